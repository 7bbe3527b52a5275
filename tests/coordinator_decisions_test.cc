// The coordinator's decision log (engine/coordinator_decisions.h): its answers, and the two-phase
// commit's invariants it asserts (a death test each: the process stops rather than take a
// decision back).
#include "engine/coordinator_decisions.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace ckpt::engine {
namespace {

TEST(DecisionLogTest, VotesCloseWhenTheVersionIsDecided) {
  DecisionLog log;
  EXPECT_EQ(log.Vote(7, 0).size(), 1u);
  EXPECT_EQ(log.Vote(7, 1).size(), 2u);
  EXPECT_EQ(log.Vote(7, 1).size(), 2u);  // a repeated vote counts once
  EXPECT_EQ(log.Commit(7), (std::set<uint32_t>{0, 1}));
  EXPECT_TRUE(log.Committed(7));
  EXPECT_FALSE(log.Aborted(7));
  EXPECT_EQ(log.committed(), std::set<uint64_t>{7});

  log.Vote(8, 2);
  EXPECT_TRUE(log.Abort(8, "rank 3 could not prepare it"));
  EXPECT_FALSE(log.Abort(8, "again"));  // already: the first cause stays
  EXPECT_EQ(*log.AbortCause(8), "rank 3 could not prepare it");
  EXPECT_EQ(log.AbortCause(7), nullptr);
  // A version learned from a rank's catalog commits with no votes.
  EXPECT_TRUE(log.Commit(9).empty());
}

TEST(DecisionLogTest, PresumedAbortTakesEveryOpenVersionAndNoDecidedOne) {
  DecisionLog log;
  log.Vote(1, 0);
  log.Commit(1);
  log.Vote(2, 0);
  log.Vote(3, 1);
  log.Vote(4, 0);
  EXPECT_TRUE(log.Abort(4, "no"));
  EXPECT_EQ(log.AbortOpen("rank 1 restarted"), (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(log.Committed(1));
  EXPECT_TRUE(log.Aborted(2) && log.Aborted(3));
  EXPECT_EQ(*log.AbortCause(4), "no");
  EXPECT_TRUE(log.AbortOpen("again").empty());
}

TEST(DecisionLogTest, CausesAreKeptForTheNewestVersionsOnly) {
  DecisionLog log;
  const uint64_t n = DecisionLog::kMaxCauses + 10;
  for (uint64_t v = 1; v <= n; ++v) log.Abort(v, "cause " + std::to_string(v));
  EXPECT_EQ(log.AbortCause(1), nullptr);
  EXPECT_EQ(*log.AbortCause(n), "cause " + std::to_string(n));
  EXPECT_TRUE(log.Aborted(1));  // the decision stays when its cause is dropped
}

using DecisionLogDeathTest = ::testing::Test;

TEST(DecisionLogDeathTest, ACommittedVersionIsNeverAborted) {
  DecisionLog log;
  log.Commit(5);
  EXPECT_DEATH(log.Abort(5, "too late"), "assertion failed");
}

TEST(DecisionLogDeathTest, AnAbortedVersionIsNeverCommitted) {
  DecisionLog log;
  log.Abort(5, "no");
  EXPECT_DEATH(log.Commit(5), "assertion failed");
}

TEST(DecisionLogDeathTest, NoVoteIsTakenForADecidedVersion) {
  DecisionLog log;
  log.Commit(5);
  log.Abort(6, "no");
  EXPECT_DEATH(log.Vote(5, 0), "assertion failed");
  EXPECT_DEATH(log.Vote(6, 0), "assertion failed");
}

TEST(DecisionLogDeathTest, AVersionIsCommittedOnce) {
  DecisionLog log;
  log.Commit(5);
  EXPECT_DEATH(log.Commit(5), "assertion failed");
}

}  // namespace
}  // namespace ckpt::engine
