// UringQueue: the IoQueue of io.h over one io_uring (liburing). Io::NewQueue of the POSIX Io
// returns one; tests and tools that need a queue without an Io use NewUringQueue directly.
//
// Bounds (TIGER_STYLE): at most queue_depth requests are in the kernel at once (one per slot of a
// fixed slot table); at most queue_depth * kUringBacklogPerSlot are outstanding (in the kernel or
// completed and waiting for Reap); a short transfer is resubmitted at most kUringMaxTries times.
#pragma once

#include <cstdint>
#include <memory>

#include "io/io.h"
#include "util/status.h"

namespace ckpt::io {

// Largest queue_depth accepted. The kernel allows 32768 SQ entries, but a deeper queue only adds
// pinned ring memory: a few hundred requests keep any NVMe device busy.
inline constexpr uint32_t kUringMaxQueueDepth = 4096;

// Outstanding requests (in flight plus completed but not yet reaped) allowed per slot, so one
// Submit may hand over a batch far larger than queue_depth (the queue feeds it to the kernel
// queue_depth at a time) while the backlog of completions stays bounded.
inline constexpr uint32_t kUringBacklogPerSlot = 64;

// Times one request is handed to the kernel for a short transfer or an interrupted one before
// its completion reports -EIO (or the interrupting errno).
inline constexpr uint32_t kUringMaxTries = 64;

struct UringQueueOptions {
  // Kernel-side submission polling (IORING_SETUP_SQPOLL). Off by default: it keeps a kernel
  // thread spinning per queue, and with it io_uring_get_sqe can return NULL before the queue is
  // full (LIMITS.md); the queue handles that by submitting and waiting for room.
  bool sqpoll = false;
  uint32_t sqpoll_idle_ms = 100;
  // The most kernel workers (io-wq) the ring's task runs for requests that block (buffered
  // writes, fsync): bounded ones (files) and unbounded ones (sockets). The kernel's default
  // grows with the requests in flight (nine a rank in the demo); eight ranks a node each with
  // their own are threads the trainer's cores pay for. 0: the kernel's default.
  uint32_t max_bounded_workers = 4;
  uint32_t max_unbounded_workers = 2;
};

// Creates a queue with options.queue_depth entries. Invalid when queue_depth is 0 or more than
// kUringMaxQueueDepth; the errno of io_uring_queue_init otherwise (for example EPERM when
// io_uring is disabled by the kernel.io_uring_disabled sysctl).
Status NewUringQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out);
Status NewUringQueue(const QueueOptions& options, const UringQueueOptions& uring_options,
                     std::unique_ptr<IoQueue>* out);

}  // namespace ckpt::io
