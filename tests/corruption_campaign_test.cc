// The corruption campaign (issue 20; docs/testing.md, "Corruption campaign"): for every kind of
// file a store writes (the catalog's log, MANIFEST, CURRENT, OPTIONS, IDENTITY and tables, the
// commit witnesses, the tier markers, the segments on the tmpfs and disk tiers, the ram arena)
// and a sample of offsets, one mutation (a flipped bit, a truncation, a deletion) of a pristine
// 3-version store on ram+tmpfs+disk, then open, latest, restore, verify and repair, each checked
// against an oracle:
//   1. nothing deletes or changes a segment the mutation did not touch, at any step (open,
//      restore, verify, repair), and every ram copy survives a mutation outside its records;
//   2. no restore ever returns wrong bytes;
//   3. an open that succeeds sees version 3 as the latest and restores every committed version
//      whole (one mutation always leaves each chunk intact on some tier); an open that fails says
//      ECORRUPT (or EIO) and names the damaged file or directory, and changed nothing but LOCK;
//   4. verify is clean only if the store really is whole: a clean verify after a mutation that
//      made an open fail or a restore fall back is a failure;
//   5. after ckptdb repair, the store opens, its latest is version 3, and every committed version
//      restores whole.
// Each TEST takes one kind of file, so ctest runs them side by side. CKPTDB_CAMPAIGN_STRIDE (a
// divisor of the sample, 1 by default; the sanitizer builds use 8) trades cases for time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr uint64_t kVersions = 3;
// Put in one ckptdb_put_shards call: "embed" and the two norms (at most chunk_bytes, 16 KiB
// here) are packed into one shared chunk (docs/format.md, "Packed shards"); the others have
// chunks of their own.
const char* const kNames[] = {"embed", "layer.0.w", "opt.m", "norm.a", "norm.b"};
constexpr size_t kTensorBytes[] = {9000, 21000, 40000, 300, 1500};

std::vector<uint8_t> Expected(uint64_t version, size_t tensor) {
  return test::RandomBytes(kTensorBytes[tensor], version * 1000003 + tensor * 7919);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint64_t kDefaultStride = 8;
#else
constexpr uint64_t kDefaultStride = 1;
#endif

// Every regular file under `dir`, by path, with its bytes.
using Tree = std::map<std::string, std::string>;

Tree Snapshot(const std::string& dir) { return test::SnapshotFiles(dir, /*without_lock=*/false); }

struct Mutation {
  enum Kind { kFlip, kTruncate, kDelete } kind = kFlip;
  std::string path;
  uint64_t offset = 0;  // the byte flipped, or the length truncated to
  uint8_t mask = 1;
  std::string Describe() const {
    switch (kind) {
      case kFlip:
        return "flip of mask " + std::to_string(mask) + " at offset " + std::to_string(offset) +
               " of " + path;
      case kTruncate:
        return "truncation to " + std::to_string(offset) + " bytes of " + path;
      case kDelete:
        return "deletion of " + path;
    }
    return path;
  }
};

class Campaign : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("/dev/shm");
    BuildPristine();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    pristine_.clear();
  }

  static std::string Root() { return dir_->Sub("root"); }
  static std::string Tiers() {
    return "ram:2M,dir=" + dir_->Sub("ram") + ";tmpfs:" + dir_->Sub("tmpfs") +
           ";disk:" + dir_->Sub("disk");
  }
  static ckptdb_options Options(bool read_only) {
    // Set once per suite (the pointers below must stay valid for every copy of the options).
    static std::string tiers, root;
    if (root != Root()) {
      tiers = Tiers();
      root = Root();
    }
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root.c_str();
    o.tiers = read_only ? nullptr : tiers.c_str();
    o.read_only = read_only ? 1 : 0;
    o.create_if_missing = read_only ? 0 : 1;
    o.chunk_bytes = 16 << 10;
    o.staging_bytes = 256 << 10;
    o.capture_threads = 1;
    return o;
  }

  // Three versions on every tier; the catalog has tables (v1, v2, flushed by the reopen) and a
  // log (v3 and the demotions' residency).
  static void BuildPristine() {
    ckptdb_options o = Options(false);
    for (uint64_t v = 1; v <= kVersions; ++v) {
      ckptdb* db = nullptr;
      ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
      std::vector<std::vector<uint8_t>> data;
      std::vector<ckptdb_shard> shards;
      for (size_t t = 0; t < std::size(kNames); ++t) data.push_back(Expected(v, t));
      for (size_t t = 0; t < std::size(kNames); ++t) {
        shards.push_back({kNames[t], data[t].data(), data[t].size(), nullptr, CKPTDB_PUT_COPY_NOW});
      }
      ASSERT_EQ(ckptdb_put_shards(db, v, shards.data(), shards.size()), CKPTDB_OK)
          << ckptdb_last_error();
      ASSERT_EQ(ckptdb_commit(db, v, 0), CKPTDB_OK) << ckptdb_last_error();
      ASSERT_EQ(ckptdb_wait_commit(db, v, "tmpfs", -1), CKPTDB_OK) << ckptdb_last_error();
      ASSERT_EQ(ckptdb_wait_commit(db, v, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
      ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);
    }
    pristine_ = Snapshot(dir_->path());
    for (const auto& [path, bytes] : pristine_) {
      if (path.ends_with(".seg")) segments_.push_back(path);
    }
    ASSERT_EQ(segments_.size(), 2 * kVersions) << "every version on tmpfs and disk";
  }

  static void RestorePristine() {
    for (const auto& e : fs::directory_iterator(dir_->path())) fs::remove_all(e.path());
    for (const auto& [path, bytes] : pristine_) {
      fs::create_directories(fs::path(path).parent_path());
      test::WriteWholeFile(path, bytes);
    }
  }

  static void Apply(const Mutation& m) {
    switch (m.kind) {
      case Mutation::kFlip:
        test::FlipByte(m.path, m.offset, m.mask);
        break;
      case Mutation::kTruncate:
        fs::resize_file(m.path, m.offset);
        break;
      case Mutation::kDelete:
        fs::remove(m.path);
        break;
    }
  }

  // Oracle 1: every segment the mutation did not touch is still there, byte for byte.
  static std::string SegmentsIntact(const Mutation& m, const char* step) {
    for (const std::string& seg : segments_) {
      if (seg == m.path) continue;
      std::error_code ec;
      if (!fs::exists(seg, ec)) return std::string(step) + ": " + seg + " is gone";
      if (test::ReadWholeFile(seg) != pristine_.at(seg)) {
        return std::string(step) + ": " + seg + " changed";
      }
    }
    return {};
  }

  // Restores every version from a read-write handle: each must come back whole (oracle 2, 3).
  static std::string RestoreAll(ckptdb* db, const char* step) {
    uint64_t latest = 0;
    if (int rc = ckptdb_latest(db, &latest); rc != CKPTDB_OK || latest != kVersions) {
      return std::string(step) + ": latest is " + std::to_string(latest) + " (" +
             ckptdb_status_name(rc) + ": " + ckptdb_last_error() + "), not " +
             std::to_string(kVersions);
    }
    for (uint64_t v = 1; v <= kVersions; ++v) {
      for (size_t t = 0; t < std::size(kNames); ++t) {
        std::vector<uint8_t> want = Expected(v, t);
        std::vector<uint8_t> got(want.size(), 0xEE);
        int rc = ckptdb_restore(db, v, kNames[t], got.data(), got.size(), 0);
        if (rc != CKPTDB_OK) {
          return std::string(step) + ": restore of version " + std::to_string(v) + " " + kNames[t] +
                 ": " + ckptdb_status_name(rc) + ": " + ckptdb_last_error();
        }
        if (got != want) {
          return std::string(step) + ": restore of version " + std::to_string(v) + " " + kNames[t] +
                 " returned WRONG BYTES";
        }
      }
    }
    return {};
  }

  // The ram tier's copies, through a read-only open: all 3 verify (issue 20, finding 4: one
  // damaged arena header copy must lose no copy).
  static std::string RamCopiesIntact() {
    ckptdb_options o = Options(true);
    ckptdb* db = nullptr;
    if (ckptdb_open(&o, &db) != CKPTDB_OK) return std::string("ram check: ") + ckptdb_last_error();
    ckptdb_verify_report report{};
    int rc = ckptdb_verify(db, CKPTDB_ALL_VERSIONS, "ram", nullptr, nullptr, &report);
    ckptdb_close(db);
    if (rc != CKPTDB_OK || report.segments_checked != kVersions) {
      return "the ram tier's copies were lost: " + std::to_string(report.segments_checked) +
             " checked, " + ckptdb_status_name(rc);
    }
    return {};
  }

  // Verify: read-only open, then every chunk of every version on every tier.
  static bool VerifyClean() {
    ckptdb_options o = Options(true);
    ckptdb* db = nullptr;
    if (ckptdb_open(&o, &db) != CKPTDB_OK) return false;
    ckptdb_verify_report report{};
    int rc = ckptdb_verify(db, CKPTDB_ALL_VERSIONS, nullptr, nullptr, nullptr, &report);
    ckptdb_close(db);
    return rc == CKPTDB_OK && report.segments_checked == 3 * kVersions;
  }

  // One case; an empty string when every oracle holds.
  static std::string RunCase(const Mutation& m) {
    // A crash inside a case names no case: CKPTDB_CAMPAIGN_TRACE=1 prints each before it runs.
    if (test::EnvCount("CKPTDB_CAMPAIGN_TRACE", 0) != 0) {
      std::fprintf(stderr, "campaign case: %s\n", m.Describe().c_str());
    }
    RestorePristine();
    Apply(m);
    Tree before = Snapshot(dir_->path());
    ckptdb_options o = Options(false);
    // Step 1: open read-write, latest, restore.
    ckptdb* db = nullptr;
    int open_rc = ckptdb_open(&o, &db);
    std::string why;
    bool whole = open_rc == CKPTDB_OK;
    if (open_rc == CKPTDB_OK) {
      why = RestoreAll(db, "open");
      ckptdb_stats_t stats{};
      if (why.empty() && ckptdb_stats(db, &stats) == CKPTDB_OK && stats.checksum_failures > 0) {
        whole = false;  // a chunk failed its check somewhere: the store is not whole
      }
      ckptdb_close(db);
      if (!why.empty()) return why;
    } else {
      const std::string message = ckptdb_last_error();
      if (open_rc != CKPTDB_ECORRUPT && open_rc != CKPTDB_EIO) {
        return std::string("open failed with ") + ckptdb_status_name(open_rc) + ": " + message;
      }
      // Named: the file, or the directory that holds it.
      const std::string name = fs::path(m.path).filename().string();
      const std::string parent = fs::path(m.path).parent_path().string();
      if (message.find(name) == std::string::npos && message.find(parent) == std::string::npos) {
        return "open failed without naming " + m.path + ": " + message;
      }
      Tree after = Snapshot(dir_->path());
      for (auto& tree : {&before, &after}) {
        for (auto it = tree->begin(); it != tree->end();) {
          it = it->first.ends_with("/LOCK") ? tree->erase(it) : std::next(it);
        }
      }
      if (before != after) {
        std::string changed;
        for (const auto& [path, bytes] : before) {
          auto it = after.find(path);
          if (it == after.end() || it->second != bytes) changed += " " + path;
        }
        for (const auto& [path, bytes] : after) {
          if (!before.count(path)) changed += " +" + path;
        }
        return "the failed open changed" + changed + ": " + message;
      }
    }
    if (std::string s = SegmentsIntact(m, "open"); !s.empty()) return s;
    // Every ram copy survives a mutation that is not inside its records (a flip in the arena's
    // header area included).
    const bool arena_records_hit =
        m.path.ends_with(".ram") && (m.kind != Mutation::kFlip || m.offset >= 16384);
    if (open_rc == CKPTDB_OK && !arena_records_hit) {
      if (std::string s = RamCopiesIntact(); !s.empty()) return s;
    }
    // Step 2: verify. Clean only when the store is whole.
    const bool clean = VerifyClean();
    if (clean && !whole) return "verify is clean, but the open failed or a chunk failed";
    if (std::string s = SegmentsIntact(m, "verify"); !s.empty()) return s;
    // Step 3: repair, then the store opens and restores every version.
    ckptdb_options ro = Options(false);
    ckptdb_repair_report report{};
    int repair_rc = ckptdb_repair(&ro, nullptr, nullptr, &report);
    if (repair_rc != CKPTDB_OK) {
      return std::string("repair: ") + ckptdb_status_name(repair_rc) + ": " + ckptdb_last_error();
    }
    if (std::string s = SegmentsIntact(m, "repair"); !s.empty()) return s;
    db = nullptr;
    if (int rc = ckptdb_open(&o, &db); rc != CKPTDB_OK) {
      return std::string("open after repair: ") + ckptdb_status_name(rc) + ": " +
             ckptdb_last_error();
    }
    why = RestoreAll(db, "after repair");
    ckptdb_close(db);
    if (!why.empty()) return why;
    return SegmentsIntact(m, "open after repair");
  }

  // The sample for one file: every byte of a small file (up to 1 KiB), else `per_file` offsets
  // spread evenly plus the first and last 64 bytes; truncations to 0, 1, half and all but one
  // byte; the deletion. Divided by the stride.
  static std::vector<Mutation> Sample(const std::string& path, uint64_t per_file) {
    const uint64_t size = pristine_.at(path).size();
    const uint64_t stride = test::EnvCount("CKPTDB_CAMPAIGN_STRIDE", kDefaultStride);
    std::vector<uint64_t> offsets;
    if (size <= 1024) {
      for (uint64_t i = 0; i < size; ++i) offsets.push_back(i);
    } else {
      for (uint64_t i = 0; i < 64; ++i) offsets.push_back(i);
      for (uint64_t i = 0; i < per_file; ++i) offsets.push_back(64 + i * (size - 128) / per_file);
      for (uint64_t i = size - 64; i < size; ++i) offsets.push_back(i);
    }
    std::vector<Mutation> out;
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (i % stride != 0) continue;
      Mutation m;
      m.path = path;
      m.offset = offsets[i];
      m.mask = static_cast<uint8_t>(1u << (offsets[i] % 8));
      out.push_back(m);
    }
    for (uint64_t len : {uint64_t{0}, uint64_t{1}, size / 2, size > 0 ? size - 1 : 0}) {
      if (len >= size) continue;
      Mutation m;
      m.kind = Mutation::kTruncate;
      m.path = path;
      m.offset = len;
      out.push_back(m);
    }
    Mutation d;
    d.kind = Mutation::kDelete;
    d.path = path;
    out.push_back(d);
    return out;
  }

  // Runs the sample of every pristine file that `pick` selects; fails the test per broken case.
  static void RunKind(const char* kind, const std::function<bool(const std::string&)>& pick,
                      uint64_t per_file) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t cases = 0, files = 0, failures = 0;
    for (const auto& [path, bytes] : pristine_) {
      if (!pick(path)) continue;
      ++files;
      for (const Mutation& m : Sample(path, per_file)) {
        ++cases;
        std::string why = RunCase(m);
        if (!why.empty()) {
          ++failures;
          ADD_FAILURE() << m.Describe() << ": " << why;
          if (failures >= 20) return;  // enough to go on; the rest would say the same
        }
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("corruption campaign, %s: %llu files, %llu cases in %.1f s\n", kind,
                static_cast<unsigned long long>(files), static_cast<unsigned long long>(cases),
                seconds);
    EXPECT_GT(cases, 0u) << "no file of kind " << kind;
  }

  static bool InCatalog(const std::string& p) {
    return p.find("/root/catalog/") != std::string::npos && !p.ends_with("/LOCK");
  }

  static TempDir* dir_;
  static Tree pristine_;
  static std::vector<std::string> segments_;
};

TempDir* Campaign::dir_ = nullptr;
Tree Campaign::pristine_;
std::vector<std::string> Campaign::segments_;

TEST_F(Campaign, CatalogLogsAndManifests) {
  RunKind(
      "catalog log, MANIFEST, CURRENT, IDENTITY, table ledger",
      [](const std::string& p) {
        return InCatalog(p) && (p.ends_with(".log") || p.find("/MANIFEST-") != std::string::npos ||
                                p.ends_with("/CURRENT") || p.ends_with("/IDENTITY") ||
                                p.ends_with("/CKPTDB-TABLES"));
      },
      512);
}

TEST_F(Campaign, CatalogTablesAndOptions) {
  RunKind(
      "catalog tables", [](const std::string& p) { return InCatalog(p) && p.ends_with(".sst"); },
      512);
  // RocksDB does not read its OPTIONS files at open: a few offsets each.
  RunKind(
      "catalog OPTIONS",
      [](const std::string& p) { return InCatalog(p) && p.find("/OPTIONS-") != std::string::npos; },
      16);
}

TEST_F(Campaign, WitnessesAndTierMarkers) {
  RunKind(
      "commit witnesses and tier markers",
      [](const std::string& p) { return p.ends_with(".commit") || p.ends_with("/CKPTDB-TIER"); },
      256);
}

TEST_F(Campaign, Segments) {
  RunKind(
      "segments on tmpfs and disk", [](const std::string& p) { return p.ends_with(".seg"); }, 96);
}

TEST_F(Campaign, RamArena) {
  RunKind(
      "ram arena", [](const std::string& p) { return p.ends_with(".ram"); }, 512);
}

}  // namespace
}  // namespace ckpt
