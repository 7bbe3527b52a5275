// The staging ring's allocator against a byte-level reference model: every region handed out
// must be in bounds, aligned and over free bytes only, and Allocate may fail only when the model
// has no free run of that length. Random sizes and free orders on tiny rings, the two traces that
// broke DataStates-LLM's public allocator, and a 2 GiB stream through a 64 MiB ring.
#include "engine/staging_ring.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

namespace ckpt {
namespace {

using Region = StagingRing::Region;

// Byte-level model: owner[i] is 0 when byte i is free, else the id of the live region holding it.
class Model {
 public:
  Model(uint64_t capacity, uint64_t alignment) : owner_(capacity, 0), alignment_(alignment) {}

  // Checks an allocation against the model and records it.
  void Take(const Region& r, uint32_t id, uint64_t asked) {
    ASSERT_GE(r.bytes, asked);
    ASSERT_LT(r.bytes, asked + alignment_);
    ASSERT_EQ(r.offset % alignment_, 0u);
    ASSERT_EQ(r.bytes % alignment_, 0u);
    ASSERT_LE(r.offset + r.bytes, owner_.size()) << "region past the end of the ring";
    for (uint64_t i = r.offset; i < r.offset + r.bytes; ++i) {
      ASSERT_EQ(owner_[i], 0u) << "byte " << i << " handed out while live in region " << owner_[i];
      owner_[i] = id;
    }
  }

  void Give(const Region& r, uint32_t id) {
    for (uint64_t i = r.offset; i < r.offset + r.bytes; ++i) {
      ASSERT_EQ(owner_[i], id);
      owner_[i] = 0;
    }
  }

  // The longest run of free bytes.
  uint64_t LargestFreeRun() const {
    uint64_t best = 0, run = 0;
    for (uint32_t o : owner_) {
      run = o == 0 ? run + 1 : 0;
      best = std::max(best, run);
    }
    return best;
  }

 private:
  std::vector<uint32_t> owner_;
  uint64_t alignment_;
};

struct Live {
  Region region;
  uint32_t id;
};

// Replays "alloc N" (N > 0) and "free" (0: frees the oldest live region) against ring and model.
// Returns the allocations' results in order (a failed one as {UINT64_MAX, 0}).
std::vector<Region> Replay(uint64_t capacity, const std::vector<uint64_t>& calls) {
  StagingRing ring(capacity, 1);
  Model model(capacity, 1);
  std::deque<Live> live;
  std::vector<Region> results;
  uint32_t next_id = 1;
  for (uint64_t call : calls) {
    if (call == 0) {
      EXPECT_FALSE(live.empty());
      if (live.empty()) continue;
      ring.Free(live.front().region);
      model.Give(live.front().region, live.front().id);
      live.pop_front();
      continue;
    }
    Region r;
    if (ring.Allocate(call, &r)) {
      model.Take(r, next_id, call);
      live.push_back({r, next_id++});
      results.push_back(r);
    } else {
      EXPECT_LT(model.LargestFreeRun(), call) << "Allocate failed with a free run available";
      results.push_back({UINT64_MAX, 0});
    }
  }
  return results;
}

TEST(StagingRing, DataStatesTraceOneNeverOverlapsTheLiveRegion) {
  // capacity 14: alloc 5, alloc 7, free, alloc 1, alloc 4, free, alloc 4, alloc 1, free, free,
  // alloc 7. Their allocator returned [0,7) for the last call while [4,8) was live.
  std::vector<Region> r = Replay(14, {5, 7, 0, 1, 4, 0, 4, 1, 0, 0, 7});
  ASSERT_EQ(r.size(), 7u);
  // Live before the last call: [4,8) and [8,9); free runs [0,4) and [9,14) are both under 7.
  EXPECT_EQ(r[6].offset, UINT64_MAX) << "7 bytes handed out at " << r[6].offset;
}

TEST(StagingRing, DataStatesTraceTwoAFullRingIsNotTakenForEmpty) {
  // capacity 11: a region [0,4) was handed out over a live [0,5) after a ring whose head and tail
  // met was taken for empty. Fill it exactly, free out of order, and ask again.
  std::vector<Region> r = Replay(11, {5, 6, 4, 0, 4});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].offset, 0u);
  EXPECT_EQ(r[1].offset, 5u);
  EXPECT_EQ(r[2].offset, UINT64_MAX) << "full ring handed out [" << r[2].offset << ")";
  EXPECT_EQ(r[3].offset, 0u);  // after [0,5) is freed
}

TEST(StagingRing, RandomSizesAndFreeOrdersMatchTheModel) {
  std::mt19937_64 rng(20261122);
  for (int round = 0; round < 300; ++round) {
    const uint64_t alignment = uint64_t{1} << (rng() % 3);  // 1, 2, 4
    const uint64_t capacity = alignment * (1 + rng() % 40);
    StagingRing ring(capacity, alignment);
    Model model(capacity, alignment);
    std::vector<Live> live;
    uint32_t next_id = 1;
    for (int step = 0; step < 400; ++step) {
      if (!live.empty() && rng() % 100 < 45) {
        // Free in any order: oldest, newest or a random one.
        size_t k = rng() % 3 == 0 ? 0 : rng() % live.size();
        ring.Free(live[k].region);
        model.Give(live[k].region, live[k].id);
        live.erase(live.begin() + static_cast<long>(k));
        continue;
      }
      uint64_t asked = 1 + rng() % (capacity + 2);
      Region r;
      if (ring.Allocate(asked, &r)) {
        model.Take(r, next_id, asked);
        if (HasFatalFailure()) return;
        live.push_back({r, next_id++});
      } else {
        uint64_t rounded = (asked + alignment - 1) / alignment * alignment;
        ASSERT_LT(model.LargestFreeRun(), rounded)
            << "round " << round << " step " << step << ": Allocate(" << asked
            << ") failed on a ring of " << capacity << " with a free run available";
      }
      ASSERT_EQ(ring.LargestFreeRun(), model.LargestFreeRun());
      uint64_t live_bytes = 0;
      for (const Live& l : live) live_bytes += l.region.bytes;
      ASSERT_EQ(ring.live_bytes(), live_bytes);
      ASSERT_EQ(ring.live_regions(), live.size());
    }
  }
}

TEST(StagingRing, TwoGibibytesPassThroughASixtyFourMebibyteRing) {
  // The capture pipeline's steady state: 4 MiB chunks through a 64 MiB ring, each freed when its
  // (simulated) write completes, a few at a time and out of order.
  constexpr uint64_t kChunk = 4 << 20, kRing = 64 << 20, kTotal = uint64_t{2} << 30;
  StagingRing ring(kRing, 4096);
  std::mt19937_64 rng(7);
  std::vector<Region> in_flight;
  uint64_t passed = 0, refusals = 0;
  while (passed < kTotal) {
    Region r;
    if (ring.Allocate(kChunk, &r)) {
      in_flight.push_back(r);
      passed += kChunk;
      continue;
    }
    ++refusals;  // back-pressure: complete some writes, in any order
    ASSERT_FALSE(in_flight.empty());
    for (int k = 0; k < 3 && !in_flight.empty(); ++k) {
      size_t i = rng() % in_flight.size();
      ring.Free(in_flight[i]);
      in_flight.erase(in_flight.begin() + static_cast<long>(i));
    }
  }
  EXPECT_EQ(passed, kTotal);
  EXPECT_GT(refusals, 0u);
  EXPECT_EQ(ring.high_water_bytes(), kRing);
  for (const Region& r : in_flight) ring.Free(r);
  EXPECT_EQ(ring.live_bytes(), 0u);
  EXPECT_EQ(ring.LargestFreeRun(), kRing);
}

TEST(StagingRing, RequestsLargerThanTheRingNeverFit) {
  StagingRing ring(4096 * 4, 4096);
  Region r;
  EXPECT_FALSE(ring.Allocate(4096 * 4 + 1, &r));
  EXPECT_TRUE(ring.Allocate(4096 * 4, &r));
  EXPECT_EQ(r.offset, 0u);
  EXPECT_FALSE(ring.Allocate(1, &r)) << "a full ring handed out a region";
}

TEST(StagingRingDeathTest, FreeingARegionThatIsNotLiveAborts) {
  StagingRing ring(64, 1);
  Region r;
  ASSERT_TRUE(ring.Allocate(8, &r));
  ring.Free(r);
  EXPECT_DEATH(ring.Free(r), "assertion failed");
  Region wrong{0, 4};
  ASSERT_TRUE(ring.Allocate(8, &r));
  EXPECT_DEATH(ring.Free(wrong), "assertion failed");
}

}  // namespace
}  // namespace ckpt
