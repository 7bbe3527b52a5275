// Device: GPU memory as capture and restore see it (DESIGN.md section 5, "Device pointers (CUDA,
// HIP) are copied by a device stream into the ring"). One interface; the backend is chosen at
// build time: CUDA (CKPTDB_WITH_CUDA) or HIP (CKPTDB_WITH_HIP), the same code in
// io/device_gpu.cc through either runtime API, or none (io/device_none.cc), the default host
// build, where every device call is refused as not supported.
//
// Copies run on a stream of the calling thread's own (created on its first copy, non-blocking
// with respect to the default stream) and are waited for on an event recorded after them:
// never a device-wide synchronize, so a trainer's kernels on other streams keep running. Each
// failure is a Status naming the runtime's error; nothing here aborts.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "util/status.h"

namespace ckpt::io {

class Device {
 public:
  virtual ~Device() = default;

  // "CUDA device 0 (NVIDIA H100 80GB HBM3), runtime 13000".
  virtual std::string Describe() const = 0;

  // Whether p points into device memory (device or managed allocations count; host memory,
  // pinned or not, does not). An error when the runtime cannot tell.
  virtual Status IsDeviceMemory(const void* p, bool* out) = 0;

  // Pins [p, p + bytes) of host memory so that copies to and from it are DMA, not staged
  // through the driver's bounce buffers (cudaHostRegister). Unpin undoes it.
  virtual Status Pin(void* p, size_t bytes) = 0;
  virtual void Unpin(void* p) = 0;

  // Copies device memory to host memory (and back) on the calling thread's stream and waits
  // for that copy's event.
  virtual Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
};

// True in a CUDA or HIP build.
bool DeviceBuild();

// The build's device (the calling thread's current one), or NotSupported saying why: a host
// build, no driver, no device.
Status OpenDevice(std::unique_ptr<Device>* out);

}  // namespace ckpt::io
