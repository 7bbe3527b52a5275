// ckptdb demo: the main job on an embedded default. A synthetic model (parameters in bf16 and
// f16, Adam moments in f32, a step counter in i64, an RNG state in u8) is trained for N
// iterations that change every byte, checkpointed every iteration through the C API; then the
// store is reopened as a restarted trainer would, the latest version is restored and checked bit
// for bit against the live state.
#include <sys/mman.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"

namespace ckpt::tools {
namespace {

struct DemoArgs {
  std::string root = "./ckptdb-demo";
  std::string tiers = "tmpfs:/dev/shm/ckptdb-demo,keep=2;disk:./ckptdb-demo/disk,keep=3";
  int iterations = 20;
  int layers = 2;
  bool remove_tmpfs = false;
};

struct Tensor {
  std::string name;
  int dtype;
  std::vector<uint64_t> shape;
  size_t bytes = 0;
  uint8_t* data = nullptr;      // the live training state
  uint8_t* restored = nullptr;  // where the restarted trainer restores into
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

uint8_t* Allocate(size_t bytes) {
  // Populated up front: LIMITS.md measured first touch at 0.3 GB/s on these VMs, and the demo
  // measures ckptdb, not the page allocator.
  size_t rounded = (bytes + 4095) & ~size_t{4095};
  void* p = mmap(nullptr, rounded ? rounded : 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

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

// One "training step": every 8-byte word changes (an LCG step salted by the iteration), so a
// restore of the wrong version can never match by accident.
void Step(Tensor& t, uint64_t iteration) {
  size_t words = t.bytes / 8;
  auto* w = reinterpret_cast<uint64_t*>(t.data);
  for (size_t i = 0; i < words; ++i) w[i] = w[i] * 6364136223846793005ull + iteration;
  for (size_t i = words * 8; i < t.bytes; ++i)
    t.data[i] = static_cast<uint8_t>(t.data[i] + iteration);
}

void Seed(Tensor& t, uint64_t seed) {
  uint64_t x = seed;
  size_t words = t.bytes / 8;
  auto* w = reinterpret_cast<uint64_t*>(t.data);
  for (size_t i = 0; i < words; ++i) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    w[i] = z ^ (z >> 31);
  }
  for (size_t i = words * 8; i < t.bytes; ++i) t.data[i] = static_cast<uint8_t>(i * 31 + seed);
}

ckptdb_tensor_info InfoOf(const Tensor& t) {
  ckptdb_tensor_info info{};
  info.dtype = t.dtype;
  info.ndim = static_cast<uint32_t>(t.shape.size());
  for (size_t d = 0; d < t.shape.size(); ++d) info.shape[d] = t.shape[d];
  return info;
}

int Fail(const char* what, int status) {
  std::fprintf(stderr, "ckptdb demo: %s: %s: %s\n", what, ckptdb_status_name(status),
               ckptdb_last_error());
  return 1;
}

std::string TierPath(const std::string& spec_tier) {
  size_t colon = spec_tier.find(':');
  size_t comma = spec_tier.find(',');
  return spec_tier.substr(colon + 1,
                          comma == std::string::npos ? std::string::npos : comma - colon - 1);
}

int RunDemo(const DemoArgs& a) {
  namespace fs = std::filesystem;
  // The demo always starts from an empty store: remove what an earlier run left behind.
  std::error_code ec;
  fs::remove_all(a.root, ec);
  std::vector<std::string> tier_dirs;
  for (size_t start = 0; start < a.tiers.size();) {
    size_t end = a.tiers.find(';', start);
    std::string t =
        a.tiers.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!t.empty()) tier_dirs.push_back(TierPath(t));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  for (const std::string& d : tier_dirs) fs::remove_all(d, ec);

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
  std::printf("ckptdb demo: %zu tensors, %.1f MiB, %d iterations\n", model.size(),
              total_bytes / 1048576.0, a.iterations);
  std::printf("store %s, tiers %s\n\n", a.root.c_str(), a.tiers.c_str());

  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = a.root.c_str();
  o.tiers = a.tiers.c_str();
  o.rank = 0;
  o.world_size = 1;
  ckptdb* db = nullptr;
  int rc = ckptdb_open(&o, &db);
  if (rc != CKPTDB_OK) return Fail("open", rc);

  std::printf("%5s %8s %11s %9s %10s %8s\n", "iter", "version", "blocked_ms", "put_ms", "commit_ms",
              "GB/s");
  double sum_blocked = 0;
  for (int it = 1; it <= a.iterations; ++it) {
    for (Tensor& t : model) Step(t, static_cast<uint64_t>(it));
    uint64_t version = static_cast<uint64_t>(it) * 100;  // versions are training steps
    auto t0 = std::chrono::steady_clock::now();
    for (const Tensor& t : model) {
      ckptdb_tensor_info info = InfoOf(t);
      rc = ckptdb_put_shard(db, version, t.name.c_str(), t.data, t.bytes, &info, 0);
      if (rc != CKPTDB_OK) return Fail(("put_shard " + t.name).c_str(), rc);
    }
    rc = ckptdb_wait_capture(db, version, -1);
    if (rc != CKPTDB_OK) return Fail("wait_capture", rc);
    auto t1 = std::chrono::steady_clock::now();
    rc = ckptdb_commit(db, version, 0);
    if (rc != CKPTDB_OK) return Fail("commit", rc);
    auto t2 = std::chrono::steady_clock::now();
    double blocked = Seconds(t2 - t0);
    sum_blocked += blocked;
    std::printf("%5d %8" PRIu64 " %11.1f %9.1f %10.1f %8.2f\n", it, version, blocked * 1e3,
                Seconds(t1 - t0) * 1e3, Seconds(t2 - t1) * 1e3, total_bytes / blocked / 1e9);
  }
  ckptdb_stats_t st;
  ckptdb_stats(db, &st);
  rc = ckptdb_close(db);
  if (rc != CKPTDB_OK) return Fail("close", rc);
  std::printf("\nmean blocked %.1f ms per checkpoint of %.1f MiB (%.2f GB/s); fixed buffers %s\n",
              sum_blocked / a.iterations * 1e3, total_bytes / 1048576.0,
              total_bytes * a.iterations / sum_blocked / 1e9, st.fixed_buffers ? "on" : "off");
  for (uint32_t i = 0; i < st.tier_count; ++i) {
    std::printf("tier %-40s O_DIRECT %-3s wrote %.2f GiB\n", st.tiers[i].name,
                st.tiers[i].direct_io ? "yes" : "no", st.tiers[i].bytes_written / 1073741824.0);
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
  uint64_t expected_version = static_cast<uint64_t>(a.iterations) * 100;
  std::printf("\n%-28s %s\n", "latest version", std::to_string(latest).c_str());
  std::printf("%-28s %.1f ms\n", "reopen (recovery)", Seconds(r1 - r0) * 1e3);
  std::printf("%-28s %.1f ms (%.2f GB/s)\n", "restore", Seconds(r2 - r1) * 1e3,
              total_bytes / Seconds(r2 - r1) / 1e9);
  std::printf("%-28s %s\n", "restore source", st.last_restore_tier);
  std::printf("%-28s %s\n", "bit-exact",
              mismatches == 0 && latest == expected_version ? "yes" : "NO");
  ckptdb_close(db);
  // The store is left whole, so that `ckptdb inspect` and `ckptdb verify` find it consistent.
  // Its tmpfs tier holds memory: say how much and how to free it (the next demo replaces it).
  for (size_t i = 0; i < tier_dirs.size(); ++i) {
    if (a.tiers.find("tmpfs:" + tier_dirs[i]) == std::string::npos) continue;
    if (a.remove_tmpfs) {
      // As after a reboot: verify will report these copies as missing; restore uses the disk.
      fs::remove_all(tier_dirs[i], ec);
      std::printf("\nremoved the tmpfs tier %s (--remove-tmpfs)\n", tier_dirs[i].c_str());
      continue;
    }
    uint64_t held = 0;
    for (const auto& e : fs::directory_iterator(tier_dirs[i], ec)) {
      if (e.is_regular_file(ec)) held += e.file_size(ec);
    }
    std::printf("\nthe tmpfs tier %s holds %.1f MiB of memory; rm -rf it to free it\n",
                tier_dirs[i].c_str(), static_cast<double>(held) / (1 << 20));
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
  std::printf("\nok: version %" PRIu64 " restored bit for bit\n", latest);
  return 0;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Train a synthetic model (>= 512 MiB, mixed dtypes), checkpoint every iteration, "
      "restart, restore the latest version and check it bit for bit");
  cmd->add_option("--root", args->root, "Store directory (removed and recreated)")
      ->capture_default_str();
  cmd->add_option("--tiers", args->tiers, "Tier spec, fastest first")->capture_default_str();
  cmd->add_option("--iterations", args->iterations, "Training iterations (one checkpoint each)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--layers", args->layers, "Transformer layers (each adds about 120 MiB)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_flag("--remove-tmpfs", args->remove_tmpfs,
                "Delete the tmpfs tier's files at the end, as a reboot would (verify then "
                "reports those copies missing)");
  cmd->callback([args, exit_code]() { *exit_code = RunDemo(*args); });
}

}  // namespace ckpt::tools
