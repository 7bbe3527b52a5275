// The I/O seam (DESIGN.md section 8): every file and device operation ckptdb makes goes through
// an Io, so tests can swap in one that injects faults (dropped unsynced data, torn writes, EIO,
// ENOSPC) the way LevelDB's fault-injection Env and RocksDB's FaultInjectionFS do.
//
// Two parts:
//   - Io: the file system. Metadata calls are synchronous; they are rare (a few per segment).
//   - Io also maps the ram tier's shared memory (io/shared_memory.h).
//   - IoQueue: an asynchronous data queue (one io_uring per queue): reads, writes and fsyncs
//     submitted in batches, completions reaped by tag. One owner thread per queue.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "io/shared_memory.h"
#include "util/status.h"

namespace ckpt::io {

struct IoRequest {
  enum class Op : uint8_t { kRead, kWrite, kSync };
  Op op = Op::kRead;
  int fd = -1;
  uint64_t offset = 0;
  void* buffer = nullptr;  // read into / write from; unused for kSync
  size_t length = 0;
  // Index of a registered buffer that contains [buffer, buffer + length), or -1.
  int buffer_index = -1;
  uint64_t tag = 0;  // returned unchanged in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  // Bytes transferred (== length for writes and syncs that succeed; a read may be short only at
  // end of file), or -errno.
  int64_t result = 0;
};

struct QueueOptions {
  uint32_t queue_depth = 64;  // submission queue entries; bounded in-flight requests
  // Hand every write to a kernel worker (io_uring's IOSQE_ASYNC) instead of trying it inline at
  // submission. A buffered write (tmpfs) otherwise runs its copy on the submitting thread;
  // offloaded, the kernel copies one chunk on another core while the caller copies and hashes
  // the next. docs/performance.md has the measurement that chose it for the engine's writes.
  bool offload_writes = false;
};

class IoQueue {
 public:
  virtual ~IoQueue() = default;

  // Registers buffers for fixed-buffer I/O (io_uring_register_buffers). Fails with ENOMEM when
  // RLIMIT_MEMLOCK forbids it (non-root); callers then go on without and say so.
  virtual Status RegisterBuffers(std::span<const iovec> buffers) = 0;

  // Queues requests and hands them to the kernel in batches. Never more than queue_depth are
  // in flight: when full, it waits for completions, which it keeps for Reap. Short writes and
  // short reads before end of file are resubmitted for the remainder, so a completion reports the
  // whole request. Returns an error only when submission itself fails.
  virtual Status Submit(std::span<const IoRequest> requests) = 0;

  // Appends at least min_completions completions (fewer only if fewer are outstanding) to out.
  // timeout_ms < 0 waits forever; on timeout returns TimedOut with what it has appended.
  virtual Status Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) = 0;

  // Requests submitted whose completion has not yet been returned by Reap.
  virtual size_t outstanding() const = 0;

  // A descriptor that polls readable (POLLIN) when Reap has completions to return without
  // waiting, or -1 when the queue has none: a queue that waits on more than one source (io/
  // nfs_io.h) polls it beside its own.
  virtual int WaitFd() const { return -1; }
};

struct OpenOptions {
  enum class Mode : uint8_t {
    kRead,
    kCreateWrite,  // create or truncate, write only
    kWrite,        // an existing file, write only, contents kept
  };
  Mode mode = Mode::kRead;
  // Ask for O_DIRECT. If the file system refuses it (EINVAL: ramfs, procfs, tmpfs before Linux
  // 6.6), the file is opened buffered and *direct_out (if given) is false. Callers align offsets,
  // lengths and buffers to 4096.
  bool direct = false;
};

class Io {
 public:
  virtual ~Io() = default;

  virtual Status NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) = 0;

  // Returns a file descriptor usable in IoRequest.fd. *direct_out says whether O_DIRECT is on.
  virtual Status Open(const std::string& path, const OpenOptions& options, int* fd,
                      bool* direct_out) = 0;
  virtual Status Close(int fd) = 0;
  virtual Status FileSize(int fd, uint64_t* bytes) = 0;

  virtual Status CreateDirs(const std::string& path) = 0;  // mkdir -p
  virtual Status ListDir(const std::string& path, std::vector<std::string>* names) = 0;
  virtual Status PathSize(const std::string& path, uint64_t* bytes) = 0;  // NotFound if absent
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;  // ok if already absent
  virtual Status SyncDir(const std::string& path) = 0;
  // Whole small files (markers): WriteFileDurably writes to path.tmp, fsyncs, renames, fsyncs
  // the directory.
  virtual Status ReadFile(const std::string& path, std::string* contents) = 0;
  virtual Status WriteFileDurably(const std::string& path, const std::string& contents) = 0;

  // The ram tier's arena: a shared-memory file mapped whole (io/shared_memory.h).
  virtual Status OpenSharedMemory(const std::string& path, const SharedMemoryOptions& options,
                                  std::unique_ptr<SharedMemory>* out) = 0;
  // Peers' replicas and parity in a node's memory: a file mapped whole and shared
  // (io/mapped_file.h).
  virtual Status OpenMappedFile(const std::string& path, const MappedFileOptions& options,
                                std::shared_ptr<MappedFile>* out) = 0;
};

// An Io that forwards every call to another (LevelDB's EnvWrapper): an Io that changes a few
// calls (io/fault_io.h, io/crash_model.h) overrides only those.
class IoWrapper : public Io {
 public:
  explicit IoWrapper(Io* base) : base_(base) {}
  Io* base() const { return base_; }

  Status NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) override {
    return base_->NewQueue(options, out);
  }
  Status Open(const std::string& path, const OpenOptions& options, int* fd,
              bool* direct_out) override {
    return base_->Open(path, options, fd, direct_out);
  }
  Status Close(int fd) override { return base_->Close(fd); }
  Status FileSize(int fd, uint64_t* bytes) override { return base_->FileSize(fd, bytes); }
  Status CreateDirs(const std::string& path) override { return base_->CreateDirs(path); }
  Status ListDir(const std::string& path, std::vector<std::string>* names) override {
    return base_->ListDir(path, names);
  }
  Status PathSize(const std::string& path, uint64_t* bytes) override {
    return base_->PathSize(path, bytes);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  Status ReadFile(const std::string& path, std::string* contents) override {
    return base_->ReadFile(path, contents);
  }
  Status WriteFileDurably(const std::string& path, const std::string& contents) override {
    return base_->WriteFileDurably(path, contents);
  }
  Status OpenSharedMemory(const std::string& path, const SharedMemoryOptions& options,
                          std::unique_ptr<SharedMemory>* out) override {
    return base_->OpenSharedMemory(path, options, out);
  }
  Status OpenMappedFile(const std::string& path, const MappedFileOptions& options,
                        std::shared_ptr<MappedFile>* out) override {
    return base_->OpenMappedFile(path, options, out);
  }

 private:
  Io* base_;
};

// The real thing: POSIX calls for metadata, io_uring for the data queues, and libnfs for the
// nfs:// paths of nfs tiers (io/nfs_io.h).
std::unique_ptr<Io> NewPosixIo();

// Synchronous conveniences over a queue with nothing else outstanding (asserted).
Status ReadAt(IoQueue& queue, int fd, uint64_t offset, void* buffer, size_t length,
              const std::string& what);
Status WriteAt(IoQueue& queue, int fd, uint64_t offset, const void* buffer, size_t length,
               const std::string& what);
Status SyncFile(IoQueue& queue, int fd, const std::string& what);

}  // namespace ckpt::io
