// Crash-state enumeration, a job of several ranks (io/crash_model.h; docs/testing.md): three
// ranks on three simulated nodes, rank 0 hosting the coordinator, commit three versions
// through a tmpfs tier and a disk commit tier while every file change of every rank (segments,
// markers, each rank's RocksDB catalog, the coordinator's decision log in rank 0's) is recorded
// with a sequence number from one clock the forked ranks share. Every message between ranks
// follows the change that caused it, so a prefix of the merged trace is a state the job could
// really be in when it stopped. For sampled crash points the nodes' directories are rebuilt as
// the crash leaves them: the whole job losing power, one node losing power while the others'
// processes die and their nodes restart, or every process killed and every node restarted: a
// restarted node's memory (the ram tier's arena, written through memory, which no trace sees,
// and its tmpfs) is gone while its disks keep all that was written. Then the job restarts on
// them and each rank checks:
//   - every rank is told the same latest: the newest version whose decision the coordinator
//     made durable (`coordinator:after_committed_written`), or the next one when the crash fell
//     inside that write;
//   - every version a rank lists committed restores bit for bit; every copy listed durable
//     verifies clean; none on the disk is missing, nor on a tmpfs that kept its contents;
//   - after the restarted job closes, no rank's tier holds a segment of a version it does not
//     list committed, and no temporary file.
// CKPTDB_CLUSTER_CRASH_STATES=N checks N sampled states (default 60): more by hand.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/catalog.h"
#include "engine/db.h"
#include "harness/job.h"
#include "io/crash_model.h"
#include "tests/support/catalog_trace.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using io::CrashSpec;
using io::FsOp;

constexpr uint32_t kRanks = 3;
constexpr uint64_t kVersions = 3;
constexpr size_t kTensorBytes[2] = {(100 << 10) + 5, 40 << 10};

std::vector<uint8_t> TensorData(uint32_t rank, uint64_t version, int which) {
  return test::RandomBytes(kTensorBytes[which],
                           rank * 1000003ull + version * 1009ull + which * 101ull);
}

std::string TensorName(uint32_t rank, int which) {
  std::string name = which == 0 ? "a/r" : "b/r";
  name += std::to_string(rank);
  return name;
}

io::FsTrace* g_trace = nullptr;
void MarkPoint(const char* point) { g_trace->Mark(point); }

struct Job {
  test::TempDir disk{"/var/tmp"};
  test::TempDir mem{"/dev/shm"};
  harness::Job harness{kRanks};  // each run a fresh coordinator port, bound and reported by rank 0
  std::string Node(uint32_t rank) const { return "node" + std::to_string(rank); }
  std::string Root(uint32_t rank) const { return disk.Sub(Node(rank) + "-root"); }
  std::string Disk(uint32_t rank) const { return disk.Sub(Node(rank) + "-disk"); }
  std::string Tmpfs(uint32_t rank) const { return mem.Sub(Node(rank) + "-tmpfs"); }
  std::string Ram(uint32_t rank) const { return mem.Sub(Node(rank) + "-ram"); }
  // The ram tier's arena is written through memory, which no trace sees: every crash state
  // starts its ranks on a new arena, as after the node restarted.
  std::vector<io::CrashDirectory> Dirs(uint32_t rank) const {
    return {{Root(rank), io::Durability::kDisk},
            {Ram(rank), io::Durability::kMemory},
            {Tmpfs(rank), io::Durability::kMemory},
            {Disk(rank), io::Durability::kDisk}};
  }
};

int OpenRank(const Job& job, uint32_t rank, ckptdb** db) {
  const std::string root = job.Root(rank);
  const std::string tiers = "ram:8M,keep=1,dir=" + job.Ram(rank) + ";tmpfs:" + job.Tmpfs(rank) +
                            ",keep=2;disk:" + job.Disk(rank);
  const std::string coordinator = job.harness.CoordinatorFor(rank);
  const std::string node = job.Node(rank);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.commit_tier = "disk";
  o.rank = rank;
  o.world_size = kRanks;
  o.node_id = node.c_str();
  o.coordinator = coordinator.c_str();
  o.job_token = "crash-states";
  o.redundancy = "none";
  o.chunk_bytes = 64 << 10;
  o.staging_bytes = 1 << 20;
  o.capture_threads = 1;
  setenv("CKPTDB_HEARTBEAT_MS", "100", 1);
  setenv("CKPTDB_DEAD_AFTER_MS", "5000", 1);
  setenv("CKPTDB_JOIN_TIMEOUT_MS", "20000", 1);
  setenv("CKPTDB_UCX_TLS", "tcp", 1);
  return ckptdb_open(&o, db);
}

// Rank 0 hosts the coordinator: it closes after every rank said it is done.
void Done(const Job& job, const std::string& phase, uint32_t rank) {
  if (!job.harness.Arrive(phase, rank == 0)) {
    std::fprintf(stderr, "rank %u: not every rank reached '%s' within 60 s\n", rank, phase.c_str());
  }
}

class ClusterCrashStatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clock_ = static_cast<std::atomic<uint64_t>*>(mmap(nullptr, sizeof(std::atomic<uint64_t>),
                                                      PROT_READ | PROT_WRITE,
                                                      MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(clock_, MAP_FAILED);
    new (clock_) std::atomic<uint64_t>(0);
    for (uint32_t r = 0; r < kRanks; ++r) {
      for (const io::CrashDirectory& d : job_.Dirs(r)) dirs_.push_back(d);
    }
  }
  void TearDown() override { munmap(clock_, sizeof(std::atomic<uint64_t>)); }

  // The job every state is cut from: each rank opens a new store, commits v1..v3 and closes,
  // recording its file changes; the traces merge by their shared clock.
  void Record() {
    auto codes = job_.harness.Run([&](uint32_t rank) {
      io::FsTrace trace(clock_);
      for (const io::CrashDirectory& d : job_.Dirs(rank)) trace.Watch(d.path);
      auto posix = io::NewPosixIo();
      io::RecordingIo recording(posix.get(), &trace);
      g_trace = &trace;
      engine::SetCrashHookForTesting(MarkPoint);
      engine::SetCatalogTraceForTesting(&trace);
      engine::SetIoForTesting(&recording);
      ckptdb* db = nullptr;
      int rc = OpenRank(job_, rank, &db);
      RANK_CHECK(rc == 0, "open: %d", rc);
      for (uint64_t v = 1; v <= kVersions; ++v) {
        for (int which = 0; which < 2; ++which) {
          auto data = TensorData(rank, v, which);
          rc = ckptdb_put_shard(db, v, TensorName(rank, which).c_str(), data.data(), data.size(),
                                nullptr, CKPTDB_PUT_COPY_NOW);
          RANK_CHECK(rc == 0, "put v%llu: %d", (unsigned long long)v, rc);
        }
        rc = ckptdb_commit(db, v, 0);
        RANK_CHECK(rc == 0, "commit v%llu: %d", (unsigned long long)v, rc);
      }
      Done(job_, "record", rank);
      rc = ckptdb_close(db);
      RANK_CHECK(rc == 0, "close: %d", rc);
      Status st = trace.Save(job_.disk.Sub("trace" + std::to_string(rank)));
      RANK_CHECK(st.ok(), "saving the trace: %s", st.ToString().c_str());
      return 0;
    });
    ASSERT_EQ(codes, std::vector<int>(kRanks, 0));
    for (uint32_t r = 0; r < kRanks; ++r) {
      std::vector<FsOp> ops;
      Status st = io::FsTrace::Load(job_.disk.Sub("trace" + std::to_string(r)), &ops);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_GT(ops.size(), 50u) << "rank " << r;
      for (FsOp& op : ops) ops_.push_back(std::move(op));
    }
    std::sort(ops_.begin(), ops_.end(), [](const FsOp& a, const FsOp& b) { return a.seq < b.seq; });
    ASSERT_EQ(Markers(UINT64_MAX, "coordinator:after_committed_written"), kVersions);
  }

  uint64_t Markers(uint64_t end, const std::string& name) const {
    uint64_t n = 0;
    for (const FsOp& op : ops_) {
      if (op.kind == FsOp::Kind::kMarker && op.seq < end && op.path == name) n++;
    }
    return n;
  }

  // The crash points to check: each one just after a change on disk; those right around the
  // coordinator's decisions always, the rest drawn at random.
  std::vector<uint64_t> PickEnds(uint64_t count, std::mt19937_64& rng) const {
    std::vector<uint64_t> all;
    for (const FsOp& op : ops_) {
      if (op.kind != FsOp::Kind::kMarker) all.push_back(op.seq + 1);
    }
    std::set<uint64_t> picked;
    for (const FsOp& op : ops_) {
      if (op.kind == FsOp::Kind::kMarker && op.path.rfind("coordinator:", 0) == 0) {
        auto at = std::lower_bound(all.begin(), all.end(), op.seq + 1);
        if (at != all.end()) picked.insert(*at);          // the change after the point
        if (at != all.begin()) picked.insert(*(at - 1));  // the change before it
      }
    }
    while (picked.size() < count && picked.size() < all.size()) {
      picked.insert(all[rng() % all.size()]);
    }
    return {picked.begin(), picked.end()};
  }

  // Restarts the job on the state; each rank checks the oracle. Returns false on a violation.
  bool CheckState(const CrashSpec& spec, const std::string& label) {
    io::CrashChoices choices;
    Status st = io::BuildCrashState(ops_, dirs_, spec, &choices);
    const std::string what = label + " at op " + std::to_string(spec.end) + " of " +
                             std::to_string(ops_.size()) + " (" + choices.Describe() + ")";
    EXPECT_TRUE(st.ok()) << what << ": " << st.ToString();
    if (!st.ok()) return false;
    const uint64_t must = Markers(spec.end, "coordinator:after_committed_written");
    const uint64_t may = Markers(spec.end, "coordinator:before_committed_written");
    auto codes = job_.harness.Run([&](uint32_t rank) {
      ckptdb* db = nullptr;
      int rc = OpenRank(job_, rank, &db);
      RANK_CHECK(rc == 0, "reopen: %d", rc);
      uint64_t latest = 0;
      rc = ckptdb_latest(db, &latest);
      RANK_CHECK(rc == 0 || rc == CKPTDB_ENOTFOUND, "latest: %d", rc);
      if (rc != 0) latest = 0;
      RANK_CHECK(latest == must || latest == may,
                 "latest is v%llu; the newest decision made durable is v%llu (or v%llu, being "
                 "decided at the crash)",
                 (unsigned long long)latest, (unsigned long long)must, (unsigned long long)may);
      test::WriteWholeFile(job_.mem.Sub("latest" + std::to_string(rank)), std::to_string(latest));
      struct Listed {
        std::set<uint64_t> committed;
        std::map<uint64_t, std::map<std::string, int>> copies;  // by version, by tier
      } listed;
      rc = ckptdb_list_versions(
          db,
          [](void* arg, const ckptdb_version_info* info) {
            auto* l = static_cast<Listed*>(arg);
            if (info->state == CKPTDB_STATE_COMMITTED) l->committed.insert(info->version);
            for (uint32_t i = 0; i < info->residency_count; ++i) {
              l->copies[info->version][info->residency[i].tier] = info->residency[i].state;
            }
            return 0;
          },
          &listed);
      RANK_CHECK(rc == 0, "list: %d", rc);
      for (uint64_t v : listed.committed) {
        RANK_CHECK(v <= latest, "v%llu is listed committed above latest v%llu",
                   (unsigned long long)v, (unsigned long long)latest);
        for (int which = 0; which < 2; ++which) {
          const auto want = TensorData(rank, v, which);
          std::vector<uint8_t> out(want.size(), 0xEE);
          rc = ckptdb_restore(db, v, TensorName(rank, which).c_str(), out.data(), out.size(), 0);
          RANK_CHECK(rc == 0 && out == want, "restore v%llu %s: %d%s", (unsigned long long)v,
                     TensorName(rank, which).c_str(), rc, out == want ? "" : ", other bytes");
        }
      }
      if (latest != 0) {
        RANK_CHECK(listed.committed.count(latest), "latest v%llu is not listed committed",
                   (unsigned long long)latest);
      }
      // Every copy listed durable checks clean. On the disk every copy is durable (none
      // missing: a power loss keeps what was published); on a tmpfs that lost power a copy may
      // be missing, or durable again (the tier manager refills it from the disk); the ram
      // tier's are all missing.
      const bool tmpfs_lost =
          (spec.modes.count(job_.Tmpfs(rank)) ? spec.modes.at(job_.Tmpfs(rank))
                                              : spec.default_mode) == CrashSpec::Mode::kPowerLoss;
      const std::string disk = "disk:" + job_.Disk(rank);
      const std::string tmpfs = "tmpfs:" + job_.Tmpfs(rank);
      for (const auto& [v, by_tier] : listed.copies) {
        if (!listed.committed.count(v)) continue;
        for (const auto& [tier, state] : by_tier) {
          if (tier != disk && tier != tmpfs) continue;
          if (state == CKPTDB_RESIDENT_MISSING) {
            RANK_CHECK(tier == tmpfs && tmpfs_lost, "v%llu is missing on %s", (unsigned long long)v,
                       tier.c_str());
          }
          if (state != CKPTDB_RESIDENT_DURABLE) continue;
          ckptdb_verify_report rep{};
          rc = ckptdb_verify(db, v, tier.c_str(), nullptr, nullptr, &rep);
          RANK_CHECK(rc == 0, "verify v%llu on %s: %d, %llu problems", (unsigned long long)v,
                     tier.c_str(), rc, (unsigned long long)rep.problems);
        }
      }
      Done(job_, "check", rank);
      rc = ckptdb_close(db);
      RANK_CHECK(rc == 0, "close: %d", rc);
      for (const std::string& dir : {job_.Tmpfs(rank), job_.Disk(rank)}) {
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
          const std::string name = e.path().filename().string();
          if (name.empty() || name[0] != 'v') continue;
          RANK_CHECK(name.find(".tmp") == std::string::npos, "%s left", e.path().c_str());
          const uint64_t v = std::strtoull(name.c_str() + 1, nullptr, 10);
          RANK_CHECK(listed.committed.count(v), "orphan %s left", e.path().c_str());
        }
      }
      return 0;
    });
    EXPECT_EQ(codes, std::vector<int>(kRanks, 0)) << what << " (each rank's reasons above)";
    if (codes != std::vector<int>(kRanks, 0)) return false;
    std::set<std::string> answers;
    for (uint32_t r = 0; r < kRanks; ++r) {
      answers.insert(test::ReadWholeFile(job_.mem.Sub("latest" + std::to_string(r))));
    }
    EXPECT_EQ(answers.size(), 1u) << what << ": the ranks were told different latest versions";
    return answers.size() == 1;
  }

  // A killed rank's node restarts: its memory (ram and tmpfs) is gone, its disks keep all that
  // was written (a clean restart writes the page cache back).
  void RestartNodes(CrashSpec* spec) const {
    for (uint32_t r = 0; r < kRanks; ++r) {
      spec->modes[job_.Ram(r)] = CrashSpec::Mode::kPowerLoss;
      spec->modes[job_.Tmpfs(r)] = CrashSpec::Mode::kPowerLoss;
    }
  }

  Job job_;
  std::atomic<uint64_t>* clock_ = nullptr;
  std::vector<io::CrashDirectory> dirs_;
  std::vector<FsOp> ops_;
};

TEST_F(ClusterCrashStatesTest, EveryRankRestartsOnTheNewestDecisionMadeDurable) {
  ASSERT_NO_FATAL_FAILURE(Record());
  std::mt19937_64 rng(20261125);
  const std::vector<uint64_t> ends =
      PickEnds(test::EnvCount("CKPTDB_CLUSTER_CRASH_STATES", 60), rng);
  size_t checked = 0;
  for (size_t i = 0; i < ends.size(); ++i) {
    CrashSpec spec;
    spec.end = ends[i];
    spec.seed = rng();
    std::string label;
    switch (i % 3) {
      case 0:
        spec.default_mode = CrashSpec::Mode::kPowerLoss;
        label = "the whole job lost power";
        break;
      case 1: {
        const uint32_t lost = static_cast<uint32_t>(rng() % kRanks);
        spec.default_mode = CrashSpec::Mode::kProcess;
        RestartNodes(&spec);
        for (const io::CrashDirectory& d : job_.Dirs(lost)) {
          spec.modes[d.path] = CrashSpec::Mode::kPowerLoss;
        }
        label = "node " + std::to_string(lost) +
                " lost power, the other ranks were killed and their nodes restarted";
        break;
      }
      default:
        spec.default_mode = CrashSpec::Mode::kProcess;
        RestartNodes(&spec);
        label = "every rank was killed and its node restarted";
        break;
    }
    if (!CheckState(spec, label)) break;
    checked++;
  }
  std::printf("[ crash states ] %zu job states checked (of %zu ops recorded by %u ranks)\n",
              checked, ops_.size(), kRanks);
}

}  // namespace
}  // namespace ckpt
