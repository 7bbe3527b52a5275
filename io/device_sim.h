// The simulated device (io/device.h, DESIGN.md section 5): GPUs whose memory is host memory this
// module hands out, whose streams are threads that run their copies in order, and whose copy
// engines (one per direction per device, as a GPU's) are held by a copy while its bytes move, at
// a set bandwidth after a set latency. Faults can be injected: a copy that fails as it runs, a
// sticky error after which every call fails, a device that vanishes, pinning refused. Built in
// every build, so that the device pipeline (io/device_queue.h, engine/capture.cc,
// engine/device_restore.cc) runs in CI and under the sanitizers without a GPU: a store opened
// with device "sim" (CKPTDB_DEVICE=sim) uses it.
//
// One simulated machine per process, as a process has one set of GPUs: the calls below configure
// it and read it, from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "io/device.h"
#include "util/status.h"

namespace ckpt::io::sim {

constexpr int kMaxDevices = 8;

struct Config {
  int devices = 1;  // 1 .. kMaxDevices
  // A copy engine's bandwidth each way; 0: as fast as memcpy runs.
  uint64_t to_host_bytes_per_s = 0;
  uint64_t to_device_bytes_per_s = 0;
  uint64_t latency_ns = 0;  // each copy's, before its bytes move (not holding the engine)
};

// Copies are numbered from 0 in the order streams start running them, counted from SetFaults.
// -1: never.
struct Faults {
  int64_t fail_copy = -1;   // fails as it runs: its bytes do not move, the next event on its
                            // stream reports it; later copies run (not sticky)
  int64_t sticky_at = -1;   // fails as it runs, and every call fails from then on (but a Record,
                            // whose event then completes with the error)
  int64_t vanish_at = -1;   // the device is gone from then on: every call fails, Locate too
  bool refuse_pin = false;  // Pin fails (host memory that cannot be registered)
};

struct Counters {
  uint64_t copies = 0;  // run, failed or not
  uint64_t bytes_to_host = 0;
  uint64_t bytes_to_device = 0;
  uint64_t pageable_copies = 0;  // whose host side was not pinned
  uint32_t max_queued = 0;       // the most copies queued on all streams at once
  uint32_t streams = 0;          // streams alive now
};

// Sets the machine up afresh: faults cleared, counters zeroed, a sticky error forgotten. Invalid
// for a bad value. Memory handed out stays valid.
Status Configure(const Config& config);
void SetFaults(const Faults& faults);
Counters Read();

// `bytes` of device `device`'s memory (page-aligned, zeroed), nullptr when it cannot be had;
// given back with Free.
void* Allocate(int device, size_t bytes);
void Free(void* p);

// A Device (io/device.h) on the simulated machine.
Status Open(std::unique_ptr<Device>* out);

}  // namespace ckpt::io::sim
