// The catalog's table ledger: the size and xxh3 of every table file (.sst) RocksDB writes into
// the catalog, in <catalog>/CKPTDB-TABLES, checked before RocksDB is allowed to open a table.
//
// Why: Debian's RocksDB is built with assertions, and some damage to a table (the corruption
// campaign found one in a table's footer, which carries no checksum of its own in table format
// 5) aborts the process inside DB::Open, before any of RocksDB's own checksums can report it. A
// whole-file checksum taken when the table is written turns that into ECORRUPT naming the file.
//
// The ledger is a RocksDB EventListener: OnTableFileCreated (called after the table is written
// and before the MANIFEST names it) hashes the file and rewrites the ledger durably (a
// temporary file, sync, rename, directory sync, through the catalog's Env, so the crash-state
// tests see it); OnTableFileDeleted drops the entry. A table without an entry (a store written
// before the ledger existed, or one whose ledger write failed) is not checked; a ledger that
// fails its own checksum is Corrupt.
//
// Format (text): "ckptdb catalog tables 1\n", then one "<name> <size> <xxh3 as 16 hex>\n" per
// table, then "end <xxh3 as 16 hex of every byte before this line>\n".
#pragma once

#include <rocksdb/listener.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "util/status.h"

namespace rocksdb {
class Env;
}

namespace ckpt::engine {

class TableLedger final : public rocksdb::EventListener {
 public:
  static constexpr const char* kFileName = "CKPTDB-TABLES";

  TableLedger(std::string dir, rocksdb::Env* env);

  // Before RocksDB opens the catalog in `dir`: every table the ledger names that exists must
  // have the recorded size and xxh3. Corrupt naming the file otherwise, or when the ledger
  // itself is damaged; Ok when there is no ledger.
  static Status Verify(const std::string& dir);

  void OnTableFileCreated(const rocksdb::TableFileCreationInfo& info) override;
  void OnTableFileDeleted(const rocksdb::TableFileDeletionInfo& info) override;

 private:
  struct Entry {
    uint64_t bytes = 0;
    uint64_t xxh3 = 0;
  };
  static Status Load(const std::string& dir, std::map<std::string, Entry>* out, bool* present);
  void WriteLocked();

  const std::string dir_;
  rocksdb::Env* env_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;  // by file name
};

}  // namespace ckpt::engine
