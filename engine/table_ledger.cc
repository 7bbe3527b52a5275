#include "engine/table_ledger.h"

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "format/checksum.h"
#include "format/segment_format.h"

namespace ckpt::engine {
namespace {

constexpr const char* kHeader = "ckptdb catalog tables 1\n";
constexpr uint64_t kMaxLedgerBytes = 1 << 20;  // a catalog holds a few tables, not thousands

std::string Hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

bool ReadFile(const std::string& path, uint64_t max_bytes, std::string* out) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || size > max_bytes) return false;  // checked before a byte is read
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  *out = s.str();
  return out->size() <= max_bytes;
}

bool FileXxh3(const std::string& path, uint64_t* bytes, uint64_t* xxh3) {
  std::string contents;
  if (!ReadFile(path, UINT64_MAX, &contents)) return false;
  *bytes = contents.size();
  *xxh3 = format::Xxh3(contents.data(), contents.size());
  return true;
}

}  // namespace

TableLedger::TableLedger(std::string dir, rocksdb::Env* env) : dir_(std::move(dir)), env_(env) {
  bool present = false;
  if (!Load(dir_, &entries_, &present).ok()) entries_.clear();  // Verify refused it at open
}

Status TableLedger::Load(const std::string& dir, std::map<std::string, Entry>* out, bool* present) {
  out->clear();
  *present = false;
  const std::string path = dir + "/" + kFileName;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::Ok();
  *present = true;
  std::string text;
  if (!ReadFile(path, kMaxLedgerBytes, &text)) {
    return Status::Corrupt("catalog table ledger " + path + " cannot be read or is too large");
  }
  const size_t end = text.rfind("end ");
  uint64_t stored = 0;
  if (text.compare(0, std::strlen(kHeader), kHeader) != 0 || end == std::string::npos ||
      text.size() != end + 4 + 16 + 1 || text.back() != '\n' ||
      std::sscanf(text.c_str() + end + 4, "%16" SCNx64, &stored) != 1 ||
      stored != format::Xxh3(text.data(), end)) {
    return Status::Corrupt("catalog table ledger " + path +
                           " is damaged (its header, end line or checksum fails)");
  }
  std::istringstream lines(text.substr(std::strlen(kHeader), end - std::strlen(kHeader)));
  std::string name, hex;
  uint64_t bytes = 0;
  while (lines >> name >> bytes >> hex) {
    Entry e;
    e.bytes = bytes;
    if (hex.size() != 16 || std::sscanf(hex.c_str(), "%16" SCNx64, &e.xxh3) != 1) {
      return Status::Corrupt("catalog table ledger " + path + ": a bad entry for " + name);
    }
    (*out)[name] = e;
  }
  return Status::Ok();
}

Status TableLedger::Verify(const std::string& dir) {
  std::map<std::string, Entry> entries;
  bool present = false;
  CKPTDB_RETURN_IF_ERROR(Load(dir, &entries, &present));
  for (const auto& [name, e] : entries) {
    const std::string path = dir + "/" + name;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;  // RocksDB reports a table it misses
    uint64_t bytes = 0, xxh3 = 0;
    if (!FileXxh3(path, &bytes, &xxh3)) {
      // Beside a live writer (a read-only tool) a compaction may have deleted it meanwhile.
      if (!std::filesystem::exists(path, ec)) continue;
      return Status::IoError("reading catalog table " + path);
    }
    if (bytes != e.bytes || xxh3 != e.xxh3) {
      return Status::Corrupt("catalog table " + path + " is damaged: " + std::to_string(bytes) +
                             " bytes of xxh3 " + format::Hex64(xxh3) + ", written as " +
                             std::to_string(e.bytes) + " bytes of xxh3 " + format::Hex64(e.xxh3) +
                             "; nothing was changed (run ckptdb repair " +
                             std::filesystem::path(dir).parent_path().string() + ")");
    }
  }
  return Status::Ok();
}

void TableLedger::OnTableFileCreated(const rocksdb::TableFileCreationInfo& info) {
  if (!info.status.ok() || info.file_path.empty()) return;
  Entry e;
  if (!FileXxh3(info.file_path, &e.bytes, &e.xxh3)) {
    std::fprintf(stderr, "ckptdb: catalog %s: cannot read new table %s to record its checksum\n",
                 dir_.c_str(), info.file_path.c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  entries_[std::filesystem::path(info.file_path).filename().string()] = e;
  WriteLocked();
}

void TableLedger::OnTableFileDeleted(const rocksdb::TableFileDeletionInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.erase(std::filesystem::path(info.file_path).filename().string()) > 0) {
    WriteLocked();
  }
}

void TableLedger::WriteLocked() {
  std::string text = kHeader;
  for (const auto& [name, e] : entries_) {
    text += name + " " + std::to_string(e.bytes) + " " + Hex16(e.xxh3) + "\n";
  }
  text += "end " + Hex16(format::Xxh3(text.data(), text.size())) + "\n";
  const std::string path = dir_ + "/" + kFileName;
  const std::string tmp = path + ".tmp";
  rocksdb::Status s = rocksdb::WriteStringToFile(env_, text, tmp, /*should_sync=*/true);
  if (s.ok()) s = env_->RenameFile(tmp, path);
  if (s.ok()) {
    std::unique_ptr<rocksdb::FSDirectory> d;
    rocksdb::IOStatus io =
        env_->GetFileSystem()->NewDirectory(dir_, rocksdb::IOOptions(), &d, nullptr);
    if (io.ok()) io = d->Fsync(rocksdb::IOOptions(), nullptr);
    s = io;
  }
  if (!s.ok()) {
    // The table stays unrecorded (and so unchecked at open); RocksDB's own checksums remain.
    std::fprintf(stderr, "ckptdb: catalog %s: writing its table ledger: %s\n", dir_.c_str(),
                 s.ToString().c_str());
  }
}

}  // namespace ckpt::engine
