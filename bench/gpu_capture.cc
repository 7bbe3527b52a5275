// Capture from and restore into device memory against the raw copy engine (issues 8 and 42;
// docs/performance.md, "GPU memory"). Built in every build:
//
//   bench_gpu_capture [--device cuda|sim] [--gib G] [--shard-mib 64] [--repeats R]
//                     [--compute-ms MS] [--capture-threads N] [--sim-gbps G]
//
// --device cuda (the default in a CUDA build) runs on CUDA device 0; --device sim (the default
// otherwise) on the simulated device (io/device_sim.h), its copy engines set to the bandwidth a
// single-threaded memcpy reaches here, measured first (or G GB/s). In one run, on one device buffer
// of --gib GiB (2 on a GPU, 0.5 simulated):
//   - raw: the device's own asynchronous copies (io/device.h: cudaMemcpyAsync on a GPU) of the
//     whole buffer into pinned host memory, in ckptdb's 4 MiB chunks, on one stream and on two,
//     waited for on an event: the limit; and back (H2D) on two streams;
//   - capture: put_shard (CKPTDB_PUT_DEVICE) of the buffer in --shard-mib shards into a ram tier,
//     timed to wait_capture; capture_ratio = its rate / raw D2H's (bar: >= 0.90);
//   - blocked per checkpoint in a training-like loop: the trainer's compute of --compute-ms is
//     queued (default: 200 ms on a GPU, and at least 2.5 copy times), the shards are put, the
//     trainer waits for its compute, then calls wait_capture right before the "optimizer step"
//     that rewrites the buffer, and commits asynchronously. Blocked = put + wait_capture: what the
//     trainer waits for beyond its own compute. blocked_ratio = blocked / one synchronous copy of
//     the state (bar: <= 0.10 when the compute is at least twice the copy);
//   - restore of every shard into device memory; restore_ratio = its rate / raw H2D's (bar:
//     >= 0.80 on a GPU, 0.90 simulated).
// The last line is `capture_ratio=... blocked_ratio=... restore_ratio=...`.
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gpu_backend.h"
#include "io/device.h"
#include "io/device_sim.h"

namespace bench {

#ifndef CKPTDB_BENCH_CUDA
bool CudaBackend(GpuBackend*, std::string* why) {
  *why = "a host build (cmake -DCKPTDB_WITH_CUDA=ON builds the CUDA benchmark)";
  return false;
}
#endif

namespace {

namespace sim = ckpt::io::sim;
using ckpt::io::CopyKind;

void OrDie(const ckpt::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
    std::exit(2);
  }
}

// The simulated device: memory from io/device_sim.h, a fill on the host, the compute a deadline.
Clock::time_point g_compute_until;
GpuBackend SimBackend() {
  GpuBackend b;
  b.device = "sim";
  b.alloc = [](size_t bytes) {
    void* p = sim::Allocate(0, bytes);
    if (p == nullptr) {
      std::fprintf(stderr, "simulated device: no memory for %zu bytes\n", bytes);
      std::exit(2);
    }
    return p;
  };
  b.release = [](void* p) { sim::Free(p); };
  b.fill = [](void* p, size_t bytes, uint32_t seed) {
    Fill(static_cast<uint8_t*>(p), bytes, seed);
  };
  b.start_compute = [](int ms) { g_compute_until = Clock::now() + std::chrono::milliseconds(ms); };
  b.finish_compute = [] { std::this_thread::sleep_until(g_compute_until); };
  return b;
}

// The best of a few single-threaded memcpys of `bytes` between faulted-in buffers, bytes/s.
double MemcpyRate(size_t bytes) {
  uint8_t* a = Allocate(bytes);
  uint8_t* b = Allocate(bytes);
  Fill(a, bytes, 1);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b, a, bytes);
    best = std::max(best, bytes / Since(t0));
  }
  munmap(a, bytes);
  munmap(b, bytes);
  return best;
}

// One pass of the device's own copies of `bytes` in `piece`-byte pieces over `streams` streams,
// waited for on an event each: seconds.
double RawCopy(ckpt::io::Device* dev, void* dst, const void* src, size_t bytes, size_t piece,
               int streams, CopyKind kind) {
  std::vector<ckpt::io::DeviceStream*> s(streams);
  std::vector<ckpt::io::DeviceEvent*> done(streams);
  for (int i = 0; i < streams; ++i) {
    OrDie(dev->CreateStream(0, &s[i]), "stream");
    OrDie(dev->CreateEvent(0, &done[i]), "event");
  }
  const auto t0 = Clock::now();
  size_t k = 0;
  for (size_t off = 0; off < bytes; off += piece, ++k) {
    const size_t n = std::min(piece, bytes - off);
    OrDie(dev->CopyAsync(s[k % streams], static_cast<uint8_t*>(dst) + off,
                         static_cast<const uint8_t*>(src) + off, n, kind),
          "copy");
  }
  for (int i = 0; i < streams; ++i) {
    OrDie(dev->Record(done[i], s[i]), "record");
    OrDie(dev->Wait(done[i]), "wait");
  }
  const double secs = Since(t0);
  for (int i = 0; i < streams; ++i) {
    dev->DestroyEvent(done[i]);
    dev->DestroyStream(s[i]);
  }
  return secs;
}

struct Args {
  std::string device;
  double gib = 0;
  uint64_t shard_mib = 64;
  int repeats = 5;
  int compute_ms = 0;
  uint32_t capture_threads = 0;  // 0: the library's default
  double sim_gbps = 0;           // the simulated engines' bandwidth; 0: memcpy's here
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--device") {
      a.device = v;
    } else if (k == "--gib") {
      a.gib = std::atof(v);
    } else if (k == "--shard-mib") {
      a.shard_mib = std::strtoull(v, nullptr, 10);
    } else if (k == "--repeats") {
      a.repeats = std::atoi(v);
    } else if (k == "--compute-ms") {
      a.compute_ms = std::atoi(v);
    } else if (k == "--sim-gbps") {
      a.sim_gbps = std::atof(v);
    } else if (k == "--capture-threads") {
      a.capture_threads = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "%s takes a value\n", argv[argc - 1]);
    std::exit(2);
  }
  return a;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  Args a = Parse(argc, argv);
  GpuBackend gpu;
  std::string why;
  const bool cuda = CudaBackend(&gpu, &why);
  if (a.device.empty()) a.device = cuda ? "cuda" : "sim";
  if (a.device == "cuda" && !cuda) {
    std::fprintf(stderr, "bench_gpu_capture --device cuda: %s; --device sim runs here\n",
                 why.c_str());
    return 2;
  }
  if (a.device != "cuda" && a.device != "sim") {
    std::fprintf(stderr, "--device %s: cuda or sim\n", a.device.c_str());
    return 2;
  }
  const bool simulated = a.device == "sim";
  if (a.gib <= 0) a.gib = simulated ? 0.5 : 2;
  if (a.shard_mib == 0 || a.repeats < 1) {
    std::fprintf(stderr, "--shard-mib and --repeats must be positive\n");
    return 2;
  }
  const size_t shard = a.shard_mib << 20;
  const size_t bytes = static_cast<size_t>(a.gib * (1ull << 30)) / shard * shard;
  if (bytes == 0) {
    std::fprintf(stderr, "--gib %.3f holds no --shard-mib %llu shard\n", a.gib,
                 static_cast<unsigned long long>(a.shard_mib));
    return 2;
  }
  const size_t chunk = 4 << 20;  // ckptdb's default chunk
  double memcpy_rate = 0;
  if (simulated) {
    gpu = SimBackend();
    memcpy_rate = MemcpyRate(std::min<size_t>(bytes, size_t{256} << 20));
    const double engine = a.sim_gbps > 0 ? a.sim_gbps * 1e9 : memcpy_rate;
    sim::Config c;
    c.to_host_bytes_per_s = c.to_device_bytes_per_s = static_cast<uint64_t>(engine);
    OrDie(sim::Configure(c), "configuring the simulated device");
    gpu.name = "simulated device, copy engines at " +
               std::to_string(memcpy_rate / 1e9).substr(0, 5) + " GB/s (one memcpy thread here)";
  }
  std::unique_ptr<ckpt::io::Device> dev;
  OrDie(ckpt::io::OpenDevice(gpu.device, &dev), "opening the device");
  uint8_t* state = static_cast<uint8_t*>(gpu.alloc(bytes));
  gpu.fill(state, bytes, 1);
  uint8_t* pinned = Allocate(bytes);
  OrDie(dev->Pin(pinned, bytes), "pinning host memory");

  std::vector<double> raw1, raw2, raw_h2d;
  for (int r = 0; r < a.repeats; ++r) {
    raw1.push_back(RawCopy(dev.get(), pinned, state, bytes, chunk, 1, CopyKind::kToHost));
    raw2.push_back(RawCopy(dev.get(), pinned, state, bytes, chunk, 2, CopyKind::kToHost));
    raw_h2d.push_back(RawCopy(dev.get(), state, pinned, bytes, chunk, 2, CopyKind::kToDevice));
  }
  const double raw = std::min(Median(raw1), Median(raw2));  // one synchronous copy of the state
  const double gb = bytes / 1e9;
  if (a.compute_ms <= 0) a.compute_ms = std::max(200, static_cast<int>(2.5e3 * raw) + 1);
  std::printf("device: %s; state %.2f GiB in %zu shards of %llu MiB; capture threads %s\n",
              gpu.name.c_str(), bytes / double(1ull << 30), bytes / shard,
              static_cast<unsigned long long>(a.shard_mib),
              a.capture_threads == 0 ? "2 (default)" : std::to_string(a.capture_threads).c_str());

  const std::string dir = "/dev/shm/ckptdb-bench-gpu";
  std::filesystem::remove_all(dir);
  const std::string tiers =
      "ram:" + std::to_string(bytes * 5 / 2 >> 20) + "M,keep=1,dir=" + dir + "/shm";
  const std::string root = dir + "/root";
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = 0;
  o.world_size = 1;
  o.capture_threads = a.capture_threads;
  o.device = gpu.device;
  ckptdb* db = nullptr;
  Check(ckptdb_open(&o, &db), "open");
  auto put_all = [&](uint64_t v) {
    for (size_t off = 0, i = 0; off < bytes; off += shard, ++i) {
      const std::string name = "shard" + std::to_string(i);
      Check(ckptdb_put_shard(db, v, name.c_str(), state + off, shard, nullptr, CKPTDB_PUT_DEVICE),
            "put_shard");
    }
  };
  uint64_t v = 1;
  put_all(v);  // opens the device and pins staging: not timed
  Check(ckptdb_commit(db, v++, 0), "commit");
  std::vector<double> capture;
  for (int r = 0; r < a.repeats; ++r, ++v) {
    const auto t0 = Clock::now();
    put_all(v);
    Check(ckptdb_wait_capture(db, v, -1), "wait_capture");
    capture.push_back(Since(t0));
    Check(ckptdb_commit(db, v, 0), "commit");
  }
  std::vector<double> blocked, iteration;
  for (int r = 0; r < a.repeats; ++r, ++v) {
    const auto t0 = Clock::now();
    gpu.start_compute(a.compute_ms);
    const auto t1 = Clock::now();
    put_all(v);
    const double put = Since(t1);
    gpu.finish_compute();
    const auto t2 = Clock::now();
    Check(ckptdb_wait_capture(db, v, -1), "wait_capture");
    blocked.push_back(put + Since(t2));
    gpu.fill(state, bytes, static_cast<uint32_t>(v));  // the optimizer step
    Check(ckptdb_commit(db, v, CKPTDB_COMMIT_ASYNC), "commit");
    iteration.push_back(Since(t0));
  }
  Check(ckptdb_wait_commit(db, v - 1, nullptr, -1), "wait_commit");
  std::vector<double> restore;
  for (int r = 0; r < a.repeats; ++r) {
    const auto t0 = Clock::now();
    for (size_t off = 0, i = 0; off < bytes; off += shard, ++i) {
      const std::string name = "shard" + std::to_string(i);
      Check(ckptdb_restore(db, v - 1, name.c_str(), state + off, shard, CKPTDB_RESTORE_DEVICE),
            "restore");
    }
    restore.push_back(Since(t0));
  }
  ckptdb_close(db);
  std::filesystem::remove_all(dir);
  dev->Unpin(pinned);
  munmap(pinned, bytes);
  gpu.release(state);

  const double capture_ratio = raw / Median(capture);
  const double blocked_ratio = Median(blocked) / raw;
  const double restore_ratio = Median(raw_h2d) / Median(restore);
  if (simulated) std::printf("memcpy here, one thread: %.2f GB/s\n", memcpy_rate / 1e9);
  std::printf("raw D2H into pinned memory: 1 stream %.2f GB/s, 2 streams %.2f GB/s\n",
              gb / Median(raw1), gb / Median(raw2));
  std::printf("ckptdb capture (to wait_capture, into the ram tier): %.2f GB/s = %.1f%% of raw\n",
              gb / Median(capture), 100 * capture_ratio);
  std::printf(
      "training-like loop (%d ms compute): blocked %.2f ms per checkpoint (put + wait_capture "
      "after the compute), iteration %.1f ms; one synchronous copy of the state %.1f ms\n",
      a.compute_ms, 1e3 * Median(blocked), 1e3 * Median(iteration), 1e3 * raw);
  std::printf("restore into device memory: %.2f GB/s; raw H2D %.2f GB/s (%.1f%%)\n",
              gb / Median(restore), gb / Median(raw_h2d), 100 * restore_ratio);
  std::printf("capture_ratio=%.3f blocked_ratio=%.3f restore_ratio=%.3f\n", capture_ratio,
              blocked_ratio, restore_ratio);
  return 0;
}
