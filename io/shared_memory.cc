#include "io/shared_memory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/assert.h"

namespace ckpt::io {
namespace {

constexpr int kMaxInterrupts = 1000;
constexpr uint64_t kPageBytes = 4096;

// Allocates [from, to) of the file. Bounded: EINTR is retried a fixed number of times.
Status Allocate(int fd, uint64_t from, uint64_t to, const std::string& path) {
  for (int i = 0; i < kMaxInterrupts; ++i) {
    if (::fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(to - from)) == 0) {
      return Status::Ok();
    }
    if (errno == EINTR) continue;
    if (errno == EOPNOTSUPP) break;  // a file system without fallocate: size it and go on
    return Status::FromErrno(errno, "allocating " + std::to_string(to - from) + " bytes of " +
                                        path + " (is the memory file system full?)");
  }
  if (::ftruncate(fd, static_cast<off_t>(to)) != 0) {
    return Status::FromErrno(errno, "sizing " + path + " to " + std::to_string(to) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

SharedMemory::~SharedMemory() {
  Unmap();
  if (fd_ >= 0) ::close(fd_);
}

Status LockShared(int fd, const std::string& path, bool* stale) {
  *stale = false;
  for (int waited_ms = 0;; ++waited_ms) {
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR) return Status::FromErrno(errno, "flock " + path);
    if (waited_ms >= kMaxLockWaitMs) {
      return Status::Busy(path + " is held exclusively for over " + std::to_string(kMaxLockWaitMs) +
                          " ms (a ckptdb gc removing it?)");
    }
    ::usleep(1000);
  }
  struct stat by_fd {};
  struct stat by_name {};
  if (::fstat(fd, &by_fd) != 0) return Status::FromErrno(errno, "stat " + path);
  if (::stat(path.c_str(), &by_name) != 0) {
    if (errno != ENOENT) return Status::FromErrno(errno, "stat " + path);
    *stale = true;
  } else {
    *stale = by_fd.st_dev != by_name.st_dev || by_fd.st_ino != by_name.st_ino;
  }
  return Status::Ok();
}

Status DirLock::Take(const std::string& dir, std::unique_ptr<DirLock>* out) {
  std::unique_ptr<DirLock> lock(new DirLock());
  lock->fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock->fd_ < 0) return Status::FromErrno(errno, "opening directory " + dir);
  bool stale = false;
  CKPTDB_RETURN_IF_ERROR(LockShared(lock->fd_, dir, &stale));
  if (stale) return Status::Busy("directory " + dir + " was removed (by ckptdb gc) as it opened");
  *out = std::move(lock);
  return Status::Ok();
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

Status SharedMemory::Open(const std::string& path, const SharedMemoryOptions& options,
                          std::unique_ptr<SharedMemory>* out) {
  auto m = std::unique_ptr<SharedMemory>(new SharedMemory());
  m->path_ = path;
  m->read_only_ = options.read_only;
  m->lock_ = options.lock;
  int flags = O_CLOEXEC | (options.read_only ? O_RDONLY : O_RDWR);
  // Opened and locked shared (LockShared); a name that a gc unlinked in between is opened again,
  // a bounded number of times (each needs a gc to remove the file anew).
  for (int attempt = 0;; ++attempt) {
    m->fd_ = ::open(path.c_str(), flags);
    if (m->fd_ < 0 && errno == ENOENT && !options.read_only) {
      CKPTDB_ASSERT(options.create_bytes % kPageBytes == 0 && options.create_bytes > 0);
      m->fd_ = ::open(path.c_str(), flags | O_CREAT | O_EXCL, 0600);
      if (m->fd_ >= 0) m->created_ = true;
      if (m->fd_ < 0 && errno == EEXIST && attempt < 8) continue;  // another opener made it
    }
    if (m->fd_ < 0) {
      return Status::FromErrno(errno, std::string("opening shared memory ") + path +
                                          (options.read_only ? " for reading" : ""));
    }
    bool stale = false;
    CKPTDB_RETURN_IF_ERROR(LockShared(m->fd_, path, &stale));
    if (!stale) break;
    ::close(m->fd_);
    m->fd_ = -1;
    m->created_ = false;
    if (attempt >= 8) {
      return Status::Busy("opening shared memory " + path +
                          ": it was removed under this open 8 times running");
    }
  }
  if (m->created_) {
    Status st = Allocate(m->fd_, 0, options.create_bytes, path);
    if (!st.ok()) {
      ::unlink(path.c_str());
      return st;
    }
  }
  struct stat st {};
  if (::fstat(m->fd_, &st) != 0) return Status::FromErrno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return Status::Invalid("shared memory " + path + " is not a file");
  m->bytes_ = static_cast<uint64_t>(st.st_size);
  if (m->bytes_ == 0 || m->bytes_ % kPageBytes != 0) {
    return Status::Corrupt("shared memory " + path + " is " + std::to_string(m->bytes_) +
                           " bytes, not a positive multiple of 4096");
  }
  Status mapped = m->Map();
  if (!mapped.ok()) {
    if (m->created_) ::unlink(path.c_str());
    return mapped;
  }
  if (m->created_) {
    // One write per page now, so the first checkpoint does not pay for the first touch.
    for (uint64_t off = 0; off < m->bytes_; off += kPageBytes) m->data_[off] = 0;
  }
  *out = std::move(m);
  return Status::Ok();
}

Status SharedMemory::Map() {
  int prot = read_only_ ? PROT_READ : PROT_READ | PROT_WRITE;
  void* p = ::mmap(nullptr, bytes_, prot, MAP_SHARED | (lock_ ? MAP_POPULATE : 0), fd_, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(
        errno, "mapping " + std::to_string(bytes_) + " bytes of shared memory " + path_);
  }
  data_ = static_cast<uint8_t*>(p);
  locked_ = lock_ && ::mlock(data_, bytes_) == 0;
  return Status::Ok();
}

void SharedMemory::Unmap() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
}

Status SharedMemory::Resize(uint64_t bytes) {
  CKPTDB_ASSERT(!read_only_);
  CKPTDB_ASSERT(bytes > 0 && bytes % kPageBytes == 0);
  if (bytes == bytes_) return Status::Ok();
  uint64_t old = bytes_;
  if (bytes > old) {
    CKPTDB_RETURN_IF_ERROR(Allocate(fd_, old, bytes, path_));
  } else if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno(errno,
                             "shrinking " + path_ + " to " + std::to_string(bytes) + " bytes");
  }
  Unmap();
  bytes_ = bytes;
  CKPTDB_RETURN_IF_ERROR(Map());
  for (uint64_t off = old; off < bytes_; off += kPageBytes) data_[off] = 0;
  return Status::Ok();
}

}  // namespace ckpt::io
