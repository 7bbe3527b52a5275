// The catalog's recording file system (tests only): RocksDB's file system with every change
// under the catalog recorded into an io::FsTrace, for the crash-state enumeration
// (io/crash_model.h). The library only takes an Env from the tests (SetCatalogEnvForTesting).
#include "tests/support/catalog_trace.h"

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <memory>
#include <string>

#include "engine/catalog.h"
#include "io/crash_model.h"

namespace ckpt::engine {
namespace {

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

std::unique_ptr<rocksdb::Env> RecordingEnv() {
  io::FsTrace* trace = g_catalog_trace.load();
  if (trace == nullptr) return nullptr;
  return rocksdb::NewCompositeEnv(
      std::make_shared<RecordingFileSystem>(rocksdb::FileSystem::Default(), trace));
}

}  // namespace

void SetCatalogTraceForTesting(io::FsTrace* trace) {
  g_catalog_trace = trace;
  SetCatalogEnvForTesting(trace != nullptr ? RecordingEnv : nullptr);
}

}  // namespace ckpt::engine
