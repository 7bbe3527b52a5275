// The tree's one clock. Deadlines and durations use the monotonic clock (MonoNs, MonoMs); only
// what is written down for people or other processes (a record's creation time) uses the wall
// clock (WallNs), which can jump.
#pragma once

#include <chrono>
#include <cstdint>

namespace ckpt {

// Nanoseconds since the Unix epoch, for timestamps stored in records.
inline uint64_t WallNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Monotonic nanoseconds (an arbitrary origin), for durations.
inline uint64_t MonoNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Monotonic milliseconds, signed so that deadline arithmetic may go below zero.
inline int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ckpt
