// Issue 40's findings, each as the adversary ran it through the ckptdb command: an import without
// --tiers keeps the store's tiers (and one that leaves out a tier holding committed copies is
// refused unless told), repair rebuilds an arena header whose two copies are both damaged, a
// forged commit witness never becomes a committed version, inspect --json escapes what the text
// output escapes, the exit codes of docs/cli.md, and a close that waits for a put in flight.
// The campaign over the same ground is tests/trust_campaign_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/catalog.h"
#include "format/commit_witness.h"
#include "format/ram_format.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::RandomBytes;
using test::TempDir;

struct Result {
  int code = -1;
  std::string output;
};

Result Cli(const std::string& args) {
  Result r;
  r.code = test::RunCommand(std::string(CKPTDB_CLI) + " " + args, &r.output);
  return r;
}

std::vector<uint8_t> Data(uint64_t version) {
  return RandomBytes(150000 + version, version * 7919);
}

// A safetensors file holding one U8 tensor "w" with `data`.
std::string WriteSafetensors(const std::string& path, const std::vector<uint8_t>& data) {
  std::string header = "{\"w\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(data.size()) +
                       "],\"data_offsets\":[0," + std::to_string(data.size()) + "]}}";
  while (header.size() % 8 != 0) header += ' ';
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size());
  test::WriteWholeFile(path, bytes);
  return path;
}

std::string ArenaFile(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".ram") return e.path().string();
  }
  return "";
}

class TrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = mem_.Sub("R");
    ram_dir_ = mem_.Sub("D");
    disk_dir_ = disk_.Sub("R-disk");
  }

  // Versions first..last committed through ckptdb import, each "w" = Data(v).
  void Import(uint64_t first, uint64_t last, const std::string& tiers) {
    for (uint64_t v = first; v <= last; ++v) {
      const std::string file = WriteSafetensors(mem_.Sub("m" + std::to_string(v)), Data(v));
      Result r = Cli("import " + file + " --root " + root_ + " --version " + std::to_string(v) +
                     (tiers.empty() ? "" : " --tiers '" + tiers + "'"));
      ASSERT_EQ(r.code, 0) << r.output;
    }
  }

  // Every version in `versions` restores bit for bit through a read-only handle; the tier the
  // last came from.
  ckptdb* OpenReadOnly() {
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root_.c_str();
    o.read_only = 1;
    o.create_if_missing = 0;
    ckptdb* db = nullptr;
    EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
    return db;
  }

  std::string RestoreEach(const std::vector<uint64_t>& versions) {
    ckptdb* db = OpenReadOnly();
    if (db == nullptr) return "";
    for (uint64_t v : versions) {
      std::vector<uint8_t> want = Data(v);
      std::vector<uint8_t> got(want.size(), 0xEE);
      EXPECT_EQ(ckptdb_restore(db, v, "w", got.data(), got.size(), 0), CKPTDB_OK)
          << "version " << v << ": " << ckptdb_last_error();
      EXPECT_TRUE(got == want) << "version " << v << " restored wrong bytes";
    }
    ckptdb_stats_t stats{};
    EXPECT_EQ(ckptdb_stats(db, &stats), CKPTDB_OK);
    ckptdb_close(db);
    return stats.last_restore_tier;
  }

  std::vector<uint64_t> Committed() {
    ckptdb* db = OpenReadOnly();
    if (db == nullptr) return {};
    std::vector<uint64_t> out = test::CommittedVersions(db);
    ckptdb_close(db);
    return out;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, ram_dir_, disk_dir_;
};

// Finding 1: the repro of the issue, then a spec that leaves the ram tier out, without and with
// --drop-tiers.
TEST_F(TrustTest, ImportWithoutTiersKeepsTheStoresTiersAndADroppedTierIsRefused) {
  const std::string tiers = "ram:64M,keep=3,dir=" + ram_dir_ + ";disk:" + disk_dir_ + ",keep=5";
  Import(1, 2, tiers);
  Import(3, 3, "");  // no --tiers: the store's own
  Result r = Cli("verify " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  r = Cli("inspect " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("not configured"), std::string::npos) << r.output;
  EXPECT_EQ(RestoreEach({1, 2, 3}), "ram");
  r = Cli("gc " + ram_dir_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1 found, 0 orphan(s)"), std::string::npos) << r.output;

  // Leaving the ram tier out is refused, naming it and the versions; nothing changes.
  const std::string arena = ArenaFile(ram_dir_);
  ASSERT_FALSE(arena.empty());
  const std::string file = WriteSafetensors(mem_.Sub("m4"), Data(4));
  const std::string without_ram = "disk:" + disk_dir_ + ",keep=5";
  r = Cli("import " + file + " --root " + root_ + " --version 4 --tiers '" + without_ram + "'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("leaves out tier ram"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("version(s) 1, 2, 3"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(arena));
  EXPECT_EQ(Committed(), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(Cli("verify " + root_).code, 0);

  // Told to, the ram copies are released (the arena goes with them) and the disk copies serve.
  r = Cli("import " + file + " --root " + root_ + " --version 4 --tiers '" + without_ram +
          "' --drop-tiers");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(arena)) << "the released arena is left for gc to find";
  r = Cli("verify " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(RestoreEach({1, 2, 3, 4}), "disk:" + disk_dir_);
  r = Cli("inspect " + root_);
  EXPECT_EQ(r.output.find("not configured"), std::string::npos) << r.output;
}

// A tier that holds some version's only copy is never left out, even when told to.
TEST_F(TrustTest, ATierHoldingAVersionsOnlyCopyIsNeverDropped) {
  Import(1, 2, "ram:64M,keep=3,dir=" + ram_dir_);
  const std::string file = WriteSafetensors(mem_.Sub("m3"), Data(3));
  Result r = Cli("import " + file + " --root " + root_ + " --version 3 --tiers 'disk:" + disk_dir_ +
                 "' --drop-tiers");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("which holds the only copy of committed version(s) 1, 2"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(ArenaFile(ram_dir_).empty());
  EXPECT_EQ(RestoreEach({1, 2}), "ram");
}

// Finding 2: a ram-only store whose two arena header copies each lost one bit.
TEST_F(TrustTest, RepairRebuildsAnArenaHeaderFromItsCopiesIndexes) {
  for (bool with_disk : {false, true}) {
    SCOPED_TRACE(with_disk ? "ram and disk" : "ram only");
    fs::remove_all(root_);
    fs::remove_all(ram_dir_);
    fs::remove_all(disk_dir_);
    Import(1, 3, "ram:64M,keep=3,dir=" + ram_dir_ + (with_disk ? ";disk:" + disk_dir_ : ""));
    const std::string arena = ArenaFile(ram_dir_);
    ASSERT_FALSE(arena.empty());
    test::FlipByte(arena, 20, 1u << 4);
    test::FlipByte(arena, 8212, 1u << 4);
    Result r = Cli("inspect " + root_);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("both header copies are damaged"), std::string::npos) << r.output;
    r = Cli("repair " + root_);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("header was rebuilt from its copies' indexes"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("3 committed version(s) recovered, 0 lost"), std::string::npos)
        << r.output;
    EXPECT_EQ(ArenaFile(ram_dir_), arena) << "the arena was moved aside";
    r = Cli("verify " + root_);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(RestoreEach({1, 2, 3}), "ram");
    EXPECT_EQ(Cli("inspect " + root_).code, 0);
  }
}

// Finding 3: v3's witness copied to a v9 name, its version rewritten and its xxh3 recomputed.
TEST_F(TrustTest, AForgedWitnessIsMovedAsideAndNeverRecordedCommitted) {
  Import(1, 3, "disk:" + disk_dir_);
  const std::string commits = root_ + "/commits/";
  const std::string v3 = test::ReadWholeFile(commits + format::WitnessFileName(3, 0));
  format::CommitWitness w;
  ASSERT_TRUE(format::DecodeCommitWitness(
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v3.data()), v3.size()),
                  "v3", &w)
                  .ok());
  w.version = 9;
  const std::vector<uint8_t> forged = format::EncodeCommitWitness(w);
  const std::string v9 = commits + format::WitnessFileName(9, 0);
  test::WriteWholeFile(v9, std::string(forged.begin(), forged.end()));

  Result r = Cli("inspect " + root_);
  EXPECT_EQ(r.code, 1) << r.output;
  r = Cli("repair " + root_);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("version 9: NOT recovered"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("could not be recovered (no copy verifies): 9"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(v9));
  EXPECT_TRUE(fs::exists(v9 + ".damaged"));
  EXPECT_EQ(Committed(), (std::vector<uint64_t>{1, 2, 3}));
  r = Cli("verify " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(Cli("inspect " + root_).code, 0);
  RestoreEach({1, 2, 3});
  Import(4, 4, "");  // version 9 blocks nothing
  EXPECT_EQ(Committed(), (std::vector<uint64_t>{1, 2, 3, 4}));
  // A second repair finds nothing to do.
  r = Cli("repair " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("catalog intact"), std::string::npos) << r.output;
}

// Verify reports a committed version that no copy backs, and repair mends the catalog in place:
// first the catalog forgets version 1's copy while its file is still there (repair records it
// again), then the file goes too (repair names version 1 lost and drops it).
TEST_F(TrustTest, VerifyReportsACommittedVersionWithoutACopyAndRepairMendsTheCatalog) {
  const std::string tier = "disk:" + disk_dir_;
  Import(1, 2, tier);
  auto forget = [&] {
    std::unique_ptr<engine::Catalog> catalog;
    ASSERT_TRUE(engine::Catalog::Open(root_ + "/catalog", false, false, &catalog).ok());
    engine::CatalogBatch batch;
    batch.delete_residency.emplace_back(1, tier);
    ASSERT_TRUE(catalog->Apply(batch, true).ok());
  };
  forget();
  Result r = Cli("verify " + root_);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("records no copy of it on any tier"), std::string::npos) << r.output;
  r = Cli("repair " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("verifies and is recorded again"), std::string::npos) << r.output;
  r = Cli("verify " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  RestoreEach({1, 2});

  forget();
  for (const auto& e : fs::directory_iterator(disk_dir_)) {
    if (e.path().string().find("v00000000000000000001") != std::string::npos) fs::remove(e.path());
  }
  EXPECT_EQ(Cli("verify " + root_).code, 1);
  r = Cli("repair " + root_);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("version 1: NOT recovered"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("catalog intact"), std::string::npos) << "rebuilt, not mended";
  EXPECT_EQ(Committed(), (std::vector<uint64_t>{2}));
  r = Cli("verify " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(root_ + "/commits/" + format::WitnessFileName(1, 0) + ".damaged"));
}

// Repair drops nothing it could not look at: a copy the catalog records on a tier the spec
// leaves out (the damage an import without --tiers did before issue 40) makes it refuse, naming
// the tier, with nothing changed; given that tier, it finds the copy.
TEST_F(TrustTest, RepairRefusesToDropAVersionWhoseCopyIsOnATierTheSpecLeavesOut) {
  const std::string tier = "disk:" + disk_dir_;
  Import(1, 2, tier);
  const std::string other = "disk:" + mem_.Sub("other");
  Result r = Cli("repair " + root_ + " --tiers '" + other + "'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("which they leave out"), std::string::npos) << r.output;
  EXPECT_EQ(Committed(), (std::vector<uint64_t>{1, 2}));
  r = Cli("repair " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  RestoreEach({1, 2});
}

// Finding 4: the JSON output escapes DEL, C1 controls, bidi and invisible characters, and a
// JSON reader gets the names back exactly.
TEST_F(TrustTest, InspectJsonEscapesWhatATerminalWouldHideOrReorder) {
  const std::vector<std::string> names = {
      "del\x7f"
      "x",
      "csi\xc2\x9b"
      "31m",
      "rlo\xe2\x80\xae"
      "gnp",
      "zw\xe2\x80\x8bsp",
      "\xef\xbb\xbf"
      "bom",
      "ls\xe2\x80\xa8"
      "x",
      "plain \xc3\xbc"};
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root_.c_str();
  const std::string tiers = "disk:" + disk_dir_;
  o.tiers = tiers.c_str();
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
  std::vector<uint8_t> data(64, 7);
  for (const std::string& n : names) {
    ASSERT_EQ(
        ckptdb_put_shard(db, 1, n.c_str(), data.data(), data.size(), nullptr, CKPTDB_PUT_COPY_NOW),
        CKPTDB_OK)
        << ckptdb_last_error();
  }
  ASSERT_EQ(ckptdb_commit(db, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  ckptdb_close(db);
  Result r = Cli("inspect --json " + root_ + " 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* raw :
       {"\x7f", "\xc2\x9b", "\xe2\x80\xae", "\xe2\x80\x8b", "\xef\xbb\xbf", "\xe2\x80\xa8"}) {
    EXPECT_EQ(r.output.find(raw), std::string::npos) << "raw bytes in: " << r.output;
  }
  EXPECT_NE(r.output.find("\\u202e"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plain \xc3\xbc"), std::string::npos) << "readable text escaped";
  nlohmann::json doc = nlohmann::json::parse(r.output);
  std::vector<std::string> got;
  for (const auto& t : doc["versions"][0]["tensors"]) got.push_back(t["name"]);
  std::vector<std::string> want = names;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
}

// The exit codes of docs/cli.md for damaged witness paths: a `commits` that is a file, a witness
// that is a directory.
TEST_F(TrustTest, DamagedWitnessPathsExitOneAndRepairMendsWhatItCan) {
  Import(1, 2, "disk:" + disk_dir_);
  const std::string commits = root_ + "/commits";
  const std::string v2 = commits + "/" + format::WitnessFileName(2, 0);
  fs::remove(v2);
  fs::create_directory(v2);
  for (const char* cmd : {"inspect ", "verify "}) {
    Result r = Cli(cmd + root_);
    EXPECT_EQ(r.code, 1) << cmd << r.output;
  }
  Result r = Cli("repair " + root_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::is_directory(v2 + ".damaged"));
  EXPECT_TRUE(fs::is_regular_file(v2)) << "the witness was not written again";
  EXPECT_EQ(Cli("verify " + root_).code, 0);
  EXPECT_EQ(Cli("inspect " + root_).code, 0);

  fs::rename(commits, commits + ".aside");
  test::WriteWholeFile(commits, "not a directory");
  for (const char* cmd : {"inspect ", "verify ", "repair "}) {
    r = Cli(cmd + root_);
    EXPECT_EQ(r.code, 1) << cmd << r.output;
    EXPECT_NE(r.output.find("is not a directory"), std::string::npos) << cmd << r.output;
  }
  const std::string file = WriteSafetensors(mem_.Sub("m3"), Data(3));
  r = Cli("import " + file + " --root " + root_ + " --version 3");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(test::ReadWholeFile(commits), "not a directory");
}

// Open item: a handle closed by one thread while another thread's call runs inside it (a put
// whose caller released Python's GIL) is freed only once that call returns; a call that begins
// while the close waits is refused (ESTATE). The call here is a listing whose callback stays
// inside the handle until it has seen the close begin.
TEST_F(TrustTest, CloseWaitsForACallInsideTheHandle) {
  Import(1, 1, "disk:" + disk_dir_);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root_.c_str();
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
  struct Shared {
    ckptdb* db;
    std::atomic<bool> inside{false};
    std::atomic<bool> returned{false};
    int refused_with = CKPTDB_OK;
  } shared;
  shared.db = db;
  std::thread lister([&] {
    const int rc = ckptdb_list_versions(
        db,
        [](void* arg, const ckptdb_version_info*) {
          auto* s = static_cast<Shared*>(arg);
          s->inside = true;
          // Bounded: until a call is refused because the close began, 10 s at most.
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (std::chrono::steady_clock::now() < until) {
            ckptdb_stats_t stats{};
            const int rc = ckptdb_stats(s->db, &stats);
            if (rc != CKPTDB_OK) {
              s->refused_with = rc;
              break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          s->returned = true;
          return 0;
        },
        &shared);
    EXPECT_EQ(rc, CKPTDB_OK) << ckptdb_last_error();
  });
  while (!shared.inside) std::this_thread::yield();
  EXPECT_EQ(ckptdb_close(db), CKPTDB_OK);
  EXPECT_TRUE(shared.returned) << "the close returned while a call was inside the handle";
  lister.join();
  EXPECT_EQ(shared.refused_with, CKPTDB_ESTATE);
}

// Open item: an arena that names another store is replaced only by an open that succeeds; one
// that fails after the tiers were opened (here the disk tier's directory is a file) leaves it
// exactly as it was.
TEST_F(TrustTest, AnArenaIsReplacedOnlyByAnOpenThatSucceeds) {
  const std::string tiers = "ram:64M,dir=" + ram_dir_ + ";disk:" + disk_dir_;
  Import(1, 1, tiers);
  const std::string arena = ArenaFile(ram_dir_);
  ASSERT_FALSE(arena.empty());
  std::string bytes = test::ReadWholeFile(arena);
  for (uint64_t at : format::kArenaHeaderCopyOffsets) {
    format::ArenaHeader h;
    auto* p = reinterpret_cast<uint8_t*>(bytes.data()) + at;
    ASSERT_TRUE(
        format::DecodeArenaHeaderCopy(std::span<const uint8_t, format::kArenaHeaderCopyBytes>(
                                          p, format::kArenaHeaderCopyBytes),
                                      "copy", &h)
            .ok());
    h.job_id ^= 0x77;
    format::EncodeArenaHeaderCopy(
        h, std::span<uint8_t, format::kArenaHeaderCopyBytes>(p, format::kArenaHeaderCopyBytes));
  }
  test::WriteWholeFile(arena, bytes);
  fs::rename(disk_dir_, disk_dir_ + ".away");
  test::WriteWholeFile(disk_dir_, "a file where the disk tier's directory was");
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root_.c_str();
  ckptdb* db = nullptr;
  testing::internal::CaptureStderr();
  EXPECT_NE(ckptdb_open(&o, &db), CKPTDB_OK);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("belongs to another store"), std::string::npos) << said;
  EXPECT_TRUE(test::ReadWholeFile(arena) == bytes) << "the failed open replaced the arena";
  EXPECT_FALSE(fs::exists(arena + ".replaced"));
  fs::remove(disk_dir_);
  fs::rename(disk_dir_ + ".away", disk_dir_);
  testing::internal::CaptureStderr();
  ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
  testing::internal::GetCapturedStderr();
  ckptdb_close(db);
  EXPECT_FALSE(test::ReadWholeFile(arena) == bytes) << "the open did not replace the arena";
  EXPECT_FALSE(fs::exists(arena + ".replaced"));
  EXPECT_EQ(RestoreEach({1}), "disk:" + disk_dir_);
}

}  // namespace
}  // namespace ckpt
