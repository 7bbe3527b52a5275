// Verify (every copy of a version, chunk by chunk), the copies a coding group's check reads
// across stores (engine/group_check.h), and the figures (stats). Readers are serialized by
// read_mu_, as in read.cc.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "util/assert.h"
#include "util/text.h"

namespace ckpt::engine {
using redundancy::CodeScheme;

using format::kBlockBytes;

Status Db::Verify(uint64_t version, const char* tier, ckptdb_verify_fn fn, void* arg,
                  ckptdb_verify_report* report) {
  std::lock_guard<std::mutex> read_lock(read_mu_);
  VerifyRun run;
  run.fn = fn;
  run.arg = arg;
  std::vector<VerifyTarget> targets;
  std::vector<std::pair<uint64_t, std::string>> uncopied;  // versions no copy backs, and why
  {
    std::lock_guard<std::mutex> lock(mu_);
    CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
    CKPTDB_RETURN_IF_ERROR(VerifyTargetsLocked(version, tier, &targets, &run.total));
    for (const auto& [v, e] : versions_) {
      if (e.record.state != CKPTDB_STATE_COMMITTED || tier != nullptr) continue;
      if (version != CKPTDB_ALL_VERSIONS && v != version) continue;
      const bool copy = std::any_of(e.residency.begin(), e.residency.end(), [](const auto& r) {
        return r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_MISSING;
      });
      // Every copy evicted by retention: a retirement that a crash cut short, which the next
      // read-write open finishes (Db::OpenImpl), not a version that lost its copies.
      if (copy || AllEvicted(e.residency)) continue;
      std::string records;
      for (const ResidencyRecord& r : e.residency) {
        static const char* const kStates[] = {"WRITING", "DURABLE", "MISSING", "EVICTED",
                                              "PENDING"};
        const bool named = r.state >= CKPTDB_RESIDENT_WRITING && r.state <= CKPTDB_RESIDENT_PENDING;
        records += (records.empty() ? "" : ", ") + r.tier + " " +
                   (named ? kStates[r.state - CKPTDB_RESIDENT_WRITING] : std::to_string(r.state));
      }
      uncopied.emplace_back(v, records.empty() ? "none" : records);
    }
  }
  const VerifyTarget store{0, ResidencyRecord{}, 0, -1};
  if (version == CKPTDB_ALL_VERSIONS && tier == nullptr) {
    // The store's own metadata: a damaged commit witness of a committed version, a ram arena
    // whose header cannot be read (Open noted them; ckptdb repair rewrites them).
    for (const std::string& problem : witness_problems_) {
      run.Emit(CKPTDB_VERIFY_PROBLEM, store, -1, 0, 0, 0, problem);
    }
  }
  for (const auto& [v, records] : uncopied) {
    run.Emit(CKPTDB_VERIFY_PROBLEM, VerifyTarget{v, ResidencyRecord{}, 0, -1}, -1, 0, 0, 0,
             V(v) + " is committed, but the catalog records no copy of it on any tier (its " +
                 "residency records: " + records + "): it cannot be restored (ckptdb repair " +
                 options_.root + " drops it)");
  }
  for (const VerifyTarget& t : targets) VerifyCopy(t, &run);
  if (report != nullptr) *report = run.rep;
  if (run.rep.problems > 0) {
    return Status::Corrupt("verify found " + std::to_string(run.rep.problems) + " problem(s) in " +
                           std::to_string(run.rep.segments_checked) + " segment(s)");
  }
  return Status::Ok();
}

void Db::VerifyRun::Emit(int kind, const VerifyTarget& t, int64_t chunk, uint64_t offset,
                         uint64_t expected, uint64_t actual, const std::string& message) {
  if (kind == CKPTDB_VERIFY_PROBLEM) rep.problems++;
  if (fn == nullptr) return;
  ckptdb_verify_event ev{};
  ev.kind = kind;
  ev.version = t.version;
  ev.tier = t.res.tier.c_str();
  ev.path = t.res.path.c_str();
  ev.chunk_index = chunk;
  ev.file_offset = offset;
  ev.expected_xxh3 = expected;
  ev.actual_xxh3 = actual;
  ev.message = message.c_str();
  ev.bytes_done = done_bytes;
  ev.bytes_total = total;
  fn(arg, &ev);
}

// The copies Verify checks: every durable (or missing) copy of `version` (or of every committed
// version), on `tier` only when it names one (any spelling of it; a tier no longer configured
// is found by the name its copies were recorded under). NotFound naming the tiers otherwise.
Status Db::VerifyTargetsLocked(uint64_t version, const char* tier, std::vector<VerifyTarget>* out,
                               uint64_t* total) {
  std::string tier_name;
  if (tier != nullptr) {
    // Any spelling of a tier that names it ("disk:/x/" is "disk:/x", "disk" the first disk
    // tier, "ram"); options such as keep= are ignored for matching.
    size_t index = 0;
    if (ResolveTier(tier, &index).ok()) {
      tier_name = tiers_[index].name();
    } else {
      tier_name = tier;
      std::vector<io::TierSpec> parsed;
      if (io::ParseTierSpecs(tier, "", &parsed).ok() && parsed.size() == 1) {
        tier_name = parsed[0].name;
      }
      bool known = false;
      for (const auto& [v, e] : versions_) {
        for (const ResidencyRecord& r : e.residency) known |= r.tier == tier_name;
      }
      if (!known) {
        std::string names;
        for (const TierState& t : tiers_) names += (names.empty() ? "" : ", ") + t.name();
        return Status::NotFound(std::string("verify: no tier named '") + tier +
                                "' (tiers: " + names + ")");
      }
    }
  }
  if (version != CKPTDB_ALL_VERSIONS) {
    CKPTDB_RETURN_IF_ERROR(CheckCommittedLocked(version, "verify " + V(version)));
  }
  for (const auto& [v, e] : versions_) {
    if (version != CKPTDB_ALL_VERSIONS && v != version) continue;
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    for (const ResidencyRecord& r : e.residency) {
      if (tier != nullptr && r.tier != tier_name) continue;
      if (r.state != CKPTDB_RESIDENT_DURABLE && r.state != CKPTDB_RESIDENT_MISSING) continue;
      out->push_back({v, r, e.record.manifest_xxh3, TierIndex(r.tier)});
      *total += r.file_bytes;
    }
  }
  return Status::Ok();
}

// Checks one copy: opened (a ram copy pinned), then VerifySegment; a copy evicted since the
// list was made is skipped.
void Db::VerifyCopy(const VerifyTarget& t, VerifyRun* run) {
  const bool ram = t.tier >= 0 && tiers_[t.tier].is_ram();
  std::string what = "tier " + t.res.tier + ", " + V(t.version) + ", " +
                     (ram ? "arena " : "segment ") + t.res.path;
  uint64_t before = run->rep.problems;
  int fd = -1;
  uint64_t size = 0;
  format::ReadAtFn read;
  RamImage image;
  Status st;
  // A copy evicted since the list was made (the manager runs beside this call) is not a
  // problem: it is simply no longer there to check.
  auto still_listed = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(t.version);
    if (it == versions_.end()) return false;
    return std::any_of(
        it->second.residency.begin(), it->second.residency.end(), [&](const ResidencyRecord& r) {
          return r.tier == t.res.tier &&
                 (r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_MISSING);
        });
  };
  if (!still_listed()) {
    run->done_bytes += t.res.file_bytes;
    return;
  }
  if (ram) {
    // Checked and pinned under one lock: the manager marks a copy evicted before it frees it.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ram_images_.find(t.version);
    auto entry = versions_.find(t.version);
    if (entry != versions_.end() && !Durable(entry->second, static_cast<size_t>(t.tier))) {
      it = ram_images_.end();
    }
    if (it == ram_images_.end()) {
      st = Status::NotFound(
          "the arena no longer holds it (a new arena, after a reboot, or "
          "evicted since this handle opened)");
    } else {
      image = it->second;
      Pin(t.version);
    }
  } else if (IsRamName(t.res.tier)) {
    st = Status::NotFound("the ram tier is not configured in this handle");
  } else {
    bool direct = false;
    st = io_->Open(t.res.path, io::OpenOptions{}, &fd, &direct);
  }
  if (!st.ok()) {
    if (still_listed()) {
      run->Emit(CKPTDB_VERIFY_PROBLEM, t, -1, 0, 0, 0,
                what + ": cannot be opened: " + st.message());
    }
    run->done_bytes += t.res.file_bytes;
    return;
  }
  RamPin pin(this, t.version, ram);  // pinned above when ram
  if (ram) {
    const RamTier* r = tiers_[t.tier].ram.get();
    size = image.file_bytes;
    read = [r, &image, what](uint64_t off, void* buf, size_t len) {
      return r->ReadAt(image, off, buf, len, what);
    };
  } else {
    st = io_->FileSize(fd, &size);
    io::IoQueue* q = read_queue_.get();
    read = [q, fd, what](uint64_t off, void* buf, size_t len) {
      return io::ReadAt(*q, fd, off, buf, len, what);
    };
    if (st.ok() && size != t.res.file_bytes) {
      run->Emit(CKPTDB_VERIFY_PROBLEM, t, -1, size, 0, 0,
                what + ": the file is " + std::to_string(size) + " bytes, the catalog recorded " +
                    std::to_string(t.res.file_bytes));
    }
  }
  VerifySegment(t, what, size, read, st, run);
  if (fd >= 0) (void)io_->Close(fd);
  pin.Release();
  run->done_bytes = std::min(run->total, run->done_bytes);
  run->rep.segments_checked++;
  if (run->rep.problems == before) run->Emit(CKPTDB_VERIFY_OK, t, -1, 0, 0, 0, what + ": clean");
}

// The segment of one copy, read through `read`: with its manifest, every chunk against its xxh3;
// without one, what the framing still tells (DESIGN.md section 4). `st`: the copy's state so far
// (a failed size read is reported as the segment's).
void Db::VerifySegment(const VerifyTarget& t, const std::string& what, uint64_t size,
                       const format::ReadAtFn& read, Status st, VerifyRun* run) {
  std::unique_ptr<format::SegmentReader> reader;
  if (st.ok()) st = format::SegmentReader::Open(what, size, read, &reader);
  if (!st.ok()) {
    run->Emit(CKPTDB_VERIFY_PROBLEM, t, -1, 0, 0, 0, st.message());
    // Without a manifest, framing still tells which chunks are intact (DESIGN.md section 4).
    Status scan = format::ScanSegment(
        what, size, read,
        [&](const format::ScannedRecord& r) {
          bool chunk = r.header.type == format::RecordType::kChunk;
          if (chunk) {
            run->rep.chunks_checked++;
            run->rep.bytes_checked += r.header.payload_bytes;
          }
          if (r.actual_xxh3 != r.header.payload_xxh3) {
            std::string label = chunk ? "chunk " + std::to_string(r.header.sequence)
                                      : std::string("manifest record");
            run->Emit(CKPTDB_VERIFY_PROBLEM, t, chunk ? r.header.sequence : -1, r.offset,
                      r.header.payload_xxh3, r.actual_xxh3,
                      what + ": " + label + " at offset " + std::to_string(r.offset) +
                          format::Xxh3Mismatch(r.header.payload_xxh3, r.actual_xxh3));
          }
        },
        &run->scratch);
    // The scan meets the same broken header or footer the open did: said once.
    if (!scan.ok() && scan.message() != st.message()) {
      run->Emit(CKPTDB_VERIFY_PROBLEM, t, -1, 0, 0, 0, scan.message());
    }
  } else {
    if (reader->footer().manifest_xxh3 != t.manifest_xxh3) {
      run->Emit(CKPTDB_VERIFY_PROBLEM, t, -1, reader->footer().manifest_offset, t.manifest_xxh3,
                reader->footer().manifest_xxh3,
                what + ": the manifest's xxh3 differs from the one the catalog recorded at commit");
    }
    // Packed shards (docs/format.md): each one's own xxh3 too, once its chunk is read.
    const format::ManifestView& m = reader->manifest();
    std::vector<std::pair<uint32_t, uint32_t>> packed;  // (chunk, tensor)
    for (uint32_t i = 0; i < m.tensor_count(); ++i) {
      if (m.tensor(i).packed()) packed.emplace_back(m.tensor(i).first_chunk(), i);
    }
    std::sort(packed.begin(), packed.end());
    size_t next_packed = 0;
    for (uint32_t c = 0; c < m.chunk_count(); ++c) {
      format::ChunkProblem p;
      Status cs = reader->CheckChunk(c, &run->scratch, &p);
      run->rep.chunks_checked++;
      run->rep.bytes_checked += m.chunk(c).payload_bytes();
      run->done_bytes += format::RecordBytes(m.chunk(c).payload_bytes());
      if (!cs.ok()) {
        run->Emit(CKPTDB_VERIFY_PROBLEM, t, c, p.file_offset, p.expected_xxh3, p.actual_xxh3,
                  cs.message());
      }
      // The record was read whole (its payload hashed) unless the read or its header failed:
      // then each packed shard in it is named that fails its own xxh3.
      const bool read_whole = cs.ok() || p.actual_xxh3 != 0;
      bool parts_ok = true;
      for (; next_packed < packed.size() && packed[next_packed].first == c; ++next_packed) {
        const fb::Tensor& pt = m.tensor(packed[next_packed].second);
        if (!read_whole) continue;
        const uint64_t actual =
            format::Xxh3(run->scratch.data() + format::kBlockBytes + pt.pack_offset(), pt.bytes());
        if (actual == pt.pack_xxh3()) continue;
        parts_ok = false;
        run->Emit(CKPTDB_VERIFY_PROBLEM, t, c, p.file_offset, pt.pack_xxh3(), actual,
                  what + ": packed tensor " + QuoteName(pt.name()->str()) + " at offset " +
                      std::to_string(pt.pack_offset()) + " of chunk " + std::to_string(c) +
                      format::Xxh3Mismatch(pt.pack_xxh3(), actual));
      }
      if (cs.ok() && parts_ok) run->Emit(CKPTDB_VERIFY_PROGRESS, t, c, p.file_offset, 0, 0, "");
    }
  }
}

// ---- A coding group's check across stores (engine/group_check.h) ------------------------------

std::string Db::ParityDir() const {
  if (tiers_.empty() || !tiers_[0].is_ram()) return "";
  return tiers_[0].spec.path + "/ckptdb-parity-r" + std::to_string(identity_.rank);
}

Status Db::CheckCopies(uint64_t version, bool check_chunks, std::vector<CopiesOf>* out) {
  std::lock_guard<std::mutex> read_lock(read_mu_);
  out->clear();
  std::vector<std::pair<uint64_t, std::vector<ResidencyRecord>>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
    if (version != CKPTDB_ALL_VERSIONS) {
      CKPTDB_RETURN_IF_ERROR(CheckCommittedLocked(version, "verify " + V(version)));
    }
    for (const auto& [v, e] : versions_) {
      if (version != CKPTDB_ALL_VERSIONS && v != version) continue;
      if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
      std::vector<ResidencyRecord> copies;
      for (const ResidencyRecord& r : e.residency) {
        if (r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_MISSING) {
          copies.push_back(r);
        }
      }
      // Fastest first: the tiers' order (one not configured here last).
      std::stable_sort(copies.begin(), copies.end(), [this](const auto& a, const auto& b) {
        auto order = [this](const std::string& t) {
          int i = TierIndex(t);
          return i < 0 ? INT32_MAX : i;
        };
        return order(a.tier) < order(b.tier);
      });
      targets.emplace_back(v, std::move(copies));
    }
  }
  std::vector<uint8_t> scratch;
  for (const auto& [v, copies] : targets) {
    CopiesOf of;
    of.version = v;
    for (const ResidencyRecord& r : copies) {
      CopyCheck c;
      c.tier = r.tier;
      c.file_bytes = r.file_bytes;
      const int ti = TierIndex(r.tier);
      c.ram = ti >= 0 && tiers_[static_cast<size_t>(ti)].is_ram();
      OpenSegment* seg = nullptr;
      if (ti < 0) {
        c.readable = Status::NotFound("tier " + r.tier + " is not configured in this handle");
      } else if (r.state == CKPTDB_RESIDENT_MISSING) {
        c.readable = Status::NotFound(V(v) + " on tier " + r.tier + " is missing");
      } else {
        c.readable = ReadSegment(v, static_cast<size_t>(ti), &seg);
      }
      if (c.readable.ok()) {
        RamPin pin(this, v, c.ram);
        const format::SegmentReader& reader = *seg->reader;
        for (uint32_t i = 0; check_chunks && i < reader.manifest().chunk_count(); ++i) {
          format::ChunkProblem problem;
          if (!reader.CheckChunk(i, &scratch, &problem).ok()) {
            const fb::Chunk& chunk = reader.manifest().chunk(i);
            c.bad.emplace_back(chunk.record_offset(),
                               chunk.record_offset() + format::RecordBytes(chunk.payload_bytes()));
          }
        }
        const fb::Redundancy* red = reader.manifest().root().redundancy();
        if (!of.group && red != nullptr && !red->parity() &&
            (red->scheme() == fb::RedundancyScheme::ReedSolomon ||
             red->scheme() == fb::RedundancyScheme::Xor)) {
          CodingGroup g;
          g.code.scheme = red->scheme() == fb::RedundancyScheme::Xor ? CodeScheme::kXor
                                                                     : CodeScheme::kReedSolomon;
          g.code.k = red->k();
          g.code.m = red->m();
          g.group = red->group();
          g.unit_bytes = red->stripe_bytes();
          g.members.assign(red->member_ranks()->begin(), red->member_ranks()->end());
          of.group = std::move(g);
          of.position = red->position();
        }
      }
      of.copies.push_back(std::move(c));
    }
    out->push_back(std::move(of));
  }
  return Status::Ok();
}

Status Db::ReadCopy(uint64_t version, const std::string& tier, uint64_t offset, uint64_t bytes,
                    uint8_t* out) {
  std::lock_guard<std::mutex> read_lock(read_mu_);
  const int ti = TierIndex(tier);
  if (ti < 0) return Status::NotFound("tier " + tier + " is not configured in this handle");
  OpenSegment* seg = nullptr;
  CKPTDB_RETURN_IF_ERROR(ReadSegment(version, static_cast<size_t>(ti), &seg));
  RamPin pin(this, version, tiers_[static_cast<size_t>(ti)].is_ram());
  const std::string what = "tier " + tier + ", " + V(version);
  const uint64_t size = seg->image.file_bytes;
  if (tiers_[static_cast<size_t>(ti)].is_ram()) {
    if (offset > size || bytes > size - offset) {
      return Status::Invalid(what + ": the range [" + std::to_string(offset) + ", +" +
                             std::to_string(bytes) + ") is past its " + std::to_string(size) +
                             " bytes");
    }
    return tiers_[static_cast<size_t>(ti)].ram->ReadAt(seg->image, offset, out, bytes, what);
  }
  return io::ReadAt(*read_queue_, seg->fd, offset, out, bytes, what);
}

// ---- Figures -----------------------------------------------------------------------------------

Status Db::Stats(ckptdb_stats_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  *out = ckptdb_stats_t{};
  figures_.Snapshot(out);
  if (options_.read_only) {
    // The tools see the figures the catalog keeps: the sums over the versions it holds.
    for (const auto& [version, e] : versions_) {
      if (!e.has_stats) continue;
      const VersionStatsRecord& s = e.stats;
      out->put_calls += s.put_calls;
      out->put_bytes += s.bytes;
      out->put_blocked_ns += s.put_blocked_ns;
      out->wait_capture_blocked_ns += s.wait_capture_blocked_ns;
      out->capture_bytes += s.bytes;
      out->capture_ns += s.capture_ns;
      out->commits++;
      out->commit_blocked_ns += s.commit_blocked_ns;
      out->backpressure_waits += s.backpressure_waits;
      out->backpressure_wait_ns += s.backpressure_wait_ns;
      out->direct_chunks += s.direct_chunks;
      out->staging_high_water_bytes =
          std::max(out->staging_high_water_bytes, s.staging_high_water_bytes);
      out->fsyncs += s.fsyncs;
    }
  }
  if (cluster_ != nullptr) {
    ClusterStats cs = cluster_->stats();
    out->replica_bytes_sent = cs.replica_bytes_sent;
    out->replica_ns = cs.replica_ns;
    out->replica_bytes_received = cs.replica_bytes_received;
    out->peer_fetch_bytes = cs.fetch_bytes;
    out->epoch = cs.epoch;
    std::string paths = cs.paths;
    if (paths.size() >= sizeof out->peer_paths) {
      paths.resize(sizeof out->peer_paths - 4);
      paths += "...";
    }
    std::snprintf(out->peer_paths, sizeof out->peer_paths, "%s", paths.c_str());
    const TrafficInterleaver::Stats is = cluster_->interleave_stats();
    out->interleave_iterations = is.profiled_iterations;
    out->interleave_spans = is.spans;
    out->interleave_idle_ns = is.idle_ns;
    out->interleave_bytes = is.bytes;
    out->interleave_overflow_bytes = is.overflow_bytes;
    out->interleave_late = is.late;
  }
  out->staging_bytes = staging_bytes_;
  if (ring_) out->staging_high_water_bytes = ring_->high_water_bytes();
  out->fixed_buffers = fixed_buffers_ || fixed_arena_base_ >= 0 ? 1 : 0;
  out->tier_count = static_cast<uint32_t>(std::min<size_t>(tiers_.size(), CKPTDB_MAX_TIERS));
  for (size_t i = 0; i < out->tier_count; ++i) {
    const TierState& t = tiers_[i];
    ckptdb_tier_stats& ts = out->tiers[i];
    ts = ckptdb_tier_stats{};
    std::snprintf(ts.name, sizeof ts.name, "%s", t.name().c_str());
    ts.kind_ram = t.is_ram() ? 1 : 0;
    ts.direct_io = t.dir && t.dir->direct() ? 1 : 0;
    ts.bytes_written = t.bytes_written;
    ts.write_ns = t.write_ns;
    ts.bytes_read = t.bytes_read;
    ts.fsyncs = t.fsyncs;
    ts.demotions = t.demotions;
    ts.evictions = t.evictions;
    ts.demotion_failures = t.demotion_failures;
    ts.pending_bytes = PendingBytes(i);
    if (t.is_ram()) {
      ts.capacity_bytes = t.ram->capacity();
      ts.high_water_bytes = t.ram->high_water_bytes();
    }
    for (const auto& [version, e] : versions_) {
      if (e.record.state == CKPTDB_STATE_COMMITTED && Durable(e, i)) {
        ts.resident_versions++;
        ts.resident_bytes += e.record.data_bytes;
      }
    }
    if (options_.read_only) {
      for (const auto& [version, e] : versions_) {
        for (const VersionStatsRecord::Tier& vt : e.stats.tiers) {
          if (vt.name != t.name()) continue;
          ts.bytes_written += vt.bytes_written;
          ts.write_ns += vt.write_ns;
        }
      }
    }
  }
  return Status::Ok();
}

Status Db::GetVersionStats(uint64_t version, ckptdb_version_stats_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  const VersionStatsRecord* s = nullptr;
  if (auto live = live_.find(version); live != live_.end()) {
    s = &live->second.stats;
  } else if (auto it = versions_.find(version); it != versions_.end() && it->second.has_stats) {
    s = &it->second.stats;
  }
  if (s == nullptr) {
    return Status::NotFound("version_stats " + V(version) +
                            ": no figures (never put in this store, or pruned with its record)");
  }
  *out = ckptdb_version_stats_t{};
  out->version = version;
  out->bytes = s->bytes;
  out->put_calls = s->put_calls;
  out->put_blocked_ns = s->put_blocked_ns;
  out->wait_capture_blocked_ns = s->wait_capture_blocked_ns;
  out->commit_blocked_ns = s->commit_blocked_ns;
  out->capture_ns = s->capture_ns;
  out->commit_ns = s->commit_ns;
  out->backpressure_waits = s->backpressure_waits;
  out->backpressure_wait_ns = s->backpressure_wait_ns;
  out->direct_chunks = s->direct_chunks;
  out->staging_high_water_bytes = s->staging_high_water_bytes;
  out->fsyncs = s->fsyncs;
  out->tier_count = static_cast<uint32_t>(std::min<size_t>(tiers_.size(), CKPTDB_MAX_TIERS));
  for (const VersionStatsRecord::Tier& t : s->tiers) {
    int i = TierIndex(t.name);
    if (i < 0 || i >= CKPTDB_MAX_TIERS) continue;
    out->tier_bytes_written[i] += t.bytes_written;
    out->tier_write_ns[i] += t.write_ns;
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
