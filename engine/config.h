// The configuration: one place that turns a caller's ckptdb_options and the environment into a
// DbOptions (DESIGN.md section 3: the environment fills what the caller left unset), and checks
// it whole before anything is touched. ckptdb_open, ckptdb_serve and ckptdb_repair resolve here;
// Db::Open validates here first. Nothing else in the library reads a CKPTDB_ variable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/traffic_interleaver.h"
#include "io/io.h"
#include "util/status.h"

namespace ckpt::engine {

enum class Backpressure : uint8_t { kBlock, kDirect, kSkip };

struct DbOptions {
  std::string root;
  // Empty: the catalog's (the last read-write open's), else "disk:<root>/segments". A writer
  // may leave out tiers that hold committed copies only with drop_tiers (tier_choice.cc).
  std::string tiers;
  bool drop_tiers = false;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string node_id;
  std::string redundancy = "none";
  std::string coordinator;  // host:port of rank 0's listener (world_size > 1)
  std::string job_token;    // authenticates every connection between ranks (world_size > 1)
  std::string listen;       // host:port this rank accepts peers on; empty: coordinator's host
  std::string ucx_tls;      // UCX_TLS for ckptdb's channel; empty: UCX's choice
  int report_fd = -1;       // where the rank writes the address it listens on; -1: nowhere
  uint64_t ec_unit_bytes = uint64_t{4} << 20;  // the unit segments are cut into for coding
  uint64_t replicate_bytes_per_s = 0;          // replication bandwidth cap; 0: none
  InterleaveOptions interleave;                // GEMINI's traffic interleaving (CKPTDB_INTERLEAVE*)
  int heartbeat_ms = 200;
  int dead_after_ms = 3000;
  int join_timeout_ms = 60000;
  std::string commit_tier;  // a tier name or kind; empty: the first tier
  Backpressure backpressure = Backpressure::kBlock;
  uint64_t staging_bytes = 64ull << 20;
  uint64_t chunk_bytes = 4ull << 20;
  uint32_t queue_depth = 64;
  uint32_t capture_threads = 2;
  bool read_only = false;
  // Set by Db::Open for a read-only open of tier directories alone (engine/tier_view.h): root is
  // then the view's private root, and rank any rank of the job that wrote them.
  bool tier_view = false;
  bool create_if_missing = true;
  bool drain_on_close = true;
  std::vector<int> cpus;        // where the threads open starts run; empty: the caller's CPUs
  std::string device = "auto";  // io::OpenDevice's `which`: "auto" or "sim"
  io::Io* io = nullptr;         // nullptr: the real POSIX + io_uring Io
};

// Parses "block", "direct", "skip".
Status ParseBackpressure(const std::string& text, Backpressure* out);

// Parses a Linux CPU list ("0-3,8,10-11"): CPUs below kMaxCpus, ranges ascending, at least one.
constexpr int kMaxCpus = 1024;  // CPU_SETSIZE
Status ParseCpuList(const std::string& text, std::vector<int>* out);

// ckptdb_open's options: every field of `o`, the environment where one is unset. Invalid naming
// the field or variable (nothing is opened or made).
Status ResolveOpenOptions(const ckptdb_options& o, DbOptions* out);
// ckptdb_serve's: the tiers and the job's options (coordinator, token, listen, ...).
Status ResolveServeOptions(const ckptdb_options& o, DbOptions* out);
// ckptdb_repair's: the root and the tiers.
Status ResolveRepairOptions(const ckptdb_options& o, DbOptions* out);

// Every value of `o` within its bounds (Db::Open's first step: a bad value changes nothing).
Status ValidateOptions(const DbOptions& o);

}  // namespace ckpt::engine
