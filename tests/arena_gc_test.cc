// Shared memory that outlives its store (issue 24; engine/arena_gc.h, ckptdb_gc, `ckptdb gc`):
// orphaned arenas (root gone, root reused by another store) and replica and parity directories
// are found and removed; what a live process has open, what its root owns, and what cannot be
// told apart are never removed.
#include "engine/arena_gc.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "io/mapped_file.h"
#include "io/shared_memory.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using engine::ShmEntry;
using test::TempDir;

class ArenaGcTest : public ::testing::Test {
 protected:
  // A store at disk_/<name> with its arena in shm_, one committed version.
  ckptdb* Open(const std::string& name, bool commit = true) {
    const std::string root = disk_.Sub(name);
    const std::string tiers = "ram:8M,dir=" + shm_.path();
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root.c_str();
    o.tiers = tiers.c_str();
    o.chunk_bytes = 64 << 10;
    ckptdb* db = nullptr;
    EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
    if (db != nullptr && commit) {
      std::vector<uint8_t> data(100000, 7);
      EXPECT_EQ(ckptdb_put_shard(db, 3, "w", data.data(), data.size(), nullptr, 0), CKPTDB_OK);
      EXPECT_EQ(ckptdb_commit(db, 3, 0), CKPTDB_OK) << ckptdb_last_error();
    }
    return db;
  }
  std::map<std::string, ShmEntry> Collect(bool remove) {
    std::vector<ShmEntry> entries;
    Status st = engine::CollectSharedMemory(shm_.path(), remove, &entries);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::map<std::string, ShmEntry> by_root;
    for (ShmEntry& e : entries) {
      by_root[e.kind == ShmEntry::Kind::kArena ? e.root : fs::path(e.path).filename().string()] = e;
    }
    return by_root;
  }
  size_t Arenas() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(shm_.path())) {
      n += e.path().extension() == ".ram";
    }
    return n;
  }

  TempDir shm_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
};

TEST_F(ArenaGcTest, OrphansAreFoundAndRemovedAndLiveOrOwnedArenasStay) {
  // gone: its root deleted. reused: its root deleted and a new store made there (another job id,
  // another arena). kept: closed, its root intact. live: open, its root deleted under it.
  for (const char* name : {"gone", "reused", "kept"}) ASSERT_EQ(ckptdb_close(Open(name)), 0);
  fs::remove_all(disk_.Sub("gone"));
  fs::remove_all(disk_.Sub("reused"));
  ASSERT_EQ(ckptdb_close(Open("reused", /*commit=*/false)), CKPTDB_OK);
  ckptdb* live = Open("live");
  fs::remove_all(disk_.Sub("live"));
  ASSERT_EQ(Arenas(), 5u);

  std::vector<ShmEntry> all;
  ASSERT_TRUE(engine::CollectSharedMemory(shm_.path(), false, &all).ok());
  ASSERT_EQ(all.size(), 5u);
  size_t orphans = 0, in_use = 0, owned = 0;
  for (const ShmEntry& e : all) {
    EXPECT_EQ(e.kind, ShmEntry::Kind::kArena);
    EXPECT_EQ(e.bytes, 8u << 20) << e.path;
    EXPECT_TRUE(e.root.starts_with(disk_.path())) << e.root;
    EXPECT_FALSE(e.removed);
    orphans += e.orphan;
    in_use += e.in_use;
    owned += e.owned;
    if (e.root == disk_.Sub("kept")) {
      EXPECT_TRUE(e.owned && !e.orphan && e.has_version && e.newest_version == 3) << e.problem;
    }
    if (e.root == disk_.Sub("gone")) {
      EXPECT_TRUE(e.orphan && !e.root_exists && !e.in_use);
    }
  }
  EXPECT_EQ(orphans, 3u) << "gone, the old arena of reused, and live (root deleted)";
  EXPECT_EQ(in_use, 1u);
  EXPECT_EQ(owned, 2u) << "kept, and reused's new arena";
  EXPECT_EQ(Arenas(), 5u) << "listing removes nothing";

  std::vector<ShmEntry> after;
  ASSERT_TRUE(engine::CollectSharedMemory(shm_.path(), true, &after).ok());
  size_t removed = 0;
  for (const ShmEntry& e : after) {
    removed += e.removed;
    if (e.in_use) {
      EXPECT_FALSE(e.removed) << "a live process's arena is never removed";
    }
  }
  EXPECT_EQ(removed, 2u);
  EXPECT_EQ(Arenas(), 3u);
  // The live store works on, and once it closes its arena goes too.
  std::vector<uint8_t> out(100000);
  EXPECT_EQ(ckptdb_restore(live, 3, "w", out.data(), out.size(), 0), CKPTDB_OK);
  ASSERT_EQ(ckptdb_close(live), CKPTDB_OK);
  ASSERT_TRUE(engine::CollectSharedMemory(shm_.path(), true, &after).ok());
  EXPECT_EQ(Arenas(), 2u);
  // The survivors open as before.
  ckptdb* kept = Open("kept", /*commit=*/false);
  EXPECT_EQ(ckptdb_restore(kept, 3, "w", out.data(), out.size(), 0), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(ckptdb_close(kept), CKPTDB_OK);
}

TEST_F(ArenaGcTest, AnArenaWhoseHeaderDoesNotReadIsNeverRemoved) {
  const std::string path = shm_.Sub("ckptdb-00000000000000aa-r00002.ram");
  test::WriteWholeFile(path, std::string(1 << 16, 'z'));
  std::vector<ShmEntry> all;
  ASSERT_TRUE(engine::CollectSharedMemory(shm_.path(), true, &all).ok());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_FALSE(all[0].orphan);
  EXPECT_FALSE(all[0].removed);
  EXPECT_NE(all[0].problem.find("header does not read"), std::string::npos) << all[0].problem;
  EXPECT_TRUE(fs::exists(path));
  // Names that are not ckptdb's are not looked at.
  test::WriteWholeFile(shm_.Sub("ckptdb-zz-r00002.ram"), "x");
  test::WriteWholeFile(shm_.Sub("other"), "x");
  ASSERT_TRUE(engine::CollectSharedMemory(shm_.path(), true, &all).ok());
  EXPECT_EQ(all.size(), 1u);
}

TEST_F(ArenaGcTest, ReplicaAndParityDirectoriesGoWithTheirRanksArena) {
  // Rank 0's directories beside its owned arena stay; rank 3's (no arena) are orphans, removed
  // file by file, except while one of its files is held open.
  ASSERT_EQ(ckptdb_close(Open("kept")), CKPTDB_OK);
  for (const char* dir : {"ckptdb-replicas-r0", "ckptdb-replicas-r3", "ckptdb-parity-r3"}) {
    fs::create_directories(shm_.Sub(dir) + "/parity");
  }
  test::WriteWholeFile(shm_.Sub("ckptdb-replicas-r0/r00001-v00000000000000000003.seg"), "a");
  test::WriteWholeFile(shm_.Sub("ckptdb-replicas-r3/r00001-v00000000000000000007.seg"), "bb");
  test::WriteWholeFile(shm_.Sub("ckptdb-replicas-r3/r00002-v00000000000000000009.seg"), "cc");
  test::WriteWholeFile(shm_.Sub("ckptdb-parity-r3/g00000-v00000000000000000004.par"), "dd");
  test::WriteWholeFile(shm_.Sub("ckptdb-parity-r3/parity/s00000000000000000000r00"), "ee");
  std::shared_ptr<io::MappedFile> held;
  ASSERT_TRUE(io::MappedFile::Open(shm_.Sub("ckptdb-replicas-r3/r00001-v00000000000000000007.seg"),
                                   io::MappedFileOptions::ReadOnly(), &held)
                  .ok());
  std::map<std::string, ShmEntry> e = Collect(/*remove=*/true);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_TRUE(e["ckptdb-replicas-r0"].owned && !e["ckptdb-replicas-r0"].orphan);
  EXPECT_TRUE(e["ckptdb-replicas-r3"].orphan && e["ckptdb-replicas-r3"].in_use);
  EXPECT_FALSE(e["ckptdb-replicas-r3"].removed);
  EXPECT_EQ(e["ckptdb-replicas-r3"].newest_version, 9u);
  EXPECT_EQ(e["ckptdb-replicas-r3"].bytes, 4u);
  EXPECT_TRUE(e["ckptdb-parity-r3"].removed) << e["ckptdb-parity-r3"].problem;
  EXPECT_EQ(e["ckptdb-parity-r3"].newest_version, 4u);
  EXPECT_FALSE(fs::exists(shm_.Sub("ckptdb-parity-r3")));
  EXPECT_TRUE(fs::exists(shm_.Sub("ckptdb-replicas-r3")));
  EXPECT_TRUE(fs::exists(shm_.Sub("ckptdb-replicas-r0/r00001-v00000000000000000003.seg")));
  held.reset();
  e = Collect(/*remove=*/true);
  EXPECT_TRUE(e["ckptdb-replicas-r3"].removed) << e["ckptdb-replicas-r3"].problem;
  EXPECT_FALSE(fs::exists(shm_.Sub("ckptdb-replicas-r3")));
}

// A mapper that opened a file gc then unlinked sees it when it takes its lock, and opens again.
TEST_F(ArenaGcTest, LockSharedSeesAFileRemovedBetweenItsOpenAndItsLock) {
  const std::string path = shm_.Sub("f");
  test::WriteWholeFile(path, "one");
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  bool stale = true;
  ASSERT_TRUE(io::LockShared(fd, path, &stale).ok());
  EXPECT_FALSE(stale);
  ::unlink(path.c_str());
  test::WriteWholeFile(path, "two");
  ASSERT_TRUE(io::LockShared(fd, path, &stale).ok());
  EXPECT_TRUE(stale);
  ::close(fd);
}

TEST_F(ArenaGcTest, TheCommandListsAndRemoves) {
  ASSERT_EQ(ckptdb_close(Open("gone")), CKPTDB_OK);
  fs::remove_all(disk_.Sub("gone"));
  std::string out;
  EXPECT_EQ(test::RunCommand(std::string(CKPTDB_CLI) + " gc " + shm_.path(), &out), 0) << out;
  EXPECT_NE(out.find("orphan: root gone"), std::string::npos) << out;
  EXPECT_NE(out.find("1 orphan(s) holding 8.0 MiB; --remove deletes them"), std::string::npos)
      << out;
  EXPECT_EQ(Arenas(), 1u);
  EXPECT_EQ(test::RunCommand(std::string(CKPTDB_CLI) + " gc --remove " + shm_.path(), &out), 0);
  EXPECT_NE(out.find("1 orphan(s) removed (8.0 MiB)"), std::string::npos) << out;
  EXPECT_EQ(Arenas(), 0u);
  EXPECT_EQ(test::RunCommand(std::string(CKPTDB_CLI) + " gc " + shm_.Sub("none"), &out), 2) << out;
  EXPECT_NE(out.find("no directory"), std::string::npos) << out;
}

}  // namespace
}  // namespace ckpt
