// The nfs tier against a real NFSv3 server (issue 24): nfs-ganesha in user space, started by each
// test on free ports (tests/support/nfs_server.h), reached through libnfs with no kernel mount.
// The client's calls (io/nfs_io.h), then the tier as the engine uses it: demotion and restore,
// and the server's faults: killed mid-demotion and restarted, unreachable at open, a full export,
// stale handles after the export is recreated, and another store's files in the directory.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/tier.h"
#include "io/io.h"
#include "io/nfs_io.h"
#include "io/tier_spec.h"
#include "tests/support/nfs_server.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::NfsServer;
using test::RandomBytes;
using test::TempDir;

// Restarts the killed server on its ports, or fails the test with why (its log's tail included).
#define ASSERT_RESTARTS(server)                          \
  do {                                                   \
    const Status restarted = (server)->Restart();        \
    ASSERT_TRUE(restarted.ok()) << restarted.ToString(); \
  } while (0)

uint64_t Seed(uint64_t version) { return version * 1000003; }

// Each test's server exports a directory of its own under /var/tmp (a disk file system, as a
// filer's would be).
class NfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!NfsServer::Installed(&why)) GTEST_FAIL() << why;
    export_ = disk_.Sub("export");
    fs::create_directories(export_);
    fs::create_directories(disk_.Sub("server"));
    Status st = NfsServer::Start(export_, disk_.Sub("server"), &server_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // The nfs:// path of `rel` inside the export.
  std::string NfsPath(const std::string& rel) const {
    return io::MakeNfsPath("127.0.0.1", server_->port(), server_->mount_port(),
                           export_ + (rel.empty() ? "" : "/" + rel));
  }

  TempDir disk_{"/var/tmp"};
  std::string export_;
  std::unique_ptr<NfsServer> server_;
};

// ---- The client -----------------------------------------------------------------------------

TEST_F(NfsTest, ClientWritesReadsRenamesAndListsOnTheServer) {
  std::unique_ptr<io::Io> nfs = io::NewPosixIo();
  const std::string dir = NfsPath("a/b");
  ASSERT_TRUE(nfs->CreateDirs(dir).ok());
  ASSERT_TRUE(fs::is_directory(export_ + "/a/b"));
  ASSERT_TRUE(nfs->CreateDirs(dir).ok()) << "again: it exists";

  // 5 MiB + 123 bytes: several WRITE3 calls of the server's wsize in flight, and a tail.
  const std::vector<uint8_t> data = RandomBytes((5 << 20) + 123, 7);
  int fd = -1;
  bool direct = true;
  ASSERT_TRUE(
      nfs->Open(dir + "/f.tmp", {io::OpenOptions::Mode::kCreateWrite, false}, &fd, &direct).ok());
  EXPECT_FALSE(direct);
  EXPECT_GE(fd, io::kNfsFdBase);
  std::unique_ptr<io::IoQueue> q;
  ASSERT_TRUE(nfs->NewQueue(io::QueueOptions{}, &q).ok());
  ASSERT_TRUE(io::WriteAt(*q, fd, 0, data.data(), data.size(), "write").ok());
  ASSERT_TRUE(io::SyncFile(*q, fd, "commit").ok());
  uint64_t size = 0;
  ASSERT_TRUE(nfs->FileSize(fd, &size).ok());
  EXPECT_EQ(size, data.size());
  ASSERT_TRUE(nfs->Close(fd).ok());
  ASSERT_TRUE(nfs->Rename(dir + "/f.tmp", dir + "/f").ok());
  EXPECT_FALSE(fs::exists(export_ + "/a/b/f.tmp"));
  EXPECT_EQ(fs::file_size(export_ + "/a/b/f"), data.size()) << "the server's file system has it";
  std::vector<std::string> names;
  ASSERT_TRUE(nfs->ListDir(dir, &names).ok());
  EXPECT_EQ(names, std::vector<std::string>{"f"});

  // Read back through another queue, past the end: a short read says where the file ends.
  ASSERT_TRUE(nfs->Open(dir + "/f", {}, &fd, nullptr).ok());
  std::unique_ptr<io::IoQueue> r;
  ASSERT_TRUE(nfs->NewQueue(io::QueueOptions{}, &r).ok());
  std::vector<uint8_t> back(data.size() + 4096);
  io::IoRequest req;
  req.op = io::IoRequest::Op::kRead;
  req.fd = fd;
  req.buffer = back.data();
  req.length = back.size();
  req.tag = 42;
  ASSERT_TRUE(r->Submit(std::span<const io::IoRequest>(&req, 1)).ok());
  std::vector<io::IoCompletion> done;
  ASSERT_TRUE(r->Reap(1, &done, 10'000).ok());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 42u);
  EXPECT_EQ(done[0].result, static_cast<int64_t>(data.size()));
  back.resize(data.size());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(nfs->Close(fd).ok());

  // Small files, durably; a missing one is NotFound; Remove of an absent one is fine.
  ASSERT_TRUE(nfs->WriteFileDurably(dir + "/m", "marker").ok());
  std::string text;
  ASSERT_TRUE(nfs->ReadFile(dir + "/m", &text).ok());
  EXPECT_EQ(text, "marker");
  EXPECT_EQ(nfs->ReadFile(dir + "/none", &text).code(), CKPTDB_ENOTFOUND);
  ASSERT_TRUE(nfs->Remove(dir + "/f").ok());
  ASSERT_TRUE(nfs->Remove(dir + "/f").ok());
  EXPECT_EQ(nfs->PathSize(dir + "/f", &size).code(), CKPTDB_ENOTFOUND);
  ASSERT_TRUE(nfs->SyncDir(dir).ok());
  EXPECT_EQ(nfs->OpenSharedMemory(dir + "/arena", {}, nullptr).code(), CKPTDB_ENOTSUP);
}

// A server that restarts between a file's unstable writes and its COMMIT may have lost them: the
// write verifier changed, and no COMMIT of that file succeeds any more.
TEST_F(NfsTest, CommitAfterAServerRestartFailsOnTheChangedVerifier) {
  std::unique_ptr<io::Io> nfs = io::NewPosixIo();
  int fd = -1;
  ASSERT_TRUE(
      nfs->Open(NfsPath("f"), {io::OpenOptions::Mode::kCreateWrite, false}, &fd, nullptr).ok());
  std::unique_ptr<io::IoQueue> q;
  ASSERT_TRUE(nfs->NewQueue(io::QueueOptions{}, &q).ok());
  const std::vector<uint8_t> data = RandomBytes(1 << 20, 3);
  ASSERT_TRUE(io::WriteAt(*q, fd, 0, data.data(), data.size(), "write").ok());
  server_->Kill();
  // ganesha's write verifier is its start time in seconds: a restart within the same second
  // would keep it (and an NFS client could not tell).
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_RESTARTS(server_);
  // The first sync finds the old connection dead; the next goes over a new one and meets the
  // new verifier; so does every later one.
  for (int i = 0; i < 3; ++i) {
    Status st = io::SyncFile(*q, fd, "commit " + std::to_string(i));
    EXPECT_FALSE(st.ok()) << i;
  }
  // Written again under a new open, the file commits.
  ASSERT_TRUE(nfs->Close(fd).ok());
  Status reopened =
      nfs->Open(NfsPath("f"), {io::OpenOptions::Mode::kCreateWrite, false}, &fd, nullptr);
  ASSERT_TRUE(reopened.ok()) << reopened.ToString();
  ASSERT_TRUE(io::WriteAt(*q, fd, 0, data.data(), data.size(), "write").ok());
  ASSERT_TRUE(io::SyncFile(*q, fd, "commit").ok());
  ASSERT_TRUE(nfs->Close(fd).ok());
}

TEST_F(NfsTest, ClientNamesTheServerWhenItDoesNotAnswer) {
  std::unique_ptr<io::Io> nfs = io::NewPosixIo();
  server_->Kill();
  std::string text;
  Status st = nfs->ReadFile(NfsPath("m"), &text);
  EXPECT_EQ(st.code(), CKPTDB_EIO) << st.ToString();
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(server_->port())), std::string::npos)
      << st.message();
  // Not an export at all: the server refuses every directory up to the root.
  ASSERT_RESTARTS(server_);
  st = nfs->ReadFile(
      io::MakeNfsPath("127.0.0.1", server_->port(), server_->mount_port(), "/not/exported"), &text);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no export"), std::string::npos) << st.message();
}

// ---- The tier ---------------------------------------------------------------------------------

class NfsTierTest : public NfsTest {
 protected:
  void SetUp() override {
    NfsTest::SetUp();
    if (HasFatalFailure()) return;
    ckptdb_options_init(&o_);
    root_ = mem_.Sub("root");
    first_ = mem_.Sub("tmpfs");
    o_.root = root_.c_str();
    o_.chunk_bytes = 256 << 10;
    o_.staging_bytes = 4 << 20;
    UseNfsDir(export_ + "/ck");
  }
  void TearDown() override {
    if (db_ != nullptr) ckptdb_close(db_);
  }
  void UseNfsDir(const std::string& dir) {
    nfs_dir_ = dir;
    tiers_ = "tmpfs:" + first_ + ";" + server_->Spec(dir);
  }
  int Open() {
    o_.tiers = tiers_.c_str();
    return ckptdb_open(&o_, &db_);
  }
  void Close() {
    ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK) << ckptdb_last_error();
    db_ = nullptr;
  }
  void Commit(uint64_t v, size_t bytes = 1 << 20) {
    auto data = RandomBytes(bytes, Seed(v));
    ASSERT_EQ(ckptdb_put_shard(db_, v, "w", data.data(), data.size(), nullptr, 0), CKPTDB_OK)
        << ckptdb_last_error();
    ASSERT_EQ(ckptdb_commit(db_, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }
  // Waits until v is durable on the nfs tier (retrying while the tier is offline).
  int WaitNfs(uint64_t v, int seconds = 60) {
    int rc = CKPTDB_ETIMEDOUT;
    for (int i = 0; i < seconds * 10; ++i) {
      rc = ckptdb_wait_commit(db_, v, "nfs", 100);
      if (rc == CKPTDB_OK || rc == CKPTDB_ENOSPC) return rc;
      if (rc != CKPTDB_EIO && rc != CKPTDB_ETIMEDOUT) return rc;
      std::this_thread::sleep_for(std::chrono::milliseconds(rc == CKPTDB_EIO ? 100 : 0));
    }
    return rc;
  }
  void ExpectRestores(uint64_t v, size_t bytes = 1 << 20) {
    std::vector<uint8_t> out(bytes);
    ASSERT_EQ(ckptdb_restore(db_, v, "w", out.data(), out.size(), 0), CKPTDB_OK)
        << v << ": " << ckptdb_last_error();
    EXPECT_EQ(out, RandomBytes(out.size(), Seed(v))) << v;
  }
  // Segment files (and temporary ones) in a local directory.
  static std::set<std::string> Files(const std::string& dir) {
    std::set<std::string> out;
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
    return out;
  }
  static std::set<std::string> Segments(const std::string& dir) {
    std::set<std::string> out;
    for (const std::string& n : Files(dir)) {
      if (n.find(".seg") != std::string::npos) out.insert(n);
    }
    return out;
  }
  // Restores come from the nfs tier alone: the first tier's files removed and the store reopened.
  void DropFirstTierAndReopen() {
    Close();
    for (const std::string& n : Segments(first_)) fs::remove(first_ + "/" + n);
    ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  }
  std::map<uint64_t, int> NfsResidency() {
    return test::ResidencyOn(db_, "nfs:127.0.0.1:" + nfs_dir_);
  }

  TempDir mem_{"/dev/shm"};
  std::string root_, first_, nfs_dir_, tiers_;
  ckptdb_options o_;
  ckptdb* db_ = nullptr;
};

TEST_F(NfsTierTest, DemotesToTheServerAndRestoresFromIt) {
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  for (uint64_t v = 1; v <= 3; ++v) Commit(v, (3 << 20) + 17 * v);
  for (uint64_t v = 1; v <= 3; ++v) ASSERT_EQ(WaitNfs(v), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(Segments(nfs_dir_).size(), 3u);
  EXPECT_TRUE(fs::exists(nfs_dir_ + "/CKPTDB-TIER")) << "the tier's marker";
  for (const std::string& n : Files(nfs_dir_)) EXPECT_FALSE(n.ends_with(".tmp")) << n;
  ckptdb_stats_t stats;
  ASSERT_EQ(ckptdb_stats(db_, &stats), CKPTDB_OK);
  DropFirstTierAndReopen();
  for (uint64_t v = 1; v <= 3; ++v) ExpectRestores(v, (3 << 20) + 17 * v);
  // A flipped byte on the server is found by the chunk checksums, never restored.
  const std::string seg = nfs_dir_ + "/" + *Segments(nfs_dir_).begin();
  test::FlipByte(seg, fs::file_size(seg) / 2);
  Close();
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  std::vector<uint8_t> out((3 << 20) + 17);
  EXPECT_EQ(ckptdb_restore(db_, 1, "w", out.data(), out.size(), 0), CKPTDB_ECORRUPT)
      << ckptdb_last_error() << " " << seg << " " << (out == RandomBytes(out.size(), Seed(1)));
}

// The server dies while a version is being written to it, and comes back: the version is never
// recorded on the tier while its file is incomplete, the other tier goes on, and the demotion
// runs again once the server answers.
TEST_F(NfsTierTest, ServerKilledMidDemotionAndRestartedResumesIt) {
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  Commit(1);
  ASSERT_EQ(WaitNfs(1), CKPTDB_OK) << ckptdb_last_error();
  constexpr size_t kBig = 48 << 20;
  Commit(2, kBig);
  // Mid-demotion: the temporary file exists on the server and holds part of the version.
  bool caught = false;
  for (int i = 0; i < 200'000 && !caught; ++i) {
    for (const std::string& n : Files(nfs_dir_)) {
      std::error_code ec;
      const uint64_t size = fs::file_size(nfs_dir_ + "/" + n, ec);
      if (n.ends_with(".tmp") && !ec && size > 0 && size < kBig) caught = true;
    }
    if (!caught) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  server_->Kill();
  ASSERT_TRUE(caught) << "the demotion of version 2 was not seen in flight";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NE(NfsResidency()[2], CKPTDB_RESIDENT_DURABLE) << "a half-written copy never counts";
  int rc = ckptdb_wait_commit(db_, 2, "nfs", 2000);
  EXPECT_EQ(rc, CKPTDB_EIO) << ckptdb_last_error();
  EXPECT_NE(std::string(ckptdb_last_error()).find("nfs:127.0.0.1:" + nfs_dir_), std::string::npos)
      << ckptdb_last_error();
  // The first tier works on without the server.
  Commit(3);
  ExpectRestores(2, kBig);
  ASSERT_RESTARTS(server_);
  ASSERT_EQ(WaitNfs(2), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(WaitNfs(3), CKPTDB_OK) << ckptdb_last_error();
  for (const std::string& n : Files(nfs_dir_)) EXPECT_FALSE(n.ends_with(".tmp")) << n;
  DropFirstTierAndReopen();
  ExpectRestores(1);
  ExpectRestores(2, kBig);
  ExpectRestores(3);
}

TEST_F(NfsTierTest, UnreachableServerAtOpenLeavesTheOtherTiersWorking) {
  server_->Kill();
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  Commit(1);
  ExpectRestores(1);
  EXPECT_EQ(ckptdb_wait_commit(db_, 1, "nfs", -1), CKPTDB_EIO);
  const std::string why = ckptdb_last_error();
  EXPECT_NE(why.find("tier nfs:127.0.0.1:" + nfs_dir_ + " is offline"), std::string::npos) << why;
  ASSERT_RESTARTS(server_);
  ASSERT_EQ(WaitNfs(1), CKPTDB_OK) << ckptdb_last_error();
  Commit(2);
  ASSERT_EQ(WaitNfs(2), CKPTDB_OK) << ckptdb_last_error();
  DropFirstTierAndReopen();
  ExpectRestores(1);
  ExpectRestores(2);
}

// An export on a small file system: the version that does not fit fails with ENOSPC after its
// tries, leaves nothing on the server, and loses nothing.
TEST_F(NfsTierTest, FullExportFailsTheDemotionWithNoSpaceAndLosesNothing) {
  const std::string small = disk_.Sub("small");
  fs::create_directories(small);
  if (::mount("ckptdb-test", small.c_str(), "tmpfs", 0, "size=6m") != 0) {
    GTEST_SKIP() << "mounting a 6 MiB tmpfs needs root: " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{small};
  std::unique_ptr<NfsServer> small_server;
  fs::create_directories(disk_.Sub("server-small"));
  ASSERT_TRUE(NfsServer::Start(small, disk_.Sub("server-small"), &small_server).ok());
  server_.swap(small_server);
  UseNfsDir(small + "/ck");
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  Commit(1, 4 << 20);
  ASSERT_EQ(WaitNfs(1), CKPTDB_OK) << ckptdb_last_error();
  Commit(2, 4 << 20);
  EXPECT_EQ(WaitNfs(2), CKPTDB_ENOSPC) << ckptdb_last_error();
  for (const std::string& n : Files(nfs_dir_)) EXPECT_FALSE(n.ends_with(".tmp")) << n;
  EXPECT_EQ(Segments(nfs_dir_).size(), 1u);
  ExpectRestores(2, 4 << 20);
  DropFirstTierAndReopen();
  ExpectRestores(1, 4 << 20);
  Close();
  small_server.reset();
}

// The export recreated while the store runs (moved away and copied back: every file a new inode,
// so every handle the client held is stale): the store finds its directory again by path.
TEST_F(NfsTierTest, StaleHandlesAfterTheExportIsRecreated) {
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  Commit(1);
  ASSERT_EQ(WaitNfs(1), CKPTDB_OK) << ckptdb_last_error();
  server_->Kill();
  const std::string old = export_ + ".old";
  fs::rename(export_, old);
  fs::copy(old, export_, fs::copy_options::recursive);
  ASSERT_RESTARTS(server_);
  Commit(2);
  ASSERT_EQ(WaitNfs(2), CKPTDB_OK) << ckptdb_last_error();
  DropFirstTierAndReopen();
  ExpectRestores(1);
  ExpectRestores(2);
}

TEST_F(NfsTierTest, AnotherStoresDirectoryIsRefused) {
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  Commit(1);
  ASSERT_EQ(WaitNfs(1), CKPTDB_OK) << ckptdb_last_error();
  // A second store (its own root and first tier, a job id of its own) on the same nfs directory.
  TempDir other;
  const std::string other_root = other.Sub("root");
  const std::string other_tiers = "tmpfs:" + other.Sub("t") + ";" + server_->Spec(nfs_dir_);
  ckptdb_options o = o_;
  o.root = other_root.c_str();
  o.tiers = other_tiers.c_str();
  ckptdb* second = nullptr;
  EXPECT_EQ(ckptdb_open(&o, &second), CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("belongs to another store"), std::string::npos)
      << ckptdb_last_error();
  EXPECT_EQ(Segments(nfs_dir_).size(), 1u) << "nothing of the first store was touched";
  ExpectRestores(1);
}

// Another job reads the nfs directory alone: no root, no catalog, no first tier. It lists what
// the rank committed and still keeps there (keep=2: version 1 was evicted, its witness with it).
// The ranks of a job share one nfs directory and open it at once: every one of them writes the
// tier's marker (the same bytes) and none fails. Each writes under a name of its own and renames
// it into place; with one shared CKPTDB-TIER.tmp, a rank found it renamed away under it
// ("stat CKPTDB-TIER.tmp: No such file"), which failed a 4-rank job in CI. Ten rounds of eight
// writers, each round on a fresh directory.
TEST_F(NfsTierTest, WritersOpeningOneSharedDirectoryAtOnceAllSucceed) {
  std::unique_ptr<io::Io> posix = io::NewPosixIo();
  for (int round = 0; round < 10; ++round) {
    const std::string dir = export_ + "/shared" + std::to_string(round);
    std::vector<io::TierSpec> specs;
    ASSERT_TRUE(io::ParseTierSpecs(server_->Spec(dir), "/", &specs).ok());
    std::vector<Status> opened(8);
    std::vector<std::thread> writers;
    for (size_t w = 0; w < opened.size(); ++w) {
      writers.emplace_back([&, w] {
        engine::Tier tier(posix.get(), specs[0]);
        opened[w] = tier.Open(/*job_id=*/0x5eed, /*read_only=*/false);
      });
    }
    for (std::thread& t : writers) t.join();
    for (const Status& st : opened) EXPECT_TRUE(st.ok()) << st.ToString();
    std::string marker;
    ASSERT_TRUE(posix->ReadFile(specs[0].path + "/CKPTDB-TIER", &marker).ok());
    engine::Tier again(posix.get(), specs[0]);
    EXPECT_TRUE(again.Open(0x5eed, true).ok()) << marker;
    for (const std::string& n : Files(dir)) {
      EXPECT_TRUE(n == "CKPTDB-TIER") << "left behind: " << n;
    }
  }
}

TEST_F(NfsTierTest, TheNfsDirectoryAloneIsReadableByAnotherJob) {
  tiers_ = "tmpfs:" + first_ + ";" + server_->Spec(nfs_dir_, ",keep=2");
  ASSERT_EQ(Open(), CKPTDB_OK) << ckptdb_last_error();
  for (uint64_t v = 1; v <= 3; ++v) Commit(v);
  Close();  // drains the demotions and the eviction of version 1 from the nfs tier
  fs::remove_all(root_);
  fs::remove_all(first_);
  EXPECT_EQ(Files(nfs_dir_ + "/commits"),
            (std::set<std::string>{"v00000000000000000002-r00000.commit",
                                   "v00000000000000000003-r00000.commit"}));
  const std::string spec = server_->Spec(nfs_dir_);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.tiers = spec.c_str();
  o.read_only = 1;
  ASSERT_EQ(ckptdb_open(&o, &db_), CKPTDB_OK) << ckptdb_last_error();
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(latest, 3u);
  EXPECT_EQ(NfsResidency(),
            (std::map<uint64_t, int>{{2, CKPTDB_RESIDENT_DURABLE}, {3, CKPTDB_RESIDENT_DURABLE}}));
  ExpectRestores(2);
  ExpectRestores(3);
  std::vector<uint8_t> out(1 << 20);
  EXPECT_EQ(ckptdb_put_shard(db_, 4, "w", out.data(), out.size(), nullptr, 0), CKPTDB_ESTATE);
  Close();
  EXPECT_FALSE(fs::exists(root_)) << "nothing was made in the writer's place";
  // A rank that wrote nothing there, and a directory no store wrote: NotFound, saying why.
  o.rank = 1;
  EXPECT_EQ(ckptdb_open(&o, &db_), CKPTDB_ENOTFOUND);
  EXPECT_NE(std::string(ckptdb_last_error()).find("no commit witness of rank 1"), std::string::npos)
      << ckptdb_last_error();
  // A segment whose bytes were damaged on the server: the view lists it, restore refuses it.
  o.rank = 0;
  test::FlipByte(nfs_dir_ + "/v00000000000000000003-r00000.seg", (1 << 19) + 4096 * 2);
  ASSERT_EQ(ckptdb_open(&o, &db_), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(ckptdb_restore(db_, 3, "w", out.data(), out.size(), 0), CKPTDB_ECORRUPT);
  ExpectRestores(2);
}

}  // namespace
}  // namespace ckpt
