// What the benchmarks share: pre-faulted buffers, medians, the raw-limit loops they compare
// ckptdb against (memcpy, write+fsync, O_DIRECT write, read), and page-cache dropping. Every
// limit is measured in the same run as the figure it is compared with (LIMITS.md: these VMs are
// noisy, only ratios taken side by side mean anything).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"

namespace bench {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Page-aligned, faulted in now: LIMITS.md measured first touch at 0.3 GB/s on these VMs, and a
// benchmark must not time the page allocator.
inline uint8_t* Allocate(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  return static_cast<uint8_t*>(p);
}

// Distinct, incompressible bytes (a splitmix64 stream).
inline void Fill(uint8_t* p, size_t bytes, uint64_t seed) {
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t z = (i / 8 + seed + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    std::memcpy(p + i, &z, 8);
  }
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline void Check(int rc, const char* what) {
  if (rc != CKPTDB_OK) {
    std::fprintf(stderr, "%s: %s: %s\n", what, ckptdb_status_name(rc), ckptdb_last_error());
    std::exit(1);
  }
}

// write(2) of all `bytes` at fd's offset, `piece` bytes a call; exits on an error.
inline void WriteAll(int fd, const uint8_t* src, size_t bytes, size_t piece) {
  for (size_t off = 0; off < bytes;) {
    ssize_t n = write(fd, src + off, std::min(piece, bytes - off));
    if (n <= 0) {
      std::perror("write");
      std::exit(2);
    }
    off += static_cast<size_t>(n);
  }
}

// write(2) of `bytes` into a new file in pieces of `piece` bytes, then fsync and close; with
// direct, through O_DIRECT (src and piece 4096-aligned). Returns seconds. The file is left.
inline double RawWrite(const std::string& path, const uint8_t* src, size_t bytes, size_t piece,
                       bool direct) {
  auto t0 = Clock::now();
  int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(2);
  }
  WriteAll(fd, src, bytes, piece);
  fsync(fd);
  close(fd);
  return Since(t0);
}

// read(2) of a whole file in pieces. Returns seconds.
inline double RawRead(const std::string& path, uint8_t* dst, size_t bytes, size_t piece) {
  auto t0 = Clock::now();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(2);
  }
  for (size_t off = 0; off < bytes;) {
    ssize_t n = read(fd, dst + off, std::min(piece, bytes - off));
    if (n <= 0) {
      std::perror("read");
      std::exit(2);
    }
    off += static_cast<size_t>(n);
  }
  close(fd);
  return Since(t0);
}

// Drops the clean page cache of every file under dir, so reads come from the device.
inline void DropCache(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

}  // namespace bench
