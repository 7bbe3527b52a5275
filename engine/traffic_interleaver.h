// GEMINI's traffic interleaving (SOSP'23, section 5), the engine's part: the trainer's timeline
// as it reports it (ckptdb_hint: ITERATION at the start of each iteration, NET_BUSY and NET_IDLE
// around its own communication), a rolling profile of each iteration's idle spans (section 5.4),
// a model of the replication's sends f(s) = alpha + s/B measured from the sends themselves, and
// a version's replication planned into the spans ahead (redundancy/interleave.h, Algorithm 2)
// and released span by span.
//
// Threads: Hint from the trainer's threads; Plan, WaitForSpan and the Record calls from the
// cluster's replication thread; Stop from Cluster::Stop; stats from any. One mutex owns it all.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "redundancy/interleave.h"

namespace ckpt::engine {

struct InterleaveOptions {
  bool enabled = true;               // CKPTDB_INTERLEAVE=off: replicate at once (hints pause)
  uint32_t profile_iterations = 20;  // CKPTDB_INTERLEAVE_PROFILE: iterations profiled first
  double mu = 0.9;                   // CKPTDB_INTERLEAVE_MU_PERCENT / 100
};

// The trainer's hint bits (ckptdb.h's CKPTDB_HINT_*).
inline constexpr unsigned kHintNetBusy = 0x1u;
inline constexpr unsigned kHintNetIdle = 0x2u;
inline constexpr unsigned kHintIteration = 0x4u;

class TrafficInterleaver {
 public:
  // Bounds: iterations of more idle spans than this are not profiled (a plan spans one
  // iteration plus the part of the current span left, within redundancy::kMaxIdleSpans), and the
  // samples the transfer model keeps.
  static constexpr size_t kMaxIterationSpans = redundancy::kMaxIdleSpans / 2 - 1;
  static constexpr size_t kModelSamples = 16;
  static constexpr uint64_t kMinBurstBytes = uint64_t{1} << 20;  // smaller ones do not measure B

  explicit TrafficInterleaver(InterleaveOptions options);

  // The trainer's hints at now_ns (hints already checked: ITERATION may come with NET_BUSY).
  void Hint(unsigned hints, uint64_t now_ns);
  // Whether the trainer said its network is busy (the pause of a replication not planned).
  bool busy() const;

  // A version's sends, measured: `bytes` sent back to back in `ns` (a burst), and a call that
  // carried no bytes (its round trip: alpha).
  void RecordBurst(uint64_t bytes, uint64_t ns);
  void RecordStartup(uint64_t ns);

  struct Schedule {
    redundancy::PartitionPlan plan;
    uint64_t first_seq = 0;  // the trainer's idle span that is the plan's span 0
    uint32_t spans = 0;      // spans planned over; the last is unbounded
  };
  // A plan for `copies` copies of `bytes` each from now on: nullopt while interleaving is off,
  // the profile holds fewer than profile_iterations iterations, or nothing was measured yet.
  std::optional<Schedule> Plan(uint64_t bytes, uint32_t copies, uint64_t piece_limit_bytes,
                               uint64_t now_ns);
  // Waits until idle span `seq` has begun and the network is idle, or (unbounded) only until it
  // has begun; a span already past is met by the next idle one (counted late). Waits at most
  // four profiled iterations (at least 200 ms, at most 10 s: a trainer that stopped hinting is
  // not waited for; counted late too). Returns at once after Stop. False when the wait ran out
  // or after Stop: the caller then sends the rest of its version at once.
  bool WaitForSpan(uint64_t seq, bool unbounded);
  // The trainer waits on ckptdb (wait_capture, a synchronous commit, wait_commit): it sends
  // nothing meanwhile, so while any such wait lasts every span counts as begun and idle.
  void TrainerWaits(bool begins);
  // Bytes sent as planned: inside their spans, or in the unbounded last one (overflow).
  void RecordSent(uint64_t bytes, bool overflow);
  void Stop();

  struct Stats {
    uint64_t profiled_iterations = 0;  // in the profile now
    uint64_t spans = 0;                // idle spans an iteration has in it
    uint64_t idle_ns = 0;              // their mean total per iteration
    uint64_t bytes = 0;                // replica bytes sent in planned bounded spans
    uint64_t overflow_bytes = 0;       // in the last, unbounded span
    uint64_t late = 0;                 // spans met late or not met (a wait that ran out)
  };
  Stats stats() const;

 private:
  void CloseSpanLocked(uint64_t now_ns);
  double WaitBoundSecondsLocked() const;

  const InterleaveOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool busy_ = false;
  uint32_t trainer_waits_ = 0;  // the trainer's waits on ckptdb under way
  bool in_iteration_ = false;   // an ITERATION hint has come
  uint64_t span_seq_ = 0;       // idle spans begun since open (the current one when !busy_)
  uint32_t span_index_ = 0;     // its index in the iteration
  uint64_t span_start_ns_ = 0;  // when it began
  uint64_t iteration_start_ns_ = 0;
  std::vector<double> current_;      // the closed spans of this iteration, seconds
  bool current_overflowed_ = false;  // more than kMaxIterationSpans: not profiled
  redundancy::IdleProfile profile_;
  std::deque<double> iteration_s_;  // the last profile_iterations iterations' lengths
  std::deque<double> burst_bytes_per_s_;
  std::deque<double> startup_s_;
  Stats stats_;
};

}  // namespace ckpt::engine
