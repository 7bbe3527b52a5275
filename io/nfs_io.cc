// The NFS client of the Io seam (io/nfs_io.h): libnfs's synchronous calls for metadata, its raw
// NFSv3 calls (rpc_nfs3_{read,write,commit}_async) for data, driven from each queue's Reap.
//
// Bounds: each queue keeps at most NfsOptions::max_in_flight calls in flight and at most
// kMaxOutstanding requests, and the write verifiers of about kMaxVerifiers files; a short transfer
// is sent again at most kMaxTries times; a directory lists at most kMaxDirEntries names; ReadFile
// reads at most kMaxReadFileBytes.
#include "io/nfs_io.h"

#include <fcntl.h>
// libnfs.h first: it defines what the raw headers use.
#include <nfsc/libnfs.h>
// clang-format off
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs.h>
// clang-format on
#include <poll.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "util/assert.h"
#include "util/clock.h"

namespace ckpt::io {
namespace {

constexpr uint64_t kMaxReadFileBytes = uint64_t{64} << 20;
constexpr size_t kMaxDirEntries = size_t{1} << 20;
constexpr int kMaxDirDepth = 2048;
constexpr uint32_t kMaxTries = 64;
constexpr size_t kMaxOutstanding = 1 << 16;
constexpr size_t kMaxVerifiers = 1024;
// The event loop wakes at least this often while calls are in flight: libnfs checks its
// deadlines only when serviced.
constexpr int kServiceIntervalMs = 100;
// A WRITE3/READ3 carries at most this much even where the server allows more.
constexpr uint64_t kMaxTransferBytes = uint64_t{1} << 20;
// A metadata call that failed faster than this on a broken connection is tried again on a new
// one (the connection was stale); a slower failure is the server not answering.
constexpr uint64_t kQuickFailureNs = 1'000'000'000;
// A queue whose connect failed fails its requests to that server at once for this long.
constexpr uint64_t kReconnectAfterNs = 1'000'000'000;

// libnfs reports a failed RPC as EFAULT and a cancelled or timed-out one as EINTR (it has no
// errno of its own for them); sockets add the rest.
bool IsConnectionError(int err) {
  switch (err) {
    case EFAULT:
    case EINTR:
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ETIMEDOUT:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ESHUTDOWN:
      return true;
    default:
      return false;
  }
}

// nfs_get_fh returns a struct that libnfs's public headers only declare. Its layout, { int len;
// char* val; }, is libnfs-private.h's in 4.0 (Debian 12's, which the build requires) and in every
// later release; a length outside NFSv3's 1..64 bytes is refused rather than trusted.
struct NfsFhLayout {
  int len;
  char* val;
};

bool CopyHandle(nfsfh* fh, std::vector<uint8_t>* out) {
  const auto* raw = reinterpret_cast<const NfsFhLayout*>(nfs_get_fh(fh));
  if (raw == nullptr || raw->len <= 0 || raw->len > NFS3_FHSIZE || raw->val == nullptr) {
    return false;
  }
  out->assign(raw->val, raw->val + raw->len);
  return true;
}

// libnfs's last error text; it may have none (NULL).
std::string ErrorOf(nfs_context* nfs) {
  const char* e = nfs_get_error(nfs);
  return e != nullptr ? e : "no detail from libnfs";
}

std::string BareHost(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

// A call made through libnfs's asynchronous API and waited for (Mount::Run). It lives on the heap,
// owned by its Mount, not in the waiter's frame: libnfs's own synchronous calls keep their
// completion on the stack and return when their wait fails (a broken connection, a signal during
// poll) while the request stays queued, and destroying the context later completes it into a
// frame that is gone. A call given up on keeps its record, without its output, until the context
// is destroyed.
struct Pending {
  bool done = false;
  int status = 0;
  std::function<void(int status, void* data)> on_data;  // copies the result out; data is libnfs's
};

void Completed(int status, nfs_context*, void* data, void* private_data) {
  auto* p = static_cast<Pending*>(private_data);
  p->done = true;
  p->status = status;
  if (p->on_data) p->on_data(status, data);
}

// One libnfs context mounted on one export of one server; its owner's alone.
class Mount {
 public:
  Mount() = default;
  Mount(const Mount&) = delete;
  Mount& operator=(const Mount&) = delete;
  ~Mount() {
    // The context first: it completes (cancels) what is still queued, into records still alive.
    if (nfs_ != nullptr) nfs_destroy_context(nfs_);
    pending_.clear();
  }

  // Starts a call (start(cb, private) queues it; nonzero: not queued) and services the
  // connection until it completes: its status (0 or bytes, or -errno), or -EIO when the
  // connection broke or its deadline passed (broken() then says so: drop this Mount).
  int Run(const std::function<int(nfs_cb, void*)>& start,
          std::function<void(int, void*)> on_data = nullptr) {
    auto record = std::make_unique<Pending>();
    Pending* p = record.get();
    p->on_data = std::move(on_data);
    pending_.push_back(std::move(record));
    if (start(Completed, p) != 0) {
      pending_.pop_back();  // not queued: no callback will come
      broken_ = true;
      return -EIO;
    }
    const uint64_t deadline = MonoNs() + (static_cast<uint64_t>(timeout_ms_) + 1000) * 1'000'000;
    // Bounded by the deadline: every round polls for at most kServiceIntervalMs.
    while (!p->done) {
      pollfd pfd{nfs_get_fd(nfs_), static_cast<short>(nfs_which_events(nfs_)), 0};
      const int rc = ::poll(&pfd, 1, kServiceIntervalMs);
      if (rc < 0 && errno != EINTR) broken_ = true;
      if (!broken_ && nfs_service(nfs_, rc > 0 ? pfd.revents : 0) < 0) broken_ = true;
      if (!p->done && (broken_ || MonoNs() > deadline)) {
        broken_ = true;
        p->on_data = nullptr;  // its output would go to a frame that returns now
        return -EIO;
      }
    }
    const int status = p->status;
    std::erase_if(pending_, [p](const std::unique_ptr<Pending>& r) { return r.get() == p; });
    return status;
  }
  bool broken() const { return broken_; }

  // The calls the metadata path makes, each over its asynchronous form: 0 (or bytes) or -errno.
  int Stat(const std::string& inside, nfs_stat_64* st) {
    return Run([&](nfs_cb cb, void* p) { return nfs_stat64_async(nfs_, inside.c_str(), cb, p); },
               [st](int status, void* data) {
                 if (status == 0) *st = *static_cast<nfs_stat_64*>(data);
               });
  }
  int Fstat(nfsfh* fh, nfs_stat_64* st) {
    return Run([&](nfs_cb cb, void* p) { return nfs_fstat64_async(nfs_, fh, cb, p); },
               [st](int status, void* data) {
                 if (status == 0) *st = *static_cast<nfs_stat_64*>(data);
               });
  }
  // Opens (create: creates) `inside`; *fh is the caller's to Close.
  int Open(const std::string& inside, int flags, bool create, nfsfh** fh) {
    return Run(
        [&](nfs_cb cb, void* p) {
          return create ? nfs_create_async(nfs_, inside.c_str(), flags, 0644, cb, p)
                        : nfs_open_async(nfs_, inside.c_str(), flags, cb, p);
        },
        [fh](int status, void* data) {
          if (status == 0) *fh = static_cast<nfsfh*>(data);
        });
  }
  int Close(nfsfh* fh) {
    return Run([&](nfs_cb cb, void* p) { return nfs_close_async(nfs_, fh, cb, p); });
  }
  int Truncate(nfsfh* fh) {
    return Run([&](nfs_cb cb, void* p) { return nfs_ftruncate_async(nfs_, fh, 0, cb, p); });
  }
  int Mkdir(const std::string& inside) {
    return Run([&](nfs_cb cb, void* p) { return nfs_mkdir_async(nfs_, inside.c_str(), cb, p); });
  }
  int Rmdir(const std::string& inside) {
    return Run([&](nfs_cb cb, void* p) { return nfs_rmdir_async(nfs_, inside.c_str(), cb, p); });
  }
  int Unlink(const std::string& inside) {
    return Run([&](nfs_cb cb, void* p) { return nfs_unlink_async(nfs_, inside.c_str(), cb, p); });
  }
  int Rename(const std::string& from, const std::string& to) {
    return Run([&](nfs_cb cb, void* p) {
      return nfs_rename_async(nfs_, from.c_str(), to.c_str(), cb, p);
    });
  }
  int Opendir(const std::string& inside, nfsdir** dir) {
    return Run([&](nfs_cb cb, void* p) { return nfs_opendir_async(nfs_, inside.c_str(), cb, p); },
               [dir](int status, void* data) {
                 if (status == 0) *dir = static_cast<nfsdir*>(data);
               });
  }
  int Pread(nfsfh* fh, uint64_t offset, uint64_t count, void* out) {
    return Run([&](nfs_cb cb, void* p) { return nfs_pread_async(nfs_, fh, offset, count, cb, p); },
               [out, count](int status, void* data) {
                 if (status > 0) std::memcpy(out, data, std::min<uint64_t>(status, count));
               });
  }
  int Pwrite(nfsfh* fh, uint64_t offset, uint64_t count, const void* in) {
    return Run(
        [&](nfs_cb cb, void* p) { return nfs_pwrite_async(nfs_, fh, offset, count, in, cb, p); });
  }
  int Fsync(nfsfh* fh) {
    return Run([&](nfs_cb cb, void* p) { return nfs_fsync_async(nfs_, fh, cb, p); });
  }

  // Connects to where.Server() and mounts the export that holds where.path: `export_dir` when
  // known, else the longest prefix of where.path the server lets us mount (a server exports
  // directories, and mounts only those).
  static Status Connect(const NfsLocation& where, const std::string& export_dir, int timeout_ms,
                        std::unique_ptr<Mount>* out) {
    std::vector<std::string> tries;
    if (!export_dir.empty()) {
      tries.push_back(export_dir);
    } else {
      for (std::string p = where.path;; p = ParentOf(p)) {
        tries.push_back(p);
        if (p == "/") break;
      }
    }
    Status refused;
    for (const std::string& dir : tries) {
      auto m = std::make_unique<Mount>();
      m->nfs_ = nfs_init_context();
      if (m->nfs_ == nullptr) return Status::NoMemory("nfs: creating a libnfs context");
      nfs_set_autoreconnect(m->nfs_, 0);  // a lost connection fails its calls; we reconnect
      nfs_set_timeout(m->nfs_, timeout_ms);
      nfs_set_dircache(m->nfs_, 0);  // another client's files must show at once
      if (nfs_set_version(m->nfs_, NFS_V3) != 0) {
        return Status::Internal("nfs: libnfs refuses NFSv3");
      }
      // libnfs sets explicit ports only from a URL's arguments.
      const std::string args = "nfs://x/?nfsport=" + std::to_string(where.port) +
                               "&mountport=" + std::to_string(where.mount_port);
      nfs_url* url = nfs_parse_url_dir(m->nfs_, args.c_str());
      if (url == nullptr) {
        return Status::Internal("nfs: libnfs refused its port arguments: " + ErrorOf(m->nfs_));
      }
      nfs_destroy_url(url);
      m->timeout_ms_ = timeout_ms;
      const std::string host = BareHost(where.host);
      std::string answer;
      const int rc = m->Run(
          [&](nfs_cb cb, void* p) {
            return nfs_mount_async(m->nfs_, host.c_str(), dir.c_str(), cb, p);
          },
          [&answer](int status, void* data) {
            if (status < 0 && data != nullptr) answer = static_cast<const char*>(data);
          });
      if (rc == 0) {
        m->export_ = dir;
        m->read_max_ = std::min<uint64_t>(nfs_get_readmax(m->nfs_), kMaxTransferBytes);
        m->write_max_ = std::min<uint64_t>(nfs_get_writemax(m->nfs_), kMaxTransferBytes);
        if (m->read_max_ == 0 || m->write_max_ == 0) {
          return Status::IoError("nfs server " + where.Server() + " offers no read or write size");
        }
        *out = std::move(m);
        return Status::Ok();
      }
      const std::string why = answer.empty() ? ErrorOf(m->nfs_) : answer;
      // MNT refused this directory (not an export): try its parent. Anything else is the
      // server or the network.
      if (m->broken() || why.find("MNT3ERR") == std::string::npos) {
        return Status::IoError("nfs server " + where.Server() + " did not answer mounting " + dir +
                               ": " + why);
      }
      refused = Status::FromErrno(
          -rc, "nfs server " + where.Server() + " refused to mount " + dir + " (" + why + ")");
    }
    return refused.WithContext("no export of nfs server " + where.Server() + " holds " +
                               where.path);
  }

  nfs_context* nfs() const { return nfs_; }
  rpc_context* rpc() const { return nfs_get_rpc_context(nfs_); }
  const std::string& export_dir() const { return export_; }
  uint64_t read_max() const { return read_max_; }
  uint64_t write_max() const { return write_max_; }

  // The path as libnfs wants it: inside the export, starting with '/'.
  std::string Inside(const std::string& path) const {
    if (export_ == "/") return path;
    if (path.size() == export_.size()) return "/";
    return path.substr(export_.size());
  }
  bool Holds(const std::string& path) const {
    return export_ == "/" || path == export_ ||
           (path.size() > export_.size() && path.compare(0, export_.size(), export_) == 0 &&
            path[export_.size()] == '/');
  }

 private:
  nfs_context* nfs_ = nullptr;
  std::string export_;
  uint64_t read_max_ = 0;
  uint64_t write_max_ = 0;
  int timeout_ms_ = 10'000;
  bool broken_ = false;
  std::vector<std::unique_ptr<Pending>> pending_;
};

struct NfsFile {
  NfsLocation where;
  std::vector<uint8_t> fh;  // the server's file handle
  uint64_t fileid = 0;
};

class NfsIoImpl;

// A queue: local requests go to the local queue, nfs ones to this queue's own connections.
class NfsQueue final : public IoQueue {
 public:
  NfsQueue(NfsIoImpl* io, std::unique_ptr<IoQueue> local, uint32_t depth)
      : io_(io), local_(std::move(local)), depth_(depth) {}
  ~NfsQueue() override {
    // Every call still in flight is cancelled (its callback runs) before the ops it names go.
    for (auto& [server, conn] : conns_) conn.mount.reset();
  }

  Status RegisterBuffers(std::span<const iovec> buffers) override {
    return local_->RegisterBuffers(buffers);
  }
  Status Submit(std::span<const IoRequest> requests) override;
  Status Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) override;
  size_t outstanding() const override { return local_->outstanding() + ops_.size() + done_.size(); }
  int WaitFd() const override { return -1; }

 private:
  struct Op;
  struct Conn {
    std::unique_ptr<Mount> mount;
    uint32_t in_flight = 0;
    uint64_t failed_ns = 0;  // when a connect last failed (0: it did not)
  };
  // One READ3, WRITE3 or COMMIT3 in flight.
  struct Call {
    NfsQueue* queue = nullptr;
    Op* op = nullptr;
    uint64_t offset = 0;
    uint8_t* data = nullptr;
    uint32_t length = 0;
    uint32_t tries = 0;
  };
  struct Op {
    IoRequest request;
    std::string server;
    std::vector<uint8_t> fh;
    uint64_t next = 0;             // bytes of the request handed to calls so far
    uint32_t in_flight = 0;        // its calls in flight
    int error = 0;                 // first errno
    uint64_t eof_at = UINT64_MAX;  // a read: where the server said the file ends
    bool started = false;
  };
  // Write verifiers of one file since its last COMMIT.
  struct Verifier {
    bool have = false;
    bool changed = false;
    char verf[NFS3_WRITEVERFSIZE] = {};
  };

  void AddNfs(const IoRequest& r);
  void Issue();
  bool IssueCall(Op* op, Conn& conn, uint64_t offset, uint8_t* data, uint32_t length);
  bool Send(Call* call, Conn& conn);
  void Finish(Call* call, int error, uint64_t transferred, bool eof);
  void CompleteIfDone(Op* op);
  void Drop(const std::string& server, int error);
  void DropBroken();
  void Service(int timeout_ms);
  static void OnReply(rpc_context* rpc, int status, void* data, void* private_data);

  NfsIoImpl* io_;
  std::unique_ptr<IoQueue> local_;
  uint32_t depth_;
  std::map<std::string, Conn> conns_;
  std::list<Op> ops_;
  std::vector<IoCompletion> done_;
  std::map<int, Verifier> verifiers_;
  std::vector<std::string> broken_;
};

class NfsIoImpl final : public Io {
 public:
  NfsIoImpl(std::unique_ptr<Io> local, const NfsOptions& options)
      : local_(std::move(local)), options_(options) {}

  const NfsOptions& options() const { return options_; }

  Status NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) override {
    std::unique_ptr<IoQueue> local;
    CKPTDB_RETURN_IF_ERROR(local_->NewQueue(options, &local));
    *out = std::make_unique<NfsQueue>(this, std::move(local), options.queue_depth);
    return Status::Ok();
  }

  Status Open(const std::string& path, const OpenOptions& options, int* fd,
              bool* direct_out) override {
    if (!IsNfsPath(path)) return local_->Open(path, options, fd, direct_out);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    NfsFile file;
    file.where = where;
    const char* doing = options.mode == OpenOptions::Mode::kRead ? "open" : "create";
    Status st = Call(where, std::string(doing) + " " + path, /*retry=*/true, [&](Mount& m) {
      const std::string inside = m.Inside(where.path);
      nfsfh* fh = nullptr;
      int rc = 0;
      switch (options.mode) {
        case OpenOptions::Mode::kRead:
          rc = m.Open(inside, O_RDONLY, /*create=*/false, &fh);
          break;
        case OpenOptions::Mode::kCreateWrite:
          rc = m.Open(inside, O_WRONLY | O_TRUNC, /*create=*/true, &fh);
          break;
        case OpenOptions::Mode::kWrite:
          rc = m.Open(inside, O_WRONLY, /*create=*/false, &fh);
          break;
      }
      if (rc != 0) return rc;
      nfs_stat_64 st{};
      rc = m.Fstat(fh, &st);
      if (rc == 0 && options.mode == OpenOptions::Mode::kCreateWrite && st.nfs_size != 0) {
        rc = m.Truncate(fh);
      }
      if (!CopyHandle(fh, &file.fh)) rc = -EIO;
      file.fileid = st.nfs_ino;
      if (!m.broken()) m.Close(fh);
      return rc;
    });
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> guard(mu_);
    CKPTDB_ASSERT(next_fd_ < INT32_MAX);
    *fd = next_fd_++;
    files_[*fd] = std::move(file);
    if (direct_out != nullptr) *direct_out = false;
    return Status::Ok();
  }

  Status Close(int fd) override {
    if (fd < kNfsFdBase) return local_->Close(fd);
    std::lock_guard<std::mutex> guard(mu_);
    if (files_.erase(fd) == 0) return Status::Invalid("close: no nfs file " + std::to_string(fd));
    return Status::Ok();
  }

  Status FileSize(int fd, uint64_t* bytes) override {
    if (fd < kNfsFdBase) return local_->FileSize(fd, bytes);
    NfsFile file;
    CKPTDB_RETURN_IF_ERROR(Lookup(fd, &file));
    // By path, then checked to be the same file: libnfs has no GETATTR by handle alone.
    const std::string path =
        MakeNfsPath(file.where.host, file.where.port, file.where.mount_port, file.where.path);
    nfs_stat_64 st{};
    CKPTDB_RETURN_IF_ERROR(Stat(file.where, path, &st));
    if (st.nfs_ino != file.fileid) {
      return Status::FromErrno(ESTALE, "size of " + path +
                                           ": the file was replaced since it "
                                           "was opened");
    }
    *bytes = st.nfs_size;
    return Status::Ok();
  }

  Status CreateDirs(const std::string& path) override {
    if (!IsNfsPath(path)) return local_->CreateDirs(path);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    return Call(where, "create directories " + path, /*retry=*/true, [&](Mount& m) {
      const std::string inside = m.Inside(where.path);
      int depth = 0;
      for (size_t end = inside.find('/', 1);; end = inside.find('/', end + 1)) {
        const std::string prefix = inside.substr(0, end);
        if (prefix.size() > 1) {
          if (++depth > kMaxDirDepth) return -ENAMETOOLONG;
          int rc = m.Mkdir(prefix);
          if (rc == -EEXIST) {
            nfs_stat_64 st{};
            rc = m.Stat(prefix, &st);
            if (rc == 0 && !S_ISDIR(st.nfs_mode)) rc = -ENOTDIR;
          }
          if (rc != 0) return rc;
        }
        if (end == std::string::npos) break;
      }
      return 0;
    });
  }

  Status ListDir(const std::string& path, std::vector<std::string>* names) override {
    if (!IsNfsPath(path)) return local_->ListDir(path, names);
    CKPTDB_ASSERT(names != nullptr);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    std::vector<std::string> found;
    bool too_many = false;
    CKPTDB_RETURN_IF_ERROR(Call(where, "list directory " + path, true, [&](Mount& m) {
      found.clear();
      nfsdir* dir = nullptr;
      const int rc = m.Opendir(m.Inside(where.path), &dir);
      if (rc != 0) return rc;
      for (nfsdirent* e = nfs_readdir(m.nfs(), dir); e != nullptr; e = nfs_readdir(m.nfs(), dir)) {
        if (std::strcmp(e->name, ".") == 0 || std::strcmp(e->name, "..") == 0) continue;
        if (found.size() >= kMaxDirEntries) {
          too_many = true;
          break;
        }
        found.emplace_back(e->name);
      }
      nfs_closedir(m.nfs(), dir);
      return 0;
    }));
    if (too_many) {
      return Status::Size("list directory " + path + ": more than " +
                          std::to_string(kMaxDirEntries) + " entries");
    }
    std::sort(found.begin(), found.end());
    *names = std::move(found);
    return Status::Ok();
  }

  Status PathSize(const std::string& path, uint64_t* bytes) override {
    if (!IsNfsPath(path)) return local_->PathSize(path, bytes);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    nfs_stat_64 st{};
    CKPTDB_RETURN_IF_ERROR(Stat(where, path, &st));
    *bytes = st.nfs_size;
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (!IsNfsPath(from) && !IsNfsPath(to)) return local_->Rename(from, to);
    NfsLocation a;
    NfsLocation b;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(from, &a));
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(to, &b));
    if (a.Server() != b.Server()) {
      return Status::Invalid("rename " + from + " to " + to + ": not on one nfs server");
    }
    const std::string what = "rename " + from + " to " + to;
    nfs_stat_64 before{};
    CKPTDB_RETURN_IF_ERROR(Stat(a, from, &before).WithContext(what));
    Status st = Call(a, what, /*retry=*/true, [&](Mount& m) {
      const int rc = m.Rename(m.Inside(a.path), m.Inside(b.path));
      // A retried RENAME whose first answer was lost finds its source gone: the check below
      // decides.
      return rc == -ENOENT ? 0 : rc;
    });
    if (!st.ok()) return st;
    // The directory's state after the rename: the new name is the file, the old one is gone.
    nfs_stat_64 after{};
    CKPTDB_RETURN_IF_ERROR(Stat(b, to, &after).WithContext(what + ": checking the new name"));
    if (after.nfs_ino != before.nfs_ino) {
      return Status::IoError(what +
                             ": the server reports another file under the new name "
                             "after the rename");
    }
    nfs_stat_64 old{};
    Status gone = Stat(a, from, &old);
    if (gone.ok()) {
      return Status::IoError(what + ": the old name still exists after the rename");
    }
    if (gone.code() != CKPTDB_ENOTFOUND) return gone.WithContext(what + ": checking the old name");
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (!IsNfsPath(path)) return local_->Remove(path);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    return Call(where, "remove " + path, /*retry=*/true, [&](Mount& m) {
      const std::string inside = m.Inside(where.path);
      int rc = m.Unlink(inside);
      if (rc == -EISDIR || rc == -EPERM) {
        nfs_stat_64 st{};
        if (m.Stat(inside, &st) == 0 && S_ISDIR(st.nfs_mode)) rc = m.Rmdir(inside);
      }
      return rc == -ENOENT ? 0 : rc;
    });
  }

  // NFSv3 makes every directory operation stable before it answers: what is left to check is
  // that the server still has the directory.
  Status SyncDir(const std::string& path) override {
    if (!IsNfsPath(path)) return local_->SyncDir(path);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    nfs_stat_64 st{};
    return Stat(where, path, &st).WithContext("sync directory " + path);
  }

  Status ReadFile(const std::string& path, std::string* contents) override {
    if (!IsNfsPath(path)) return local_->ReadFile(path, contents);
    CKPTDB_ASSERT(contents != nullptr);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    std::string data;
    bool too_big = false;
    CKPTDB_RETURN_IF_ERROR(Call(where, "read " + path, /*retry=*/true, [&](Mount& m) {
      data.clear();
      nfsfh* fh = nullptr;
      int rc = m.Open(m.Inside(where.path), O_RDONLY, /*create=*/false, &fh);
      if (rc != 0) return rc;
      char chunk[16384];
      for (;;) {
        const int n = m.Pread(fh, data.size(), sizeof chunk, chunk);
        if (n < 0) {
          rc = n;
          break;
        }
        if (n == 0) break;
        if (data.size() + static_cast<size_t>(n) > kMaxReadFileBytes) {
          too_big = true;
          break;
        }
        data.append(chunk, static_cast<size_t>(n));
      }
      if (!m.broken()) m.Close(fh);
      return rc;
    }));
    if (too_big) {
      return Status::Size("read " + path + ": larger than " + std::to_string(kMaxReadFileBytes) +
                          " bytes, the most ReadFile reads (it is for small marker files)");
    }
    *contents = std::move(data);
    return Status::Ok();
  }

  // FILE_SYNC writes (O_SYNC): each answer means stable, so no verifier is involved.
  Status WriteFileDurably(const std::string& path, const std::string& contents) override {
    if (!IsNfsPath(path)) return local_->WriteFileDurably(path, contents);
    NfsLocation where;
    CKPTDB_RETURN_IF_ERROR(ParseNfsPath(path, &where));
    const std::string tmp = path + ".tmp";
    NfsLocation tmp_where = where;
    tmp_where.path += ".tmp";
    Status st = Call(where, "write " + tmp, /*retry=*/true, [&](Mount& m) {
      nfsfh* fh = nullptr;
      int rc = m.Open(m.Inside(tmp_where.path), O_WRONLY | O_TRUNC | O_SYNC, /*create=*/true, &fh);
      if (rc != 0) return rc;
      nfs_stat_64 st{};
      rc = m.Fstat(fh, &st);
      if (rc == 0 && st.nfs_size != 0) rc = m.Truncate(fh);
      for (size_t done = 0; rc == 0 && done < contents.size();) {
        const size_t n = std::min<size_t>(contents.size() - done, m.write_max());
        const int w = m.Pwrite(fh, done, n, contents.data() + done);
        if (w < 0) rc = w;
        if (w == 0) rc = -EIO;
        if (w > 0) done += static_cast<size_t>(w);
      }
      if (rc == 0) rc = m.Fsync(fh);
      if (!m.broken()) m.Close(fh);
      return rc;
    });
    if (st.ok()) st = Rename(tmp, path);
    if (!st.ok()) {
      (void)Remove(tmp);  // best effort: a stale .tmp is harmless, the old file stands
      return st;
    }
    return Status::Ok();
  }

  Status OpenSharedMemory(const std::string& path, const SharedMemoryOptions& options,
                          std::unique_ptr<SharedMemory>* out) override {
    if (IsNfsPath(path)) return Status::NotSupported("shared memory on nfs: " + path);
    return local_->OpenSharedMemory(path, options, out);
  }
  Status OpenMappedFile(const std::string& path, const MappedFileOptions& options,
                        std::shared_ptr<MappedFile>* out) override {
    if (IsNfsPath(path)) return Status::NotSupported("a mapped file on nfs: " + path);
    return local_->OpenMappedFile(path, options, out);
  }

  Status Lookup(int fd, NfsFile* out) {
    std::lock_guard<std::mutex> guard(mu_);
    auto it = files_.find(fd);
    if (it == files_.end()) return Status::Invalid("no open nfs file " + std::to_string(fd));
    *out = it->second;
    return Status::Ok();
  }

  // A data connection for a queue: mounted on the export the metadata connection found.
  Status ConnectData(const NfsLocation& where, std::unique_ptr<Mount>* out) {
    return Mount::Connect(where, KnownExport(where), options_.timeout_ms, out);
  }

 private:
  // Runs op (a libnfs sync call returning 0 or -errno) on the server's metadata connection,
  // connecting first where needed. A connection error drops the connection; with `retry` the
  // call runs once more on a new one.
  template <typename Op>
  Status Call(const NfsLocation& where, const std::string& what, bool retry, Op op) {
    std::lock_guard<std::mutex> guard(meta_mu_);
    const std::string server = where.Server();
    for (int attempt = 0;; ++attempt) {
      std::unique_ptr<Mount>& m = meta_[server];
      if (m == nullptr || !m->Holds(where.path)) {
        m.reset();
        Status st = Mount::Connect(where, KnownExport(where), options_.timeout_ms, &m);
        if (!st.ok()) return st.WithContext(what);
        std::lock_guard<std::mutex> files_guard(mu_);
        exports_[server].insert(m->export_dir());
      }
      const uint64_t start_ns = MonoNs();
      const int rc = op(*m);
      if (rc == 0) return Status::Ok();
      const std::string why = ErrorOf(m->nfs());
      // A connection that broke (an old one, to a server that restarted since) or a server's
      // NFS3ERR_IO is tried once more on a new connection, and so is a stale handle (the export
      // was recreated: a new mount looks the path up from a fresh root handle). A call that
      // waited out its deadline is not: the server does not answer, and its caller would wait
      // twice as long.
      const bool dropped = m->broken() || IsConnectionError(-rc);
      const bool quick = MonoNs() - start_ns < kQuickFailureNs;
      if (dropped || rc == -EIO || rc == -ESTALE) {
        m.reset();
        if (attempt == 0 && ((retry && quick) || rc == -ESTALE)) continue;
      }
      if (dropped) {
        return Status::IoError(what + ": nfs server " + server + " did not answer (" + why + ")");
      }
      return Status::FromErrno(-rc, what + " (" + why + ")");
    }
  }

  // An export of the server found earlier that holds where.path, or "" (then Connect looks).
  std::string KnownExport(const NfsLocation& where) {
    std::lock_guard<std::mutex> guard(mu_);
    auto it = exports_.find(where.Server());
    if (it == exports_.end()) return "";
    std::string best;
    for (const std::string& e : it->second) {
      const bool holds =
          e == "/" || where.path == e || (where.path.starts_with(e) && where.path[e.size()] == '/');
      if (holds && e.size() >= best.size()) best = e;
    }
    return best;
  }

  Status Stat(const NfsLocation& where, const std::string& path, nfs_stat_64* st) {
    return Call(where, "stat " + path, /*retry=*/true,
                [&](Mount& m) { return m.Stat(m.Inside(where.path), st); });
  }

  std::unique_ptr<Io> local_;
  NfsOptions options_;
  std::mutex meta_mu_;  // the metadata connections (held across calls to the server)
  std::map<std::string, std::unique_ptr<Mount>> meta_;
  std::mutex mu_;  // below meta_mu_: the open files and the exports found
  std::map<int, NfsFile> files_;
  std::map<std::string, std::set<std::string>> exports_;
  int next_fd_ = kNfsFdBase;
};

// ---- NfsQueue ----------------------------------------------------------------------------------

Status NfsQueue::Submit(std::span<const IoRequest> requests) {
  size_t start = 0;
  for (size_t i = 0; i <= requests.size(); ++i) {
    if (i < requests.size() && requests[i].fd < kNfsFdBase) continue;
    if (i > start) CKPTDB_RETURN_IF_ERROR(local_->Submit(requests.subspan(start, i - start)));
    if (i < requests.size()) AddNfs(requests[i]);
    start = i + 1;
  }
  Issue();
  return Status::Ok();
}

void NfsQueue::AddNfs(const IoRequest& r) {
  CKPTDB_ASSERT(ops_.size() + done_.size() < kMaxOutstanding);
  NfsFile file;
  Status st = io_->Lookup(r.fd, &file);
  if (!st.ok()) {
    done_.push_back({r.tag, -EBADF});
    return;
  }
  const std::string server = file.where.Server();
  Conn& conn = conns_[server];
  if (conn.mount == nullptr) {
    // A server that did not answer a moment ago fails the requests after it at once: each
    // connect may wait out the deadline.
    if (conn.failed_ns != 0 && MonoNs() - conn.failed_ns < kReconnectAfterNs) {
      done_.push_back({r.tag, -ECONNREFUSED});
      return;
    }
    st = io_->ConnectData(file.where, &conn.mount);
    if (!st.ok()) {
      conn.failed_ns = MonoNs();
      std::fprintf(stderr, "ckptdb: %s\n", st.ToString().c_str());
      done_.push_back({r.tag, -ECONNREFUSED});
      return;
    }
    conn.failed_ns = 0;
  }
  if (r.op == IoRequest::Op::kWrite && verifiers_.size() > kMaxVerifiers) {
    // Files closed without a COMMIT leave their entry: dropped once the file is gone.
    std::erase_if(verifiers_, [this](const auto& v) {
      NfsFile f;
      return !io_->Lookup(v.first, &f).ok();
    });
  }
  Op& op = ops_.emplace_back();
  op.request = r;
  op.server = server;
  op.fh = std::move(file.fh);
}

// Hands calls to the connections, oldest request first, up to max_in_flight per connection.
void NfsQueue::Issue() {
  const uint32_t limit = io_->options().max_in_flight;
  for (auto it = ops_.begin(); it != ops_.end();) {
    Op& op = *it++;
    auto c = conns_.find(op.server);
    if (c == conns_.end() || c->second.mount == nullptr) {
      if (op.error == 0) op.error = ECONNRESET;
      CompleteIfDone(&op);
      continue;
    }
    Conn& conn = c->second;
    const IoRequest& r = op.request;
    if (op.error != 0) {
      CompleteIfDone(&op);
      continue;
    }
    if (r.op == IoRequest::Op::kSync) {
      if (!op.started && conn.in_flight < limit) {
        op.started = true;
        IssueCall(&op, conn, 0, nullptr, 0);
      }
      continue;
    }
    const uint64_t max =
        r.op == IoRequest::Op::kRead ? conn.mount->read_max() : conn.mount->write_max();
    while (op.error == 0 && op.next < r.length && conn.in_flight < limit) {
      const auto n = static_cast<uint32_t>(std::min<uint64_t>(max, r.length - op.next));
      op.started = true;
      if (!IssueCall(&op, conn, r.offset + op.next, static_cast<uint8_t*>(r.buffer) + op.next, n))
        break;
      op.next += n;
    }
    if (r.length == 0 && !op.started) {
      op.started = true;
      CompleteIfDone(&op);
    }
  }
  DropBroken();
}

// Connections that failed, dropped; dropping one runs callbacks that may name more.
void NfsQueue::DropBroken() {
  for (int round = 0; !broken_.empty(); ++round) {
    CKPTDB_ASSERT(round < 1024);
    std::vector<std::string> servers;
    servers.swap(broken_);
    for (const std::string& server : servers) Drop(server, ECONNRESET);
  }
}

bool NfsQueue::IssueCall(Op* op, Conn& conn, uint64_t offset, uint8_t* data, uint32_t length) {
  auto* call = new Call{this, op, offset, data, length, 0};
  return Send(call, conn);
}

bool NfsQueue::Send(Call* call, Conn& conn) {
  Op* op = call->op;
  nfs_fh3 fh{};
  fh.data.data_len = static_cast<u_int>(op->fh.size());
  fh.data.data_val = reinterpret_cast<char*>(op->fh.data());
  int rc = 0;
  switch (op->request.op) {
    case IoRequest::Op::kWrite: {
      WRITE3args a{};
      a.file = fh;
      a.offset = call->offset;
      a.count = call->length;
      a.stable = UNSTABLE;
      a.data.data_len = call->length;
      a.data.data_val = reinterpret_cast<char*>(call->data);
      rc = rpc_nfs3_write_async(conn.mount->rpc(), OnReply, &a, call);
      break;
    }
    case IoRequest::Op::kRead: {
      READ3args a{};
      a.file = fh;
      a.offset = call->offset;
      a.count = call->length;
      rc = rpc_nfs3_read_async(conn.mount->rpc(), OnReply, &a, call);
      break;
    }
    case IoRequest::Op::kSync: {
      COMMIT3args a{};
      a.file = fh;
      rc = rpc_nfs3_commit_async(conn.mount->rpc(), OnReply, &a, call);
      break;
    }
  }
  if (rc != 0) {
    // Not queued: no callback will come.
    if (op->error == 0) op->error = ECONNRESET;
    delete call;
    broken_.push_back(op->server);
    return false;
  }
  conn.in_flight++;
  op->in_flight++;
  return true;
}

void NfsQueue::OnReply(rpc_context* rpc, int status, void* data, void* private_data) {
  auto* call = static_cast<Call*>(private_data);
  NfsQueue* q = call->queue;
  Op* op = call->op;
  if (status != RPC_STATUS_SUCCESS) {
    const int err = status == RPC_STATUS_TIMEOUT ? ETIMEDOUT : ECONNRESET;
    q->broken_.push_back(op->server);
    q->Finish(call, err, 0, false);
    return;
  }
  switch (op->request.op) {
    case IoRequest::Op::kWrite: {
      auto* res = static_cast<WRITE3res*>(data);
      if (res->status != NFS3_OK) {
        q->Finish(call, nfsstat3_to_errno(res->status) < 0 ? -nfsstat3_to_errno(res->status) : EIO,
                  0, false);
        return;
      }
      const WRITE3resok& ok = res->WRITE3res_u.resok;
      Verifier& v = q->verifiers_[op->request.fd];
      if (ok.committed == UNSTABLE || ok.committed == DATA_SYNC) {
        if (v.have && std::memcmp(v.verf, ok.verf, sizeof v.verf) != 0) v.changed = true;
        std::memcpy(v.verf, ok.verf, sizeof v.verf);
        v.have = true;
      }
      q->Finish(call, 0, std::min<uint64_t>(ok.count, call->length), false);
      return;
    }
    case IoRequest::Op::kRead: {
      auto* res = static_cast<READ3res*>(data);
      if (res->status != NFS3_OK) {
        q->Finish(call, nfsstat3_to_errno(res->status) < 0 ? -nfsstat3_to_errno(res->status) : EIO,
                  0, false);
        return;
      }
      const READ3resok& ok = res->READ3res_u.resok;
      const uint64_t n = std::min<uint64_t>({ok.count, ok.data.data_len, call->length});
      std::memcpy(call->data, ok.data.data_val, n);
      q->Finish(call, 0, n, ok.eof != 0);
      return;
    }
    case IoRequest::Op::kSync: {
      auto* res = static_cast<COMMIT3res*>(data);
      if (res->status != NFS3_OK) {
        q->Finish(call, nfsstat3_to_errno(res->status) < 0 ? -nfsstat3_to_errno(res->status) : EIO,
                  0, false);
        return;
      }
      auto it = q->verifiers_.find(op->request.fd);
      int err = 0;
      if (it != q->verifiers_.end()) {
        const Verifier& v = it->second;
        if (v.changed ||
            (v.have && std::memcmp(v.verf, res->COMMIT3res_u.resok.verf, sizeof v.verf) != 0)) {
          std::fprintf(stderr,
                       "ckptdb: nfs server %s restarted before COMMIT (its write verifier "
                       "changed): unstable writes may be lost; the file must be written again\n",
                       op->server.c_str());
          err = ECONNRESET;
        }
        // A matching COMMIT settles the writes before it; a changed verifier stays: every
        // later COMMIT of the file fails too, until it is written again under a new open.
        if (err == 0) q->verifiers_.erase(it);
      }
      q->Finish(call, err, 0, false);
      return;
    }
  }
  (void)rpc;
}

// A call's answer: the rest of a short transfer goes out again (a bounded number of times); the
// op completes when its last call is in.
void NfsQueue::Finish(Call* call, int error, uint64_t transferred, bool eof) {
  Op* op = call->op;
  auto c = conns_.find(op->server);
  CKPTDB_ASSERT(op->in_flight > 0);
  op->in_flight--;
  if (c != conns_.end() && c->second.in_flight > 0) c->second.in_flight--;
  const bool data = op->request.op != IoRequest::Op::kSync;
  if (error != 0) {
    if (op->error == 0) op->error = error;
  } else if (op->request.op == IoRequest::Op::kRead && (eof || transferred == 0)) {
    op->eof_at = std::min(op->eof_at, call->offset + transferred);
  } else if (data && transferred < call->length) {
    call->offset += transferred;
    call->data += transferred;
    call->length -= static_cast<uint32_t>(transferred);
    const bool alive = c != conns_.end() && c->second.mount != nullptr;
    if (++call->tries < kMaxTries && alive && op->error == 0) {
      Send(call, c->second);  // on failure it freed the call and set op->error
      CompleteIfDone(op);
      return;
    }
    if (op->error == 0) op->error = EIO;
  }
  delete call;
  CompleteIfDone(op);
}

void NfsQueue::CompleteIfDone(Op* op) {
  const IoRequest& r = op->request;
  bool all_sent = op->next >= r.length;
  if (op->error != 0) all_sent = true;  // nothing more goes out for it
  if (r.op == IoRequest::Op::kSync) all_sent = op->started || op->error != 0;
  if (op->in_flight > 0 || !all_sent) return;
  int64_t result = 0;
  if (op->error != 0) {
    result = -op->error;
  } else if (r.op == IoRequest::Op::kRead) {
    const uint64_t end = std::min(op->eof_at, r.offset + r.length);
    result = static_cast<int64_t>(end > r.offset ? end - r.offset : 0);
  } else if (r.op == IoRequest::Op::kWrite) {
    result = static_cast<int64_t>(r.length);
  }
  done_.push_back({r.tag, result});
  for (auto it = ops_.begin(); it != ops_.end(); ++it) {
    if (&*it == op) {
      ops_.erase(it);
      break;
    }
  }
}

// A connection that failed: destroying it cancels its calls (each callback runs), then every
// op of the server still waiting fails.
void NfsQueue::Drop(const std::string& server, int error) {
  auto c = conns_.find(server);
  if (c == conns_.end()) return;
  std::unique_ptr<Mount> mount = std::move(c->second.mount);
  mount.reset();
  conns_.erase(server);
  std::vector<Op*> left;
  for (Op& op : ops_) {
    if (op.server == server) left.push_back(&op);
  }
  for (Op* op : left) {
    CKPTDB_ASSERT(op->in_flight == 0);
    if (op->error == 0) op->error = error;
    op->started = true;
    op->next = op->request.length;
    CompleteIfDone(op);
  }
}

// Polls every connection (and the local queue's wait descriptor, when it has one) for up to
// timeout_ms and services what is ready; every connection is serviced at least once, so
// libnfs checks its deadlines.
void NfsQueue::Service(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::string> servers;
  for (auto& [server, conn] : conns_) {
    if (conn.mount == nullptr) continue;
    fds.push_back({rpc_get_fd(conn.mount->rpc()),
                   static_cast<short>(rpc_which_events(conn.mount->rpc())), 0});
    servers.push_back(server);
  }
  const int local_fd = local_->outstanding() > 0 ? local_->WaitFd() : -1;
  if (local_fd >= 0) fds.push_back({local_fd, POLLIN, 0});
  if (local_->outstanding() > 0 && local_fd < 0) timeout_ms = std::min(timeout_ms, 1);
  (void)::poll(fds.data(), fds.size(), timeout_ms);
  for (size_t i = 0; i < servers.size(); ++i) {
    auto c = conns_.find(servers[i]);
    if (c == conns_.end() || c->second.mount == nullptr) continue;
    if (rpc_service(c->second.mount->rpc(), fds[i].revents) < 0) broken_.push_back(servers[i]);
  }
  DropBroken();
}

Status NfsQueue::Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) {
  CKPTDB_ASSERT(out != nullptr);
  if (ops_.empty() && done_.empty()) return local_->Reap(min_completions, out, timeout_ms);
  const size_t wanted = std::min(min_completions, outstanding());
  const uint64_t start_ns = MonoNs();
  auto left_ms = [&]() -> int {
    if (timeout_ms < 0) return -1;
    const int64_t left =
        int64_t{timeout_ms} - static_cast<int64_t>((MonoNs() - start_ns) / 1'000'000);
    return static_cast<int>(std::max<int64_t>(0, left));
  };
  size_t got = 0;
  Status status;
  // Bounded by the deadline, or (none) by the requests outstanding: each round services the
  // connections, and a connection that stops answering fails its calls at libnfs's deadline.
  for (;;) {
    // libnfs sends queued calls and checks their deadlines only when serviced: every round does,
    // even one that asks for nothing and waits for nothing.
    if (!ops_.empty()) Service(0);
    if (local_->outstanding() > 0) {
      const size_t before = out->size();
      Status st = local_->Reap(0, out, 0);
      got += out->size() - before;
      if (!st.ok() && st.code() != CKPTDB_ETIMEDOUT) status = st;
    }
    Issue();
    if (got + done_.size() >= wanted || !status.ok()) break;
    const int left = left_ms();
    if (left == 0) {
      status = Status::TimedOut("nfs queue: " + std::to_string(got + done_.size()) + " of " +
                                std::to_string(wanted) + " completions wanted came within " +
                                std::to_string(timeout_ms) + " ms");
      break;
    }
    if (ops_.empty()) {
      // Only local requests are left to wait for: the local queue waits best.
      const size_t before = out->size();
      Status st = local_->Reap(wanted - got - done_.size(), out, left);
      got += out->size() - before;
      if (!st.ok()) status = st;
      break;
    }
    Service(left < 0 ? kServiceIntervalMs : std::min(left, kServiceIntervalMs));
  }
  out->insert(out->end(), done_.begin(), done_.end());
  done_.clear();
  return status;
}

}  // namespace

std::unique_ptr<Io> NewNfsIo(std::unique_ptr<Io> local, const NfsOptions& options) {
  return std::make_unique<NfsIoImpl>(std::move(local), options);
}

}  // namespace ckpt::io
