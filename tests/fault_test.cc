// Every failing call of a commit (io/fault_io.h): a store on a tmpfs tier and a disk tier (the
// commit tier, so a commit writes, fsyncs and renames on both) commits v1 cleanly; then, for each
// kind of call and each of the calls of that kind that v2's put, commit and close make, a fresh
// handle fails exactly that call with EIO or ENOSPC. Every failed call is reported by put,
// commit or close (never swallowed); a reopen without faults finds v1, or v2 when the failed call
// came after v2 was recorded committed, whole: restore is bit for bit and verify is clean; and
// no file of a v2 that is not committed is left behind. v2 lost while its commit said Ok fails.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/db.h"
#include "io/fault_io.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using io::FaultIo;
using test::RandomBytes;
using test::TempDir;

constexpr size_t kShardBytes = (300 << 10) + 17;  // 5 chunks of 64 KiB and a partial one

class FaultTest : public ::testing::Test {
 protected:
  engine::DbOptions Options(io::Io* io) {
    engine::DbOptions o;
    o.root = mem_.Sub("root");
    o.tiers = "tmpfs:" + mem_.Sub("t1") + ";disk:" + disk_.Sub("t2");
    o.commit_tier = "disk";
    o.chunk_bytes = 64 << 10;
    o.staging_bytes = 1 << 20;
    o.io = io;
    return o;
  }

  // Puts and commits version v (two shards); the first failure, or Ok.
  Status Save(engine::Db* db, uint64_t v) {
    for (int which = 0; which < 2; ++which) {
      auto data = RandomBytes(kShardBytes, v * 10 + which);
      const std::string name = "w" + std::to_string(which);
      Status st =
          db->PutShard(v, name.c_str(), data.data(), data.size(), nullptr, CKPTDB_PUT_COPY_NOW);
      if (!st.ok()) return st;
    }
    return db->Commit(v, 0);
  }

  // Opens without faults: the newest version is `v1` or 2, whole on every tier that has it.
  void CheckReopened(const std::string& what, uint64_t* latest) {
    std::unique_ptr<engine::Db> db;
    Status st = engine::Db::Open(Options(nullptr), &db);
    ASSERT_TRUE(st.ok()) << what << ": reopen: " << st.ToString();
    ASSERT_TRUE(db->Latest(latest).ok()) << what;
    EXPECT_TRUE(*latest == 1 || *latest == 2) << what << ": latest " << *latest;
    for (int which = 0; which < 2; ++which) {
      std::vector<uint8_t> out(kShardBytes);
      const std::string name = "w" + std::to_string(which);
      st = db->Restore(*latest, name.c_str(), out.data(), out.size(), 0);
      ASSERT_TRUE(st.ok()) << what << ": restore: " << st.ToString();
      EXPECT_EQ(out, RandomBytes(kShardBytes, *latest * 10 + which)) << what;
    }
    st = db->Verify(CKPTDB_ALL_VERSIONS, nullptr, nullptr, nullptr, nullptr);
    EXPECT_TRUE(st.ok()) << what << ": verify: " << st.ToString();
    EXPECT_TRUE(db->Close().ok());
    if (*latest == 1) {
      for (const std::string& dir : {mem_.Sub("t1"), disk_.Sub("t2")}) {
        for (const auto& e : std::filesystem::directory_iterator(dir)) {
          EXPECT_EQ(e.path().filename().string().find("v00000000000000000002"), std::string::npos)
              << what << ": v2's file " << e.path() << " was left behind";
        }
      }
    }
  }

  // The store right after v1: saved once, put back before each case.
  void SaveBaseline() {
    for (const auto& [from, to] : Pairs()) {
      std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
    }
  }
  void RestoreBaseline() {
    for (const auto& [from, to] : Pairs()) {
      std::filesystem::remove_all(from);
      std::filesystem::copy(to, from, std::filesystem::copy_options::recursive);
    }
  }
  std::vector<std::pair<std::string, std::string>> Pairs() {
    return {{mem_.Sub("root"), mem_.Sub("root.v1")},
            {mem_.Sub("t1"), mem_.Sub("t1.v1")},
            {disk_.Sub("t2"), disk_.Sub("t2.v1")}};
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
};

TEST_F(FaultTest, EveryFailingCallOfACommitIsReportedAndLeavesTheLastVersionWhole) {
  std::unique_ptr<io::Io> posix = io::NewPosixIo();
  {
    std::unique_ptr<engine::Db> db;
    ASSERT_TRUE(engine::Db::Open(Options(posix.get()), &db).ok());
    ASSERT_TRUE(Save(db.get(), 1).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  SaveBaseline();
  // v2 run clean once (then thrown away) to count the calls of each kind it makes.
  FaultIo counting(posix.get());
  {
    std::unique_ptr<engine::Db> db;
    ASSERT_TRUE(engine::Db::Open(Options(&counting), &db).ok());
    counting.Reset();
    ASSERT_TRUE(Save(db.get(), 2).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  std::vector<uint64_t> calls(FaultIo::kCalls);
  for (size_t k = 0; k < FaultIo::kCalls; ++k) {
    calls[k] = counting.Count(static_cast<FaultIo::Call>(k));
  }
  for (size_t k = 0; k < FaultIo::kCalls; ++k) {
    std::printf("v2's put, commit and close: %llu %s call(s)\n",
                static_cast<unsigned long long>(calls[k]),
                FaultIo::CallName(static_cast<FaultIo::Call>(k)));
  }
  ASSERT_GE(calls[static_cast<size_t>(FaultIo::Call::kWrite)], 12u);
  ASSERT_GE(calls[static_cast<size_t>(FaultIo::Call::kSync)], 2u);
  size_t cases = 0, reported = 0;
  for (size_t k = 0; k < FaultIo::kCalls; ++k) {
    const auto call = static_cast<FaultIo::Call>(k);
    std::vector<int> errors = {EIO, ENOSPC};
    if (call == FaultIo::Call::kWrite || call == FaultIo::Call::kRead) {
      errors.push_back(FaultIo::kShort);
    }
    for (uint64_t nth = 1; nth <= calls[k]; ++nth) {
      for (int error : errors) {
        const std::string what =
            std::string("failing ") + FaultIo::CallName(call) + " " + std::to_string(nth) +
            (error == FaultIo::kShort ? " short" : std::string(" with ") + std::strerror(error));
        RestoreBaseline();  // the store as it was before v2
        FaultIo faults(posix.get());
        std::unique_ptr<engine::Db> db;
        ASSERT_TRUE(engine::Db::Open(Options(&faults), &db).ok()) << what;
        faults.Reset();
        faults.Arm(call, nth, error);
        Status saved = Save(db.get(), 2);
        Status closed = db->Close();
        db.reset();
        ++cases;
        // A failed call is reported by the save or the close, never swallowed: a write or an
        // fsync said to have failed may not have reached the disk, whatever the reopen finds.
        ASSERT_TRUE(faults.Fired()) << what << ": the call was never made";
        EXPECT_TRUE(!saved.ok() || !closed.ok()) << what << ": the failure was not reported";
        if (!saved.ok() || !closed.ok()) ++reported;
        uint64_t latest = 0;
        ASSERT_NO_FATAL_FAILURE(CheckReopened(what, &latest));
        if (faults.Fired() && latest == 1) {
          EXPECT_FALSE(saved.ok()) << what << ": v2 was lost but its commit said Ok";
        }
      }
    }
  }
  std::printf("failing calls tried: %zu, reported: %zu\n", cases, reported);
}

// Every failing read of a restore: v1 is on both tiers; each read that restoring both shards
// makes (the segments' framing and manifests, then the chunks) fails in turn with EIO. Each time
// the restore still returns every byte, read from the other tier, and the handle stays usable.
TEST_F(FaultTest, EveryFailingReadOfARestoreIsServedByTheOtherTier) {
  std::unique_ptr<io::Io> posix = io::NewPosixIo();
  FaultIo faults(posix.get());
  std::unique_ptr<engine::Db> db;
  ASSERT_TRUE(engine::Db::Open(Options(&faults), &db).ok());
  ASSERT_TRUE(Save(db.get(), 1).ok());
  ASSERT_TRUE(db->Close().ok());
  auto restore_both = [&](const std::string& what) {
    std::unique_ptr<engine::Db> reader;
    Status st = engine::Db::Open(Options(&faults), &reader);
    if (!st.ok()) return st;
    for (int which = 0; which < 2; ++which) {
      std::vector<uint8_t> out(kShardBytes);
      const std::string name = "w" + std::to_string(which);
      st = reader->Restore(1, name.c_str(), out.data(), out.size(), 0);
      if (!st.ok()) return st;
      EXPECT_EQ(out, RandomBytes(kShardBytes, 10 + which)) << what;
    }
    return reader->Close();
  };
  faults.Reset();
  ASSERT_TRUE(restore_both("clean").ok());
  const uint64_t reads = faults.Count(FaultIo::Call::kRead);
  std::printf("a clean open and restore of both shards: %llu reads\n",
              static_cast<unsigned long long>(reads));
  ASSERT_GE(reads, 12u);
  for (uint64_t nth = 1; nth <= reads; ++nth) {
    for (int error : {EIO, FaultIo::kShort}) {
      const std::string what =
          "failing read " + std::to_string(nth) + (error == EIO ? " with EIO" : " short");
      faults.Reset();
      faults.Arm(FaultIo::Call::kRead, nth, error);
      Status st = restore_both(what);
      EXPECT_TRUE(st.ok()) << what << ": " << st.ToString();
      EXPECT_TRUE(faults.Fired()) << what;
    }
  }
}

// Slow storage changes timing, never outcomes: with every fsync 30 ms slow, every write and read
// 2 ms and every rename and directory fsync 5 ms, a trainer that puts the next version while the
// last one commits asynchronously still commits every version, and each restores bit for bit.
TEST_F(FaultTest, SlowCallsDelayCommitsButChangeNoOutcome) {
  std::unique_ptr<io::Io> posix = io::NewPosixIo();
  FaultIo slow(posix.get());
  slow.SetLatency(FaultIo::Call::kSync, 30000);
  slow.SetLatency(FaultIo::Call::kWrite, 2000);
  slow.SetLatency(FaultIo::Call::kRead, 2000);
  slow.SetLatency(FaultIo::Call::kRename, 5000);
  slow.SetLatency(FaultIo::Call::kSyncDir, 5000);
  std::unique_ptr<engine::Db> db;
  ASSERT_TRUE(engine::Db::Open(Options(&slow), &db).ok());
  constexpr uint64_t kVersions = 4;
  for (uint64_t v = 1; v <= kVersions; ++v) {
    std::vector<uint8_t> data[2];  // the caller's until wait_capture returns
    for (int which = 0; which < 2; ++which) {
      data[which] = RandomBytes(kShardBytes, v * 10 + which);
      const std::string name = which == 0 ? "w0" : "w1";
      ASSERT_TRUE(
          db->PutShard(v, name.c_str(), data[which].data(), data[which].size(), nullptr, 0).ok());
    }
    ASSERT_TRUE(db->WaitCapture(v, -1).ok());
    ASSERT_TRUE(db->Commit(v, CKPTDB_COMMIT_ASYNC).ok());
  }
  ASSERT_TRUE(db->WaitCommit(kVersions, nullptr, -1).ok());
  ASSERT_TRUE(db->Close().ok());
  EXPECT_GE(slow.Count(FaultIo::Call::kSync), 2 * kVersions);
  std::unique_ptr<engine::Db> reader;
  ASSERT_TRUE(engine::Db::Open(Options(&slow), &reader).ok());
  for (uint64_t v = 1; v <= kVersions; ++v) {
    for (int which = 0; which < 2; ++which) {
      std::vector<uint8_t> out(kShardBytes);
      const std::string name = which == 0 ? "w0" : "w1";
      Status st = reader->Restore(v, name.c_str(), out.data(), out.size(), 0);
      ASSERT_TRUE(st.ok()) << "v" << v << ": " << st.ToString();
      EXPECT_EQ(out, RandomBytes(kShardBytes, v * 10 + which)) << "v" << v;
    }
  }
  ASSERT_TRUE(reader->Close().ok());
}

}  // namespace
}  // namespace ckpt
