// A version's part in the job's commit on this rank (engine/job_commit.h): the states the
// cluster's messages move it through, and the protocol's order it asserts (a death test each: the
// rank stops rather than record a commit the coordinator could not have made, or take a decision
// back).
#include "engine/job_commit.h"

#include <gtest/gtest.h>

namespace ckpt::engine {
namespace {

using Decision = JobCommit::Decision;
using Replication = JobCommit::Replication;
using Vote = JobCommit::Vote;

TEST(JobCommitTest, APushAVoteAndACommit) {
  JobCommit job;
  EXPECT_TRUE(job.MustVoteNo());  // given up now, the coordinator must hear so
  job.StartReplication();
  EXPECT_TRUE(job.replicating());
  job.Replicated(Status::Ok());
  EXPECT_FALSE(job.replicating());
  EXPECT_EQ(job.replication(), Replication::kSafe);
  job.ClaimYes();
  EXPECT_TRUE(job.yes_sent());
  EXPECT_FALSE(job.MustVoteNo());  // the yes left: only the coordinator decides
  job.Decide(true, "");
  EXPECT_EQ(job.decision(), Decision::kCommitted);
  job.Decide(true, "");  // the same decision heard twice changes nothing
  EXPECT_EQ(job.decision(), Decision::kCommitted);
}

TEST(JobCommitTest, AFailedPushKeepsItsCauseAndLeavesTheVoteToBeCast) {
  JobCommit job;
  job.StartReplication();
  job.Replicated(Status::IoError("peer 3 is gone"));
  EXPECT_EQ(job.replication(), Replication::kFailed);
  EXPECT_EQ(job.replication_error().message(), "peer 3 is gone");
  EXPECT_TRUE(job.MustVoteNo());
}

TEST(JobCommitTest, ARefusedVoteIsAnAbortWithTheRefusalAsItsCause) {
  JobCommit job;
  job.StartReplication();
  job.Replicated(Status::Ok());
  job.ClaimYes();
  job.Refused("fenced: the job is in epoch 4");
  EXPECT_EQ(job.vote(), Vote::kRefused);
  EXPECT_EQ(job.decision(), Decision::kAborted);
  EXPECT_EQ(job.abort_why(), "fenced: the job is in epoch 4");
  EXPECT_TRUE(job.yes_sent());
  EXPECT_FALSE(job.MustVoteNo());
  // The coordinator's own abort, heard after, names the job's cause.
  job.Decide(false, "rank 2 failed");
  EXPECT_EQ(job.abort_why(), "rank 2 failed");
}

TEST(JobCommitTest, AnAbortBeforeTheVoteNeedsNoVote) {
  JobCommit job;
  job.StartReplication();
  job.Decide(false, "rank 1 could not prepare it");
  EXPECT_EQ(job.decision(), Decision::kAborted);
  EXPECT_FALSE(job.MustVoteNo());  // the coordinator knows: it aborted it
  job.Replicated(Status::Ok());    // the push still ends; nothing else changes
  EXPECT_EQ(job.decision(), Decision::kAborted);
}

using JobCommitDeathTest = ::testing::Test;

TEST(JobCommitDeathTest, NoYesBeforeTheRedundancyIsSafe) {
  JobCommit job;
  EXPECT_DEATH(job.ClaimYes(), "assertion failed");
  job.StartReplication();
  EXPECT_DEATH(job.ClaimYes(), "assertion failed");
  job.Replicated(Status::IoError("no peer"));
  EXPECT_DEATH(job.ClaimYes(), "assertion failed");
}

TEST(JobCommitDeathTest, APushStartsOnceAndEndsOnce) {
  JobCommit job;
  EXPECT_DEATH(job.Replicated(Status::Ok()), "assertion failed");
  job.StartReplication();
  EXPECT_DEATH(job.StartReplication(), "assertion failed");
  job.Replicated(Status::Ok());
  EXPECT_DEATH(job.Replicated(Status::Ok()), "assertion failed");
}

TEST(JobCommitDeathTest, OneVoteAVersion) {
  JobCommit job;
  job.StartReplication();
  job.Replicated(Status::Ok());
  job.ClaimYes();
  EXPECT_DEATH(job.ClaimYes(), "assertion failed");
}

TEST(JobCommitDeathTest, NoCommitWithoutThisRanksYes) {
  JobCommit job;
  EXPECT_DEATH(job.Decide(true, ""), "assertion failed");
  job.StartReplication();
  job.Replicated(Status::Ok());
  job.ClaimYes();
  job.Refused("v7 was already aborted");
  // The concern this class was written for: a commit heard after the vote was refused.
  EXPECT_DEATH(job.Decide(true, ""), "assertion failed");
}

TEST(JobCommitDeathTest, ADecisionIsNeverTakenBack) {
  JobCommit committed;
  committed.StartReplication();
  committed.Replicated(Status::Ok());
  committed.ClaimYes();
  committed.Decide(true, "");
  EXPECT_DEATH(committed.Decide(false, "late"), "assertion failed");
  EXPECT_DEATH(committed.Refused("late"), "assertion failed");

  JobCommit aborted;
  aborted.StartReplication();
  aborted.Replicated(Status::Ok());
  aborted.ClaimYes();
  aborted.Decide(false, "rank 3 failed");
  EXPECT_DEATH(aborted.Decide(true, ""), "assertion failed");
}

}  // namespace
}  // namespace ckpt::engine
