// Chunk checksums: XXH3-64 with seed 0, everywhere (segment header, record headers, payloads,
// manifest, footer, verify, restore). One code path only: LIMITS.md measured the plain shared
// XXH3_64bits falling to 3.9 GB/s in a thread that also called the dispatch variant, so ckptdb
// calls libxxhash's runtime-dispatched XXH3_64bits_dispatch (AVX-512/AVX2/SSE2) and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt::format {

uint64_t Xxh3(const void* data, size_t length_bytes);

// Streaming XXH3-64: the same value as Xxh3 over the concatenation of every Update. Capture
// copies a chunk in pieces that fit in L2 and hashes each piece right after copying it, while it
// is still in cache (DESIGN.md section 5).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Reset();
  void Update(const void* data, size_t length_bytes);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

}  // namespace ckpt::format
