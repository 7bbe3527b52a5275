// The count behind `ckptdb verify`'s recoverability of a coding group (engine/group_check.h,
// SpareMemberLosses), held against an enumeration: for random stripes of every code with
// K + M <= 8 (and a sample up to 12), every set of members is lost in turn, and the oracle says
// which loss sets leave a stripe that misses a unit with fewer than K blocks. The cluster tests
// check the whole verify (parity recomputed, sources) against the losses they cause.
#include "engine/group_check.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <vector>

namespace ckpt::engine {
namespace {

// One stripe as the oracle sees it: block b (K data, then M parity) is held by member
// owner[b]; a data block may be zeros (past its member's segment: always there).
struct Stripe {
  std::vector<uint32_t> owner;
  std::vector<bool> zero;
  std::vector<bool> present;
};

// Does losing the members in `lost` (a bit set) leave every stripe decodable where it needs it?
bool Survives(uint32_t k, const std::vector<Stripe>& stripes, uint32_t lost) {
  for (const Stripe& s : stripes) {
    uint32_t there = 0;
    bool missing_unit = false;
    for (size_t b = 0; b < s.owner.size(); ++b) {
      const bool gone = (lost >> s.owner[b]) & 1;
      const bool ok = s.zero[b] || (s.present[b] && !gone);
      there += ok;
      if (b < k && !ok) missing_unit = true;
    }
    if (missing_unit && there < k) return false;
  }
  return true;
}

// The largest x <= m such that every loss set of at most x members survives; -1 when even no
// loss fails.
int Oracle(uint32_t k, uint32_t m, const std::vector<Stripe>& stripes) {
  const uint32_t g = k + m;
  if (!Survives(k, stripes, 0)) return -1;
  int spare = static_cast<int>(m);
  for (uint32_t lost = 1; lost < (1u << g); ++lost) {
    const int size = std::popcount(lost);
    if (size - 1 >= spare) continue;
    if (!Survives(k, stripes, lost)) spare = size - 1;
  }
  return spare;
}

void CheckRandomStripes(uint32_t k, uint32_t m, std::mt19937_64& rng, int trials) {
  const uint32_t g = k + m;
  std::bernoulli_distribution absent(0.15);
  std::bernoulli_distribution zero(0.1);
  std::uniform_int_distribution<int> count(1, 6);
  for (int trial = 0; trial < trials; ++trial) {
    // Some members lost outright (every block of theirs gone), then scattered bad blocks.
    uint32_t lost = 0;
    for (uint32_t p = 0; p < g; ++p) {
      if (std::bernoulli_distribution(0.12)(rng)) lost |= 1u << p;
    }
    std::vector<Stripe> stripes(static_cast<size_t>(count(rng)));
    std::vector<StripeBlocks> counts;
    for (size_t s = 0; s < stripes.size(); ++s) {
      Stripe& st = stripes[s];
      StripeBlocks c;
      const uint32_t rotation = static_cast<uint32_t>(rng() % g);
      for (uint32_t b = 0; b < g; ++b) {
        st.owner.push_back((rotation + b) % g);
        st.zero.push_back(b < k && zero(rng));
        st.present.push_back(!((lost >> st.owner[b]) & 1) && !absent(rng));
        if (b < k && st.zero[b]) {
          c.zeros++;
        } else if (b < k) {
          (st.present[b] ? c.data_present : c.data_missing)++;
        } else if (st.present[b]) {
          c.parity_present++;
        }
      }
      counts.push_back(c);
    }
    const int want = Oracle(k, m, stripes);
    ASSERT_EQ(SpareMemberLosses(k, m, counts), want)
        << k << "+" << m << " trial " << trial << " (" << stripes.size() << " stripes)";
  }
}

TEST(GroupCheckTest, SpareLossesAgreeWithEveryLossSetForCodesUpTo8Blocks) {
  std::mt19937_64 rng(20261125);
  for (uint32_t g = 2; g <= 8; ++g) {
    for (uint32_t m = 1; m < g; ++m) CheckRandomStripes(g - m, m, rng, 300);
  }
}

TEST(GroupCheckTest, SpareLossesAgreeWithEveryLossSetForASampleOfLargerCodes) {
  std::mt19937_64 rng(7);
  for (auto [k, m] : {std::pair<uint32_t, uint32_t>{8, 2}, {6, 3}, {8, 4}, {10, 2}, {9, 3}}) {
    CheckRandomStripes(k, m, rng, 40);
  }
}

// The cases named: nothing lost spares M; a lost member spares M - 1; M lost spares 0; M + 1
// lost where a unit is missing is not recoverable; a stripe that misses nothing and has only
// zeros and parity left cannot fail.
TEST(GroupCheckTest, NamedCases) {
  const StripeBlocks whole{0, 4, 0, 2};
  EXPECT_EQ(SpareMemberLosses(4, 2, std::span(&whole, 1)), 2);
  const StripeBlocks one_lost{0, 3, 1, 2};
  EXPECT_EQ(SpareMemberLosses(4, 2, std::span(&one_lost, 1)), 1);
  const StripeBlocks two_lost{0, 3, 1, 1};
  EXPECT_EQ(SpareMemberLosses(4, 2, std::span(&two_lost, 1)), 0);
  const StripeBlocks three_lost{0, 2, 2, 1};
  EXPECT_EQ(SpareMemberLosses(4, 2, std::span(&three_lost, 1)), -1);
  const StripeBlocks zeros{4, 0, 0, 2};
  EXPECT_EQ(SpareMemberLosses(4, 2, std::span(&zeros, 1)), 2);
}

}  // namespace
}  // namespace ckpt::engine
