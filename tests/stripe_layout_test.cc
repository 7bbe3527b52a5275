// Where a coding group's units and parity go (redundancy/stripe_layout.h): every unit of every
// member has exactly one place and the place names it back, each stripe has K distinct data members
// and M other members holding its parity, parity load is even, and losing any M members leaves K
// blocks of every stripe.
#include "redundancy/stripe_layout.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace ckpt::redundancy {
namespace {

TEST(StripeLayoutTest, EveryUnitHasOnePlaceThatNamesItBack) {
  for (uint32_t g = 2; g <= 8; ++g) {
    for (uint32_t m = 1; m < g; ++m) {
      const uint32_t k = g - m;
      for (uint64_t version : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000003}}) {
        StripeLayout layout(k, m, 4096, version);
        std::set<std::pair<uint64_t, uint32_t>> taken;
        for (uint32_t p = 0; p < g; ++p) {
          for (uint64_t j = 0; j < 3 * k + 2; ++j) {
            auto slot = layout.DataSlot(p, j);
            ASSERT_LT(slot.index, k);
            EXPECT_TRUE(taken.insert({slot.stripe, slot.index}).second)
                << "two units in one slot: " << k << "+" << m;
            EXPECT_EQ(layout.DataMember(slot.stripe, slot.index), p);
            EXPECT_EQ(layout.DataUnit(slot.stripe, slot.index), j);
            EXPECT_FALSE(layout.ParityRow(slot.stripe, p).has_value());
            if (j > 0) {
              EXPECT_GT(slot.stripe, layout.DataSlot(p, j - 1).stripe) << "in order";
            }
          }
        }
      }
    }
  }
}

TEST(StripeLayoutTest, EachStripeHasKDataMembersAndMOthersHoldingItsParityEvenly) {
  for (uint32_t g = 2; g <= 8; ++g) {
    for (uint32_t m = 1; m < g; ++m) {
      const uint32_t k = g - m;
      for (uint64_t version : {uint64_t{0}, uint64_t{5}}) {
        StripeLayout layout(k, m, 1 << 20, version);
        std::vector<uint32_t> parity_load(g, 0), data_load(g, 0);
        for (uint64_t s = 0; s < 4 * g; ++s) {
          std::set<uint32_t> in_stripe;
          for (uint32_t i = 0; i < k; ++i) {
            EXPECT_TRUE(in_stripe.insert(layout.DataMember(s, i)).second);
            ++data_load[layout.DataMember(s, i)];
          }
          for (uint32_t r = 0; r < m; ++r) {
            const uint32_t holder = layout.ParityMember(s, r);
            EXPECT_TRUE(in_stripe.insert(holder).second) << "a member twice in a stripe";
            EXPECT_EQ(layout.ParityRow(s, holder), r);
            ++parity_load[holder];
          }
          EXPECT_EQ(in_stripe.size(), g);
        }
        for (uint32_t p = 0; p < g; ++p) {
          EXPECT_EQ(parity_load[p], 4 * m) << k << "+" << m << " member " << p;
          EXPECT_EQ(data_load[p], 4 * k);
        }
      }
    }
  }
}

TEST(StripeLayoutTest, TheVersionRotatesWhoHoldsParity) {
  std::set<uint32_t> holders;
  for (uint64_t v = 0; v < 6; ++v) holders.insert(StripeLayout(4, 2, 4096, v).ParityMember(0, 0));
  EXPECT_EQ(holders.size(), 6u) << "stripe 0's first parity row moves over every member";
}

TEST(StripeLayoutTest, UnequalSegmentsSetTheStripeCountAndEachStripesLength) {
  const uint64_t unit = 4096;
  StripeLayout layout(2, 1, unit, 0);
  // Member 0: 2.5 units, member 1: 1 unit, member 2: nothing.
  const std::vector<uint64_t> bytes = {2 * unit + 100, unit, 0};
  EXPECT_EQ(layout.Units(bytes[0]), 3u);
  EXPECT_EQ(layout.UnitBytes(bytes[0], 2), 100u);
  EXPECT_EQ(layout.UnitBytes(bytes[0], 3), 0u);
  const uint64_t stripes = layout.Stripes(bytes);
  EXPECT_EQ(stripes, layout.DataSlot(0, 2).stripe + 1);
  uint64_t covered = 0;
  for (uint64_t s = 0; s < stripes; ++s) {
    uint64_t longest = 0;
    for (uint32_t i = 0; i < 2; ++i) {
      const uint32_t p = layout.DataMember(s, i);
      const uint64_t b = layout.UnitBytes(bytes[p], layout.DataUnit(s, i));
      covered += b;
      longest = std::max(longest, b);
    }
    EXPECT_EQ(layout.StripeBytes(bytes, s), longest);
  }
  EXPECT_EQ(covered, bytes[0] + bytes[1] + bytes[2]) << "every byte in exactly one stripe";
  EXPECT_EQ(layout.Stripes(std::vector<uint64_t>{0, 0, 0}), 0u);
}

// Losing any M members leaves at least K blocks (data or parity) of every stripe.
TEST(StripeLayoutTest, AnyMLostMembersLeaveKBlocksOfEveryStripe) {
  for (uint32_t g = 2; g <= 8; ++g) {
    for (uint32_t m = 1; m < g; ++m) {
      const uint32_t k = g - m;
      StripeLayout layout(k, m, 4096, 3);
      for (uint32_t lost = 0; lost < (1u << g); ++lost) {
        if (static_cast<uint32_t>(__builtin_popcount(lost)) > m) continue;
        for (uint64_t s = 0; s < 2 * g; ++s) {
          uint32_t left = 0;
          for (uint32_t i = 0; i < k; ++i) left += !(lost & (1u << layout.DataMember(s, i)));
          for (uint32_t r = 0; r < m; ++r) left += !(lost & (1u << layout.ParityMember(s, r)));
          EXPECT_GE(left, k);
        }
      }
    }
  }
}

TEST(StripeLayoutTest, ParityStripesListsWhereAMemberHoldsParity) {
  StripeLayout layout(3, 2, 4096, 1);
  for (uint32_t q = 0; q < 5; ++q) {
    auto stripes = layout.ParityStripes(q, 20);
    EXPECT_EQ(stripes.size(), 8u);  // 2 of every 5
    for (uint64_t s : stripes) EXPECT_TRUE(layout.ParityRow(s, q).has_value());
  }
}

}  // namespace
}  // namespace ckpt::redundancy
