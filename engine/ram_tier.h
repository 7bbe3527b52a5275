// The ram tier (DESIGN.md section 5): an arena of shared memory that holds the newest committed
// versions of one rank, and outlives the trainer process (GEMINI's local CPU-memory checkpoint;
// REFT's tmpfs copy without the dump). It is the capture destination when it is the first tier:
// capture copies each chunk from the caller's buffer straight into its arena region, hashing it
// while it is in cache, so a checkpoint costs one copy (docs/performance.md has the figures).
//
// The arena is one file, <dir>/ckptdb-<job id in hex>-r<rank>.ram (docs/format.md, "The ram
// tier's arena"):
//   [0, 4096)          arena header block: ArenaHeader (64 bytes), then zeros
//   [4096, capacity)   regions of 4096-byte multiples, handed out by a StagingRing allocator
// A version's copy is a segment image: exactly the records its segment file has (header block,
// chunk records, the manifest record with the footer block), each in a region of its own, and an
// index region listing where each record lies. The catalog's residency record names the index
// (offset, size) and the arena's generation; nothing else in the arena is trusted. Regions of
// versions that were never committed belong to nobody: after a crash they are simply free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/staging_ring.h"
#include "format/ram_format.h"
#include "io/io.h"
#include "io/tier_spec.h"
#include "util/status.h"

namespace ckpt::engine {

// Where one record of a segment image lies.
struct RamExtent {
  uint64_t logical_offset = 0;  // its offset in the segment file it stands for
  uint64_t arena_offset = 0;
  uint64_t bytes = 0;  // a multiple of 4096
};

// A committed version's copy in the arena, as its index describes it.
struct RamImage {
  uint64_t version = 0;
  uint64_t file_bytes = 0;  // of the segment the image stands for
  uint64_t index_offset = 0;
  uint64_t index_bytes = 0;
  std::vector<RamExtent> extents;  // by logical offset, contiguous from 0 to file_bytes
};

class RamTier {
 public:
  RamTier(io::Io* io, io::TierSpec spec) : io_(io), spec_(std::move(spec)) {}

  static std::string ArenaPath(const std::string& dir, uint64_t job_id, uint32_t rank);

  // Read-write: maps the arena, creating it when absent (or when its header names another store
  // or is damaged: a file with this store's name that is not its arena is replaced). Read-only:
  // maps it for reading; when it is absent or not this store's, available() is false and every
  // copy the catalog places there reads as missing.
  Status Open(uint64_t job_id, uint32_t rank, bool read_only);

  const io::TierSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  const std::string& path() const { return path_; }
  bool available() const { return memory_ != nullptr; }
  bool created() const { return created_; }  // Open made a new arena (first open, or reboot)
  uint64_t generation() const { return generation_; }
  uint64_t capacity() const { return memory_ ? memory_->bytes() : 0; }
  bool locked() const { return memory_ && memory_->locked(); }
  uint8_t* base() const { return memory_->data(); }

  // ---- Allocation (read-write; the caller serializes these calls) ------------------------------
  // Regions are arena offsets; they never cover the header block.
  bool Allocate(uint64_t bytes, StagingRing::Region* out);
  void Free(const StagingRing::Region& region);
  void FreeImage(const RamImage& image);  // every record region and the index region
  // At open: marks a committed copy's regions live. Fails (changing nothing) when a region lies
  // outside the arena or overlaps one already claimed.
  Status Claim(const RamImage& image);
  // After every committed copy is claimed: makes the arena the spec's size. Growing always
  // works; shrinking only when no live region lies past the new end.
  Status ResizeToSpec();
  uint64_t live_bytes() const { return allocator_ ? allocator_->live_bytes() : 0; }
  uint64_t high_water_bytes() const { return allocator_ ? allocator_->high_water_bytes() : 0; }
  // Counts every Free: a capture that failed to allocate after the last one need not retry.
  uint64_t frees() const { return frees_; }
  uint64_t free_bytes() const { return allocator_ ? allocator_->capacity() - live_bytes() : 0; }
  uint64_t largest_free_run() const { return allocator_ ? allocator_->LargestFreeRun() : 0; }

  // ---- Images ----------------------------------------------------------------------------------
  // Allocates the index region of `image` (extents set, offsets filled in) and writes it.
  // False when the arena has no room for it.
  bool WriteIndex(uint64_t job_id, uint32_t rank, RamImage* image);
  // Reads and checks the index named by a catalog record. Corrupt when it does not decode, does
  // not describe `version` of this store, or has an extent out of bounds or out of order.
  Status LoadImage(uint64_t job_id, uint32_t rank, uint64_t version, uint64_t file_bytes,
                   uint64_t index_offset, uint64_t index_bytes, RamImage* out) const;
  // Copies [offset, offset + bytes) of the segment the image stands for; Corrupt past its end.
  Status ReadAt(const RamImage& image, uint64_t offset, void* dst, size_t bytes,
                const std::string& what) const;
  // The record that starts at logical `offset`, or nullptr when no extent starts there.
  const RamExtent* ExtentAt(const RamImage& image, uint64_t offset) const;

  static constexpr uint64_t kHeaderBytes = 4096;
  static constexpr uint32_t kMaxIndexEntries = (1u << 24) + 8;

 private:
  Status CreateArena(uint64_t job_id, uint32_t rank);
  void WriteHeader(uint64_t capacity_bytes);  // header_ with this capacity, into the arena

  io::Io* io_;
  io::TierSpec spec_;
  std::string path_;
  std::unique_ptr<io::SharedMemory> memory_;
  std::unique_ptr<StagingRing> allocator_;  // over [kHeaderBytes, capacity)
  format::ArenaHeader header_;              // as in the arena (read-write) or as read at Open
  uint64_t generation_ = 0;
  uint64_t frees_ = 0;
  bool created_ = false;
  bool read_only_ = false;
};

}  // namespace ckpt::engine
