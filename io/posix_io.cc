// PosixIo: the real Io. Metadata goes through plain POSIX calls (they are rare: a few per
// segment), data through io_uring queues (io/uring_queue.h). Every error names the operation
// and the path, so a user can act on it without a debugger: "open /x/y for writing: ...".
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/io.h"
#include "io/nfs_io.h"
#include "io/uring_queue.h"
#include "util/assert.h"

namespace ckpt::io {
namespace {

// System calls interrupted by a signal are retried this many times before the error is
// reported: a flood of signals must not turn into a hang.
constexpr int kMaxInterrupts = 1000;
// ReadFile is for small files (markers, a few hundred bytes); anything this large is not one.
constexpr uint64_t kMaxReadFileBytes = uint64_t{64} << 20;
// A tier directory holds a few files per version; a million names means something is wrong, and
// the bound keeps ListDir's memory in check.
constexpr size_t kMaxDirEntries = size_t{1} << 20;
// mkdir -p creates at most this many levels (PATH_MAX 4096 allows at most 2048).
constexpr int kMaxDirDepth = 2048;

int OpenRetrying(const char* path, int flags, mode_t mode) {
  for (int i = 0; i < kMaxInterrupts; ++i) {
    const int fd = ::open(path, flags, mode);
    if (fd >= 0 || errno != EINTR) return fd;
  }
  return -1;  // errno is EINTR
}

int FsyncRetrying(int fd) {
  for (int i = 0; i < kMaxInterrupts; ++i) {
    if (::fsync(fd) == 0) return 0;
    if (errno != EINTR) return -1;
  }
  return -1;
}

std::string ParentDir(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

Status SyncDirectory(const std::string& path) {
  const int fd = OpenRetrying(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "open directory " + path + " to fsync it");
  Status status;
  if (FsyncRetrying(fd) != 0) status = Status::FromErrno(errno, "fsync directory " + path);
  ::close(fd);
  return status;
}

// Writes all of data to fd at its file position. Bounded: each round moves at least one byte or
// counts an interruption.
Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done_bytes = 0;
  int interrupts = 0;
  while (done_bytes < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done_bytes, data.size() - done_bytes);
    if (n < 0) {
      if (errno == EINTR && ++interrupts < kMaxInterrupts) continue;
      return Status::FromErrno(errno, "write " + std::to_string(data.size()) + " bytes to " + path);
    }
    if (n == 0) {
      return Status::IoError("write " + std::to_string(data.size()) + " bytes to " + path +
                             ": the kernel wrote 0 bytes after " + std::to_string(done_bytes));
    }
    done_bytes += static_cast<size_t>(n);
  }
  return Status::Ok();
}

class PosixIo final : public Io {
 public:
  Status NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) override {
    return NewUringQueue(options, out);
  }

  Status Open(const std::string& path, const OpenOptions& options, int* fd,
              bool* direct_out) override {
    CKPTDB_ASSERT(fd != nullptr);
    const bool writing = options.mode != OpenOptions::Mode::kRead;
    const char* purpose = writing ? " for writing" : " for reading";
    int flags = O_CLOEXEC;
    switch (options.mode) {
      case OpenOptions::Mode::kRead:
        flags |= O_RDONLY;
        break;
      case OpenOptions::Mode::kCreateWrite:
        flags |= O_WRONLY | O_CREAT | O_TRUNC;
        break;
      case OpenOptions::Mode::kWrite:
        flags |= O_WRONLY;
        break;
    }
    bool direct = options.direct;
    int opened = OpenRetrying(path.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
    if (opened < 0 && direct && errno == EINVAL) {
      // The file system refuses O_DIRECT (tmpfs before Linux 6.6, ramfs, procfs): the documented
      // fallback is buffered I/O, reported through *direct_out so the tier can say so.
      direct = false;
      opened = OpenRetrying(path.c_str(), flags, 0644);
    }
    if (opened < 0) {
      return Status::FromErrno(errno, std::string("open ") + path + purpose +
                                          (options.direct && direct ? " with O_DIRECT" : ""));
    }
    *fd = opened;
    if (direct_out != nullptr) *direct_out = direct;
    return Status::Ok();
  }

  Status Close(int fd) override {
    // No retry on EINTR: Linux has released the descriptor either way, and a second close
    // could close one another thread just opened.
    if (::close(fd) != 0) return Status::FromErrno(errno, "close fd " + std::to_string(fd));
    return Status::Ok();
  }

  Status FileSize(int fd, uint64_t* bytes) override {
    CKPTDB_ASSERT(bytes != nullptr);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat fd " + std::to_string(fd));
    *bytes = static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }

  Status CreateDirs(const std::string& path) override {
    if (path.empty()) return Status::Invalid("create directories: empty path");
    // Each prefix that ends a component, shortest first: "/a/b/c" -> "/a", "/a/b", "/a/b/c".
    int depth = 0;
    for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
      const std::string prefix = path.substr(0, end);
      const bool last = end == std::string::npos;
      if (!prefix.empty() && prefix.back() != '/') {
        if (++depth > kMaxDirDepth) {
          return Status::Invalid("create directories " + path + ": more than " +
                                 std::to_string(kMaxDirDepth) + " levels");
        }
        CKPTDB_RETURN_IF_ERROR(CreateOneDir(prefix).WithContext("create directories " + path));
      }
      if (last) break;
    }
    return Status::Ok();
  }

  Status ListDir(const std::string& path, std::vector<std::string>* names) override {
    CKPTDB_ASSERT(names != nullptr);
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return Status::FromErrno(errno, "list directory " + path);
    std::vector<std::string> found;
    Status status;
    for (;;) {
      errno = 0;
      const dirent* entry = ::readdir(dir);
      if (entry == nullptr) {
        if (errno != 0) status = Status::FromErrno(errno, "list directory " + path);
        break;
      }
      if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
      if (found.size() >= kMaxDirEntries) {
        status = Status::Size("list directory " + path + ": more than " +
                              std::to_string(kMaxDirEntries) + " entries");
        break;
      }
      found.emplace_back(entry->d_name);
    }
    ::closedir(dir);
    if (!status.ok()) return status;
    std::sort(found.begin(), found.end());
    *names = std::move(found);
    return Status::Ok();
  }

  Status PathSize(const std::string& path, uint64_t* bytes) override {
    CKPTDB_ASSERT(bytes != nullptr);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
    *bytes = static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return Status::FromErrno(errno, "rename " + from + " to " + to);
    }
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::Ok();
    if (errno == EISDIR) {
      // An (empty) directory: retention removes a version's directory after its files.
      if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return Status::Ok();
      return Status::FromErrno(errno, "remove directory " + path);
    }
    return Status::FromErrno(errno, "remove " + path);
  }

  Status SyncDir(const std::string& path) override { return SyncDirectory(path); }

  Status OpenSharedMemory(const std::string& path, const SharedMemoryOptions& options,
                          std::unique_ptr<SharedMemory>* out) override {
    return SharedMemory::Open(path, options, out);
  }

  Status OpenMappedFile(const std::string& path, const MappedFileOptions& options,
                        std::shared_ptr<MappedFile>* out) override {
    return MappedFile::Open(path, options, out);
  }

  Status ReadFile(const std::string& path, std::string* contents) override {
    CKPTDB_ASSERT(contents != nullptr);
    const int fd = OpenRetrying(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno(errno, "open " + path + " for reading");
    Status status = ReadAllFrom(fd, path, contents);
    ::close(fd);
    return status;
  }

  Status WriteFileDurably(const std::string& path, const std::string& contents) override {
    const std::string tmp = path + ".tmp";
    const int fd = OpenRetrying(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno(errno, "open " + tmp + " for writing");
    Status status = WriteAll(fd, contents, tmp);
    if (status.ok() && FsyncRetrying(fd) != 0) status = Status::FromErrno(errno, "fsync " + tmp);
    // close can report a deferred write error (NFS): it counts.
    if (::close(fd) != 0 && status.ok()) status = Status::FromErrno(errno, "close " + tmp);
    if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
      status = Status::FromErrno(errno, "rename " + tmp + " to " + path);
    }
    if (!status.ok()) {
      ::unlink(tmp.c_str());  // best effort: a stale .tmp is harmless, the old file stands
      return status;
    }
    // The rename is durable only once the directory is.
    return SyncDirectory(ParentDir(path)).WithContext("write " + path + " durably");
  }

 private:
  // mkdir of one level; fsyncs the parent when it created the directory so the new entry
  // survives a crash.
  static Status CreateOneDir(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0755) == 0) return SyncDirectory(ParentDir(dir));
    const int err = errno;
    if (err != EEXIST) return Status::FromErrno(err, "mkdir " + dir);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + dir);
    if (!S_ISDIR(st.st_mode)) {
      return Status::Invalid("mkdir " + dir + ": it exists and is not a directory");
    }
    return Status::Ok();
  }

  static Status ReadAllFrom(int fd, const std::string& path, std::string* contents) {
    std::string data;
    char chunk[16384];
    int interrupts = 0;
    // Bounded by kMaxReadFileBytes: the loop stops with an error before reading past it.
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n < 0) {
        if (errno == EINTR && ++interrupts < kMaxInterrupts) continue;
        return Status::FromErrno(errno, "read " + path);
      }
      if (n == 0) break;
      if (data.size() + static_cast<size_t>(n) > kMaxReadFileBytes) {
        return Status::Size("read " + path + ": larger than " + std::to_string(kMaxReadFileBytes) +
                            " bytes, the most ReadFile reads (it is for small marker files)");
      }
      data.append(chunk, static_cast<size_t>(n));
    }
    *contents = std::move(data);
    return Status::Ok();
  }
};

// Submits one request on a queue that has nothing else outstanding and reaps its completion.
Status RunOne(IoQueue& queue, const IoRequest& request, IoCompletion* completion,
              const std::string& doing) {
  // With other requests outstanding, the one completion reaped could be someone else's.
  CKPTDB_ASSERT(queue.outstanding() == 0);
  CKPTDB_RETURN_IF_ERROR(queue.Submit(std::span<const IoRequest>(&request, 1)).WithContext(doing));
  std::vector<IoCompletion> completions;
  CKPTDB_RETURN_IF_ERROR(queue.Reap(1, &completions, -1).WithContext(doing));
  CKPTDB_ASSERT(completions.size() == 1);
  CKPTDB_ASSERT(completions[0].tag == request.tag);
  *completion = completions[0];
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Io> NewPosixIo() { return NewNfsIo(std::make_unique<PosixIo>()); }

Status ReadAt(IoQueue& queue, int fd, uint64_t offset, void* buffer, size_t length,
              const std::string& what) {
  IoRequest request;
  request.op = IoRequest::Op::kRead;
  request.fd = fd;
  request.offset = offset;
  request.buffer = buffer;
  request.length = length;
  const std::string doing = "read " + std::to_string(length) + " bytes at offset " +
                            std::to_string(offset) + " of " + what;
  IoCompletion completion;
  CKPTDB_RETURN_IF_ERROR(RunOne(queue, request, &completion, doing));
  if (completion.result < 0) return Status::FromErrno(static_cast<int>(-completion.result), doing);
  if (static_cast<uint64_t>(completion.result) < length) {
    // The caller asked for bytes it expects to be there (its manifest says so): a file that
    // ends early was truncated or is not the file the manifest describes.
    return Status::Corrupt("short read of " + std::to_string(completion.result) + " of " +
                           std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                           " of " + what + ": the file ends early");
  }
  return Status::Ok();
}

Status WriteAt(IoQueue& queue, int fd, uint64_t offset, const void* buffer, size_t length,
               const std::string& what) {
  IoRequest request;
  request.op = IoRequest::Op::kWrite;
  request.fd = fd;
  request.offset = offset;
  // The queue never writes into a write request's buffer; IoRequest has one pointer for both.
  request.buffer = const_cast<void*>(buffer);
  request.length = length;
  const std::string doing = "write " + std::to_string(length) + " bytes at offset " +
                            std::to_string(offset) + " of " + what;
  IoCompletion completion;
  CKPTDB_RETURN_IF_ERROR(RunOne(queue, request, &completion, doing));
  if (completion.result < 0) return Status::FromErrno(static_cast<int>(-completion.result), doing);
  if (static_cast<uint64_t>(completion.result) != length) {
    return Status::IoError("short write of " + std::to_string(completion.result) + " of " +
                           std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                           " of " + what);
  }
  return Status::Ok();
}

Status SyncFile(IoQueue& queue, int fd, const std::string& what) {
  IoRequest request;
  request.op = IoRequest::Op::kSync;
  request.fd = fd;
  const std::string doing = "fsync " + what;
  IoCompletion completion;
  CKPTDB_RETURN_IF_ERROR(RunOne(queue, request, &completion, doing));
  if (completion.result < 0) return Status::FromErrno(static_cast<int>(-completion.result), doing);
  return Status::Ok();
}

}  // namespace ckpt::io
