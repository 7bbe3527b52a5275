// Benchmarks of issue 4 (docs/performance.md, "Many ranks"): a job of ranks run as forked
// processes on simulated nodes (one directory tree and one node_id per rank under --shm), talking
// over UCX on loopback through the public C API, as tests/cluster_test.cc runs them. Every ckptdb
// handle lives in a child process (the parent only forks, runs ucx_perftest and measures limits),
// so no process forks with ckptdb's or RocksDB's threads running. Each figure is set against a
// limit measured in the same run:
//
//   replicate  2 ranks on 2 nodes, replicate:2: each commit pushes the rank's segment into its
//              peer's memory (received in place into a mapped tmpfs file, every chunk's xxh3
//              checked before it is accepted). Replication rate = replica_bytes_sent /
//              replica_ns (ckptdb_stats, taken after each commit: one figure per version),
//              against ucx_perftest's ucp_am_bw (active messages with rendezvous, what ckptdb's
//              transport uses) with the same UCX_TLS, run between the versions while the job
//              waits, in 64 MiB messages (ckptdb's pieces) and 8 MiB ones: each version against
//              the limit measured just before it, the median of those ratios. "One way": rank
//              1's state is a single chunk, so rank 0 alone pushes (as ucx_perftest's one
//              sender); "both ways": both push at once, against two ucx_perftest pairs run at
//              once. The same commits with redundancy none show what is not replication.
//   commit     Commit latency: ckptdb_commit (synchronous: it returns once the version is
//              COMMITTED, decided by the coordinator and recorded by the rank) of a small state on
//              2, 4 and 8 ranks, replicate:2 and none. All ranks start their commit at a barrier;
//              the job's latency of a version is from the first rank's call to the last rank's
//              return. Against a single rank (world_size 1) committing the same state, and the
//              UCX round trip (ucx_perftest ucp_am_lat, which reports half a round trip).
//   restore    One rank's segment restored (a) from a peer's memory after its node was wiped (its
//              directories deleted, the rank reopened on empty ones), (b) from a local disk tier
//              (page cache dropped), against a raw read(2) of the segment, and (c) from the same
//              disk tier read by a process whose reads of that disk are throttled (cgroup blkio,
//              v1 read_bps_device or v2 io.max) to a tenth of the raw read rate measured in (b):
//              a stand-in for a slow shared tier (ckptdb has no nfs tier yet).
//   arc        REFT's ARC and AEC against plain replica groups: m ranks on m nodes, no
//              redundancy, one replica group holding the same state, every shard put as
//              replicated, declared "none" (each keeps the whole state), "arc" (its slice and the
//              next member's, hashing the rest), "aec" (its slice and XOR parity of the others')
//              and "arc+aec" (m >= 3 for the last two). Per config: the bytes a rank keeps
//              against its state (ideal 2/m, 1/m + 1/(m(m-1)), 2/m + 1/(m(m-2))), put +
//              wait_capture and commit times, the time every rank takes to restore its whole
//              state at once (checked byte for byte), and the same once rank m-1's store is
//              closed (ARC reads its slice's copy, AEC decodes it), each against none in the same
//              run; and the bytes sent to peers at capture (none: 0).
//
//   hostile    Commit latency of 2 ranks (replicate:2, --commit-kib a rank) while a thread of
//              the parent connects to the coordinator's port as fast as it can: random bytes,
//              connect-and-close, and Hellos left idle (the pending table at its bound), against
//              the same job quiet; --repeats rounds, quiet and attacked alternating.
//
// Usage: bench_cluster [--mode replicate|commit|restore|coding|arc|hostile|all] [--mib M]
// [--versions V]
//                      [--tls "UCX_TLS [UCX_NAME=VALUE]..."]... [--ranks 2,4,8] [--commit-kib K]
//                      [--repeats R] [--shm DIR] [--disk DIR] [--timeout S]
// --tls may be given more than once (replicate runs each; commit and restore use the first);
// default: tcp, then shm,tcp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "ckptdb/ckptdb.h"
#include "harness/job.h"
#include "transport/rma.h"

namespace {

using bench::Allocate;
using bench::Clock;
using bench::Median;
using bench::Since;
namespace fs = std::filesystem;
namespace harness = ckpt::harness;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kShardBytes = 64 * kMiB;         // the ranks' tensors
constexpr size_t kChunkBytes = 4 * kMiB;          // ckptdb's default chunk
constexpr size_t kPieceBytes = 8 * kMiB;          // ckptdb's fetch calls; ucx_perftest's -s
constexpr size_t kReplicaPieceBytes = 64 * kMiB;  // ckptdb's replica calls; ucx_perftest's -s too
// Versions whose replica memory on the receiver is new (replica_keep 2 + the spare): they pay
// the VM's first touch of tmpfs pages (LIMITS.md) and are reported apart, as warm-up.
constexpr int kWarmupVersions = 3;
constexpr uint32_t kMaxRanks = 24;
constexpr int kMaxVersions = 64;

struct Args {
  std::string mode = "all";
  size_t mib = 0;                                     // 0: 512 for replicate, 256 for restore
  int versions = 0;                                   // 0: 6 for replicate, 20 for commit
  std::vector<std::string> tls = {"tcp", "shm,tcp"};  // UCX_TLS values
  std::vector<uint32_t> ranks = {2, 4, 8};
  size_t commit_kib = 4096;
  int repeats = 4;
  std::string shm = "/dev/shm/ckptdb-bench-cluster";
  std::string disk = "/var/tmp/ckptdb-bench-cluster";
  int timeout_s = 170;  // a rank process never outlives this (alarm)
  std::string
      only;  // --mode coding: run the configs whose "<nodes>x<per node>:<redundancy>" has it
};

double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p * v.size()));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string piece;
  while (std::getline(in, piece, sep)) {
    if (!piece.empty()) out.push_back(piece);
  }
  return out;
}

// A --tls entry, "TLS [NAME=VALUE]...": UCX_TLS for ckptdb's ranks (CKPTDB_UCX_TLS) and for
// ucx_perftest, then UCX settings put in the environment of both. Returns the UCX_TLS value.
std::string ApplyTls(const std::string& entry) {
  std::vector<std::string> words = Split(entry, ' ');
  for (size_t i = 1; i < words.size(); ++i) {
    size_t eq = words[i].find('=');
    if (eq != std::string::npos)
      setenv(words[i].substr(0, eq).c_str(), words[i].c_str() + eq + 1, 1);
  }
  std::string tls = words.empty() ? "" : words[0];
  setenv("CKPTDB_UCX_TLS", tls.c_str(), 1);
  return tls;
}

// What ckptdb's bulk bytes are measured against over `tls` (issue 21): where its ranks move them
// one-sided (windows over shared memory, transport/rma.h), ucx_perftest's one-sided test over
// that transport in ckptdb's slot size; else ucp_am_bw (the socket path stands in for UCX's tcp).
struct BulkLimit {
  std::string test;  // ucx_perftest -t
  std::string tls;   // its UCX_TLS
  size_t piece = 0;  // its -s: ckptdb's piece
};
BulkLimit LimitFor(const std::string& tls, bool put) {
  const std::string rma = ckpt::transport::RmaTransports(tls);
  if (!rma.empty()) return {put ? "ucp_put_bw" : "ucp_get", rma, 16 * kMiB};
  return {"ucp_am_bw", tls, put ? kReplicaPieceBytes : kPieceBytes};
}

void UnapplyTls(const std::string& entry) {
  std::vector<std::string> words = Split(entry, ' ');
  for (size_t i = 1; i < words.size(); ++i)
    unsetenv(words[i].substr(0, words[i].find('=')).c_str());
}

// ---- what the rank processes share with the parent ---------------------------------------------

// One anonymous shared mapping made before any fork: the figures each rank reports (one slot per
// rank and version). The ranks' barriers, gates and coordinator port are the job harness's
// (harness/job.h).
struct Shared {
  double t0[kMaxRanks][kMaxVersions];  // steady clock, seconds: commit called
  double t1[kMaxRanks][kMaxVersions];  // commit returned
  double replica_bytes[kMaxRanks][kMaxVersions];
  double replica_ns[kMaxRanks][kMaxVersions];
  double commit_ns[kMaxRanks][kMaxVersions];  // ckptdb_version_stats' commit_ns
  double value[kMaxRanks][8];
  char text[kMaxRanks][256];
};

Shared* g_shared = nullptr;

void ResetShared() { std::memset(static_cast<void*>(g_shared), 0, sizeof *g_shared); }

// The job being run (RunRanks): its ranks' coordinator address, barrier and counters.
harness::Job* g_job = nullptr;

void Barrier() {
  if (!g_job->Barrier()) _exit(1);  // a rank failed: the harness stops this one too
}

// Runs fn(rank) in `ranks` child processes (harness/job.h: rank 0 first, the others once it
// reported its coordinator port), `before_others` in this one once rank 0 reported, and `parent`
// (when given) once all are forked; true when every child exits 0. When one fails, the others
// (which may wait for it at a barrier) are killed.
bool RunRanks(uint32_t ranks, const std::function<int(uint32_t)>& fn, int timeout_s,
              const std::function<void()>& parent = {},
              const std::function<void()>& before_others = {}) {
  ResetShared();
  harness::Job job(ranks);
  g_job = &job;
  harness::RunOptions options;
  options.alarm_s = static_cast<unsigned>(timeout_s);
  options.kill_all_on_failure = true;
  options.report_timeout_ms = timeout_s * 1000;
  options.parent = parent;
  options.before_others = before_others;
  const std::vector<int> codes = job.Run(fn, options);
  g_job = nullptr;
  bool ok = true;
  for (uint32_t r = 0; r < ranks; ++r) {
    if (codes[r] == 0) continue;
    std::fprintf(stderr, "rank %u: exit code %d%s\n", r, codes[r],
                 codes[r] > 128 ? " (a signal: 128 + it)" : "");
    ok = false;
  }
  return ok;
}

// A port for ucx_perftest's server (-p), which cannot report the one it binds: bound here and
// closed, then given to it. The job's own ports are bound by the ranks (RunRanks).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    std::perror("a free port");
    std::exit(2);
  }
  close(fd);
  return ntohs(sa.sin_port);
}

#define RANK_CHECK(expr, what)                                                           \
  do {                                                                                   \
    int rc_ = (expr);                                                                    \
    if (rc_ != CKPTDB_OK) {                                                              \
      std::fprintf(stderr, "rank %u: %s: %s: %s\n", rank, what, ckptdb_status_name(rc_), \
                   ckptdb_last_error());                                                 \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

// ---- a rank's state and store ------------------------------------------------------------------

struct RankState {
  size_t shard_bytes = 0;
  size_t bytes = 0;
  std::vector<uint8_t*> shards;
  std::vector<std::string> names;
};

// Pre-faulted, incompressible, distinct per rank (allocated in the rank's process, outside any
// timed region: LIMITS.md, first touch).
RankState MakeRankState(uint32_t rank, size_t bytes) {
  RankState s;
  s.shard_bytes = std::min(bytes, kShardBytes);
  size_t n = (bytes + s.shard_bytes - 1) / s.shard_bytes;
  s.bytes = s.shard_bytes * n;
  for (size_t i = 0; i < n; ++i) {
    s.shards.push_back(Allocate(s.shard_bytes));
    bench::Fill(s.shards.back(), s.shard_bytes, (uint64_t{rank} << 32) + i * 7919);
    s.names.push_back("r" + std::to_string(rank) + ".layer" + std::to_string(i));
  }
  return s;
}

// The optimizer step: every shard changes a little.
void Step(RankState& s, uint64_t version) {
  for (uint8_t* p : s.shards) {
    for (size_t off = 0; off < s.shard_bytes; off += kMiB) p[off] ^= static_cast<uint8_t>(version);
  }
}

struct Job {
  std::string dir;  // holds node<R>/ for every rank
  uint32_t ranks = 2;
  std::string redundancy = "none";
  uint32_t keep = 1;
  uint32_t ranks_per_node = 1;  // node_id "node<rank / ranks_per_node>"
  // > 1: ranks [g * n, g * n + n) are replica group g (ckptdb_declare_replicas), holding the same
  // state (their group's first rank's) and putting every shard as replicated.
  uint32_t replica_group = 0;
  const char* protection = nullptr;  // the replica groups' (ckptdb_declare_replicas)
  // A rank's directories (its store and its node's memory); a node's loss removes those of all
  // its ranks.
  std::string Node(uint32_t rank) const { return dir + "/node" + std::to_string(rank); }
};

// A job of `ranks` ranks on fresh directories under --shm.
Job NewJob(const Args& a, uint32_t ranks, const std::string& redundancy, uint32_t keep = 1) {
  Job job;
  job.dir = a.shm + "/job";
  job.ranks = ranks;
  job.redundancy = redundancy;
  job.keep = keep;
  fs::remove_all(job.dir);
  return job;
}

// A ram arena for keep + 1 versions of `bytes` (one being captured while `keep` are kept), plus
// record headers and slack.
std::string RamMib(size_t bytes, uint32_t keep) {
  size_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  size_t per_version = bytes + chunks * 4096 + 64 * 8192 + kMiB;
  return std::to_string(per_version * (keep + 1) / kMiB + 64) + "M";
}

// Opens rank `rank` of the job on its node, as tests/cluster_test.cc does; world_size 1 when the
// job has one rank (no coordinator, no transport).
int OpenRank(const Job& job, uint32_t rank, size_t bytes, ckptdb** db) {
  std::string node = job.Node(rank);
  fs::create_directories(node + "/shm");
  std::string root = node + "/root";
  std::string tiers = "ram:" + RamMib(bytes, job.keep) + ",keep=" + std::to_string(job.keep) +
                      ",dir=" + node + "/shm";
  std::string coordinator = g_job->CoordinatorFor(rank);
  std::string node_id = "node" + std::to_string(rank / job.ranks_per_node);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = rank;
  o.world_size = job.ranks;
  if (job.ranks > 1) {
    o.node_id = node_id.c_str();
    o.coordinator = coordinator.c_str();
    o.job_token = "bench-cluster-token";
    o.redundancy = job.redundancy.c_str();
  }
  return ckptdb_open(&o, db);
}

int PutAll(ckptdb* db, const RankState& s, uint64_t version, unsigned flags = 0) {
  for (size_t i = 0; i < s.shards.size(); ++i) {
    int rc = ckptdb_put_shard(db, version, s.names[i].c_str(), s.shards[i], s.shard_bytes, nullptr,
                              flags);
    if (rc != CKPTDB_OK) return rc;
  }
  return ckptdb_wait_capture(db, version, -1);
}

// A job's ranks close together, rank 0 (the coordinator) last.
int CloseRanks(ckptdb* db, uint32_t rank, uint32_t ranks) {
  if (ranks == 1) return ckptdb_close(db);
  Barrier();
  int rc = CKPTDB_OK;
  if (rank != 0) rc = ckptdb_close(db);
  Barrier();
  if (rank == 0) rc = ckptdb_close(db);
  return rc;
}

// ---- ucx_perftest ------------------------------------------------------------------------------

struct Perf {
  bool ok = false;
  double gbs = 0;         // overall bandwidth, 10^9 bytes/s (ucx_perftest prints MiB/s)
  double typical_us = 0;  // latency median (ping-pong tests: half a round trip)
  double average_us = 0;
};

pid_t Spawn(const std::vector<std::string>& argv, const std::string& tls, int out_fd) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("UCX_TLS", tls.c_str(), 1);
    int devnull = open("/dev/null", O_RDWR);
    dup2(out_fd >= 0 ? out_fd : devnull, 1);
    dup2(out_fd >= 0 ? out_fd : devnull, 2);
    alarm(120);  // survives exec
    std::vector<char*> args;
    for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// The last line of ucx_perftest's output with its 8 figures: iterations, latency 50th percentile,
// average and overall (usec), bandwidth average and overall (MB/s, which ucx_perftest computes
// with 1024*1024), message rate average and overall.
Perf ParsePerf(const std::string& out) {
  Perf p;
  std::stringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::stringstream in(line);
    std::vector<double> v;
    std::string tok;
    while (in >> tok) {
      if (tok == "Final:") continue;
      char* end = nullptr;
      double x = std::strtod(tok.c_str(), &end);
      if (end == tok.c_str() || *end != '\0') {
        v.clear();
        break;
      }
      v.push_back(x);
    }
    if (v.size() == 8) {
      p.ok = true;
      p.typical_us = v[1];
      p.average_us = v[3];
      p.gbs = v[5] * 1048576.0 / 1e9;
    }
  }
  return p;
}

// `pairs` servers and clients of ucx_perftest test `test` at once, UCX_TLS=tls; one Perf a pair.
std::vector<Perf> PerfTest(const std::string& tls, const std::string& test, size_t bytes, int iters,
                           int pairs) {
  std::fflush(nullptr);
  std::vector<pid_t> servers, clients;
  std::vector<int> ports, outs;
  for (int i = 0; i < pairs; ++i) {
    ports.push_back(FreePort());
    servers.push_back(Spawn({"ucx_perftest", "-p", std::to_string(ports.back())}, tls, -1));
  }
  usleep(500 * 1000);  // the servers listen
  for (int i = 0; i < pairs; ++i) {
    outs.push_back(memfd_create("ucx_perftest", MFD_CLOEXEC));
    clients.push_back(Spawn({"ucx_perftest", "127.0.0.1", "-p", std::to_string(ports[i]), "-t",
                             test, "-s", std::to_string(bytes), "-n", std::to_string(iters), "-f"},
                            tls, outs.back()));
  }
  std::vector<Perf> out;
  for (int i = 0; i < pairs; ++i) {
    int status = 0;
    waitpid(clients[i], &status, 0);
    std::string text;
    char buf[4096];
    lseek(outs[i], 0, SEEK_SET);
    for (ssize_t n; (n = read(outs[i], buf, sizeof buf)) > 0;) text.append(buf, n);
    close(outs[i]);
    Perf p = ParsePerf(text);
    if (!p.ok) {
      std::fprintf(stderr, "ucx_perftest %s (UCX_TLS=%s) gave no result:\n%s\n", test.c_str(),
                   tls.c_str(), text.c_str());
    }
    out.push_back(p);
  }
  for (pid_t s : servers) {
    int status = 0;
    for (int i = 0; i < 50 && waitpid(s, &status, WNOHANG) == 0; ++i) usleep(100 * 1000);
    if (waitpid(s, &status, WNOHANG) == 0) {
      kill(s, SIGKILL);
      waitpid(s, &status, 0);
    }
  }
  return out;
}

Perf PerfOne(const std::string& tls, const std::string& test, size_t bytes, int iters) {
  return PerfTest(tls, test, bytes, iters, 1)[0];
}

// ---- replicate ---------------------------------------------------------------------------------

struct ReplicateResult {
  bool ok = false;
  double rate_gbs[2] = {0, 0};    // median per-version replica_bytes_sent / replica_ns, a rank
  double commit_ms[2] = {0, 0};   // median commit call to return
  double replica_ms[2] = {0, 0};  // median replica_ns
  std::vector<double> rates[2];
  std::vector<double> warmup_rates[2];
  double received[2] = {0, 0};
  std::string paths;  // rank 0's ckptdb_stats peer_paths
};

// Two ranks on two nodes; rank 0 checkpoints bytes0, rank 1 bytes1, `versions` times. Where
// `between` is given, the ranks wait before each version after the warm-up ones (before its
// optimizer step and capture) while the parent runs between(version): a limit measured right
// next to the version it is set against, with the job idle.
ReplicateResult ReplicateJob(const Args& a, const std::string& redundancy, size_t bytes0,
                             size_t bytes1, int versions,
                             const std::function<void(int)>& between = {}) {
  Job job = NewJob(a, 2, redundancy);
  ReplicateResult res;
  res.ok = RunRanks(
      2,
      [&](uint32_t rank) {
        RankState s = MakeRankState(rank, rank == 0 ? bytes0 : bytes1);
        ckptdb* db = nullptr;
        RANK_CHECK(OpenRank(job, rank, s.bytes, &db), "open");
        ckptdb_stats_t st;
        RANK_CHECK(ckptdb_stats(db, &st), "stats");
        uint64_t sent = st.replica_bytes_sent, ns = st.replica_ns;
        for (int v = 1; v <= versions; ++v) {
          g_job->Add("at_gate");  // all ranks at v: 2 * v
          if (!g_job->WaitAtLeast("gate", v, -1)) return 1;
          Step(s, v);
          RANK_CHECK(PutAll(db, s, v), "put");
          Barrier();
          g_shared->t0[rank][v] = Now();
          RANK_CHECK(ckptdb_commit(db, v, 0), "commit");
          g_shared->t1[rank][v] = Now();
          RANK_CHECK(ckptdb_stats(db, &st), "stats");
          g_shared->replica_bytes[rank][v] = static_cast<double>(st.replica_bytes_sent - sent);
          g_shared->replica_ns[rank][v] = static_cast<double>(st.replica_ns - ns);
          sent = st.replica_bytes_sent;
          ns = st.replica_ns;
        }
        g_shared->value[rank][0] = static_cast<double>(st.replica_bytes_received);
        std::snprintf(g_shared->text[rank], sizeof g_shared->text[rank], "%s", st.peer_paths);
        RANK_CHECK(CloseRanks(db, rank, 2), "close");
        return 0;
      },
      a.timeout_s,
      [&] {
        g_job->Set("gate", between ? kWarmupVersions : versions);
        const double deadline = Now() + a.timeout_s;
        for (int v = kWarmupVersions + 1; between && v <= versions; ++v) {
          const int left_ms = static_cast<int>((deadline - Now()) * 1000);
          if (left_ms <= 0 || !g_job->WaitAtLeast("at_gate", 2 * v, left_ms)) break;
          between(v);
          g_job->Set("gate", v);
        }
        g_job->Set("gate", versions);
      });
  fs::remove_all(job.dir);
  if (!res.ok) return res;
  for (uint32_t r = 0; r < 2; ++r) {
    std::vector<double> commit, replica;
    for (int v = 1; v <= std::min(versions, kWarmupVersions); ++v) {
      double ns = g_shared->replica_ns[r][v];
      if (ns > 0) res.warmup_rates[r].push_back(g_shared->replica_bytes[r][v] / ns);
    }
    for (int v = kWarmupVersions + 1; v <= versions; ++v) {
      double ns = g_shared->replica_ns[r][v];
      if (ns > 0) res.rates[r].push_back(g_shared->replica_bytes[r][v] / ns);
      replica.push_back(ns / 1e6);
      commit.push_back((g_shared->t1[r][v] - g_shared->t0[r][v]) * 1e3);
    }
    res.rate_gbs[r] = Median(res.rates[r]);
    res.commit_ms[r] = Median(commit);
    res.replica_ms[r] = Median(replica);
    res.received[r] = g_shared->value[r][0];
  }
  res.paths = g_shared->text[0];
  return res;
}

std::string List(const std::vector<double>& v, const char* fmt = "%.2f") {
  std::string out;
  char buf[64];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, fmt, x);
    if (!out.empty()) out += ' ';
    out += buf;
  }
  return out;
}

void RunReplicate(const Args& a, const std::string& tls, size_t bytes, int versions, int iters);

void Replicate(const Args& a) {
  const size_t bytes = (a.mib ? a.mib : 512) * kMiB;
  const int versions =
      std::clamp(a.versions ? a.versions : 9, kWarmupVersions + 1, kMaxVersions - 1);
  const int iters = static_cast<int>(std::max<size_t>(64, 2 * bytes / kPieceBytes));
  std::printf(
      "== replicate: 2 ranks on 2 nodes, %zu MiB a rank, %d versions (versions 1-%d warm up: "
      "the receiver's replica memory is new), replicate:2 ==\n",
      bytes >> 20, versions, kWarmupVersions);
  for (const std::string& entry : a.tls) {
    const std::string tls = ApplyTls(entry);
    std::printf("\n-- UCX_TLS=%s --\n", entry.c_str());
    RunReplicate(a, tls, bytes, versions, iters);
    UnapplyTls(entry);
  }
}

void RunReplicate(const Args& a, const std::string& tls, size_t bytes, int versions, int iters) {
  // The limit, measured between the versions, with the job idle: ucx_perftest ucp_am_bw moving
  // the version's bytes in ckptdb's 64 MiB pieces (like for like: its buffers, 128 MiB, are no
  // more in the 32 MiB L3 than ckptdb's 512 MiB are) and in 8 MiB messages (one 8 MiB buffer a
  // side, reused: cache-resident, faster than any 512 MiB transfer can be; the stricter ratio).
  // One-sided (shared memory): ucp_put_bw in ckptdb's 16 MiB slots, and 8 MiB.
  const BulkLimit limit = LimitFor(tls, /*put=*/true);
  const int big_iters = std::max<int>(16, static_cast<int>(2 * bytes / limit.piece));
  std::vector<double> perf_big(kMaxVersions), perf_small(kMaxVersions), copy_gbs(kMaxVersions);
  bool perf_ok = true;
  // One-sided, the bytes cross by copies (a put into the holder's window, the holder's copy into
  // the replica): a memcpy of the version's bytes between two buffers of its size, warm, is the
  // physical limit of one such copy on this machine.
  const bool one_sided = limit.test == "ucp_put_bw";
  uint8_t* copy_src = one_sided ? Allocate(bytes) : nullptr;
  uint8_t* copy_dst = one_sided ? Allocate(bytes) : nullptr;
  auto between = [&](int v) {
    if (one_sided) {
      std::memcpy(copy_dst, copy_src, bytes);  // warm
      const auto t = Clock::now();
      std::memcpy(copy_dst, copy_src, bytes);
      copy_gbs[v] = bytes / Since(t) / 1e9;
    }
    Perf big = PerfOne(limit.tls, limit.test, limit.piece, big_iters);
    Perf small = PerfOne(limit.tls, limit.test, kPieceBytes, iters);
    perf_ok = perf_ok && big.ok && small.ok;
    perf_big[v] = big.gbs;
    perf_small[v] = small.gbs;
  };
  ReplicateResult one = ReplicateJob(a, "replicate:2", bytes, kChunkBytes, versions, between);
  if (one_sided) {
    munmap(copy_src, bytes);
    munmap(copy_dst, bytes);
  }
  if (!one.ok || !perf_ok) {
    std::printf("  the job or ucx_perftest failed (see stderr): UCX_TLS=%s not measured\n",
                tls.c_str());
    return;
  }
  ReplicateResult none = ReplicateJob(a, "none", bytes, kChunkBytes, versions);
  std::vector<Perf> pairs_before = PerfTest(limit.tls, limit.test, kPieceBytes, iters, 2);
  ReplicateResult both = ReplicateJob(a, "replicate:2", bytes, bytes, versions);
  std::vector<Perf> pairs_after = PerfTest(limit.tls, limit.test, kPieceBytes, iters, 2);
  if (!none.ok || !both.ok) {
    std::printf("  a job failed (see stderr): UCX_TLS=%s not measured\n", tls.c_str());
    return;
  }
  std::printf("  one way (rank 0 pushes %zu MiB a version to rank 1):\n", bytes >> 20);
  std::printf("    warm-up versions 1-%d             %s GB/s (new replica memory)\n",
              kWarmupVersions, List(one.warmup_rates[0]).c_str());
  std::printf("    (limit: ucx_perftest %s, UCX_TLS=%s; ckptdb's path: %s)\n", limit.test.c_str(),
              limit.tls.c_str(), one.paths.c_str());
  std::printf("    version  %s %zu MiB x %d  8 MiB x %d  ckptdb   / %zu MiB  / 8 MiB\n",
              limit.test.c_str(), limit.piece >> 20, big_iters, iters, limit.piece >> 20);
  std::vector<double> ratio_big, ratio_small;
  for (int v = kWarmupVersions + 1; v <= versions; ++v) {
    const double rate = one.rates[0][v - kWarmupVersions - 1];
    ratio_big.push_back(rate / perf_big[v]);
    ratio_small.push_back(rate / perf_small[v]);
    std::printf("    %7d  %17.2f  %10.2f  %6.2f  %7.0f%%  %6.0f%%   GB/s\n", v, perf_big[v],
                perf_small[v], rate, 100 * ratio_big.back(), 100 * ratio_small.back());
  }
  std::printf("    replication rate, median          %8.2f GB/s\n", one.rate_gbs[0]);
  if (one_sided) {
    std::vector<double> ratio_copy;
    for (int v = kWarmupVersions + 1; v <= versions; ++v) {
      ratio_copy.push_back(one.rates[0][v - kWarmupVersions - 1] / copy_gbs[v]);
    }
    std::printf(
        "    against one memcpy of %zu MiB      %8.0f%%  (memcpy %s GB/s between the versions; "
        "ckptdb copies twice: the put, then the holder's copy into the replica)\n",
        bytes >> 20, 100 * Median(ratio_copy),
        List(std::vector<double>(copy_gbs.begin() + kWarmupVersions + 1,
                                 copy_gbs.begin() + versions + 1))
            .c_str());
  }
  std::printf(
      "    replication / ucx_perftest        %8.0f%%  (median of the versions' ratios; bar: 90%% "
      "of ucx_perftest in ckptdb's %zu MiB pieces)\n",
      100 * Median(ratio_big), limit.piece >> 20);
  std::printf("    the same against 8 MiB messages   %8.0f%%  (cache-resident buffers)\n",
              100 * Median(ratio_small));
  std::printf("    commit, replicate:2 (median)      %8.1f ms, of which replica_ns %.1f ms\n",
              one.commit_ms[0], one.replica_ms[0]);
  std::printf("    commit, redundancy none (median)  %8.1f ms\n", none.commit_ms[0]);
  std::printf("    replication's share of the commit %8.1f ms (difference)\n",
              one.commit_ms[0] - none.commit_ms[0]);
  double pb = 0, pa = 0;
  for (const Perf& p : pairs_before) pb += p.gbs / pairs_before.size();
  for (const Perf& p : pairs_after) pa += p.gbs / pairs_after.size();
  const double pair = (pb + pa) / 2;
  std::printf("  both ways (each rank pushes %zu MiB a version to the other, at once):\n",
              bytes >> 20);
  std::printf("    ucx_perftest, two pairs at once: before %.2f + %.2f, after %.2f + %.2f GB/s\n",
              pairs_before[0].gbs, pairs_before[1].gbs, pairs_after[0].gbs, pairs_after[1].gbs);
  std::printf("    replication rate, median          %8.2f GB/s (rank 0), %.2f GB/s (rank 1)\n",
              both.rate_gbs[0], both.rate_gbs[1]);
  std::printf("    replication / ucx_perftest pair   %8.0f%% (rank 0), %.0f%% (rank 1)\n",
              100 * both.rate_gbs[0] / pair, 100 * both.rate_gbs[1] / pair);
  std::printf("    commit (median)                   %8.1f ms (rank 0), replica_ns %.1f ms\n",
              both.commit_ms[0], both.replica_ms[0]);
}

// ---- commit ------------------------------------------------------------------------------------

struct CommitResult {
  bool ok = false;
  std::vector<double> job_ms;   // a version: first rank's call to the last rank's return
  std::vector<double> rank_ms;  // every rank's call to return
  std::vector<double> stat_ms;  // ckptdb_version_stats' commit_ns, every rank
};

// The job's ranks put and commit versions 1..versions synchronously, all starting each commit
// at a barrier: t0/t1 (call, return) and commit_ns per rank and version in g_shared.
bool CommitVersions(const Args& a, const Job& job, size_t bytes, int versions,
                    const std::function<void()>& before_others = {}) {
  return RunRanks(
      job.ranks,
      [&](uint32_t rank) {
        const uint32_t n = job.replica_group;
        const uint32_t first = n > 1 ? rank / n * n : rank;
        RankState s = MakeRankState(first, bytes);
        ckptdb* db = nullptr;
        RANK_CHECK(OpenRank(job, rank, s.bytes, &db), "open");
        if (n > 1) {
          std::vector<uint32_t> members;
          for (uint32_t m = first; m < first + n; ++m) members.push_back(m);
          RANK_CHECK(ckptdb_declare_replicas(db, rank / n, members.data(), n, job.protection),
                     "declare replicas");
        }
        for (int v = 1; v <= versions; ++v) {
          Step(s, v);
          RANK_CHECK(PutAll(db, s, v, n > 1 ? CKPTDB_PUT_REPLICATED : 0), "put");
          Barrier();
          g_shared->t0[rank][v] = Now();
          RANK_CHECK(ckptdb_commit(db, v, 0), "commit");
          g_shared->t1[rank][v] = Now();
          ckptdb_version_stats_t vs;
          if (ckptdb_version_stats(db, v, &vs) == CKPTDB_OK) {
            g_shared->commit_ns[rank][v] = static_cast<double>(vs.commit_ns);
          }
        }
        RANK_CHECK(CloseRanks(db, rank, job.ranks), "close");
        return 0;
      },
      a.timeout_s, {}, before_others);
}

// Strangers on the job's coordinator port, from a thread of this (parent) process, for as long
// as `stop` is false: in turn random bytes (up to 4 KiB), a connect-and-close, and a valid Hello
// left idle (so the coordinator's table of pending handshakes stays at its bound). Counts the
// connections it made.
struct Attacker {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> connections{0};
  double first = 0;  // when the first connection was made (the coordinator listening)
  double last = 0;
  std::thread thread;
  void Start(int port) {
    thread = std::thread([this, port] {
      std::mt19937_64 rng(27);
      std::vector<uint8_t> noise(4096);
      for (uint8_t& b : noise) b = static_cast<uint8_t>(rng());
      const std::vector<uint8_t> hello = {'C', 'K', 'P', 'H', 1, 1, 0, 0, 42, 0, 0, 0};
      std::deque<int> idle;
      for (uint64_t i = 0; !stop; ++i) {
        // A connect that does not finish in 50 ms is given up: a full accept queue (before the
        // coordinator's loop runs) drops SYNs, and a blocking connect would wait out the
        // kernel's retransmission backoff (1 s, 3 s) instead of attacking.
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(static_cast<uint16_t>(port));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool up = fd >= 0;
        if (up && connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
          pollfd pf{fd, POLLOUT, 0};
          int err = 0;
          socklen_t len = sizeof err;
          up = errno == EINPROGRESS && poll(&pf, 1, 50) == 1 &&
               getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
        }
        if (!up) {
          if (fd >= 0) close(fd);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        if (connections++ == 0) first = Now();
        last = Now();
        if (i % 3 == 0) {
          ssize_t w = send(fd, noise.data(), rng() % noise.size(), MSG_NOSIGNAL);
          (void)w;
        } else if (i % 3 == 2) {
          ssize_t w = send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
          (void)w;
          idle.push_back(fd);  // a header announcing a body that never comes
          if (idle.size() > 100) {
            close(idle.front());
            idle.pop_front();
          }
          continue;
        }
        close(fd);
      }
      for (int fd : idle) close(fd);
    });
  }
  void Stop() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

CommitResult CommitJob(const Args& a, uint32_t ranks, const std::string& redundancy, size_t bytes,
                       int warmup, int versions, uint32_t replica_group = 0,
                       Attacker* attacker = nullptr) {
  Job job = NewJob(a, ranks, redundancy);
  job.replica_group = replica_group;
  CommitResult res;
  const int total = warmup + versions;
  // The strangers start once rank 0 listens (its port is known from then), before the others.
  auto attack = [&] {
    const std::string at = g_job->coordinator();
    if (attacker != nullptr && !at.empty())
      attacker->Start(std::stoi(at.substr(at.rfind(':') + 1)));
  };
  res.ok = CommitVersions(a, job, bytes, total, attack);
  if (attacker != nullptr) attacker->Stop();
  fs::remove_all(job.dir);
  if (!res.ok) return res;
  for (int v = warmup + 1; v <= total; ++v) {
    double first = 1e300, last = 0;
    for (uint32_t r = 0; r < ranks; ++r) {
      first = std::min(first, g_shared->t0[r][v]);
      last = std::max(last, g_shared->t1[r][v]);
      res.rank_ms.push_back((g_shared->t1[r][v] - g_shared->t0[r][v]) * 1e3);
      res.stat_ms.push_back(g_shared->commit_ns[r][v] / 1e6);
    }
    res.job_ms.push_back((last - first) * 1e3);
  }
  return res;
}

void Commit(const Args& a) {
  const size_t bytes = a.commit_kib * 1024;
  const int versions = std::min(a.versions ? a.versions : 20, kMaxVersions - 3);
  const int warmup = 2;
  const std::string tls = ApplyTls(a.tls.front());
  std::printf(
      "== commit latency: %zu KiB a rank, one rank a node, UCX_TLS=%s, %d versions after %d "
      "warm-up; ckptdb_commit synchronous ==\n",
      a.commit_kib, tls.c_str(), versions, warmup);
  Perf lat = PerfOne(tls, "ucp_am_lat", 8, 20000);
  Perf bw = PerfOne(tls, "ucp_am_bw", std::min(bytes, kPieceBytes), 200);
  CommitResult single = CommitJob(a, 1, "none", bytes, warmup, versions);
  if (!single.ok) {
    std::printf("  the single-rank job failed (see stderr)\n");
    return;
  }
  const double single_ms = Median(single.job_ms);
  const double rtt_ms = lat.ok ? 2 * lat.typical_us / 1e3 : 0;
  std::printf(
      "  limits: one rank (world_size 1) commits the same state in %.2f ms (median, p90 "
      "%.2f); UCX round trip %.1f us (ucx_perftest ucp_am_lat: median %.2f us one way)\n",
      single_ms, Percentile(single.job_ms, 0.9), rtt_ms * 1e3, lat.typical_us);
  if (bw.ok) {
    std::printf("  the state's bytes at ucx_perftest's ucp_am_bw rate (%.2f GB/s): %.2f ms\n",
                bw.gbs, bytes / bw.gbs / 1e6);
  }
  std::printf("  %-5s %-11s %10s %10s %12s %14s %12s %12s\n", "ranks", "redundancy", "median ms",
              "p90 ms", "rank median", "stats median", "/ 1 rank", "/ UCX RTT");
  std::printf("  %-5u %-11s %10.2f %10.2f %12.2f %14.2f %12.2f %12.0f\n", 1u, "none", single_ms,
              Percentile(single.job_ms, 0.9), Median(single.rank_ms), Median(single.stat_ms), 1.0,
              rtt_ms > 0 ? single_ms / rtt_ms : 0);
  for (uint32_t n : a.ranks) {
    // "none+groups": replica groups of 2 ranks (ckptdb_declare_replicas), every shard put as
    // replicated and compared at each commit, against the same job without them.
    for (const char* redundancy : {"replicate:2", "none", "none+groups"}) {
      const bool groups = std::strcmp(redundancy, "none+groups") == 0;
      CommitResult r =
          CommitJob(a, n, groups ? "none" : redundancy, bytes, warmup, versions, groups ? 2 : 0);
      if (!r.ok) {
        std::printf("  %-5u %-11s failed (see stderr)\n", n, redundancy);
        continue;
      }
      double m = Median(r.job_ms);
      std::printf("  %-5u %-11s %10.2f %10.2f %12.2f %14.2f %12.2f %12.0f\n", n, redundancy, m,
                  Percentile(r.job_ms, 0.9), Median(r.rank_ms), Median(r.stat_ms), m / single_ms,
                  rtt_ms > 0 ? m / rtt_ms : 0);
    }
  }
  std::printf(
      "  (median and p90 over the versions of the job's latency: the first rank's call to "
      "the last rank's return; \"rank median\" over every rank's own call; \"stats\" is "
      "ckptdb_version_stats' commit_ns)\n");
}

// ---- hostile ----------------------------------------------------------------------------------

// Commit latency with strangers hammering the coordinator's port (issue 21's goal: within 2x of
// a quiet run), quiet and attacked runs alternating.
void Hostile(const Args& a) {
  const size_t bytes = a.commit_kib * 1024;
  const int versions = std::min(a.versions ? a.versions : 20, kMaxVersions - 3);
  const int warmup = 2;
  const std::string tls = ApplyTls(a.tls.front());
  std::printf(
      "== commit latency under attack: 2 ranks, replicate:2, %zu KiB a rank, UCX_TLS=%s, %d "
      "versions after %d warm-up; quiet and attacked runs alternate ==\n",
      a.commit_kib, tls.c_str(), versions, warmup);
  std::vector<double> quiet_all, attacked_all;
  for (int round = 0; round < a.repeats; ++round) {
    CommitResult quiet = CommitJob(a, 2, "replicate:2", bytes, warmup, versions);
    Attacker attacker;
    CommitResult attacked = CommitJob(a, 2, "replicate:2", bytes, warmup, versions, 0, &attacker);
    const double seconds = std::max(1e-3, attacker.last - attacker.first);
    if (!quiet.ok || !attacked.ok) {
      std::printf("  round %d: a job failed (see stderr)\n", round);
      continue;
    }
    quiet_all.insert(quiet_all.end(), quiet.job_ms.begin(), quiet.job_ms.end());
    attacked_all.insert(attacked_all.end(), attacked.job_ms.begin(), attacked.job_ms.end());
    std::printf(
        "  round %d: quiet median %.2f ms (p90 %.2f), attacked median %.2f ms (p90 %.2f): "
        "%.2fx; %llu strangers' connections in the %.2f s the coordinator listened (%.0f a "
        "second)\n",
        round, Median(quiet.job_ms), Percentile(quiet.job_ms, 0.9), Median(attacked.job_ms),
        Percentile(attacked.job_ms, 0.9), Median(attacked.job_ms) / Median(quiet.job_ms),
        static_cast<unsigned long long>(attacker.connections.load()), seconds,
        attacker.connections.load() / seconds);
  }
  if (quiet_all.empty()) return;
  std::printf("  all rounds: quiet median %.2f ms, attacked median %.2f ms: %.2fx (goal: 2x)\n",
              Median(quiet_all), Median(attacked_all), Median(attacked_all) / Median(quiet_all));
}

// ---- restore -----------------------------------------------------------------------------------

// The restoring process's reads of `dir`'s disk limited to bytes_per_s: a cgroup (v1 blkio or v2
// io) this process joins. Returns the cgroup's directory ("" and a reason when impossible).
std::string MakeThrottle(const std::string& dir, uint64_t bytes_per_s, std::string* why) {
  struct stat sb {};
  if (stat(dir.c_str(), &sb) != 0) {
    *why = dir + ": " + std::strerror(errno);
    return "";
  }
  std::string dev = std::to_string(major(sb.st_dev)) + ":" + std::to_string(minor(sb.st_dev));
  std::error_code ec;
  fs::path sys = fs::canonical("/sys/dev/block/" + dev, ec);
  if (ec) {
    *why = dir + " is not on a block device (" + dev + ")";
    return "";
  }
  if (fs::exists(sys / "partition")) {  // throttles apply to whole disks
    std::ifstream in(sys.parent_path() / "dev");
    std::getline(in, dev);
  }
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text << std::flush;
    return static_cast<bool>(out);
  };
  const std::string v1 = "/sys/fs/cgroup/blkio";
  if (fs::exists(v1 + "/blkio.throttle.read_bps_device")) {
    std::string g = v1 + "/ckptdb-bench-cluster";
    fs::create_directories(g, ec);
    if (!ec &&
        write(g + "/blkio.throttle.read_bps_device", dev + " " + std::to_string(bytes_per_s))) {
      return g;
    }
    *why = "cgroup v1 blkio: cannot set " + g + "/blkio.throttle.read_bps_device";
    return "";
  }
  const std::string v2 = "/sys/fs/cgroup";
  std::ifstream controllers(v2 + "/cgroup.controllers");
  std::string c((std::istreambuf_iterator<char>(controllers)), std::istreambuf_iterator<char>());
  if (c.find("io") != std::string::npos) {
    std::string g = v2 + "/ckptdb-bench-cluster";
    write(v2 + "/cgroup.subtree_control", "+io");
    fs::create_directories(g, ec);
    if (!ec && write(g + "/io.max", dev + " rbps=" + std::to_string(bytes_per_s))) return g;
    *why = "cgroup v2: cannot set " + g + "/io.max";
    return "";
  }
  *why = "no cgroup blkio (v1) or io (v2) controller";
  return "";
}

std::string FindSegment(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".seg") return e.path().string();
  }
  return "";
}

int RestoreAll(ckptdb* db, const RankState& s, uint8_t* dst, uint64_t version, double* seconds) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < s.shards.size(); ++i) {
    int rc =
        ckptdb_restore(db, version, s.names[i].c_str(), dst + i * s.shard_bytes, s.shard_bytes, 0);
    if (rc != CKPTDB_OK) return rc;
  }
  *seconds = Since(t0);
  for (size_t i = 0; i < s.shards.size(); ++i) {
    if (std::memcmp(dst + i * s.shard_bytes, s.shards[i], s.shard_bytes) != 0) {
      std::fprintf(stderr, "restored bytes of %s differ\n", s.names[i].c_str());
      return CKPTDB_ECORRUPT;
    }
  }
  return CKPTDB_OK;
}

// The job restarts after `lost` lost its directories; `lost` restores its whole
// state of `versions` steps, the newest version every rank can restore, and checks it bit for
// bit; the others serve. g_shared->value[1][0]: its seconds, [1][1]: its peer_fetch_bytes;
// g_shared->text[1]: where the restore came from.
bool RestartAndRestoreLostRank(const Args& a, Job& job, uint32_t lost, size_t bytes, int versions) {
  return RunRanks(
      job.ranks,
      [&](uint32_t rank) {
        RankState s;
        uint8_t* dst = nullptr;
        if (rank == lost) {
          s = MakeRankState(lost, bytes);
          for (int v = 1; v <= versions; ++v) Step(s, v);
          dst = Allocate(s.bytes);
        }
        ckptdb* db = nullptr;
        RANK_CHECK(OpenRank(job, rank, bytes, &db), "reopen");
        uint64_t latest = 0;
        RANK_CHECK(ckptdb_latest(db, &latest), "latest");
        Barrier();
        if (rank == lost) {
          double t = 0;
          RANK_CHECK(RestoreAll(db, s, dst, latest, &t), "restore of the lost rank");
          ckptdb_stats_t st;
          RANK_CHECK(ckptdb_stats(db, &st), "stats");
          g_shared->value[1][0] = t;
          g_shared->value[1][1] = static_cast<double>(st.peer_fetch_bytes);
          std::snprintf(g_shared->text[1], sizeof g_shared->text[1], "%s", st.last_restore_tier);
        }
        RANK_CHECK(CloseRanks(db, rank, job.ranks), "close");
        return 0;
      },
      a.timeout_s);
}

// One process with a disk-only handle on the store (as after a reboot): drops the page cache and
// reads the segment raw, drops it again and restores every shard, or the same the other way round
// (the virtual disk reads faster what it read a moment ago: the rounds alternate the order).
// value[0][0] raw seconds, value[0][1] restore seconds, value[0][2] segment bytes. With `cgroup`,
// joins it first.
bool DiskRound(const Args& a, size_t bytes, const std::string& cgroup, bool raw_first) {
  return RunRanks(
      1,
      [&](uint32_t rank) {
        if (!cgroup.empty()) {
          std::ofstream procs(cgroup + "/cgroup.procs");
          procs << getpid() << std::flush;
          if (!procs) {
            std::fprintf(stderr, "cannot join %s\n", cgroup.c_str());
            return 1;
          }
        }
        RankState s = MakeRankState(0, bytes);
        uint8_t* dst = Allocate(s.bytes);
        const std::string tier = a.disk + "/tier";
        const std::string segment = FindSegment(tier);
        const size_t seg_bytes = fs::file_size(segment);
        uint8_t* raw = Allocate(seg_bytes);
        std::string root = a.disk + "/root", tiers = "disk:" + tier;
        ckptdb_options o;
        ckptdb_options_init(&o);
        o.root = root.c_str();
        o.tiers = tiers.c_str();
        ckptdb* db = nullptr;
        RANK_CHECK(ckptdb_open(&o, &db), "open disk");
        g_shared->value[0][2] = static_cast<double>(seg_bytes);
        for (int i = 0; i < 2; ++i) {
          bench::DropCache(tier);
          if ((i == 0) == raw_first) {
            g_shared->value[0][0] = bench::RawRead(segment, raw, seg_bytes, kChunkBytes);
          } else {
            double t = 0;
            RANK_CHECK(RestoreAll(db, s, dst, 1, &t), "restore from disk");
            g_shared->value[0][1] = t;
          }
        }
        ckptdb_stats_t st;
        RANK_CHECK(ckptdb_stats(db, &st), "stats");
        std::snprintf(g_shared->text[0], sizeof g_shared->text[0], "%s", st.last_restore_tier);
        RANK_CHECK(ckptdb_close(db), "close");
        return 0;
      },
      a.timeout_s);
}

void Restore(const Args& a) {
  const size_t bytes = (a.mib ? a.mib : 256) * kMiB;
  const std::string tls = ApplyTls(a.tls.front());
  std::printf(
      "== restore: one rank's %zu MiB from a peer's memory (UCX_TLS=%s), a local disk "
      "tier and a throttled one; %d rounds ==\n",
      bytes >> 20, tls.c_str(), a.repeats);
  // (a) From a peer. Both ranks save version 1 (replicate:2: each holds the other's replica);
  // then node 1 is lost (its directories, memory included) and rank 1 reopens on empty ones.
  Job job = NewJob(a, 2, "replicate:2", 2);
  bool ok = RunRanks(
      2,
      [&](uint32_t rank) {
        RankState s = MakeRankState(rank, bytes);
        ckptdb* db = nullptr;
        RANK_CHECK(OpenRank(job, rank, s.bytes, &db), "open");
        RANK_CHECK(PutAll(db, s, 1), "put");
        RANK_CHECK(ckptdb_commit(db, 1, 0), "commit");
        RANK_CHECK(CloseRanks(db, rank, 2), "close");
        return 0;
      },
      a.timeout_s);
  std::vector<double> peer_s, perf_gbs;
  std::string peer_source;
  // One-sided (shared memory): ucp_get in ckptdb's 8 MiB fetch pieces; else ucp_am_bw.
  BulkLimit bulk = LimitFor(tls, /*put=*/false);
  bulk.piece = kPieceBytes;
  // One memcpy of the state between two warm buffers: one copy's physical limit here (a
  // one-sided restore copies twice: the holder into its window, the get out of it).
  double copy_gbs = 0;
  {
    uint8_t* from = Allocate(bytes);
    uint8_t* to = Allocate(bytes);
    std::memcpy(to, from, bytes);
    const auto t = Clock::now();
    std::memcpy(to, from, bytes);
    copy_gbs = bytes / Since(t) / 1e9;
    munmap(from, bytes);
    munmap(to, bytes);
  }
  for (int r = 0; ok && r < a.repeats; ++r) {
    Perf p = PerfOne(bulk.tls, bulk.test, bulk.piece, 64);
    if (p.ok) perf_gbs.push_back(p.gbs);
    fs::remove_all(job.Node(1));
    ok = RestartAndRestoreLostRank(a, job, 1, bytes, 0);
    if (!ok) break;
    peer_s.push_back(g_shared->value[1][0]);
    peer_source = g_shared->text[1];
    std::printf(
        "  round %d: from the peer %.2f GB/s (%s, %.0f MiB fetched); ucx_perftest "
        "%s just before %.2f GB/s\n",
        r, bytes / g_shared->value[1][0] / 1e9, g_shared->text[1], g_shared->value[1][1] / kMiB,
        bulk.test.c_str(), p.gbs);
    if (peer_source.rfind("peer:", 0) != 0) {
      std::printf("  the restore came from %s, not a peer: not a peer restore\n",
                  peer_source.c_str());
      ok = false;
    }
  }
  fs::remove_all(job.dir);
  if (!ok) std::printf("  restore from a peer failed (see stderr)\n");
  // (b) From a local disk tier: one rank's store with the disk tier as its only tier.
  fs::remove_all(a.disk);
  fs::create_directories(a.disk);
  bool disk_ok = RunRanks(
      1,
      [&](uint32_t rank) {
        RankState s = MakeRankState(0, bytes);
        std::string root = a.disk + "/root", tiers = "disk:" + a.disk + "/tier";
        ckptdb_options o;
        ckptdb_options_init(&o);
        o.root = root.c_str();
        o.tiers = tiers.c_str();
        ckptdb* db = nullptr;
        RANK_CHECK(ckptdb_open(&o, &db), "open disk");
        RANK_CHECK(PutAll(db, s, 1), "put");
        RANK_CHECK(ckptdb_commit(db, 1, 0), "commit");
        RANK_CHECK(ckptdb_close(db), "close");
        return 0;
      },
      a.timeout_s);
  std::vector<double> raw_s, disk_s;
  double seg_bytes = 0;
  for (int r = 0; disk_ok && r < a.repeats; ++r) {
    disk_ok = DiskRound(a, bytes, "", r % 2 == 0);
    if (!disk_ok) break;
    raw_s.push_back(g_shared->value[0][0]);
    disk_s.push_back(g_shared->value[0][1]);
    seg_bytes = g_shared->value[0][2];
    std::printf(
        "  round %d: raw read of the segment %.2f GB/s, restore from disk %.2f GB/s (%s; %s "
        "first)\n",
        r, seg_bytes / raw_s.back() / 1e9, bytes / disk_s.back() / 1e9, g_shared->text[0],
        r % 2 == 0 ? "raw read" : "restore");
  }
  // (c) The same tier read through a throttle of a tenth of (b)'s raw read rate.
  std::vector<double> slow_raw_s, slow_s;
  uint64_t limit = 0;
  std::string why;
  if (disk_ok) {
    limit = static_cast<uint64_t>(seg_bytes / Median(raw_s) / 10);
    std::string cgroup = MakeThrottle(a.disk, limit, &why);
    for (int r = 0; !cgroup.empty() && r < a.repeats; ++r) {
      if (!DiskRound(a, bytes, cgroup, r % 2 == 0)) {
        why = "the throttled restore failed (see stderr)";
        break;
      }
      slow_raw_s.push_back(g_shared->value[0][0]);
      slow_s.push_back(g_shared->value[0][1]);
      std::printf("  round %d, throttled to %.3f GB/s: raw read %.3f GB/s, restore %.3f GB/s\n", r,
                  limit / 1e9, seg_bytes / slow_raw_s.back() / 1e9, bytes / slow_s.back() / 1e9);
    }
    if (!cgroup.empty()) rmdir(cgroup.c_str());
  }
  fs::remove_all(a.disk);
  // A peer restore fetches one 4 MiB chunk at a time: ucx_perftest's ping-pong of 4 MiB
  // messages (half a round trip each) is that pattern's transport limit.
  const Perf lat = PerfOne(tls, "ucp_am_lat", kChunkBytes, 100);
  const double peer = peer_s.empty() ? 0 : bytes / Median(peer_s) / 1e9;
  const double perf = Median(perf_gbs);
  std::printf(
      "  restore from a peer's memory    %8.2f GB/s  (%s; ucx_perftest %s, UCX_TLS=%s, %zu MiB: "
      "%.2f GB/s: %.0f%%)\n",
      peer, peer_source.c_str(), bulk.test.c_str(), bulk.tls.c_str(), bulk.piece >> 20, perf,
      perf > 0 ? 100 * peer / perf : 0);
  std::printf(
      "  one memcpy of %zu MiB             %8.2f GB/s  (the peer restore is %.0f%% of it)\n",
      bytes >> 20, copy_gbs, copy_gbs > 0 ? 100 * peer / copy_gbs : 0);
  if (lat.ok) {
    const double one = kChunkBytes / lat.typical_us / 1e3;
    std::printf(
        "  one 4 MiB message at a time     %8.2f GB/s  (ucx_perftest ucp_am_lat -s 4 MiB, "
        "%.0f us each way: the peer restore is %.0f%% of it)\n",
        one, lat.typical_us, 100 * peer / one);
  }
  if (!disk_ok) {
    std::printf("  restore from disk failed (see stderr)\n");
    return;
  }
  const double raw = seg_bytes / Median(raw_s) / 1e9, disk = bytes / Median(disk_s) / 1e9;
  std::printf("  raw read of the segment (disk)  %8.2f GB/s\n", raw);
  std::printf("  restore from a local disk tier  %8.2f GB/s  (%.0f%% of the raw read)\n", disk,
              100 * disk / raw);
  if (slow_s.empty()) {
    std::printf("  slow tier: not measured: %s\n", why.c_str());
  } else {
    const double slow_raw = seg_bytes / Median(slow_raw_s) / 1e9;
    const double slow = bytes / Median(slow_s) / 1e9;
    std::printf(
        "  slow tier: throttle %.3f GB/s (a tenth of the raw read), raw read through it "
        "%.3f GB/s, restore %.3f GB/s (%.0f%% of its raw read)\n",
        limit / 1e9, slow_raw, slow, 100 * slow / slow_raw);
    std::printf("  peer / slow tier                %8.1fx\n", peer / slow);
  }
  std::printf("  peer / disk                     %8.2fx\n", peer / disk);
}

}  // namespace

// ---- coding ------------------------------------------------------------------------------------

struct CodingResult {
  bool ok = false;
  double commit_ms = 0;  // median job latency of a synchronous commit, after the warm-up
  double restore_s = 0;  // the lost rank's whole state
  double overhead = 0;   // (data + redundancy of the last version) / data
  std::string source;
};

// `ranks` ranks, `per_node` on each node, each `bytes` of state, `versions` commits with
// `redundancy`; then node 1 is lost and its first rank restores everything on empty directories.
CodingResult CodingJob(const Args& a, uint32_t ranks, uint32_t per_node,
                       const std::string& redundancy, size_t bytes, int versions) {
  Job job = NewJob(a, ranks, redundancy);
  job.ranks_per_node = per_node;
  const uint32_t lost = per_node;  // node 1's first rank
  CodingResult res;
  const int warmup = 2;
  res.ok = CommitVersions(a, job, bytes, versions);
  if (!res.ok) return res;
  std::vector<double> job_ms;
  for (int v = warmup + 1; v <= versions; ++v) {
    double first = 1e300, last = 0;
    for (uint32_t r = 0; r < ranks; ++r) {
      first = std::min(first, g_shared->t0[r][v]);
      last = std::max(last, g_shared->t1[r][v]);
    }
    job_ms.push_back((last - first) * 1e3);
  }
  res.commit_ms = Median(job_ms);
  // The last version's redundancy: its replicas or its parity segments, on every node.
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-v%020d", versions);
  uint64_t redundancy_bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(job.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.find(suffix) != std::string::npos &&
        (e.path().extension() == ".seg" || e.path().extension() == ".par")) {
      redundancy_bytes += e.file_size();
    }
  }
  const double state = static_cast<double>(ranks) * bytes;
  res.overhead = (state + redundancy_bytes) / state;
  for (uint32_t r = lost; r < lost + per_node; ++r) fs::remove_all(job.Node(r));
  res.ok = RestartAndRestoreLostRank(a, job, lost, bytes, versions);
  fs::remove_all(job.dir);
  res.restore_s = g_shared->value[1][0];
  res.source = g_shared->text[1];
  return res;
}

// ---- arc ---------------------------------------------------------------------------------------

struct ArcResult {
  bool ok = false;
  double kept_ratio = 0;  // the bytes the ranks keep (their segments' chunks) / their state
  std::vector<double> capture_ms, commit_ms;  // per rank and measured version
  std::vector<double> restore_s;              // per rank: its whole state, all ranks at once
  std::vector<double> degraded_s;             // the same with the last rank's store gone
  double sent = 0;                            // replica_bytes_sent, all ranks
};

ArcResult ArcJob(const Args& a, uint32_t ranks, const char* protection, size_t bytes,
                 int versions) {
  Job job = NewJob(a, ranks, "none");
  job.replica_group = ranks;
  job.protection = protection;
  ArcResult res;
  res.ok = RunRanks(
      ranks,
      [&](uint32_t rank) {
        RankState s = MakeRankState(0, bytes);  // every rank the same replica
        ckptdb* db = nullptr;
        RANK_CHECK(OpenRank(job, rank, s.bytes, &db), "open");
        std::vector<uint32_t> members;
        for (uint32_t m = 0; m < ranks; ++m) members.push_back(m);
        RANK_CHECK(ckptdb_declare_replicas(db, 0, members.data(), ranks, protection), "declare");
        for (int v = 1; v <= versions; ++v) {
          Step(s, v);
          Barrier();
          const auto t0 = Clock::now();
          RANK_CHECK(PutAll(db, s, v, CKPTDB_PUT_REPLICATED), "put");
          g_shared->t0[rank][v] = Since(t0) * 1e3;
          Barrier();
          const auto t1 = Clock::now();
          RANK_CHECK(ckptdb_commit(db, v, 0), "commit");
          g_shared->t1[rank][v] = Since(t1) * 1e3;
        }
        // What the segment keeps: its slices' chunks and (AEC) its parity units.
        uint64_t kept = 0;
        auto add = [](void* arg, const ckptdb_tensor_desc* t) {
          *static_cast<uint64_t*>(arg) += t->kept_bytes + t->parity_bytes;
          return 0;
        };
        RANK_CHECK(ckptdb_list(db, versions, add, &kept), "list");
        g_shared->value[rank][0] = static_cast<double>(kept);
        std::vector<uint8_t> out(s.shard_bytes);
        auto restore_all = [&] {
          for (size_t i = 0; i < s.shards.size(); ++i) {
            RANK_CHECK(ckptdb_restore(db, versions, s.names[i].c_str(), out.data(), out.size(), 0),
                       "restore");
            if (std::memcmp(out.data(), s.shards[i], out.size()) != 0) {
              std::fprintf(stderr, "rank %u: %s restored wrong\n", rank, s.names[i].c_str());
              return 1;
            }
          }
          return 0;
        };
        Barrier();
        const auto t2 = Clock::now();
        if (restore_all() != 0) return 1;
        g_shared->value[rank][1] = Since(t2);
        ckptdb_stats_t st;
        ckptdb_stats(db, &st);
        g_shared->value[rank][2] = static_cast<double>(st.replica_bytes_sent);
        // Degraded: the last rank's store goes (its memory with it) and the others restore again:
        // "none" from its own copy, ARC the lost slice from the member before it, AEC decoding it
        // from the others' parity units.
        const uint32_t lost = ranks - 1;
        Barrier();
        if (rank == lost) RANK_CHECK(ckptdb_close(db), "close");
        Barrier();
        if (rank != lost) {
          const auto t3 = Clock::now();
          if (restore_all() != 0) return 1;
          g_shared->value[rank][3] = Since(t3);
        }
        Barrier();
        if (rank != 0 && rank != lost) RANK_CHECK(ckptdb_close(db), "close");
        Barrier();
        if (rank == 0) RANK_CHECK(ckptdb_close(db), "close");
        return 0;
      },
      a.timeout_s);
  fs::remove_all(job.dir);
  if (!res.ok) return res;
  double kept = 0;
  for (uint32_t r = 0; r < ranks; ++r) {
    kept += g_shared->value[r][0];
    res.restore_s.push_back(g_shared->value[r][1]);
    if (r != ranks - 1) res.degraded_s.push_back(g_shared->value[r][3]);
    res.sent += g_shared->value[r][2];
    for (int v = 2; v <= versions; ++v) {  // version 1 pays the arena's first touch
      res.capture_ms.push_back(g_shared->t0[r][v]);
      res.commit_ms.push_back(g_shared->t1[r][v]);
    }
  }
  const size_t state = (bytes + kShardBytes - 1) / kShardBytes * std::min(bytes, kShardBytes);
  res.kept_ratio = kept / (static_cast<double>(state) * ranks);
  return res;
}

void Arc(const Args& a) {
  const size_t bytes = (a.mib ? a.mib : 128) * kMiB;
  const int versions = a.versions ? a.versions : 4;
  const std::string tls = ApplyTls(a.tls.front());
  std::printf(
      "== REFT's ARC and AEC: m ranks on m nodes holding the same %zu MiB state, one replica "
      "group, no redundancy, UCX_TLS=%s; \"none\" keeps it whole, \"arc\" each rank's 2 "
      "slices, \"aec\" its slice and parity of the others', \"arc+aec\" both ==\n",
      bytes / kMiB, tls.c_str());
  Perf bw = PerfOne(tls, "ucp_am_bw", kPieceBytes, 200);
  if (bw.ok) {
    std::printf("  limit: ucx_perftest ucp_am_bw, one pair, %zu MiB messages: %.2f GB/s\n",
                kPieceBytes / kMiB, bw.gbs);
  }
  std::printf("  %-3s %-8s %8s %8s %11s %10s %10s %13s %11s %12s\n", "m", "group", "kept", "ideal",
              "capture ms", "commit ms", "restore s", "restore GB/s", "degraded s", "sent at cap");
  for (uint32_t m : a.ranks) {
    if (m < 2 || m > kMaxRanks) continue;
    struct Row {
      const char* protection;
      double ideal;  // the kept fraction REFT's arithmetic gives
      ArcResult r;
    };
    std::vector<Row> rows = {{"none", 1.0, {}}, {"arc", 2.0 / m, {}}};
    if (m >= 3) {
      rows.push_back({"aec", 1.0 / m + 1.0 / (m * (m - 1.0)), {}});
      rows.push_back({"arc+aec", 2.0 / m + 1.0 / (m * (m - 2.0)), {}});
    }
    for (Row& row : rows) row.r = ArcJob(a, m, row.protection, bytes, versions);
    for (const Row& row : rows) {
      const ArcResult& r = row.r;
      if (!r.ok) {
        std::printf("  %-3u %-8s failed (see stderr)\n", m, row.protection);
        continue;
      }
      const double restore = Median(r.restore_s);
      std::printf("  %-3u %-8s %7.1f%% %7.1f%% %11.1f %10.1f %10.3f %13.2f %11.3f %12.0f\n", m,
                  row.protection, 100 * r.kept_ratio, 100 * std::min(1.0, row.ideal),
                  Median(r.capture_ms), Median(r.commit_ms), restore, bytes / restore / 1e9,
                  Median(r.degraded_s), r.sent);
    }
    const ArcResult& none = rows[0].r;
    for (size_t i = 1; i < rows.size(); ++i) {
      const ArcResult& r = rows[i].r;
      if (!none.ok || !r.ok) continue;
      std::printf(
          "      %s / none: memory %.2f, capture %.2f, commit %.2f, restore %.2f, degraded "
          "restore %.2f\n",
          rows[i].protection, r.kept_ratio / none.kept_ratio,
          Median(r.capture_ms) / Median(none.capture_ms),
          Median(r.commit_ms) / Median(none.commit_ms),
          Median(r.restore_s) / Median(none.restore_s),
          Median(r.degraded_s) / Median(none.degraded_s));
    }
    if (none.ok && rows[1].r.ok) {
      // What arc's restores moved: every rank gathers the (1 - kept) of its state it lacks.
      const ArcResult& arc = rows[1].r;
      const double gathered = (1 - arc.kept_ratio) * static_cast<double>(bytes) * m;
      const double slowest = *std::max_element(arc.restore_s.begin(), arc.restore_s.end());
      std::printf(
          "      arc gathered %.0f MiB over the network in all, %.2f GB/s (%.0f%% of one "
          "ucp_am_bw pair)\n",
          gathered / kMiB, gathered / slowest / 1e9,
          bw.ok ? 100 * gathered / slowest / 1e9 / bw.gbs : 0.0);
    }
  }
  std::printf(
      "  (kept: the slices' chunks and parity units of the ranks' segments over their states; "
      "capture: put_shard of every shard + wait_capture; restore: every rank restores its whole "
      "state at once, the median rank; degraded: the same by the others once rank m-1's store "
      "is closed; medians over ranks and versions 2..%d)\n",
      versions);
}

void Coding(const Args& a) {
  const size_t bytes = (a.mib ? a.mib : 64) * kMiB;
  const int versions = std::clamp(a.versions ? a.versions : 6, 3, kMaxVersions - 1);
  const std::string tls = ApplyTls(a.tls.front());
  std::printf(
      "== replication against coding groups (ECHECK's comparison in miniature): %zu MiB a rank, "
      "%d versions (2 warm-up), UCX_TLS=%s; then node 1 is lost and its first rank restores ==\n",
      bytes >> 20, versions, tls.c_str());
  std::printf("  %-5s %-5s %-12s %12s %14s %12s %10s  %s\n", "nodes", "ranks", "redundancy",
              "commit ms", "memory/data", "restore s", "GB/s", "restored from");
  struct Config {
    uint32_t nodes;
    uint32_t per_node;
    std::string redundancy;
  };
  // ec:4+2 needs 6 distinct nodes: on 8 nodes it runs with 3 ranks on each (24 ranks, 4 groups
  // dealt round the nodes), beside replicate:2 on the same 24 ranks.
  std::vector<Config> configs = {{4, 1, "replicate:2"}, {4, 1, "ec:2+2"}, {4, 1, "xor:3"},
                                 {6, 1, "replicate:2"}, {6, 1, "ec:4+2"}, {8, 1, "replicate:2"},
                                 {8, 1, "ec:2+2"},      {8, 1, "ec:6+2"}, {8, 3, "replicate:2"},
                                 {8, 3, "ec:4+2"}};
  if (!a.only.empty()) {
    std::vector<Config> chosen;
    for (const Config& c : configs) {
      const std::string key =
          std::to_string(c.nodes) + "x" + std::to_string(c.per_node) + ":" + c.redundancy;
      if (key.find(a.only) != std::string::npos) chosen.push_back(c);
    }
    configs = chosen;
  }
  for (const Config& c : configs) {
    const uint32_t ranks = c.nodes * c.per_node;
    CodingResult r = CodingJob(a, ranks, c.per_node, c.redundancy, bytes, versions);
    if (!r.ok) {
      std::printf("  %-5u %-5u %-12s the job failed (see stderr)\n", c.nodes, ranks,
                  c.redundancy.c_str());
      continue;
    }
    std::printf("  %-5u %-5u %-12s %12.1f %14.3f %12.3f %10.2f  %s\n", c.nodes, ranks,
                c.redundancy.c_str(), r.commit_ms, r.overhead, r.restore_s,
                bytes / r.restore_s / 1e9, r.source.c_str());
    std::fflush(stdout);
  }
}

int main(int argc, char** argv) {
  Args a;
  std::vector<std::string> tls;
  std::vector<uint32_t> ranks;
  CLI::App app{"ckptdb's job benchmarks: ranks as processes on loopback (docs/performance.md)"};
  app.add_option("--mode", a.mode)
      ->check(CLI::IsMember({"replicate", "commit", "restore", "coding", "arc", "hostile", "all"}));
  app.add_option("--mib", a.mib, "state per rank, MiB (0: the mode's own)");
  app.add_option("--versions", a.versions, "versions per run (0: the mode's own)");
  app.add_option("--tls", tls, "\"UCX_TLS [NAME=VALUE]...\", repeatable: one run each")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--ranks", ranks, "job sizes, comma separated")
      ->delimiter(',')
      ->check(CLI::Range(1u, 1u << 16));
  app.add_option("--commit-kib", a.commit_kib);
  app.add_option("--repeats", a.repeats)->check(CLI::Range(1, 1000));
  app.add_option("--shm", a.shm);
  app.add_option("--disk", a.disk);
  app.add_option("--only", a.only, "--mode coding: the configs whose NODESxPER:REDUNDANCY has it");
  app.add_option("--timeout", a.timeout_s, "seconds a rank process may live")
      ->check(CLI::Range(1, 86400));
  CLI11_PARSE(app, argc, argv);
  if (!tls.empty()) a.tls = tls;
  if (!ranks.empty()) {
    a.ranks.clear();
    for (uint32_t r : ranks) a.ranks.push_back(std::min<uint32_t>(kMaxRanks, r));
  }
  if (a.tls.empty()) a.tls = {"tcp"};
  void* p =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    return 2;
  }
  g_shared = static_cast<Shared*>(p);
  // Heartbeats and failure detection at their defaults; a job that cannot assemble fails in 20 s.
  setenv("CKPTDB_JOIN_TIMEOUT_MS", "20000", 0);
  fs::remove_all(a.shm);
  fs::create_directories(a.shm);
  const bool all = a.mode == "all";
  if (all || a.mode == "replicate") Replicate(a);
  if (all || a.mode == "commit") {
    if (all) std::printf("\n");
    Commit(a);
  }
  if (all || a.mode == "restore") {
    if (all) std::printf("\n");
    Restore(a);
  }
  if (all || a.mode == "coding") {
    if (all) std::printf("\n");
    Coding(a);
  }
  if (all || a.mode == "arc") {
    if (all) std::printf("\n");
    Arc(a);
  }
  if (all || a.mode == "hostile") {
    if (all) std::printf("\n");
    Hostile(a);
  }
  fs::remove_all(a.shm);
  fs::remove_all(a.disk);
  return 0;
}
