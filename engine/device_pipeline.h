// A store's device state (DESIGN.md section 5; engine/capture.cc, engine/device_restore.cc):
// the device, opened by the first put or restore that names device memory (a CPU-only user
// never creates a GPU context); the staging ring and the ram arena pinned then, once; a
// D2H queue that capture workers submit to and the store's device thread reaps; an H2D queue
// and a pinned bounce pool for restores into device memory, used under Db::read_mu_.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/device.h"
#include "io/device_queue.h"

namespace ckpt::engine {

struct DevicePipeline {
  // A capture copy in flight: the chunk it copies (its tag is the key).
  struct Ticket {
    uint64_t version = 0;
    uint64_t generation = 0;
    uint32_t chunk = 0;
  };
  // The bounce pool: slots of kPoolSlotBytes, for tiers other than a pinned arena.
  static constexpr uint64_t kPoolSlotBytes = uint64_t{16} << 20;
  static constexpr uint32_t kPoolSlots = 4;

  std::unique_ptr<io::Device> device;
  Status status;              // of opening it
  bool tried = false;         // opening was tried
  std::vector<void*> pinned;  // regions pinned at open, unpinned at close
  bool arena_pinned = false;  // the ram arena is pinned: restores copy from it in place
  std::unique_ptr<io::DeviceQueue> capture;  // D2H
  std::unique_ptr<io::DeviceQueue> restore;  // H2D
  std::thread thread;                        // ckpt-device: reaps capture's copies
  uint8_t* pool = nullptr;                   // kPoolSlots * kPoolSlotBytes, pinned if it could be
  // Under Db::mu_: the capture copies in flight.
  std::unordered_map<uint64_t, Ticket> tickets;
  uint64_t next_tag = 0;
};

}  // namespace ckpt::engine
