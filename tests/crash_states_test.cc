// Crash-state enumeration, one rank (io/crash_model.h; docs/testing.md): a store commits four
// versions through three tiers (tmpfs, a disk commit tier, and a slower tier with NFS's
// close-to-open semantics) while every file change it makes, its RocksDB catalog's included, is
// recorded. Then, for every point of that trace, the directories are rebuilt as a crash there
// may leave them: the process killed (everything it wrote survives), and the machine losing
// power (tmpfs empty; disk keeping synced data plus any subset of the rest, writes torn at
// sector boundaries, a prefix of the unsynced metadata changes; NFS keeping closed files), the
// luckiest, the unluckiest and random choices. Each state is opened and checked against the
// oracle of docs/commit-protocol.md:
//   - latest is the newest version whose COMMITTED record was durable: the version that passed
//     its `commit:after_committed` point, or the next one when the crash fell inside its
//     COMMITTED write (between `commit:before_committed` and `commit:after_committed`);
//   - every version listed committed restores bit for bit (never a mix of versions), and verify
//     finds nothing wrong on any tier;
//   - no segment file of a version that is not committed is left on any tier, and no temporary
//     file (orphans are collected), after the reopened store closes.
// CKPTDB_CRASH_STATE_SEEDS=N (default 4) random power-loss states per point: more by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/catalog.h"
#include "engine/db.h"
#include "io/crash_model.h"
#include "tests/support/catalog_trace.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using io::CrashSpec;
using io::FsOp;
using test::RandomBytes;
using test::TempDir;

constexpr uint64_t kVersions = 4;
constexpr size_t kShardBytes[2] = {(150 << 10) + 17, 70 << 10};

std::vector<uint8_t> ShardData(uint64_t version, int which) {
  return RandomBytes(kShardBytes[which], version * 1000 + static_cast<uint64_t>(which));
}

std::string ShardName(int which) { return which == 0 ? "w0" : "w1"; }

// Each version's small shards, put in one call: packed into one chunk (docs/format.md, "Packed
// shards"), so every crash state below also cuts through a pack's record.
constexpr int kSmallShards = 12;
std::vector<uint8_t> SmallData(uint64_t version, int which) {
  return RandomBytes(40 + 97 * static_cast<size_t>(which),
                     0x9E3779B97F4A7C15ull * (version * 100 + static_cast<uint64_t>(which) + 1));
}
std::string SmallName(int which) { return "norm" + std::to_string(which); }

io::FsTrace* g_trace = nullptr;
void MarkPoint(const char* point) { g_trace->Mark(point); }

class CrashStatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = disk_.Sub("root");
    t1_ = mem_.Sub("t1");
    t2_ = disk_.Sub("t2");
    t3_ = disk_.Sub("nfs");
    dirs_ = {{root_, io::Durability::kDisk},
             {t1_, io::Durability::kMemory},
             {t2_, io::Durability::kDisk},
             {t3_, io::Durability::kNfs}};
    Record();
  }

  engine::DbOptions Options() const {
    engine::DbOptions o;
    o.root = root_;
    o.tiers = "tmpfs:" + t1_ + ",keep=2;disk:" + t2_ + ",keep=2;disk:" + t3_;
    o.commit_tier = "disk:" + t2_;
    o.chunk_bytes = 64 << 10;
    o.staging_bytes = 1 << 20;
    o.capture_threads = 1;
    return o;
  }

  // The run every crash state is cut from: open a new store, commit v1..v4, close.
  void Record() {
    io::FsTrace trace;
    for (const io::CrashDirectory& d : dirs_) trace.Watch(d.path);
    auto posix = io::NewPosixIo();
    io::RecordingIo recording(posix.get(), &trace);
    g_trace = &trace;
    engine::SetCrashHookForTesting(MarkPoint);
    engine::SetCatalogTraceForTesting(&trace);
    engine::DbOptions o = Options();
    o.io = &recording;
    std::unique_ptr<engine::Db> db;
    Status st = engine::Db::Open(o, &db);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (uint64_t v = 1; v <= kVersions; ++v) {
      for (int which = 0; which < 2; ++which) {
        auto data = ShardData(v, which);
        const std::string name = ShardName(which);
        st = db->PutShard(v, name.c_str(), data.data(), data.size(), nullptr, CKPTDB_PUT_COPY_NOW);
        ASSERT_TRUE(st.ok()) << st.ToString();
      }
      std::vector<std::vector<uint8_t>> small;
      std::vector<std::string> names;
      std::vector<ckptdb_shard> shards;
      for (int which = 0; which < kSmallShards; ++which) {
        small.push_back(SmallData(v, which));
        names.push_back(SmallName(which));
      }
      for (int which = 0; which < kSmallShards; ++which) {
        shards.push_back({names[which].c_str(), small[which].data(), small[which].size(), nullptr,
                          CKPTDB_PUT_COPY_NOW});
      }
      st = db->PutShards(v, shards.data(), shards.size());
      ASSERT_TRUE(st.ok()) << st.ToString();
      st = db->Commit(v, 0);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    st = db->Close();
    ASSERT_TRUE(st.ok()) << st.ToString();
    db.reset();
    engine::SetCatalogTraceForTesting(nullptr);
    engine::SetCrashHookForTesting(nullptr);
    g_trace = nullptr;
    ops_ = trace.ops();
    ASSERT_GT(ops_.size(), 100u);
    // Every file kind the run wrote must have been seen: segments on each tier, the catalog.
    size_t segment_writes = 0, catalog_syncs = 0;
    for (const FsOp& op : ops_) {
      if (op.kind == FsOp::Kind::kWrite && op.path.find(".seg") != std::string::npos) {
        segment_writes++;
      }
      if (op.kind == FsOp::Kind::kSync && op.path.find("/catalog/") != std::string::npos) {
        catalog_syncs++;
      }
    }
    ASSERT_GT(segment_writes, 10u);
    ASSERT_GE(catalog_syncs, 2 * kVersions) << "PREPARED and COMMITTED of each version, synced";
  }

  // The crash points: just after each op that changes a file (a marker changes nothing).
  std::vector<uint64_t> Ends() const {
    std::vector<uint64_t> ends = {0};
    for (const FsOp& op : ops_) {
      if (op.kind != FsOp::Kind::kMarker) ends.push_back(op.seq + 1);
    }
    return ends;
  }

  size_t MarkersBefore(uint64_t end, const std::string& name) const {
    size_t n = 0;
    for (const FsOp& op : ops_) {
      if (op.kind == FsOp::Kind::kMarker && op.seq < end && op.path == name) n++;
    }
    return n;
  }

  // Builds the state and checks the oracle; returns false (after reporting) on a violation.
  bool Check(const CrashSpec& spec, const std::string& label) {
    io::CrashChoices choices;
    Status st = io::BuildCrashState(ops_, dirs_, spec, &choices);
    std::string what = label + " at op " + std::to_string(spec.end) + " of " +
                       std::to_string(ops_.size()) + " (" + choices.Describe() + "; the last ops:";
    for (const FsOp& op : ops_) {
      if (op.seq < spec.end && op.seq + 6 >= spec.end) {
        what += std::string(" ") + io::FsOpKindName(op.kind) + " " + op.path +
                (op.to.empty() ? "" : " -> " + op.to);
      }
    }
    what += ")";
    EXPECT_TRUE(st.ok()) << what << ": " << st.ToString();
    if (!st.ok()) return false;
    // Commits run one after another, so the k-th commit point is version k's.
    const uint64_t must = MarkersBefore(spec.end, "commit:after_committed");
    const uint64_t may = MarkersBefore(spec.end, "commit:before_committed");
    const int failures_before = ::testing::UnitTest::GetInstance()->failed_test_count();
    const bool memory_lost = spec.default_mode == CrashSpec::Mode::kPowerLoss;
    CheckOpened(what, must, may, memory_lost);
    states_checked_++;
    return !HasFailure() &&
           ::testing::UnitTest::GetInstance()->failed_test_count() == failures_before;
  }

  void CheckOpened(const std::string& what, uint64_t must, uint64_t may, bool memory_lost) {
    std::unique_ptr<engine::Db> db;
    Status st = engine::Db::Open(Options(), &db);
    ASSERT_TRUE(st.ok()) << what << ": reopen: " << st.ToString();
    uint64_t latest = 0;
    st = db->Latest(&latest);
    if (st.code() == CKPTDB_ENOTFOUND) latest = 0;
    ASSERT_TRUE(st.ok() || latest == 0) << what << ": latest: " << st.ToString();
    ASSERT_TRUE(latest == must || latest == may)
        << what << ": latest is " << latest << "; the newest durable COMMITTED is v" << must
        << (may != must ? " (or v" + std::to_string(may) + ", committing at the crash)" : "");
    // Every version listed committed restores bit for bit.
    struct Listed {
      std::map<uint64_t, int> states;
      std::map<uint64_t, std::map<std::string, int>> residency;  // by version, by tier
    } listed;
    st = db->ListVersions(
        [](void* arg, const ckptdb_version_info* info) {
          auto* l = static_cast<Listed*>(arg);
          l->states[info->version] = info->state;
          for (uint32_t i = 0; i < info->residency_count; ++i) {
            l->residency[info->version][info->residency[i].tier] = info->residency[i].state;
          }
          return 0;
        },
        &listed);
    const auto& states = listed.states;
    ASSERT_TRUE(st.ok()) << what << ": list: " << st.ToString();
    std::set<uint64_t> committed;
    for (const auto& [v, state] : states) {
      if (state != CKPTDB_STATE_COMMITTED) continue;
      committed.insert(v);
      ASSERT_LE(v, latest) << what << ": v" << v << " is listed committed but latest is " << latest;
      for (int which = 0; which < 2; ++which) {
        std::vector<uint8_t> out(kShardBytes[which]);
        const std::string name = ShardName(which);
        st = db->Restore(v, name.c_str(), out.data(), out.size(), 0);
        ASSERT_TRUE(st.ok()) << what << ": restore v" << v << " " << name << ": " << st.ToString();
        ASSERT_TRUE(out == ShardData(v, which))
            << what << ": v" << v << " " << name << " restored other bytes";
      }
      for (int which = 0; which < kSmallShards; ++which) {
        std::vector<uint8_t> out(SmallData(v, which).size());
        const std::string name = SmallName(which);
        st = db->Restore(v, name.c_str(), out.data(), out.size(), 0);
        ASSERT_TRUE(st.ok()) << what << ": restore v" << v << " " << name << ": " << st.ToString();
        ASSERT_TRUE(out == SmallData(v, which))
            << what << ": v" << v << " " << name << " restored other bytes";
      }
    }
    if (latest != 0) {
      ASSERT_TRUE(committed.count(latest)) << what << ": latest v" << latest << " is not listed";
    }
    // Every copy checks clean, but for copies lost with the machine's memory (verify reports a
    // missing copy as a problem: docs/api.md), which must be recorded MISSING.
    const std::string tmpfs = "tmpfs:" + t1_;
    std::vector<std::string> tiers = {"disk:" + t2_, "disk:" + t3_};
    if (!memory_lost) tiers.push_back(tmpfs);
    for (const std::string& tier : tiers) {
      std::string problems;
      st = db->Verify(
          CKPTDB_ALL_VERSIONS, tier.c_str(),
          [](void* arg, const ckptdb_verify_event* e) {
            if (e->kind == CKPTDB_VERIFY_PROBLEM) *static_cast<std::string*>(arg) += e->message;
          },
          &problems, nullptr);
      ASSERT_TRUE(st.ok()) << what << ": verify " << tier << ": " << st.ToString() << ": "
                           << problems;
    }
    for (const auto& [v, by_tier] : listed.residency) {
      auto it = by_tier.find(tmpfs);
      if (!memory_lost || it == by_tier.end()) continue;
      ASSERT_NE(it->second, CKPTDB_RESIDENT_DURABLE)
          << what << ": v" << v << " is listed DURABLE on " << tmpfs << ", which lost power";
    }
    st = db->Close();
    ASSERT_TRUE(st.ok()) << what << ": close: " << st.ToString();
    // No orphan: every segment file on every tier is of a committed version, none temporary.
    for (const std::string& dir : {t1_, t2_, t3_}) {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.empty() || name[0] != 'v') continue;
        ASSERT_EQ(name.find(".tmp"), std::string::npos) << what << ": " << e.path() << " left";
        const uint64_t v = std::strtoull(name.c_str() + 1, nullptr, 10);
        ASSERT_TRUE(committed.count(v)) << what << ": orphan " << e.path() << " left";
      }
    }
  }

  // Every crash point under one way of choosing the state; stops at the first violation.
  void Enumerate(const std::string& label, CrashSpec spec, uint64_t seeds = 1) {
    const std::vector<uint64_t> ends = Ends();
    for (uint64_t end : ends) {
      for (uint64_t seed = 0; seed < seeds; ++seed) {
        spec.end = end;
        spec.seed = end * 7919 + seed;
        if (!Check(spec, label + " seed " + std::to_string(spec.seed))) return;
      }
    }
    std::printf("[ crash states ] %s: %zu states checked (%zu crash points)\n", label.c_str(),
                states_checked_, ends.size());
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, t1_, t2_, t3_;
  std::vector<io::CrashDirectory> dirs_;
  std::vector<FsOp> ops_;
  size_t states_checked_ = 0;
};

TEST_F(CrashStatesTest, AProcessKilledAtAnyPointLeavesTheNewestDurableCommit) {
  CrashSpec spec;
  spec.default_mode = CrashSpec::Mode::kProcess;
  Enumerate("process killed", spec);
}

TEST_F(CrashStatesTest, PowerLossKeepingEveryUnsyncedWriteLeavesTheNewestDurableCommit) {
  CrashSpec spec;
  spec.keep_all = true;
  Enumerate("power loss, every unsynced change kept", spec);
}

TEST_F(CrashStatesTest, PowerLossDroppingEveryUnsyncedWriteLeavesTheNewestDurableCommit) {
  CrashSpec spec;
  spec.keep_none = true;
  Enumerate("power loss, every unsynced change dropped", spec);
}

TEST_F(CrashStatesTest, PowerLossWithTornAndReorderedWritesLeavesTheNewestDurableCommit) {
  Enumerate("power loss, unsynced writes kept, torn or dropped at random", CrashSpec{},
            test::EnvCount("CKPTDB_CRASH_STATE_SEEDS", 4));
}

}  // namespace
}  // namespace ckpt
