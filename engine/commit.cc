// The tier manager's commits and aborts (manager.cc's steps 3 and 4; docs/commit-protocol.md):
// the tail of a version's segment (manifest record and footer), fsync and rename, the demotions a
// slower commit tier needs, the job's vote and decision, then PREPARED and COMMITTED, each synced;
// and finishing an abort. Runs on the manager's thread, mu_ dropped around file and catalog work.
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

namespace ckpt::engine {
using format::kBlockBytes;
using redundancy::CodeScheme;

// ---- Commit ------------------------------------------------------------------------------------

// Advances v's commit as far as it can go now (docs/commit-protocol.md), a method per phase, each
// going on to the next in the same round until one waits or the version leaves the manager's
// hands. Returns whether anything changed.
bool Db::RunCommit(std::unique_lock<std::mutex>& lock, LiveVersion* v) {
  const uint64_t version = v->version;
  const CommitRound round{v->phase, v->residency.size(), demotion_.has_value()};
  Status st;
  if (v->phase == CommitPhase::kNone) {
    if (std::optional<bool> done = CommitManifest(lock, v, round)) return *done;
  }
  if (v->phase == CommitPhase::kTail) {
    std::optional<bool> done =
        v->ram ? CommitTailInArena(lock, v, round) : CommitTailToFile(lock, v, round);
    if (done) return *done;
  }
  if (v->phase == CommitPhase::kDemote && !v->ram && v->synced && v->fd >= 0) {
    if (std::optional<bool> done = CommitPublishFile(lock, v, round)) return *done;
  }
  if (v->phase == CommitPhase::kDemote) {
    if (demotion_)
      return CommitRoundChanged(version, round);  // one demotion at a time; a commit's goes next
    if (!v->demote_to.empty()) {
      size_t target = v->demote_to.front();
      v->demote_to.erase(v->demote_to.begin());
      st = StartDemotion(lock, version, 0, target, /*for_commit=*/true);
      if (!st.ok()) return FailCommitLocked(v, st);
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
    if (std::optional<bool> done = CommitStartReplication(lock, v, round)) return *done;
  }
  if (v->phase == CommitPhase::kReplicate) {
    if (std::optional<bool> done = CommitVote(lock, v, round)) return *done;
  }
  if (v->phase == CommitPhase::kVoting) {
    if (v->job.decision() == JobCommit::Decision::kNone) return false;
    if (v->job.decision() == JobCommit::Decision::kAborted) {
      const std::string& why = v->job.abort_why();
      return FailCommitLocked(
          v, Status::State(
                 V(version) + " was aborted by the coordinator" +
                 (why.empty() ? " (a rank failed, was fenced, or did not vote)" : ": " + why)));
    }
    VersionRecord rec = versions_[version].record;
    rec.state = CKPTDB_STATE_PREPARED;
    rec.manifest_xxh3 = v->manifest_xxh3;
    st = WriteCommitted(lock, v, rec);
    if (!st.ok() && live_.count(version)) FailLocked(&live_.at(version), st);
    return true;
  }
  return CommitRoundChanged(version, round);
}

// Fails v's commit with st (FailLocked); true, for RunCommit's "something changed".
bool Db::FailCommitLocked(LiveVersion* v, const Status& st) {
  FailLocked(v, st);
  return true;
}

bool Db::CommitRoundChanged(uint64_t version, const CommitRound& round) const {
  auto it = live_.find(version);
  return it == live_.end() || it->second.phase != round.phase ||
         it->second.residency.size() != round.copies || demotion_.has_value() != round.demoting ||
         !it->second.error.ok();
}

// kNone: capture is complete. Records the version CAPTURED and builds its manifest; on to kTail.
std::optional<bool> Db::CommitManifest(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                       const CommitRound& round) {
  const uint64_t version = v->version;
  Status st;
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
  // A version with replicated shards of an "arc", "aec" or "arc+aec" group records the group
  // (docs/format.md), also when every shard is kept whole (two members, small shards): what a
  // member that lost its own copy lays its shards out from, and what holdings advertise.
  // With AOR always: the record says which shards are replicated and which are recomputed.
  if (replica_group_ && replica_group_->dedup() &&
      (!v->replicated_names.empty() || replica_group_->aor)) {
    const ReplicaGroup& g = *replica_group_;
    mc.replicas.present = true;
    mc.replicas.group = g.group;
    mc.replicas.members = g.members;
    mc.replicas.position = static_cast<uint32_t>(
        std::find(g.members.begin(), g.members.end(), identity_.rank) - g.members.begin());
    mc.replicas.piece_bytes = options_.chunk_bytes;
    mc.replicas.arc = g.arc;
    mc.replicas.aec = g.aec;
    mc.replicas.aor = g.aor;
    if (g.aor) {
      for (format::TensorEntry& t : v->tensors) t.replicated = v->replicated_names.count(t.name);
    }
    // Without the job's redundancy every member put replicated shards only (put_shard refuses
    // others): a member's lost segment is its group's slices.
    mc.replicas.replicated_only = cluster_->options().replicas <= 1 && !cluster_->options().code;
    arc_versions_[version] = {g.group, g.members, mc.replicas.replicated_only, g.protection()};
  }
  // The manifest takes the tensors: no put comes after a commit. A replica group's shards stay,
  // for the comparison of replicas (kReplicate).
  // With AOR, the private shards and recomputed replicas are compared too.
  const bool aor = replica_group_ && replica_group_->aor;
  for (format::TensorEntry& t : v->tensors) {
    if (aor || v->replicated_names.count(t.name)) v->replicated_tensors.push_back(t);
  }
  mc.tensors = std::move(v->tensors);
  v->tensors.clear();
  if (cluster_ != nullptr && cluster_->Group()) {
    // The coding group's layout (docs/format.md): what a rebuild and verify read back.
    const CodingGroup& g = *cluster_->Group();
    mc.redundancy.scheme =
        static_cast<uint8_t>(g.code.scheme == CodeScheme::kXor ? fb::RedundancyScheme::Xor
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
  std::vector<uint8_t> manifest = format::BuildManifest(mc);
  spare_entries_.Give(std::move(mc.tensors));  // for the next version's tensor list
  lock.lock();
  if (!st.ok()) return FailCommitLocked(v, st.WithContext("commit " + V(version)));
  if (manifest.size() > format::kMaxManifestBytes) {
    return FailCommitLocked(
        v, Status::Invalid(V(version) + ": the manifest would be " +
                           std::to_string(manifest.size()) + " bytes, over the 1 GiB limit"));
  }
  v->manifest_xxh3 = format::Xxh3(manifest.data(), manifest.size());
  v->manifest = std::move(manifest);
  v->tail_bytes = format::RecordBytes(v->manifest.size()) + kBlockBytes;
  for (size_t t = 1; t <= commit_tier_; ++t) {
    if (tiers_[t].Takes(version)) v->demote_to.push_back(t);
  }
  v->phase = CommitPhase::kTail;
  return std::nullopt;
}

// kTail on a ram first tier: the header, tail and index regions in the arena, the image
// recorded; on to kDemote (or waits for arena space).
std::optional<bool> Db::CommitTailInArena(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                          const CommitRound& round) {
  const uint64_t version = v->version;
  // Header (if the arena had no room at open), tail and index regions; the arena may be short
  // of them now: the commit then waits for evictions like a capture (or fails when nothing
  // can free them: DetectStagingDeadlockLocked).
  RamTier& ram = *tiers_[0].ram;
  StagingRing::Region tail{};
  if (v->header_region.bytes == 0) {
    if (!ram.Allocate(kBlockBytes, &v->header_region)) {
      v->arena_waiters[kCommitWaiter] = ram.frees();
      return CommitRoundChanged(version, round);
    }
    EncodeSegmentHeaderBlock(*v, ram.base() + v->header_region.offset);
  }
  if (!ram.Allocate(v->tail_bytes, &tail)) {
    v->arena_waiters[kCommitWaiter] = ram.frees();
    return CommitRoundChanged(version, round);
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
    return CommitRoundChanged(version, round);
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
  return std::nullopt;
}

// kTail on a directory first tier: the manifest record and footer written after the chunks;
// the write's completion moves the version to kSync, the sync to kDemote.
std::optional<bool> Db::CommitTailToFile(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                         const CommitRound& round) {
  const uint64_t version = v->version;
  Status st;
  if (v->tail) return CommitRoundChanged(version, round);  // the tail write is in flight
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
  if (block == nullptr)
    return FailCommitLocked(v, Status::NoMemory("allocating the manifest of " + V(version)));
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
    return FailCommitLocked(v, st.WithContext("writing the manifest of " + V(version)));
  }
  return true;  // kTail completes into kSync, kSync into kDemote
}

// kDemote on a directory first tier, once synced: the rename that publishes the segment.
std::optional<bool> Db::CommitPublishFile(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                          const CommitRound& round) {
  const uint64_t version = v->version;
  Status st;
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
  if (!st.ok()) return FailCommitLocked(v, st.WithContext("publishing " + V(version)));
  ResidencyRecord res;
  res.tier = tiers_[0].name();
  res.state = CKPTDB_RESIDENT_DURABLE;
  res.path = tier.SegmentPath(version, identity_.rank);
  res.file_bytes = v->next_offset + v->tail_bytes;
  v->residency.push_back(res);
  const uint64_t elapsed = MonoNs() - v->tier0_started_mono_ns;
  v->stats.AddTier(tiers_[0].name(), res.file_bytes, elapsed);
  tiers_[0].write_ns += elapsed;
  return std::nullopt;
}

// kDecide in a job: the version's redundancy (replicas or parity in peers' memory) pushed by
// the cluster worker; on to kReplicate.
std::optional<bool> Db::CommitStartReplication(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                               const CommitRound& round) {
  const uint64_t version = v->version;
  // world_size > 1: the rank's redundancy must be safe too before it may vote (GEMINI's
  // replicas in peers' memory), pushed by the cluster worker straight from the arena.
  if (!v->ram)
    return FailCommitLocked(
        v, Status::NotSupported(V(version) + ": world_size > 1 needs a ram first tier"));
  std::vector<SendExtent> extents;
  for (const RamExtent& e : v->image.extents) {
    extents.push_back({e.logical_offset, tiers_[0].ram->base() + e.arena_offset, e.bytes});
  }
  const uint64_t file_bytes = v->image.file_bytes;
  v->job.StartReplication();
  v->phase = CommitPhase::kReplicate;
  const uint64_t generation = v->generation;
  // A declared replica group compares its replicated shards before anything is protected:
  // each one's digest is the xxh3 of its chunks' xxh3s (computed while they were captured).
  std::optional<ReplicaGroup> group = replica_group_;
  std::vector<Cluster::ReplicaDigest> digests;
  if (group) {
    for (const format::TensorEntry& t : v->replicated_tensors) {
      // A deduplicated shard's pieces are its chunks had it been kept whole.
      // A packed (private) shard by its own hash: what its one chunk's would be unpacked, as
      // the recomputed replica of it is.
      const bool dedup = t.full_bytes != 0;
      const size_t count = dedup ? t.piece_xxh3.size() : t.chunk_count;
      std::vector<uint8_t> hashes(size_t{8} * count);
      for (size_t c = 0; c < count; ++c) {
        format::le::Put<uint64_t>(hashes.data(), size_t{8} * c,
                                  dedup      ? t.piece_xxh3[c]
                                  : t.packed ? t.pack_xxh3
                                             : v->chunks[t.first_chunk + c].xxh3);
      }
      // REFT's AOR: a recomputed replica is reported by its owner's name (the prefix off).
      const uint8_t kind = v->replicated_names.count(t.name) ? Cluster::ReplicaDigest::kReplicated
                           : t.recomputed                    ? Cluster::ReplicaDigest::kRecomputed
                                                             : Cluster::ReplicaDigest::kPrivate;
      digests.push_back({kind == Cluster::ReplicaDigest::kRecomputed
                             ? t.name.substr(format::kRecomputedPrefix.size())
                             : t.name,
                         dedup ? t.full_bytes : t.bytes, format::Xxh3(hashes.data(), hashes.size()),
                         kind});
    }
    std::sort(digests.begin(), digests.end(), [](const auto& a, const auto& b) {
      return a.kind != b.kind ? a.kind < b.kind : a.name < b.name;
    });
  }
  const uint64_t chunk_bytes = options_.chunk_bytes;
  PostClusterJob(kProtectLane, [this, version, generation, file_bytes, extents, group, digests,
                                chunk_bytes] {
    Status rs = group ? cluster_->CheckReplicas(version, group->group, group->members,
                                                group->protection(), chunk_bytes, digests)
                      : Status::Ok();
    if (rs.ok() && group) {
      // The job may have given the version up while the group compared: protect nothing then.
      std::lock_guard<std::mutex> guard(mu_);
      auto it = live_.find(version);
      if (it == live_.end() || it->second.generation != generation || it->second.abort_requested ||
          !it->second.error.ok() || it->second.job.decision() == JobCommit::Decision::kAborted) {
        rs = Status::State(V(version) + " was given up while its replica group compared" +
                           (it != live_.end() && !it->second.job.abort_why().empty()
                                ? ": " + it->second.job.abort_why()
                                : ""));
      }
    }
    if (rs.ok()) rs = cluster_->Protect(version, file_bytes, extents);
    JobCommit::Message m;
    m.kind = JobCommit::Message::Kind::kReplicated;
    m.version = version;
    m.generation = generation;
    m.status = rs;
    std::lock_guard<std::mutex> guard(mu_);
    DeliverLocked(m);
  });
  return true;
}

// kReplicate: once the redundancy is safe, PREPARED recorded and the vote cast; on to kVoting.
std::optional<bool> Db::CommitVote(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                   const CommitRound& round) {
  const uint64_t version = v->version;
  Status st;
  if (v->job.replication() == JobCommit::Replication::kRunning) return false;
  if (v->job.replication() == JobCommit::Replication::kFailed)
    return FailCommitLocked(v, v->job.replication_error());
  VersionRecord rec;
  st = WritePrepared(lock, v, &rec);
  if (!live_.count(version)) return true;
  if (!st.ok()) return FailCommitLocked(v, st);
  v->phase = CommitPhase::kVoting;
  const uint64_t generation = v->generation;
  PostClusterJob(kVoteLane, [this, version, generation] {
    {
      std::lock_guard<std::mutex> guard(mu_);
      if (!ClaimYesLocked(version)) return;
    }
    Status vs = cluster_->Vote(version);
    if (vs.ok()) {
      CrashPoint("commit:after_vote");
      return;
    }
    JobCommit::Message m;
    m.kind = vs.code() == CKPTDB_ESTATE ? JobCommit::Message::Kind::kVoteRefused
                                        : JobCommit::Message::Kind::kVoteUndelivered;
    m.version = version;
    m.generation = generation;
    m.status = vs;
    std::lock_guard<std::mutex> guard(mu_);
    DeliverLocked(m);
  });
  return true;
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
  rec.committed_unix_ns = WallNs();
  v->stats.commit_ns = MonoNs() - v->commit_requested_mono_ns;
  CatalogBatch committed;
  committed.put_versions.push_back(rec);
  committed.put_stats.emplace_back(version, v->stats);
  // Copies the commit made on nfs tiers (a first or commit tier there) get the tier's witness
  // too, as a demotion's do (WriteTierWitness).
  std::vector<size_t> nfs_copies;
  for (const ResidencyRecord& r : v->residency) {
    const int t = TierIndex(r.tier);
    if (t >= 0 && tiers_[t].is_nfs() && r.state == CKPTDB_RESIDENT_DURABLE) nfs_copies.push_back(t);
  }
  lock.unlock();
  CrashPoint("commit:before_committed");
  Status st = catalog_->Apply(committed, /*sync=*/true);
  Status witnessed;
  if (st.ok()) {
    CrashPoint("commit:before_witness");
    witnessed = WriteWitness(rec);
    for (size_t t : nfs_copies) WriteTierWitness(t, rec);
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
  figures_.commits++;
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
  const bool vote_no = cluster_ != nullptr && v->job.MustVoteNo();
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
  figures_.aborts++;
  live_.erase(version);
  if (vote_no) {
    PostClusterJob(kVoteLane, [this, version, why] {
      Status st = cluster_->VoteAbort(version, why.message());
      if (!st.ok() && st.code() != CKPTDB_EPEER) {
        std::fprintf(stderr, "ckptdb: %s\n", st.ToString().c_str());
      }
    });
  }
  state_cv_.notify_all();
}

}  // namespace ckpt::engine
