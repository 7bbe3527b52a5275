// SharedMemory: a file in a memory file system (normally /dev/shm) mapped whole and shared. It is
// the ram tier's arena (DESIGN.md section 5): the pages belong to the file, not to the process,
// so they outlive a trainer that crashes or is killed (REFT's tmpfs copy without the dump,
// GEMINI's local CPU-memory checkpoint), and the next process maps the same bytes again. They do
// not outlive the node: a reboot empties the file system.
//
// A new file is given all its pages at creation (fallocate, so a full file system is an error
// now rather than a SIGBUS later) and they are touched once: LIMITS.md measured first touch of
// memory on these VMs at 0.3 GB/s, against 17 GB/s for memory already touched, and that first
// touch must not land inside a checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace ckpt::io {

// Every process that maps an arena, or a peer's replica or parity file, holds a shared flock on
// it for as long as it has it open; `ckptdb gc` (engine/arena_gc.h) takes an exclusive one,
// without waiting, before it unlinks a file, so a file some process has open is never removed,
// and no scan of /proc is needed. LockShared takes the shared lock on fd, waiting out a gc's
// brief exclusive one (at most kMaxLockWaitMs), then checks that `path` still names the file fd
// is: gc may have unlinked it between the open and the lock. *stale says it did: close fd and
// open the path again.
inline constexpr int kMaxLockWaitMs = 2000;
Status LockShared(int fd, const std::string& path, bool* stale);

// A shared flock on a directory for the holder's life: a replica or parity store holds one on its
// directory, so `ckptdb gc` removes nothing in it (replicas kept by name and mapped only when
// read, or served by path, are in use too).
class DirLock {
 public:
  static Status Take(const std::string& dir, std::unique_ptr<DirLock>* out);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  DirLock() = default;
  int fd_ = -1;
};

struct SharedMemoryOptions {
  bool read_only = false;  // map PROT_READ; the file must exist (NotFound otherwise)
  // Read-write: the size to create the file with when it does not exist. An existing file is
  // mapped at its own size (see bytes()); Resize changes it.
  uint64_t create_bytes = 0;
  // Map every page up front (MAP_POPULATE) and mlock the mapping, best effort (RLIMIT_MEMLOCK
  // may forbid it): for the trainer, whose captures must not fault. A tool that reads a few
  // copies maps lazily.
  bool lock = true;
};

class SharedMemory {
 public:
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Opens (read-write: creating when absent) the file at path and maps it.
  static Status Open(const std::string& path, const SharedMemoryOptions& options,
                     std::unique_ptr<SharedMemory>* out);

  // Read-write only: grows or shrinks the file to `bytes` (new pages allocated and touched as at
  // creation) and maps it again; data() changes. The caller ensures nothing lives past `bytes`.
  Status Resize(uint64_t bytes);

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }
  bool created() const { return created_; }  // Open made the file
  bool locked() const { return locked_; }    // mlock succeeded

 private:
  SharedMemory() = default;
  Status Map();
  void Unmap();

  std::string path_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool read_only_ = false;
  bool lock_ = true;
  bool created_ = false;
  bool locked_ = false;
};

}  // namespace ckpt::io
