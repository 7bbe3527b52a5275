// ECHECK's encoding at the senders against ckptdb's encoding at the holders (issue 25,
// docs/performance.md, "Encoding at the senders"), on links that are the bottleneck.
//
// K + M ranks on K + M simulated nodes, each in its own network namespace, joined by a bridge in a
// namespace of its own; each node's veth is shaped by a token bucket (tc tbf, --rate-mbit) at both
// ends, so that every node has a full-duplex link of that rate; CKPTDB_UCX_TLS=tcp, so that UCX
// cannot bypass the links through shared memory. One coding group of all the ranks (ec:K+M), each
// rank --mib MiB of state in 4 tensors, --versions synchronous commits (the first --warmup not
// measured), each version's parity built across the group before the commit returns. A job is
// one encoding; the encodings alternate job by job, --rounds times, the order rotating, so that
// the machine's noise falls on both alike. Per encoding:
//
//   protect   the job's latency of a synchronous commit (first rank's call to last rank's
//             return), median over the measured versions of every round; against the link's
//             limit: each node must send M x its segment and receive as much (the parity of a
//             stripe is M blocks, each built from K data units of K other nodes), so no encoding
//             can protect a version in less than M x segment / rate.
//   wire      bytes each node sent per version: ckptdb's replica_bytes_sent (the units or partial
//             products) and the tc counter of its link's sending end (everything, framing and the
//             commit's messages included), against M x segment.
//   CPU       each rank process's user + system time per version (getrusage over the measured
//             versions), the median rank; and the same per GB protected.
//
// Needs root (network namespaces, tc). Usage:
//   bench_encode [--codes ec:2+2,ec:4+2] [--mib 32] [--versions 8] [--warmup 2] [--rounds 3]
//                [--rate-mbit 400] [--unit-kib 4096] [--shm /dev/shm]
// (the defaults are the run docs/performance.md records first).
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/netns.h"
#include "ckptdb/ckptdb.h"
#include "harness/job.h"

namespace {

namespace fs = std::filesystem;
namespace harness = ckpt::harness;
using bench::Clock;
using bench::Median;
using bench::Since;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kMaxNodes = 16;
constexpr int kMaxVersions = 64;
constexpr int kTensors = 4;

struct Args {
  std::vector<std::string> codes = {"ec:2+2", "ec:4+2"};
  int mib = 32;
  int versions = 8;
  int warmup = 2;
  int rounds = 3;
  int rate_mbit = 400;
  int unit_kib = 4096;
  std::string shm = "/dev/shm";
};

// What the ranks of one job hand back (a shared mapping made before the fork).
struct Shared {
  double t0[kMaxNodes][kMaxVersions + 1];  // a commit's call and return, seconds (CLOCK_MONOTONIC)
  double t1[kMaxNodes][kMaxVersions + 1];
  double cpu_s[kMaxNodes];   // user + system over the measured versions
  uint64_t sent[kMaxNodes];  // replica_bytes_sent over the measured versions
  int failed[kMaxNodes];
};
Shared* g_shared = nullptr;

double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

// N namespaces on one bridge (in a namespace of its own), each node's veth shaped at both ends:
// its sending end in its namespace, its receiving end on the bridge. Deleted with the object.
class Star {
 public:
  Star(int nodes, int rate_mbit) : nodes_(nodes) {
    const std::string id = std::to_string(getpid() % 100000);
    subnet_ = "10.83." + std::to_string(getpid() % 200 + 20) + ".";
    hub_ = "ckbeh" + id;
    ok_ = bench::RunQuiet("ip netns add " + hub_) &&
          bench::RunQuiet("ip -n " + hub_ + " link add br0 type bridge") &&
          bench::RunQuiet("ip -n " + hub_ + " link set br0 up");
    const std::string tbf =
        " root tbf rate " + std::to_string(rate_mbit) + "mbit burst 256kb latency 50ms";
    for (int k = 0; ok_ && k < nodes; ++k) {
      const std::string ns = "ckbe" + id + "-" + std::to_string(k);
      const std::string dev = "ckben" + id + "x" + std::to_string(k);
      const std::string hub_dev = "ckbeh" + id + "x" + std::to_string(k);
      ns_.push_back(ns);
      dev_.push_back(dev);
      const std::string in = "ip -n " + ns + " ";
      ok_ = bench::RunQuiet("ip netns add " + ns) &&
            bench::RunQuiet("ip link add " + dev + " type veth peer name " + hub_dev) &&
            bench::RunQuiet("ip link set " + dev + " netns " + ns) &&
            bench::RunQuiet("ip link set " + hub_dev + " netns " + hub_) &&
            bench::RunQuiet("ip -n " + hub_ + " link set " + hub_dev + " master br0") &&
            bench::RunQuiet("ip -n " + hub_ + " link set " + hub_dev + " up") &&
            bench::RunQuiet(in + "addr add " + Addr(k) + "/24 dev " + dev) &&
            bench::RunQuiet(in + "link set " + dev + " up") &&
            bench::RunQuiet(in + "link set lo up") &&
            bench::RunQuiet("tc -n " + ns + " qdisc add dev " + dev + tbf) &&
            bench::RunQuiet("tc -n " + hub_ + " qdisc add dev " + hub_dev + tbf);
    }
  }
  ~Star() {
    for (const std::string& ns : ns_) bench::RunQuiet("ip netns del " + ns);
    bench::RunQuiet("ip netns del " + hub_);
  }
  bool ok() const { return ok_; }
  std::string Addr(int k) const { return subnet_ + std::to_string(k + 1); }
  // Bytes node k's link has sent (its shaper's counter, tc -s qdisc), -1 when unread.
  long long SentBytes(int k) const { return bench::QdiscSentBytes(ns_[k], dev_[k]); }
  // In a rank's process: into node k's namespace, with a /sys of it (where UCX finds interfaces).
  int Enter(int k) const { return bench::EnterNetns(ns_[k]); }

 private:
  int nodes_;
  bool ok_ = false;
  std::string subnet_, hub_;
  std::vector<std::string> ns_, dev_;
};

#define RANK_FAIL(...)                       \
  do {                                       \
    std::fprintf(stderr, "rank %d: ", rank); \
    std::fprintf(stderr, __VA_ARGS__);       \
    std::fprintf(stderr, "\n");              \
    g_shared->failed[rank] = 1;              \
    return 1;                                \
  } while (0)

int RankJob(const Args& a, const Star& star, harness::Job& job, const std::string& dir, int rank,
            int nodes, const std::string& redundancy) {
  if (star.Enter(rank) != 0) RANK_FAIL("setns: %s", std::strerror(errno));
  const std::string node = dir + "/node" + std::to_string(rank);
  fs::create_directories(node + "/shm");
  const std::string root = node + "/root";
  const size_t bytes = static_cast<size_t>(a.mib) * kMiB;
  const std::string tiers =
      "ram:" + std::to_string(4 * a.mib + 64) + "M,keep=1,dir=" + node + "/shm";
  const std::string coordinator = job.CoordinatorFor(static_cast<uint32_t>(rank));
  const std::string node_id = "node" + std::to_string(rank);
  const std::string listen = star.Addr(rank) + ":0";
  setenv("CKPTDB_LISTEN", listen.c_str(), 1);
  setenv("CKPTDB_UCX_TLS", "tcp", 1);
  setenv("CKPTDB_EC_UNIT_BYTES", std::to_string(size_t{1024} * a.unit_kib).c_str(), 1);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = static_cast<uint32_t>(rank);
  o.world_size = static_cast<uint32_t>(nodes);
  o.node_id = node_id.c_str();
  o.coordinator = coordinator.c_str();
  o.job_token = "bench-encode";
  o.redundancy = redundancy.c_str();
  ckptdb* db = nullptr;
  if (ckptdb_open(&o, &db) != CKPTDB_OK) RANK_FAIL("open: %s", ckptdb_last_error());
  uint8_t* state = bench::Allocate(bytes);
  bench::Fill(state, bytes, 1000 + static_cast<uint64_t>(rank));
  const size_t tensor = bytes / kTensors;
  double cpu0 = 0;
  ckptdb_stats_t s0{};
  for (int v = 1; v <= a.versions; ++v) {
    if (v == a.warmup + 1) {
      cpu0 = CpuSeconds();
      ckptdb_stats(db, &s0);
    }
    state[0] = static_cast<uint8_t>(v);  // the update
    for (int t = 0; t < kTensors; ++t) {
      const std::string name = "state/t" + std::to_string(t);
      if (ckptdb_put_shard(db, static_cast<uint64_t>(v), name.c_str(), state + t * tensor, tensor,
                           nullptr, 0) != CKPTDB_OK) {
        RANK_FAIL("put v%d: %s", v, ckptdb_last_error());
      }
    }
    if (ckptdb_wait_capture(db, static_cast<uint64_t>(v), -1) != CKPTDB_OK) {
      RANK_FAIL("capture v%d: %s", v, ckptdb_last_error());
    }
    job.Arrive("v" + std::to_string(v), true);
    g_shared->t0[rank][v] = Now();
    if (ckptdb_commit(db, static_cast<uint64_t>(v), 0) != CKPTDB_OK) {
      RANK_FAIL("commit v%d: %s", v, ckptdb_last_error());
    }
    g_shared->t1[rank][v] = Now();
  }
  g_shared->cpu_s[rank] = CpuSeconds() - cpu0;
  ckptdb_stats_t s1{};
  ckptdb_stats(db, &s1);
  g_shared->sent[rank] = s1.replica_bytes_sent - s0.replica_bytes_sent;
  // Close together, rank 0 (the coordinator) last.
  job.Arrive("close", true);
  if (rank != 0) ckptdb_close(db);
  job.Arrive("closed", true);
  if (rank == 0) ckptdb_close(db);
  return 0;
}

struct Figures {
  std::vector<double> protect_ms;  // job latency per measured version
  std::vector<double> cpu_ms;      // per rank and job: CPU per version
  std::vector<double> sent_mb;     // per rank and job: replica bytes sent per version
  std::vector<double> link_mb;     // per node and job: its link's bytes sent per version
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ECHECK's encoding at the senders against at the holders (docs/performance.md)"};
  app.add_option("--codes", a.codes, "ec:K+M codes, one group of K + M nodes each")->delimiter(',');
  app.add_option("--mib", a.mib, "state, MiB a rank")->check(CLI::Range(4, 4096));
  app.add_option("--versions", a.versions)->check(CLI::Range(2, kMaxVersions));
  app.add_option("--warmup", a.warmup, "versions before measuring")->check(CLI::Range(0, 32));
  app.add_option("--rounds", a.rounds)->check(CLI::Range(1, 100));
  app.add_option("--rate-mbit", a.rate_mbit, "each node's link")->check(CLI::Range(10, 100000));
  app.add_option("--unit-kib", a.unit_kib, "CKPTDB_EC_UNIT_BYTES in KiB")
      ->check(CLI::Range(4, 1 << 20));
  app.add_option("--shm", a.shm);
  CLI11_PARSE(app, argc, argv);
  if (a.warmup >= a.versions) {
    std::fprintf(stderr, "bench_encode: --warmup %d leaves no version of %d measured\n", a.warmup,
                 a.versions);
    return 2;
  }
  struct Code {
    std::string name;
    int k = 0, m = 0;
  };
  std::vector<Code> codes;
  for (const std::string& c : a.codes) {
    Code code{c};
    if (std::sscanf(c.c_str(), "ec:%d+%d", &code.k, &code.m) != 2 || code.k < 1 || code.m < 1 ||
        code.k + code.m > kMaxNodes || c.find(',') != std::string::npos) {
      std::fprintf(stderr, "bench_encode: --codes %s: ec:K+M with K + M <= %d, no options\n",
                   c.c_str(), kMaxNodes);
      return 2;
    }
    codes.push_back(code);
  }
  g_shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (g_shared == MAP_FAILED) return 2;
  const std::string dir = a.shm + "/ckptdb-bench-encode-" + std::to_string(getpid());
  const double segment = static_cast<double>(a.mib) * kMiB;
  const double rate = a.rate_mbit * 1e6 / 8;  // bytes per second
  std::printf(
      "bench_encode: one coding group of K + M ranks on K + M nodes, each node's link shaped to "
      "%d Mbit/s (%.1f MB/s) each way, UCX_TLS=tcp;\n  %d MiB a rank in %d tensors, %d KiB "
      "units, %d synchronous commits a job (%d warm-up), %d rounds, encodings alternating\n",
      a.rate_mbit, rate / 1e6, a.mib, kTensors, a.unit_kib, a.versions, a.warmup, a.rounds);
  std::fflush(stdout);
  const char* kEncodings[] = {"holder", "sender"};
  std::map<std::pair<std::string, int>, Figures> figures;
  const auto started = Clock::now();
  for (const Code& code : codes) {
    const int nodes = code.k + code.m;
    Star star(nodes, a.rate_mbit);
    if (!star.ok()) {
      std::fprintf(stderr,
                   "bench_encode: cannot make network namespaces, veth, a bridge and tc here "
                   "(needs root and CAP_NET_ADMIN)\n");
      return 2;
    }
    for (int round = 0; round < a.rounds; ++round) {
      for (int e = 0; e < 2; ++e) {
        const int encoding = (e + round) % 2;
        const std::string redundancy =
            code.name + (encoding == 1 ? ",encode=sender" : ",encode=holder");
        std::memset(g_shared, 0, sizeof(Shared));
        fs::remove_all(dir);
        std::vector<long long> link_before(nodes);
        for (int k = 0; k < nodes; ++k) link_before[k] = star.SentBytes(k);
        harness::Job job(static_cast<uint32_t>(nodes));
        job.set_coordinator_host(star.Addr(0));
        harness::RunOptions ro;
        ro.alarm_s = 600;
        ro.kill_all_on_failure = true;
        auto rcs = job.Run(
            [&](uint32_t rank) {
              return RankJob(a, star, job, dir, static_cast<int>(rank), nodes, redundancy);
            },
            ro);
        fs::remove_all(dir);
        if (rcs != std::vector<int>(nodes, 0)) {
          std::fprintf(stderr, "bench_encode: a job failed (%s)\n", redundancy.c_str());
          return 1;
        }
        Figures& f = figures[{code.name, encoding}];
        const int measured = a.versions - a.warmup;
        for (int v = a.warmup + 1; v <= a.versions; ++v) {
          double first = 1e300, last = 0;
          for (int r = 0; r < nodes; ++r) {
            first = std::min(first, g_shared->t0[r][v]);
            last = std::max(last, g_shared->t1[r][v]);
          }
          f.protect_ms.push_back((last - first) * 1e3);
        }
        for (int r = 0; r < nodes; ++r) {
          f.cpu_ms.push_back(g_shared->cpu_s[r] * 1e3 / measured);
          f.sent_mb.push_back(g_shared->sent[r] / 1e6 / measured);
          // The link's counter covers the whole job (warm-up, joining, closing): per version of
          // all of them.
          f.link_mb.push_back((star.SentBytes(r) - link_before[r]) / 1e6 / a.versions);
        }
      }
    }
  }
  std::printf(
      "\n| code | encoded at | protect ms (median) | / link limit | replica MB sent a node a "
      "version (median) | / (M x segment) | link MB a node a version | CPU ms a rank a version "
      "(median) | CPU s per GB protected |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Code& code : codes) {
    const double limit_ms = code.m * segment / rate * 1e3;
    for (int encoding = 0; encoding < 2; ++encoding) {
      const Figures& f = figures[{code.name, encoding}];
      const double protect = Median(f.protect_ms);
      const double cpu = Median(f.cpu_ms);
      const double sent = Median(f.sent_mb);
      std::printf("| %s | %s | %.1f | %.2f | %.1f | %.3f | %.1f | %.1f | %.2f |\n",
                  code.name.c_str(), kEncodings[encoding], protect, protect / limit_ms, sent,
                  sent * 1e6 / (code.m * segment), Median(f.link_mb), cpu,
                  cpu / 1e3 / (segment / 1e9));
    }
  }
  std::printf("\nlink limit: M x segment / rate; %.0f s in all\n", Since(started));
  return 0;
}
