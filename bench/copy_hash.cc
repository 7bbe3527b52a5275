// How capture should copy and hash (DESIGN.md section 5: "the xxh3 of each chunk is computed
// while it is hot in cache"): a copy of --gib from a pre-faulted buffer into another, in 4 MiB
// chunks, each hashed with streaming XXH3 piece by piece right after the piece is copied, for
// several piece sizes, on one thread and on two, against a plain memcpy of the same bytes in the
// same run. engine/capture.cc's kCopyPieceBytes is chosen from this.
//
// Usage: bench_copy_hash [--gib G] [--repeats R]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "format/checksum.h"

namespace {

using bench::Clock;
using bench::Since;

constexpr size_t kChunkBytes = 4 << 20;

uint64_t CopyHashRange(uint8_t* dst, const uint8_t* src, size_t begin, size_t end, size_t piece) {
  uint64_t h = 0;
  for (size_t c = begin; c < end; c += kChunkBytes) {
    ckpt::format::Xxh3Stream hash;
    for (size_t off = c; off < c + kChunkBytes; off += piece) {
      std::memcpy(dst + off, src + off, piece);
      hash.Update(dst + off, piece);
    }
    h ^= hash.Digest();
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 2;
  int repeats = 3;
  CLI::App app{"copy and xxh3 against memcpy (docs/performance.md)"};
  app.add_option("--gib", gib)->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats)->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = static_cast<size_t>(gib * 1073741824.0) / kChunkBytes * kChunkBytes;
  uint8_t* src = bench::Allocate(bytes);
  uint8_t* dst = bench::Allocate(bytes);
  bench::Fill(src, bytes, 1);
  std::printf("bench_copy_hash: %.2f GiB in 4 MiB chunks, %d rounds (median)\n",
              bytes / 1073741824.0, repeats);
  std::printf("%-10s %12s %12s %12s %14s\n", "piece", "memcpy GB/s", "1 thread", "2 threads",
              "1 thread/memcpy");
  volatile uint64_t sink = 0;
  for (size_t piece :
       {size_t{16} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
    std::vector<double> m, one, two;
    for (int r = 0; r <= repeats; ++r) {
      auto t0 = Clock::now();
      std::memcpy(dst, src, bytes);
      double tm = Since(t0);
      t0 = Clock::now();
      sink = sink ^ CopyHashRange(dst, src, 0, bytes, piece);
      double t1 = Since(t0);
      t0 = Clock::now();
      uint64_t h2 = 0;
      std::thread helper([&] { h2 = CopyHashRange(dst, src, bytes / 2, bytes, piece); });
      sink = sink ^ CopyHashRange(dst, src, 0, bytes / 2, piece);
      helper.join();
      sink = sink ^ h2;
      double t2 = Since(t0);
      if (r > 0) {
        m.push_back(tm);
        one.push_back(t1);
        two.push_back(t2);
      }
    }
    double gm = bytes / bench::Median(m) / 1e9, g1 = bytes / bench::Median(one) / 1e9;
    double g2 = bytes / bench::Median(two) / 1e9;
    std::printf("%-7zu KiB %12.2f %12.2f %12.2f %13.0f%%\n", piece >> 10, gm, g1, g2,
                100 * g1 / gm);
  }
  return 0;
}
