// Names the calling thread (at most 15 bytes, the kernel's limit: longer names are cut), so that
// `top -H`, /proc/PID/task/*/comm, perf and gdb say which of ckptdb's threads is which.
#pragma once

#include <pthread.h>

#include <string>

namespace ckpt {

inline void SetThreadName(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace ckpt
