// ckptdb demo: the main job on an embedded default. A synthetic model (parameters in bf16 and
// f16, Adam moments in f32, a step counter in i64, an RNG state in u8) trains for N iterations
// and checkpoints every iteration the way a trainer uses ckptdb (DataStates-LLM's lazy capture):
// at the end of iteration i it puts every shard of version i and goes on; iteration i+1's
// forward and backward pass (a compute phase that leaves the state alone) runs while capture
// threads copy the shards into the ram tier; right before the optimizer step changes the state,
// it waits for the capture and commits version i asynchronously. The table shows what each
// checkpoint blocked the trainer for, next to what a synchronous write+fsync of the same state
// costs. Versions divisible by 10 are demoted to a disk tier in the background. Then the store is
// reopened as a restarted trainer would, the latest version is restored from ram and checked
// bit for bit against the live state.
#include "tools/demo.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace ckpt::tools {
namespace {

using demo::Allocate;
using demo::ForwardBackward;
using demo::InfoOf;
using demo::Seconds;
using demo::Seed;
using demo::Step;
using demo::SyncWriteSeconds;
using demo::Tensor;

struct DemoArgs {
  std::string root = "./ckptdb-demo";
  // The ram arena is sized from the model at run time unless --tiers is given.
  std::string tiers;
  std::string ram_dir = "/dev/shm/ckptdb-demo";
  std::string disk_dir = "./ckptdb-demo/disk";
  int iterations = 20;
  int layers = 2;
  int compute_ms = 100;
  bool drop_ram = false;
};

std::vector<Tensor> BuildModel(int layers) {
  const uint64_t vocab = 32000, hidden = 1024, ffn = 4096;
  std::vector<Tensor> params;
  auto add = [&](std::string name, int dtype, std::vector<uint64_t> shape) {
    Tensor t{std::move(name), dtype, std::move(shape)};
    t.bytes = ckptdb_dtype_bytes(dtype);
    for (uint64_t d : t.shape) t.bytes *= d;
    params.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", CKPTDB_DTYPE_BF16, {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "attn.qkv.weight", CKPTDB_DTYPE_BF16, {3 * hidden, hidden});
    add(p + "attn.o.weight", CKPTDB_DTYPE_BF16, {hidden, hidden});
    add(p + "mlp.w1.weight", CKPTDB_DTYPE_BF16, {ffn, hidden});
    add(p + "mlp.w2.weight", CKPTDB_DTYPE_BF16, {hidden, ffn});
    add(p + "ln1.weight", CKPTDB_DTYPE_F32, {hidden});
    add(p + "ln2.weight", CKPTDB_DTYPE_F32, {hidden});
  }
  add("model.norm.weight", CKPTDB_DTYPE_F32, {hidden});
  add("lm_head.scale", CKPTDB_DTYPE_F16, {hidden});
  std::vector<Tensor> all = params;
  for (const Tensor& p : params) {
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      Tensor t{"optimizer." + std::string(moment) + "." + p.name, CKPTDB_DTYPE_F32, p.shape};
      t.bytes = 4;
      for (uint64_t d : t.shape) t.bytes *= d;
      all.push_back(std::move(t));
    }
  }
  all.push_back(Tensor{"optimizer.step", CKPTDB_DTYPE_I64, {}, 8});
  all.push_back(Tensor{"rng.cpu_state", CKPTDB_DTYPE_U8, {5056}, 5056});
  return all;
}

int Fail(const char* what, int status) {
  std::fprintf(stderr, "ckptdb demo: %s: %s\n", what, ErrorText(status).c_str());
  return 1;
}

}  // namespace

namespace demo {

double SyncWriteSeconds(const std::vector<Tensor>& model, const std::string& path) {
  auto t0 = std::chrono::steady_clock::now();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  for (const Tensor& t : model) {
    for (size_t off = 0; off < t.bytes;) {
      ssize_t n = write(fd, t.data + off, t.bytes - off);
      if (n <= 0) {
        close(fd);
        unlink(path.c_str());
        return -1;
      }
      off += static_cast<size_t>(n);
    }
  }
  const bool synced = fsync(fd) == 0;
  close(fd);
  if (!synced) {
    unlink(path.c_str());
    return -1;
  }
  return Seconds(std::chrono::steady_clock::now() - t0);
}

double ColdReadSeconds(const std::string& path, uint8_t* into, uint64_t bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  // Its pages out of the page cache (they are clean after the fsync): the read is the disk's.
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < bytes) {
    ssize_t n = read(fd, into + done, bytes - done);
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  return done == bytes ? Seconds(std::chrono::steady_clock::now() - t0) : -1;
}

}  // namespace demo

namespace {

int PutAll(ckptdb* db, uint64_t version, const std::vector<Tensor>& model) {
  for (const Tensor& t : model) {
    ckptdb_tensor_info info = InfoOf(t);
    int rc = ckptdb_put_shard(db, version, t.name.c_str(), t.data, t.bytes, &info, 0);
    if (rc != CKPTDB_OK) return Fail(("put_shard " + t.name).c_str(), rc);
  }
  return 0;
}

std::string Where(ckptdb* db, uint64_t version) {
  std::string out;
  auto fn = [](void* arg, const ckptdb_version_info* i) {
    auto* o = static_cast<std::pair<uint64_t, std::string>*>(arg);
    if (i->version != o->first) return 0;
    for (uint32_t k = 0; k < i->residency_count; ++k) {
      if (i->residency[k].state != CKPTDB_RESIDENT_DURABLE) continue;
      std::string tier = i->residency[k].tier;
      o->second += (o->second.empty() ? "" : "+") + tier.substr(0, tier.find(':'));
    }
    return 1;
  };
  std::pair<uint64_t, std::string> arg{version, ""};
  ckptdb_list_versions(db, fn, &arg);
  // Nothing durable yet: its asynchronous commit is still being recorded.
  return arg.second.empty() ? "(committing)" : arg.second;
}

int RunDemo(const DemoArgs& a) {
  namespace fs = std::filesystem;
  // The demo always starts from an empty store: remove what an earlier run left behind (the
  // arena lives in a directory of its own so that this removes it too).
  std::error_code ec;
  fs::remove_all(a.root, ec);
  fs::remove_all(a.ram_dir, ec);
  fs::remove_all(a.disk_dir, ec);

  std::vector<Tensor> model = BuildModel(a.layers);
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    model[i].data = Allocate(model[i].bytes);
    model[i].restored = Allocate(model[i].bytes);
    if (!model[i].data || !model[i].restored) {
      std::fprintf(stderr, "ckptdb demo: cannot allocate %zu bytes for %s\n", model[i].bytes,
                   model[i].name.c_str());
      return 1;
    }
    Seed(model[i], i + 1);
    total_bytes += model[i].bytes;
  }
  // Room for four versions in ram: the two it keeps, one still being demoted to disk, and the
  // one being captured (with three, every capture after a demotion waits for it to finish),
  // plus record headers (4 KiB per chunk and per tensor).
  uint64_t version_bytes = total_bytes + (total_bytes >> 10) + model.size() * 8192 + (1 << 20);
  std::string tiers = a.tiers;
  if (tiers.empty()) {
    tiers = "ram:" + std::to_string((4 * version_bytes >> 20) + 16) + "M,keep=2,dir=" + a.ram_dir +
            ";disk:" + a.disk_dir + ",every=10,keep=2";
  }
  std::printf("ckptdb demo: %zu tensors, %.1f MiB, %d iterations, %d ms of compute each\n",
              model.size(), total_bytes / 1048576.0, a.iterations, a.compute_ms);
  std::printf("store %s, tiers %s\n", a.root.c_str(), tiers.c_str());

  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = a.root.c_str();
  o.tiers = tiers.c_str();
  o.rank = 0;
  o.world_size = 1;
  ckptdb* db = nullptr;
  auto open0 = std::chrono::steady_clock::now();
  int rc = ckptdb_open(&o, &db);
  if (rc != CKPTDB_OK) return Fail("open", rc);
  std::printf(
      "opened in %.0f ms (a new ram arena's pages are allocated and touched once per "
      "node; a restart finds them)\n",
      Seconds(std::chrono::steady_clock::now() - open0) * 1e3);
  fs::create_directories(a.disk_dir, ec);
  const std::string probe = a.disk_dir + "/sync-write-probe.bin";
  double sync_s = SyncWriteSeconds(model, probe);
  unlink(probe.c_str());
  std::printf("a synchronous write+fsync of this state to %s takes %.0f ms (%.2f GB/s)\n\n",
              a.disk_dir.c_str(), sync_s * 1e3, total_bytes / sync_s / 1e9);

  std::printf("%5s %8s %11s %8s %8s %9s %10s %9s  %s\n", "iter", "version", "blocked_ms", "put_ms",
              "wait_ms", "commit_ms", "sync_ms", "blocked%", "version-1 is on");
  double sum_blocked = 0;
  int checkpoints = 0;
  double put_s = 0;  // put of the version captured during this iteration
  for (int it = 1; it <= a.iterations + 1; ++it) {
    ForwardBackward(a.compute_ms);
    double wait_s = 0, commit_s = 0;
    if (it > 1) {
      // Before the optimizer step: the previous version must be out of the live buffers.
      uint64_t version = static_cast<uint64_t>(it - 1);
      auto w0 = std::chrono::steady_clock::now();
      rc = ckptdb_wait_capture(db, version, -1);
      if (rc != CKPTDB_OK) return Fail("wait_capture", rc);
      auto c0 = std::chrono::steady_clock::now();
      rc = ckptdb_commit(db, version, CKPTDB_COMMIT_ASYNC);
      if (rc != CKPTDB_OK) return Fail("commit", rc);
      auto c1 = std::chrono::steady_clock::now();
      wait_s = Seconds(c0 - w0);
      commit_s = Seconds(c1 - c0);
      double blocked = put_s + wait_s + commit_s;
      sum_blocked += blocked;
      ++checkpoints;
      std::printf("%5d %8" PRIu64 " %11.2f %8.2f %8.2f %9.2f %10.0f %8.2f%%  %s\n", it - 1, version,
                  blocked * 1e3, put_s * 1e3, wait_s * 1e3, commit_s * 1e3, sync_s * 1e3,
                  100 * blocked / sync_s, version > 1 ? Where(db, version - 1).c_str() : "-");
    }
    if (it > a.iterations) break;
    // The optimizer step: every byte of the state changes. Then the new state is checkpointed.
    for (Tensor& t : model) Step(t, static_cast<uint64_t>(it));
    auto p0 = std::chrono::steady_clock::now();
    if (int r = PutAll(db, static_cast<uint64_t>(it), model); r != 0) return r;
    put_s = Seconds(std::chrono::steady_clock::now() - p0);
  }
  rc = ckptdb_wait_commit(db, static_cast<uint64_t>(a.iterations), nullptr, -1);
  if (rc != CKPTDB_OK) return Fail("wait_commit", rc);
  ckptdb_stats_t st;
  ckptdb_stats(db, &st);
  auto close0 = std::chrono::steady_clock::now();
  rc = ckptdb_close(db);  // waits for the demotions still running
  if (rc != CKPTDB_OK) return Fail("close", rc);
  double close_s = Seconds(std::chrono::steady_clock::now() - close0);
  std::printf(
      "\nmean blocked %.2f ms per checkpoint of %.1f MiB: %.2f%% of a synchronous "
      "write+fsync (%.0f ms)\n",
      sum_blocked / checkpoints * 1e3, total_bytes / 1048576.0,
      100 * sum_blocked / checkpoints / sync_s, sync_s * 1e3);
  std::printf("capture %.2f GB/s; close drained the last demotions in %.0f ms\n",
              st.capture_ns ? static_cast<double>(st.capture_bytes) / st.capture_ns : 0.0,
              close_s * 1e3);
  std::printf("tiers at the last commit, before the close drained the rest:\n");
  for (uint32_t i = 0; i < st.tier_count; ++i) {
    const ckptdb_tier_stats& t = st.tiers[i];
    std::printf(
        "  %-36s wrote %7.2f GiB at %5.2f GB/s, %2u demoted in, %2u evicted, holds "
        "%u\n",
        t.name, t.bytes_written / 1073741824.0,
        t.write_ns ? static_cast<double>(t.bytes_written) / t.write_ns : 0.0, t.demotions,
        t.evictions, t.resident_versions);
  }

  // A restarted trainer: a new handle, recovery, latest, restore everything, compare.
  std::printf("\nrestart: reopening the store\n");
  auto r0 = std::chrono::steady_clock::now();
  rc = ckptdb_open(&o, &db);
  if (rc != CKPTDB_OK) return Fail("reopen", rc);
  auto r1 = std::chrono::steady_clock::now();
  uint64_t latest = 0;
  rc = ckptdb_latest(db, &latest);
  if (rc != CKPTDB_OK) return Fail("latest", rc);
  for (Tensor& t : model) {
    rc = ckptdb_restore(db, latest, t.name.c_str(), t.restored, t.bytes, 0);
    if (rc != CKPTDB_OK) return Fail(("restore " + t.name).c_str(), rc);
  }
  auto r2 = std::chrono::steady_clock::now();
  ckptdb_stats(db, &st);
  size_t mismatches = 0;
  for (const Tensor& t : model) {
    if (std::memcmp(t.data, t.restored, t.bytes) != 0) {
      std::fprintf(stderr, "MISMATCH: %s differs from the live state\n", t.name.c_str());
      ++mismatches;
    }
  }
  const uint64_t expected_version = static_cast<uint64_t>(a.iterations);
  std::printf("%-28s %s\n", "latest version", std::to_string(latest).c_str());
  std::printf("%-28s %.1f ms\n", "reopen (recovery)", Seconds(r1 - r0) * 1e3);
  std::printf("%-28s %.1f ms (%.2f GB/s)\n", "restore", Seconds(r2 - r1) * 1e3,
              total_bytes / Seconds(r2 - r1) / 1e9);
  std::printf("%-28s %s\n", "restore source", st.last_restore_tier);
  std::printf("%-28s %s\n", "bit-exact",
              mismatches == 0 && latest == expected_version ? "yes" : "NO");
  ckptdb_close(db);
  // The store is left whole, so that `ckptdb inspect` and `ckptdb verify` find it consistent.
  // Its ram arena holds memory: say how much and how to free it (the next demo replaces it).
  if (a.drop_ram) {
    // As after a reboot: verify will report the ram copies missing; restore uses the disk.
    fs::remove_all(a.ram_dir, ec);
    std::printf("\nremoved the ram tier's arena in %s (--drop-ram)\n", a.ram_dir.c_str());
  } else {
    uint64_t held = 0;
    for (const auto& e : fs::directory_iterator(a.ram_dir, ec)) {
      if (e.is_regular_file(ec)) held += e.file_size(ec);
    }
    std::printf("\nthe ram tier's arena in %s holds %.1f MiB of memory; rm -rf it to free it\n",
                a.ram_dir.c_str(), static_cast<double>(held) / (1 << 20));
  }
  for (Tensor& t : model) {
    munmap(t.data, (t.bytes + 4095) & ~size_t{4095});
    munmap(t.restored, (t.bytes + 4095) & ~size_t{4095});
  }
  if (mismatches != 0 || latest != expected_version) {
    std::fprintf(stderr,
                 "ckptdb demo: FAILED: restored state is not the state of version %" PRIu64 "\n",
                 expected_version);
    return 1;
  }
  if (std::string(st.last_restore_tier) != "ram" && a.tiers.empty()) {
    std::fprintf(stderr, "ckptdb demo: FAILED: the restore came from %s, not from ram\n",
                 st.last_restore_tier);
    return 1;
  }
  std::printf("\nok: version %" PRIu64 " restored bit for bit from %s\n", latest,
              st.last_restore_tier);
  return 0;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DemoArgs>();
  auto cluster = std::make_shared<demo::ClusterArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "A job of --ranks trainer processes on --nodes simulated nodes (default 4 on 4) checkpoints "
      "every iteration into memory replicated to another node, loses a node, restarts and "
      "restores from peers' memory bit for bit. With --ranks 1: one trainer with a synthetic "
      "model (>= 512 MiB, mixed dtypes), lazy capture, disk demotion, restart, restore");
  cmd->add_option("--ranks", cluster->ranks, "Trainer processes (1: the single-trainer demo)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--nodes", cluster->nodes, "Simulated nodes the ranks are spread over")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--kill-node", cluster->kill_node, "The node that is lost (default: the last)")
      ->check(CLI::Range(0, 63));
  cmd->add_option("--redundancy", cluster->redundancy,
                  "replicate:M, or ec:K+M[,encode=sender] / xor:K coding groups (many ranks)")
      ->capture_default_str();
  auto* protection =
      cmd->add_option("--protection", cluster->protection,
                      "REFT's in-memory protection instead of GEMINI's replicas: arc, aec, "
                      "arc+aec, or with AOR aor (= arc+aor), aec+aor, arc+aec+aor. Every rank "
                      "then holds the same data-parallel state, declared one replica group (one "
                      "rank per node), and keeps only its slices (and parity) of it; with AOR "
                      "the optimizer's moments are each rank's own and the rank before keeps "
                      "them recomputed; the lost node's ranks restore from the group. Redundancy "
                      "is none unless --redundancy says otherwise")
          ->check(
              CLI::IsMember({"arc", "aec", "arc+aec", "aor", "arc+aor", "aec+aor", "arc+aec+aor"}));
  cmd->add_option("--mib-per-rank", cluster->mib_per_rank, "State per rank in MiB (many ranks)")
      ->check(CLI::Range(1.0, 4096.0))
      ->capture_default_str();
  cmd->add_option("--tls", cluster->tls, "UCX_TLS between the ranks (tcp, shm, or empty)")
      ->capture_default_str();
  cmd->add_option("--backpressure", cluster->backpressure,
                  "Many ranks: what capture does when the ram tier's arena is full of versions "
                  "still being protected: block (wait), direct (write to the next tier from the "
                  "trainer's buffer), skip (drop the version); default: the library's")
      ->check(CLI::IsMember({"block", "direct", "skip"}));
  cmd->add_option("--root", args->root, "Store directory (removed and recreated)")
      ->capture_default_str();
  cmd->add_option("--tiers", args->tiers,
                  "Tier spec, fastest first (one rank; default: a ram tier in --ram-dir sized for "
                  "four versions, keep=2; --disk-dir every=10, keep=2)");
  cmd->add_option("--ram-dir", args->ram_dir,
                  "Directory of the ram tier's arena; with many ranks, the nodes' memory (removed "
                  "first)")
      ->capture_default_str();
  cmd->add_option("--disk-dir", args->disk_dir, "The disk tier's directory (one rank)")
      ->capture_default_str();
  auto* iterations = cmd->add_option("--iterations", args->iterations,
                                     "Training iterations, one checkpoint each (default: 20 with "
                                     "one rank, 10 with many)")
                         ->check(CLI::Range(1, 100000));
  cmd->add_option("--layers", args->layers,
                  "Transformer layers (one rank; each adds about 120 MiB)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  auto* compute = cmd->add_option("--compute-ms", args->compute_ms,
                                  "Forward and backward pass per iteration, during which capture "
                                  "(and replication) runs (default: 100 with one rank, 300 with "
                                  "many: a version's replication must fit in it)")
                      ->check(CLI::Range(0, 600000));
  cmd->add_option("--kill-rounds", cluster->kill_rounds,
                  "Many ranks: instead of the demo, a kill campaign of N rounds: each restarts "
                  "the job, restores and checks its latest version bit for bit, trains, and "
                  "SIGKILLs a random rank, the coordinator, a node (wiping it) or the whole job "
                  "at a random time")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--seed", cluster->seed, "The kill campaign's random seed (default: 1)")
      ->capture_default_str();
  cmd->add_flag("--drop-ram", args->drop_ram,
                "Delete the ram tier's arena at the end, as a reboot would (one rank; verify then "
                "reports those copies missing)");
  auto* redundancy = cmd->get_option("--redundancy");
  cmd->callback([args, cluster, iterations, compute, protection, redundancy, exit_code]() {
    if (cluster->ranks == 1) {
      *exit_code = RunDemo(*args);
      return;
    }
    cluster->root = args->root;
    cluster->ram_dir = args->ram_dir;
    if (compute->count() > 0) cluster->compute_ms = args->compute_ms;
    if (iterations->count() > 0) cluster->iterations = args->iterations;
    if (protection->count() > 0 && redundancy->count() == 0) cluster->redundancy = "none";
    *exit_code = demo::RunClusterDemo(*cluster);
  });
}

}  // namespace ckpt::tools
