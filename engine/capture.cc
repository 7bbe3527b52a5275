// The capture workers and the calls that wait on them (DESIGN.md section 5; DataStates-LLM
// sections 4-5): put.cc checks a shard and queues its chunks; workers copy each chunk out of
// the caller's buffer into staging memory (the ram arena, or the staging ring), hashing it while
// it is hot; wait_capture returns when no chunk of the version is read from callers' buffers any
// more, which is what makes it safe to let the optimizer change them.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "format/segment_writer.h"
#include "redundancy/erasure_code.h"
#include "util/assert.h"
#include "util/text.h"
#include "util/thread_name.h"

namespace ckpt::engine {
namespace {

using format::kBlockBytes;

// 64 KiB pieces stay in L2 between the copy and the hash: copy-and-hash ran at 83-84% of memcpy
// on one thread with 16-256 KiB pieces, 71-74% with 1-4 MiB ones (bench_copy_hash,
// docs/performance.md).
constexpr uint64_t kCopyPieceBytes = 64 << 10;

// While the trainer waits on its store it sends nothing of its own: replication need not wait
// for the trainer's idle spans meanwhile (GEMINI's interleaving, engine/traffic_interleaver.h).
class TrainerWaitScope {
 public:
  explicit TrainerWaitScope(Cluster* cluster) : cluster_(cluster) {
    if (cluster_ != nullptr) cluster_->TrainerWaits(true);
  }
  ~TrainerWaitScope() {
    if (cluster_ != nullptr) cluster_->TrainerWaits(false);
  }
  TrainerWaitScope(const TrainerWaitScope&) = delete;
  TrainerWaitScope& operator=(const TrainerWaitScope&) = delete;

 private:
  Cluster* const cluster_;
};

}  // namespace

uint64_t CopyAndHash(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  format::Xxh3Stream hash;
  for (uint64_t off = 0; off < bytes; off += kCopyPieceBytes) {
    size_t n = static_cast<size_t>(std::min(kCopyPieceBytes, bytes - off));
    std::memcpy(dst + off, src + off, n);
    hash.Update(dst + off, n);
  }
  return hash.Digest();
}

// A pack's payload (docs/format.md, "Packed shards"): each part copied to its offset and hashed
// there (its tensor's pack_xxh3, into *part_xxh3), zeros between parts; returns the xxh3 of the
// whole payload (the chunk's).
uint64_t Db::CopyPack(uint8_t* payload, const std::vector<PackPart>& parts,
                      std::vector<uint64_t>* part_xxh3) {
  part_xxh3->resize(parts.size());
  uint64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const PackPart& p = parts[i];
    std::memset(payload + at, 0, p.offset - at);
    std::memcpy(payload + p.offset, p.src, p.bytes);
    (*part_xxh3)[i] = format::Xxh3(payload + p.offset, p.bytes);
    at = p.offset + p.bytes;
  }
  return format::Xxh3(payload, at);
}

// An AEC parity unit's payload (docs/format.md, "AEC parity units"): the XOR of its parts,
// pieces of the caller's shard in host memory (a replicated shard in device memory is refused at
// its put), each zero-padded to the unit's `bytes`.
void Db::XorParts(uint8_t* payload, uint64_t bytes, const std::vector<PackPart>& parts) {
  std::memset(payload, 0, bytes);
  for (const PackPart& p : parts) {
    CKPTDB_ASSERT(p.offset == 0 && p.bytes <= bytes);
    redundancy::XorInto(payload, p.src, p.bytes);
  }
}

Status ValidateName(const char* name, const std::string& call) {
  if (name == nullptr) return Status::Invalid(call + ": name is NULL");
  size_t n = strnlen(name, CKPTDB_MAX_NAME_BYTES + 1);
  if (n == 0) return Status::Invalid(call + ": name is empty");
  if (n > CKPTDB_MAX_NAME_BYTES) {
    return Status::Invalid(call + ": name " + QuoteName(std::string_view(name, n)) +
                           " is longer than " + std::to_string(CKPTDB_MAX_NAME_BYTES) + " bytes");
  }
  return Status::Ok();
}

// COPY_NOW: the caller's thread captures its own chunks and hashes its own pieces, not waiting
// behind the queue, then waits for any chunk back-pressure sent direct. The version's error,
// if it failed meanwhile.
Status Db::CaptureOnCallerLocked(std::unique_lock<std::mutex>& lock, uint64_t version,
                                 uint64_t generation, const std::vector<uint32_t>& own_pieces,
                                 const std::vector<uint32_t>& own_chunks) {
  for (uint32_t index : own_pieces) {
    auto live = live_.find(version);
    CKPTDB_ASSERT(live != live_.end());  // its unhashed pieces keep it live
    HashPiece(lock, &live->second, index);
  }
  for (uint32_t index : own_chunks) {
    auto live = live_.find(version);
    CKPTDB_ASSERT(live != live_.end());  // its uncaptured chunks keep it live
    CaptureChunk(lock, &live->second, index);
  }
  // A chunk back-pressure sent direct still reads `data` until its write completes: wait for
  // it (in this very version: the number may have been aborted and put again meanwhile).
  state_cv_.wait(lock, [&] {
    auto live = live_.find(version);
    if (live == live_.end() || live->second.generation != generation) return true;
    for (uint32_t i : own_chunks) {
      Home h = live->second.chunks[i].home;
      if (h == Home::kQueued || h == Home::kCopying || h == Home::kDirect) return false;
    }
    return true;
  });
  auto live = live_.find(version);
  if (live != live_.end() && live->second.generation == generation && !live->second.error.ok()) {
    return live->second.error;
  }
  return Status::Ok();
}

Status Db::WaitCapture(uint64_t version, int timeout_ms) {
  const uint64_t start = MonoNs();
  std::unique_lock<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  std::string what = "wait_capture " + V(version);
  auto captured = [&] {
    auto it = live_.find(version);
    return closed_ || it == live_.end() || it->second.uncaptured == 0;
  };
  bool done = true;
  TrainerWaitScope waits(captured() ? nullptr : cluster_.get());
  if (timeout_ms < 0) {
    state_cv_.wait(lock, captured);
  } else {
    done = state_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), captured);
  }
  const uint64_t blocked = MonoNs() - start;
  figures_.wait_capture_calls++;
  figures_.wait_capture_blocked_ns += blocked;
  auto it = live_.find(version);
  if (it != live_.end()) it->second.stats.wait_capture_blocked_ns += blocked;
  if (!done) {
    return Status::TimedOut(what + ": " + std::to_string(it->second.uncaptured) +
                            " chunks are still being copied after " + std::to_string(timeout_ms) +
                            " ms");
  }
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  if (it != live_.end()) {
    const LiveVersion& v = it->second;
    if (!v.error.ok()) return FailureFor(v.error, what);
    if (v.abort_requested) return Status::State(what + ": the version is being aborted");
    return Status::Ok();
  }
  auto known = versions_.find(version);
  if (known == versions_.end() || !known->second.has_record) {
    return FindOutcome(version, what)
        .value_or(Status::NotFound(what + ": no shards were put into it"));
  }
  if (known->second.record.state == CKPTDB_STATE_ABORTED) return Outcome(version, what);
  return Status::Ok();
}

Status Db::Commit(uint64_t version, unsigned flags) {
  const uint64_t start = MonoNs();
  std::unique_lock<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  std::string what = "commit " + V(version);
  if (options_.read_only) return Status::State(what + ": the store is open read-only");
  if (flags & ~CKPTDB_COMMIT_ASYNC) {
    return Status::Invalid(what + ": unknown flags " + std::to_string(flags));
  }
  auto it = live_.find(version);
  if (it == live_.end()) {
    auto known = versions_.find(version);
    if (known != versions_.end() && known->second.record.state == CKPTDB_STATE_ABORTED) {
      return Outcome(version, what);
    }
    if (known != versions_.end() && known->second.record.state != CKPTDB_STATE_OPEN) {
      return Status::State(what + ": the version is " +
                           ckptdb_state_name(known->second.record.state));
    }
    return FindOutcome(version, what)
        .value_or(Status::NotFound(what + ": no shards were put into it"));
  }
  LiveVersion& v = it->second;
  if (v.commit_requested) return Status::State(what + ": its commit is already under way");
  if (!v.error.ok()) return FailureFor(v.error, what);
  if (v.abort_requested) return Status::State(what + ": the version is being aborted");
  v.commit_requested = true;
  v.commit_requested_mono_ns = start;
  WakeManager();
  if (!(flags & CKPTDB_COMMIT_ASYNC)) {
    TrainerWaitScope waits(cluster_.get());
    state_cv_.wait(lock, [&] { return closed_ || live_.count(version) == 0; });
  }
  const uint64_t blocked = MonoNs() - start;
  figures_.commit_blocked_ns += blocked;
  if (auto live = live_.find(version); live != live_.end()) {
    live->second.stats.commit_blocked_ns += blocked;
    return Status::Ok();  // asynchronous: wait_commit reports the outcome
  }
  if (auto known = versions_.find(version); known != versions_.end()) {
    known->second.stats.commit_blocked_ns += blocked;
    stats_dirty_.insert(version);  // the manager records it
    WakeManager();
    if (known->second.record.state == CKPTDB_STATE_COMMITTED) {
      auto witness = witness_errors_.find(version);
      return witness == witness_errors_.end() ? Status::Ok() : witness->second.WithContext(what);
    }
  }
  if (!poisoned_.ok()) return poisoned_;
  return Outcome(version, what);
}

Status Db::WaitCommit(uint64_t version, const char* tier, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  std::string what = "wait_commit " + V(version);
  int target = -1;
  if (tier != nullptr) {
    size_t index = 0;
    CKPTDB_RETURN_IF_ERROR(ResolveTier(tier, &index).WithContext(what));
    target = static_cast<int>(index);
    what += " on tier " + tiers_[index].name();
  }
  // Decides, or returns nullopt to wait longer.
  auto decide = [&]() -> std::optional<Status> {
    if (closed_) return Status::State(what + ": the store is closed");
    if (!poisoned_.ok()) return Status::State(poisoned_.message());
    auto live = live_.find(version);
    if (live != live_.end()) {
      if (options_.read_only) return Status::State(what + ": the version is not committed");
      if (!live->second.commit_requested) {
        return Status::State(what +
                             ": the version is OPEN and has not been committed; call "
                             "ckptdb_commit");
      }
      return std::nullopt;
    }
    auto known = versions_.find(version);
    if (known == versions_.end() || !known->second.has_record) {
      return FindOutcome(version, what).value_or(Status::NotFound(what + ": unknown version"));
    }
    const VersionEntry& e = known->second;
    int s = e.record.state;
    if (s == CKPTDB_STATE_ABORTED) return Outcome(version, what);
    if (s != CKPTDB_STATE_COMMITTED && s != CKPTDB_STATE_RETIRED) {
      return Status::State(what + ": the version is " + std::string(ckptdb_state_name(s)) +
                           " and has not been committed");
    }
    if (target < 0) {
      auto witness = witness_errors_.find(version);
      return witness == witness_errors_.end() ? Status::Ok() : witness->second.WithContext(what);
    }
    for (const ResidencyRecord& r : e.residency) {
      if (r.tier == tiers_[target].name() &&
          (r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_EVICTED)) {
        return Status::Ok();
      }
    }
    if (auto failed = demotion_errors_.find({version, static_cast<size_t>(target)});
        failed != demotion_errors_.end()) {
      return failed->second.WithContext(what);
    }
    if (!tiers_[target].online()) return tiers_[target].offline.WithContext(what);
    if (options_.read_only || s == CKPTDB_STATE_RETIRED || !Wants(target, version) ||
        !HasSource(version, target)) {
      return Status::State(what +
                           ": the tier does not take the version under its policy "
                           "(every=, keep=), or no copy is left to demote from");
    }
    return std::nullopt;
  };
  std::optional<Status> result = decide();
  TrainerWaitScope waits(result ? nullptr : cluster_.get());
  if (!result && timeout_ms < 0) {
    state_cv_.wait(lock, [&] { return (result = decide()).has_value(); });
  } else if (!result && !state_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                            [&] { return (result = decide()).has_value(); })) {
    return Status::TimedOut(what + ": not done after " + std::to_string(timeout_ms) + " ms");
  }
  return *result;
}

// ---- Capture workers ----------------------------------------------------------------------------

void Db::WorkerLoop() {
  SetThreadName("ckpt-capture");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    if (const Task& front = tasks_.front(); !front.help && front.piece == kNoPiece) {
      auto it = live_.find(front.version);
      CKPTDB_ASSERT(it != live_.end());  // a version stays live while it has queued chunks
      if (CaptureSmallChunks(lock, &it->second)) continue;  // it took them from the queue
    }
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    if (task.help) {
      lock.unlock();
      ParallelJob& job = *task.help;
      for (size_t i = job.next.fetch_add(1); i < job.count; i = job.next.fetch_add(1)) {
        job.fn(i);
        if (job.done.fetch_add(1) + 1 == job.count) {
          std::lock_guard<std::mutex> g(mu_);
          state_cv_.notify_all();
        }
      }
      lock.lock();
      continue;
    }
    auto it = live_.find(task.version);
    CKPTDB_ASSERT(it != live_.end());  // a version stays live while it has queued chunks
    if (task.piece != kNoPiece) {
      HashPiece(lock, &it->second, task.piece);
    } else {
      CaptureChunk(lock, &it->second, task.chunk);
    }
  }
}

void Db::RunParallel(size_t count, std::function<void(size_t)> fn) {
  if (count == 0) return;
  auto job = std::make_shared<ParallelJob>();
  job->fn = std::move(fn);
  job->count = count;
  const size_t helpers = std::min<size_t>(workers_.size(), count - 1);
  if (helpers > 0) {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < helpers; ++i) tasks_.push_front(Task{0, 0, kNoPiece, job});
    work_cv_.notify_all();
  }
  // The caller works too; helpers that start late find nothing left and return.
  for (size_t i = job->next.fetch_add(1); i < count; i = job->next.fetch_add(1)) {
    job->fn(i);
    job->done.fetch_add(1);
  }
  if (job->done.load() == count) return;
  std::unique_lock<std::mutex> lock(mu_);
  state_cv_.wait(lock, [&] { return job->done.load() == count; });
}

// Copies chunk `index` of v out of the caller's buffer into staging memory and hashes it. Called
// with the lock held; drops it for the copy.
void Db::CaptureChunk(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index) {
  ChunkSlot& c = v->chunks[index];
  CKPTDB_ASSERT(c.home == Home::kQueued);
  if (!v->error.ok() || v->abort_requested) {
    c.home = Home::kDropped;
    FinishChunkLocked(v, &c);
    return;
  }
  c.home = Home::kCopying;
  const uint64_t record_bytes = format::RecordBytes(c.payload_bytes);
  if (!AcquireStaging(lock, v, index, record_bytes, &c.region)) return;  // dropped or direct
  uint8_t* record = (v->ram ? tiers_[0].ram->base() : staging_) + c.region.offset;
  format::RecordHeader rh = format::ChunkRecordHeader(v->version, identity_.rank, index,
                                                      c.payload_bytes, c.record_offset);
  const uint8_t* src = c.src;
  // A pack's parts never change once made, and the deque keeps them where they are.
  const std::vector<PackPart>* parts = c.pack != kNoPack ? &v->packs[c.pack] : nullptr;
  std::vector<uint64_t> part_xxh3;
  const bool parity = c.parity;
  uint64_t tag = 0;
  if (c.device >= 0) {
    CKPTDB_ASSERT(parts == nullptr && !parity);  // device shards are neither packed nor XORed
    tag = device_.next_tag++;
    device_.tickets[tag] = {v->version, v->generation, index};
  }
  lock.unlock();
  if (parity) {
    // An AEC parity unit: its parts XORed, then hashed.
    CKPTDB_ASSERT(c.device < 0);
    XorParts(record + kBlockBytes, c.payload_bytes, *parts);
    rh.payload_xxh3 = format::Xxh3(record + kBlockBytes, c.payload_bytes);
  } else if (parts != nullptr) {
    rh.payload_xxh3 = CopyPack(record + kBlockBytes, *parts, &part_xxh3);
  } else if (c.device >= 0) {
    // Queued on the device's copy engine, straight into the (pinned) staging region; the device
    // thread hashes it once it has landed (DeviceLoop). Once queued, the chunk is no longer this
    // worker's: the device thread may finish it, and its version, before the lock is back.
    Status st = device_.capture->Submit(
        {c.device, io::CopyKind::kToHost, record + kBlockBytes, src, c.payload_bytes, tag});
    lock.lock();
    if (!st.ok()) {
      device_.tickets.erase(tag);
      FailLocked(
          v, st.WithContext("capture of chunk " + std::to_string(index) + " of " + V(v->version)));
      c.home = Home::kDropped;
      FinishChunkLocked(v, &c);
    }
    return;
  } else {
    rh.payload_xxh3 = CopyAndHash(record + kBlockBytes, src, c.payload_bytes);
  }
  uint64_t padded = format::AlignUp(c.payload_bytes);
  std::memset(record + kBlockBytes + c.payload_bytes, 0, padded - c.payload_bytes);
  format::EncodeRecordHeaderBlock(rh, record);
  lock.lock();
  for (size_t i = 0; i < part_xxh3.size(); ++i) {
    v->tensors[(*parts)[i].tensor].pack_xxh3 = part_xxh3[i];
  }
  if (ChunkCapturedLocked(v, index, rh.payload_xxh3)) WakeManager();
}

// Chunk `index` of v is copied and hashed into its staging region: kept (kDone in the arena,
// kStaged for the manager to write) or, the version given up meanwhile, dropped. True when the
// manager has a write to do.
bool Db::ChunkCapturedLocked(LiveVersion* v, uint32_t index, uint64_t xxh3) {
  ChunkSlot& c = v->chunks[index];
  const bool copied = c.home == Home::kHashing;  // a device chunk, no longer counted uncaptured
  c.xxh3 = xxh3;
  figures_.capture_bytes += c.payload_bytes;
  bool to_write = false;
  if (!v->error.ok() || v->abort_requested) {
    c.home = Home::kDropped;
  } else if (v->ram) {
    c.home = Home::kDone;
  } else {
    c.home = Home::kStaged;
    v->to_write.push_back(index);
    to_write = true;
  }
  if (!copied) {
    FinishChunkLocked(v, &c, /*wake_waiters=*/c.home == Home::kDropped);
    return to_write;
  }
  CKPTDB_ASSERT(v->unhashed > 0);
  if (--v->unhashed == 0) WakeManager();  // a commit or an abort may wait for the last
  if (c.home == Home::kDropped) {
    FreeChunkRegionLocked(v, &c);
    if (!v->ram) v->unwritten--;
    state_cv_.notify_all();
  }
  return to_write;
}

// A device chunk whose copy has landed in its staging region: hashed there (the lock dropped),
// its header block written, then kept or dropped as a worker's chunk is.
void Db::HashCopiedChunk(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index) {
  ChunkSlot& c = v->chunks[index];
  CKPTDB_ASSERT(c.home == Home::kHashing);
  uint64_t xxh3 = 0;
  if (v->error.ok() && !v->abort_requested) {
    uint8_t* record = (v->ram ? tiers_[0].ram->base() : staging_) + c.region.offset;
    format::RecordHeader rh = format::ChunkRecordHeader(v->version, identity_.rank, index,
                                                        c.payload_bytes, c.record_offset);
    const uint64_t bytes = c.payload_bytes;
    lock.unlock();
    rh.payload_xxh3 = format::Xxh3(record + kBlockBytes, bytes);
    std::memset(record + kBlockBytes + bytes, 0, format::AlignUp(bytes) - bytes);
    format::EncodeRecordHeaderBlock(rh, record);
    xxh3 = rh.payload_xxh3;
    lock.lock();
  }
  if (ChunkCapturedLocked(v, index, xxh3)) WakeManager();
}

// The device thread: reaps capture's copies as they complete. A copy that failed fails its
// version; one that landed frees the caller's buffer (wait_capture counts it captured) and is
// hashed here, while the copies after it are still in flight. Exits once the queue is shut down
// (at close, after the workers) and nothing is in flight.
void Db::DeviceLoop() {
  SetThreadName("ckpt-device");
  std::vector<io::DeviceQueue::Completion> done;
  std::vector<std::pair<LiveVersion*, uint32_t>> landed;
  while (device_.capture->Reap(&done, 64, /*wait=*/true) > 0) {
    std::unique_lock<std::mutex> lock(mu_);
    landed.clear();
    for (const io::DeviceQueue::Completion& d : done) {
      auto ticket = device_.tickets.find(d.tag);
      CKPTDB_ASSERT(ticket != device_.tickets.end());
      const DevicePipeline::Ticket t = ticket->second;
      device_.tickets.erase(ticket);
      // Live: its chunk is kCopying, so uncaptured holds the version.
      auto it = live_.find(t.version);
      CKPTDB_ASSERT(it != live_.end() && it->second.generation == t.generation);
      LiveVersion* v = &it->second;
      ChunkSlot& c = v->chunks[t.chunk];
      CKPTDB_ASSERT(c.home == Home::kCopying);
      if (!d.status.ok()) {
        FailLocked(v, d.status.WithContext("capture of chunk " + std::to_string(t.chunk) + " of " +
                                           V(v->version)));
      }
      if (!v->error.ok() || v->abort_requested) {
        c.home = Home::kDropped;
        FinishChunkLocked(v, &c);
        continue;
      }
      c.home = Home::kHashing;
      v->unhashed++;
      CapturedOneLocked(v, /*wake_waiters=*/false);
      landed.emplace_back(v, t.chunk);
    }
    state_cv_.notify_all();  // a COPY_NOW put waits for its device chunks to land
    // Each version stays live while it has chunks kHashing (unhashed > 0).
    for (const auto& [v, chunk] : landed) HashCopiedChunk(lock, v, chunk);
  }
}

bool Db::CaptureSmallChunks(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  // Small: a run of them is copied and hashed in microseconds, under what one lock hand-over
  // costs a chunk on two cores. Bounded: at most kRun chunks and kRunBytes of payload.
  constexpr uint64_t kSmallBytes = 64 << 10;
  constexpr size_t kRun = 64;
  constexpr uint64_t kRunBytes = 1 << 20;
  if (!v->error.ok() || v->abort_requested) return false;
  struct Item {
    uint32_t index;
    uint8_t* record;
    format::RecordHeader header;
  };
  Item run[kRun];
  size_t n = 0;
  uint64_t run_bytes = 0;
  while (n < kRun && !tasks_.empty()) {
    const Task& t = tasks_.front();
    if (t.help || t.piece != kNoPiece || t.version != v->version) break;
    ChunkSlot& c = v->chunks[t.chunk];
    if (c.device >= 0 || c.pack != kNoPack || c.payload_bytes > kSmallBytes ||
        run_bytes + c.payload_bytes > kRunBytes) {
      break;
    }
    CKPTDB_ASSERT(c.home == Home::kQueued);
    const uint64_t record_bytes = format::RecordBytes(c.payload_bytes);
    const bool got = v->ram ? tiers_[0].ram->Allocate(record_bytes, &c.region)
                            : ring_->Allocate(record_bytes, &c.region);
    if (!got) break;  // back-pressure: CaptureChunk's, one chunk at a time
    if (!v->ram) {
      v->stats.staging_high_water_bytes =
          std::max(v->stats.staging_high_water_bytes, ring_->live_bytes());
    }
    c.home = Home::kCopying;
    run[n++] = {t.chunk, (v->ram ? tiers_[0].ram->base() : staging_) + c.region.offset,
                format::ChunkRecordHeader(v->version, identity_.rank, t.chunk, c.payload_bytes,
                                          c.record_offset)};
    run_bytes += c.payload_bytes;
    tasks_.pop_front();
  }
  if (n == 0) return false;
  // The chunks' slots stay where they are while the lock is dropped: the deque only grows at
  // its back, and a version with chunks kCopying stays live.
  std::array<const uint8_t*, kRun> src;
  std::array<uint64_t, kRun> bytes;
  for (size_t k = 0; k < n; ++k) {
    src[k] = v->chunks[run[k].index].src;
    bytes[k] = v->chunks[run[k].index].payload_bytes;
  }
  lock.unlock();
  for (size_t k = 0; k < n; ++k) {
    uint8_t* record = run[k].record;
    run[k].header.payload_xxh3 = CopyAndHash(record + kBlockBytes, src[k], bytes[k]);
    std::memset(record + kBlockBytes + bytes[k], 0, format::AlignUp(bytes[k]) - bytes[k]);
    format::EncodeRecordHeaderBlock(run[k].header, record);
  }
  lock.lock();
  bool to_write = false;
  for (size_t k = 0; k < n; ++k) {
    to_write |= ChunkCapturedLocked(v, run[k].index, run[k].header.payload_xxh3);
  }
  if (to_write) WakeManager();
  return true;
}

void Db::HashPiece(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index) {
  if (v->error.ok() && !v->abort_requested) {
    const uint8_t* src = v->hash_pieces[index].src;
    const uint64_t bytes = v->hash_pieces[index].bytes;
    lock.unlock();
    const uint64_t xxh3 = format::Xxh3(src, bytes);
    lock.lock();
    v->hash_pieces[index].xxh3 = xxh3;
  }
  CapturedOneLocked(v, /*wake_waiters=*/false);
}

// Bookkeeping once a chunk no longer reads the caller's buffer (captured, dropped, or its direct
// write done).
void Db::FinishChunkLocked(LiveVersion* v, ChunkSlot* c, bool wake_waiters) {
  if (c->home == Home::kDropped) {
    FreeChunkRegionLocked(v, c);
    if (!v->ram) v->unwritten--;
    wake_waiters = true;
  }
  CapturedOneLocked(v, wake_waiters);
}

// Who waits for a chunk: wait_capture for the version's last one (uncaptured 0), and a
// COPY_NOW put for its own chunks, which it captures itself but for those sent direct (their
// writes' completions wake it, manager.cc). So a worker's ordinary capture wakes no one until
// the last: a wake-up a chunk cost more than capturing a 256-byte chunk (issue 23).
void Db::CapturedOneLocked(LiveVersion* v, bool wake_waiters) {
  CKPTDB_ASSERT(v->uncaptured > 0);
  v->uncaptured--;
  if (v->uncaptured == 0) {
    v->stats.capture_ns = MonoNs() - v->first_put_mono_ns;
    if (v->error.ok()) figures_.capture_ns += v->stats.capture_ns;
    WakeManager();  // a commit may be waiting for this, or an abort
    wake_waiters = true;
  }
  if (wake_waiters) state_cv_.notify_all();
}

// Gets `bytes` of staging memory for chunk `index` (in the arena for a ram version, else in the
// ring), applying the back-pressure policy when there is none. Returns true with *out set; false
// when the chunk was dropped (version failed or skipped) or handed to a direct write.
bool Db::AcquireStaging(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index,
                        uint64_t bytes, StagingRing::Region* out) {
  auto allocate = [&] {
    if (v->ram) return tiers_[0].ram->Allocate(bytes, out);
    if (!ring_->Allocate(bytes, out)) return false;
    v->stats.staging_high_water_bytes =
        std::max(v->stats.staging_high_water_bytes, ring_->live_bytes());
    return true;
  };
  if (allocate()) return true;
  ChunkSlot& c = v->chunks[index];
  figures_.backpressure_waits++;
  v->stats.backpressure_waits++;
  if (options_.backpressure == Backpressure::kSkip) {
    // Memory that a failed or aborted version still holds comes back as soon as the manager has
    // finished that version, with nothing else to wait for: wait for it (bounded, 2 s) before
    // skipping, or a version put right after a skipped one would be skipped for the skipped
    // one's memory.
    auto dying = [&] {
      for (const auto& [version, other] : live_) {
        if (&other != v && other.abort_requested && other.ram == v->ram) return true;
      }
      return false;
    };
    for (int turn = 0; turn < 200 && dying(); ++turn) {
      state_cv_.wait_for(lock, std::chrono::milliseconds(10));
      if (allocate()) return true;
    }
    const std::string where =
        v->ram ? "the ram tier's arena (" + std::to_string(tiers_[0].ram->capacity()) + " bytes)"
               : "the staging ring (" + std::to_string(staging_bytes_) + " bytes)";
    SkipLocked(v, V(v->version) + " was skipped: " + where + " had no room for chunk " +
                      std::to_string(index) + " (back-pressure policy skip)");
    c.home = Home::kDropped;
    FinishChunkLocked(v, &c);
    return false;
  }
  if (options_.backpressure == Backpressure::kDirect && !v->ram && c.device < 0 &&
      c.pack == kNoPack) {
    // (A device chunk cannot be written from where it is, nor a pack, whose parts lie apart: it
    // waits for staging, as with block.)
    // Written to tier 0 straight from the caller's buffer; its header block comes from a small
    // pool. wait_capture waits for the write, which reads the caller's buffer.
    state_cv_.wait(lock, [&] {
      return !free_direct_headers_.empty() || !v->error.ok() || v->abort_requested || stopping_;
    });
    if (!v->error.ok() || v->abort_requested || free_direct_headers_.empty()) {
      c.home = Home::kDropped;
      FinishChunkLocked(v, &c);
      return false;
    }
    c.header_block = free_direct_headers_.back();
    free_direct_headers_.pop_back();
    c.home = Home::kDirect;
    uint8_t* header = direct_headers_ + uint64_t{c.header_block} * kBlockBytes;
    const uint8_t* src = c.src;
    const uint64_t payload = c.payload_bytes;
    format::RecordHeader rh =
        format::ChunkRecordHeader(v->version, identity_.rank, index, payload, c.record_offset);
    lock.unlock();
    rh.payload_xxh3 = format::Xxh3(src, payload);
    format::EncodeRecordHeaderBlock(rh, header);
    lock.lock();
    c.xxh3 = rh.payload_xxh3;
    figures_.direct_chunks++;
    v->stats.direct_chunks++;
    figures_.capture_bytes += payload;
    v->to_write.push_back(index);
    WakeManager();
    return false;
  }
  // Block (and direct for a ram version: its staging is the tier itself, there is nothing to
  // write around). The manager frees ring regions as writes complete and arena regions as it
  // demotes and evicts; it fails the version if nothing can ever free enough.
  const uint64_t wait_start = MonoNs();
  if (v->ram) v->arena_waiters[index] = tiers_[0].ram->frees();
  WakeManager();
  bool got = false;
  state_cv_.wait(lock, [&] {
    if (!v->error.ok() || v->abort_requested || stopping_) return true;
    got = allocate();
    if (!got && v->ram) {
      // Tried again after the last free and still short: tell the manager, which decides
      // whether anything can ever free enough.
      uint64_t frees = tiers_[0].ram->frees();
      if (v->arena_waiters[index] != frees) {
        v->arena_waiters[index] = frees;
        WakeManager();
      }
    }
    return got;
  });
  if (v->ram) v->arena_waiters.erase(index);
  const uint64_t waited = MonoNs() - wait_start;
  figures_.backpressure_wait_ns += waited;
  v->stats.backpressure_wait_ns += waited;
  if (!got) {
    c.home = Home::kDropped;
    FinishChunkLocked(v, &c);
    return false;
  }
  return true;
}

void Db::DropQueuedLocked(LiveVersion* v) {
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    if (!it->help && it->version == v->version && it->piece != kNoPiece) {
      it = tasks_.erase(it);
      CapturedOneLocked(v);
    } else if (!it->help && it->version == v->version) {
      ChunkSlot& c = v->chunks[it->chunk];
      c.home = Home::kDropped;
      it = tasks_.erase(it);
      FinishChunkLocked(v, &c);
    } else {
      ++it;
    }
  }
  state_cv_.notify_all();
}

// The version cannot be committed any more: remember why, stop capturing it, let the manager
// abort it.
void Db::FailLocked(LiveVersion* v, const Status& st) {
  CKPTDB_ASSERT(!st.ok());
  if (v->error.ok()) {
    v->error = st;
    RememberOutcome(v->version, st, /*may_put_again=*/false);
  }
  v->abort_requested = true;
  DropQueuedLocked(v);
  WakeManager();
}

void Db::SkipLocked(LiveVersion* v, const std::string& why) {
  if (v->error.ok()) figures_.skipped_versions++;
  FailLocked(v, Status::Skipped(why));
}

void Db::RememberOutcome(uint64_t version, const Status& st, bool may_put_again) {
  outcomes_[version] = {st, may_put_again};
  while (outcomes_.size() > kMaxOutcomes) outcomes_.erase(outcomes_.begin());
}

std::optional<Status> Db::FindOutcome(uint64_t version, const std::string& what) const {
  auto it = outcomes_.find(version);
  if (it == outcomes_.end()) return std::nullopt;
  return FailureFor(it->second.status, what);
}

Status Db::Outcome(uint64_t version, const std::string& what) const {
  return FindOutcome(version, what).value_or(Status::State(what + ": the version was aborted"));
}

// Opens the device once (options.device: the build's GPU runtime, or the simulated device), pins
// the staging ring, the ram arena (read-write, when mapped) and the restore pool so that copies
// into and out of them are DMA, makes the two copy queues and starts the device thread. A failure
// to pin is said once and the device is used all the same (those copies then go through the
// driver's bounce buffers). Not under mu_: the first call may take long (pinning an arena of
// many GiB), and the others wait here only.
Status Db::OpenDeviceOnce() {
  std::lock_guard<std::mutex> g(device_mu_);
  DevicePipeline& d = device_;
  if (d.tried) return d.status;
  d.tried = true;
  d.status = io::OpenDevice(options_.device, &d.device);
  if (!d.status.ok()) return d.status;
  void* pool = mmap(nullptr, DevicePipeline::kPoolSlots * DevicePipeline::kPoolSlotBytes,
                    PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pool == MAP_FAILED) {
    d.status = Status::FromErrno(errno, "mapping the device restore pool");
    d.device.reset();
    return d.status;
  }
  d.pool = static_cast<uint8_t*>(pool);
  bool told = false;
  auto pin = [&](void* p, uint64_t bytes, const char* what) {
    if (p == nullptr || bytes == 0) return false;
    Status st = d.device->Pin(p, bytes);
    if (st.ok()) {
      d.pinned.push_back(p);
      return true;
    }
    if (!told) {
      std::fprintf(stderr, "ckptdb: %s is not pinned, device copies go through the driver: %s\n",
                   what, st.message().c_str());
    }
    told = true;
    return false;
  };
  pin(staging_, staging_bytes_, "the staging ring");
  if (!tiers_.empty() && tiers_[0].is_ram() && tiers_[0].ram->available()) {
    // Read-only, the arena is mapped for reading: restores still copy from it.
    d.arena_pinned = pin(tiers_[0].ram->base(), tiers_[0].ram->capacity(), "the ram tier's arena");
  }
  pin(d.pool, DevicePipeline::kPoolSlots * DevicePipeline::kPoolSlotBytes, "the restore pool");
  d.capture = std::make_unique<io::DeviceQueue>(d.device.get(), io::DeviceQueueOptions{});
  d.restore = std::make_unique<io::DeviceQueue>(d.device.get(), io::DeviceQueueOptions{});
  d.thread = std::thread([this] {
    if (!options_.cpus.empty()) {  // where open's own threads run
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int cpu : options_.cpus) CPU_SET(cpu, &set);
      (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    DeviceLoop();
  });
  device_open_.store(true, std::memory_order_release);
  return d.status;
}

Status Db::LocateDevice(const void* p, bool flagged, const std::string& what, int* device) {
  *device = -1;
  if (!DeviceConfigured()) {
    return flagged ? Status::NotSupported(what +
                                          ": device memory needs a CUDA or HIP build, or the "
                                          "simulated device (device \"sim\")")
                   : Status::Ok();
  }
  if (flagged) {
    CKPTDB_RETURN_IF_ERROR(OpenDeviceOnce().WithContext(what));
  } else if (!device_open_.load(std::memory_order_acquire)) {
    return Status::Ok();  // never opened: host memory, and a CPU-only user pays nothing
  }
  int d = -1;
  Status st = device_.device->Locate(p, &d);
  if (!st.ok()) return flagged ? st.WithContext(what) : Status::Ok();
  if (flagged && d < 0) {
    return Status::Invalid(what + ": the device flag names host memory");
  }
  *device = d;
  return Status::Ok();
}

}  // namespace ckpt::engine
