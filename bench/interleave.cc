// GEMINI's traffic interleaving measured (issue 25, docs/performance.md, "Interleaving"): the
// shape of GEMINI's Figure 16, the iteration time of a training loop against its checkpoint size,
// with no checkpointing, with replication started at once, and with replication interleaved into
// the loop's idle network spans (ckptdb_hint).
//
// Two ranks on two simulated nodes, each in its own network namespace, joined by one veth pair
// whose both ends are shaped by a token bucket (tc tbf, --rate-mbit), so that the link, not the
// machine, is the bottleneck; CKPTDB_UCX_TLS=tcp, so UCX cannot bypass the link through shared
// memory (the tc counters are read before and after each job and compared with the bytes the
// loop and the replicas sent). The loop, per iteration, on both ranks at once:
//
//   compute (a sleep of --compute-ms, standing for the GPU's forward pass),
//   an exchange of --comm-kib each way over a TCP connection between the ranks (a collective),
//   compute again (the backward pass), another exchange (the gradients' all-reduce),
//   then the update: wait_capture of the version put one iteration ago, its commit (async), and
//   the put of this iteration's state (--sizes MiB a rank, lazily captured).
//
// The interleaved configuration reports the loop's timeline (ITERATION, NET_BUSY around each
// exchange, NET_IDLE after it) and profiles --profile iterations first; the others report none
// (CKPTDB_INTERLEAVE=off). Each job runs --warmup iterations before it measures. The
// configurations and sizes alternate job by job, --rounds times, so that the machine's noise
// falls on all of them alike; each (configuration, size) measures --iterations iterations in all.
// Figures: the median and p95 iteration time, and each against no checkpointing's in the same run.
//
// Needs root (network namespaces, tc). Usage:
//   bench_interleave [--sizes 1,2,3,4,6] [--iterations 200] [--rounds 2] [--rate-mbit 400]
//                    [--compute-ms 40] [--comm-kib 1024] [--profile 10] [--warmup 12]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/netns.h"
#include "ckptdb/ckptdb.h"
#include "harness/job.h"

namespace {

namespace fs = std::filesystem;
namespace harness = ckpt::harness;
using bench::Clock;
using bench::Since;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kRanks = 2;
constexpr int kMaxIterations = 4096;  // a job's, warm-up included
constexpr int kLoopPort = 47017;      // the loop's own connection (in the job's namespaces)

enum Config { kNone = 0, kAtOnce = 1, kInterleaved = 2 };
const char* kConfigNames[] = {"no checkpoint", "replicate at once", "interleaved"};

struct Args {
  std::vector<int> sizes_mib = {1, 2, 3, 4, 6};
  int iterations = 200;
  int rounds = 2;
  int rate_mbit = 400;
  int compute_ms = 40;
  int comm_kib = 1024;
  int profile = 10;
  int warmup = 12;
  std::string shm = "/dev/shm";
};

// What the ranks of one job hand back (a shared mapping made before the fork).
struct Shared {
  double iteration_s[kRanks][kMaxIterations];
  ckptdb_stats_t stats[kRanks];
  int failed[kRanks];
};
Shared* g_shared = nullptr;

// The two namespaces and their shaped veth pair; deleted with the object.
class Link {
 public:
  Link(int rate_mbit) {
    const std::string id = std::to_string(getpid() % 100000);
    subnet_ = "10.81." + std::to_string(getpid() % 200 + 20) + ".";
    for (int k = 0; k < kRanks; ++k) ns_.push_back("ckbi" + id + "-" + std::to_string(k));
    dev_ = {"ckbia" + id, "ckbib" + id};
    ok_ = bench::RunQuiet("ip netns add " + ns_[0]) && bench::RunQuiet("ip netns add " + ns_[1]);
    ok_ = ok_ && bench::RunQuiet("ip link add " + dev_[0] + " type veth peer name " + dev_[1]);
    for (int k = 0; ok_ && k < kRanks; ++k) {
      const std::string in = "ip -n " + ns_[k] + " ";
      ok_ = bench::RunQuiet("ip link set " + dev_[k] + " netns " + ns_[k]) &&
            bench::RunQuiet(in + "addr add " + Addr(k) + "/24 dev " + dev_[k]) &&
            bench::RunQuiet(in + "link set " + dev_[k] + " up") &&
            bench::RunQuiet(in + "link set lo up") &&
            bench::RunQuiet("tc -n " + ns_[k] + " qdisc add dev " + dev_[k] + " root tbf rate " +
                            std::to_string(rate_mbit) + "mbit burst 256kb latency 50ms");
    }
  }
  ~Link() {
    for (const std::string& ns : ns_) bench::RunQuiet("ip netns del " + ns);
  }
  bool ok() const { return ok_; }
  std::string Addr(int k) const { return subnet_ + std::to_string(k + 1); }
  // Bytes the shaper of rank k's end has sent (tc -s qdisc), -1 when unread.
  long long SentBytes(int k) const { return bench::QdiscSentBytes(ns_[k], dev_[k]); }
  // In a rank's process: into its namespace, with a /sys of it (where UCX finds interfaces).
  int Enter(int k) const { return bench::EnterNetns(ns_[k]); }

 private:
  bool ok_ = false;
  std::string subnet_;
  std::vector<std::string> ns_, dev_;
};

// The loop's connection to the other rank: rank 0 listens, rank 1 connects (retrying while rank
// 0 is not listening yet).
int LoopSocket(const Link& link, int rank) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(kLoopPort);
  inet_pton(AF_INET, link.Addr(0).c_str(), &a.sin_addr);
  int one = 1;
  if (rank == 0) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0) return -1;
    int c = accept(l, nullptr, nullptr);
    close(l);
    if (c >= 0) setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return c;
  }
  for (int tries = 0; tries < 500; ++tries) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return c;
    }
    close(c);
    usleep(10000);
  }
  return -1;
}

// A collective: `bytes` each way at once; returns false on a broken connection.
bool Exchange(int fd, const uint8_t* out, uint8_t* in, size_t bytes) {
  size_t sent = 0, received = 0;
  while (sent < bytes || received < bytes) {
    pollfd p{fd, static_cast<short>((sent < bytes ? POLLOUT : 0) | (received < bytes ? POLLIN : 0)),
             0};
    if (poll(&p, 1, 10000) <= 0) return false;
    if ((p.revents & POLLOUT) && sent < bytes) {
      ssize_t n = send(fd, out + sent, bytes - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) return false;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    if ((p.revents & POLLIN) && received < bytes) {
      ssize_t n = recv(fd, in + received, bytes - received, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return false;
      if (n > 0) received += static_cast<size_t>(n);
    }
  }
  return true;
}

#define RANK_FAIL(...)                       \
  do {                                       \
    std::fprintf(stderr, "rank %d: ", rank); \
    std::fprintf(stderr, __VA_ARGS__);       \
    std::fprintf(stderr, "\n");              \
    g_shared->failed[rank] = 1;              \
    return 1;                                \
  } while (0)

int RankLoop(const Args& a, const Link& link, harness::Job& job, const std::string& dir, int rank,
             Config config, size_t state_bytes, int iterations) {
  if (link.Enter(rank) != 0) RANK_FAIL("setns: %s", std::strerror(errno));
  const std::string node = dir + "/node" + std::to_string(rank);
  fs::create_directories(node + "/shm");
  const std::string root = node + "/root";
  const std::string tiers =
      "ram:" + std::to_string(8 * state_bytes / kMiB + 64) + "M,keep=2,dir=" + node + "/shm";
  const std::string coordinator = job.CoordinatorFor(rank);
  const std::string node_id = "node" + std::to_string(rank);
  const std::string listen = link.Addr(rank) + ":0";
  setenv("CKPTDB_LISTEN", listen.c_str(), 1);
  setenv("CKPTDB_UCX_TLS", "tcp", 1);
  setenv("CKPTDB_INTERLEAVE", config == kInterleaved ? "on" : "off", 1);
  setenv("CKPTDB_INTERLEAVE_PROFILE", std::to_string(a.profile).c_str(), 1);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = static_cast<uint32_t>(rank);
  o.world_size = kRanks;
  o.node_id = node_id.c_str();
  o.coordinator = coordinator.c_str();
  o.job_token = "bench-interleave";
  o.redundancy = "replicate:2";
  ckptdb* db = nullptr;
  if (ckptdb_open(&o, &db) != CKPTDB_OK) RANK_FAIL("open: %s", ckptdb_last_error());
  const int fd = LoopSocket(link, rank);
  if (fd < 0) RANK_FAIL("the loop's connection: %s", std::strerror(errno));
  const size_t comm = static_cast<size_t>(a.comm_kib) << 10;
  uint8_t* out = bench::Allocate(comm);
  uint8_t* in = bench::Allocate(comm);
  bench::Fill(out, comm, static_cast<uint64_t>(rank));
  uint8_t* state = bench::Allocate(state_bytes);
  bench::Fill(state, state_bytes, 100 + static_cast<uint64_t>(rank));
  const bool hints = config == kInterleaved;
  auto hint = [&](unsigned h) {
    if (hints) (void)ckptdb_hint(db, h);
  };
  auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  const std::string name = "state/r" + std::to_string(rank);
  for (int it = 1; it <= iterations; ++it) {
    const auto t0 = Clock::now();
    hint(CKPTDB_HINT_ITERATION);
    sleep_ms(a.compute_ms);
    hint(CKPTDB_HINT_NET_BUSY);
    if (!Exchange(fd, out, in, comm)) RANK_FAIL("exchange: %s", std::strerror(errno));
    hint(CKPTDB_HINT_NET_IDLE);
    sleep_ms(a.compute_ms);
    hint(CKPTDB_HINT_NET_BUSY);
    if (!Exchange(fd, out, in, comm)) RANK_FAIL("exchange: %s", std::strerror(errno));
    hint(CKPTDB_HINT_NET_IDLE);
    if (config != kNone) {
      const uint64_t v = static_cast<uint64_t>(it);
      if (v > 1) {
        if (ckptdb_wait_capture(db, v - 1, -1) != CKPTDB_OK ||
            ckptdb_commit(db, v - 1, CKPTDB_COMMIT_ASYNC) != CKPTDB_OK) {
          RANK_FAIL("commit v%d: %s", it - 1, ckptdb_last_error());
        }
      }
      // A bound on versions in flight (the ram tier keeps 2): a replication that falls behind
      // blocks the loop here, as it would block a trainer.
      if (v > 3 && ckptdb_wait_commit(db, v - 3, nullptr, -1) != CKPTDB_OK) {
        RANK_FAIL("v%d: %s", it - 3, ckptdb_last_error());
      }
      state[0] = static_cast<uint8_t>(it);  // the update
      if (ckptdb_put_shard(db, v, name.c_str(), state, state_bytes, nullptr, 0) != CKPTDB_OK) {
        RANK_FAIL("put v%d: %s", it, ckptdb_last_error());
      }
    }
    g_shared->iteration_s[rank][it - 1] = Since(t0);
  }
  // The last version too, then every commit's outcome, before the figures are taken.
  if (config != kNone) {
    const uint64_t last = static_cast<uint64_t>(iterations);
    if (ckptdb_wait_capture(db, last, -1) != CKPTDB_OK ||
        ckptdb_commit(db, last, CKPTDB_COMMIT_ASYNC) != CKPTDB_OK) {
      RANK_FAIL("commit v%d: %s", iterations, ckptdb_last_error());
    }
    for (uint64_t v = std::max<uint64_t>(1, last - 2); v <= last; ++v) {
      if (ckptdb_wait_commit(db, v, nullptr, -1) != CKPTDB_OK) {
        RANK_FAIL("v%llu: %s", (unsigned long long)v, ckptdb_last_error());
      }
    }
  }
  ckptdb_stats(db, &g_shared->stats[rank]);
  job.Arrive("done", true);
  close(fd);
  ckptdb_close(db);
  return 0;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Figures {
  std::vector<double> iteration_s;  // measured iterations of both ranks, all rounds
  uint64_t replica_bytes = 0, planned = 0, overflow = 0, late = 0, loop_bytes = 0;
  long long link_bytes = 0;
  uint64_t spans = 0, idle_ns = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"GEMINI's traffic interleaving against replication at once (docs/performance.md)"};
  app.add_option("--sizes", a.sizes_mib, "checkpoint sizes, MiB a rank")->delimiter(',');
  app.add_option("--iterations", a.iterations, "measured iterations per configuration and size")
      ->check(CLI::Range(4, 100000));
  app.add_option("--rounds", a.rounds)->check(CLI::Range(1, 100));
  app.add_option("--rate-mbit", a.rate_mbit, "the link's rate")->check(CLI::Range(10, 100000));
  app.add_option("--compute-ms", a.compute_ms)->check(CLI::Range(1, 10000));
  app.add_option("--comm-kib", a.comm_kib, "each exchange, each way")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--profile", a.profile, "iterations profiled")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", a.warmup, "iterations before measuring")->check(CLI::Range(0, 1000));
  app.add_option("--shm", a.shm);
  CLI11_PARSE(app, argc, argv);
  for (int s : a.sizes_mib) {
    if (s < 1 || s > 4096) {
      std::fprintf(stderr, "bench_interleave: --sizes %d MiB: 1 to 4096\n", s);
      return 2;
    }
  }
  const int per_job = (a.iterations + a.rounds - 1) / a.rounds;
  if (a.warmup + per_job > kMaxIterations) {
    std::fprintf(stderr, "bench_interleave: %d iterations a job: at most %d\n", a.warmup + per_job,
                 kMaxIterations);
    return 2;
  }
  if (a.warmup < a.profile) a.warmup = a.profile + 2;
  Link link(a.rate_mbit);
  if (!link.ok()) {
    std::fprintf(stderr,
                 "bench_interleave: cannot make network namespaces, veth and tc here (needs root "
                 "and CAP_NET_ADMIN)\n");
    return 2;
  }
  g_shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (g_shared == MAP_FAILED) return 2;
  const std::string dir = a.shm + "/ckptdb-bench-interleave-" + std::to_string(getpid());
  std::printf(
      "bench_interleave: 2 ranks on 2 nodes, a veth link shaped to %d Mbit/s (%.1f MB/s) "
      "each way, UCX_TLS=tcp;\n  an iteration: %d ms compute, %d KiB exchanged each way, "
      "%d ms compute, %d KiB each way, the update; %d iterations per figure in %d rounds, "
      "after %d of warm-up (%d profiled)\n",
      a.rate_mbit, a.rate_mbit / 8.0, a.compute_ms, a.comm_kib, a.compute_ms, a.comm_kib,
      a.iterations, a.rounds, a.warmup, a.profile);
  std::fflush(stdout);
  std::map<std::pair<int, int>, Figures> figures;  // (size, config)
  const auto started = Clock::now();
  for (int round = 0; round < a.rounds; ++round) {
    for (int size : a.sizes_mib) {
      for (int c = 0; c < 3; ++c) {
        const Config config = static_cast<Config>((c + round) % 3);  // rotating order
        std::memset(g_shared, 0, sizeof(Shared));
        fs::remove_all(dir);
        const long long link_before = link.SentBytes(0) + link.SentBytes(1);
        harness::Job job(kRanks);
        job.set_coordinator_host(link.Addr(0));
        const int iterations = a.warmup + per_job;
        harness::RunOptions ro;
        ro.alarm_s = 600;
        ro.kill_all_on_failure = true;
        auto codes = job.Run(
            [&](uint32_t rank) {
              return RankLoop(a, link, job, dir, static_cast<int>(rank), config,
                              static_cast<size_t>(size) * kMiB, iterations);
            },
            ro);
        fs::remove_all(dir);
        if (codes != std::vector<int>(kRanks, 0)) {
          std::fprintf(stderr, "bench_interleave: a job failed (size %d MiB, %s)\n", size,
                       kConfigNames[config]);
          return 1;
        }
        Figures& f = figures[{size, config}];
        for (int r = 0; r < kRanks; ++r) {
          for (int it = a.warmup; it < iterations; ++it) {
            f.iteration_s.push_back(g_shared->iteration_s[r][it]);
          }
          const ckptdb_stats_t& st = g_shared->stats[r];
          f.replica_bytes += st.replica_bytes_sent;
          f.planned += st.interleave_bytes;
          f.overflow += st.interleave_overflow_bytes;
          f.late += st.interleave_late;
          f.spans = st.interleave_spans;
          f.idle_ns = st.interleave_idle_ns;
          f.loop_bytes += 2ull * iterations * (static_cast<uint64_t>(a.comm_kib) << 10);
        }
        f.link_bytes += link.SentBytes(0) + link.SentBytes(1) - link_before;
      }
    }
  }
  std::printf(
      "\n| MiB a rank | configuration | median (ms) | p95 (ms) | median / none | p95 / "
      "none | replica MB sent | in idle spans | overflow | late spans | link MB (tc) / "
      "loop + replicas |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int size : a.sizes_mib) {
    const double none_median = Quantile(figures[{size, kNone}].iteration_s, 0.5);
    const double none_p95 = Quantile(figures[{size, kNone}].iteration_s, 0.95);
    for (int c = 0; c < 3; ++c) {
      const Figures& f = figures[{size, c}];
      const double median = Quantile(f.iteration_s, 0.5), p95 = Quantile(f.iteration_s, 0.95);
      const double expected = static_cast<double>(f.loop_bytes + f.replica_bytes);
      std::printf(
          "| %d | %s | %.1f | %.1f | %.3f | %.3f | %.1f | %.1f | %.1f | %llu | %.1f / %.1f |\n",
          size, kConfigNames[c], median * 1e3, p95 * 1e3, median / none_median, p95 / none_p95,
          f.replica_bytes / 1e6, f.planned / 1e6, f.overflow / 1e6, (unsigned long long)f.late,
          f.link_bytes / 1e6, expected / 1e6);
    }
  }
  const Figures& any = figures[{a.sizes_mib.front(), kInterleaved}];
  std::printf("\nprofiled: %llu idle spans an iteration, %.1f ms idle in all; %.0f s in all\n",
              (unsigned long long)any.spans, any.idle_ns / 1e6, Since(started));
  return 0;
}
