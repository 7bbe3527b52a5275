// How a job's ranks form coding groups (engine/cluster.h, ComputeCodingGroups): every rank in
// exactly one group of K + M, every group on K + M distinct nodes, for one or many ranks per node
// and node counts that are not a multiple of K + M; refusals name the numbers.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "redundancy/placement.h"

namespace ckpt::redundancy {
namespace {

CodeSpec Code(const std::string& text) {
  CodeSpec code;
  EXPECT_TRUE(ParseCodeSpec(text, &code).ok()) << text;
  return code;
}

// Ranks node-major: ranks_per_node consecutive ranks on each of `nodes` nodes.
std::vector<std::string> NodeMajor(int nodes, int ranks_per_node) {
  std::vector<std::string> out;
  for (int n = 0; n < nodes; ++n) {
    for (int r = 0; r < ranks_per_node; ++r) out.push_back("node" + std::to_string(n));
  }
  return out;
}

void ExpectAPartitionOnDistinctNodes(const std::vector<std::string>& node_of_rank,
                                     const CodeSpec& code,
                                     const std::vector<std::vector<uint32_t>>& groups) {
  std::set<uint32_t> seen;
  for (const auto& group : groups) {
    ASSERT_EQ(group.size(), code.k + code.m);
    std::set<std::string> nodes;
    for (uint32_t rank : group) {
      EXPECT_TRUE(seen.insert(rank).second) << "rank " << rank << " in two groups";
      EXPECT_TRUE(nodes.insert(node_of_rank[rank]).second)
          << "two members on " << node_of_rank[rank];
    }
  }
  EXPECT_EQ(seen.size(), node_of_rank.size());
}

TEST(CodingGroupsTest, OneRankPerNodeGivesConsecutiveNodes) {
  std::vector<std::vector<uint32_t>> groups;
  ASSERT_TRUE(ComputeCodingGroups(NodeMajor(8, 1), Code("ec:2+2"), &groups).ok());
  EXPECT_EQ(groups, (std::vector<std::vector<uint32_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

// ec:4+2 on 8 nodes of 3 ranks: 4 groups, each 6 cyclically consecutive nodes.
TEST(CodingGroupsTest, NodesThatAreNotAMultipleOfTheGroupTakeSeveralRanksEach) {
  const auto node_of = NodeMajor(8, 3);
  std::vector<std::vector<uint32_t>> groups;
  ASSERT_TRUE(ComputeCodingGroups(node_of, Code("ec:4+2"), &groups).ok());
  ASSERT_EQ(groups.size(), 4u);
  ExpectAPartitionOnDistinctNodes(node_of, Code("ec:4+2"), groups);
  // Group 1 starts at node 6 and wraps: nodes 6 7 0 1 2 3, their second... first ranks.
  EXPECT_EQ(groups[1], (std::vector<uint32_t>{18, 21, 1, 4, 7, 10}));
}

TEST(CodingGroupsTest, RandomJobsArePartitionedOrRefused) {
  std::mt19937 rng(5);
  int formed = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int nodes = 1 + static_cast<int>(rng() % 10);
    const int ranks = 1 + static_cast<int>(rng() % 24);
    std::vector<std::string> node_of;
    for (int r = 0; r < ranks; ++r) node_of.push_back("n" + std::to_string(rng() % nodes));
    const uint32_t m = 1 + rng() % 3;
    const uint32_t k = 1 + rng() % 4;
    const CodeSpec code = Code("ec:" + std::to_string(k) + "+" + std::to_string(m));
    std::vector<std::vector<uint32_t>> groups;
    Status st = ComputeCodingGroups(node_of, code, &groups);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), CKPTDB_EINVAL);
      EXPECT_NE(st.message().find(code.Name()), std::string::npos) << st.message();
      continue;
    }
    ++formed;
    ExpectAPartitionOnDistinctNodes(node_of, code, groups);
  }
  EXPECT_GT(formed, 50);
}

// Every job with as many ranks on each node, at least K + M nodes and ranks a multiple of K + M
// is accepted (and partitioned onto distinct nodes); every other equal job is refused.
TEST(CodingGroupsTest, EqualNodesAreAcceptedExactlyWhenTheyFit) {
  for (int nodes = 1; nodes <= 10; ++nodes) {
    for (int per_node = 1; per_node <= 4; ++per_node) {
      for (uint32_t g = 2; g <= 8; ++g) {
        for (uint32_t m = 1; m < g; ++m) {
          const CodeSpec code = Code("ec:" + std::to_string(g - m) + "+" + std::to_string(m));
          const auto node_of = NodeMajor(nodes, per_node);
          const bool fits = static_cast<uint32_t>(nodes) >= g && node_of.size() % g == 0;
          std::vector<std::vector<uint32_t>> groups;
          Status st = ComputeCodingGroups(node_of, code, &groups);
          ASSERT_EQ(st.ok(), fits)
              << nodes << " nodes of " << per_node << ", " << code.Name() << ": " << st.message();
          if (fits) ExpectAPartitionOnDistinctNodes(node_of, code, groups);
        }
      }
    }
  }
}

TEST(CodingGroupsTest, RefusalsNameTheNumbers) {
  std::vector<std::vector<uint32_t>> groups;
  Status st = ComputeCodingGroups(NodeMajor(3, 2), Code("ec:2+2"), &groups);
  EXPECT_NE(st.message().find("groups of 4 distinct nodes; the job has 3"), std::string::npos)
      << st.message();
  st = ComputeCodingGroups(NodeMajor(5, 1), Code("ec:2+2"), &groups);
  EXPECT_NE(st.message().find("in groups of 4 on distinct nodes; the job has 5 ranks"),
            std::string::npos)
      << st.message();
  // node0 runs 3 of 4 ranks: a group of 2 would put two of them together.
  st = ComputeCodingGroups({"node0", "node0", "node0", "node1"}, Code("ec:1+1"), &groups);
  EXPECT_NE(st.message().find("would share node node0"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace ckpt::redundancy
