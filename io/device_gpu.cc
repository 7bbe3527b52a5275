// The GPU Device (io/device.h) for CUDA and HIP: one body, through the names below. Built
// with CKPTDB_WITH_CUDA (the CUDA runtime, CUDA::cudart) or CKPTDB_WITH_HIP (HIP's runtime on
// ROCm, whose API mirrors CUDA's call for call).
#if defined(CKPTDB_DEVICE_CUDA)
#include <cuda_runtime_api.h>
#define GPU(name) cuda##name
#define GPU_NAME "CUDA"
using GpuError = cudaError_t;
using GpuStream = cudaStream_t;
using GpuEvent = cudaEvent_t;
using GpuPointerAttributes = cudaPointerAttributes;
using GpuDeviceProp = cudaDeviceProp;
inline bool OnDevice(const cudaPointerAttributes& a) {
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
#elif defined(CKPTDB_DEVICE_HIP)
#include <hip/hip_runtime_api.h>
#define GPU(name) hip##name
#define GPU_NAME "HIP"
using GpuError = hipError_t;
using GpuStream = hipStream_t;
using GpuEvent = hipEvent_t;
using GpuPointerAttributes = hipPointerAttribute_t;
using GpuDeviceProp = hipDeviceProp_t;
inline bool OnDevice(const hipPointerAttribute_t& a) {  // HIP 5's fields (Debian 12's ROCm)
  return a.memoryType == hipMemoryTypeDevice || a.isManaged;
}
#else
#error "io/device_gpu.cc needs CKPTDB_DEVICE_CUDA or CKPTDB_DEVICE_HIP"
#endif

#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "io/device.h"

namespace ckpt::io {
namespace {

Status Fail(GpuError e, const std::string& what) {
  const char* name = GPU(GetErrorName)(e);
  const char* text = GPU(GetErrorString)(e);
  Status s = Status::IoError(what + ": " + GPU_NAME + " " + (name ? name : "error") + " (" +
                             (text ? text : "") + ")");
  return e == GPU(ErrorMemoryAllocation) ? Status::NoMemory(s.message()) : s;
}

// The calling thread's stream and event on the device: created once, kept for the thread's life
// (a capture worker or a restoring caller), destroyed with it.
struct ThreadStream {
  int device = -1;
  GpuStream stream = nullptr;
  GpuEvent done = nullptr;
  ~ThreadStream() {
    if (done != nullptr) (void)GPU(EventDestroy)(done);
    if (stream != nullptr) (void)GPU(StreamDestroy)(stream);
  }
};

class GpuDevice final : public Device {
 public:
  GpuDevice(int device, std::string description)
      : device_(device), description_(std::move(description)) {}

  std::string Describe() const override { return description_; }

  Status IsDeviceMemory(const void* p, bool* out) override {
    GpuPointerAttributes a{};
    GpuError e = GPU(PointerGetAttributes)(&a, p);
    if (e != GPU(Success)) {
      (void)GPU(GetLastError)();  // clear it: an unknown pointer is not a sticky error
      // Older runtimes refuse host memory they never saw: that is host memory.
      if (e == GPU(ErrorInvalidValue)) {
        *out = false;
        return Status::Ok();
      }
      return Fail(e, "asking where a pointer lives");
    }
    *out = OnDevice(a);
    return Status::Ok();
  }

  Status Pin(void* p, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    GpuError e = GPU(HostRegister)(p, bytes, GPU(HostRegisterPortable));
    if (e != GPU(Success)) {
      (void)GPU(GetLastError)();
      return Fail(e, "pinning " + std::to_string(bytes) + " bytes of staging memory");
    }
    return Status::Ok();
  }

  void Unpin(void* p) override {
    if (GPU(HostUnregister)(p) != GPU(Success)) (void)GPU(GetLastError)();
  }

  Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, GPU(MemcpyDeviceToHost), "copying device memory to the host");
  }

  Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, GPU(MemcpyHostToDevice), "copying host memory to the device");
  }

 private:
  Status Copy(void* dst, const void* src, size_t bytes, GPU(MemcpyKind) kind, const char* what) {
    if (bytes == 0) return Status::Ok();
    thread_local ThreadStream ts;
    GpuError e = GPU(SetDevice)(device_);
    if (e == GPU(Success) && ts.stream != nullptr && ts.device != device_) {
      ts.~ThreadStream();  // another device's: made anew for this one
      new (&ts) ThreadStream();
    }
    if (e == GPU(Success) && ts.stream == nullptr) {
      e = GPU(StreamCreateWithFlags)(&ts.stream, GPU(StreamNonBlocking));
      if (e == GPU(Success)) e = GPU(EventCreateWithFlags)(&ts.done, GPU(EventDisableTiming));
      ts.device = device_;
    }
    if (e == GPU(Success)) e = GPU(MemcpyAsync)(dst, src, bytes, kind, ts.stream);
    if (e == GPU(Success)) e = GPU(EventRecord)(ts.done, ts.stream);
    if (e == GPU(Success)) e = GPU(EventSynchronize)(ts.done);
    if (e != GPU(Success)) {
      (void)GPU(GetLastError)();
      return Fail(e, std::string(what) + " (" + std::to_string(bytes) + " bytes)");
    }
    return Status::Ok();
  }

  const int device_;
  const std::string description_;
};

}  // namespace

bool DeviceBuild() { return true; }

Status OpenDevice(std::unique_ptr<Device>* out) {
  int count = 0;
  GpuError e = GPU(GetDeviceCount)(&count);
  if (e != GPU(Success)) {
    (void)GPU(GetLastError)();
    return Status::NotSupported(Fail(e, "no usable " GPU_NAME " device").message());
  }
  if (count == 0) return Status::NotSupported("no " GPU_NAME " device");
  int device = 0;
  e = GPU(GetDevice)(&device);
  GpuDeviceProp prop{};
  if (e == GPU(Success)) e = GPU(GetDeviceProperties)(&prop, device);
  int runtime = 0;
  if (e == GPU(Success)) e = GPU(RuntimeGetVersion)(&runtime);
  if (e != GPU(Success)) {
    (void)GPU(GetLastError)();
    return Status::NotSupported(Fail(e, "opening " GPU_NAME " device").message());
  }
  *out = std::make_unique<GpuDevice>(device, std::string(GPU_NAME) + " device " +
                                                 std::to_string(device) + " (" + prop.name +
                                                 "), runtime " + std::to_string(runtime));
  return Status::Ok();
}

}  // namespace ckpt::io
