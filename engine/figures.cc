#include "engine/figures.h"

#include <cstdio>

namespace ckpt::engine {

void Figures::SetLastRestore(const std::string& first_source, const std::string& sources) {
  std::string cut = sources;
  if (cut.size() >= sizeof(ckptdb_stats_t::last_restore_sources)) {
    cut.resize(sizeof(ckptdb_stats_t::last_restore_sources) - 4);
    cut += "...";
  }
  std::lock_guard<std::mutex> lock(mu_);
  last_restore_tier_ = first_source;
  last_restore_sources_ = std::move(cut);
}

void Figures::Snapshot(ckptdb_stats_t* out) const {
  out->put_calls = put_calls.load();
  out->put_bytes = put_bytes.load();
  out->put_blocked_ns = put_blocked_ns.load();
  out->wait_capture_calls = wait_capture_calls.load();
  out->wait_capture_blocked_ns = wait_capture_blocked_ns.load();
  out->capture_bytes = capture_bytes.load();
  out->capture_ns = capture_ns.load();
  out->commits = commits.load();
  out->commit_blocked_ns = commit_blocked_ns.load();
  out->aborts = aborts.load();
  out->skipped_versions = skipped_versions.load();
  out->backpressure_waits = backpressure_waits.load();
  out->backpressure_wait_ns = backpressure_wait_ns.load();
  out->direct_chunks = direct_chunks.load();
  out->fsyncs = fsyncs.load();
  out->restore_calls = restore_calls.load();
  out->restore_bytes = restore_bytes.load();
  out->restore_ns = restore_ns.load();
  out->checksum_failures = checksum_failures.load();
  std::lock_guard<std::mutex> lock(mu_);
  std::snprintf(out->last_restore_tier, sizeof out->last_restore_tier, "%s",
                last_restore_tier_.c_str());
  std::snprintf(out->last_restore_sources, sizeof out->last_restore_sources, "%s",
                last_restore_sources_.c_str());
}

}  // namespace ckpt::engine
