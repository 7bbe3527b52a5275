// GPU capture and restore against the raw copy engine (issue 8; docs/performance.md, "GPU").
// Built in a CUDA build only (bench_gpu_capture); needs a GPU to run:
//
//   build-cuda/bench_gpu_capture [--gib 2] [--shard-mib 64] [--repeats 5] [--compute-ms 200]
//                                [--capture-threads N (default: the library's, 2)]
//
// In one run, on one device buffer of --gib GiB (filled by a kernel):
//   - raw: cudaMemcpyAsync of the whole buffer into pinned host memory (cudaHostAlloc) in
//     pieces of ckptdb's chunk size, on one stream and on two, waited for on an event: the limit;
//   - ckptdb capture: put_shard (CKPTDB_PUT_DEVICE) of the buffer in --shard-mib shards into a ram
//     tier, timed to wait_capture; its rate / raw's (bar: >= 90%);
//   - blocked time of a training-like loop: a "compute" kernel of --compute-ms on the trainer's
//     stream, the put of the shards, wait_capture right before the "optimizer step" kernel that
//     rewrites the buffer, an asynchronous commit; blocked = put + wait_capture, next to the
//     time a synchronous copy of the whole state takes;
//   - restore into device memory, against the raw host-to-device copy.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace {

__global__ void FillKernel(float* p, size_t n, float base) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    p[i] = base + static_cast<float>(i % 1000003);
  }
}

__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
    std::exit(2);
  }
}

// One pass of raw copies of `bytes` in `piece`-byte pieces over `streams` streams.
double RawCopy(void* dst, const void* src, size_t bytes, size_t piece, int streams,
               cudaMemcpyKind kind) {
  std::vector<cudaStream_t> s(streams);
  std::vector<cudaEvent_t> done(streams);
  for (int i = 0; i < streams; ++i) {
    CudaCheck(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking), "stream");
    CudaCheck(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming), "event");
  }
  const auto t0 = bench::Clock::now();
  size_t k = 0;
  for (size_t off = 0; off < bytes; off += piece, ++k) {
    const size_t n = std::min(piece, bytes - off);
    CudaCheck(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + off,
                              static_cast<const uint8_t*>(src) + off, n, kind, s[k % streams]),
              "cudaMemcpyAsync");
  }
  for (int i = 0; i < streams; ++i) {
    CudaCheck(cudaEventRecord(done[i], s[i]), "record");
    CudaCheck(cudaEventSynchronize(done[i]), "synchronize");
  }
  const double secs = bench::Since(t0);
  for (int i = 0; i < streams; ++i) {
    cudaEventDestroy(done[i]);
    cudaStreamDestroy(s[i]);
  }
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 2;
  uint64_t shard_mib = 64;
  int repeats = 5;
  int compute_ms = 200;
  uint32_t capture_threads = 0;  // 0: the library's default
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--gib")
      gib = std::atof(argv[i + 1]);
    else if (a == "--shard-mib")
      shard_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--repeats")
      repeats = std::atoi(argv[i + 1]);
    else if (a == "--compute-ms")
      compute_ms = std::atoi(argv[i + 1]);
    else if (a == "--capture-threads")
      capture_threads = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_gpu_capture: no CUDA device here: nothing to measure\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CudaCheck(cudaGetDeviceProperties(&prop, 0), "properties");
  const size_t shard = shard_mib << 20;
  const size_t bytes = static_cast<size_t>(gib * (1ull << 30)) / shard * shard;
  const size_t chunk = 4 << 20;  // ckptdb's default chunk
  float* dev = nullptr;
  CudaCheck(cudaMalloc(&dev, bytes), "cudaMalloc");
  FillKernel<<<1024, 256>>>(dev, bytes / sizeof(float), 1.0f);
  CudaCheck(cudaDeviceSynchronize(), "fill");
  void* pinned = nullptr;
  CudaCheck(cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(pinned, 0, bytes);
  std::printf("device: %s; state %.2f GiB in %zu shards of %zu MiB; capture threads %s\n",
              prop.name, bytes / double(1ull << 30), bytes / shard, shard_mib,
              capture_threads == 0 ? "2 (default)" : std::to_string(capture_threads).c_str());

  std::vector<double> raw1, raw2, raw_h2d;
  for (int r = 0; r < repeats; ++r) {
    raw1.push_back(RawCopy(pinned, dev, bytes, chunk, 1, cudaMemcpyDeviceToHost));
    raw2.push_back(RawCopy(pinned, dev, bytes, chunk, 2, cudaMemcpyDeviceToHost));
    raw_h2d.push_back(RawCopy(dev, pinned, bytes, chunk, 2, cudaMemcpyHostToDevice));
  }
  const double raw = std::min(bench::Median(raw1), bench::Median(raw2));
  const double gb = bytes / 1e9;

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
  o.capture_threads = capture_threads;
  ckptdb* db = nullptr;
  bench::Check(ckptdb_open(&o, &db), "open");
  auto put_all = [&](uint64_t v) {
    for (size_t off = 0, i = 0; off < bytes; off += shard, ++i) {
      const std::string name = "shard" + std::to_string(i);
      bench::Check(ckptdb_put_shard(db, v, name.c_str(), reinterpret_cast<uint8_t*>(dev) + off,
                                    shard, nullptr, CKPTDB_PUT_DEVICE),
                   "put_shard");
    }
  };
  uint64_t v = 1;
  put_all(v);  // opens the device and pins staging: not timed
  bench::Check(ckptdb_commit(db, v++, 0), "commit");
  std::vector<double> capture;
  for (int r = 0; r < repeats; ++r, ++v) {
    const auto t0 = bench::Clock::now();
    put_all(v);
    bench::Check(ckptdb_wait_capture(db, v, -1), "wait_capture");
    capture.push_back(bench::Since(t0));
    bench::Check(ckptdb_commit(db, v, 0), "commit");
  }
  // The training-like loop.
  int clock_khz = 0;
  CudaCheck(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock");
  cudaStream_t trainer;
  CudaCheck(cudaStreamCreateWithFlags(&trainer, cudaStreamNonBlocking), "stream");
  std::vector<double> blocked, iteration;
  for (int r = 0; r < repeats; ++r, ++v) {
    const auto t0 = bench::Clock::now();
    SpinKernel<<<1, 1, 0, trainer>>>(static_cast<long long>(clock_khz) * compute_ms);  // compute
    const auto t1 = bench::Clock::now();
    put_all(v);
    bench::Check(ckptdb_wait_capture(db, v, -1), "wait_capture");
    const double b = bench::Since(t1);
    FillKernel<<<1024, 256, 0, trainer>>>(dev, bytes / sizeof(float), static_cast<float>(v));
    bench::Check(ckptdb_commit(db, v, CKPTDB_COMMIT_ASYNC), "commit");
    CudaCheck(cudaStreamSynchronize(trainer), "trainer");
    blocked.push_back(b);
    iteration.push_back(bench::Since(t0));
  }
  bench::Check(ckptdb_wait_commit(db, v - 1, nullptr, -1), "wait_commit");
  // Restore into device memory.
  std::vector<double> restore;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = bench::Clock::now();
    for (size_t off = 0, i = 0; off < bytes; off += shard, ++i) {
      const std::string name = "shard" + std::to_string(i);
      bench::Check(ckptdb_restore(db, v - 1, name.c_str(), reinterpret_cast<uint8_t*>(dev) + off,
                                  shard, CKPTDB_RESTORE_DEVICE),
                   "restore");
    }
    restore.push_back(bench::Since(t0));
  }
  ckptdb_close(db);
  std::filesystem::remove_all(dir);
  cudaFreeHost(pinned);
  cudaFree(dev);

  std::printf("raw D2H into pinned memory: 1 stream %.2f GB/s, 2 streams %.2f GB/s\n",
              gb / bench::Median(raw1), gb / bench::Median(raw2));
  std::printf(
      "ckptdb capture (copy + xxh3 into the ram tier): %.2f GB/s = %.1f%% of raw "
      "(bar >= 90%%)\n",
      gb / bench::Median(capture), 100 * raw / bench::Median(capture));
  std::printf(
      "training-like loop (%d ms compute): blocked %.1f ms per checkpoint (put + "
      "wait_capture), iteration %.1f ms; a synchronous copy of the state takes %.1f ms\n",
      compute_ms, 1e3 * bench::Median(blocked), 1e3 * bench::Median(iteration), 1e3 * raw);
  std::printf("restore into device memory: %.2f GB/s; raw H2D %.2f GB/s (%.1f%%)\n",
              gb / bench::Median(restore), gb / bench::Median(raw_h2d),
              100 * bench::Median(raw_h2d) / bench::Median(restore));
  return 0;
}
