// The C API for one rank: the happy path, every documented misuse, reopen, retention.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using test::RandomBytes;
using test::TempDir;

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tiers_ = "tmpfs:" + mem_.Sub("t1") + ";disk:" + disk_.Sub("t2");
    ckptdb_options_init(&o_);
    o_.root = nullptr;
    root_ = mem_.Sub("root");
    o_.root = root_.c_str();
    o_.tiers = tiers_.c_str();
    o_.rank = 0;
    o_.world_size = 1;
    o_.chunk_bytes = 64 << 10;  // small chunks so small tensors span several
    o_.staging_bytes = 1 << 20;
  }
  void TearDown() override {
    if (db_ != nullptr) ckptdb_close(db_);
  }
  void Open() { ASSERT_EQ(ckptdb_open(&o_, &db_), CKPTDB_OK) << ckptdb_last_error(); }
  void Reopen() {
    ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK) << ckptdb_last_error();
    db_ = nullptr;
    Open();
  }
  // Callers pass temporaries: COPY_NOW, so the bytes are out of `data` when Put returns.
  void Put(uint64_t v, const std::string& name, const std::vector<uint8_t>& data) {
    ASSERT_EQ(ckptdb_put_shard(db_, v, name.c_str(), data.data(), data.size(), nullptr,
                               CKPTDB_PUT_COPY_NOW),
              CKPTDB_OK)
        << ckptdb_last_error();
  }
  std::vector<uint8_t> Get(uint64_t v, const std::string& name, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(ckptdb_restore(db_, v, name.c_str(), out.data(), n, 0), CKPTDB_OK)
        << ckptdb_last_error();
    return out;
  }
  // How many tensors committed version v lists.
  size_t Listed(uint64_t v) {
    size_t listed = 0;
    EXPECT_EQ(ckptdb_list(
                  db_, v,
                  [](void* arg, const ckptdb_tensor_desc*) {
                    ++*static_cast<size_t*>(arg);
                    return 0;
                  },
                  &listed),
              CKPTDB_OK)
        << ckptdb_last_error();
    return listed;
  }
  static bool Mentions(const char* needle) {
    return std::string(ckptdb_last_error()).find(needle) != std::string::npos;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, tiers_;
  ckptdb_options o_;
  ckptdb* db_ = nullptr;
};

TEST_F(ApiTest, PutCommitRestoreRoundTripAcrossReopen) {
  Open();
  auto a = RandomBytes(300 << 10, 1), b = RandomBytes(17, 2), empty = std::vector<uint8_t>();
  Put(10, "layers.0.w", a);
  Put(10, "layers.0.b", b);
  Put(10, "empty", empty);
  ASSERT_EQ(ckptdb_commit(db_, 10, 0), CKPTDB_OK) << ckptdb_last_error();
  Reopen();
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, 10u);
  EXPECT_EQ(Get(10, "layers.0.w", a.size()), a);
  EXPECT_EQ(Get(10, "layers.0.b", b.size()), b);
  EXPECT_EQ(ckptdb_restore(db_, 10, "empty", nullptr, 0, 0), CKPTDB_OK) << ckptdb_last_error();
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(std::string(st.last_restore_tier), "tmpfs:" + mem_.Sub("t1"));
}

// Alone, a committed version is recoverable from the rank's own tiers with no node loss to
// spare; an unknown or open version is an error that says so.
TEST_F(ApiTest, RecoverableAloneSaysWhichTiersAndNoLossToSpare) {
  Open();
  Put(3, "w", RandomBytes(5000, 3));
  ckptdb_recoverable_t r;
  EXPECT_EQ(ckptdb_recoverable(db_, 3, &r), CKPTDB_ESTATE) << "open, not committed";
  ASSERT_EQ(ckptdb_commit(db_, 3, 0), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_recoverable(db_, 3, &r), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(r.recoverable, 1);
  EXPECT_EQ(r.spare_losses, 0);
  EXPECT_EQ(r.ranks_local, 1u);
  EXPECT_EQ(r.ranks_lost, 0u);
  EXPECT_NE(std::string(r.detail).find("tmpfs:"), std::string::npos) << r.detail;
  EXPECT_EQ(ckptdb_recoverable(db_, 99, &r), CKPTDB_ENOTFOUND);
  EXPECT_EQ(ckptdb_recoverable(db_, 3, nullptr), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_recoverable(nullptr, 3, &r), CKPTDB_EINVAL);
}

// Replica groups are a job's (ckptdb_declare_replicas): a rank alone is refused, and so is a
// replicated put without a declaration; neither changes anything.
TEST_F(ApiTest, ReplicaGroupsNeedAJob) {
  Open();
  const uint32_t members[2] = {0, 1};
  EXPECT_EQ(ckptdb_declare_replicas(db_, 0, members, 2, nullptr), CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("needs a job"), std::string::npos)
      << ckptdb_last_error();
  EXPECT_EQ(ckptdb_declare_replicas(nullptr, 0, members, 2, nullptr), CKPTDB_EINVAL);
  auto data = RandomBytes(100, 1);
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "w", data.data(), data.size(), nullptr, CKPTDB_PUT_REPLICATED),
            CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("ckptdb_declare_replicas"), std::string::npos)
      << ckptdb_last_error();
  // REFT's AOR: a recomputed replica needs a group declared with it; the reserved prefix is
  // never a name of the caller's; a shard is not both every member's and the next one's.
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "w", data.data(), data.size(), nullptr, CKPTDB_PUT_RECOMPUTED),
            CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("with REFT's AOR"), std::string::npos)
      << ckptdb_last_error();
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "@aor:w", data.data(), data.size(), nullptr, 0),
            CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("reserved for recomputed replicas"),
            std::string::npos)
      << ckptdb_last_error();
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "w", data.data(), data.size(), nullptr,
                             CKPTDB_PUT_REPLICATED | CKPTDB_PUT_RECOMPUTED),
            CKPTDB_EINVAL);
  const std::string longest(CKPTDB_MAX_NAME_BYTES - 4, 'n');  // with the prefix, 1 byte over
  EXPECT_EQ(ckptdb_put_shard(db_, 1, longest.c_str(), data.data(), data.size(), nullptr,
                             CKPTDB_PUT_RECOMPUTED),
            CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("must then fit"), std::string::npos)
      << ckptdb_last_error();
  uint64_t latest = 0;
  EXPECT_EQ(ckptdb_latest(db_, &latest), CKPTDB_ENOTFOUND) << "the refused put opened nothing";
}

TEST_F(ApiTest, TensorInfoIsListedBackInNameOrder) {
  Open();
  auto w = RandomBytes(4 * 6 * 2, 3);
  ckptdb_tensor_info info{};
  info.dtype = CKPTDB_DTYPE_BF16;
  info.ndim = 2;
  info.shape[0] = 4;
  info.shape[1] = 6;
  info.global_shape[0] = 8;
  info.global_shape[1] = 6;
  info.global_offset[0] = 4;
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "z.w", w.data(), w.size(), &info, 0), CKPTDB_OK)
      << ckptdb_last_error();
  Put(1, "a.raw", RandomBytes(5, 4));
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK);
  struct Seen {
    std::vector<std::string> names;
    std::vector<uint64_t> shape, global_shape, global_offset;
    int dtype = -1;
  } seen;
  ASSERT_EQ(ckptdb_list(
                db_, 1,
                [](void* arg, const ckptdb_tensor_desc* t) {
                  auto* s = static_cast<Seen*>(arg);
                  s->names.push_back(t->name);
                  if (std::string(t->name) == "z.w") {
                    s->dtype = t->dtype;
                    s->shape.assign(t->shape, t->shape + t->ndim);
                    s->global_shape.assign(t->global_shape, t->global_shape + t->ndim);
                    s->global_offset.assign(t->global_offset, t->global_offset + t->ndim);
                  }
                  return 0;
                },
                &seen),
            CKPTDB_OK);
  EXPECT_EQ(seen.names, (std::vector<std::string>{"a.raw", "z.w"}));
  EXPECT_EQ(seen.dtype, CKPTDB_DTYPE_BF16);
  EXPECT_EQ(seen.shape, (std::vector<uint64_t>{4, 6}));
  EXPECT_EQ(seen.global_shape, (std::vector<uint64_t>{8, 6}));
  EXPECT_EQ(seen.global_offset, (std::vector<uint64_t>{4, 0}));
}

TEST_F(ApiTest, MisuseReturnsDocumentedStatusAndChangesNothing) {
  Open();
  auto d = RandomBytes(100, 5);
  EXPECT_EQ(ckptdb_put_shard(db_, 1, nullptr, d.data(), d.size(), nullptr, 0), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("name is NULL"));
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "", d.data(), d.size(), nullptr, 0), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("name is empty"));
  std::string long_name(CKPTDB_MAX_NAME_BYTES + 1, 'x');
  EXPECT_EQ(ckptdb_put_shard(db_, 1, long_name.c_str(), d.data(), d.size(), nullptr, 0),
            CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", nullptr, 10, nullptr, 0), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("data is NULL"));
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", d.data(), d.size(), nullptr, 0x80), CKPTDB_EINVAL);
  // Host memory named device memory: no device to copy it with (a host build, or a CUDA build
  // where there is no GPU), or, with a GPU, refused as host memory.
  const int device_rc =
      ckptdb_put_shard(db_, 1, "x", d.data(), d.size(), nullptr, CKPTDB_PUT_DEVICE);
  EXPECT_TRUE(device_rc == CKPTDB_ENOTSUP || device_rc == CKPTDB_EINVAL) << device_rc;
  EXPECT_TRUE(Mentions(device_rc == CKPTDB_ENOTSUP ? "device" : "host memory"))
      << ckptdb_last_error();
  std::vector<uint8_t> back(d.size());
  const int restore_rc =
      ckptdb_restore(db_, 1, "x", back.data(), back.size(), CKPTDB_RESTORE_DEVICE);
  EXPECT_TRUE(restore_rc == CKPTDB_ENOTSUP || restore_rc == CKPTDB_EINVAL) << restore_rc;
  EXPECT_EQ(ckptdb_put_shard(db_, CKPTDB_ALL_VERSIONS, "x", d.data(), d.size(), nullptr, 0),
            CKPTDB_EINVAL);
  ckptdb_tensor_info info{};
  info.dtype = CKPTDB_DTYPE_F32;
  info.ndim = 1;
  info.shape[0] = 7;  // 28 bytes, not 100
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", d.data(), d.size(), &info, 0), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("28 bytes"));
  info.shape[0] = 25;
  info.global_shape[0] = 30;
  info.global_offset[0] = 10;  // 10 + 25 > 30
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", d.data(), d.size(), &info, 0), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("outside global size"));
  info.dtype = 99;
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", d.data(), d.size(), &info, 0), CKPTDB_EINVAL);
  info = {};
  info.ndim = CKPTDB_MAX_DIMS + 1;
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", d.data(), d.size(), &info, 0), CKPTDB_EINVAL);
  // None of that opened version 1.
  EXPECT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_ENOTFOUND);
  EXPECT_EQ(ckptdb_wait_capture(db_, 1, 0), CKPTDB_ENOTFOUND);

  Put(5, "x", d);
  EXPECT_EQ(ckptdb_put_shard(db_, 5, "x", d.data(), d.size(), nullptr, 0), CKPTDB_EEXIST);
  EXPECT_TRUE(Mentions("already put"));
  EXPECT_EQ(ckptdb_wait_capture(db_, 5, -1), CKPTDB_OK);
  EXPECT_EQ(ckptdb_commit(db_, 5, 0x40), CKPTDB_EINVAL);
  ASSERT_EQ(ckptdb_commit(db_, 5, 0), CKPTDB_OK);
  EXPECT_EQ(ckptdb_commit(db_, 5, 0), CKPTDB_ESTATE);
  EXPECT_EQ(ckptdb_wait_commit(db_, 5, nullptr, 0), CKPTDB_OK);
  // Put after commit, and versions not above the last committed one.
  EXPECT_EQ(ckptdb_put_shard(db_, 5, "y", d.data(), d.size(), nullptr, 0), CKPTDB_ESTATE);
  EXPECT_EQ(ckptdb_put_shard(db_, 4, "y", d.data(), d.size(), nullptr, 0), CKPTDB_ESTATE);
  EXPECT_TRUE(Mentions("not above the last committed version 5"));
  EXPECT_EQ(ckptdb_abort(db_, 5), CKPTDB_ESTATE);
  // Restore errors.
  std::vector<uint8_t> out(d.size());
  EXPECT_EQ(ckptdb_restore(db_, 5, "x", out.data(), out.size() - 1, 0), CKPTDB_ESIZE);
  EXPECT_TRUE(Mentions("100 bytes"));
  EXPECT_EQ(ckptdb_restore(db_, 5, "nope", out.data(), out.size(), 0), CKPTDB_ENOTFOUND);
  EXPECT_EQ(ckptdb_restore(db_, 6, "x", out.data(), out.size(), 0), CKPTDB_ENOTFOUND);
  EXPECT_TRUE(Mentions("unknown version"));
  EXPECT_EQ(ckptdb_restore(db_, 5, nullptr, out.data(), out.size(), 0), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_restore(db_, 5, "x", nullptr, out.size(), 0), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_restore(db_, 5, "x", out.data(), out.size(), 3), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_wait_commit(db_, 77, nullptr, 0), CKPTDB_ENOTFOUND);
  EXPECT_EQ(ckptdb_abort(db_, 77), CKPTDB_ENOTFOUND);
  EXPECT_EQ(ckptdb_list(
                db_, 77, [](void*, const ckptdb_tensor_desc*) { return 0; }, nullptr),
            CKPTDB_ENOTFOUND);
  // A failed restore of the wrong size leaves the buffer untouched.
  std::vector<uint8_t> sentinel(d.size() - 1, 0xAB);
  EXPECT_EQ(ckptdb_restore(db_, 5, "x", sentinel.data(), sentinel.size(), 0), CKPTDB_ESIZE);
  EXPECT_EQ(sentinel, std::vector<uint8_t>(d.size() - 1, 0xAB));
  // NULL handles.
  EXPECT_EQ(ckptdb_put_shard(nullptr, 1, "x", d.data(), 1, nullptr, 0), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_latest(nullptr, nullptr), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_close(nullptr), CKPTDB_OK);
  EXPECT_EQ(ckptdb_latest(db_, nullptr), CKPTDB_EINVAL);
}

TEST_F(ApiTest, UncommittedVersionIsInvisibleAndAbortedAtClose) {
  Open();
  Put(1, "x", RandomBytes(10, 1));
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK);
  Put(2, "x", RandomBytes(10, 2));
  std::vector<uint8_t> out(10);
  EXPECT_EQ(ckptdb_restore(db_, 2, "x", out.data(), 10, 0), CKPTDB_ESTATE);
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, 1u);
  Reopen();
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK);
  EXPECT_EQ(latest, 1u);
  EXPECT_EQ(ckptdb_restore(db_, 2, "x", out.data(), 10, 0), CKPTDB_ESTATE);
  // No file of version 2 is left on any tier.
  for (const std::string& dir : {mem_.Sub("t1"), disk_.Sub("t2")}) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      EXPECT_EQ(e.path().filename().string().find("v00000000000000000002"), std::string::npos)
          << e.path();
    }
  }
  // An aborted version may be put again and committed.
  auto again = RandomBytes(10, 3);
  Put(2, "x", again);
  ASSERT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(Get(2, "x", 10), again);
}

TEST_F(ApiTest, AbortDeletesFilesAndCommitOfNewerAbortsOlderOpenVersions) {
  Open();
  Put(1, "x", RandomBytes(10, 1));
  ASSERT_EQ(ckptdb_abort(db_, 1), CKPTDB_OK);
  EXPECT_EQ(ckptdb_abort(db_, 1), CKPTDB_OK);  // idempotent
  EXPECT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_ESTATE);
  EXPECT_EQ(ckptdb_wait_commit(db_, 1, nullptr, 0), CKPTDB_ESTATE);
  Put(3, "x", RandomBytes(10, 3));
  Put(4, "x", RandomBytes(10, 4));
  ASSERT_EQ(ckptdb_commit(db_, 4, 0), CKPTDB_OK);
  EXPECT_EQ(ckptdb_commit(db_, 3, 0), CKPTDB_ESTATE);
  struct States {
    std::vector<std::pair<uint64_t, int>> v;
  } s;
  ASSERT_EQ(ckptdb_list_versions(
                db_,
                [](void* arg, const ckptdb_version_info* i) {
                  static_cast<States*>(arg)->v.emplace_back(i->version, i->state);
                  return 0;
                },
                &s),
            CKPTDB_OK);
  EXPECT_EQ(
      s.v, (std::vector<std::pair<uint64_t, int>>{
               {1, CKPTDB_STATE_ABORTED}, {3, CKPTDB_STATE_ABORTED}, {4, CKPTDB_STATE_COMMITTED}}));
}

TEST_F(ApiTest, RetentionKeepsNewestAndEveryThinsSlowTier) {
  tiers_ = "tmpfs:" + mem_.Sub("t1") + ",keep=2;disk:" + disk_.Sub("t2") + ",every=3,keep=2";
  o_.tiers = tiers_.c_str();
  Open();
  for (uint64_t v = 1; v <= 10; ++v) {
    Put(v, "x", RandomBytes(1000, v));
    ASSERT_EQ(ckptdb_commit(db_, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }
  // Demotion and eviction run in the background; close waits for them.
  Reopen();
  auto count = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::string n = e.path().filename().string();
      if (n.ends_with(".seg")) names.push_back(n.substr(0, 21));
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(count(mem_.Sub("t1")),
            (std::vector<std::string>{"v00000000000000000009", "v00000000000000000010"}));
  EXPECT_EQ(count(disk_.Sub("t2")),
            (std::vector<std::string>{"v00000000000000000006", "v00000000000000000009"}));
  // Version 6 is only on the disk tier now, and still restorable from there.
  EXPECT_EQ(Get(6, "x", 1000), RandomBytes(1000, 6));
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(std::string(st.last_restore_tier), "disk:" + disk_.Sub("t2"));
  // Version 5 is on no tier: retired.
  std::vector<uint8_t> out(1000);
  EXPECT_EQ(ckptdb_restore(db_, 5, "x", out.data(), 1000, 0), CKPTDB_ESTATE);
  EXPECT_TRUE(Mentions("RETIRED"));
}

TEST_F(ApiTest, TmpfsTierLostAfterRebootFallsBackToDisk) {
  Open();
  auto a = RandomBytes(200 << 10, 9);
  Put(1, "x", a);
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK);
  ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK);
  db_ = nullptr;
  // A reboot empties the tmpfs tier (marker included).
  std::filesystem::remove_all(mem_.Sub("t1"));
  Open();
  uint64_t latest = 0;
  ASSERT_EQ(ckptdb_latest(db_, &latest), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(latest, 1u);
  EXPECT_EQ(Get(1, "x", a.size()), a);
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(std::string(st.last_restore_tier), "disk:" + disk_.Sub("t2"));
}

TEST_F(ApiTest, OpenRejectsBadOptionsClearly) {
  ckptdb* db = nullptr;
  ckptdb_options bad = o_;
  bad.world_size = 4;  // a job needs a ram first tier (replicas and restores from memory)
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("world_size 4"));
  bad.world_size = 0;
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  bad = o_;
  bad.redundancy = "replicate:2";  // needs peers
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("replicate:2"));
  bad = o_;
  bad.chunk_bytes = 5000;
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("chunk_bytes 5000"));
  bad = o_;
  bad.staging_bytes = 4096;
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  bad = o_;
  bad.tiers = "tape:/x";
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("tape"));
  bad = o_;
  bad.redundancy = "ec:4+2";
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);  // a coding group needs peers
  EXPECT_TRUE(Mentions("ec:4+2"));
  bad.redundancy = "ec:4+0";
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("ec:4+0"));
  bad = o_;
  bad.root = "";
  setenv("CKPTDB_ROOT", "", 1);
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_EINVAL);
  bad = o_;
  bad.read_only = 1;
  EXPECT_EQ(ckptdb_open(&bad, &db), CKPTDB_ENOTFOUND);
  EXPECT_EQ(db, nullptr);
  EXPECT_EQ(ckptdb_open(nullptr, &db), CKPTDB_EINVAL);
}

TEST_F(ApiTest, SecondWriterIsRefusedButReadOnlyToolsMayOpen) {
  Open();
  Put(1, "x", RandomBytes(10, 1));
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK);
  ckptdb* other = nullptr;
  EXPECT_EQ(ckptdb_open(&o_, &other), CKPTDB_EBUSY);
  EXPECT_TRUE(Mentions("open read-write by another handle"));
  ckptdb_options ro;
  ckptdb_options_init(&ro);
  ro.root = root_.c_str();
  ro.read_only = 1;
  ASSERT_EQ(ckptdb_open(&ro, &other), CKPTDB_OK) << ckptdb_last_error();
  uint64_t latest = 0;
  EXPECT_EQ(ckptdb_latest(other, &latest), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(latest, 1u);
  auto d = RandomBytes(10, 1);
  EXPECT_EQ(ckptdb_put_shard(other, 2, "x", d.data(), d.size(), nullptr, 0), CKPTDB_ESTATE);
  EXPECT_TRUE(Mentions("read-only"));
  EXPECT_EQ(ckptdb_close(other), CKPTDB_OK);
}

TEST_F(ApiTest, TierDirectoryOfAnotherStoreIsRefused) {
  Open();
  ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK);
  db_ = nullptr;
  std::string other_root = mem_.Sub("other-root");
  ckptdb_options o = o_;
  o.root = other_root.c_str();
  ckptdb* db = nullptr;
  EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("belongs to another store"));
}

TEST_F(ApiTest, EnvironmentFillsUnsetOptions) {
  setenv("CKPTDB_ROOT", root_.c_str(), 1);
  setenv("CKPTDB_TIERS", tiers_.c_str(), 1);
  setenv("CKPTDB_RANK", "0", 1);
  ckptdb_options o;
  ckptdb_options_init(&o);
  ASSERT_EQ(ckptdb_open(&o, &db_), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK);
  db_ = nullptr;
  setenv("CKPTDB_RANK", "zero", 1);
  EXPECT_EQ(ckptdb_open(&o, &db_), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("CKPTDB_RANK"));
  unsetenv("CKPTDB_RANK");
  // Every variable is resolved and checked in one place (engine/config.cc) before anything is
  // opened: a bad one is named, and a new root is not made.
  const std::string fresh = root_ + "-never-made";
  setenv("CKPTDB_ROOT", fresh.c_str(), 1);
  for (const char* unit : {"5000", "0", "-4096", "134217728", "4k"}) {
    setenv("CKPTDB_EC_UNIT_BYTES", unit, 1);
    EXPECT_EQ(ckptdb_open(&o, &db_), CKPTDB_EINVAL) << unit;
    EXPECT_TRUE(Mentions("CKPTDB_EC_UNIT_BYTES")) << ckptdb_last_error();
  }
  unsetenv("CKPTDB_EC_UNIT_BYTES");
  setenv("CKPTDB_HEARTBEAT_MS", "-5", 1);
  EXPECT_EQ(ckptdb_open(&o, &db_), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("CKPTDB_HEARTBEAT_MS"));
  unsetenv("CKPTDB_HEARTBEAT_MS");
  EXPECT_FALSE(std::filesystem::exists(fresh));
  unsetenv("CKPTDB_ROOT");
  unsetenv("CKPTDB_TIERS");
}

// The threads of this process, and the CPU list (/proc/.../status Cpus_allowed_list) of one.
std::set<std::string> ThreadIds() {
  std::set<std::string> ids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ids.insert(entry.path().filename().string());
  }
  return ids;
}
std::string CpusOf(const std::string& tid) {
  std::ifstream status("/proc/self/task/" + tid + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) return line.substr(line.find_last_of(" \t") + 1);
  }
  return "?";
}

TEST_F(ApiTest, OpenStartsItsThreadsOnTheGivenCpus) {
  cpu_set_t mine;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof mine, &mine), 0);
  int last = -1;  // the highest CPU this thread may run on
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mine)) last = cpu;
  }
  ASSERT_GE(last, 0);
  const std::string cpus = std::to_string(last);
  const std::set<std::string> before = ThreadIds();
  o_.cpus = cpus.c_str();
  o_.capture_threads = 3;
  Open();
  std::vector<std::string> started;
  for (const std::string& tid : ThreadIds()) {
    if (before.count(tid) == 0) started.push_back(tid);
  }
  EXPECT_GE(started.size(), 4u) << "3 capture workers and the tier manager";
  for (const std::string& tid : started) EXPECT_EQ(CpusOf(tid), cpus) << "thread " << tid;
  cpu_set_t after;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof after, &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&mine, &after)) << "the caller's CPUs are given back";
  const std::vector<uint8_t> data = RandomBytes(100000, 3);
  Put(1, "w", data);
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(Get(1, "w", data.size()), data);

  // Bad lists are refused, naming the option, before anything is opened.
  ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK);
  db_ = nullptr;
  ckptdb* db = nullptr;
  for (const char* bad : {"x", "3-1", "1024", "0-", ",", "1,,2", "0 1", "-1", "99999999", "1,"}) {
    ckptdb_options o = o_;
    o.cpus = bad;
    EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_EINVAL) << "'" << bad << "'";
    EXPECT_TRUE(Mentions("cpus")) << ckptdb_last_error();
  }
  int absent = -1;  // a CPU this thread may not run on, if there is one below 1024
  for (int cpu = CPU_SETSIZE - 1; cpu >= 0 && absent < 0; --cpu) {
    if (!CPU_ISSET(cpu, &mine)) absent = cpu;
  }
  if (absent >= 0) {
    const std::string none = std::to_string(absent);
    ckptdb_options o = o_;
    o.cpus = none.c_str();
    EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_EINVAL);
    EXPECT_TRUE(Mentions("none of them")) << ckptdb_last_error();
  }
  ckptdb_options o = o_;
  o.cpus = nullptr;
  setenv("CKPTDB_CPUS", "2-", 1);
  EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("cpus \"2-\""));
  unsetenv("CKPTDB_CPUS");
  EXPECT_EQ(db, nullptr);
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof after, &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&mine, &after));
}

TEST_F(ApiTest, ManyTensorsThroughATinyStagingArea) {
  o_.staging_bytes = 2 * ((64 << 10) + 4096);  // exactly two slots
  Open();
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 200; ++i) {
    data.push_back(RandomBytes(static_cast<size_t>(i * 997 % 150000), static_cast<uint64_t>(i)));
    Put(1, "t" + std::to_string(i), data.back());
  }
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  Reopen();
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(Get(1, "t" + std::to_string(i), data[i].size()), data[i]) << i;
  }
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, 1, nullptr, nullptr, nullptr, &rep), CKPTDB_OK);
  EXPECT_EQ(rep.segments_checked, 2u);
  EXPECT_EQ(rep.problems, 0u);
}

TEST_F(ApiTest, FailedFirstOpenLeavesNothingBehind) {
  // The second tier belongs to another store: the first open fails after it created the root
  // and wrote the first tier's marker. Both must be gone, and a corrected open must work.
  std::string foreign = disk_.Sub("foreign");
  std::filesystem::create_directories(foreign);
  test::WriteWholeFile(foreign + "/CKPTDB-TIER", "ckptdb tier\njob_id=0000000000000001\n");
  std::string spec = "tmpfs:" + mem_.Sub("t1") + ";disk:" + foreign;
  o_.tiers = spec.c_str();
  ckptdb* db = nullptr;
  EXPECT_EQ(ckptdb_open(&o_, &db), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("belongs to another store"));
  EXPECT_FALSE(std::filesystem::exists(root_));
  EXPECT_FALSE(std::filesystem::exists(mem_.Sub("t1") + "/CKPTDB-TIER"));
  o_.tiers = tiers_.c_str();
  Open();
}

TEST_F(ApiTest, ExistingDirectoryThatIsNoStoreIsRefusedUntouched) {
  std::string plain = mem_.Sub("plain");
  std::filesystem::create_directories(plain);
  ckptdb_options o = o_;
  o.root = plain.c_str();
  o.create_if_missing = 0;
  ckptdb* db = nullptr;
  EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_ENOTFOUND);
  o.create_if_missing = 1;
  o.read_only = 1;
  EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_ENOTFOUND);
  EXPECT_TRUE(std::filesystem::is_empty(plain)) << "a refused open must not create files";
}

TEST_F(ApiTest, WaitCaptureOfAbortedVersionAndVerifyByAnySpellingOfTheTier) {
  Open();
  Put(1, "x", RandomBytes(10, 1));
  ASSERT_EQ(ckptdb_abort(db_, 1), CKPTDB_OK);
  EXPECT_EQ(ckptdb_wait_capture(db_, 1, 0), CKPTDB_ESTATE);
  Put(2, "x", RandomBytes(10, 2));
  ASSERT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_OK);
  // The disk tier receives it in the background.
  ASSERT_EQ(ckptdb_wait_commit(db_, 2, "disk", -1), CKPTDB_OK) << ckptdb_last_error();
  std::string spelled = "disk:" + disk_.Sub("t2") + "/./,keep=4";
  ckptdb_verify_report rep{};
  EXPECT_EQ(ckptdb_verify(db_, 2, spelled.c_str(), nullptr, nullptr, &rep), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(rep.segments_checked, 1u);
}

TEST(ApiNames, StatusDtypeAndStateNames) {
  EXPECT_STREQ(ckptdb_status_name(CKPTDB_ECORRUPT), "CKPTDB_ECORRUPT");
  EXPECT_STREQ(ckptdb_status_name(-999), "CKPTDB_E?");
  EXPECT_STREQ(ckptdb_dtype_name(CKPTDB_DTYPE_BF16), "bf16");
  EXPECT_EQ(ckptdb_dtype_bytes(CKPTDB_DTYPE_F64), 8u);
  EXPECT_EQ(ckptdb_dtype_bytes(-1), 0u);
  EXPECT_STREQ(ckptdb_state_name(CKPTDB_STATE_PREPARED), "PREPARED");
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// ckptdb_put_shards: many shards in one call, as many put_shard calls would put them.
TEST_F(ApiTest, PutShardsPutsEveryShardInOneCall) {
  Open();
  constexpr size_t kCount = 2000;
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::string> names;
  std::vector<ckptdb_tensor_info> infos(kCount);
  std::vector<ckptdb_shard> shards(kCount);
  names.reserve(kCount);  // the descriptors point into them
  data.reserve(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    // Sizes from 0 to a few chunks (chunk_bytes is 64 KiB here); f32 for every other one.
    const size_t n = i % 97 == 0 ? (i % 3) * (64 << 10) + 4 : 4 * (i % 50);
    data.push_back(RandomBytes(n, 1000 + i));
    names.push_back("layer." + std::to_string(i) + ".w");
    infos[i].dtype = CKPTDB_DTYPE_F32;
    infos[i].ndim = 1;
    infos[i].shape[0] = n / 4;
    shards[i] = {names[i].c_str(), data[i].data(), n, i % 2 == 0 ? &infos[i] : nullptr,
                 i % 5 == 0 ? CKPTDB_PUT_COPY_NOW : 0u};
  }
  ASSERT_EQ(ckptdb_put_shards(db_, 3, shards.data(), shards.size()), CKPTDB_OK)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_wait_capture(db_, 3, -1), CKPTDB_OK) << ckptdb_last_error();
  // A second call adds to the same version.
  auto extra = RandomBytes(1000, 7);
  ckptdb_shard more{"extra", extra.data(), extra.size(), nullptr, CKPTDB_PUT_COPY_NOW};
  ASSERT_EQ(ckptdb_put_shards(db_, 3, &more, 1), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_commit(db_, 3, 0), CKPTDB_OK) << ckptdb_last_error();
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.put_calls, kCount + 1);  // put_calls counts shards
  Reopen();
  for (size_t i = 0; i < kCount; i += 7) {
    EXPECT_EQ(Get(3, names[i], data[i].size()), data[i]) << names[i];
  }
  EXPECT_EQ(Get(3, "extra", extra.size()), extra);
  EXPECT_EQ(Listed(3), kCount + 1);
}

// The first refusal, named by its index; and nothing of the call is put.
TEST_F(ApiTest, PutShardsIsAllOrNothingAndNamesTheShard) {
  Open();
  auto d = RandomBytes(100, 5);
  ckptdb_tensor_info bad{};
  bad.dtype = CKPTDB_DTYPE_F32;
  bad.ndim = 1;
  bad.shape[0] = 7;  // 28 bytes, not 100
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) names.push_back("t" + std::to_string(i));
  auto batch = [&] {
    std::vector<ckptdb_shard> s;
    for (const std::string& n : names) s.push_back({n.c_str(), d.data(), d.size(), nullptr, 0});
    return s;
  };
  std::vector<ckptdb_shard> s = batch();
  s[7].info = &bad;
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shard 7 of 10")) << ckptdb_last_error();
  EXPECT_TRUE(Mentions("put_shard 't7' into version 1")) << ckptdb_last_error();
  EXPECT_TRUE(Mentions("28 bytes")) << ckptdb_last_error();
  s = batch();
  s[4].name = nullptr;
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shard 4 of 10")) << ckptdb_last_error();
  s = batch();
  s[3].data = nullptr;
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shard 3 of 10: put_shard 't3' into version 1: data is NULL"))
      << ckptdb_last_error();
  s = batch();
  s[9].flags = 0x80;
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shard 9 of 10")) << ckptdb_last_error();
  s = batch();
  s[6].flags = CKPTDB_PUT_REPLICATED;  // no replica group
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shard 6 of 10")) << ckptdb_last_error();
  // Two shards of one call with one name: the later one is named, with the earlier's index.
  s = batch();
  s[8].name = s[2].name;
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EEXIST);
  EXPECT_TRUE(Mentions("shard 8 of 10")) << ckptdb_last_error();
  EXPECT_TRUE(Mentions("shard 2 has the same name")) << ckptdb_last_error();
  // None of that opened version 1.
  EXPECT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_ENOTFOUND);
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_EQ(st.put_calls, 0u);

  // A name already in the version: refused at its index, and the rest of the call with it.
  Put(1, "t5", d);
  s = batch();
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_EEXIST);
  EXPECT_TRUE(Mentions("shard 5 of 10")) << ckptdb_last_error();
  EXPECT_TRUE(Mentions("already put")) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(Listed(1), 1u);
  // The version's state refuses the whole call.
  s = batch();
  EXPECT_EQ(ckptdb_put_shards(db_, 1, s.data(), s.size()), CKPTDB_ESTATE);
  EXPECT_TRUE(Mentions("put_shards into version 1")) << ckptdb_last_error();
  EXPECT_TRUE(Mentions("already committed")) << ckptdb_last_error();
}

// Small shards of one call share chunks (docs/format.md, "Packed shards"): each still restored
// and checked alone, on every tier and after a reopen, also as a slice, and a damaged one does
// not take its pack-mates with it. A version mixes packs with shards that have chunks of their
// own, a zero-byte shard and COPY_NOW shards.
TEST_F(ApiTest, PutShardsPacksSmallShards) {
  for (const bool ram : {false, true}) {
    SCOPED_TRACE(ram ? "ram first tier" : "tmpfs first tier");
    TempDir mem{"/dev/shm"};
    TempDir disk{"/var/tmp"};
    const std::string tiers = (ram ? "ram:64M,dir=" + mem.Sub("ram") : "tmpfs:" + mem.Sub("t1")) +
                              ";disk:" + disk.Sub("t2");
    const std::string root = mem.Sub("root");
    o_.root = root.c_str();
    o_.tiers = tiers.c_str();
    Open();
    constexpr size_t kCount = 3000;
    std::vector<std::vector<uint8_t>> data;
    std::vector<std::string> names;
    std::vector<ckptdb_shard> shards(kCount);
    std::vector<ckptdb_tensor_info> infos(kCount);
    data.reserve(kCount);
    names.reserve(kCount);
    uint64_t data_bytes = 0;
    for (size_t i = 0; i < kCount; ++i) {
      // 256 bytes mostly; a few odd sizes, one of no bytes, a few of two chunks (not packed).
      const size_t n = i == 17 ? 0 : i % 500 == 3 ? (100 << 10) : i % 7 == 0 ? 4 + i % 61 : 256;
      // Seeds far apart: RandomBytes of seeds s and s + 1 are the same stream 8 bytes apart.
      data.push_back(RandomBytes(n, 0x9E3779B97F4A7C15ull * (i + 1)));
      names.push_back("expert." + std::to_string(i));
      infos[i].dtype = CKPTDB_DTYPE_U8;
      infos[i].ndim = 1;
      infos[i].shape[0] = n;
      shards[i] = {names[i].c_str(), data[i].data(), n, &infos[i],
                   i % 11 == 0 ? CKPTDB_PUT_COPY_NOW : 0u};
      data_bytes += n;
    }
    ASSERT_EQ(ckptdb_put_shards(db_, 1, shards.data(), shards.size()), CKPTDB_OK)
        << ckptdb_last_error();
    ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
    // Shards of 256 bytes share a chunk; one of 100 KiB has two of its own.
    auto chunks_of = [&](const std::string& name) {
      std::vector<ckptdb_chunk_desc> list;
      EXPECT_EQ(ckptdb_list_chunks(
                    db_, 1, name.c_str(),
                    [](void* arg, const ckptdb_chunk_desc* d) {
                      static_cast<std::vector<ckptdb_chunk_desc>*>(arg)->push_back(*d);
                      return 0;
                    },
                    &list, nullptr),
                CKPTDB_OK)
          << ckptdb_last_error();
      return list;
    };
    ASSERT_EQ(chunks_of(names[1]).size(), 1u);
    EXPECT_EQ(chunks_of(names[1])[0].index, chunks_of(names[2])[0].index);
    EXPECT_GT(chunks_of(names[1])[0].payload_bytes, 256u);
    EXPECT_EQ(chunks_of(names[3]).size(), 2u);
    EXPECT_EQ(chunks_of(names[17]).size(), 0u);
    ckptdb_close(db_);  // drains the demotion to disk
    db_ = nullptr;
    // The disk tier's segment: about its data's size, not a 4 KiB block a shard.
    const std::string seg = disk.Sub("t2") + "/v00000000000000000001-r00000.seg";
    const std::string file = test::ReadWholeFile(seg);
    ASSERT_FALSE(file.empty()) << seg;
    EXPECT_LT(file.size(), data_bytes * 3 / 2 + (512 << 10)) << "data " << data_bytes;
    Open();
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(Get(1, names[i], data[i].size()), data[i]) << names[i];
    }
    EXPECT_EQ(Listed(1), kCount);
    // A slice of a packed shard: bytes 100 .. 139.
    ckptdb_box box{};
    box.ndim = 1;
    box.offset[0] = 100;
    box.shape[0] = 40;
    std::vector<uint8_t> slice(40);
    uint64_t covered = 0;
    ASSERT_EQ(ckptdb_restore_slice(db_, 1, names[5].c_str(), &box, slice.data(), slice.size(), 0,
                                   &covered),
              CKPTDB_OK)
        << ckptdb_last_error();
    EXPECT_EQ(covered, 40u);
    EXPECT_EQ(slice, std::vector<uint8_t>(data[5].begin() + 100, data[5].begin() + 140));
    EXPECT_EQ(ckptdb_verify(db_, 1, nullptr, nullptr, nullptr, nullptr), CKPTDB_OK)
        << ckptdb_last_error();
    ckptdb_close(db_);
    db_ = nullptr;

    // Only the disk copy left, one byte of shard 5 flipped there: shard 5 fails its own xxh3
    // (zeroed, named), shard 6 in the same pack still restores, and verify names shard 5.
    std::filesystem::remove_all(ram ? mem.Sub("ram") : mem.Sub("t1"));
    const std::string shard5(data[5].begin(), data[5].end());
    const size_t at = file.find(shard5);
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(file.rfind(shard5), at);
    test::FlipByte(seg, at + 9);
    Open();
    std::vector<uint8_t> out(256, 0xee);
    EXPECT_EQ(ckptdb_restore(db_, 1, names[5].c_str(), out.data(), out.size(), 0), CKPTDB_ECORRUPT);
    EXPECT_TRUE(Mentions("restore 'expert.5' of version 1")) << ckptdb_last_error();
    EXPECT_EQ(out, std::vector<uint8_t>(256, 0));
    EXPECT_EQ(Get(1, names[6], 256), data[6]);
    EXPECT_EQ(Get(1, names[4], data[4].size()), data[4]);
    std::string problems;
    EXPECT_EQ(ckptdb_verify(
                  db_, 1, nullptr,
                  [](void* arg, const ckptdb_verify_event* e) {
                    if (e->kind == CKPTDB_VERIFY_PROBLEM)
                      *static_cast<std::string*>(arg) += e->message;
                  },
                  &problems, nullptr),
              CKPTDB_ECORRUPT);
    EXPECT_NE(problems.find("packed tensor 'expert.5'"), std::string::npos) << problems;
    ckptdb_close(db_);
    db_ = nullptr;
  }
}

// Many batched calls into one version: each adds its shards (and packs) to the same version,
// and its bookkeeping grows with the shards, not with the calls (a put that doubled its room on
// every call asked for terabytes by the 30th).
TEST_F(ApiTest, PutShardsManyCallsIntoOneVersion) {
  Open();
  constexpr int kCalls = 64;
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::string> names;
  for (int i = 0; i < 3 * kCalls; ++i) {
    data.push_back(RandomBytes(100 + i, 0x9E3779B97F4A7C15ull * (i + 1)));
    names.push_back("m" + std::to_string(i));
  }
  for (int call = 0; call < kCalls; ++call) {
    std::vector<ckptdb_shard> shards;
    for (int i = 3 * call; i < 3 * call + 3; ++i) {
      shards.push_back({names[i].c_str(), data[i].data(), data[i].size(), nullptr, 0});
    }
    ASSERT_EQ(ckptdb_put_shards(db_, 1, shards.data(), shards.size()), CKPTDB_OK)
        << "call " << call << ": " << ckptdb_last_error();
  }
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  Reopen();
  EXPECT_EQ(Listed(1), size_t{3 * kCalls});
  for (int i = 0; i < 3 * kCalls; ++i) EXPECT_EQ(Get(1, names[i], data[i].size()), data[i]);
}

TEST_F(ApiTest, PutShardsArgumentsAndLimits) {
  Open();
  EXPECT_EQ(ckptdb_put_shards(nullptr, 1, nullptr, 0), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_put_shards(db_, 1, nullptr, 3), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shards is NULL"));
  EXPECT_EQ(ckptdb_put_shards(db_, CKPTDB_ALL_VERSIONS, nullptr, 0), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_put_shards(db_, 1, nullptr, size_t{1} << 25), CKPTDB_EINVAL);
  // Nothing to put: Ok, and the version is not opened.
  EXPECT_EQ(ckptdb_put_shards(db_, 1, nullptr, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_ENOTFOUND);
  // The chunk limit counts the whole call: two shards that fit alone and not together. Their
  // bytes are never read (the call is refused before anything is queued).
  static uint8_t byte = 0;
  const uint64_t chunk = o_.chunk_bytes;
  const uint64_t limit = uint64_t{1} << 24;  // chunks a version holds (docs/api.md, Limits)
  ckptdb_shard two[2] = {{"a", &byte, static_cast<size_t>((limit - 1) * chunk), nullptr, 0},
                         {"b", &byte, static_cast<size_t>(2 * chunk), nullptr, 0}};
  EXPECT_EQ(ckptdb_put_shards(db_, 1, two, 2), CKPTDB_EINVAL);
  EXPECT_TRUE(Mentions("shard 1 of 2")) << ckptdb_last_error();
  EXPECT_TRUE(Mentions("would exceed")) << ckptdb_last_error();
  EXPECT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_ENOTFOUND);
  // A read-only handle.
  Reopen();
  ckptdb_close(db_);
  db_ = nullptr;
  o_.read_only = 1;
  Open();
  auto d = RandomBytes(10, 1);
  ckptdb_shard one{"x", d.data(), d.size(), nullptr, 0};
  EXPECT_EQ(ckptdb_put_shards(db_, 2, &one, 1), CKPTDB_ESTATE);
  EXPECT_TRUE(Mentions("read-only"));
}

}  // namespace
}  // namespace ckpt
