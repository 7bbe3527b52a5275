// Damaged segments: a flipped byte, a truncated file, random bytes in place of a segment, a
// damaged manifest. Restore never returns wrong bytes: it falls back to another tier, or fails
// with CKPTDB_ECORRUPT and zeroes what it could not verify. Verify names the damage exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using test::RandomBytes;
using test::TempDir;

constexpr uint64_t kChunkBytes = 64 << 10;
constexpr uint64_t kBlock = 4096;
constexpr size_t kTensorBytes = 3 * kChunkBytes + 1000;  // chunks 0..3, the last one short

// Offset of chunk k's payload for the first (only) tensor: header block, then full records.
uint64_t PayloadOffset(uint64_t k) { return kBlock + k * (kBlock + kChunkBytes) + kBlock; }

struct Events {
  std::vector<ckptdb_verify_event> problems;
  std::vector<std::string> messages;
  std::vector<std::string> tiers;
};

void Collect(void* arg, const ckptdb_verify_event* e) {
  if (e->kind != CKPTDB_VERIFY_PROBLEM) return;
  auto* ev = static_cast<Events*>(arg);
  ev->problems.push_back(*e);
  ev->messages.push_back(e->message);
  ev->tiers.push_back(e->tier);
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = mem_.Sub("root");
    t1_ = mem_.Sub("t1");
    t2_ = disk_.Sub("t2");
    tiers_ = "tmpfs:" + t1_ + ";disk:" + t2_;
    ckptdb_options_init(&o_);
    o_.root = root_.c_str();
    o_.tiers = tiers_.c_str();
    o_.rank = 0;
    o_.world_size = 1;
    o_.chunk_bytes = kChunkBytes;
    o_.staging_bytes = 1 << 20;
    data_ = RandomBytes(kTensorBytes, 42);
    ckptdb* db = nullptr;
    ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << ckptdb_last_error();
    ASSERT_EQ(ckptdb_put_shard(db, 7, "w", data_.data(), data_.size(), nullptr, 0), CKPTDB_OK);
    ASSERT_EQ(ckptdb_commit(db, 7, 0), CKPTDB_OK);
    ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);
  }
  void TearDown() override {
    if (db_) ckptdb_close(db_);
  }
  void Open() { ASSERT_EQ(ckptdb_open(&o_, &db_), CKPTDB_OK) << ckptdb_last_error(); }
  std::string Seg(const std::string& dir) { return dir + "/v00000000000000000007-r00000.seg"; }
  int Restore(std::vector<uint8_t>* out) {
    out->assign(kTensorBytes, 0xEE);
    return ckptdb_restore(db_, 7, "w", out->data(), out->size(), 0);
  }
  std::string LastRestoreTier() {
    ckptdb_stats_t st;
    EXPECT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
    return st.last_restore_tier;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, t1_, t2_, tiers_;
  ckptdb_options o_;
  std::vector<uint8_t> data_;
  ckptdb* db_ = nullptr;
};

TEST_F(CorruptionTest, FlippedByteOnFastTierFallsBackToSlowTier) {
  test::FlipByte(Seg(t1_), PayloadOffset(1) + 123);
  Open();
  std::vector<uint8_t> out;
  ASSERT_EQ(Restore(&out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, data_);
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.checksum_failures, 1u);
  EXPECT_EQ(st.tiers[1].bytes_read, kChunkBytes) << "only the bad chunk is read from disk";
  EXPECT_EQ(st.tiers[0].bytes_read, kTensorBytes - kChunkBytes)
      << "bytes_read counts verified bytes: not the chunk that failed";
}

TEST_F(CorruptionTest, FlippedByteOnEveryTierIsCorruptAndZeroedNeverWrong) {
  test::FlipByte(Seg(t1_), PayloadOffset(2) + 5);
  test::FlipByte(Seg(t2_), PayloadOffset(2) + 5);
  Open();
  std::vector<uint8_t> out;
  ASSERT_EQ(Restore(&out), CKPTDB_ECORRUPT);
  std::string msg = ckptdb_last_error();
  EXPECT_NE(msg.find("chunk 2 at offset " + std::to_string(PayloadOffset(2) - kBlock)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("fails xxh3 (expected 0x"), std::string::npos) << msg;
  // Chunks 0, 1 and 3 are right; chunk 2 is zeroed.
  for (size_t i = 0; i < out.size(); ++i) {
    bool in_chunk2 = i >= 2 * kChunkBytes && i < 3 * kChunkBytes;
    ASSERT_EQ(out[i], in_chunk2 ? 0 : data_[i]) << "byte " << i;
  }
}

TEST_F(CorruptionTest, VerifyNamesTierSegmentChunkOffsetAndChecksums) {
  uint64_t record = PayloadOffset(3) - kBlock;
  test::FlipByte(Seg(t2_), PayloadOffset(3) + 999);
  Open();
  Events ev;
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, CKPTDB_ALL_VERSIONS, nullptr, Collect, &ev, &rep), CKPTDB_ECORRUPT);
  ASSERT_EQ(ev.problems.size(), 1u);
  EXPECT_EQ(rep.problems, 1u);
  EXPECT_EQ(rep.segments_checked, 2u);
  const ckptdb_verify_event& p = ev.problems[0];
  EXPECT_EQ(ev.tiers[0], "disk:" + t2_);
  EXPECT_EQ(p.chunk_index, 3);
  EXPECT_EQ(p.file_offset, record);
  EXPECT_NE(p.expected_xxh3, p.actual_xxh3);
  EXPECT_NE(ev.messages[0].find(Seg(t2_)), std::string::npos) << ev.messages[0];
  EXPECT_NE(ev.messages[0].find("chunk 3 at offset " + std::to_string(record)), std::string::npos);
  // Restricting verify to the clean tier finds nothing.
  EXPECT_EQ(ckptdb_verify(db_, 7, ("tmpfs:" + t1_).c_str(), nullptr, nullptr, nullptr), CKPTDB_OK);
  EXPECT_EQ(ckptdb_verify(db_, 7, "disk:/nowhere", nullptr, nullptr, nullptr), CKPTDB_ENOTFOUND);
}

TEST_F(CorruptionTest, TruncatedSegmentIsReportedAndBypassed) {
  std::filesystem::resize_file(Seg(t1_), PayloadOffset(2));
  Open();
  std::vector<uint8_t> out;
  ASSERT_EQ(Restore(&out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, data_);
  EXPECT_EQ(LastRestoreTier(), "disk:" + t2_);
  Events ev;
  EXPECT_EQ(ckptdb_verify(db_, 7, nullptr, Collect, &ev, nullptr), CKPTDB_ECORRUPT);
  ASSERT_FALSE(ev.messages.empty());
  EXPECT_NE(ev.messages[0].find("bytes, the catalog recorded"), std::string::npos)
      << ev.messages[0];
  // Both copies truncated: a clear error, never partial data as if whole.
  ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK);
  db_ = nullptr;
  std::filesystem::resize_file(Seg(t2_), PayloadOffset(2));
  Open();
  EXPECT_EQ(Restore(&out), CKPTDB_ECORRUPT);
  EXPECT_NE(std::string(ckptdb_last_error()).find("no tier has a readable segment"),
            std::string::npos)
      << ckptdb_last_error();
}

TEST_F(CorruptionTest, RandomBytesInPlaceOfASegmentGiveClearErrors) {
  auto junk = RandomBytes(std::filesystem::file_size(Seg(t1_)), 99);
  test::WriteWholeFile(Seg(t1_), std::string(junk.begin(), junk.end()));
  test::WriteWholeFile(Seg(t2_), std::string(junk.begin(), junk.end()));
  Open();
  std::vector<uint8_t> out;
  EXPECT_EQ(Restore(&out), CKPTDB_ECORRUPT);
  EXPECT_NE(std::string(ckptdb_last_error()).find("not a ckptdb segment"), std::string::npos)
      << ckptdb_last_error();
  Events ev;
  EXPECT_EQ(ckptdb_verify(db_, 7, nullptr, Collect, &ev, nullptr), CKPTDB_ECORRUPT);
  EXPECT_GE(ev.problems.size(), 2u);
  EXPECT_EQ(ckptdb_list(
                db_, 7, [](void*, const ckptdb_tensor_desc*) { return 0; }, nullptr),
            CKPTDB_ECORRUPT);
}

TEST_F(CorruptionTest, DamagedManifestFallsBackAndVerifyStillScansChunks) {
  // The manifest record follows the last chunk record; flip a byte in its payload.
  uint64_t manifest_payload = PayloadOffset(3) + ((1000 + kBlock - 1) / kBlock) * kBlock + kBlock;
  test::FlipByte(Seg(t1_), manifest_payload + 8);
  Open();
  std::vector<uint8_t> out;
  ASSERT_EQ(Restore(&out), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(out, data_);
  EXPECT_EQ(LastRestoreTier(), "disk:" + t2_);
  Events ev;
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, 7, ("tmpfs:" + t1_).c_str(), Collect, &ev, &rep), CKPTDB_ECORRUPT);
  ASSERT_FALSE(ev.messages.empty());
  EXPECT_NE(ev.messages[0].find("manifest"), std::string::npos) << ev.messages[0];
  // Framing alone still walks every chunk record.
  EXPECT_EQ(rep.chunks_checked, 4u);
}

}  // namespace
}  // namespace ckpt
