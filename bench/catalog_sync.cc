// Benchmark: what syncing every catalog write costs a commit (issue 40, open item 4). Since issue
// 20 every write to a store's catalog is synced, so that a crash can tear only the last record
// (that is how an open tells a torn log from a damaged one); before, only PREPARED, COMMITTED and
// ABORTED records were. Measured in one run, interleaved round by round, on the file system the
// store's root is on:
//   raw fdatasync   a 512-byte append and fdatasync to one file: the physical price of one
//                   synced write on this file system
//   catalog, before the six catalog writes a version makes (OPEN, its residency, CAPTURED,
//                   PREPARED, COMMITTED, the eviction of an older version), records of the
//                   catalog's sizes in a RocksDB with the catalog's options, synced as before
//                   issue 20 (PREPARED and COMMITTED only)
//   catalog, now    the same, every write synced
//   ckptdb commit   put (64 KiB, copied at once) + commit of a version of a real store on a disk
//                   tier in the same directory, keep=2: everything a small commit does
// Reported: the medians per version, and what "now" adds over "before" as a share of ckptdb's
// commit. Usage: bench_catalog_sync [--dir D] [--versions N] [--rounds R]
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "ckptdb/ckptdb.h"

namespace {

using bench::Check;
using bench::Clock;
using bench::Median;
using bench::Since;

// Seconds per synced 512-byte append.
double RawSync(const std::string& dir, int count) {
  const std::string path = dir + "/raw-sync";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror("open");
    std::exit(2);
  }
  std::vector<char> record(512, 'r');
  const auto t0 = Clock::now();
  for (int i = 0; i < count; ++i) {
    if (::write(fd, record.data(), record.size()) != static_cast<ssize_t>(record.size()) ||
        ::fdatasync(fd) != 0) {
      std::perror("write/fdatasync");
      std::exit(2);
    }
  }
  const double s = Since(t0) / count;
  ::close(fd);
  std::filesystem::remove(path);
  return s;
}

// Seconds per version of the catalog's six writes, every one synced or (every_write false) only
// PREPARED and COMMITTED, into a new RocksDB with the catalog's options (engine/catalog.cc).
double CatalogWrites(const std::string& dir, int versions, bool every_write) {
  std::filesystem::remove_all(dir);
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.allow_fallocate = false;
  options.max_open_files = 64;
  options.write_buffer_size = 512 << 10;
  options.track_and_verify_wals_in_manifest = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status st = rocksdb::DB::Open(options, dir, &raw);
  if (!st.ok()) {
    std::fprintf(stderr, "rocksdb open %s: %s\n", dir.c_str(), st.ToString().c_str());
    std::exit(2);
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  const std::string version_record(120, 'v');    // a version record, about its size
  const std::string residency_record(200, 'r');  // a residency record with its path
  auto key = [](const char* kind, int v) { return std::string(kind) + std::to_string(v); };
  const auto t0 = Clock::now();
  for (int v = 0; v < versions; ++v) {
    struct Write {
      bool synced_before;
      std::function<void(rocksdb::WriteBatch&)> fill;
    };
    const Write writes[] = {
        {false, [&](rocksdb::WriteBatch& b) { b.Put(key("v/", v), version_record); }},  // OPEN
        {false, [&](rocksdb::WriteBatch& b) { b.Put(key("r/", v), residency_record); }},
        {false, [&](rocksdb::WriteBatch& b) { b.Put(key("v/", v), version_record); }},  // CAPTURED
        {true, [&](rocksdb::WriteBatch& b) { b.Put(key("v/", v), version_record); }},   // PREPARED
        {true,
         [&](rocksdb::WriteBatch& b) {  // COMMITTED, with its residency
           b.Put(key("v/", v), version_record);
           b.Put(key("r/", v), residency_record);
         }},
        {false,
         [&](rocksdb::WriteBatch& b) {  // the eviction of the version before last
           b.Delete(key("r/", v - 2));
           b.Put(key("v/", v - 2), version_record);
         }},
    };
    for (const Write& w : writes) {
      rocksdb::WriteBatch batch;
      w.fill(batch);
      rocksdb::WriteOptions o;
      o.sync = every_write || w.synced_before;
      st = db->Write(o, &batch);
      if (!st.ok()) {
        std::fprintf(stderr, "rocksdb write: %s\n", st.ToString().c_str());
        std::exit(2);
      }
    }
  }
  const double s = Since(t0) / versions;
  db.reset();
  std::filesystem::remove_all(dir);
  return s;
}

// Seconds per version of put + commit into a real store (disk tier, keep=2).
double CkptdbCommits(const std::string& dir, int versions) {
  std::filesystem::remove_all(dir);
  const std::string root = dir + "/root";
  const std::string tiers = "disk:" + dir + "/segments,keep=2";
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  ckptdb* db = nullptr;
  Check(ckptdb_open(&o, &db), "open");
  std::vector<uint8_t> data(64 << 10, 7);
  const auto t0 = Clock::now();
  for (int v = 1; v <= versions; ++v) {
    Check(ckptdb_put_shard(db, v, "w", data.data(), data.size(), nullptr, CKPTDB_PUT_COPY_NOW),
          "put");
    Check(ckptdb_commit(db, v, 0), "commit");
  }
  const double s = Since(t0) / versions;
  Check(ckptdb_close(db), "close");
  std::filesystem::remove_all(dir);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"What syncing every catalog write costs a commit"};
  std::string dir = "/var/tmp/ckptdb-bench-sync";
  int versions = 200;
  int rounds = 5;
  app.add_option("--dir", dir, "Where the catalogs and the store go (the store root's fs)");
  app.add_option("--versions", versions, "Versions per round")->check(CLI::Range(10, 100000));
  app.add_option("--rounds", rounds, "Rounds, each measuring all four")->check(CLI::Range(1, 50));
  CLI11_PARSE(app, argc, argv);
  std::filesystem::create_directories(dir);
  std::vector<double> raw, before, now, commit;
  (void)CatalogWrites(dir + "/warm", versions / 4, true);  // untimed warm-up
  for (int r = 0; r < rounds; ++r) {
    raw.push_back(RawSync(dir, versions));
    before.push_back(CatalogWrites(dir + "/before", versions, false));
    now.push_back(CatalogWrites(dir + "/now", versions, true));
    commit.push_back(CkptdbCommits(dir + "/store", versions));
  }
  const double ms = 1e3;
  const double r = Median(raw) * ms, b = Median(before) * ms, n = Median(now) * ms,
               c = Median(commit) * ms;
  std::printf("dir %s, %d versions a round, %d rounds (medians)\n", dir.c_str(), versions, rounds);
  std::printf("raw 512-byte append + fdatasync    %8.3f ms\n", r);
  std::printf("catalog writes a version, before   %8.3f ms  (%.1f fdatasyncs)\n", b, b / r);
  std::printf("catalog writes a version, now      %8.3f ms  (%.1f fdatasyncs)\n", n, n / r);
  std::printf("ckptdb put + commit a version      %8.3f ms\n", c);
  std::printf("added by syncing every write       %8.3f ms a version: %.0f%% of the commit\n",
              n - b, 100.0 * (n - b) / c);
  std::filesystem::remove_all(dir);
  return 0;
}
