// The trust campaign (issue 40; docs/testing.md, "Trust campaign"): what a command does to a
// store whose metadata lies or whose user changes its tiers. Three kinds of case, each from a
// pristine store of versions 2, 4 and 6:
//   - forged commit witnesses of versions that never existed (below, between and above the real
//     ones), of this rank, of another rank and of another job, made from a real witness with a
//     valid xxh3;
//   - both header copies of a ram-only store's arena damaged: the same bit of every byte of
//     both fixed headers, a bit of one field in copy A with one of another field in copy B, a
//     sample of both root path extensions, and copy B rewritten valid but disagreeing with A;
//   - tier specs that leave out, reorder, resize, add and move tiers, without and with
//     drop_tiers.
// The oracle after each case, whatever the command said: an open that fails says ECORRUPT or
// EINVAL and changed nothing but LOCK; after it and ckptdb repair, the store opens, its committed
// versions are exactly 2, 4 and 6, each restores bit for bit, verify is clean, no version without
// a copy is reported committed, a new version above 6 commits, and `ckptdb gc --remove` on the
// ram tier's directory takes nothing the store still needs. CKPTDB_CAMPAIGN_STRIDE (1 by default,
// 8 in the sanitizer builds) thins the header cases.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "format/commit_witness.h"
#include "format/ram_format.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::vector<uint64_t> kVersions = {2, 4, 6};
const char* const kNames[] = {"embed", "layer.0.w", "norm"};
constexpr size_t kTensorBytes[] = {9000, 40000, 300};

std::vector<uint8_t> Expected(uint64_t version, size_t tensor) {
  return test::RandomBytes(kTensorBytes[tensor], version * 1000003 + tensor * 7919);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint64_t kDefaultStride = 8;
#else
constexpr uint64_t kDefaultStride = 1;
#endif

using Tree = std::map<std::string, std::string>;

Tree Snapshot(const std::string& dir) { return test::SnapshotFiles(dir, /*without_lock=*/true); }

class TrustCampaign : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.Sub("root");
    ram_ = dir_.Sub("ram");
    tmpfs_ = dir_.Sub("tmpfs");
    disk_ = dir_.Sub("disk");
  }

  std::string Full() const { return "ram:2M,dir=" + ram_ + ";tmpfs:" + tmpfs_ + ";disk:" + disk_; }

  // Opens the store: read_only, or read-write with `tiers` (nullptr: the store's own).
  int Open(const char* tiers, bool read_only, bool drop_tiers, ckptdb** db) {
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root_.c_str();
    o.tiers = tiers;
    o.read_only = read_only ? 1 : 0;
    o.create_if_missing = read_only ? 0 : 1;
    o.drop_tiers = drop_tiers ? 1 : 0;
    o.chunk_bytes = 16 << 10;
    o.staging_bytes = 256 << 10;
    o.capture_threads = 1;
    *db = nullptr;
    return ckptdb_open(&o, db);
  }

  std::string Commit(ckptdb* db, uint64_t v) {
    std::vector<std::vector<uint8_t>> data;
    std::vector<ckptdb_shard> shards;
    for (size_t t = 0; t < std::size(kNames); ++t) data.push_back(Expected(v, t));
    for (size_t t = 0; t < std::size(kNames); ++t) {
      shards.push_back({kNames[t], data[t].data(), data[t].size(), nullptr, CKPTDB_PUT_COPY_NOW});
    }
    if (ckptdb_put_shards(db, v, shards.data(), shards.size()) != CKPTDB_OK ||
        ckptdb_commit(db, v, 0) != CKPTDB_OK) {
      return "commit of version " + std::to_string(v) + ": " + ckptdb_last_error();
    }
    return {};
  }

  // The pristine store: versions 2, 4, 6 on every tier of `tiers`.
  void Build(const std::string& tiers) {
    for (uint64_t v : kVersions) {
      ckptdb* db = nullptr;
      ASSERT_EQ(Open(tiers.c_str(), false, false, &db), CKPTDB_OK) << ckptdb_last_error();
      ASSERT_EQ(Commit(db, v), "");
      for (const char* t : {"tmpfs", "disk"}) {
        if (tiers.find(std::string(t) + ":") != std::string::npos) {
          ASSERT_EQ(ckptdb_wait_commit(db, v, t, -1), CKPTDB_OK) << ckptdb_last_error();
        }
      }
      ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);
    }
    pristine_ = Snapshot(dir_.path());
  }

  void RestorePristine() {
    for (const auto& e : fs::directory_iterator(dir_.path())) fs::remove_all(e.path());
    for (const auto& [path, bytes] : pristine_) {
      fs::create_directories(fs::path(path).parent_path());
      test::WriteWholeFile(path, bytes);
    }
  }

  std::string Arena() const {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ram_, ec)) {
      if (e.path().extension() == ".ram") return e.path().string();
    }
    return "";
  }

  // Every committed version restores whole; the committed versions are exactly kVersions.
  std::string RestoreAll(ckptdb* db, const char* step) {
    const std::vector<uint64_t> committed = test::CommittedVersions(db);
    if (committed != kVersions) {
      std::string list;
      for (uint64_t v : committed) list += " " + std::to_string(v);
      return std::string(step) + ": committed versions are" + list + ", not 2 4 6";
    }
    for (uint64_t v : kVersions) {
      for (size_t t = 0; t < std::size(kNames); ++t) {
        std::vector<uint8_t> want = Expected(v, t);
        std::vector<uint8_t> got(want.size(), 0xEE);
        const int rc = ckptdb_restore(db, v, kNames[t], got.data(), got.size(), 0);
        if (rc != CKPTDB_OK) {
          return std::string(step) + ": restore of version " + std::to_string(v) + " " + kNames[t] +
                 ": " + ckptdb_status_name(rc) + ": " + ckptdb_last_error();
        }
        if (got != want) {
          return std::string(step) + ": version " + std::to_string(v) + " restored WRONG BYTES";
        }
      }
    }
    return {};
  }

  std::string VerifyClean(const char* step) {
    ckptdb* db = nullptr;
    if (Open(nullptr, true, false, &db) != CKPTDB_OK) {
      return std::string(step) + ": read-only open: " + ckptdb_last_error();
    }
    uint64_t problems = 1;
    ckptdb_open_problems(db, nullptr, nullptr, &problems);
    ckptdb_verify_report report{};
    const int rc = ckptdb_verify(db, CKPTDB_ALL_VERSIONS, nullptr, nullptr, nullptr, &report);
    ckptdb_close(db);
    if (rc != CKPTDB_OK || problems != 0) {
      return std::string(step) + ": verify " + ckptdb_status_name(rc) + ", " +
             std::to_string(report.problems) + " problem(s), " + std::to_string(problems) +
             " noted at open";
    }
    return {};
  }

  // The oracle after a case's own steps: repair, then open, restore, verify, gc, a new version.
  // verify_clean false: verify may report copies that are gone (a lost arena's), nothing else
  // changes.
  std::string AfterRepair(bool ram_restores, bool verify_clean = true) {
    ckptdb_options ro;
    ckptdb_options_init(&ro);
    ro.root = root_.c_str();
    ckptdb_repair_report report{};
    const int repair_rc = ckptdb_repair(&ro, nullptr, nullptr, &report);
    if (repair_rc != CKPTDB_OK && repair_rc != CKPTDB_ECORRUPT) {
      return std::string("repair: ") + ckptdb_status_name(repair_rc) + ": " + ckptdb_last_error();
    }
    // gc may remove only what no store needs: every version must still restore after it.
    if (fs::exists(ram_) && ckptdb_gc(ram_.c_str(), 1, nullptr, nullptr) != CKPTDB_OK) {
      return std::string("gc: ") + ckptdb_last_error();
    }
    ckptdb* db = nullptr;
    if (int rc = Open(nullptr, false, false, &db); rc != CKPTDB_OK) {
      return std::string("open after repair: ") + ckptdb_status_name(rc) + ": " +
             ckptdb_last_error();
    }
    std::string why = RestoreAll(db, "after repair");
    ckptdb_stats_t stats{};
    if (why.empty() && ram_restores && ckptdb_stats(db, &stats) == CKPTDB_OK &&
        std::string(stats.last_restore_tier) != "ram") {
      why = std::string("after repair: restored from ") + stats.last_restore_tier + ", not ram";
    }
    ckptdb_close(db);
    if (!why.empty()) return why;
    if (verify_clean) {
      if (why = VerifyClean("after repair"); !why.empty()) return why;
    }
    if (int rc = Open(nullptr, false, false, &db); rc != CKPTDB_OK) {
      return std::string("reopen: ") + ckptdb_last_error();
    }
    why = Commit(db, 7);
    ckptdb_close(db);
    return why;
  }

  // An open that failed: with one of `codes`, and nothing but LOCK changed.
  // segments_only: the open may have recorded what it found (copies MISSING), but no segment
  // may be gone or changed.
  std::string FailedCleanly(int rc, const std::vector<int>& codes, const Tree& before,
                            bool segments_only = false) {
    if (std::find(codes.begin(), codes.end(), rc) == codes.end()) {
      return std::string("open failed with ") + ckptdb_status_name(rc) + ": " + ckptdb_last_error();
    }
    Tree after = Snapshot(dir_.path());
    for (const auto& [path, bytes] : before) {
      if (segments_only && !path.ends_with(".seg")) continue;
      auto it = after.find(path);
      if (it == after.end() || it->second != bytes) {
        return "the failed open changed " + path + ": " + ckptdb_last_error();
      }
    }
    if (!segments_only && after.size() != before.size()) {
      return std::string("the failed open made files: ") + ckptdb_last_error();
    }
    return {};
  }

  void Report(const char* kind, uint64_t cases, uint64_t failures,
              std::chrono::steady_clock::time_point start) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("trust campaign, %s: %llu cases in %.1f s, %llu failed\n", kind,
                static_cast<unsigned long long>(cases), seconds,
                static_cast<unsigned long long>(failures));
    EXPECT_GT(cases, 0u);
  }

  TempDir dir_{"/dev/shm"};
  std::string root_, ram_, tmpfs_, disk_;
  Tree pristine_;
};

TEST_F(TrustCampaign, ForgedWitnesses) {
  Build(Full());
  const auto start = std::chrono::steady_clock::now();
  uint64_t cases = 0, failures = 0;
  const std::string commits = root_ + "/commits/";
  for (uint64_t source : kVersions) {
    const std::string real = pristine_.at(commits + format::WitnessFileName(source, 0));
    format::CommitWitness w;
    ASSERT_TRUE(
        format::DecodeCommitWitness(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(real.data()), real.size()),
            "witness", &w)
            .ok());
    for (uint64_t forged :
         {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{5}, uint64_t{9}, uint64_t{1} << 40}) {
      for (int who = 0; who < 3; ++who) {  // this rank, rank 1, another job
        ++cases;
        RestorePristine();
        format::CommitWitness f = w;
        f.version = forged;
        if (who == 1) f.rank = 1;
        if (who == 2) f.job_id ^= 0x5a5a;
        const std::vector<uint8_t> bytes = format::EncodeCommitWitness(f);
        test::WriteWholeFile(commits + format::WitnessFileName(forged, f.rank),
                             std::string(bytes.begin(), bytes.end()));
        const Tree before = Snapshot(dir_.path());
        ckptdb* db = nullptr;
        const int rc = Open(Full().c_str(), false, false, &db);
        std::string why;
        if (rc == CKPTDB_OK) {
          why = RestoreAll(db, "open");
          ckptdb_close(db);
        } else {
          why = FailedCleanly(rc, {CKPTDB_ECORRUPT}, before);
        }
        if (why.empty()) why = AfterRepair(/*ram_restores=*/false);
        if (!why.empty()) {
          ++failures;
          ADD_FAILURE() << "witness of version " << forged << " (from " << source << ", "
                        << (who == 0   ? "this rank"
                            : who == 1 ? "rank 1"
                                       : "another job")
                        << "): " << why;
        }
      }
    }
  }
  Report("forged witnesses", cases, failures, start);
}

TEST_F(TrustCampaign, ArenaHeadersDamagedInBothCopies) {
  Build("ram:2M,keep=3,dir=" + ram_);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t stride = test::EnvCount("CKPTDB_CAMPAIGN_STRIDE", kDefaultStride);
  const uint64_t b = format::kArenaHeaderCopyOffsets[1];
  // (what, mutation of the arena's bytes)
  std::vector<std::pair<std::string, std::function<void(std::string&)>>> cases;
  for (uint64_t i = 0; i < format::kArenaHeaderBytes; i += 1) {
    cases.push_back({"byte " + std::to_string(i) + " of both copies", [i, b](std::string& s) {
                       s[i] ^= static_cast<char>(1u << (i % 8));
                       s[b + i] ^= static_cast<char>(1u << ((i + 3) % 8));
                     }});
  }
  const uint64_t fields[] = {0, 4, 8, 16, 24, 32, 40, 48, 56};  // one byte in each field
  for (uint64_t fa : fields) {
    for (uint64_t fb : fields) {
      if (fa == fb) continue;
      cases.push_back({"field at " + std::to_string(fa) + " of A, " + std::to_string(fb) + " of B",
                       [fa, fb, b](std::string& s) {
                         s[fa + 1] ^= 0x10;
                         s[b + fb + 2] ^= 0x02;
                       }});
    }
  }
  for (uint64_t k = 0; k < 16 + root_.size(); k += 5) {
    const uint64_t at = format::kArenaExtensionOffset + k;
    cases.push_back(
        {"extension byte " + std::to_string(k) + " of both copies", [at, b](std::string& s) {
           s[at] ^= 0x04;
           s[b + at] ^= 0x40;
         }});
  }
  // Copy B valid but disagreeing with A: another generation, another job, another capacity.
  for (int field = 0; field < 3; ++field) {
    cases.push_back(
        {"copy B valid and disagreeing (" + std::to_string(field) + ")",
         [field, b](std::string& s) {
           format::ArenaHeader h;
           std::span<const uint8_t, format::kArenaHeaderCopyBytes> in(
               reinterpret_cast<const uint8_t*>(s.data()) + b, format::kArenaHeaderCopyBytes);
           if (!format::DecodeArenaHeaderCopy(in, "B", &h).ok()) return;
           if (field == 0) h.generation ^= 1;
           if (field == 1) h.job_id ^= 1;
           if (field == 2) h.capacity_bytes += 4096;
           format::EncodeArenaHeaderCopy(
               h, std::span<uint8_t, format::kArenaHeaderCopyBytes>(
                      reinterpret_cast<uint8_t*>(s.data()) + b, format::kArenaHeaderCopyBytes));
         }});
  }
  uint64_t run = 0, failures = 0;
  const std::string arena_name = fs::path(Arena()).filename().string();
  ASSERT_FALSE(arena_name.empty());
  for (size_t c = 0; c < cases.size(); ++c) {
    if (c % stride != 0 && c + 3 < cases.size()) continue;  // the disagreeing ones always run
    ++run;
    RestorePristine();
    const std::string arena = ram_ + "/" + arena_name;
    std::string bytes = test::ReadWholeFile(arena);
    cases[c].second(bytes);
    test::WriteWholeFile(arena, bytes);
    const Tree before = Snapshot(dir_.path());
    ckptdb* db = nullptr;
    const int rc = Open(nullptr, false, false, &db);
    std::string why;
    if (rc == CKPTDB_OK) {
      why = "the read-write open went past an arena whose header copies both fail";
      ckptdb_close(db);
    } else {
      why = FailedCleanly(rc, {CKPTDB_ECORRUPT}, before);
    }
    if (why.empty()) why = AfterRepair(/*ram_restores=*/true);
    if (why.empty() && Arena() != arena) why = "the arena was moved aside";
    if (!why.empty()) {
      ++failures;
      ADD_FAILURE() << cases[c].first << ": " << why;
      if (failures >= 20) return;
    }
  }
  Report("arena headers", run, failures, start);
}

TEST_F(TrustCampaign, TierSpecs) {
  Build(Full());
  const auto start = std::chrono::steady_clock::now();
  const std::string ram = "ram:2M,dir=" + ram_;
  const std::string other_ram = "ram:2M,dir=" + dir_.Sub("ram2");
  const std::string tmpfs = "tmpfs:" + tmpfs_;
  const std::string disk = "disk:" + disk_;
  const std::string fresh = "disk:" + dir_.Sub("fresh");
  struct Case {
    std::string what, spec;
    bool leaves_out_copies;   // refused without drop_tiers
    bool only_copies;         // refused even with it
    bool lose_arena = false;  // the arena deleted first (a reboot): its copies are not there
  };
  const std::vector<Case> specs = {
      {"the store's own (none given)", "", false, false},
      {"the same", ram + ";" + tmpfs + ";" + disk, false, false},
      {"without ram", tmpfs + ";" + disk, true, false},
      {"without tmpfs", ram + ";" + disk, true, false},
      {"without disk", ram + ";" + tmpfs, true, false},
      {"ram alone", ram, true, false},
      {"disk alone", disk, true, false},
      {"a new directory alone", fresh, true, true},
      {"ram moved to another directory", other_ram + ";" + tmpfs + ";" + disk, true, false},
      {"tmpfs and disk reordered", ram + ";" + disk + ";" + tmpfs, false, false},
      {"ram grown", "ram:4M,dir=" + ram_ + ";" + tmpfs + ";" + disk, false, false},
      {"ram shrunk below its copies", "ram:96K,dir=" + ram_ + ";" + tmpfs + ";" + disk, false,
       false},
      {"a tier added", ram + ";" + tmpfs + ";" + disk + ";" + fresh, false, false},
      // The catalog still says the ram copies are there: only the open finds they are not, and
      // the tmpfs and disk copies are then the only ones.
      {"ram alone, the arena lost", ram, true, true, true},
  };
  uint64_t cases = 0, failures = 0;
  for (const Case& c : specs) {
    for (bool drop : {false, true}) {
      ++cases;
      RestorePristine();
      if (c.lose_arena) fs::remove(Arena());
      const Tree before = Snapshot(dir_.path());
      ckptdb* db = nullptr;
      const int rc = Open(c.spec.empty() ? nullptr : c.spec.c_str(), false, drop, &db);
      std::string why;
      const bool refused = c.only_copies || (c.leaves_out_copies && !drop);
      if (rc == CKPTDB_OK) {
        if (refused) why = "opened, but it leaves out tiers holding committed copies";
        if (why.empty()) why = RestoreAll(db, "open");
        ckptdb_close(db);
        if (why.empty()) why = VerifyClean("after the open");
      } else {
        // A shrink past live copies is refused as bad input too (the arena's own check).
        why = refused || c.what.find("shrunk") != std::string::npos
                  ? FailedCleanly(rc, {CKPTDB_EINVAL}, before, /*segments_only=*/c.lose_arena)
                  : std::string("refused: ") + ckptdb_status_name(rc) + ": " + ckptdb_last_error();
      }
      if (why.empty()) why = AfterRepair(/*ram_restores=*/false, /*verify_clean=*/!c.lose_arena);
      if (!why.empty()) {
        ++failures;
        ADD_FAILURE() << c.what << (drop ? ", drop_tiers" : "") << ": " << why;
      }
    }
  }
  Report("tier specs", cases, failures, start);
}

}  // namespace
}  // namespace ckpt
