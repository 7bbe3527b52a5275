// The staging ring's allocator (DESIGN.md section 5): hands out regions of a byte range and
// takes them back in any order. It places chunks on their way from a caller's buffer to a
// directory tier in the staging ring, and every record of the ram tier's arena (whose size
// changes only at open, Resize). It never hands out a region that overlaps a live one: the live
// regions are the state, kept in an ordered map, and every allocation is checked against them,
// never derived from head/tail arithmetic (DataStates-LLM's public allocator returned [0,7) over a
// live [4,8) that way; tests/staging_ring_test.cc replays that trace and checks against a
// byte-level model).
//
// Placement is first fit starting where the last allocation ended, wrapping once to the start:
// in steady state (frees roughly in allocation order) that is a ring, and it still finds any
// free run of the requested size when frees come out of order. Allocate fails only when no such
// run exists; the caller then applies its back-pressure policy.
//
// Not thread-safe: its owner serializes calls (the engine under its mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace ckpt {

class StagingRing {
 public:
  struct Region {
    uint64_t offset = 0;
    uint64_t bytes = 0;  // a multiple of the ring's alignment, > 0
  };

  // capacity and alignment must be > 0, alignment a power of two dividing capacity.
  StagingRing(uint64_t capacity, uint64_t alignment);

  // Rounds `bytes` up to the alignment. False when 0 < bytes and no free run that long exists
  // now (bytes larger than the capacity never fit); bytes == 0 is a caller's bug (asserted).
  bool Allocate(uint64_t bytes, Region* out);

  // Returns a region Allocate handed out and that is still live, in any order. Asserts that it
  // is exactly such a region.
  void Free(const Region& region);

  // Marks a given region live, as if Allocate had handed it out: the ram tier rebuilds its
  // allocator this way from the catalog after a restart. False, changing nothing, when the region
  // is empty, unaligned, out of bounds or overlaps a live one.
  bool Claim(const Region& region);

  // Changes the capacity (alignment still dividing it). False, changing nothing, when a live
  // region ends past the new capacity.
  bool Resize(uint64_t capacity);

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t live_bytes() const { return live_bytes_; }
  size_t live_regions() const { return live_.size(); }
  uint64_t high_water_bytes() const { return high_water_bytes_; }
  // The longest run Allocate could hand out now.
  uint64_t LargestFreeRun() const;

 private:
  // True when [offset, offset + bytes) is inside the ring and overlaps no live region.
  bool IsFree(uint64_t offset, uint64_t bytes) const;
  void CheckInvariants() const;

  static constexpr size_t kFullCheckRegions = 256;

  uint64_t capacity_;
  const uint64_t alignment_;
  std::map<uint64_t, uint64_t> live_;  // offset -> bytes, disjoint
  uint64_t cursor_ = 0;                // where the last allocation ended
  uint64_t live_bytes_ = 0;
  uint64_t high_water_bytes_ = 0;
};

}  // namespace ckpt
