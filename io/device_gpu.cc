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
inline bool OnDevice(const hipPointerAttribute_t& a) {
#if HIP_VERSION_MAJOR >= 6
  return a.type == hipMemoryTypeDevice || a.type == hipMemoryTypeManaged;
#else  // HIP 5 (Debian 12's ROCm)
  return a.memoryType == hipMemoryTypeDevice || a.isManaged;
#endif
}
#else
#error "io/device_gpu.cc needs CKPTDB_DEVICE_CUDA or CKPTDB_DEVICE_HIP"
#endif

#include <string>
#include <utility>
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

// The calling thread's stream and event on one device: created on its first copy there, kept
// for the thread's life (a capture worker or a restoring caller), destroyed with it.
struct ThreadStream {
  GpuStream stream = nullptr;
  GpuEvent done = nullptr;
  ThreadStream() = default;
  ThreadStream(const ThreadStream&) = delete;
  ThreadStream& operator=(const ThreadStream&) = delete;
  ThreadStream(ThreadStream&& o) noexcept : stream(o.stream), done(o.done) {
    o.stream = nullptr;
    o.done = nullptr;
  }
  ThreadStream& operator=(ThreadStream&& o) noexcept {
    std::swap(stream, o.stream);
    std::swap(done, o.done);
    return *this;
  }
  ~ThreadStream() {
    if (done != nullptr) (void)GPU(EventDestroy)(done);
    if (stream != nullptr) (void)GPU(StreamDestroy)(stream);
  }
};

class GpuDevice final : public Device {
 public:
  explicit GpuDevice(std::string description) : description_(std::move(description)) {}

  std::string Describe() const override { return description_; }

  Status Locate(const void* p, int* device) override {
    GpuPointerAttributes a{};
    GpuError e = GPU(PointerGetAttributes)(&a, p);
    if (e != GPU(Success)) {
      (void)GPU(GetLastError)();  // not sticky: an unknown pointer
      // Older runtimes refuse host memory they never saw: that is host memory.
      if (e == GPU(ErrorInvalidValue)) {
        *device = -1;
        return Status::Ok();
      }
      return Fail(e, "asking where a pointer lives");
    }
    *device = OnDevice(a) ? a.device : -1;
    return Status::Ok();
  }

  Status Pin(void* p, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    GpuError e = GPU(HostRegister)(p, bytes, GPU(HostRegisterPortable));
    if (e != GPU(Success)) {
      (void)GPU(GetLastError)();
      return Fail(e, "pinning " + std::to_string(bytes) + " bytes of host memory");
    }
    return Status::Ok();
  }

  void Unpin(void* p) override {
    if (GPU(HostUnregister)(p) != GPU(Success)) (void)GPU(GetLastError)();
  }

  Status CopyToHost(int device, void* dst, const void* src, size_t bytes) override {
    return Copy(device, dst, src, bytes, GPU(MemcpyDeviceToHost),
                "copying device memory to the host");
  }

  Status CopyToDevice(int device, void* dst, const void* src, size_t bytes) override {
    return Copy(device, dst, src, bytes, GPU(MemcpyHostToDevice),
                "copying host memory to the device");
  }

 private:
  Status Copy(int device, void* dst, const void* src, size_t bytes, GPU(MemcpyKind) kind,
              const char* what) {
    if (bytes == 0) return Status::Ok();
    if (device < 0 || device >= 1024) {
      return Status::Invalid(std::string(what) + ": device " + std::to_string(device));
    }
    thread_local std::vector<ThreadStream> streams;  // by device ordinal
    int previous = -1;
    GpuError e = GPU(GetDevice)(&previous);
    if (e == GPU(Success)) e = GPU(SetDevice)(device);
    if (e == GPU(Success) && streams.size() <= static_cast<size_t>(device)) {
      streams.resize(static_cast<size_t>(device) + 1);
    }
    if (e == GPU(Success) && streams[device].done == nullptr) {
      ThreadStream fresh;  // both or neither: a failure leaves nothing half made
      e = GPU(StreamCreateWithFlags)(&fresh.stream, GPU(StreamNonBlocking));
      if (e == GPU(Success)) {
        e = GPU(EventCreateWithFlags)(&fresh.done,
                                      GPU(EventDisableTiming) | GPU(EventBlockingSync));
      }
      if (e == GPU(Success)) streams[device] = std::move(fresh);
    }
    if (e == GPU(Success)) {
      ThreadStream& ts = streams[device];
      e = GPU(MemcpyAsync)(dst, src, bytes, kind, ts.stream);
      if (e == GPU(Success)) e = GPU(EventRecord)(ts.done, ts.stream);
      if (e == GPU(Success)) e = GPU(EventSynchronize)(ts.done);
    }
    if (previous >= 0 && previous != device) (void)GPU(SetDevice)(previous);
    if (e != GPU(Success)) {
      (void)GPU(GetLastError)();
      return Fail(e, std::string(what) + " (" + std::to_string(bytes) + " bytes, device " +
                         std::to_string(device) + ")");
    }
    return Status::Ok();
  }

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
  int runtime = 0;
  e = GPU(RuntimeGetVersion)(&runtime);
  if (e != GPU(Success)) {
    (void)GPU(GetLastError)();
    return Status::NotSupported(Fail(e, "opening the " GPU_NAME " runtime").message());
  }
  *out = std::make_unique<GpuDevice>(std::string(GPU_NAME) + " runtime " + std::to_string(runtime) +
                                     ", " + std::to_string(count) + " device(s)");
  return Status::Ok();
}

}  // namespace ckpt::io
