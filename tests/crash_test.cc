// Crashes at named points of the commit sequence (DESIGN.md section 6): a forked child runs the
// commit and _exits at the point, as a SIGKILL would leave it (nothing flushed, no destructors);
// the parent reopens the store and checks what must and must not be visible.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/db.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using test::RandomBytes;
using test::TempDir;

const char* g_stop_at = nullptr;

void StopHook(const char* point) {
  if (g_stop_at != nullptr && std::string(point) == g_stop_at) _exit(77);
}

class CrashTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    root_ = mem_.Sub("root");
    tiers_ = "tmpfs:" + mem_.Sub("t1") + ";disk:" + disk_.Sub("t2");
    ckptdb_options_init(&o_);
    o_.root = root_.c_str();
    o_.tiers = tiers_.c_str();
    o_.rank = 0;
    o_.world_size = 1;
    o_.chunk_bytes = 64 << 10;
    o_.staging_bytes = 1 << 20;
  }

  // Runs `body` in a child that stops at `point` (or runs to the end with point == nullptr).
  // Returns the child's exit code.
  template <typename F>
  int InChild(const char* point, F body) {
    pid_t pid = fork();
    if (pid == 0) {
      g_stop_at = point;
      engine::SetCrashHookForTesting(StopHook);
      _exit(body());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  int CommitTwoVersions() {
    ckptdb* db = nullptr;
    if (ckptdb_open(&o_, &db) != CKPTDB_OK) return 1;
    for (uint64_t v = 1; v <= 2; ++v) {
      auto a = RandomBytes(200 << 10, v);
      if (ckptdb_put_shard(db, v, "w", a.data(), a.size(), nullptr, 0) != CKPTDB_OK) return 2;
      if (ckptdb_commit(db, v, 0) != CKPTDB_OK) return 3;
    }
    return 0;  // no close: a process that simply ends
  }

  std::vector<std::string> SegmentFiles() {
    std::vector<std::string> out;
    for (const std::string& dir : {mem_.Sub("t1"), disk_.Sub("t2")}) {
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        std::string n = e.path().filename().string();
        if (n[0] == 'v') out.push_back(n);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, tiers_;
  ckptdb_options o_;
};

// Version 2 crashes at the point; version 1 was committed before.
struct Expectation {
  const char* point;
  uint64_t latest;  // what must be visible after recovery
};

TEST_F(CrashTest, CrashBetweenPreparedAndCommittedIsNotVisible) {
  ASSERT_EQ(InChild("commit:after_prepared", [this] { return CommitTwoVersions(); }), 77);
  // The child stopped in version 1's commit: nothing was ever committed.
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << ckptdb_last_error();
  uint64_t latest = 0;
  EXPECT_EQ(ckptdb_latest(db, &latest), CKPTDB_ENOTFOUND);
  std::vector<uint8_t> out(200 << 10);
  EXPECT_EQ(ckptdb_restore(db, 1, "w", out.data(), out.size(), 0), CKPTDB_ESTATE);
  EXPECT_TRUE(SegmentFiles().empty()) << "recovery must collect the prepared version's files";
  ckptdb_close(db);
}

class CrashPointTest : public CrashTest {};

TEST_P(CrashPointTest, RecoveryShowsExactlyTheVersionsWhoseCommitWasDurable) {
  const char* point = GetParam();
  // Commit version 1 cleanly, then crash during version 2 at the point.
  ASSERT_EQ(InChild(nullptr,
                    [this] {
                      ckptdb* db = nullptr;
                      if (ckptdb_open(&o_, &db) != CKPTDB_OK) return 1;
                      auto a = RandomBytes(200 << 10, 1);
                      if (ckptdb_put_shard(db, 1, "w", a.data(), a.size(), nullptr, 0)) return 2;
                      if (ckptdb_commit(db, 1, 0)) return 3;
                      return ckptdb_close(db) == CKPTDB_OK ? 0 : 4;
                    }),
            0);
  int code = InChild(point, [this] {
    ckptdb* db = nullptr;
    if (ckptdb_open(&o_, &db) != CKPTDB_OK) return 1;
    auto a = RandomBytes(200 << 10, 2);
    if (ckptdb_put_shard(db, 2, "w", a.data(), a.size(), nullptr, 0)) return 2;
    if (std::string(g_stop_at) == "after:put") _exit(77);
    if (ckptdb_commit(db, 2, 0)) return 3;
    return 0;
  });
  ASSERT_EQ(code, 77) << "the child did not reach " << point;
  bool committed = std::string(point) == "commit:after_committed";
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << ckptdb_last_error();
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, committed ? 2u : 1u) << point;
  std::vector<uint8_t> out(200 << 10);
  ASSERT_EQ(ckptdb_restore(db, latest, "w", out.data(), out.size(), 0), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(out, RandomBytes(200 << 10, latest));
  // The commit tier is the first (tmpfs): a version committed just before the crash may not have
  // reached the disk tier; reopening resumes its demotion.
  ASSERT_EQ(ckptdb_wait_commit(db, latest, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
  // Only the visible versions' segments remain: no .tmp, no orphan.
  std::vector<std::string> want = {"v00000000000000000001-r00000.seg",
                                   "v00000000000000000001-r00000.seg"};
  if (committed) {
    want.push_back("v00000000000000000002-r00000.seg");
    want.push_back("v00000000000000000002-r00000.seg");
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(SegmentFiles(), want) << point;
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db, CKPTDB_ALL_VERSIONS, nullptr, nullptr, nullptr, &rep), CKPTDB_OK);
  EXPECT_EQ(rep.segments_checked, committed ? 4u : 2u);
  ckptdb_close(db);
}

INSTANTIATE_TEST_SUITE_P(Points, CrashPointTest,
                         ::testing::Values("after:put", "commit:after_fsync",
                                           "commit:after_prepared", "commit:after_committed"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return s;
                         });

TEST_F(CrashTest, OrphanSegmentFilesAreCollectedAtOpen) {
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK);
  auto a = RandomBytes(1000, 1);
  ASSERT_EQ(ckptdb_put_shard(db, 1, "w", a.data(), a.size(), nullptr, 0), CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(db, 1, 0), CKPTDB_OK);
  ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);
  // Files no catalog record accounts for: a stray segment and a temporary one.
  test::WriteWholeFile(mem_.Sub("t1") + "/v00000000000000000009-r00000.seg", "junk");
  test::WriteWholeFile(disk_.Sub("t2") + "/v00000000000000000003-r00000.seg.tmp", "junk");
  test::WriteWholeFile(disk_.Sub("t2") + "/v00000000000000000003-r00007.seg", "rank 7's");
  test::WriteWholeFile(disk_.Sub("t2") + "/notes.txt", "not ours");
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK);
  EXPECT_FALSE(std::filesystem::exists(mem_.Sub("t1") + "/v00000000000000000009-r00000.seg"));
  EXPECT_FALSE(std::filesystem::exists(disk_.Sub("t2") + "/v00000000000000000003-r00000.seg.tmp"));
  EXPECT_TRUE(std::filesystem::exists(disk_.Sub("t2") + "/v00000000000000000003-r00007.seg"))
      << "another rank's files are not this rank's to collect";
  EXPECT_TRUE(std::filesystem::exists(disk_.Sub("t2") + "/notes.txt"));
  uint64_t latest = 0;
  EXPECT_EQ(ckptdb_latest(db, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, 1u);
  ckptdb_close(db);
}

}  // namespace
}  // namespace ckpt
