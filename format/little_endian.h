// Fixed-offset little-endian field access for the on-disk and in-arena structures
// (docs/format.md). x86 and arm64 Linux are little-endian; the static_assert keeps a big-endian
// port from silently writing a different format.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ckpt::format::le {

static_assert(std::endian::native == std::endian::little, "format assumes a little-endian host");

template <typename T>
inline void Put(uint8_t* base, size_t offset, T v) {
  std::memcpy(base + offset, &v, sizeof(T));
}

template <typename T>
inline T Get(const uint8_t* base, size_t offset) {
  T v;
  std::memcpy(&v, base + offset, sizeof(T));
  return v;
}

// An 8-character magic ("CKPTSEG1") as the u64 it is stored as.
inline uint64_t Magic(const char (&m)[9]) {
  uint64_t v;
  std::memcpy(&v, m, 8);
  return v;
}

}  // namespace ckpt::format::le
