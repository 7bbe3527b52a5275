// The host build's GPU runtime (io/device.h): there is none. The simulated device
// (io/device_sim.h) is still there.
#include "io/device.h"

namespace ckpt::io {

bool DeviceBuild() { return false; }

Status OpenRuntimeDevice(std::unique_ptr<Device>*) {
  return Status::NotSupported(
      "device memory needs a CUDA or HIP build (cmake -DCKPTDB_WITH_CUDA=ON or "
      "-DCKPTDB_WITH_HIP=ON), or the simulated device (device \"sim\", CKPTDB_DEVICE=sim)");
}

}  // namespace ckpt::io
