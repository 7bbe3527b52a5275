// The job harness (harness/job.h) on its own: exit codes, the rank-0 report, counters, the
// barrier, failures and leftovers. The ranks here are plain functions; tests/cluster_test.cc runs
// real jobs through it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "harness/job.h"
#include "util/clock.h"

namespace ckpt::harness {
namespace {

// Writes `line` to CKPTDB_REPORT_FD, as ckptdb_open does once it listens.
void Report(const std::string& line) {
  const char* fd = std::getenv("CKPTDB_REPORT_FD");
  ASSERT_NE(fd, nullptr);
  ASSERT_EQ(write(std::atoi(fd), line.data(), line.size()), static_cast<ssize_t>(line.size()));
}

TEST(HarnessTest, ExitCodesByRankAndSignalsAs128PlusIt) {
  Job job(3);
  auto codes = job.Run([](uint32_t rank) {
    if (rank == 1) raise(SIGKILL);
    return static_cast<int>(rank) * 10;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 128 + SIGKILL, 20}));
}

TEST(HarnessTest, TheOthersStartWithTheAddressRank0Reported) {
  Job job(3);
  job.set_coordinator_host("127.0.0.1");
  EXPECT_EQ(job.CoordinatorFor(0), "127.0.0.1:0");  // before any report: bind a free port
  auto codes = job.Run([&](uint32_t rank) {
    if (rank == 0) {
      // Rank 0 is alone until it reports: nobody has arrived anywhere.
      if (job.Get("started") != 0) return 1;
      Report("127.0.0.1:4242\n");
    }
    job.Add("started");
    if (!job.Arrive("all", true, 10000)) return 2;
    return job.CoordinatorFor(rank) == "127.0.0.1:4242" ? 0 : 3;
  });
  EXPECT_EQ(codes, std::vector<int>(3, 0));
  EXPECT_EQ(job.coordinator(), "127.0.0.1:4242");
  EXPECT_EQ(PortOf(job.coordinator()), 4242);
}

TEST(HarnessTest, ARank0ThatExitsWithoutReportingDoesNotHoldTheOthers) {
  Job job(2);
  RunOptions options;
  options.report_timeout_ms = 60000;
  const int64_t t0 = MonoMs();
  auto codes = job.Run(
      [&](uint32_t rank) {
        return rank == 0 ? 0 : (job.CoordinatorFor(1) == "127.0.0.1:0" ? 0 : 1);
      },
      options);
  EXPECT_EQ(codes, std::vector<int>(2, 0));
  EXPECT_LT(MonoMs() - t0, 30000) << "the others waited for the report's deadline";
  EXPECT_EQ(job.coordinator(), "");
}

TEST(HarnessTest, CountersAreSharedAndWaitsHaveDeadlines) {
  Job job(2);
  auto codes = job.Run([&](uint32_t rank) {
    if (rank == 0) {
      if (!job.WaitAtLeast("from1", 3, 10000)) return 1;
      job.Set("to1", 7);
      return 0;
    }
    for (int i = 0; i < 3; ++i) job.Add("from1");
    if (!job.WaitAtLeast("to1", 7, 10000)) return 2;
    // Nobody adds to "never": the wait ends at its deadline, false.
    const int64_t t0 = MonoMs();
    if (job.WaitAtLeast("never", 1, 200)) return 3;
    return MonoMs() - t0 >= 150 ? 0 : 4;
  });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
  EXPECT_EQ(job.Get("from1"), 3);
  // A new run starts its counters at 0.
  codes = job.Run([&](uint32_t) { return job.Get("from1") == 0 ? 0 : 1; });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(HarnessTest, TheBarrierHoldsEveryRankAndEndsWhenOneFails) {
  Job job(4);
  auto codes = job.Run([&](uint32_t rank) {
    for (int round = 1; round <= 20; ++round) {
      job.Add("round");
      if (!job.Barrier(10000)) return 1;
      // Past the barrier, every rank has added for this round.
      if (job.Get("round") < 4 * round) return 2;
      if (!job.Barrier(10000)) return 1;
    }
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(4, 0));
  // Rank 3 fails instead of arriving: the others' barrier ends (false) at once, not at its
  // deadline.
  const int64_t t0 = MonoMs();
  codes = job.Run([&](uint32_t rank) {
    if (rank == 3) return 9;
    return job.Barrier(60000) ? 1 : 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0, 9}));
  EXPECT_LT(MonoMs() - t0, 30000);
}

TEST(HarnessTest, AFailureStopsTheOthersWhenAsked) {
  Job job(3);
  RunOptions options;
  options.kill_all_on_failure = true;
  options.report_timeout_ms = 0;  // no job: rank 0 reports nothing
  auto codes = job.Run(
      [&](uint32_t rank) {
        if (rank == 2) return 5;
        pause();  // blocked for good: only the harness's SIGKILL ends it
        return 0;
      },
      options);
  EXPECT_EQ(codes, (std::vector<int>{128 + SIGKILL, 128 + SIGKILL, 5}));
}

TEST(HarnessTest, StartKillAndWaitRankByRank) {
  Job job(2);
  RunOptions options;
  options.report_timeout_ms = 0;  // no job: rank 0 reports nothing
  job.Start(
      [&](uint32_t rank) {
        if (rank == 1) return 3;
        pause();
        return 0;
      },
      options);
  EXPECT_EQ(job.Wait(1), 3);
  EXPECT_EQ(job.Wait(1), 3);  // again: the code it had
  EXPECT_FALSE(job.Exited(0));
  job.Kill(0);
  EXPECT_EQ(job.Wait(), (std::vector<int>{128 + SIGKILL, 3}));
}

TEST(HarnessTest, ALeftoverRankIsKilledWithItsJob) {
  pid_t left = -1;
  {
    Job job(1);
    job.Start([](uint32_t) {
      pause();
      return 0;
    });
    left = job.pid(0);
    EXPECT_EQ(kill(left, 0), 0);
  }
  EXPECT_NE(kill(left, 0), 0) << "rank 0 outlived its job";
}

TEST(HarnessTest, AnAddressPipeCarriesOneProcesssReport) {
  AddressPipe pipe;
  Job job(1);
  job.Start([&](uint32_t) {
    pipe.Give();
    Report("[::1]:5151\n");
    return 0;
  });
  EXPECT_EQ(pipe.Read(10000), "[::1]:5151");
  EXPECT_EQ(PortOf("[::1]:5151"), 5151);
  EXPECT_EQ(PortOf("nohost"), 0);
  EXPECT_EQ(job.Wait(), std::vector<int>{0});
}

}  // namespace
}  // namespace ckpt::harness
