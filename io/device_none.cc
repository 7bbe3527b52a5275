// The host build's Device (io/device.h): there is none.
#include "io/device.h"

namespace ckpt::io {

bool DeviceBuild() { return false; }

Status OpenDevice(std::unique_ptr<Device>*) {
  return Status::NotSupported(
      "device memory needs a CUDA or HIP build (cmake -DCKPTDB_WITH_CUDA=ON or "
      "-DCKPTDB_WITH_HIP=ON)");
}

}  // namespace ckpt::io
