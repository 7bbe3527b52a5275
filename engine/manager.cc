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
// then waits for a completion or a wake (an eventfd read on the same queue). mu_ is dropped
// around every file operation and catalog write, so callers and workers never wait on the disk.
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
#include "util/assert.h"

namespace ckpt::engine {
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

// Requests the manager may still put in flight: the wake read keeps one slot, and the manager
// never lets Submit wait for a slot (it would wait with completions unhandled).
static size_t FreeRequestSlots(size_t in_flight, uint32_t queue_depth) {
  return in_flight + 1 >= queue_depth ? 0 : queue_depth - 1 - in_flight;
}

void Db::ManagerLoop() {
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
    lock.unlock();
    std::vector<io::IoCompletion> done;
    Status st = queue_->Reap(progress ? 0 : 1, &done, -1);
    lock.lock();
    // What Reap returned counts even when it also failed.
    if (!st.ok()) std::fprintf(stderr, "ckptdb: tier manager: %s\n", st.ToString().c_str());
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
      bool idle = v->uncaptured == 0 && v->writes_in_flight == 0 && !demoting && !v->replicating;
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
    if (closing_ && v->phase == CommitPhase::kVoting && v->decision == 0) {
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
      bool capture_done = v->uncaptured == 0 && v->unwritten == 0 && v->writes_in_flight == 0;
      if (v->phase != CommitPhase::kNone || capture_done) progress |= RunCommit(lock, v);
    }
  }
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
  std::memset(block, 0, kBlockBytes);
  format::EncodeSegmentHeader(h, std::span<uint8_t, 64>(block, 64));
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
    CKPTDB_ASSERT(demotion_ && demotion_->version == r.version);
    Demotion& d = *demotion_;
    d.in_flight--;
    if (r.result < 0 ||
        (r.kind != RequestKind::kDemoteSync && static_cast<uint64_t>(r.result) != r.bytes)) {
      if (d.error.ok()) {
        // A failed read names the source copy; a failed write or fsync, the target's file.
        std::string where =
            "demoting " + V(d.version) + " from tier " + tiers_[d.source].name() + " to tier " +
            tiers_[d.target].name() +
            (r.kind == RequestKind::kDemoteRead
                 ? " (reading the source copy)"
                 : " (" + tiers_[d.target].dir->TempPath(d.version, identity_.rank) + ")");
        d.error = r.result < 0 ? Status::FromErrno(static_cast<int>(-r.result), where)
                               : Status::IoError(where + ": a transfer of record at offset " +
                                                 std::to_string(d.records[r.chunk].offset) +
                                                 " came up short");
      }
    } else if (r.kind == RequestKind::kDemoteWrite) {
      tiers_[d.target].bytes_written += r.bytes;
    } else if (r.kind == RequestKind::kDemoteRead) {
      tiers_[d.source].bytes_read += r.bytes;
    } else {
      tiers_[d.target].fsyncs++;
      stats_.fsyncs++;
    }
    if (r.kind == RequestKind::kDemoteSync) {
      d.synced = d.error.ok();
      return;
    }
    Demotion::Record& rec = d.records[r.chunk];
    if (r.kind == RequestKind::kDemoteRead && d.error.ok()) {
      rec.read_done = true;  // PumpDemotion checks it and writes it
    } else {
      FreeRingLocked(&rec.ring);  // written, or the demotion failed: the region is done
    }
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
        stats_.fsyncs++;
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

// ---- Commit ------------------------------------------------------------------------------------

// Advances v's commit as far as it can go now. Returns whether anything changed.
bool Db::RunCommit(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  const uint64_t version = v->version;
  const CommitPhase before = v->phase;
  const size_t copies_before = v->residency.size();
  const bool demoting_before = demotion_.has_value();
  auto changed = [&] {
    auto it = live_.find(version);
    return it == live_.end() || it->second.phase != before ||
           it->second.residency.size() != copies_before ||
           demotion_.has_value() != demoting_before || !it->second.error.ok();
  };
  auto fail = [&](const Status& st) {
    FailLocked(v, st);
    return true;
  };
  Status st;
  if (v->phase == CommitPhase::kNone) {
    // Capture is complete: every byte is out of the caller's buffers and on the first tier.
    VersionRecord rec = versions_[version].record;
    rec.state = CKPTDB_STATE_CAPTURED;
    rec.data_bytes = v->data_bytes;
    rec.tensor_count = static_cast<uint32_t>(v->tensors.size());
    rec.chunk_count = static_cast<uint32_t>(v->chunks.size());
    versions_[version].record = rec;
    format::ManifestContents mc;
    mc.job_id = identity_.job_id;
    mc.rank = identity_.rank;
    mc.world_size = identity_.world_size;
    mc.version = version;
    mc.node_id = options_.node_id;
    mc.created_unix_ns = v->created_unix_ns;
    mc.writer = "ckptdb " + std::to_string(CKPTDB_VERSION_MAJOR) + "." +
                std::to_string(CKPTDB_VERSION_MINOR) + "." + std::to_string(CKPTDB_VERSION_PATCH);
    // Deduplicated shards (REFT's ARC) list every piece's xxh3: the held ones from their chunks.
    for (format::TensorEntry& t : v->tensors) {
      if (t.full_bytes == 0) continue;
      t.piece_xxh3.clear();
      for (int64_t source : v->piece_sources.at(t.name)) {
        t.piece_xxh3.push_back(source >= 0 ? v->chunks[static_cast<size_t>(source)].xxh3
                                           : v->hash_pieces[static_cast<size_t>(-1 - source)].xxh3);
      }
    }
    // A version with replicated shards of an "arc" group records the group (docs/format.md),
    // also when every shard is kept whole (two members, small shards): what a member that lost
    // its own copy lays its shards out from, and what holdings advertise.
    if (replica_group_ && replica_group_->arc && !v->replicated_names.empty()) {
      const ReplicaGroup& g = *replica_group_;
      mc.replicas.present = true;
      mc.replicas.group = g.group;
      mc.replicas.members = g.members;
      mc.replicas.position = static_cast<uint32_t>(
          std::find(g.members.begin(), g.members.end(), identity_.rank) - g.members.begin());
      mc.replicas.piece_bytes = options_.chunk_bytes;
      // Without the job's redundancy every member put replicated shards only (put_shard refuses
      // others): a member's lost segment is its group's slices.
      mc.replicas.replicated_only = cluster_->options().replicas <= 1 && !cluster_->options().code;
      arc_versions_[version] = {g.group, g.members, mc.replicas.replicated_only};
    }
    mc.tensors = v->tensors;
    if (cluster_ != nullptr && cluster_->Group()) {
      // The coding group's layout (docs/format.md): what a rebuild and verify read back.
      const CodingGroup& g = *cluster_->Group();
      mc.redundancy.scheme = static_cast<uint8_t>(g.code.scheme == CodeScheme::kXor
                                                      ? fb::RedundancyScheme::Xor
                                                      : fb::RedundancyScheme::ReedSolomon);
      mc.redundancy.group = g.group;
      mc.redundancy.k = g.code.k;
      mc.redundancy.m = g.code.m;
      mc.redundancy.stripe_bytes = g.unit_bytes;
      mc.redundancy.member_ranks = g.members;
      mc.redundancy.position = cluster_->GroupPosition();
    }
    mc.chunks.reserve(v->chunks.size());
    for (const ChunkSlot& c : v->chunks)
      mc.chunks.push_back({c.record_offset, c.payload_bytes, c.xxh3});
    lock.unlock();
    CatalogBatch captured;
    captured.put_versions.push_back(rec);
    st = catalog_->Apply(captured, /*sync=*/false);
    std::vector<uint8_t> manifest = format::BuildManifest(std::move(mc));
    lock.lock();
    if (!st.ok()) return fail(st.WithContext("commit " + V(version)));
    if (manifest.size() > format::kMaxManifestBytes) {
      return fail(Status::Invalid(V(version) + ": the manifest would be " +
                                  std::to_string(manifest.size()) +
                                  " bytes, over the 1 GiB limit"));
    }
    v->manifest_xxh3 = format::Xxh3(manifest.data(), manifest.size());
    v->manifest = std::move(manifest);
    v->tail_bytes = format::RecordBytes(v->manifest.size()) + kBlockBytes;
    for (size_t t = 1; t <= commit_tier_; ++t) {
      if (tiers_[t].Takes(version)) v->demote_to.push_back(t);
    }
    v->phase = CommitPhase::kTail;
  }
  if (v->phase == CommitPhase::kTail && v->ram) {
    // Header (if the arena had no room at open), tail and index regions; the arena may be short
    // of them now: the commit then waits for evictions like a capture (or fails when nothing
    // can free them: DetectStagingDeadlockLocked).
    RamTier& ram = *tiers_[0].ram;
    StagingRing::Region tail{};
    if (v->header_region.bytes == 0) {
      if (!ram.Allocate(kBlockBytes, &v->header_region)) {
        v->arena_waiters[kCommitWaiter] = ram.frees();
        return changed();
      }
      EncodeSegmentHeaderBlock(*v, ram.base() + v->header_region.offset);
    }
    if (!ram.Allocate(v->tail_bytes, &tail)) {
      v->arena_waiters[kCommitWaiter] = ram.frees();
      return changed();
    }
    const uint64_t manifest_offset = v->next_offset;
    RamImage image;
    image.version = version;
    image.file_bytes = manifest_offset + v->tail_bytes;
    image.extents.push_back({0, v->header_region.offset, kBlockBytes});
    for (const ChunkSlot& c : v->chunks) {
      CKPTDB_ASSERT(c.home == Home::kDone);
      image.extents.push_back({c.record_offset, c.region.offset, c.region.bytes});
    }
    image.extents.push_back({manifest_offset, tail.offset, tail.bytes});
    if (!ram.WriteIndex(identity_.job_id, identity_.rank, &image)) {
      FreeArenaLocked(&tail);
      v->arena_waiters[kCommitWaiter] = ram.frees();
      return changed();
    }
    v->arena_waiters.erase(kCommitWaiter);
    // The regions are this version's alone, and its manifest is the manager's: no lock needed
    // for the copy (a manifest may run to megabytes).
    uint8_t* out = ram.base() + tail.offset;
    lock.unlock();
    std::memset(out, 0, tail.bytes);
    format::EncodeSegmentTail(out, v->tail_bytes, v->manifest, v->manifest_xxh3, manifest_offset,
                              version, identity_.rank, static_cast<uint32_t>(v->chunks.size()));
    lock.lock();
    v->image = image;
    ResidencyRecord res;
    res.tier = tiers_[0].name();
    res.state = CKPTDB_RESIDENT_DURABLE;
    res.path = ram.path();
    res.file_bytes = image.file_bytes;
    res.ram_generation = ram.generation();
    res.ram_index_offset = image.index_offset;
    res.ram_index_bytes = image.index_bytes;
    v->residency.push_back(res);
    // Capture wrote the chunk records into the arena; the header and tail complete the copy.
    const uint64_t elapsed = MonoNs() - v->tier0_started_mono_ns;
    v->stats.AddTier(tiers_[0].name(), image.file_bytes, elapsed);
    tiers_[0].bytes_written += image.file_bytes;
    tiers_[0].write_ns += elapsed;
    v->phase = CommitPhase::kDemote;
  } else if (v->phase == CommitPhase::kTail) {
    if (v->tail) return changed();  // the tail write is in flight
    const uint64_t manifest_offset = v->next_offset;
    // As for ram: the manifest is the manager's, and it may run to megabytes.
    lock.unlock();
    void* block = std::aligned_alloc(kBlockBytes, v->tail_bytes);
    if (block != nullptr) {
      std::memset(block, 0, v->tail_bytes);
      format::EncodeSegmentTail(static_cast<uint8_t*>(block), v->tail_bytes, v->manifest,
                                v->manifest_xxh3, manifest_offset, version, identity_.rank,
                                static_cast<uint32_t>(v->chunks.size()));
    }
    lock.lock();
    if (block == nullptr) return fail(Status::NoMemory("allocating the manifest of " + V(version)));
    v->tail.reset(static_cast<uint8_t*>(block));
    io::IoRequest r;
    r.op = io::IoRequest::Op::kWrite;
    r.fd = v->fd;
    r.offset = manifest_offset;
    r.buffer = block;
    r.length = v->tail_bytes;
    v->writes_in_flight++;
    lock.unlock();
    st = SubmitRequest(r, Request{RequestKind::kTail, version, 0, v->tail_bytes});
    lock.lock();
    if (!st.ok()) {
      v->writes_in_flight--;
      return fail(st.WithContext("writing the manifest of " + V(version)));
    }
    return true;  // kTail completes into kSync, kSync into kDemote
  }
  if (v->phase == CommitPhase::kDemote && !v->ram && v->synced && v->fd >= 0) {
    // Chunk durable before manifest is visible: the fsync is done; now the rename.
    int fd = v->fd;
    int buffered = v->buffered_fd;
    v->fd = -1;
    v->buffered_fd = -1;
    Tier& tier = *tiers_[0].dir;
    lock.unlock();
    if (buffered >= 0) (void)io_->Close(buffered);
    st = tier.Publish(version, identity_.rank, fd);
    lock.lock();
    if (!st.ok()) return fail(st.WithContext("publishing " + V(version)));
    ResidencyRecord res;
    res.tier = tiers_[0].name();
    res.state = CKPTDB_RESIDENT_DURABLE;
    res.path = tier.SegmentPath(version, identity_.rank);
    res.file_bytes = v->next_offset + v->tail_bytes;
    v->residency.push_back(res);
    const uint64_t elapsed = MonoNs() - v->tier0_started_mono_ns;
    v->stats.AddTier(tiers_[0].name(), res.file_bytes, elapsed);
    tiers_[0].write_ns += elapsed;
  }
  if (v->phase == CommitPhase::kDemote) {
    if (demotion_) return changed();  // one demotion at a time; a commit's goes next
    if (!v->demote_to.empty()) {
      size_t target = v->demote_to.front();
      v->demote_to.erase(v->demote_to.begin());
      st = StartDemotion(lock, version, 0, target, /*for_commit=*/true);
      if (!st.ok()) return fail(st);
      return true;
    }
    v->phase = CommitPhase::kDecide;
  }
  if (v->phase == CommitPhase::kDecide && cluster_ == nullptr) {
    st = DecideCommit(lock, v);
    if (!st.ok() && live_.count(version)) FailLocked(&live_.at(version), st);
    return true;
  }
  if (v->phase == CommitPhase::kDecide) {
    // world_size > 1: the rank's redundancy must be safe too before it may vote (GEMINI's
    // replicas in peers' memory), pushed by the cluster worker straight from the arena.
    if (!v->ram)
      return fail(Status::NotSupported(V(version) + ": world_size > 1 needs a ram first tier"));
    std::vector<SendExtent> extents;
    for (const RamExtent& e : v->image.extents) {
      extents.push_back({e.logical_offset, tiers_[0].ram->base() + e.arena_offset, e.bytes});
    }
    const uint64_t file_bytes = v->image.file_bytes;
    v->replicating = true;
    v->phase = CommitPhase::kReplicate;
    const uint64_t generation = v->generation;
    // A declared replica group compares its replicated shards before anything is protected:
    // each one's digest is the xxh3 of its chunks' xxh3s (computed while they were captured).
    std::optional<ReplicaGroup> group = replica_group_;
    std::vector<Cluster::ReplicaDigest> digests;
    if (group) {
      for (const format::TensorEntry& t : v->tensors) {
        if (!v->replicated_names.count(t.name)) continue;
        // A deduplicated shard's pieces are its chunks had it been kept whole.
        const bool dedup = t.full_bytes != 0;
        const size_t count = dedup ? t.piece_xxh3.size() : t.chunk_count;
        std::vector<uint8_t> hashes(size_t{8} * count);
        for (size_t c = 0; c < count; ++c) {
          format::le::Put<uint64_t>(hashes.data(), size_t{8} * c,
                                    dedup ? t.piece_xxh3[c] : v->chunks[t.first_chunk + c].xxh3);
        }
        digests.push_back(
            {t.name, dedup ? t.full_bytes : t.bytes, format::Xxh3(hashes.data(), hashes.size())});
      }
      std::sort(digests.begin(), digests.end(),
                [](const auto& a, const auto& b) { return a.name < b.name; });
    }
    const uint64_t chunk_bytes = options_.chunk_bytes;
    PostClusterJob([this, version, generation, file_bytes, extents, group, digests, chunk_bytes] {
      Status rs = group ? cluster_->CheckReplicas(version, group->group, group->members, group->arc,
                                                  chunk_bytes, digests)
                        : Status::Ok();
      if (rs.ok() && group) {
        // The job may have given the version up while the group compared: protect nothing then.
        std::lock_guard<std::mutex> guard(mu_);
        auto it = live_.find(version);
        if (it == live_.end() || it->second.generation != generation ||
            it->second.abort_requested || !it->second.error.ok() || it->second.decision < 0) {
          rs = Status::State(V(version) + " was given up while its replica group compared" +
                             (it != live_.end() && !it->second.abort_why.empty()
                                  ? ": " + it->second.abort_why
                                  : ""));
        }
      }
      if (rs.ok()) rs = cluster_->Protect(version, file_bytes, extents);
      std::lock_guard<std::mutex> guard(mu_);
      auto it = live_.find(version);
      if (it == live_.end() || it->second.generation != generation) return;
      it->second.replicating = false;
      it->second.replicated = rs.ok() ? 1 : -1;
      it->second.replicate_error = rs;
      WakeManager();
    });
    return true;
  }
  if (v->phase == CommitPhase::kReplicate) {
    if (v->replicated == 0) return false;
    if (v->replicated < 0) return fail(v->replicate_error);
    VersionRecord rec;
    st = WritePrepared(lock, v, &rec);
    if (!live_.count(version)) return true;
    if (!st.ok()) return fail(st);
    v->phase = CommitPhase::kVoting;
    PostClusterJob([this, version] {
      {
        std::lock_guard<std::mutex> guard(mu_);
        auto it = live_.find(version);
        // Given up since (a newer commit, a failure): FinishAbort votes no instead.
        if (it == live_.end() || it->second.abort_requested) return;
        it->second.vote_sent = true;
        newest_vote_sent_ = std::max(newest_vote_sent_, version);
      }
      Status vs = cluster_->Vote(version);
      if (vs.ok()) {
        CrashPoint("commit:after_vote");
        return;
      }
      std::lock_guard<std::mutex> guard(mu_);
      auto it = live_.find(version);
      if (it == live_.end()) return;
      if (vs.code() == CKPTDB_ESTATE) {
        it->second.decision = -1;  // refused (fenced, or already aborted): it cannot commit
        if (it->second.abort_why.empty()) it->second.abort_why = vs.message();
      } else if (it->second.decision == 0) {
        // The vote may or may not have arrived (the coordinator may have committed and died):
        // the version stays PREPARED with its copies, in doubt, until an open asks the
        // coordinator. Nothing here may abort it.
        RememberOutcome(version,
                        vs.WithContext(V(version) + " is PREPARED and in doubt; reopen to learn "
                                                    "the coordinator's decision"),
                        /*may_put_again=*/false);
        if (it->second.ram) it->second.image = RamImage{};
        live_.erase(it);
        state_cv_.notify_all();
      }
      WakeManager();
    });
    return true;
  }
  if (v->phase == CommitPhase::kVoting) {
    if (v->decision == 0) return false;
    if (v->decision < 0) {
      return fail(
          Status::State(V(version) + " was aborted by the coordinator" +
                        (v->abort_why.empty() ? " (a rank failed, was fenced, or did not vote)"
                                              : ": " + v->abort_why)));
    }
    VersionRecord rec = versions_[version].record;
    rec.state = CKPTDB_STATE_PREPARED;
    rec.manifest_xxh3 = v->manifest_xxh3;
    st = WriteCommitted(lock, v, rec);
    if (!st.ok() && live_.count(version)) FailLocked(&live_.at(version), st);
    return true;
  }
  return changed();
}

// PREPARED, then COMMITTED, each synced (docs/commit-protocol.md steps 6-7). On success the
// live version becomes a committed catalog entry.
Status Db::DecideCommit(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  VersionRecord rec;
  CKPTDB_RETURN_IF_ERROR(WritePrepared(lock, v, &rec));
  // world_size = 1: this rank is its own coordinator and every vote (its own) is in.
  return WriteCommitted(lock, v, rec);
}

Status Db::WritePrepared(std::unique_lock<std::mutex>& lock, LiveVersion* v, VersionRecord* out) {
  const uint64_t version = v->version;
  VersionRecord rec = versions_[version].record;  // sizes set when the capture completed
  rec.state = CKPTDB_STATE_PREPARED;
  rec.manifest_xxh3 = v->manifest_xxh3;
  CatalogBatch prepared;
  prepared.put_versions.push_back(rec);
  for (const ResidencyRecord& r : v->residency) prepared.put_residency.emplace_back(version, r);
  lock.unlock();
  Status st = catalog_->Apply(prepared, /*sync=*/true);
  lock.lock();
  if (!st.ok()) return st.WithContext("commit " + V(version) + ": writing PREPARED");
  CrashPoint("commit:after_prepared");
  *out = rec;
  return Status::Ok();
}

Status Db::WriteCommitted(std::unique_lock<std::mutex>& lock, LiveVersion* v, VersionRecord rec) {
  const uint64_t version = v->version;
  rec.state = CKPTDB_STATE_COMMITTED;
  rec.committed_unix_ns = NowNs();
  v->stats.commit_ns = MonoNs() - v->commit_requested_mono_ns;
  CatalogBatch committed;
  committed.put_versions.push_back(rec);
  committed.put_stats.emplace_back(version, v->stats);
  lock.unlock();
  CrashPoint("commit:before_committed");
  Status st = catalog_->Apply(committed, /*sync=*/true);
  Status witnessed;
  if (st.ok()) {
    CrashPoint("commit:before_witness");
    witnessed = WriteWitness(rec);
  }
  lock.lock();
  if (!witnessed.ok()) {
    witness_errors_[version] = witnessed;
    while (witness_errors_.size() > kMaxOutcomes) witness_errors_.erase(witness_errors_.begin());
  }
  if (!st.ok()) {
    // The decision may or may not be durable; the next open decides from the catalog. Until
    // then this handle must not claim either outcome: the copies stay as they are.
    poisoned_ = st.WithContext("commit " + V(version) +
                               ": writing COMMITTED failed; close and reopen the store to "
                               "learn the outcome");
    RememberOutcome(version, poisoned_, /*may_put_again=*/false);
    if (v->ram) {
      v->image = RamImage{};  // its regions stay allocated: they may belong to a committed copy
    }
    live_.erase(version);
    state_cv_.notify_all();
    return Status::Ok();
  }
  CrashPoint("commit:after_committed");
  VersionEntry& e = versions_[version];
  e.has_record = true;
  e.record = rec;
  e.residency = v->residency;
  e.has_stats = true;
  e.stats = v->stats;
  if (v->ram) ram_images_[version] = v->image;
  ram_reserve_bytes_ = v->next_offset + v->tail_bytes;
  stats_.commits++;
  live_.erase(version);
  // Older open versions can never commit now (versions increase).
  for (auto& [older, ov] : live_) {
    if (older < version && !ov.abort_requested) {
      FailLocked(&ov, Status::State(V(older) + " was aborted: " + V(version) +
                                    " was committed after it, and versions increase"));
    }
  }
  state_cv_.notify_all();
  return Status::Ok();
}

// ---- Abort -------------------------------------------------------------------------------------

void Db::FinishAbort(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  const uint64_t version = v->version;
  // In a job, a version this rank never voted for cannot commit: the coordinator hears so now,
  // not when this rank is declared dead, so the ranks that voted stop waiting. Not when the
  // coordinator's abort is why (it knows), nor once the yes left (the decision is its).
  const bool vote_no = cluster_ != nullptr && !v->vote_sent && v->decision == 0;
  // Memory first: ring regions of chunks never written, and the version's arena regions.
  for (ChunkSlot& c : v->chunks) FreeChunkRegionLocked(v, &c);
  if (v->ram) {
    FreeArenaLocked(&v->header_region);
    if (!v->image.extents.empty()) {
      // The tail and the index; the chunk and header regions were freed above.
      StagingRing::Region tail{v->image.extents.back().arena_offset, v->image.extents.back().bytes};
      StagingRing::Region index{v->image.index_offset, v->image.index_bytes};
      FreeArenaLocked(&tail);
      FreeArenaLocked(&index);
    }
  }
  int fd = v->fd;
  int buffered = v->buffered_fd;
  v->fd = v->buffered_fd = -1;
  std::vector<ResidencyRecord> copies = v->residency;
  Status why = v->error.ok() ? Status::State(V(version) + " was aborted") : v->error;
  VersionRecord rec = versions_[version].record;
  rec.version = version;
  rec.rank = identity_.rank;
  rec.state = CKPTDB_STATE_ABORTED;
  lock.unlock();
  if (fd >= 0) (void)io_->Close(fd);
  if (buffered >= 0) (void)io_->Close(buffered);
  Status st;
  if (!tiers_[0].is_ram()) st = tiers_[0].dir->RemoveSegment(version, identity_.rank);
  for (const ResidencyRecord& r : copies) {
    int t = TierIndex(r.tier);
    if (t > 0 && !tiers_[t].is_ram()) {
      Status rs = tiers_[t].dir->RemoveSegment(version, identity_.rank);
      if (st.ok()) st = rs;
    }
  }
  CatalogBatch batch;
  batch.delete_versions.push_back(version);
  batch.put_versions.push_back(rec);
  // Not synced: an abort that is lost reads as undecided, which recovery aborts again.
  Status cs = catalog_->Apply(batch, /*sync=*/false);
  lock.lock();
  if (!st.ok() || !cs.ok()) {
    std::fprintf(stderr, "ckptdb: aborting %s: %s\n", V(version).c_str(),
                 (!st.ok() ? st : cs).ToString().c_str());
  }
  VersionEntry& e = versions_[version];
  e = VersionEntry{};
  e.has_record = true;
  e.record = rec;
  // In a job the coordinator aborts it for every rank (below): it stays aborted.
  if (outcomes_.count(version) == 0) {
    RememberOutcome(version, why, /*may_put_again=*/cluster_ == nullptr);
  }
  stats_.aborts++;
  live_.erase(version);
  if (vote_no) {
    PostClusterJob([this, version, why] {
      Status st = cluster_->VoteAbort(version, why.message());
      if (!st.ok() && st.code() != CKPTDB_EPEER) {
        std::fprintf(stderr, "ckptdb: %s\n", st.ToString().c_str());
      }
    });
  }
  state_cv_.notify_all();
}

// ---- Demotion ----------------------------------------------------------------------------------

bool Db::PlanDemotion(std::unique_lock<std::mutex>& lock) {
  for (const auto& [version, e] : versions_) {
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    for (size_t target = 1; target < tiers_.size(); ++target) {
      if (tiers_[target].is_ram() || Durable(e, target) || !Wants(target, version)) continue;
      auto failed = failed_sources_.find({version, target});
      for (size_t source = 0; source < tiers_.size(); ++source) {
        if (source == target || !Durable(e, source)) continue;
        if (failed != failed_sources_.end() && failed->second.count(source)) continue;
        Status st = StartDemotion(lock, version, source, target, /*for_commit=*/false);
        if (st.ok()) return true;
        failed_sources_[{version, target}].insert(source);
        demotion_errors_[{version, target}] = st;
        tiers_[target].demotion_failures++;
        std::fprintf(stderr, "ckptdb: %s\n", st.ToString().c_str());
        state_cv_.notify_all();  // wait_commit on that tier has its answer
        return true;             // state changed; plan again next round
      }
    }
  }
  return false;
}

// The records a demotion copies, in file order: the header block and the tail encoded again
// from the source's checked header, footer and manifest (what is written is what was verified),
// and each chunk record between them. Called without mu_ (a manifest may run to megabytes): the
// demotion is the manager's.
Status Db::PlanDemotionRecords(Demotion* d, const std::string& what) {
  const format::SegmentReader& reader = *d->segment.reader;
  const format::ManifestView& m = reader.manifest();
  const format::SegmentFooter& footer = reader.footer();
  const bool through_ring = !tiers_[d->source].is_ram();
  d->file_bytes = footer.file_bytes;
  const uint64_t tail_bytes = d->file_bytes - footer.manifest_offset;
  d->head.reset(static_cast<uint8_t*>(std::aligned_alloc(kBlockBytes, kBlockBytes)));
  d->tail.reset(static_cast<uint8_t*>(std::aligned_alloc(kBlockBytes, tail_bytes)));
  if (!d->head || !d->tail) {
    return Status::NoMemory(what + ": allocating " + std::to_string(tail_bytes) +
                            " bytes for its manifest");
  }
  std::memset(d->head.get(), 0, kBlockBytes);
  format::EncodeSegmentHeader(reader.header(), std::span<uint8_t, 64>(d->head.get(), 64));
  std::memset(d->tail.get(), 0, tail_bytes);
  format::EncodeSegmentTail(d->tail.get(), tail_bytes, reader.manifest_bytes(),
                            footer.manifest_xxh3, footer.manifest_offset, footer.version,
                            footer.rank, footer.chunk_count);
  d->records.reserve(m.chunk_count() + 2);
  d->records.push_back({0, kBlockBytes, -1});
  d->records.back().encoded = d->head.get();
  for (uint32_t c = 0; c < m.chunk_count(); ++c) {
    const uint64_t bytes = format::RecordBytes(m.chunk(c).payload_bytes());
    if (through_ring && bytes > ring_->capacity()) {
      return Status::Invalid(what + ": chunk " + std::to_string(c) + "'s record of " +
                             std::to_string(bytes) + " bytes does not fit the staging ring of " +
                             std::to_string(ring_->capacity()) +
                             " bytes it is read through; raise staging_bytes");
    }
    d->records.push_back({m.chunk(c).record_offset(), bytes, static_cast<int64_t>(c)});
  }
  d->records.push_back({footer.manifest_offset, tail_bytes, -1});
  d->records.back().encoded = d->tail.get();
  return Status::Ok();
}

Status Db::StartDemotion(std::unique_lock<std::mutex>& lock, uint64_t version, size_t source,
                         size_t target, bool for_commit) {
  CKPTDB_ASSERT(!demotion_ && !tiers_[target].is_ram());
  const std::string what = "demoting " + V(version) + " from tier " + tiers_[source].name() +
                           " to tier " + tiers_[target].name();
  // The source copy: a committed one from the catalog, or the commit's own first-tier copy.
  ResidencyRecord res;
  VersionRecord record;
  RamImage image;
  if (for_commit) {
    LiveVersion& v = live_.at(version);
    CKPTDB_ASSERT(!v.residency.empty());
    res = v.residency.front();
    record.manifest_xxh3 = v.manifest_xxh3;
    if (v.ram) image = v.image;
  } else {
    const VersionEntry& e = versions_.at(version);
    for (const ResidencyRecord& r : e.residency) {
      if (r.tier == tiers_[source].name()) res = r;
    }
    record = e.record;
    if (tiers_[source].is_ram()) image = ram_images_.at(version);
  }
  demotion_.emplace();
  Demotion& d = *demotion_;
  d.version = version;
  d.source = source;
  d.target = target;
  d.for_commit = for_commit;
  d.started_mono_ns = MonoNs();
  if (tiers_[source].is_ram()) ram_pins_[version]++;
  lock.unlock();
  Status st = OpenSegmentAt(version, source, res, record, std::move(image), &d.segment,
                            metadata_queue_.get());
  int fd = -1;
  bool direct = false;
  if (st.ok()) st = PlanDemotionRecords(&d, what);
  if (st.ok()) {
    st = tiers_[target].dir->CreateTemp(version, identity_.rank, &fd);
    direct = tiers_[target].dir->direct();
  }
  Status cs;
  if (st.ok() && !for_commit) {
    CatalogBatch batch;
    ResidencyRecord writing;
    writing.tier = tiers_[target].name();
    writing.state = CKPTDB_RESIDENT_WRITING;
    writing.path = tiers_[target].dir->TempPath(version, identity_.rank);
    batch.put_residency.emplace_back(version, writing);
    cs = catalog_->Apply(batch, /*sync=*/false);  // lost in a crash: the tmp file is an orphan
  }
  lock.lock();
  if (st.ok() && !cs.ok()) st = cs;
  if (!st.ok()) {
    const int source_fd = d.segment.fd;
    if (tiers_[source].is_ram()) Unpin(version);
    demotion_.reset();
    lock.unlock();
    if (fd >= 0) {
      (void)io_->Close(fd);
      (void)tiers_[target].dir->RemoveSegment(version, identity_.rank);
    }
    if (source_fd >= 0) (void)io_->Close(source_fd);
    lock.lock();
    return st.WithContext(what);
  }
  d.fd = fd;
  d.direct = direct;
  if (!for_commit) {
    for (ResidencyRecord& r : versions_.at(version).residency) {
      if (r.tier == tiers_[target].name()) r.state = CKPTDB_RESIDENT_WRITING;
    }
  }
  return Status::Ok();
}

// Record i of a demotion, at `p` (a ring region, the arena, or the re-encoded header block or
// tail): a chunk record is checked against the manifest and its xxh3 before it is written to the
// target, so a copy never carries damage to a slower tier. Called without mu_: the manager alone
// touches the demotion's records, fd and reader while it runs.
Status Db::CheckAndWriteDemoted(const Demotion& d, size_t i, uint8_t* p, int buffer_index) {
  const Demotion::Record& rec = d.records[i];
  if (rec.chunk >= 0) {
    format::ChunkProblem problem;
    CKPTDB_RETURN_IF_ERROR(
        d.segment.reader->CheckRecord(static_cast<uint32_t>(rec.chunk), p, &problem));
  }
  io::IoRequest w;
  w.op = io::IoRequest::Op::kWrite;
  w.fd = d.fd;
  w.offset = rec.offset;
  w.buffer = p;
  w.length = rec.bytes;
  w.buffer_index = buffer_index;
  return SubmitRequest(
      w, Request{RequestKind::kDemoteWrite, d.version, static_cast<uint32_t>(i), rec.bytes});
}

// Starts the next records of the demotion: from ram, each record is checked in place and written
// from the arena; from a directory tier it is read into a ring region first, checked, then
// written from there.
void Db::PumpDemotion(std::unique_lock<std::mutex>& lock) {
  Demotion& d = *demotion_;
  const bool abandon = closing_ && !options_.drain_on_close && !d.for_commit;
  if (!d.error.ok() || abandon) {
    if (d.in_flight == 0) {
      EndDemotion(lock, abandon && d.error.ok()
                            ? Status::State("the store was closed before the demotion ended")
                            : d.error);
    }
    return;
  }
  const bool ram_source = tiers_[d.source].is_ram();
  auto what = [&] { return "demoting " + V(d.version) + " to tier " + tiers_[d.target].name(); };
  // Records read from a directory tier whose read completed: check and write them. Records
  // before d.unwritten are all written; at most the records in flight lie between it and next.
  while (d.unwritten < d.next && d.records[d.unwritten].written) d.unwritten++;
  for (size_t i = d.unwritten; !ram_source && i < d.next && d.error.ok(); ++i) {
    Demotion::Record& rec = d.records[i];
    if (!rec.read_done || rec.written) continue;
    if (FreeRequestSlots(requests_.size(), options_.queue_depth) == 0) return;
    rec.written = true;
    uint8_t* p = staging_ + rec.ring.offset;
    lock.unlock();
    Status st = CheckAndWriteDemoted(d, i, p, fixed_buffers_ ? 0 : -1);
    lock.lock();
    if (st.ok()) {
      d.in_flight++;
    } else {
      d.error = st.WithContext(what());
      FreeRingLocked(&rec.ring);
    }
  }
  while (d.error.ok() && d.next < d.records.size() && d.in_flight < kDemotionRecordsInFlight &&
         FreeRequestSlots(requests_.size(), options_.queue_depth) > 0) {
    const size_t i = d.next;
    Demotion::Record& rec = d.records[i];
    if (rec.encoded != nullptr) {
      d.next++;
      rec.written = true;
      lock.unlock();
      Status st = CheckAndWriteDemoted(d, i, const_cast<uint8_t*>(rec.encoded), -1);
      lock.lock();
      if (!st.ok()) {
        d.error = st.WithContext(what());
        break;
      }
      d.in_flight++;
    } else if (ram_source) {
      const RamExtent* extent = tiers_[d.source].ram->ExtentAt(d.segment.image, rec.offset);
      if (extent == nullptr || extent->bytes != rec.bytes) {
        d.error = Status::Corrupt(what() + ": the ram copy has no record at offset " +
                                  std::to_string(rec.offset));
        break;
      }
      uint8_t* p = tiers_[d.source].ram->base() + extent->arena_offset;
      const int buffer_index =
          fixed_arena_base_ >= 0
              ? fixed_arena_base_ + static_cast<int>(extent->arena_offset / kMaxFixedBufferBytes)
              : -1;
      const bool one_buffer = extent->arena_offset / kMaxFixedBufferBytes ==
                              (extent->arena_offset + extent->bytes - 1) / kMaxFixedBufferBytes;
      d.next++;
      lock.unlock();
      Status st = CheckAndWriteDemoted(d, i, p, one_buffer ? buffer_index : -1);
      lock.lock();
      if (!st.ok()) {
        d.error = st.WithContext(what());
        break;
      }
      tiers_[d.source].bytes_read += rec.bytes;
      d.in_flight++;
    } else {
      if (!ring_->Allocate(rec.bytes, &rec.ring)) break;  // wait for ring space
      d.next++;
      io::IoRequest r;
      r.op = io::IoRequest::Op::kRead;
      r.fd = d.segment.fd;
      r.offset = rec.offset;
      r.buffer = staging_ + rec.ring.offset;
      r.length = rec.bytes;
      r.buffer_index = fixed_buffers_ ? 0 : -1;
      const uint64_t version = d.version;
      lock.unlock();
      Status st = SubmitRequest(
          r, Request{RequestKind::kDemoteRead, version, static_cast<uint32_t>(i), rec.bytes});
      lock.lock();
      if (!st.ok()) {
        FreeRingLocked(&rec.ring);
        d.error = st.WithContext(what());
        break;
      }
      d.in_flight++;
    }
  }
  if (!d.error.ok()) {
    // A failure with nothing left in flight ends the demotion now: no completion will come to
    // wake the manager for it.
    if (d.in_flight == 0) EndDemotion(lock, d.error);
    return;
  }
  bool all_written =
      d.next == d.records.size() && d.in_flight == 0 &&
      std::all_of(d.records.begin(), d.records.end(),
                  [&](const Demotion::Record& r) { return ram_source || r.written; });
  if (all_written && !d.syncing) {
    d.syncing = true;
    io::IoRequest s;
    s.op = io::IoRequest::Op::kSync;
    s.fd = d.fd;
    const uint64_t version = d.version;
    lock.unlock();
    Status st = SubmitRequest(s, Request{RequestKind::kDemoteSync, version});
    lock.lock();
    if (!st.ok()) {
      d.error = st.WithContext(what());
      return;
    }
    d.in_flight++;
  } else if (d.syncing && d.synced && d.in_flight == 0) {
    EndDemotion(lock, Status::Ok());
  }
}

void Db::EndDemotion(std::unique_lock<std::mutex>& lock, const Status& result) {
  Demotion d = std::move(*demotion_);
  demotion_.reset();
  // Records read and never written (the demotion failed or was abandoned) give back their ring
  // regions.
  for (Demotion::Record& rec : d.records) FreeRingLocked(&rec.ring);
  const uint64_t version = d.version;
  Status st = result;
  int source_fd = d.segment.fd;
  Tier& target = *tiers_[d.target].dir;
  lock.unlock();
  if (source_fd >= 0) (void)io_->Close(source_fd);
  if (st.ok()) {
    CrashPoint("demote:after_fsync");
    int fd = d.fd;
    d.fd = -1;
    st = target.Publish(version, identity_.rank, fd);
  }
  if (d.fd >= 0) (void)io_->Close(d.fd);
  lock.lock();
  if (tiers_[d.source].is_ram()) Unpin(version);
  ResidencyRecord res;
  res.tier = tiers_[d.target].name();
  res.state = CKPTDB_RESIDENT_DURABLE;
  res.path = target.SegmentPath(version, identity_.rank);
  res.file_bytes = d.file_bytes;
  const uint64_t elapsed = MonoNs() - d.started_mono_ns;
  if (d.for_commit) {
    auto it = live_.find(version);
    if (it != live_.end()) {
      LiveVersion& v = it->second;
      if (st.ok()) {
        v.residency.push_back(res);
        v.stats.AddTier(res.tier, d.file_bytes, elapsed);
        tiers_[d.target].demotions++;
        tiers_[d.target].write_ns += elapsed;
      } else {
        lock.unlock();
        (void)target.RemoveSegment(version, identity_.rank);
        lock.lock();
        FailLocked(&v, st);
      }
    }
    state_cv_.notify_all();
    return;
  }
  if (st.ok()) {
    CatalogBatch batch;
    batch.put_residency.emplace_back(version, res);
    lock.unlock();
    st = catalog_->Apply(batch, /*sync=*/true);
    lock.lock();
  }
  VersionEntry& e = versions_.at(version);
  if (st.ok()) {
    bool found = false;
    for (ResidencyRecord& r : e.residency) {
      if (r.tier == res.tier) {
        r = res;
        found = true;
      }
    }
    if (!found) e.residency.push_back(res);
    tiers_[d.target].demotions++;
    tiers_[d.target].write_ns += elapsed;
    if (e.has_stats) {
      e.stats.AddTier(res.tier, d.file_bytes, elapsed);
      stats_dirty_.insert(version);
    }
  } else {
    // The catalog may say WRITING for it: recovery (or the next attempt) collects the file.
    lock.unlock();
    (void)target.RemoveSegment(version, identity_.rank);
    CatalogBatch batch;
    batch.delete_residency.emplace_back(version, res.tier);
    (void)catalog_->Apply(batch, /*sync=*/false);
    lock.lock();
    std::erase_if(e.residency, [&](const ResidencyRecord& r) { return r.tier == res.tier; });
    if (!(closing_ && !options_.drain_on_close)) {
      failed_sources_[{version, d.target}].insert(d.source);
      demotion_errors_[{version, d.target}] = st;
      tiers_[d.target].demotion_failures++;
      std::fprintf(stderr, "ckptdb: %s\n", st.ToString().c_str());
    }
  }
  state_cv_.notify_all();
}

// ---- Eviction and retention --------------------------------------------------------------------

bool Db::EvictLocked(std::unique_lock<std::mutex>& lock) {
  // One eviction per call, oldest first: copies the policy no longer wants, then (ram) copies
  // that must make room for the next version.
  std::optional<std::pair<uint64_t, size_t>> pick;
  for (const auto& [version, e] : versions_) {
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    for (size_t t = 0; t < tiers_.size() && !pick; ++t) {
      if (Evictable(t, version, /*for_space=*/false)) pick = {version, t};
    }
    if (pick) break;
  }
  if (!pick && tiers_[0].is_ram()) {
    RamTier& ram = *tiers_[0].ram;
    bool short_of_space = ram.free_bytes() < ram_reserve_bytes_;
    for (const auto& [version, v] : live_) short_of_space |= !v.arena_waiters.empty();
    if (short_of_space) {
      for (const auto& [version, e] : versions_) {
        if (Evictable(0, version, /*for_space=*/true)) {
          pick = {version, 0};
          break;
        }
      }
    }
  }
  if (!pick) return false;
  const auto [version, t] = *pick;
  VersionEntry& e = versions_.at(version);
  ResidencyRecord res;
  for (const ResidencyRecord& r : e.residency) {
    if (r.tier == tiers_[t].name()) res = r;
  }
  res.state = CKPTDB_RESIDENT_EVICTED;
  CatalogBatch batch;
  batch.put_residency.emplace_back(version, res);
  // Marked now, under the lock: no reader pins the copy while the record is written.
  auto mark = [&](int state) {
    for (ResidencyRecord& r : versions_.at(version).residency) {
      if (r.tier == res.tier) r.state = state;
    }
  };
  mark(CKPTDB_RESIDENT_EVICTED);
  // The record first, synced, then the copy goes (the arena regions are reused, the file is
  // deleted): after a crash between the two the copy is an orphan that recovery collects, never
  // a copy the catalog lists that is half overwritten or gone.
  lock.unlock();
  Status st = catalog_->Apply(batch, /*sync=*/true);
  CrashPoint("evict:after_record");
  lock.lock();
  if (st.ok() && tiers_[t].is_ram()) {
    // Readers pin only copies they find durable, under the lock: none can have pinned it since
    // it was marked evicted above, and Evictable refused it if one had before.
    CKPTDB_ASSERT(ram_pins_.count(version) == 0);
    auto image = ram_images_.find(version);
    if (image != ram_images_.end()) {
      tiers_[0].ram->FreeImage(image->second);
      ram_images_.erase(image);
      SpaceFreedLocked();
    }
  } else if (st.ok()) {
    Tier& tier = *tiers_[t].dir;
    lock.unlock();
    Status removed = tier.RemoveSegment(version, identity_.rank);
    lock.lock();
    if (!removed.ok()) {
      std::fprintf(stderr, "ckptdb: evicting %s from tier %s: %s (the next open collects it)\n",
                   V(version).c_str(), tiers_[t].name().c_str(), removed.ToString().c_str());
    }
  }
  if (!st.ok()) {
    mark(CKPTDB_RESIDENT_DURABLE);
    std::fprintf(stderr, "ckptdb: evicting %s from tier %s: %s\n", V(version).c_str(),
                 tiers_[t].name().c_str(), st.ToString().c_str());
    return false;
  }
  tiers_[t].evictions++;
  RetireLocked(lock);
  state_cv_.notify_all();
  return true;
}

// A committed version left with no copy (durable or missing) becomes RETIRED, and the history
// of retired and aborted records is kept to its bound.
void Db::RetireLocked(std::unique_lock<std::mutex>& lock) {
  CatalogBatch batch;
  std::optional<uint64_t> newest = NewestCommitted();
  size_t history = 0;
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    VersionEntry& e = it->second;
    if (e.record.state == CKPTDB_STATE_COMMITTED && it->first != newest) {
      bool any = std::any_of(e.residency.begin(), e.residency.end(), [](const ResidencyRecord& r) {
        return r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_MISSING ||
               r.state == CKPTDB_RESIDENT_WRITING;
      });
      if (!any) {
        e.record.state = CKPTDB_STATE_RETIRED;
        batch.put_versions.push_back(e.record);
      }
    }
    if (e.record.state == CKPTDB_STATE_RETIRED || e.record.state == CKPTDB_STATE_ABORTED) {
      if (++history > kMaxHistoryRecords && live_.count(it->first) == 0) {
        batch.delete_versions.push_back(it->first);
      }
    }
  }
  // The newest retired version stays as the floor for "versions must increase".
  if (std::optional<uint64_t> floor = LastCommitted(); floor) {
    std::erase(batch.delete_versions, *floor);
  }
  for (uint64_t v : batch.delete_versions) versions_.erase(v);
  if (batch.put_versions.empty() && batch.delete_versions.empty()) return;
  lock.unlock();
  // A retired version's witness goes first: a witness always means "committed in the catalog"
  // (a crash in between leaves a committed record without its witness, which is allowed).
  // A version whose witness could not be removed stays COMMITTED (retired again later): a
  // witness left behind a RETIRED record, once the history bound deletes the record, would
  // make every later open refuse the catalog.
  std::vector<uint64_t> kept;
  for (const VersionRecord& r : batch.put_versions) {
    if (r.state != CKPTDB_STATE_RETIRED) continue;
    Status ws = WitnessDir(io_, options_.root).Remove(r.version, identity_.rank);
    if (!ws.ok()) {
      std::fprintf(stderr,
                   "ckptdb: retiring %s: removing its commit witness: %s; it stays "
                   "committed for now\n",
                   V(r.version).c_str(), ws.ToString().c_str());
      kept.push_back(r.version);
    }
  }
  std::erase_if(batch.put_versions, [&](const VersionRecord& r) {
    return std::find(kept.begin(), kept.end(), r.version) != kept.end();
  });
  std::erase_if(batch.delete_versions,
                [&](uint64_t v) { return std::find(kept.begin(), kept.end(), v) != kept.end(); });
  Status st = catalog_->Apply(batch, /*sync=*/false);
  lock.lock();
  for (uint64_t v : kept) {
    if (auto it = versions_.find(v); it != versions_.end()) {
      it->second.record.state = CKPTDB_STATE_COMMITTED;
    }
  }
  if (!st.ok()) std::fprintf(stderr, "ckptdb: retiring versions: %s\n", st.ToString().c_str());
}

// Captures (and ram commits) waiting for arena space that nothing will ever free fail with
// ENOSPC instead of waiting forever. Space can come from: a demotion running or possible (it
// makes a version evictable), an evictable version, a reader's pin ending, another live version
// being aborted or committed (its regions, or the newest-committed rule moving on).
void Db::DetectStagingDeadlockLocked() {
  if (!tiers_[0].is_ram()) return;
  const uint64_t frees = tiers_[0].ram->frees();
  bool waiting = false;
  for (const auto& [version, v] : live_) {
    for (const auto& [chunk, seen] : v.arena_waiters) {
      if (seen != frees) return;  // a waiter has not tried since the last free: it may fit now
      waiting = true;
    }
  }
  if (!waiting) return;
  if (demotion_ || !ram_pins_.empty()) return;
  for (const auto& [version, v] : live_) {
    if (v.arena_waiters.empty() && (v.abort_requested || v.commit_requested)) return;
  }
  for (const auto& [version, e] : versions_) {
    if (Evictable(0, version, /*for_space=*/true)) return;
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    for (size_t t = 1; t < tiers_.size(); ++t) {
      if (!Durable(e, t) && Wants(t, version) && HasSource(version, t)) return;  // demotable
    }
  }
  RamTier& ram = *tiers_[0].ram;
  std::string held;
  for (const auto& [version, image] : ram_images_) {
    held += (held.empty() ? "" : ", ") + V(version) + " (" + std::to_string(image.file_bytes) +
            " bytes" +
            (version == NewestCommitted() ? ", the newest committed: never evicted" : "") + ")";
  }
  for (auto& [version, v] : live_) {
    if (v.arena_waiters.empty()) continue;
    FailLocked(
        &v, Status::NoSpace("ram tier: the arena of " + std::to_string(ram.capacity()) +
                            " bytes has no room left for " + V(version) + " (" +
                            std::to_string(ram.live_bytes()) +
                            " bytes in use; committed copies: " + (held.empty() ? "none" : held) +
                            ") and nothing can free any: give the ram tier more bytes, lower "
                            "chunk_bytes, or use backpressure=skip"));
  }
}

}  // namespace ckpt::engine
