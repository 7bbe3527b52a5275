// The commit protocol simulated (engine/simulation.h; docs/testing.md, "Simulation"): seeds of
// faults over the real coordinator and JobCommit hold every invariant, and a seed replays
// exactly. `ckptdb simulate` runs more of them (the simulate test in tests/CMakeLists.txt).
#include "engine/simulation.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace ckpt::engine {
namespace {

SimulationResult RunSeed(uint32_t ranks, uint64_t seed, bool faults) {
  SimulationOptions o;
  o.ranks = ranks;
  o.ranks_per_node = 8;
  o.seed = seed;
  o.faults = faults;
  o.versions = 3;
  SimulationResult r;
  Status st = Simulate(o, &r);
  EXPECT_TRUE(st.ok()) << st.message();
  return r;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (size_t i = 0; i < lines.size() && i < 20; ++i) out += lines[i] + "\n";
  return out;
}

TEST(SimulationTest, SeedsOfFaultsHoldEveryInvariant) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SimulationResult r = RunSeed(64, seed, true);
    EXPECT_TRUE(r.violations.empty()) << "seed " << seed << ":\n" << Joined(r.violations);
    EXPECT_GE(r.figures.committed, 3u) << "seed " << seed;
    EXPECT_EQ(r.figures.faults, 8u) << "seed " << seed;
    EXPECT_GT(r.figures.votes, 0u);
  }
}

TEST(SimulationTest, ASeedReplaysExactly) {
  SimulationResult a = RunSeed(64, 7, true);
  SimulationResult b = RunSeed(64, 7, true);
  EXPECT_EQ(a.figures.sim_ms, b.figures.sim_ms);
  EXPECT_EQ(a.figures.messages, b.figures.messages);
  EXPECT_EQ(a.figures.dropped, b.figures.dropped);
  EXPECT_EQ(a.figures.committed, b.figures.committed);
  EXPECT_EQ(a.figures.aborted, b.figures.aborted);
  EXPECT_EQ(a.figures.votes, b.figures.votes);
  EXPECT_EQ(a.violations, b.violations);
  // Another seed is another run.
  SimulationResult c = RunSeed(64, 8, true);
  EXPECT_NE(a.figures.messages, c.figures.messages);
}

TEST(SimulationTest, AQuietNetworkCommitsEveryVersionItTries) {
  SimulationResult r = RunSeed(64, 3, false);
  EXPECT_TRUE(r.violations.empty()) << Joined(r.violations);
  EXPECT_EQ(r.figures.dropped, 0u);
  EXPECT_EQ(r.figures.aborted, 0u);
  EXPECT_EQ(r.figures.coordinator_opens, 1u);
  EXPECT_GE(r.figures.committed, 3u);
}

TEST(SimulationTest, AThousandRanksOnAHundredAndTwentyFiveNodes) {
  SimulationResult r = RunSeed(1000, 2, true);
  EXPECT_TRUE(r.violations.empty()) << Joined(r.violations);
  EXPECT_GE(r.figures.committed, 3u);
}

TEST(SimulationTest, BadOptionsAreRefused) {
  SimulationOptions o;
  o.ranks = 0;
  SimulationResult r;
  EXPECT_EQ(Simulate(o, &r).code(), CKPTDB_EINVAL);
  o.ranks = 8;
  o.ranks_per_node = 0;
  EXPECT_EQ(Simulate(o, &r).code(), CKPTDB_EINVAL);
  o.ranks_per_node = 8;
  o.dir = "/proc/no-such-dir";
  EXPECT_NE(Simulate(o, &r).code(), CKPTDB_OK);
}

}  // namespace
}  // namespace ckpt::engine
