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

#include <memory>
#include <string>
#include <utility>

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

}  // namespace

// The runtime's stream and event, with the device they belong to (calls on them make it the
// calling thread's current device for their length, then put back the one it was).
struct DeviceStream {
  int device = 0;
  GpuStream stream = nullptr;
};
struct DeviceEvent {
  int device = 0;
  GpuEvent event = nullptr;
};

namespace {

// Makes `device` the calling thread's current one for its scope.
class OnDeviceScope {
 public:
  explicit OnDeviceScope(int device) {
    error_ = GPU(GetDevice)(&previous_);
    if (error_ == GPU(Success) && previous_ != device) error_ = GPU(SetDevice)(device);
  }
  ~OnDeviceScope() {
    int now = -1;
    if (previous_ >= 0 && GPU(GetDevice)(&now) == GPU(Success) && now != previous_) {
      (void)GPU(SetDevice)(previous_);
    }
  }
  OnDeviceScope(const OnDeviceScope&) = delete;
  OnDeviceScope& operator=(const OnDeviceScope&) = delete;
  GpuError error() const { return error_; }

 private:
  int previous_ = -1;
  GpuError error_;
};

Status Check(GpuError e, const std::string& what) {
  if (e == GPU(Success)) return Status::Ok();
  (void)GPU(GetLastError)();
  return Fail(e, what);
}

class GpuDevice final : public Device {
 public:
  GpuDevice(std::string description, int count)
      : description_(std::move(description)), count_(count) {}

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
    return Check(GPU(HostRegister)(p, bytes, GPU(HostRegisterPortable)),
                 "pinning " + std::to_string(bytes) + " bytes of host memory");
  }

  void Unpin(void* p) override {
    if (GPU(HostUnregister)(p) != GPU(Success)) (void)GPU(GetLastError)();
  }

  Status CreateStream(int device, DeviceStream** out) override {
    CKPTDB_RETURN_IF_ERROR(CheckOrdinal(device, "creating a stream"));
    OnDeviceScope on(device);
    CKPTDB_RETURN_IF_ERROR(Check(on.error(), "selecting device " + std::to_string(device)));
    auto s = std::make_unique<DeviceStream>();
    s->device = device;
    CKPTDB_RETURN_IF_ERROR(Check(GPU(StreamCreateWithFlags)(&s->stream, GPU(StreamNonBlocking)),
                                 "creating a stream on device " + std::to_string(device)));
    *out = s.release();
    return Status::Ok();
  }
  void DestroyStream(DeviceStream* s) override {
    if (s == nullptr) return;
    OnDeviceScope on(s->device);
    if (GPU(StreamDestroy)(s->stream) != GPU(Success)) (void)GPU(GetLastError)();
    delete s;
  }

  Status CreateEvent(int device, DeviceEvent** out) override {
    CKPTDB_RETURN_IF_ERROR(CheckOrdinal(device, "creating an event"));
    OnDeviceScope on(device);
    CKPTDB_RETURN_IF_ERROR(Check(on.error(), "selecting device " + std::to_string(device)));
    auto e = std::make_unique<DeviceEvent>();
    e->device = device;
    CKPTDB_RETURN_IF_ERROR(Check(
        GPU(EventCreateWithFlags)(&e->event, GPU(EventDisableTiming) | GPU(EventBlockingSync)),
        "creating an event on device " + std::to_string(device)));
    *out = e.release();
    return Status::Ok();
  }
  void DestroyEvent(DeviceEvent* e) override {
    if (e == nullptr) return;
    OnDeviceScope on(e->device);
    if (GPU(EventDestroy)(e->event) != GPU(Success)) (void)GPU(GetLastError)();
    delete e;
  }

  Status CopyAsync(DeviceStream* s, void* dst, const void* src, size_t bytes,
                   CopyKind kind) override {
    OnDeviceScope on(s->device);
    GpuError e = on.error();
    if (e == GPU(Success)) {
      e = GPU(MemcpyAsync)(
          dst, src, bytes,
          kind == CopyKind::kToHost ? GPU(MemcpyDeviceToHost) : GPU(MemcpyHostToDevice), s->stream);
    }
    if (e == GPU(Success)) return Status::Ok();
    return Check(e, DescribeCopy(kind, bytes, s->device));
  }

  // The calls below run for every copy: their messages are made only on an error.
  Status Record(DeviceEvent* e, DeviceStream* s) override {
    OnDeviceScope on(s->device);
    GpuError r = on.error();
    if (r == GPU(Success)) r = GPU(EventRecord)(e->event, s->stream);
    if (r == GPU(Success)) return Status::Ok();
    return Check(r, "recording an event on device " + std::to_string(s->device));
  }

  Status Query(DeviceEvent* e, bool* done) override {
    OnDeviceScope on(e->device);
    GpuError r = GPU(EventQuery)(e->event);
    *done = r != GPU(ErrorNotReady);
    if (r == GPU(ErrorNotReady) || r == GPU(Success)) return Status::Ok();
    return Check(r, "a copy on device " + std::to_string(e->device));
  }

  Status Wait(DeviceEvent* e) override {
    OnDeviceScope on(e->device);
    GpuError r = GPU(EventSynchronize)(e->event);
    if (r == GPU(Success)) return Status::Ok();
    return Check(r, "a copy on device " + std::to_string(e->device));
  }

 private:
  Status CheckOrdinal(int device, const char* what) const {
    if (device < 0 || device >= count_) {
      return Status::Invalid(std::string(what) + ": device " + std::to_string(device) +
                             " is not one of the " + std::to_string(count_) + " present");
    }
    return Status::Ok();
  }

  const std::string description_;
  const int count_;
};

}  // namespace

bool DeviceBuild() { return true; }

Status OpenRuntimeDevice(std::unique_ptr<Device>* out) {
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
                                         ", " + std::to_string(count) + " device(s)",
                                     count);
  return Status::Ok();
}

}  // namespace ckpt::io
