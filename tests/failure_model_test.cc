// redundancy/failure_model.h: joint decoding over stacked protections and exact enumeration of
// failure sets. Held against redundancy/placement.h's independent counting for coding groups, and
// against what can be worked out by hand for REFT's schemes; REFT's stacking claim (section 4.2:
// N schemes tolerate N failures in a sharding group) is checked where it holds and where not.
#include "redundancy/failure_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace ckpt::redundancy {
namespace {

std::vector<ReftScheme> Schemes(const std::vector<std::string>& names) {
  std::vector<ReftScheme> out;
  for (const std::string& n : names) {
    ReftScheme s;
    EXPECT_TRUE(ParseReftScheme(n, &s).ok()) << n;
    out.push_back(s);
  }
  return out;
}

// The smallest loss within sharding group 0 of a REFT layout.
int Tolerance(int nodes, int m, const std::vector<std::string>& schemes,
              std::vector<int>* example = nullptr, std::string* lost = nullptr) {
  FailureModel model(1);
  EXPECT_TRUE(BuildReftModel(nodes, m, Schemes(schemes), nullptr, nullptr, &model).ok());
  std::vector<int> sg;
  for (int i = 0; i < m; ++i) sg.push_back(i);
  int size = 0;
  std::vector<int> set;
  std::string what;
  EXPECT_TRUE(model.SmallestLoss(sg, &size, &set, &what).ok());
  if (example) *example = set;
  if (lost) *lost = what;
  return size == 0 ? m : size - 1;
}

TEST(FailureModelTest, CodingGroupsAgreeWithPlacementsCounting) {
  for (auto [nodes, k, m] : {std::tuple{4, 2, 2}, {6, 2, 1}, {8, 2, 2}, {12, 4, 2}, {9, 2, 1}}) {
    FailureModel model(1);
    std::vector<std::vector<int>> groups;
    ASSERT_TRUE(BuildCodingModel(nodes, 1, k, m, &model, &groups).ok());
    CodingPlacement placement;
    ASSERT_TRUE(ComputeCodingPlacement(nodes, k, m, &placement).ok());
    EXPECT_EQ(groups, placement.groups);
    for (int f = 0; f <= nodes; ++f) {
      double recovery = 0, loss = 0, want = 0;
      ASSERT_TRUE(model.RecoveryProbability(f, &recovery, &loss).ok());
      ASSERT_TRUE(RecoveryProbabilityExact(placement, f, &want).ok());
      EXPECT_NEAR(recovery, want, 1e-12) << nodes << " nodes " << k << "+" << m << " f " << f;
      EXPECT_NEAR(recovery + loss, 1.0, 1e-12);
    }
  }
}

// ec:4+2 on 8 nodes of 3 ranks: groups span nodes 0-5, 6-3, 4-1 and 2-7, each missing a
// different pair ({6,7}, {4,5}, {2,3}, {0,1}). Any 2 failures keep every group within its M = 2;
// 3 nodes cannot touch all four pairs, so some group contains all three: every set of 3 loses.
TEST(FailureModelTest, GroupsOfRanksOverMoreNodesThanAGroup) {
  FailureModel model(1);
  std::vector<std::vector<int>> groups;
  ASSERT_TRUE(BuildCodingModel(8, 3, 4, 2, &model, &groups).ok());
  ASSERT_EQ(groups.size(), 4u);
  double recovery = 0, loss = 0;
  ASSERT_TRUE(model.RecoveryProbability(2, &recovery, &loss).ok());
  EXPECT_EQ(recovery, 1.0);
  ASSERT_TRUE(model.RecoveryProbability(3, &recovery, &loss).ok());
  EXPECT_EQ(loss, 1.0);
  EXPECT_NEAR(model.memory_per_node, 1.5, 1e-12);
}

TEST(FailureModelTest, ReftSchemesAlone) {
  // Sharding alone: any one loss loses a slice.
  EXPECT_EQ(Tolerance(4, 4, {}), 0);
  // ARC or AEC: any one loss is survived, two adjacent ones are not.
  for (int m : {3, 4, 5}) {
    EXPECT_EQ(Tolerance(m, m, {"arc"}), 1) << m;
    EXPECT_EQ(Tolerance(m, m, {"aec"}), 1) << m;
  }
  EXPECT_EQ(Tolerance(2, 2, {"arc"}), 1);
}

// REFT: "If N redundant protection strategies are enabled simultaneously, or the same strategy is
// used N times with different parameters ... if N or fewer node failures occur in the same SG,
// the training process can be restored."
TEST(FailureModelTest, ReftStackingClaim) {
  // Holds: two ARC copies at different shifts put every slice on 3 nodes.
  EXPECT_EQ(Tolerance(4, 4, {"arc", "arc:2"}), 2);
  EXPECT_EQ(Tolerance(5, 5, {"arc", "arc:2"}), 2);
  // ARC and AEC as ckptdb builds them ("arc+aec"): slice j's parity is kept off node j - 1,
  // which holds its ARC copy, so any two losses are survived (with REFT's layout, parity over all
  // m - 1 others, losing nodes 0 and 1 of a group of 3 lost slice 1: its copy was on node 0, and
  // one of its sub-slices was covered only by node 0's parity). Three are not.
  for (int m : {3, 4, 5, 6}) EXPECT_EQ(Tolerance(m, m, {"arc", "aec"}), 2) << m;
  std::vector<int> set;
  std::string lost;
  EXPECT_EQ(Tolerance(4, 4, {"arc", "aec"}, &set, &lost), 2);
  EXPECT_EQ(set.size(), 3u);
  EXPECT_NE(lost.find("slice"), std::string::npos) << lost;
  // Nor the same parameters twice (no new redundancy).
  EXPECT_EQ(Tolerance(4, 4, {"arc", "arc"}), 1);
}

TEST(FailureModelTest, MemoryPerNode) {
  FailureModel model(1);
  ASSERT_TRUE(BuildReftModel(8, 4, Schemes({"arc", "aec"}), nullptr, nullptr, &model).ok());
  EXPECT_NEAR(model.memory_per_node, 0.25 + 0.25 + 1.0 / 8, 1e-12);  // parity over 2 members
  Placement replicas;
  ASSERT_TRUE(ComputePlacement(8, 2, PlacementStrategy::kMixed, &replicas).ok());
  ASSERT_TRUE(BuildReftModel(8, 4, Schemes({"aec"}), &replicas, nullptr, &model).ok());
  EXPECT_NEAR(model.memory_per_node, 2 * (0.25 + 1.0 / 12), 1e-12);
}

// Stacked across nodes: AEC in groups of 4 plus replicas of each node's snapshot on another
// group's node survives any 2 failures (each of the 2 layers alone survives 1).
TEST(FailureModelTest, MixedWithReplicasAcrossNodes) {
  Placement replicas;
  ASSERT_TRUE(ComputePlacement(8, 2, PlacementStrategy::kRing, &replicas).ok());
  FailureModel model(1);
  ASSERT_TRUE(BuildReftModel(8, 4, Schemes({"aec"}), &replicas, nullptr, &model).ok());
  double recovery = 0, loss = 0;
  ASSERT_TRUE(model.RecoveryProbability(2, &recovery, &loss).ok());
  EXPECT_EQ(recovery, 1.0);
}

// REFT's AOR: each member's private shard is also held by the member before it, so a loss of
// one member is survived and of an owner with its keeper is not; without AOR a private shard
// is lost with its node, whatever protects the group's state.
TEST(FailureModelTest, AorKeepsEachPrivateShardOnTheMemberBefore) {
  FailureModel model(1);
  ASSERT_TRUE(BuildReftModel(4, 4, Schemes({"arc", "aec"}), nullptr, nullptr, &model, 1).ok());
  double recovery = 0, loss = 0;
  ASSERT_TRUE(model.RecoveryProbability(1, &recovery, &loss).ok());
  EXPECT_EQ(recovery, 0.0);
  ASSERT_TRUE(
      BuildReftModel(4, 4, Schemes({"arc", "aec", "aor"}), nullptr, nullptr, &model, 1).ok());
  EXPECT_NEAR(model.memory_per_node, 0.25 + 0.25 + 1.0 / 8 + 2, 1e-12);
  ASSERT_TRUE(model.RecoveryProbability(1, &recovery, &loss).ok());
  EXPECT_EQ(recovery, 1.0);
  // Of the 6 pairs of 4, the 4 adjacent ones (an owner and its keeper) lose a private shard.
  ASSERT_TRUE(model.RecoveryProbability(2, &recovery, &loss).ok());
  EXPECT_NEAR(recovery, 2.0 / 6, 1e-12);
  std::vector<int> group = {0, 1, 2, 3}, set;
  int smallest = 0;
  std::string lost;
  ASSERT_TRUE(model.SmallestLoss(group, &smallest, &set, &lost).ok());
  EXPECT_EQ(smallest, 2);
  EXPECT_NE(lost.find("private shard"), std::string::npos) << lost;
  EXPECT_EQ(BuildReftModel(4, 4, Schemes({"aor"}), nullptr, nullptr, &model).code(), CKPTDB_EINVAL);
  EXPECT_EQ(BuildReftModel(4, 4, Schemes({"arc"}), nullptr, nullptr, &model, -1).code(),
            CKPTDB_EINVAL);
}

TEST(FailureModelTest, BadLayoutsAreRefused) {
  FailureModel model(1);
  EXPECT_EQ(BuildReftModel(6, 4, Schemes({"arc"}), nullptr, nullptr, &model).code(), CKPTDB_EINVAL);
  EXPECT_EQ(BuildReftModel(4, 2, Schemes({"aec"}), nullptr, nullptr, &model).code(), CKPTDB_EINVAL);
  EXPECT_EQ(BuildReftModel(4, 4, Schemes({"arc:4"}), nullptr, nullptr, &model).code(),
            CKPTDB_EINVAL);
  ReftScheme s;
  EXPECT_EQ(ParseReftScheme("arc:x", &s).code(), CKPTDB_EINVAL);
  EXPECT_EQ(ParseReftScheme("xor", &s).code(), CKPTDB_EINVAL);
}

}  // namespace
}  // namespace ckpt::redundancy
