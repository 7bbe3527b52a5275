// Benchmarks of issue 3 (docs/performance.md), each a ratio to a limit measured in the same run:
//
//   blocked  A synthetic trainer (--gib of state in --shards shards) puts every shard, computes
//            for --compute-ratio times the time a memcpy of its state takes, waits for capture,
//            changes its state (the optimizer step) and commits asynchronously. Blocked time is
//            what put_shard, wait_capture and commit take from it. Compared with a synchronous
//            write+fsync of the same state to --disk, and with a synchronous memcpy of it.
//            --compute spin burns a core (a CPU-bound trainer); sleep leaves the cores free (the
//            GPU computes, the host thread waits).
//   capture  put_shard of every shard then wait_capture, nothing else running: bytes per second
//            against a single-thread memcpy of the same bytes.
//   drain    A committed version's demotion from the ram tier to a disk tier (commit returns to
//            the copy durable on disk, chunks re-checked, fsync, rename, catalog), against a raw
//            O_DIRECT sequential write of the same bytes to the same directory plus fsync.
//   restore  Restore of every shard from ram against memcpy, into memory already written and
//            into new memory (each page faulting on its first write, in both), and from the disk
//            tier (page cache dropped) against a raw read(2) of the same segment files.
//   many     --small-shards shards of --small-bytes each (issue 23): the ckptdb_put_shards call
//            alone against a memcpy of its descriptor array, put_shards plus wait_capture, and
//            the same shards through one ckptdb_put_shard call each, into a ram tier; medians of
//            --repeats runs, a new version each.
//   stall    --runs runs, each on a new store and a new arena (ram:3G,keep=2): one shard of
//            --gib put lazily, compute as a sleep of 3x a memcpy of it, wait_capture. Blocked
//            time (put + wait_capture) against that memcpy, its distribution over the runs (not
//            a median alone: issue 23 saw a tenth of the speed in some runs), and open's time
//            beside it.
//   sweep    Checkpoint every 1, 2, 5, 10 iterations, a flush-bound and a compute-bound trainer,
//            ckptdb against a synchronous write+fsync per checkpoint (the shape of DataStates-LLM
//            figures 11-12): checkpoint throughput seen by the trainer, mean iteration time, and
//            end-to-end time including the drain at the end.
//
// Usage: bench_async [--mode blocked|capture|drain|restore|many|stall|sweep|all] [--gib G]
//                    [--shards N] [--disk DIR] [--shm DIR] [--iterations I]
//                    [--compute spin|sleep] [--compute-ratio R] [--threads T] [--repeats R]
//                    [--runs N] [--small-shards N] [--small-bytes B]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "ckptdb/ckptdb.h"

namespace {

using bench::Allocate;
using bench::Check;
using bench::Clock;
using bench::Median;
using bench::Since;
namespace fs = std::filesystem;

struct Args {
  std::string mode = "all";
  double gib = 2.0;
  size_t shards = 128;
  std::string disk = "/var/tmp/ckptdb-bench";
  std::string shm = "/dev/shm/ckptdb-bench";
  int iterations = 6;
  std::string compute = "spin";
  double compute_ratio = 1.0;
  uint32_t threads = 2;
  int repeats = 3;
  int runs = 20;
  size_t small_shards = 100000;
  size_t small_bytes = 256;
};

struct State {
  size_t shard_bytes = 0;
  size_t bytes = 0;
  std::vector<uint8_t*> shards;
  std::vector<std::string> names;
};

State MakeState(const Args& a) {
  State s;
  s.shard_bytes = static_cast<size_t>(a.gib * 1073741824.0) / a.shards / 4096 * 4096;
  s.bytes = s.shard_bytes * a.shards;
  for (size_t i = 0; i < a.shards; ++i) {
    s.shards.push_back(Allocate(s.shard_bytes));
    bench::Fill(s.shards.back(), s.shard_bytes, i * 7919);
    s.names.push_back("layers." + std::to_string(i / 4) + ".w" + std::to_string(i % 4));
  }
  return s;
}

double MemcpyState(const State& s, uint8_t* dst) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < s.shards.size(); ++i) {
    std::memcpy(dst + i * s.shard_bytes, s.shards[i], s.shard_bytes);
  }
  return Since(t0);
}

// The state written as one file, synchronously: what a checkpoint without ckptdb costs the
// trainer (torch.save-style: write everything, fsync, then go on).
double SyncWriteState(const State& s, const std::string& path) {
  auto t0 = Clock::now();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(2);
  }
  for (uint8_t* p : s.shards) bench::WriteAll(fd, p, s.shard_bytes, s.shard_bytes);
  fsync(fd);
  close(fd);
  return Since(t0);
}

void Compute(const std::string& how, double seconds) {
  if (how == "sleep") {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return;
  }
  auto t0 = Clock::now();
  volatile uint64_t x = 1;
  while (Since(t0) < seconds) {
    for (int i = 0; i < 1000; ++i) x = x * 6364136223846793005ull + 1;
  }
}

// The optimizer step: every shard changes (a few bytes each; its cost is not the point).
void Step(State& s, uint64_t iteration) {
  for (uint8_t* p : s.shards) {
    for (size_t off = 0; off < s.shard_bytes; off += 1 << 20)
      p[off] ^= static_cast<uint8_t>(iteration);
  }
}

struct Store {
  std::string root, tiers, commit_tier;
  ckptdb* db = nullptr;
  ckptdb_options o;
  Store(const std::string& root_dir, const std::string& tier_spec, uint32_t threads,
        const char* commit = nullptr)
      : root(root_dir), tiers(tier_spec), commit_tier(commit ? commit : "") {
    ckptdb_options_init(&o);
    o.root = root.c_str();
    o.tiers = tiers.c_str();
    o.capture_threads = threads;
    if (!commit_tier.empty()) o.commit_tier = commit_tier.c_str();
    Check(ckptdb_open(&o, &db), "open");
  }
  ~Store() {
    if (db) Check(ckptdb_close(db), "close");
  }
  double Put(const State& s, uint64_t v) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < s.shards.size(); ++i) {
      Check(ckptdb_put_shard(db, v, s.names[i].c_str(), s.shards[i], s.shard_bytes, nullptr, 0),
            "put_shard");
    }
    return Since(t0);
  }
};

std::string RamSpec(const Args& a, const State& s, int versions, const std::string& extra) {
  // Room for `versions` copies plus record headers (one 4 KiB block per 4 MiB chunk and per
  // shard), plus 64 MiB of slack.
  uint64_t per_version = s.bytes + (s.bytes >> 10) + s.shards.size() * 8192 + (1 << 20);
  uint64_t mib = (per_version * versions >> 20) + 64;
  return "ram:" + std::to_string(mib) + "M,dir=" + a.shm + extra;
}

void Fresh(const Args& a) {
  fs::remove_all(a.shm);
  fs::remove_all(a.disk);
  fs::create_directories(a.shm);
  fs::create_directories(a.disk);
}

// ---- blocked ------------------------------------------------------------------------------------

void Blocked(const Args& a, State& s, uint8_t* scratch) {
  Fresh(a);
  double memcpy_s = MemcpyState(s, scratch);
  memcpy_s = std::min(memcpy_s, MemcpyState(s, scratch));
  double sync_s = SyncWriteState(s, a.disk + "/sync.bin");
  fs::remove(a.disk + "/sync.bin");
  const double compute_s = a.compute_ratio * memcpy_s;
  std::printf(
      "== blocked: %.2f GiB in %zu shards, compute %s %.1f ms (%.2f x memcpy), %u capture "
      "threads ==\n",
      s.bytes / 1073741824.0, s.shards.size(), a.compute.c_str(), compute_s * 1e3, a.compute_ratio,
      a.threads);
  // ram only, keep=1: each version is superseded by the next; the arena holds two.
  Store st(a.shm + "/store", RamSpec(a, s, 2, ",keep=1"), a.threads);
  std::vector<double> blocked, put, wait, commit, iteration;
  for (int it = 1; it <= a.iterations; ++it) {
    auto i0 = Clock::now();
    double p = st.Put(s, it);
    Compute(a.compute, compute_s);
    auto w0 = Clock::now();
    Check(ckptdb_wait_capture(st.db, it, -1), "wait_capture");
    double w = Since(w0);
    Step(s, it);
    auto c0 = Clock::now();
    Check(ckptdb_commit(st.db, it, CKPTDB_COMMIT_ASYNC), "commit");
    double c = Since(c0);
    double i = Since(i0);
    if (it > 1) {  // the first iteration warms up
      blocked.push_back(p + w + c);
      put.push_back(p);
      wait.push_back(w);
      commit.push_back(c);
      iteration.push_back(i);
    }
    std::printf(
        "  iteration %2d: blocked %7.2f ms (put %6.2f, wait_capture %6.2f, commit %5.2f), "
        "iteration %7.1f ms\n",
        it, (p + w + c) * 1e3, p * 1e3, w * 1e3, c * 1e3, i * 1e3);
  }
  Check(ckptdb_wait_commit(st.db, a.iterations, nullptr, -1), "wait_commit");
  double b = Median(blocked);
  std::printf("  memcpy of the state          %8.1f ms (%.2f GB/s)\n", memcpy_s * 1e3,
              s.bytes / memcpy_s / 1e9);
  std::printf("  sync write+fsync (disk)      %8.1f ms (%.2f GB/s)\n", sync_s * 1e3,
              s.bytes / sync_s / 1e9);
  std::printf("  blocked, median              %8.2f ms (put %.2f, wait %.2f, commit %.2f)\n",
              b * 1e3, Median(put) * 1e3, Median(wait) * 1e3, Median(commit) * 1e3);
  std::printf("  blocked / sync write+fsync   %8.2f%%  (bar: 5%%)\n", 100 * b / sync_s);
  std::printf("  blocked / memcpy             %8.2f%%  (bar: 10%%)\n", 100 * b / memcpy_s);
  std::printf("  iteration / (compute)        %8.2f   (interference: 1.00 is none)\n",
              Median(iteration) / compute_s);
}

// ---- capture ------------------------------------------------------------------------------------

void Capture(const Args& a, State& s, uint8_t* scratch) {
  Fresh(a);
  std::printf("== capture: %.2f GiB in %zu shards into ram, %u capture threads ==\n",
              s.bytes / 1073741824.0, s.shards.size(), a.threads);
  Store st(a.shm + "/store", RamSpec(a, s, 2, ",keep=1"), a.threads);
  std::vector<double> memcpy_s, capture_s;
  for (int r = 0; r <= a.repeats; ++r) {
    double m = MemcpyState(s, scratch);
    auto t0 = Clock::now();
    st.Put(s, r + 1);
    Check(ckptdb_wait_capture(st.db, r + 1, -1), "wait_capture");
    double c = Since(t0);
    Check(ckptdb_commit(st.db, r + 1, 0), "commit");
    if (r > 0) {
      memcpy_s.push_back(m);
      capture_s.push_back(c);
    }
    std::printf("  round %d: memcpy %.2f GB/s, capture %.2f GB/s\n", r, s.bytes / m / 1e9,
                s.bytes / c / 1e9);
  }
  double m = s.bytes / Median(memcpy_s) / 1e9, c = s.bytes / Median(capture_s) / 1e9;
  std::printf("  memcpy (1 thread), median    %8.2f GB/s\n", m);
  std::printf("  capture with xxh3, median    %8.2f GB/s\n", c);
  std::printf("  capture / memcpy             %8.0f%%  (bar: 80%%)\n", 100 * c / m);
}

// ---- drain --------------------------------------------------------------------------------------

void Drain(const Args& a, State& s, uint8_t* scratch) {
  Fresh(a);
  std::printf("== drain: %.2f GiB from ram to disk:%s ==\n", s.bytes / 1073741824.0,
              a.disk.c_str());
  // keep on disk is larger than the rounds: no eviction (an unlink of the last round's 2 GiB)
  // runs during a measurement.
  Store st(a.shm + "/store",
           RamSpec(a, s, 2, ",keep=1") + ";disk:" + a.disk +
               "/tier,keep=" + std::to_string(a.repeats + 2),
           a.threads);
  std::vector<double> raw_s, drain_s;
  for (int r = 0; r <= a.repeats; ++r) {
    // Raw: the same bytes, O_DIRECT, 4 MiB writes (ckptdb's chunk size), then fsync.
    for (size_t i = 0; i < s.shards.size(); ++i) {
      std::memcpy(scratch + i * s.shard_bytes, s.shards[i], s.shard_bytes);
    }
    // The two alternate which goes first: the virtual disk may still be busy with the one
    // before (its cache is volatile), and neither should always pay for it.
    std::string raw = a.disk + "/raw.bin";
    double w = 0, d = 0;
    auto raw_write = [&] {
      w = bench::RawWrite(raw, scratch, s.bytes, 4 << 20, /*direct=*/true);
      fs::remove(raw);
    };
    if (r % 2 == 0) raw_write();
    st.Put(s, r + 1);
    Check(ckptdb_commit(st.db, r + 1, 0), "commit");  // durable in ram
    auto t0 = Clock::now();
    Check(ckptdb_wait_commit(st.db, r + 1, "disk", -1), "wait_commit disk");
    d = Since(t0);
    if (r % 2 == 1) raw_write();
    if (r > 0) {
      raw_s.push_back(w);
      drain_s.push_back(d);
    }
    std::printf("  round %d: raw O_DIRECT write+fsync %.2f GB/s, drain %.2f GB/s\n", r,
                s.bytes / w / 1e9, s.bytes / d / 1e9);
  }
  ckptdb_stats_t stats;
  Check(ckptdb_stats(st.db, &stats), "stats");
  double w = s.bytes / Median(raw_s) / 1e9, d = s.bytes / Median(drain_s) / 1e9;
  std::printf("  tier disk O_DIRECT: %s\n", stats.tiers[1].direct_io ? "yes" : "no");
  std::printf("  raw O_DIRECT write+fsync     %8.2f GB/s\n", w);
  std::printf("  ckptdb drain ram -> disk     %8.2f GB/s\n", d);
  std::printf("  drain / raw                  %8.0f%%  (bar: 85%%)\n", 100 * d / w);
}

// ---- restore ------------------------------------------------------------------------------------

void Restore(const Args& a, State& s, uint8_t* scratch) {
  Fresh(a);
  std::printf("== restore: %.2f GiB from ram and from disk:%s ==\n", s.bytes / 1073741824.0,
              a.disk.c_str());
  const std::string root = a.shm + "/store";
  const std::string disk_tier = a.disk + "/tier";
  const std::string spec = RamSpec(a, s, 2, ",keep=1") + ";disk:" + disk_tier + ",keep=1";
  {
    Store st(root, spec, a.threads);
    st.Put(s, 1);
    Check(ckptdb_commit(st.db, 1, 0), "commit");
    Check(ckptdb_wait_commit(st.db, 1, "disk", -1), "wait_commit disk");
  }
  // Into `into` (default: scratch, whose pages are faulted in: every round's memcpy writes them).
  auto restore_all = [&](ckptdb* db, uint8_t* into = nullptr) {
    uint8_t* dst = into != nullptr ? into : scratch;
    auto t0 = Clock::now();
    for (size_t i = 0; i < s.shards.size(); ++i) {
      Check(ckptdb_restore(db, 1, s.names[i].c_str(), dst + i * s.shard_bytes, s.shard_bytes, 0),
            "restore");
    }
    double t = Since(t0);
    for (size_t i = 0; i < s.shards.size(); ++i) {
      if (std::memcmp(dst + i * s.shard_bytes, s.shards[i], s.shard_bytes) != 0) {
        std::fprintf(stderr, "restored bytes of %s differ\n", s.names[i].c_str());
        std::exit(1);
      }
    }
    return t;
  };
  std::vector<double> memcpy_s, open_s, ram_s, ram_ro_s, read_s, disk_s, fresh_memcpy_s, fresh_s;
  // Memory no one has written yet, as a restarted trainer's new tensors are: each of its pages
  // faults on first write, which on a paravirtualized guest costs as much as the copy itself.
  // Both the memcpy and the restore into such memory are timed, so a page-fault cost shows as
  // itself and not as a slow restore.
  auto fresh = [&] {
    void* p = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(2);
    }
    return static_cast<uint8_t*>(p);
  };
  std::string segment;
  for (const auto& e : fs::directory_iterator(disk_tier)) {
    if (e.path().extension() == ".seg") segment = e.path().string();
  }
  const size_t segment_bytes = fs::file_size(segment);
  uint8_t* raw = Allocate(segment_bytes);
  for (int r = 0; r <= a.repeats; ++r) {
    double m = MemcpyState(s, scratch);
    auto from_ram = [&](ckptdb* db) {
      ckptdb_stats_t stats;
      Check(ckptdb_stats(db, &stats), "stats");
      if (std::string(stats.last_restore_tier) != "ram") {
        std::fprintf(stderr, "restore came from %s, not ram\n", stats.last_restore_tier);
        std::exit(1);
      }
    };
    // A restarted trainer: its read-write handle maps (and locks) the arena at open, then
    // restores from it.
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root.c_str();
    o.tiers = spec.c_str();
    o.capture_threads = a.threads;  // restores are copied and checked by as many threads
    ckptdb* db = nullptr;
    auto o0 = Clock::now();
    Check(ckptdb_open(&o, &db), "open");
    double open = Since(o0);
    double rr = restore_all(db);
    from_ram(db);
    // Which of the two goes first alternates by round: the second's new memory may be pages the
    // first just gave back, which the host has not taken back yet (faster than truly new ones).
    auto fresh_memcpy = [&] {
      uint8_t* untouched = fresh();
      auto f0 = Clock::now();
      for (size_t i = 0; i < s.shards.size(); ++i) {
        std::memcpy(untouched + i * s.shard_bytes, s.shards[i], s.shard_bytes);
      }
      const double t = Since(f0);
      munmap(untouched, s.bytes);
      return t;
    };
    auto fresh_restore = [&] {
      uint8_t* untouched = fresh();
      const double t = restore_all(db, untouched);
      munmap(untouched, s.bytes);
      return t;
    };
    double fm = 0, fr = 0;
    if (r % 2 == 0) {
      fm = fresh_memcpy();
      fr = fresh_restore();
    } else {
      fr = fresh_restore();
      fm = fresh_memcpy();
    }
    Check(ckptdb_close(db), "close");
    // A read-only tool (`ckptdb restore` beside the trainer) maps the arena lazily: the mapping
    // is paid inside its restore.
    o.tiers = nullptr;
    o.read_only = 1;
    Check(ckptdb_open(&o, &db), "open read-only");
    double rro = restore_all(db);
    from_ram(db);
    Check(ckptdb_close(db), "close");
    bench::DropCache(a.disk);
    double raw_read = bench::RawRead(segment, raw, segment_bytes, 4 << 20);
    bench::DropCache(a.disk);
    std::string disk_only = "disk:" + disk_tier;
    o.tiers = disk_only.c_str();  // the disk tier alone: as after a reboot
    Check(ckptdb_open(&o, &db), "open disk");
    double rd = restore_all(db);
    Check(ckptdb_close(db), "close");
    if (r > 0) {
      memcpy_s.push_back(m);
      open_s.push_back(open);
      ram_s.push_back(rr);
      ram_ro_s.push_back(rro);
      read_s.push_back(raw_read);
      disk_s.push_back(rd);
      fresh_memcpy_s.push_back(fm);
      fresh_s.push_back(fr);
    }
    std::printf(
        "  round %d: memcpy %.2f, open %.0f ms, ram %.2f, ram read-only %.2f, raw read %.2f, "
        "disk %.2f GB/s; into new memory: memcpy %.2f, ram %.2f GB/s\n",
        r, s.bytes / m / 1e9, open * 1e3, s.bytes / rr / 1e9, s.bytes / rro / 1e9,
        segment_bytes / raw_read / 1e9, s.bytes / rd / 1e9, s.bytes / fm / 1e9, s.bytes / fr / 1e9);
  }
  munmap(raw, segment_bytes);
  double m = s.bytes / Median(memcpy_s) / 1e9, rr = s.bytes / Median(ram_s) / 1e9;
  double rro = s.bytes / Median(ram_ro_s) / 1e9;
  double raw_read = segment_bytes / Median(read_s) / 1e9, rd = s.bytes / Median(disk_s) / 1e9;
  const double fm = s.bytes / Median(fresh_memcpy_s) / 1e9;
  const double fr = s.bytes / Median(fresh_s) / 1e9;
  std::printf("  into memory already written (page faults paid before the clock starts):\n");
  std::printf("  memcpy                       %8.2f GB/s\n", m);
  std::printf("  open of the trainer's handle %8.0f ms (maps and locks the arena)\n",
              Median(open_s) * 1e3);
  std::printf("  restore from ram (verified)  %8.2f GB/s\n", rr);
  std::printf("  the same, read-only handle   %8.2f GB/s (maps the arena as it reads)\n", rro);
  std::printf("  raw read of the segment      %8.2f GB/s\n", raw_read);
  std::printf("  restore from disk (verified) %8.2f GB/s\n", rd);
  std::printf("  ram restore / memcpy         %8.0f%%  (bar: 80%%)\n", 100 * rr / m);
  std::printf(
      "  into new memory (every page faults on its first write, in both; which goes first\n"
      "  alternates by round):\n");
  std::printf("  memcpy                       %8.2f GB/s\n", fm);
  std::printf("  restore from ram (verified)  %8.2f GB/s\n", fr);
  std::printf("  ram restore / memcpy         %8.0f%%\n", 100 * fr / fm);
  std::printf("  disk restore / raw read      %8.0f%%  (bar: 85%%)\n", 100 * rd / raw_read);
}

// ---- sweep --------------------------------------------------------------------------------------

struct SweepResult {
  double blocked_s = 0;     // all checkpoints, summed
  double iteration_s = 0;   // mean
  double end_to_end_s = 0;  // including the final drain
  int checkpoints = 0;
};

SweepResult RunSweep(const Args& a, State& s, const std::string& approach, int every,
                     double compute_s, int iterations) {
  Fresh(a);
  SweepResult res;
  auto t0 = Clock::now();
  std::vector<double> its;
  if (approach == "sync") {
    for (int it = 1; it <= iterations; ++it) {
      auto i0 = Clock::now();
      Compute(a.compute, compute_s);
      Step(s, it);
      if (it % every == 0) {
        res.blocked_s += SyncWriteState(s, a.disk + "/ckpt-" + std::to_string(it % 2) + ".bin");
        res.checkpoints++;
      }
      its.push_back(Since(i0));
    }
    res.end_to_end_s = Since(t0);
  } else {
    // Opening is set-up, not training: a new arena's pages are allocated and touched once, when
    // the job first starts on the node (the arena then outlives restarts).
    Store* st =
        new Store(a.shm + "/store",
                  RamSpec(a, s, 3, ",keep=2") + ";disk:" + a.disk + "/tier,keep=2", a.threads);
    t0 = Clock::now();
    for (int it = 1; it <= iterations; ++it) {
      auto i0 = Clock::now();
      double blocked = 0;
      bool checkpoint = it % every == 0;
      if (checkpoint) blocked += st->Put(s, it);
      Compute(a.compute, compute_s);
      if (checkpoint) {
        auto w0 = Clock::now();
        Check(ckptdb_wait_capture(st->db, it, -1), "wait_capture");
        blocked += Since(w0);
      }
      Step(s, it);
      if (checkpoint) {
        auto c0 = Clock::now();
        Check(ckptdb_commit(st->db, it, CKPTDB_COMMIT_ASYNC), "commit");
        blocked += Since(c0);
        res.checkpoints++;
      }
      res.blocked_s += blocked;
      its.push_back(Since(i0));
    }
    delete st;  // close: waits for the commits and drains the demotions to disk
    res.end_to_end_s = Since(t0);
  }
  for (double x : its) res.iteration_s += x / its.size();
  return res;
}

// ---- many -------------------------------------------------------------------------------------

void Many(const Args& a) {
  Fresh(a);
  uint64_t listed_many = 0;
  const size_t n = a.small_shards;
  std::vector<uint8_t> data(n * a.small_bytes);
  bench::Fill(data.data(), data.size(), 17);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.push_back("layers." + std::to_string(i) + ".bias");
  std::vector<ckptdb_shard> shards(n);
  for (size_t i = 0; i < n; ++i) {
    shards[i] = {names[i].c_str(), data.data() + i * a.small_bytes, a.small_bytes, nullptr, 0};
  }
  // One put_shard a shard makes each its own record (8 KiB for 256 bytes); put_shards packs
  // them. The arena holds two such versions (the last two committed); a disk tier takes every
  // committed version, as a job's first slower tier does.
  const uint64_t arena_mib = (2 * n * 8192 >> 20) + 64;
  Store st(a.shm + "/store",
           "ram:" + std::to_string(arena_mib) + "M,keep=2,dir=" + a.shm + ";disk:" + a.disk +
               "/tier,keep=2",
           a.threads);
  std::vector<ckptdb_shard> copy(n);
  std::vector<double> descs, call, with_capture, one_by_one;
  uint64_t v = 0;
  for (int r = 0; r < a.repeats + 1; ++r) {
    auto t0 = Clock::now();
    std::memcpy(copy.data(), shards.data(), n * sizeof(ckptdb_shard));
    descs.push_back(Since(t0));
    ++v;
    t0 = Clock::now();
    Check(ckptdb_put_shards(st.db, v, shards.data(), n), "put_shards");
    call.push_back(Since(t0));
    Check(ckptdb_wait_capture(st.db, v, -1), "wait_capture");
    with_capture.push_back(Since(t0));
    Check(ckptdb_abort(st.db, v), "abort");
    ++v;
    t0 = Clock::now();
    for (const ckptdb_shard& s : shards) {
      Check(ckptdb_put_shard(st.db, v, s.name, s.data, s.nbytes, nullptr, 0), "put_shard");
    }
    Check(ckptdb_wait_capture(st.db, v, -1), "wait_capture");
    one_by_one.push_back(Since(t0));
    Check(ckptdb_abort(st.db, v), "abort");
  }
  for (auto* x : {&descs, &call, &with_capture, &one_by_one}) x->erase(x->begin());  // warm-up
  const double per = 1e6 / static_cast<double>(n);
  std::printf("== many: %zu shards of %zu bytes into a ram tier, median of %d ==\n", n,
              a.small_bytes, a.repeats);
  std::printf("  memcpy of the descriptor array      %9.3f ms  %7.3f us a shard\n",
              Median(descs) * 1e3, Median(descs) * per);
  std::printf(
      "  ckptdb_put_shards                   %9.3f ms  %7.3f us a shard  (%.0fx the memcpy)\n",
      Median(call) * 1e3, Median(call) * per, Median(call) / Median(descs));
  std::printf("  put_shards + wait_capture           %9.3f ms  %7.3f us a shard\n",
              Median(with_capture) * 1e3, Median(with_capture) * per);
  std::printf("  put_shard each + wait_capture       %9.3f ms  %7.3f us a shard\n",
              Median(one_by_one) * 1e3, Median(one_by_one) * per);
  // Commit one version of all the shards and one of a single shard; then, on a new handle, the
  // first restore of one shard from each (open timed apart), and the segment's size.
  // Commit and the demotion to disk (both ckptdb's whole path: the manifest, the tail, the
  // catalog's synced records, the copy to disk, its fsync) against one write + fsync of the
  // data to the same file system.
  Check(ckptdb_put_shards(st.db, ++v, shards.data(), n), "put_shards");
  const uint64_t many = v;
  Check(ckptdb_wait_capture(st.db, many, -1), "wait_capture");
  auto c0 = Clock::now();
  Check(ckptdb_commit(st.db, many, 0), "commit");
  const double commit_s = Since(c0);
  Check(ckptdb_wait_commit(st.db, many, "disk", -1), "wait_commit disk");
  const double durable_s = Since(c0);
  c0 = Clock::now();
  {
    const std::string path = a.disk + "/sync.bin";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::perror(path.c_str());
      std::exit(2);
    }
    bench::WriteAll(fd, data.data(), data.size(), 1 << 20);
    fsync(fd);
    close(fd);
  }
  const double write_fsync_s = Since(c0);
  // The manifest's bytes, from the disk copy's footer (docs/format.md section 4: bytes 8-15).
  uint64_t manifest_bytes = 0;
  {
    char name[64];
    std::snprintf(name, sizeof name, "/tier/v%020" PRIu64 "-r00000.seg", many);
    const std::string path = a.disk + name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    uint8_t footer[64];
    const off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    if (size < 64 || pread(fd, footer, 64, size - 64) != 64) {
      std::fprintf(stderr, "cannot read the footer of %s\n", path.c_str());
      std::exit(2);
    }
    close(fd);
    std::memcpy(&manifest_bytes, footer + 8, 8);  // little-endian, as the host
  }
  Check(ckptdb_put_shards(st.db, ++v, shards.data(), 1), "put_shards");
  const uint64_t one = v;
  Check(ckptdb_commit(st.db, one, 0), "commit");
  // The ram tier's copy: what its commit wrote there, the whole segment image.
  ckptdb_version_stats_t vs;
  Check(ckptdb_version_stats(st.db, many, &vs), "version_stats");
  const uint64_t segment_bytes = vs.tier_bytes_written[0];
  ckptdb_list(
      st.db, many,
      [](void* arg, const ckptdb_tensor_desc*) {
        ++*static_cast<uint64_t*>(arg);
        return 0;
      },
      &listed_many);
  Check(ckptdb_close(st.db), "close");
  st.db = nullptr;
  auto t0 = Clock::now();
  Check(ckptdb_open(&st.o, &st.db), "open");
  const double open_s = Since(t0);
  std::vector<uint8_t> out(a.small_bytes);
  const std::string middle = names[n / 2];
  t0 = Clock::now();
  Check(ckptdb_restore(st.db, many, middle.c_str(), out.data(), out.size(), 0), "restore");
  const double first_many = Since(t0);
  t0 = Clock::now();
  Check(ckptdb_restore(st.db, many, names[n / 3].c_str(), out.data(), out.size(), 0), "restore");
  const double second_many = Since(t0);
  // The same right after another open: the first restore of a handle pays for what any first
  // restore pays (its buffers, the workers' first wake-up), which is not the tensor count's.
  Check(ckptdb_close(st.db), "close");
  st.db = nullptr;
  t0 = Clock::now();
  Check(ckptdb_open(&st.o, &st.db), "open");
  const double reopen_s = Since(t0);
  t0 = Clock::now();
  Check(ckptdb_restore(st.db, one, names[0].c_str(), out.data(), out.size(), 0), "restore");
  const double first_one = Since(t0);
  std::printf("  open after the commits                %9.3f ms (again: %.3f ms)\n", open_s * 1e3,
              reopen_s * 1e3);
  std::printf("  first restore of one shard, version of %zu  %9.3f ms  (%.0fx a version of one)\n",
              n, first_many * 1e3, first_many / first_one);
  std::printf("  its second restore of another shard   %9.3f ms\n", second_many * 1e3);
  std::printf("  first restore from a version of one (after another open) %9.3f ms\n",
              first_one * 1e3);
  std::printf(
      "  segment of %zu shards: %.2f MB for %.2f MB of data and a %.2f MB manifest (%.3fx, bar "
      "1.1x)\n",
      n, segment_bytes / 1e6, data.size() / 1e6, manifest_bytes / 1e6,
      static_cast<double>(segment_bytes) / static_cast<double>(data.size() + manifest_bytes));
  std::printf("  commit (to ram)                       %9.3f ms\n", commit_s * 1e3);
  std::printf(
      "  commit + demotion durable on disk     %9.3f ms  (%.1fx one write+fsync, bar 10x)\n",
      durable_s * 1e3, durable_s / write_fsync_s);
  std::printf("  one write + fsync of the data         %9.3f ms\n", write_fsync_s * 1e3);
  if (listed_many != n) {
    std::fprintf(stderr, "the version lists %" PRIu64 " shards, not %zu\n", listed_many, n);
    std::exit(1);
  }
}

// ---- stall -------------------------------------------------------------------------------------

void Stall(const Args& a) {
  const size_t bytes = static_cast<size_t>(a.gib * 1073741824.0) / 4096 * 4096;
  uint8_t* shard = Allocate(bytes);
  bench::Fill(shard, bytes, 5);
  uint8_t* scratch = Allocate(bytes);
  std::memcpy(scratch, shard, bytes);  // both written: no first touch inside a measurement
  const uint64_t arena_mib = (3 * bytes >> 20) + 64;
  std::printf("== stall: one %.2f GiB shard put lazily, %d runs, each on a new %" PRIu64
              " MiB arena ==\n",
              bytes / 1073741824.0, a.runs, arena_mib);
  std::printf("  %4s %10s %10s %12s %12s %9s\n", "run", "open ms", "memcpy ms", "compute ms",
              "blocked ms", "/ memcpy");
  std::vector<double> ratios, opens;
  for (int run = 1; run <= a.runs; ++run) {
    Fresh(a);
    auto m0 = Clock::now();
    std::memcpy(scratch, shard, bytes);
    const double memcpy_s = Since(m0);
    auto o0 = Clock::now();
    Store st(a.shm + "/store", "ram:" + std::to_string(arena_mib) + "M,keep=2,dir=" + a.shm,
             a.threads);
    const double open_s = Since(o0);
    auto t0 = Clock::now();
    Check(ckptdb_put_shard(st.db, 1, "w", shard, bytes, nullptr, 0), "put_shard");
    double blocked = Since(t0);
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * memcpy_s));
    auto w0 = Clock::now();
    Check(ckptdb_wait_capture(st.db, 1, -1), "wait_capture");
    blocked += Since(w0);
    Check(ckptdb_commit(st.db, 1, 0), "commit");
    ratios.push_back(blocked / memcpy_s);
    opens.push_back(open_s);
    std::printf("  %4d %10.0f %10.1f %12.1f %12.2f %9.3f\n", run, open_s * 1e3, memcpy_s * 1e3,
                3 * memcpy_s * 1e3, blocked * 1e3, blocked / memcpy_s);
  }
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  const size_t within = static_cast<size_t>(
      std::count_if(ratios.begin(), ratios.end(), [](double r) { return r <= 0.10; }));
  std::printf(
      "  blocked / memcpy: median %.3f, worst %.3f; %zu of %d runs within 0.10 (bar: 19 "
      "of 20)\n",
      Median(ratios), sorted.back(), within, a.runs);
  std::printf("  open, median %.0f ms, worst %.0f ms\n", Median(opens) * 1e3,
              *std::max_element(opens.begin(), opens.end()) * 1e3);
  munmap(shard, bytes);
  munmap(scratch, bytes);
}

void Sweep(const Args& a, State& s) {
  Fresh(a);
  // The disk's speed swings several-fold on these VMs (LIMITS.md): the median of three writes.
  std::vector<double> probes;
  for (int i = 0; i < 3; ++i) {
    probes.push_back(SyncWriteState(s, a.disk + "/probe.bin"));
    fs::remove(a.disk + "/probe.bin");
  }
  const double write_s = Median(probes);
  struct Trainer {
    const char* name;
    double compute_s;
  };
  // Flush-bound: an iteration is an eighth of what writing the state to disk takes, so a
  // checkpoint every iteration cannot drain in time. Compute-bound: two writes' worth.
  const Trainer trainers[] = {{"flush-bound", write_s / 8}, {"compute-bound", write_s * 2}};
  std::printf("== sweep: %.2f GiB state, write+fsync of it %.0f ms, %d iterations, compute %s ==\n",
              s.bytes / 1073741824.0, write_s * 1e3, a.iterations, a.compute.c_str());
  for (const Trainer& t : trainers) {
    std::printf("\n  %s trainer (iteration compute %.0f ms)\n", t.name, t.compute_s * 1e3);
    std::printf("  %-6s %-7s %16s %14s %14s %14s %12s\n", "every", "approach", "blocked ms/ckpt",
                "ckpt GB/s seen", "iteration ms", "end-to-end s", "vs none");
    SweepResult none = RunSweep(a, s, "sync", a.iterations + 1, t.compute_s, a.iterations);
    for (int every : {1, 2, 5, 10}) {
      for (const char* approach : {"sync", "ckptdb"}) {
        SweepResult r = RunSweep(a, s, approach, every, t.compute_s, a.iterations);
        double seen = r.checkpoints ? s.bytes * r.checkpoints / r.blocked_s / 1e9 : 0;
        double per = r.checkpoints ? r.blocked_s / r.checkpoints * 1e3 : 0;
        std::printf("  %-6d %-7s %16.2f %14.2f %14.1f %14.2f %11.2fx\n", every, approach, per, seen,
                    r.iteration_s * 1e3, r.end_to_end_s, r.end_to_end_s / none.end_to_end_s);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ckptdb's asynchronous checkpoint benchmarks (docs/performance.md)"};
  app.add_option("--mode", a.mode)
      ->check(CLI::IsMember(
          {"blocked", "capture", "drain", "restore", "many", "stall", "sweep", "all"}));
  app.add_option("--gib", a.gib, "state per round, GiB")->check(CLI::PositiveNumber);
  app.add_option("--shards", a.shards)->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--disk", a.disk, "directory of the disk tier");
  app.add_option("--shm", a.shm, "directory of the ram tier and tmpfs runs");
  app.add_option("--iterations", a.iterations)->check(CLI::Range(1, 1000000));
  app.add_option("--compute", a.compute)->check(CLI::IsMember({"spin", "sleep"}));
  app.add_option("--compute-ratio", a.compute_ratio)->check(CLI::PositiveNumber);
  app.add_option("--threads", a.threads, "capture threads")->check(CLI::Range(1, 64));
  app.add_option("--repeats", a.repeats)->check(CLI::Range(1, 1000));
  app.add_option("--runs", a.runs, "stall: runs, each on a new arena")->check(CLI::Range(1, 1000));
  app.add_option("--small-shards", a.small_shards, "many: shards")
      ->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option("--small-bytes", a.small_bytes, "many: bytes a shard")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  CLI11_PARSE(app, argc, argv);
  if (a.mode == "many" || a.mode == "stall") {
    if (a.mode == "many") Many(a);
    if (a.mode == "stall") Stall(a);
    fs::remove_all(a.shm);
    fs::remove_all(a.disk);
    return 0;
  }
  State s = MakeState(a);
  uint8_t* scratch = Allocate(s.bytes);
  bool all = a.mode == "all";
  if (all || a.mode == "blocked") Blocked(a, s, scratch);
  if (all || a.mode == "capture") Capture(a, s, scratch);
  if (all || a.mode == "drain") Drain(a, s, scratch);
  if (all || a.mode == "restore") Restore(a, s, scratch);
  if (a.mode == "sweep") Sweep(a, s);
  fs::remove_all(a.shm);
  fs::remove_all(a.disk);
  return 0;
}
