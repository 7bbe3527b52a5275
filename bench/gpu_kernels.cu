// bench/gpu_backend.h on CUDA device 0: memory from cudaMalloc, a fill kernel, and a spinning
// kernel as the trainer's compute on a stream of its own.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "bench/gpu_backend.h"

namespace bench {
namespace {

cudaStream_t g_trainer = nullptr;
int g_clock_khz = 0;

void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
    std::exit(2);
  }
}

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

void* Alloc(size_t bytes) {
  void* p = nullptr;
  CudaCheck(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void Release(void* p) { cudaFree(p); }
void Fill(void* p, size_t bytes, uint32_t seed) {
  FillKernel<<<1024, 256, 0, g_trainer>>>(static_cast<float*>(p), bytes / sizeof(float),
                                          static_cast<float>(seed));
  CudaCheck(cudaStreamSynchronize(g_trainer), "fill");
}
void StartCompute(int ms) {
  SpinKernel<<<1, 1, 0, g_trainer>>>(static_cast<long long>(g_clock_khz) * ms);
}
void FinishCompute() { CudaCheck(cudaStreamSynchronize(g_trainer), "compute"); }

}  // namespace

bool CudaBackend(GpuBackend* out, std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    *why = std::string("no CUDA device here (") + cudaGetErrorName(e) + ")";
    return false;
  }
  cudaDeviceProp prop{};
  CudaCheck(cudaGetDeviceProperties(&prop, 0), "properties");
  CudaCheck(cudaDeviceGetAttribute(&g_clock_khz, cudaDevAttrClockRate, 0), "clock");
  CudaCheck(cudaStreamCreateWithFlags(&g_trainer, cudaStreamNonBlocking), "stream");
  out->name = prop.name;
  out->device = "auto";
  out->alloc = Alloc;
  out->release = Release;
  out->fill = Fill;
  out->start_compute = StartCompute;
  out->finish_compute = FinishCompute;
  return true;
}

}  // namespace bench
