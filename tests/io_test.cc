// Tests of the io/ layer: UringQueue (batches, bounds, fixed buffers, fsync, timeouts, short
// transfers, errors as completions) and PosixIo (open with the O_DIRECT fallback, metadata calls,
// durable small files) and the ReadAt/WriteAt/SyncFile helpers. Files live in temporary
// directories under /dev/shm (tmpfs) and /tmp (the root file system, ext4 here), removed at the
// end of each test.
#include "io/io.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "io/uring_queue.h"
#include "util/status.h"

namespace ckpt::io {
namespace {

constexpr size_t kAlignBytes = 4096;  // O_DIRECT alignment of offsets, lengths and buffers

// A directory made by mkdtemp under parent, removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& parent) {
    std::string pattern = parent + "/ckptdb_io_test.XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Page-aligned memory, as O_DIRECT and fixed buffers want it.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes)
      : data_(static_cast<char*>(std::aligned_alloc(kAlignBytes, bytes))), size_bytes_(bytes) {
    std::memset(data_, 0, bytes);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  char* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  char* data_;
  size_t size_bytes_;
};

// Fills a buffer with a pattern that differs per byte and per seed, so a chunk written at the
// wrong offset or read from the wrong place is caught.
void FillPattern(char* data, size_t bytes, uint32_t seed) {
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + seed * 7 + i / 4096));
}

std::unique_ptr<IoQueue> MakeQueue(uint32_t queue_depth, bool offload_writes = false) {
  std::unique_ptr<IoQueue> queue;
  QueueOptions options;
  options.queue_depth = queue_depth;
  options.offload_writes = offload_writes;
  Status st = NewUringQueue(options, &queue);
  EXPECT_TRUE(st.ok()) << st.message();
  return queue;
}

IoRequest Read(int fd, uint64_t offset, void* buffer, size_t length, uint64_t tag) {
  IoRequest r;
  r.op = IoRequest::Op::kRead;
  r.fd = fd;
  r.offset = offset;
  r.buffer = buffer;
  r.length = length;
  r.tag = tag;
  return r;
}

IoRequest Write(int fd, uint64_t offset, void* buffer, size_t length, uint64_t tag) {
  IoRequest r = Read(fd, offset, buffer, length, tag);
  r.op = IoRequest::Op::kWrite;
  return r;
}

IoRequest Sync(int fd, uint64_t tag) {
  IoRequest r;
  r.op = IoRequest::Op::kSync;
  r.fd = fd;
  r.tag = tag;
  return r;
}

// Submits the requests and reaps all their completions (10 s at most), sorted by tag.
std::vector<IoCompletion> RunAll(IoQueue& queue, const std::vector<IoRequest>& requests) {
  Status st = queue.Submit(requests);
  EXPECT_TRUE(st.ok()) << st.message();
  std::vector<IoCompletion> completions;
  st = queue.Reap(requests.size(), &completions, 10'000);
  EXPECT_TRUE(st.ok()) << st.message();
  std::sort(completions.begin(), completions.end(),
            [](const IoCompletion& a, const IoCompletion& b) { return a.tag < b.tag; });
  return completions;
}

IoCompletion RunOne(IoQueue& queue, const IoRequest& request) {
  std::vector<IoCompletion> completions = RunAll(queue, {request});
  EXPECT_EQ(completions.size(), 1u);
  return completions.empty() ? IoCompletion{request.tag, INT64_MIN} : completions[0];
}

bool HasODirect(int fd) { return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

int64_t ElapsedMs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

class Pipe {
 public:
  Pipe() { EXPECT_EQ(::pipe2(fds_, O_CLOEXEC), 0); }
  ~Pipe() {
    CloseReadEnd();
    CloseWriteEnd();
  }
  int read_fd() const { return fds_[0]; }
  int write_fd() const { return fds_[1]; }
  void CloseReadEnd() {
    if (fds_[0] >= 0) ::close(fds_[0]);
    fds_[0] = -1;
  }
  void CloseWriteEnd() {
    if (fds_[1] >= 0) ::close(fds_[1]);
    fds_[1] = -1;
  }
  void Put(const char* text) {
    ASSERT_EQ(::write(fds_[1], text, std::strlen(text)), static_cast<ssize_t>(std::strlen(text)));
  }

 private:
  int fds_[2] = {-1, -1};
};

// ---- UringQueue on real files ------------------------------------------------------------------

class UringQueueOnFileSystemTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UringQueueOnFileSystemTest, WritesThenReadsBackWithDirectIoHonouredOrFallenBack) {
  TempDir dir(GetParam());
  ASSERT_TRUE(dir.ok()) << "mkdtemp under " << GetParam();
  std::unique_ptr<Io> io = NewPosixIo();
  const std::string path = dir.File("data");
  constexpr size_t kChunkBytes = 64 * 1024;
  constexpr size_t kChunks = 16;
  AlignedBuffer source(kChunkBytes * kChunks);
  AlignedBuffer target(kChunkBytes * kChunks);
  FillPattern(source.data(), source.size_bytes(), 1);

  OpenOptions write_options;
  write_options.mode = OpenOptions::Mode::kCreateWrite;
  write_options.direct = true;
  int fd = -1;
  bool direct = false;
  Status st = io->Open(path, write_options, &fd, &direct);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(direct, HasODirect(fd)) << "direct_out must say what the descriptor really does";

  std::unique_ptr<IoQueue> queue = MakeQueue(8);
  std::vector<IoRequest> writes;
  for (size_t i = 0; i < kChunks; ++i) {
    writes.push_back(
        Write(fd, i * kChunkBytes, source.data() + i * kChunkBytes, kChunkBytes, 100 + i));
  }
  std::vector<IoCompletion> done = RunAll(*queue, writes);
  ASSERT_EQ(done.size(), kChunks);
  for (size_t i = 0; i < kChunks; ++i) {
    EXPECT_EQ(done[i].tag, 100 + i);
    EXPECT_EQ(done[i].result, static_cast<int64_t>(kChunkBytes));
  }
  const IoCompletion synced = RunOne(*queue, Sync(fd, 7));
  EXPECT_EQ(synced.tag, 7u);
  EXPECT_EQ(synced.result, 0);
  ASSERT_TRUE(io->Close(fd).ok());

  OpenOptions read_options;
  read_options.direct = true;
  st = io->Open(path, read_options, &fd, &direct);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(direct, HasODirect(fd));
  std::vector<IoRequest> reads;
  for (size_t i = 0; i < kChunks; ++i) {
    reads.push_back(Read(fd, i * kChunkBytes, target.data() + i * kChunkBytes, kChunkBytes, i));
  }
  done = RunAll(*queue, reads);
  ASSERT_EQ(done.size(), kChunks);
  for (size_t i = 0; i < kChunks; ++i) {
    EXPECT_EQ(done[i].tag, i);
    EXPECT_EQ(done[i].result, static_cast<int64_t>(kChunkBytes));
  }
  EXPECT_EQ(std::memcmp(source.data(), target.data(), source.size_bytes()), 0);
  uint64_t size_bytes = 0;
  ASSERT_TRUE(io->FileSize(fd, &size_bytes).ok());
  EXPECT_EQ(size_bytes, kChunkBytes * kChunks);
  ASSERT_TRUE(io->Close(fd).ok());
  EXPECT_EQ(queue->outstanding(), 0u);
}

INSTANTIATE_TEST_SUITE_P(TmpfsAndRootFileSystem, UringQueueOnFileSystemTest,
                         ::testing::Values("/dev/shm", "/tmp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "/dev/shm" ? std::string("DevShm")
                                                           : std::string("Tmp");
                         });

// Writes `count` 4 KiB chunks, chunk i filled with byte i, through a queue of the given depth
// in one Submit, then checks every completion and the file's contents.
void WriteManyThroughOneSubmit(IoQueue& queue, size_t count) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("many"), options, &fd, nullptr).ok());
  constexpr size_t kChunkBytes = 4096;
  AlignedBuffer source(kChunkBytes * count);
  std::vector<IoRequest> writes;
  for (size_t i = 0; i < count; ++i) {
    std::memset(source.data() + i * kChunkBytes, static_cast<int>(i & 0xFF), kChunkBytes);
    writes.push_back(
        Write(fd, i * kChunkBytes, source.data() + i * kChunkBytes, kChunkBytes, 1000 + i));
  }
  Status st = queue.Submit(writes);
  ASSERT_TRUE(st.ok()) << st.message();
  // Every request counts until Reap returns it, whether the kernel finished it or not.
  EXPECT_EQ(queue.outstanding(), count);
  std::vector<IoCompletion> done;
  st = queue.Reap(count, &done, 10'000);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(done.size(), count);
  EXPECT_EQ(queue.outstanding(), 0u);
  std::sort(done.begin(), done.end(),
            [](const IoCompletion& a, const IoCompletion& b) { return a.tag < b.tag; });
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(done[i].tag, 1000 + i);
    EXPECT_EQ(done[i].result, static_cast<int64_t>(kChunkBytes));
  }
  ASSERT_TRUE(io->Close(fd).ok());
  std::string contents;
  ASSERT_TRUE(io->ReadFile(dir.File("many"), &contents).ok());
  ASSERT_EQ(contents.size(), count * kChunkBytes);
  EXPECT_EQ(std::memcmp(contents.data(), source.data(), contents.size()), 0);
}

TEST(UringQueueTest, BatchOfOneHundredThroughDepthFourCompletesEveryRequest) {
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  WriteManyThroughOneSubmit(*queue, 100);
}

TEST(UringQueueTest, BatchAtTheOutstandingBoundCompletesEveryRequest) {
  std::unique_ptr<IoQueue> queue = MakeQueue(2);
  WriteManyThroughOneSubmit(*queue, 2 * kUringBacklogPerSlot);
}

TEST(UringQueueTest, SqpollQueueHandlesBatchesLargerThanItsRing) {
  // With SQPOLL io_uring_get_sqe can return NULL before the ring is full (LIMITS.md): the queue
  // must submit, wait for room and retry.
  QueueOptions options;
  options.queue_depth = 4;
  UringQueueOptions uring_options;
  uring_options.sqpoll = true;
  std::unique_ptr<IoQueue> queue;
  Status st = NewUringQueue(options, uring_options, &queue);
  if (!st.ok()) GTEST_SKIP() << "SQPOLL unavailable here: " << st.message();
  WriteManyThroughOneSubmit(*queue, 200);
}

TEST(UringQueueTest, SubmitBeyondTheOutstandingBoundIsRefusedAndQueuesNothing) {
  std::unique_ptr<IoQueue> queue = MakeQueue(1);
  static char byte;
  std::vector<IoRequest> requests(kUringBacklogPerSlot + 1, Read(0, 0, &byte, 0, 0));
  Status st = queue->Submit(requests);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("outstanding"), std::string::npos) << st.message();
  EXPECT_EQ(queue->outstanding(), 0u);
}

TEST(UringQueueTest, MalformedRequestInABatchIsRefusedBeforeAnyIsQueued) {
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  char buffer[16];
  std::vector<IoRequest> batch = {Read(0, 0, buffer, sizeof(buffer), 1),
                                  Write(1, 0, nullptr, 10, 2)};
  Status st = queue->Submit(batch);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("tag 2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("NULL buffer"), std::string::npos) << st.message();
  EXPECT_EQ(queue->outstanding(), 0u);

  // UINT64_MAX would mean "the file position" to io_uring.
  st = queue->Submit(std::vector<IoRequest>{Read(0, UINT64_MAX, buffer, 1, 3)});
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("largest file offset"), std::string::npos) << st.message();

  IoRequest unregistered = Read(0, 0, buffer, sizeof(buffer), 4);
  unregistered.buffer_index = 0;
  st = queue->Submit(std::vector<IoRequest>{unregistered});
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("buffer_index 0"), std::string::npos) << st.message();
  EXPECT_EQ(queue->outstanding(), 0u);
}

TEST(UringQueueTest, FixedBuffersWriteAndReadBack) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  constexpr size_t kHalfBytes = 128 * 1024;
  AlignedBuffer buffer(2 * kHalfBytes);
  FillPattern(buffer.data(), kHalfBytes, 2);
  iovec region{buffer.data(), buffer.size_bytes()};
  Status st = queue->RegisterBuffers({&region, 1});
  if (!st.ok()) {
    // Non-root with a small RLIMIT_MEMLOCK: the documented degradation, with a reason.
    EXPECT_NE(st.message().find("fixed buffers are off"), std::string::npos) << st.message();
    GTEST_SKIP() << st.message();
  }

  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  options.direct = true;
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("fixed"), options, &fd, nullptr).ok());
  IoRequest write = Write(fd, 0, buffer.data(), kHalfBytes, 1);
  write.buffer_index = 0;
  IoCompletion done = RunOne(*queue, write);
  EXPECT_EQ(done.result, static_cast<int64_t>(kHalfBytes));
  ASSERT_TRUE(io->Close(fd).ok());

  options.mode = OpenOptions::Mode::kRead;
  ASSERT_TRUE(io->Open(dir.File("fixed"), options, &fd, nullptr).ok());
  IoRequest read = Read(fd, 0, buffer.data() + kHalfBytes, kHalfBytes, 2);
  read.buffer_index = 0;
  done = RunOne(*queue, read);
  EXPECT_EQ(done.tag, 2u);
  EXPECT_EQ(done.result, static_cast<int64_t>(kHalfBytes));
  EXPECT_EQ(std::memcmp(buffer.data(), buffer.data() + kHalfBytes, kHalfBytes), 0);

  // A request that reaches past the registered region is refused, not sent to the kernel.
  IoRequest outside = Read(fd, 0, buffer.data() + kHalfBytes, kHalfBytes + 1, 3);
  outside.buffer_index = 0;
  st = queue->Submit(std::vector<IoRequest>{outside});
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("not inside registered buffer 0"), std::string::npos) << st.message();
  ASSERT_TRUE(io->Close(fd).ok());

  // Re-registering (here: unregistering) works once nothing is in flight.
  st = queue->RegisterBuffers({});
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST(UringQueueTest, RegisteringBuffersBeyondMemlockLimitFailsSayingFixedBuffersAreOff) {
  // Root has no locked-memory limit, so the refusal is checked in a child that gives up root (if
  // it has it) and lowers its RLIMIT_MEMLOCK, as a user's job would run. The child reports the
  // message through a pipe.
  Pipe channel;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    if (::geteuid() == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
          ::setresuid(65534, 65534, 65534) != 0) {
        ::_exit(3);
      }
    }
    rlimit limit{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &limit) != 0) ::_exit(4);
    std::unique_ptr<IoQueue> queue;
    QueueOptions options;
    options.queue_depth = 2;
    if (!NewUringQueue(options, &queue).ok()) ::_exit(5);
    AlignedBuffer buffer(16 << 20);
    iovec region{buffer.data(), buffer.size_bytes()};
    Status st = queue->RegisterBuffers({&region, 1});
    const std::string report = std::to_string(st.code()) + " " + st.message();
    if (::write(channel.write_fd(), report.data(), report.size()) < 0) ::_exit(6);
    ::_exit(0);
  }
  channel.CloseWriteEnd();
  std::string report;
  char chunk[512];
  for (int round = 0; round < 100; ++round) {
    const ssize_t n = ::read(channel.read_fd(), chunk, sizeof(chunk));
    if (n <= 0) break;
    report.append(chunk, static_cast<size_t>(n));
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status));
  ASSERT_EQ(WEXITSTATUS(wait_status), 0) << "child could not set up the test";
  EXPECT_EQ(report.rfind(std::to_string(CKPTDB_ENOMEM) + " ", 0), 0u) << report;
  EXPECT_NE(report.find("fixed buffers are off"), std::string::npos) << report;
  EXPECT_NE(report.find("RLIMIT_MEMLOCK is 65536 bytes"), std::string::npos) << report;
  EXPECT_NE(report.find("16777216 bytes"), std::string::npos) << report;
}

TEST(UringQueueTest, FsyncRequestsCompleteWithTheirTags) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("synced"), options, &fd, nullptr).ok());
  char data[4096];
  FillPattern(data, sizeof(data), 3);
  ASSERT_EQ(RunOne(*MakeQueue(2), Write(fd, 0, data, sizeof(data), 1)).result,
            static_cast<int64_t>(sizeof(data)));
  std::unique_ptr<IoQueue> queue = MakeQueue(2);
  std::vector<IoCompletion> done = RunAll(*queue, {Sync(fd, 40), Sync(fd, 41), Sync(fd, 42)});
  ASSERT_EQ(done.size(), 3u);
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_EQ(done[i].tag, 40 + i);
    EXPECT_EQ(done[i].result, 0);
  }
  ASSERT_TRUE(io->Close(fd).ok());
}

TEST(UringQueueTest, ZeroLengthReadAndWriteCompleteWithZero) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("empty"), options, &fd, nullptr).ok());
  char byte = 0;
  std::unique_ptr<IoQueue> queue = MakeQueue(2);
  std::vector<IoCompletion> done = RunAll(*queue, {Write(fd, 0, &byte, 0, 1)});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].result, 0);
  ASSERT_TRUE(io->Close(fd).ok());
}

// ---- Reap timing and short transfers (pipes make the kernel wait on demand) ------------------

TEST(UringQueueTest, ReapWithNothingOutstandingReturnsPromptly) {
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  std::vector<IoCompletion> out;
  const auto start = std::chrono::steady_clock::now();
  Status st = queue->Reap(1, &out, 5'000);
  EXPECT_TRUE(st.ok()) << st.message();
  st = queue->Reap(3, &out, -1);  // would hang forever if it waited
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(out.empty());
  EXPECT_LT(ElapsedMs(start), 1'000);
}

TEST(UringQueueTest, ReapTimesOutOnAWaitingReadAndCollectsItOnceDataArrives) {
  Pipe pipe;
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  char buffer[8] = {};
  ASSERT_TRUE(queue->Submit(std::vector<IoRequest>{Read(pipe.read_fd(), 0, buffer, 8, 5)}).ok());

  std::vector<IoCompletion> out;
  auto start = std::chrono::steady_clock::now();
  Status st = queue->Reap(1, &out, 50);
  EXPECT_EQ(st.code(), CKPTDB_ETIMEDOUT) << st.message();
  EXPECT_GE(ElapsedMs(start), 40);
  EXPECT_LT(ElapsedMs(start), 2'000);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(queue->outstanding(), 1u);

  // Half the bytes: the read comes back short, not at end of file, so the queue resubmits the
  // rest and the request is still not complete.
  pipe.Put("abcd");
  st = queue->Reap(1, &out, 100);
  EXPECT_EQ(st.code(), CKPTDB_ETIMEDOUT) << st.message();
  EXPECT_TRUE(out.empty());

  pipe.Put("efgh");
  st = queue->Reap(1, &out, 10'000);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 5u);
  EXPECT_EQ(out[0].result, 8);
  EXPECT_EQ(std::string(buffer, 8), "abcdefgh");
  EXPECT_EQ(queue->outstanding(), 0u);
}

TEST(UringQueueTest, ReadThatReachesEndOfPipeReportsTheBytesSoFar) {
  Pipe pipe;
  pipe.Put("xyz");
  pipe.CloseWriteEnd();
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  char buffer[8] = {};
  const IoCompletion done = RunOne(*queue, Read(pipe.read_fd(), 0, buffer, 8, 1));
  EXPECT_EQ(done.result, 3);
  EXPECT_EQ(std::string(buffer, 3), "xyz");
}

TEST(UringQueueTest, PipeWriteLargerThanThePipeCompletesInFull) {
  // A pipe holds 64 KiB: the kernel moves a 1 MiB write in short pieces as the reader drains,
  // and the queue must report the whole request once.
  Pipe pipe;
  constexpr size_t kBytes = 1 << 20;
  std::vector<char> source(kBytes);
  FillPattern(source.data(), kBytes, 4);
  std::vector<char> received;
  std::thread reader([&] {
    std::vector<char> chunk(64 * 1024);
    for (int round = 0; round < 100'000 && received.size() < kBytes; ++round) {
      const ssize_t n = ::read(pipe.read_fd(), chunk.data(), chunk.size());
      if (n <= 0) break;
      received.insert(received.end(), chunk.data(), chunk.data() + n);
    }
  });
  std::unique_ptr<IoQueue> queue = MakeQueue(2);
  const IoCompletion done = RunOne(*queue, Write(pipe.write_fd(), 0, source.data(), kBytes, 9));
  pipe.CloseWriteEnd();
  reader.join();
  EXPECT_EQ(done.result, static_cast<int64_t>(kBytes));
  ASSERT_EQ(received.size(), kBytes);
  EXPECT_EQ(std::memcmp(received.data(), source.data(), kBytes), 0);
}

TEST(UringQueueTest, DestroyingAQueueWithAWaitingReadDoesNotHang) {
  Pipe pipe;
  char buffer[8];
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_ptr<IoQueue> queue = MakeQueue(4);
    ASSERT_TRUE(queue->Submit(std::vector<IoRequest>{Read(pipe.read_fd(), 0, buffer, 8, 1)}).ok());
  }
  // The destructor cancels the read (nothing else would ever finish it) and waits for its CQE.
  EXPECT_LT(ElapsedMs(start), 5'000);
}

TEST(UringQueueTest, ReadPastEndOfFileGivesAShortCount) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  const std::string contents(10'000, 'q');
  ASSERT_TRUE(io->WriteFileDurably(dir.File("short"), contents).ok());
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("short"), OpenOptions{}, &fd, nullptr).ok());
  std::vector<char> buffer(16384);
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  std::vector<IoCompletion> done = RunAll(
      *queue, {Read(fd, 0, buffer.data(), 16384, 0), Read(fd, 20'000, buffer.data(), 4096, 1)});
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].result, 10'000);
  EXPECT_EQ(done[1].result, 0);
  EXPECT_EQ(std::string(buffer.data(), 10'000), contents);
  ASSERT_TRUE(io->Close(fd).ok());
}

// ---- Errors come back as completions --------------------------------------------------------

TEST(UringQueueTest, WriteToADescriptorOpenedReadOnlyCompletesWithEbadf) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  ASSERT_TRUE(io->WriteFileDurably(dir.File("ro"), "read only").ok());
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("ro"), OpenOptions{}, &fd, nullptr).ok());
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  char data[4] = {'a', 'b', 'c', 'd'};
  IoCompletion done = RunOne(*queue, Write(fd, 0, data, sizeof(data), 11));
  EXPECT_EQ(done.tag, 11u);
  EXPECT_EQ(done.result, -EBADF);
  // The queue goes on working after an error.
  char back[9] = {};
  done = RunOne(*queue, Read(fd, 0, back, 9, 12));
  EXPECT_EQ(done.result, 9);
  EXPECT_EQ(std::string(back, 9), "read only");
  ASSERT_TRUE(io->Close(fd).ok());
}

// offload_writes hands writes to kernel workers (IOSQE_ASYNC): they may finish in any order,
// but each must land at its own offset, and errors must still come back with their tags.
TEST(UringQueueTest, OffloadedWritesLandAtTheirOffsetsAndReportErrors) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  constexpr size_t kChunkBytes = 256 * 1024;
  constexpr size_t kChunks = 24;
  AlignedBuffer source(kChunkBytes * kChunks);
  AlignedBuffer target(kChunkBytes * kChunks);
  FillPattern(source.data(), source.size_bytes(), 9);
  OpenOptions write_options;
  write_options.mode = OpenOptions::Mode::kCreateWrite;
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("data"), write_options, &fd, nullptr).ok());
  std::unique_ptr<IoQueue> queue = MakeQueue(8, /*offload_writes=*/true);
  std::vector<IoRequest> writes;
  for (size_t i = 0; i < kChunks; ++i) {
    writes.push_back(
        Write(fd, i * kChunkBytes, source.data() + i * kChunkBytes, kChunkBytes, 500 + i));
  }
  std::vector<IoCompletion> done = RunAll(*queue, writes);
  ASSERT_EQ(done.size(), kChunks);
  std::set<uint64_t> tags;
  for (const IoCompletion& c : done) {
    EXPECT_EQ(c.result, static_cast<int64_t>(kChunkBytes)) << "tag " << c.tag;
    tags.insert(c.tag);
  }
  EXPECT_EQ(tags.size(), kChunks);
  ASSERT_TRUE(io->Close(fd).ok());
  ASSERT_TRUE(io->Open(dir.File("data"), OpenOptions{}, &fd, nullptr).ok());
  ASSERT_EQ(pread(fd, target.data(), target.size_bytes(), 0),
            static_cast<ssize_t>(target.size_bytes()));
  EXPECT_EQ(std::memcmp(source.data(), target.data(), source.size_bytes()), 0);
  // The descriptor is read-only now: an offloaded write fails with EBADF, under its own tag.
  IoCompletion failed = RunOne(*queue, Write(fd, 0, source.data(), 4096, 77));
  EXPECT_EQ(failed.tag, 77u);
  EXPECT_EQ(failed.result, -EBADF);
  ASSERT_TRUE(io->Close(fd).ok());
}

TEST(UringQueueTest, BadDescriptorCompletesWithEbadf) {
  std::unique_ptr<IoQueue> queue = MakeQueue(4);
  char buffer[16];
  const int never_opened = 1 << 20;  // above any descriptor this process has
  std::vector<IoCompletion> done = RunAll(
      *queue,
      {Read(-1, 0, buffer, 16, 0), Write(never_opened, 0, buffer, 16, 1), Sync(never_opened, 2)});
  ASSERT_EQ(done.size(), 3u);
  for (const IoCompletion& c : done) EXPECT_EQ(c.result, -EBADF) << "tag " << c.tag;
}

TEST(NewUringQueueTest, RejectsQueueDepthZeroAndAboveTheLimit) {
  std::unique_ptr<IoQueue> queue;
  QueueOptions options;
  options.queue_depth = 0;
  Status st = NewUringQueue(options, &queue);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("queue_depth 0"), std::string::npos) << st.message();
  options.queue_depth = kUringMaxQueueDepth + 1;
  st = NewUringQueue(options, &queue);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_EQ(queue, nullptr);
  options.queue_depth = kUringMaxQueueDepth;
  st = NewUringQueue(options, &queue);
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST(PosixIoTest, NewQueueMakesAWorkingQueue) {
  std::unique_ptr<Io> io = NewPosixIo();
  std::unique_ptr<IoQueue> queue;
  QueueOptions options;
  options.queue_depth = 8;
  ASSERT_TRUE(io->NewQueue(options, &queue).ok());
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(queue->outstanding(), 0u);
  options.queue_depth = 0;
  EXPECT_EQ(io->NewQueue(options, &queue).code(), CKPTDB_EINVAL);
}

// ---- PosixIo: open and O_DIRECT --------------------------------------------------------------

TEST(PosixIoTest, DirectIoOnDevShmIsReportedAsTheDescriptorHasIt) {
  // tmpfs refused O_DIRECT before Linux 6.6 and takes it since: either way direct_out must tell
  // the truth, and the file must work.
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  options.direct = true;
  int fd = -1;
  bool direct = true;
  ASSERT_TRUE(io->Open(dir.File("d"), options, &fd, &direct).ok());
  EXPECT_EQ(direct, HasODirect(fd));
  ASSERT_TRUE(io->Close(fd).ok());
}

TEST(PosixIoTest, OpenFallsBackToBufferedWhenTheFileSystemRefusesDirectIo) {
  // procfs refuses O_DIRECT with EINVAL, as tmpfs did before Linux 6.6.
  std::unique_ptr<Io> io = NewPosixIo();
  OpenOptions options;
  options.direct = true;
  int fd = -1;
  bool direct = true;
  Status st = io->Open("/proc/self/status", options, &fd, &direct);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(direct);
  EXPECT_FALSE(HasODirect(fd));
  char buffer[64];
  EXPECT_GT(::read(fd, buffer, sizeof(buffer)), 0);
  ASSERT_TRUE(io->Close(fd).ok());
}

TEST(PosixIoTest, OpenForWritingFallsBackToBufferedOnRamfs) {
  // ramfs refuses O_DIRECT: the create-and-write path of the fallback. Mounting needs root.
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  if (::mount("ckptdb_io_test", dir.path().c_str(), "ramfs", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount ramfs here: " << std::strerror(errno);
  }
  std::unique_ptr<Io> io = NewPosixIo();
  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  options.direct = true;
  int fd = -1;
  bool direct = true;
  Status st = io->Open(dir.File("f"), options, &fd, &direct);
  EXPECT_TRUE(st.ok()) << st.message();
  if (st.ok()) {
    EXPECT_FALSE(direct);
    EXPECT_FALSE(HasODirect(fd));
    EXPECT_TRUE(WriteAt(*MakeQueue(1), fd, 0, "ramfs", 5, "ramfs file").ok());
    uint64_t size_bytes = 0;
    EXPECT_TRUE(io->FileSize(fd, &size_bytes).ok());
    EXPECT_EQ(size_bytes, 5u);
    EXPECT_TRUE(io->Close(fd).ok());
  }
  EXPECT_EQ(::umount2(dir.path().c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

TEST(PosixIoTest, OpenErrorsNameThePathAndTheOperation) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  int fd = -1;
  const std::string missing = dir.File("missing");
  Status st = io->Open(missing, OpenOptions{}, &fd, nullptr);
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_NE(st.message().find("open " + missing + " for reading"), std::string::npos)
      << st.message();

  OpenOptions write_options;
  write_options.mode = OpenOptions::Mode::kCreateWrite;
  const std::string in_missing_dir = dir.File("no/such/dir");
  st = io->Open(in_missing_dir, write_options, &fd, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("open " + in_missing_dir + " for writing"), std::string::npos)
      << st.message();
}

// ---- PosixIo: metadata and small files -------------------------------------------------------

TEST(PosixIoTest, WriteFileDurablyThenReadFileRoundTripsAndLeavesNoTemporary) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  const std::string path = dir.File("MARKER");
  ASSERT_TRUE(io->WriteFileDurably(path, "version 1\n").ok());
  std::string contents;
  ASSERT_TRUE(io->ReadFile(path, &contents).ok());
  EXPECT_EQ(contents, "version 1\n");

  std::string binary(100'000, '\0');
  FillPattern(binary.data(), binary.size(), 5);
  ASSERT_TRUE(io->WriteFileDurably(path, binary).ok());  // replaces the old file
  ASSERT_TRUE(io->ReadFile(path, &contents).ok());
  EXPECT_EQ(contents, binary);

  ASSERT_TRUE(io->WriteFileDurably(path, "").ok());
  ASSERT_TRUE(io->ReadFile(path, &contents).ok());
  EXPECT_EQ(contents, "");

  std::vector<std::string> names;
  ASSERT_TRUE(io->ListDir(dir.path(), &names).ok());
  EXPECT_EQ(names, std::vector<std::string>{"MARKER"});

  Status st = io->ReadFile(dir.File("absent"), &contents);
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_NE(st.message().find(dir.File("absent")), std::string::npos) << st.message();
}

TEST(PosixIoTest, ListDirReturnsSortedNamesWithoutDotEntries) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  for (const char* name : {"zeta", "alpha", "Mid", "b.tmp", "a10", "a2"}) {
    ASSERT_TRUE(io->WriteFileDurably(dir.File(name), name).ok());
  }
  ASSERT_TRUE(io->CreateDirs(dir.File("subdir")).ok());
  std::vector<std::string> names;
  ASSERT_TRUE(io->ListDir(dir.path(), &names).ok());
  EXPECT_EQ(names,
            (std::vector<std::string>{"Mid", "a10", "a2", "alpha", "b.tmp", "subdir", "zeta"}));

  Status st = io->ListDir(dir.File("absent"), &names);
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_NE(st.message().find(dir.File("absent")), std::string::npos) << st.message();
}

TEST(PosixIoTest, RemoveOfAnAbsentPathSucceeds) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  EXPECT_TRUE(io->Remove(dir.File("never-existed")).ok());
  ASSERT_TRUE(io->WriteFileDurably(dir.File("f"), "x").ok());
  EXPECT_TRUE(io->Remove(dir.File("f")).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.File("f")));
  EXPECT_TRUE(io->Remove(dir.File("f")).ok());
  ASSERT_TRUE(io->CreateDirs(dir.File("empty_dir")).ok());
  EXPECT_TRUE(io->Remove(dir.File("empty_dir")).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.File("empty_dir")));
}

TEST(PosixIoTest, RenameMovesTheFileAndNamesBothPathsOnError) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  ASSERT_TRUE(io->WriteFileDurably(dir.File("from"), "payload").ok());
  ASSERT_TRUE(io->Rename(dir.File("from"), dir.File("to")).ok());
  ASSERT_TRUE(io->SyncDir(dir.path()).ok());
  std::string contents;
  ASSERT_TRUE(io->ReadFile(dir.File("to"), &contents).ok());
  EXPECT_EQ(contents, "payload");
  EXPECT_FALSE(std::filesystem::exists(dir.File("from")));

  Status st = io->Rename(dir.File("from"), dir.File("to"));
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_NE(st.message().find("rename " + dir.File("from") + " to " + dir.File("to")),
            std::string::npos)
      << st.message();
}

TEST(PosixIoTest, PathSizeOfAnAbsentPathIsNotFound) {
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  uint64_t size_bytes = 99;
  Status st = io->PathSize(dir.File("absent"), &size_bytes);
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_NE(st.message().find(dir.File("absent")), std::string::npos) << st.message();
  ASSERT_TRUE(io->WriteFileDurably(dir.File("five"), "12345").ok());
  ASSERT_TRUE(io->PathSize(dir.File("five"), &size_bytes).ok());
  EXPECT_EQ(size_bytes, 5u);
}

TEST(PosixIoTest, CreateDirsMakesEveryLevelAndIsIdempotent) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  const std::string deep = dir.File("a/b//c/d/");
  ASSERT_TRUE(io->CreateDirs(deep).ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.File("a/b/c/d")));
  EXPECT_TRUE(io->CreateDirs(deep).ok());
  EXPECT_TRUE(io->SyncDir(dir.File("a/b/c/d")).ok());

  ASSERT_TRUE(io->WriteFileDurably(dir.File("file"), "not a dir").ok());
  Status st = io->CreateDirs(dir.File("file/sub"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir.File("file")), std::string::npos) << st.message();
  EXPECT_EQ(io->CreateDirs("").code(), CKPTDB_EINVAL);

  st = io->SyncDir(dir.File("absent"));
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
}

// ---- ReadAt / WriteAt / SyncFile ------------------------------------------------------------

TEST(SynchronousHelpersTest, WriteAtSyncFileReadAtRoundTrip) {
  TempDir dir("/tmp");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Io> io = NewPosixIo();
  std::unique_ptr<IoQueue> queue = MakeQueue(2);
  OpenOptions options;
  options.mode = OpenOptions::Mode::kCreateWrite;
  int fd = -1;
  ASSERT_TRUE(io->Open(dir.File("seg"), options, &fd, nullptr).ok());
  std::string data(8192, '\0');
  FillPattern(data.data(), data.size(), 6);
  Status st = WriteAt(*queue, fd, 4096, data.data(), data.size(), "segment seg");
  ASSERT_TRUE(st.ok()) << st.message();
  st = SyncFile(*queue, fd, "segment seg");
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(io->Close(fd).ok());

  ASSERT_TRUE(io->Open(dir.File("seg"), OpenOptions{}, &fd, nullptr).ok());
  std::string back(8192, '\0');
  st = ReadAt(*queue, fd, 4096, back.data(), back.size(), "segment seg");
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(back, data);

  st = ReadAt(*queue, fd, 8192, back.data(), 8192, "segment seg");
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_NE(st.message().find("short read of 4096 of 8192 bytes at offset 8192 of segment seg"),
            std::string::npos)
      << st.message();
  ASSERT_TRUE(io->Close(fd).ok());
}

TEST(SynchronousHelpersTest, ErrnoFromTheKernelNamesWhatWasBeingDone) {
  std::unique_ptr<IoQueue> queue = MakeQueue(2);
  char buffer[16];
  Status st = ReadAt(*queue, -1, 0, buffer, sizeof(buffer), "segment bad");
  EXPECT_EQ(st.code(), CKPTDB_EIO);
  EXPECT_NE(st.message().find("segment bad"), std::string::npos) << st.message();
  st = WriteAt(*queue, -1, 0, buffer, sizeof(buffer), "segment bad");
  EXPECT_NE(st.message().find("write 16 bytes at offset 0 of segment bad"), std::string::npos)
      << st.message();
  st = SyncFile(*queue, -1, "segment bad");
  EXPECT_NE(st.message().find("fsync segment bad"), std::string::npos) << st.message();
  EXPECT_EQ(queue->outstanding(), 0u);
}

}  // namespace
}  // namespace ckpt::io
