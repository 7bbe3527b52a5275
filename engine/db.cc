// Db: opening a store (options, tiers, staging, recovery), closing it, and the calls that only
// look at or change the catalog's view. The capture path is in capture.cc, the tier manager in
// manager.cc, the tier policy in policy.cc, the read path in read.cc.
#include "engine/db.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sodium.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/internal.h"
#include "engine/tier_view.h"
#include "format/checksum.h"
#include "format/commit_witness.h"
#include "format/segment_format.h"
#include "util/assert.h"

namespace ckpt::engine {

using format::kBlockBytes;

namespace {
CrashHook g_crash_hook = nullptr;
std::atomic<io::Io*> g_testing_io{nullptr};

// options.cpus: the calling thread runs on those CPUs while it opens the store, so that every
// thread the open starts (and every thread those start) inherits them; its own CPUs come back
// when the open returns.
class OpenOnCpus {
 public:
  Status Start(const std::vector<int>& cpus) {
    if (cpus.empty()) return Status::Ok();
    if (pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_) != 0) {
      return Status::Internal("options: cpus: reading the calling thread's CPUs failed");
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : cpus) CPU_SET(cpu, &set);
    if (int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set); err != 0) {
      return Status::Invalid(std::string("options: cpus: none of them can run this process's "
                                         "threads (") +
                             std::strerror(err) + "): see its cgroup's cpuset or nproc");
    }
    set_ = true;
    return Status::Ok();
  }
  ~OpenOnCpus() {
    if (set_) (void)pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
  }

 private:
  cpu_set_t saved_{};
  bool set_ = false;
};
}  // namespace

void SetIoForTesting(io::Io* io) { g_testing_io = io; }

void SetCrashHookForTesting(CrashHook hook) { g_crash_hook = hook; }
void CrashPoint(const char* point) {
  if (g_crash_hook != nullptr) g_crash_hook(point);
}

Db::Db(DbOptions options) : options_(std::move(options)) {}

Db::~Db() { (void)Close(); }

Status Db::Open(const DbOptions& given, std::unique_ptr<Db>* out) {
  OpenOnCpus on_cpus;
  CKPTDB_RETURN_IF_ERROR(on_cpus.Start(given.cpus));
  DbOptions options = given;
  std::string view_root;
  if (options.read_only && options.root.empty()) {
    // Tier directories alone: their records become a catalog in a private root, which the
    // handle removes at close.
    CKPTDB_RETURN_IF_ERROR(ValidateOptions(options));
    std::unique_ptr<io::Io> owned;
    io::Io* io = options.io != nullptr ? options.io : g_testing_io.load();
    if (io == nullptr) {
      owned = io::NewPosixIo();
      io = owned.get();
    }
    CKPTDB_RETURN_IF_ERROR(BuildTierView(options, io, &view_root));
    options.root = view_root;
    options.tier_view = true;
  }
  auto db = std::unique_ptr<Db>(new Db(options));
  db->view_root_ = view_root;
  Status st = db->OpenImpl();
  if (!st.ok()) {
    // A store this call created and could not finish opening is removed again, so a failed
    // first open leaves nothing behind.
    bool created = db->created_root_;
    bool created_catalog = db->created_catalog_;
    // Markers and an arena this open created go again in every case: a failed open leaves the
    // tiers as it found them.
    std::vector<std::string> markers = db->markers_written_;
    std::string arena = db->ram_created_;
    const std::string replaced = db->ram_replaced_;
    // Where the arena it replaced goes back to (the replacement may not have been created).
    const std::string replaced_home =
        replaced.substr(0, replaced.size() - std::min(replaced.size(), sizeof ".replaced" - 1));
    io::Io* io = db->io_;
    std::unique_ptr<io::Io> owned = std::move(db->owned_io_);
    (void)db->Close();
    if (created) {
      // The store's identity dies with its root, so the tier markers and the arena naming it
      // must go too, or every later open would find them "owned by another store".
      for (const std::string& m : markers) (void)io->Remove(m);
      if (!arena.empty()) (void)io->Remove(arena);
      if (!replaced.empty()) (void)io->Rename(replaced, replaced_home);
      std::error_code ec;
      std::filesystem::remove_all(options.root, ec);
    } else {
      for (const std::string& m : markers) (void)io->Remove(m);
      if (!arena.empty()) (void)io->Remove(arena);
      // The arena this open replaced (another store's, an older format's) comes back as it was.
      if (!replaced.empty()) (void)io->Rename(replaced, replaced_home);
      if (created_catalog) {
        // A catalog this open made in an existing root goes again with what it named.
        std::error_code ec;
        std::filesystem::remove_all(options.root + "/catalog", ec);
      }
    }
    return st;
  }
  // Only now is the arena it replaced let go (RamTier::ReplaceArena set it aside), or one that
  // an open killed at this point left.
  if (!db->tiers_.empty() && db->tiers_[0].is_ram() && !options.read_only) {
    (void)db->io_->Remove(db->tiers_[0].ram->path() + ".replaced");
  }
  *out = std::move(db);
  return Status::Ok();
}

void Db::ChooseIo() {
  const DbOptions& o = options_;
  if (o.io != nullptr) {
    io_ = o.io;
  } else if (io::Io* testing = g_testing_io.load(); testing != nullptr) {
    io_ = testing;
  } else {
    owned_io_ = io::NewPosixIo();
    io_ = owned_io_.get();
  }
}

// The root exists (or is created, where the options allow) and is a store; a writer holds its
// LOCK from here on.
Status Db::OpenRoot() {
  const DbOptions& o = options_;
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
    // Refuse a directory that is not a store before touching it (no LOCK, no catalog files). A
    // catalog directory without CURRENT is a damaged store: Catalog::Open says so.
    Status is_store = io_->PathSize(root + "/catalog", &ignored);
    if (!is_store.ok()) {
      std::map<uint64_t, WitnessFile> witnesses;
      if (WitnessDir(io_, root).Load(WitnessDir::kAnyRank, 0, &witnesses).ok() &&
          !witnesses.empty()) {
        return Status::Corrupt("store " + root + " has commit witnesses (" +
                               witnesses.begin()->second.path +
                               ", ...) but no catalog: the catalog was lost; nothing was changed "
                               "(run ckptdb repair " +
                               root + ")");
      }
      return Status::NotFound("no ckptdb store at " + root + " (no catalog)");
    }
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
  return Status::Ok();
}

// Opens the catalog, checked whole against the commit witnesses; *reopen_read_write says it
// was opened read-only for now and becomes writable once the tiers are checked too.
Status Db::OpenCatalog(bool* reopen_read_write_out) {
  const DbOptions& o = options_;
  const std::string& root = o.root;
  // A new catalog only where the root holds none at all: commit witnesses without a catalog
  // mean it was lost, and starting a new one over them would orphan (and the sweep then
  // delete) every committed segment.
  const std::string catalog_dir = root + "/catalog";
  std::error_code dir_ec;
  const bool had_catalog = std::filesystem::exists(catalog_dir + "/CURRENT", dir_ec);
  if (!had_catalog && !o.read_only) {
    std::map<uint64_t, WitnessFile> witnesses;
    CKPTDB_RETURN_IF_ERROR(WitnessDir(io_, root).Load(WitnessDir::kAnyRank, 0, &witnesses));
    if (!witnesses.empty()) {
      const bool some = std::filesystem::is_directory(catalog_dir, dir_ec) &&
                        !std::filesystem::is_empty(catalog_dir, dir_ec);
      return Status::Corrupt(
          "store " + root + " has commit witnesses (" + witnesses.begin()->second.path +
          ", ...) but " +
          (some ? "its catalog " + catalog_dir + " has no CURRENT: the catalog is damaged"
                : std::string("no catalog: the catalog was lost")) +
          "; nothing was changed (run ckptdb repair " + root + ")");
    }
  }
  // The witnesses are listed before the catalog is read: a witness is written only after its
  // COMMITTED record is synced, so every one listed here is in the catalog read below, even
  // beside a live trainer (read-only tools), unless it was removed meanwhile (retired).
  CKPTDB_RETURN_IF_ERROR(WitnessDir(io_, root).Load(WitnessDir::kAnyRank, 0, &early_witnesses_));
  // The catalog is checked whole, read-only, before anything is written (Catalog::Open), and
  // with it this rank's commit witnesses: a witness the catalog does not account for means the
  // catalog lost synced records, and the open fails with every byte as it was.
  // An existing catalog stays read-only until the tiers (their markers, the arena's header) are
  // checked too: only then may RocksDB write (its read-write open flushes and rolls files).
  const bool reopen_read_write = had_catalog && !o.read_only;
  CKPTDB_RETURN_IF_ERROR(Catalog::Open(
      catalog_dir, o.read_only || reopen_read_write, o.create_if_missing,
      [this, &root](Catalog& c) { return CheckWitnesses(c, root); }, &catalog_));
  created_catalog_ = !had_catalog && !o.read_only;
  Status st = catalog_->GetIdentity(&identity_);
  *reopen_read_write_out = reopen_read_write;
  return CheckIdentity(st, reopen_read_write);
}

// The store's identity record: written on a first open, else it must name this rank and job.
Status Db::CheckIdentity(Status st, bool reopen_read_write) {
  const DbOptions& o = options_;
  const std::string& root = o.root;
  if (st.code() == CKPTDB_ENOTFOUND && reopen_read_write) {
    // A catalog without identity: a first open stopped before writing it, so nothing else is in
    // it either. Written now, which needs the catalog read-write.
    CKPTDB_RETURN_IF_ERROR(Catalog::ReopenReadWrite(&catalog_));
  }
  // Every store of a job gets the job's id, derived from its token: a replacement rank on empty
  // directories then recognizes its job's segments on tiers that outlived its node.
  uint64_t job_id = 0;
  const bool in_job = o.world_size > 1 && !o.job_token.empty();
  if (in_job) {
    const std::string label = "ckptdb job id\n" + o.job_token;
    uint8_t digest[crypto_generichash_BYTES_MIN];
    crypto_generichash(digest, sizeof digest, reinterpret_cast<const uint8_t*>(label.data()),
                       label.size(), nullptr, 0);
    std::memcpy(&job_id, digest, sizeof job_id);
  }
  if (st.code() == CKPTDB_ENOTFOUND) {
    if (o.read_only) return Status::NotFound("store " + root + " has no identity record");
    if (!in_job && getrandom(&job_id, sizeof job_id, 0) != sizeof job_id) {
      return Status::FromErrno(errno, "getrandom for the store's job id");
    }
    identity_ = Identity{job_id, o.rank, o.world_size, o.chunk_bytes, WallNs()};
    CKPTDB_RETURN_IF_ERROR(catalog_->PutIdentity(identity_));
  } else if (!st.ok()) {
    return st;
  } else if (!o.read_only && identity_.rank != o.rank) {
    return Status::Invalid("store " + root + " belongs to rank " + std::to_string(identity_.rank) +
                           ", not rank " + std::to_string(o.rank));
  } else if (!o.read_only && in_job &&
             (identity_.job_id != job_id || identity_.world_size != o.world_size)) {
    // Its committed versions would count as the job's (the coordinator learns decisions from
    // the ranks' catalogs): a store of another job, or of this rank alone, cannot join.
    return Status::Invalid("store " + root + " belongs to " +
                           (identity_.world_size != o.world_size
                                ? "a job of " + std::to_string(identity_.world_size) + " rank(s)"
                                : std::string("another job (another CKPTDB_JOB_TOKEN)")) +
                           ", not this job of " + std::to_string(o.world_size) +
                           " ranks: give this rank an empty root, or the one it had in this job");
  }
  return Status::Ok();
}

// The writer's queues and memory: allocated and faulted in once, never per checkpoint.
Status Db::AllocateWriteBuffers(const io::QueueOptions& qo) {
  const DbOptions& o = options_;
  io::QueueOptions wqo = qo;
  wqo.offload_writes = true;  // the kernel copies into tmpfs while capture stages the next chunk
  CKPTDB_RETURN_IF_ERROR(io_->NewQueue(wqo, &queue_));
  io::QueueOptions mqo;
  mqo.queue_depth = 2;
  CKPTDB_RETURN_IF_ERROR(io_->NewQueue(mqo, &metadata_queue_));
  // The staging ring carries chunks to a directory first tier, and chunks a demotion reads from
  // a directory tier; a ram first tier with a single directory tier behind it has neither (its
  // captures and demotions go from the arena), so it gets no ring. Allocated and faulted in
  // once (LIMITS.md: first touch runs at 0.3 GB/s here), never per checkpoint. Whole records
  // only: a record never wraps.
  const size_t directory_tiers = static_cast<size_t>(
      std::count_if(tiers_.begin(), tiers_.end(), [](const TierState& t) { return !t.is_ram(); }));
  if (!tiers_[0].is_ram() || directory_tiers >= 2) {
    staging_bytes_ = o.staging_bytes / kBlockBytes * kBlockBytes;
    void* p = ::mmap(nullptr, staging_bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      staging_bytes_ = 0;
      return Status::FromErrno(
          errno, "allocating " + std::to_string(o.staging_bytes) + " bytes of staging");
    }
    staging_ = static_cast<uint8_t*>(p);
    (void)::mlock(staging_, staging_bytes_);  // best effort: unprivileged limits are small
    ring_ = std::make_unique<StagingRing>(staging_bytes_, kBlockBytes);
  }
  void* h = ::mmap(nullptr, kDirectHeaders * kBlockBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (h == MAP_FAILED) return Status::FromErrno(errno, "allocating direct-write header blocks");
  direct_headers_ = static_cast<uint8_t*>(h);
  for (uint32_t i = kDirectHeaders; i > 0; --i) free_direct_headers_.push_back(i - 1);
  return Status::Ok();
}

// Fixed buffers: the staging ring (when there is one), then the arena in pieces of at most
// 1 GiB (the kernel's limit per registered buffer). Registered after recovery, which may have
// resized the arena.
void Db::RegisterFixedBuffers() {
  std::vector<iovec> buffers;
  if (ring_) buffers.push_back({staging_, staging_bytes_});
  const size_t arena_base = buffers.size();
  if (tiers_[0].is_ram()) {
    RamTier& ram = *tiers_[0].ram;
    for (uint64_t off = 0; off < ram.capacity(); off += kMaxFixedBufferBytes) {
      buffers.push_back({ram.base() + off, static_cast<size_t>(std::min(kMaxFixedBufferBytes,
                                                                        ram.capacity() - off))});
    }
  }
  Status reg = buffers.empty() ? Status::Ok() : queue_->RegisterBuffers(buffers);
  if (!reg.ok() && ring_ && buffers.size() > 1) {
    // The arena may be too large to pin: the ring alone, then.
    buffers.erase(buffers.begin() + 1, buffers.end());
    reg = queue_->RegisterBuffers(buffers);
  }
  fixed_buffers_ = reg.ok() && ring_ != nullptr;
  if (reg.ok() && buffers.size() > arena_base) fixed_arena_base_ = static_cast<int>(arena_base);
}

Status Db::OpenImpl() {
  const DbOptions& o = options_;
  CKPTDB_RETURN_IF_ERROR(ValidateOptions(options_));
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  std::vector<io::TierSpec> specs;
  if (!o.read_only) CKPTDB_RETURN_IF_ERROR(ParseWriterTiers(cwd, o.tiers, &specs));
  ChooseIo();
  CKPTDB_RETURN_IF_ERROR(OpenRoot());
  bool reopen_read_write = false;
  CKPTDB_RETURN_IF_ERROR(OpenCatalog(&reopen_read_write));
  CKPTDB_RETURN_IF_ERROR(catalog_->LoadAll(&versions_));
  CKPTDB_RETURN_IF_ERROR(o.read_only ? ParseReaderTiers(cwd, &specs)
                                     : ChooseWriterTiers(cwd, &specs));
  CKPTDB_RETURN_IF_ERROR(OpenTiers(specs));
  if (reopen_read_write && catalog_->read_only()) {
    CKPTDB_RETURN_IF_ERROR(Catalog::ReopenReadWrite(&catalog_));
  }

  io::QueueOptions qo;
  qo.queue_depth = o.queue_depth;
  CKPTDB_RETURN_IF_ERROR(io_->NewQueue(qo, &read_queue_));
  if (o.read_only) {
    // What a read-only handle cannot write it still sees: copies whose file or arena is gone
    // read as missing.
    RefreshResidencyLocked(nullptr);
    StartThreads();  // workers only: they help restores copy and check ram copies
    WarmManifests();
    return Status::Ok();
  }
  CKPTDB_RETURN_IF_ERROR(AllocateWriteBuffers(qo));
  if (o.world_size > 1) {
    // Join the job before recovery: versions this rank PREPARED are decided by the coordinator
    // (docs/commit-protocol.md, recovery), not presumed aborted locally.
    CKPTDB_RETURN_IF_ERROR(StartCluster());
    CKPTDB_RETURN_IF_ERROR(ResolveInDoubt());
    CKPTDB_RETURN_IF_ERROR(AdoptSegments());
  }
  CKPTDB_RETURN_IF_ERROR(Recover());
  CKPTDB_RETURN_IF_ERROR(ReleaseDroppedCopies(/*release=*/false));
  {
    // A version whose last copy was evicted just before a crash is retired now, not left
    // committed with nothing to restore.
    std::unique_lock<std::mutex> lock(mu_);
    RetireLocked(lock);
  }
  WriteMissingWitnesses(o.root);
  if (cluster_ != nullptr) {
    LearnArcVersions();
    cluster_->Ready();
  }
  // Recorded for read-only tools only once recovery accepted it (an arena shrink past a live
  // copy is refused there).
  CKPTDB_RETURN_IF_ERROR(catalog_->PutTiers(CanonicalTiers()));
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status::FromErrno(errno, "eventfd for the tier manager");
  CKPTDB_RETURN_IF_ERROR(ReleaseDroppedCopies(/*release=*/true));  // nothing fails after it
  RegisterFixedBuffers();
  StartThreads();
  WarmManifests();
  return Status::Ok();
}

Status Db::OpenTiers(const std::vector<io::TierSpec>& specs) {
  CKPTDB_ASSERT(specs.size() == tiers_.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    TierState& t = tiers_[i];
    if (specs[i].kind == io::TierKind::kRam) {
      CKPTDB_ASSERT(i == 0);
      t.ram = std::make_unique<RamTier>(io_, specs[i]);
      Status st = t.ram->Open(identity_.job_id, identity_.rank, options_.root, options_.read_only);
      if (t.ram->created()) ram_created_ = t.ram->path();
      ram_replaced_ = t.ram->replaced();
      CKPTDB_RETURN_IF_ERROR(st);
      if (!t.ram->unreadable_why().empty()) witness_problems_.push_back(t.ram->unreadable_why());
    } else {
      t.dir = std::make_unique<Tier>(io_, specs[i]);
      Status st = t.dir->Open(identity_.job_id, options_.read_only);
      if (t.dir->wrote_marker())
        markers_written_.push_back(specs[i].path + "/" + Tier::kMarkerName);
      // An nfs tier behind another whose server does not answer: the store opens without it
      // and the manager tries it again. Any other failure (a refused mount, another store's
      // directory) fails the open.
      if (!st.ok() && t.is_nfs() && i > 0 &&
          (st.code() == CKPTDB_EIO || st.code() == CKPTDB_ETIMEDOUT)) {
        std::fprintf(stderr, "ckptdb: tier %s is offline, the other tiers go on: %s\n",
                     t.name().c_str(), st.ToString().c_str());
        BackOffLocked(i, st.WithContext("tier " + t.name() + " is offline"));
        continue;
      }
      CKPTDB_RETURN_IF_ERROR(st);
    }
  }
  return Status::Ok();
}

Status Db::CheckWitnesses(Catalog& catalog, const std::string& root) {
  Identity id;
  Status st = catalog.GetIdentity(&id);
  if (st.code() == CKPTDB_ENOTFOUND) {
    // A first open that stopped before writing the identity: it committed nothing.
    id.rank = options_.rank;
    id.job_id = 0;
  } else if (!st.ok()) {
    return st;
  }
  std::map<uint64_t, WitnessFile> witnesses;
  for (const auto& [version, f] : early_witnesses_) {
    uint64_t bytes = 0;
    if (f.rank != id.rank) continue;
    if (io_->PathSize(f.path, &bytes).code() == CKPTDB_ENOTFOUND) continue;  // retired since
    witnesses.emplace(version, f);
  }
  early_witnesses_.clear();
  if (witnesses.empty()) return Status::Ok();
  std::map<uint64_t, VersionEntry> versions;
  CKPTDB_RETURN_IF_ERROR(catalog.LoadAll(&versions));
  std::vector<std::string> problems;
  CKPTDB_RETURN_IF_ERROR(
      CheckWitnessesAgainst(witnesses, versions, id.job_id, catalog.dir(), root, &problems));
  for (const std::string& p : problems) std::fprintf(stderr, "ckptdb: %s\n", p.c_str());
  witness_problems_.insert(witness_problems_.end(), problems.begin(), problems.end());
  return Status::Ok();
}

void Db::WriteMissingWitnesses(const std::string& root) {
  // Committed versions without a witness (a store older than witnesses, a witness write that
  // failed) get one now: until then a lost COMMITTED record of theirs could not be caught.
  std::map<uint64_t, WitnessFile> present;
  if (!WitnessDir(io_, root).Load(identity_.rank, identity_.job_id, &present).ok()) return;
  std::vector<VersionRecord> missing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [version, e] : versions_) {
      if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
      // Only absent ones: a damaged witness is damaged metadata, reported (verify) and
      // rewritten by the explicit act of ckptdb repair.
      if (present.find(version) == present.end()) missing.push_back(e.record);
    }
  }
  for (const VersionRecord& rec : missing) (void)WriteWitness(rec);  // a failure is printed
}

std::string Db::CanonicalTiers() const {
  std::string canonical;
  for (const TierState& t : tiers_) {
    canonical += (canonical.empty() ? "" : ";") + io::FormatTierSpec(t.spec);
  }
  return canonical;
}

Status Db::WriteWitness(const VersionRecord& rec) {
  const format::CommitWitness w = MakeWitness(identity_, rec, CanonicalTiers());
  Status st = WitnessDir(io_, options_.root).Write(w);
  if (st.ok()) return st;
  st = Status::FromCode(st.code(), V(rec.version) +
                                       " is committed (its COMMITTED record is durable), but its "
                                       "commit witness could not be written: " +
                                       st.message() +
                                       "; the catalog alone records it until ckptdb repair "
                                       "writes the witness");
  std::fprintf(stderr, "ckptdb: %s\n", st.message().c_str());
  return st;
}

// Sets each committed copy's in-memory residency to what is really there: a directory copy is
// DURABLE while its file exists, a ram copy while the arena of its generation holds its index
// (and, for read-write handles, its regions can be claimed). Returns the records that changed
// into *batch when one is given.
void Db::RefreshResidencyLocked(CatalogBatch* batch) {
  for (auto& [version, e] : versions_) {
    if (e.record.state != CKPTDB_STATE_COMMITTED) continue;
    for (ResidencyRecord& res : e.residency) {
      if (res.state != CKPTDB_RESIDENT_DURABLE && res.state != CKPTDB_RESIDENT_MISSING) continue;
      int t = TierIndex(res.tier);
      int want = res.state;
      if (t >= 0 && tiers_[t].is_ram()) {
        RamTier& ram = *tiers_[t].ram;
        want = CKPTDB_RESIDENT_MISSING;
        if (ram.available() && res.ram_generation == ram.generation()) {
          RamImage image;
          Status st = ram.LoadImage(identity_.job_id, identity_.rank, version, res.file_bytes,
                                    res.ram_index_offset, res.ram_index_bytes, &image);
          if (st.ok() && !options_.read_only) st = ram.Claim(image);
          if (st.ok()) {
            ram_images_[version] = std::move(image);
            want = CKPTDB_RESIDENT_DURABLE;
          } else {
            std::fprintf(stderr, "ckptdb: %s; the copy is treated as missing\n",
                         st.message().c_str());
          }
        }
      } else if (!IsRamName(res.tier) && (t < 0 || tiers_[t].online())) {
        // MISSING only when the file is gone (a tmpfs after reboot); a damaged file stays
        // DURABLE so restore and verify report the damage instead of hiding it, and a file
        // that cannot be looked at now (a server that stopped answering) keeps its state.
        uint64_t bytes = 0;
        Status found = io_->PathSize(res.path, &bytes);
        if (found.ok()) want = CKPTDB_RESIDENT_DURABLE;
        if (found.code() == CKPTDB_ENOTFOUND) want = CKPTDB_RESIDENT_MISSING;
      }
      if (want != res.state) {
        res.state = want;
        if (batch != nullptr) batch->put_residency.emplace_back(version, res);
      }
    }
  }
}

Status Db::CheckPublishedSegment(const std::string& path, uint64_t version, uint64_t manifest_xxh3,
                                 uint64_t* file_bytes) {
  const std::string what = "segment " + path;
  int fd = -1;
  bool direct = false;
  CKPTDB_RETURN_IF_ERROR(io_->Open(path, io::OpenOptions{}, &fd, &direct).WithContext(what));
  Status st = io_->FileSize(fd, file_bytes);
  std::unique_ptr<format::SegmentReader> reader;
  if (st.ok()) {
    io::IoQueue* q = read_queue_.get();
    st = format::SegmentReader::Open(
        what, *file_bytes,
        [q, fd, what](uint64_t off, void* buf, size_t len) {
          return io::ReadAt(*q, fd, off, buf, len, what);
        },
        &reader);
  }
  (void)io_->Close(fd);
  CKPTDB_RETURN_IF_ERROR(st);
  if (reader->footer().version != version || reader->footer().rank != identity_.rank ||
      reader->footer().manifest_xxh3 != manifest_xxh3) {
    return Status::Corrupt(what + ": its footer names version " +
                           std::to_string(reader->footer().version) + " of rank " +
                           std::to_string(reader->footer().rank) + " with manifest " +
                           format::Hex64(reader->footer().manifest_xxh3) + ", not the committed " +
                           V(version) + "'s " + format::Hex64(manifest_xxh3));
  }
  return Status::Ok();
}

// Presumed abort (DESIGN.md section 6): a version without a durable COMMITTED record was never
// visible, so recovery aborts it and deletes its files; its ram regions were never recorded and
// are simply free. Open has already checked the catalog whole and against the commit witnesses
// (CheckWitnesses), so "undecided" here is the catalog's word, not a guess. A committed version's
// interrupted demotion (a WRITING copy) is dropped: the tier manager starts it again. Then every
// segment file of this rank that no committed copy accounts for is collected, except a published
// copy of a committed version that verifies (CheckPublishedSegment), which is recorded instead;
// copies that vanished (a tmpfs or the arena after a reboot) are marked missing so restore goes
// straight to a tier that has them.
Status Db::Recover() {
  CatalogBatch batch;
  std::set<std::string> dirs_to_sync;
  for (auto& [version, e] : versions_) {
    VersionRecord& r = e.record;
    bool undecided = r.state == CKPTDB_STATE_OPEN || r.state == CKPTDB_STATE_CAPTURED ||
                     r.state == CKPTDB_STATE_PREPARED;
    std::vector<ResidencyRecord> kept;
    for (const ResidencyRecord& res : e.residency) {
      bool drop = undecided || res.state == CKPTDB_RESIDENT_WRITING;
      if (!drop) {
        kept.push_back(res);
        continue;
      }
      const int t = TierIndex(res.tier);
      if (!IsRamName(res.tier) && (t < 0 || tiers_[t].online())) {
        // A committed version's interrupted demotion may have published its file already: the
        // sweep below checks it and keeps it if it verifies. Undecided versions are aborted.
        // (An offline tier's files stay: the sweep after it comes back collects temporary
        // ones.)
        if (undecided) CKPTDB_RETURN_IF_ERROR(io_->Remove(res.path));
        CKPTDB_RETURN_IF_ERROR(io_->Remove(res.path + ".tmp"));
        dirs_to_sync.insert(std::filesystem::path(res.path).parent_path().string());
      }
      batch.delete_residency.emplace_back(version, res.tier);
    }
    e.residency = std::move(kept);
    if (undecided) {
      r.state = CKPTDB_STATE_ABORTED;
      batch.put_versions.push_back(r);
    }
  }
  RefreshResidencyLocked(&batch);
  if (tiers_[0].is_ram()) CKPTDB_RETURN_IF_ERROR(tiers_[0].ram->ResizeToSpec());
  for (const TierState& tier : tiers_) {
    if (tier.is_ram() || !tier.online()) continue;
    std::vector<SegmentFileName> files;
    CKPTDB_RETURN_IF_ERROR(tier.dir->ListSegments(&files));
    for (const SegmentFileName& f : files) {
      if (f.rank != identity_.rank) continue;  // another rank's files share this directory
      bool keep = false;
      auto it = versions_.find(f.version);
      if (!f.temporary && it != versions_.end() &&
          it->second.record.state == CKPTDB_STATE_COMMITTED) {
        for (const ResidencyRecord& res : it->second.residency) {
          if (res.tier == tier.name() && res.state == CKPTDB_RESIDENT_DURABLE) keep = true;
        }
        if (!keep) {
          // A published copy of a committed version whose residency record is not DURABLE (a
          // demotion interrupted after its rename, an eviction before its unlink, a record
          // lost): never deleted on the strength of that metadata when the file verifies.
          const std::string path = tier.spec.path + "/" + f.name;
          uint64_t bytes = 0;
          Status check =
              CheckPublishedSegment(path, f.version, it->second.record.manifest_xxh3, &bytes);
          if (check.ok()) {
            ResidencyRecord res;
            res.tier = tier.name();
            res.state = CKPTDB_RESIDENT_DURABLE;
            res.path = path;
            res.file_bytes = bytes;
            std::erase_if(it->second.residency,
                          [&](const ResidencyRecord& r) { return r.tier == res.tier; });
            it->second.residency.push_back(res);
            batch.put_residency.emplace_back(f.version, res);
            keep = true;
          } else if (check.code() != CKPTDB_ECORRUPT) {
            // Not known to be damaged (a failing read, a permission): never deleted on a guess.
            return check.WithContext("recovery: checking " + path);
          } else {
            std::fprintf(stderr, "ckptdb: removing %s, which the catalog does not hold: %s\n",
                         path.c_str(), check.message().c_str());
          }
        }
      }
      if (!keep) {
        CKPTDB_RETURN_IF_ERROR(io_->Remove(tier.spec.path + "/" + f.name));
        dirs_to_sync.insert(tier.spec.path);
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
  // The next version is likely the size of the last: the manager keeps that much of the arena
  // free when it can.
  if (std::optional<uint64_t> newest = NewestCommitted(); newest) {
    ram_reserve_bytes_ = versions_.at(*newest).record.data_bytes;
  }
  CrashPoint("recover:done");
  return Status::Ok();
}

void Db::StartThreads() {
  if (!options_.read_only) manager_ = std::thread([this] { ManagerLoop(); });
  for (uint32_t i = 0; i < options_.capture_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

Status Db::CheckNotClosed() const {
  if (closed_ || closing_) return Status::State("the store is closed");
  if (!poisoned_.ok()) return Status::State(poisoned_.message());
  return Status::Ok();
}

Status Db::Close() {
  // Readers finish first: they use the read queue, the segment cache and the tiers freed below.
  std::lock_guard<std::mutex> read_lock(read_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_ || closing_) return Status::Ok();
  closing_ = true;
  // No more hints come from a closing trainer: what replication is left goes at once.
  if (cluster_ != nullptr) cluster_->StopInterleaving();
  if (manager_.joinable()) {
    // Versions not asked to commit are aborted; those asked finish (their callers were promised
    // an outcome). Then the manager drains demotions, or leaves them to the next open.
    for (auto& [version, v] : live_) {
      if (!v.commit_requested && !v.abort_requested) {
        v.abort_requested = true;
        RememberOutcome(version,
                        Status::State("version " + std::to_string(version) +
                                      " was aborted: the store was closed before it was committed"),
                        /*may_put_again=*/true);
        DropQueuedLocked(&v);
      }
    }
    WakeManager();
    state_cv_.wait(lock, [&] { return manager_idle_; });
  }
  stopping_ = true;
  work_cv_.notify_all();
  WakeManager();
  lock.unlock();
  for (std::thread& w : workers_) w.join();
  // The device thread lands the copies still in flight (their versions are aborting), then ends.
  if (device_open_.load(std::memory_order_acquire)) device_.capture->Shutdown();
  if (device_.thread.joinable()) device_.thread.join();
  if (manager_.joinable()) manager_.join();
  // A tier's retry may still be waiting on its server (each call bounded by its deadline).
  if (tier_retry_.joinable()) tier_retry_.join();
  lock.lock();
  cluster_stop_ = true;
  for (std::condition_variable& cv : cluster_cv_) cv.notify_all();
  lock.unlock();
  for (std::thread& w : cluster_workers_) {
    if (w.joinable()) w.join();
  }
  cluster_.reset();
  lock.lock();
  for (auto& [key, seg] : segments_) {
    if (seg.fd >= 0) (void)io_->Close(seg.fd);
  }
  segments_.clear();
  queue_.reset();  // unregisters staging and the arena before they are unmapped
  read_queue_.reset();
  metadata_queue_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
  {
    std::lock_guard<std::mutex> g(device_mu_);
    device_.capture.reset();
    device_.restore.reset();
    for (void* p : device_.pinned) device_.device->Unpin(p);  // before the memory is unmapped
    device_.pinned.clear();
    if (device_.pool != nullptr) {
      ::munmap(device_.pool, DevicePipeline::kPoolSlots * DevicePipeline::kPoolSlotBytes);
    }
    device_.pool = nullptr;
  }
  if (staging_ != nullptr) ::munmap(staging_, staging_bytes_);
  staging_ = nullptr;
  if (direct_headers_ != nullptr) ::munmap(direct_headers_, kDirectHeaders * kBlockBytes);
  direct_headers_ = nullptr;
  tiers_.clear();
  catalog_.reset();
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  if (!view_root_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(view_root_, ec);
  }
  closed_ = true;
  state_cv_.notify_all();
  return Status::Ok();
}

Status Db::Abort(uint64_t version) {
  std::unique_lock<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  std::string what = "abort version " + std::to_string(version);
  auto live = live_.find(version);
  if (live != live_.end()) {
    LiveVersion& v = live->second;
    if (v.commit_requested && v.error.ok()) {
      return Status::State(what + ": its commit is under way; wait for it with ckptdb_wait_commit");
    }
    if (!v.abort_requested) {
      v.abort_requested = true;
      // In a job this rank's abort is the job's (FinishAbort votes no): not put again.
      RememberOutcome(
          version,
          Status::State("version " + std::to_string(version) + " was aborted by the caller"),
          /*may_put_again=*/cluster_ == nullptr);
      DropQueuedLocked(&v);
      WakeManager();
    }
    // Returns once nothing of it is read from the caller's buffers and its files are gone.
    state_cv_.wait(lock, [&] { return live_.count(version) == 0 || closed_; });
    return Status::Ok();
  }
  auto it = versions_.find(version);
  if (it == versions_.end() || !it->second.has_record) {
    return Status::NotFound(what + ": unknown version");
  }
  if (it->second.record.state == CKPTDB_STATE_ABORTED) return Status::Ok();
  return Status::State(what + ": the version is " + ckptdb_state_name(it->second.record.state));
}

Status Db::ListVersions(ckptdb_version_fn fn, void* arg) {
  std::unique_lock<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  if (fn == nullptr) return Status::Invalid("list_versions: fn is NULL");
  // A copy, so the callback runs without the lock (it may call back into this handle).
  struct Row {
    ckptdb_version_info info{};
    std::vector<ResidencyRecord> residency;
    std::vector<int> configured;
  };
  std::vector<Row> rows;
  for (const auto& [version, e] : versions_) {
    if (!e.has_record) continue;
    Row row;
    ckptdb_version_info& info = row.info;
    info.version = version;
    info.state = e.record.state;
    // A live version being aborted is shown as what it is about to be.
    if (auto live = live_.find(version); live != live_.end() && live->second.abort_requested) {
      info.state = CKPTDB_STATE_ABORTED;
    }
    info.rank = e.record.rank;
    info.data_bytes = e.record.data_bytes;
    info.tensor_count = e.record.tensor_count;
    info.chunk_count = e.record.chunk_count;
    info.created_unix_ns = e.record.created_unix_ns;
    info.committed_unix_ns = e.record.committed_unix_ns;
    for (const ResidencyRecord& r : e.residency) {
      row.residency.push_back(r);
      row.configured.push_back(TierIndex(r.tier) >= 0);
    }
    if (e.record.state == CKPTDB_STATE_COMMITTED) {
      // Tiers that want the version and do not hold it yet: demotion pending.
      for (size_t t = 0; t < tiers_.size(); ++t) {
        bool recorded =
            std::any_of(e.residency.begin(), e.residency.end(),
                        [&](const ResidencyRecord& r) { return r.tier == tiers_[t].name(); });
        if (!recorded && Wants(t, version) && HasSource(version, t)) {
          ResidencyRecord pending;
          pending.tier = tiers_[t].name();
          pending.state = CKPTDB_RESIDENT_PENDING;
          row.residency.push_back(pending);
          row.configured.push_back(1);
        }
      }
    }
    rows.push_back(std::move(row));
  }
  lock.unlock();
  for (Row& row : rows) {
    std::vector<ckptdb_residency> res;
    for (size_t i = 0; i < row.residency.size(); ++i) {
      const ResidencyRecord& r = row.residency[i];
      res.push_back(ckptdb_residency{r.tier.c_str(), r.path.c_str(), r.state, row.configured[i]});
    }
    row.info.residency_count = static_cast<uint32_t>(res.size());
    row.info.residency = res.data();
    if (fn(arg, &row.info) != 0) break;
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
