// The ram tier (DESIGN.md section 5; issue 3): a shared-memory arena that outlives the trainer.
// A trainer killed with SIGKILL at random points leaves the newest committed version restorable
// from ram by a new process, bit for bit, without a byte read from the slower tier; a lost arena
// (reboot) falls back to the disk copy; a damaged arena chunk falls back chunk by chunk and is
// named by verify; the arena grows and shrinks with its spec only when that is safe. Its header
// is kept twice (issue 20): a damaged copy is rewritten from the other and loses no copy, two
// damaged copies fail the open and change nothing, a rewrite cut short between the copies takes
// the newer, and every copy is found again by scanning for its index, without the catalog.
#include "engine/ram_tier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "format/ram_format.h"
#include "io/io.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::FillRandom;
using test::RandomBytes;
using test::TempDir;

// The one arena file in dir.
std::string ArenaFile(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".ram") return e.path().string();
  }
  return "";
}

// The first `bytes` of a file (the header area, by default).
std::string FileHead(const std::string& path, size_t bytes = format::kArenaHeaderAreaBytes) {
  std::string head(bytes, '\0');
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr);
  if (f == nullptr) return "";
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  return head;
}

// Header copy `copy` (0: A at offset 0, 1: B at offset 8192) of an arena file, decoded.
Status ReadHeaderCopy(const std::string& arena, int copy, format::ArenaHeader* h) {
  const std::string bytes = FileHead(arena);
  const uint64_t at = format::kArenaHeaderCopyOffsets[copy];
  if (bytes.size() < at + format::kArenaHeaderCopyBytes) return Status::Corrupt("short file");
  return format::DecodeArenaHeaderCopy(
      std::span<const uint8_t, format::kArenaHeaderCopyBytes>(
          reinterpret_cast<const uint8_t*>(bytes.data()) + at, format::kArenaHeaderCopyBytes),
      "copy", h);
}

void WriteHeaderCopy(const std::string& arena, int copy, const format::ArenaHeader& h) {
  std::vector<uint8_t> slot(format::kArenaHeaderCopyBytes);
  format::EncodeArenaHeaderCopy(
      h, std::span<uint8_t, format::kArenaHeaderCopyBytes>(slot.data(), slot.size()));
  FILE* f = std::fopen(arena.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fseek(f, static_cast<long>(format::kArenaHeaderCopyOffsets[copy]), SEEK_SET), 0);
  ASSERT_EQ(std::fwrite(slot.data(), 1, slot.size(), f), slot.size());
  std::fclose(f);
}

// The arena header's capacity field, read from the file itself: both copies must be whole and
// agree, as every read-write open and close leaves them.
uint64_t HeaderCapacity(const std::string& arena) {
  format::ArenaHeader a, b;
  EXPECT_TRUE(ReadHeaderCopy(arena, 0, &a).ok());
  EXPECT_TRUE(ReadHeaderCopy(arena, 1, &b).ok());
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.capacity_bytes, b.capacity_bytes);
  return a.capacity_bytes;
}

// A header rewrite cut short between its two copies: copy A carries the new capacity and the
// next sequence, copy B is as it was.
void SetHeaderCapacity(const std::string& arena, uint64_t capacity) {
  format::ArenaHeader h;
  ASSERT_TRUE(ReadHeaderCopy(arena, 0, &h).ok());
  h.capacity_bytes = capacity;
  ++h.sequence;
  WriteHeaderCopy(arena, 0, h);
}

// The job id an arena's file name carries: ckptdb-<16 hex digits>-r<rank>.ram.
uint64_t ArenaJobId(const std::string& arena) {
  const std::string name = fs::path(arena).filename().string();
  return std::stoull(name.substr(7, 16), nullptr, 16);
}

class RamTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptdb_options_init(&o_);
    root_ = mem_.Sub("root");
    ram_dir_ = mem_.Sub("ram");
    disk_dir_ = disk_.Sub("disk");
    SetTiers("ram:16M,keep=2,dir=" + ram_dir_ + ";disk:" + disk_dir_);
    o_.root = root_.c_str();
    o_.chunk_bytes = 64 << 10;
    o_.staging_bytes = 1 << 20;
  }
  void TearDown() override {
    if (db_ != nullptr) ckptdb_close(db_);
  }
  void SetTiers(const std::string& tiers) {
    tiers_ = tiers;
    o_.tiers = tiers_.c_str();
  }
  void Open() { ASSERT_EQ(ckptdb_open(&o_, &db_), CKPTDB_OK) << ckptdb_last_error(); }
  void Close() {
    ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK) << ckptdb_last_error();
    db_ = nullptr;
  }
  void Commit(uint64_t v, const std::vector<uint8_t>& data) {
    ASSERT_EQ(ckptdb_put_shard(db_, v, "w", data.data(), data.size(), nullptr, 0), CKPTDB_OK)
        << ckptdb_last_error();
    ASSERT_EQ(ckptdb_wait_capture(db_, v, -1), CKPTDB_OK) << ckptdb_last_error();
    ASSERT_EQ(ckptdb_commit(db_, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }
  int Restore(uint64_t v, std::vector<uint8_t>* out) {
    return ckptdb_restore(db_, v, "w", out->data(), out->size(), 0);
  }
  ckptdb_stats_t Stats() {
    ckptdb_stats_t st{};
    EXPECT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
    return st;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, ram_dir_, disk_dir_, tiers_;
  ckptdb_options o_;
  ckptdb* db_ = nullptr;
};

TEST_F(RamTierTest, CommitsToTheArenaAndRestoresFromItAfterReopen) {
  Open();
  auto a = RandomBytes(300 << 10, 1);
  Commit(1, a);
  // The commit tier is ram: committed before the disk copy exists.
  std::vector<uint8_t> out(a.size());
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  EXPECT_STREQ(Stats().last_restore_tier, "ram");
  EXPECT_EQ(Stats().staging_bytes, 0u) << "ram with one directory tier needs no staging ring";
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
  Close();
  std::string arena = ArenaFile(ram_dir_);
  ASSERT_FALSE(arena.empty());
  EXPECT_EQ(fs::file_size(arena), 16u << 20);
  Open();
  std::fill(out.begin(), out.end(), 0);
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  ckptdb_stats_t st = Stats();
  EXPECT_STREQ(st.last_restore_tier, "ram");
  EXPECT_EQ(st.tiers[1].bytes_read, 0u) << "nothing is read from the slower tier";
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, 1, "ram", nullptr, nullptr, &rep), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(rep.segments_checked, 1u);
  EXPECT_EQ(rep.chunks_checked, 5u);
}

TEST_F(RamTierTest, LostArenaFallsBackToTheDiskCopy) {
  Open();
  auto a = RandomBytes(200 << 10, 2);
  Commit(1, a);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  Close();
  ASSERT_TRUE(fs::remove(ArenaFile(ram_dir_)));  // as after a reboot
  Open();
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(latest, 1u);
  std::vector<uint8_t> out(a.size());
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  EXPECT_EQ(std::string(Stats().last_restore_tier), "disk:" + disk_dir_);
  // The ram copy reads as missing, and the new arena takes new versions.
  struct Seen {
    int ram_state = 0;
  } seen;
  ASSERT_EQ(ckptdb_list_versions(
                db_,
                [](void* arg, const ckptdb_version_info* i) {
                  for (uint32_t k = 0; k < i->residency_count; ++k) {
                    if (std::string(i->residency[k].tier) == "ram") {
                      static_cast<Seen*>(arg)->ram_state = i->residency[k].state;
                    }
                  }
                  return 0;
                },
                &seen),
            CKPTDB_OK);
  EXPECT_EQ(seen.ram_state, CKPTDB_RESIDENT_MISSING);
  auto b = RandomBytes(100 << 10, 3);
  Commit(2, b);
  out.assign(b.size(), 0);
  ASSERT_EQ(Restore(2, &out), CKPTDB_OK);
  EXPECT_EQ(out, b);
  EXPECT_STREQ(Stats().last_restore_tier, "ram");
}

TEST_F(RamTierTest, ALostArenaDemotesFromADirectoryTierThroughTheStagingRing) {
  const std::string tmpfs_dir = mem_.Sub("tmpfs");
  SetTiers("ram:16M,keep=2,dir=" + ram_dir_ + ";tmpfs:" + tmpfs_dir);
  Open();
  auto a = RandomBytes(300 << 10, 9);
  Commit(1, a);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "tmpfs", -1), CKPTDB_OK) << ckptdb_last_error();
  Close();
  ASSERT_TRUE(fs::remove(ArenaFile(ram_dir_)));  // as after a reboot
  // A disk tier behind the tmpfs one: version 1 can reach it only from the tmpfs copy, read
  // into the staging ring, checked, written.
  SetTiers("ram:16M,keep=2,dir=" + ram_dir_ + ";tmpfs:" + tmpfs_dir + ";disk:" + disk_dir_);
  Open();
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
  ckptdb_stats_t st = Stats();
  EXPECT_GT(st.staging_bytes, 0u);
  EXPECT_GT(st.staging_high_water_bytes, 0u);
  EXPECT_GE(st.tiers[1].bytes_read, a.size());
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, 1, "disk", nullptr, nullptr, &rep), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(rep.segments_checked, 1u);
  EXPECT_EQ(rep.problems, 0u);
}

TEST_F(RamTierTest, DamagedArenaChunkFallsBackAndVerifyNamesIt) {
  Open();
  auto a = RandomBytes(256 << 10, 4);  // 4 chunks of 64 KiB
  Commit(1, a);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  Close();
  // Flip one payload byte of some chunk in the arena: find the first chunk's bytes by content.
  std::string arena = ArenaFile(ram_dir_);
  std::string bytes = test::ReadWholeFile(arena);
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(a.data()) + (128 << 10), 64));
  ASSERT_NE(at, std::string::npos);
  test::FlipByte(arena, at + 10);
  Open();
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, 1, "ram", nullptr, nullptr, &rep), CKPTDB_ECORRUPT);
  EXPECT_EQ(rep.problems, 1u);
  EXPECT_NE(std::string(ckptdb_last_error()).find("1 problem"), std::string::npos);
  std::vector<uint8_t> out(a.size());
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a) << "the bad chunk comes from the disk copy";
  ckptdb_stats_t st = Stats();
  EXPECT_STREQ(st.last_restore_tier, "ram");
  EXPECT_EQ(st.checksum_failures, 1u);
  EXPECT_EQ(st.tiers[1].bytes_read, 64u << 10) << "only the bad chunk is read from disk";
}

TEST_F(RamTierTest, ADamagedHeaderCopyIsRewrittenFromTheOther) {
  Open();
  Commit(1, RandomBytes(100 << 10, 5));
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  const std::string before = FileHead(arena);
  test::FlipByte(arena, 8192 + 20);  // inside copy B's job id
  testing::internal::CaptureStderr();
  Open();
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("ram tier arena " + arena + ": header copy B at offset 8192 fails xxh3 ("),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("; rewritten from copy A"), std::string::npos) << said;
  std::vector<uint8_t> out(100 << 10);
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, RandomBytes(100 << 10, 5));
  EXPECT_STREQ(Stats().last_restore_tier, "ram");
  Close();
  EXPECT_EQ(FileHead(arena), before) << "copy B is copy A again, byte for byte";
}

// Issue 20, finding 4: one flipped bit in the header used to lose every copy in the arena.
TEST_F(RamTierTest, EveryFlippedBitInOneHeaderCopyLosesNoCopy) {
  SetTiers("ram:4M,dir=" + ram_dir_);  // ram only: the copies can come from nowhere else
  Open();
  auto a = RandomBytes(100 << 10, 31);
  auto b = RandomBytes(70 << 10, 32);
  Commit(1, a);
  Commit(2, b);
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  const std::string before = FileHead(arena);
  format::ArenaHeader h;
  ASSERT_TRUE(ReadHeaderCopy(arena, 0, &h).ok());
  EXPECT_EQ(h.root_path, root_);
  const uint64_t extension_bytes = format::ArenaExtensionBytes(h.root_path.size());
  // (offset, mask): every bit of each copy's fixed header, every 37th byte of its extension.
  std::vector<std::pair<uint64_t, uint8_t>> flips;
  for (uint64_t copy : format::kArenaHeaderCopyOffsets) {
    for (uint64_t bit = 0; bit < format::kArenaHeaderBytes * 8; ++bit) {
      flips.emplace_back(copy + bit / 8, static_cast<uint8_t>(1u << (bit % 8)));
    }
    for (uint64_t i = 0; i < extension_bytes; i += 37) {
      flips.emplace_back(copy + format::kArenaExtensionOffset + i, uint8_t{0x04});
    }
  }
  std::vector<uint8_t> out;
  for (const auto& [offset, mask] : flips) {
    test::FlipByte(arena, offset, mask);
    testing::internal::CaptureStderr();  // one line per flip
    Open();
    testing::internal::GetCapturedStderr();
    out.assign(a.size(), 0);
    ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << "offset " << offset << ": " << ckptdb_last_error();
    ASSERT_EQ(out, a) << "offset " << offset;
    out.assign(b.size(), 0);
    ASSERT_EQ(Restore(2, &out), CKPTDB_OK) << "offset " << offset << ": " << ckptdb_last_error();
    ASSERT_EQ(out, b) << "offset " << offset;
    Close();
    ASSERT_EQ(FileHead(arena), before)
        << "offset " << offset << ": the damaged copy was not rewritten";
  }
}

TEST_F(RamTierTest, BothHeaderCopiesDamagedFailsTheOpenAndChangesNothing) {
  Open();
  auto a = RandomBytes(100 << 10, 33);
  Commit(1, a);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  test::FlipByte(arena, 20);         // copy A's job id
  test::FlipByte(arena, 8192 + 80);  // copy B's root path
  const std::string before = test::ReadWholeFile(arena);
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_EQ(ckptdb_open(&o_, &db_), CKPTDB_ECORRUPT);
    db_ = nullptr;
    const std::string why = ckptdb_last_error();
    EXPECT_NE(why.find("ram tier arena " + arena), std::string::npos) << why;
    EXPECT_NE(why.find("header copy A at offset 0 fails xxh3"), std::string::npos) << why;
    EXPECT_NE(why.find("header copy B at offset 8192: root path extension fails xxh3"),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("ckptdb repair " + root_), std::string::npos) << why;
    ASSERT_TRUE(fs::exists(arena));
    EXPECT_TRUE(test::ReadWholeFile(arena) == before) << "the arena was changed";
  }
  // A read-only open goes on without the arena: the ram copy reads as missing.
  ckptdb_options ro;
  ckptdb_options_init(&ro);
  ro.root = root_.c_str();
  ro.read_only = 1;
  testing::internal::CaptureStderr();
  ASSERT_EQ(ckptdb_open(&ro, &db_), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_NE(testing::internal::GetCapturedStderr().find("read-only"), std::string::npos);
  std::vector<uint8_t> out(a.size());
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  EXPECT_EQ(std::string(Stats().last_restore_tier), "disk:" + disk_dir_);
  Close();
  EXPECT_TRUE(test::ReadWholeFile(arena) == before) << "the arena was changed";
}

TEST_F(RamTierTest, AnArenaOfTheFirstFormatOrOnlyZerosIsReplaced) {
  Open();
  auto a = RandomBytes(100 << 10, 34);
  Commit(1, a);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, "disk", -1), CKPTDB_OK);
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  format::ArenaHeader h;
  ASSERT_TRUE(ReadHeaderCopy(arena, 0, &h).ok());
  const uint64_t generation = h.generation;
  // Version 1's header (copy A's fixed header, format_version 1), copy B's slot all zeros.
  h.format_version = 1;
  h.sequence = 0;  // version 1's reserved field
  h.root_path.clear();
  {
    std::vector<uint8_t> zeros(format::kArenaHeaderCopyBytes, 0);
    format::EncodeArenaHeader(h, std::span<uint8_t, format::kArenaHeaderBytes>(zeros.data(), 64));
    std::string bytes = test::ReadWholeFile(arena);
    bytes.replace(0, zeros.size(), std::string(zeros.begin(), zeros.end()));
    bytes.replace(8192, zeros.size(), std::string(zeros.size(), '\0'));
    test::WriteWholeFile(arena, bytes);
  }
  testing::internal::CaptureStderr();
  Open();
  std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("arena format version 1, written by an older ckptdb"), std::string::npos)
      << said;
  std::vector<uint8_t> out(a.size());
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  EXPECT_EQ(std::string(Stats().last_restore_tier), "disk:" + disk_dir_);
  Close();
  ASSERT_TRUE(ReadHeaderCopy(arena, 0, &h).ok());
  EXPECT_NE(h.generation, generation);
  // An arena of zeros from end to end (its creation cut short) holds nothing: it is finished.
  test::WriteWholeFile(arena, std::string(fs::file_size(arena), '\0'));
  testing::internal::CaptureStderr();
  Open();
  said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("holds only zeros"), std::string::npos) << said;
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  Close();
  EXPECT_TRUE(ReadHeaderCopy(arena, 0, &h).ok());
  EXPECT_TRUE(ReadHeaderCopy(arena, 1, &h).ok());
}

TEST_F(RamTierTest, ArenaResizesOnlyWhenItsCopiesStillFit) {
  Open();
  Commit(1, RandomBytes(1 << 20, 6));
  Close();
  SetTiers("ram:32M,keep=2,dir=" + ram_dir_ + ";disk:" + disk_dir_);
  Open();
  Close();
  EXPECT_EQ(fs::file_size(ArenaFile(ram_dir_)), 32u << 20);
  std::vector<uint8_t> out(1 << 20);
  SetTiers("ram:2M,keep=2,dir=" + ram_dir_ + ";disk:" + disk_dir_);
  // The copy of version 1 lies in the first 2 MiB (first fit from the start): this shrink fits.
  Open();
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  Close();
  EXPECT_EQ(fs::file_size(ArenaFile(ram_dir_)), 2u << 20);
}

TEST_F(RamTierTest, AShrinkPastALiveCopyIsRefusedAndChangesNothing) {
  SetTiers("ram:16M,keep=2,dir=" + ram_dir_);
  Open();
  auto a = RandomBytes(1 << 20, 8);
  auto b = RandomBytes(1 << 20, 80);
  Commit(1, a);
  Commit(2, b);  // first fit: past the first 2 MiB
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  const std::string other_disk = disk_.Sub("other");
  SetTiers("ram:2M,keep=2,dir=" + ram_dir_ + ";disk:" + other_disk);
  EXPECT_EQ(ckptdb_open(&o_, &db_), CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("holds committed copies past"), std::string::npos)
      << ckptdb_last_error();
  db_ = nullptr;
  EXPECT_EQ(fs::file_size(arena), 16u << 20);
  // The refused spec was not recorded: a read-only tool still sees the store's own tiers.
  ckptdb_options ro;
  ckptdb_options_init(&ro);
  ro.root = root_.c_str();
  ro.read_only = 1;
  ASSERT_EQ(ckptdb_open(&ro, &db_), CKPTDB_OK) << ckptdb_last_error();
  ckptdb_stats_t st = Stats();
  EXPECT_EQ(st.tier_count, 1u);
  std::vector<uint8_t> out(b.size());
  ASSERT_EQ(Restore(2, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, b);
}

TEST_F(RamTierTest, ACrashInsideAResizeKeepsTheArenasCopies) {
  SetTiers("ram:16M,dir=" + ram_dir_);  // ram only: the copy can come from nowhere else
  Open();
  auto a = RandomBytes(1 << 20, 7);
  Commit(1, a);
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  std::vector<uint8_t> out(a.size());
  // A grow cut short: the file is 32 MiB, the header still says 16.
  fs::resize_file(arena, 32u << 20);
  SetTiers("ram:32M,dir=" + ram_dir_);
  Open();
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  EXPECT_STREQ(Stats().last_restore_tier, "ram");
  Close();
  EXPECT_EQ(HeaderCapacity(arena), 32u << 20) << "the open completes the header";
  // A shrink cut short: the header says 8 MiB, the file is still 32.
  SetHeaderCapacity(arena, 8u << 20);
  SetTiers("ram:8M,dir=" + ram_dir_);
  Open();
  std::fill(out.begin(), out.end(), 0);
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, a);
  Close();
  EXPECT_EQ(fs::file_size(arena), 8u << 20);
  EXPECT_EQ(HeaderCapacity(arena), 8u << 20);
}

TEST_F(RamTierTest, ArenaTooSmallForTwoVersionsFailsTheCaptureClearly) {
  // ram only, no slower tier: version 1 is the newest committed and never evicted, so version 2
  // can never fit. The capture fails with ENOSPC instead of waiting forever.
  SetTiers("ram:2M,dir=" + ram_dir_);
  Open();
  auto a = RandomBytes(1200 << 10, 7);
  Commit(1, a);
  auto b = RandomBytes(1200 << 10, 8);
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "w", b.data(), b.size(), nullptr, 0), CKPTDB_OK);
  EXPECT_EQ(ckptdb_wait_capture(db_, 2, -1), CKPTDB_ENOSPC);
  std::string why = ckptdb_last_error();
  EXPECT_NE(why.find("ram tier"), std::string::npos) << why;
  EXPECT_NE(why.find("never evicted"), std::string::npos) << why;
  EXPECT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_ENOSPC);
  // Version 1 is untouched.
  std::vector<uint8_t> out(a.size());
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK);
  EXPECT_EQ(out, a);
}

TEST_F(RamTierTest, SkipPolicyDropsTheVersionThatDoesNotFit) {
  SetTiers("ram:2M,dir=" + ram_dir_);
  o_.backpressure = "skip";
  Open();
  auto a = RandomBytes(1200 << 10, 9);
  Commit(1, a);
  auto b = RandomBytes(1200 << 10, 10);
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "w", b.data(), b.size(), nullptr, 0), CKPTDB_OK);
  EXPECT_EQ(ckptdb_wait_capture(db_, 2, -1), CKPTDB_ESKIPPED);
  EXPECT_NE(std::string(ckptdb_last_error()).find("skip"), std::string::npos);
  EXPECT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_ESKIPPED);
  EXPECT_EQ(Stats().skipped_versions, 1u);
  // A version that fits goes through afterwards.
  auto c = RandomBytes(100 << 10, 11);
  Commit(3, c);
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, 3u);
}

TEST_F(RamTierTest, BlockPolicyWaitsForDemotionToMakeRoom) {
  // The arena holds about two and a half versions: from version 3 on, each capture must wait
  // until the oldest version in ram is on the disk tier and can be evicted (the newest committed
  // one never is).
  SetTiers("ram:5M,dir=" + ram_dir_ + ";disk:" + disk_dir_);
  Open();
  std::vector<std::vector<uint8_t>> data;
  for (uint64_t v = 1; v <= 5; ++v) {
    data.push_back(RandomBytes(1800 << 10, 20 + v));
    Commit(v, data.back());
  }
  ckptdb_stats_t st = Stats();
  EXPECT_GE(st.tiers[0].evictions, 3u);
  EXPECT_LE(st.tiers[0].high_water_bytes, 5u << 20);
  Close();
  Open();
  for (uint64_t v = 1; v <= 5; ++v) {
    ASSERT_EQ(ckptdb_wait_commit(db_, v, "disk", -1), CKPTDB_OK) << v << ckptdb_last_error();
    std::vector<uint8_t> out(data[v - 1].size());
    ASSERT_EQ(Restore(v, &out), CKPTDB_OK) << ckptdb_last_error();
    EXPECT_EQ(out, data[v - 1]) << v;
  }
}

// ---- The arena's header and index, through RamTier itself -------------------------------------

class RamArenaTest : public RamTierTest {
 protected:
  // The arena as RamTier sees it, opened on its own (no catalog), as ckptdb repair would.
  std::unique_ptr<engine::RamTier> OpenArena(const std::string& root_path, bool read_only,
                                             Status* st) {
    const std::string arena = ArenaFile(ram_dir_);
    io::TierSpec spec;
    spec.kind = io::TierKind::kRam;
    spec.path = ram_dir_;
    spec.capacity_bytes = fs::file_size(arena);
    spec.name = "ram";
    auto ram = std::make_unique<engine::RamTier>(io_.get(), spec);
    *st = ram->Open(ArenaJobId(arena), 0, root_path, read_only);
    return ram;
  }
  // Every version the disk tier holds, as its segment file's bytes.
  std::map<uint64_t, std::string> DiskSegments() {
    std::map<uint64_t, std::string> out;
    for (const auto& e : fs::directory_iterator(disk_dir_)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() != ".seg") continue;
      out[std::stoull(name.substr(1, 20))] = test::ReadWholeFile(e.path().string());
    }
    return out;
  }
  static std::string ImageBytes(const engine::RamTier& ram, const engine::RamImage& image) {
    std::string bytes(image.file_bytes, '\0');
    EXPECT_TRUE(ram.ReadAt(image, 0, bytes.data(), bytes.size(), "image").ok());
    return bytes;
  }

  std::unique_ptr<io::Io> io_ = io::NewPosixIo();
};

TEST_F(RamArenaTest, ATornHeaderRewriteTakesTheNewerCopy) {
  Open();
  Commit(1, RandomBytes(100 << 10, 40));
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  format::ArenaHeader a, b;
  ASSERT_TRUE(ReadHeaderCopy(arena, 0, &a).ok());
  ASSERT_TRUE(ReadHeaderCopy(arena, 1, &b).ok());
  ASSERT_EQ(a.sequence, b.sequence);
  // Copy A is written first: a process killed in between leaves A new and B old.
  a.root_path = "/elsewhere/root";
  ++a.sequence;
  WriteHeaderCopy(arena, 0, a);
  Status st;
  auto ram = OpenArena("/x", /*read_only=*/true, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(ram->available());
  EXPECT_EQ(ram->root_path(), "/elsewhere/root");
  ram.reset();
  // The reverse (B newer) is taken the same way: the higher sequence wins, whichever copy.
  b.root_path = "/newer/in/b";
  b.sequence = a.sequence + 1;
  WriteHeaderCopy(arena, 1, b);
  ram = OpenArena("/x", /*read_only=*/true, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ram->root_path(), "/newer/in/b");
  ram.reset();
  // A read-write open finishes the rewrite, then records its own root with the next sequence.
  ram = OpenArena(root_, /*read_only=*/false, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ram->root_path(), root_);
  ram.reset();
  ASSERT_TRUE(ReadHeaderCopy(arena, 0, &a).ok());
  ASSERT_TRUE(ReadHeaderCopy(arena, 1, &b).ok());
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.root_path, root_);
  EXPECT_EQ(b.root_path, root_);
  // The store opens with its copy in ram.
  Open();
  std::vector<uint8_t> out(100 << 10);
  ASSERT_EQ(Restore(1, &out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, RandomBytes(100 << 10, 40));
  EXPECT_STREQ(Stats().last_restore_tier, "ram");
}

TEST_F(RamArenaTest, TwoValidCopiesThatDisagreeAreCorrupt) {
  Open();
  Commit(1, RandomBytes(100 << 10, 41));
  Close();
  const std::string arena = ArenaFile(ram_dir_);
  format::ArenaHeader b;
  ASSERT_TRUE(ReadHeaderCopy(arena, 1, &b).ok());
  for (int c = 0; c < 2; ++c) {
    format::ArenaHeader bad = b;
    if (c == 0) {
      bad.generation ^= 1;  // another arena's copy, whatever its sequence
      bad.sequence += 5;
    } else {
      bad.capacity_bytes += 4096;  // the same sequence, another content
    }
    WriteHeaderCopy(arena, 1, bad);
    const std::string before = test::ReadWholeFile(arena);
    Status st;
    auto ram = OpenArena(root_, /*read_only=*/false, &st);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.ToString();
    EXPECT_NE(st.message().find("both pass their checksums but disagree"), std::string::npos)
        << st.message();
    ram.reset();
    EXPECT_TRUE(test::ReadWholeFile(arena) == before) << "the arena was changed";
    testing::internal::CaptureStderr();
    ram = OpenArena(root_, /*read_only=*/true, &st);
    testing::internal::GetCapturedStderr();
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_FALSE(ram->available());
  }
}

TEST_F(RamArenaTest, ScanImagesFindsEveryCopyWithoutTheCatalog) {
  SetTiers("ram:8M,keep=3,dir=" + ram_dir_ + ";disk:" + disk_dir_);
  Open();
  for (uint64_t v = 1; v <= 4; ++v) {
    Commit(v, RandomBytes((100 + 60 * v) << 10, 50 + 10 * v));
    ASSERT_EQ(ckptdb_wait_commit(db_, v, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
  }
  // Version 1 leaves ram (keep=3) once it is on disk: wait until it is gone.
  auto ram_state = [&](uint64_t version) {
    struct Arg {
      uint64_t version;
      int state = -1;
    } arg{version};
    EXPECT_EQ(ckptdb_list_versions(
                  db_,
                  [](void* p, const ckptdb_version_info* i) {
                    auto* a = static_cast<Arg*>(p);
                    for (uint32_t k = 0; i->version == a->version && k < i->residency_count; ++k) {
                      if (std::string(i->residency[k].tier) == "ram") {
                        a->state = i->residency[k].state;
                      }
                    }
                    return 0;
                  },
                  &arg),
              CKPTDB_OK);
    return arg.state;
  };
  for (int i = 0; i < 1000 && ram_state(1) == CKPTDB_RESIDENT_DURABLE; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(ram_state(1), CKPTDB_RESIDENT_DURABLE) << "version 1 was never evicted from ram";
  Close();
  const std::map<uint64_t, std::string> disk = DiskSegments();
  ASSERT_EQ(disk.size(), 4u);
  const std::string arena = ArenaFile(ram_dir_);

  // The catalog is not read: each copy in the arena is found by its index alone, and is the
  // very segment the disk tier holds. The evicted version's index was erased.
  Status st;
  auto ram = OpenArena(root_, /*read_only=*/true, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<engine::RamImage> images;
  ASSERT_TRUE(ram->ScanImages(ArenaJobId(arena), 0, &images).ok());
  ASSERT_EQ(images.size(), 3u);
  std::map<uint64_t, engine::RamImage> found;
  for (const engine::RamImage& image : images) {
    EXPECT_TRUE(ImageBytes(*ram, image) == disk.at(image.version)) << image.version;
    found[image.version] = image;
  }
  EXPECT_EQ(found.count(1), 0u);
  EXPECT_EQ(found.count(2) + found.count(3) + found.count(4), 3u);
  // Another store's job id or rank finds nothing.
  ASSERT_TRUE(ram->ScanImages(ArenaJobId(arena) ^ 1, 0, &images).ok());
  EXPECT_TRUE(images.empty());
  ASSERT_TRUE(ram->ScanImages(ArenaJobId(arena), 1, &images).ok());
  EXPECT_TRUE(images.empty());
  ram.reset();

  // A second index of version 3 (as a capture that ran again after a crash leaves): still one
  // image per version.
  {
    std::string bytes = test::ReadWholeFile(arena);
    const engine::RamImage& v3 = found.at(3);
    ASSERT_EQ(bytes.substr(bytes.size() - v3.index_bytes), std::string(v3.index_bytes, '\0'))
        << "the arena's last region is expected free";
    bytes.replace(bytes.size() - v3.index_bytes, v3.index_bytes,
                  bytes.substr(v3.index_offset, v3.index_bytes));
    test::WriteWholeFile(arena, bytes);
  }
  ram = OpenArena(root_, /*read_only=*/true, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(ram->ScanImages(ArenaJobId(arena), 0, &images).ok());
  ASSERT_EQ(images.size(), 3u);
  for (const engine::RamImage& image : images) {
    EXPECT_TRUE(ImageBytes(*ram, image) == disk.at(image.version)) << image.version;
  }
  ram.reset();

  // A flipped bit in one index loses that version and no other.
  test::FlipByte(arena, found.at(3).index_offset + 30);
  test::FlipByte(arena, fs::file_size(arena) - found.at(3).index_bytes + 100);
  ram = OpenArena(root_, /*read_only=*/true, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(ram->ScanImages(ArenaJobId(arena), 0, &images).ok());
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].version, 2u);
  EXPECT_EQ(images[1].version, 4u);
  for (const engine::RamImage& image : images) {
    EXPECT_EQ(image.index_offset, found.at(image.version).index_offset);
    EXPECT_TRUE(ImageBytes(*ram, image) == disk.at(image.version)) << image.version;
  }
}

// ---- kill -9 ----------------------------------------------------------------------------------

constexpr int kShards = 4;
size_t ShardBytes(int shard) { return (300 << 10) + 4097 * shard; }
uint64_t Seed(uint64_t version, int shard) { return version * 100 + shard; }

// The child: a trainer that checkpoints every iteration into ram (commit tier) with a disk tier
// every 3 versions, and reports each version whose commit returned on `fd`. It runs until it is
// killed.
[[noreturn]] void Trainer(const ckptdb_options& o, int fd, bool async) {
  ckptdb* db = nullptr;
  if (ckptdb_open(&o, &db) != CKPTDB_OK) _exit(2);
  uint64_t latest = 0;
  if (ckptdb_latest(db, &latest) != CKPTDB_OK) latest = 0;
  std::vector<std::vector<uint8_t>> state(kShards);
  for (int s = 0; s < kShards; ++s) state[s].resize(ShardBytes(s));
  for (uint64_t v = latest + 1; v < latest + 10000; ++v) {
    for (int s = 0; s < kShards; ++s) FillRandom(state[s].data(), state[s].size(), Seed(v, s));
    for (int s = 0; s < kShards; ++s) {
      std::string name = "shard." + std::to_string(s);
      if (ckptdb_put_shard(db, v, name.c_str(), state[s].data(), state[s].size(), nullptr, 0)) {
        _exit(3);
      }
    }
    if (ckptdb_wait_capture(db, v, -1) != CKPTDB_OK) _exit(4);
    if (ckptdb_commit(db, v, async ? CKPTDB_COMMIT_ASYNC : 0) != CKPTDB_OK) _exit(5);
    if (async && ckptdb_wait_commit(db, v, nullptr, -1) != CKPTDB_OK) _exit(6);
    if (write(fd, &v, sizeof v) != sizeof v) _exit(7);
  }
  _exit(0);
}

TEST_F(RamTierTest, KillNineAtAnyPointLeavesTheNewestCommitRestorableFromRam) {
  SetTiers("ram:16M,keep=2,dir=" + ram_dir_ + ";disk:" + disk_dir_ + ",every=3,keep=2");
  std::mt19937_64 rng(20261123);
  uint64_t acknowledged = 0;
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(pipe_fds[0]);
      Trainer(o_, pipe_fds[1], round % 2 == 1);
    }
    close(pipe_fds[1]);
    // Let it run a random while, then kill it without warning.
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 250));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status))
        << "the trainer stopped on its own: exit " << WEXITSTATUS(status);
    uint64_t v = 0;
    while (read(pipe_fds[0], &v, sizeof v) == sizeof v) acknowledged = std::max(acknowledged, v);
    close(pipe_fds[0]);

    // A new process (this one) opens the store and restores the newest committed version.
    Open();
    uint64_t latest = 0;
    ASSERT_EQ(ckptdb_latest(db_, &latest), acknowledged ? CKPTDB_OK : CKPTDB_ENOTFOUND)
        << ckptdb_last_error();
    if (acknowledged == 0) {
      Close();
      continue;
    }
    // The one version the trainer may have committed but not reported yet.
    EXPECT_GE(latest, acknowledged) << "round " << round;
    EXPECT_LE(latest, acknowledged + 1) << "round " << round;
    for (int s = 0; s < kShards; ++s) {
      std::vector<uint8_t> out(ShardBytes(s));
      std::string name = "shard." + std::to_string(s);
      ASSERT_EQ(ckptdb_restore(db_, latest, name.c_str(), out.data(), out.size(), 0), CKPTDB_OK)
          << "round " << round << ": " << ckptdb_last_error();
      EXPECT_EQ(out, RandomBytes(out.size(), Seed(latest, s))) << "round " << round << " " << name;
    }
    ckptdb_stats_t st = Stats();
    EXPECT_STREQ(st.last_restore_tier, "ram") << "round " << round;
    EXPECT_EQ(st.tiers[1].bytes_read, 0u) << "round " << round << ": the disk tier was read";
    std::string problems;
    EXPECT_EQ(ckptdb_verify(
                  db_, CKPTDB_ALL_VERSIONS, nullptr,
                  [](void* arg, const ckptdb_verify_event* e) {
                    if (e->kind == CKPTDB_VERIFY_PROBLEM) {
                      *static_cast<std::string*>(arg) += std::string(e->message) + "\n";
                    }
                  },
                  &problems, nullptr),
              CKPTDB_OK)
        << "round " << round << ": " << ckptdb_last_error() << "\n"
        << problems;
    acknowledged = latest;
    Close();
  }
  EXPECT_GT(acknowledged, 0u) << "no round got as far as a commit";
}

}  // namespace
}  // namespace ckpt
