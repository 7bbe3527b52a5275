// The code of coding groups (redundancy/erasure_code.h) against an oracle of its own: GF(2^8) with
// the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and the Cauchy generator written out here
// byte by byte, not through ISA-L. Every erasure of up to M blocks of every K + M up to 8 decodes
// to the original bytes; M + 1 erasures cannot be decoded.
#include "redundancy/erasure_code.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "ckptdb/ckptdb.h"

namespace ckpt::redundancy {
namespace {

// GF(2^8) by log and exp tables over the generator 2.
struct Gf {
  uint8_t exp[512];
  uint8_t log[256];
  Gf() {
    unsigned x = 1;
    for (int i = 0; i < 255; ++i) {
      exp[i] = static_cast<uint8_t>(x);
      log[x] = static_cast<uint8_t>(i);
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (int i = 255; i < 512; ++i) exp[i] = exp[i - 255];
  }
  uint8_t Mul(uint8_t a, uint8_t b) const { return a == 0 || b == 0 ? 0 : exp[log[a] + log[b]]; }
  uint8_t Inv(uint8_t a) const { return exp[255 - log[a]]; }
};
const Gf& GF() {
  static const Gf gf;
  return gf;
}

// Parity row r's coefficient for data block j: the Cauchy element 1 / ((k + r) ^ j); xor: 1.
uint8_t OracleCoefficient(const CodeSpec& s, uint32_t r, uint32_t j) {
  if (s.scheme == CodeScheme::kXor) return 1;
  return GF().Inv(static_cast<uint8_t>((s.k + r) ^ j));
}

std::vector<std::vector<uint8_t>> OracleParity(const CodeSpec& s,
                                               const std::vector<std::vector<uint8_t>>& data) {
  const size_t bytes = data[0].size();
  std::vector<std::vector<uint8_t>> parity(s.m, std::vector<uint8_t>(bytes, 0));
  for (uint32_t r = 0; r < s.m; ++r) {
    for (uint32_t j = 0; j < s.k; ++j) {
      const uint8_t c = OracleCoefficient(s, r, j);
      for (size_t b = 0; b < bytes; ++b) parity[r][b] ^= GF().Mul(c, data[j][b]);
    }
  }
  return parity;
}

std::vector<std::vector<uint8_t>> RandomBlocks(uint32_t n, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> blocks(n, std::vector<uint8_t>(bytes));
  for (auto& b : blocks) {
    for (auto& x : b) x = static_cast<uint8_t>(rng());
  }
  return blocks;
}

std::vector<const uint8_t*> ConstPtrs(const std::vector<std::vector<uint8_t>>& v) {
  std::vector<const uint8_t*> out;
  for (const auto& b : v) out.push_back(b.data());
  return out;
}
std::vector<uint8_t*> Ptrs(std::vector<std::vector<uint8_t>>& v) {
  std::vector<uint8_t*> out;
  for (auto& b : v) out.push_back(b.data());
  return out;
}

// Every K + M from 2 to 8 (and xor:K up to K + 1 = 8).
std::vector<CodeSpec> SmallCodes() {
  std::vector<CodeSpec> out;
  for (uint32_t n = 2; n <= 8; ++n) {
    for (uint32_t m = 1; m < n; ++m) out.push_back({CodeScheme::kReedSolomon, n - m, m});
    if (n >= 3) out.push_back({CodeScheme::kXor, n - 1, 1});
  }
  return out;
}

// Each subset of {0..n-1} of size `size`, as a bitmask.
std::vector<uint32_t> Subsets(uint32_t n, uint32_t size) {
  std::vector<uint32_t> out;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (static_cast<uint32_t>(__builtin_popcount(mask)) == size) out.push_back(mask);
  }
  return out;
}

TEST(ErasureCodeTest, ParsesSchemesAndRefusesWhatIsOutOfRange) {
  CodeSpec s;
  ASSERT_TRUE(ParseCodeSpec("ec:4+2", &s).ok());
  EXPECT_EQ(s.scheme, CodeScheme::kReedSolomon);
  EXPECT_EQ(s.k, 4u);
  EXPECT_EQ(s.m, 2u);
  EXPECT_EQ(s.Name(), "ec:4+2");
  ASSERT_TRUE(ParseCodeSpec("xor:3", &s).ok());
  EXPECT_EQ(s.scheme, CodeScheme::kXor);
  EXPECT_EQ(s.k, 3u);
  EXPECT_EQ(s.m, 1u);
  EXPECT_EQ(s.Name(), "xor:3");
  ASSERT_TRUE(ParseCodeSpec("ec:30+2", &s).ok());
  EXPECT_EQ(s.encoding, Encoding::kHolder);
  ASSERT_TRUE(ParseCodeSpec("ec:4+2,encode=sender", &s).ok());
  EXPECT_EQ(s.encoding, Encoding::kSender);
  EXPECT_EQ(s.k, 4u);
  EXPECT_EQ(s.m, 2u);
  EXPECT_EQ(s.Name(), "ec:4+2");  // the code, which the parity is
  EXPECT_EQ(s.Spelling(), "ec:4+2,encode=sender");
  ASSERT_TRUE(ParseCodeSpec("ec:4+2,encode=holder", &s).ok());
  EXPECT_EQ(s.encoding, Encoding::kHolder);
  EXPECT_EQ(s.Spelling(), "ec:4+2");
  for (const char* bad : {"ec:",
                          "ec:4",
                          "ec:4+",
                          "ec:+2",
                          "ec:0+2",
                          "ec:4+0",
                          "ec:31+2",
                          "ec:4+2+1",
                          "ec:-1+2",
                          "ec:4 +2",
                          "ec:999+1",
                          "xor:1",
                          "xor:",
                          "xor:32",
                          "xor:x",
                          "rs:4+2",
                          "",
                          "ec:4+2,",
                          "ec:4+2,encode=",
                          "ec:4+2,encode=both",
                          "ec:4+2,encode=sender,",
                          "ec:4+2,encode=sender,encode=holder",
                          "ec:0+2,encode=sender",
                          "xor:3,encode=sender",
                          "ec:4+2;encode=sender",
                          "ec:4+2,ENCODE=SENDER"}) {
    Status st = ParseCodeSpec(bad, &s);
    EXPECT_EQ(st.code(), CKPTDB_EINVAL) << bad;
    EXPECT_NE(st.message().find(bad), std::string::npos) << st.message();
  }
}

TEST(ErasureCodeTest, EncodeMatchesTheOracleForEveryCodeUpToEightBlocks) {
  for (const CodeSpec& spec : SmallCodes()) {
    std::unique_ptr<ErasureCode> code;
    ASSERT_TRUE(ErasureCode::Make(spec, &code).ok()) << spec.Name();
    for (size_t bytes : {size_t{1}, size_t{31}, size_t{4096}, size_t{70001}}) {
      auto data = RandomBlocks(spec.k, bytes, spec.k * 100 + spec.m * 7 + bytes);
      std::vector<std::vector<uint8_t>> parity(spec.m, std::vector<uint8_t>(bytes, 0xEE));
      code->Encode(bytes, ConstPtrs(data).data(), Ptrs(parity).data());
      EXPECT_EQ(parity, OracleParity(spec, data)) << spec.Name() << " " << bytes << " bytes";
      for (uint32_t r = 0; r < spec.m; ++r) {
        for (uint32_t j = 0; j < spec.k; ++j) {
          EXPECT_EQ(code->Coefficient(r, j), OracleCoefficient(spec, r, j)) << spec.Name();
        }
      }
    }
  }
}

// A parity holder accumulates one data block at a time, in any order, into the rows it holds.
TEST(ErasureCodeTest, UpdatesInAnyOrderSumToTheEncodingForAnySetOfRows) {
  std::mt19937_64 rng(5);
  for (const CodeSpec& spec : SmallCodes()) {
    std::unique_ptr<ErasureCode> code;
    ASSERT_TRUE(ErasureCode::Make(spec, &code).ok());
    const size_t bytes = 12345;
    auto data = RandomBlocks(spec.k, bytes, spec.k * 31 + spec.m);
    auto want = OracleParity(spec, data);
    for (uint32_t mask = 1; mask < (1u << spec.m); ++mask) {  // every nonempty set of rows
      std::vector<uint32_t> rows;
      for (uint32_t r = 0; r < spec.m; ++r) {
        if (mask & (1u << r)) rows.push_back(r);
      }
      std::vector<std::vector<uint8_t>> parity(rows.size(), std::vector<uint8_t>(bytes, 0));
      std::vector<uint32_t> order(spec.k);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (uint32_t j : order) code->Update(bytes, j, data[j].data(), rows, Ptrs(parity).data());
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(parity[i], want[rows[i]]) << spec.Name() << " row " << rows[i];
      }
    }
  }
}

// ECHECK's encoding at the senders: each data block's partials for a set of rows, XORed over
// the K blocks in any order, are the encoding of those rows, for every code, length and set.
TEST(ErasureCodeTest, PartialsXoredInAnyOrderAreTheEncodingForAnySetOfRows) {
  std::mt19937_64 rng(9);
  for (const CodeSpec& spec : SmallCodes()) {
    std::unique_ptr<ErasureCode> code;
    ASSERT_TRUE(ErasureCode::Make(spec, &code).ok());
    for (size_t bytes : {size_t{1}, size_t{33}, size_t{4096}, size_t{12345}}) {
      auto data = RandomBlocks(spec.k, bytes, spec.k * 17 + spec.m + bytes);
      auto want = OracleParity(spec, data);
      for (uint32_t mask = 1; mask < (1u << spec.m); ++mask) {
        std::vector<uint32_t> rows;
        for (uint32_t r = 0; r < spec.m; ++r) {
          if (mask & (1u << r)) rows.push_back(r);
        }
        std::shuffle(rows.begin(), rows.end(), rng);  // rows in any order, not only consecutive
        std::vector<std::vector<uint8_t>> parity(rows.size(), std::vector<uint8_t>(bytes, 0));
        std::vector<uint32_t> order(spec.k);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (uint32_t j : order) {
          std::vector<std::vector<uint8_t>> partial(rows.size(), std::vector<uint8_t>(bytes, 0xA5));
          code->Partial(bytes, j, data[j].data(), rows, Ptrs(partial).data());
          for (size_t i = 0; i < rows.size(); ++i) {
            // One block's partial is its coefficient times it, byte by byte (the oracle's).
            const uint8_t c = OracleCoefficient(spec, rows[i], j);
            EXPECT_EQ(partial[i][bytes / 2], GF().Mul(c, data[j][bytes / 2])) << spec.Name();
            XorInto(parity[i].data(), partial[i].data(), bytes);
          }
        }
        for (size_t i = 0; i < rows.size(); ++i) {
          EXPECT_EQ(parity[i], want[rows[i]])
              << spec.Name() << " row " << rows[i] << ", " << bytes << " bytes";
        }
      }
    }
  }
}

// The test of the issue: every failure subset of size up to M of a K + M group for K + M up to
// 8 decodes to the original bytes from any K survivors; M + 1 losses leave fewer than K.
TEST(ErasureCodeTest, EveryErasureOfUpToMBlocksDecodesBitForBit) {
  size_t cases = 0;
  for (const CodeSpec& spec : SmallCodes()) {
    std::unique_ptr<ErasureCode> code;
    ASSERT_TRUE(ErasureCode::Make(spec, &code).ok());
    const uint32_t n = spec.k + spec.m;
    const size_t bytes = 4099;
    auto data = RandomBlocks(spec.k, bytes, n * 1000 + spec.m);
    auto parity = OracleParity(spec, data);
    std::vector<const uint8_t*> blocks = ConstPtrs(data);
    for (const auto& p : parity) blocks.push_back(p.data());
    for (uint32_t lost_count = 0; lost_count <= spec.m + 1; ++lost_count) {
      for (uint32_t lost : Subsets(n, lost_count)) {
        std::vector<uint32_t> survivors;
        for (uint32_t i = 0; i < n; ++i) {
          if (!(lost & (1u << i))) survivors.push_back(i);
        }
        std::vector<uint32_t> wanted;
        for (uint32_t i = 0; i < spec.k; ++i) {
          if (lost & (1u << i)) wanted.push_back(i);
        }
        if (survivors.size() < spec.k) {
          ASSERT_EQ(lost_count, spec.m + 1);
          continue;  // nothing to give Decode: K blocks are not there
        }
        // Any K of the survivors will do: the last K (parity first where there is some).
        std::vector<uint32_t> use(survivors.end() - spec.k, survivors.end());
        std::vector<const uint8_t*> present;
        for (uint32_t i : use) present.push_back(blocks[i]);
        std::vector<std::vector<uint8_t>> out(wanted.size(), std::vector<uint8_t>(bytes, 0));
        Status st = code->Decode(bytes, use, present.data(), wanted, Ptrs(out).data());
        ASSERT_TRUE(st.ok()) << spec.Name() << ": " << st.message();
        for (size_t w = 0; w < wanted.size(); ++w) {
          ASSERT_EQ(out[w], data[wanted[w]]) << spec.Name() << " lost mask " << lost;
        }
        ++cases;
      }
    }
  }
  std::printf("erasure patterns decoded: %zu\n", cases);
}

TEST(ErasureCodeTest, DecodeRefusesWrongInputAndChangesNothing) {
  std::unique_ptr<ErasureCode> code;
  ASSERT_TRUE(ErasureCode::Make({CodeScheme::kReedSolomon, 4, 2}, &code).ok());
  auto data = RandomBlocks(6, 64, 1);
  std::vector<const uint8_t*> present = ConstPtrs(data);
  std::vector<uint8_t> out(64, 0x5A);
  uint8_t* outp = out.data();
  const uint32_t wanted[] = {0};
  const uint32_t three[] = {1, 2, 3};
  const uint32_t repeated[] = {1, 1, 2, 3};
  const uint32_t outside[] = {1, 2, 3, 6};
  const uint32_t fine[] = {1, 2, 3, 4};
  const uint32_t no_such[] = {4};
  EXPECT_EQ(code->Decode(64, three, present.data(), wanted, &outp).code(), CKPTDB_EINVAL);
  EXPECT_EQ(code->Decode(64, repeated, present.data(), wanted, &outp).code(), CKPTDB_EINVAL);
  EXPECT_EQ(code->Decode(64, outside, present.data(), wanted, &outp).code(), CKPTDB_EINVAL);
  EXPECT_EQ(code->Decode(64, fine, present.data(), no_such, &outp).code(), CKPTDB_EINVAL);
  EXPECT_EQ(out, std::vector<uint8_t>(64, 0x5A));
  std::unique_ptr<ErasureCode> bad;
  EXPECT_EQ(ErasureCode::Make({CodeScheme::kXor, 3, 2}, &bad).code(), CKPTDB_EINVAL);
  EXPECT_EQ(ErasureCode::Make({CodeScheme::kReedSolomon, 0, 2}, &bad).code(), CKPTDB_EINVAL);
  EXPECT_EQ(ErasureCode::Make({CodeScheme::kReedSolomon, 30, 3}, &bad).code(), CKPTDB_EINVAL);
}

// Beyond 8: a random sample of erasure patterns of the largest codes.
TEST(ErasureCodeTest, ASampleOfErasuresOfLargeCodesDecodes) {
  std::mt19937_64 rng(11);
  for (CodeSpec spec :
       {CodeSpec{CodeScheme::kReedSolomon, 12, 4}, CodeSpec{CodeScheme::kReedSolomon, 20, 12},
        CodeSpec{CodeScheme::kXor, 31, 1}}) {
    std::unique_ptr<ErasureCode> code;
    ASSERT_TRUE(ErasureCode::Make(spec, &code).ok());
    const uint32_t n = spec.k + spec.m;
    const size_t bytes = 1000;
    auto data = RandomBlocks(spec.k, bytes, n);
    std::vector<std::vector<uint8_t>> parity(spec.m, std::vector<uint8_t>(bytes));
    code->Encode(bytes, ConstPtrs(data).data(), Ptrs(parity).data());
    ASSERT_EQ(parity, OracleParity(spec, data)) << spec.Name();
    std::vector<const uint8_t*> blocks = ConstPtrs(data);
    for (const auto& p : parity) blocks.push_back(p.data());
    for (int round = 0; round < 200; ++round) {
      std::vector<uint32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      const uint32_t lost = static_cast<uint32_t>(rng() % (spec.m + 1));
      std::vector<uint32_t> use(order.begin() + lost, order.begin() + lost + spec.k);
      std::vector<uint32_t> wanted;
      for (uint32_t i = 0; i < lost; ++i) {
        if (order[i] < spec.k) wanted.push_back(order[i]);
      }
      std::vector<const uint8_t*> present;
      for (uint32_t i : use) present.push_back(blocks[i]);
      std::vector<std::vector<uint8_t>> out(wanted.size(), std::vector<uint8_t>(bytes));
      ASSERT_TRUE(code->Decode(bytes, use, present.data(), wanted, Ptrs(out).data()).ok());
      for (size_t w = 0; w < wanted.size(); ++w) ASSERT_EQ(out[w], data[wanted[w]]) << spec.Name();
    }
  }
}

}  // namespace
}  // namespace ckpt::redundancy
