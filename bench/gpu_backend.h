// The device a GPU benchmark runs on (bench/gpu_capture.cc): device memory, filling it, and a
// trainer's compute, for a real GPU (bench/gpu_kernels.cu, a CUDA build) or the simulated device
// (io/device_sim.h, every build).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bench {

struct GpuBackend {
  std::string name;         // printed: the card, or the simulated device
  const char* device = "";  // ckptdb_options.device and io::OpenDevice's `which`
  void* (*alloc)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
  void (*fill)(void* p, size_t bytes, uint32_t seed) = nullptr;  // synchronous
  void (*start_compute)(int ms) = nullptr;  // queued on the trainer's stream; returns at once
  void (*finish_compute)() = nullptr;       // waits for it
};

// The CUDA device 0, or false with *why (no device, or a host build).
bool CudaBackend(GpuBackend* out, std::string* why);

}  // namespace bench
