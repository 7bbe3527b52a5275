// The handle's figures (ckptdb_stats): a component of its own. The capture, commit, demotion
// and read paths add to its counters, each an atomic, so none needs the handle's lock for them;
// the last restore's sources are kept under a lock of its own. A snapshot taken while calls run
// may count one figure of a call and not yet the next (each figure is a sum on its own).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "ckptdb/ckptdb.h"

namespace ckpt::engine {

class Figures {
 public:
  std::atomic<uint64_t> put_calls{0};
  std::atomic<uint64_t> put_bytes{0};
  std::atomic<uint64_t> put_blocked_ns{0};
  std::atomic<uint64_t> wait_capture_calls{0};
  std::atomic<uint64_t> wait_capture_blocked_ns{0};
  std::atomic<uint64_t> capture_bytes{0};
  std::atomic<uint64_t> capture_ns{0};
  std::atomic<uint64_t> commits{0};
  std::atomic<uint64_t> commit_blocked_ns{0};
  std::atomic<uint64_t> aborts{0};
  std::atomic<uint64_t> skipped_versions{0};
  std::atomic<uint64_t> backpressure_waits{0};
  std::atomic<uint64_t> backpressure_wait_ns{0};
  std::atomic<uint64_t> direct_chunks{0};
  std::atomic<uint64_t> fsyncs{0};
  std::atomic<uint64_t> restore_calls{0};
  std::atomic<uint64_t> restore_bytes{0};
  std::atomic<uint64_t> restore_ns{0};
  std::atomic<uint64_t> checksum_failures{0};

  // A restore that succeeded: the fastest source that served any of its bytes, and all of them
  // ("SOURCE BYTES" pairs joined by "; "; cut to what ckptdb_stats_t holds, ending in "...").
  void SetLastRestore(const std::string& first_source, const std::string& sources);

  // The counters and the last restore into *out; the rest of it is left as it is.
  void Snapshot(ckptdb_stats_t* out) const;

 private:
  mutable std::mutex mu_;
  std::string last_restore_tier_;
  std::string last_restore_sources_;
};

}  // namespace ckpt::engine
