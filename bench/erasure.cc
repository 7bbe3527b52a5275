// Issue 5's coding benchmarks (docs/performance.md, "Coding groups"), each against a limit
// measured in the same run over the same buffers:
//
//   encode      ErasureCode::Encode (all M parity blocks of K data blocks) against a bare ISA-L
//               loop: ec_init_tables once, then ec_encode_data over the same blocks.
//   accumulate  what a parity holder does (ErasureCode::Update, one data block at a time into the
//               M rows, as blocks arrive) against the same bare encode.
//   sender      what the group does encoded at the senders (ec:K+M,encode=sender): each data
//               block's M partial products (ErasureCode::Partial, one pass), then each XORed into
//               its row (XorInto, the holder's part), against the same bare encode; and the
//               senders' part alone.
//   decode      ErasureCode::Decode of M lost data blocks from K survivors (matrix inversion
//               included) against bare ISA-L: gf_invert_matrix, ec_init_tables, ec_encode_data.
// (The memory a scheme costs is a size, not a rate: tests/parity_store_test.cc prints and checks
// it, EverySchemesParityMemoryIsAboutKPlusMOverK.)
// Rates are data bytes (K blocks) per second; blocks are pre-faulted and incompressible; each
// figure is the median of --repeats rounds, the two sides alternating.
//
// Usage: bench_erasure [--block-mib B] [--repeats R] [--codes 4+2,8+2,6+3]
#include <isa-l/erasure_code.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "redundancy/erasure_code.h"

namespace {

using namespace ckpt;
using namespace ckpt::redundancy;
using bench::Allocate;
using bench::Clock;
using bench::Median;
using bench::Since;

struct Blocks {
  std::vector<uint8_t*> data, parity, out, partial;
};

Blocks MakeBlocks(const CodeSpec& spec, size_t bytes) {
  Blocks b;
  for (uint32_t i = 0; i < spec.k; ++i) {
    b.data.push_back(Allocate(bytes));
    bench::Fill(b.data.back(), bytes, 1000 + i);
  }
  for (uint32_t r = 0; r < spec.m; ++r) {
    b.parity.push_back(Allocate(bytes));
    b.out.push_back(Allocate(bytes));
    b.partial.push_back(Allocate(bytes));
  }
  return b;
}

double BareEncode(const CodeSpec& spec, const std::vector<uint8_t>& matrix, size_t bytes,
                  Blocks& b) {
  std::vector<uint8_t> tables(size_t{32} * spec.k * spec.m);
  const Clock::time_point t0 = Clock::now();
  ec_init_tables(static_cast<int>(spec.k), static_cast<int>(spec.m),
                 const_cast<uint8_t*>(&matrix[size_t{spec.k} * spec.k]), tables.data());
  ec_encode_data(static_cast<int>(bytes), static_cast<int>(spec.k), static_cast<int>(spec.m),
                 tables.data(), b.data.data(), b.out.data());
  return Since(t0);
}

double BareDecode(const CodeSpec& spec, const std::vector<uint8_t>& matrix, size_t bytes,
                  Blocks& b) {
  // Data blocks 0..M-1 lost: survivors are data M..K-1 and every parity block.
  const uint32_t k = spec.k, m = spec.m;
  const Clock::time_point t0 = Clock::now();
  std::vector<uint8_t> sub(size_t{k} * k), inverse(size_t{k} * k);
  std::vector<uint8_t*> present;
  for (uint32_t i = 0; i < k; ++i) {
    const uint32_t index = i < k - m ? m + i : k + (i - (k - m));
    std::memcpy(&sub[size_t{i} * k], &matrix[size_t{index} * k], k);
    present.push_back(index < k ? b.data[index] : b.parity[index - k]);
  }
  gf_invert_matrix(sub.data(), inverse.data(), static_cast<int>(k));
  std::vector<uint8_t> tables(size_t{32} * k * m);
  ec_init_tables(static_cast<int>(k), static_cast<int>(m), inverse.data(), tables.data());
  ec_encode_data(static_cast<int>(bytes), static_cast<int>(k), static_cast<int>(m), tables.data(),
                 present.data(), b.out.data());
  return Since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  size_t block_mib = 16;
  int repeats = 7;
  std::vector<std::string> codes = {"ec:4+2", "ec:8+2", "ec:6+3"};
  std::vector<std::string> shapes;
  CLI::App app{"ckptdb's erasure code against bare ISA-L (docs/performance.md)"};
  app.add_option("--block-mib", block_mib)->check(CLI::Range(size_t{1}, size_t{1024}));
  app.add_option("--repeats", repeats)->check(CLI::Range(1, 1000));
  app.add_option("--codes", shapes, "K+M shapes, comma separated (4+2,8+2,6+3)")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (!shapes.empty()) {
    codes.clear();
    for (const std::string& shape : shapes) codes.push_back("ec:" + shape);
  }
  const size_t bytes = block_mib << 20;
  std::printf(
      "== coding: blocks of %zu MiB, median of %d rounds; rates are data bytes (K blocks) "
      "per second ==\n",
      block_mib, repeats);
  std::printf("  %-8s %10s %10s %7s %12s %7s %12s %7s %10s %7s %10s %10s %7s\n", "code", "bare enc",
              "Encode", "/bare", "Update(acc)", "/bare", "Partial+XOR", "/bare", "Partial", "/bare",
              "bare dec", "Decode", "/bare");
  for (const std::string& name : codes) {
    CodeSpec spec;
    if (!ParseCodeSpec(name, &spec).ok()) {
      std::fprintf(stderr, "bad code %s\n", name.c_str());
      return 2;
    }
    std::unique_ptr<ErasureCode> code;
    if (!ErasureCode::Make(spec, &code).ok()) return 1;
    std::vector<uint8_t> matrix(size_t{spec.k + spec.m} * spec.k);
    gf_gen_cauchy1_matrix(matrix.data(), static_cast<int>(spec.k + spec.m),
                          static_cast<int>(spec.k));
    Blocks b = MakeBlocks(spec, bytes);
    code->Encode(bytes, b.data.data(), b.parity.data());  // the survivors decode reads
    std::vector<double> bare_enc, enc, acc, sender, partial, bare_dec, dec;
    std::vector<uint32_t> all_rows(spec.m), lost(spec.m), survivors;
    for (uint32_t r = 0; r < spec.m; ++r) all_rows[r] = r, lost[r] = r;
    std::vector<const uint8_t*> present;
    for (uint32_t i = spec.m; i < spec.k; ++i) survivors.push_back(i), present.push_back(b.data[i]);
    for (uint32_t r = 0; survivors.size() < spec.k; ++r) {
      survivors.push_back(spec.k + r);
      present.push_back(b.parity[r]);
    }
    for (int round = 0; round < repeats + 1; ++round) {
      double t_bare = BareEncode(spec, matrix, bytes, b);
      Clock::time_point t0 = Clock::now();
      code->Encode(bytes, b.data.data(), b.out.data());
      double t_enc = Since(t0);
      for (uint8_t* p : b.out) std::memset(p, 0, bytes);
      t0 = Clock::now();
      for (uint32_t i = 0; i < spec.k; ++i) {
        code->Update(bytes, i, b.data[i], all_rows, b.out.data());
      }
      double t_acc = Since(t0);
      bool same = true;
      for (uint32_t r = 0; r < spec.m; ++r)
        same = same && !std::memcmp(b.out[r], b.parity[r], bytes);
      for (uint8_t* p : b.out) std::memset(p, 0, bytes);
      double t_partial = 0;
      t0 = Clock::now();
      for (uint32_t i = 0; i < spec.k; ++i) {
        const Clock::time_point t1 = Clock::now();
        code->Partial(bytes, i, b.data[i], all_rows, b.partial.data());
        t_partial += Since(t1);
        for (uint32_t r = 0; r < spec.m; ++r) XorInto(b.out[r], b.partial[r], bytes);
      }
      double t_sender = Since(t0);
      for (uint32_t r = 0; r < spec.m; ++r)
        same = same && !std::memcmp(b.out[r], b.parity[r], bytes);
      double t_bdec = BareDecode(spec, matrix, bytes, b);
      t0 = Clock::now();
      Status st = code->Decode(bytes, survivors, present.data(), lost, b.out.data());
      double t_dec = Since(t0);
      for (uint32_t r = 0; r < spec.m; ++r) same = same && !std::memcmp(b.out[r], b.data[r], bytes);
      if (!same || !st.ok()) {
        std::fprintf(stderr, "%s: wrong bytes\n", name.c_str());
        return 1;
      }
      if (round == 0) continue;  // warm-up
      const double data = static_cast<double>(bytes) * spec.k;
      bare_enc.push_back(data / t_bare / 1e9);
      enc.push_back(data / t_enc / 1e9);
      acc.push_back(data / t_acc / 1e9);
      sender.push_back(data / t_sender / 1e9);
      partial.push_back(data / t_partial / 1e9);
      bare_dec.push_back(data / t_bdec / 1e9);
      dec.push_back(data / t_dec / 1e9);
    }
    std::printf(
        "  %-8s %8.2f %10.2f %6.0f%% %10.2f %6.0f%% %10.2f %6.0f%% %10.2f %6.0f%% %10.2f %10.2f "
        "%6.0f%%   GB/s\n",
        name.c_str(), Median(bare_enc), Median(enc), 100 * Median(enc) / Median(bare_enc),
        Median(acc), 100 * Median(acc) / Median(bare_enc), Median(sender),
        100 * Median(sender) / Median(bare_enc), Median(partial),
        100 * Median(partial) / Median(bare_enc), Median(bare_dec), Median(dec),
        100 * Median(dec) / Median(bare_dec));
    for (uint8_t* p : b.data) munmap(p, bytes);
    for (uint8_t* p : b.parity) munmap(p, bytes);
    for (uint8_t* p : b.out) munmap(p, bytes);
    for (uint8_t* p : b.partial) munmap(p, bytes);
  }
  return 0;
}
