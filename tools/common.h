// What the ckptdb subcommands share: exit codes, opening a store read-only, listing versions
// into owned records, and the small formatting helpers of their text output.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "util/status.h"

namespace ckpt::tools {

// Exit codes of every subcommand (docs/cli.md).
inline constexpr int kExitOk = 0;       // done, nothing wrong
inline constexpr int kExitProblem = 1;  // ran, and found or hit a problem with the data
inline constexpr int kExitUsage = 2;    // bad arguments, or no store to work on

struct CloseDb {
  void operator()(ckptdb* db) const { ckptdb_close(db); }
};
using DbHandle = std::unique_ptr<ckptdb, CloseDb>;

// An anonymous or file mapping, unmapped when it goes out of scope.
struct Mapping {
  void* data = MAP_FAILED;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();
};

// Writes all of [data, data + bytes) to fd (retrying short writes and EINTR); `what` names the
// file in errors. No fsync.
Status WriteAll(int fd, const void* data, uint64_t bytes, const std::string& what);

// The exit code for a failed call's status: kExitUsage for bad arguments and for no such store,
// version or name (CKPTDB_EINVAL, CKPTDB_ENOTFOUND); kExitProblem for everything else, damaged
// data and metadata (CKPTDB_ECORRUPT) and full disks among them.
int ExitCodeFor(int status);

// "CKPTDB_ENOTFOUND: <ckptdb_last_error()>".
std::string ErrorText(int status);

// Opens the store at `root` read-only (no recovery, no lock, no writes: safe beside a running
// trainer). On failure prints the reason to stderr and returns ExitCodeFor(status).
int OpenReadOnly(const std::string& root, DbHandle* out);
// Rank `rank`'s view of tier directories alone (a read-only open with tiers and no root). Says
// why on stderr when it fails, except, with quiet_if_absent, that the rank has nothing there
// (kExitUsage then, as for any NotFound).
int OpenTierView(const std::string& tiers, uint32_t rank, bool quiet_if_absent, DbHandle* out);
// The most ranks a tool opens views of.
inline constexpr uint32_t kMaxViewRanks = 65536;

struct Residency {
  std::string tier;
  std::string path;
  int state = 0;
  bool configured = false;
};

struct VersionRecord {
  uint64_t version = 0;
  int state = 0;
  uint32_t rank = 0;
  uint64_t data_bytes = 0;
  uint32_t tensor_count = 0;
  uint32_t chunk_count = 0;
  uint64_t created_unix_ns = 0;
  uint64_t committed_unix_ns = 0;
  std::vector<Residency> residency;
};

// Every version the catalog knows, oldest first. Returns a ckptdb status.
int ListVersions(ckptdb* db, std::vector<VersionRecord>* out);

struct TensorRecord {
  std::string name;
  int dtype = 0;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> global_shape;   // empty when the shard is the whole tensor
  std::vector<uint64_t> global_offset;  // empty when the shard is the whole tensor
  uint64_t bytes = 0;
  uint32_t chunk_count = 0;
  uint64_t kept_bytes = 0;    // less than bytes: a shard its replica group deduplicated
  uint64_t parity_bytes = 0;  // its AEC parity units ("aec", "arc+aec" groups)
  bool recomputed = false;    // a recomputed replica of the next member's shard (REFT's AOR)
};

// The tensors of committed `version`, in name order. Returns a ckptdb status.
int ListTensors(ckptdb* db, uint64_t version, std::vector<TensorRecord>* out);

// Parses a version number given on the command line ("17"); false for anything else.
bool ParseVersion(const std::string& text, uint64_t* out);

std::string HumanBytes(uint64_t bytes);                   // "552.6 MiB"
std::string FormatShape(const std::vector<uint64_t>& s);  // "[32000, 1024]"
std::string FormatUnixNs(uint64_t unix_ns);               // "2026-11-22T14:01:02Z", "-" for 0
const char* ResidencyName(int state);                     // "DURABLE", ...

}  // namespace ckpt::tools
