// UringQueue: IoQueue over liburing. See io/uring_queue.h for the bounds and io/io.h for the
// contract.
//
// Request life cycle: Submit takes a free slot of the slot table (queue_depth slots, allocated
// once), prepares one SQE for it, and hands the batch to the kernel with one io_uring_submit.
// When every slot is busy it waits for completions first. A CQE for a short transfer prepares a
// new SQE for the remainder in the same slot; a CQE that finishes the request appends an
// IoCompletion to the backlog and frees the slot. Reap returns the backlog.
//
// user_data of every SQE is (generation << 32) | slot index: the generation changes each time a
// slot is freed, so a CQE that does not belong to the slot's current request is caught by an
// assertion instead of completing the wrong request.
#include "io/uring_queue.h"

#include <liburing.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "util/assert.h"
#include "util/clock.h"

namespace ckpt::io {
namespace {

// One SQE moves at most this much: the SQE length field is 32 bits and the kernel caps one read
// or write at MAX_RW_COUNT (2 GiB - 4 KiB). A larger request goes to the kernel in pieces; a
// piece that transfers in full is not a short transfer and does not count as a try.
constexpr size_t kMaxBytesPerSqe = size_t{1} << 30;

// user_data of the cancel-everything SQE the destructor sends. Slot user_data never has
// 0xFFFFFFFE in its low 32 bits (slot indexes are below kUringMaxQueueDepth), and liburing's own
// LIBURING_UDATA_TIMEOUT is ~0.
constexpr uint64_t kCancelUserData = ~uint64_t{1};

// Attempts at getting an SQE (each submits what is prepared and waits for room) before giving up.
constexpr int kMaxSqeAttempts = 64;
// Attempts at io_uring_submit that were interrupted (EINTR) or refused for now (EAGAIN, EBUSY).
constexpr int kMaxSubmitAttempts = 64;
// Consecutive waits interrupted by signals with no completion in between before a wait gives up.
constexpr int kMaxConsecutiveInterrupts = 1000;
// How long the destructor waits for requests still in the kernel. A disk fsync measured about
// 1 s here (LIMITS.md); a minute covers a slow device without hanging a shutdown forever.
constexpr int64_t kCloseWaitMs = 60'000;
// The kernel's limit on registered buffers (IORING_MAX_REG_BUFFERS).
constexpr size_t kMaxRegisteredBuffers = 1 << 14;

constexpr uint64_t kMaxFileOffset = static_cast<uint64_t>(INT64_MAX);

const char* OpName(IoRequest::Op op) {
  switch (op) {
    case IoRequest::Op::kRead:
      return "read";
    case IoRequest::Op::kWrite:
      return "write";
    case IoRequest::Op::kSync:
      return "fsync";
  }
  return "unknown op";
}

class UringQueue final : public IoQueue {
 public:
  UringQueue(uint32_t queue_depth, bool offload_writes)
      : queue_depth_(queue_depth),
        offload_writes_(offload_writes),
        backlog_capacity_(size_t{queue_depth} * kUringBacklogPerSlot),
        slots_(queue_depth) {
    free_slots_.reserve(queue_depth);
    // Reverse order so slot 0 is taken first: keeps a shallow use of the queue in few slots.
    for (uint32_t i = queue_depth; i > 0; --i) free_slots_.push_back(i - 1);
    // reserve only allocates; pages are touched as completions arrive.
    backlog_.reserve(backlog_capacity_);
  }

  UringQueue(const UringQueue&) = delete;
  UringQueue& operator=(const UringQueue&) = delete;

  ~UringQueue() override;

  Status Init(const UringQueueOptions& uring_options);

  Status RegisterBuffers(std::span<const iovec> buffers) override;
  Status Submit(std::span<const IoRequest> requests) override;
  Status Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) override;
  size_t outstanding() const override { return in_flight_ + backlog_.size(); }
  // The ring's descriptor polls readable while completions wait in it (the backlog is empty
  // after every Reap).
  int WaitFd() const override { return ring_.ring_fd; }

 private:
  struct Slot {
    IoRequest request;
    uint64_t done_bytes = 0;   // transferred so far by earlier SQEs of this request
    uint32_t asked_bytes = 0;  // length of the SQE now in the kernel
    uint32_t tries = 0;        // SQEs that came back short or interrupted
    uint32_t generation = 0;
    bool in_use = false;
  };

  static uint64_t UserData(uint32_t index, uint32_t generation) {
    return (uint64_t{generation} << 32) | index;
  }

  std::string Describe() const {
    return "io queue (io_uring, queue_depth " + std::to_string(queue_depth_) + ")";
  }

  Status CheckRequest(const IoRequest& request) const;
  int SubmitPrepared();
  int GetSqe(io_uring_sqe** out);
  int PrepareSqe(uint32_t index);
  int WaitForCqe(int64_t timeout_ns);
  size_t HandleReadyCqes();
  void HandleCqe(uint64_t user_data, int32_t result);
  void Complete(uint32_t index, int64_t result);
  void Release(uint32_t index);

  const uint32_t queue_depth_;
  const bool offload_writes_;
  const size_t backlog_capacity_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool sqpoll_ = false;
  // Set by the destructor: CQEs then only free their slots (no resubmission, no backlog).
  bool closing_ = false;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;   // capacity queue_depth
  std::vector<IoCompletion> backlog_;  // capacity backlog_capacity_
  size_t in_flight_ = 0;               // slots in use: requests the kernel still works on
  std::vector<iovec> registered_;      // copies of the registered buffers, for validation
};

Status UringQueue::Init(const UringQueueOptions& uring_options) {
  io_uring_params params{};
  // SUBMIT_ALL: a bad SQE in a batch fails alone (as a CQE) instead of stopping the batch.
  params.flags = IORING_SETUP_SUBMIT_ALL;
  if (uring_options.sqpoll) {
    params.flags |= IORING_SETUP_SQPOLL;
    params.sq_thread_idle = uring_options.sqpoll_idle_ms;
  }
  int rc = io_uring_queue_init_params(queue_depth_, &ring_, &params);
  if (rc == -EINVAL) {
    // Kernels before 5.18 do not know SUBMIT_ALL; without it a batch can stop early, and the
    // rest of it stays in the SQ ring until the next submit, which is still correct.
    params = io_uring_params{};
    if (uring_options.sqpoll) {
      params.flags = IORING_SETUP_SQPOLL;
      params.sq_thread_idle = uring_options.sqpoll_idle_ms;
    }
    rc = io_uring_queue_init_params(queue_depth_, &ring_, &params);
  }
  if (rc < 0) {
    return Status::FromErrno(-rc, "io_uring_queue_init with " + std::to_string(queue_depth_) +
                                      " entries" + (uring_options.sqpoll ? " and SQPOLL" : "") +
                                      " (is io_uring disabled by the kernel.io_uring_disabled "
                                      "sysctl or a seccomp filter?)");
  }
  // The CQ must hold a CQE for every slot plus the destructor's cancel, or completions could
  // overflow it; the kernel makes it twice the SQ size by default.
  CKPTDB_ASSERT(ring_.cq.ring_entries >= queue_depth_ + 1);
  CKPTDB_ASSERT(ring_.sq.ring_entries >= queue_depth_);
  ring_ready_ = true;
  sqpoll_ = uring_options.sqpoll;
  if (uring_options.max_bounded_workers != 0 || uring_options.max_unbounded_workers != 0) {
    // Best effort: a kernel before 5.15 keeps its default (EINVAL), which is still correct.
    unsigned limits[2] = {uring_options.max_bounded_workers, uring_options.max_unbounded_workers};
    (void)io_uring_register_iowq_max_workers(&ring_, limits);
  }
  return Status::Ok();
}

UringQueue::~UringQueue() {
  if (!ring_ready_) return;
  closing_ = true;
  if (in_flight_ > 0) {
    // The kernel may write into callers' buffers until it posts each request's CQE, so the ring
    // must not go away before then. Cancel what can be cancelled first (a read from a pipe can
    // wait forever); requests already running on a device finish and post their CQEs.
    io_uring_sqe* sqe = nullptr;
    if (GetSqe(&sqe) == 0) {
      io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
      io_uring_sqe_set_data64(sqe, kCancelUserData);
    }
    const int64_t deadline_ns = static_cast<int64_t>(MonoNs()) + kCloseWaitMs * 1'000'000;
    int interrupts = 0;
    while (in_flight_ > 0) {
      const int64_t left_ns = deadline_ns - static_cast<int64_t>(MonoNs());
      if (left_ns <= 0) break;
      const int rc = WaitForCqe(left_ns);
      if (rc == 0) {
        interrupts = 0;
        HandleReadyCqes();
      } else if (rc == -EINTR && ++interrupts < kMaxConsecutiveInterrupts) {
        continue;
      } else {
        break;
      }
    }
    if (in_flight_ > 0) {
      std::fprintf(stderr,
                   "ckptdb: %s closing with %zu requests still in the kernel after %lld ms; "
                   "their buffers must stay valid until the kernel drops them\n",
                   Describe().c_str(), in_flight_, static_cast<long long>(kCloseWaitMs));
    }
  }
  io_uring_queue_exit(&ring_);
}

Status UringQueue::RegisterBuffers(std::span<const iovec> buffers) {
  if (in_flight_ > 0) {
    return Status::State(Describe() + ": cannot change registered buffers while " +
                         std::to_string(in_flight_) + " requests are in flight; reap them first");
  }
  if (buffers.size() > kMaxRegisteredBuffers) {
    return Status::Invalid(Describe() + ": cannot register " + std::to_string(buffers.size()) +
                           " buffers; expected at most " + std::to_string(kMaxRegisteredBuffers));
  }
  if (!registered_.empty()) {
    const int rc = io_uring_unregister_buffers(&ring_);
    if (rc < 0) {
      return Status::FromErrno(-rc, Describe() + ": unregistering " +
                                        std::to_string(registered_.size()) + " fixed buffers");
    }
    registered_.clear();
  }
  if (buffers.empty()) return Status::Ok();

  const int rc =
      io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
  if (rc < 0) {
    uint64_t total_bytes = 0;
    for (const iovec& v : buffers) total_bytes += v.iov_len;
    std::string why;
    if (rc == -ENOMEM || rc == -EPERM) {
      rlimit limit{};
      if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
        why = "; RLIMIT_MEMLOCK is " +
              (limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                               : std::to_string(limit.rlim_cur) + " bytes") +
              ": raise it (ulimit -l, LimitMEMLOCK=) or grant CAP_IPC_LOCK to use fixed buffers";
      }
    }
    return Status::FromErrno(-rc, Describe() + ": fixed buffers are off: registering " +
                                      std::to_string(buffers.size()) + " buffers of " +
                                      std::to_string(total_bytes) + " bytes in all failed" + why);
  }
  registered_.assign(buffers.begin(), buffers.end());
  return Status::Ok();
}

Status UringQueue::CheckRequest(const IoRequest& request) const {
  switch (request.op) {
    case IoRequest::Op::kRead:
    case IoRequest::Op::kWrite:
      break;
    case IoRequest::Op::kSync:
      return Status::Ok();  // buffer, length, offset and buffer_index are unused
    default:
      return Status::Invalid("op " + std::to_string(static_cast<int>(request.op)) +
                             " is not one of read, write, fsync");
  }
  if (request.buffer == nullptr && request.length > 0) {
    return Status::Invalid(std::string(OpName(request.op)) + " of " +
                           std::to_string(request.length) + " bytes has a NULL buffer");
  }
  // An offset of -1 (UINT64_MAX) means "the file position" to io_uring; ckptdb always means an
  // absolute offset, so anything past INT64_MAX is a caller's bug, not a request.
  if (request.offset > kMaxFileOffset || request.length > kMaxFileOffset - request.offset) {
    return Status::Invalid(std::string(OpName(request.op)) + " of " +
                           std::to_string(request.length) + " bytes at offset " +
                           std::to_string(request.offset) + " ends past the largest file offset");
  }
  if (request.buffer_index < -1 ||
      request.buffer_index >= static_cast<int64_t>(registered_.size())) {
    return Status::Invalid("buffer_index " + std::to_string(request.buffer_index) +
                           " is not -1 or one of the " + std::to_string(registered_.size()) +
                           " registered buffers");
  }
  if (request.buffer_index >= 0) {
    const iovec& region = registered_[request.buffer_index];
    const auto begin = reinterpret_cast<uintptr_t>(region.iov_base);
    const auto start = reinterpret_cast<uintptr_t>(request.buffer);
    if (start < begin || start - begin > region.iov_len ||
        request.length > region.iov_len - (start - begin)) {
      return Status::Invalid("buffer of " + std::to_string(request.length) +
                             " bytes is not inside registered buffer " +
                             std::to_string(request.buffer_index) + " (" +
                             std::to_string(region.iov_len) + " bytes)");
    }
  }
  return Status::Ok();
}

// Hands every prepared SQE to the kernel. Returns 0 or -errno.
int UringQueue::SubmitPrepared() {
  for (int attempt = 0; attempt < kMaxSubmitAttempts; ++attempt) {
    const int rc = io_uring_submit(&ring_);
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    if (rc < 0) return rc;
    // With SQPOLL the kernel thread takes entries on its own time: submit only wakes it.
    // Without, a submit that took fewer than were prepared (a kernel without SUBMIT_ALL) leaves
    // the rest in the ring; go round again for them.
    if (sqpoll_ || io_uring_sq_ready(&ring_) == 0) return 0;
  }
  return -EAGAIN;
}

// Gets a free SQE. io_uring_get_sqe returns NULL when the SQ ring is full of entries the kernel
// has not taken yet, which with SQPOLL happens with fewer than queue_depth in flight (the
// kernel thread runs behind): submit what is there and wait for room, a bounded number of times.
int UringQueue::GetSqe(io_uring_sqe** out) {
  for (int attempt = 0; attempt < kMaxSqeAttempts; ++attempt) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe != nullptr) {
      *out = sqe;
      return 0;
    }
    int rc = SubmitPrepared();
    if (rc < 0) return rc;
    rc = io_uring_sqring_wait(&ring_);  // returns at once without SQPOLL
    if (rc < 0 && rc != -EINTR) return rc;
  }
  return -EBUSY;
}

// Prepares the SQE that moves the rest of the slot's request. Returns 0 or -errno.
int UringQueue::PrepareSqe(uint32_t index) {
  Slot& slot = slots_[index];
  CKPTDB_ASSERT(slot.in_use);
  io_uring_sqe* sqe = nullptr;
  const int rc = GetSqe(&sqe);
  if (rc < 0) return rc;
  const IoRequest& request = slot.request;
  if (request.op == IoRequest::Op::kSync) {
    io_uring_prep_fsync(sqe, request.fd, 0);
    slot.asked_bytes = 0;
  } else {
    CKPTDB_ASSERT(slot.done_bytes <= request.length);
    const size_t piece_bytes = std::min<size_t>(request.length - slot.done_bytes, kMaxBytesPerSqe);
    char* address = static_cast<char*>(request.buffer) + slot.done_bytes;
    const uint64_t offset = request.offset + slot.done_bytes;
    const auto length = static_cast<unsigned>(piece_bytes);
    const bool fixed = request.buffer_index >= 0;
    if (request.op == IoRequest::Op::kRead) {
      if (fixed) {
        io_uring_prep_read_fixed(sqe, request.fd, address, length, offset, request.buffer_index);
      } else {
        io_uring_prep_read(sqe, request.fd, address, length, offset);
      }
    } else if (fixed) {
      io_uring_prep_write_fixed(sqe, request.fd, address, length, offset, request.buffer_index);
    } else {
      io_uring_prep_write(sqe, request.fd, address, length, offset);
    }
    slot.asked_bytes = length;
    if (request.op == IoRequest::Op::kWrite && offload_writes_) sqe->flags |= IOSQE_ASYNC;
  }
  io_uring_sqe_set_data64(sqe, UserData(index, slot.generation));
  return 0;
}

// Submits what is prepared and waits until a CQE is ready (it is left in the ring for
// HandleReadyCqes). timeout_ns < 0 waits forever. Returns 0, -ETIME or -errno.
int UringQueue::WaitForCqe(int64_t timeout_ns) {
  const int rc = SubmitPrepared();
  if (rc < 0) return rc;
  io_uring_cqe* cqe = nullptr;
  if (timeout_ns < 0) return io_uring_wait_cqe(&ring_, &cqe);
  __kernel_timespec ts{};
  ts.tv_sec = timeout_ns / 1'000'000'000;
  ts.tv_nsec = timeout_ns % 1'000'000'000;
  return io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
}

// Handles every CQE already in the ring, at most the ring's size per call. Returns how many.
size_t UringQueue::HandleReadyCqes() {
  size_t handled = 0;
  for (unsigned i = 0; i < ring_.cq.ring_entries; ++i) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&ring_, &cqe) != 0 || cqe == nullptr) break;
    const uint64_t user_data = io_uring_cqe_get_data64(cqe);
    const int32_t result = cqe->res;
    // Marked seen before handling: the CQE's ring entry is free again before any resubmission.
    io_uring_cqe_seen(&ring_, cqe);
    HandleCqe(user_data, result);
    ++handled;
  }
  return handled;
}

void UringQueue::HandleCqe(uint64_t user_data, int32_t result) {
  // The destructor's cancel reports how many requests it caught; nothing waits for that.
  if (user_data == kCancelUserData) return;
  const auto index = static_cast<uint32_t>(user_data & 0xFFFFFFFFu);
  const auto generation = static_cast<uint32_t>(user_data >> 32);
  CKPTDB_ASSERT(index < queue_depth_);
  Slot& slot = slots_[index];
  CKPTDB_ASSERT(slot.in_use);
  CKPTDB_ASSERT(slot.generation == generation);
  if (closing_) {
    Release(index);
    return;
  }
  const IoRequest& request = slot.request;
  if (request.op == IoRequest::Op::kSync) {
    Complete(index, result < 0 ? result : static_cast<int64_t>(request.length));
    return;
  }
  const bool is_read = request.op == IoRequest::Op::kRead;
  if (result < 0) {
    // EINTR: a signal cut the transfer off before it moved anything; the same SQE again is
    // the right answer. Every other errno is the request's result.
    if (result == -EINTR && ++slot.tries < kUringMaxTries) {
      const int rc = PrepareSqe(index);
      if (rc < 0) Complete(index, rc);
      return;
    }
    Complete(index, result);
    return;
  }
  CKPTDB_ASSERT(static_cast<uint64_t>(result) <= slot.asked_bytes);
  slot.done_bytes += static_cast<uint64_t>(result);
  if (slot.done_bytes == request.length) {
    Complete(index, static_cast<int64_t>(slot.done_bytes));
    return;
  }
  if (result == 0) {
    // A read of 0 bytes is end of file: report what came before it. A write of 0 bytes would
    // come back as 0 again: stop instead of looping.
    Complete(index, is_read ? static_cast<int64_t>(slot.done_bytes) : -EIO);
    return;
  }
  // A piece that moved all it asked for is a split of a large request, not a short transfer.
  if (static_cast<uint32_t>(result) < slot.asked_bytes && ++slot.tries >= kUringMaxTries) {
    Complete(index, -EIO);
    return;
  }
  const int rc = PrepareSqe(index);
  if (rc < 0) Complete(index, rc);
}

void UringQueue::Complete(uint32_t index, int64_t result) {
  // Cannot fail: Submit admits a request only while outstanding() stays within the capacity.
  CKPTDB_ASSERT(backlog_.size() < backlog_capacity_);
  backlog_.push_back(IoCompletion{slots_[index].request.tag, result});
  Release(index);
}

void UringQueue::Release(uint32_t index) {
  Slot& slot = slots_[index];
  CKPTDB_ASSERT(slot.in_use);
  CKPTDB_ASSERT(in_flight_ > 0);
  slot.in_use = false;
  ++slot.generation;
  free_slots_.push_back(index);
  --in_flight_;
}

Status UringQueue::Submit(std::span<const IoRequest> requests) {
  CKPTDB_ASSERT(!closing_);
  const size_t room = backlog_capacity_ - outstanding();
  if (requests.size() > room) {
    return Status::Invalid(Describe() + ": cannot take " + std::to_string(requests.size()) +
                           " requests with " + std::to_string(outstanding()) +
                           " outstanding; expected at most " + std::to_string(backlog_capacity_) +
                           " outstanding (queue_depth * " + std::to_string(kUringBacklogPerSlot) +
                           "): reap first or submit smaller batches");
  }
  // Checked before any is queued, so a bad batch changes nothing.
  for (size_t i = 0; i < requests.size(); ++i) {
    Status st = CheckRequest(requests[i]);
    if (!st.ok()) {
      return st.WithContext(Describe() + ": request " + std::to_string(i) + " of " +
                            std::to_string(requests.size()) + " (tag " +
                            std::to_string(requests[i].tag) + ", fd " +
                            std::to_string(requests[i].fd) + ")");
    }
  }

  auto failure = [&](size_t i, int err, const char* doing) {
    return Status::FromErrno(
        err, Describe() + ": " + doing + ": the first " + std::to_string(i) + " of " +
                 std::to_string(requests.size()) +
                 " requests were queued and will complete through Reap; the rest were not");
  };

  for (size_t i = 0; i < requests.size(); ++i) {
    // Every slot busy: wait for the kernel to finish one. Completions wait in the backlog for
    // Reap. Each round either frees a slot, resubmits a short transfer (bounded per request by
    // kUringMaxTries) or counts an interruption.
    int interrupts = 0;
    while (free_slots_.empty()) {
      const int rc = WaitForCqe(-1);
      if (rc == 0) {
        interrupts = 0;
        HandleReadyCqes();
      } else if (rc != -EINTR || ++interrupts >= kMaxConsecutiveInterrupts) {
        return failure(i, -rc, "waiting for a free slot");
      }
    }
    const uint32_t index = free_slots_.back();
    free_slots_.pop_back();
    Slot& slot = slots_[index];
    CKPTDB_ASSERT(!slot.in_use);
    slot.request = requests[i];
    slot.done_bytes = 0;
    slot.asked_bytes = 0;
    slot.tries = 0;
    slot.in_use = true;
    ++in_flight_;
    const int rc = PrepareSqe(index);
    if (rc < 0) {
      Release(index);
      return failure(i, -rc, "getting a submission queue entry");
    }
  }
  // One io_uring_enter for the whole batch (or for what is left of it after waits above).
  const int rc = SubmitPrepared();
  if (rc < 0) return failure(requests.size(), -rc, "io_uring_submit");
  return Status::Ok();
}

Status UringQueue::Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) {
  CKPTDB_ASSERT(out != nullptr);
  CKPTDB_ASSERT(!closing_);
  const size_t wanted = std::min(min_completions, outstanding());
  // Take what the kernel has finished already, even when the backlog alone would do: it costs
  // no system call and frees slots.
  if (in_flight_ > 0) HandleReadyCqes();

  const int64_t deadline_ns =
      timeout_ms < 0 ? 0 : static_cast<int64_t>(MonoNs()) + int64_t{timeout_ms} * 1'000'000;
  Status status;
  int interrupts = 0;
  // Bounded: each round handles at least one CQE, times out, or counts an interruption; a
  // request goes round at most kUringMaxTries times.
  while (backlog_.size() < wanted) {
    CKPTDB_ASSERT(in_flight_ > 0);
    int64_t left_ns = -1;
    if (timeout_ms >= 0)
      left_ns = std::max<int64_t>(0, deadline_ns - static_cast<int64_t>(MonoNs()));
    const int rc = WaitForCqe(left_ns);
    if (rc == 0) {
      interrupts = 0;
      HandleReadyCqes();
    } else if (rc == -ETIME) {
      // A CQE may have landed as the clock ran out: take it rather than report a false timeout.
      HandleReadyCqes();
      if (backlog_.size() >= wanted) break;
      status = Status::TimedOut(Describe() + ": " + std::to_string(backlog_.size()) + " of " +
                                std::to_string(wanted) + " completions wanted came within " +
                                std::to_string(timeout_ms) + " ms; " + std::to_string(in_flight_) +
                                " requests still in flight");
      break;
    } else if (rc != -EINTR || ++interrupts >= kMaxConsecutiveInterrupts) {
      status = Status::FromErrno(-rc, Describe() + ": waiting for completions");
      break;
    }
  }
  out->insert(out->end(), backlog_.begin(), backlog_.end());
  backlog_.clear();  // keeps its capacity: no allocation on the next round
  return status;
}

}  // namespace

Status NewUringQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) {
  return NewUringQueue(options, UringQueueOptions{}, out);
}

Status NewUringQueue(const QueueOptions& options, const UringQueueOptions& uring_options,
                     std::unique_ptr<IoQueue>* out) {
  CKPTDB_ASSERT(out != nullptr);
  if (options.queue_depth == 0 || options.queue_depth > kUringMaxQueueDepth) {
    return Status::Invalid("io queue: queue_depth " + std::to_string(options.queue_depth) +
                           " is out of range; expected 1 to " +
                           std::to_string(kUringMaxQueueDepth));
  }
  auto queue = std::make_unique<UringQueue>(options.queue_depth, options.offload_writes);
  CKPTDB_RETURN_IF_ERROR(queue->Init(uring_options));
  *out = std::move(queue);
  return Status::Ok();
}

}  // namespace ckpt::io
