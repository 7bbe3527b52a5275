// The catalog (DESIGN.md section 6): one RocksDB per rank holding the store's identity, every
// version's state and every segment's residency per tier. Decisions that must survive a crash
// (PREPARED, COMMITTED, ABORTED) are written with sync; the rest may be lost, because recovery
// treats anything undecided as aborted (presumed abort).
//
// Keys (bytewise order):
//   "meta/identity"                      -> Identity
//   "meta/tiers"                         -> the tier spec of the last read-write open
//   "v/" + be64(version)                 -> VersionRecord
//   "r/" + be64(version) + "/" + tier    -> ResidencyRecord
//   "s/" + be64(version)                 -> VersionStatsRecord (figures for ckptdb_version_stats)
// Values are fixed little-endian layouts ending in their own xxh3, checked on every read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "util/status.h"

namespace rocksdb {
class DB;
class Env;
class Logger;
struct Options;
}  // namespace rocksdb

namespace ckpt::engine {

struct Identity {
  uint64_t job_id = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t chunk_bytes = 0;
  uint64_t created_unix_ns = 0;
};

struct VersionRecord {
  uint64_t version = 0;
  int state = CKPTDB_STATE_OPEN;
  uint32_t rank = 0;
  uint64_t data_bytes = 0;
  uint32_t tensor_count = 0;
  uint32_t chunk_count = 0;
  uint64_t created_unix_ns = 0;
  uint64_t committed_unix_ns = 0;
  uint64_t manifest_xxh3 = 0;
};

struct ResidencyRecord {
  std::string tier;  // the tier's canonical name
  int state = CKPTDB_RESIDENT_WRITING;
  std::string path;         // the segment file; the ram tier: its arena file
  uint64_t file_bytes = 0;  // the segment's size (ram: of the image the index describes)
  // The ram tier only: where the copy's index lies in the arena, and the arena's generation
  // (a new arena file, after a reboot, has another, so old records read as missing).
  uint64_t ram_generation = 0;
  uint64_t ram_index_offset = 0;
  uint64_t ram_index_bytes = 0;
};

// Every record EVICTED: retention took each copy and a crash came before the version's RETIRED
// record (the next read-write open writes it). Not a version that lost its copies.
inline bool AllEvicted(const std::vector<ResidencyRecord>& records) {
  return !records.empty() &&
         std::all_of(records.begin(), records.end(),
                     [](const ResidencyRecord& r) { return r.state == CKPTDB_RESIDENT_EVICTED; });
}

// What one version cost, kept so that the tools can show it (ckptdb inspect --stats).
struct VersionStatsRecord {
  uint64_t bytes = 0;
  uint64_t put_calls = 0;
  uint64_t put_blocked_ns = 0;
  uint64_t wait_capture_blocked_ns = 0;
  uint64_t commit_blocked_ns = 0;
  uint64_t capture_ns = 0;
  uint64_t commit_ns = 0;
  uint64_t backpressure_waits = 0;
  uint64_t backpressure_wait_ns = 0;
  uint64_t direct_chunks = 0;
  uint64_t staging_high_water_bytes = 0;
  uint64_t fsyncs = 0;
  struct Tier {
    std::string name;
    uint64_t bytes_written = 0;
    uint64_t write_ns = 0;
  };
  std::vector<Tier> tiers;  // at most CKPTDB_MAX_TIERS, one per tier name

  // A copy written to `name`: added to that tier's figures (a version written to the same tier
  // again, say after an eviction and a new demotion, adds up). When CKPTDB_MAX_TIERS names are
  // there already (tiers renamed across opens), the oldest entry makes room.
  void AddTier(const std::string& name, uint64_t bytes, uint64_t ns);
};

struct VersionEntry {
  bool has_record = false;
  VersionRecord record;
  std::vector<ResidencyRecord> residency;
  bool has_stats = false;
  VersionStatsRecord stats;
};

// A set of changes applied atomically.
struct CatalogBatch {
  std::vector<VersionRecord> put_versions;
  std::vector<std::pair<uint64_t, ResidencyRecord>> put_residency;
  std::vector<std::pair<uint64_t, std::string>> delete_residency;  // version, tier
  std::vector<uint64_t> delete_versions;  // the record, all its residency and its stats
  std::vector<std::pair<uint64_t, VersionStatsRecord>> put_stats;
};

class CatalogLogger;

// What ScanCatalogLog found in one RocksDB write-ahead log.
struct LogScan {
  bool damaged = false;      // a record fails its header, length or checksum
  uint64_t bad_offset = 0;   // the first such record's offset
  bool valid_after = false;  // a whole record that starts a later write follows it
  uint64_t next_valid_offset = 0;
};
// Walks a catalog log record by record (RocksDB's log format). Every catalog write is synced
// before the next begins, so a crash can tear only the last write: damage with a valid later
// write after it, or in any log but the newest, is corruption, not a torn tail. Pure; any bytes.
LogScan ScanCatalogLog(std::span<const uint8_t> log);

// What Catalog::Salvage could read from a damaged catalog: every record that still decodes.
struct SalvagedCatalog {
  bool opened = false;
  std::string open_error;  // when !opened
  bool has_identity = false;
  Identity identity;
  std::string tiers;                          // empty when unreadable
  std::map<uint64_t, VersionEntry> versions;  // version records that decoded, with residency
  std::vector<std::string> problems;          // records skipped, reads that stopped
};

class Catalog {
 public:
  ~Catalog();
  // Opens the catalog in `dir`. A directory that is absent or empty holds no catalog: NotFound,
  // or a new catalog when `create` (read-write only). Anything else is opened read-only first and
  // checked whole (VerifyIntegrity, then `check` on that handle when given); only then, for a
  // read-write open, reopened read-write. So a damaged catalog (a bad record in the middle of
  // the log, a missing CURRENT, a bad MANIFEST or table) fails with Corrupt and every byte as it
  // was; a torn log tail (a crash inside an unsynced write) is recovered. Read-write opens and
  // every write first check that the file system keeps kReserveBytes free (NoSpace if not).
  static Status Open(const std::string& dir, bool read_only, bool create,
                     const std::function<Status(Catalog&)>& check, std::unique_ptr<Catalog>* out);
  static Status Open(const std::string& dir, bool read_only, bool create,
                     std::unique_ptr<Catalog>* out) {
    return Open(dir, read_only, create, nullptr, out);
  }

  // Replaces a handle Open returned read-only (after its checks) by a read-write one with the
  // same recovery (a torn tail found at Open is recovered the same way), after CheckSpace.
  static Status ReopenReadWrite(std::unique_ptr<Catalog>* catalog);
  bool read_only() const { return read_only_; }

  // Free space a read-write catalog keeps in hand: a flush of the whole write buffer, the WAL it
  // came from, a new MANIFEST and OPTIONS file at open, with room to spare. Below it every write
  // fails with NoSpace before RocksDB is called (issue 20, finding 3). It is a check, not a
  // reservation: space another process takes between the check and RocksDB's write makes that
  // write fail NoSpace inside RocksDB, which ckptdb's own logger keeps from aborting; the
  // version then fails ENOSPC and the last committed one stays whole (full_disk_test,
  // SpaceTakenBetweenTheCheckAndTheWriteIsEnospcNeverAnAbort).
  static constexpr uint64_t kReserveBytes = 2 << 20;
  // NoSpace naming `what` when dir's file system has less than kReserveBytes free.
  static Status CheckSpace(const std::string& dir, const std::string& what);

  // Repair (ckptdb repair): opens `dir` read-only replaying its log up to the first record that
  // fails its checksum, and reads every record that still decodes. Writes nothing. Never fails:
  // what could not be read is said in out->problems (or open_error).
  static void Salvage(const std::string& dir, SalvagedCatalog* out);

  // Checks every table block's checksum and decodes every record (Corrupt naming the first bad
  // one). Open runs it before any read-write open.
  Status VerifyIntegrity();
  const std::string& dir() const { return dir_; }

  Status GetIdentity(Identity* out);  // NotFound on a new catalog
  Status PutIdentity(const Identity& id);
  Status GetTiers(std::string* spec);
  Status PutTiers(const std::string& spec);
  // The coordinator's records (docs/commit-protocol.md): its epoch and its decisions, under
  // "coord/". NotFound when absent.
  Status GetMeta(const std::string& key, std::string* value);
  Status PutMeta(const std::string& key, const std::string& value, bool sync);
  Status ListMeta(const std::string& prefix, std::map<std::string, std::string>* out);

  Status Apply(const CatalogBatch& batch, bool sync);
  // Every version, with its residency, by version.
  Status LoadAll(std::map<uint64_t, VersionEntry>* out);

  // Encodings, public for the fuzz target and tests.
  static std::string EncodeVersion(const VersionRecord& r);
  static Status DecodeVersion(const std::string& value, const std::string& what, VersionRecord* r);
  static std::string EncodeResidency(const ResidencyRecord& r);
  static Status DecodeResidency(const std::string& value, const std::string& what,
                                ResidencyRecord* r);
  static std::string EncodeStats(const VersionStatsRecord& r);
  static Status DecodeStats(const std::string& value, const std::string& what,
                            VersionStatsRecord* r);

 private:
  Catalog() = default;
  static rocksdb::Options BaseOptions(const std::shared_ptr<rocksdb::Logger>& logger);
  // kStrict: a torn log tail only (kTolerateCorruptedTailRecords). kTornTail: replay up to the
  // first bad record (point in time), after ClassifyLogDamage found only a torn tail. kSalvage:
  // point in time too, whatever the damage (repair reads what it can).
  enum class Recovery { kStrict, kTornTail, kSalvage };
  static Status OpenRocks(const std::string& dir, bool read_only, bool create,
                          std::unique_ptr<Catalog>* out, Recovery recovery = Recovery::kStrict);
  // Before every open of an existing catalog: Ok when the only damage in the logs is the newest
  // log's torn tail (*torn set, and said on stderr), Corrupt naming the log and offset when a
  // log is damaged otherwise, and Ok with *torn false when the logs are whole.
  static Status ClassifyLogDamage(const std::string& dir, bool* torn);
  std::string dir_;
  bool read_only_ = false;
  Recovery recovery_ = Recovery::kStrict;
  std::shared_ptr<CatalogLogger> logger_;
  std::unique_ptr<rocksdb::Env> env_;  // a recording one (tests), or nullptr: RocksDB's default
  std::unique_ptr<rocksdb::DB> db_;    // after env_: closed before it goes
};

// Tests only: the Env the catalogs this process opens read-write from now on use, made per open
// by `make` (nullptr, or a `make` that returns nullptr: RocksDB's default). The recording file
// system of the crash-state enumeration is one (tests/support/catalog_trace.h); it lives with
// the tests, not in the library.
using CatalogEnvMaker = std::unique_ptr<rocksdb::Env> (*)();
void SetCatalogEnvForTesting(CatalogEnvMaker make);

}  // namespace ckpt::engine
