#include "engine/catalog.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

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

Status Catalog::Open(const std::string& dir, bool read_only, bool create,
                     std::unique_ptr<Catalog>* out) {
  rocksdb::Options options;
  options.create_if_missing = create && !read_only;
  options.paranoid_checks = true;
  // A catalog is small (a few records per version); keep RocksDB's footprint small too.
  options.max_open_files = 64;
  options.keep_log_file_num = 4;
  options.max_log_file_size = 1 << 20;
  options.write_buffer_size = 4 << 20;
  auto c = std::unique_ptr<Catalog>(new Catalog());
  c->dir_ = dir;
  if (io::FsTrace* trace = g_catalog_trace.load(); trace != nullptr && !read_only) {
    c->env_ = rocksdb::NewCompositeEnv(
        std::make_shared<RecordingFileSystem>(rocksdb::FileSystem::Default(), trace));
    options.env = c->env_.get();
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(options, dir, &db)
                                : rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) {
    if (s.IsInvalidArgument() && s.ToString().find("does not exist") != std::string::npos) {
      return Status::NotFound("no ckptdb catalog at " + dir);
    }
    if (s.IsIOError() && s.ToString().find("No such file") != std::string::npos) {
      return Status::NotFound("no ckptdb catalog at " + dir);
    }
    return FromRocks(s, "opening catalog " + dir);
  }
  c->db_.reset(db);
  *out = std::move(c);
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
  rocksdb::WriteOptions o;
  o.sync = true;
  return FromRocks(db_->Put(o, "meta/identity", w.Finish()), "catalog " + dir_);
}

Status Catalog::GetTiers(std::string* spec) {
  return FromRocks(db_->Get(rocksdb::ReadOptions(), "meta/tiers", spec),
                   "catalog " + dir_ + " tiers");
}

Status Catalog::PutTiers(const std::string& spec) {
  rocksdb::WriteOptions o;
  o.sync = true;
  return FromRocks(db_->Put(o, "meta/tiers", spec), "catalog " + dir_);
}

Status Catalog::GetMeta(const std::string& key, std::string* value) {
  return FromRocks(db_->Get(rocksdb::ReadOptions(), key, value), "catalog " + dir_ + " " + key);
}

Status Catalog::PutMeta(const std::string& key, const std::string& value, bool sync) {
  rocksdb::WriteOptions o;
  o.sync = sync;
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
  rocksdb::WriteOptions o;
  o.sync = sync;
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
