#include "engine/traffic_interleaver.h"

#include <algorithm>
#include <chrono>

#include "util/assert.h"

namespace ckpt::engine {
namespace {

double Median(const std::deque<double>& samples) {
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Keep(std::deque<double>* samples, double value, size_t bound) {
  if (samples->size() == bound) samples->pop_front();
  samples->push_back(value);
}

}  // namespace

TrafficInterleaver::TrafficInterleaver(InterleaveOptions options)
    : options_(options), profile_(std::max<uint32_t>(options.profile_iterations, 1)) {}

void TrafficInterleaver::CloseSpanLocked(uint64_t now_ns) {
  CKPTDB_ASSERT(!busy_);
  if (current_.size() == kMaxIterationSpans) {
    current_overflowed_ = true;
    return;
  }
  current_.push_back(static_cast<double>(now_ns - std::min(now_ns, span_start_ns_)) * 1e-9);
}

void TrafficInterleaver::Hint(unsigned hints, uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (hints & kHintIteration) {
    if (in_iteration_) {
      if (!busy_) CloseSpanLocked(now_ns);
      if (!current_overflowed_ && profile_.AddIteration(current_)) {
        Keep(&iteration_s_, static_cast<double>(now_ns - iteration_start_ns_) * 1e-9,
             std::max<uint32_t>(options_.profile_iterations, 1));
      }
    }
    in_iteration_ = true;
    iteration_start_ns_ = now_ns;
    current_.clear();
    current_overflowed_ = false;
    span_index_ = 0;
    busy_ = (hints & kHintNetBusy) != 0;
    if (!busy_) {
      ++span_seq_;
      span_start_ns_ = now_ns;
    } else {
      ++span_seq_;  // an iteration that opens busy has an empty first span
      current_.push_back(0);
    }
  } else if (hints & kHintNetBusy) {
    if (!busy_ && in_iteration_) CloseSpanLocked(now_ns);
    busy_ = true;
  } else if (hints & kHintNetIdle) {
    if (busy_ && in_iteration_) {
      ++span_seq_;
      ++span_index_;
      span_start_ns_ = now_ns;
    }
    busy_ = false;
  }
  cv_.notify_all();
}

bool TrafficInterleaver::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void TrafficInterleaver::RecordBurst(uint64_t bytes, uint64_t ns) {
  // A small burst's time is mostly its calls' start-up, which alpha already counts.
  if (bytes < kMinBurstBytes || ns == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Keep(&burst_bytes_per_s_, static_cast<double>(bytes) / (static_cast<double>(ns) * 1e-9),
       kModelSamples);
}

void TrafficInterleaver::RecordStartup(uint64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  Keep(&startup_s_, static_cast<double>(ns) * 1e-9, kModelSamples);
}

std::optional<TrafficInterleaver::Schedule> TrafficInterleaver::Plan(uint64_t bytes,
                                                                     uint32_t copies,
                                                                     uint64_t piece_limit_bytes,
                                                                     uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t support = 0;
  const std::vector<double> mean = profile_.MeanSpans(&support);
  if (!options_.enabled || !in_iteration_ || support < options_.profile_iterations ||
      burst_bytes_per_s_.empty() || startup_s_.empty() || mean.empty()) {
    return std::nullopt;
  }
  // One iteration of spans from here (GEMINI's window, from a checkpoint to the next update):
  // what is left of the current span when idle, then the spans that follow, up to the last one
  // before this place comes round again, which is unbounded (Algorithm 2, line 2). So a version
  // is sent before the next one's replication would begin from the same place: what does not
  // fit slows that last span, and never piles onto the versions after it.
  const size_t d = mean.size();
  const size_t at = std::min<size_t>(span_index_, d - 1);
  std::vector<double> spans;
  Schedule s;
  if (!busy_) {
    const double elapsed = static_cast<double>(now_ns - std::min(now_ns, span_start_ns_)) * 1e-9;
    spans.push_back(std::max(0.0, mean[at] - elapsed));
    for (size_t k = 1; k < d; ++k) spans.push_back(mean[(at + k) % d]);
    s.first_seq = span_seq_;
  } else {
    for (size_t k = 1; k <= d; ++k) spans.push_back(mean[(at + k) % d]);
    s.first_seq = span_seq_ + 1;
  }
  const redundancy::TransferModel model{Median(startup_s_), Median(burst_bytes_per_s_)};
  if (!redundancy::PartitionCheckpoint(spans, bytes, copies, piece_limit_bytes, options_.mu, model,
                                       &s.plan)
           .ok()) {
    return std::nullopt;  // out of its bounds: replicate at once
  }
  s.spans = static_cast<uint32_t>(spans.size());
  return s;
}

double TrafficInterleaver::WaitBoundSecondsLocked() const {
  return std::clamp(4 * Median(iteration_s_), 0.2, 10.0);
}

bool TrafficInterleaver::WaitForSpan(uint64_t seq, bool unbounded) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(WaitBoundSecondsLocked()));
  const bool met = cv_.wait_until(lock, deadline, [&] {
    return stop_ || trainer_waits_ > 0 || (span_seq_ >= seq && (unbounded || !busy_));
  });
  if (!stop_ && trainer_waits_ == 0 && (!met || (!unbounded && span_seq_ > seq))) ++stats_.late;
  return met && !stop_;
}

void TrafficInterleaver::TrainerWaits(bool begins) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_ASSERT(begins || trainer_waits_ > 0);
  trainer_waits_ += begins ? 1 : -1;
  cv_.notify_all();
}

void TrafficInterleaver::RecordSent(uint64_t bytes, bool overflow) {
  std::lock_guard<std::mutex> lock(mu_);
  (overflow ? stats_.overflow_bytes : stats_.bytes) += bytes;
}

void TrafficInterleaver::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

TrafficInterleaver::Stats TrafficInterleaver::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  size_t support = 0;
  const std::vector<double> mean = profile_.MeanSpans(&support);
  s.profiled_iterations = support;
  s.spans = mean.size();
  double idle = 0;
  for (double t : mean) idle += t;
  s.idle_ns = static_cast<uint64_t>(idle * 1e9);
  return s;
}

}  // namespace ckpt::engine
