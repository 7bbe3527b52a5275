// ckptdb demo --ranks R --nodes N (R > 1): GEMINI made real on one machine. R trainer processes
// on N simulated nodes (each node a node_id, a directory for its disks and one under /dev/shm for
// its memory) checkpoint every iteration into their ram tier, replicated (replicate:2) into the
// memory of a rank on another node over loopback (ckptdb's authenticated socket), with the
// cross-rank two-phase commit. Then one node is lost: its processes are SIGKILLed and its
// directories deleted, and the rest of the job is torn down the way a scheduler does it (SIGKILL;
// their memory and disks stay). The job restarts, the lost node's ranks on empty directories, every
// rank restores the latest version (the lost ones from their peers' memory) and checks it bit for
// bit against the state it recomputes. The tables show the time the trainer was blocked per
// checkpoint, the replication traffic per rank and node, and where each rank's restore came from.
//
// The parent is the scheduler: it forks the ranks through the job harness (harness/job.h: rank 0
// binds a free port for the coordinator and reports it before the others start) and reads one
// fixed-size report from each down a pipe; a byte down another pipe tells a rank to close (rank
// 0, the coordinator, last).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "harness/job.h"
#include "tools/common.h"
#include "tools/demo.h"

namespace ckpt::tools::demo {
namespace {

namespace fs = std::filesystem;

constexpr int kPlotted = 256;  // iterations whose blocked time a report carries (for the plot)
constexpr int kSyncSaves = 3;  // synchronous saves of the same state, for comparison

// What a process's threads have used (/proc/self/task/*/schedstat): the threads other than the
// trainer's (ckptdb's, RocksDB's, io_uring's workers) on a core, waiting for one, and times run;
// the trainer's own thread waiting for a core. Threads that ended before are not counted.
struct ThreadUse {
  uint64_t helper_cpu_ns = 0;
  uint64_t helper_wait_ns = 0;
  uint64_t helper_runs = 0;
  uint64_t trainer_wait_ns = 0;
  ThreadUse Since(const ThreadUse& before) const {
    return {helper_cpu_ns - before.helper_cpu_ns, helper_wait_ns - before.helper_wait_ns,
            helper_runs - before.helper_runs, trainer_wait_ns - before.trainer_wait_ns};
  }
};

// What a rank tells the scheduler after each phase. Plain data, written with one write().
struct Report {
  int32_t status = 0;  // a ckptdb status, or 1 for a failed check
  char error[1024] = {};
  uint32_t checkpoints = 0;
  double blocked_sum_ms = 0;
  double blocked_max_ms = 0;
  float blocked_ms[kPlotted] = {};  // per checkpoint, the first kPlotted
  // The same state saved the synchronous way (write + fsync to the node's disk), kSyncSaves
  // times after training, every rank at once; and read back at the restart (-1: not there).
  double sync_ms[kSyncSaves] = {};
  double sync_read_ms = -1;
  uint64_t state_bytes = 0;
  uint64_t replica_sent = 0;
  uint64_t replica_received = 0;
  uint64_t replica_ns = 0;
  uint64_t backpressure_ns = 0;
  uint64_t backpressure_waits = 0;  // chunks that found the arena full (policy block: waited)
  uint64_t direct_chunks = 0;       // written to the next tier from the trainer's buffer
  uint32_t skipped = 0;             // versions dropped (policy skip)
  uint64_t epoch = 0;
  uint64_t latest = 0;
  double open_ms = 0;
  double restore_ms = 0;
  char source[64] = {};    // the fastest source of any byte (ckptdb_stats' last_restore_tier)
  char sources[160] = {};  // where every byte came from, over all the rank's tensors
  char paths[96] = {};     // how replicas travelled to each peer (ckptdb_stats' peer_paths)
  int32_t bit_exact = 0;
  uint32_t threads = 0;  // the rank process's threads at the end of training (the trainer's own
                         // one included), from /proc/self/status
  ThreadUse used;        // over the phase, from the end of the open
};

ThreadUse ThreadUseNow() {
  ThreadUse u;
  const std::string self = std::to_string(::getpid());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/task", ec)) {
    FILE* f = std::fopen((e.path() / "schedstat").c_str(), "r");
    if (f == nullptr) continue;
    unsigned long long cpu = 0, wait = 0, runs = 0;
    const bool read = std::fscanf(f, "%llu %llu %llu", &cpu, &wait, &runs) == 3;
    std::fclose(f);
    if (!read) continue;
    if (e.path().filename() == self) {
      u.trainer_wait_ns += wait;
    } else {
      u.helper_cpu_ns += cpu;
      u.helper_wait_ns += wait;
      u.helper_runs += runs;
    }
  }
  return u;
}

// This process's threads, from /proc/self/status (0 when it cannot be read).
uint32_t ThreadCount() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned n = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "Threads: %u", &n) == 1) break;
  }
  std::fclose(f);
  return n;
}

// The memory a node's directory holds (the ram tier's arenas and its peers' replicas): the
// blocks its files use, not their sizes (an arena is sparse until written).
uint64_t BytesUsedUnder(const std::string& dir) {
  uint64_t used = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st;
    if (it->is_regular_file(ec) && ::stat(it->path().c_str(), &st) == 0) {
      used += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return used;
}

struct Job {
  ClusterArgs args;
  std::string token;
  std::shared_ptr<harness::Job> ranks;  // the processes of the current run
  int NodeOf(int rank) const { return rank * args.nodes / args.ranks; }
  std::string DiskDir(int node) const { return args.root + "/node" + std::to_string(node); }
  std::string RamDir(int node) const { return args.ram_dir + "/node" + std::to_string(node); }
};

// Where a rank's synchronous save of the comparison goes: its node's disk.
std::string SyncPath(const Job& job, int rank) {
  return job.DiskDir(job.NodeOf(rank)) + "/sync-save-r" + std::to_string(rank) + ".bin";
}

// One rank's shard of a model: bf16 parameters and their f32 Adam moments, a step counter and
// an RNG state, about mib_per_rank MiB in all.
std::vector<Tensor> BuildShard(int rank, double mib) {
  const uint64_t cols = 1024;
  uint64_t param_bytes = static_cast<uint64_t>(mib * 1048576.0 / 5);  // moments are 4x
  uint64_t rows = std::max<uint64_t>(1, param_bytes / 4 / (cols * 2));
  std::vector<Tensor> out;
  for (int l = 0; l < 4; ++l) {
    std::string p = "layers." + std::to_string(l) + ".mlp.w.shard" + std::to_string(rank);
    // A partial last chunk in every tensor: 3 extra rows.
    uint64_t r = rows + 3;
    out.push_back(Tensor{p, CKPTDB_DTYPE_BF16, {r, cols}, r * cols * 2});
    out.push_back(Tensor{"optimizer.exp_avg." + p, CKPTDB_DTYPE_F32, {r, cols}, r * cols * 4});
    out.push_back(Tensor{"optimizer.exp_avg_sq." + p, CKPTDB_DTYPE_F32, {r, cols}, r * cols * 4});
  }
  out.push_back(Tensor{"optimizer.step", CKPTDB_DTYPE_I64, {}, 8});
  out.push_back(Tensor{"rng.cpu_state", CKPTDB_DTYPE_U8, {5056}, 5056});
  return out;
}

bool Aor(const std::string& protection) {
  return protection == "aor" || protection.ends_with("+aor");
}

// What a rank holds and puts: its own shard; or with a replica group (--protection) the one
// data-parallel state every rank holds, replicated; with AOR that state's parameters replicated,
// the optimizer's moments and step its own (ZeRO-1), and the next rank's moments and step
// recomputed: stepped here by the same update from the same seed, as a keeper would apply the
// owner's optimizer update from the gradients it has too.
std::vector<Tensor> RankState(const Job& job, int rank) {
  const double mib = job.args.mib_per_rank;
  auto seeded = [](std::vector<Tensor> shard, int state) {
    for (size_t i = 0; i < shard.size(); ++i) shard[i].seed = uint64_t(state + 1) * 1000 + i + 1;
    return shard;
  };
  if (job.args.protection.empty()) return seeded(BuildShard(rank, mib), rank);
  std::vector<Tensor> out;
  for (Tensor& t : seeded(BuildShard(0, mib), 0)) {
    if (Aor(job.args.protection) && t.name.starts_with("optimizer.")) continue;
    t.flags = CKPTDB_PUT_REPLICATED;
    out.push_back(std::move(t));
  }
  if (!Aor(job.args.protection)) return out;
  const int next = (rank + 1) % job.args.ranks;
  for (int state : {rank, next}) {
    for (Tensor& t : seeded(BuildShard(state, mib), state)) {
      if (!t.name.starts_with("optimizer.")) continue;
      if (t.name == "optimizer.step") t.name += ".rank" + std::to_string(state);
      t.flags = state == rank ? 0u : unsigned{CKPTDB_PUT_RECOMPUTED};
      t.own = state == rank;
      out.push_back(std::move(t));
    }
  }
  return out;
}

void SeedShard(std::vector<Tensor>& shard) {
  for (Tensor& t : shard) Seed(t, t.seed);
}

void SetError(Report* r, int status, const std::string& what) {
  r->status = status;
  std::snprintf(r->error, sizeof r->error, "%s", what.c_str());
}

int OpenRank(const Job& job, int rank, uint64_t version_bytes, ckptdb** db) {
  const int node = job.NodeOf(rank);
  std::error_code ec;
  fs::create_directories(job.RamDir(node), ec);
  fs::create_directories(job.DiskDir(node), ec);
  // Four versions fit in the arena: the two it keeps, one being demoted, one being captured.
  std::string tiers = "ram:" + std::to_string((4 * version_bytes >> 20) + 16) +
                      "M,keep=2,dir=" + job.RamDir(node) + ";disk:" + job.DiskDir(node) +
                      "/disk-r" + std::to_string(rank) + ",every=5,keep=2";
  std::string root = job.DiskDir(node) + "/rank" + std::to_string(rank);
  std::string node_id = "node" + std::to_string(node);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = static_cast<uint32_t>(rank);
  o.world_size = static_cast<uint32_t>(job.args.ranks);
  o.node_id = node_id.c_str();
  const std::string coordinator = job.ranks->CoordinatorFor(static_cast<uint32_t>(rank));
  o.coordinator = coordinator.c_str();
  o.job_token = job.token.c_str();
  o.redundancy = job.args.redundancy.c_str();
  o.staging_bytes = 16 << 20;
  if (!job.args.backpressure.empty()) o.backpressure = job.args.backpressure.c_str();
  // A replica group cuts shards into slices of whole chunks: small chunks, so that the demo's
  // tensors of a few MiB are spread over the members rather than left whole in the last slice.
  if (!job.args.protection.empty()) o.chunk_bytes = 256 << 10;
  setenv("CKPTDB_UCX_TLS", job.args.tls.c_str(), 1);
  // The trainer reports each iteration's start (ckptdb_hint): a short profile, so that the
  // demo's ten iterations replicate in the planned idle spans (GEMINI's interleaving).
  setenv("CKPTDB_INTERLEAVE_PROFILE", "3", 0);
  int rc = ckptdb_open(&o, db);
  if (rc != CKPTDB_OK || job.args.protection.empty()) return rc;
  // REFT: all ranks are one replica group, declared again at every open, before any put.
  std::vector<uint32_t> members;
  for (int r = 0; r < job.args.ranks; ++r) members.push_back(static_cast<uint32_t>(r));
  rc = ckptdb_declare_replicas(*db, 0, members.data(), members.size(), job.args.protection.c_str());
  if (rc != CKPTDB_OK) {
    ckptdb_close(*db);
    *db = nullptr;
  }
  return rc;
}

uint64_t VersionBytes(const std::vector<Tensor>& shard) {
  uint64_t total = 0;
  for (const Tensor& t : shard) total += t.bytes;
  return total + (total >> 10) + shard.size() * 8192 + (1 << 20);
}

// Phase 1: train `iterations` iterations, one checkpoint each (put, lazy capture during the
// next compute phase, wait_capture before the optimizer step, asynchronous commit).
void Train(const Job& job, int rank, ckptdb* db, std::vector<Tensor>& shard, Report* r) {
  double put_ms = 0;
  const bool skipping = job.args.backpressure == "skip";
  for (int it = 1; it <= job.args.iterations + 1; ++it) {
    // The forward and backward pass runs on the GPU: the host's cores stay free for capture
    // and replication (four ranks spinning on this machine's two cores would measure the
    // scheduler, not ckptdb). The demo's trainer has no collectives of its own: one idle span
    // an iteration, which the replication is planned into.
    (void)ckptdb_hint(db, CKPTDB_HINT_ITERATION);
    std::this_thread::sleep_for(std::chrono::milliseconds(job.args.compute_ms));
    if (it > 1) {
      uint64_t version = static_cast<uint64_t>(it - 1);
      auto w0 = std::chrono::steady_clock::now();
      int rc = ckptdb_wait_capture(db, version, -1);
      if (rc == CKPTDB_OK) rc = ckptdb_commit(db, version, CKPTDB_COMMIT_ASYNC);
      // Back-pressure's skip dropped it here (ESKIPPED, counted in ckptdb_stats) or on another
      // rank (the coordinator aborted it: ESTATE): the newest version protected stays the one
      // to restore, and training goes on.
      const bool dropped = rc == CKPTDB_ESKIPPED || (skipping && rc == CKPTDB_ESTATE);
      if (rc != CKPTDB_OK && !dropped)
        return SetError(r, rc, "v" + std::to_string(version) + ": " + ErrorText(rc));
      double blocked = put_ms + Seconds(std::chrono::steady_clock::now() - w0) * 1e3;
      r->blocked_sum_ms += blocked;
      r->blocked_max_ms = std::max(r->blocked_max_ms, blocked);
      if (r->checkpoints < kPlotted) r->blocked_ms[r->checkpoints] = static_cast<float>(blocked);
      r->checkpoints++;
    }
    if (it > job.args.iterations) break;
    for (Tensor& t : shard) Step(t, static_cast<uint64_t>(it));
    auto p0 = std::chrono::steady_clock::now();
    for (const Tensor& t : shard) {
      ckptdb_tensor_info info = InfoOf(t);
      int rc = ckptdb_put_shard(db, static_cast<uint64_t>(it), t.name.c_str(), t.data, t.bytes,
                                &info, t.flags);
      if (skipping && (rc == CKPTDB_ESKIPPED || rc == CKPTDB_ESTATE)) break;  // dropped already
      if (rc != CKPTDB_OK) return SetError(r, rc, "put " + t.name + ": " + ErrorText(rc));
    }
    put_ms = Seconds(std::chrono::steady_clock::now() - p0) * 1e3;
  }
  // Every version decided (a version a rank skipped is aborted for every rank): the newest
  // committed one is what the restart restores.
  int rc = CKPTDB_OK;
  for (int v = skipping ? 1 : job.args.iterations; v <= job.args.iterations; ++v) {
    rc = ckptdb_wait_commit(db, static_cast<uint64_t>(v), nullptr, 120000);
    if (skipping && (rc == CKPTDB_ESKIPPED || rc == CKPTDB_ESTATE)) rc = CKPTDB_OK;
    if (rc != CKPTDB_OK) return SetError(r, rc, "wait_commit: " + ErrorText(rc));
  }
  rc = ckptdb_latest(db, &r->latest);  // what the restart must restore
  if (rc != CKPTDB_OK) return SetError(r, rc, "latest: " + ErrorText(rc));
  // The comparison, in the same run: the same state saved the way a trainer without ckptdb does
  // (torch.save to the node's disk: write, then fsync), what that blocks the trainer for; every
  // rank at once, as a job checkpoints. The last file stays for the restart to read back.
  const std::string path = SyncPath(job, rank);
  for (int i = 0; i < kSyncSaves; ++i) {
    r->sync_ms[i] = SyncWriteSeconds(shard, path) * 1e3;
    if (r->sync_ms[i] < 0) return SetError(r, CKPTDB_EIO, "a synchronous save to " + path);
  }
}

// The comparison's restart: the rank's synchronous save read back from the node's disk, cold
// (gone with a lost node). Before the store opens, so that no rank's read overlaps another's
// restore: every restore starts once the job has assembled, that is once every rank has opened.
void ReadBackSyncSave(const Job& job, int rank, const std::vector<Tensor>& shard, Report* r) {
  uint64_t saved = 0;
  for (const Tensor& t : shard) saved += t.bytes;
  if (uint8_t* into = Allocate(saved); into != nullptr) {
    const double s = ColdReadSeconds(SyncPath(job, rank), into, saved);
    r->sync_read_ms = s < 0 ? -1 : s * 1e3;
    Free(into, saved);
  }
}

// Phase 2: the restarted rank restores the latest version and checks every byte against the
// state recomputed from the seed.
void Restore(const Job& job, int rank, ckptdb* db, std::vector<Tensor>& shard, Report* r) {
  int rc = ckptdb_latest(db, &r->latest);
  if (rc != CKPTDB_OK) return SetError(r, rc, "latest: " + ErrorText(rc));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, uint64_t>> by_source;  // in the order first seen
  for (Tensor& t : shard) {
    if (!t.own) continue;  // a recomputed replica of another rank's: that rank restores it
    rc = ckptdb_restore(db, r->latest, t.name.c_str(), t.restored, t.bytes, 0);
    if (rc != CKPTDB_OK) return SetError(r, rc, "restore " + t.name + ": " + ErrorText(rc));
    ckptdb_stats_t st;
    if (ckptdb_stats(db, &st) != CKPTDB_OK) continue;
    std::string list = st.last_restore_sources;  // "SOURCE BYTES; SOURCE BYTES..."
    for (size_t at = 0; at < list.size();) {
      size_t end = std::min(list.find("; ", at), list.size());
      size_t space = list.rfind(' ', end - 1);
      if (space == std::string::npos || space < at) break;
      std::string source = list.substr(at, space - at);
      uint64_t bytes = std::strtoull(list.c_str() + space + 1, nullptr, 10);
      auto it = std::find_if(by_source.begin(), by_source.end(),
                             [&](const auto& e) { return e.first == source; });
      if (it == by_source.end()) {
        by_source.emplace_back(source, bytes);
      } else {
        it->second += bytes;
      }
      at = end + 2;
    }
  }
  r->restore_ms = Seconds(std::chrono::steady_clock::now() - t0) * 1e3;
  std::string text;
  for (const auto& [source, bytes] : by_source) {
    char part[96];
    std::snprintf(part, sizeof part, "%s%s %.1f MiB", text.empty() ? "" : ", ", source.c_str(),
                  static_cast<double>(bytes) / (1 << 20));
    text += part;
  }
  std::snprintf(r->sources, sizeof r->sources, "%s", text.c_str());
  SeedShard(shard);
  for (uint64_t it = 1; it <= r->latest; ++it) {
    for (Tensor& t : shard) Step(t, it);
  }
  r->bit_exact = 1;
  for (const Tensor& t : shard) {
    if (t.own && std::memcmp(t.data, t.restored, t.bytes) != 0) {
      r->bit_exact = 0;
      SetError(r, 1, t.name + " differs from the state of v" + std::to_string(r->latest));
    }
  }
}

// The kill campaign's rank (phase 3): restores the job's latest version if there is one and
// checks it bit for bit, reports, then trains from there, committing every iteration, and
// writes each version whose commit returned Ok (8 bytes) down the report pipe, until the
// scheduler SIGKILLs it. A failed commit (a peer died) ends its training; it waits to be killed.
void Campaign(const Job& job, int rank, ckptdb* db, std::vector<Tensor>& shard, Report* r,
              int report_fd) {
  int rc = ckptdb_latest(db, &r->latest);
  if (rc == CKPTDB_ENOTFOUND) {
    r->latest = 0;  // a new job
    r->bit_exact = 1;
  } else if (rc != CKPTDB_OK) {
    return SetError(r, rc, "latest: " + ErrorText(rc));
  } else {
    Restore(job, rank, db, shard, r);
    if (r->status != 0) return;
  }
  if (write(report_fd, r, sizeof *r) != static_cast<ssize_t>(sizeof *r)) return;
  r->status = -1;  // reported already
  for (uint64_t it = r->latest + 1;; ++it) {
    std::this_thread::sleep_for(std::chrono::milliseconds(job.args.compute_ms));
    for (Tensor& t : shard) Step(t, it);
    for (const Tensor& t : shard) {
      ckptdb_tensor_info info = InfoOf(t);
      if (ckptdb_put_shard(db, it, t.name.c_str(), t.data, t.bytes, &info, t.flags) != CKPTDB_OK) {
        return;
      }
    }
    if (ckptdb_commit(db, it, 0) != CKPTDB_OK) return;
    if (write(report_fd, &it, sizeof it) != static_cast<ssize_t>(sizeof it)) return;
  }
}

// A rank process: runs its phase, reports, then waits for the word to close (or its SIGKILL).
int RankMain(const Job& job, int rank, int phase, int report_fd, int control_fd) {
  alarm(600);  // never outlive a scheduler that went away
  std::vector<Tensor> shard = RankState(job, rank);
  Report r;
  for (Tensor& t : shard) {
    t.data = Allocate(t.bytes);
    t.restored = phase >= 2 ? Allocate(t.bytes) : nullptr;
    r.state_bytes += t.bytes;
    if (t.data == nullptr || (phase >= 2 && t.restored == nullptr)) {
      SetError(&r, CKPTDB_ENOMEM, "cannot allocate " + t.name);
    }
  }
  ckptdb* db = nullptr;
  ThreadUse at_open;  // the phase's use starts after the open (its own threads start in it)
  if (r.status == 0) {
    SeedShard(shard);
    if (phase == 2) ReadBackSyncSave(job, rank, shard, &r);
    auto o0 = std::chrono::steady_clock::now();
    int rc = OpenRank(job, rank, VersionBytes(shard), &db);
    r.open_ms = Seconds(std::chrono::steady_clock::now() - o0) * 1e3;
    at_open = ThreadUseNow();
    if (rc != CKPTDB_OK) {
      db = nullptr;
      SetError(&r, rc, "open: " + ErrorText(rc));
    }
  }
  if (db != nullptr) {
    if (phase == 1) Train(job, rank, db, shard, &r);
    if (phase == 2) Restore(job, rank, db, shard, &r);
    if (phase == 3) {
      Campaign(job, rank, db, shard, &r, report_fd);
      if (r.status == -1) {  // reported, trained until its commit failed: wait for the kill
        char word = 0;
        (void)!read(control_fd, &word, 1);
        return 1;
      }
    }
    ckptdb_stats_t st;
    if (ckptdb_stats(db, &st) == CKPTDB_OK) {
      r.replica_sent = st.replica_bytes_sent;
      r.replica_received = st.replica_bytes_received;
      r.replica_ns = st.replica_ns;
      r.backpressure_ns = st.backpressure_wait_ns;
      r.backpressure_waits = st.backpressure_waits;
      r.direct_chunks = st.direct_chunks;
      r.skipped = static_cast<uint32_t>(st.skipped_versions);
      r.epoch = st.epoch;
      std::snprintf(r.source, sizeof r.source, "%s", st.last_restore_tier);
      std::snprintf(r.paths, sizeof r.paths, "%s", st.peer_paths);
    }
    r.threads = ThreadCount();
    r.used = ThreadUseNow().Since(at_open);
  }
  if (write(report_fd, &r, sizeof r) != static_cast<ssize_t>(sizeof r)) return 3;
  char word = 0;
  if (read(control_fd, &word, 1) != 1) word = 'k';  // the scheduler is gone: close anyway
  int rc = db != nullptr ? ckptdb_close(db) : CKPTDB_OK;
  return r.status == 0 && rc == CKPTDB_OK ? 0 : 1;
}

struct Proc {
  harness::Job* job = nullptr;  // the run it belongs to, which forked it and reaps it
  uint32_t rank = 0;
  bool running = false;  // not reaped yet
  int report_fd = -1;
  int control_fd = -1;
  Report report;
  bool reported = false;
  void Kill() const {
    if (running) job->Kill(rank);
  }
  int Wait() {  // its exit code, reaping it
    running = false;
    return job->Wait(rank);
  }
};

std::vector<Proc> Spawn(const Job& job, int phase) {
  const int ranks = job.args.ranks;
  std::vector<Proc> procs(ranks);
  // Each rank's two pipes, made before any fork: the scheduler keeps the ends in Proc, the rank
  // those in child_ends (its report's write end, its control's read end) and closes the rest.
  std::vector<std::pair<int, int>> child_ends(ranks, {-1, -1});
  auto close_all = [&] {
    for (int k = 0; k < ranks; ++k) {
      for (int fd :
           {procs[k].report_fd, procs[k].control_fd, child_ends[k].first, child_ends[k].second}) {
        if (fd >= 0) close(fd);
      }
    }
  };
  for (int rank = 0; rank < ranks; ++rank) {
    int report[2], control[2];
    if (pipe2(report, O_CLOEXEC) != 0) {
      std::perror("ckptdb demo: starting a rank");
      close_all();
      return {};
    }
    procs[rank].report_fd = report[0];
    child_ends[rank].first = report[1];
    if (pipe2(control, O_CLOEXEC) != 0) {
      std::perror("ckptdb demo: starting a rank");
      close_all();
      return {};
    }
    procs[rank].control_fd = control[1];
    child_ends[rank].second = control[0];
  }
  harness::RunOptions options;
  options.alarm_s = 0;  // the scheduler kills what it must
  options.report_timeout_ms = 120000;
  job.ranks->Start(
      [&](uint32_t rank) {
        const std::pair<int, int> mine = child_ends[rank];
        child_ends[rank] = {-1, -1};
        close_all();
        return RankMain(job, static_cast<int>(rank), phase, mine.first, mine.second);
      },
      options);
  for (int rank = 0; rank < ranks; ++rank) {
    close(child_ends[rank].first);
    close(child_ends[rank].second);
    procs[rank].job = job.ranks.get();
    procs[rank].rank = static_cast<uint32_t>(rank);
    procs[rank].running = true;
  }
  return procs;
}

// Reads every rank's report, or notes which rank died or stayed silent past the deadline.
bool Collect(std::vector<Proc>& procs, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool ok = true;
  for (size_t rank = 0; rank < procs.size(); ++rank) {
    Proc& p = procs[rank];
    size_t got = 0;
    auto* out = reinterpret_cast<char*>(&p.report);
    while (got < sizeof p.report) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      pollfd pfd{p.report_fd, POLLIN, 0};
      if (left <= 0 || poll(&pfd, 1, left) <= 0) break;
      ssize_t n = read(p.report_fd, out + got, sizeof p.report - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    p.reported = got == sizeof p.report;
    if (!p.reported) {
      std::fprintf(stderr, "ckptdb demo: rank %zu %s\n", rank,
                   got == 0 ? "died or stayed silent" : "sent a short report");
      ok = false;
    } else if (p.report.status != 0) {
      std::fprintf(stderr, "ckptdb demo: rank %zu: %s\n", rank, p.report.error);
      ok = false;
    }
  }
  return ok;
}

void KillAll(std::vector<Proc>& procs, const std::vector<int>& ranks) {
  if (procs.empty()) return;  // Spawn failed, and cleaned up after itself
  for (int rank : ranks) procs[rank].Kill();
  for (int rank : ranks) {
    if (procs[rank].running) procs[rank].Wait();
    close(procs[rank].report_fd);
    close(procs[rank].control_fd);
  }
}

// Closes every rank, the coordinator (rank 0) last; true when all exited 0.
bool CloseAll(std::vector<Proc>& procs) {
  bool ok = true;
  for (size_t i = 1; i <= procs.size(); ++i) {
    Proc& p = procs[i % procs.size()];
    if (!p.running) continue;
    (void)!write(p.control_fd, "c", 1);
    ok &= p.Wait() == 0;
    close(p.report_fd);
    close(p.control_fd);
  }
  return ok;
}

// ---- The kill campaign (ckptdb demo --kill-rounds N) ----

// Reads, for up to ms milliseconds, the versions campaign ranks write as their commits return;
// confirmed[rank] is the newest. A pipe at end of file (its rank died) is closed.
void PollProgress(std::vector<Proc>& procs, std::vector<uint64_t>* confirmed, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> ranks;
    for (size_t r = 0; r < procs.size(); ++r) {
      if (procs[r].report_fd < 0) continue;
      fds.push_back({procs[r].report_fd, POLLIN, 0});
      ranks.push_back(r);
    }
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    // Past the deadline only what is already there is read (a drain asks for 10 ms at a time).
    if (fds.empty() || poll(fds.data(), fds.size(), std::max(left, 0)) <= 0) return;
    if (left < 0 && ms > 0) return;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Proc& p = procs[ranks[i]];
      uint64_t version = 0;
      // Writes of 8 bytes to a pipe are atomic: a read gets whole ones.
      if (read(p.report_fd, &version, sizeof version) != static_cast<ssize_t>(sizeof version)) {
        close(p.report_fd);
        p.report_fd = -1;
        continue;
      }
      (*confirmed)[ranks[i]] = std::max((*confirmed)[ranks[i]], version);
    }
  }
}

// SIGKILLs the ranks, then reads what they wrote before they died.
void KillAndDrain(std::vector<Proc>& procs, const std::vector<int>& ranks,
                  std::vector<uint64_t>* confirmed) {
  for (int rank : ranks) procs[rank].Kill();
  for (int rank : ranks) {
    Proc& p = procs[rank];
    if (p.running) p.Wait();
    if (p.control_fd >= 0) close(p.control_fd);
    p.control_fd = -1;
  }
  for (int i = 0; i < 1000; ++i) {
    bool open = false;
    for (int rank : ranks) open |= procs[rank].report_fd >= 0;
    if (!open) break;
    PollProgress(procs, confirmed, 10);
  }
}

std::string RandomToken() {
  unsigned char bytes[16] = {};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!read(fd, bytes, sizeof bytes);
    close(fd);
  }
  std::string out;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    out += hex;
  }
  return out;
}

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

// The blackbox crash test (RocksDB's, for a job): rounds of start, restore, train, fault. Each
// round starts every rank on the nodes' directories as the last round left them; each restores
// the job's latest version and checks it bit for bit against the state it recomputes, then
// trains, committing every iteration. The scheduler then SIGKILLs one rank, the coordinator
// (rank 0), a whole node (its ranks, and its memory and disk directories deleted), every rank,
// or one rank while the job is still starting, at a random time, and tears the rest of the job
// down (SIGKILL). Checked at every restart: every rank gets the same latest; it is at least the
// newest version whose commit returned Ok on some rank, and at most one past the oldest
// version every rank confirmed; every byte matches; and before a node loss and after the last
// round the job commits again (every rank, within 60 s). A node is lost only once every rank has
// committed a version in the round, so that version has all its replicas (replicate:2 keeps one
// loss survivable); rank and job kills come at any time, restarts included.
int RunKillCampaign(const Job& job_in, uint64_t seed) {
  Job job = job_in;
  const ClusterArgs& a = job.args;
  std::mt19937_64 rng(seed);
  std::printf(
      "ckptdb demo --kill-rounds %d: %d ranks on %d simulated nodes, %.1f MiB per rank, %s, a "
      "checkpoint every %d ms of compute, seed %llu\n",
      a.kill_rounds, a.ranks, a.nodes, a.mib_per_rank, a.redundancy.c_str(), a.compute_ms,
      static_cast<unsigned long long>(seed));
  enum Fault { kRank, kCoordinator, kNode, kJob, kDuringStart, kFaults };
  const char* names[kFaults] = {"one rank killed", "the coordinator killed", "a node lost",
                                "every rank killed", "a rank killed while the job starts"};
  int counts[kFaults] = {};
  uint64_t guaranteed = 0;  // newest version whose commit returned Ok somewhere
  uint64_t upper = 0;       // newest version that may have committed
  uint64_t commits = 0;
  std::vector<int> all;
  for (int r = 0; r < a.ranks; ++r) all.push_back(r);
  for (int round = 1; round <= a.kill_rounds + 1; ++round) {
    const bool last = round == a.kill_rounds + 1;
    const Fault fault = last ? kFaults : static_cast<Fault>(rng() % kFaults);
    std::vector<Proc> procs = Spawn(job, 3);
    std::vector<uint64_t> confirmed(a.ranks, 0);
    if (static_cast<int>(procs.size()) != a.ranks) {
      std::fprintf(stderr, "ckptdb demo: cannot start the ranks\n");
      return kExitProblem;
    }
    if (fault == kDuringStart) {
      // The kill lands anywhere: in the open, the recovery, the restore or the training after;
      // the others run on a moment (their commits stall on the dead rank), then are killed too.
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1500));
      const int victim = static_cast<int>(rng() % a.ranks);
      procs[victim].Kill();
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
      for (Proc& p : procs) p.Kill();
      // Then what each wrote: its report, if it got that far, and the versions it committed.
      bool all_reported = true;
      std::vector<uint64_t> told;  // the latest each reporting rank was told
      uint64_t newest = 0, oldest = UINT64_MAX;
      for (Proc& p : procs) {
        p.Wait();
        close(p.control_fd);
        std::string bytes;
        char buffer[4096];
        for (ssize_t n; (n = read(p.report_fd, buffer, sizeof buffer)) > 0;)
          bytes.append(buffer, n);
        close(p.report_fd);
        if (bytes.size() < sizeof(Report)) {
          all_reported = false;
          continue;
        }
        std::memcpy(&p.report, bytes.data(), sizeof(Report));
        if (p.report.status == 1) {  // restored, and the bytes are not the version's
          std::fprintf(stderr, "ckptdb demo: round %d: %s\n", round, p.report.error);
          return kExitProblem;
        }
        if (p.report.status != 0) {
          // Its open, latest or restore failed as the victim died (the coordinator, or the
          // peer it was reading from): it never trained, so no version committed after.
          all_reported = false;
          continue;
        }
        told.push_back(p.report.latest);
        uint64_t mine = p.report.latest;
        for (size_t at = sizeof(Report); at + 8 <= bytes.size(); at += 8) {
          std::memcpy(&mine, bytes.data() + at, 8);
        }
        newest = std::max(newest, mine);
        oldest = std::min(oldest, mine);
      }
      // The ranks that got as far as their restore were told one latest, within the bounds.
      for (uint64_t latest : told) {
        if (latest != told.front() || latest < guaranteed || latest > upper) {
          std::fprintf(stderr,
                       "ckptdb demo: round %d: a rank was told latest v%llu (another v%llu); a "
                       "commit of v%llu returned Ok and nothing above v%llu can have committed\n",
                       round, static_cast<unsigned long long>(latest),
                       static_cast<unsigned long long>(told.front()),
                       static_cast<unsigned long long>(guaranteed),
                       static_cast<unsigned long long>(upper));
          return kExitProblem;
        }
      }
      counts[fault]++;
      if (all_reported) {  // else no version could commit: each needs every rank's vote
        commits += newest - told.front();
        guaranteed = std::max(guaranteed, newest);
        upper = std::max(upper, oldest + 1);
      }
      std::printf("round %3d: rank %d killed at a random time after the restart began (%s)\n",
                  round, victim,
                  all_reported
                      ? ("every rank had restored v" + std::to_string(told.front()) +
                         " bit for bit; committed up to v" + std::to_string(newest))
                            .c_str()
                      : (std::to_string(told.size()) + " of the ranks had restored").c_str());
      continue;
    }
    // Every rank restored: check what it found.
    bool ok = Collect(procs, 300);
    uint64_t latest = procs[0].report.latest;
    for (int r = 0; r < a.ranks && ok; ++r) {
      const Report& p = procs[r].report;
      if (p.latest != latest) {
        std::fprintf(stderr, "ckptdb demo: round %d: rank %d was told latest v%llu, rank 0 v%llu\n",
                     round, r, static_cast<unsigned long long>(p.latest),
                     static_cast<unsigned long long>(latest));
        ok = false;
      } else if (!p.bit_exact) {
        std::fprintf(stderr, "ckptdb demo: round %d: rank %d restored other bytes than v%llu's\n",
                     round, r, static_cast<unsigned long long>(latest));
        ok = false;
      }
    }
    if (ok && (latest < guaranteed || latest > upper)) {
      std::fprintf(stderr,
                   "ckptdb demo: round %d: latest is v%llu; a commit of v%llu returned Ok and "
                   "nothing above v%llu can have committed\n",
                   round, static_cast<unsigned long long>(latest),
                   static_cast<unsigned long long>(guaranteed),
                   static_cast<unsigned long long>(upper));
      ok = false;
    }
    if (!ok) {
      KillAndDrain(procs, all, &confirmed);
      std::fprintf(stderr, "ckptdb demo: FAILED in round %d\n", round);
      return kExitProblem;
    }
    std::fill(confirmed.begin(), confirmed.end(), latest);
    // The job must make progress again: before a node is lost (so that the version every rank
    // committed has all its replicas) and after the last round, every rank commits a version.
    auto every_rank_committed = [&] {
      for (int i = 0; i < 600; ++i) {
        if (*std::min_element(confirmed.begin(), confirmed.end()) > latest) return true;
        PollProgress(procs, &confirmed, 100);
      }
      KillAndDrain(procs, all, &confirmed);
      std::fprintf(stderr,
                   "ckptdb demo: round %d: restored v%llu, but not every rank committed a "
                   "version in the 60 s after\n",
                   round, static_cast<unsigned long long>(latest));
      return false;
    };
    if (last) {
      if (!every_rank_committed()) return kExitProblem;
      KillAndDrain(procs, all, &confirmed);
      std::printf(
          "round %3d: latest v%llu on every rank, bit for bit; then every rank committed "
          "v%llu\n",
          round, static_cast<unsigned long long>(latest),
          static_cast<unsigned long long>(latest + 1));
      break;
    }
    // Train, then the fault.
    const auto t0 = std::chrono::steady_clock::now();
    if (fault == kNode && !every_rank_committed()) return kExitProblem;
    PollProgress(procs, &confirmed, static_cast<int>(100 + rng() % 1400));
    std::string what;
    if (fault == kRank) {
      const int victim = 1 + static_cast<int>(rng() % (a.ranks - 1));
      KillAndDrain(procs, {victim}, &confirmed);
      what = "rank " + std::to_string(victim) + " killed";
    } else if (fault == kCoordinator) {
      KillAndDrain(procs, {0}, &confirmed);
      what = "rank 0 (the coordinator) killed";
    } else if (fault == kNode) {
      const int node = static_cast<int>(rng() % a.nodes);
      std::vector<int> victims;
      for (int r = 0; r < a.ranks; ++r) {
        if (job.NodeOf(r) == node) victims.push_back(r);
      }
      KillAndDrain(procs, victims, &confirmed);
      std::error_code ec;
      fs::remove_all(job.DiskDir(node), ec);
      fs::remove_all(job.RamDir(node), ec);
      what = "node" + std::to_string(node) + " lost (its ranks killed, its memory and disks wiped)";
    } else {
      what = "every rank killed";
    }
    const double at_s = Seconds(std::chrono::steady_clock::now() - t0);
    // The survivors run on a moment (their commits stall on the dead), then the job is torn
    // down as a scheduler does it.
    PollProgress(procs, &confirmed, static_cast<int>(rng() % 300));
    KillAndDrain(procs, all, &confirmed);
    counts[fault]++;
    const uint64_t newest = *std::max_element(confirmed.begin(), confirmed.end());
    const uint64_t oldest = *std::min_element(confirmed.begin(), confirmed.end());
    commits += newest - latest;
    guaranteed = std::max(guaranteed, newest);
    upper = std::max(upper, oldest + 1);
    std::printf("round %3d: restored v%llu bit for bit; committed up to v%llu; %s after %.2f s\n",
                round, static_cast<unsigned long long>(latest),
                static_cast<unsigned long long>(newest), what.c_str(), at_s);
    std::fflush(stdout);
  }
  std::printf("\nok: %d rounds (", a.kill_rounds);
  for (int f = 0; f < kFaults; ++f) std::printf("%s%d %s", f ? ", " : "", counts[f], names[f]);
  std::printf(
      "), %llu versions committed in all; every restart restored the same latest on every rank, "
      "bit for bit, never older than a commit that returned Ok\n",
      static_cast<unsigned long long>(commits));
  return kExitOk;
}

}  // namespace

int RunClusterDemo(const ClusterArgs& a) {
  Job job{a, RandomToken(), nullptr};
  if (a.ranks < 2 || a.nodes < 2 || a.nodes > a.ranks) {
    std::fprintf(stderr,
                 "ckptdb demo: --ranks %d --nodes %d: a job needs 2 <= nodes <= ranks (replicas "
                 "go to another node; use --ranks 1 for the single-trainer demo)\n",
                 a.ranks, a.nodes);
    return kExitUsage;
  }
  const bool aec = a.protection.find("aec") != std::string::npos;
  if (!a.protection.empty() && (a.nodes != a.ranks || (aec && a.ranks < 3))) {
    std::fprintf(stderr,
                 "ckptdb demo: --protection %s --ranks %d --nodes %d: a replica group needs one "
                 "rank per node (nodes = ranks)%s\n",
                 a.protection.c_str(), a.ranks, a.nodes,
                 aec ? ", and 3 or more of them with AEC" : "");
    return kExitUsage;
  }
  if (job.args.kill_node < 0) job.args.kill_node = a.nodes - 1;
  if (job.args.kill_node >= a.nodes) {
    std::fprintf(stderr, "ckptdb demo: --kill-node %d: choose a node from 0 to %d\n",
                 job.args.kill_node, a.nodes - 1);
    return kExitUsage;
  }
  job.ranks = std::make_shared<harness::Job>(static_cast<uint32_t>(a.ranks));
  job.ranks->set_coordinator_port(a.port);
  const std::string coordinator =
      a.port > 0 ? "127.0.0.1:" + std::to_string(a.port) : "127.0.0.1 (a free port rank 0 reports)";
  signal(SIGPIPE, SIG_IGN);  // a rank that died must not take the scheduler with it
  std::error_code ec;
  fs::remove_all(a.root, ec);
  fs::remove_all(a.ram_dir, ec);
  if (a.kill_rounds > 0) return RunKillCampaign(job, a.seed);
  const int victim = job.args.kill_node;

  std::vector<Tensor> probe = BuildShard(0, a.mib_per_rank);
  uint64_t state_bytes = 0;
  for (const Tensor& t : probe) state_bytes += t.bytes;
  std::printf(
      "ckptdb demo: %d ranks on %d simulated nodes, %.1f MiB of state per rank, %d iterations "
      "of %d ms compute (a sleep: the GPU's work), a checkpoint every iteration\n",
      a.ranks, a.nodes, MiB(state_bytes), a.iterations, a.compute_ms);
  std::printf(
      "each node: memory %s/nodeK (ram tier, keep=2, and peers' replicas), disks %s/nodeK "
      "(catalogs; disk tier every=5)\n",
      a.ram_dir.c_str(), a.root.c_str());
  const bool coded = a.redundancy.rfind("replicate:", 0) != 0;
  if (!a.protection.empty()) {
    // The part before "+aor" protects the replicated state ("aor" alone: "arc").
    std::string kept = a.protection;
    if (Aor(kept)) kept = kept == "aor" ? "arc" : kept.substr(0, kept.size() - 4);
    std::string reft = kept == "arc+aec" ? "arc --reft aec" : kept;
    uint64_t own = 0, shared = 0;
    for (const Tensor& t : RankState(job, 0)) {
      if (t.own) (t.flags & CKPTDB_PUT_REPLICATED ? shared : own) += t.bytes;
    }
    char share[64] = "";
    if (Aor(a.protection)) {
      std::snprintf(share, sizeof share, " --reft aor --private %.3g",
                    static_cast<double>(own) / static_cast<double>(shared));
    }
    std::printf(
        "every rank holds the same data-parallel state: one replica group of all %d ranks, "
        "protection %s (REFT: each keeps its slice%s%s; `ckptdb plan --nodes %d --dp %d --reft "
        "%s%s`), redundancy %s, CKPTDB_UCX_TLS=%s on loopback, coordinator %s\n",
        a.ranks, a.protection.c_str(),
        kept == "arc"   ? " and the next one's"
        : kept == "aec" ? " and XOR parity of the others'"
                        : ", the next one's and XOR parity of two others'",
        Aor(a.protection) ? "; the optimizer's moments are each rank's own (ZeRO-1), and the rank "
                            "before recomputes them from the same update (AOR)"
                          : "",
        a.nodes, a.ranks, reft.c_str(), share, a.redundancy.c_str(), a.tls.c_str(),
        coordinator.c_str());
  } else if (coded) {
    std::printf(
        "redundancy %s (coding groups of K+M nodes, parity in each other's memory: `ckptdb plan "
        "--nodes %d --ec K+M`), CKPTDB_UCX_TLS=%s (tcp: ckptdb's authenticated socket) on "
        "loopback, coordinator %s\n",
        a.redundancy.c_str(), a.nodes, a.tls.c_str(), coordinator.c_str());
  } else {
    std::printf(
        "redundancy %s (GEMINI Algorithm 1 placement over nodes: `ckptdb plan --nodes %d "
        "--replicas %s`), CKPTDB_UCX_TLS=%s (tcp: ckptdb's authenticated socket) on loopback, "
        "coordinator %s\n",
        a.redundancy.c_str(), a.nodes, a.redundancy.substr(10).c_str(), a.tls.c_str(),
        coordinator.c_str());
  }
  std::printf("ranks per node:");
  for (int n = 0; n < a.nodes; ++n) {
    std::printf(" node%d{", n);
    bool first = true;
    for (int r = 0; r < a.ranks; ++r) {
      if (job.NodeOf(r) != n) continue;
      std::printf("%s%d", first ? "" : ",", r);
      first = false;
    }
    std::printf("}");
  }
  std::printf("\n\n== training: %d checkpoints per rank ==\n", a.iterations);

  std::vector<Proc> procs = Spawn(job, 1);
  std::vector<int> all;
  for (int r = 0; r < a.ranks; ++r) all.push_back(r);
  if (static_cast<int>(procs.size()) != a.ranks || !Collect(procs, 300)) {
    KillAll(procs, all);
    std::fprintf(stderr, "ckptdb demo: FAILED during training\n");
    return kExitProblem;
  }
  std::printf("%4s %6s %6s %12s %9s %8s %7s %7s %14s %10s %10s %11s %6s  %s\n", "rank", "node",
              "ckpts", "blocked_ms", "max_ms", "full_ms", "direct", "skipped", "replicate_ms",
              "sent_MiB", "recv_MiB", "repl_GB/s", "epoch", "path");
  std::map<int, std::pair<uint64_t, uint64_t>> per_node;
  double blocked_all = 0, replicate_all = 0;
  for (int r = 0; r < a.ranks; ++r) {
    const Report& p = procs[r].report;
    double mean = p.checkpoints ? p.blocked_sum_ms / p.checkpoints : 0;
    double repl = p.checkpoints ? p.replica_ns / 1e6 / p.checkpoints : 0;
    blocked_all += mean;
    replicate_all += repl;
    std::printf("%4d %6s %6u %12.2f %9.2f %8.2f %7" PRIu64
                " %7u %14.1f %10.1f %10.1f %11.2f %6" PRIu64 "  %s\n",
                r, ("node" + std::to_string(job.NodeOf(r))).c_str(), p.checkpoints, mean,
                p.blocked_max_ms, p.checkpoints ? p.backpressure_ns / 1e6 / p.checkpoints : 0.0,
                p.direct_chunks, p.skipped, repl, MiB(p.replica_sent), MiB(p.replica_received),
                p.replica_ns ? static_cast<double>(p.replica_sent) / p.replica_ns : 0.0, p.epoch,
                p.paths[0] != 0 ? p.paths : "-");
    per_node[job.NodeOf(r)].first += p.replica_sent;
    per_node[job.NodeOf(r)].second += p.replica_received;
  }
  std::printf(
      "blocked_ms: put + wait_capture + commit per checkpoint, what the trainer waited (mean; "
      "max_ms the worst); full_ms: of capture's time per checkpoint, waiting for arena space "
      "(versions not yet replicated cannot be evicted; --backpressure block); direct: chunks "
      "written to the disk tier from the trainer's buffer instead (--backpressure direct); "
      "skipped: versions dropped instead (--backpressure skip); replicate_ms: the push of a "
      "version to a "
      "peer's memory, in the background; path: how it travelled to each peer (socket: ckptdb's "
      "authenticated connection; rma:posix: UCX one-sided puts into the peer's window over "
      "shared memory)\n");
  std::printf("mean over ranks: blocked %.2f ms, replication %.1f ms per version (%.1f%%)\n",
              blocked_all / a.ranks, replicate_all / a.ranks,
              replicate_all > 0 ? 100 * blocked_all / replicate_all : 0.0);
  std::printf(
      "per node: its ranks, their processes' threads (each rank's trainer thread "
      "included), the memory its ram directory holds (arenas and peers' replicas), and "
      "the replication traffic out and in; then, per checkpoint of each rank, what the threads "
      "other than the trainer's used: CPU, times they ran, time they waited for a core, and the "
      "trainer's own wait for a core\n");
  for (const auto& [node, t] : per_node) {
    int ranks = 0;
    uint32_t threads = 0;
    uint64_t cpu = 0, runs = 0, wait = 0, trainer_wait = 0, ckpts = 0;
    for (int r = 0; r < a.ranks; ++r) {
      if (job.NodeOf(r) != node) continue;
      const Report& p = procs[r].report;
      ++ranks;
      threads += p.threads;
      cpu += p.used.helper_cpu_ns;
      runs += p.used.helper_runs;
      wait += p.used.helper_wait_ns;
      trainer_wait += p.used.trainer_wait_ns;
      ckpts += p.checkpoints;
    }
    const double per = ckpts > 0 ? 1.0 / static_cast<double>(ckpts) : 0.0;
    std::printf(
        "  node%d: %d rank(s), %u threads, memory %.0f MiB, out %.0f MiB, in %.0f MiB; "
        "helpers %.1f ms CPU, %.0f runs, %.1f ms waiting for a core; trainer %.2f ms waiting\n",
        node, ranks, threads, MiB(BytesUsedUnder(job.RamDir(node))), MiB(t.first), MiB(t.second),
        static_cast<double>(cpu) / 1e6 * per, static_cast<double>(runs) * per,
        static_cast<double>(wait) / 1e6 * per, static_cast<double>(trainer_wait) / 1e6 * per);
  }
  std::vector<Report> trained;
  for (const Proc& p : procs) trained.push_back(p.report);
  std::printf("\n== node%d is lost ==\n", victim);
  std::vector<int> victims, survivors;
  for (int r = 0; r < a.ranks; ++r) (job.NodeOf(r) == victim ? victims : survivors).push_back(r);
  KillAll(procs, victims);
  fs::remove_all(job.DiskDir(victim), ec);
  fs::remove_all(job.RamDir(victim), ec);
  std::printf("SIGKILLed rank(s)");
  for (int r : victims) std::printf(" %d", r);
  std::printf(" and deleted %s and %s\n", job.DiskDir(victim).c_str(), job.RamDir(victim).c_str());
  KillAll(procs, survivors);
  std::printf(
      "the job is torn down (the other %zu ranks SIGKILLed, as a scheduler does); their nodes "
      "keep their memory and disks\n",
      survivors.size());

  std::printf(
      "\n== restart: every rank restores the latest version; node%d's on empty directories ==\n",
      victim);
  procs = Spawn(job, 2);
  bool ok = static_cast<int>(procs.size()) == a.ranks && Collect(procs, 300);
  std::printf("%4s %6s %7s %9s %11s %9s %-24s %10s\n", "rank", "node", "latest", "open_ms",
              "restore_ms", "GB/s", "bytes from", "bit-exact");
  for (int r = 0; r < a.ranks && ok; ++r) {
    const Report& p = procs[r].report;
    std::printf("%4d %6s %7" PRIu64 " %9.1f %11.1f %9.2f %-24s %10s\n", r,
                ("node" + std::to_string(job.NodeOf(r))).c_str(), p.latest, p.open_ms, p.restore_ms,
                p.restore_ms > 0 ? p.state_bytes / (p.restore_ms * 1e6) : 0.0, p.sources,
                p.bit_exact ? "yes" : "NO");
    const bool lost = job.NodeOf(r) == victim;
    // The job's newest committed version when training ended: the last iteration's, unless
    // back-pressure's skip dropped it.
    if (!p.bit_exact || p.latest != trained[0].latest) {
      std::fprintf(
          stderr, "ckptdb demo: rank %d restored v%" PRIu64 ", the job's latest was v%" PRIu64 "\n",
          r, p.latest, trained[0].latest);
      ok = false;
    }
    // A replica group's members all gather slices from the others ("arc:rankN") and decode what
    // none keeps whole ("aec:rankN"): the lost one reads nothing of its own ram, the others do.
    const bool from_peers = !a.protection.empty() ? std::strstr(p.sources, "ram ") == nullptr
                                                  : std::strncmp(p.source, "peer:", 5) == 0 ||
                                                        std::strncmp(p.source, "rebuild:", 8) == 0;
    if (lost != from_peers) {
      std::fprintf(stderr, "ckptdb demo: rank %d restored from %s, expected %s\n", r, p.source,
                   lost ? "its peers' memory" : "its own ram tier");
      ok = false;
    }
  }
  bool closed = CloseAll(procs);
  if (!ok || !closed) {
    std::fprintf(stderr, "ckptdb demo: FAILED%s\n",
                 closed ? "" : " (a rank did not close cleanly)");
    return kExitProblem;
  }
  std::printf("\nok: every rank restored v%" PRIu64
              " bit for bit; node%d's ranks from their peers' memory, the rest from their own ram "
              "tier\n",
              trained[0].latest, victim);
  std::vector<RankFigures> figures;
  for (int r = 0; r < a.ranks; ++r) {
    const Report& t = trained[r];
    const Report& p = procs[r].report;
    RankFigures f;
    f.rank = r;
    f.node = job.NodeOf(r);
    f.lost = f.node == victim;
    f.blocked_ms.assign(t.blocked_ms, t.blocked_ms + std::min<uint32_t>(t.checkpoints, kPlotted));
    f.sync_ms.assign(t.sync_ms, t.sync_ms + kSyncSaves);
    f.restore_ms = p.restore_ms;
    f.sync_read_ms = p.sync_read_ms;
    f.bytes = p.state_bytes;
    f.restored_from = p.source;
    figures.push_back(std::move(f));
  }
  PrintSummaryAndPlot(a, victim, figures);
  std::printf("the nodes' memory is in %s: rm -rf it to free it (the next demo replaces it)\n",
              a.ram_dir.c_str());
  return kExitOk;
}

}  // namespace ckpt::tools::demo
