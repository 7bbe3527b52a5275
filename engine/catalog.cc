#include "engine/catalog.h"

#include <isa-l/crc.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "engine/catalog_codec.h"
#include "engine/table_ledger.h"
#include "format/checksum.h"
#include "format/segment_format.h"

namespace ckpt::engine {

using namespace catalog_codec;

namespace {

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  if (s.IsNotFound()) return Status::NotFound(what + ": " + s.ToString());
  if (s.IsCorruption()) return Status::Corrupt(what + ": " + s.ToString());
  if (s.IsNoSpace()) return Status::NoSpace(what + ": " + s.ToString());
  return Status::IoError(what + ": " + s.ToString());
}

}  // namespace

Catalog::~Catalog() = default;

// RocksDB's info log goes to ckptdb's own logging (stderr) instead of LOG files in the catalog
// directory: a read-only open must not create or rotate files there (a failed open leaves every
// byte as it found it). Warnings and errors are printed, and the last few are kept so that an
// open that fails can say which file RocksDB found damaged (its status alone does not).
class CatalogLogger final : public rocksdb::Logger {
 public:
  CatalogLogger(std::string dir, bool print)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL), dir_(std::move(dir)), print_(print) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[1024];
    std::vsnprintf(line, sizeof line, format, ap);
    // Warnings are kept for the error they may explain; errors are printed as they come (not
    // while a new catalog is made, where RocksDB reports the directory it is about to create).
    if (print_ && std::strstr(line, "[ERROR]") != nullptr) {
      std::fprintf(stderr, "ckptdb: catalog %s: rocksdb: %s\n", dir_.c_str(), line);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (recent_.size() == kRecentLines) recent_.erase(recent_.begin());
    recent_.emplace_back(line);
  }
  std::string Recent() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string text;
    for (const std::string& l : recent_) text += (text.empty() ? "" : "; ") + l;
    return text;
  }

 private:
  static constexpr size_t kRecentLines = 4;
  std::string dir_;
  bool print_;
  std::mutex mu_;
  std::vector<std::string> recent_;
};

namespace {
// The store a catalog directory belongs to (<root>/catalog), for messages.
std::string StoreRoot(const std::string& dir) {
  std::string root = std::filesystem::path(dir).parent_path().string();
  return root.empty() ? "." : root;
}
// True when `dir` holds only what RocksDB writes while creating a database, before CURRENT:
// IDENTITY, LOCK, the first MANIFEST, OPTIONS and temporary files. A log or a table means the
// catalog was in use.
bool OnlyCreationLeftovers(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool leftover = name == "IDENTITY" || name == "LOCK" || name == "MANIFEST-000001" ||
                          name.rfind("OPTIONS-", 0) == 0 || name.rfind("LOG", 0) == 0 ||
                          (name.size() > 6 && name.compare(name.size() - 6, 6, ".dbtmp") == 0);
    if (!leftover) return false;
  }
  return !ec;
}

}  // namespace

rocksdb::Options Catalog::BaseOptions(const std::shared_ptr<rocksdb::Logger>& logger) {
  rocksdb::Options options;
  options.paranoid_checks = true;
  // A torn tail (a crash inside an unsynced write) is tolerated, and only it: a record that
  // fails its checksum in the middle of the log, or any other damage, fails the open with
  // Corruption. The default (point-in-time recovery) would silently stop replaying at the first
  // bad record and so roll the store back past synced COMMITTED records (issue 20, finding 1).
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  options.info_log = logger;
  // No fallocate: RocksDB would preallocate about 1.1 x write_buffer_size of WAL (4.4 MB with
  // the old 4 MiB buffer) and a file system with less free fails every write. Space is checked
  // ahead instead (CheckSpace).
  options.allow_fallocate = false;
  // A catalog is small (a few records per version); keep RocksDB's footprint small too. The
  // write buffer bounds how much a flush writes at once, and so the reserve below.
  options.max_open_files = 64;
  options.write_buffer_size = 512 << 10;
  // A log file that goes missing is corruption, not an empty log (without this RocksDB cannot
  // tell, and the records in it, synced COMMITTED ones among them, would silently vanish).
  options.track_and_verify_wals_in_manifest = true;
  return options;
}

Status Catalog::CheckSpace(const std::string& dir, const std::string& what) {
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return Status::FromErrno(errno, "statvfs " + dir);
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes < kReserveBytes) {
    return Status::NoSpace(
        what + ": the file system of catalog " + dir + " has " + std::to_string(free_bytes) +
        " bytes free, below the catalog's reserve of " + std::to_string(kReserveBytes) +
        " bytes; nothing was written (free space there, then retry)");
  }
  return Status::Ok();
}

namespace {
std::atomic<CatalogEnvMaker> g_env_maker{nullptr};
}  // namespace

void SetCatalogEnvForTesting(CatalogEnvMaker make) { g_env_maker = make; }

Status Catalog::Open(const std::string& dir, bool read_only, bool create,
                     const std::function<Status(Catalog&)>& check, std::unique_ptr<Catalog>* out) {
  // What is there decides: no directory or an empty one is no catalog (created only when asked);
  // files without CURRENT are a damaged catalog, never a reason to start a new one over it.
  std::error_code ec;
  const bool exists = std::filesystem::is_directory(dir, ec);
  ec.clear();  // absent is an answer, not an error
  const bool empty = !exists || std::filesystem::is_empty(dir, ec);
  if (ec) return Status::IoError("reading catalog directory " + dir + ": " + ec.message());
  if (empty) {
    if (read_only || !create) return Status::NotFound("no ckptdb catalog at " + dir);
    return OpenRocks(dir, /*read_only=*/false, /*create=*/true, out);
  }
  if (!std::filesystem::exists(dir + "/CURRENT", ec) && OnlyCreationLeftovers(dir)) {
    // A first open that stopped while RocksDB made the catalog (CURRENT is its last step):
    // nothing was ever written to it, so it is no catalog.
    if (read_only || !create) return Status::NotFound("no ckptdb catalog at " + dir);
    return OpenRocks(dir, /*read_only=*/false, /*create=*/true, out);
  }
  if (!std::filesystem::exists(dir + "/CURRENT", ec)) {
    return Status::Corrupt("catalog " + dir +
                           " has files but no CURRENT: the catalog is damaged; nothing was "
                           "changed (run ckptdb repair " +
                           StoreRoot(dir) + ")");
  }
  // Opened read-only first and checked whole (every table's blocks, every record) before
  // anything is written: a damaged catalog fails the open with every byte as it was.
  // Every log is walked with its own framing first (ScanCatalogLog): RocksDB's strict mode
  // cannot tell a torn tail (a crash inside the last, synced, write) from damage, and it drops
  // some damage silently (a length past the end of an older log, a zero header mid-block).
  std::unique_ptr<Catalog> c;
  bool torn = false;
  CKPTDB_RETURN_IF_ERROR(ClassifyLogDamage(dir, &torn));
  const Recovery recovery = torn ? Recovery::kTornTail : Recovery::kStrict;
  CKPTDB_RETURN_IF_ERROR(OpenRocks(dir, /*read_only=*/true, /*create=*/false, &c, recovery));
  CKPTDB_RETURN_IF_ERROR(c->VerifyIntegrity());
  if (check) CKPTDB_RETURN_IF_ERROR(check(*c));
  if (read_only) {
    *out = std::move(c);
    return Status::Ok();
  }
  c.reset();
  CKPTDB_RETURN_IF_ERROR(CheckSpace(dir, "opening the catalog read-write"));
  return OpenRocks(dir, /*read_only=*/false, /*create=*/false, out, recovery);
}

Status Catalog::ClassifyLogDamage(const std::string& dir, bool* torn) {
  *torn = false;
  std::vector<std::pair<uint64_t, std::string>> logs;  // by number
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".log") != 0) continue;
    uint64_t number = 0;
    bool digits = true;
    for (size_t i = 0; i + 4 < name.size(); ++i) {
      digits = digits && name[i] >= '0' && name[i] <= '9';
      if (digits) number = number * 10 + static_cast<uint64_t>(name[i] - '0');
    }
    if (digits) logs.emplace_back(number, entry.path().string());
  }
  if (ec) return Status::IoError("listing catalog " + dir + ": " + ec.message());
  std::sort(logs.begin(), logs.end());
  for (size_t i = 0; i < logs.size(); ++i) {
    const std::string& path = logs[i].second;
    std::string bytes;
    {
      std::FILE* f = std::fopen(path.c_str(), "rb");
      if (f == nullptr) return Status::FromErrno(errno, "reading catalog log " + path);
      char buf[65536];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
        bytes.append(buf, n);
        if (bytes.size() > (64u << 20)) break;  // far beyond any catalog log; scan what we have
      }
      std::fclose(f);
    }
    LogScan scan = ScanCatalogLog(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    if (!scan.damaged) continue;
    const bool newest = i + 1 == logs.size();
    if (!newest || scan.valid_after) {
      return Status::Corrupt(
          "catalog " + dir + ": log " + path + ": the record at offset " +
          std::to_string(scan.bad_offset) + " fails its checksum or framing, and " +
          (newest ? "a later write follows it at offset " + std::to_string(scan.next_valid_offset)
                  : std::string("newer logs follow it")) +
          ": the log is damaged (a crash tears only the last write); nothing was changed (run "
          "ckptdb repair " +
          StoreRoot(dir) + ")");
    }
    std::fprintf(stderr,
                 "ckptdb: catalog %s: log %s ends in a torn record at offset %llu (a crash "
                 "inside its last write, which never returned); recovering without it\n",
                 dir.c_str(), path.c_str(), static_cast<unsigned long long>(scan.bad_offset));
    *torn = true;
  }
  return Status::Ok();
}

Status Catalog::OpenRocks(const std::string& dir, bool read_only, bool create,
                          std::unique_ptr<Catalog>* out, Recovery recovery) {
  auto logger =
      std::make_shared<CatalogLogger>(dir, /*print=*/!create && recovery == Recovery::kStrict);
  rocksdb::Options options = BaseOptions(logger);
  options.create_if_missing = create && !read_only;
  if (recovery == Recovery::kTornTail) {
    options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  } else if (recovery == Recovery::kSalvage) {
    // Point in time, not kSkipAnyCorruptedRecords: Debian's 7.8 log reader was seen to loop
    // forever skipping a damaged record (the corruption campaign hung in it). What lies past
    // the damage is lost to the salvage; the commit witnesses still name every committed
    // version. paranoid_checks stays on: without it a damaged table corrupted RocksDB's heap.
    options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  }
  auto c = std::unique_ptr<Catalog>(new Catalog());
  c->dir_ = dir;
  if (CatalogEnvMaker make = g_env_maker.load(); make != nullptr && !read_only) c->env_ = make();
  if (c->env_ != nullptr) options.env = c->env_.get();
  if (!read_only) {
    std::error_code ec;
    const std::string where = std::filesystem::is_directory(dir, ec)
                                  ? dir
                                  : std::filesystem::path(dir).parent_path().string();
    CKPTDB_RETURN_IF_ERROR(CheckSpace(where.empty() ? "." : where, "opening the catalog"));
  }
  if (!read_only) {
    options.listeners.push_back(std::make_shared<TableLedger>(
        dir, options.env != nullptr ? options.env : rocksdb::Env::Default()));
  }
  if (!create) {
    // Before RocksDB reads a table: a damaged one could abort the process inside DB::Open.
    CKPTDB_RETURN_IF_ERROR(TableLedger::Verify(dir));
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(options, dir, &db)
                                : rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) {
    std::string detail = logger->Recent();
    Status st = FromRocks(s, "opening catalog " + dir);
    if (st.code() == CKPTDB_ENOTFOUND ||
        (st.code() == CKPTDB_EIO && s.ToString().find("No such file") != std::string::npos)) {
      // A file the catalog's MANIFEST names is gone, or CURRENT names no MANIFEST. Other I/O
      // errors (permissions, descriptors, a failing disk) stay what they are: not damage.
      st = Status::Corrupt(st.message());
    }
    return Status::FromCode(
        st.code(), st.message() + (detail.empty() ? "" : " (" + detail + ")") +
                       "; nothing was changed (ckptdb verify says more; ckptdb repair rebuilds "
                       "the catalog from what verifies)");
  }
  c->db_.reset(db);
  c->logger_ = std::move(logger);
  c->read_only_ = read_only;
  c->recovery_ = recovery;
  *out = std::move(c);
  return Status::Ok();
}

Status Catalog::ReopenReadWrite(std::unique_ptr<Catalog>* catalog) {
  const std::string dir = (*catalog)->dir_;
  const Recovery recovery = (*catalog)->recovery_;
  catalog->reset();
  CKPTDB_RETURN_IF_ERROR(CheckSpace(dir, "opening the catalog read-write"));
  return OpenRocks(dir, /*read_only=*/false, /*create=*/false, catalog, recovery);
}

void Catalog::Salvage(const std::string& dir, SalvagedCatalog* out) {
  *out = SalvagedCatalog{};
  std::unique_ptr<Catalog> c;
  Status st = OpenRocks(dir, /*read_only=*/true, /*create=*/false, &c, Recovery::kSalvage);
  if (!st.ok()) {
    out->open_error = st.message();
    return;
  }
  out->opened = true;
  // Tables are read only when every block verifies: RocksDB is not safe to iterate over a
  // damaged table (the witnesses name every committed version without them).
  if (rocksdb::Status v = c->db_->VerifyChecksum(); !v.ok()) {
    out->problems.push_back("its tables fail their checksums (" + v.ToString() +
                            "); their version records are not read");
    return;
  }
  Status id = c->GetIdentity(&out->identity);
  out->has_identity = id.ok();
  if (!id.ok() && id.code() != CKPTDB_ENOTFOUND) out->problems.push_back(id.message());
  if (!c->GetTiers(&out->tiers).ok()) out->tiers.clear();
  std::unique_ptr<rocksdb::Iterator> it(c->db_->NewIterator(rocksdb::ReadOptions()));
  std::map<uint64_t, std::vector<ResidencyRecord>> residency;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::string key = it->key().ToString();
    if (key.size() == 10 && key.compare(0, 2, "v/") == 0) {
      const uint64_t v = FromBe64(key.data() + 2);
      VersionRecord r;
      Status d = DecodeVersion(it->value().ToString(), "v/" + std::to_string(v), &r);
      if (d.ok() && r.version != v)
        d = Status::Corrupt("v/" + std::to_string(v) + " names another version");
      if (!d.ok()) {
        out->problems.push_back("skipped catalog record " + d.message());
        continue;
      }
      VersionEntry& e = out->versions[v];
      e.has_record = true;
      e.record = r;
    } else if (key.size() > 11 && key.compare(0, 2, "r/") == 0) {
      const uint64_t v = FromBe64(key.data() + 2);
      ResidencyRecord r;
      Status d = DecodeResidency(it->value().ToString(),
                                 "r/" + std::to_string(v) + "/" + key.substr(11), &r);
      if (!d.ok()) {
        out->problems.push_back("skipped catalog record " + d.message());
        continue;
      }
      residency[v].push_back(std::move(r));
    }
  }
  if (!it->status().ok()) {
    out->problems.push_back("reading stopped at a damaged block: " + it->status().ToString());
  }
  for (auto& [v, list] : residency) {
    auto e = out->versions.find(v);
    if (e != out->versions.end()) e->second.residency = std::move(list);
  }
}

// Every table block's checksum, then every record decoded: damage anywhere is found at open, not
// when a version happens to be read.
Status Catalog::VerifyIntegrity() {
  rocksdb::Status s = db_->VerifyChecksum();
  if (!s.ok()) {
    std::string detail = logger_ ? logger_->Recent() : std::string();
    return Status::Corrupt("catalog " + dir_ + " fails its checksums: " + s.ToString() +
                           (detail.empty() ? "" : " (" + detail + ")") +
                           "; nothing was changed (run ckptdb repair " + StoreRoot(dir_) + ")");
  }
  std::map<uint64_t, VersionEntry> all;
  Status st = LoadAll(&all);
  if (st.ok()) {
    Identity id;
    st = GetIdentity(&id);
    if (st.code() == CKPTDB_ENOTFOUND) st = Status::Ok();  // checked by the caller
  }
  if (!st.ok()) {
    return Status::FromCode(
        st.code() == CKPTDB_ENOTSUP ? CKPTDB_ENOTSUP : CKPTDB_ECORRUPT,
        st.message() + "; nothing was changed (run ckptdb repair " + StoreRoot(dir_) + ")");
  }
  return Status::Ok();
}

Status Catalog::GetIdentity(Identity* out) {
  std::string v;
  CKPTDB_RETURN_IF_ERROR(FromRocks(db_->Get(rocksdb::ReadOptions(), "meta/identity", &v),
                                   "catalog " + dir_ + " identity"));
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, "meta/identity"));
  Reader r(v);
  uint8_t fmt;
  if (!r.Get(&fmt) || !r.Get(&out->job_id) || !r.Get(&out->rank) || !r.Get(&out->world_size) ||
      !r.Get(&out->chunk_bytes) || !r.Get(&out->created_unix_ns) || r.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record meta/identity has the wrong length");
  }
  return Status::Ok();
}

Status Catalog::PutIdentity(const Identity& id) {
  Writer w;
  w.Put<uint8_t>(kRecordFormat);
  w.Put(id.job_id);
  w.Put(id.rank);
  w.Put(id.world_size);
  w.Put(id.chunk_bytes);
  w.Put(id.created_unix_ns);
  CKPTDB_RETURN_IF_ERROR(CheckSpace(dir_, "writing the store's identity"));
  rocksdb::WriteOptions o;
  o.sync = true;
  return FromRocks(db_->Put(o, "meta/identity", w.Finish()), "catalog " + dir_);
}

Status Catalog::GetTiers(std::string* spec) {
  return FromRocks(db_->Get(rocksdb::ReadOptions(), "meta/tiers", spec),
                   "catalog " + dir_ + " tiers");
}

Status Catalog::PutTiers(const std::string& spec) {
  CKPTDB_RETURN_IF_ERROR(CheckSpace(dir_, "writing the tier spec"));
  rocksdb::WriteOptions o;
  o.sync = true;
  return FromRocks(db_->Put(o, "meta/tiers", spec), "catalog " + dir_);
}

Status Catalog::GetMeta(const std::string& key, std::string* value) {
  return FromRocks(db_->Get(rocksdb::ReadOptions(), key, value), "catalog " + dir_ + " " + key);
}

Status Catalog::PutMeta(const std::string& key, const std::string& value, bool sync) {
  CKPTDB_RETURN_IF_ERROR(CheckSpace(dir_, "writing " + key));
  (void)sync;  // every catalog write is synced (ScanCatalogLog relies on it)
  rocksdb::WriteOptions o;
  o.sync = true;
  return FromRocks(db_->Put(o, key, value), "catalog " + dir_ + " " + key);
}

Status Catalog::ListMeta(const std::string& prefix, std::map<std::string, std::string>* out) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    (*out)[it->key().ToString()] = it->value().ToString();
  }
  return FromRocks(it->status(), "catalog " + dir_ + " " + prefix);
}

Status Catalog::Apply(const CatalogBatch& batch, bool sync) {
  // A full file system under RocksDB aborts the process (an assertion in Debian's build after a
  // failed WAL append): it is never allowed to get there.
  CKPTDB_RETURN_IF_ERROR(CheckSpace(dir_, "writing the catalog"));
  rocksdb::WriteBatch wb;
  for (uint64_t v : batch.delete_versions) {
    wb.Delete(VersionKey(v));
    wb.Delete(StatsKey(v));
    std::string p = ResidencyPrefix(v);
    std::string end = p;
    end.back() = static_cast<char>('/' + 1);
    wb.DeleteRange(p, end);
  }
  for (const VersionRecord& r : batch.put_versions) wb.Put(VersionKey(r.version), EncodeVersion(r));
  for (const auto& [v, tier] : batch.delete_residency) wb.Delete(ResidencyPrefix(v) + tier);
  for (const auto& [v, r] : batch.put_residency)
    wb.Put(ResidencyPrefix(v) + r.tier, EncodeResidency(r));
  for (const auto& [v, r] : batch.put_stats) wb.Put(StatsKey(v), EncodeStats(r));
  // Every write is synced, whatever the caller's `sync` says, so that a crash can tear only the
  // last one: that is how Open tells a torn tail from damage (ScanCatalogLog). The writes a
  // caller would leave unsynced (aborts, retirements, residency) are few per version.
  (void)sync;
  rocksdb::WriteOptions o;
  o.sync = true;
  return FromRocks(db_->Write(o, &wb), "writing catalog " + dir_);
}

Status Catalog::LoadAll(std::map<uint64_t, VersionEntry>* out) {
  out->clear();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("r/"); it->Valid() && it->key().starts_with("r/"); it->Next()) {
    std::string key = it->key().ToString();
    if (key.size() < 2 + 8 + 2) return Status::Corrupt("catalog key of bad length under r/");
    uint64_t v = FromBe64(key.data() + 2);
    ResidencyRecord r;
    CKPTDB_RETURN_IF_ERROR(DecodeResidency(it->value().ToString(),
                                           "r/" + std::to_string(v) + "/" + key.substr(11), &r));
    (*out)[v].residency.push_back(std::move(r));
  }
  CKPTDB_RETURN_IF_ERROR(FromRocks(it->status(), "reading catalog " + dir_));
  for (it->Seek("v/"); it->Valid() && it->key().starts_with("v/"); it->Next()) {
    if (it->key().size() != 10) return Status::Corrupt("catalog key of bad length under v/");
    uint64_t v = FromBe64(it->key().data() + 2);
    VersionRecord r;
    CKPTDB_RETURN_IF_ERROR(DecodeVersion(it->value().ToString(), "v/" + std::to_string(v), &r));
    if (r.version != v)
      return Status::Corrupt("catalog record v/" + std::to_string(v) + " names version " +
                             std::to_string(r.version));
    (*out)[v].record = r;
    (*out)[v].has_record = true;
  }
  CKPTDB_RETURN_IF_ERROR(FromRocks(it->status(), "reading catalog " + dir_));
  for (it->Seek("s/"); it->Valid() && it->key().starts_with("s/"); it->Next()) {
    if (it->key().size() != 10) return Status::Corrupt("catalog key of bad length under s/");
    uint64_t v = FromBe64(it->key().data() + 2);
    auto e = out->find(v);
    // Figures are written with or after their version record and deleted with it. A figure
    // record without its version, or one that does not decode, is damage that affects nothing
    // restorable: it is skipped (and said), never a reason to refuse the store.
    if (e == out->end() || !e->second.has_record) continue;
    Status st = DecodeStats(it->value().ToString(), "s/" + std::to_string(v), &e->second.stats);
    if (!st.ok()) {
      std::fprintf(stderr, "ckptdb: %s; its figures are ignored\n", st.message().c_str());
      e->second.stats = VersionStatsRecord{};
      continue;
    }
    e->second.has_stats = true;
  }
  CKPTDB_RETURN_IF_ERROR(FromRocks(it->status(), "reading catalog " + dir_));
  // Residency without a version record cannot be produced by Apply; refuse it as damage.
  for (const auto& [v, e] : *out) {
    if (!e.has_record) {
      return Status::Corrupt("catalog has residency for version " + std::to_string(v) +
                             " but no version record");
    }
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
