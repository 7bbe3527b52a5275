// Device: GPU memory as capture and restore see it (DESIGN.md section 5, "Device pointers (CUDA,
// HIP) are copied by a device stream into the ring"). One interface; the backend is chosen at
// build time: CUDA (CKPTDB_WITH_CUDA) or HIP (CKPTDB_WITH_HIP), the same code in
// io/device_gpu.cc through either runtime API, or none (io/device_none.cc), the default host
// build, where every device call is refused as not supported.
//
// Copies run on a stream of the calling thread's own for the pointer's device (created on its
// first copy there, non-blocking with respect to the default stream) and are waited for on an
// event recorded after them (blocking, not spinning): never a device-wide synchronize, so a
// trainer's kernels on other streams keep running. They are not ordered after the caller's own
// work: the caller makes sure the kernels writing a tensor are done before it is put (and that
// none still reads a restore's destination). Each failure is a Status naming the runtime's
// error; nothing here aborts.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "util/status.h"

namespace ckpt::io {

class Device {
 public:
  virtual ~Device() = default;

  // "CUDA runtime 13000, 2 devices".
  virtual std::string Describe() const = 0;

  // Where p points: *device is the ordinal of the GPU whose memory it is (device or managed
  // memory), -1 for host memory (pinned or not). An error when the runtime cannot tell (after a
  // sticky error of the caller's kernels, for one).
  virtual Status Locate(const void* p, int* device) = 0;

  // Pins [p, p + bytes) of host memory so that copies to and from it are DMA, not staged
  // through the driver's bounce buffers (cudaHostRegister). Unpin undoes it.
  virtual Status Pin(void* p, size_t bytes) = 0;
  virtual void Unpin(void* p) = 0;

  // Copies GPU `device`'s memory to host memory (and back) on the calling thread's stream for
  // that device, and waits for that copy's event. The calling thread's current device is as it
  // was after the call.
  virtual Status CopyToHost(int device, void* dst, const void* src, size_t bytes) = 0;
  virtual Status CopyToDevice(int device, void* dst, const void* src, size_t bytes) = 0;
};

// True in a CUDA or HIP build.
bool DeviceBuild();

// The build's GPU runtime, or NotSupported saying why: a host build, no driver, no device.
Status OpenDevice(std::unique_ptr<Device>* out);

}  // namespace ckpt::io
