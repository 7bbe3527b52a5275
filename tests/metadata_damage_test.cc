// Damaged store metadata (issue 20): the four ways a new user and an adversary lost good
// checkpoints on the landed tree, each a regression test, and the commit witness's format.
//   1. a flipped byte in the catalog's newest log rolled the store back and deleted the newer
//      segments; a truncated log lost the newest version the same way;
//   2. a deleted catalog/CURRENT made a failed open write a new catalog, and the next open
//      discard the old one;
//   3. (tests/full_disk_test.cc: a full file system aborted the process)
//   4. (tests/ram_tier_test.cc: one flipped bit in the arena header lost every ram copy)
//   5. a damaged store made the tools exit 2 ("bad usage") instead of 1.
// Every failed open must leave every byte as it was (LOCK aside), name the damaged file, and
// `ckptdb repair` must bring every committed version back.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "format/checksum.h"
#include "format/commit_witness.h"
#include "format/segment_format.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<uint8_t> Data(uint64_t version) { return test::RandomBytes(30000, version * 4241); }

std::map<std::string, std::string> Tree(const std::string& dir) {
  std::map<std::string, std::string> t;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != "LOCK") {
      t[e.path().string()] = test::ReadWholeFile(e.path().string());
    }
  }
  return t;
}

class MetadataDamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.Sub("root");
    tiers_ = "disk:" + dir_.Sub("disk");
    ckptdb_options_init(&o_);
    o_.root = root_.c_str();
    o_.tiers = tiers_.c_str();
    o_.chunk_bytes = 16 << 10;
    o_.staging_bytes = 256 << 10;
    // Three versions, one open each, as three `ckptdb import`s make them: the newest log holds
    // version 3's records, the tables the older ones.
    for (uint64_t v = 1; v <= 3; ++v) {
      ckptdb* db = nullptr;
      ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << ckptdb_last_error();
      std::vector<uint8_t> d = Data(v);
      ASSERT_EQ(ckptdb_put_shard(db, v, "w", d.data(), d.size(), nullptr, CKPTDB_PUT_COPY_NOW),
                CKPTDB_OK);
      ASSERT_EQ(ckptdb_commit(db, v, 0), CKPTDB_OK) << ckptdb_last_error();
      ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);
    }
  }

  std::string NewestLog() {
    std::string newest;
    for (const auto& e : fs::directory_iterator(root_ + "/catalog")) {
      const std::string p = e.path().string();
      if (p.ends_with(".log") && (newest.empty() || p > newest)) newest = p;
    }
    return newest;
  }

  // The open fails with ECORRUPT naming `named`, twice, and nothing changes.
  void ExpectRefusedUnchanged(const std::string& named) {
    auto before = Tree(dir_.path());
    for (int attempt = 0; attempt < 2; ++attempt) {
      ckptdb* db = nullptr;
      ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_ECORRUPT) << "attempt " << attempt;
      const std::string message = ckptdb_last_error();
      EXPECT_NE(message.find(named), std::string::npos) << message;
      EXPECT_NE(message.find("ckptdb repair"), std::string::npos) << message;
    }
    ckptdb_options ro = o_;
    ro.read_only = 1;
    ro.tiers = nullptr;
    ckptdb* db = nullptr;
    EXPECT_EQ(ckptdb_open(&ro, &db), CKPTDB_ECORRUPT);
    EXPECT_EQ(Tree(dir_.path()), before) << "a failed open changed files";
    for (uint64_t v = 1; v <= 3; ++v) {
      EXPECT_TRUE(fs::exists(dir_.Sub("disk") + "/" + SegName(v))) << v;
    }
  }

  // ckptdb repair brings every version back, whole.
  void ExpectRepaired() {
    ckptdb_repair_report report{};
    std::vector<std::string> lines;
    ASSERT_EQ(ckptdb_repair(
                  &o_,
                  [](void* arg, const char* line) {
                    static_cast<std::vector<std::string>*>(arg)->push_back(line);
                  },
                  &lines, &report),
              CKPTDB_OK)
        << ckptdb_last_error();
    EXPECT_EQ(report.catalog_rebuilt, 1);
    EXPECT_EQ(report.versions_recovered, 3u);
    EXPECT_EQ(report.versions_lost, 0u);
    ckptdb* db = nullptr;
    ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << ckptdb_last_error();
    uint64_t latest = 0;
    EXPECT_EQ(ckptdb_latest(db, &latest), CKPTDB_OK);
    EXPECT_EQ(latest, 3u);
    for (uint64_t v = 1; v <= 3; ++v) {
      std::vector<uint8_t> want = Data(v), got(want.size());
      EXPECT_EQ(ckptdb_restore(db, v, "w", got.data(), got.size(), 0), CKPTDB_OK)
          << ckptdb_last_error();
      EXPECT_EQ(got, want) << "version " << v;
    }
    EXPECT_EQ(ckptdb_verify(db, CKPTDB_ALL_VERSIONS, nullptr, nullptr, nullptr, nullptr),
              CKPTDB_OK);
    ckptdb_close(db);
  }

  static std::string SegName(uint64_t v) {
    char b[64];
    std::snprintf(b, sizeof b, "v%020llu-r00000.seg", static_cast<unsigned long long>(v));
    return b;
  }

  int Cli(const std::string& args, std::string* out = nullptr) {
    std::string output;
    int rc = test::RunCommand(std::string(CKPTDB_CLI) + " " + args, &output);
    if (out != nullptr) *out = output;
    return rc;
  }

  TempDir dir_{"/var/tmp"};
  std::string root_, tiers_;
  ckptdb_options o_;
};

TEST_F(MetadataDamageTest, AFlippedByteInTheNewestLogFailsTheOpenAndDeletesNothing) {
  const std::string log = NewestLog();
  ASSERT_FALSE(log.empty());
  ASSERT_GT(fs::file_size(log), 100u);
  test::FlipByte(log, 20);  // inside the first record: later writes follow it
  ExpectRefusedUnchanged(fs::path(log).filename().string());
  ExpectRepaired();
}

TEST_F(MetadataDamageTest, ATruncatedLogIsCaughtByTheCommitWitness) {
  const std::string log = NewestLog();
  fs::resize_file(log, fs::file_size(log) / 2);
  ExpectRefusedUnchanged("commit witness");
  ExpectRepaired();
}

TEST_F(MetadataDamageTest, AMissingCurrentNeverStartsANewCatalog) {
  fs::remove(root_ + "/catalog/CURRENT");
  ExpectRefusedUnchanged("CURRENT");
  ExpectRepaired();
}

TEST_F(MetadataDamageTest, AMissingCatalogWithWitnessesIsNotANewStore) {
  fs::remove_all(root_ + "/catalog");
  ExpectRefusedUnchanged("commit witnesses");
  ExpectRepaired();
}

TEST_F(MetadataDamageTest, ADamagedWitnessOfACommittedVersionIsReportedAndRewritten) {
  const std::string witness = root_ + "/commits/" + format::WitnessFileName(2, 0);
  test::FlipByte(witness, 30);
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << "the catalog is whole: the witness is redundant";
  ckptdb_close(db);
  std::string out;
  EXPECT_EQ(Cli("verify " + root_, &out), 1) << out;
  EXPECT_NE(out.find(witness), std::string::npos) << out;
  ckptdb_repair_report report{};
  ASSERT_EQ(ckptdb_repair(&o_, nullptr, nullptr, &report), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(report.catalog_rebuilt, 0);
  EXPECT_EQ(report.witnesses_written, 1u);
  EXPECT_EQ(Cli("verify " + root_, &out), 0) << out;
}

TEST_F(MetadataDamageTest, ADamagedStoreExitsOneAndBadUsageTwo) {
  test::FlipByte(NewestLog(), 20);
  std::string out;
  EXPECT_EQ(Cli("inspect " + root_, &out), 1) << out;
  EXPECT_NE(out.find("ckptdb repair"), std::string::npos) << out;
  EXPECT_EQ(Cli("verify " + root_, &out), 1) << out;
  EXPECT_EQ(Cli("restore " + root_ + " --out " + dir_.Sub("out"), &out), 1) << out;
  EXPECT_EQ(Cli("export " + root_ + " --out " + dir_.Sub("x.safetensors"), &out), 1) << out;
  EXPECT_EQ(Cli("inspect " + dir_.Sub("nowhere"), &out), 2) << out;
  EXPECT_EQ(Cli("verify " + root_ + " --version banana", &out), 2) << out;
  EXPECT_EQ(Cli("repair", &out), 2) << out;
  EXPECT_EQ(Cli("repair " + root_, &out), 0) << out;
  EXPECT_NE(out.find("version 3: recovered"), std::string::npos) << out;
  EXPECT_EQ(Cli("verify " + root_, &out), 0) << out;
}

TEST_F(MetadataDamageTest, RepairSaysWhatItCouldNotRecoverAndDeletesNothing) {
  // Version 3's only copy is damaged beyond its manifest, and the catalog is lost: repair keeps
  // versions 1 and 2, names version 3, and keeps the damaged file.
  const std::string seg3 = dir_.Sub("disk") + "/" + SegName(3);
  fs::resize_file(seg3, 4096);
  fs::remove_all(root_ + "/catalog");
  std::string out;
  EXPECT_EQ(Cli("repair " + root_, &out), 1) << out;
  EXPECT_NE(out.find("version 3: NOT recovered"), std::string::npos) << out;
  EXPECT_NE(out.find("version 2: recovered"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(seg3) || fs::exists(seg3 + ".orphan")) << "repair deleted a file";
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK) << ckptdb_last_error();
  uint64_t latest = 0;
  EXPECT_EQ(ckptdb_latest(db, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, 2u);
  ckptdb_close(db);
}

TEST_F(MetadataDamageTest, RepairRefusesWhileTheStoreIsOpen) {
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o_, &db), CKPTDB_OK);
  EXPECT_EQ(ckptdb_repair(&o_, nullptr, nullptr, nullptr), CKPTDB_EBUSY);
  ckptdb_close(db);
}

// ---- The commit witness's format (docs/format.md, "The commit witness") ----------------------

format::CommitWitness GoldenWitness() {
  format::CommitWitness w;
  w.rank = 3;
  w.job_id = 0x0123456789abcdefull;
  w.version = 42;
  w.world_size = 8;
  w.chunk_bytes = 4 << 20;
  w.data_bytes = 123456789;
  w.manifest_xxh3 = 0xfedcba9876543210ull;
  w.tensor_count = 17;
  w.chunk_count = 40;
  w.created_unix_ns = 1795000000000000000ull;
  w.committed_unix_ns = 1795000000500000000ull;
  w.store_created_unix_ns = 1794000000000000000ull;
  w.tiers = "ram:8G,keep=2;disk:/nvme/ck,keep=3";
  return w;
}

std::string WitnessGoldenPath() {
  return std::string(CKPTDB_TEST_DATA_DIR) + "/golden-witness-v1.commit";
}

TEST(CommitWitness, DISABLED_Regenerate) {
  std::vector<uint8_t> bytes = format::EncodeCommitWitness(GoldenWitness());
  test::WriteWholeFile(WitnessGoldenPath(), std::string(bytes.begin(), bytes.end()));
}

TEST(CommitWitness, GoldenFileIsTheFormat) {
  const std::string raw = test::ReadWholeFile(WitnessGoldenPath());
  ASSERT_EQ(raw.size(), 96u + 34u + 8u);
  std::vector<uint8_t> bytes = format::EncodeCommitWitness(GoldenWitness());
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), raw) << "the encoder changed the format";
  EXPECT_EQ(raw.compare(0, 8, "CKPTWIT1"), 0);
  format::CommitWitness w;
  ASSERT_TRUE(
      format::DecodeCommitWitness(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()),
          "golden", &w)
          .ok());
  EXPECT_EQ(w.version, 42u);
  EXPECT_EQ(w.rank, 3u);
  EXPECT_EQ(w.world_size, 8u);
  EXPECT_EQ(w.manifest_xxh3, 0xfedcba9876543210ull);
  EXPECT_EQ(w.tiers, "ram:8G,keep=2;disk:/nvme/ck,keep=3");
}

TEST(CommitWitness, EveryDamageIsRefused) {
  const std::vector<uint8_t> good = format::EncodeCommitWitness(GoldenWitness());
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= mask;
      format::CommitWitness w;
      Status st = format::DecodeCommitWitness(bad, "bad", &w);
      EXPECT_FALSE(st.ok()) << "byte " << i;
      EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "byte " << i << ": " << st.ToString();
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    format::CommitWitness w;
    EXPECT_FALSE(format::DecodeCommitWitness(std::span(good.data(), n), "short", &w).ok()) << n;
  }
}

// The job's decision record (docs/format.md section 17): every field read back, every flipped
// bit and every truncation refused, the name's form exact.
TEST(DecisionRecord, EveryFieldRoundTripsAndEveryDamageIsRefused) {
  format::JobDecision d;
  d.job_id = 0x0123456789abcdefULL;
  d.version = 42;
  d.world_size = 8;
  d.decided_unix_ns = 1795752493126020121ULL;
  const std::vector<uint8_t> good = format::EncodeJobDecision(d);
  ASSERT_EQ(good.size(), format::kDecisionBytes);
  EXPECT_EQ(std::string(good.begin(), good.begin() + 8), "CKPTDEC1");
  format::JobDecision back;
  ASSERT_TRUE(format::DecodeJobDecision(good, "good", &back).ok());
  EXPECT_EQ(back.job_id, d.job_id);
  EXPECT_EQ(back.version, d.version);
  EXPECT_EQ(back.world_size, d.world_size);
  EXPECT_EQ(back.decided_unix_ns, d.decided_unix_ns);
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= mask;
      Status st = format::DecodeJobDecision(bad, "bad", &back);
      EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "byte " << i << ": " << st.ToString();
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(format::DecodeJobDecision(std::span(good.data(), n), "short", &back).ok()) << n;
  }
  uint64_t v = 0;
  EXPECT_EQ(format::DecisionFileName(3), "v00000000000000000003.decision");
  EXPECT_TRUE(format::ParseDecisionFileName("v18446744073709551615.decision", &v));
  EXPECT_EQ(v, UINT64_MAX);
  EXPECT_FALSE(format::ParseDecisionFileName("v18446744073709551616.decision", &v));
  EXPECT_FALSE(format::ParseDecisionFileName("v00000000000000000003.decision.tmp", &v));
  EXPECT_FALSE(format::ParseDecisionFileName("v0000000000000000000x.decision", &v));
}

TEST(CommitWitness, FileNames) {
  uint64_t v = 0;
  uint32_t r = 0;
  EXPECT_EQ(format::WitnessFileName(3, 7), "v00000000000000000003-r00007.commit");
  EXPECT_TRUE(format::ParseWitnessFileName("v18446744073709551615-r65535.commit", &v, &r));
  EXPECT_EQ(v, UINT64_MAX);
  EXPECT_EQ(r, 65535u);
  EXPECT_FALSE(format::ParseWitnessFileName("v18446744073709551616-r00000.commit", &v, &r));
  EXPECT_FALSE(format::ParseWitnessFileName("v00000000000000000003-r00007.commit.tmp", &v, &r));
  EXPECT_FALSE(format::ParseWitnessFileName("v00000000000000000003-r00007.commix", &v, &r));
  EXPECT_FALSE(format::ParseWitnessFileName("v0000000000000000000x-r00007.commit", &v, &r));
}

}  // namespace
}  // namespace ckpt
