// The read path: latest, restore, list (DESIGN.md section 5, "restore from the fastest place
// that still holds a verified copy"); verify, the coding group's check and the figures are in
// verify.cc. Readers are serialized by read_mu_
// (they share one io_uring read queue and a cache of open segments) and take mu_ only to look at
// the catalog's view and to pin ram copies, so a restore never stalls capture or the manager.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/box.h"
#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "util/assert.h"
#include "util/text.h"

namespace ckpt::engine {
using redundancy::CodeScheme;
namespace {

using format::kBlockBytes;

// Chunk reads a restore keeps in flight per segment file. Restore reads are buffered, so the
// kernel's readahead already prefetches; two in flight overlap one chunk's xxh3 with the next
// chunk's read and keep the file's access sequential. Deeper queues scatter the reads over
// io_uring workers, which defeats readahead: on the disk tier of docs/performance.md, restore ran
// at 1.8-2.9 GB/s with 64 in flight and 4.2-4.6 GB/s (91-95% of a plain sequential read) with
// 1-2; tmpfs was the same either way.
constexpr size_t kRestoreReadsInFlight = 2;

}  // namespace

void Db::Pin(uint64_t version) { ram_pins_[version]++; }

void Db::Unpin(uint64_t version) {
  auto it = ram_pins_.find(version);
  CKPTDB_ASSERT(it != ram_pins_.end() && it->second > 0);
  if (--it->second == 0) {
    ram_pins_.erase(it);
    WakeManager();  // an eviction may have waited for this reader
  }
}

// Opens the copy of `version` on `tier` that `res` describes and checks its manifest against
// the catalog's xxh3 (when known). out must stay where it is while the reader is used: the
// reader reads through out->fd or out->image. A ram copy is read through `image`, a file through
// `queue`, which the caller owns and has nothing else outstanding on while the reader reads.
Status Db::OpenSegmentAt(uint64_t version, size_t tier, const ResidencyRecord& res,
                         const VersionRecord& record, RamImage image, OpenSegment* out,
                         io::IoQueue* queue) {
  out->tier = tier;
  std::string what;
  if (tiers_[tier].is_ram()) {
    what = "ram copy of " + V(version) + " (" + res.path + ")";
    const RamTier* ram = tiers_[tier].ram.get();
    out->image = std::move(image);
    RamImage* img = &out->image;
    CKPTDB_RETURN_IF_ERROR(format::SegmentReader::Open(
        what, img->file_bytes,
        [ram, img, what](uint64_t off, void* buf, size_t len) {
          return ram->ReadAt(*img, off, buf, len, what);
        },
        &out->reader));
  } else {
    what = "segment " + res.path + " (tier " + res.tier + ")";
    bool direct = false;
    CKPTDB_RETURN_IF_ERROR(
        io_->Open(res.path, io::OpenOptions{}, &out->fd, &direct).WithContext(what));
    uint64_t size = 0;
    Status st = io_->FileSize(out->fd, &size);
    if (st.ok() && size != res.file_bytes) {
      st = Status::Corrupt(what + ": the file is " + std::to_string(size) +
                           " bytes, the catalog recorded " + std::to_string(res.file_bytes));
    }
    if (st.ok()) {
      int fd = out->fd;
      format::ReadAtFn read = [queue, fd, what](uint64_t off, void* buf, size_t len) {
        return io::ReadAt(*queue, fd, off, buf, len, what);
      };
      st = format::SegmentReader::Open(what, size, std::move(read), &out->reader);
    }
    if (!st.ok()) {
      (void)io_->Close(out->fd);
      out->fd = -1;
      return st;
    }
  }
  if (record.manifest_xxh3 != 0 && out->reader->footer().manifest_xxh3 != record.manifest_xxh3) {
    if (out->fd >= 0) (void)io_->Close(out->fd);
    out->fd = -1;
    return Status::Corrupt(what + ": its manifest xxh3 " +
                           format::Hex64(out->reader->footer().manifest_xxh3) +
                           " differs from the catalog's " + format::Hex64(record.manifest_xxh3));
  }
  return Status::Ok();
}

// A reader of (version, tier), from the cache or opened now. For a ram copy the version is
// pinned (the caller unpins when done reading). Called with read_mu_ held, mu_ not held.
Status Db::ReadSegment(uint64_t version, size_t tier, OpenSegment** out) {
  ResidencyRecord res;
  VersionRecord record;
  uint64_t index_offset = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto entry = versions_.find(version);
    if (entry == versions_.end()) return Status::NotFound(V(version) + " is no longer known");
    const VersionEntry& e = entry->second;
    bool found = false;
    for (const ResidencyRecord& r : e.residency) {
      if (r.tier == tiers_[tier].name() && r.state == CKPTDB_RESIDENT_DURABLE) {
        res = r;
        found = true;
      }
    }
    if (!found) return Status::NotFound(V(version) + " is not on tier " + tiers_[tier].name());
    record = e.record;
    if (tiers_[tier].is_ram()) {
      auto image = ram_images_.find(version);
      if (image == ram_images_.end()) {
        return Status::NotFound(V(version) + ": the ram tier's arena no longer holds it");
      }
      index_offset = image->second.index_offset;
      Pin(version);
    }
  }
  auto key = std::make_pair(version, tier);
  auto it = segments_.find(key);
  if (it != segments_.end() &&
      (!tiers_[tier].is_ram() || it->second.image.index_offset == index_offset)) {
    *out = &it->second;
    return Status::Ok();
  }
  if (it != segments_.end()) segments_.erase(it);  // a ram copy that was replaced
  RamImage image;
  if (tiers_[tier].is_ram()) {
    std::lock_guard<std::mutex> lock(mu_);
    image = ram_images_.at(version);  // pinned: it stays
  }
  OpenSegment& seg = segments_[key];
  Status st = OpenSegmentAt(version, tier, res, record, std::move(image), &seg, read_queue_.get());
  if (!st.ok()) {
    segments_.erase(key);
    RamPin(this, version, tiers_[tier].is_ram()).Release();
    return st;
  }
  while (segments_.size() > kMaxOpenSegments) {
    auto victim = segments_.begin();
    if (victim->first == key) ++victim;
    if (victim->second.fd >= 0) (void)io_->Close(victim->second.fd);
    segments_.erase(victim);
  }
  *out = &segments_.at(key);
  return Status::Ok();
}

// Opens, verifies and caches the manifests of the committed copies in the ram tier, newest
// first, at most half the reader cache: after a restart the first restore of a version of many
// tensors finds its manifest checked, instead of paying for it (the FlatBuffers verifier and the
// format's rules are linear in the tensors). Open pays instead, once; a copy that fails here is
// left to the restore that needs it to report.
void Db::WarmManifests() {
  if (tiers_.empty() || !tiers_[0].is_ram()) return;
  std::vector<uint64_t> newest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = versions_.rbegin();
         it != versions_.rend() && newest.size() < kMaxOpenSegments / 2; ++it) {
      if (it->second.has_record && it->second.record.state == CKPTDB_STATE_COMMITTED &&
          Durable(it->second, 0)) {
        newest.push_back(it->first);
      }
    }
  }
  std::lock_guard<std::mutex> read_lock(read_mu_);
  for (uint64_t version : newest) {
    OpenSegment* seg = nullptr;
    if (ReadSegment(version, 0, &seg).ok()) RamPin(this, version, true).Release();
  }
}

// Reads chunks `chunks` (sorted indexes) of seg's tensor into dst, chunk chunks[k] at
// dst_offset[k], checking each against its xxh3; the failed ones are listed in *failed. A ram
// copy is copied by the caller and the capture workers together; a file is read through io_uring.
Status Db::ReadChunks(OpenSegment* seg, const RestorePlan& plan,
                      const std::vector<uint32_t>& chunks, const std::vector<uint64_t>& dst_offset,
                      uint8_t* dst, std::vector<uint32_t>* failed, uint64_t* bytes_read) {
  const format::ManifestView& m = seg->reader->manifest();
  CKPTDB_ASSERT(dst_offset.size() == chunks.size());
  failed->clear();
  auto record_failure = [&](uint32_t index, const std::string& problem) {
    failed->push_back(index);
    if (last_problem_.empty()) {
      last_problem_ = "chunk " + std::to_string(index) + " at offset " +
                      std::to_string(m.chunk(index).record_offset()) + " of " +
                      seg->reader->what() + problem;
    }
  };
  if (tiers_[seg->tier].is_ram()) {
    const RamTier& ram = *tiers_[seg->tier].ram;
    std::vector<uint64_t> actual(chunks.size());
    enum : uint8_t { kFailed, kOk, kNoRecord };
    std::vector<uint8_t> outcome(chunks.size(), kFailed);
    RunParallel(chunks.size(), [&](size_t k) {
      const fb::Chunk& c = m.chunk(chunks[k]);
      const RamExtent* extent = ram.ExtentAt(seg->image, c.record_offset());
      if (extent == nullptr || extent->bytes < kBlockBytes + c.payload_bytes()) {
        outcome[k] = kNoRecord;
        return;
      }
      const RestorePlan::ChunkPart part = plan.PartOf(c);
      actual[k] =
          CopyAndHash(dst + dst_offset[k],
                      ram.base() + extent->arena_offset + kBlockBytes + part.offset, part.bytes);
      outcome[k] = actual[k] == part.xxh3 ? kOk : kFailed;
    });
    for (size_t k = 0; k < chunks.size(); ++k) {
      const RestorePlan::ChunkPart part = plan.PartOf(m.chunk(chunks[k]));
      if (outcome[k] == kOk) {
        *bytes_read += part.bytes;
      } else if (outcome[k] == kNoRecord) {
        record_failure(chunks[k], " has no record of its size in the arena's index");
      } else {
        record_failure(chunks[k], format::Xxh3Mismatch(part.xxh3, actual[k]));
      }
    }
    std::sort(failed->begin(), failed->end());
    return Status::Ok();
  }
  size_t next = 0;
  size_t in_flight = 0;
  const size_t depth = std::min<size_t>(options_.queue_depth, kRestoreReadsInFlight);
  std::vector<io::IoCompletion> done;
  // Bounded: each iteration submits or reaps at least one request.
  while (next < chunks.size() || in_flight > 0) {
    io::IoRequest reqs[kRestoreReadsInFlight];
    size_t n = 0;
    while (next < chunks.size() && in_flight + n < depth) {
      const fb::Chunk& c = m.chunk(chunks[next]);
      const RestorePlan::ChunkPart part = plan.PartOf(c);
      io::IoRequest& r = reqs[n++];
      r.op = io::IoRequest::Op::kRead;
      r.fd = seg->fd;
      r.offset = c.record_offset() + kBlockBytes + part.offset;
      r.buffer = dst + dst_offset[next];
      r.length = part.bytes;
      r.tag = next;
      ++next;
    }
    Status st;
    if (n > 0) {
      st = read_queue_->Submit(std::span<const io::IoRequest>(reqs, n));
      if (st.ok()) in_flight += n;
    }
    done.clear();
    if (st.ok()) st = read_queue_->Reap(1, &done, -1);
    if (!st.ok()) {
      // The kernel may still be writing into the caller's buffer: wait for every read that was
      // submitted (bounded by the queue depth) before handing the buffer back.
      std::vector<io::IoCompletion> rest;
      if (in_flight > done.size()) (void)read_queue_->Reap(in_flight - done.size(), &rest, -1);
      return st;
    }
    for (const io::IoCompletion& cp : done) {
      --in_flight;
      size_t k = cp.tag;
      const RestorePlan::ChunkPart part = plan.PartOf(m.chunk(chunks[k]));
      bool ok = cp.result == static_cast<int64_t>(part.bytes);
      uint64_t actual = 0;
      if (ok) {
        actual = format::Xxh3(dst + dst_offset[k], part.bytes);
        ok = actual == part.xxh3;
      }
      if (ok) {
        *bytes_read += part.bytes;
      } else {
        record_failure(chunks[k], cp.result < 0
                                      ? " cannot be read: " +
                                            std::string(std::strerror(static_cast<int>(-cp.result)))
                                  : cp.result != static_cast<int64_t>(part.bytes)
                                      ? " is cut short"
                                      : format::Xxh3Mismatch(part.xxh3, actual));
      }
    }
  }
  std::sort(failed->begin(), failed->end());
  return Status::Ok();
}

// Ok when `version` is committed; otherwise why not (open, unknown, aborted, retired), in the
// words of `what`.
Status Db::CheckCommittedLocked(uint64_t version, const std::string& what) const {
  if (live_.count(version)) {
    return Status::State(what + ": the version is OPEN (being put or committed), not committed");
  }
  auto it = versions_.find(version);
  if (it == versions_.end() || !it->second.has_record) {
    return Status::NotFound(what + ": unknown version");
  }
  if (it->second.record.state != CKPTDB_STATE_COMMITTED) {
    return Status::State(what + ": the version is " + ckptdb_state_name(it->second.record.state) +
                         ", not committed");
  }
  return Status::Ok();
}

// The tiers holding a durable copy of committed `version`, fastest first; a clear error when it
// is not committed or no configured tier holds it (naming where its copies went).
Status Db::CommittedCopies(uint64_t version, const std::string& what,
                           std::vector<size_t>* candidates) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  CKPTDB_RETURN_IF_ERROR(CheckCommittedLocked(version, what));
  auto it = versions_.find(version);
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    if (Durable(it->second, ti)) candidates->push_back(ti);
  }
  if (!candidates->empty()) return Status::Ok();
  std::string where;
  for (const ResidencyRecord& r : it->second.residency) {
    where += (where.empty() ? "" : ", ") + r.tier + " " +
             (r.state == CKPTDB_RESIDENT_MISSING   ? "missing"
              : r.state == CKPTDB_RESIDENT_EVICTED ? "evicted"
              : TierIndex(r.tier) < 0              ? "not configured"
                                                   : "not durable");
  }
  return Status::NotFound(what + ": no configured tier holds a copy of the version (" +
                          (where.empty() ? "no copies recorded" : where) + ")");
}

Status Db::LayOut(const format::ManifestView& m, const std::string& name, size_t nbytes,
                  const std::string& source, RestorePlan* plan) {
  const fb::Tensor* t = m.Find(name);
  if (!plan->laid_out) {
    if (t == nullptr)
      return Status::NotFound(plan->what + ": the version has no tensor by that name");
    if (format::ShardBytes(*t) != nbytes) {
      return Status::Size(plan->what + ": the tensor is " + std::to_string(format::ShardBytes(*t)) +
                          " bytes, the buffer is " + std::to_string(nbytes));
    }
    plan->laid_out = true;
    plan->first = t->first_chunk();
    plan->count = t->chunk_count();
    if (t->packed()) {
      // One chunk, shared: the shard's own part of it, checked against its own xxh3.
      plan->packed = RestorePlan::ChunkPart{t->pack_offset(), t->bytes(), t->pack_xxh3()};
      const bool wanted =
          plan->wanted == nullptr || std::any_of(plan->wanted->begin(), plan->wanted->end(),
                                                 [&](const auto& r) { return r.first < r.second; });
      if (wanted) plan->pending.push_back(plan->first);
      plan->dst_offset.push_back(0);
      plan->chunk_bytes.push_back(t->bytes());
      return Status::Ok();
    }
    // A deduplicated shard's chunks are the pieces of its slices, in order (ManifestView checked).
    std::vector<uint64_t> starts;
    if (t->full_bytes() != 0) {
      const fb::Replicas& g = *m.root().replicas();
      RestorePlan::Dedup& d = plan->dedup.emplace();
      d.full_bytes = t->full_bytes();
      d.piece_bytes = g.piece_bytes();
      d.piece_xxh3.assign(t->piece_xxh3()->begin(), t->piece_xxh3()->end());
      d.members.assign(g.members()->begin(), g.members()->end());
      d.position = g.position();
      d.arc = g.protection() != fb::ReplicaProtection::Aec;
      d.aec = g.protection() == fb::ReplicaProtection::Aec ||
              g.protection() == fb::ReplicaProtection::ArcAec;
      d.have.assign(d.piece_xxh3.size(), false);
      for (uint64_t piece : format::KeptPieces(*t, d.piece_bytes)) {
        starts.push_back(piece * d.piece_bytes);
        d.have[piece] = true;  // once its chunk is read (Restore checks pending)
      }
    }
    uint64_t offset = 0;
    const bool filter = plan->wanted != nullptr && !plan->dedup;
    size_t w = 0;  // the first wanted range that does not end before this chunk
    for (uint32_t c = plan->first; c < plan->first + plan->count; ++c) {
      const uint64_t end = offset + m.chunk(c).payload_bytes();
      if (filter) {
        while (w < plan->wanted->size() && (*plan->wanted)[w].second <= offset) ++w;
      }
      if (!filter || (w < plan->wanted->size() && (*plan->wanted)[w].first < end)) {
        plan->pending.push_back(c);
      }
      plan->dst_offset.push_back(starts.empty() ? offset : starts[c - plan->first]);
      plan->chunk_bytes.push_back(m.chunk(c).payload_bytes());
      offset += m.chunk(c).payload_bytes();
    }
    return Status::Ok();
  }
  if (t == nullptr || t->first_chunk() != plan->first || t->chunk_count() != plan->count ||
      format::ShardBytes(*t) != nbytes || (t->full_bytes() != 0) != plan->dedup.has_value() ||
      t->packed() != plan->packed.has_value() ||
      (t->packed() &&
       (t->pack_offset() != plan->packed->offset || t->pack_xxh3() != plan->packed->xxh3))) {
    return Status::Corrupt(source + " lays the tensor out differently");
  }
  if (t->packed()) return Status::Ok();
  for (uint32_t i = 0; i < plan->count; ++i) {
    if (m.chunk(plan->first + i).payload_bytes() != plan->chunk_bytes[i]) {
      return Status::Corrupt(source + " lays the tensor out differently");
    }
  }
  return Status::Ok();
}

// The restore planner (DESIGN.md section 7): for each chunk of the tensor, the fastest source
// that still holds a verified copy. Local ram first, then peers' memory (a job's replicas), then
// the slower local tiers; a chunk that fails its xxh3 or cannot be read stays pending for the
// next source. What no source can supply is zeroed, never returned as if whole.
Status Db::Restore(uint64_t version, const char* name, void* dst, size_t nbytes, unsigned flags,
                   const ByteRanges* wanted) {
  const uint64_t start = MonoNs();
  CKPTDB_RETURN_IF_ERROR(ValidateName(name, "restore"));
  RestorePlan plan;
  plan.wanted = wanted;
  plan.what = "restore " + QuoteName(name) + " of " + V(version);
  const std::string& what = plan.what;
  if (flags & ~CKPTDB_RESTORE_DEVICE) {
    return Status::Invalid(what + ": unknown flags " + std::to_string(flags));
  }
  if (dst == nullptr && nbytes > 0) return Status::Invalid(what + ": dst is NULL");
  int device = -1;
  if (nbytes > 0) {
    CKPTDB_RETURN_IF_ERROR(
        LocateDevice(dst, (flags & CKPTDB_RESTORE_DEVICE) != 0, what + " (dst)", &device));
  } else if ((flags & CKPTDB_RESTORE_DEVICE) && !DeviceConfigured()) {
    return Status::NotSupported(what +
                                ": device memory needs a CUDA or HIP build, or the simulated "
                                "device (device \"sim\")");
  }
  if (device >= 0) {
    CKPTDB_ASSERT(wanted == nullptr);  // restore_slice refuses device memory
    return RestoreToDevice(version, name, static_cast<uint8_t*>(dst), nbytes, device, what);
  }
  std::lock_guard<std::mutex> read_lock(read_mu_);
  std::vector<size_t> candidates;
  Status copies = CommittedCopies(version, what, &candidates);
  // No local copy (a replacement node, or copies evicted) still leaves a peer's memory.
  if (!copies.ok() && (cluster_ == nullptr || copies.code() != CKPTDB_ENOTFOUND)) return copies;
  if (!copies.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!job_committed_.count(version)) return copies;  // not a version the job committed
    plan.Note(copies.message());
  }
  const std::vector<std::unique_ptr<RestoreSource>> order = RestoreOrder(candidates);
  last_problem_.clear();
  RestoreCall call;
  call.version = version;
  call.name = name;
  call.nbytes = nbytes;
  call.out = static_cast<uint8_t*>(dst);
  call.plan = &plan;
  for (const std::unique_ptr<RestoreSource>& source : order) {
    if (source->Done(plan)) continue;
    CKPTDB_RETURN_IF_ERROR(source->Read(&call));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t ti = 0; ti < tiers_.size(); ++ti) tiers_[ti].bytes_read += call.read_by_tier[ti];
  figures_.checksum_failures += plan.chunk_failures;
  if (!plan.laid_out) {
    return Status::Corrupt(what +
                           (cluster_ != nullptr ? ": no tier and no peer has a readable copy: "
                                                : ": no tier has a readable segment: ") +
                           plan.errors);
  }
  if (!plan.pending.empty()) {
    // Never wrong bytes: what no source could supply is zeroed before the error is returned.
    for (uint32_t c : plan.pending) {
      std::memset(call.out + plan.dst_offset[c - plan.first], 0, plan.chunk_bytes[c - plan.first]);
    }
    return Status::Corrupt(what + ": " + std::to_string(plan.pending.size()) + " of " +
                           std::to_string(plan.count) + " chunks have no good copy on any tier" +
                           (cluster_ != nullptr ? " or peer" : "") + " (" + last_problem_ +
                           (plan.errors.empty() ? "" : "; " + plan.errors) +
                           "); their bytes in the buffer are zeroed");
  }
  if (call.pieces_missing > 0) {
    const RestorePlan::Dedup& d = *plan.dedup;
    return Status::Corrupt(
        what + ": " + std::to_string(call.pieces_missing) + " of the " +
        std::to_string(d.have.size()) +
        " pieces of this deduplicated shard that other members of replica group [" +
        JoinRanks(d.members) + "] keep could be read from none of them (" +
        (last_problem_.empty() ? plan.errors : last_problem_ + "; " + plan.errors) +
        "); their bytes in the buffer are zeroed");
  }
  RecordRestoreLocked(plan, order.empty() ? "" : order[0]->TierName(), nbytes, wanted, start);
  return Status::Ok();
}

// A deduplicated shard's pieces other members keep, gathered once this rank's own are in.
// Returns how many pieces no member supplied (zeroed in out: never wrong bytes).
uint64_t Db::GatherDedupPieces(uint64_t version, const char* name, uint8_t* out,
                               RestorePlan* plan_ptr) {
  RestorePlan& plan = *plan_ptr;
  uint64_t pieces_missing = 0;
  RestorePlan::Dedup& d = *plan.dedup;
  // Its own pieces no tier could supply are kept by another member too (slice p by member
  // p - 1, slice p + 1 by member p + 1): they are gathered like the rest.
  for (uint32_t c : plan.pending) d.have[plan.dst_offset[c - plan.first] / d.piece_bytes] = false;
  GatherSlices(version, name, out, &plan);
  std::erase_if(plan.pending, [&](uint32_t c) {
    return d.have[plan.dst_offset[c - plan.first] / d.piece_bytes];
  });
  for (size_t p = 0; p < d.have.size(); ++p) {
    if (d.have[p]) continue;  // kept here (pending says whether it was read) or gathered
    // Never wrong bytes: a piece no member supplied is zeroed.
    const uint64_t off = p * d.piece_bytes;
    std::memset(out + off, 0, std::min(d.piece_bytes, d.full_bytes - off));
    ++pieces_missing;
  }
  return pieces_missing;
}

// What a successful restore leaves in the figures (ckptdb_stats): where its bytes came from, the
// first source that served any (the fastest) and all of them; the call, its bytes and its time.
void Db::RecordRestoreLocked(const RestorePlan& plan, const std::string& first_tier, size_t nbytes,
                             const ByteRanges* wanted, uint64_t start) {
  std::string first_source = plan.served.empty() ? "" : plan.served[0].first;
  if (first_source.empty()) first_source = first_tier;  // an empty tensor
  std::string sources;
  for (const auto& [source, bytes] : plan.served) {
    sources += (sources.empty() ? "" : "; ") + source + " " + std::to_string(bytes);
  }
  figures_.SetLastRestore(first_source, sources);
  figures_.restore_calls++;
  uint64_t wanted_bytes = nbytes;  // a slice counts the ranges it asked for
  if (wanted != nullptr) {
    wanted_bytes = 0;
    for (const auto& [begin, end] : *wanted) wanted_bytes += end - begin;
  }
  figures_.restore_bytes += wanted_bytes;
  figures_.restore_ns += MonoNs() - start;
}

// A box of a global tensor (resharding, docs/api.md): the part of it that this store's shard
// holds. Only the chunks that part lies in are read, into an anonymous mapping the size of the
// shard whose untouched pages cost nothing; then its runs are copied into the caller's box. On
// any error dst is left as it was, except when the box is the shard itself (read in place).
Status Db::RestoreSlice(uint64_t version, const char* name, const ckptdb_box* box, void* dst,
                        size_t nbytes, unsigned flags, uint64_t* covered) {
  CKPTDB_RETURN_IF_ERROR(ValidateName(name, "restore_slice"));
  const std::string what = "restore_slice " + QuoteName(name) + " of " + V(version);
  if (box == nullptr) return Status::Invalid(what + ": box is NULL");
  if (covered == nullptr) return Status::Invalid(what + ": covered is NULL");
  if (flags != 0) return Status::Invalid(what + ": unknown flags " + std::to_string(flags));
  if (box->ndim > CKPTDB_MAX_DIMS) {
    return Status::Invalid(what + ": the box has " + std::to_string(box->ndim) +
                           " dimensions; at most " + std::to_string(CKPTDB_MAX_DIMS));
  }
  if (dst == nullptr && nbytes > 0) return Status::Invalid(what + ": dst is NULL");
  if (nbytes > 0) {
    int device = -1;
    CKPTDB_RETURN_IF_ERROR(LocateDevice(dst, false, what, &device));
    if (device >= 0) {
      return Status::NotSupported(what +
                                  ": dst is device memory; restore the box into host "
                                  "memory and copy it");
    }
  }
  int dtype = CKPTDB_DTYPE_UNKNOWN;
  Box shard, global;
  uint64_t shard_bytes = 0;
  CKPTDB_RETURN_IF_ERROR(WithManifest(version, what, [&](const format::ManifestView& m, size_t) {
    const fb::Tensor* t = m.Find(name);
    if (t == nullptr) return Status::NotFound(what + ": the version has no tensor by that name");
    dtype = static_cast<int>(t->dtype());
    const size_t ndim = t->shape() ? t->shape()->size() : 0;
    if (t->shape() != nullptr) shard.shape.assign(t->shape()->begin(), t->shape()->end());
    if (t->global_shape() != nullptr && t->global_shape()->size() == ndim && ndim > 0 &&
        t->global_offset() != nullptr && t->global_offset()->size() == ndim) {
      global.shape.assign(t->global_shape()->begin(), t->global_shape()->end());
      shard.offset.assign(t->global_offset()->begin(), t->global_offset()->end());
    } else {
      global.shape = shard.shape;
      shard.offset.assign(ndim, 0);
    }
    global.offset.assign(ndim, 0);
    shard_bytes = format::ShardBytes(*t);
    return Status::Ok();
  }));
  if (dtype == CKPTDB_DTYPE_UNKNOWN && shard.ndim() == 0) {
    return Status::Invalid(what +
                           ": the shard is raw bytes, not a tensor (ckptdb_restore reads it)");
  }
  if (box->ndim != shard.ndim()) {
    return Status::Invalid(what + ": the box has " + std::to_string(box->ndim) +
                           " dimensions, the tensor " + std::to_string(shard.ndim()));
  }
  Box want;
  want.offset.assign(box->offset, box->offset + box->ndim);
  want.shape.assign(box->shape, box->shape + box->ndim);
  for (size_t d = 0; d < want.ndim(); ++d) {
    if (want.offset[d] > global.shape[d] || want.shape[d] > global.shape[d] - want.offset[d]) {
      std::string gs;
      for (uint64_t s : global.shape) gs += (gs.empty() ? "" : ", ") + std::to_string(s);
      return Status::Invalid(what + ": the box " + want.ToString() +
                             " lies outside the global shape [" + gs + "]");
    }
  }
  const uint64_t element = ckptdb_dtype_bytes(dtype);
  uint64_t volume = 0;
  if (!want.Volume(&volume) || volume > UINT64_MAX / element || volume * element != nbytes) {
    return Status::Size(what + ": the box " + want.ToString() + " is " + std::to_string(volume) +
                        " elements of " + std::to_string(element) + " bytes, the buffer is " +
                        std::to_string(nbytes) + " bytes");
  }
  Box part;
  if (!Intersect(want, shard, &part) || shard_bytes == 0) {
    *covered = 0;  // this shard holds none of the box
    return Status::Ok();
  }
  uint64_t part_volume = 0;
  CKPTDB_ASSERT(part.Volume(&part_volume));
  if (part.shape == shard.shape && want.shape == shard.shape) {
    // The box is the shard: no staging. On a read failure dst holds no unverified bytes (the
    // failed chunks zeroed, as ckptdb_restore does), but it is no longer as it was.
    CKPTDB_RETURN_IF_ERROR(Restore(version, name, dst, nbytes, 0).WithContext(what));
    *covered = part_volume;
    return Status::Ok();
  }
  ByteRanges ranges;
  ForEachRun(part, shard, want, element, [&](uint64_t from, uint64_t, uint64_t bytes) {
    if (!ranges.empty() && ranges.back().second == from) {
      ranges.back().second += bytes;
    } else {
      ranges.emplace_back(from, from + bytes);
    }
  });
  void* staging = mmap(nullptr, shard_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (staging == MAP_FAILED) {
    return Status::FromErrno(
        errno, what + ": mapping " + std::to_string(shard_bytes) + " bytes to stage the shard");
  }
  Status st = Restore(version, name, staging, shard_bytes, 0, &ranges);
  if (st.ok()) {
    const auto* from = static_cast<const uint8_t*>(staging);
    auto* to = static_cast<uint8_t*>(dst);
    ForEachRun(part, shard, want, element, [&](uint64_t f, uint64_t t, uint64_t bytes) {
      std::memcpy(to + t, from + f, bytes);
    });
    *covered = part_volume;
  }
  munmap(staging, shard_bytes);
  return st.ok() ? st : st.WithContext(what);
}

Status Db::Recoverable(uint64_t version, ckptdb_recoverable_t* out) {
  *out = ckptdb_recoverable_t{};
  const std::string what = "recoverable " + V(version);
  std::string detail;
  if (cluster_ != nullptr) {
    RecoverableInfo info;
    CKPTDB_RETURN_IF_ERROR(cluster_->Recoverable(version, &info).WithContext(what));
    out->recoverable = info.recoverable ? 1 : 0;
    out->spare_losses = info.spare_losses;
    out->ranks_local = info.ranks_local;
    out->ranks_from_peers = info.ranks_from_peers;
    out->ranks_lost = info.ranks_lost;
    detail = info.detail;
  } else {
    // Alone: this rank's tiers, and no node to lose.
    {
      std::lock_guard<std::mutex> lock(mu_);
      CKPTDB_RETURN_IF_ERROR(CheckCommittedLocked(version, what));  // unknown, open, aborted
    }
    std::vector<size_t> copies;
    Status st = CommittedCopies(version, what, &copies);
    if (!st.ok() && st.code() != CKPTDB_ENOTFOUND) return st;
    out->recoverable = st.ok() ? 1 : 0;
    out->spare_losses = st.ok() ? 0 : -1;
    out->ranks_local = st.ok() ? 1 : 0;
    out->ranks_lost = st.ok() ? 0 : 1;
    if (st.ok()) {
      detail = V(version) + ": from this rank's tiers (";
      for (size_t i = 0; i < copies.size(); ++i) {
        detail += (i ? ", " : "") + tiers_[copies[i]].name();
      }
      detail += "); no redundancy in other nodes' memory";
    } else {
      detail = st.message();
    }
  }
  std::snprintf(out->detail, sizeof out->detail, "%s", detail.c_str());
  return Status::Ok();
}

Status Db::Latest(uint64_t* version) {
  // A job: the coordinator's answer, the same on every rank (DESIGN.md section 6).
  if (cluster_ != nullptr) return cluster_->Latest(version);
  // Candidates newest first, looked at under the lock; files are checked without it.
  struct Copy {
    uint64_t version;
    std::string path;  // empty: a ram copy the arena holds
    uint64_t file_bytes;
  };
  std::vector<Copy> copies;
  size_t committed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
    for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
      if (it->second.record.state != CKPTDB_STATE_COMMITTED) continue;
      ++committed;
      for (const ResidencyRecord& r : it->second.residency) {
        int t = TierIndex(r.tier);
        if (r.state != CKPTDB_RESIDENT_DURABLE || t < 0) continue;
        if (!tiers_[t].is_ram()) {
          copies.push_back({it->first, r.path, r.file_bytes});
        } else if (ram_images_.count(it->first)) {
          copies.push_back({it->first, "", 0});
        }
      }
    }
  }
  for (const Copy& c : copies) {
    uint64_t bytes = 0;
    if (c.path.empty() || (io_->PathSize(c.path, &bytes).ok() && bytes == c.file_bytes)) {
      *version = c.version;
      return Status::Ok();
    }
  }
  if (committed == 0) return Status::NotFound("no version has been committed in " + options_.root);
  return Status::NotFound(std::to_string(committed) +
                          " committed versions, but no configured tier still holds any of them");
}

// Calls visit with the manifest of the fastest readable committed copy of `version`.
Status Db::WithManifest(
    uint64_t version, const std::string& what,
    const std::function<Status(const format::ManifestView&, size_t tier)>& visit) {
  std::lock_guard<std::mutex> read_lock(read_mu_);
  std::vector<size_t> candidates;
  CKPTDB_RETURN_IF_ERROR(CommittedCopies(version, what, &candidates));
  std::string errors;
  for (size_t ti : candidates) {
    OpenSegment* seg = nullptr;
    Status st = ReadSegment(version, ti, &seg);
    if (!st.ok()) {
      errors += (errors.empty() ? "" : "; ") + st.message();
      continue;
    }
    // The manifest is the reader's own copy: visiting it does not need the pin.
    RamPin(this, version, tiers_[ti].is_ram()).Release();
    return visit(seg->reader->manifest(), ti);
  }
  return Status::Corrupt(what + ": no tier has a readable manifest" +
                         (errors.empty() ? "" : ": " + errors));
}

Status Db::List(uint64_t version, ckptdb_list_fn fn, void* arg) {
  if (fn == nullptr) return Status::Invalid("list: fn is NULL");
  return WithManifest(version, "list " + V(version), [&](const format::ManifestView& m, size_t) {
    for (uint32_t i = 0; i < m.tensor_count(); ++i) {
      const fb::Tensor& t = m.tensor(i);
      std::string name = t.name()->str();
      ckptdb_tensor_desc d{};
      d.name = name.c_str();
      d.dtype = static_cast<int>(t.dtype());
      d.ndim = t.shape() ? t.shape()->size() : 0;
      d.shape = t.shape() ? t.shape()->data() : nullptr;
      d.global_shape =
          (t.global_shape() && t.global_shape()->size()) ? t.global_shape()->data() : nullptr;
      d.global_offset =
          (t.global_offset() && t.global_offset()->size()) ? t.global_offset()->data() : nullptr;
      d.nbytes = format::ShardBytes(t);  // what a restore fills; a deduplicated shard keeps less
      d.chunk_count = t.chunk_count();
      d.kept_bytes = t.bytes();
      d.parity_chunks = t.parity_chunks();
      d.recomputed = t.recomputed() ? 1 : 0;
      const uint32_t parity_first = t.first_chunk() + t.chunk_count();
      for (uint32_t c = parity_first; c < parity_first + d.parity_chunks; ++c) {
        d.parity_bytes += m.chunk(c).payload_bytes();
      }
      if (fn(arg, &d) != 0) break;
    }
    return Status::Ok();
  });
}

Status Db::ListChunks(uint64_t version, const char* name, ckptdb_chunk_fn fn, void* arg,
                      const char** source) {
  CKPTDB_RETURN_IF_ERROR(ValidateName(name, "list_chunks"));
  if (fn == nullptr) return Status::Invalid("list_chunks: fn is NULL");
  const std::string what = "list_chunks " + QuoteName(name) + " of " + V(version);
  return WithManifest(version, what, [&](const format::ManifestView& m, size_t tier) {
    const fb::Tensor* t = m.Find(name);
    if (t == nullptr) return Status::NotFound(what + ": the version has no tensor by that name");
    if (source != nullptr) *source = tiers_[tier].name().c_str();
    for (uint32_t c = t->first_chunk(); c < t->first_chunk() + t->chunk_count(); ++c) {
      const fb::Chunk& chunk = m.chunk(c);
      ckptdb_chunk_desc d{c, chunk.record_offset(), chunk.payload_bytes(), chunk.xxh3()};
      if (fn(arg, &d) != 0) break;
    }
    return Status::Ok();
  });
}

}  // namespace ckpt::engine
