// GEMINI's interleaving of checkpoint traffic with training traffic (Wang et al., SOSP'23,
// section 5): the network's idle spans of an iteration, profiled over its first iterations
// (section 5.4), and a version's replication cut into partitions that fit them (Algorithm 2).
// Pure arithmetic (no clock, no I/O): the engine times the spans (engine/traffic_interleaver.h)
// and sends the partitions (engine/cluster_replication.cc).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "util/status.h"

namespace ckpt::redundancy {

// Bounds: the spans one iteration is profiled into (an iteration with more is not profiled:
// its pattern is not one a schedule could follow), the partitions one plan may hold, and the
// smallest partition a bounded span is given (below it a call's start-up dominates; the rest of
// such a span is left idle, as line 12 of Algorithm 2 would otherwise emit pieces of a few
// bytes).
inline constexpr size_t kMaxIdleSpans = 64;
inline constexpr size_t kMaxPartitions = size_t{1} << 20;
inline constexpr uint64_t kMinPartitionBytes = uint64_t{64} << 10;
// The iterations a profile averages at most (a ring: the newest are kept).
inline constexpr size_t kMaxProfiledIterations = 1000;

// f(s) = alpha + s / B: the time to send s bytes to a receiver (GEMINI section 5.3).
struct TransferModel {
  double alpha_s = 0;
  double bytes_per_s = 0;
  double Seconds(uint64_t bytes) const {
    return alpha_s + static_cast<double>(bytes) / bytes_per_s;
  }
};

struct Partition {
  uint32_t span = 0;    // index into the spans planned over; the last one is unbounded
  uint32_t copy = 0;    // which of the copies (m - 1 in the paper: one per replica target)
  uint64_t offset = 0;  // in the copy's bytes
  uint64_t bytes = 0;
};

struct PartitionPlan {
  std::vector<Partition> partitions;  // in sending order: span by span, copy by copy
  uint64_t overflow_bytes = 0;        // bytes that only fit the last, unbounded span
};

// Algorithm 2 (checkpoint_partition): `copies` copies of `checkpoint_bytes` each, cut into
// partitions of at most `piece_limit_bytes` (R/p), placed into `idle_spans_s` in order, each
// span's room being mu times its length; the last span is unbounded (line 2), so every byte is
// placed. Two departures from the listing, both of which the text supports: line 18 takes
// f(size), the time of the partition just placed, from the span (the listing's f(remain_size)
// would charge the span for what is left of the checkpoint); and a bounded span's remainder
// smaller than f(kMinPartitionBytes) is left unused. Invalid for no spans, more than
// kMaxIdleSpans, a negative or non-finite span, mu outside (0, 1], a piece limit of 0, a model
// with B <= 0 or alpha < 0, or a plan that would exceed kMaxPartitions.
Status PartitionCheckpoint(std::span<const double> idle_spans_s, uint64_t checkpoint_bytes,
                           uint32_t copies, uint64_t piece_limit_bytes, double mu,
                           const TransferModel& model, PartitionPlan* out);

// The profiled idle spans of an iteration (section 5.4): each iteration's spans in order; the
// profile is the mean of each span over the iterations with the most common span count (an
// iteration whose pattern differs, such as one that also evaluated, does not blur it).
class IdleProfile {
 public:
  // Keeps the newest `window` iterations (1 to kMaxProfiledIterations).
  explicit IdleProfile(size_t window = kMaxProfiledIterations);
  // Iterations with no span or more than kMaxIdleSpans are not counted (false).
  bool AddIteration(std::span<const double> spans_s);
  size_t iterations() const { return iterations_.size(); }
  // The mean spans of the iterations with the modal span count (ties: the later count seen);
  // empty before any iteration. `support` (optional): how many iterations they are.
  std::vector<double> MeanSpans(size_t* support = nullptr) const;

 private:
  size_t window_;
  std::vector<std::vector<double>> iterations_;  // oldest first, at most window_
};

}  // namespace ckpt::redundancy
