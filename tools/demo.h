// What the two demos share (tools/demo.cc, one trainer; tools/demo_cluster.cc, a job of many
// ranks on simulated nodes): the synthetic state, its deterministic "training step", and the
// compute phase during which capture runs.
#pragma once

#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"

namespace ckpt::tools::demo {

struct Tensor {
  std::string name;
  int dtype;
  std::vector<uint64_t> shape;
  size_t bytes = 0;
  uint8_t* data = nullptr;      // the live training state
  uint8_t* restored = nullptr;  // where the restarted trainer restores into
  // Many ranks: the put's flags (CKPTDB_PUT_REPLICATED, CKPTDB_PUT_RECOMPUTED), the seed its
  // bytes start from, and whether the rank restores it (not a recomputed replica of another's).
  unsigned flags = 0;
  uint64_t seed = 0;
  bool own = true;
};

inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

inline uint8_t* Allocate(size_t bytes) {
  // Populated up front: LIMITS.md measured first touch at 0.3 GB/s on these VMs, and the demo
  // measures ckptdb, not the page allocator.
  size_t rounded = (bytes + 4095) & ~size_t{4095};
  void* p = mmap(nullptr, rounded ? rounded : 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

inline void Free(uint8_t* p, size_t bytes) {
  if (p != nullptr) munmap(p, bytes ? (bytes + 4095) & ~size_t{4095} : 4096);
}

// One "training step": every 8-byte word changes (an LCG step salted by the iteration), so a
// restore of the wrong version can never match by accident.
inline void Step(Tensor& t, uint64_t iteration) {
  size_t words = t.bytes / 8;
  auto* w = reinterpret_cast<uint64_t*>(t.data);
  for (size_t i = 0; i < words; ++i) w[i] = w[i] * 6364136223846793005ull + iteration;
  for (size_t i = words * 8; i < t.bytes; ++i)
    t.data[i] = static_cast<uint8_t>(t.data[i] + iteration);
}

inline void Seed(Tensor& t, uint64_t seed) {
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

inline ckptdb_tensor_info InfoOf(const Tensor& t) {
  ckptdb_tensor_info info{};
  info.dtype = t.dtype;
  info.ndim = static_cast<uint32_t>(t.shape.size());
  for (size_t d = 0; d < t.shape.size(); ++d) info.shape[d] = t.shape[d];
  return info;
}

// The forward and backward pass: work that reads no checkpointed state (the GPU's, here the
// CPU's), during which the capture of the previous version runs.
inline void ForwardBackward(int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile uint64_t x = 1;
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 1000; ++i) x = x * 6364136223846793005ull + 1;
  }
}

struct ClusterArgs {
  int ranks = 4;
  int nodes = 4;
  int kill_node = -1;  // -1: the last node
  std::string root = "./ckptdb-demo";
  std::string ram_dir = "/dev/shm/ckptdb-demo";
  int iterations = 10;
  int compute_ms = 300;  // above one version's replication time on a 2-core machine
  double mib_per_rank = 32;
  std::string tls = "tcp";
  std::string backpressure;                // block, direct or skip; empty: the library's default
  int port = 0;                            // 0: a free one
  std::string redundancy = "replicate:2";  // or ec:K+M, xor:K
  // REFT: "arc", "aec" or "arc+aec": every rank holds the same (data-parallel) state, one replica
  // group of all ranks, one rank per node; with "+aor" (or "aor") the optimizer's moments are
  // each rank's own (ZeRO-1) and the rank before keeps them recomputed; empty: each rank its own
  // shard.
  std::string protection;
  int kill_rounds = 0;  // > 0: the kill campaign instead of the demo
  uint64_t seed = 1;    // the campaign's faults and their times
};

// `ckptdb demo --ranks R --nodes N` (R > 1): tools/demo_cluster.cc. Returns the exit code.
int RunClusterDemo(const ClusterArgs& args);

// One rank of the many-rank demo's run, for its summary (tools/demo_summary.cc).
struct RankFigures {
  int rank = 0;
  int node = 0;
  bool lost = false;              // its node was the one lost
  std::vector<float> blocked_ms;  // per checkpoint
  std::vector<double> sync_ms;    // the same state saved with write + fsync
  double restore_ms = 0;          // the restart's restore of its state
  double sync_read_ms = -1;       // its synchronous save read back (-1: lost with its node)
  uint64_t bytes = 0;             // its state
  std::string restored_from;      // the restore's fastest source
};
// The table of what ckptdb saved the trainer against the synchronous save, ROOT/run.json, and
// ROOT/run.png when matplotlib is there.
void PrintSummaryAndPlot(const ClusterArgs& args, int lost_node,
                         const std::vector<RankFigures>& ranks);

// What a checkpoint costs without ckptdb: the state written to `path` synchronously (write, then
// fsync), in seconds; -1 when it cannot be written (the file is removed then). The file stays.
double SyncWriteSeconds(const std::vector<Tensor>& model, const std::string& path);
// The restart's side of it: `bytes` of `path` read into `into` after its pages were dropped from
// the page cache (posix_fadvise DONTNEED on the clean pages: the read is the disk's), in seconds;
// -1 when it cannot be read whole.
double ColdReadSeconds(const std::string& path, uint8_t* into, uint64_t bytes);

}  // namespace ckpt::tools::demo
