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

#include "engine/table_ledger.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "io/crash_model.h"

namespace ckpt::engine {
namespace {

constexpr uint8_t kRecordFormat = 1;
// Residency records of format 2 add the ram tier's locator (generation, index offset and size);
// format 1 records (written before the ram tier existed) are still read.
constexpr uint8_t kResidencyFormat = 2;
constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxTierNameBytes = 4096 + 16;

// Appends and reads little-endian fields; Reader refuses to run past the end.
class Writer {
 public:
  template <typename T>
  void Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s_.append(b, sizeof(T));
  }
  void PutBytes(const std::string& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    s_.append(v);
  }
  std::string Finish() {
    Put<uint64_t>(format::Xxh3(s_.data(), s_.size()));
    return std::move(s_);
  }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  bool Get(T* v) {
    if (s_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(std::string* v, size_t max_bytes) {
    uint32_t n;
    if (!Get(&n) || n > max_bytes || s_.size() - pos_ < n) return false;
    v->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

// Checks the trailing xxh3 and the record format byte (one of [min_format, max_format]).
Status CheckFrame(const std::string& v, const std::string& what, uint8_t min_format = kRecordFormat,
                  uint8_t max_format = kRecordFormat) {
  if (v.size() < 9) return Status::Corrupt("catalog record " + what + " is too short");
  uint64_t stored;
  std::memcpy(&stored, v.data() + v.size() - 8, 8);
  uint64_t actual = format::Xxh3(v.data(), v.size() - 8);
  if (stored != actual) {
    return Status::Corrupt("catalog record " + what + " fails xxh3 (expected " +
                           format::Hex64(stored) + ", got " + format::Hex64(actual) + ")");
  }
  const auto format = static_cast<uint8_t>(v[0]);
  if (format < min_format || format > max_format) {
    return Status::NotSupported("catalog record " + what + " has format " +
                                std::to_string(static_cast<uint8_t>(v[0])));
  }
  return Status::Ok();
}

std::string Be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}
uint64_t FromBe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string VersionKey(uint64_t v) { return "v/" + Be64(v); }
std::string ResidencyPrefix(uint64_t v) { return "r/" + Be64(v) + "/"; }
std::string StatsKey(uint64_t v) { return "s/" + Be64(v); }

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  if (s.IsNotFound()) return Status::NotFound(what + ": " + s.ToString());
  if (s.IsCorruption()) return Status::Corrupt(what + ": " + s.ToString());
  if (s.IsNoSpace()) return Status::NoSpace(what + ": " + s.ToString());
  return Status::IoError(what + ": " + s.ToString());
}

// RocksDB's file system with every change under the catalog recorded into a trace (tests only:
// SetCatalogTraceForTesting). The data a file gets is recorded as RocksDB appends it, its
// syncs as they return.
class RecordingFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  RecordingFile(std::unique_ptr<rocksdb::FSWritableFile> base, std::string path, io::FsTrace* trace,
                uint64_t size)
      : FSWritableFileOwnerWrapper(std::move(base)),
        path_(std::move(path)),
        trace_(trace),
        size_(size) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Append(data, o, dbg);
    if (s.ok()) RecordWrite(size_, data);
    return s;
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Append(data, o, info, dbg);
    if (s.ok()) RecordWrite(size_, data);
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->PositionedAppend(data, offset, o, dbg);
    if (s.ok()) RecordWrite(offset, data);
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->PositionedAppend(data, offset, o, info, dbg);
    if (s.ok()) RecordWrite(offset, data);
    return s;
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Truncate(size, o, dbg);
    if (s.ok()) {
      io::FsOp op;
      op.kind = io::FsOp::Kind::kTruncate;
      op.path = path_;
      op.offset = size;
      trace_->Record(std::move(op));
      size_ = size;
    }
    return s;
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Recorded(target()->Sync(o, dbg), io::FsOp::Kind::kSync);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Recorded(target()->Fsync(o, dbg), io::FsOp::Kind::kSync);
  }
  rocksdb::IOStatus RangeSync(uint64_t, uint64_t, const rocksdb::IOOptions&,
                              rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::OK();  // a hint that promises nothing; the model keeps it unsynced
  }
  rocksdb::IOStatus Close(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Recorded(target()->Close(o, dbg), io::FsOp::Kind::kClose);
  }

 private:
  void RecordWrite(uint64_t offset, const rocksdb::Slice& data) {
    io::FsOp op;
    op.kind = io::FsOp::Kind::kWrite;
    op.path = path_;
    op.offset = offset;
    op.data.assign(data.data(), data.size());
    trace_->Record(std::move(op));
    size_ = std::max(size_, offset + data.size());
  }
  rocksdb::IOStatus Recorded(rocksdb::IOStatus s, io::FsOp::Kind kind) {
    if (s.ok()) {
      io::FsOp op;
      op.kind = kind;
      op.path = path_;
      trace_->Record(std::move(op));
    }
    return s;
  }

  std::string path_;
  io::FsTrace* trace_;
  uint64_t size_;
};

class RecordingDirectory final : public rocksdb::FSDirectoryWrapper {
 public:
  RecordingDirectory(std::unique_ptr<rocksdb::FSDirectory> base, std::string path,
                     io::FsTrace* trace)
      : FSDirectoryWrapper(std::move(base)), path_(std::move(path)), trace_(trace) {}
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return Recorded(FSDirectoryWrapper::Fsync(o, dbg));
  }
  rocksdb::IOStatus FsyncWithDirOptions(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg,
                                        const rocksdb::DirFsyncOptions& d) override {
    return Recorded(FSDirectoryWrapper::FsyncWithDirOptions(o, dbg, d));
  }

 private:
  rocksdb::IOStatus Recorded(rocksdb::IOStatus s) {
    if (s.ok()) {
      io::FsOp op;
      op.kind = io::FsOp::Kind::kSyncDir;
      op.path = path_;
      trace_->Record(std::move(op));
    }
    return s;
  }
  std::string path_;
  io::FsTrace* trace_;
};

class RecordingFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  RecordingFileSystem(std::shared_ptr<rocksdb::FileSystem> base, io::FsTrace* trace)
      : FileSystemWrapper(std::move(base)), trace_(trace) {}
  const char* Name() const override { return "CkptdbRecordingFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> base;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, &base, dbg);
    if (!s.ok()) return s;
    Record(io::FsOp::Kind::kCreate, f);
    *r = std::make_unique<RecordingFile>(std::move(base), f, trace_, 0);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    uint64_t size = 0;
    const bool existed = target()->GetFileSize(f, rocksdb::IOOptions(), &size, dbg).ok();
    std::unique_ptr<rocksdb::FSWritableFile> base;
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, &base, dbg);
    if (!s.ok()) return s;
    if (!existed) Record(io::FsOp::Kind::kCreate, f);
    *r = std::make_unique<RecordingFile>(std::move(base), f, trace_, size);
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> base;
    rocksdb::IOStatus s = target()->ReuseWritableFile(f, old, o, &base, dbg);
    if (!s.ok()) return s;
    Record(io::FsOp::Kind::kRename, old, f);
    *r = std::make_unique<RecordingFile>(std::move(base), f, trace_, 0);
    return s;
  }
  rocksdb::IOStatus NewRandomRWFile(const std::string& f, const rocksdb::FileOptions&,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>*,
                                    rocksdb::IODebugContext*) override {
    // RocksDB uses these only for features the catalog leaves off; an unrecorded write would
    // make every crash state built from the trace wrong, so refuse it loudly.
    return rocksdb::IOStatus::NotSupported("random read-write files are not recorded: " + f);
  }
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& o,
                                 std::unique_ptr<rocksdb::FSDirectory>* r,
                                 rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSDirectory> base;
    rocksdb::IOStatus s = target()->NewDirectory(name, o, &base, dbg);
    if (!s.ok()) return s;
    std::string path = name;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    *r = std::make_unique<RecordingDirectory>(std::move(base), path, trace_);
    return s;
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->DeleteFile(f, o, dbg);
    if (s.ok()) Record(io::FsOp::Kind::kRemove, f);
    return s;
  }
  rocksdb::IOStatus Truncate(const std::string& f, size_t size, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Truncate(f, size, o, dbg);
    if (s.ok()) {
      io::FsOp op;
      op.kind = io::FsOp::Kind::kTruncate;
      op.path = f;
      op.offset = size;
      trace_->Record(std::move(op));
    }
    return s;
  }
  rocksdb::IOStatus CreateDir(const std::string& d, const rocksdb::IOOptions& o,
                              rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->CreateDir(d, o, dbg);
    if (s.ok()) Record(io::FsOp::Kind::kMkdir, d);
    return s;
  }
  rocksdb::IOStatus CreateDirIfMissing(const std::string& d, const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->CreateDirIfMissing(d, o, dbg);
    if (s.ok()) Record(io::FsOp::Kind::kMkdir, d);
    return s;
  }
  rocksdb::IOStatus RenameFile(const std::string& from, const std::string& to,
                               const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->RenameFile(from, to, o, dbg);
    if (s.ok()) Record(io::FsOp::Kind::kRename, from, to);
    return s;
  }
  rocksdb::IOStatus LinkFile(const std::string& from, const std::string& to,
                             const rocksdb::IOOptions&, rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("hard links are not recorded: " + from + " " + to);
  }

 private:
  void Record(io::FsOp::Kind kind, const std::string& path, const std::string& to = {}) {
    io::FsOp op;
    op.kind = kind;
    op.path = path;
    op.to = to;
    trace_->Record(std::move(op));
  }
  io::FsTrace* trace_;
};

std::atomic<io::FsTrace*> g_catalog_trace{nullptr};

bool ValidState(int s) { return s >= CKPTDB_STATE_OPEN && s <= CKPTDB_STATE_RETIRED; }
bool ValidResidency(int s) { return s >= CKPTDB_RESIDENT_WRITING && s <= CKPTDB_RESIDENT_EVICTED; }

}  // namespace

void SetCatalogTraceForTesting(io::FsTrace* trace) { g_catalog_trace = trace; }

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

// CRC-32C as RocksDB's log computes it (crc32c::Value, Extend, Mask), on ISA-L's crc32_iscsi,
// which keeps the register uncomplemented: crc32c(data) = ~crc32_iscsi(data, ~0).
uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t n) {
  return ~crc32_iscsi(const_cast<uint8_t*>(data), static_cast<int>(n), ~crc);
}
uint32_t UnmaskCrc(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace

LogScan ScanCatalogLog(std::span<const uint8_t> log) {
  // RocksDB's write-ahead log (its format is LevelDB's): 32 KiB blocks of records, each a 7-byte
  // header {masked crc32c u32, length u16, type u8} and its payload, never crossing a block;
  // fewer than 7 bytes left in a block are a zero trailer. Types 1-4 are FULL, FIRST, MIDDLE,
  // LAST (the catalog never recycles logs, so the recyclable types do not occur).
  constexpr size_t kBlock = 32768, kHeader = 7;
  auto record_at = [&](size_t p, bool* zero) -> bool {
    *zero = false;
    const size_t in_block = p % kBlock;
    if (kBlock - in_block < kHeader || log.size() - p < kHeader) return false;
    uint32_t stored;
    uint16_t length;
    std::memcpy(&stored, log.data() + p, 4);
    std::memcpy(&length, log.data() + p + 4, 2);
    const uint8_t type = log[p + 6];
    if (type == 0 && length == 0 && stored == 0) {
      *zero = true;
      return false;
    }
    if (type < 1 || type > 4 || in_block + kHeader + length > kBlock ||
        log.size() - p - kHeader < length) {
      return false;
    }
    uint32_t crc = Crc32cExtend(0, &type, 1);
    crc = Crc32cExtend(crc, log.data() + p + kHeader, length);
    return crc == UnmaskCrc(stored);
  };
  LogScan scan;
  size_t p = 0;
  while (p < log.size()) {
    const size_t in_block = p % kBlock;
    if (kBlock - in_block < kHeader) {
      p += kBlock - in_block;  // the block's trailer
      continue;
    }
    bool zero = false;
    if (record_at(p, &zero)) {
      uint16_t length;
      std::memcpy(&length, log.data() + p + 4, 2);
      p += kHeader + length;
      continue;
    }
    if (zero) {
      // Zeros: space never written (or written out of order by a torn last write). RocksDB's
      // reader drops the rest of the block, so anything but zeros there is damage.
      const size_t block_end = std::min(log.size(), p + (kBlock - in_block));
      if (std::all_of(log.begin() + p, log.begin() + block_end, [](uint8_t b) { return b == 0; })) {
        p = block_end;
        continue;
      }
    }
    scan.damaged = true;
    scan.bad_offset = p;
    break;
  }
  if (!scan.damaged) return scan;
  // A whole record after the bad one that starts a write (FULL or FIRST) is a later write: the
  // damage is not the tail a crash inside the last write leaves.
  for (size_t q = scan.bad_offset + 1; q + kHeader <= log.size(); ++q) {
    const uint8_t type = log[q + 6];
    if (type != 1 && type != 2) continue;
    bool zero = false;
    if (record_at(q, &zero)) {
      scan.valid_after = true;
      scan.next_valid_offset = q;
      break;
    }
  }
  return scan;
}

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
  if (io::FsTrace* trace = g_catalog_trace.load(); trace != nullptr && !read_only) {
    c->env_ = rocksdb::NewCompositeEnv(
        std::make_shared<RecordingFileSystem>(rocksdb::FileSystem::Default(), trace));
    options.env = c->env_.get();
  }
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

std::string Catalog::EncodeVersion(const VersionRecord& r) {
  Writer w;
  w.Put<uint8_t>(kRecordFormat);
  w.Put(r.version);
  w.Put<uint8_t>(static_cast<uint8_t>(r.state));
  w.Put(r.rank);
  w.Put(r.data_bytes);
  w.Put(r.tensor_count);
  w.Put(r.chunk_count);
  w.Put(r.created_unix_ns);
  w.Put(r.committed_unix_ns);
  w.Put(r.manifest_xxh3);
  return w.Finish();
}

Status Catalog::DecodeVersion(const std::string& v, const std::string& what, VersionRecord* r) {
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, what));
  Reader rd(v);
  uint8_t fmt, state;
  if (!rd.Get(&fmt) || !rd.Get(&r->version) || !rd.Get(&state) || !rd.Get(&r->rank) ||
      !rd.Get(&r->data_bytes) || !rd.Get(&r->tensor_count) || !rd.Get(&r->chunk_count) ||
      !rd.Get(&r->created_unix_ns) || !rd.Get(&r->committed_unix_ns) ||
      !rd.Get(&r->manifest_xxh3) || rd.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record " + what + " has the wrong length");
  }
  if (!ValidState(state)) {
    return Status::Corrupt("catalog record " + what + " has unknown state " +
                           std::to_string(state));
  }
  r->state = state;
  return Status::Ok();
}

std::string Catalog::EncodeResidency(const ResidencyRecord& r) {
  Writer w;
  w.Put<uint8_t>(kResidencyFormat);
  w.Put<uint8_t>(static_cast<uint8_t>(r.state));
  w.Put(r.file_bytes);
  w.PutBytes(r.tier);
  w.PutBytes(r.path);
  w.Put(r.ram_generation);
  w.Put(r.ram_index_offset);
  w.Put(r.ram_index_bytes);
  return w.Finish();
}

Status Catalog::DecodeResidency(const std::string& v, const std::string& what, ResidencyRecord* r) {
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, what, kRecordFormat, kResidencyFormat));
  Reader rd(v);
  uint8_t fmt, state;
  bool ok = rd.Get(&fmt) && rd.Get(&state) && rd.Get(&r->file_bytes) &&
            rd.GetBytes(&r->tier, kMaxTierNameBytes) && rd.GetBytes(&r->path, kMaxPathBytes);
  if (ok && fmt >= 2) {
    ok = rd.Get(&r->ram_generation) && rd.Get(&r->ram_index_offset) && rd.Get(&r->ram_index_bytes);
  }
  if (!ok || rd.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record " + what + " has the wrong length");
  }
  if (!ValidResidency(state)) {
    return Status::Corrupt("catalog record " + what + " has unknown residency state " +
                           std::to_string(state));
  }
  r->state = state;
  return Status::Ok();
}

void VersionStatsRecord::AddTier(const std::string& name, uint64_t bytes, uint64_t ns) {
  for (Tier& t : tiers) {
    if (t.name == name) {
      t.bytes_written += bytes;
      t.write_ns += ns;
      return;
    }
  }
  if (tiers.size() == CKPTDB_MAX_TIERS) tiers.erase(tiers.begin());
  tiers.push_back({name, bytes, ns});
}

std::string Catalog::EncodeStats(const VersionStatsRecord& r) {
  Writer w;
  w.Put<uint8_t>(kRecordFormat);
  for (uint64_t f :
       {r.bytes, r.put_calls, r.put_blocked_ns, r.wait_capture_blocked_ns, r.commit_blocked_ns,
        r.capture_ns, r.commit_ns, r.backpressure_waits, r.backpressure_wait_ns, r.direct_chunks,
        r.staging_high_water_bytes, r.fsyncs}) {
    w.Put(f);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(r.tiers.size()));
  for (const VersionStatsRecord::Tier& t : r.tiers) {
    w.PutBytes(t.name);
    w.Put(t.bytes_written);
    w.Put(t.write_ns);
  }
  return w.Finish();
}

Status Catalog::DecodeStats(const std::string& v, const std::string& what, VersionStatsRecord* r) {
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, what));
  Reader rd(v);
  uint8_t fmt;
  uint32_t tiers = 0;
  bool ok = rd.Get(&fmt);
  for (uint64_t* f :
       {&r->bytes, &r->put_calls, &r->put_blocked_ns, &r->wait_capture_blocked_ns,
        &r->commit_blocked_ns, &r->capture_ns, &r->commit_ns, &r->backpressure_waits,
        &r->backpressure_wait_ns, &r->direct_chunks, &r->staging_high_water_bytes, &r->fsyncs}) {
    ok = ok && rd.Get(f);
  }
  ok = ok && rd.Get(&tiers) && tiers <= CKPTDB_MAX_TIERS;
  r->tiers.clear();
  for (uint32_t i = 0; ok && i < tiers; ++i) {
    VersionStatsRecord::Tier t;
    ok = rd.GetBytes(&t.name, kMaxTierNameBytes) && rd.Get(&t.bytes_written) && rd.Get(&t.write_ns);
    r->tiers.push_back(std::move(t));
  }
  if (!ok || rd.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record " + what + " has the wrong length");
  }
  return Status::Ok();
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
