// Device: GPU memory as capture and restore see it (DESIGN.md section 5). One interface, three
// backends: the build's GPU runtime, CUDA (CKPTDB_WITH_CUDA) or HIP (CKPTDB_WITH_HIP), the same
// code in io/device_gpu.cc through either runtime API; none (io/device_none.cc, the default host
// build), where the runtime is refused as not supported; and the simulated device
// (io/device_sim.h), built in every build, whose copy engines are threads.
//
// The interface is the runtime's asynchronous one, and no more of it than ckptdb uses: streams
// (each a FIFO of copies on one device, non-blocking with respect to the default stream),
// copies queued on a stream, and events recorded after them, queried or waited for (blocking,
// not spinning). Never a device-wide synchronize, so a trainer's kernels on other streams keep
// running. Copies are not ordered after the caller's own work: the caller makes sure the kernels
// writing a tensor are done before it is put (and that none still reads a restore's destination).
// io/device_queue.h drives these calls; nothing else in the engine makes them. Each failure is a
// Status naming the runtime's error; nothing here aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace ckpt::io {

enum class CopyKind : uint8_t { kToHost, kToDevice };

// A backend's stream and event: opaque, made and destroyed by the Device that owns them.
struct DeviceStream;
struct DeviceEvent;

class Device {
 public:
  virtual ~Device() = default;

  // "CUDA runtime 13000, 2 devices", "simulated device, 1 device, ...".
  virtual std::string Describe() const = 0;

  // Where p points: *device is the ordinal of the GPU whose memory it is (device or managed
  // memory), -1 for host memory (pinned or not). An error when the runtime cannot tell (after a
  // sticky error of the caller's kernels, for one).
  virtual Status Locate(const void* p, int* device) = 0;

  // Pins [p, p + bytes) of host memory so that copies to and from it are DMA, not staged
  // through the driver's bounce buffers (cudaHostRegister). Unpin undoes it. Slow (it touches
  // every page): done once per region, at open, never per copy.
  virtual Status Pin(void* p, size_t bytes) = 0;
  virtual void Unpin(void* p) = 0;

  // A stream on GPU `device`; destroyed by DestroyStream once nothing queued on it is waited
  // for any more.
  virtual Status CreateStream(int device, DeviceStream** out) = 0;
  virtual void DestroyStream(DeviceStream* s) = 0;
  virtual Status CreateEvent(int device, DeviceEvent** out) = 0;
  virtual void DestroyEvent(DeviceEvent* e) = 0;

  // Queues a copy of `bytes` on s and returns: device memory to host memory (kToHost) or back.
  // An error here means the copy was refused and will not run (a bad pointer or length, a
  // sticky error); one found while it runs is reported by the next event recorded after it.
  virtual Status CopyAsync(DeviceStream* s, void* dst, const void* src, size_t bytes,
                           CopyKind kind) = 0;
  // e completes once everything queued on s before this call has.
  virtual Status Record(DeviceEvent* e, DeviceStream* s) = 0;
  // *done: whether e has completed. The error of a copy before it, once it has.
  virtual Status Query(DeviceEvent* e, bool* done) = 0;
  // Blocks until e has completed; the error of a copy before it, if one failed.
  virtual Status Wait(DeviceEvent* e) = 0;
};

// True in a CUDA or HIP build.
bool DeviceBuild();

// `which`: "auto" (or empty), the build's GPU runtime, or NotSupported saying why (a host build,
// no driver, no device); "sim", the process's simulated device (io/device_sim.h). Anything else
// is Invalid.
Status OpenDevice(const std::string& which, std::unique_ptr<Device>* out);

// "copying device memory to the host (N bytes, device D)": what an error of a copy names.
std::string DescribeCopy(CopyKind kind, size_t bytes, int device);

// The build's GPU runtime (io/device_gpu.cc or io/device_none.cc); OpenDevice's "auto".
Status OpenRuntimeDevice(std::unique_ptr<Device>* out);

}  // namespace ckpt::io
