// One-sided windows between the ranks of one host (issue 21; docs/transport.md, "One-sided puts
// and gets"). Internal to Cluster: engine/cluster_replication.cc (replication, fetches) and
// engine/cluster_rma.cc (granting windows, attaching them).
//
// A rank that replicates to, or fetches from, a peer asks the peer once for a window (kWindow):
// kWindowSlots slots of kWindowSlotBytes in the peer's memory, allocated by UCX (transport/rma.h),
// whose descriptor comes back over the authenticated connection. Where the window attaches (the
// same host, a shared-memory transport the job allows), bulk bytes move by one-sided copies:
//   - a replica piece is put into a slot, then a small call (kReplica, phase "landed") names the
//     slot; the holder copies it into the replica's memory and hashes its records there, as for a
//     piece received on the socket;
//   - a fetch names a slot; the holder copies the range into it and replies empty; the fetcher
//     gets the slot into its destination.
// Slots belong to the asking rank: it takes one before a put or a fetch and gives it back when
// the call that used it has returned, so the holder only touches a slot the asker handed it.
// The holder checks that the window named is the one it granted this connection, and the slot
// and length are within it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "transport/rma.h"
#include "util/assert.h"

namespace ckpt::engine {

inline constexpr uint32_t kWindowSlots = 4;
inline constexpr uint64_t kWindowSlotBytes = uint64_t{16} << 20;
inline constexpr uint64_t kWindowBytes = kWindowSlots * kWindowSlotBytes;
// Windows a rank grants at once (one per asking connection); past it the oldest is dropped and
// its asker's next use of it fails with ESTATE, naming the window.
inline constexpr size_t kMaxWindows = 8;
inline constexpr uint32_t kNoSlot = UINT32_MAX;

// The asking side: a peer's window, attached, and which of its slots are in use.
struct PeerWindow {
  std::shared_ptr<transport::RemoteWindow> window;

  // A free slot, or kNoSlot.
  uint32_t TryAcquire() {
    std::lock_guard<std::mutex> lock(mu);
    return TakeLocked();
  }
  // Waits for a free slot: only while the caller holds none (another thread's calls give theirs
  // back on their own, so this cannot wait on itself).
  uint32_t Acquire() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return free != 0; });
    return TakeLocked();
  }
  void Release(uint32_t slot) {
    CKPTDB_ASSERT(slot < kWindowSlots);
    {
      std::lock_guard<std::mutex> lock(mu);
      CKPTDB_ASSERT((free & (1u << slot)) == 0);
      free |= 1u << slot;
    }
    cv.notify_one();
  }

 private:
  uint32_t TakeLocked() {
    if (free == 0) return kNoSlot;
    const uint32_t slot = static_cast<uint32_t>(__builtin_ctz(free));
    free &= ~(1u << slot);
    return slot;
  }
  std::mutex mu;
  std::condition_variable cv;
  uint32_t free = (1u << kWindowSlots) - 1;
};
static_assert(kWindowSlots <= 32);

}  // namespace ckpt::engine
