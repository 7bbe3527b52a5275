#include "engine/repair.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "engine/catalog.h"
#include "engine/internal.h"
#include "engine/ram_tier.h"
#include "engine/tier.h"
#include "engine/witness.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "io/tier_spec.h"

namespace ckpt::engine {
namespace {

// What one copy of a committed version looked like.
struct CopyCheck {
  bool usable = false;   // footer and manifest verify and match the committed manifest
  int code = CKPTDB_OK;  // why not usable: ECORRUPT for damage, another code for a failing read
  ResidencyRecord residency;
  uint64_t bad_chunks = 0;
  uint32_t chunks = 0;
  uint64_t data_bytes = 0;
  uint32_t tensor_count = 0;
  uint64_t manifest_xxh3 = 0;
  std::string problem;  // why not usable, or which chunks failed
};

// Checks a segment through `read`: its footer, manifest, version and rank, then every chunk.
void CheckImage(const std::string& what, uint64_t size, const format::ReadAtFn& read,
                uint64_t version, uint32_t rank, uint64_t manifest_xxh3, CopyCheck* c) {
  std::unique_ptr<format::SegmentReader> reader;
  Status st = format::SegmentReader::Open(what, size, read, &reader);
  if (st.ok() && (reader->footer().version != version || reader->footer().rank != rank)) {
    st = Status::Corrupt(what + ": its footer says version " +
                         std::to_string(reader->footer().version) + " of rank " +
                         std::to_string(reader->footer().rank));
  }
  if (st.ok() && manifest_xxh3 != 0 && reader->footer().manifest_xxh3 != manifest_xxh3) {
    st = Status::Corrupt(what + ": its manifest xxh3 " +
                         format::Hex64(reader->footer().manifest_xxh3) +
                         " is not the committed one " + format::Hex64(manifest_xxh3));
  }
  if (!st.ok()) {
    c->problem = st.message();
    c->code = st.code();
    return;
  }
  c->usable = true;
  c->chunks = reader->footer().chunk_count;
  c->manifest_xxh3 = reader->footer().manifest_xxh3;
  const format::ManifestView& m = reader->manifest();
  c->tensor_count = m.tensor_count();
  for (uint32_t i = 0; i < m.tensor_count(); ++i) c->data_bytes += m.tensor(i).bytes();
  std::vector<uint8_t> scratch;
  for (uint32_t i = 0; i < c->chunks; ++i) {
    format::ChunkProblem problem;
    if (!reader->CheckChunk(i, &scratch, &problem).ok()) {
      if (c->bad_chunks++ == 0) {
        c->problem = "chunk " + std::to_string(i) + " at offset " +
                     std::to_string(problem.file_offset) + " fails its check";
      }
    }
  }
  if (c->bad_chunks > 1) c->problem += " (" + std::to_string(c->bad_chunks) + " chunks in all)";
}

// `path` + `suffix`, or with "-<ns>" after it when an earlier repair left that name: what is set
// aside is never set over.
std::string AsideName(io::Io* io, const std::string& path, const std::string& suffix) {
  uint64_t ignored = 0;
  const std::string aside = path + suffix;
  if (io->PathSize(aside, &ignored).code() == CKPTDB_ENOTFOUND) return aside;
  return aside + "-" + std::to_string(static_cast<uint64_t>(WallNs()));
}

class Repair {
 public:
  Repair(const DbOptions& options, const std::function<void(const std::string&)>& say,
         RepairOutcome* out)
      : options_(options), say_(say), out_(out) {}

  Status Run();

 private:
  void Say(const std::string& line) {
    if (say_) say_(line);
  }
  Status CheckIntact(bool* intact);
  // A committed version without a copy is lost only when every place it could be was looked
  // at: EIO for a copy that could not be read, EINVAL for one the catalog records on a tier
  // the spec leaves out; nothing is changed then.
  Status CheckLossesAreReal() const;
  // The intact catalog mended in place (its other records, a coordinator's among them, kept):
  // copies found that it does not record are added, lost versions deleted.
  Status MendCatalog();
  // The ram tier's arena, opened read-write under the store's lock (a damaged header copy is
  // rewritten from the other). *out is null when there is none, or when neither header copy
  // verifies: that arena is renamed aside (".damaged-<ns>"), so the next open starts a new one
  // and the catalog's records of the old one read as missing.
  Status OpenArena(const io::TierSpec& spec, std::unique_ptr<RamTier>* out);
  Status Lock();
  Status Gather();
  Status FindCopies();
  Status WriteCatalog();
  Status Finish();
  Status SetAside(const std::string& path, const std::string& suffix, const std::string& why);
  Status SetAsideOrphans();

  const DbOptions& options_;
  const std::function<void(const std::string&)>& say_;
  RepairOutcome* out_;
  std::unique_ptr<io::Io> io_;
  std::unique_ptr<io::IoQueue> queue_;
  int lock_fd_ = -1;
  std::string root_;
  std::string catalog_dir_;

  SalvagedCatalog salvaged_;
  std::map<uint64_t, WitnessFile> witnesses_;
  Identity identity_;
  std::string tiers_;
  std::vector<io::TierSpec> specs_;
  // The versions to rebuild: committed ones (with their copies), and, in a job, PREPARED ones
  // that the coordinator decides at the next open.
  struct Version {
    VersionRecord record;
    bool witnessed = false;
    std::vector<ResidencyRecord> copies;    // found, each verified
    std::vector<ResidencyRecord> recorded;  // what the catalog (or what was salvaged) records
    // Every record EVICTED: retention took its copies and a crash came before its RETIRED
    // record. Not lost; the rebuilt catalog records it RETIRED.
    bool retiring = false;
    std::string uncertain;  // a copy that could not be looked at (not damage): why
  };
  std::map<uint64_t, Version> versions_;
  std::set<std::string> kept_paths_;  // segment files the new catalog accounts for
  // The arena generations the catalog's records of ram copies name, newest version first: what
  // an arena header rebuilt from its indexes takes (RamTier::RebuildHeader).
  std::vector<uint64_t> ram_generations_;
  void NoteRamGenerations(const std::map<uint64_t, VersionEntry>& versions);

 public:
  ~Repair() {
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }
};

Status Repair::Run() {
  root_ = options_.root;
  if (root_.empty()) return Status::Invalid("repair: name the store's root directory");
  catalog_dir_ = root_ + "/catalog";
  std::error_code ec;
  if (!std::filesystem::is_directory(root_, ec)) {
    return Status::NotFound("repair: no directory " + root_);
  }
  io_ = io::NewPosixIo();
  CKPTDB_RETURN_IF_ERROR(io_->NewQueue(io::QueueOptions{}, &queue_));
  CKPTDB_RETURN_IF_ERROR(Lock());
  bool intact = false;
  CKPTDB_RETURN_IF_ERROR(CheckIntact(&intact));
  if (intact) {
    // The catalog is whole, but every committed version it records must still have a copy
    // that verifies: the catalog is mended in place (never rebuilt: it holds more than
    // versions, a coordinator's epoch and decisions among them).
    CKPTDB_RETURN_IF_ERROR(FindCopies());
    CKPTDB_RETURN_IF_ERROR(CheckLossesAreReal());
    CKPTDB_RETURN_IF_ERROR(MendCatalog());
    return Finish();
  }
  CKPTDB_RETURN_IF_ERROR(Gather());
  CKPTDB_RETURN_IF_ERROR(FindCopies());
  CKPTDB_RETURN_IF_ERROR(CheckLossesAreReal());
  CKPTDB_RETURN_IF_ERROR(WriteCatalog());
  return Finish();
}

Status Repair::Lock() {
  const std::string path = root_ + "/LOCK";
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return Status::FromErrno(errno, "repair: opening " + path);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::Busy("repair: store " + root_ +
                          " is open read-write (a trainer or another repair); close it first");
    }
    return Status::FromErrno(errno, "repair: locking " + path);
  }
  return Status::Ok();
}

// The catalog opens whole and agrees with every valid witness: nothing to rebuild. The
// versions it records as committed are what Finish writes missing witnesses for.
Status Repair::CheckIntact(bool* intact) {
  *intact = false;
  std::error_code ec;
  if (!std::filesystem::exists(catalog_dir_ + "/CURRENT", ec)) {
    Say("catalog " + catalog_dir_ + ": missing or without CURRENT; rebuilding it");
    return Status::Ok();
  }
  std::unique_ptr<Catalog> catalog;
  Status st = Catalog::Open(catalog_dir_, /*read_only=*/true, /*create=*/false, &catalog);
  Identity id;
  if (st.ok()) st = catalog->GetIdentity(&id);
  std::map<uint64_t, VersionEntry> versions;
  if (st.ok()) st = catalog->LoadAll(&versions);
  if (st.ok()) st = WitnessDir(io_.get(), root_).Load(id.rank, 0, &witnesses_);
  std::vector<std::string> problems;
  if (st.ok()) {
    st = CheckWitnessesAgainst(witnesses_, versions, id.job_id, catalog_dir_, root_, &problems);
  }
  if (!st.ok()) {
    // Only damage is repaired: an error that is not (a permission, a failing read, a full
    // disk) is returned, and nothing is changed.
    if (st.code() != CKPTDB_ECORRUPT && st.code() != CKPTDB_ENOTFOUND) {
      return st.WithContext("repair: reading the catalog");
    }
    Say(st.message() + "; rebuilding it");
    witnesses_.clear();
    return Status::Ok();
  }
  *intact = true;
  identity_ = id;
  (void)catalog->GetTiers(&tiers_);
  catalog.reset();
  Say("catalog " + catalog_dir_ + ": intact, and every commit witness agrees with it");
  // The arena (the one other piece of metadata an open refuses to go past) and every copy are
  // checked next (Run: FindCopies).
  if (!options_.tiers.empty()) tiers_ = options_.tiers;
  if (tiers_.empty()) tiers_ = "disk:" + root_ + "/segments";
  NoteRamGenerations(versions);
  for (const auto& [v, e] : versions) {
    if (e.record.state != CKPTDB_STATE_COMMITTED || AllEvicted(e.residency)) continue;
    Version& ver = versions_[v];
    ver.record = e.record;
    ver.recorded = e.residency;
    auto w = witnesses_.find(v);
    ver.witnessed = w != witnesses_.end() && w->second.status.ok();
  }
  return Status::Ok();
}

void Repair::NoteRamGenerations(const std::map<uint64_t, VersionEntry>& versions) {
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    for (const ResidencyRecord& r : it->second.residency) {
      if (!IsRamName(r.tier) || r.ram_generation == 0) continue;
      if (std::find(ram_generations_.begin(), ram_generations_.end(), r.ram_generation) ==
          ram_generations_.end()) {
        ram_generations_.push_back(r.ram_generation);
      }
    }
  }
}

Status Repair::OpenArena(const io::TierSpec& spec, std::unique_ptr<RamTier>* out) {
  out->reset();
  const std::string path = RamTier::ArenaPath(spec.path, identity_.job_id, identity_.rank);
  uint64_t bytes = 0;
  if (io_->PathSize(path, &bytes).code() == CKPTDB_ENOTFOUND) {
    Say("tier " + spec.name + ": no arena of this store at " + path);
    return Status::Ok();
  }
  auto ram = std::make_unique<RamTier>(io_.get(), spec);
  Status st = ram->Open(identity_.job_id, identity_.rank, root_, /*read_only=*/false);
  if (st.ok() && ram->available()) {
    *out = std::move(ram);
    return Status::Ok();
  }
  if (st.code() == CKPTDB_ECORRUPT && ram->header_unreadable()) {
    Status rebuilt = ram->RebuildHeader(identity_.job_id, identity_.rank, ram_generations_);
    if (rebuilt.ok()) {
      Say("tier " + spec.name + ": " + st.message() + "; its header was rebuilt from its " +
          "copies' indexes (generation " + format::Hex64(ram->generation()) + ")");
      *out = std::move(ram);
      return Status::Ok();
    }
    st = Status::Corrupt(st.message() + "; " + rebuilt.message());
  }
  ram.reset();  // unmapped before the rename
  if (st.code() != CKPTDB_ECORRUPT && st.code() != CKPTDB_EINVAL) return st;
  const std::string aside = path + ".damaged-" + std::to_string(static_cast<uint64_t>(WallNs()));
  CKPTDB_RETURN_IF_ERROR(io_->Rename(path, aside));
  ++out_->files_moved_aside;
  Say("tier " + spec.name + ": the arena " + path + " cannot be used (" + st.message() +
      "); moved aside to " + aside + ": its copies are not recovered");
  return Status::Ok();
}

// Step 2: what the old catalog still says, and the witnesses.
Status Repair::Gather() {
  out_->catalog_rebuilt = true;
  std::error_code ec;
  if (std::filesystem::exists(catalog_dir_ + "/CURRENT", ec)) {
    Catalog::Salvage(catalog_dir_, &salvaged_);
    if (!salvaged_.opened) {
      Say("old catalog: unreadable (" + salvaged_.open_error + ")");
    } else {
      Say("old catalog: " + std::to_string(salvaged_.versions.size()) + " version record(s) read" +
          (salvaged_.problems.empty() ? std::string()
                                      : ", " + std::to_string(salvaged_.problems.size()) +
                                            " problem(s): " + salvaged_.problems.front()));
    }
  }
  NoteRamGenerations(salvaged_.versions);
  CKPTDB_RETURN_IF_ERROR(WitnessDir(io_.get(), root_).Load(WitnessDir::kAnyRank, 0, &witnesses_));
  // Whose store: the old catalog's identity, else the newest valid witness's.
  const format::CommitWitness* newest = nullptr;
  for (const auto& [v, f] : witnesses_) {
    if (f.status.ok()) newest = &f.witness;
  }
  if (salvaged_.has_identity) {
    identity_ = salvaged_.identity;
  } else if (newest != nullptr) {
    identity_.job_id = newest->job_id;
    identity_.rank = newest->rank;
    identity_.world_size = newest->world_size;
    identity_.chunk_bytes = newest->chunk_bytes;
    identity_.created_unix_ns = newest->store_created_unix_ns;
    Say("identity: from commit witness of version " + std::to_string(newest->version) +
        " (job id " + format::Hex64(identity_.job_id) + ", rank " + std::to_string(identity_.rank) +
        ")");
  } else {
    return Status::Corrupt(
        "repair: store " + root_ +
        " has no readable identity record and no valid commit witness: nothing proves which "
        "versions committed; nothing was changed");
  }
  for (auto& [v, f] : witnesses_) {
    if (!f.status.ok()) {
      Say("witness " + f.path + ": " + f.status.message());
    } else if (f.witness.rank != identity_.rank || f.witness.job_id != identity_.job_id) {
      f.status = Status::Corrupt("commit witness " + f.path + " names job id " +
                                 format::Hex64(f.witness.job_id) + " rank " +
                                 std::to_string(f.witness.rank) + ", not this store's");
      Say("witness " + f.path + ": " + f.status.message() + "; ignored");
    }
  }
  // The tier spec: the caller's, else the old catalog's, else the newest witness's.
  tiers_ = !options_.tiers.empty()                       ? options_.tiers
           : !salvaged_.tiers.empty()                    ? salvaged_.tiers
           : newest != nullptr && !newest->tiers.empty() ? newest->tiers
                                                         : "disk:" + root_ + "/segments";
  // Committed: a valid witness, or a salvaged COMMITTED record. A job's PREPARED records stay
  // for the coordinator to decide; a lone rank's never committed.
  for (const auto& [v, f] : witnesses_) {
    if (!f.status.ok()) continue;
    Version& ver = versions_[v];
    ver.witnessed = true;
    ver.record.version = v;
    ver.record.state = CKPTDB_STATE_COMMITTED;
    ver.record.rank = identity_.rank;
    ver.record.data_bytes = f.witness.data_bytes;
    ver.record.tensor_count = f.witness.tensor_count;
    ver.record.chunk_count = f.witness.chunk_count;
    ver.record.created_unix_ns = f.witness.created_unix_ns;
    ver.record.committed_unix_ns = f.witness.committed_unix_ns;
    ver.record.manifest_xxh3 = f.witness.manifest_xxh3;
  }
  for (const auto& [v, e] : salvaged_.versions) {
    const int state = e.record.state;
    const bool committed = state == CKPTDB_STATE_COMMITTED;
    const bool in_doubt = state == CKPTDB_STATE_PREPARED && identity_.world_size > 1;
    if (!committed && !in_doubt) continue;
    auto it = versions_.find(v);
    if (it != versions_.end()) {
      if (e.record.manifest_xxh3 != it->second.record.manifest_xxh3) {
        Say("version " + std::to_string(v) + ": the old catalog's manifest xxh3 " +
            format::Hex64(e.record.manifest_xxh3) +
            " differs from its witness's; the witness's "
            "is used");
      }
      it->second.recorded = e.residency;
      it->second.retiring = committed && AllEvicted(e.residency);
      continue;
    }
    Version& ver = versions_[v];
    ver.record = e.record;
    ver.recorded = e.residency;
    ver.retiring = committed && AllEvicted(e.residency);
  }
  return Status::Ok();
}

// Step 3: every copy of every version, checked.
Status Repair::FindCopies() {
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  Status st = io::ParseTierSpecs(tiers_, cwd, &specs_);
  if (!st.ok()) {
    return Status::Invalid("repair: the tier spec \"" + tiers_ + "\" does not parse (" +
                           st.message() + "); give the store's tiers with --tiers");
  }
  // Recorded as the store's spec from here on (the catalog's, each witness's): in the canonical
  // form an open records, paths made absolute against this process's directory once.
  tiers_.clear();
  for (const io::TierSpec& spec : specs_) {
    tiers_ += (tiers_.empty() ? "" : ";") + io::FormatTierSpec(spec);
  }
  Say("tiers: " + tiers_);
  for (const io::TierSpec& spec : specs_) {
    if (spec.kind == io::TierKind::kRam) {
      std::unique_ptr<RamTier> arena;
      CKPTDB_RETURN_IF_ERROR(OpenArena(spec, &arena));
      if (arena == nullptr) continue;
      RamTier& ram = *arena;
      std::vector<RamImage> images;
      st = ram.ScanImages(identity_.job_id, identity_.rank, &images);
      if (!st.ok()) {
        Say("tier " + spec.name + ": " + st.message());
        for (auto& [v, ver] : versions_) ver.uncertain = st.message();
        continue;
      }
      for (const RamImage& image : images) {
        auto it = versions_.find(image.version);
        if (it == versions_.end()) continue;  // not committed: its regions are simply free
        const std::string what = "tier " + spec.name + ", version " +
                                 std::to_string(image.version) + ", arena " + ram.path();
        CopyCheck c;
        CheckImage(
            what, image.file_bytes,
            [&](uint64_t off, void* buf, size_t len) {
              return ram.ReadAt(image, off, buf, len, what);
            },
            image.version, identity_.rank, it->second.record.manifest_xxh3, &c);
        if (!c.usable) {
          Say("version " + std::to_string(image.version) + " on " + spec.name +
              ": not usable: " + c.problem);
          continue;
        }
        c.residency.tier = spec.name;
        c.residency.state = CKPTDB_RESIDENT_DURABLE;
        c.residency.path = ram.path();
        c.residency.file_bytes = image.file_bytes;
        c.residency.ram_generation = ram.generation();
        c.residency.ram_index_offset = image.index_offset;
        c.residency.ram_index_bytes = image.index_bytes;
        if (c.bad_chunks > 0) {
          Say("version " + std::to_string(image.version) + " on " + spec.name + ": kept, but " +
              c.problem + " (restore reads those chunks from another copy)");
        }
        it->second.copies.push_back(c.residency);
      }
      continue;
    }
    Tier tier(io_.get(), spec);
    for (auto& [v, ver] : versions_) {
      const std::string path = tier.SegmentPath(v, identity_.rank);
      uint64_t size = 0;
      if (Status found = io_->PathSize(path, &size); !found.ok()) {
        if (found.code() != CKPTDB_ENOTFOUND) ver.uncertain = found.message();
        continue;
      }
      const std::string what = "segment " + path + " (tier " + spec.name + ")";
      int fd = -1;
      bool direct = false;
      CopyCheck c;
      st = io_->Open(path, io::OpenOptions{}, &fd, &direct);
      if (!st.ok()) {
        Say("version " + std::to_string(v) + " on " + spec.name + ": " + st.message());
        if (st.code() != CKPTDB_ENOTFOUND) ver.uncertain = st.message();
        continue;
      }
      io::IoQueue* q = queue_.get();
      CheckImage(
          what, size,
          [q, fd, what](uint64_t off, void* buf, size_t len) {
            return io::ReadAt(*q, fd, off, buf, len, what);
          },
          v, identity_.rank, ver.record.manifest_xxh3, &c);
      (void)io_->Close(fd);
      if (!c.usable) {
        Say("version " + std::to_string(v) + " on " + spec.name + ": not usable: " + c.problem);
        if (c.code != CKPTDB_ECORRUPT && c.code != CKPTDB_ENOTFOUND) ver.uncertain = c.problem;
        continue;
      }
      if (ver.record.manifest_xxh3 == 0) ver.record.manifest_xxh3 = c.manifest_xxh3;
      if (ver.record.data_bytes == 0) ver.record.data_bytes = c.data_bytes;
      if (ver.record.tensor_count == 0) ver.record.tensor_count = c.tensor_count;
      if (ver.record.chunk_count == 0) ver.record.chunk_count = c.chunks;
      if (c.bad_chunks > 0) {
        Say("version " + std::to_string(v) + " on " + spec.name + ": kept, but " + c.problem +
            " (restore reads those chunks from another copy)");
      }
      c.residency.tier = spec.name;
      c.residency.state = CKPTDB_RESIDENT_DURABLE;
      c.residency.path = path;
      c.residency.file_bytes = size;
      ver.copies.push_back(c.residency);
      kept_paths_.insert(path);
    }
  }
  return Status::Ok();
}

Status Repair::CheckLossesAreReal() const {
  std::set<std::string> names;
  std::string arena;
  for (const io::TierSpec& spec : specs_) {
    names.insert(spec.name);
    if (spec.kind == io::TierKind::kRam) {
      arena = RamTier::ArenaPath(spec.path, identity_.job_id, identity_.rank);
    }
  }
  for (const auto& [v, ver] : versions_) {
    if (!ver.copies.empty() || ver.retiring || ver.record.state != CKPTDB_STATE_COMMITTED) {
      continue;
    }
    if (!ver.uncertain.empty()) {
      return Status::IoError("repair: cannot tell whether " + V(v) + " has a copy (" +
                             ver.uncertain +
                             "); nothing was changed: run it again once that can be read");
    }
    for (const ResidencyRecord& r : ver.recorded) {
      if (r.state != CKPTDB_RESIDENT_DURABLE) continue;
      std::error_code ec;
      const bool listed =
          names.count(r.tier) > 0 &&
          (!IsRamName(r.tier) || r.path == arena || std::filesystem::equivalent(r.path, arena, ec));
      if (listed) continue;
      return Status::Invalid("repair: " + V(v) + " has no copy on the tiers \"" + tiers_ +
                             "\", but the catalog records one on tier " + r.tier + " (" + r.path +
                             "), which they leave out; nothing was changed: give " +
                             "--tiers with that tier too");
    }
  }
  return Status::Ok();
}

Status Repair::MendCatalog() {
  CatalogBatch batch;
  for (const auto& [v, ver] : versions_) {
    if (ver.copies.empty()) {
      batch.delete_versions.push_back(v);  // lost (CheckLossesAreReal): Finish names it
      continue;
    }
    for (const ResidencyRecord& c : ver.copies) {
      const bool known = std::any_of(ver.recorded.begin(), ver.recorded.end(), [&](const auto& r) {
        return r.tier == c.tier && r.state == CKPTDB_RESIDENT_DURABLE;
      });
      if (!known) batch.put_residency.emplace_back(v, c);
    }
  }
  if (batch.delete_versions.empty() && batch.put_residency.empty()) return Status::Ok();
  std::unique_ptr<Catalog> catalog;
  CKPTDB_RETURN_IF_ERROR(
      Catalog::Open(catalog_dir_, /*read_only=*/false, /*create=*/false, &catalog)
          .WithContext("repair: opening the catalog to mend it"));
  CKPTDB_RETURN_IF_ERROR(catalog->Apply(batch, /*sync=*/true));
  for (const auto& [v, c] : batch.put_residency) {
    Say("version " + std::to_string(v) + ": its copy on " + c.tier + " (" + c.path +
        ") verifies and is recorded again");
  }
  out_->copies_recovered += batch.put_residency.size();
  return Status::Ok();
}

// Step 4: the new catalog, built beside the old and swapped in by two renames.
Status Repair::WriteCatalog() {
  const std::string fresh =
      root_ + "/catalog.repair-" + std::to_string(static_cast<uint64_t>(WallNs()));
  std::unique_ptr<Catalog> catalog;
  CKPTDB_RETURN_IF_ERROR(Catalog::Open(fresh, /*read_only=*/false, /*create=*/true, &catalog)
                             .WithContext("repair: creating the new catalog"));
  CKPTDB_RETURN_IF_ERROR(catalog->PutIdentity(identity_));
  CKPTDB_RETURN_IF_ERROR(catalog->PutTiers(tiers_));
  CatalogBatch batch;
  for (auto& [v, ver] : versions_) {
    // A committed version that no copy backs is not recorded (Finish names it lost and moves
    // its witness aside): recorded, it would read as committed and block its version number.
    // One whose copies retention took is recorded retired.
    if (ver.retiring && ver.copies.empty()) {
      VersionRecord retired = ver.record;
      retired.state = CKPTDB_STATE_RETIRED;
      batch.put_versions.push_back(retired);
      continue;
    }
    if (ver.record.state == CKPTDB_STATE_COMMITTED && ver.copies.empty()) continue;
    batch.put_versions.push_back(ver.record);
    for (const ResidencyRecord& r : ver.copies) batch.put_residency.emplace_back(v, r);
  }
  // The newest retired version stays the floor for "versions must increase".
  for (auto it = salvaged_.versions.rbegin(); it != salvaged_.versions.rend(); ++it) {
    if (it->second.record.state == CKPTDB_STATE_RETIRED && !versions_.count(it->first)) {
      batch.put_versions.push_back(it->second.record);
      break;
    }
  }
  CKPTDB_RETURN_IF_ERROR(catalog->Apply(batch, /*sync=*/true));
  catalog.reset();
  std::error_code ec;
  if (std::filesystem::exists(catalog_dir_, ec)) {
    const std::string aside =
        root_ + "/catalog.damaged-" + std::to_string(static_cast<uint64_t>(WallNs()));
    CKPTDB_RETURN_IF_ERROR(io_->Rename(catalog_dir_, aside));
    Say("old catalog kept as " + aside);
  }
  CKPTDB_RETURN_IF_ERROR(io_->Rename(fresh, catalog_dir_));
  CKPTDB_RETURN_IF_ERROR(io_->SyncDir(root_));
  Say("new catalog written: " + catalog_dir_);
  return Status::Ok();
}

// Renames `path` to AsideName(path, suffix) and says so, `why` first.
Status Repair::SetAside(const std::string& path, const std::string& suffix,
                        const std::string& why) {
  const std::string aside = AsideName(io_.get(), path, suffix);
  CKPTDB_RETURN_IF_ERROR(io_->Rename(path, aside));
  ++out_->files_moved_aside;
  Say(why + "; moved aside to " + aside);
  return Status::Ok();
}

// What the next open's sweep would delete goes aside instead: repair deletes nothing.
Status Repair::SetAsideOrphans() {
  for (const io::TierSpec& spec : specs_) {
    if (spec.kind == io::TierKind::kRam) continue;
    Tier tier(io_.get(), spec);
    std::vector<SegmentFileName> files;
    if (!tier.ListSegments(&files).ok()) continue;
    for (const SegmentFileName& f : files) {
      const std::string path = spec.path + "/" + f.name;
      if (f.rank != identity_.rank || kept_paths_.count(path)) continue;
      CKPTDB_RETURN_IF_ERROR(
          SetAside(path, ".orphan", "segment " + path + ": no recovered version accounts for it"));
    }
    (void)io_->SyncDir(spec.path);
  }
  return Status::Ok();
}

// Step 5 (and the intact case): witnesses, files moved aside, the verdict.
Status Repair::Finish() {
  WitnessDir witnesses(io_.get(), root_);
  uint64_t lost = 0;
  std::string lost_list;
  // A damaged witness (or something else under its name, a directory) goes aside first: a
  // recovered version's is written again below, and nothing may stand in the way of that.
  std::set<uint64_t> aside;
  for (const auto& [v, f] : witnesses_) {
    if (f.status.ok()) continue;
    CKPTDB_RETURN_IF_ERROR(SetAside(f.path, ".damaged", "witness " + f.path));
    aside.insert(v);
  }
  for (auto& [v, ver] : versions_) {
    if (ver.record.state != CKPTDB_STATE_COMMITTED) {
      Say("version " + std::to_string(v) + ": PREPARED, " + std::to_string(ver.copies.size()) +
          " copy(ies); the job's coordinator decides it at the next open");
      continue;
    }
    if (ver.retiring && ver.copies.empty()) {
      Say("version " + std::to_string(v) + ": retention had evicted every copy; recorded retired");
      continue;
    }
    if (ver.copies.empty()) {
      ++lost;
      lost_list += (lost_list.empty() ? "" : ", ") + std::to_string(v);
      Say("version " + std::to_string(v) + ": NOT recovered: committed, but no copy verifies");
      continue;
    }
    ++out_->versions_recovered;
    if (out_->catalog_rebuilt) {
      out_->copies_recovered += ver.copies.size();
      std::string where;
      for (const ResidencyRecord& r : ver.copies) where += (where.empty() ? "" : ", ") + r.tier;
      Say("version " + std::to_string(v) + ": recovered (" + where + ")");
    }
    if (ver.witnessed) continue;
    ver.record.version = v;
    const format::CommitWitness w = MakeWitness(identity_, ver.record, tiers_);
    CKPTDB_RETURN_IF_ERROR(
        witnesses.Write(w).WithContext("repair: writing the witness of " + V(v)));
    ++out_->witnesses_written;
    Say("version " + std::to_string(v) + ": commit witness written");
  }
  out_->versions_lost = lost;
  // Tier markers: rewritten where missing or damaged in a directory that holds this store's
  // segments (a directory without them is not provably this store's, and is left alone).
  for (const io::TierSpec& spec : specs_) {
    if (spec.kind == io::TierKind::kRam) continue;
    Tier tier(io_.get(), spec);
    bool rewrote = false;
    CKPTDB_RETURN_IF_ERROR(tier.RepairMarker(identity_.job_id, &rewrote));
    if (rewrote) Say("tier " + spec.name + ": its marker " + Tier::kMarkerName + " rewritten");
  }
  // Witnesses the next open would refuse the catalog over: of a version not recovered (a forged
  // one among them), of one recorded retired, and (rebuilt) of one the new catalog lacks. A
  // recovered version's, a job's PREPARED one's and (intact) a retirement's stay.
  for (const auto& [v, f] : witnesses_) {
    if (aside.count(v) > 0) continue;
    auto it = versions_.find(v);
    const bool unbacked = it != versions_.end() &&
                          it->second.record.state == CKPTDB_STATE_COMMITTED &&
                          it->second.copies.empty();
    if (!unbacked && !(it == versions_.end() && out_->catalog_rebuilt)) continue;
    const bool retired = unbacked && it->second.retiring;
    CKPTDB_RETURN_IF_ERROR(
        SetAside(f.path, retired ? ".retired" : ".damaged", "witness " + f.path));
  }
  if (out_->catalog_rebuilt) CKPTDB_RETURN_IF_ERROR(SetAsideOrphans());
  if (lost > 0) {
    return Status::Corrupt(
        "repair: " + std::to_string(lost) +
        " committed version(s) could not be recovered (no copy verifies): " + lost_list);
  }
  return Status::Ok();
}

}  // namespace

Status RepairStore(const DbOptions& options, const std::function<void(const std::string&)>& say,
                   RepairOutcome* out) {
  *out = RepairOutcome{};
  Repair repair(options, say, out);
  return repair.Run();
}

}  // namespace ckpt::engine
