// The tier manager (DESIGN.md section 5; issue 3): committed versions are demoted to the slower
// tiers that want them (every=, keep=), each chunk re-checked on the way; copies are evicted
// only when safe on a slower tier or superseded, never the newest committed one; a slower commit
// tier makes commit wait for it; demotions left by a close or a crash resume at the next open; a
// damaged source or an unwritable target fails the demotion with a clear error and no copy.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::RandomBytes;
using test::TempDir;

// Far-apart seeds: test::RandomBytes streams of neighbouring seeds overlap (shifted by 8 bytes),
// and the damage tests look for one version's bytes in the arena.
uint64_t Seed(uint64_t version) { return version * 1000003; }

class TierManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptdb_options_init(&o_);
    root_ = mem_.Sub("root");
    ram_ = "ram:32M,dir=" + mem_.Sub("ram");
    tmpfs_dir_ = mem_.Sub("tmpfs");
    disk_dir_ = disk_.Sub("disk");
    o_.root = root_.c_str();
    o_.chunk_bytes = 64 << 10;
    o_.staging_bytes = 1 << 20;
  }
  void TearDown() override {
    if (db_ != nullptr) ckptdb_close(db_);
  }
  void Open(const std::string& tiers) {
    tiers_ = tiers;
    o_.tiers = tiers_.c_str();
    ASSERT_EQ(ckptdb_open(&o_, &db_), CKPTDB_OK) << ckptdb_last_error();
  }
  void Close() {
    ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK) << ckptdb_last_error();
    db_ = nullptr;
  }
  void Commit(uint64_t v) {
    auto data = RandomBytes(200 << 10, Seed(v));
    ASSERT_EQ(ckptdb_put_shard(db_, v, "w", data.data(), data.size(), nullptr, 0), CKPTDB_OK);
    ASSERT_EQ(ckptdb_commit(db_, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }
  // Versions with a segment file in dir.
  static std::set<uint64_t> Files(const std::string& dir) {
    std::set<uint64_t> out;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::string n = e.path().filename().string();
      EXPECT_FALSE(n.ends_with(".tmp")) << n;
      if (n.ends_with(".seg")) out.insert(std::stoull(n.substr(1, 20)));
    }
    return out;
  }
  std::map<uint64_t, int> Residency(const std::string& tier) {
    return test::ResidencyOn(db_, tier);
  }
  void ExpectRestores(uint64_t v) {
    std::vector<uint8_t> out(200 << 10);
    ASSERT_EQ(ckptdb_restore(db_, v, "w", out.data(), out.size(), 0), CKPTDB_OK)
        << v << ": " << ckptdb_last_error();
    EXPECT_EQ(out, RandomBytes(out.size(), Seed(v))) << v;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, ram_, tmpfs_dir_, disk_dir_, tiers_;
  ckptdb_options o_;
  ckptdb* db_ = nullptr;
};

TEST_F(TierManagerTest, EachTierGetsWhatItsPolicyWants) {
  Open(ram_ + ",keep=2;tmpfs:" + tmpfs_dir_ + ",every=2,keep=2;disk:" + disk_dir_ +
       ",every=5,keep=1");
  for (uint64_t v = 1; v <= 12; ++v) Commit(v);
  // Commit is done once the version is in ram; each slower tier receives it in the background.
  ASSERT_EQ(ckptdb_wait_commit(db_, 12, "tmpfs", -1), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_wait_commit(db_, 10, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(ckptdb_wait_commit(db_, 11, "tmpfs", 0), CKPTDB_ESTATE) << "every=2 skips 11";
  EXPECT_NE(std::string(ckptdb_last_error()).find("does not take"), std::string::npos);
  EXPECT_EQ(ckptdb_wait_commit(db_, 12, "nfs", 0), CKPTDB_ENOTFOUND);
  Close();  // drains: every demotion and eviction is done
  Open(tiers_);
  EXPECT_EQ(Files(tmpfs_dir_), (std::set<uint64_t>{10, 12}));
  EXPECT_EQ(Files(disk_dir_), (std::set<uint64_t>{10}));
  std::map<uint64_t, int> ram = Residency("ram");
  std::set<uint64_t> in_ram;
  for (auto [v, state] : ram) {
    if (state == CKPTDB_RESIDENT_DURABLE) in_ram.insert(v);
  }
  EXPECT_EQ(in_ram, (std::set<uint64_t>{11, 12}));
  for (uint64_t v : {10, 11, 12}) ExpectRestores(v);
  // Versions no tier holds any more are retired, not restorable.
  std::vector<uint8_t> out(200 << 10);
  EXPECT_EQ(ckptdb_restore(db_, 9, "w", out.data(), out.size(), 0), CKPTDB_ESTATE);
  ckptdb_stats_t st{};
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.tier_count, 3u);
  EXPECT_EQ(st.tiers[0].resident_versions, 2u);
  EXPECT_EQ(st.tiers[1].pending_bytes, 0u);
}

TEST_F(TierManagerTest, TheNewestCommittedVersionIsNeverEvicted) {
  // keep=1 on ram and a disk tier that takes only every 1000th version: each older version is
  // superseded as soon as a newer one commits, but the newest always stays.
  Open(ram_ + ",keep=1;disk:" + disk_dir_ + ",every=1000");
  for (uint64_t v = 1; v <= 5; ++v) {
    Commit(v);
    uint64_t latest = 0;
    ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK);
    EXPECT_EQ(latest, v);
    ExpectRestores(v);
  }
  Close();
  Open(tiers_);
  std::map<uint64_t, int> ram = Residency("ram");
  EXPECT_EQ(ram[5], CKPTDB_RESIDENT_DURABLE);
  for (uint64_t v = 1; v <= 4; ++v) EXPECT_EQ(ram[v], CKPTDB_RESIDENT_EVICTED) << v;
  EXPECT_TRUE(Files(disk_dir_).empty());
}

TEST_F(TierManagerTest, ASlowerCommitTierMakesCommitWaitForIt) {
  o_.commit_tier = "disk";
  Open(ram_ + ";disk:" + disk_dir_ + ",every=2");
  Commit(2);
  // Durable on disk before commit returned.
  EXPECT_EQ(Files(disk_dir_), (std::set<uint64_t>{2}));
  EXPECT_EQ(Residency("disk:" + disk_dir_)[2], CKPTDB_RESIDENT_DURABLE);
  // A version the commit tier does not take is committed once it is on the tiers that do.
  Commit(3);
  EXPECT_EQ(Residency("ram")[3], CKPTDB_RESIDENT_DURABLE);
  ckptdb_version_stats_t vs{};
  ASSERT_EQ(ckptdb_version_stats(db_, 2, &vs), CKPTDB_OK);
  EXPECT_EQ(vs.tier_bytes_written[1],
            fs::file_size(disk_dir_ + "/v00000000000000000002-r00000.seg"));
  o_.commit_tier = "tape";
  ckptdb* other = nullptr;
  TempDir elsewhere("/dev/shm");
  std::string root = elsewhere.Sub("r");
  ckptdb_options o = o_;
  o.root = root.c_str();
  std::string tiers = "tmpfs:" + elsewhere.Sub("t");
  o.tiers = tiers.c_str();
  EXPECT_EQ(ckptdb_open(&o, &other), CKPTDB_ENOTFOUND);
  EXPECT_NE(std::string(ckptdb_last_error()).find("no tier named \"tape\""), std::string::npos);
  EXPECT_FALSE(fs::exists(root)) << "a refused open creates nothing";
}

TEST_F(TierManagerTest, DemotionsResumeAtTheNextOpen) {
  // Versions committed while only ram was configured are demoted once a disk tier is added.
  Open(ram_);
  for (uint64_t v = 1; v <= 3; ++v) Commit(v);
  Close();
  o_.drain_on_close = 0;  // and a close that does not wait for them leaves them resumable
  Open(ram_ + ";disk:" + disk_dir_);
  Close();
  o_.drain_on_close = 1;
  Open(tiers_);
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_EQ(ckptdb_wait_commit(db_, v, "disk", -1), CKPTDB_OK) << v << ckptdb_last_error();
  }
  Close();
  EXPECT_EQ(Files(disk_dir_), (std::set<uint64_t>{1, 2, 3}));
  // The disk copies are whole: without the arena they restore on their own.
  for (const auto& e : fs::directory_iterator(mem_.Sub("ram"))) fs::remove(e.path());
  Open(tiers_);
  for (uint64_t v = 1; v <= 3; ++v) ExpectRestores(v);
  ckptdb_stats_t st{};
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(std::string(st.last_restore_tier), "disk:" + disk_dir_);
}

TEST_F(TierManagerTest, ATierThatWantsAVersionItLacksListsItPending) {
  Open(ram_);
  Commit(1);
  Close();
  // A read-only look with a disk tier added: disk wants version 1, and ram can give it.
  ckptdb_options ro = o_;
  ro.read_only = 1;
  std::string tiers = ram_ + ";disk:" + disk_dir_;
  ro.tiers = tiers.c_str();
  ASSERT_EQ(ckptdb_open(&ro, &db_), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(Residency("disk:" + disk_dir_)[1], CKPTDB_RESIDENT_PENDING);
  EXPECT_EQ(Residency("ram")[1], CKPTDB_RESIDENT_DURABLE);
  ckptdb_stats_t st{};
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.tiers[1].pending_bytes, 200u << 10);
}

TEST_F(TierManagerTest, ADamagedSourceChunkFailsTheDemotionAndNamesIt) {
  Open(ram_);
  Commit(1);
  Close();
  // Flip one payload byte of version 1 in the arena.
  std::string arena;
  for (const auto& e : fs::directory_iterator(mem_.Sub("ram"))) arena = e.path().string();
  std::string bytes = test::ReadWholeFile(arena);
  auto want = RandomBytes(200 << 10, Seed(1));
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(want.data()) + (64 << 10), 64));
  ASSERT_NE(at, std::string::npos);
  test::FlipByte(arena, at);
  Open(ram_ + ";disk:" + disk_dir_);
  EXPECT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_ECORRUPT);
  std::string why = ckptdb_last_error();
  EXPECT_NE(why.find("chunk 1"), std::string::npos) << why;
  EXPECT_NE(why.find("fails xxh3"), std::string::npos) << why;
  ckptdb_stats_t st{};
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.tiers[1].demotion_failures, 1u);
  Close();
  EXPECT_TRUE(Files(disk_dir_).empty()) << "no copy of damaged data is made";
}

TEST_F(TierManagerTest, KeepCountsOnlyCopiesAlreadyOnTheTier) {
  // disk keep=1 holds version 1. Version 2 is committed but never reaches disk (its ram copy is
  // damaged, so its demotion fails): the disk must not give up version 1 for it.
  Open(ram_ + ";disk:" + disk_dir_ + ",keep=1");
  Commit(1);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  Close();
  // The disk tier stays (it holds version 1) but takes only every 3rd version: 2 stays in ram.
  Open(ram_ + ";disk:" + disk_dir_ + ",keep=1,every=3");
  Commit(2);
  Close();
  std::string arena;
  for (const auto& e : fs::directory_iterator(mem_.Sub("ram"))) arena = e.path().string();
  std::string bytes = test::ReadWholeFile(arena);
  auto two = RandomBytes(200 << 10, Seed(2));
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(two.data()), 64));
  ASSERT_NE(at, std::string::npos);
  test::FlipByte(arena, at + 1);
  Open(ram_ + ";disk:" + disk_dir_ + ",keep=1");
  EXPECT_EQ(ckptdb_wait_commit(db_, 2, "disk", -1), CKPTDB_ECORRUPT);
  Close();
  EXPECT_EQ(Files(disk_dir_), (std::set<uint64_t>{1}));
}

TEST_F(TierManagerTest, AnUnwritableTargetFailsTheDemotionClearly) {
  Open(ram_ + ";disk:" + disk_dir_);
  Commit(1);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  // The disk tier's directory turns into a file under the store's feet.
  fs::remove_all(disk_dir_);
  test::WriteWholeFile(disk_dir_, "not a directory");
  Commit(2);
  int rc = ckptdb_wait_commit(db_, 2, "disk", -1);
  EXPECT_NE(rc, CKPTDB_OK);
  EXPECT_NE(std::string(ckptdb_last_error()).find("demoting version 2"), std::string::npos)
      << ckptdb_last_error();
  // The ram copy still serves it.
  ExpectRestores(2);
  ckptdb_close(db_);
  db_ = nullptr;
  fs::remove(disk_dir_);
}

TEST_F(TierManagerTest, FiguresArePersistedForTheTools) {
  Open(ram_ + ";disk:" + disk_dir_);
  for (uint64_t v = 1; v <= 3; ++v) Commit(v);
  ASSERT_EQ(ckptdb_wait_commit(db_, 3, "disk", -1), CKPTDB_OK);
  Close();
  ckptdb_options ro = o_;
  ro.read_only = 1;
  ro.tiers = nullptr;
  ASSERT_EQ(ckptdb_open(&ro, &db_), CKPTDB_OK) << ckptdb_last_error();
  ckptdb_version_stats_t vs{};
  ASSERT_EQ(ckptdb_version_stats(db_, 2, &vs), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(vs.bytes, 200u << 10);
  EXPECT_EQ(vs.put_calls, 1u);
  EXPECT_GT(vs.tier_bytes_written[0], 200u << 10);
  EXPECT_GT(vs.tier_bytes_written[1], 200u << 10) << "the demotion's figures";
  EXPECT_EQ(ckptdb_version_stats(db_, 99, &vs), CKPTDB_ENOTFOUND);
  ckptdb_stats_t st{};
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.commits, 3u);
  EXPECT_EQ(st.put_bytes, 3u * (200 << 10));
  EXPECT_EQ(st.tier_count, 2u);
  EXPECT_EQ(st.tiers[0].kind_ram, 1u);
  EXPECT_EQ(st.tiers[0].capacity_bytes, 32u << 20);
  EXPECT_EQ(st.tiers[1].resident_versions, 3u);
}

}  // namespace
}  // namespace ckpt
