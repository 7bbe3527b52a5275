// Shared memory that outlives its store (engine/arena_gc.h).
#include "engine/arena_gc.h"

#include <fcntl.h>
#include <sys/file.h>
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
#include <memory>
#include <set>

#include "engine/catalog.h"
#include "engine/ram_tier.h"
#include "format/ram_format.h"
#include "format/segment_format.h"
#include "io/tier_spec.h"

namespace ckpt::engine {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxNames = size_t{1} << 20;
constexpr int kMaxDepth = 4;
constexpr const char* kReplicaPrefix = "ckptdb-replicas-r";
constexpr const char* kParityPrefix = "ckptdb-parity-r";

// An open file descriptor, closed at scope end (its flock with it).
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// "ckptdb-<16 hex>-r<5 digits>.ram" (RamTier::ArenaPath's names).
bool ParseArenaName(const std::string& name, uint64_t* job_id, uint32_t* rank) {
  if (name.size() != 34 || name.compare(0, 7, "ckptdb-") != 0 || name.compare(23, 2, "-r") != 0 ||
      name.compare(30, 4, ".ram") != 0) {
    return false;
  }
  uint64_t job = 0;
  for (size_t i = 7; i < 23; ++i) {
    const char c = name[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return false;
    job = job << 4 | static_cast<uint64_t>(digit);
  }
  uint32_t r = 0;
  for (size_t i = 25; i < 30; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    r = r * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  *job_id = job;
  *rank = r;
  return true;
}

// "<prefix><rank>", rank in decimal digits only.
bool ParseRankDir(const std::string& name, const char* prefix, uint32_t* rank) {
  const size_t n = std::strlen(prefix);
  if (name.size() <= n || name.size() > n + 5 || name.compare(0, n, prefix) != 0) return false;
  uint32_t r = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    r = r * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  *rank = r;
  return true;
}

// Whether some process holds a lock on fd's file: an exclusive lock, tried without waiting and
// let go at once.
bool InUse(int fd) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return true;
  ::flock(fd, LOCK_UN);
  return false;
}

// The newer of the arena's two header copies that decodes.
Status ReadArenaHeader(int fd, const std::string& path, format::ArenaHeader* out) {
  std::vector<uint8_t> area(format::kArenaHeaderAreaBytes);
  const ssize_t n = ::pread(fd, area.data(), area.size(), 0);
  if (n != static_cast<ssize_t>(area.size())) {
    return Status::Corrupt(path + ": shorter than an arena's header area");
  }
  Status first;
  bool found = false;
  for (int copy = 0; copy < 2; ++copy) {
    const uint64_t at = format::kArenaHeaderCopyOffsets[copy];
    format::ArenaHeader h;
    Status st =
        format::DecodeArenaHeaderCopy(std::span<const uint8_t, format::kArenaHeaderCopyBytes>(
                                          area.data() + at, format::kArenaHeaderCopyBytes),
                                      path + ": header copy " + (copy == 0 ? "A" : "B"), &h);
    if (!st.ok()) {
      if (first.ok()) first = st;
      continue;
    }
    if (!found || h.sequence > out->sequence) *out = std::move(h);
    found = true;
  }
  return found ? Status::Ok() : first;
}

// The newest version whose index region in the arena decodes and names the header's job, rank
// and generation (evicted copies' indexes are erased, engine/ram_tier.cc).
bool NewestIndexed(int fd, uint64_t bytes, const format::ArenaHeader& h, uint64_t* newest) {
  if (bytes <= format::kArenaHeaderAreaBytes) return false;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return false;
  const auto* base = static_cast<const uint8_t*>(p);
  bool any = false;
  for (uint64_t off = format::kArenaHeaderAreaBytes; off + format::kRamIndexHeaderBytes <= bytes;
       off += 4096) {
    std::span<const uint8_t> region(base + off, bytes - off);
    if (!format::LooksLikeRamIndex(region)) continue;
    format::RamIndex index;
    const auto max_entries = static_cast<uint32_t>(
        std::min<uint64_t>(region.size() / format::kRamIndexEntryBytes, UINT32_MAX));
    if (!format::DecodeRamIndex(region, max_entries, "index", &index).ok()) continue;
    if (index.job_id != h.job_id || index.rank != h.rank || index.generation != h.generation) {
      continue;
    }
    *newest = any ? std::max(*newest, index.version) : index.version;
    any = true;
  }
  ::munmap(p, bytes);
  return any;
}

// Whether the arena's root still owns it: its catalog, read-only, names the arena's job and rank
// and a ram tier whose arena file is `path`. Sets e->owned, or says in e->problem why it cannot
// tell (then e is no orphan).
void CheckOwner(const std::string& path, const format::ArenaHeader& h, ShmEntry* e) {
  std::error_code ec;
  if (h.root_path.empty() || h.root_path[0] != '/') {
    e->problem = "its header names no absolute root (\"" + h.root_path.substr(0, 200) +
                 "\"): whose it is cannot be told; reopen the store to record it";
    return;
  }
  // Gone only when the file system says so: a root it cannot look at (a permission, a shared
  // file system that does not answer) is not gone.
  struct stat root_stat {};
  if (::stat(h.root_path.c_str(), &root_stat) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      e->orphan = true;
    } else {
      e->problem = "its root cannot be looked at (" + std::string(std::strerror(errno)) +
                   "): whose it is cannot be told";
    }
    return;
  }
  e->root_exists = true;
  if (!fs::exists(h.root_path + "/catalog/CURRENT", ec)) {
    e->problem = "its root exists but holds no catalog: whose it is cannot be told";
    return;
  }
  std::unique_ptr<Catalog> catalog;
  Identity id;
  std::string spec;
  Status st =
      Catalog::Open(h.root_path + "/catalog", /*read_only=*/true, /*create=*/false, &catalog);
  if (st.ok()) st = catalog->GetIdentity(&id);
  if (st.ok()) st = catalog->GetTiers(&spec);
  if (!st.ok()) {
    e->problem = "reading its root's catalog: " + st.message();
    return;
  }
  std::vector<io::TierSpec> tiers;
  if (id.job_id != h.job_id || id.rank != h.rank) {
    e->orphan = true;  // the root now holds another store
    return;
  }
  if (!io::ParseTierSpecs(spec, h.root_path, &tiers).ok() || tiers.empty() ||
      tiers[0].kind != io::TierKind::kRam) {
    e->orphan = true;  // the store no longer has a ram tier
    return;
  }
  const std::string current = RamTier::ArenaPath(tiers[0].path, id.job_id, id.rank);
  e->owned = fs::weakly_canonical(current, ec) == fs::weakly_canonical(path, ec);
  e->orphan = !e->owned;
}

ShmEntry ExamineArena(const std::string& path, uint64_t job_id, uint32_t rank, ino_t* ino) {
  ShmEntry e;
  e.kind = ShmEntry::Kind::kArena;
  e.path = path;
  e.job_id = job_id;
  e.rank = rank;
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat st {};
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    e.problem = f.fd < 0 ? std::string("open: ") + std::strerror(errno) : "not a regular file";
    return e;
  }
  *ino = st.st_ino;
  e.bytes = static_cast<uint64_t>(st.st_size);
  e.in_use = InUse(f.fd);
  format::ArenaHeader h;
  Status hs = ReadArenaHeader(f.fd, path, &h);
  if (!hs.ok()) {
    e.problem = "its header does not read (" + hs.message() +
                "): never removed on a guess (`ckptdb repair ROOT` moves a damaged arena aside)";
    return e;
  }
  if (h.job_id != job_id || h.rank != rank) {
    e.problem = "its header names job " + format::Hex64(h.job_id) + " rank " +
                std::to_string(h.rank) + ", not what its name says";
    return e;
  }
  e.root = h.root_path;
  e.has_version = NewestIndexed(f.fd, e.bytes, h, &e.newest_version);
  CheckOwner(path, h, &e);
  return e;
}

// Unlinks `path` if it is still the file `ino` and no process has it open: under an exclusive
// flock taken without waiting.
Status RemoveIfUnused(const std::string& path, ino_t ino) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (f.fd < 0) return Status::FromErrno(errno, "open " + path);
  if (::flock(f.fd, LOCK_EX | LOCK_NB) != 0) {
    return Status::Busy(path + " is in use (a process has it open)");
  }
  struct stat by_fd {};
  struct stat by_name {};
  if (::fstat(f.fd, &by_fd) != 0 || ::lstat(path.c_str(), &by_name) != 0 || by_fd.st_ino != ino ||
      by_name.st_ino != ino || by_fd.st_dev != by_name.st_dev) {
    return Status::Busy(path + " changed while it was examined; run gc again");
  }
  if (::unlink(path.c_str()) != 0) return Status::FromErrno(errno, "unlink " + path);
  return Status::Ok();
}

// The regular files under dir, depth first, bounded.
Status FilesUnder(const std::string& dir, int depth, std::vector<std::string>* files,
                  std::vector<std::string>* dirs) {
  if (depth > kMaxDepth) return Status::Invalid(dir + ": deeper than " + std::to_string(kMaxDepth));
  std::error_code ec;
  size_t n = 0;
  for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
    if (++n > kMaxNames) return Status::Size(dir + ": more than 2^20 names");
    if (d.is_symlink(ec)) continue;
    if (d.is_directory(ec)) {
      CKPTDB_RETURN_IF_ERROR(FilesUnder(d.path().string(), depth + 1, files, dirs));
    } else if (d.is_regular_file(ec)) {
      files->push_back(d.path().string());
    }
  }
  if (ec) return Status::FromErrno(ec.value(), "listing " + dir);
  dirs->push_back(dir);
  return Status::Ok();
}

ShmEntry ExamineRankDir(const std::string& path, ShmEntry::Kind kind, uint32_t rank,
                        std::vector<std::string>* files, std::vector<std::string>* dirs) {
  ShmEntry e;
  e.kind = kind;
  e.path = path;
  e.rank = rank;
  Status st = FilesUnder(path, 0, files, dirs);
  if (!st.ok()) {
    e.problem = st.message();
    return e;
  }
  for (const std::string& file : *files) {
    Fd f(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat sb {};
    if (f.fd >= 0 && ::fstat(f.fd, &sb) == 0) e.bytes += static_cast<uint64_t>(sb.st_size);
    if (f.fd >= 0 && InUse(f.fd)) e.in_use = true;
    const std::string name = fs::path(file).filename().string();
    unsigned int who = 0;
    unsigned long long version = 0;
    if (std::sscanf(name.c_str(), "r%5u-v%20llu.seg", &who, &version) == 2 ||
        std::sscanf(name.c_str(), "g%5u-v%20llu.par", &who, &version) == 2) {
      e.newest_version = e.has_version ? std::max<uint64_t>(e.newest_version, version) : version;
      e.has_version = true;
    }
  }
  return e;
}

}  // namespace

Status CollectSharedMemory(const std::string& dir, bool remove, std::vector<ShmEntry>* out) {
  out->clear();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::NotFound("no directory " + dir);
  std::vector<std::pair<std::string, std::string>> names;  // name, path
  size_t n = 0;
  for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
    if (++n > kMaxNames) return Status::Size(dir + ": more than 2^20 names");
    names.emplace_back(d.path().filename().string(), d.path().string());
  }
  if (ec) return Status::FromErrno(ec.value(), "listing " + dir);
  std::sort(names.begin(), names.end());
  // Arenas first: the replica and parity directories of a rank go by its arenas.
  std::map<uint32_t, bool> rank_owned;  // rank -> an arena of it is owned
  std::set<uint32_t> rank_in_use;
  for (const auto& [name, path] : names) {
    uint64_t job_id = 0;
    uint32_t rank = 0;
    if (!ParseArenaName(name, &job_id, &rank)) continue;
    ino_t ino = 0;
    ShmEntry e = ExamineArena(path, job_id, rank, &ino);
    // An arena whose owner cannot be told keeps its rank's directories as if owned.
    rank_owned[rank] = rank_owned[rank] || e.owned || !e.orphan;
    if (e.in_use) rank_in_use.insert(rank);
    if (remove && e.orphan && !e.in_use) {
      Status st = RemoveIfUnused(path, ino);
      e.removed = st.ok();
      if (!st.ok()) e.problem = st.message();
    }
    out->push_back(std::move(e));
  }
  for (const auto& [name, path] : names) {
    uint32_t rank = 0;
    ShmEntry::Kind kind;
    if (ParseRankDir(name, kReplicaPrefix, &rank)) {
      kind = ShmEntry::Kind::kReplicas;
    } else if (ParseRankDir(name, kParityPrefix, &rank)) {
      kind = ShmEntry::Kind::kParity;
    } else {
      continue;
    }
    if (!fs::is_directory(path, ec) || fs::is_symlink(path, ec)) continue;
    std::vector<std::string> files, dirs;
    ShmEntry e = ExamineRankDir(path, kind, rank, &files, &dirs);
    // A replica or parity store holds a shared lock on its directory while it lives
    // (io::DirLock); removal holds an exclusive one, taken without waiting, throughout.
    Fd dir_fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    const bool dir_locked = dir_fd.fd >= 0 && ::flock(dir_fd.fd, LOCK_EX | LOCK_NB) == 0;
    e.in_use = e.in_use || !dir_locked || rank_in_use.count(rank) > 0;
    e.owned = rank_owned[rank];
    e.orphan = e.problem.empty() && !e.owned;
    if (remove && e.orphan && !e.in_use) {
      Status st;
      for (const std::string& file : files) {
        struct stat sb {};
        if (::lstat(file.c_str(), &sb) != 0) continue;
        st = RemoveIfUnused(file, sb.st_ino);
        if (!st.ok()) break;
      }
      for (const std::string& d : dirs) {  // deepest first: FilesUnder appends a dir after its own
        if (st.ok() && ::rmdir(d.c_str()) != 0) st = Status::FromErrno(errno, "rmdir " + d);
      }
      e.removed = st.ok();
      if (!st.ok()) e.problem = st.message();
    }
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
