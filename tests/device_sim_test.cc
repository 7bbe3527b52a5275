// The device pipeline on the simulated device (issue 42; io/device_sim.h, io/device_queue.h,
// engine/capture.cc, engine/device_restore.cc): what tests/gpu_test.cu checks on a GPU, here in
// every build and under ASan and TSan, plus what a GPU cannot be made to do on purpose: copies
// that fail as they run, a sticky error, a device that vanishes, pinning refused, a slow copy
// engine with a version aborted under it.
#include "io/device_sim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "io/device_queue.h"
#include "tests/test_util.h"

namespace {

namespace sim = ckpt::io::sim;
using ckpt::Status;
using ckpt::io::CopyKind;
using ckpt::io::DeviceQueue;
using ckpt::test::TempDir;

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Simulated device memory, freed with its scope.
struct SimBuffer {
  SimBuffer(int device, size_t bytes) : bytes(bytes) {
    p = static_cast<uint8_t*>(sim::Allocate(device, bytes));
  }
  ~SimBuffer() {
    if (p != nullptr) sim::Free(p);
  }
  SimBuffer(const SimBuffer&) = delete;
  SimBuffer& operator=(const SimBuffer&) = delete;
  uint8_t* p = nullptr;
  size_t bytes = 0;
};

// ---- The queue on the simulated device ----------------------------------------------------------

class DeviceQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::Config c;
    c.devices = 2;
    ASSERT_TRUE(sim::Configure(c).ok());
    ASSERT_TRUE(sim::Open(&device_).ok());
  }
  std::unique_ptr<ckpt::io::Device> device_;
};

TEST_F(DeviceQueueTest, CopiesLandBothWaysAndComeBackByTag) {
  constexpr size_t kBytes = 1 << 20;
  SimBuffer dev(1, 8 * kBytes);
  ASSERT_NE(dev.p, nullptr);
  std::vector<uint8_t> want = Pattern(8 * kBytes, 1), back(8 * kBytes);
  int located = -5;
  ASSERT_TRUE(device_->Locate(dev.p + 100, &located).ok());
  EXPECT_EQ(located, 1);
  ASSERT_TRUE(device_->Locate(want.data(), &located).ok());
  EXPECT_EQ(located, -1);
  ckpt::io::DeviceQueueOptions o;
  o.streams_per_device = 3;
  o.max_bytes_in_flight = 2 * kBytes;  // at most two at once
  DeviceQueue q(device_.get(), o);
  std::vector<DeviceQueue::Completion> done;
  std::vector<bool> seen(8, false);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(
        q.Submit({1, CopyKind::kToDevice, dev.p + i * kBytes, want.data() + i * kBytes, kBytes, i})
            .ok());
    EXPECT_LE(q.bytes_in_flight(), 2 * kBytes);
    q.Reap(&done, 8, false);
    for (const auto& d : done) seen[d.tag] = d.status.ok();
  }
  while (q.unreaped() > 0) {
    q.Reap(&done, 8, true);
    for (const auto& d : done) seen[d.tag] = d.status.ok();
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 8);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(q.Submit({1, CopyKind::kToHost, back.data() + i * kBytes, dev.p + i * kBytes,
                          kBytes, 100 + i})
                    .ok());
  }
  size_t reaped = 0;
  while (reaped < 8) reaped += q.Reap(&done, 3, true);
  EXPECT_EQ(back, want);
  EXPECT_LE(sim::Read().max_queued, 2u);
}

TEST_F(DeviceQueueTest, ReapWaitsForASubmitAndEndsAtShutdown) {
  DeviceQueue q(device_.get(), {});
  SimBuffer dev(0, 4096);
  std::vector<uint8_t> host(4096, 7);
  std::thread submitter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(q.Submit({0, CopyKind::kToDevice, dev.p, host.data(), 4096, 42}).ok());
  });
  std::vector<DeviceQueue::Completion> done;
  ASSERT_EQ(q.Reap(&done, 4, true), 1u);  // waited for the submit
  EXPECT_EQ(done[0].tag, 42u);
  submitter.join();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    q.Shutdown();
  });
  EXPECT_EQ(q.Reap(&done, 4, true), 0u);
  stopper.join();
  EXPECT_EQ(q.Submit({0, CopyKind::kToDevice, dev.p, host.data(), 4096, 43}).code(), CKPTDB_ESTATE);
}

TEST_F(DeviceQueueTest, ABadPointerIsRefusedAtSubmission) {
  DeviceQueue q(device_.get(), {});
  SimBuffer dev(0, 4096);
  std::vector<uint8_t> host(8192);
  // Past the end of the allocation, host memory named as the device's, another device's memory.
  Status past = q.Submit({0, CopyKind::kToHost, host.data(), dev.p, 8192, 1});
  EXPECT_EQ(past.code(), CKPTDB_EINVAL) << past.message();
  EXPECT_NE(past.message().find("invalid argument"), std::string::npos) << past.message();
  EXPECT_EQ(q.Submit({0, CopyKind::kToHost, host.data(), host.data() + 4096, 16, 2}).code(),
            CKPTDB_EINVAL);
  EXPECT_EQ(q.Submit({1, CopyKind::kToHost, host.data(), dev.p, 16, 3}).code(), CKPTDB_EINVAL);
  EXPECT_EQ(q.Submit({9, CopyKind::kToHost, host.data(), dev.p, 16, 3}).code(), CKPTDB_EINVAL);
  EXPECT_EQ(q.unreaped(), 0u);
}

TEST_F(DeviceQueueTest, AFailedCopyCompletesWithItsErrorAndTheNextRuns) {
  ckpt::io::DeviceQueueOptions one_stream;  // copies numbered in submission order
  one_stream.streams_per_device = 1;
  DeviceQueue q(device_.get(), one_stream);
  SimBuffer dev(0, 3 * 4096);
  std::vector<uint8_t> host = Pattern(3 * 4096, 3);
  sim::Faults f;
  f.fail_copy = 1;
  sim::SetFaults(f);
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        q.Submit({0, CopyKind::kToDevice, dev.p + i * 4096, host.data() + i * 4096, 4096, i}).ok());
  }
  std::vector<Status> status(3);
  std::vector<DeviceQueue::Completion> done;
  for (size_t n = 0; n < 3;) {
    n += q.Reap(&done, 3, true);
    for (const auto& d : done) status[d.tag] = d.status;
  }
  EXPECT_TRUE(status[0].ok());
  EXPECT_EQ(status[1].code(), CKPTDB_EIO);
  EXPECT_NE(status[1].message().find("injected"), std::string::npos) << status[1].message();
  EXPECT_TRUE(status[2].ok()) << status[2].message();
  EXPECT_EQ(std::memcmp(dev.p, host.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(dev.p + 8192, host.data() + 8192, 4096), 0);
}

TEST_F(DeviceQueueTest, AStickyErrorFailsEveryCallAfterIt) {
  DeviceQueue q(device_.get(), {});
  SimBuffer dev(0, 4096);
  std::vector<uint8_t> host(4096);
  sim::Faults f;
  f.sticky_at = 0;
  sim::SetFaults(f);
  ASSERT_TRUE(q.Submit({0, CopyKind::kToDevice, dev.p, host.data(), 4096, 1}).ok());
  std::vector<DeviceQueue::Completion> done;
  ASSERT_EQ(q.Reap(&done, 1, true), 1u);
  EXPECT_NE(done[0].status.message().find("sticky"), std::string::npos) << done[0].status.message();
  EXPECT_FALSE(q.Submit({0, CopyKind::kToDevice, dev.p, host.data(), 4096, 2}).ok());
  int located = 0;
  EXPECT_FALSE(device_->Locate(dev.p, &located).ok());
  std::unique_ptr<ckpt::io::Device> again;
  EXPECT_FALSE(sim::Open(&again).ok());
}

// ---- A store on the simulated device
// -------------------------------------------------------------

class SimStoreTest : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 12 << 20;  // 3 chunks of 4 MiB

  void SetUp() override {
    sim::Config c;
    c.devices = 2;
    ASSERT_TRUE(sim::Configure(c).ok());
    x_ = std::make_unique<SimBuffer>(0, kBytes);
    y_ = std::make_unique<SimBuffer>(0, kBytes);
    want_ = Pattern(kBytes, 11);
    std::memcpy(x_->p, want_.data(), kBytes);
  }
  void TearDown() override {
    if (db_ != nullptr) ckptdb_close(db_);
  }
  void Open(const std::string& tiers, uint64_t staging_bytes = 0, const char* device = "sim") {
    root_ = dir_.Sub("root");
    tiers_ = tiers;
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root_.c_str();
    o.tiers = tiers_.c_str();
    o.rank = 0;
    o.world_size = 1;
    o.device = device;
    o.staging_bytes = staging_bytes;
    ASSERT_EQ(ckptdb_open(&o, &db_), CKPTDB_OK) << ckptdb_last_error();
  }
  std::string RamAndDisk() const {
    return "ram:128M,keep=2,dir=" + dir_.Sub("shm") + ";disk:" + dir_.Sub("disk");
  }
  std::vector<uint8_t> RestoreToHost(uint64_t v, const char* name = "x") {
    std::vector<uint8_t> out(kBytes);
    EXPECT_EQ(ckptdb_restore(db_, v, name, out.data(), kBytes, 0), CKPTDB_OK)
        << ckptdb_last_error();
    return out;
  }
  std::vector<uint8_t> OnDevice(const SimBuffer& b) const {
    return std::vector<uint8_t>(b.p, b.p + b.bytes);
  }
  void PutCommit(uint64_t v, unsigned flags = CKPTDB_PUT_DEVICE) {
    ASSERT_EQ(ckptdb_put_shard(db_, v, "x", x_->p, kBytes, nullptr, flags), CKPTDB_OK)
        << ckptdb_last_error();
    ASSERT_EQ(ckptdb_commit(db_, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }

  TempDir dir_{"/dev/shm"};
  std::string root_, tiers_;
  ckptdb* db_ = nullptr;
  std::unique_ptr<SimBuffer> x_, y_;
  std::vector<uint8_t> want_;
};

TEST_F(SimStoreTest, DevicePutRestoresBitForBit) {
  Open(RamAndDisk());
  PutCommit(1);
  EXPECT_EQ(RestoreToHost(1), want_);
  // Recognized without the flag once the device is open, and with COPY_NOW.
  PutCommit(2, CKPTDB_PUT_COPY_NOW);
  EXPECT_EQ(RestoreToHost(2), want_);
  // Every copy went to or from pinned memory: the staging ring and the arena, pinned once.
  EXPECT_EQ(sim::Read().pageable_copies, 0u);
  EXPECT_GE(sim::Read().bytes_to_host, 2 * kBytes);
}

TEST_F(SimStoreTest, ThroughTheStagingRingToADiskTier) {
  // No ram tier: chunks land in the ring, hashed on the device thread, then written. A ring of
  // two chunks makes capture wait for writes (back-pressure) while hashing is still to come.
  Open("disk:" + dir_.Sub("disk"), uint64_t{8} << 20 | 16384);
  for (uint64_t v = 1; v <= 3; ++v) PutCommit(v);
  EXPECT_EQ(RestoreToHost(3), want_);
  EXPECT_EQ(sim::Read().pageable_copies, 0u);
}

TEST_F(SimStoreTest, AfterWaitCaptureTheTensorMayChange) {
  Open(RamAndDisk());
  sim::Config slow;  // slow enough that hashing is still to come when wait_capture returns
  slow.devices = 2;
  slow.to_host_bytes_per_s = uint64_t{400} << 20;
  ASSERT_TRUE(sim::Configure(slow).ok());
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_wait_capture(db_, 1, -1), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_GE(sim::Read().bytes_to_host, kBytes);  // every copy out of x has run
  std::memset(x_->p, 0xEE, kBytes);              // the optimizer step
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(RestoreToHost(1), want_);
}

TEST_F(SimStoreTest, RestoreIntoDeviceMemoryFromEachTier) {
  Open(RamAndDisk());
  PutCommit(1);
  ASSERT_EQ(ckptdb_wait_commit(db_, 1, ("disk:" + dir_.Sub("disk")).c_str(), -1), CKPTDB_OK)
      << ckptdb_last_error();
  // Pipelined, one copy a chunk (the restore through host memory would make one of the whole).
  for (unsigned flags : {CKPTDB_RESTORE_DEVICE, 0u}) {  // named, then recognized
    std::memset(y_->p, 0, kBytes);
    const uint64_t before = sim::Read().copies;
    ASSERT_EQ(ckptdb_restore(db_, 1, "x", y_->p, kBytes, flags), CKPTDB_OK) << ckptdb_last_error();
    EXPECT_EQ(OnDevice(*y_), want_) << "flags " << flags;
    EXPECT_EQ(sim::Read().copies - before, 3u);
  }
  ckptdb_stats_t st;
  ASSERT_EQ(ckptdb_stats(db_, &st), CKPTDB_OK);
  EXPECT_STREQ(st.last_restore_tier, "ram");
  // The disk copy alone, through the pinned pool.
  ckptdb_close(db_);
  db_ = nullptr;
  ckptdb_options o;
  ckptdb_options_init(&o);
  std::string disk = "disk:" + dir_.Sub("disk");
  o.root = root_.c_str();
  o.tiers = disk.c_str();
  o.device = "sim";
  o.drop_tiers = 1;
  ASSERT_EQ(ckptdb_open(&o, &db_), CKPTDB_OK) << ckptdb_last_error();
  std::memset(y_->p, 0, kBytes);
  const uint64_t before = sim::Read().copies;
  ASSERT_EQ(ckptdb_restore(db_, 1, "x", y_->p, kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(OnDevice(*y_), want_);
  EXPECT_EQ(sim::Read().copies - before, 3u);
  EXPECT_EQ(sim::Read().pageable_copies, 0u);
}

TEST_F(SimStoreTest, ACorruptChunkOnTheDeviceIsZeroedNeverWrong) {
  Open("disk:" + dir_.Sub("disk"));
  PutCommit(1);
  // Flip a byte of the second chunk's payload in the segment file.
  const size_t at = (5 << 20) + 123;
  std::string segment;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.Sub("disk"))) {
    if (e.is_regular_file() && e.file_size() > kBytes) segment = e.path();
  }
  ASSERT_FALSE(segment.empty());
  std::fstream f(segment, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<uint8_t> file;
  for (std::istreambuf_iterator<char> it(f), end; it != end; ++it) file.push_back(*it);
  auto hit = std::search(file.begin(), file.end(), want_.begin() + at, want_.begin() + at + 64);
  ASSERT_NE(hit, file.end());
  f.seekp(hit - file.begin());
  const char flipped = static_cast<char>(*hit ^ 0x5Au);
  f.write(&flipped, 1);
  f.close();
  std::memset(y_->p, 0x77, kBytes);
  EXPECT_EQ(ckptdb_restore(db_, 1, "x", y_->p, kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_ECORRUPT);
  EXPECT_NE(std::string(ckptdb_last_error()).find("zeroed"), std::string::npos)
      << ckptdb_last_error();
  std::vector<uint8_t> got = OnDevice(*y_);
  const size_t chunk = 4 << 20;
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + chunk, want_.begin()));
  EXPECT_TRUE(
      std::all_of(got.begin() + chunk, got.begin() + 2 * chunk, [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::equal(got.begin() + 2 * chunk, got.end(), want_.begin() + 2 * chunk));
}

TEST_F(SimStoreTest, MisnamedMemoryIsRefused) {
  Open(RamAndDisk());
  std::vector<uint8_t> host(kBytes);
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "h", host.data(), 64, nullptr, CKPTDB_PUT_DEVICE),
            CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("host memory"), std::string::npos)
      << ckptdb_last_error();
  PutCommit(1);
  EXPECT_EQ(ckptdb_restore(db_, 1, "x", host.data(), kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_restore(db_, 1, "x", y_->p, 64, 0), CKPTDB_ESIZE);
  ckptdb_box box{};
  uint64_t covered = 0;
  EXPECT_EQ(ckptdb_restore_slice(db_, 1, "x", &box, y_->p, 64, 0, &covered), CKPTDB_ENOTSUP);
}

TEST_F(SimStoreTest, WithoutTheSimulatedDeviceTheFlagIsRefusedInAHostBuild) {
  if (ckpt::io::DeviceBuild()) GTEST_SKIP() << "a GPU build: its runtime answers instead";
  Open(RamAndDisk(), 0, "auto");
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE),
            CKPTDB_ENOTSUP);
  EXPECT_NE(std::string(ckptdb_last_error()).find("sim"), std::string::npos) << ckptdb_last_error();
  ckptdb_close(db_);
  db_ = nullptr;
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root_.c_str();
  o.device = "tpu";
  EXPECT_EQ(ckptdb_open(&o, &db_), CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("tpu"), std::string::npos);
}

TEST_F(SimStoreTest, ACopyPastTheAllocationFailsTheVersionAndTheStoreGoesOn) {
  Open(RamAndDisk());
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_->p, kBytes + (1 << 20), nullptr, CKPTDB_PUT_DEVICE),
            CKPTDB_OK);
  EXPECT_NE(ckptdb_commit(db_, 1, 0), CKPTDB_OK);
  EXPECT_NE(std::string(ckptdb_last_error()).find("invalid argument"), std::string::npos)
      << ckptdb_last_error();
  PutCommit(2);
  EXPECT_EQ(RestoreToHost(2), want_);
}

TEST_F(SimStoreTest, ACopyThatFailsAsItRunsFailsItsVersionOnly) {
  Open(RamAndDisk());
  PutCommit(1);  // opens the device
  sim::Faults f;
  f.fail_copy = 1;  // the second chunk of version 2
  sim::SetFaults(f);
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  EXPECT_EQ(ckptdb_wait_capture(db_, 2, -1), CKPTDB_EIO);
  EXPECT_NE(std::string(ckptdb_last_error()).find("injected"), std::string::npos)
      << ckptdb_last_error();
  EXPECT_NE(ckptdb_commit(db_, 2, 0), CKPTDB_OK);
  PutCommit(3);
  EXPECT_EQ(RestoreToHost(3), want_);
  EXPECT_EQ(RestoreToHost(1), want_);
}

TEST_F(SimStoreTest, AFailedCopyFailsARestoreIntoTheDeviceAndTheNextOneWorks) {
  Open(RamAndDisk());
  PutCommit(1);
  sim::Faults f;
  f.fail_copy = 1;  // the restore's second chunk
  sim::SetFaults(f);
  EXPECT_EQ(ckptdb_restore(db_, 1, "x", y_->p, kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_EIO);
  EXPECT_NE(std::string(ckptdb_last_error()).find("injected"), std::string::npos)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_restore(db_, 1, "x", y_->p, kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(OnDevice(*y_), want_);
}

TEST_F(SimStoreTest, AStickyErrorOrAVanishedDeviceFailsCallsAndCloseStillEnds) {
  for (bool vanish : {false, true}) {
    SCOPED_TRACE(vanish ? "vanished" : "sticky");
    sim::Config c;
    c.devices = 2;
    ASSERT_TRUE(sim::Configure(c).ok());
    Open(RamAndDisk());
    const uint64_t v = vanish ? 10 : 1;
    PutCommit(v);
    sim::Faults f;
    (vanish ? f.vanish_at : f.sticky_at) = 1;
    sim::SetFaults(f);
    ASSERT_EQ(ckptdb_put_shard(db_, v + 1, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE),
              CKPTDB_OK);
    EXPECT_NE(ckptdb_commit(db_, v + 1, 0), CKPTDB_OK);
    EXPECT_NE(std::string(ckptdb_last_error()).find(vanish ? "gone" : "sticky"), std::string::npos)
        << ckptdb_last_error();
    EXPECT_NE(ckptdb_restore(db_, v, "x", y_->p, kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_OK);
    EXPECT_EQ(RestoreToHost(v), want_);  // host memory needs no device
    ASSERT_EQ(ckptdb_close(db_), CKPTDB_OK);
    db_ = nullptr;
  }
}

TEST_F(SimStoreTest, AbortedAndClosedWithCopiesInFlight) {
  Open(RamAndDisk());
  sim::Config slow;
  slow.devices = 2;
  slow.to_host_bytes_per_s = uint64_t{64} << 20;  // 12 MiB: about 190 ms
  ASSERT_TRUE(sim::Configure(slow).ok());
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  EXPECT_EQ(ckptdb_abort(db_, 1), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  EXPECT_EQ(ckptdb_close(db_), CKPTDB_OK);  // version 2 aborted while its copies run
  db_ = nullptr;
  sim::Config fast;
  fast.devices = 2;
  ASSERT_TRUE(sim::Configure(fast).ok());
  Open(RamAndDisk());
  PutCommit(3);
  EXPECT_EQ(RestoreToHost(3), want_);
}

TEST_F(SimStoreTest, PinningRefusedIsSaidAndCopiesStillLand) {
  sim::Faults f;
  f.refuse_pin = true;
  sim::SetFaults(f);
  Open(RamAndDisk());
  PutCommit(1);
  EXPECT_EQ(RestoreToHost(1), want_);
  ASSERT_EQ(ckptdb_restore(db_, 1, "x", y_->p, kBytes, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(OnDevice(*y_), want_);
  EXPECT_GT(sim::Read().pageable_copies, 0u);
}

TEST_F(SimStoreTest, ShardsOnTwoDevicesAndManyVersions) {
  Open(RamAndDisk());
  SimBuffer z(1, kBytes);
  std::vector<uint8_t> want_z = Pattern(kBytes, 12);
  std::memcpy(z.p, want_z.data(), kBytes);
  for (uint64_t v = 1; v <= 4; ++v) {
    ASSERT_EQ(ckptdb_put_shard(db_, v, "x", x_->p, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
    ASSERT_EQ(ckptdb_put_shard(db_, v, "z", z.p, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
    ASSERT_EQ(ckptdb_wait_capture(db_, v, -1), CKPTDB_OK) << ckptdb_last_error();
    ASSERT_EQ(ckptdb_commit(db_, v, CKPTDB_COMMIT_ASYNC), CKPTDB_OK) << ckptdb_last_error();
  }
  ASSERT_EQ(ckptdb_wait_commit(db_, 4, nullptr, -1), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(RestoreToHost(4, "z"), want_z);
  SimBuffer back(1, kBytes);
  ASSERT_EQ(ckptdb_restore(db_, 4, "z", back.p, kBytes, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(OnDevice(back), want_z);
}

}  // namespace
