#include "engine/db.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "util/assert.h"

namespace ckpt::engine {
namespace {

using format::kBlockBytes;

CrashHook g_crash_hook = nullptr;

void CrashPoint(const char* point) {
  if (g_crash_hook != nullptr) g_crash_hook(point);
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}
uint64_t MonoNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Tags of write-queue requests: kind in the top byte, tier index, then the staging slot.
enum TagKind : uint64_t { kTagSlot = 1, kTagCommit = 2 };
uint64_t MakeTag(TagKind kind, size_t tier, size_t slot) {
  return (uint64_t{kind} << 56) | (uint64_t{tier} << 40) | slot;
}
TagKind TagKindOf(uint64_t tag) { return static_cast<TagKind>(tag >> 56); }
size_t TagTier(uint64_t tag) { return (tag >> 40) & 0xffff; }
size_t TagSlot(uint64_t tag) { return tag & 0xffffffffffu; }

// Copy pieces small enough to stay in L2 between the copy and the hash (DESIGN.md section 5).
constexpr size_t kCopyPieceBytes = 256 << 10;
// Bounds on the in-memory history of retired and aborted versions kept for inspect.
constexpr size_t kMaxHistoryRecords = 64;
// Cached open segments for restore.
constexpr size_t kMaxOpenSegments = 16;
// Chunk reads a restore keeps in flight per segment. Restore reads are buffered, so the kernel's
// readahead already prefetches; two in flight overlap one chunk's xxh3 with the next chunk's read
// and keep the file's access sequential. Deeper queues scatter the reads over io_uring workers,
// which defeats readahead: on the disk tier of docs/performance.md, restore ran at 1.8-2.9 GB/s
// with 64 in flight and 4.2-4.6 GB/s (91-95% of a plain sequential read) with 1-2; tmpfs was the
// same either way.
constexpr size_t kRestoreReadsInFlight = 2;

std::string V(uint64_t version) { return "version " + std::to_string(version); }

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

}  // namespace

void SetCrashHookForTesting(CrashHook hook) { g_crash_hook = hook; }

Db::Db(DbOptions options) : options_(std::move(options)) {}

Db::~Db() { (void)Close(); }

Status Db::Open(const DbOptions& options, std::unique_ptr<Db>* out) {
  auto db = std::unique_ptr<Db>(new Db(options));
  Status st = db->OpenImpl();
  if (!st.ok()) {
    // A store this call created and could not finish opening is removed again, so a failed
    // first open leaves nothing behind.
    bool created = db->created_root_;
    std::vector<std::string> markers = db->markers_written_;
    io::Io* io = db->io_;
    std::unique_ptr<io::Io> owned = std::move(db->owned_io_);
    (void)db->Close();
    if (created) {
      // The store's identity dies with its root, so the tier markers naming it must go too or
      // every later open would find the tiers "owned by another store".
      for (const std::string& m : markers) (void)io->Remove(m);
      std::error_code ec;
      std::filesystem::remove_all(options.root, ec);
    }
    return st;
  }
  *out = std::move(db);
  return Status::Ok();
}

Status Db::OpenImpl() {
  const DbOptions& o = options_;
  if (o.root.empty()) return Status::Invalid("options: root is empty; name the store's directory");
  if (o.world_size != 1) {
    return Status::NotSupported("options: world_size " + std::to_string(o.world_size) +
                                ": this build runs one rank (world_size = 1) per store");
  }
  if (o.rank >= o.world_size) {
    return Status::Invalid("options: rank " + std::to_string(o.rank) + " is not below world_size " +
                           std::to_string(o.world_size));
  }
  if (!o.redundancy.empty() && o.redundancy != "none") {
    return Status::NotSupported("options: redundancy \"" + o.redundancy +
                                "\": this build supports only \"none\"");
  }
  if (o.chunk_bytes < kBlockBytes || o.chunk_bytes > format::kMaxChunkBytes ||
      !format::IsAligned(o.chunk_bytes)) {
    return Status::Invalid("options: chunk_bytes " + std::to_string(o.chunk_bytes) +
                           " must be a multiple of 4096 between 4096 and 1 GiB");
  }
  if (o.queue_depth == 0 || o.queue_depth > 4096) {
    return Status::Invalid("options: queue_depth " + std::to_string(o.queue_depth) +
                           " must be between 1 and 4096");
  }
  slot_bytes_ = kBlockBytes + o.chunk_bytes;
  if (!o.read_only && o.staging_bytes / slot_bytes_ < 2) {
    return Status::Invalid("options: staging_bytes " + std::to_string(o.staging_bytes) +
                           " holds fewer than 2 chunks of " + std::to_string(o.chunk_bytes) +
                           " bytes plus their 4096-byte record headers");
  }

  std::error_code ec;
  std::string cwd = std::filesystem::current_path(ec).string();
  std::vector<io::TierSpec> specs;
  if (!o.read_only) {
    // Bad input changes nothing: the spec is checked before the store is created.
    std::string spec = o.tiers.empty() ? "disk:" + o.root + "/segments" : o.tiers;
    CKPTDB_RETURN_IF_ERROR(io::ParseTierSpecs(spec, cwd, &specs));
  }

  if (o.io != nullptr) {
    io_ = o.io;
  } else {
    owned_io_ = io::NewPosixIo();
    io_ = owned_io_.get();
  }
  const std::string& root = o.root;
  uint64_t ignored;
  Status exists = io_->PathSize(root, &ignored);
  if (!exists.ok()) {
    if (exists.code() != CKPTDB_ENOTFOUND) return exists;
    if (o.read_only || !o.create_if_missing) {
      return Status::NotFound("no ckptdb store at " + root);
    }
    CKPTDB_RETURN_IF_ERROR(io_->CreateDirs(root));
    created_root_ = true;
  } else if (o.read_only || !o.create_if_missing) {
    // Refuse a directory that is not a store before touching it (no LOCK, no catalog files).
    Status is_store = io_->PathSize(root + "/catalog/CURRENT", &ignored);
    if (!is_store.ok()) return Status::NotFound("no ckptdb store at " + root + " (no catalog)");
  }
  if (!o.read_only) {
    std::string lock_path = root + "/LOCK";
    lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) return Status::FromErrno(errno, "opening " + lock_path);
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      ::close(lock_fd_);
      lock_fd_ = -1;
      if (err == EWOULDBLOCK) {
        return Status::Busy("store " + root +
                            " is open read-write by another handle (in this or another process); "
                            "close it there first (read-only tools such as ckptdb inspect may "
                            "run alongside)");
      }
      return Status::FromErrno(err, "locking " + lock_path);
    }
  }
  CKPTDB_RETURN_IF_ERROR(
      Catalog::Open(root + "/catalog", o.read_only, o.create_if_missing, &catalog_));
  Status st = catalog_->GetIdentity(&identity_);
  if (st.code() == CKPTDB_ENOTFOUND) {
    if (o.read_only) return Status::NotFound("store " + root + " has no identity record");
    uint64_t job_id = 0;
    if (getrandom(&job_id, sizeof job_id, 0) != sizeof job_id) {
      return Status::FromErrno(errno, "getrandom for the store's job id");
    }
    identity_ = Identity{job_id, o.rank, o.world_size, o.chunk_bytes, NowNs()};
    CKPTDB_RETURN_IF_ERROR(catalog_->PutIdentity(identity_));
  } else if (!st.ok()) {
    return st;
  } else if (!o.read_only && identity_.rank != o.rank) {
    return Status::Invalid("store " + root + " belongs to rank " + std::to_string(identity_.rank) +
                           ", not rank " + std::to_string(o.rank));
  }

  if (o.read_only) {
    // Tools open with the tiers of the last read-write open unless told otherwise.
    std::string spec = o.tiers;
    if (spec.empty()) {
      Status ts = catalog_->GetTiers(&spec);
      if (!ts.ok() && ts.code() != CKPTDB_ENOTFOUND) return ts;
    }
    if (spec.empty()) spec = "disk:" + root + "/segments";
    CKPTDB_RETURN_IF_ERROR(io::ParseTierSpecs(spec, cwd, &specs));
  }
  std::string canonical;
  for (const io::TierSpec& s : specs) {
    auto tier = std::make_unique<Tier>(io_, s);
    Status ts = tier->Open(identity_.job_id, o.read_only);
    if (tier->wrote_marker()) markers_written_.push_back(s.path + "/" + Tier::kMarkerName);
    CKPTDB_RETURN_IF_ERROR(ts);
    canonical += (canonical.empty() ? "" : ";") + s.name;
    if (s.keep) canonical += ",keep=" + std::to_string(s.keep);
    if (s.every != 1) canonical += ",every=" + std::to_string(s.every);
    tiers_.push_back(std::move(tier));
  }

  io::QueueOptions qo;
  qo.queue_depth = o.queue_depth;
  CKPTDB_RETURN_IF_ERROR(io_->NewQueue(qo, &read_queue_));
  if (!o.read_only) {
    CKPTDB_RETURN_IF_ERROR(catalog_->PutTiers(canonical));
    io::QueueOptions wqo = qo;
    wqo.offload_writes = true;  // the kernel copies into tmpfs while put_shard stages the next chunk
    CKPTDB_RETURN_IF_ERROR(io_->NewQueue(wqo, &write_queue_));
    // Staging is allocated and faulted in once (LIMITS.md: first touch runs at 0.3 GB/s here),
    // never per checkpoint.
    slot_count_ = std::min<size_t>(o.staging_bytes / slot_bytes_, 1u << 20);
    staging_bytes_ = slot_count_ * slot_bytes_;
    void* p = ::mmap(nullptr, staging_bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      return Status::FromErrno(
          errno, "allocating " + std::to_string(staging_bytes_) + " bytes of staging");
    }
    staging_ = static_cast<uint8_t*>(p);
    (void)::mlock(staging_, staging_bytes_);  // best effort: unprivileged limits are small
    iovec iov{staging_, staging_bytes_};
    fixed_buffers_ = write_queue_->RegisterBuffers(std::span<const iovec>(&iov, 1)).ok();
    slot_pending_.assign(slot_count_, 0);
    slot_version_.assign(slot_count_, 0);
    for (size_t i = slot_count_; i > 0; --i) free_slots_.push_back(i - 1);
  }
  CKPTDB_RETURN_IF_ERROR(catalog_->LoadAll(&versions_));
  if (!o.read_only) CKPTDB_RETURN_IF_ERROR(Recover());
  return Status::Ok();
}

int Db::TierIndex(const std::string& name) const {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i]->name() == name) return static_cast<int>(i);
  }
  return -1;
}

bool Db::FileDurable(const ResidencyRecord& r) const {
  uint64_t bytes = 0;
  return io_->PathSize(r.path, &bytes).ok() && bytes == r.file_bytes;
}

std::optional<uint64_t> Db::LastCommitted() const {
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second.record.state == CKPTDB_STATE_COMMITTED ||
        it->second.record.state == CKPTDB_STATE_RETIRED) {
      return it->first;
    }
  }
  return std::nullopt;
}

// Presumed abort (DESIGN.md section 6): a version without a durable COMMITTED record was never
// visible, so recovery aborts it and deletes its files. Then every segment file of this rank that
// no committed version accounts for is collected, and committed copies that vanished (a tmpfs
// after a reboot) are marked missing so restore goes straight to a tier that has them.
Status Db::Recover() {
  CatalogBatch batch;
  std::set<std::string> dirs_to_sync;
  for (auto& [version, e] : versions_) {
    VersionRecord& r = e.record;
    if (r.state == CKPTDB_STATE_OPEN || r.state == CKPTDB_STATE_CAPTURED ||
        r.state == CKPTDB_STATE_PREPARED) {
      for (const ResidencyRecord& res : e.residency) {
        CKPTDB_RETURN_IF_ERROR(io_->Remove(res.path));
        CKPTDB_RETURN_IF_ERROR(io_->Remove(res.path + ".tmp"));
        dirs_to_sync.insert(std::filesystem::path(res.path).parent_path().string());
        batch.delete_residency.emplace_back(version, res.tier);
      }
      e.residency.clear();
      r.state = CKPTDB_STATE_ABORTED;
      batch.put_versions.push_back(r);
    } else if (r.state == CKPTDB_STATE_COMMITTED) {
      for (ResidencyRecord& res : e.residency) {
        if (res.state != CKPTDB_RESIDENT_DURABLE && res.state != CKPTDB_RESIDENT_MISSING) continue;
        // MISSING only when the file is gone (a tmpfs after reboot); a damaged file stays
        // DURABLE so restore and verify report the damage instead of hiding it.
        uint64_t bytes = 0;
        int want = io_->PathSize(res.path, &bytes).ok() ? CKPTDB_RESIDENT_DURABLE
                                                        : CKPTDB_RESIDENT_MISSING;
        if (want != res.state) {
          res.state = want;
          batch.put_residency.emplace_back(version, res);
        }
      }
    }
  }
  for (const auto& tier : tiers_) {
    std::vector<SegmentFileName> files;
    CKPTDB_RETURN_IF_ERROR(tier->ListSegments(&files));
    for (const SegmentFileName& f : files) {
      if (f.rank != identity_.rank) continue;  // another rank's files share this directory
      bool keep = false;
      auto it = versions_.find(f.version);
      if (!f.temporary && it != versions_.end() &&
          it->second.record.state == CKPTDB_STATE_COMMITTED) {
        for (const ResidencyRecord& res : it->second.residency) {
          if (res.tier == tier->name() && res.state == CKPTDB_RESIDENT_DURABLE) keep = true;
        }
      }
      if (!keep) {
        CKPTDB_RETURN_IF_ERROR(io_->Remove(tier->spec().path + "/" + f.name));
        dirs_to_sync.insert(tier->spec().path);
      }
    }
  }
  for (const std::string& d : dirs_to_sync) {
    Status st = io_->SyncDir(d);
    if (!st.ok() && st.code() != CKPTDB_ENOTFOUND) return st;
  }
  if (!batch.put_versions.empty() || !batch.put_residency.empty() ||
      !batch.delete_residency.empty()) {
    CKPTDB_RETURN_IF_ERROR(catalog_->Apply(batch, /*sync=*/true));
  }
  CrashPoint("recover:done");
  return Status::Ok();
}

Status Db::CheckNotClosed() const {
  if (closed_) return Status::State("the store is closed");
  if (!poisoned_.ok()) return Status::State(poisoned_.message());
  return Status::Ok();
}

Status Db::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return Status::Ok();
  Status result;
  if (write_queue_) {
    // Abort every version still open: nothing uncommitted survives a close.
    std::vector<uint64_t> open;
    for (const auto& [v, ov] : open_) open.push_back(v);
    for (uint64_t v : open) {
      Status st = AbortOpen(v, "the store was closed before it was committed");
      if (result.ok() && !st.ok()) result = st;
    }
    while (write_queue_->outstanding() > 0) {
      Status st = Pump(1);
      if (!st.ok()) {
        if (result.ok()) result = st;
        break;
      }
    }
  }
  for (auto& [key, seg] : segments_) {
    if (seg.fd >= 0) (void)io_->Close(seg.fd);
  }
  segments_.clear();
  write_queue_.reset();  // unregisters staging before it is unmapped
  read_queue_.reset();
  if (staging_ != nullptr) {
    ::munmap(staging_, staging_bytes_);
    staging_ = nullptr;
  }
  catalog_.reset();
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  closed_ = true;
  return result;
}

// ---- Write path --------------------------------------------------------------------------------

Status Db::Pump(size_t min_completions) {
  std::vector<io::IoCompletion> done;
  CKPTDB_RETURN_IF_ERROR(write_queue_->Reap(min_completions, &done, -1));
  for (const io::IoCompletion& c : done) {
    size_t tier = TagTier(c.tag);
    uint64_t version = committing_version_;
    if (TagKindOf(c.tag) == kTagSlot) {
      size_t slot = TagSlot(c.tag);
      CKPTDB_ASSERT(slot < slot_count_ && slot_pending_[slot] > 0);
      version = slot_version_[slot];
      if (--slot_pending_[slot] == 0) free_slots_.push_back(slot);
    } else {
      CKPTDB_ASSERT(TagKindOf(c.tag) == kTagCommit);
    }
    CKPTDB_ASSERT(tier < tiers_.size());
    auto it = open_.find(version);
    if (it == open_.end()) continue;
    OpenVersion& v = it->second;
    CKPTDB_ASSERT(v.writes_in_flight > 0);
    --v.writes_in_flight;
    if (c.result < 0) {
      if (v.error.ok()) {
        v.error =
            Status::FromErrno(static_cast<int>(-c.result),
                              "writing " + V(version) + " to tier " + tiers_[tier]->name() + " (" +
                                  tiers_[tier]->TempPath(version, identity_.rank) + ")");
      }
    } else if (c.result > 0) {
      stats_.tier_bytes_written[tier] += static_cast<uint64_t>(c.result);
    }
  }
  return Status::Ok();
}

Status Db::AcquireSlot(size_t* slot) {
  // Bounded: each Pump returns at least one completion, and every busy slot has writes in flight.
  while (free_slots_.empty()) {
    CKPTDB_ASSERT(write_queue_->outstanding() > 0);
    CKPTDB_RETURN_IF_ERROR(Pump(1));
  }
  *slot = free_slots_.back();
  free_slots_.pop_back();
  CKPTDB_ASSERT(slot_pending_[*slot] == 0);
  return Status::Ok();
}

Status Db::SubmitWrites(OpenVersion* v, size_t slot, uint64_t offset, const void* buf,
                        uint64_t length, bool from_slot) {
  CKPTDB_ASSERT(format::IsAligned(offset) && format::IsAligned(length));
  CKPTDB_ASSERT(reinterpret_cast<uintptr_t>(buf) % kBlockBytes == 0);
  io::IoRequest reqs[CKPTDB_MAX_TIERS];
  size_t n = 0;
  for (const TierWriter& w : v->writers) {
    io::IoRequest& r = reqs[n++];
    r.op = io::IoRequest::Op::kWrite;
    r.fd = w.fd;
    r.offset = offset;
    r.buffer = const_cast<void*>(buf);
    r.length = length;
    r.buffer_index = (from_slot && fixed_buffers_) ? 0 : -1;
    r.tag =
        from_slot ? MakeTag(kTagSlot, w.tier_index, slot) : MakeTag(kTagCommit, w.tier_index, 0);
  }
  if (from_slot) {
    slot_pending_[slot] = static_cast<uint32_t>(n);
    slot_version_[slot] = v->version;
  }
  v->writes_in_flight += static_cast<uint32_t>(n);
  Status st = write_queue_->Submit(std::span<const io::IoRequest>(reqs, n));
  if (!st.ok()) {
    // Nothing of this batch reached the kernel; undo the accounting so the slot is reusable.
    v->writes_in_flight -= static_cast<uint32_t>(n);
    if (from_slot) {
      slot_pending_[slot] = 0;
      free_slots_.push_back(slot);
    }
  }
  return st;
}

Status Db::OpenVersionFor(uint64_t version, OpenVersion** out) {
  auto it = open_.find(version);
  if (it != open_.end()) {
    *out = &it->second;
    return Status::Ok();
  }
  auto known = versions_.find(version);
  if (known != versions_.end()) {
    int s = known->second.record.state;
    if (s == CKPTDB_STATE_COMMITTED || s == CKPTDB_STATE_RETIRED) {
      return Status::State(V(version) + " is already committed; put shards into a new version");
    }
  }
  std::optional<uint64_t> last = LastCommitted();
  if (last && version <= *last) {
    return Status::State(V(version) + " is not above the last committed version " +
                         std::to_string(*last) + "; versions must increase");
  }
  OpenVersion v;
  v.version = version;
  v.created_unix_ns = NowNs();
  CatalogBatch batch;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!tiers_[i]->TakesVersion(version)) continue;
    TierWriter w;
    w.tier_index = i;
    Status st = tiers_[i]->CreateTemp(version, identity_.rank, &w.fd);
    if (!st.ok()) {
      for (TierWriter& done : v.writers) {
        (void)io_->Close(done.fd);
        (void)tiers_[done.tier_index]->RemoveSegment(version, identity_.rank);
      }
      return st.WithContext("opening " + V(version) + " on tier " + tiers_[i]->name());
    }
    v.writers.push_back(w);
    batch.put_residency.emplace_back(
        version, ResidencyRecord{tiers_[i]->name(), CKPTDB_RESIDENT_WRITING,
                                 tiers_[i]->TempPath(version, identity_.rank), 0});
  }
  CKPTDB_ASSERT(!v.writers.empty());  // the first tier takes every version (every=1)
  VersionRecord rec;
  rec.version = version;
  rec.state = CKPTDB_STATE_OPEN;
  rec.rank = identity_.rank;
  rec.created_unix_ns = v.created_unix_ns;
  batch.delete_versions.push_back(version);  // an aborted earlier attempt at this version
  batch.put_versions.push_back(rec);
  // Not synced: an OPEN record lost in a crash changes nothing, recovery collects the files.
  Status st = catalog_->Apply(batch, /*sync=*/false);
  auto [pos, inserted] = open_.emplace(version, std::move(v));
  CKPTDB_ASSERT(inserted);
  OpenVersion* ov = &pos->second;
  if (st.ok()) {
    VersionEntry& e = versions_[version];
    e.has_record = true;
    e.record = rec;
    e.residency.clear();
    for (auto& [ver, r] : batch.put_residency) e.residency.push_back(r);
    // The segment header block, written from a staging slot (its bytes past 64 are zero).
    size_t slot;
    st = AcquireSlot(&slot);
    if (st.ok()) {
      uint8_t* base = staging_ + slot * slot_bytes_;
      format::SegmentHeader h;
      h.job_id = identity_.job_id;
      h.version = version;
      h.rank = identity_.rank;
      h.world_size = identity_.world_size;
      h.chunk_bytes = options_.chunk_bytes;
      h.created_unix_ns = ov->created_unix_ns;
      format::EncodeSegmentHeader(h, std::span<uint8_t, 64>(base, 64));
      std::memset(base + 64, 0, kBlockBytes - 64);
      st = SubmitWrites(ov, slot, 0, base, kBlockBytes, /*from_slot=*/true);
      ov->next_offset = kBlockBytes;
    }
  }
  if (!st.ok()) {
    (void)AbortOpen(version, st.message());
    return st;
  }
  *out = ov;
  return Status::Ok();
}

Status Db::WriteChunk(OpenVersion* v, const uint8_t* src, uint64_t bytes) {
  CKPTDB_ASSERT(bytes > 0 && bytes <= options_.chunk_bytes);
  size_t slot;
  CKPTDB_RETURN_IF_ERROR(AcquireSlot(&slot));
  uint8_t* base = staging_ + slot * slot_bytes_;
  uint8_t* payload = base + kBlockBytes;
  format::Xxh3Stream hash;
  for (uint64_t off = 0; off < bytes; off += kCopyPieceBytes) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyPieceBytes, bytes - off));
    std::memcpy(payload + off, src + off, n);
    hash.Update(payload + off, n);
  }
  uint64_t padded = format::AlignUp(bytes);
  std::memset(payload + bytes, 0, padded - bytes);
  format::RecordHeader rh;
  rh.type = format::RecordType::kChunk;
  rh.payload_bytes = bytes;
  rh.payload_xxh3 = hash.Digest();
  rh.record_offset = v->next_offset;
  rh.version = v->version;
  rh.rank = identity_.rank;
  rh.sequence = static_cast<uint32_t>(v->chunks.size());
  format::EncodeRecordHeader(rh, std::span<uint8_t, 64>(base, 64));
  std::memset(base + 64, 0, kBlockBytes - 64);
  v->chunks.push_back({v->next_offset, bytes, rh.payload_xxh3});
  uint64_t record_bytes = format::RecordBytes(bytes);
  CKPTDB_RETURN_IF_ERROR(SubmitWrites(v, slot, v->next_offset, base, record_bytes, true));
  v->next_offset += record_bytes;
  return Status::Ok();
}

namespace {

Status ValidateTensorInfo(const ckptdb_tensor_info* info, const std::string& what, size_t nbytes,
                          format::TensorEntry* t) {
  if (info == nullptr) return Status::Ok();
  if (info->dtype < 0 || info->dtype >= CKPTDB_DTYPE_COUNT_) {
    return Status::Invalid(what + ": unknown dtype " + std::to_string(info->dtype));
  }
  if (info->ndim > CKPTDB_MAX_DIMS) {
    return Status::Invalid(what + ": ndim " + std::to_string(info->ndim) + " exceeds " +
                           std::to_string(CKPTDB_MAX_DIMS));
  }
  size_t element_bytes = format::DTypeBytes(static_cast<uint32_t>(info->dtype));
  uint64_t elements = 1;
  for (uint32_t d = 0; d < info->ndim; ++d) {
    if (__builtin_mul_overflow(elements, info->shape[d], &elements)) {
      return Status::Invalid(what + ": shape overflows 64 bits");
    }
  }
  bool scalar_or_shaped = info->ndim > 0 || info->dtype != CKPTDB_DTYPE_UNKNOWN;
  uint64_t expected = 0;
  if (scalar_or_shaped &&
      (__builtin_mul_overflow(elements, element_bytes, &expected) || expected != nbytes)) {
    std::string shape;
    for (uint32_t d = 0; d < info->ndim; ++d)
      shape += (d ? "x" : "") + std::to_string(info->shape[d]);
    return Status::Invalid(what + ": shape [" + shape + "] of " + ckptdb_dtype_name(info->dtype) +
                           " is " + std::to_string(expected) + " bytes, but nbytes is " +
                           std::to_string(nbytes));
  }
  bool global = false;
  for (uint32_t d = 0; d < info->ndim; ++d) global |= info->global_shape[d] != 0;
  for (uint32_t d = 0; d < info->ndim; ++d) {
    if (!global && info->global_offset[d] != 0) {
      return Status::Invalid(what + ": global_offset given without global_shape");
    }
    uint64_t end;
    if (global && (__builtin_add_overflow(info->global_offset[d], info->shape[d], &end) ||
                   end > info->global_shape[d])) {
      return Status::Invalid(what + ": in dimension " + std::to_string(d) + " the shard [" +
                             std::to_string(info->global_offset[d]) + ", +" +
                             std::to_string(info->shape[d]) + ") lies outside global size " +
                             std::to_string(info->global_shape[d]));
    }
  }
  t->dtype = static_cast<uint8_t>(info->dtype);
  t->shape.assign(info->shape, info->shape + info->ndim);
  if (global) {
    t->global_shape.assign(info->global_shape, info->global_shape + info->ndim);
    t->global_offset.assign(info->global_offset, info->global_offset + info->ndim);
  }
  return Status::Ok();
}

Status ValidateName(const char* name, const std::string& call) {
  if (name == nullptr) return Status::Invalid(call + ": name is NULL");
  size_t n = strnlen(name, CKPTDB_MAX_NAME_BYTES + 1);
  if (n == 0) return Status::Invalid(call + ": name is empty");
  if (n > CKPTDB_MAX_NAME_BYTES) {
    return Status::Invalid(call + ": name '" + std::string(name, 64) + "...' is longer than " +
                           std::to_string(CKPTDB_MAX_NAME_BYTES) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

Status Db::PutShard(uint64_t version, const char* name, const void* data, size_t nbytes,
                    const ckptdb_tensor_info* info, unsigned flags) {
  uint64_t start = MonoNs();
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  CKPTDB_RETURN_IF_ERROR(ValidateName(name, "put_shard"));
  std::string what = "put_shard '" + std::string(name) + "' into " + V(version);
  if (options_.read_only) return Status::State(what + ": the store is open read-only");
  if (version == CKPTDB_ALL_VERSIONS) return Status::Invalid(what + ": that value is reserved");
  if (flags & ~(CKPTDB_PUT_COPY_NOW | CKPTDB_PUT_DEVICE)) {
    return Status::Invalid(what + ": unknown flags " + std::to_string(flags));
  }
  if (flags & CKPTDB_PUT_DEVICE) {
    return Status::NotSupported(what + ": device memory needs a CUDA or HIP build");
  }
  if (data == nullptr && nbytes > 0) return Status::Invalid(what + ": data is NULL");
  format::TensorEntry t;
  t.name = name;
  t.bytes = nbytes;
  CKPTDB_RETURN_IF_ERROR(ValidateTensorInfo(info, what, nbytes, &t));
  auto existing = open_.find(version);
  if (existing != open_.end()) {
    if (existing->second.names.count(t.name)) {
      return Status::Exists(what + ": the name was already put in this version");
    }
    if (!existing->second.error.ok()) {
      // A write of this version failed while another call was running: abort it now and
      // report that failure, as if this put had met it.
      Status err = existing->second.error;
      (void)AbortOpen(version, err.message());
      return err.WithContext(what + " (the version was aborted)");
    }
  }
  // Limits the reader enforces are checked before anything is written, so a put that would
  // make the version unreadable is refused and changes nothing.
  uint64_t chunks_before = existing != open_.end() ? existing->second.chunks.size() : 0;
  uint64_t tensors_before = existing != open_.end() ? existing->second.tensors.size() : 0;
  uint64_t chunks_needed = (nbytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
  if (chunks_before + chunks_needed > format::kMaxChunksPerSegment ||
      tensors_before + 1 > format::kMaxTensorsPerSegment) {
    return Status::Invalid(what + ": the version would exceed " +
                           std::to_string(format::kMaxChunksPerSegment) + " chunks or " +
                           std::to_string(format::kMaxTensorsPerSegment) +
                           " tensors; use a larger chunk_bytes or fewer shards");
  }
  OpenVersion* v = nullptr;
  CKPTDB_RETURN_IF_ERROR(OpenVersionFor(version, &v));
  t.first_chunk = static_cast<uint32_t>(v->chunks.size());
  const uint8_t* src = static_cast<const uint8_t*>(data);
  Status st;
  for (uint64_t off = 0; off < nbytes && st.ok(); off += options_.chunk_bytes) {
    st = WriteChunk(v, src + off, std::min<uint64_t>(options_.chunk_bytes, nbytes - off));
  }
  if (st.ok() && !v->error.ok()) st = v->error;
  if (!st.ok()) {
    (void)AbortOpen(version, st.message());
    return st.WithContext(what + " (the version was aborted)");
  }
  t.chunk_count = static_cast<uint32_t>(v->chunks.size()) - t.first_chunk;
  v->data_bytes += nbytes;
  v->names.insert(t.name);
  v->tensors.push_back(std::move(t));
  stats_.put_calls++;
  stats_.put_bytes += nbytes;
  stats_.put_blocked_ns += MonoNs() - start;
  return Status::Ok();
}

Status Db::WaitCapture(uint64_t version, int timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  // put_shard copies before it returns in this build, so every accepted byte is already out of
  // the caller's buffers; the call only checks that the version exists.
  if (open_.count(version)) return Status::Ok();
  auto it = versions_.find(version);
  if (it == versions_.end())
    return Status::NotFound("wait_capture " + V(version) + ": no shards were put");
  if (it->second.record.state == CKPTDB_STATE_ABORTED) {
    return Status::State("wait_capture " + V(version) + ": the version was aborted");
  }
  return Status::Ok();
}

Status Db::DrainVersion(OpenVersion* v) {
  // Bounded: each Pump returns at least one completion while this version has writes in flight.
  while (v->writes_in_flight > 0) CKPTDB_RETURN_IF_ERROR(Pump(1));
  return v->error;
}

Status Db::FinishSegments(OpenVersion* v, uint64_t* manifest_xxh3) {
  committing_version_ = v->version;
  CKPTDB_RETURN_IF_ERROR(DrainVersion(v));
  format::ManifestContents mc;
  mc.job_id = identity_.job_id;
  mc.rank = identity_.rank;
  mc.world_size = identity_.world_size;
  mc.version = v->version;
  mc.node_id = options_.node_id;
  mc.created_unix_ns = v->created_unix_ns;
  mc.writer = "ckptdb " + std::to_string(CKPTDB_VERSION_MAJOR) + "." +
              std::to_string(CKPTDB_VERSION_MINOR) + "." + std::to_string(CKPTDB_VERSION_PATCH);
  mc.tensors = v->tensors;
  mc.chunks = v->chunks;
  std::vector<uint8_t> manifest = format::BuildManifest(std::move(mc));
  if (manifest.size() > format::kMaxManifestBytes) {
    return Status::Invalid(V(v->version) + ": the manifest would be " +
                           std::to_string(manifest.size()) + " bytes, over the 1 GiB limit");
  }
  // The tail: manifest record header block, manifest padded, footer block.
  uint64_t tail_bytes = format::RecordBytes(manifest.size()) + kBlockBytes;
  std::unique_ptr<uint8_t, AlignedFree> tail(
      static_cast<uint8_t*>(std::aligned_alloc(kBlockBytes, tail_bytes)));
  if (!tail) return Status::NoMemory("allocating the manifest of " + V(v->version));
  std::memset(tail.get(), 0, tail_bytes);
  *manifest_xxh3 = format::Xxh3(manifest.data(), manifest.size());
  format::RecordHeader rh;
  rh.type = format::RecordType::kManifest;
  rh.payload_bytes = manifest.size();
  rh.payload_xxh3 = *manifest_xxh3;
  rh.record_offset = v->next_offset;
  rh.version = v->version;
  rh.rank = identity_.rank;
  rh.sequence = static_cast<uint32_t>(v->chunks.size());
  format::EncodeRecordHeader(rh, std::span<uint8_t, 64>(tail.get(), 64));
  std::memcpy(tail.get() + kBlockBytes, manifest.data(), manifest.size());
  format::SegmentFooter f;
  f.manifest_offset = v->next_offset;
  f.manifest_bytes = manifest.size();
  f.manifest_xxh3 = *manifest_xxh3;
  f.version = v->version;
  f.rank = identity_.rank;
  f.chunk_count = static_cast<uint32_t>(v->chunks.size());
  f.file_bytes = v->next_offset + tail_bytes;
  format::EncodeFooter(f, std::span<uint8_t, 64>(tail.get() + tail_bytes - 64, 64));
  CKPTDB_RETURN_IF_ERROR(SubmitWrites(v, 0, v->next_offset, tail.get(), tail_bytes, false));
  CKPTDB_RETURN_IF_ERROR(DrainVersion(v));
  v->next_offset += tail_bytes;
  // Chunk durable before manifest is visible: fsync every tier's file, then rename.
  io::IoRequest reqs[CKPTDB_MAX_TIERS];
  size_t n = 0;
  for (const TierWriter& w : v->writers) {
    io::IoRequest& r = reqs[n++];
    r.op = io::IoRequest::Op::kSync;
    r.fd = w.fd;
    r.tag = MakeTag(kTagCommit, w.tier_index, 0);
  }
  v->writes_in_flight += static_cast<uint32_t>(n);
  CKPTDB_RETURN_IF_ERROR(write_queue_->Submit(std::span<const io::IoRequest>(reqs, n)));
  CKPTDB_RETURN_IF_ERROR(DrainVersion(v));
  CrashPoint("commit:after_fsync");
  for (TierWriter& w : v->writers) {
    int fd = w.fd;
    w.fd = -1;
    CKPTDB_RETURN_IF_ERROR(tiers_[w.tier_index]->Publish(v->version, identity_.rank, fd));
    w.published = true;
  }
  return Status::Ok();
}

Status Db::Commit(uint64_t version, unsigned flags) {
  uint64_t start = MonoNs();
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  std::string what = "commit " + V(version);
  if (options_.read_only) return Status::State(what + ": the store is open read-only");
  if (flags & ~CKPTDB_COMMIT_ASYNC) {
    return Status::Invalid(what + ": unknown flags " + std::to_string(flags));
  }
  auto it = open_.find(version);
  if (it == open_.end()) {
    auto known = versions_.find(version);
    if (known != versions_.end() && known->second.record.state != CKPTDB_STATE_OPEN) {
      return Status::State(what + ": the version is " +
                           ckptdb_state_name(known->second.record.state));
    }
    return Status::NotFound(what + ": no shards were put into it");
  }
  OpenVersion& v = it->second;
  if (!v.error.ok()) {
    Status err = v.error;
    (void)AbortOpen(version, err.message());
    return err.WithContext(what + " (the version was aborted)");
  }
  VersionRecord rec = versions_[version].record;
  rec.state = CKPTDB_STATE_CAPTURED;
  rec.data_bytes = v.data_bytes;
  rec.tensor_count = static_cast<uint32_t>(v.tensors.size());
  rec.chunk_count = static_cast<uint32_t>(v.chunks.size());
  CatalogBatch captured;
  captured.put_versions.push_back(rec);
  Status st = catalog_->Apply(captured, /*sync=*/false);
  if (st.ok()) st = FinishSegments(&v, &rec.manifest_xxh3);
  CatalogBatch prepared;
  if (st.ok()) {
    // Manifest durable before PREPARED: the segments are synced and renamed by now.
    rec.state = CKPTDB_STATE_PREPARED;
    prepared.put_versions.push_back(rec);
    for (const TierWriter& w : v.writers) {
      prepared.put_residency.emplace_back(
          version, ResidencyRecord{tiers_[w.tier_index]->name(), CKPTDB_RESIDENT_DURABLE,
                                   tiers_[w.tier_index]->SegmentPath(version, identity_.rank),
                                   v.next_offset});
    }
    st = catalog_->Apply(prepared, /*sync=*/true);
  }
  if (!st.ok()) {
    (void)AbortOpen(version, st.message());
    return st.WithContext(what + " (the version was aborted)");
  }
  CrashPoint("commit:after_prepared");
  // world_size = 1: this rank is its own coordinator and every vote (its own) is in.
  rec.state = CKPTDB_STATE_COMMITTED;
  rec.committed_unix_ns = NowNs();
  CatalogBatch committed;
  committed.put_versions.push_back(rec);
  st = catalog_->Apply(committed, /*sync=*/true);
  if (!st.ok()) {
    // The decision may or may not be durable; the next open decides from the catalog. Until
    // then this handle must not claim either outcome.
    open_.erase(version);
    poisoned_ = st.WithContext(what +
                               ": writing COMMITTED failed; close and reopen the store to "
                               "learn the outcome");
    return poisoned_;
  }
  CrashPoint("commit:after_committed");
  VersionEntry& e = versions_[version];
  e.has_record = true;
  e.record = rec;
  e.residency.clear();
  for (auto& [ver, r] : prepared.put_residency) e.residency.push_back(r);
  open_.erase(version);
  // Older open versions can never commit now (versions increase).
  std::vector<uint64_t> older;
  for (const auto& [ov, unused] : open_) {
    if (ov < version) older.push_back(ov);
  }
  for (uint64_t ov : older) (void)AbortOpen(ov, "superseded by the commit of " + V(version));
  Status retention = ApplyRetention();
  if (!retention.ok()) {
    std::fprintf(stderr, "ckptdb: warning: retention after %s: %s\n", V(version).c_str(),
                 retention.ToString().c_str());
  }
  stats_.commits++;
  stats_.commit_blocked_ns += MonoNs() - start;
  return Status::Ok();
}

Status Db::AbortOpen(uint64_t version, const std::string& why) {
  auto it = open_.find(version);
  if (it == open_.end()) return Status::Ok();
  OpenVersion& v = it->second;
  // Let the kernel finish with the staging slots before they are reused; errors no longer matter.
  while (v.writes_in_flight > 0) {
    Status st = Pump(1);
    if (!st.ok()) break;
  }
  Status result;
  for (TierWriter& w : v.writers) {
    if (w.fd >= 0) (void)io_->Close(w.fd);
    w.fd = -1;
    Status st = tiers_[w.tier_index]->RemoveSegment(version, identity_.rank);
    if (result.ok() && !st.ok()) result = st;
  }
  open_.erase(it);
  VersionEntry& e = versions_[version];
  CatalogBatch batch;
  for (const ResidencyRecord& r : e.residency) batch.delete_residency.emplace_back(version, r.tier);
  e.residency.clear();
  e.has_record = true;
  e.record.version = version;
  e.record.rank = identity_.rank;
  e.record.state = CKPTDB_STATE_ABORTED;
  batch.put_versions.push_back(e.record);
  // Not synced: an abort that is lost reads as undecided, which recovery aborts again.
  Status st = catalog_->Apply(batch, /*sync=*/false);
  if (result.ok() && !st.ok()) result = st;
  stats_.aborts++;
  (void)why;
  return result;
}

Status Db::Abort(uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  if (open_.count(version)) return AbortOpen(version, "aborted by the caller");
  auto it = versions_.find(version);
  if (it == versions_.end()) return Status::NotFound("abort " + V(version) + ": unknown version");
  if (it->second.record.state == CKPTDB_STATE_ABORTED) return Status::Ok();
  return Status::State("abort " + V(version) + ": the version is " +
                       ckptdb_state_name(it->second.record.state));
}

Status Db::WaitCommit(uint64_t version, int timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  // Commit is complete when ckptdb_commit returns in this build, so nothing is ever pending.
  auto it = versions_.find(version);
  if (it == versions_.end())
    return Status::NotFound("wait_commit " + V(version) + ": unknown version");
  int s = it->second.record.state;
  if (s == CKPTDB_STATE_COMMITTED || s == CKPTDB_STATE_RETIRED) return Status::Ok();
  if (s == CKPTDB_STATE_ABORTED) return Status::State("wait_commit " + V(version) + ": aborted");
  return Status::State("wait_commit " + V(version) + ": the version is " + ckptdb_state_name(s) +
                       " and has not been committed; call ckptdb_commit");
}

// Keeps the newest `keep` committed versions on each tier that sets keep=; deletes the older
// copies. The newest committed version is never evicted (it is always within the newest keep).
// A version with no copy left becomes RETIRED.
Status Db::ApplyRetention() {
  CatalogBatch batch;
  Status result;
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    uint64_t keep = tiers_[ti]->spec().keep;
    if (keep == 0) continue;
    uint64_t seen = 0;
    for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
      if (it->second.record.state != CKPTDB_STATE_COMMITTED) continue;
      for (ResidencyRecord& r : it->second.residency) {
        if (r.tier != tiers_[ti]->name() || r.state != CKPTDB_RESIDENT_DURABLE) continue;
        if (++seen <= keep) continue;
        DropSegments(it->first);
        Status st = tiers_[ti]->RemoveSegment(it->first, identity_.rank);
        if (!st.ok()) {
          if (result.ok()) result = st;
          continue;
        }
        r.state = CKPTDB_RESIDENT_EVICTED;
        batch.put_residency.emplace_back(it->first, r);
      }
    }
  }
  // Retire versions with no copy left, and bound the history of retired and aborted records.
  std::optional<uint64_t> newest_committed;
  for (auto it = versions_.rbegin(); it != versions_.rend() && !newest_committed; ++it) {
    if (it->second.record.state == CKPTDB_STATE_COMMITTED) newest_committed = it->first;
  }
  size_t history = 0;
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    VersionEntry& e = it->second;
    if (e.record.state == CKPTDB_STATE_COMMITTED) {
      bool any = std::any_of(e.residency.begin(), e.residency.end(), [](const ResidencyRecord& r) {
        return r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_MISSING;
      });
      if (!any && it->first != newest_committed) {
        e.record.state = CKPTDB_STATE_RETIRED;
        batch.put_versions.push_back(e.record);
      }
    }
    if (e.record.state == CKPTDB_STATE_RETIRED || e.record.state == CKPTDB_STATE_ABORTED) {
      if (++history > kMaxHistoryRecords) batch.delete_versions.push_back(it->first);
    }
  }
  // The newest retired version stays as the floor for "versions must increase".
  if (std::optional<uint64_t> floor = LastCommitted(); floor) {
    std::erase(batch.delete_versions, *floor);
  }
  for (uint64_t v : batch.delete_versions) versions_.erase(v);
  if (batch.put_versions.empty() && batch.put_residency.empty() && batch.delete_versions.empty()) {
    return result;
  }
  Status st = catalog_->Apply(batch, /*sync=*/false);
  return result.ok() ? st : result;
}

// ---- Read path ---------------------------------------------------------------------------------

void Db::DropSegments(uint64_t version) {
  for (auto it = segments_.begin(); it != segments_.end();) {
    if (it->first.first == version) {
      if (it->second.fd >= 0) (void)io_->Close(it->second.fd);
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
}

Status Db::ReadSegment(uint64_t version, size_t tier_index, OpenSegment** out) {
  auto key = std::make_pair(version, tier_index);
  auto it = segments_.find(key);
  if (it != segments_.end()) {
    *out = &it->second;
    return Status::Ok();
  }
  const VersionEntry& e = versions_.at(version);
  const ResidencyRecord* res = nullptr;
  for (const ResidencyRecord& r : e.residency) {
    if (r.tier == tiers_[tier_index]->name()) res = &r;
  }
  if (res == nullptr)
    return Status::NotFound(V(version) + " is not on tier " + tiers_[tier_index]->name());
  std::string what = "segment " + res->path + " (tier " + res->tier + ")";
  OpenSegment seg;
  io::OpenOptions o;
  bool direct = false;
  CKPTDB_RETURN_IF_ERROR(io_->Open(res->path, o, &seg.fd, &direct).WithContext(what));
  uint64_t size = 0;
  Status st = io_->FileSize(seg.fd, &size);
  if (st.ok() && size != res->file_bytes) {
    st = Status::Corrupt(what + ": the file is " + std::to_string(size) +
                         " bytes, the catalog recorded " + std::to_string(res->file_bytes));
  }
  if (st.ok()) {
    io::IoQueue* q = read_queue_.get();
    int fd = seg.fd;
    st = format::SegmentReader::Open(
        what, size,
        [q, fd, what](uint64_t off, void* buf, size_t len) {
          return io::ReadAt(*q, fd, off, buf, len, what);
        },
        &seg.reader);
  }
  if (st.ok() && seg.reader->footer().manifest_xxh3 != e.record.manifest_xxh3) {
    st = Status::Corrupt(what + ": its manifest xxh3 " +
                         format::Hex64(seg.reader->footer().manifest_xxh3) +
                         " differs from the catalog's " + format::Hex64(e.record.manifest_xxh3));
  }
  if (!st.ok()) {
    (void)io_->Close(seg.fd);
    return st;
  }
  if (segments_.size() >= kMaxOpenSegments) {
    (void)io_->Close(segments_.begin()->second.fd);
    segments_.erase(segments_.begin());
  }
  auto [pos, inserted] = segments_.emplace(key, std::move(seg));
  *out = &pos->second;
  return Status::Ok();
}

Status Db::ReadChunksInto(OpenSegment* seg, const std::vector<uint32_t>& chunks,
                          uint64_t first_chunk, uint8_t* dst, size_t tier_index,
                          std::vector<uint32_t>* failed) {
  const format::ManifestView& m = seg->reader->manifest();
  // Destination offset of each chunk: chunk k of the tensor starts after chunks [first, k).
  // `chunks` is sorted, so one running sum over the tensor's chunks gives every offset.
  std::vector<uint64_t> dst_offset;
  dst_offset.reserve(chunks.size());
  uint64_t running = 0;
  uint32_t c = static_cast<uint32_t>(first_chunk);
  for (uint32_t idx : chunks) {
    CKPTDB_ASSERT(idx >= c);
    for (; c < idx; ++c) running += m.chunk(c).payload_bytes();
    dst_offset.push_back(running);
  }
  failed->clear();
  size_t next = 0;
  size_t in_flight = 0;
  const size_t depth = std::min<size_t>(options_.queue_depth, kRestoreReadsInFlight);
  std::vector<io::IoCompletion> done;
  // Bounded: each iteration submits or reaps at least one request.
  while (next < chunks.size() || in_flight > 0) {
    io::IoRequest reqs[64];
    size_t n = 0;
    while (next < chunks.size() && in_flight + n < depth && n < std::size(reqs)) {
      const fb::Chunk& c = m.chunk(chunks[next]);
      io::IoRequest& r = reqs[n++];
      r.op = io::IoRequest::Op::kRead;
      r.fd = seg->fd;
      r.offset = c.record_offset() + kBlockBytes;
      r.buffer = dst + dst_offset[next];
      r.length = c.payload_bytes();
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
      if (in_flight > done.size()) {
        (void)read_queue_->Reap(in_flight - done.size(), &rest, -1);
      }
      return st;
    }
    for (const io::IoCompletion& cp : done) {
      --in_flight;
      size_t k = cp.tag;
      const fb::Chunk& c = m.chunk(chunks[k]);
      bool ok = cp.result == static_cast<int64_t>(c.payload_bytes());
      uint64_t actual = 0;
      if (ok) {
        actual = format::Xxh3(dst + dst_offset[k], c.payload_bytes());
        ok = actual == c.xxh3();
        stats_.tier_bytes_read[tier_index] += c.payload_bytes();
      }
      if (!ok) {
        stats_.checksum_failures++;
        failed->push_back(chunks[k]);
        if (last_problem_.empty()) {
          last_problem_ =
              "chunk " + std::to_string(chunks[k]) + " at offset " +
              std::to_string(c.record_offset()) + " of " + seg->reader->what() +
              (cp.result < 0
                   ? " cannot be read: " + std::string(std::strerror(static_cast<int>(-cp.result)))
               : cp.result != static_cast<int64_t>(c.payload_bytes())
                   ? " is cut short"
                   : " fails xxh3 (expected " + format::Hex64(c.xxh3()) + ", got " +
                         format::Hex64(actual) + ")");
        }
      }
    }
  }
  std::sort(failed->begin(), failed->end());
  return Status::Ok();
}

Status Db::Restore(uint64_t version, const char* name, void* dst, size_t nbytes, unsigned flags) {
  uint64_t start = MonoNs();
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  CKPTDB_RETURN_IF_ERROR(ValidateName(name, "restore"));
  std::string what = "restore '" + std::string(name) + "' of " + V(version);
  if (flags != 0) return Status::Invalid(what + ": unknown flags " + std::to_string(flags));
  if (dst == nullptr && nbytes > 0) return Status::Invalid(what + ": dst is NULL");
  auto it = versions_.find(version);
  if (it == versions_.end() || !it->second.has_record) {
    return Status::NotFound(what + ": unknown version");
  }
  if (it->second.record.state != CKPTDB_STATE_COMMITTED) {
    return Status::State(what + ": the version is " + ckptdb_state_name(it->second.record.state) +
                         ", not committed");
  }
  std::vector<size_t> candidates;
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    for (const ResidencyRecord& r : it->second.residency) {
      if (r.tier == tiers_[ti]->name() && r.state == CKPTDB_RESIDENT_DURABLE)
        candidates.push_back(ti);
    }
  }
  if (candidates.empty()) {
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
  last_problem_.clear();
  std::string errors;
  const fb::Tensor* tensor = nullptr;
  uint32_t first = 0, count = 0;
  uint64_t bytes = 0;
  std::vector<uint32_t> pending;
  std::string served_by;
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (size_t ti : candidates) {
    OpenSegment* seg = nullptr;
    Status st = ReadSegment(version, ti, &seg);
    if (!st.ok()) {
      errors += (errors.empty() ? "" : "; ") + st.message();
      continue;
    }
    const fb::Tensor* t = seg->reader->manifest().Find(name);
    if (tensor == nullptr) {
      if (t == nullptr) return Status::NotFound(what + ": the version has no tensor by that name");
      if (t->bytes() != nbytes) {
        return Status::Size(what + ": the tensor is " + std::to_string(t->bytes()) +
                            " bytes, the buffer is " + std::to_string(nbytes));
      }
      tensor = t;
      first = t->first_chunk();
      count = t->chunk_count();
      bytes = t->bytes();
      for (uint32_t c = first; c < first + count; ++c) pending.push_back(c);
    } else if (t == nullptr || t->first_chunk() != first || t->chunk_count() != count ||
               t->bytes() != bytes) {
      errors +=
          (errors.empty() ? "" : "; ") + seg->reader->what() + " lays the tensor out differently";
      continue;
    }
    std::vector<uint32_t> failed;
    Status rs = ReadChunksInto(seg, pending, first, out, ti, &failed);
    if (!rs.ok()) {
      // Nothing in the buffer can be vouched for after a queue failure.
      if (nbytes > 0) std::memset(out, 0, nbytes);
      return rs.WithContext(what + " (the buffer is zeroed)");
    }
    if (served_by.empty() && failed.size() < pending.size()) served_by = tiers_[ti]->name();
    pending = std::move(failed);
    if (pending.empty()) break;
  }
  if (tensor == nullptr) {
    return Status::Corrupt(what + ": no tier has a readable segment: " + errors);
  }
  if (!pending.empty()) {
    // Never wrong bytes: what no tier could supply is zeroed before the error is returned.
    OpenSegment* seg = nullptr;
    for (size_t ti : candidates) {
      if (ReadSegment(version, ti, &seg).ok()) break;
    }
    const format::ManifestView& m = seg->reader->manifest();
    for (uint32_t c : pending) {
      uint64_t off = 0;
      for (uint32_t k = first; k < c; ++k) off += m.chunk(k).payload_bytes();
      std::memset(out + off, 0, m.chunk(c).payload_bytes());
    }
    return Status::Corrupt(what + ": " + std::to_string(pending.size()) + " of " +
                           std::to_string(count) + " chunks have no good copy on any tier (" +
                           last_problem_ + (errors.empty() ? "" : "; " + errors) +
                           "); their bytes in the buffer are zeroed");
  }
  std::snprintf(stats_.last_restore_tier, sizeof stats_.last_restore_tier, "%s",
                served_by.empty() ? tiers_[candidates[0]]->name().c_str() : served_by.c_str());
  stats_.restore_calls++;
  stats_.restore_bytes += nbytes;
  stats_.restore_ns += MonoNs() - start;
  return Status::Ok();
}

Status Db::Latest(uint64_t* version) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  size_t committed = 0;
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second.record.state != CKPTDB_STATE_COMMITTED) continue;
    ++committed;
    for (const ResidencyRecord& r : it->second.residency) {
      if (r.state == CKPTDB_RESIDENT_DURABLE && TierIndex(r.tier) >= 0 && FileDurable(r)) {
        *version = it->first;
        return Status::Ok();
      }
    }
  }
  if (committed == 0) return Status::NotFound("no version has been committed in " + options_.root);
  return Status::NotFound(std::to_string(committed) +
                          " committed versions, but no configured tier still holds any of them");
}

Status Db::List(uint64_t version, ckptdb_list_fn fn, void* arg) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  if (fn == nullptr) return Status::Invalid("list: fn is NULL");
  auto it = versions_.find(version);
  if (it == versions_.end() || !it->second.has_record) {
    return Status::NotFound("list " + V(version) + ": unknown version");
  }
  if (it->second.record.state != CKPTDB_STATE_COMMITTED) {
    return Status::State("list " + V(version) + ": the version is " +
                         ckptdb_state_name(it->second.record.state));
  }
  std::string errors;
  bool any_copy = false;
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    bool resident = false;
    for (const ResidencyRecord& r : it->second.residency) {
      resident |= r.tier == tiers_[ti]->name() && r.state == CKPTDB_RESIDENT_DURABLE;
    }
    if (!resident) continue;
    any_copy = true;
    OpenSegment* seg = nullptr;
    Status st = ReadSegment(version, ti, &seg);
    if (!st.ok()) {
      errors += (errors.empty() ? "" : "; ") + st.message();
      continue;
    }
    const format::ManifestView& m = seg->reader->manifest();
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
      d.nbytes = t.bytes();
      d.chunk_count = t.chunk_count();
      if (fn(arg, &d) != 0) break;
    }
    return Status::Ok();
  }
  if (!any_copy) {
    return Status::NotFound("list " + V(version) +
                            ": no configured tier holds a copy of the version");
  }
  return Status::Corrupt("list " + V(version) + ": no tier has a readable manifest" +
                         (errors.empty() ? "" : ": " + errors));
}

Status Db::ListVersions(ckptdb_version_fn fn, void* arg) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  if (fn == nullptr) return Status::Invalid("list_versions: fn is NULL");
  for (const auto& [version, e] : versions_) {
    if (!e.has_record) continue;
    std::vector<ckptdb_residency> res;
    for (const ResidencyRecord& r : e.residency) {
      res.push_back(
          ckptdb_residency{r.tier.c_str(), r.path.c_str(), r.state, TierIndex(r.tier) >= 0});
    }
    ckptdb_version_info info{};
    info.version = version;
    info.state = e.record.state;
    info.rank = e.record.rank;
    info.data_bytes = e.record.data_bytes;
    info.tensor_count = e.record.tensor_count;
    info.chunk_count = e.record.chunk_count;
    info.created_unix_ns = e.record.created_unix_ns;
    info.committed_unix_ns = e.record.committed_unix_ns;
    info.residency_count = static_cast<uint32_t>(res.size());
    info.residency = res.data();
    if (fn(arg, &info) != 0) break;
  }
  return Status::Ok();
}

Status Db::Verify(uint64_t version, const char* tier, ckptdb_verify_fn fn, void* arg,
                  ckptdb_verify_report* report) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  ckptdb_verify_report rep{};
  std::string tier_name;
  if (tier != nullptr) {
    // Accept any spelling of a tier that parses to the same canonical name ("disk:/x/" is
    // "disk:/x"); options such as keep= are ignored for matching.
    tier_name = tier;
    std::vector<io::TierSpec> parsed;
    std::error_code ec;
    if (io::ParseTierSpecs(tier, std::filesystem::current_path(ec).string(), &parsed).ok() &&
        parsed.size() == 1) {
      tier_name = parsed[0].name;
    }
    tier = tier_name.c_str();
    bool known = TierIndex(tier) >= 0;
    for (const auto& [v, e] : versions_) {
      for (const ResidencyRecord& r : e.residency) known |= r.tier == tier;
    }
    if (!known) {
      std::string names;
      for (const auto& t : tiers_) names += (names.empty() ? "" : ", ") + t->name();
      return Status::NotFound(std::string("verify: no tier named '") + tier + "' (tiers: " + names +
                              ")");
    }
  }
  struct Target {
    uint64_t version;
    ResidencyRecord res;
    uint64_t manifest_xxh3;
  };
  std::vector<Target> targets;
  if (version != CKPTDB_ALL_VERSIONS) {
    auto it = versions_.find(version);
    if (it == versions_.end() || !it->second.has_record) {
      return Status::NotFound("verify " + V(version) + ": unknown version");
    }
    if (it->second.record.state != CKPTDB_STATE_COMMITTED) {
      return Status::State("verify " + V(version) + ": the version is " +
                           ckptdb_state_name(it->second.record.state) +
                           "; only committed versions have segments to check");
    }
  }
  uint64_t total = 0;
  for (const auto& [v, e] : versions_) {
    if (version != CKPTDB_ALL_VERSIONS && v != version) continue;
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    for (const ResidencyRecord& r : e.residency) {
      if (tier != nullptr && r.tier != tier) continue;
      if (r.state != CKPTDB_RESIDENT_DURABLE && r.state != CKPTDB_RESIDENT_MISSING) continue;
      targets.push_back({v, r, e.record.manifest_xxh3});
      total += r.file_bytes;
    }
  }
  uint64_t done_bytes = 0;
  auto emit = [&](int kind, const Target& t, int64_t chunk, uint64_t offset, uint64_t expected,
                  uint64_t actual, const std::string& message) {
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
  };
  std::vector<uint8_t> scratch;
  for (const Target& t : targets) {
    std::string what = "tier " + t.res.tier + ", " + V(t.version) + ", segment " + t.res.path;
    uint64_t before = rep.problems;
    int fd = -1;
    bool direct = false;
    Status st = io_->Open(t.res.path, io::OpenOptions{}, &fd, &direct);
    if (!st.ok()) {
      emit(CKPTDB_VERIFY_PROBLEM, t, -1, 0, 0, 0, what + ": cannot be opened: " + st.message());
      done_bytes += t.res.file_bytes;
      continue;
    }
    uint64_t size = 0;
    st = io_->FileSize(fd, &size);
    io::IoQueue* q = read_queue_.get();
    format::ReadAtFn read = [q, fd, what](uint64_t off, void* buf, size_t len) {
      return io::ReadAt(*q, fd, off, buf, len, what);
    };
    if (st.ok() && size != t.res.file_bytes) {
      emit(CKPTDB_VERIFY_PROBLEM, t, -1, size, 0, 0,
           what + ": the file is " + std::to_string(size) + " bytes, the catalog recorded " +
               std::to_string(t.res.file_bytes));
    }
    std::unique_ptr<format::SegmentReader> reader;
    if (st.ok()) st = format::SegmentReader::Open(what, size, read, &reader);
    if (!st.ok()) {
      emit(CKPTDB_VERIFY_PROBLEM, t, -1, 0, 0, 0, st.message());
      // Without a manifest, framing still tells which chunks are intact (DESIGN.md section 4).
      Status scan = format::ScanSegment(
          what, size, read,
          [&](const format::ScannedRecord& r) {
            bool chunk = r.header.type == format::RecordType::kChunk;
            if (chunk) {
              rep.chunks_checked++;
              rep.bytes_checked += r.header.payload_bytes;
            }
            if (r.actual_xxh3 != r.header.payload_xxh3) {
              std::string label = chunk ? "chunk " + std::to_string(r.header.sequence)
                                        : std::string("manifest record");
              emit(CKPTDB_VERIFY_PROBLEM, t, chunk ? r.header.sequence : -1, r.offset,
                   r.header.payload_xxh3, r.actual_xxh3,
                   what + ": " + label + " at offset " + std::to_string(r.offset) +
                       " fails xxh3 (expected " + format::Hex64(r.header.payload_xxh3) + ", got " +
                       format::Hex64(r.actual_xxh3) + ")");
            }
          },
          &scratch);
      if (!scan.ok()) emit(CKPTDB_VERIFY_PROBLEM, t, -1, 0, 0, 0, scan.message());
    } else {
      if (reader->footer().manifest_xxh3 != t.manifest_xxh3) {
        emit(CKPTDB_VERIFY_PROBLEM, t, -1, reader->footer().manifest_offset, t.manifest_xxh3,
             reader->footer().manifest_xxh3,
             what + ": the manifest's xxh3 differs from the one the catalog recorded at commit");
      }
      for (uint32_t c = 0; c < reader->manifest().chunk_count(); ++c) {
        format::ChunkProblem p;
        Status cs = reader->CheckChunk(c, &scratch, &p);
        rep.chunks_checked++;
        rep.bytes_checked += reader->manifest().chunk(c).payload_bytes();
        done_bytes += format::RecordBytes(reader->manifest().chunk(c).payload_bytes());
        if (!cs.ok()) {
          emit(CKPTDB_VERIFY_PROBLEM, t, c, p.file_offset, p.expected_xxh3, p.actual_xxh3,
               cs.message());
        } else {
          emit(CKPTDB_VERIFY_PROGRESS, t, c, p.file_offset, 0, 0, "");
        }
      }
    }
    (void)io_->Close(fd);
    done_bytes = std::min(total, done_bytes);
    rep.segments_checked++;
    if (rep.problems == before) emit(CKPTDB_VERIFY_OK, t, -1, 0, 0, 0, what + ": clean");
  }
  if (report != nullptr) *report = rep;
  if (rep.problems > 0) {
    return Status::Corrupt("verify found " + std::to_string(rep.problems) + " problem(s) in " +
                           std::to_string(rep.segments_checked) + " segment(s)");
  }
  return Status::Ok();
}

Status Db::Stats(ckptdb_stats_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  *out = stats_;
  out->fixed_buffers = fixed_buffers_ ? 1 : 0;
  out->tier_count = static_cast<uint32_t>(tiers_.size());
  for (size_t i = 0; i < tiers_.size() && i < CKPTDB_MAX_TIERS; ++i) {
    std::snprintf(out->tier_names[i], sizeof out->tier_names[i], "%s", tiers_[i]->name().c_str());
    out->tier_direct_io[i] = tiers_[i]->direct() ? 1 : 0;
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
