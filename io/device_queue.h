// DeviceQueue: asynchronous copies between device and host memory (io/device.h), in the shape of
// io/uring_queue: bounded bytes and copies in flight, several streams per device taken in turn,
// each copy followed by an event of its own, completions reaped apart from submission. Capture
// (engine/capture.cc) submits D2H copies from its workers and reaps them on the store's device
// thread; a restore into device memory (engine/device_restore.cc) submits H2D copies and reaps
// them itself.
//
// Thread safety: Submit from any threads; Reap from one thread at a time (asserted).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "io/device.h"
#include "util/status.h"

namespace ckpt::io {

struct DeviceQueueOptions {
  uint32_t streams_per_device = 4;
  uint64_t max_bytes_in_flight = uint64_t{128} << 20;
  uint32_t max_copies_in_flight = 256;
};

class DeviceQueue {
 public:
  struct Copy {
    int device = 0;
    CopyKind kind = CopyKind::kToHost;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    uint64_t tag = 0;  // the caller's: handed back with the completion
  };
  struct Completion {
    uint64_t tag = 0;
    size_t bytes = 0;
    Status status;  // the runtime's error, naming the copy
  };

  // `device` outlives the queue.
  DeviceQueue(Device* device, DeviceQueueOptions options);
  // Waits for every copy in flight (their memory must stay valid until then), then destroys
  // the streams and events.
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  // Queues c on the next stream of its device, waiting (on the oldest running copy's event) while
  // the copies still running hold the queue's bounds (a copy larger than the byte bound goes
  // alone). An error means c was refused and will never complete
  // (a bad pointer, a sticky error, the queue shut down); a copy that fails as it runs completes
  // with its error.
  Status Submit(const Copy& c);

  // Completed copies, at most `max`, into out (cleared first). With `wait`, blocks until at
  // least one has completed, or, when none is in flight, until one is submitted or Shutdown is
  // called; 0 then means shut down with nothing in flight.
  size_t Reap(std::vector<Completion>* out, size_t max, bool wait);

  // Submit refuses from now on; Reap with wait returns 0 once nothing is in flight.
  void Shutdown();

  size_t unreaped() const;           // submitted, not yet handed back by Reap
  uint64_t bytes_in_flight() const;  // of the copies still running

 private:
  struct Slot {
    Copy copy;
    DeviceEvent* event = nullptr;
    bool done = false;
    Status status;
  };
  struct PerDevice {
    std::vector<DeviceStream*> streams;
    std::vector<DeviceEvent*> free_events;
    uint32_t next = 0;
  };

  // Streams and an event for c's device, made on first use. Under mu_.
  Status ReadyLocked(int device, PerDevice** out, DeviceEvent** event);
  // Marks the slots whose events have completed. Under mu_.
  void PollLocked();
  bool RoomLocked(size_t bytes) const;
  void MarkDoneLocked(Slot* s, Status status);
  void TakeDoneLocked(std::vector<Completion>* out, size_t max);

  Device* const device_;
  const DeviceQueueOptions options_;
  mutable std::mutex mu_;
  std::condition_variable reap_cv_;  // Reap waits for a copy to be submitted
  std::deque<Slot> slots_;           // in submission order
  std::vector<PerDevice> devices_;   // by ordinal
  uint32_t running_ = 0;             // slots not done
  uint64_t bytes_in_flight_ = 0;     // theirs
  bool shutdown_ = false;
  std::atomic<bool> reaping_{false};
};

}  // namespace ckpt::io
