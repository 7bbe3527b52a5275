#include "redundancy/interleave.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "util/assert.h"

namespace ckpt::redundancy {

Status PartitionCheckpoint(std::span<const double> idle_spans_s, uint64_t checkpoint_bytes,
                           uint32_t copies, uint64_t piece_limit_bytes, double mu,
                           const TransferModel& model, PartitionPlan* out) {
  *out = {};
  if (idle_spans_s.empty() || idle_spans_s.size() > kMaxIdleSpans) {
    return Status::Invalid("interleave: " + std::to_string(idle_spans_s.size()) +
                           " idle spans (1 to " + std::to_string(kMaxIdleSpans) + ")");
  }
  for (double t : idle_spans_s) {
    if (!std::isfinite(t) || t < 0) {
      return Status::Invalid("interleave: an idle span of " + std::to_string(t) + " s");
    }
  }
  if (!(mu > 0 && mu <= 1)) {
    return Status::Invalid("interleave: mu " + std::to_string(mu) + " is not in (0, 1]");
  }
  if (piece_limit_bytes == 0) return Status::Invalid("interleave: a piece limit of 0 bytes");
  if (!(model.bytes_per_s > 0) || !std::isfinite(model.bytes_per_s) || !(model.alpha_s >= 0) ||
      !std::isfinite(model.alpha_s)) {
    return Status::Invalid("interleave: a transfer model of alpha " +
                           std::to_string(model.alpha_s) + " s and B " +
                           std::to_string(model.bytes_per_s) + " B/s");
  }
  if (checkpoint_bytes == 0 || copies == 0) return Status::Ok();
  // The plan's size is bounded before it is built: every partition but the last of a span is
  // either a full piece or at least kMinPartitionBytes, so a copy needs at most
  // bytes / min(piece, min partition) + one per span.
  const uint64_t smallest = std::min(piece_limit_bytes, kMinPartitionBytes);
  const double bound =
      static_cast<double>(copies) * (static_cast<double>(checkpoint_bytes / smallest) + 2.0 +
                                     static_cast<double>(idle_spans_s.size()));
  if (bound > static_cast<double>(kMaxPartitions)) {
    return Status::Invalid("interleave: " + std::to_string(copies) + " copies of " +
                           std::to_string(checkpoint_bytes) + " bytes in pieces of " +
                           std::to_string(piece_limit_bytes) + " could need more than " +
                           std::to_string(kMaxPartitions) + " partitions");
  }
  const double full_piece_s = model.Seconds(piece_limit_bytes);
  const double min_piece_s = model.Seconds(std::min(piece_limit_bytes, kMinPartitionBytes));
  uint32_t copy = 0;
  uint64_t remain_bytes = checkpoint_bytes;  // of the copy being placed
  const size_t last = idle_spans_s.size() - 1;
  for (size_t span = 0; span < idle_spans_s.size(); ++span) {
    const bool unbounded = span == last;  // line 2: t[d] = +infinity
    double remain_s = unbounded ? std::numeric_limits<double>::infinity() : mu * idle_spans_s[span];
    while (remain_s > 0) {
      uint64_t size = piece_limit_bytes;  // lines 9-10
      if (remain_s < full_piece_s) {
        // Line 12: what fits in the rest of the span; less than a minimum partition is not sent.
        if (remain_s < min_piece_s) break;
        const double fits = (remain_s - model.alpha_s) * model.bytes_per_s;
        size = std::min<uint64_t>(piece_limit_bytes, static_cast<uint64_t>(fits));
        if (size == 0) break;
      }
      size = std::min(size, remain_bytes);  // line 14
      out->partitions.push_back(
          {static_cast<uint32_t>(span), copy, checkpoint_bytes - remain_bytes, size});
      if (unbounded) out->overflow_bytes += size;
      remain_bytes -= size;
      remain_s -= model.Seconds(size);  // line 18, with f(size): see the header
      if (remain_bytes == 0) {          // lines 21-28
        if (++copy == copies) return Status::Ok();
        remain_bytes = checkpoint_bytes;
      }
    }
  }
  CKPTDB_ASSERT(false && "the last span is unbounded: every byte is placed");
  return Status::Ok();
}

IdleProfile::IdleProfile(size_t window)
    : window_(std::clamp<size_t>(window, 1, kMaxProfiledIterations)) {}

bool IdleProfile::AddIteration(std::span<const double> spans_s) {
  if (spans_s.empty() || spans_s.size() > kMaxIdleSpans) return false;
  for (double t : spans_s) {
    if (!std::isfinite(t) || t < 0) return false;
  }
  if (iterations_.size() == window_) iterations_.erase(iterations_.begin());
  iterations_.emplace_back(spans_s.begin(), spans_s.end());
  return true;
}

std::vector<double> IdleProfile::MeanSpans(size_t* support) const {
  if (support != nullptr) *support = 0;
  if (iterations_.empty()) return {};
  std::map<size_t, size_t> counts;  // span count -> iterations with it
  size_t modal = 0, best = 0;
  for (const auto& it : iterations_) {
    const size_t n = ++counts[it.size()];
    if (n >= best) {
      best = n;
      modal = it.size();
    }
  }
  std::vector<double> mean(modal, 0.0);
  for (const auto& it : iterations_) {
    if (it.size() != modal) continue;
    for (size_t i = 0; i < modal; ++i) mean[i] += it[i];
  }
  for (double& t : mean) t /= static_cast<double>(best);
  if (support != nullptr) *support = best;
  return mean;
}

}  // namespace ckpt::redundancy
