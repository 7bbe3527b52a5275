// Benchmark: commit N bytes of shards to one tier and restore them, against the raw limits of the
// same machine measured in the same run (LIMITS.md: these VMs are noisy, so only ratios taken
// side by side mean anything):
//   memcpy      pre-faulted source to pre-faulted destination, one thread
//   raw write   write(2) of the same bytes into a new file in the same directory, fsync, close,
//               then unlink the previous round's file: exactly what a commit with keep=1 does
//               (new segment, then retention deletes the old one). Both sides so allocate new
//               tmpfs pages while the old ones are still held; LIMITS.md's first-touch effect
//               hits them alike.
//   raw read    read(2) of that file into the pre-faulted destination
// Before every read, raw or ckptdb, the files' clean pages are dropped from the page cache
// (posix_fadvise DONTNEED) so a disk tier is read from the device on both sides; ckptdb writes
// disk tiers with O_DIRECT and would otherwise be compared against a page-cache read. On tmpfs
// the advice does nothing: the pages are the file.
// ckptdb commit = put_shard of every tensor + commit (durable, fsynced, renamed, catalogued);
// ckptdb restore = a fresh handle's restore of every tensor, each chunk checked against its xxh3.
// Runs are interleaved (raw, ckptdb, raw, ckptdb, ...) after one untimed warm-up round, and the
// median of each is reported.
//
// Usage: bench_commit_restore [--dir D] [--gib G] [--tensor-mib M] [--repeats R]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "ckptdb/ckptdb.h"

namespace {

using bench::Allocate;
using bench::Check;
using bench::Clock;
using bench::DropCache;
using bench::Median;
using bench::RawRead;
using bench::Since;
constexpr size_t kPieceBytes = 4 << 20;

// The raw write of one round: a new file, then the previous round's is unlinked, exactly what a
// commit with keep=1 does (new segment, then retention deletes the old one).
double RawWrite(const std::string& path, const std::string& previous, const uint8_t* src,
                size_t bytes, size_t piece) {
  auto t0 = Clock::now();
  bench::RawWrite(path, src, bytes, piece, /*direct=*/false);
  unlink(previous.c_str());
  return Since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/dev/shm/ckptdb-bench";
  double gib = 2.0;
  size_t tensor_mib = 64;
  int repeats = 3;
  CLI::App app{"ckptdb's commit and restore against the file system (docs/performance.md)"};
  app.add_option("--dir", dir, "the store's directory");
  app.add_option("--gib", gib)->check(CLI::PositiveNumber);
  app.add_option("--tensor-mib", tensor_mib)->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--repeats", repeats)->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  const size_t tensor_bytes = tensor_mib << 20;
  const size_t count = std::max<size_t>(1, static_cast<size_t>(gib * 1073741824.0) / tensor_bytes);
  const size_t bytes = count * tensor_bytes;
  namespace fs = std::filesystem;
  fs::remove_all(dir);
  fs::create_directories(dir);

  uint8_t* src = Allocate(bytes);
  uint8_t* dst = Allocate(bytes);
  bench::Fill(src, bytes, 0);
  std::printf("bench_commit_restore: %zu tensors x %zu MiB = %.2f GiB in %s, %d repeats\n", count,
              tensor_mib, bytes / 1073741824.0, dir.c_str(), repeats);

  const std::string root = dir + "/store";
  const std::string tiers = "tmpfs:" + dir + "/tier,keep=1";
  // The tier kind only changes whether O_DIRECT is tried; name it by what the directory is.
  std::string tier_spec = tiers;
  if (dir.rfind("/dev/shm", 0) != 0) tier_spec = "disk:" + dir + "/tier,keep=1";
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tier_spec.c_str();
  o.rank = 0;
  o.world_size = 1;

  std::vector<double> memcpy_s, write_s, read_s, commit_s, restore_s;
  std::vector<std::string> names;
  for (size_t t = 0; t < count; ++t) names.push_back("layer." + std::to_string(t) + ".weight");
  for (int r = 0; r <= repeats; ++r) {  // round 0 is the untimed warm-up
    bool timed = r > 0;
    auto t0 = Clock::now();
    std::memcpy(dst, src, bytes);
    if (timed) memcpy_s.push_back(Since(t0));

    std::string raw_path = dir + "/raw" + std::to_string(r) + ".bin";
    std::string previous = dir + "/raw" + std::to_string(r - 1) + ".bin";
    // In pieces of ckptdb's default chunk size, so both sides make the same size of system call.
    double w = RawWrite(raw_path, previous, src, bytes, kPieceBytes);
    DropCache(dir);
    double rd = RawRead(raw_path, dst, bytes, kPieceBytes);
    if (timed) {
      write_s.push_back(w);
      read_s.push_back(rd);
    }

    ckptdb* db = nullptr;
    Check(ckptdb_open(&o, &db), "open");
    uint64_t version = static_cast<uint64_t>(r + 1);
    t0 = Clock::now();
    for (size_t t = 0; t < count; ++t) {
      Check(ckptdb_put_shard(db, version, names[t].c_str(), src + t * tensor_bytes, tensor_bytes,
                             nullptr, 0),
            "put_shard");
    }
    Check(ckptdb_commit(db, version, 0), "commit");
    if (timed) commit_s.push_back(Since(t0));
    Check(ckptdb_close(db), "close");

    std::memset(dst, 0, bytes);
    DropCache(dir);
    Check(ckptdb_open(&o, &db), "reopen");
    t0 = Clock::now();
    for (size_t t = 0; t < count; ++t) {
      Check(ckptdb_restore(db, version, names[t].c_str(), dst + t * tensor_bytes, tensor_bytes, 0),
            "restore");
    }
    if (timed) restore_s.push_back(Since(t0));
    Check(ckptdb_close(db), "close");
    if (std::memcmp(src, dst, bytes) != 0) {
      std::fprintf(stderr, "restored bytes differ from the source\n");
      return 1;
    }
  }
  fs::remove_all(dir);

  auto gbps = [&](double s) { return bytes / s / 1e9; };
  double mc = gbps(Median(memcpy_s)), rw = gbps(Median(write_s)), rr = gbps(Median(read_s));
  double cm = gbps(Median(commit_s)), rs = gbps(Median(restore_s));
  std::printf("\n%-34s %9s\n", "measurement (median)", "GB/s");
  std::printf("%-34s %9.2f\n", "memcpy (limit)", mc);
  std::printf("%-34s %9.2f\n", "raw write+fsync (limit)", rw);
  std::printf("%-34s %9.2f\n", "raw read (limit)", rr);
  std::printf("%-34s %9.2f\n", "ckptdb commit", cm);
  std::printf("%-34s %9.2f\n", "ckptdb restore (xxh3-verified)", rs);
  std::printf("\n%-34s %8.0f%%   (bar: 60%%)\n", "commit / raw write", 100 * cm / rw);
  std::printf("%-34s %8.0f%%   (bar: 60%%)\n", "restore / raw read", 100 * rs / rr);
  std::printf("%-34s %8.0f%%\n", "commit / memcpy", 100 * cm / mc);
  return 0;
}
