// The tier manager's demotions, evictions and retention (manager.cc's steps 5 and 6): copying a
// committed version to the slower tiers that want it, every chunk checked against its xxh3
// between reading and writing it; evicting copies the policy lets go (policy.cc); retiring
// versions past the retention; and the staging deadlock check. Runs on the manager's thread.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/db.h"
#include "engine/internal.h"
#include "engine/witness.h"
#include "format/checksum.h"
#include "format/little_endian.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_writer.h"
#include "util/assert.h"
#include "util/thread_name.h"

namespace ckpt::engine {
using format::kBlockBytes;
using redundancy::CodeScheme;

// ---- Demotion ----------------------------------------------------------------------------------

bool Db::PlanDemotion(std::unique_lock<std::mutex>& lock) {
  for (const auto& [version, e] : versions_) {
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    const uint64_t now = MonoNs();
    for (size_t target = 1; target < tiers_.size(); ++target) {
      if (tiers_[target].is_ram() || Durable(e, target) || !Wants(target, version)) continue;
      if (!tiers_[target].online() || now < tiers_[target].retry_ns) continue;
      auto failed = failed_sources_.find({version, target});
      for (size_t source = 0; source < tiers_.size(); ++source) {
        if (source == target || !Durable(e, source) || !tiers_[source].online()) continue;
        if (failed != failed_sources_.end() && failed->second.count(source)) continue;
        Status st = StartDemotion(lock, version, source, target, /*for_commit=*/false);
        if (st.ok()) return true;
        DemotionFailedLocked(lock, version, source, target, st);
        return true;  // state changed; plan again next round
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
  format::EncodeSegmentHeaderBlock(reader.header(), d->head.get());
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
  if (!ram_source && !WriteReadRecordsLocked(lock)) return;
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
    const VersionRecord record = versions_.at(version).record;
    lock.unlock();
    st = catalog_->Apply(batch, /*sync=*/true);
    if (st.ok() && tiers_[d.target].is_nfs()) WriteTierWitness(d.target, record);
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
    tiers_[d.target].backoff_ns = 0;  // the tier works: its next failure backs off from the start
    demotion_tries_.erase({version, d.target});
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
      DemotionFailedLocked(lock, version, d.source, d.target, st);
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
    const bool nfs = tiers_[t].is_nfs();
    lock.unlock();
    // The tier's own witness goes before its copy: it never names a copy that is gone.
    Status removed = nfs ? RemoveTierWitness(t, version) : Status::Ok();
    if (removed.ok()) removed = tier.RemoveSegment(version, identity_.rank);
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

// A committed version whose copies retention evicted, every one, becomes RETIRED, and the history
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
      // Retention's act only: a committed version with no record at all lost its copies some
      // other way, and stays committed for verify to report and repair to drop.
      bool evicted = std::any_of(e.residency.begin(), e.residency.end(),
                                 [](const auto& r) { return r.state == CKPTDB_RESIDENT_EVICTED; });
      if (!any && evicted) {
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

// A demotion's read, write or fsync completed (HandleCompletion): its accounting, the first
// error kept (naming the source copy or the target's file), and what the record's region does
// next (PumpDemotion checks and writes what was read; what was written is freed).
void Db::DemotionCompletedLocked(const Request& r) {
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
      d.error = r.result < 0
                    ? Status::FromErrno(static_cast<int>(-r.result), where)
                    : Status::IoError(where + ": a transfer of record at offset " +
                                      std::to_string(d.records[r.chunk].offset) + " came up short");
    }
  } else if (r.kind == RequestKind::kDemoteWrite) {
    tiers_[d.target].bytes_written += r.bytes;
  } else if (r.kind == RequestKind::kDemoteRead) {
    tiers_[d.source].bytes_read += r.bytes;
  } else {
    tiers_[d.target].fsyncs++;
    figures_.fsyncs++;
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
}

// Records of a directory-tier demotion whose reads completed, from d.unwritten on: each checked
// against its xxh3 and written. False when the queue has no slot left (PumpDemotion goes on at
// its next round).
bool Db::WriteReadRecordsLocked(std::unique_lock<std::mutex>& lock) {
  Demotion& d = *demotion_;
  for (size_t i = d.unwritten; i < d.next && d.error.ok(); ++i) {
    Demotion::Record& rec = d.records[i];
    if (!rec.read_done || rec.written) continue;
    if (FreeRequestSlots(requests_.size(), options_.queue_depth) == 0) return false;
    rec.written = true;
    uint8_t* p = staging_ + rec.ring.offset;
    lock.unlock();
    Status st = CheckAndWriteDemoted(d, i, p, fixed_buffers_ ? 0 : -1);
    lock.lock();
    if (st.ok()) {
      d.in_flight++;
    } else {
      d.error = st.WithContext("demoting " + V(d.version) + " to tier " + tiers_[d.target].name());
      FreeRingLocked(&rec.ring);
    }
  }
  return true;
}

// ---- A tier directory's own witnesses ----------------------------------------------------------

// Called without mu_, after the copy's DURABLE record is synced: the version's witness in the
// tier directory (and from rank 0 of a job, the job's decision record), so that a reader of the
// directory alone can list the version (docs/api.md, "Reading a tier directory alone"). A
// failure is reported and leaves the copy as it is: the reader then does not list it.
void Db::WriteTierWitness(size_t tier, const VersionRecord& record) {
  const std::string& dir = tiers_[tier].spec.path;
  Status st = WitnessDir(io_, dir).Write(MakeWitness(identity_, record, CanonicalTiers()));
  if (st.ok() && identity_.rank == 0 && identity_.world_size > 1) {
    format::JobDecision d;
    d.job_id = identity_.job_id;
    d.version = record.version;
    d.world_size = identity_.world_size;
    d.decided_unix_ns = record.committed_unix_ns;
    st = DecisionDir(io_, dir).Write(d);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "ckptdb: %s on tier %s: writing its witness: %s\n",
                 V(record.version).c_str(), tiers_[tier].name().c_str(), st.ToString().c_str());
  }
}

Status Db::RemoveTierWitness(size_t tier, uint64_t version) {
  const std::string& dir = tiers_[tier].spec.path;
  if (identity_.rank == 0 && identity_.world_size > 1) {
    CKPTDB_RETURN_IF_ERROR(DecisionDir(io_, dir).Remove(version));
  }
  return WitnessDir(io_, dir).Remove(version, identity_.rank);
}

// ---- Offline tiers -----------------------------------------------------------------------------

// A demotion of `version` from `source` to `target` failed (at its start or its end). An nfs
// target is asked whether its server still answers: if not, the tier goes offline and the
// demotion waits for it; if so, it is tried again after the tier's backoff, kNfsDemotionTries
// times in all. Anything else gives the source up for that version (wait_commit reports it).
void Db::DemotionFailedLocked(std::unique_lock<std::mutex>& lock, uint64_t version, size_t source,
                              size_t target, const Status& st) {
  TierState& t = tiers_[target];
  t.demotion_failures++;
  std::fprintf(stderr, "ckptdb: %s\n", st.ToString().c_str());
  if (t.is_nfs()) {
    // A call that waited out its deadline already says the server does not answer.
    Status probe = st;
    if (st.code() != CKPTDB_ETIMEDOUT) {
      const std::string path = t.spec.path;
      lock.unlock();
      probe = io_->SyncDir(path);
      lock.lock();
    }
    if (!probe.ok() || ++demotion_tries_[{version, target}] < kNfsDemotionTries) {
      BackOffLocked(target, probe.ok() ? Status::Ok()
                                       : probe.WithContext("tier " + t.name() + " is offline"));
      return;
    }
  }
  failed_sources_[{version, target}].insert(source);
  demotion_errors_[{version, target}] = st;
  state_cv_.notify_all();  // wait_commit on that tier has its answer
}

void Db::BackOffLocked(size_t tier, const Status& offline) {
  TierState& t = tiers_[tier];
  t.backoff_ns =
      t.backoff_ns == 0 ? kTierRetryFirstNs : std::min(2 * t.backoff_ns, kTierRetryMaxNs);
  t.retry_ns = MonoNs() + t.backoff_ns;
  if (!offline.ok()) t.offline = offline;
  state_cv_.notify_all();  // wait_commit on that tier has its answer
}

int Db::ManagerWaitMsLocked() const {
  uint64_t next = UINT64_MAX;
  for (const TierState& t : tiers_) {
    if (t.retry_ns != 0) next = std::min(next, t.retry_ns);
  }
  if (next == UINT64_MAX) return -1;
  const uint64_t now = MonoNs();
  return next <= now ? 0
                     : static_cast<int>(std::min<uint64_t>((next - now) / 1'000'000 + 1, 60'000));
}

bool Db::RetryOfflineTiers(std::unique_lock<std::mutex>& lock) {
  bool back = false;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    TierState& t = tiers_[i];
    if (t.retry_ns == 0 || MonoNs() < t.retry_ns) continue;
    if (t.online()) {
      t.retry_ns = 0;  // a backoff after a failed demotion ran out: PlanDemotion goes on
      back = true;
      continue;
    }
    // One offline tier at a time is tried, on a thread of its own: a server that does not answer
    // costs each call its deadline, which the manager (commits to the other tiers) must not wait.
    if (tier_retry_busy_) continue;
    tier_retry_busy_ = true;
    t.retry_ns = 0;  // the try sets the next one
    std::vector<std::pair<uint64_t, ResidencyRecord>> copies;
    for (const auto& [version, e] : versions_) {
      for (const ResidencyRecord& r : e.residency) {
        if (r.tier == t.name() && r.state == CKPTDB_RESIDENT_DURABLE) {
          copies.emplace_back(version, r);
        }
      }
    }
    lock.unlock();
    if (tier_retry_.joinable()) tier_retry_.join();  // the last try, done (it cleared busy)
    tier_retry_ = std::thread([this, i, copies = std::move(copies)]() mutable {
      SetThreadName("ckpt-tier-retry");
      RetryTier(i, std::move(copies));
    });
    lock.lock();
  }
  return back;
}

// The tier opened again as at open: its marker checked (a directory recreated without one gets
// a new one only when it holds no segment), this rank's temporary files collected, its recorded
// `copies` looked for (those gone become MISSING). Runs on tier_retry_, without mu_ until the end.
void Db::RetryTier(size_t i, std::vector<std::pair<uint64_t, ResidencyRecord>> copies) {
  TierState& t = tiers_[i];  // tiers_ never changes size while the store is open
  // A new Tier object: Open sets fields that stats read under mu_ from the one in place.
  auto fresh = std::make_unique<Tier>(io_, t.spec);
  Tier& tier = *fresh;
  Status st = tier.Open(identity_.job_id, options_.read_only);
  std::vector<SegmentFileName> files;
  if (st.ok()) st = tier.ListSegments(&files);
  for (size_t f = 0; st.ok() && f < files.size(); ++f) {
    if (files[f].temporary && files[f].rank == identity_.rank && !options_.read_only) {
      st = io_->Remove(tier.spec().path + "/" + files[f].name);
    }
  }
  std::vector<std::pair<uint64_t, ResidencyRecord>> gone;
  for (size_t c = 0; st.ok() && c < copies.size(); ++c) {
    uint64_t bytes = 0;
    Status found = io_->PathSize(copies[c].second.path, &bytes);
    if (found.code() == CKPTDB_ENOTFOUND) {
      gone.push_back(copies[c]);
    } else if (!found.ok()) {
      st = found;
    }
  }
  if (st.ok() && !gone.empty() && !options_.read_only) {
    CatalogBatch batch;
    for (auto& [version, r] : gone) {
      r.state = CKPTDB_RESIDENT_MISSING;
      batch.put_residency.emplace_back(version, r);
    }
    st = catalog_->Apply(batch, /*sync=*/true);
  }
  std::unique_lock<std::mutex> lock(mu_);
  tier_retry_busy_ = false;
  if (!st.ok()) {
    BackOffLocked(i, st.WithContext("tier " + t.name() + " is offline"));
  } else {
    for (const auto& [version, r] : gone) {
      auto it = versions_.find(version);
      if (it == versions_.end()) continue;
      for (ResidencyRecord& res : it->second.residency) {
        if (res.tier == r.tier && res.state == CKPTDB_RESIDENT_DURABLE) {
          res.state = CKPTDB_RESIDENT_MISSING;
        }
      }
      std::fprintf(stderr, "ckptdb: tier %s came back without %s's copy (%s)\n", t.name().c_str(),
                   V(version).c_str(), r.path.c_str());
    }
    std::fprintf(stderr, "ckptdb: tier %s is back online\n", t.name().c_str());
    t.dir = std::move(fresh);
    t.offline = Status::Ok();
    t.retry_ns = 0;
    t.backoff_ns = 0;
    state_cv_.notify_all();
  }
  WakeManager();
}

}  // namespace ckpt::engine
