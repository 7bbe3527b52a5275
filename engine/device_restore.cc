// Restore into device memory (DESIGN.md section 5; docs/api.md, "Device memory"): the restore
// pipeline backwards. From this rank's own tiers each chunk is read (in place from a pinned ram
// arena; io_uring into a slot of the pinned restore pool otherwise), verified on the host, and
// copied to the device on the restore queue's streams, the three stages overlapped: the next
// chunks are verified (or the next slot read) while the copies before them run. Whatever that
// cannot serve (peers' replicas, rebuilds, a replica group's slices, packed shards, chunks no tier
// here has good) goes through the general restore into host memory and then through the pool.
// Nothing is pinned per call.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "util/assert.h"

namespace ckpt::engine {
namespace {

using format::kBlockBytes;
constexpr uint64_t kSlotBytes = DevicePipeline::kPoolSlotBytes;
constexpr uint32_t kSlots = DevicePipeline::kPoolSlots;

// The copies of one restore on the restore queue: submitted, reaped, counted by pool slot (tag
// kSlots: no slot, the arena). The first error is kept; Drain waits for every copy, so that no
// copy still reads the pool or the arena when the call returns.
class H2dCopies {
 public:
  H2dCopies(io::DeviceQueue* q, int device) : q_(q), device_(device) {}
  ~H2dCopies() { Drain(); }
  H2dCopies(const H2dCopies&) = delete;
  H2dCopies& operator=(const H2dCopies&) = delete;

  void Submit(uint8_t* dst, const uint8_t* src, size_t bytes, uint32_t slot) {
    if (!error_.ok()) return;
    Status st = q_->Submit({device_, io::CopyKind::kToDevice, dst, src, bytes, slot});
    if (!st.ok()) {
      error_ = st;
      return;
    }
    ++in_flight_;
    if (slot < kSlots) ++busy_[slot];
  }
  void Reap(bool wait) {
    if (in_flight_ == 0) return;
    q_->Reap(&done_, 64, wait);
    for (const io::DeviceQueue::Completion& d : done_) {
      --in_flight_;
      if (d.tag < kSlots) --busy_[d.tag];
      if (!d.status.ok() && error_.ok()) error_ = d.status;
    }
  }
  void WaitForSlot(uint32_t slot) {
    while (busy_[slot] > 0) Reap(true);
  }
  void Drain() {
    while (in_flight_ > 0) Reap(true);
  }
  const Status& error() const { return error_; }

 private:
  io::DeviceQueue* const q_;
  const int device_;
  size_t in_flight_ = 0;
  size_t busy_[kSlots] = {};
  std::vector<io::DeviceQueue::Completion> done_;
  Status error_;
};

// nbytes of verified host memory to the device through the pool's slots: each piece copied into a
// slot while the slots before it are on their way.
Status CopyThroughPool(io::DeviceQueue* q, uint8_t* pool, const uint8_t* host, uint8_t* dst,
                       size_t nbytes, int device) {
  H2dCopies copies(q, device);
  uint32_t slot = 0;
  for (size_t off = 0; off < nbytes && copies.error().ok(); off += kSlotBytes) {
    const size_t n = std::min<size_t>(kSlotBytes, nbytes - off);
    copies.WaitForSlot(slot);
    uint8_t* base = pool + uint64_t{slot} * kSlotBytes;
    std::memcpy(base, host + off, n);
    copies.Submit(dst + off, base, n, slot);
    slot = (slot + 1) % kSlots;
  }
  copies.Drain();
  return copies.error();
}

}  // namespace

Status Db::RestoreToDevice(uint64_t version, const char* name, uint8_t* dst, size_t nbytes,
                           int device, const std::string& what) {
  const uint64_t start = MonoNs();
  {
    std::lock_guard<std::mutex> read_lock(read_mu_);
    std::vector<size_t> candidates;
    if (CommittedCopies(version, what, &candidates).ok()) {
      std::vector<size_t> order;  // ram first, as the general restore's order
      for (size_t ti : candidates) {
        if (tiers_[ti].is_ram()) order.push_back(ti);
      }
      for (size_t ti : candidates) {
        if (!tiers_[ti].is_ram()) order.push_back(ti);
      }
      last_problem_.clear();
      RestorePlan plan;
      plan.what = what;
      for (size_t ti : order) {
        if (plan.laid_out && plan.pending.empty()) break;
        OpenSegment* seg = nullptr;
        Status st = ReadSegment(version, ti, &seg);
        if (!st.ok()) {
          plan.Note(st.message());
          continue;
        }
        RamPin pin(this, version, tiers_[ti].is_ram());
        st = LayOut(seg->reader->manifest(), name, nbytes, seg->reader->what(), &plan);
        if (st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESIZE) return st;
        if (!st.ok()) {
          plan.Note(st.message());
          continue;
        }
        if (plan.dedup || plan.packed) break;  // the general restore's
        uint64_t bytes = 0;
        st = PipeToDevice(seg, &plan, dst, device, &bytes);
        pin.Release();
        if (!st.ok()) return st.WithContext(what);  // the device failed: dst is not vouched for
        plan.Served(tiers_[ti].name(), bytes);
        std::lock_guard<std::mutex> lock(mu_);
        tiers_[ti].bytes_read += bytes;
      }
      if (plan.laid_out && plan.pending.empty() && !plan.dedup && !plan.packed) {
        std::lock_guard<std::mutex> lock(mu_);
        figures_.checksum_failures += plan.chunk_failures;
        RecordRestoreLocked(plan, "", nbytes, nullptr, start);
        return Status::Ok();
      }
    }
  }
  return RestoreViaHost(version, name, dst, nbytes, device, what);
}

// The pending chunks of plan from one tier to dst on the device; those that fail their xxh3 or
// cannot be read stay pending. Returns once every copy it queued has completed.
Status Db::PipeToDevice(OpenSegment* seg, RestorePlan* plan, uint8_t* dst, int device,
                        uint64_t* bytes) {
  const format::ManifestView& m = seg->reader->manifest();
  H2dCopies copies(device_.restore.get(), device);
  std::vector<uint32_t> failed;
  auto out = [&](uint32_t c) { return dst + plan->dst_offset[c - plan->first]; };
  if (tiers_[seg->tier].is_ram() && device_.arena_pinned) {
    // In place: a batch of chunks verified where they lie (on a capture worker too), then
    // copied from there while the next batch is verified. Two a batch: what is verified before
    // the first copy starts is not overlapped (16 a batch, a 64 MiB shard's chunks, restored at
    // 82% of an 8 GB/s simulated engine, 2 at 92%: docs/performance.md).
    const RamTier& ram = *tiers_[seg->tier].ram;
    constexpr size_t kBatch = 2;
    const std::vector<uint32_t>& pending = plan->pending;
    for (size_t at = 0; at < pending.size() && copies.error().ok(); at += kBatch) {
      const size_t n = std::min(kBatch, pending.size() - at);
      const uint8_t* src[kBatch] = {};
      uint64_t actual[kBatch] = {};
      RunParallel(n, [&](size_t k) {
        const fb::Chunk& c = m.chunk(pending[at + k]);
        const RamExtent* extent = ram.ExtentAt(seg->image, c.record_offset());
        if (extent == nullptr || extent->bytes < kBlockBytes + c.payload_bytes()) return;
        src[k] = ram.base() + extent->arena_offset + kBlockBytes;
        actual[k] = format::Xxh3(src[k], c.payload_bytes());
      });
      for (size_t k = 0; k < n; ++k) {
        const uint32_t index = pending[at + k];
        const fb::Chunk& c = m.chunk(index);
        if (src[k] != nullptr && actual[k] == c.xxh3()) {
          copies.Submit(out(index), src[k], c.payload_bytes(), kSlots);
          *bytes += c.payload_bytes();
          continue;
        }
        failed.push_back(index);
        plan->chunk_failures++;
        if (last_problem_.empty()) {
          last_problem_ = "chunk " + std::to_string(index) + " of " + seg->reader->what() +
                          (src[k] == nullptr ? " has no record of its size in the arena's index"
                                             : format::Xxh3Mismatch(c.xxh3(), actual[k]));
        }
      }
      copies.Reap(false);
    }
  } else {
    // Through the pool: a slot's worth of chunks read and verified (ReadChunks), then copied to
    // the device from the slot while the next slot is read.
    const std::vector<uint32_t> pending = plan->pending;
    uint8_t* const pool = device_.pool;
    uint32_t slot = 0;
    for (size_t at = 0; at < pending.size() && copies.error().ok();) {
      std::vector<uint32_t> batch;
      std::vector<uint64_t> offsets;
      uint64_t used = 0;
      for (; at < pending.size(); ++at) {
        const uint64_t b = m.chunk(pending[at]).payload_bytes();
        if (b > kSlotBytes) {
          failed.push_back(pending[at]);  // larger than a slot: the general restore's
          continue;
        }
        if (used + b > kSlotBytes) break;
        batch.push_back(pending[at]);
        offsets.push_back(used);
        used += b;
      }
      copies.WaitForSlot(slot);
      uint8_t* base = pool + uint64_t{slot} * kSlotBytes;
      std::vector<uint32_t> bad;
      Status rs = ReadChunks(seg, *plan, batch, offsets, base, &bad, bytes);
      if (!rs.ok()) return rs;  // copies drains first
      for (size_t k = 0; k < batch.size(); ++k) {
        if (std::find(bad.begin(), bad.end(), batch[k]) != bad.end()) continue;
        copies.Submit(out(batch[k]), base + offsets[k], m.chunk(batch[k]).payload_bytes(), slot);
      }
      plan->chunk_failures += bad.size();
      failed.insert(failed.end(), bad.begin(), bad.end());
      copies.Reap(false);
      slot = (slot + 1) % kSlots;
    }
  }
  copies.Drain();
  std::sort(failed.begin(), failed.end());
  plan->pending = std::move(failed);
  return copies.error();
}

// The general restore (Db::Restore: every source, chunks no source has zeroed) into host memory,
// the size checked before any memory is mapped, then to the device through the restore pool.
Status Db::RestoreViaHost(uint64_t version, const char* name, void* dst, size_t nbytes, int device,
                          const std::string& what) {
  uint64_t stored = 0;
  CKPTDB_RETURN_IF_ERROR(WithManifest(version, what, [&](const format::ManifestView& m, size_t) {
    const fb::Tensor* t = m.Find(name);
    if (t == nullptr) return Status::NotFound(what + ": the version has no tensor by that name");
    stored = format::ShardBytes(*t);
    return Status::Ok();
  }));
  if (stored != nbytes) {
    return Status::Size(what + ": the tensor is " + std::to_string(stored) +
                        " bytes, the buffer is " + std::to_string(nbytes));
  }
  void* host = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (host == MAP_FAILED) {
    return Status::FromErrno(
        errno, what + ": mapping " + std::to_string(nbytes) + " bytes of host memory to stage it");
  }
  Status st = Restore(version, name, host, nbytes, 0, nullptr);
  if (st.ok() || st.code() == CKPTDB_ECORRUPT) {
    std::lock_guard<std::mutex> read_lock(read_mu_);  // the pool's and the restore queue's
    Status copied =
        CopyThroughPool(device_.restore.get(), device_.pool, static_cast<const uint8_t*>(host),
                        static_cast<uint8_t*>(dst), nbytes, device);
    if (!copied.ok()) st = copied.WithContext(what);
  }
  munmap(host, nbytes);
  return st;
}

}  // namespace ckpt::engine
