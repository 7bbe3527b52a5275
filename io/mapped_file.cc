#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "io/shared_memory.h"

namespace ckpt::io {

Status MappedFile::Open(const std::string& path, const MappedFileOptions& options,
                        std::shared_ptr<MappedFile>* out) {
  // Held open under a shared flock for its life (io/shared_memory.h, LockShared): `ckptdb gc`
  // never removes it meanwhile. A file gc removed between the open and the lock is gone.
  auto lock = [&path](int fd) {
    bool stale = false;
    CKPTDB_RETURN_IF_ERROR(LockShared(fd, path, &stale));
    if (stale) return Status::NotFound(path + ": removed (by ckptdb gc) as it was opened");
    return Status::Ok();
  };
  if (!options.read_only) {
    std::shared_ptr<MappedFile> m(new MappedFile());
    m->fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC | (options.create ? O_CREAT | O_EXCL : 0), 0600);
    if (m->fd_ < 0) return Status::FromErrno(errno, path);
    CKPTDB_RETURN_IF_ERROR(lock(m->fd_));
    CKPTDB_RETURN_IF_ERROR(m->Resize(options.bytes, path));
    *out = std::move(m);
    return Status::Ok();
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->writable_ = false;
  m->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (m->fd_ < 0) return Status::FromErrno(errno, path);
  CKPTDB_RETURN_IF_ERROR(lock(m->fd_));
  struct stat sb {};
  if (fstat(m->fd_, &sb) != 0) return Status::FromErrno(errno, path);
  if (sb.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(sb.st_size), PROT_READ, MAP_SHARED, m->fd_, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, path + ": mmap");
    m->data_ = static_cast<uint8_t*>(p);
    m->bytes_ = static_cast<uint64_t>(sb.st_size);
  }
  *out = std::move(m);
  return Status::Ok();
}

void MappedFile::Populate(uint64_t offset, uint64_t bytes) const {
  if (data_ == nullptr || offset >= bytes_) return;
  const uint64_t page = 4096;
  uint64_t first = offset & ~(page - 1);
  uint64_t end = std::min(bytes_, offset + std::min(bytes, bytes_ - offset));
  // Best effort: a kernel without MADV_POPULATE_* (EINVAL) leaves the pages to fault in.
  if (madvise(data_ + first, end - first, writable_ ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) ==
          0 &&
      first == 0 && end == bytes_) {
    populated_ = true;
  }
}

Status MappedFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes,
                          const std::string& what) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return Status::Invalid(what + ": a read of [" + std::to_string(offset) + ", +" +
                           std::to_string(bytes) + ") past its " + std::to_string(bytes_) +
                           " bytes");
  }
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < bytes) {
    ssize_t n = pread(fd_, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, what + ": pread");
    if (n == 0) return Status::IoError(what + ": the file ends before its mapping does");
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status MappedFile::Reserve(const std::string& what) const {
  if (populated_ || data_ == nullptr) return Status::Ok();
  if (writable_) {
    // Best effort where the file system has no fallocate (EOPNOTSUPP): tmpfs has it.
    int rc = 0;
    do {
      rc = fallocate(fd_, 0, 0, static_cast<off_t>(bytes_));  // a pending signal: EINTR
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EOPNOTSUPP) {
      return Status::FromErrno(
          errno, what + ": allocating its " + std::to_string(bytes_) + " bytes of memory");
    }
  }
  Populate(0, bytes_);
  return Status::Ok();
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
}

Status MappedFile::Resize(uint64_t bytes, const std::string& what) {
  if (bytes == bytes_ && (data_ != nullptr || bytes == 0)) return Status::Ok();
  if (data_ != nullptr) munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  populated_ = false;
  if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0) return Status::FromErrno(errno, what);
  if (bytes == 0) return Status::Ok();
  // Not populated here, under the store's lock: Begin and Find populate after letting it go, so
  // that Place (the transport's progress thread) never waits for new pages (LIMITS.md: first
  // touch 0.3 GB/s).
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, what + ": mmap");
  data_ = static_cast<uint8_t*>(p);
  bytes_ = bytes;
  return Status::Ok();
}

}  // namespace ckpt::io
