// Checkpoint placement (redundancy/placement.h) and `ckptdb plan`: GEMINI Algorithm 1 layouts,
// never two copies on one node, the exact recovery probability against a brute-force oracle that
// enumerates every failure set, GEMINI Corollary 1 and the paper's 93.3% / 80.0% figures, ring
// against group, erasure-coded groups, REFT's Weibull survival (eqs. 5-6) against hand-computed
// values and the paper's Figure 8, every error, and the command's output and exit codes.
#include "redundancy/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace ckpt::redundancy {
namespace {

using test::RunCommand;

// n choose r as a double, exact for the small n used here.
double Choose(int n, int r) {
  if (r < 0 || r > n) return 0;
  double c = 1;
  for (int i = 1; i <= r; i++) c = c * (n - r + i) / i;
  return c;
}

Placement Make(int nodes, int replicas, PlacementStrategy strategy) {
  Placement p;
  Status st = ComputePlacement(nodes, replicas, strategy, &p);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return p;
}

double Recovery(const Placement& p, int failures) {
  double value = -1;
  Status st = RecoveryProbabilityExact(p, failures, &value);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return value;
}

// The oracle: for every failure set (a bitmask over N <= 20 nodes), whether it loses a
// checkpoint, straight from the definition: node i's checkpoint is lost iff all its holders fail.
// Returns, per failure count k, the fraction of the C(N, k) sets that lose nothing.
std::vector<double> OracleRecovery(const Placement& p) {
  const int n = p.nodes;
  std::vector<uint32_t> holder_masks;
  for (const std::vector<int>& holders : p.holders) {
    uint32_t mask = 0;
    for (int h : holders) mask |= uint32_t{1} << h;
    holder_masks.push_back(mask);
  }
  std::vector<double> safe(static_cast<size_t>(n) + 1, 0);
  for (uint32_t failed = 0; failed < (uint32_t{1} << n); failed++) {
    bool lost = false;
    for (uint32_t mask : holder_masks) lost = lost || (failed & mask) == mask;
    if (!lost) safe[std::popcount(failed)] += 1;
  }
  for (int k = 0; k <= n; k++) safe[k] /= Choose(n, k);
  return safe;
}

// The oracle for independent node failures: the sum over every failure set of its probability.
double OracleSurvival(const Placement& p, double node_survival) {
  const int n = p.nodes;
  double total = 0;
  for (uint32_t failed = 0; failed < (uint32_t{1} << n); failed++) {
    bool lost = false;
    for (const std::vector<int>& holders : p.holders) {
      bool all = true;
      for (int h : holders) all = all && (failed >> h & 1) != 0;
      lost = lost || all;
    }
    if (lost) continue;
    int k = std::popcount(failed);
    total += std::pow(1 - node_survival, k) * std::pow(node_survival, n - k);
  }
  return total;
}

TEST(PlacementTest, AlgorithmOneGroupsWhenReplicasDivideNodes) {
  Placement p = Make(16, 2, PlacementStrategy::kMixed);
  EXPECT_EQ(p.strategy, PlacementStrategy::kGroup);  // Algorithm 1 line 11
  ASSERT_EQ(p.groups.size(), 8u);
  for (int g = 0; g < 8; g++) EXPECT_EQ(p.groups[g], (std::vector<int>{2 * g, 2 * g + 1}));
  EXPECT_EQ(p.holders[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(p.holders[1], (std::vector<int>{1, 0}));
  EXPECT_EQ(p.holders[15], (std::vector<int>{15, 14}));

  Placement q = Make(9, 3, PlacementStrategy::kGroup);
  EXPECT_EQ(q.groups, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}));
  EXPECT_EQ(q.holders[4], (std::vector<int>{4, 5, 3}));
}

TEST(PlacementTest, AlgorithmOneMixedWhenTheyDoNot) {
  // GEMINI Figure 3c: N = 5, m = 2: a group of two, then a ring of three.
  Placement p = Make(5, 2, PlacementStrategy::kMixed);
  EXPECT_EQ(p.strategy, PlacementStrategy::kMixed);
  EXPECT_EQ(p.groups, (std::vector<std::vector<int>>{{0, 1}, {2, 3, 4}}));
  EXPECT_EQ(p.holders, (std::vector<std::vector<int>>{{0, 1}, {1, 0}, {2, 3}, {3, 4}, {4, 2}}));

  // floor(10/3) - 1 = 2 groups of 3, then a ring over the last 3 + 10 % 3 = 4 nodes.
  Placement q = Make(10, 3, PlacementStrategy::kMixed);
  EXPECT_EQ(q.groups, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8, 9}}));
  EXPECT_EQ(q.holders[8], (std::vector<int>{8, 9, 6}));
  EXPECT_EQ(q.holders[9], (std::vector<int>{9, 6, 7}));

  // floor(5/3) = 1: no plain group is left, all five nodes form the ring.
  Placement r = Make(5, 3, PlacementStrategy::kMixed);
  EXPECT_EQ(r.groups, (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(r.holders[4], (std::vector<int>{4, 0, 1}));
}

TEST(PlacementTest, RingIsTheNextNodes) {
  Placement p = Make(4, 3, PlacementStrategy::kRing);
  EXPECT_EQ(p.strategy, PlacementStrategy::kRing);
  EXPECT_EQ(p.groups, (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(p.holders, (std::vector<std::vector<int>>{{0, 1, 2}, {1, 2, 3}, {2, 3, 0}, {3, 0, 1}}));
}

// Every layout of N = 1..40, m = 1..min(N, 5): m distinct holders per node, the node itself
// first, every node holding exactly m checkpoints (Theorem 1's proof: each machine sends and
// receives m - 1 copies), groups of consecutive ids partitioning the nodes as Algorithm 1 says.
TEST(PlacementTest, NeverTwoCopiesOnOneNode) {
  for (int n = 1; n <= 40; n++) {
    for (int m = 1; m <= std::min(n, 5); m++) {
      for (PlacementStrategy s :
           {PlacementStrategy::kGroup, PlacementStrategy::kRing, PlacementStrategy::kMixed}) {
        if (s == PlacementStrategy::kGroup && n % m != 0) continue;
        SCOPED_TRACE("N=" + std::to_string(n) + " m=" + std::to_string(m) + " " +
                     PlacementStrategyName(s));
        Placement p = Make(n, m, s);
        ASSERT_EQ(p.nodes, n);
        ASSERT_EQ(p.replicas, m);
        ASSERT_EQ(static_cast<int>(p.holders.size()), n);
        std::vector<int> held(static_cast<size_t>(n), 0);
        for (int i = 0; i < n; i++) {
          const std::vector<int>& h = p.holders[i];
          ASSERT_EQ(static_cast<int>(h.size()), m);
          EXPECT_EQ(h[0], i);
          std::vector<int> sorted = h;
          std::sort(sorted.begin(), sorted.end());
          EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
          for (int node : h) {
            ASSERT_TRUE(0 <= node && node < n);
            held[node]++;
          }
        }
        for (int node = 0; node < n; node++) EXPECT_EQ(held[node], m);
        int next = 0;
        for (const std::vector<int>& g : p.groups) {
          for (int node : g) EXPECT_EQ(node, next++);
        }
        EXPECT_EQ(next, n);
        if (s == PlacementStrategy::kRing) {
          EXPECT_EQ(p.groups.size(), 1u);
        } else {
          ASSERT_EQ(static_cast<int>(p.groups.size()), n / m);
          for (size_t g = 0; g + 1 < p.groups.size(); g++) {
            EXPECT_EQ(static_cast<int>(p.groups[g].size()), m);
          }
          EXPECT_EQ(static_cast<int>(p.groups.back().size()), m + n % m);
          EXPECT_EQ(p.strategy, n % m == 0 ? PlacementStrategy::kGroup : PlacementStrategy::kMixed);
        }
      }
    }
  }
}

TEST(PlacementTest, ExactMatchesEnumerationOfEveryFailureSet) {
  for (int n = 1; n <= 14; n++) {
    for (int m = 1; m <= std::min(n, 5); m++) {
      for (PlacementStrategy s :
           {PlacementStrategy::kGroup, PlacementStrategy::kRing, PlacementStrategy::kMixed}) {
        if (s == PlacementStrategy::kGroup && n % m != 0) continue;
        Placement p = Make(n, m, s);
        std::vector<double> oracle = OracleRecovery(p);
        for (int k = 0; k <= n; k++) {
          EXPECT_NEAR(Recovery(p, k), oracle[k], 1e-12)
              << "N=" << n << " m=" << m << " k=" << k << " " << PlacementStrategyName(s);
        }
      }
    }
  }
  // A few larger spaces (2^18 sets).
  for (auto [n, m] : {std::pair{18, 3}, {17, 2}, {17, 4}}) {
    for (PlacementStrategy s : {PlacementStrategy::kRing, PlacementStrategy::kMixed}) {
      Placement p = Make(n, m, s);
      std::vector<double> oracle = OracleRecovery(p);
      for (int k = 0; k <= n; k++) {
        EXPECT_NEAR(Recovery(p, k), oracle[k], 1e-12) << "N=" << n << " m=" << m << " k=" << k;
      }
    }
  }
}

// Certain outcomes come out exact, not within rounding of it: `ckptdb plan` prints ">99.9%"
// rather than "100.0%" for anything short of certain.
TEST(PlacementTest, CertainOutcomesAreExact) {
  for (PlacementStrategy s : {PlacementStrategy::kRing, PlacementStrategy::kMixed}) {
    Placement p = Make(37, 4, s);
    for (int k = 0; k < 4; k++) {
      double loss = -1;
      ASSERT_TRUE(LossProbabilityExact(p, k, &loss).ok());
      EXPECT_EQ(loss, 0.0) << k;
      EXPECT_EQ(Recovery(p, k), 1.0) << k;
    }
    EXPECT_EQ(Recovery(p, 37), 0.0);
  }
  // Two groups of two: any three failures take a whole group.
  EXPECT_EQ(Recovery(Make(4, 2, PlacementStrategy::kGroup), 3), 0.0);
  double loss = -1;
  ASSERT_TRUE(LossProbabilityExact(Make(4, 2, PlacementStrategy::kGroup), 3, &loss).ok());
  EXPECT_EQ(loss, 1.0);
  // A tiny loss keeps its digits where 1 - recovery would not: N = 65536 in groups of 4 with 4
  // failures loses iff the 4 are a group: (N / 4) / C(N, 4) = 6 / ((N-1)(N-2)(N-3)), 2.2e-14.
  ASSERT_TRUE(
      LossProbabilityExact(Make(kMaxPlacementNodes, 4, PlacementStrategy::kGroup), 4, &loss).ok());
  const double n = kMaxPlacementNodes;
  EXPECT_NEAR(loss / (6 / ((n - 1) * (n - 2) * (n - 3))), 1.0, 1e-9);
}

// GEMINI Corollary 1 (eqs. 3-6): exact for m <= k < 2m (eq. 5), a lower bound from 2m on
// (eq. 6), 1 below m.
TEST(PlacementTest, CorollaryOneAgainstExactGroupPlacement) {
  for (int n = 1; n <= 40; n++) {
    for (int m = 1; m <= std::min(n, 5); m++) {
      if (n % m != 0) continue;
      Placement p = Make(n, m, PlacementStrategy::kGroup);
      for (int k = 0; k <= n; k++) {
        double exact = Recovery(p, k);
        double bound = GeminiCorollary1(n, m, k);
        SCOPED_TRACE("N=" + std::to_string(n) + " m=" + std::to_string(m) +
                     " k=" + std::to_string(k));
        if (k < m) {
          EXPECT_EQ(bound, 1.0);
        }
        if (Corollary1IsExact(m, k)) {
          EXPECT_NEAR(exact, bound, 1e-12);
        } else {
          EXPECT_GE(exact, bound - 1e-12);
        }
      }
    }
  }
  // Strictly a bound once two whole groups can fail: N = 16, m = 2, k = 4.
  EXPECT_NEAR(GeminiCorollary1(16, 2, 4), 0.6, 1e-12);
  EXPECT_NEAR(Recovery(Make(16, 2, PlacementStrategy::kGroup), 4), 1120.0 / 1820.0, 1e-12);
}

// GEMINI section 7.2 / Figure 9: N = 16, m = 2: 93.3% for k = 2, 80.0% for k = 3.
TEST(PlacementTest, GeminiFigureNine) {
  Placement p = Make(16, 2, PlacementStrategy::kMixed);
  EXPECT_NEAR(Recovery(p, 2), 14.0 / 15.0, 1e-12);  // 93.3%: 8 of the 120 pairs are a group
  EXPECT_NEAR(Recovery(p, 3), 0.8, 1e-12);          // 80.0%: 8 * 14 of the 560 triples hold one
  EXPECT_NEAR(GeminiCorollary1(16, 2, 2), 14.0 / 15.0, 1e-12);
  EXPECT_NEAR(GeminiCorollary1(16, 2, 3), 0.8, 1e-12);
}

// The paper says Ring's probability at N = 16, k = 3 is "25.0% lower" than GEMINI's 80.0%, i.e.
// 60.0%: that is 1 - 16 * 14 / 560, counting for each of the 16 adjacent pairs the 14 choices of
// a third node, which counts each of the 16 runs of three adjacent nodes twice. Exactly, 208 of
// the 560 triples hold an adjacent pair, so Ring recovers with 352 / 560 = 62.9%: 17.1 points,
// or 21.4% relative, below group placement.
TEST(PlacementTest, RingBelowGroupAtSixteenNodes) {
  double group = Recovery(Make(16, 2, PlacementStrategy::kGroup), 3);
  double ring = Recovery(Make(16, 2, PlacementStrategy::kRing), 3);
  EXPECT_NEAR(ring, 352.0 / 560.0, 1e-12);
  EXPECT_LT(ring, group);
  EXPECT_NEAR((group - ring) / group, 0.2142857142857143, 1e-12);
  EXPECT_NEAR(1 - 16.0 * 14.0 / 560.0, 0.75 * group, 1e-12);  // the paper's 25% figure
  // And at k = 2 (GEMINI Figure 3's argument): 16 adjacent pairs against 8 groups.
  EXPECT_NEAR(Recovery(Make(16, 2, PlacementStrategy::kRing), 2), 1 - 16.0 / 120.0, 1e-12);
}

// Theorem 1's proof: with k = m, a set loses a checkpoint iff it is one of the n distinct holder
// sets, so the loss is n / C(N, m); mixed placement has n = N - (m - 1)(floor(N/m) - 1). The
// optimum is ceil(N/m) / C(N, m), and the gap, (N % m + m - 2) / C(N, m), reaches the paper's
// bound (2m - 3) / C(N, m) when N % m = m - 1.
TEST(PlacementTest, TheoremOneCountAndGap) {
  for (int n = 3; n <= 40; n++) {
    for (int m = 2; m <= std::min(n, 5); m++) {
      if (n % m == 0) continue;
      double loss = 1 - Recovery(Make(n, m, PlacementStrategy::kMixed), m);
      double distinct = n - (m - 1) * (n / m - 1);
      EXPECT_NEAR(loss, distinct / Choose(n, m), 1e-12) << n << " " << m;
      double optimum = std::ceil(static_cast<double>(n) / m) / Choose(n, m);
      EXPECT_NEAR(loss - optimum, (n % m + m - 2) / Choose(n, m), 1e-12) << n << " " << m;
      EXPECT_LE(n % m + m - 2, 2 * m - 3);
    }
  }
}

// At the size bound the counting stays fast and accurate: N = 65536, m = 2, k = 2 and 3 are
// exact in Corollary 1's closed form (eq. 5).
TEST(PlacementTest, LargeClusterMatchesClosedForm) {
  Placement p = Make(kMaxPlacementNodes, 2, PlacementStrategy::kMixed);
  for (int k : {2, 3}) {
    double loss = -1;
    ASSERT_TRUE(LossProbabilityExact(p, k, &loss).ok());
    double closed = 1 - GeminiCorollary1(kMaxPlacementNodes, 2, k);
    EXPECT_NEAR(loss / closed, 1.0, 1e-9) << k;
  }
  // A ring of 65536 with m = 3 and 5 failures: about N * C(N, 2) / C(N, 5) = 60 / N^2.
  Placement ring = Make(kMaxPlacementNodes, 3, PlacementStrategy::kRing);
  double loss = -1;
  ASSERT_TRUE(LossProbabilityExact(ring, 5, &loss).ok());
  EXPECT_NEAR(loss * kMaxPlacementNodes * kMaxPlacementNodes / 60.0, 1.0, 1e-3);
}

// Erasure-coded groups against their own oracle: a group is lost iff more than `parity` of its
// nodes fail.
TEST(PlacementTest, CodingMatchesEnumeration) {
  for (auto [n, data, parity] :
       {std::tuple{16, 2, 2}, {12, 3, 1}, {12, 4, 2}, {15, 3, 2}, {6, 5, 1}, {18, 4, 2}}) {
    CodingPlacement c;
    ASSERT_TRUE(ComputeCodingPlacement(n, data, parity, &c).ok());
    ASSERT_EQ(static_cast<int>(c.groups.size()), n / (data + parity));
    EXPECT_EQ(c.groups[0].front(), 0);
    EXPECT_EQ(c.groups.back().back(), n - 1);
    std::vector<double> safe(static_cast<size_t>(n) + 1, 0);
    for (uint32_t failed = 0; failed < (uint32_t{1} << n); failed++) {
      bool lost = false;
      for (const std::vector<int>& g : c.groups) {
        int down = 0;
        for (int node : g) down += (failed >> node) & 1;
        lost = lost || down > parity;
      }
      if (!lost) safe[std::popcount(failed)] += 1;
    }
    for (int k = 0; k <= n; k++) {
      double value = -1;
      ASSERT_TRUE(RecoveryProbabilityExact(c, k, &value).ok());
      EXPECT_NEAR(value, safe[k] / Choose(n, k), 1e-12)
          << n << " " << data << "+" << parity << " k=" << k;
    }
  }
  // 16 nodes in 2+2 groups, 3 failures: 4 groups * C(4, 3) of the 560 triples are lost.
  CodingPlacement c;
  ASSERT_TRUE(ComputeCodingPlacement(16, 2, 2, &c).ok());
  double value = -1;
  ASSERT_TRUE(RecoveryProbabilityExact(c, 3, &value).ok());
  EXPECT_NEAR(value, 1 - 16.0 / 560.0, 1e-12);
}

// REFT section 5: P_s = exp(-lambda t^c); eqs. 5 and 6; our generalisation of eq. 5 to any
// placement against hand-computed values and an enumeration oracle.
TEST(PlacementTest, WeibullSurvival) {
  double ps = -1;
  ASSERT_TRUE(WeibullNodeSurvival(0.01, 2.0, 3.0, &ps).ok());
  EXPECT_NEAR(ps, std::exp(-0.09), 1e-15);  // 0.913931...
  ASSERT_TRUE(WeibullNodeSurvival(0.5, 1.0, 0.0, &ps).ok());
  EXPECT_EQ(ps, 1.0);

  double value = -1;
  // Two groups of two, P_s = 0.9: each group loses a checkpoint only if both fail.
  ASSERT_TRUE(InMemorySurvival(Make(4, 2, PlacementStrategy::kGroup), 0.9, &value).ok());
  EXPECT_NEAR(value, 0.99 * 0.99, 1e-15);
  // A ring of 3, m = 2: safe with no failure or one: 0.9^3 + 3 * 0.1 * 0.9^2 = 0.972.
  ASSERT_TRUE(InMemorySurvival(Make(3, 2, PlacementStrategy::kRing), 0.9, &value).ok());
  EXPECT_NEAR(value, 0.972, 1e-15);
  // A ring of 5, m = 2: no two adjacent failures: 0.9^5 + 5 * 0.1 * 0.9^4 + 5 * 0.01 * 0.9^3.
  ASSERT_TRUE(InMemorySurvival(Make(5, 2, PlacementStrategy::kRing), 0.9, &value).ok());
  EXPECT_NEAR(value, 0.95499, 1e-14);

  for (int n = 1; n <= 12; n++) {
    for (int m = 1; m <= std::min(n, 4); m++) {
      for (PlacementStrategy s : {PlacementStrategy::kRing, PlacementStrategy::kMixed}) {
        Placement p = Make(n, m, s);
        for (double survival : {0.0, 0.3, 0.9, 0.999, 1.0}) {
          ASSERT_TRUE(InMemorySurvival(p, survival, &value).ok());
          EXPECT_NEAR(value, OracleSurvival(p, survival), 1e-13)
              << n << " " << m << " " << PlacementStrategyName(s) << " " << survival;
        }
      }
    }
  }

  // Eq. 5 is this placement's survival for groups of n surviving one failure: coding n-1+1,
  // and groups of m = 2 replicas.
  CodingPlacement c;
  ASSERT_TRUE(ComputeCodingPlacement(12, 5, 1, &c).ok());
  ASSERT_TRUE(InMemorySurvival(c, 0.95, &value).ok());
  EXPECT_NEAR(value, ReftEquation5(12, 6, 0.95, 1.0), 1e-15);
  EXPECT_NEAR(value, std::pow(std::pow(0.95, 6) + 6 * 0.05 * std::pow(0.95, 5), 2), 1e-15);
  ASSERT_TRUE(InMemorySurvival(Make(12, 2, PlacementStrategy::kGroup), 0.95, &value).ok());
  EXPECT_NEAR(value, ReftEquation5(12, 2, 0.95, 1.0), 1e-15);
  // Eq. 6 is the survival with one copy per node, and its P_tr factor multiplies.
  ASSERT_TRUE(InMemorySurvival(Make(12, 1, PlacementStrategy::kGroup), 0.95, &value).ok());
  EXPECT_NEAR(value, ReftEquation6(12, 0.95, 1.0), 1e-15);
  EXPECT_NEAR(ReftEquation6(12, 0.95, 0.99), std::pow(0.95 * 0.99, 12), 1e-15);
  EXPECT_NEAR(ReftEquation5(12, 6, 0.95, 0.99),
              ReftEquation5(12, 6, 0.95, 1.0) * std::pow(0.99, 12), 1e-15);
}

// REFT Figure 8: 3072 devices in sharding groups of 6 (6 DP paths), lambda 1e-4, c = 1.3: with
// REFT the parameters stay above 0.9 survival for 16.22 days; checkpointing alone, "around 0.5
// days". Eq. 5 with P_re = 1 crosses 0.9 at 16.18 days and eq. 6 at 0.44 days; with the figure's
// software rate 1e-5 in P_re^k the crossing would be 2.6 days, so the figure's curve leaves it out.
TEST(PlacementTest, ReftFigureEight) {
  CodingPlacement c;
  ASSERT_TRUE(ComputeCodingPlacement(3072, 5, 1, &c).ok());
  auto survival = [&](double days) {
    double ps = -1;
    double value = -1;
    EXPECT_TRUE(WeibullNodeSurvival(1e-4, 1.3, days, &ps).ok());
    EXPECT_TRUE(InMemorySurvival(c, ps, &value).ok());
    return value;
  };
  EXPECT_GT(survival(16.0), 0.9);
  EXPECT_LT(survival(16.4), 0.9);
  auto baseline = [](double days) {
    double ps = -1;
    EXPECT_TRUE(WeibullNodeSurvival(1e-4, 1.3, days, &ps).ok());
    return ReftEquation6(3072, ps, 1.0);
  };
  EXPECT_GT(baseline(0.4), 0.9);
  EXPECT_LT(baseline(0.5), 0.9);
}

TEST(PlacementTest, Errors) {
  Placement p;
  Status st = ComputePlacement(0, 1, PlacementStrategy::kMixed, &p);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("nodes 0"), std::string::npos) << st.message();
  st = ComputePlacement(kMaxPlacementNodes + 1, 2, PlacementStrategy::kMixed, &p);
  EXPECT_NE(st.message().find("65537"), std::string::npos) << st.message();
  st = ComputePlacement(4, 0, PlacementStrategy::kMixed, &p);
  EXPECT_NE(st.message().find("replicas 0"), std::string::npos) << st.message();
  st = ComputePlacement(4, 5, PlacementStrategy::kRing, &p);
  EXPECT_NE(st.message().find("replicas 5 is more than nodes 4"), std::string::npos)
      << st.message();
  st = ComputePlacement(10, 3, PlacementStrategy::kGroup, &p);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("10 is not divisible by 3"), std::string::npos) << st.message();

  p = Make(16, 2, PlacementStrategy::kMixed);
  double value = -1;
  EXPECT_EQ(RecoveryProbabilityExact(p, -1, &value).code(), CKPTDB_EINVAL);
  st = RecoveryProbabilityExact(p, 17, &value);
  EXPECT_NE(st.message().find("failures 17 is outside 0..16"), std::string::npos) << st.message();
  Placement forged = p;
  forged.holders[3] = {3, 3};  // two copies on node 3
  st = RecoveryProbabilityExact(forged, 2, &value);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("not one ComputePlacement makes"), std::string::npos);
  EXPECT_EQ(InMemorySurvival(forged, 0.5, &value).code(), CKPTDB_EINVAL);
  forged = p;
  forged.groups.pop_back();
  EXPECT_EQ(RecoveryProbabilityExact(forged, 2, &value).code(), CKPTDB_EINVAL);

  Placement big = Make(kMaxPlacementNodes, 2, PlacementStrategy::kMixed);
  st = RecoveryProbabilityExact(big, 30000, &value);
  EXPECT_EQ(st.code(), CKPTDB_ENOTSUP);
  EXPECT_NE(st.message().find("30000 failures"), std::string::npos) << st.message();

  CodingPlacement c;
  st = ComputeCodingPlacement(10, 2, 2, &c);
  EXPECT_NE(st.message().find("10 is not divisible by the coding group size 2+2 = 4"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(ComputeCodingPlacement(8, 0, 2, &c).code(), CKPTDB_EINVAL);
  EXPECT_EQ(ComputeCodingPlacement(8, 4, 0, &c).code(), CKPTDB_EINVAL);
  ASSERT_TRUE(ComputeCodingPlacement(8, 2, 2, &c).ok());
  EXPECT_EQ(RecoveryProbabilityExact(c, 9, &value).code(), CKPTDB_EINVAL);
  c.groups.pop_back();
  EXPECT_EQ(RecoveryProbabilityExact(c, 2, &value).code(), CKPTDB_EINVAL);

  EXPECT_EQ(WeibullNodeSurvival(-1, 1, 1, &value).code(), CKPTDB_EINVAL);
  EXPECT_EQ(WeibullNodeSurvival(1, 0, 1, &value).code(), CKPTDB_EINVAL);
  EXPECT_EQ(WeibullNodeSurvival(1, 1, -2, &value).code(), CKPTDB_EINVAL);
  EXPECT_EQ(WeibullNodeSurvival(1, 1, std::nan(""), &value).code(), CKPTDB_EINVAL);
  EXPECT_EQ(WeibullNodeSurvival(INFINITY, 1, 1, &value).code(), CKPTDB_EINVAL);
  EXPECT_EQ(InMemorySurvival(p, 1.5, &value).code(), CKPTDB_EINVAL);
  EXPECT_EQ(InMemorySurvival(p, std::nan(""), &value).code(), CKPTDB_EINVAL);
}

// ---- ckptdb plan ----------------------------------------------------------------------------

struct Result {
  int code = -1;
  std::string output;
};

Result Plan(const std::string& args) {
  Result r;
  r.code = RunCommand(std::string(CKPTDB_CLI) + " plan " + args, &r.output);
  return r;
}

bool Has(const Result& r, const std::string& text) {
  return r.output.find(text) != std::string::npos;
}

TEST(PlanCliTest, GeminiFigures) {
  Result two = Plan("--nodes 16 --replicas 2 --failures 2");
  EXPECT_EQ(two.code, 0) << two.output;
  EXPECT_TRUE(Has(two, "93.3%")) << two.output;
  EXPECT_TRUE(Has(two, "group 7: nodes 14 15")) << two.output;
  EXPECT_TRUE(Has(two, "node 15: on 15 14")) << two.output;
  Result three = Plan("--nodes 16 --replicas 2 --failures 3");
  EXPECT_EQ(three.code, 0) << three.output;
  EXPECT_TRUE(Has(three, "80.0%")) << three.output;

  Result table = Plan("--nodes 16");  // m = 2, k = 1..5
  EXPECT_EQ(table.code, 0) << table.output;
  for (const char* line :
       {"1         100.0%                 100.0%", "2         93.3%                  93.3%",
        "3         80.0%                  80.0%", "4         61.5%                  >= 60.0%"}) {
    EXPECT_TRUE(Has(table, line)) << line << "\n" << table.output;
  }
  Result ring = Plan("--nodes 16 --failures 3 --strategy ring");
  EXPECT_EQ(ring.code, 0) << ring.output;
  EXPECT_TRUE(Has(ring, "62.9%")) << ring.output;
  Result mixed = Plan("--nodes 5");
  EXPECT_TRUE(Has(mixed, "group 1 (ring): nodes 2 3 4")) << mixed.output;
  EXPECT_TRUE(Has(mixed, "node 4: on 4 2")) << mixed.output;
}

TEST(PlanCliTest, JsonCodingAndWeibull) {
  Result r = Plan("--nodes 16 --failures 3 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["format"], "ckptdb-plan");
  EXPECT_EQ(j["strategy"], "group");
  EXPECT_EQ(j["groups"].size(), 8u);
  EXPECT_EQ(j["holders"][1], (std::vector<int>{1, 0}));
  EXPECT_NEAR(j["failures"][0]["recovery_probability"].get<double>(), 0.8, 1e-12);
  EXPECT_NEAR(j["failures"][0]["corollary1"].get<double>(), 0.8, 1e-12);
  EXPECT_EQ(j["failures"][0]["corollary1_exact"], true);

  Result ec = Plan("--nodes 16 --ec 2+2 --failures 3");
  EXPECT_EQ(ec.code, 0) << ec.output;
  EXPECT_TRUE(Has(ec, "97.1%")) << ec.output;

  Result w = Plan("--nodes 3072 --ec 5+1 --failures 2 --weibull 0.0001,1.3 --days 16 --json");
  ASSERT_EQ(w.code, 0) << w.output;
  j = nlohmann::json::parse(w.output);
  EXPECT_GT(j["weibull"]["survival"].get<double>(), 0.9);
  EXPECT_NEAR(j["weibull"]["node_survival"].get<double>(), std::exp(-1e-4 * std::pow(16, 1.3)),
              1e-15);
  Result text = Plan("--nodes 4 --replicas 2 --weibull 0.01,2 --days 3");
  EXPECT_EQ(text.code, 0) << text.output;
  // P_s = exp(-0.09) = 91.4%; (1 - 0.0861^2)^2 = 98.5%; P_s^4 = 69.8%.
  EXPECT_TRUE(Has(text, "91.4%")) << text.output;
  EXPECT_TRUE(Has(text, "98.5%")) << text.output;
  EXPECT_TRUE(Has(text, "69.8%")) << text.output;
}

// REFT sharding groups: the stacking claim printed where it holds (two ARC shifts) and where it
// does not (ARC and AEC: the ARC holder also holds the only parity covering one of the owner's
// sub-slices), in text and JSON; coding groups of several ranks per node.
TEST(PlanCliTest, ReftStackingAndRanksPerNode) {
  Result holds = Plan("--nodes 8 --dp 4 --reft arc --reft arc:2");
  EXPECT_EQ(holds.code, 0) << holds.output;
  EXPECT_TRUE(Has(holds, "so it tolerates 2: the claim holds here")) << holds.output;
  EXPECT_TRUE(Has(holds, "2         100.0%")) << holds.output;
  // ARC with AEC as ckptdb builds it ("arc+aec": slice j's parity off node j - 1): every pair
  // of the 4 is survived, no triple; each node keeps 1/4 + 1/4 + 1/(4*2) of the model.
  Result both = Plan("--nodes 4 --dp 4 --reft arc --reft aec --json");
  ASSERT_EQ(both.code, 0) << both.output;
  nlohmann::json j = nlohmann::json::parse(both.output);
  EXPECT_EQ(j["reft_stacking_claim"]["holds"], true);
  EXPECT_EQ(j["reft_stacking_claim"]["tolerated_in_sharding_group"], 2);
  EXPECT_EQ(j["reft_stacking_claim"]["smallest_loss"], (std::vector<int>{0, 1, 2}));
  EXPECT_NEAR(j["memory_per_node"].get<double>(), 0.25 + 0.25 + 1.0 / 8, 1e-12);
  EXPECT_NEAR(j["failures"][1]["recovery_probability"].get<double>(), 1.0, 1e-12);
  EXPECT_NEAR(j["failures"][2]["recovery_probability"].get<double>(), 0.0, 1e-12);
  Result ranks = Plan("--nodes 8 --ec 4+2 --ranks-per-node 3");
  EXPECT_EQ(ranks.code, 0) << ranks.output;
  EXPECT_TRUE(Has(ranks, "group 1: nodes 6 7 0 1 2 3")) << ranks.output;
  EXPECT_TRUE(Has(ranks, "3         0.0%")) << ranks.output;
  Result bad = Plan("--nodes 8 --dp 3 --reft arc");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(Has(bad, "sharding groups of 3 nodes")) << bad.output;
  bad = Plan("--nodes 4 --dp 4 --reft xor");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(Has(bad, "'xor' is not a REFT scheme")) << bad.output;
}

// Inputs whose placement or model would take gigabytes are refused before anything is built
// (65536 nodes with 65536 replicas once used 13 GB for over 100 s; 65536 nodes in sharding groups
// of 4096, 22 GB), each naming its bound.
TEST(PlanCommand, InputsTooBigToModelAreRefusedBeforeAnythingIsBuilt) {
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--nodes 65536 --replicas 65536 --failures 1", "copies to place, more than 4194304"},
           {"--nodes 65536 --dp 4096 --reft arc --failures 1", "node-slices to model"},
           {"--nodes 65536 --dp 4096 --compare", "node-slices to model"},
           {"--nodes 65536 --ec 2+2 --ranks-per-node 1024 --failures 2", "ranks to model"}}) {
    const auto start = std::chrono::steady_clock::now();
    Result r = Plan(args);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_TRUE(Has(r, want)) << args << ": " << r.output;
    EXPECT_LT(s, 30.0) << args << ": refused only after " << s << " s";
  }
  Result ok = Plan("--nodes 65536 --replicas 64 --failures 1");  // at the bound: 4194304
  EXPECT_EQ(ok.code, 0) << ok.output.substr(0, 300);
}

// One row of `plan --compare --json` as a test expects it: memory per node, losses tolerated,
// and the odds for 1 and 2 failures.
struct CompareRow {
  const char* name;
  double memory;
  int tolerated;
  double one;
  double two;
};
void ExpectComparison(const std::string& output, const std::vector<CompareRow>& want) {
  const nlohmann::json j = nlohmann::json::parse(output);
  ASSERT_EQ(j["comparison"].size(), want.size()) << output;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& row = j["comparison"][i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(row["protection"], want[i].name);
    EXPECT_NEAR(row["memory_per_node"].get<double>(), want[i].memory, 1e-12);
    EXPECT_EQ(row["tolerated_in_sharding_group"], want[i].tolerated);
    EXPECT_NEAR(row["failures"][0]["recovery_probability"].get<double>(), want[i].one, 1e-12);
    EXPECT_NEAR(row["failures"][1]["recovery_probability"].get<double>(), want[i].two, 1e-12);
  }
}

// --compare: REFT's protections as ckptdb builds them beside replicas of each node's snapshot,
// on 8 nodes in sharding groups of 4. Memory per node: 1/4, 1/2, 1/4 + 1/12, 1/2 + 1/8, 2/4.
// Two failures of 28 pairs: ARC loses the 8 adjacent pairs within a group (20/28), AEC every
// pair within a group (12 of 28: 16/28 survive), ARC with AEC none; replicas (the mixed
// placement of 8 nodes, pairs) lose the 4 pairs that hold both copies (24/28).
TEST(PlanCliTest, CompareSetsTheProtectionsSideBySide) {
  Result r = Plan("--nodes 8 --dp 4 --compare --json");
  ASSERT_EQ(r.code, 0) << r.output;
  ExpectComparison(r.output, {{"none", 0.25, 0, 0.0, 0.0},
                              {"arc", 0.5, 1, 1.0, 20.0 / 28},
                              {"aec", 0.25 + 1.0 / 12, 1, 1.0, 16.0 / 28},
                              {"arc+aec", 0.625, 2, 1.0, 1.0},
                              {"replicate:2", 0.5, 1, 1.0, 24.0 / 28}});
  Result text = Plan("--nodes 8 --dp 4 --compare --ec 3+1");
  EXPECT_EQ(text.code, 0) << text.output;
  EXPECT_TRUE(Has(text, "arc+aec           0.625          2      100.0%      100.0%"))
      << text.output;
  EXPECT_TRUE(Has(text, "ec:3+1")) << text.output;
  EXPECT_TRUE(Has(text, "--private F adds them and the aor rows")) << text.output;
  Result bad = Plan("--nodes 8 --dp 4 --compare --reft arc");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_TRUE(Has(bad, "--compare picks the protections itself")) << bad.output;
  Result pairs = Plan("--nodes 8 --dp 2 --compare");  // no aec rows with groups of 2
  EXPECT_EQ(pairs.code, 0) << pairs.output;
  EXPECT_FALSE(Has(pairs, "aec")) << pairs.output;
}

// --private 0.5: each node also holds a private shard of half the group's state (a ZeRO-1
// optimizer shard) that no other member holds. Without AOR any one loss loses data; with it
// (kept again by the node before) ARC's adjacent pairs are lost as before (20/28 survive 2), as
// are ARC with AEC's (AOR's loss of an owner and its keeper); memory adds 0.5 per node, twice
// with AOR, and doubles with replicas.
TEST(PlanCliTest, ComparePrivateShardsWithAndWithoutAor) {
  Result r = Plan("--nodes 8 --dp 4 --compare --private 0.5 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["private_share"], 0.5);
  ExpectComparison(r.output, {{"none", 0.75, 0, 0.0, 0.0},
                              {"arc", 1.0, 0, 0.0, 0.0},
                              {"aec", 0.75 + 1.0 / 12, 0, 0.0, 0.0},
                              {"arc+aec", 1.125, 0, 0.0, 0.0},
                              {"arc+aor", 1.5, 1, 1.0, 20.0 / 28},
                              {"aec+aor", 1.25 + 1.0 / 12, 1, 1.0, 16.0 / 28},
                              {"arc+aec+aor", 1.625, 1, 1.0, 20.0 / 28},
                              {"replicate:2", 1.5, 1, 1.0, 24.0 / 28}});
  Result aor = Plan("--nodes 8 --dp 4 --reft aor");
  EXPECT_EQ(aor.code, 2) << aor.output;
  EXPECT_TRUE(Has(aor, "aor protects each member's private shard")) << aor.output;
  Result stacked = Plan("--nodes 8 --dp 4 --reft arc --reft aor --private 1");
  EXPECT_EQ(stacked.code, 0) << stacked.output;
  EXPECT_TRUE(Has(stacked, "memory per node: 2.5 x")) << stacked.output;
  for (const char* bad : {"--private 0", "--private -1", "--private 2000", "--private x"}) {
    Result b = Plan(std::string("--nodes 8 --dp 4 --compare ") + bad);
    EXPECT_EQ(b.code, 2) << bad << ": " << b.output;
  }
  EXPECT_EQ(Plan("--nodes 8 --private 1").code, 2);  // needs --dp
}

TEST(PlanCliTest, BadArgumentsExitTwo) {
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {
           Case{"--nodes 0", "--nodes 0"},
           Case{"--nodes 70000", "--nodes 70000"},
           Case{"--nodes abc", "--nodes"},
           Case{"", "--nodes"},
           Case{"--nodes 4 --replicas 5", "--replicas 5"},
           Case{"--nodes 4 --replicas 0", "--replicas 0"},
           Case{"--nodes 10 --replicas 3 --strategy group", "not divisible by 3"},
           Case{"--nodes 16 --strategy star", "--strategy"},
           Case{"--nodes 16 --failures 17", "--failures 17"},
           Case{"--nodes 16 --failures -1", "--failures -1"},
           Case{"--nodes 16 --ec 2x2", "--ec '2x2'"},
           Case{"--nodes 10 --ec 2+2", "divisible by the coding group size 2+2"},
           Case{"--nodes 16 --ec 2+0", "parity shards 0"},
           Case{"--nodes 16 --ec 2+2 --replicas 3", "--replicas"},
           Case{"--nodes 16 --weibull 0.1,1", "--days"},
           Case{"--nodes 16 --days 3", "--weibull"},
           Case{"--nodes 16 --weibull abc --days 3", "--weibull 'abc'"},
           Case{"--nodes 16 --weibull -1,1 --days 3", "lambda"},
           Case{"--nodes 16 --weibull 0.1,0 --days 3", "shape"},
           Case{"--nodes 16 --weibull 0.1,1 --days -3", "days"},
           Case{"--nodes 65536 --failures 30000", "ask for fewer failures"},
       }) {
    Result r = Plan(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(Has(r, c.message)) << c.args << ": expected '" << c.message << "'\n" << r.output;
  }
  Result help = Plan("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Has(help, "--weibull")) << help.output;
}

}  // namespace
}  // namespace ckpt::redundancy
