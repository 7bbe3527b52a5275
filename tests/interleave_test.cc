// GEMINI's traffic interleaving: Algorithm 2 (redundancy/interleave.h) against a direct model of
// what it must produce, the idle-span profile, and the engine's timeline of the trainer's hints
// (engine/traffic_interleaver.h) driven with chosen timestamps.
#include "redundancy/interleave.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "engine/traffic_interleaver.h"

namespace ckpt {
namespace {

using redundancy::IdleProfile;
using redundancy::Partition;
using redundancy::PartitionCheckpoint;
using redundancy::PartitionPlan;
using redundancy::TransferModel;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// What every plan must satisfy: each copy's bytes covered once, in order, by partitions of at
// most the piece limit; spans in order; every bounded span's partitions fit mu times its length
// under f(s) = alpha + s/B; the overflow is what the last span got.
void ExpectValid(const PartitionPlan& plan, const std::vector<double>& spans, uint64_t bytes,
                 uint32_t copies, uint64_t limit, double mu, const TransferModel& m) {
  std::vector<uint64_t> next(copies, 0);
  std::vector<double> used(spans.size(), 0);
  uint32_t span = 0, copy = 0;
  uint64_t overflow = 0;
  for (const Partition& p : plan.partitions) {
    ASSERT_LT(p.copy, copies);
    ASSERT_GE(p.span, span) << "spans in order";
    ASSERT_GE(p.copy, p.span == span ? copy : 0) << "copies in order";
    span = p.span;
    copy = p.copy;
    ASSERT_EQ(p.offset, next[p.copy]) << "each copy in order, no gap, no overlap";
    ASSERT_GT(p.bytes, 0u);
    ASSERT_LE(p.bytes, limit);
    next[p.copy] += p.bytes;
    used[p.span] += m.Seconds(p.bytes);
    if (p.span + 1 == spans.size()) overflow += p.bytes;
  }
  for (uint32_t c = 0; c < copies; ++c) EXPECT_EQ(next[c], bytes) << "copy " << c;
  for (size_t s = 0; s + 1 < spans.size(); ++s) {
    EXPECT_LE(used[s], mu * spans[s] * (1 + 1e-9)) << "span " << s;
  }
  EXPECT_EQ(plan.overflow_bytes, overflow);
}

TEST(PartitionCheckpoint, FillsEachSpanWithFullPiecesThenWhatFitsAndOverflowsIntoTheLast) {
  // 100 MB/s, alpha 1 ms, pieces of 4 MiB (f = 42.9 ms), mu 0.5.
  const TransferModel m{0.001, 100e6};
  const std::vector<double> spans = {0.2, 0.05, 0.0, 1.0};
  PartitionPlan plan;
  ASSERT_TRUE(PartitionCheckpoint(spans, 12 * kMiB, 1, 4 * kMiB, 0.5, m, &plan).ok());
  ExpectValid(plan, spans, 12 * kMiB, 1, 4 * kMiB, 0.5, m);
  // Span 0 has 100 ms: two full pieces (85.9 ms), then (14.1 ms - 1 ms) * 100 MB/s.
  ASSERT_GE(plan.partitions.size(), 4u);
  EXPECT_EQ(plan.partitions[0].bytes, 4 * kMiB);
  EXPECT_EQ(plan.partitions[1].bytes, 4 * kMiB);
  const double rest = 0.1 - 2 * m.Seconds(4 * kMiB);
  EXPECT_EQ(plan.partitions[2].span, 0u);
  EXPECT_EQ(plan.partitions[2].bytes, static_cast<uint64_t>((rest - m.alpha_s) * m.bytes_per_s));
  // Span 1 (25 ms) takes (25 - 1) ms worth; span 2 is empty; the last takes the rest.
  EXPECT_EQ(plan.partitions[3].span, 1u);
  EXPECT_EQ(plan.partitions[3].bytes, static_cast<uint64_t>(0.024 * m.bytes_per_s));
  uint64_t before_last = 0;
  for (const Partition& p : plan.partitions) {
    EXPECT_NE(p.span, 2u);
    if (p.span < 3) before_last += p.bytes;
  }
  EXPECT_EQ(plan.overflow_bytes, 12 * kMiB - before_last);
}

TEST(PartitionCheckpoint, EveryCopyIsPlacedAndACheckpointThatFitsNeverOverflows) {
  const TransferModel m{0.0002, 1e9};
  const std::vector<double> spans = {0.05, 0.05, 0.05};
  PartitionPlan plan;
  // 3 copies of 8 MiB at 1 GB/s: 25 ms of sending into 90 ms of planned room.
  ASSERT_TRUE(PartitionCheckpoint(spans, 8 * kMiB, 3, 2 * kMiB, 0.9, m, &plan).ok());
  ExpectValid(plan, spans, 8 * kMiB, 3, 2 * kMiB, 0.9, m);
  EXPECT_EQ(plan.overflow_bytes, 0u);
  // Too much for the bounded spans: the overflow is exactly what they could not take.
  ASSERT_TRUE(PartitionCheckpoint(spans, 64 * kMiB, 3, 2 * kMiB, 0.9, m, &plan).ok());
  ExpectValid(plan, spans, 64 * kMiB, 3, 2 * kMiB, 0.9, m);
  EXPECT_GT(plan.overflow_bytes, 0u);
  EXPECT_LT(plan.overflow_bytes, 3 * 64 * kMiB);
}

TEST(PartitionCheckpoint, RandomPlansAreValid) {
  std::mt19937_64 rng(25);
  for (int round = 0; round < 2000; ++round) {
    std::vector<double> spans(1 + rng() % 12);
    for (double& t : spans) t = (rng() % 4 == 0) ? 0.0 : (rng() % 100000) * 1e-6;
    const TransferModel m{(rng() % 1000) * 1e-6, 1e6 * (1 + rng() % 5000)};
    const uint64_t bytes = rng() % (64 * kMiB);
    const uint32_t copies = 1 + rng() % 3;
    const uint64_t limit = 4096 + rng() % (16 * kMiB);
    const double mu = 0.05 + (rng() % 95) / 100.0;
    PartitionPlan plan;
    ASSERT_TRUE(PartitionCheckpoint(spans, bytes, copies, limit, mu, m, &plan).ok());
    ExpectValid(plan, spans, bytes, copies, limit, mu, m);
    if (HasFatalFailure() || HasFailure()) {
      FAIL() << "round " << round;
    }
  }
}

TEST(PartitionCheckpoint, LeavesASpanTooShortForAMinimumPartition) {
  const TransferModel m{0.001, 100e6};
  // 1.2 ms of room: less than f(64 KiB) = 1.66 ms.
  PartitionPlan plan;
  ASSERT_TRUE(
      PartitionCheckpoint(std::vector<double>{0.0012, 1}, kMiB, 1, kMiB, 1.0, m, &plan).ok());
  ASSERT_EQ(plan.partitions.size(), 1u);
  EXPECT_EQ(plan.partitions[0].span, 1u);
  EXPECT_EQ(plan.overflow_bytes, kMiB);
}

TEST(PartitionCheckpoint, RefusesBadInputsAndLeavesNothing) {
  const TransferModel good{0.001, 1e8};
  PartitionPlan plan;
  plan.overflow_bytes = 7;
  const std::vector<double> one = {0.1};
  EXPECT_FALSE(PartitionCheckpoint({}, kMiB, 1, kMiB, 0.9, good, &plan).ok());
  EXPECT_EQ(plan.overflow_bytes, 0u);
  std::vector<double> many(redundancy::kMaxIdleSpans + 1, 0.1);
  EXPECT_FALSE(PartitionCheckpoint(many, kMiB, 1, kMiB, 0.9, good, &plan).ok());
  EXPECT_FALSE(
      PartitionCheckpoint(std::vector<double>{-1.0}, kMiB, 1, kMiB, 0.9, good, &plan).ok());
  EXPECT_FALSE(
      PartitionCheckpoint(std::vector<double>{std::nan("")}, kMiB, 1, kMiB, 0.9, good, &plan).ok());
  EXPECT_FALSE(PartitionCheckpoint(one, kMiB, 1, kMiB, 0.0, good, &plan).ok());
  EXPECT_FALSE(PartitionCheckpoint(one, kMiB, 1, kMiB, 1.5, good, &plan).ok());
  EXPECT_FALSE(PartitionCheckpoint(one, kMiB, 1, 0, 0.9, good, &plan).ok());
  EXPECT_FALSE(PartitionCheckpoint(one, kMiB, 1, kMiB, 0.9, {0.001, 0}, &plan).ok());
  EXPECT_FALSE(PartitionCheckpoint(one, kMiB, 1, kMiB, 0.9, {-1, 1e8}, &plan).ok());
  // A plan past kMaxPartitions is refused before anything is built.
  Status st = PartitionCheckpoint(one, uint64_t{1} << 40, 8, 4096, 0.9, good, &plan);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("partitions"), std::string::npos) << st.message();
  EXPECT_TRUE(plan.partitions.empty());
  // Nothing to send: an empty plan.
  ASSERT_TRUE(PartitionCheckpoint(one, 0, 2, kMiB, 0.9, good, &plan).ok());
  EXPECT_TRUE(plan.partitions.empty());
}

TEST(IdleProfile, AveragesTheIterationsOfTheModalPatternOverItsWindow) {
  IdleProfile p(4);
  EXPECT_TRUE(p.MeanSpans().empty());
  EXPECT_FALSE(p.AddIteration(std::vector<double>{}));
  EXPECT_FALSE(p.AddIteration(std::vector<double>{0.1, -1}));
  EXPECT_TRUE(p.AddIteration(std::vector<double>{0.1, 0.2}));
  EXPECT_TRUE(p.AddIteration(std::vector<double>{0.3, 0.4}));
  EXPECT_TRUE(p.AddIteration(std::vector<double>{9.0}));  // another pattern: not averaged in
  size_t support = 0;
  std::vector<double> mean = p.MeanSpans(&support);
  ASSERT_EQ(mean.size(), 2u);
  EXPECT_EQ(support, 2u);
  EXPECT_DOUBLE_EQ(mean[0], 0.2);
  EXPECT_DOUBLE_EQ(mean[1], 0.3);
  // The window keeps the newest 4: the first two go, the single-span pattern wins.
  EXPECT_TRUE(p.AddIteration(std::vector<double>{1.0}));
  EXPECT_TRUE(p.AddIteration(std::vector<double>{2.0}));
  EXPECT_TRUE(p.AddIteration(std::vector<double>{3.0}));
  EXPECT_EQ(p.iterations(), 4u);
  mean = p.MeanSpans(&support);
  ASSERT_EQ(mean.size(), 1u);
  EXPECT_EQ(support, 4u);
  EXPECT_DOUBLE_EQ(mean[0], 15.0 / 4);
}

// The trainer's timeline, fed with chosen timestamps: iteration = 40 ms idle, 20 ms busy,
// 30 ms idle, 10 ms busy.
constexpr uint64_t kMs = 1000000;
void Iteration(engine::TrafficInterleaver* t, uint64_t start_ns) {
  t->Hint(engine::kHintIteration, start_ns);
  t->Hint(engine::kHintNetBusy, start_ns + 40 * kMs);
  t->Hint(engine::kHintNetIdle, start_ns + 60 * kMs);
  t->Hint(engine::kHintNetBusy, start_ns + 90 * kMs);
  t->Hint(engine::kHintNetIdle, start_ns + 100 * kMs);
}

TEST(TrafficInterleaver, ProfilesTheTrainersSpansAndPlansFromWhereItIs) {
  engine::InterleaveOptions o;
  o.profile_iterations = 3;
  o.mu = 1.0;
  engine::TrafficInterleaver t(o);
  t.RecordBurst(100 * kMiB, 1000 * kMs);  // 104.9 MB/s
  t.RecordStartup(kMs / 2);
  uint64_t now = 1000 * kMs;
  for (int i = 0; i < 3; ++i, now += 100 * kMs) Iteration(&t, now);
  // Three iterations begun, two closed: not profiled enough yet.
  EXPECT_FALSE(t.Plan(8 * kMiB, 1, 4 * kMiB, now).has_value());
  Iteration(&t, now);
  now += 100 * kMs;
  t.Hint(engine::kHintIteration, now);  // iteration 5 begins: 4 closed, spans {40, 30, 0} ms
  engine::TrafficInterleaver::Stats st = t.stats();
  EXPECT_EQ(st.profiled_iterations, 3u);
  ASSERT_EQ(st.spans, 3u);  // 40 ms, 30 ms, and the 0 ms between the last IDLE and ITERATION
  EXPECT_NEAR(static_cast<double>(st.idle_ns), 70e6, 1e3);
  // 10 ms into span 0: its 30 ms left, span 1 (30 ms), then span 2, the last before span 0
  // comes round again: unbounded.
  auto s = t.Plan(8 * kMiB, 1, 4 * kMiB, now + 10 * kMs);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->spans, 3u);
  uint64_t bytes = 0, in_first = 0;
  for (const Partition& p : s->plan.partitions) {
    bytes += p.bytes;
    if (p.span == 0) in_first += p.bytes;
  }
  EXPECT_EQ(bytes, 8 * kMiB);
  // 29.5 ms at 104.9 MB/s.
  EXPECT_NEAR(static_cast<double>(in_first), 0.0295 * 104857600, 2.0);
  EXPECT_GT(s->plan.overflow_bytes, 0u);
  // While busy (in the first collective), the plan starts at the next idle span.
  t.Hint(engine::kHintNetBusy, now + 40 * kMs);
  auto busy = t.Plan(8 * kMiB, 1, 4 * kMiB, now + 45 * kMs);
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->first_seq, s->first_seq + 1);
  EXPECT_EQ(busy->spans, 3u);  // spans 1 and 2, then span 0 of the next iteration, unbounded
  uint64_t in_last = 0;
  for (const Partition& p : busy->plan.partitions) in_last += p.span == 2 ? p.bytes : 0;
  EXPECT_EQ(in_last, busy->plan.overflow_bytes);
  EXPECT_GT(in_last, 0u);
  // Off: no plan, ever.
  o.enabled = false;
  engine::TrafficInterleaver off(o);
  off.RecordBurst(100 * kMiB, 1000 * kMs);
  off.RecordStartup(kMs);
  for (int i = 0; i < 6; ++i, now += 100 * kMs) Iteration(&off, now);
  EXPECT_FALSE(off.Plan(kMiB, 1, kMiB, now).has_value());
}

TEST(TrafficInterleaver, WaitsForItsSpanAndGivesUpOnATrainerThatStoppedHinting) {
  engine::InterleaveOptions o;
  engine::TrafficInterleaver t(o);
  t.Hint(engine::kHintIteration, 0);
  t.Hint(engine::kHintNetBusy, 10);
  // Span 1 begins on another thread: the wait returns then, met.
  const auto t0 = std::chrono::steady_clock::now();
  std::thread trainer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    t.Hint(engine::kHintNetIdle, 20);
  });
  EXPECT_TRUE(t.WaitForSpan(2, false));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(25));
  trainer.join();
  EXPECT_EQ(t.stats().late, 0u);
  // A span already past, met by the current idle one: late.
  EXPECT_TRUE(t.WaitForSpan(1, false));
  EXPECT_EQ(t.stats().late, 1u);
  // Busy: an unbounded span goes at once, a bounded one waits (200 ms bound here: no iteration
  // profiled) and gives up.
  t.Hint(engine::kHintNetBusy, 30);
  EXPECT_TRUE(t.WaitForSpan(2, true));
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_FALSE(t.WaitForSpan(3, false));
  EXPECT_GE(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(190));
  EXPECT_EQ(t.stats().late, 2u);
  // Stopped: nothing waits.
  t.Stop();
  EXPECT_FALSE(t.WaitForSpan(100, false));
  EXPECT_EQ(t.stats().late, 2u);
}

}  // namespace
}  // namespace ckpt
