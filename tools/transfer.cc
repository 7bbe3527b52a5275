// ckptdb export (ROOT... | --tiers SPEC) --version V --format safetensors --out FILE
//               [--rank R | --merge]
// ckptdb import FILE --root ROOT --version V [--tiers SPEC [--drop-tiers]]
//
// Export writes one committed version as a safetensors file (tools/safetensors.h): one rank's
// shards as stored, or with --merge the full tensors assembled from every rank's shards by their
// global offsets (ckptdb_restore_slice). Shards' places, raw-bytes records, the version and the
// rank go into the file's __metadata__, so that import of a one-rank export gives back the same
// tensors with the same places. The file appears whole or not at all: written under a temporary
// name, fsynced, then renamed without replacing anything.
//
// Import checks the whole header first (the file is untrusted), then puts every tensor as a
// version of the store and commits it; on any failure the version is aborted, so it is either
// committed whole or not at all.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/safetensors.h"
#include "util/status.h"
#include "util/text.h"

namespace ckpt::tools {
namespace {

constexpr const char* kShardsKey = "ckptdb.shards";  // {name: {global_shape, global_offset}}
constexpr const char* kRawKey = "ckptdb.raw";        // {name: shape} of shards put as raw bytes

struct ExportArgs {
  std::vector<std::string> roots;
  std::string tiers;  // without roots: read these tier directories alone, every rank found
  std::string version;
  std::string format = "safetensors";
  std::string out;
  int rank = -1;
  bool merge = false;
};

struct Store {
  std::string root;
  DbHandle db;
  uint32_t rank = 0;
  std::vector<TensorRecord> tensors;
};

// One tensor of the file and where its bytes come from.
struct Planned {
  SafetensorsTensor out;
  std::vector<const Store*> from;  // one store: a restore; several (merge): restore_slice each
  const TensorRecord* record = nullptr;  // the first source's
  bool assemble = false;  // the global tensor from the shards' places, else the stored shard
};

bool Whole(const TensorRecord& t) { return t.global_shape.empty(); }

int Fail(const char* command, const std::string& message, int code) {
  std::fprintf(stderr, "ckptdb %s: %s\n", command, SafeMessage(message).c_str());
  return code;
}

bool Meets(const TensorRecord& a, const TensorRecord& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (a.global_offset[d] >= b.global_offset[d] + b.shape[d] ||
        b.global_offset[d] >= a.global_offset[d] + a.shape[d]) {
      return false;
    }
  }
  return true;
}

// The merged tensors: each name's shards (in rank order) assembled into the global tensor.
Status PlanMerge(const std::vector<Store>& stores, std::vector<Planned>* plan) {
  std::map<std::string, std::vector<std::pair<const Store*, const TensorRecord*>>> by_name;
  for (const Store& s : stores) {
    for (const TensorRecord& t : s.tensors) {
      if (t.name.rfind("__ckptdb__/", 0) == 0) continue;  // one rank's own records
      by_name[t.name].emplace_back(&s, &t);
    }
  }
  for (const auto& [name, shards] : by_name) {
    Planned p;
    p.out.name = name;
    const TensorRecord& first = *shards[0].second;
    p.record = &first;
    p.out.dtype = first.dtype == CKPTDB_DTYPE_UNKNOWN ? CKPTDB_DTYPE_U8 : first.dtype;
    if (Whole(first)) {
      // A whole tensor (replicated, or one rank's own): the lowest rank's copy.
      p.out.shape = first.dtype == CKPTDB_DTYPE_UNKNOWN && first.shape.empty()
                        ? std::vector<uint64_t>{first.bytes}
                        : first.shape;
      p.from.push_back(shards[0].first);
      plan->push_back(std::move(p));
      continue;
    }
    std::vector<const TensorRecord*> used;
    for (const auto& [store, t] : shards) {
      if (Whole(*t) || t->global_shape != first.global_shape || t->dtype != first.dtype) {
        return Status::Invalid(
            "tensor " + QuoteName(name) + ": rank " + std::to_string(store->rank) + "'s shard is " +
            ckptdb_dtype_name(t->dtype) + " of global shape " + FormatShape(t->global_shape) +
            ", rank " + std::to_string(shards[0].first->rank) + "'s " +
            ckptdb_dtype_name(first.dtype) + " of " + FormatShape(first.global_shape));
      }
      bool replica = false;
      for (const TensorRecord* u : used) {
        if (u->global_offset == t->global_offset && u->shape == t->shape) {
          replica = true;
        } else if (Meets(*u, *t)) {
          return Status::Invalid("tensor " + QuoteName(name) + ": rank " +
                                 std::to_string(store->rank) + "'s shard at " +
                                 FormatShape(t->global_offset) + " overlaps another at " +
                                 FormatShape(u->global_offset));
        }
      }
      if (replica) continue;
      used.push_back(t);
      p.from.push_back(store);
    }
    p.out.shape = first.global_shape;
    p.assemble = true;
    plan->push_back(std::move(p));
  }
  return Status::Ok();
}

// Reads planned tensor p (of `bytes`) into dst.
Status ReadPlanned(const Planned& p, uint64_t version, uint64_t bytes, void* dst) {
  if (!p.assemble) {
    int rc = ckptdb_restore(p.from[0]->db.get(), version, p.out.name.c_str(), dst, bytes, 0);
    return rc == CKPTDB_OK ? Status::Ok() : Status::Corrupt(ErrorText(rc));
  }
  ckptdb_box box{};
  box.ndim = static_cast<uint32_t>(p.out.shape.size());
  for (size_t d = 0; d < p.out.shape.size(); ++d) box.shape[d] = p.out.shape[d];
  uint64_t covered = 0;
  for (const Store* s : p.from) {
    uint64_t n = 0;
    int rc =
        ckptdb_restore_slice(s->db.get(), version, p.out.name.c_str(), &box, dst, bytes, 0, &n);
    if (rc != CKPTDB_OK) return Status::Corrupt(ErrorText(rc));
    covered += n;
  }
  const uint64_t elements = bytes / ckptdb_dtype_bytes(p.record->dtype);
  if (covered != elements) {
    return Status::Invalid("tensor " + QuoteName(p.out.name) +
                           ": the shards of the roots given hold " + std::to_string(covered) +
                           " of its " + std::to_string(elements) +
                           " elements (is a rank's root missing?)");
  }
  return Status::Ok();
}

int RunExport(const ExportArgs& args) {
  const char* cmd = "export";
  if (args.format != "safetensors") {
    return Fail(cmd, "--format " + args.format + ": the one format written is safetensors",
                kExitUsage);
  }
  if (args.merge && args.rank >= 0)
    return Fail(cmd, "--rank and --merge exclude each other", kExitUsage);
  if (!args.merge && args.rank < 0 && args.roots.size() > 1) {
    return Fail(cmd,
                std::to_string(args.roots.size()) +
                    " roots: say which rank's shards to export (--rank R), or --merge them",
                kExitUsage);
  }
  uint64_t version = 0;
  if (!args.version.empty() && !ParseVersion(args.version, &version)) {
    return Fail(cmd, "--version " + QuoteName(args.version) + " is not a version number",
                kExitUsage);
  }
  if (args.roots.empty() == args.tiers.empty()) {
    return Fail(cmd, "give the store's roots, or --tiers to read tier directories alone",
                kExitUsage);
  }
  std::vector<Store> stores(args.roots.size());
  for (size_t i = 0; i < args.roots.size(); ++i) {
    stores[i].root = args.roots[i];
    if (int rc = OpenReadOnly(args.roots[i], &stores[i].db); rc != kExitOk) return rc;
  }
  // Tier directories alone: rank 0's view, then each next rank's until one has nothing there.
  for (uint32_t rank = 0; !args.tiers.empty() && rank < kMaxViewRanks; ++rank) {
    Store s;
    s.root = "tiers " + args.tiers + " (rank " + std::to_string(rank) + ")";
    const int rc = OpenTierView(args.tiers, rank, /*quiet_if_absent=*/rank > 0, &s.db);
    if (rc == kExitUsage && rank > 0) break;
    if (rc != kExitOk) return rc;
    stores.push_back(std::move(s));
  }
  if (args.version.empty()) {
    // The newest version every root has committed and can restore.
    version = UINT64_MAX;
    for (const Store& s : stores) {
      uint64_t v = 0;
      if (int rc = ckptdb_latest(s.db.get(), &v); rc != CKPTDB_OK) {
        return Fail(cmd, "store " + s.root + " has no restorable version: " + ErrorText(rc),
                    ExitCodeFor(rc));
      }
      version = std::min(version, v);
    }
  }
  std::map<uint32_t, std::string> ranks;
  for (Store& s : stores) {
    std::vector<VersionRecord> versions;
    if (int rc = ListVersions(s.db.get(), &versions); rc != CKPTDB_OK) {
      return Fail(cmd, ErrorText(rc), kExitProblem);
    }
    auto it = std::find_if(versions.begin(), versions.end(),
                           [&](const VersionRecord& r) { return r.version == version; });
    if (it == versions.end()) {
      return Fail(cmd, "store " + s.root + " has no version " + std::to_string(version),
                  kExitUsage);
    }
    s.rank = it->rank;
    if (!ranks.emplace(s.rank, s.root).second) {
      return Fail(cmd,
                  s.root + " and " + ranks[s.rank] + " both hold rank " + std::to_string(s.rank),
                  kExitUsage);
    }
    if (int rc = ListTensors(s.db.get(), version, &s.tensors); rc != CKPTDB_OK) {
      return Fail(cmd, ErrorText(rc),
                  rc == CKPTDB_ENOTFOUND || rc == CKPTDB_ESTATE ? kExitUsage : kExitProblem);
    }
  }
  std::sort(stores.begin(), stores.end(),
            [](const Store& a, const Store& b) { return a.rank < b.rank; });

  std::vector<Planned> plan;
  std::map<std::string, std::string> metadata{{"ckptdb.version", std::to_string(version)}};
  if (args.merge) {
    if (Status s = PlanMerge(stores, &plan); !s.ok()) return Fail(cmd, s.message(), kExitProblem);
    metadata["ckptdb.merged_ranks"] = std::to_string(stores.size());
  } else {
    const Store* s = &stores[0];
    if (args.rank >= 0) {
      auto it = std::find_if(stores.begin(), stores.end(), [&](const Store& x) {
        return x.rank == static_cast<uint32_t>(args.rank);
      });
      if (it == stores.end()) {
        return Fail(cmd, "no root given holds rank " + std::to_string(args.rank), kExitUsage);
      }
      s = &*it;
    }
    metadata["ckptdb.rank"] = std::to_string(s->rank);
    nlohmann::json shards = nlohmann::json::object(), raw = nlohmann::json::object();
    for (const TensorRecord& t : s->tensors) {
      Planned p;
      p.out.name = t.name;
      p.record = &t;
      p.from.push_back(s);
      // Raw bytes are U8 of their length here; their own shape (which counts bytes, or none)
      // goes into the metadata.
      const bool is_raw = t.dtype == CKPTDB_DTYPE_UNKNOWN;
      p.out.dtype = is_raw ? CKPTDB_DTYPE_U8 : t.dtype;
      p.out.shape = is_raw ? std::vector<uint64_t>{t.bytes} : t.shape;
      if (is_raw) raw[t.name] = t.shape;
      if (!Whole(t)) {
        shards[t.name] = {{"global_shape", t.global_shape}, {"global_offset", t.global_offset}};
      }
      plan.push_back(std::move(p));
    }
    try {
      if (!raw.empty()) metadata[kRawKey] = raw.dump();
      if (!shards.empty()) metadata[kShardsKey] = shards.dump();
    } catch (const nlohmann::json::exception&) {
      return Fail(cmd,
                  "a tensor name of rank " + std::to_string(s->rank) +
                      " is not UTF-8, which a safetensors header cannot carry",
                  kExitProblem);
    }
  }
  for (const Planned& p : plan) {
    if (p.out.name == "__metadata__") {
      return Fail(cmd,
                  "a tensor is named __metadata__, the name safetensors keeps for its metadata",
                  kExitProblem);
    }
  }
  // Byte ranges, in name order.
  std::vector<SafetensorsTensor> entries;
  uint64_t offset = 0, largest = 0;
  for (Planned& p : plan) {
    uint64_t elements = 1;
    for (uint64_t d : p.out.shape) elements *= d;
    const uint64_t bytes = elements * ckptdb_dtype_bytes(p.out.dtype);
    p.out.begin = offset;
    p.out.end = offset + bytes;
    offset += bytes;
    largest = std::max(largest, bytes);
    entries.push_back(p.out);
  }
  std::string header;
  if (Status s = BuildSafetensorsHeader(entries, metadata, &header); !s.ok()) {
    return Fail(cmd, s.message(), kExitProblem);
  }

  // Written under a temporary name beside --out, renamed into place once whole and durable.
  const std::string tmp = args.out + ".ckptdb-export.tmp";
  struct stat st;
  if (lstat(args.out.c_str(), &st) == 0 || errno != ENOENT) {
    return Fail(cmd, args.out + " already exists; nothing was written", kExitUsage);
  }
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) {
    return Fail(cmd,
                tmp + " exists: an export to " + args.out +
                    " is running, or one was cut short (then remove it)",
                kExitUsage);
  }
  if (fd < 0) return Fail(cmd, "create " + tmp + ": " + std::strerror(errno), kExitUsage);
  Mapping buffer;
  buffer.bytes = std::max<uint64_t>(largest, 1);
  buffer.data =
      mmap(nullptr, buffer.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  Status s =
      buffer.data == MAP_FAILED
          ? Status::FromErrno(errno, "map " + HumanBytes(largest) + " for the largest tensor")
          : WriteAll(fd, header.data(), header.size(), tmp);
  for (size_t i = 0; s.ok() && i < plan.size(); ++i) {
    const uint64_t bytes = plan[i].out.end - plan[i].out.begin;
    s = ReadPlanned(plan[i], version, bytes, buffer.data);
    if (s.ok()) s = WriteAll(fd, buffer.data, bytes, tmp);
  }
  if (s.ok() && fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + tmp);
  if (close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + tmp);
  if (s.ok() &&
      renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, args.out.c_str(), RENAME_NOREPLACE) != 0) {
    s = Status::FromErrno(errno, "rename " + tmp + " to " + args.out);
  }
  if (!s.ok()) {
    unlink(tmp.c_str());
    return Fail(cmd, s.message() + "; nothing was written", kExitProblem);
  }
  const std::string dir =
      args.out.find('/') == std::string::npos ? "." : args.out.substr(0, args.out.rfind('/') + 1);
  int dirfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd >= 0) {
    fsync(dirfd);
    close(dirfd);
  }
  std::printf("exported %zu tensor(s), %s, of version %" PRIu64 " (%s) to %s\n", plan.size(),
              HumanBytes(offset).c_str(), version,
              args.merge ? ("merged from " + std::to_string(stores.size()) + " ranks").c_str()
                         : ("rank " + metadata["ckptdb.rank"]).c_str(),
              args.out.c_str());
  return kExitOk;
}

struct ImportArgs {
  std::string file;
  std::string root;
  std::string version;
  std::string tiers;
  bool drop_tiers = false;
};

// The places recorded by export (kShardsKey, kRawKey), checked: they are from the file.
Status ReadPlaces(const SafetensorsFile& f, std::map<std::string, ckptdb_tensor_info>* infos) {
  std::map<std::string, const SafetensorsTensor*> by_name;
  for (const SafetensorsTensor& t : f.tensors) {
    ckptdb_tensor_info info{};
    info.dtype = t.dtype;
    info.ndim = static_cast<uint32_t>(t.shape.size());
    std::copy(t.shape.begin(), t.shape.end(), info.shape);
    (*infos)[t.name] = info;
    by_name[t.name] = &t;
  }
  auto parse = [](const std::string& text, nlohmann::json* out) {
    return ParseShallowJson(text.data(), text.data() + text.size(), 3, out) && out->is_object();
  };
  if (auto it = f.metadata.find(kRawKey); it != f.metadata.end()) {
    nlohmann::json raw;
    if (!parse(it->second, &raw))
      return Status::Invalid(std::string(kRawKey) + " is not an object");
    for (const auto& [name, shape] : raw.items()) {
      const std::string at = std::string(kRawKey) + " " + QuoteName(name);
      auto t = by_name.find(name);
      if (t == by_name.end() || t->second->dtype != CKPTDB_DTYPE_U8 ||
          t->second->shape.size() != 1) {
        return Status::Invalid(at + " is not a one-dimensional U8 tensor of the file");
      }
      ckptdb_tensor_info info{};  // raw bytes: dtype UNKNOWN, a shape that counts bytes, or none
      uint64_t product = 1;
      if (!shape.is_array() || shape.size() > CKPTDB_MAX_DIMS) {
        return Status::Invalid(at + ": its shape is not an array of at most " +
                               std::to_string(CKPTDB_MAX_DIMS) + " dimensions");
      }
      for (const nlohmann::json& d : shape) {
        if (!d.is_number_unsigned() ||
            __builtin_mul_overflow(product, d.get<uint64_t>(), &product)) {
          return Status::Invalid(at + ": its shape " + DescribeJson(shape) + " is not unsigned");
        }
        info.shape[info.ndim++] = d.get<uint64_t>();
      }
      if (info.ndim > 0 && product != t->second->shape[0]) {
        return Status::Invalid(at + ": its shape " + DescribeJson(shape) + " does not count its " +
                               std::to_string(t->second->shape[0]) + " bytes");
      }
      (*infos)[name] = info;
    }
  }
  if (auto it = f.metadata.find(kShardsKey); it != f.metadata.end()) {
    nlohmann::json shards;
    if (!parse(it->second, &shards)) {
      return Status::Invalid(std::string(kShardsKey) + " is not an object");
    }
    for (const auto& [name, place] : shards.items()) {
      auto t = by_name.find(name);
      const std::string at = std::string(kShardsKey) + " " + QuoteName(name);
      if (t == by_name.end()) return Status::Invalid(at + " is not a tensor of the file");
      ckptdb_tensor_info& info = (*infos)[name];
      const size_t ndim = info.ndim;
      if (!place.is_object() || !place.contains("global_shape") ||
          !place.contains("global_offset") || !place["global_shape"].is_array() ||
          !place["global_offset"].is_array() || place["global_shape"].size() != ndim ||
          place["global_offset"].size() != ndim) {
        return Status::Invalid(at + ": not {global_shape, global_offset} of " +
                               std::to_string(ndim) + " dimensions");
      }
      for (size_t d = 0; d < ndim; ++d) {
        const nlohmann::json& g = place["global_shape"][d];
        const nlohmann::json& o = place["global_offset"][d];
        if (!g.is_number_unsigned() || !o.is_number_unsigned()) {
          return Status::Invalid(at + ": a dimension is not an unsigned number");
        }
        info.global_shape[d] = g.get<uint64_t>();
        info.global_offset[d] = o.get<uint64_t>();
      }
    }
  }
  return Status::Ok();
}

// What a put of the file's tensor would refuse, refused before any store is opened or made: a
// name that is empty, over CKPTDB_MAX_NAME_BYTES, holds a NUL (the C API would cut it there and
// import it under another name) or takes the recomputed replicas' prefix; a shard that lies
// outside its global shape.
Status CheckImportable(const SafetensorsTensor& t, const ckptdb_tensor_info& info,
                       const std::string& file) {
  if (t.name.empty()) return Status::Invalid(file + ": a tensor has an empty name");
  const std::string at = file + ": tensor " + QuoteName(t.name);
  if (t.name.size() > CKPTDB_MAX_NAME_BYTES) {
    return Status::Invalid(at + ": its name is " + std::to_string(t.name.size()) +
                           " bytes, a tensor name at most " +
                           std::to_string(CKPTDB_MAX_NAME_BYTES));
  }
  if (t.name.find('\0') != std::string::npos) {
    return Status::Invalid(at + ": its name holds a NUL byte, which no tensor name can");
  }
  if (t.name.rfind(format::kRecomputedPrefix, 0) == 0) {
    return Status::Invalid(at + ": names beginning with '" +
                           std::string(format::kRecomputedPrefix) +
                           "' are ckptdb's own (REFT's recomputed replicas)");
  }
  bool global = false;
  for (uint32_t d = 0; d < info.ndim; ++d) global |= info.global_shape[d] != 0;
  for (uint32_t d = 0; global && d < info.ndim; ++d) {
    uint64_t end = 0;
    if (__builtin_add_overflow(info.global_offset[d], info.shape[d], &end) ||
        end > info.global_shape[d]) {
      return Status::Invalid(at + ": " + std::string(kShardsKey) + " puts it at [" +
                             std::to_string(info.global_offset[d]) + ", +" +
                             std::to_string(info.shape[d]) + ") in dimension " + std::to_string(d) +
                             ", outside the global size " + std::to_string(info.global_shape[d]));
    }
  }
  return Status::Ok();
}

int RunImport(const ImportArgs& args) {
  const char* cmd = "import";
  uint64_t version = 0;
  if (!ParseVersion(args.version, &version)) {
    return Fail(cmd, "--version " + QuoteName(args.version) + " is not a version number",
                kExitUsage);
  }
  int fd = open(args.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Fail(cmd, "open " + args.file + ": " + std::strerror(errno), kExitUsage);
  struct stat st;
  Mapping file;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Fail(cmd, args.file + " is not a regular file", kExitUsage);
  }
  file.bytes = static_cast<size_t>(st.st_size);
  if (file.bytes > 0) file.data = mmap(nullptr, file.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (file.bytes > 0 && file.data == MAP_FAILED) {
    return Fail(cmd, "map " + args.file + ": " + std::strerror(errno), kExitProblem);
  }
  const auto* bytes = static_cast<const uint8_t*>(file.data == MAP_FAILED ? nullptr : file.data);
  SafetensorsFile parsed;
  Status s = ParseSafetensors(bytes, file.bytes, file.bytes, args.file, &parsed);
  std::map<std::string, ckptdb_tensor_info> infos;
  if (s.ok()) s = ReadPlaces(parsed, &infos).WithContext(args.file);
  if (s.ok() && parsed.tensors.empty()) {
    s = Status::Invalid(args.file + " holds no tensor: a version needs at least one");
  }
  for (size_t i = 0; s.ok() && i < parsed.tensors.size(); ++i) {
    s = CheckImportable(parsed.tensors[i], infos[parsed.tensors[i].name], args.file);
  }
  if (!s.ok()) return Fail(cmd, s.message() + "; nothing was imported", kExitProblem);
  // A store this import makes is removed again when the import fails: a failed import leaves
  // ROOT as it found it. Ours only when this call made the directory (mkdir: not a path that
  // exists, a dangling link or one it cannot look at), and never after an open that found the
  // store busy (another process took it in between).
  std::error_code ec;
  const bool made_root = mkdir(args.root.c_str(), 0755) == 0;

  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = args.root.c_str();
  o.tiers = args.tiers.empty() ? nullptr : args.tiers.c_str();
  o.drop_tiers = args.drop_tiers ? 1 : 0;
  o.rank = 0;
  o.world_size = 1;
  ckptdb* raw_db = nullptr;
  if (int rc = ckptdb_open(&o, &raw_db); rc != CKPTDB_OK) {
    const std::string why = ErrorText(rc);
    if (made_root && rc != CKPTDB_EBUSY) std::filesystem::remove_all(args.root, ec);
    return Fail(cmd, "open " + args.root + ": " + why, ExitCodeFor(rc));
  }
  DbHandle db(raw_db);
  int rc = CKPTDB_OK;
  std::string failed;
  uint64_t total = 0;
  for (const SafetensorsTensor& t : parsed.tensors) {
    const ckptdb_tensor_info& info = infos[t.name];
    rc = ckptdb_put_shard(db.get(), version, t.name.c_str(), bytes + parsed.buffer_offset + t.begin,
                          t.end - t.begin, &info, 0);
    if (rc != CKPTDB_OK) {
      failed = "tensor " + QuoteName(t.name) + ": " + ErrorText(rc);
      break;
    }
    total += t.end - t.begin;
  }
  if (rc == CKPTDB_OK) {
    rc = ckptdb_commit(db.get(), version, 0);
    if (rc != CKPTDB_OK) failed = "commit: " + ErrorText(rc);
  }
  if (rc != CKPTDB_OK) {
    // Nothing half imported: the open version is dropped (abort leaves a committed one alone).
    (void)ckptdb_abort(db.get(), version);
    db.reset();
    if (made_root) std::filesystem::remove_all(args.root, ec);
    // A version the store already has (or has passed) is the caller's mistake; the rest is the
    // file's or the store's.
    return Fail(cmd,
                "version " + std::to_string(version) + " of " + args.root + ": " + failed +
                    "; nothing was imported",
                rc == CKPTDB_ESTATE || rc == CKPTDB_EEXIST ? kExitUsage : kExitProblem);
  }
  std::printf("imported %zu tensor(s), %s, from %s as version %" PRIu64 " of %s\n",
              parsed.tensors.size(), HumanBytes(total).c_str(), args.file.c_str(), version,
              args.root.c_str());
  return kExitOk;
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a committed version as a safetensors file: one rank's, or merged");
  cmd->add_option("roots", args->roots, "The store's root; with --merge, every rank's");
  cmd->add_option("--tiers", args->tiers,
                  "Without roots: read these tier directories alone (a job's nfs tier after the "
                  "job is gone), every rank that committed there");
  cmd->add_option("--version,-v", args->version,
                  "The committed version (default: the newest every root can restore)");
  cmd->add_option("--format,-f", args->format, "The file format: safetensors");
  cmd->add_option("--out,-o", args->out, "The file to write (must not exist)")->required();
  cmd->add_option("--rank,-r", args->rank, "Of several roots, the rank whose shards to export")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--merge", args->merge,
                "Assemble the full tensors from every rank's shards by their global offsets");
  cmd->callback([args, exit_code] { *exit_code = RunExport(*args); });
}

void AddImportCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "import", "Commit the tensors of a safetensors file as a version of a store");
  cmd->add_option("file", args->file, "The safetensors file")->required();
  cmd->add_option("--root", args->root, "The store (created when missing)")->required();
  cmd->add_option("--version,-v", args->version, "The version to commit it as")->required();
  cmd->add_option("--tiers", args->tiers,
                  "Tier spec (default: the store's own, as its last writer gave it; for a new "
                  "store disk:ROOT/segments)");
  cmd->add_flag("--drop-tiers", args->drop_tiers,
                "Let --tiers leave out a tier that holds committed copies: they are released "
                "(every such version must have a copy on a tier that stays)");
  cmd->callback([args, exit_code] { *exit_code = RunImport(*args); });
}

}  // namespace ckpt::tools
