#include "engine/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "engine/cluster.h"
#include "engine/internal.h"
#include "format/segment_format.h"
#include "util/text.h"

namespace ckpt::engine {
namespace {

// Environment fallbacks for unset options (DESIGN.md section 3: "env fills unset ones").
const char* EnvOr(const char* value, const char* name) {
  if (value != nullptr && value[0] != '\0') return value;
  const char* e = std::getenv(name);
  return (e != nullptr && e[0] != '\0') ? e : nullptr;
}

Status EnvU32(uint32_t value, const char* name, uint32_t fallback, uint32_t* out) {
  if (value != CKPTDB_UNSET) {
    *out = value;
    return Status::Ok();
  }
  const char* e = std::getenv(name);
  if (e == nullptr || e[0] == '\0') {
    *out = fallback;
    return Status::Ok();
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(e, &end, 10);
  if (errno != 0 || *end != '\0' || e[0] == '-' || v >= CKPTDB_UNSET) {
    return Status::Invalid(std::string("environment ") + name + "=\"" + e +
                           "\" is not a non-negative integer");
  }
  *out = static_cast<uint32_t>(v);
  return Status::Ok();
}

// CKPTDB_EC_UNIT_BYTES: the unit segments are cut into for coding (tests use small ones to get
// many stripes).
Status EcUnitBytes(uint64_t* out) {
  const char* unit = std::getenv("CKPTDB_EC_UNIT_BYTES");
  if (unit == nullptr || *unit == '\0') return Status::Ok();
  char* end = nullptr;
  errno = 0;
  const unsigned long long bytes = std::strtoull(unit, &end, 10);
  if (errno != 0 || *end != '\0' || unit[0] == '-' || bytes < format::kBlockBytes ||
      !format::IsAligned(bytes) || bytes > (uint64_t{64} << 20)) {
    return Status::Invalid(std::string("environment CKPTDB_EC_UNIT_BYTES=\"") + unit +
                           "\": a multiple of 4096 from 4096 to 64 MiB");
  }
  *out = bytes;
  return Status::Ok();
}

// CKPTDB_INTERLEAVE (on, off), CKPTDB_INTERLEAVE_PROFILE (iterations profiled before a plan,
// 1 to 1000) and CKPTDB_INTERLEAVE_MU_PERCENT (the share of an idle span planned, 1 to 100).
Status Interleave(InterleaveOptions* out) {
  if (const char* e = std::getenv("CKPTDB_INTERLEAVE"); e != nullptr && e[0] != '\0') {
    const std::string v = e;
    if (v != "on" && v != "off") {
      return Status::Invalid("environment CKPTDB_INTERLEAVE=\"" + v + "\" is not on or off");
    }
    out->enabled = v == "on";
  }
  uint32_t n = 0;
  Status st = EnvU32(CKPTDB_UNSET, "CKPTDB_INTERLEAVE_PROFILE", out->profile_iterations, &n);
  if (st.ok() && (n < 1 || n > redundancy::kMaxProfiledIterations)) {
    st = Status::Invalid("environment CKPTDB_INTERLEAVE_PROFILE=" + std::to_string(n) + ": 1 to " +
                         std::to_string(redundancy::kMaxProfiledIterations));
  }
  if (!st.ok()) return st;
  out->profile_iterations = n;
  const uint32_t fallback = static_cast<uint32_t>(out->mu * 100 + 0.5);
  st = EnvU32(CKPTDB_UNSET, "CKPTDB_INTERLEAVE_MU_PERCENT", fallback, &n);
  if (st.ok() && (n < 1 || n > 100)) {
    st = Status::Invalid("environment CKPTDB_INTERLEAVE_MU_PERCENT=" + std::to_string(n) +
                         ": 1 to 100");
  }
  if (st.ok()) out->mu = n / 100.0;
  return st;
}

// CKPTDB_REPORT_FD: a descriptor open for writing, where a listening rank reports its address.
Status ReportFd(int* out) {
  const char* e = std::getenv("CKPTDB_REPORT_FD");
  *out = -1;
  if (e == nullptr || e[0] == '\0') return Status::Ok();
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(e, &end, 10);
  const std::string what = std::string("environment CKPTDB_REPORT_FD=\"") + e + "\"";
  if (errno != 0 || *end != '\0' || e[0] == '-' || e[0] == '+' || v > INT_MAX) {
    return Status::Invalid(what + " is not a file descriptor number");
  }
  const int flags = ::fcntl(static_cast<int>(v), F_GETFL);
  if (flags < 0) return Status::Invalid(what + " is not an open file descriptor");
  if ((flags & O_ACCMODE) == O_RDONLY) {
    return Status::Invalid(what + " is not open for writing");
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

// The options ckptdb_open and ckptdb_serve share: tiers and the job's, from the environment
// where unset.
Status ResolveJobOptions(const ckptdb_options* o, DbOptions* out) {
  DbOptions& d = *out;
  if (const char* t = EnvOr(o->tiers, "CKPTDB_TIERS")) d.tiers = t;
  Status st = EnvU32(o->rank, "CKPTDB_RANK", 0, &d.rank);
  if (st.ok()) st = EnvU32(o->world_size, "CKPTDB_WORLD_SIZE", 1, &d.world_size);
  if (!st.ok()) return st;
  if (const char* n = EnvOr(o->node_id, "CKPTDB_NODE_ID")) {
    d.node_id = n;
  } else {
    char host[HOST_NAME_MAX + 1] = {};
    if (gethostname(host, sizeof host - 1) == 0) d.node_id = host;
  }
  if (const char* r = EnvOr(o->redundancy, "CKPTDB_REDUNDANCY")) d.redundancy = r;
  if (const char* c = EnvOr(o->coordinator, "CKPTDB_COORDINATOR")) d.coordinator = c;
  if (const char* j = EnvOr(o->job_token, "CKPTDB_JOB_TOKEN")) d.job_token = j;
  if (const char* c = EnvOr(o->commit_tier, "CKPTDB_COMMIT_TIER")) d.commit_tier = c;
  // Job knobs read from the environment only (docs/api.md, "A job of many ranks").
  if (const char* l = std::getenv("CKPTDB_LISTEN")) d.listen = l;
  if (const char* t = std::getenv("CKPTDB_UCX_TLS")) d.ucx_tls = t;
  if (st.ok()) st = ReportFd(&d.report_fd);
  uint32_t ms = 0;
  if (st.ok()) st = EnvU32(CKPTDB_UNSET, "CKPTDB_HEARTBEAT_MS", 200, &ms);
  d.heartbeat_ms = static_cast<int>(std::max(ms, 10u));
  if (st.ok()) st = EnvU32(CKPTDB_UNSET, "CKPTDB_DEAD_AFTER_MS", 3000, &ms);
  d.dead_after_ms = static_cast<int>(std::max(ms, 2u * static_cast<uint32_t>(d.heartbeat_ms)));
  if (st.ok()) st = EnvU32(CKPTDB_UNSET, "CKPTDB_JOIN_TIMEOUT_MS", 60000, &ms);
  d.join_timeout_ms = static_cast<int>(ms);
  uint32_t mbps = 0;
  if (st.ok()) st = EnvU32(CKPTDB_UNSET, "CKPTDB_REPLICATE_MBPS", 0, &mbps);
  d.replicate_bytes_per_s = uint64_t{mbps} << 20;
  if (st.ok()) st = EcUnitBytes(&d.ec_unit_bytes);
  if (st.ok()) st = Interleave(&d.interleave);
  return st;
}

}  // namespace

Status ParseBackpressure(const std::string& text, Backpressure* out) {
  if (text == "block") {
    *out = Backpressure::kBlock;
  } else if (text == "direct") {
    *out = Backpressure::kDirect;
  } else if (text == "skip") {
    *out = Backpressure::kSkip;
  } else {
    return Status::Invalid("options: backpressure \"" + text +
                           "\" is not one of block, direct, skip");
  }
  return Status::Ok();
}

Status ParseCpuList(const std::string& text, std::vector<int>* out) {
  out->clear();
  auto bad = [&](const std::string& why) {
    return Status::Invalid("options: cpus \"" + text.substr(0, 64) +
                           (text.size() > 64 ? "...\"" : "\"") + ": " + why +
                           " (a CPU list such as \"2-7,12\")");
  };
  if (text.empty()) return bad("empty");
  std::vector<bool> seen(kMaxCpus, false);
  size_t at = 0;
  while (true) {
    auto number = [&](int* value) {
      size_t digits = 0;
      long v = 0;
      while (at < text.size() && text[at] >= '0' && text[at] <= '9' && digits < 5) {
        v = v * 10 + (text[at++] - '0');
        ++digits;
      }
      if (digits == 0) return false;
      *value = static_cast<int>(v);
      return true;
    };
    int first = 0;
    if (!number(&first)) return bad("a CPU number expected at character " + std::to_string(at));
    int last = first;
    if (at < text.size() && text[at] == '-') {
      ++at;
      if (!number(&last)) return bad("a CPU number expected after '-'");
    }
    if (last < first) return bad(std::to_string(first) + "-" + std::to_string(last) + " descends");
    if (last >= kMaxCpus) {
      return bad("CPU " + std::to_string(last) + " is not below " + std::to_string(kMaxCpus));
    }
    for (int cpu = first; cpu <= last; ++cpu) {
      if (!seen[static_cast<size_t>(cpu)]) out->push_back(cpu);
      seen[static_cast<size_t>(cpu)] = true;
    }
    if (at == text.size()) return Status::Ok();
    if (text[at] != ',') return bad("unexpected '" + text.substr(at, 1) + "'");
    ++at;
  }
}

Status ResolveOpenOptions(const ckptdb_options& o, DbOptions* out) {
  DbOptions& d = *out;
  const char* root = EnvOr(o.root, "CKPTDB_ROOT");
  // Read-only, tiers without a root read a tier directory alone (engine/tier_view.h).
  if (root == nullptr && !(o.read_only != 0 && EnvOr(o.tiers, "CKPTDB_TIERS") != nullptr)) {
    return Status::Invalid(
        "ckptdb_open: no root: set options.root or CKPTDB_ROOT (or, read-only, tiers alone to "
        "read a tier directory without its store)");
  }
  d.root = root == nullptr ? "" : root;
  CKPTDB_RETURN_IF_ERROR(ResolveJobOptions(&o, &d));
  if (const char* b = EnvOr(o.backpressure, "CKPTDB_BACKPRESSURE")) {
    CKPTDB_RETURN_IF_ERROR(ParseBackpressure(b, &d.backpressure));
  }
  if (o.staging_bytes != 0) d.staging_bytes = o.staging_bytes;
  if (o.chunk_bytes != 0) d.chunk_bytes = o.chunk_bytes;
  if (o.queue_depth != 0) d.queue_depth = o.queue_depth;
  if (o.capture_threads != 0) d.capture_threads = o.capture_threads;
  d.read_only = o.read_only != 0;
  d.create_if_missing = o.create_if_missing != 0;
  d.drain_on_close = o.drain_on_close != 0;
  d.drop_tiers = o.drop_tiers != 0;
  if (const char* drop = std::getenv("CKPTDB_DROP_TIERS"); drop != nullptr && o.drop_tiers == 0) {
    if (std::strcmp(drop, "1") != 0 && std::strcmp(drop, "0") != 0) {
      return Status::Invalid("CKPTDB_DROP_TIERS must be 0 or 1, not " + QuoteName(drop));
    }
    d.drop_tiers = std::strcmp(drop, "1") == 0;
  }
  if (const char* cpus = EnvOr(o.cpus, "CKPTDB_CPUS")) {
    CKPTDB_RETURN_IF_ERROR(ParseCpuList(cpus, &d.cpus));
  }
  if (const char* device = EnvOr(o.device, "CKPTDB_DEVICE")) {
    d.device = device;
    if (d.device != "auto" && d.device != "sim") {
      return Status::Invalid("options: device " + QuoteName(d.device) +
                             " is not one of auto (the build's GPU runtime), sim (the "
                             "simulated device)");
    }
  }
  return Status::Ok();
}

Status ResolveServeOptions(const ckptdb_options& o, DbOptions* out) {
  return ResolveJobOptions(&o, out);
}

Status ResolveRepairOptions(const ckptdb_options& o, DbOptions* out) {
  const char* root = EnvOr(o.root, "CKPTDB_ROOT");
  if (root == nullptr) {
    return Status::Invalid("ckptdb_repair: no root: set options.root or CKPTDB_ROOT");
  }
  out->root = root;
  if (o.tiers != nullptr) out->tiers = o.tiers;
  return Status::Ok();
}

// Every option is checked before anything is touched: a bad value changes nothing.
Status ValidateOptions(const DbOptions& o) {
  // Read-only without a root: a view of tier directories, of any rank of the job that wrote them.
  const bool view = o.tier_view || (o.read_only && o.root.empty() && !o.tiers.empty());
  if (o.root.empty() && !view) {
    return Status::Invalid("options: root is empty; name the store's directory");
  }
  if (o.world_size == 0 || o.world_size > 65536) {
    return Status::Invalid("options: world_size " + std::to_string(o.world_size) +
                           " must be 1..65536");
  }
  if (view && o.rank >= 65536) {
    return Status::Invalid("options: rank " + std::to_string(o.rank) + " is not below 65536");
  }
  if (!view && o.rank >= o.world_size) {
    return Status::Invalid("options: rank " + std::to_string(o.rank) + " is not below world_size " +
                           std::to_string(o.world_size));
  }
  uint32_t replicas = 1;
  std::optional<redundancy::CodeSpec> code;
  CKPTDB_RETURN_IF_ERROR(ParseRedundancy(o.redundancy, &replicas, &code).WithContext("options"));
  if ((replicas > 1 || code) && o.world_size == 1) {
    return Status::Invalid("options: redundancy \"" + o.redundancy +
                           "\" needs peers: world_size is 1");
  }
  if (o.chunk_bytes < format::kBlockBytes || o.chunk_bytes > format::kMaxChunkBytes ||
      !format::IsAligned(o.chunk_bytes)) {
    return Status::Invalid("options: chunk_bytes " + std::to_string(o.chunk_bytes) +
                           " must be a multiple of 4096 between 4096 and 1 GiB");
  }
  if (o.queue_depth < 2 || o.queue_depth > 4096) {
    return Status::Invalid("options: queue_depth " + std::to_string(o.queue_depth) +
                           " must be between 2 and 4096");
  }
  if (o.capture_threads == 0 || o.capture_threads > kMaxCaptureThreads) {
    return Status::Invalid("options: capture_threads " + std::to_string(o.capture_threads) +
                           " must be between 1 and " + std::to_string(kMaxCaptureThreads));
  }
  const uint64_t record_bytes = format::RecordBytes(o.chunk_bytes);
  if (!o.read_only && o.staging_bytes / record_bytes < 2) {
    return Status::Invalid("options: staging_bytes " + std::to_string(o.staging_bytes) +
                           " holds fewer than 2 chunks of " + std::to_string(o.chunk_bytes) +
                           " bytes plus their 4096-byte record headers");
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
