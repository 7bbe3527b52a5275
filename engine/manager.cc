// The tier manager (DESIGN.md sections 5 and 6): one thread that owns the io_uring write queue
// and makes every change to files and to the catalog, so their order is the order of one
// thread. Each round it
//   1. opens new versions on the first tier (the OPEN record; directory: the temporary file
//      and its header block),
//   2. writes captured ring chunks (and direct chunks) to the first tier's file,
//   3. runs commits: the tail (manifest record and footer), fsync and rename, the demotions a
//      slower commit tier needs, then PREPARED and COMMITTED, each synced,
//   4. finishes aborts,
//   5. demotes committed versions to the slower tiers that want them, checking every chunk
//      against its xxh3 between reading it and writing it, and records the copy durable,
//   6. evicts copies the policy lets go (policy.cc), and fails captures that wait for arena
//      space nothing can ever free,
// then waits for a completion or a wake (an eventfd read on the same queue). Steps 3 and 4 are in
// commit.cc, 5 and 6 in demotion.cc; this file has the loop, steps 1 and 2, and completions. mu_ is
// dropped around every file operation and catalog write, so callers and workers never wait on the
// disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/little_endian.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_writer.h"
#include "util/assert.h"
#include "util/thread_name.h"

namespace ckpt::engine {
using redundancy::CodeScheme;
namespace {

using format::kBlockBytes;

}  // namespace

void Db::WakeManager() {
  if (wake_fd_ < 0 || wake_pending_.exchange(true)) return;
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  CKPTDB_ASSERT(n == sizeof one);  // an eventfd write fails only on counter overflow
}

// Staging space comes back only through these. Each free wakes everyone who may be waiting for
// space: capture workers and commits on state_cv_, the manager for a demotion's next read. The
// arena's deadlock check (DetectStagingDeadlockLocked) depends on it: it calls a wait hopeless
// only once every waiter has tried again since the last free, which holds only if every free
// wakes them.
void Db::SpaceFreedLocked() {
  state_cv_.notify_all();
  WakeManager();
}

void Db::FreeRingLocked(StagingRing::Region* region) {
  if (region->bytes == 0) return;
  ring_->Free(*region);
  *region = {};
  SpaceFreedLocked();
}

void Db::FreeArenaLocked(StagingRing::Region* region) {
  if (region->bytes == 0) return;
  tiers_[0].ram->Free(*region);
  *region = {};
  SpaceFreedLocked();
}

void Db::FreeChunkRegionLocked(const LiveVersion* v, ChunkSlot* c) {
  if (v->ram) {
    FreeArenaLocked(&c->region);
  } else {
    FreeRingLocked(&c->region);
  }
}

// Hands one request to the queue. When Submit fails after the request was queued (the final
// io_uring_submit refused, the entry is prepared and goes with the next), it still completes
// through Reap: it is kept and reported submitted.
Status Db::SubmitRequest(io::IoRequest request, Request meta) {
  const uint64_t tag = next_request_++;
  request.tag = tag;
  requests_.emplace(tag, meta);
  const size_t before = queue_->outstanding();
  Status st = queue_->Submit(std::span<const io::IoRequest>(&request, 1));
  if (!st.ok() && queue_->outstanding() > before) return Status::Ok();
  if (!st.ok()) requests_.erase(tag);
  return st;
}

void Db::ManagerLoop() {
  SetThreadName("ckpt-manager");
  std::unique_lock<std::mutex> lock(mu_);
  {
    io::IoRequest wake;
    wake.op = io::IoRequest::Op::kRead;
    wake.fd = wake_fd_;
    wake.buffer = &wake_buffer_;
    wake.length = sizeof wake_buffer_;
    Status st = SubmitRequest(wake, Request{RequestKind::kWake});
    CKPTDB_ASSERT(st.ok());  // a fresh queue takes one request
  }
  for (;;) {
    bool progress = ManagerStepLocked(lock);
    if (stopping_) break;
    const int wait_ms = progress ? 0 : ManagerWaitMsLocked();
    lock.unlock();
    std::vector<io::IoCompletion> done;
    Status st = queue_->Reap(progress ? 0 : 1, &done, wait_ms);
    lock.lock();
    // What Reap returned counts even when it also failed. A wait that ran out is a tier's
    // retry time coming.
    if (!st.ok() && !(wait_ms >= 0 && st.code() == CKPTDB_ETIMEDOUT)) {
      std::fprintf(stderr, "ckptdb: tier manager: %s\n", st.ToString().c_str());
    }
    for (const io::IoCompletion& c : done) {
      auto it = requests_.find(c.tag);
      CKPTDB_ASSERT(it != requests_.end());
      Request r = it->second;
      r.result = c.result;
      requests_.erase(it);
      HandleCompletion(lock, r);
    }
  }
}

bool Db::ManagerStepLocked(std::unique_lock<std::mutex>& lock) {
  bool progress = false;
  // Versions, oldest first. A version's entry stays while the manager works on it: only the
  // manager erases live versions.
  std::vector<uint64_t> order;
  for (const auto& [version, v] : live_) order.push_back(version);
  for (uint64_t version : order) {
    auto it = live_.find(version);
    if (it == live_.end()) continue;
    LiveVersion* v = &it->second;
    if (!poisoned_.ok() && v->error.ok()) FailLocked(v, poisoned_);
    if (v->abort_requested) {
      // Chunks waiting for the manager's write are dropped: direct ones still count as
      // uncaptured (they hold the caller's buffer and a header block), ring ones hold a region.
      if (!v->to_write.empty()) {
        DropUnwrittenLocked(v);
        progress = true;
      }
      bool demoting = demotion_ && demotion_->version == version;
      bool idle = v->uncaptured == 0 && v->unhashed == 0 && v->writes_in_flight == 0 && !demoting &&
                  !v->job.replicating();
      if (idle) {
        FinishAbort(lock, v);
        progress = true;
      }
      continue;
    }
    if (!v->opened) {
      Status st = OpenOnFirstTier(lock, v);
      if (!st.ok()) FailLocked(v, st);
      progress = true;
      continue;
    }
    if (!v->to_write.empty() && FreeRequestSlots(requests_.size(), options_.queue_depth) > 0) {
      SubmitWrites(lock, v);
      progress = true;
    }
    if (closing_ && v->phase == CommitPhase::kVoting &&
        v->job.decision() == JobCommit::Decision::kNone) {
      // Closing with a vote cast and no decision yet: the version stays PREPARED, in doubt,
      // with its copies; the next open asks the coordinator (docs/commit-protocol.md).
      RememberOutcome(
          version,
          Status::State(V(version) +
                        " is PREPARED and in doubt: the store was closed "
                        "before the coordinator's decision arrived; reopen to learn it"),
          /*may_put_again=*/false);
      if (v->ram) v->image = RamImage{};
      live_.erase(version);
      state_cv_.notify_all();
      progress = true;
      continue;
    }
    if (v->commit_requested && v->error.ok() && v->phase != CommitPhase::kSync) {
      bool capture_done =
          v->uncaptured == 0 && v->unhashed == 0 && v->unwritten == 0 && v->writes_in_flight == 0;
      if (v->phase != CommitPhase::kNone || capture_done) progress |= RunCommit(lock, v);
    }
  }
  progress |= RetryOfflineTiers(lock);
  if (demotion_) {
    size_t before = demotion_->next;
    bool syncing = demotion_->syncing;
    PumpDemotion(lock);
    progress |= !demotion_ || demotion_->next != before || demotion_->syncing != syncing;
  } else if (!(closing_ && !options_.drain_on_close)) {
    progress |= PlanDemotion(lock);
  }
  progress |= EvictLocked(lock);
  DetectStagingDeadlockLocked();
  if (!stats_dirty_.empty()) {
    CatalogBatch batch;
    for (uint64_t version : stats_dirty_) {
      auto it = versions_.find(version);
      if (it != versions_.end() && it->second.has_stats) {
        batch.put_stats.emplace_back(version, it->second.stats);
      }
    }
    stats_dirty_.clear();
    lock.unlock();
    // Not synced: figures are not decisions.
    Status st = catalog_->Apply(batch, /*sync=*/false);
    lock.lock();
    if (!st.ok()) std::fprintf(stderr, "ckptdb: recording figures: %s\n", st.ToString().c_str());
  }
  if (closing_ && !manager_idle_ && live_.empty() && requests_.size() == 1 && !demotion_) {
    // Close waits for this: nothing in flight, and no demotion left to drain (when draining).
    bool more = options_.drain_on_close && !progress && PlanDemotion(lock);
    if (!more && !progress) {
      manager_idle_ = true;
      state_cv_.notify_all();
    }
    progress |= more;
  }
  return progress;
}

// ---- Opening a version on the first tier --------------------------------------------------------

// A version's segment header block (4096 bytes: the header, then zeros) at `block`.
void Db::EncodeSegmentHeaderBlock(const LiveVersion& v, uint8_t* block) const {
  format::SegmentHeader h;
  h.job_id = identity_.job_id;
  h.version = v.version;
  h.rank = identity_.rank;
  h.world_size = identity_.world_size;
  h.chunk_bytes = options_.chunk_bytes;
  h.created_unix_ns = v.created_unix_ns;
  format::EncodeSegmentHeaderBlock(h, block);
}

Status Db::OpenOnFirstTier(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  const uint64_t version = v->version;
  TierState& t0 = tiers_[0];
  ResidencyRecord res;
  res.tier = t0.name();
  res.state = CKPTDB_RESIDENT_WRITING;
  VersionRecord rec;
  rec.version = version;
  rec.state = CKPTDB_STATE_OPEN;
  rec.rank = identity_.rank;
  rec.created_unix_ns = v->created_unix_ns;
  v->tier0_started_mono_ns = MonoNs();
  if (v->ram) {
    // The header block is taken now when the arena has room, else at commit.
    res.path = t0.ram->path();
    res.ram_generation = t0.ram->generation();
    if (t0.ram->Allocate(kBlockBytes, &v->header_region)) {
      EncodeSegmentHeaderBlock(*v, t0.ram->base() + v->header_region.offset);
    }
    lock.unlock();
  } else {
    lock.unlock();
    int fd = -1;
    Status st = t0.dir->CreateTemp(version, identity_.rank, &fd);
    if (!st.ok()) {
      lock.lock();
      return st.WithContext("opening " + V(version) + " on tier " + t0.name());
    }
    res.path = t0.dir->TempPath(version, identity_.rank);
    // The header block goes through the queue like every data write: from a block of its own.
    void* block = std::aligned_alloc(kBlockBytes, kBlockBytes);
    CKPTDB_ASSERT(block != nullptr);
    EncodeSegmentHeaderBlock(*v, static_cast<uint8_t*>(block));
    lock.lock();
    v->fd = fd;
    v->fd_direct = t0.dir->direct();
    v->tail.reset(static_cast<uint8_t*>(block));  // freed when the header write completes
    io::IoRequest r;
    r.op = io::IoRequest::Op::kWrite;
    r.fd = fd;
    r.offset = 0;
    r.buffer = block;
    r.length = kBlockBytes;
    v->writes_in_flight++;
    lock.unlock();
    st = SubmitRequest(r, Request{RequestKind::kHeader, version, 0, kBlockBytes});
    lock.lock();
    if (!st.ok()) {
      v->writes_in_flight--;
      v->opened = true;  // the fd is open: the abort closes and removes it
      return st.WithContext("writing the header of " + V(version));
    }
    lock.unlock();
  }
  // Not synced: an OPEN record lost in a crash changes nothing, recovery collects the files.
  CatalogBatch batch;
  batch.delete_versions.push_back(version);  // an aborted earlier attempt at this version
  batch.put_versions.push_back(rec);
  batch.put_residency.emplace_back(version, res);
  Status st = catalog_->Apply(batch, /*sync=*/false);
  lock.lock();
  v->opened = true;
  VersionEntry& e = versions_[version];
  e = VersionEntry{};
  e.has_record = true;
  e.record = rec;
  e.residency.push_back(res);
  return st;
}

// ---- Writing chunks to the first tier's file ---------------------------------------------------

void Db::DropUnwrittenLocked(LiveVersion* v) {
  std::vector<uint32_t> pending;
  pending.swap(v->to_write);
  for (uint32_t index : pending) {
    ChunkSlot& c = v->chunks[index];
    if (c.home == Home::kDirect) {
      free_direct_headers_.push_back(c.header_block);
      c.header_block = UINT32_MAX;
      c.home = Home::kDropped;
      FinishChunkLocked(v, &c);  // gives back the caller's buffer; counts it unwritten
    } else {
      CKPTDB_ASSERT(c.home == Home::kStaged);
      FreeRingLocked(&c.region);
      c.home = Home::kDropped;
      v->unwritten--;
    }
  }
  state_cv_.notify_all();
}

void Db::SubmitWrites(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  const uint64_t version = v->version;
  // O_DIRECT needs the caller's buffer and length aligned; otherwise a direct chunk's payload
  // goes through a buffered descriptor of the same file (the ranges never share a page).
  auto aligned = [](const ChunkSlot& c) {
    return reinterpret_cast<uintptr_t>(c.src) % kBlockBytes == 0 &&
           c.payload_bytes % kBlockBytes == 0;
  };
  if (v->fd_direct && v->buffered_fd < 0 &&
      std::any_of(v->to_write.begin(), v->to_write.end(), [&](uint32_t i) {
        return v->chunks[i].home == Home::kDirect && !aligned(v->chunks[i]);
      })) {
    const std::string path = tiers_[0].dir->TempPath(version, identity_.rank);
    lock.unlock();
    io::OpenOptions o;
    o.mode = io::OpenOptions::Mode::kWrite;
    int fd = -1;
    Status st = io_->Open(path, o, &fd, nullptr);
    lock.lock();
    if (!st.ok()) {
      // The abort drops the chunks still waiting here (DropUnwrittenLocked).
      FailLocked(v, st.WithContext("direct writes of " + V(version)));
      return;
    }
    v->buffered_fd = fd;
  }
  size_t room = FreeRequestSlots(requests_.size(), options_.queue_depth);
  std::vector<std::pair<io::IoRequest, Request>> batch;
  while (!v->to_write.empty() && batch.size() + 2 <= room) {
    uint32_t index = v->to_write.front();
    v->to_write.erase(v->to_write.begin());
    ChunkSlot& c = v->chunks[index];
    if (c.home == Home::kStaged) {
      io::IoRequest r;
      r.op = io::IoRequest::Op::kWrite;
      r.fd = v->fd;
      r.offset = c.record_offset;
      r.buffer = staging_ + c.region.offset;
      r.length = c.region.bytes;
      r.buffer_index = fixed_buffers_ ? 0 : -1;
      c.home = Home::kWriting;
      batch.push_back({r, Request{RequestKind::kChunk, version, index, c.region.bytes}});
    } else {
      CKPTDB_ASSERT(c.home == Home::kDirect);
      int payload_fd = v->fd_direct && !aligned(c) ? v->buffered_fd : v->fd;
      CKPTDB_ASSERT(payload_fd >= 0);
      io::IoRequest h;
      h.op = io::IoRequest::Op::kWrite;
      h.fd = v->fd;
      h.offset = c.record_offset;
      h.buffer = direct_headers_ + uint64_t{c.header_block} * kBlockBytes;
      h.length = kBlockBytes;
      io::IoRequest d;
      d.op = io::IoRequest::Op::kWrite;
      d.fd = payload_fd;
      d.offset = c.record_offset + kBlockBytes;
      d.buffer = const_cast<uint8_t*>(c.src);
      d.length = c.payload_bytes;
      c.direct_writes = c.payload_bytes > 0 ? 2 : 1;
      batch.push_back({h, Request{RequestKind::kDirectHeader, version, index, kBlockBytes}});
      if (c.payload_bytes > 0) {
        batch.push_back({d, Request{RequestKind::kDirectData, version, index, c.payload_bytes}});
      }
    }
  }
  v->writes_in_flight += static_cast<uint32_t>(batch.size());
  lock.unlock();
  Status st;
  size_t submitted = 0;
  for (auto& [r, meta] : batch) {
    st = SubmitRequest(r, meta);
    if (!st.ok()) break;
    ++submitted;
  }
  lock.lock();
  if (!st.ok()) {
    // What was not submitted completes here, as failed.
    for (size_t i = submitted; i < batch.size(); ++i) {
      Request r = batch[i].second;
      r.result = -EIO;
      HandleCompletion(lock, r);
    }
    FailLocked(v, st.WithContext("writing " + V(version) + " to tier " + tiers_[0].name()));
  }
}

// ---- Completions -------------------------------------------------------------------------------

void Db::HandleCompletion(std::unique_lock<std::mutex>& lock, const Request& r) {
  if (r.kind == RequestKind::kWake) {
    wake_pending_.store(false);
    if (!stopping_) {
      io::IoRequest wake;
      wake.op = io::IoRequest::Op::kRead;
      wake.fd = wake_fd_;
      wake.buffer = &wake_buffer_;
      wake.length = sizeof wake_buffer_;
      Status st = SubmitRequest(wake, Request{RequestKind::kWake});
      CKPTDB_ASSERT(st.ok());  // one slot is always kept for it
    }
    return;
  }
  if (r.kind == RequestKind::kDemoteRead || r.kind == RequestKind::kDemoteWrite ||
      r.kind == RequestKind::kDemoteSync) {
    DemotionCompletedLocked(r);
    return;
  }
  auto it = live_.find(r.version);
  CKPTDB_ASSERT(it != live_.end());  // a version stays live while it has writes in flight
  LiveVersion* v = &it->second;
  CKPTDB_ASSERT(v->writes_in_flight > 0);
  v->writes_in_flight--;
  auto file = [&] {
    return tiers_[0].is_ram() ? tiers_[0].name()
                              : tiers_[0].dir->TempPath(v->version, identity_.rank);
  };
  Status failure;
  if (r.result < 0) {
    failure =
        Status::FromErrno(static_cast<int>(-r.result), "writing " + V(v->version) + " to tier " +
                                                           tiers_[0].name() + " (" + file() + ")");
  } else if (r.kind != RequestKind::kSync && static_cast<uint64_t>(r.result) != r.bytes) {
    failure = Status::IoError("writing " + V(v->version) + " to " + file() + ": " +
                              std::to_string(r.result) + " of " + std::to_string(r.bytes) +
                              " bytes written");
  } else if (r.kind != RequestKind::kSync) {
    tiers_[0].bytes_written += r.bytes;
  }
  switch (r.kind) {
    case RequestKind::kHeader:
      v->tail.reset();
      break;
    case RequestKind::kChunk: {
      ChunkSlot& c = v->chunks[r.chunk];
      CKPTDB_ASSERT(c.home == Home::kWriting);
      FreeRingLocked(&c.region);
      c.home = failure.ok() ? Home::kDone : Home::kDropped;
      v->unwritten--;
      break;
    }
    case RequestKind::kDirectHeader:
    case RequestKind::kDirectData: {
      ChunkSlot& c = v->chunks[r.chunk];
      CKPTDB_ASSERT(c.home == Home::kDirect && c.direct_writes > 0);
      if (!failure.ok()) c.home = Home::kDropped;
      if (--c.direct_writes == 0) {
        free_direct_headers_.push_back(c.header_block);
        c.header_block = UINT32_MAX;
        if (c.home == Home::kDirect) {
          c.home = Home::kDone;
          v->unwritten--;
        }
        FinishChunkLocked(v, &c);
      }
      break;
    }
    case RequestKind::kTail:
      if (failure.ok()) {
        v->tail.reset();
        io::IoRequest s;
        s.op = io::IoRequest::Op::kSync;
        s.fd = v->fd;
        v->writes_in_flight++;
        lock.unlock();
        failure = SubmitRequest(s, Request{RequestKind::kSync, v->version});
        lock.lock();
        if (!failure.ok()) v->writes_in_flight--;
        v->phase = CommitPhase::kSync;
      }
      break;
    case RequestKind::kSync:
      if (failure.ok()) {
        tiers_[0].fsyncs++;
        figures_.fsyncs++;
        v->stats.fsyncs++;
        CrashPoint("commit:after_fsync");
        // Published (renamed, directory fsynced) by RunCommit in the next round.
        v->phase = CommitPhase::kDemote;
        v->synced = true;
      }
      break;
    default:
      CKPTDB_ASSERT(false);
  }
  if (!failure.ok()) FailLocked(v, failure);
}

}  // namespace ckpt::engine
