#include "tools/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace ckpt::tools {

Mapping::~Mapping() {
  if (data != MAP_FAILED) munmap(data, bytes);
}

Status WriteAll(int fd, const void* data, uint64_t bytes, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t done = 0;
  while (done < bytes) {
    size_t step = static_cast<size_t>(std::min<uint64_t>(bytes - done, uint64_t{1} << 30));
    ssize_t n = write(fd, p + done, step);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "write " + what);
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

int ExitCodeFor(int status) {
  if (status == CKPTDB_OK) return kExitOk;
  return status == CKPTDB_EINVAL || status == CKPTDB_ENOTFOUND ? kExitUsage : kExitProblem;
}

std::string ErrorText(int status) {
  std::string text = ckptdb_status_name(status);
  const char* message = ckptdb_last_error();
  if (message != nullptr && *message != '\0') text += std::string(": ") + message;
  return text;
}

int OpenReadOnly(const std::string& root, DbHandle* out) {
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.read_only = 1;
  o.create_if_missing = 0;
  ckptdb* db = nullptr;
  int rc = ckptdb_open(&o, &db);
  if (rc != CKPTDB_OK) {
    std::fprintf(stderr, "ckptdb: cannot open store %s: %s\n", root.c_str(), ErrorText(rc).c_str());
    if (rc == CKPTDB_ECORRUPT) {
      std::fprintf(stderr,
                   "ckptdb: the store's metadata is damaged; `ckptdb repair %s` rebuilds "
                   "the catalog from what verifies\n",
                   root.c_str());
    }
    return ExitCodeFor(rc);
  }
  out->reset(db);
  return kExitOk;
}

int OpenTierView(const std::string& tiers, uint32_t rank, bool quiet_if_absent, DbHandle* out) {
  // A root from the environment would turn the view into an open of that store.
  ::unsetenv("CKPTDB_ROOT");
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.tiers = tiers.c_str();
  o.rank = rank;
  o.read_only = 1;
  o.create_if_missing = 0;
  ckptdb* db = nullptr;
  const int rc = ckptdb_open(&o, &db);
  if (rc != CKPTDB_OK) {
    if (!(quiet_if_absent && rc == CKPTDB_ENOTFOUND)) {
      std::fprintf(stderr, "ckptdb: cannot read tiers %s (rank %u): %s\n", tiers.c_str(), rank,
                   ErrorText(rc).c_str());
    }
    return ExitCodeFor(rc);
  }
  out->reset(db);
  return kExitOk;
}

int ListVersions(ckptdb* db, std::vector<VersionRecord>* out) {
  out->clear();
  auto collect = [](void* arg, const ckptdb_version_info* info) -> int {
    auto* records = static_cast<std::vector<VersionRecord>*>(arg);
    VersionRecord r;
    r.version = info->version;
    r.state = info->state;
    r.rank = info->rank;
    r.data_bytes = info->data_bytes;
    r.tensor_count = info->tensor_count;
    r.chunk_count = info->chunk_count;
    r.created_unix_ns = info->created_unix_ns;
    r.committed_unix_ns = info->committed_unix_ns;
    for (uint32_t i = 0; i < info->residency_count; i++) {
      const ckptdb_residency& res = info->residency[i];
      r.residency.push_back({res.tier, res.path, res.state, res.configured != 0});
    }
    records->push_back(std::move(r));
    return 0;
  };
  return ckptdb_list_versions(db, collect, out);
}

int ListTensors(ckptdb* db, uint64_t version, std::vector<TensorRecord>* out) {
  out->clear();
  auto collect = [](void* arg, const ckptdb_tensor_desc* t) -> int {
    auto* records = static_cast<std::vector<TensorRecord>*>(arg);
    TensorRecord r;
    r.name = t->name;
    r.dtype = t->dtype;
    r.shape.assign(t->shape, t->shape + t->ndim);
    if (t->global_shape != nullptr)
      r.global_shape.assign(t->global_shape, t->global_shape + t->ndim);
    if (t->global_offset != nullptr) {
      r.global_offset.assign(t->global_offset, t->global_offset + t->ndim);
    }
    r.bytes = t->nbytes;
    r.chunk_count = t->chunk_count;
    r.kept_bytes = t->kept_bytes;
    r.parity_bytes = t->parity_bytes;
    r.recomputed = t->recomputed != 0;
    records->push_back(std::move(r));
    return 0;
  };
  return ckptdb_list(db, version, collect, out);
}

bool ParseVersion(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  if (value == CKPTDB_ALL_VERSIONS) return false;
  *out = value;
  return true;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    unit++;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " B", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  }
  return text;
}

std::string FormatShape(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); i++) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string FormatUnixNs(uint64_t unix_ns) {
  if (unix_ns == 0) return "-";
  time_t seconds = static_cast<time_t>(unix_ns / 1000000000u);
  struct tm utc;
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

const char* ResidencyName(int state) {
  switch (state) {
    case CKPTDB_RESIDENT_WRITING:
      return "WRITING";
    case CKPTDB_RESIDENT_DURABLE:
      return "DURABLE";
    case CKPTDB_RESIDENT_MISSING:
      return "MISSING";
    case CKPTDB_RESIDENT_EVICTED:
      return "EVICTED";
    case CKPTDB_RESIDENT_PENDING:
      return "PENDING";
    default:
      return "?";
  }
}

}  // namespace ckpt::tools
