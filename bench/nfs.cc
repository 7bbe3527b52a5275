// bench_nfs: the nfs tier against raw libnfs on the same export, in the same run (issue 24).
//
//   bench_nfs --export DIR --port P --mountport M [--mib N] [--rounds R]
//
// The server (bench/run.sh starts tests/support's nfs_fixture: nfs-ganesha on loopback) exports
// DIR. Each round, interleaved:
//   - raw write: N MiB written sequentially to a new file (one per round, as each version is a
//     new segment) through libnfs's asynchronous API, 16 pwrite calls of 1 MiB in flight, then
//     fsync (COMMIT) and close;
//   - demotion: a version of N MiB (shards of 64 MiB) committed to a ram tier, timed from the
//     commit's return until ckptdb_wait_commit on the nfs tier returns (create, WRITE3s, COMMIT,
//     RENAME and its check, the catalog's synced record, the tier's witness);
//   - raw read: the raw file read back the same way (16 preads of 1 MiB in flight);
//   - restore: the version restored from the nfs tier alone (a view of its directory: no ram,
//     no root), every chunk checked against its xxh3.
// Reports the medians and demotion/raw-write and restore/raw-read as throughput ratios.
#include <nfsc/libnfs.h>
#include <poll.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace {

using bench::Check;
using bench::Clock;
using bench::Since;

constexpr size_t kPiece = 1 << 20;
constexpr int kInFlight = 16;
constexpr size_t kShardBytes = size_t{64} << 20;

struct Raw {
  nfs_context* nfs = nullptr;
  int in_flight = 0;
  int failed = 0;
};

void Die(const char* what, nfs_context* nfs) {
  std::fprintf(stderr, "bench_nfs: %s: %s\n", what, nfs != nullptr ? nfs_get_error(nfs) : "");
  std::exit(2);
}

void Done(int status, nfs_context*, void*, void* private_data) {
  auto* r = static_cast<Raw*>(private_data);
  r->in_flight--;
  if (status < 0) r->failed++;
}

// Drives the event loop until at most `level` calls are in flight.
void DrainTo(Raw& r, int level) {
  while (r.in_flight > level) {
    pollfd p{nfs_get_fd(r.nfs), static_cast<short>(nfs_which_events(r.nfs)), 0};
    if (poll(&p, 1, 1000) < 0 && errno != EINTR) Die("poll", nullptr);
    if (nfs_service(r.nfs, p.revents) < 0) Die("nfs_service", r.nfs);
  }
  if (r.failed) Die("a call failed", r.nfs);
}

Raw Connect(const std::string& export_dir, int port, int mount_port) {
  Raw r;
  r.nfs = nfs_init_context();
  const std::string args =
      "nfs://x/?nfsport=" + std::to_string(port) + "&mountport=" + std::to_string(mount_port);
  nfs_url* url = nfs_parse_url_dir(r.nfs, args.c_str());
  if (url == nullptr) Die("ports", r.nfs);
  nfs_destroy_url(url);
  if (nfs_mount(r.nfs, "127.0.0.1", export_dir.c_str()) != 0) Die("mount", r.nfs);
  return r;
}

double RawWrite(Raw& r, const std::string& name, const uint8_t* data, size_t bytes) {
  const Clock::time_point t0 = Clock::now();
  nfsfh* fh = nullptr;
  if (nfs_create(r.nfs, name.c_str(), O_WRONLY | O_TRUNC, 0644, &fh) != 0) Die("create", r.nfs);
  for (size_t off = 0; off < bytes; off += kPiece) {
    DrainTo(r, kInFlight - 1);
    r.in_flight++;
    if (nfs_pwrite_async(r.nfs, fh, off, std::min(kPiece, bytes - off), data + off, Done, &r) != 0)
      Die("pwrite", r.nfs);
  }
  DrainTo(r, 0);
  if (nfs_fsync(r.nfs, fh) != 0) Die("fsync", r.nfs);
  nfs_close(r.nfs, fh);
  return Since(t0);
}

struct ReadCall {
  Raw* r;
  uint8_t* dst;
};

void ReadDone(int status, nfs_context*, void* data, void* private_data) {
  auto* c = static_cast<ReadCall*>(private_data);
  c->r->in_flight--;
  if (status < 0) {
    c->r->failed++;
  } else {
    std::memcpy(c->dst, data, static_cast<size_t>(status));
  }
  delete c;
}

double RawRead(Raw& r, const std::string& name, uint8_t* out, size_t bytes) {
  const Clock::time_point t0 = Clock::now();
  nfsfh* fh = nullptr;
  if (nfs_open(r.nfs, name.c_str(), O_RDONLY, &fh) != 0) Die("open", r.nfs);
  for (size_t off = 0; off < bytes; off += kPiece) {
    DrainTo(r, kInFlight - 1);
    r.in_flight++;
    auto* c = new ReadCall{&r, out + off};
    if (nfs_pread_async(r.nfs, fh, off, std::min(kPiece, bytes - off), ReadDone, c) != 0)
      Die("pread", r.nfs);
  }
  DrainTo(r, 0);
  nfs_close(r.nfs, fh);
  return Since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_nfs: the nfs tier against raw libnfs on one export"};
  std::string export_dir;
  int port = 0, mount_port = 0, rounds = 3;
  size_t mib = 256;
  app.add_option("--export", export_dir, "The directory the server exports")->required();
  app.add_option("--port", port, "The server's NFS port")->required();
  app.add_option("--mountport", mount_port, "The server's MOUNT port")->required();
  app.add_option("--mib", mib, "MiB a round writes and reads");
  app.add_option("--rounds", rounds, "Rounds");
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = mib << 20;
  const size_t shards = (bytes + kShardBytes - 1) / kShardBytes;
  uint8_t* data = bench::Allocate(bytes);
  uint8_t* back = bench::Allocate(bytes);
  bench::Fill(data, bytes, 24);

  const std::string work = "/dev/shm/ckptdb-bench-nfs";
  std::filesystem::remove_all(work);
  const std::string tier_dir = export_dir + "/ck";
  const std::string nfs_tier = "nfs:127.0.0.1:" + tier_dir + ",port=" + std::to_string(port) +
                               ",mountport=" + std::to_string(mount_port);
  const std::string tiers =
      "ram:" + std::to_string(2 * bytes + (64 << 20)) + ",keep=1,dir=" + work + "/shm;" + nfs_tier;
  const std::string root = work + "/root";
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = 0;
  o.world_size = 1;
  ckptdb* db = nullptr;
  Check(ckptdb_open(&o, &db), "open");
  Raw raw = Connect(export_dir, port, mount_port);

  std::vector<double> raw_write, demote, raw_read, restore;
  for (int round = 1; round <= rounds; ++round) {
    // A new file each round, as each version is a new segment: the server's disk writes new
    // blocks for both (rewriting one file was cheaper for it, and flattered the limit).
    const std::string raw_name = "/raw-" + std::to_string(round) + ".bin";
    raw_write.push_back(RawWrite(raw, raw_name, data, bytes));
    const auto v = static_cast<uint64_t>(round);
    for (size_t s = 0; s < shards; ++s) {
      const size_t off = s * kShardBytes;
      Check(ckptdb_put_shard(db, v, ("s" + std::to_string(s)).c_str(), data + off,
                             std::min(kShardBytes, bytes - off), nullptr, 0),
            "put");
    }
    Check(ckptdb_commit(db, v, 0), "commit");
    const Clock::time_point t0 = Clock::now();
    Check(ckptdb_wait_commit(db, v, "nfs", -1), "wait for the nfs tier");
    demote.push_back(Since(t0));
    raw_read.push_back(RawRead(raw, raw_name, back, bytes));
    if (std::memcmp(back, data, bytes) != 0) Die("the raw read differs", nullptr);
    // The nfs directory alone: no ram, no root.
    ckptdb_options ro;
    ckptdb_options_init(&ro);
    ro.tiers = nfs_tier.c_str();
    ro.read_only = 1;
    ckptdb* view = nullptr;
    Check(ckptdb_open(&ro, &view), "open the nfs directory alone");
    std::memset(back, 0, bytes);
    const Clock::time_point t1 = Clock::now();
    for (size_t s = 0; s < shards; ++s) {
      const size_t off = s * kShardBytes;
      Check(ckptdb_restore(view, v, ("s" + std::to_string(s)).c_str(), back + off,
                           std::min(kShardBytes, bytes - off), 0),
            "restore from nfs");
    }
    restore.push_back(Since(t1));
    ckptdb_close(view);
    if (std::memcmp(back, data, bytes) != 0) Die("the restore differs", nullptr);
    std::printf("round %d: raw write %.3f s, demotion %.3f s, raw read %.3f s, restore %.3f s\n",
                round, raw_write.back(), demote.back(), raw_read.back(), restore.back());
  }
  ckptdb_close(db);
  for (int round = 1; round <= rounds; ++round) {
    nfs_unlink(raw.nfs, ("/raw-" + std::to_string(round) + ".bin").c_str());
  }
  nfs_destroy_context(raw.nfs);
  std::filesystem::remove_all(work);
  const double gb = static_cast<double>(bytes) / 1e9;
  const double w = bench::Median(raw_write), d = bench::Median(demote);
  const double r = bench::Median(raw_read), s = bench::Median(restore);
  std::printf(
      "%zu MiB, medians of %d: raw libnfs write %.3f GB/s, demotion to nfs %.3f GB/s "
      "(%.0f%% of raw)\n",
      mib, rounds, gb / w, gb / d, 100 * w / d);
  std::printf(
      "%zu MiB, medians of %d: raw libnfs read %.3f GB/s, restore from nfs %.3f GB/s "
      "(%.0f%% of raw)\n",
      mib, rounds, gb / r, gb / s, 100 * r / s);
  return 0;
}
