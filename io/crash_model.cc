#include "io/crash_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "util/assert.h"

namespace ckpt::io {
namespace {

constexpr uint64_t kSectorBytes = 512;
// A trace file holds at most this many ops, and an op at most this much data: a bound on what
// Load allocates from a file.
constexpr uint64_t kMaxTraceOps = uint64_t{1} << 24;
constexpr uint64_t kMaxOpBytes = uint64_t{1} << 30;

bool IsUnder(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

void PutLe64(char* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>(v >> (8 * i));
}

uint64_t GetLe64(const char* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(at[i])} << (8 * i);
  return v;
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

}  // namespace

const char* FsOpKindName(FsOp::Kind kind) {
  switch (kind) {
    case FsOp::Kind::kCreate:
      return "create";
    case FsOp::Kind::kWrite:
      return "write";
    case FsOp::Kind::kTruncate:
      return "truncate";
    case FsOp::Kind::kSync:
      return "fsync";
    case FsOp::Kind::kClose:
      return "close";
    case FsOp::Kind::kRename:
      return "rename";
    case FsOp::Kind::kRemove:
      return "remove";
    case FsOp::Kind::kSyncDir:
      return "directory fsync";
    case FsOp::Kind::kMkdir:
      return "mkdir";
    case FsOp::Kind::kMarker:
      return "marker";
  }
  return "?";
}

// ---- FsTrace ----

void FsTrace::Watch(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_.push_back(dir);
}

bool FsTrace::Watched(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& dir : watched_) {
    if (path == dir || IsUnder(path, dir)) return true;
  }
  return false;
}

void FsTrace::Record(FsOp op) {
  if (!recording_.load()) return;
  if (op.kind != FsOp::Kind::kMarker && !Watched(op.path) &&
      !(op.kind == FsOp::Kind::kRename && Watched(op.to))) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  op.seq = clock_->fetch_add(1);  // under the lock: this trace's ops are in seq order
  ops_.push_back(std::move(op));
}

void FsTrace::Mark(const std::string& name) {
  FsOp op;
  op.kind = FsOp::Kind::kMarker;
  op.path = name;
  Record(std::move(op));
}

std::vector<FsOp> FsTrace::ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_;
}

size_t FsTrace::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

// The file: "ckptdb trace 1\n", then per op: kind (1 byte), seq, offset, and the lengths of
// path, to and data (8 bytes each, little-endian), then those bytes.
Status FsTrace::Save(const std::string& path) const {
  std::string out = "ckptdb trace 1\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const FsOp& op : ops_) {
      char head[1 + 6 * 8];
      head[0] = static_cast<char>(op.kind);
      const uint64_t fields[6] = {op.seq,       op.offset,      op.path.size(),
                                  op.to.size(), op.data.size(), 0};
      for (int i = 0; i < 6; ++i) PutLe64(head + 1 + 8 * i, fields[i]);
      out.append(head, sizeof head);
      out += op.path;
      out += op.to;
      out += op.data;
    }
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return Status::IoError("writing trace " + path);
  return Status::Ok();
}

Status FsTrace::Load(const std::string& path, std::vector<FsOp>* ops) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound("trace " + path + " cannot be opened");
  std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string magic = "ckptdb trace 1\n";
  if (in.compare(0, magic.size(), magic) != 0) {
    return Status::Corrupt("trace " + path + " does not start with '" + magic.substr(0, 14) + "'");
  }
  size_t at = magic.size();
  ops->clear();
  while (at < in.size()) {
    if (ops->size() >= kMaxTraceOps) return Status::Corrupt("trace " + path + ": too many ops");
    if (in.size() - at < 1 + 6 * 8) return Status::Corrupt("trace " + path + ": torn op header");
    FsOp op;
    const uint8_t kind = static_cast<uint8_t>(in[at]);
    if (kind > static_cast<uint8_t>(FsOp::Kind::kMarker)) {
      return Status::Corrupt("trace " + path + ": unknown op kind " + std::to_string(kind));
    }
    op.kind = static_cast<FsOp::Kind>(kind);
    uint64_t fields[6];
    for (int i = 0; i < 6; ++i) fields[i] = GetLe64(in.data() + at + 1 + 8 * i);
    at += 1 + 6 * 8;
    op.seq = fields[0];
    op.offset = fields[1];
    if (op.offset > kMaxOpBytes * 16) {
      return Status::Corrupt("trace " + path + ": an op at offset " + std::to_string(op.offset));
    }
    const uint64_t lengths[3] = {fields[2], fields[3], fields[4]};
    std::string* parts[3] = {&op.path, &op.to, &op.data};
    for (int i = 0; i < 3; ++i) {
      if (lengths[i] > kMaxOpBytes || lengths[i] > in.size() - at) {
        return Status::Corrupt("trace " + path + ": an op runs past the end");
      }
      parts[i]->assign(in, at, lengths[i]);
      at += lengths[i];
    }
    ops->push_back(std::move(op));
  }
  return Status::Ok();
}

// ---- RecordingIo ----

namespace {

class RecordingQueue final : public IoQueue {
 public:
  RecordingQueue(RecordingIo* io, std::unique_ptr<IoQueue> base)
      : io_(io), base_(std::move(base)) {}

  Status RegisterBuffers(std::span<const iovec> buffers) override {
    return base_->RegisterBuffers(buffers);
  }
  Status Submit(std::span<const IoRequest> requests) override {
    for (const IoRequest& r : requests) {
      if (r.op == IoRequest::Op::kRead) continue;
      std::string path = io_->PathOf(r.fd);
      if (!path.empty()) pending_[r.tag] = Pending{r, std::move(path)};
    }
    return base_->Submit(requests);
  }
  Status Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) override {
    const size_t before = out->size();
    Status st = base_->Reap(min_completions, out, timeout_ms);
    for (size_t i = before; i < out->size(); ++i) {
      const IoCompletion& c = (*out)[i];
      auto it = pending_.find(c.tag);
      if (it == pending_.end()) continue;
      const Pending p = std::move(it->second);
      pending_.erase(it);
      if (c.result < 0) continue;  // failed: the real file keeps what it keeps; so may the model
      FsOp op;
      op.path = p.path;
      if (p.request.op == IoRequest::Op::kWrite) {
        op.kind = FsOp::Kind::kWrite;
        op.offset = p.request.offset;
        op.data.assign(static_cast<const char*>(p.request.buffer),
                       std::min<uint64_t>(static_cast<uint64_t>(c.result), p.request.length));
      } else {
        op.kind = FsOp::Kind::kSync;
      }
      io_->trace()->Record(std::move(op));
    }
    return st;
  }
  size_t outstanding() const override { return base_->outstanding(); }
  int WaitFd() const override { return base_->WaitFd(); }

 private:
  struct Pending {
    IoRequest request;
    std::string path;
  };
  RecordingIo* io_;
  std::unique_ptr<IoQueue> base_;
  std::map<uint64_t, Pending> pending_;  // by tag: one owner thread per queue
};

FsOp PathOp(FsOp::Kind kind, const std::string& path, const std::string& to = {}) {
  FsOp op;
  op.kind = kind;
  op.path = path;
  op.to = to;
  return op;
}

}  // namespace

std::string RecordingIo::PathOf(int fd) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = paths_.find(fd);
  return it == paths_.end() ? std::string() : it->second;
}

Status RecordingIo::NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) {
  std::unique_ptr<IoQueue> inner;
  CKPTDB_RETURN_IF_ERROR(base()->NewQueue(options, &inner));
  *out = std::make_unique<RecordingQueue>(this, std::move(inner));
  return Status::Ok();
}

Status RecordingIo::Open(const std::string& path, const OpenOptions& options, int* fd,
                         bool* direct_out) {
  CKPTDB_RETURN_IF_ERROR(base()->Open(path, options, fd, direct_out));
  // Only what is opened for writing changes a file (and only its close flushes to NFS).
  if (options.mode == OpenOptions::Mode::kRead || !trace_->Watched(path)) return Status::Ok();
  if (options.mode == OpenOptions::Mode::kCreateWrite)
    trace_->Record(PathOp(FsOp::Kind::kCreate, path));
  std::lock_guard<std::mutex> lock(mu_);
  paths_[*fd] = path;
  return Status::Ok();
}

Status RecordingIo::Close(int fd) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = paths_.find(fd);
    if (it != paths_.end()) {
      path = it->second;
      paths_.erase(it);
    }
  }
  Status st = base()->Close(fd);
  if (!path.empty()) trace_->Record(PathOp(FsOp::Kind::kClose, path));
  return st;
}

Status RecordingIo::CreateDirs(const std::string& path) {
  uint64_t ignored = 0;
  const bool existed = base()->PathSize(path, &ignored).ok();
  CKPTDB_RETURN_IF_ERROR(base()->CreateDirs(path));
  if (existed) return Status::Ok();
  // What PosixIo did: mkdir, then an fsync of the parent.
  trace_->Record(PathOp(FsOp::Kind::kMkdir, path));
  trace_->Record(PathOp(FsOp::Kind::kSyncDir, Parent(path)));
  return Status::Ok();
}

Status RecordingIo::Rename(const std::string& from, const std::string& to) {
  CKPTDB_RETURN_IF_ERROR(base()->Rename(from, to));
  trace_->Record(PathOp(FsOp::Kind::kRename, from, to));
  return Status::Ok();
}

Status RecordingIo::Remove(const std::string& path) {
  uint64_t ignored = 0;
  const bool existed = base()->PathSize(path, &ignored).ok();
  CKPTDB_RETURN_IF_ERROR(base()->Remove(path));
  if (existed) trace_->Record(PathOp(FsOp::Kind::kRemove, path));
  return Status::Ok();
}

Status RecordingIo::SyncDir(const std::string& path) {
  CKPTDB_RETURN_IF_ERROR(base()->SyncDir(path));
  trace_->Record(PathOp(FsOp::Kind::kSyncDir, path));
  return Status::Ok();
}

Status RecordingIo::WriteFileDurably(const std::string& path, const std::string& contents) {
  CKPTDB_RETURN_IF_ERROR(base()->WriteFileDurably(path, contents));
  // What PosixIo did, in its order: path.tmp written and fsynced, renamed, directory fsynced.
  const std::string tmp = path + ".tmp";
  trace_->Record(PathOp(FsOp::Kind::kCreate, tmp));
  FsOp write = PathOp(FsOp::Kind::kWrite, tmp);
  write.data = contents;
  trace_->Record(std::move(write));
  trace_->Record(PathOp(FsOp::Kind::kSync, tmp));
  trace_->Record(PathOp(FsOp::Kind::kClose, tmp));
  trace_->Record(PathOp(FsOp::Kind::kRename, tmp, path));
  trace_->Record(PathOp(FsOp::Kind::kSyncDir, Parent(path)));
  return Status::Ok();
}

// ---- Crash states ----

std::string CrashChoices::Describe() const {
  return std::to_string(ops_replayed) + " ops replayed; unsynced writes kept " +
         std::to_string(writes_kept) + ", torn " + std::to_string(writes_torn) + ", dropped " +
         std::to_string(writes_dropped) + "; metadata changes past the last directory fsync kept " +
         std::to_string(metadata_kept) + ", dropped " + std::to_string(metadata_dropped);
}

namespace {

struct Inode {
  std::string data;                  // what the process saw
  std::string durable;               // as of the last fsync (NFS: or close)
  std::vector<const FsOp*> pending;  // writes and truncates since then, in order
};

// A create, rename, remove or mkdir, in its journal (the watched directory it is under).
struct MetaOp {
  const FsOp* op = nullptr;
  size_t inode = 0;    // a create's new file
  size_t journal = 0;  // index of its directory in dirs_
  size_t rank = 0;     // its place among its journal's ops
};

class Model {
 public:
  Model(const std::vector<CrashDirectory>& dirs, const CrashSpec& spec)
      : dirs_(dirs), spec_(spec), journal_ops_(dirs.size()), durable_(dirs.size()) {}

  // Which watched directory holds path; dirs_.size(): none.
  size_t DirOf(const std::string& path) const {
    for (size_t i = 0; i < dirs_.size(); ++i) {
      if (path == dirs_[i].path || IsUnder(path, dirs_[i].path)) return i;
    }
    return dirs_.size();
  }
  bool Watched(const std::string& path) const { return DirOf(path) < dirs_.size(); }
  CrashSpec::Mode ModeOf(const CrashDirectory& d) const {
    auto it = spec_.modes.find(d.path);
    return it == spec_.modes.end() ? spec_.default_mode : it->second;
  }

  void Apply(const FsOp& op) {
    switch (op.kind) {
      case FsOp::Kind::kCreate: {
        const size_t inode = inodes_.size();
        inodes_.emplace_back();
        names_[op.path] = inode;
        gone_.erase(op.path);
        AddMeta(op, inode, op.path);
        break;
      }
      case FsOp::Kind::kWrite: {
        Inode* f = InodeOf(op.path);
        if (f == nullptr) break;
        if (f->data.size() < op.offset + op.data.size()) {
          f->data.resize(op.offset + op.data.size());
        }
        std::memcpy(f->data.data() + op.offset, op.data.data(), op.data.size());
        f->pending.push_back(&op);
        break;
      }
      case FsOp::Kind::kTruncate: {
        Inode* f = InodeOf(op.path);
        if (f == nullptr) break;
        f->data.resize(op.offset);
        f->pending.push_back(&op);
        break;
      }
      case FsOp::Kind::kSync:
        if (Inode* f = InodeOf(op.path)) Persist(*f);
        break;
      case FsOp::Kind::kClose: {
        const size_t d = DirOf(op.path);
        if (d < dirs_.size() && dirs_[d].durability == Durability::kNfs) {
          if (Inode* f = InodeOf(op.path)) Persist(*f);
        }
        break;
      }
      case FsOp::Kind::kRename: {
        auto it = names_.find(op.path);
        if (it == names_.end()) break;  // a file made outside the trace: nothing to move
        const size_t inode = it->second;
        names_.erase(it);
        names_[op.to] = inode;
        gone_.insert(op.path);
        gone_.erase(op.to);
        AddMeta(op, inode, op.to);
        break;
      }
      case FsOp::Kind::kRemove:
        if (names_.erase(op.path) != 0) {
          gone_.insert(op.path);
          AddMeta(op, 0, op.path);
        }
        break;
      case FsOp::Kind::kSyncDir: {
        // Every create, rename, remove and mkdir in this directory so far is durable, and (a
        // journal keeps metadata in order) every one before them in its journal.
        const size_t j = DirOf(op.path);
        if (j == dirs_.size()) break;
        for (const MetaOp& m : meta_) {
          if (m.journal != j || m.rank < durable_[j]) continue;
          if (Parent(m.op->path) == op.path ||
              (m.op->kind == FsOp::Kind::kRename && Parent(m.op->to) == op.path)) {
            durable_[j] = m.rank + 1;
          }
        }
        break;
      }
      case FsOp::Kind::kMkdir:
        if (DirOf(op.path) < dirs_.size() && op.path != dirs_[DirOf(op.path)].path) {
          AddMeta(op, 0, op.path);
        }
        break;
      case FsOp::Kind::kMarker:
        break;
    }
  }

  // Writes the crash state into the directories.
  Status Materialize(std::mt19937_64& rng, CrashChoices* choices) {
    // Per journal, how many of its metadata changes survive: a process crash keeps all, a power
    // loss on a disk the durable ones and a random prefix of the rest, NFS all, memory none.
    std::vector<size_t> keep(dirs_.size());
    for (size_t j = 0; j < dirs_.size(); ++j) {
      const bool process = ModeOf(dirs_[j]) == CrashSpec::Mode::kProcess;
      const size_t total = journal_ops_[j];
      if (process || dirs_[j].durability == Durability::kNfs || spec_.keep_all) {
        keep[j] = total;
      } else if (dirs_[j].durability == Durability::kMemory) {
        keep[j] = 0;
      } else if (spec_.keep_none || total == durable_[j]) {
        keep[j] = durable_[j];
      } else {
        keep[j] = durable_[j] + rng() % (total - durable_[j] + 1);
      }
      if (!process && dirs_[j].durability == Durability::kDisk) {
        choices->metadata_kept += keep[j] - durable_[j];
        choices->metadata_dropped += total - keep[j];
      }
    }
    std::map<std::string, size_t> names;
    std::set<std::string> made;  // directories made in the trace that survive
    for (const MetaOp& m : meta_) {
      if (m.rank >= keep[m.journal]) continue;
      const FsOp& op = *m.op;
      switch (op.kind) {
        case FsOp::Kind::kCreate:
          names[op.path] = m.inode;
          break;
        case FsOp::Kind::kRename:
          names.erase(op.path);
          names[op.to] = m.inode;
          break;
        case FsOp::Kind::kRemove:
          names.erase(op.path);
          break;
        case FsOp::Kind::kMkdir:
          made.insert(op.path);
          break;
        default:
          break;
      }
    }
    // A name in a directory the trace made survives only with that directory.
    auto reachable = [&](const std::string& path) {
      for (std::string dir = Parent(path); Watched(dir) && dir != dirs_[DirOf(dir)].path;
           dir = Parent(dir)) {
        if (made_dirs_.count(dir) != 0 && made.count(dir) == 0) return false;
      }
      return true;
    };
    std::vector<std::optional<std::string>> contents(inodes_.size());
    for (size_t d = 0; d < dirs_.size(); ++d) {
      const CrashDirectory& dir = dirs_[d];
      std::error_code ec;
      std::filesystem::remove_all(dir.path, ec);
      std::filesystem::create_directories(dir.path, ec);
      if (ec) return Status::FromErrno(ec.value(), "making crash directory " + dir.path);
      const bool process = ModeOf(dir) == CrashSpec::Mode::kProcess;
      if (!process && dir.durability == Durability::kMemory) continue;  // lost with the power
      for (const std::string& m : made) {
        if (DirOf(m) == d && reachable(m)) std::filesystem::create_directories(m, ec);
      }
      for (const auto& [path, inode] : names) {
        if (DirOf(path) != d || !reachable(path)) continue;
        if (!contents[inode]) {
          contents[inode] =
              process ? inodes_[inode].data : AfterPowerLoss(inodes_[inode], rng, choices);
        }
        CKPTDB_RETURN_IF_ERROR(WriteWhole(path, *contents[inode]));
      }
    }
    return Status::Ok();
  }

 private:
  void AddMeta(const FsOp& op, size_t inode, const std::string& where) {
    const size_t j = DirOf(where);
    if (j == dirs_.size()) return;
    meta_.push_back({&op, inode, j, journal_ops_[j]++});
    if (op.kind == FsOp::Kind::kMkdir) made_dirs_.insert(op.path);
  }

  // The file a write, truncate, fsync or close names; nullptr for a name the trace saw go
  // (renamed away or removed: the op reached a descriptor of a file no longer there).
  Inode* InodeOf(const std::string& path) {
    auto it = names_.find(path);
    if (it != names_.end()) return &inodes_[it->second];
    if (gone_.count(path) != 0) return nullptr;
    // A file the trace did not see created (opened to append): it is there, empty, durably.
    const size_t inode = inodes_.size();
    inodes_.emplace_back();
    names_.emplace(path, inode);
    FsOp* made = &implicit_.emplace_back();
    made->kind = FsOp::Kind::kCreate;
    made->path = path;
    const size_t j = DirOf(path);
    if (j < dirs_.size()) {
      // Durable already: ahead of everything in its journal.
      for (MetaOp& m : meta_) {
        if (m.journal == j) m.rank++;
      }
      meta_.insert(meta_.begin(), {made, inode, j, 0});
      journal_ops_[j]++;
      durable_[j]++;
    }
    return &inodes_[inode];
  }

  static void Persist(Inode& f) {
    f.durable = f.data;
    f.pending.clear();
  }

  static Status WriteWhole(const std::string& path, const std::string& bytes) {
    std::error_code ec;
    std::filesystem::create_directories(Parent(path), ec);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno(errno, "writing crash state " + path);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) {
        const int error = errno;
        ::close(fd);
        return Status::FromErrno(error, "writing crash state " + path);
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    return Status::Ok();
  }

  // The durable data, then each unsynced write kept whole, dropped, or torn into a random set
  // of its sectors; truncates kept or not.
  std::string AfterPowerLoss(const Inode& f, std::mt19937_64& rng, CrashChoices* choices) const {
    std::string out = f.durable;
    for (const FsOp* op : f.pending) {
      const uint64_t fate = spec_.keep_all ? 0 : spec_.keep_none ? 1 : rng() % 3;
      if (op->kind == FsOp::Kind::kTruncate) {
        if (fate != 1) out.resize(op->offset);
        continue;
      }
      if (fate == 1) {
        choices->writes_dropped++;
        continue;
      }
      (fate == 0 ? choices->writes_kept : choices->writes_torn)++;
      const uint64_t end = op->offset + op->data.size();
      for (uint64_t at = op->offset; at < end;) {
        const uint64_t sector_end = std::min(end, (at / kSectorBytes + 1) * kSectorBytes);
        if (fate == 0 || rng() % 2 == 0) {
          if (out.size() < sector_end) out.resize(sector_end);
          std::memcpy(out.data() + at, op->data.data() + (at - op->offset), sector_end - at);
        }
        at = sector_end;
      }
    }
    return out;
  }

  const std::vector<CrashDirectory>& dirs_;
  const CrashSpec& spec_;
  std::vector<Inode> inodes_;
  std::map<std::string, size_t> names_;  // what the process saw
  std::set<std::string> gone_;           // names the trace saw renamed away or removed
  std::vector<MetaOp> meta_;
  std::vector<size_t> journal_ops_;  // by journal: its metadata changes so far
  std::vector<size_t> durable_;      // by journal: how many of them are durable (a prefix)
  std::set<std::string> made_dirs_;  // every directory made in the trace
  std::deque<FsOp> implicit_;
};

}  // namespace

Status BuildCrashState(const std::vector<FsOp>& ops, const std::vector<CrashDirectory>& dirs,
                       const CrashSpec& spec, CrashChoices* choices) {
  CKPTDB_ASSERT(!(spec.keep_all && spec.keep_none));
  *choices = CrashChoices{};
  std::vector<const FsOp*> order;
  for (const FsOp& op : ops) {
    if (op.seq < spec.end) order.push_back(&op);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const FsOp* a, const FsOp* b) { return a->seq < b->seq; });
  Model model(dirs, spec);
  for (const FsOp* op : order) {
    if (op->kind != FsOp::Kind::kMarker && !model.Watched(op->path) &&
        !(op->kind == FsOp::Kind::kRename && model.Watched(op->to))) {
      continue;
    }
    model.Apply(*op);
    choices->ops_replayed++;
  }
  std::mt19937_64 rng(spec.seed);
  return model.Materialize(rng, choices);
}

}  // namespace ckpt::io
