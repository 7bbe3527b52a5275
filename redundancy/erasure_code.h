// ErasureCode: the arithmetic of DESIGN.md section 7's coding groups, on ISA-L (ECHECK,
// ../shared/papers/echeck.txt; REFT's XOR, reft-paper.txt section 4.2).
//
// A code turns K equal-length data blocks into M parity blocks such that any K of the K + M
// blocks give back the K data blocks (maximum distance separable):
//   - ec:K+M: Reed-Solomon over GF(2^8) with a systematic Cauchy generator matrix (ISA-L
//     gf_gen_cauchy1_matrix: identity on top, 1/(i ^ j) below; every square submatrix of a Cauchy
//     matrix is invertible, so every choice of K survivors decodes, which a Vandermonde matrix
//     does not guarantee for every K, M), encoded with ec_encode_data;
//   - xor:K: one parity block, the XOR of the K data blocks (ISA-L xor_gen), M = 1.
// Blocks are plain byte ranges: the code knows nothing of segments, stripes or ranks
// (redundancy/stripe_layout.h places blocks, the cluster moves them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::redundancy {

enum class CodeScheme : uint8_t { kReedSolomon, kXor };

// Where a coding group's GF(2^8) products are computed (ECHECK's decentralized encoding,
// echeck.txt section IV; docs/performance.md, "Encoding at the senders"). Either way a parity
// block is the same bytes: the sum over the stripe's data blocks of coefficient x block.
//   kHolder  each data member sends its unit as it is; the parity holder multiplies and adds.
//   kSender  each data member multiplies its unit by its coefficient of the holder's row and
//            sends that partial product; the holder, the reduction's target, only XORs.
enum class Encoding : uint8_t { kHolder, kSender };

struct CodeSpec {
  CodeScheme scheme = CodeScheme::kReedSolomon;
  uint32_t k = 0;  // data blocks
  uint32_t m = 0;  // parity blocks (1 for xor)
  Encoding encoding = Encoding::kHolder;
  std::string Name() const;      // the code: "ec:4+2", "xor:3" (what the parity is)
  std::string Spelling() const;  // as given: "ec:4+2,encode=sender" (how it is built)
  bool operator==(const CodeSpec& o) const {
    return scheme == o.scheme && k == o.k && m == o.m && encoding == o.encoding;
  }
};

// Bounds: a group's members sit on distinct nodes, and 32 is far beyond what a checkpoint's
// coding group needs (ECHECK evaluates up to 8+8); GF(2^8) itself allows 256.
inline constexpr uint32_t kMaxCodeBlocks = 32;

// Parses "ec:K+M" (1 <= K, 1 <= M, K + M <= kMaxCodeBlocks), optionally followed by
// ",encode=holder" (the default) or ",encode=sender", and "xor:K" (2 <= K, K + 1 <=
// kMaxCodeBlocks; XOR has no multiply, so it takes no encode=). Invalid names the text and the
// form expected.
Status ParseCodeSpec(const std::string& text, CodeSpec* out);

// dst ^= src over `bytes` bytes, any alignment, at memory speed.
void XorInto(uint8_t* dst, const uint8_t* src, size_t bytes);

class ErasureCode {
 public:
  static Status Make(const CodeSpec& spec, std::unique_ptr<ErasureCode>* out);

  const CodeSpec& spec() const { return spec_; }
  uint32_t k() const { return spec_.k; }
  uint32_t m() const { return spec_.m; }

  // Parity row r's coefficient for data block i (1 for xor).
  uint8_t Coefficient(uint32_t row, uint32_t data_index) const;

  // All M parity blocks of K data blocks, `bytes` each.
  void Encode(size_t bytes, const uint8_t* const* data, uint8_t* const* parity) const;

  // Adds data block `data_index`'s contribution to the parity rows `rows` (parity[i] is row
  // rows[i]): parity[i] ^= Coefficient(rows[i], data_index) * data. Starting from zeroed parity
  // and adding every data block gives Encode's result: a parity holder accumulates the blocks
  // of a stripe as they arrive, in any order, with no buffer for them.
  void Update(size_t bytes, uint32_t data_index, const uint8_t* data,
              std::span<const uint32_t> rows, uint8_t* const* parity) const;

  // Data block `data_index`'s partial products for the parity rows `rows` (out[i] is row
  // rows[i]): out[i] = Coefficient(rows[i], data_index) * data, all rows in one pass over data.
  // XORing the K data blocks' partials of a row gives that row's parity (Encoding::kSender).
  void Partial(size_t bytes, uint32_t data_index, const uint8_t* data,
               std::span<const uint32_t> rows, uint8_t* const* out) const;

  // Rebuilds data blocks from any K blocks that survive. `present[i]` is block index
  // present_index[i] (0..K-1 data, K..K+M-1 parity row index - K), exactly K distinct ones;
  // out[w] receives data block wanted[w]. Invalid for a wrong count, a repeated or out-of-range
  // index; Internal if the matrix cannot be inverted (never for a Cauchy matrix).
  Status Decode(size_t bytes, std::span<const uint32_t> present_index,
                const uint8_t* const* present, std::span<const uint32_t> wanted,
                uint8_t* const* out) const;

 private:
  explicit ErasureCode(const CodeSpec& spec) : spec_(spec) {}
  bool AllRows(std::span<const uint32_t> rows) const;  // exactly 0, 1, ..., M-1
  // ec_init_tables of parity rows `rows` against data blocks first .. first + sources - 1, made
  // for them alone (32 bytes an entry reserved, whatever ISA-L's own layout uses of it).
  std::vector<uint8_t> TablesOf(std::span<const uint32_t> rows, uint32_t first,
                                uint32_t sources) const;
  CodeSpec spec_;
  std::vector<uint8_t> matrix_;  // (K + M) x K, row major; identity on top
  std::vector<uint8_t> tables_;  // ec_init_tables of the M parity rows
  // ec_init_tables of the M rows against one source, one such set per data block (each made by
  // its own call, never cut from another: ISA-L's table layout is its own): a sender's partials
  // in one pass (ec_encode_data with one source).
  std::vector<uint8_t> column_tables_;
};

}  // namespace ckpt::redundancy
