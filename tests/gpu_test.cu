// GPU memory (issue 8; docs/api.md "Device memory"): shards put from device memory and restored
// into it, with kernels running beside capture. Built in a CUDA build only (make test-cuda, which
// runs each test in its own process: a test that leaves the CUDA context broken spoils no other);
// without a device every test prints why it is skipped. The producer of each put tensor is
// synchronized first: ckptdb's copies are not ordered after the caller's kernels.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tests/test_util.h"

namespace {

using ckpt::test::TempDir;

__global__ void FillKernel(float* p, size_t n, float base) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    p[i] = base + static_cast<float>(i);
  }
}

// Keeps rewriting p for about `cycles` clock ticks: a kernel that is still running while
// capture copies another buffer.
__global__ void BusyKernel(float* p, size_t n, long long cycles) {
  const long long start = clock64();
  float v = 0;
  while (clock64() - start < cycles) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
      p[i] = v;
    }
    v += 1;
  }
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

class GpuTest : public ::testing::Test {
 protected:
  static constexpr size_t kFloats = 3 << 20;  // 12 MiB: several chunks
  static constexpr size_t kBytes = kFloats * sizeof(float);

  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device here (" << cudaGetErrorName(e)
                   << "): the GPU tests run where one is present";
    }
    root_ = dir_.Sub("root");
    tiers_ = "ram:128M,keep=2,dir=" + dir_.Sub("shm") + ";disk:" + dir_.Sub("disk");
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root_.c_str();
    o.tiers = tiers_.c_str();
    o.rank = 0;
    o.world_size = 1;
    ASSERT_EQ(ckptdb_open(&o, &db_), CKPTDB_OK) << ckptdb_last_error();
    CUDA_OK(cudaMalloc(&x_, kBytes));
    CUDA_OK(cudaMalloc(&y_, kBytes));
    FillKernel<<<256, 256>>>(x_, kFloats, 1.0f);
    CUDA_OK(cudaDeviceSynchronize());
    want_.resize(kFloats);
    CUDA_OK(cudaMemcpy(want_.data(), x_, kBytes, cudaMemcpyDeviceToHost));
  }
  void TearDown() override {
    if (db_ != nullptr) ckptdb_close(db_);
    if (x_ != nullptr) cudaFree(x_);
    if (y_ != nullptr) cudaFree(y_);
  }
  std::vector<float> RestoreToHost(uint64_t v) {
    std::vector<float> out(kFloats);
    EXPECT_EQ(ckptdb_restore(db_, v, "x", out.data(), kBytes, 0), CKPTDB_OK) << ckptdb_last_error();
    return out;
  }

  TempDir dir_{"/dev/shm"};
  std::string root_, tiers_;
  ckptdb* db_ = nullptr;
  float* x_ = nullptr;
  float* y_ = nullptr;
  std::vector<float> want_;
};

TEST_F(GpuTest, DevicePutRestoresBitForBit) {
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(RestoreToHost(1), want_);
  // Recognized without the flag, and with COPY_NOW.
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "x", x_, kBytes, nullptr, CKPTDB_PUT_COPY_NOW), CKPTDB_OK)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(RestoreToHost(2), want_);
}

TEST_F(GpuTest, CaptureDoesNotWaitForOtherKernels) {
  // A kernel keeps rewriting y on its own stream for about a second while x is captured: the
  // capture waits on its own copies' events, never on the device, so it is done first.
  // A first version opens the device and pins staging, so that the one timed against the kernel
  // only copies.
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  cudaStream_t busy;
  CUDA_OK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  int clock_khz = 0;
  CUDA_OK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  BusyKernel<<<64, 256, 0, busy>>>(y_, kFloats, static_cast<long long>(clock_khz) * 1000);
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_wait_capture(db_, 2, -1), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(cudaStreamQuery(busy), cudaErrorNotReady)
      << "the busy kernel ended before capture did: the capture may have synchronized the device";
  ASSERT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_OK) << ckptdb_last_error();
  CUDA_OK(cudaStreamSynchronize(busy));
  CUDA_OK(cudaStreamDestroy(busy));
  EXPECT_EQ(RestoreToHost(2), want_);
}

TEST_F(GpuTest, AfterWaitCaptureTheTensorMayChange) {
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_wait_capture(db_, 1, -1), CKPTDB_OK) << ckptdb_last_error();
  FillKernel<<<256, 256>>>(x_, kFloats, -7.0f);  // the optimizer step
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(RestoreToHost(1), want_);
}

TEST_F(GpuTest, RestoreIntoDeviceMemory) {
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  for (unsigned flags : {CKPTDB_RESTORE_DEVICE, 0u}) {  // named, then recognized
    CUDA_OK(cudaMemset(y_, 0, kBytes));
    ASSERT_EQ(ckptdb_restore(db_, 1, "x", y_, kBytes, flags), CKPTDB_OK) << ckptdb_last_error();
    std::vector<float> got(kFloats);
    CUDA_OK(cudaMemcpy(got.data(), y_, kBytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want_) << "flags " << flags;
  }
}

TEST_F(GpuTest, MisnamedMemoryIsRefused) {
  std::vector<float> host(kFloats);
  EXPECT_EQ(ckptdb_put_shard(db_, 1, "h", host.data(), 64, nullptr, CKPTDB_PUT_DEVICE),
            CKPTDB_EINVAL);
  EXPECT_NE(std::string(ckptdb_last_error()).find("host memory"), std::string::npos)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(ckptdb_restore(db_, 1, "x", host.data(), kBytes, CKPTDB_RESTORE_DEVICE), CKPTDB_EINVAL);
  EXPECT_EQ(ckptdb_restore(db_, 1, "x", y_, 64, 0), CKPTDB_ESIZE);
  ckptdb_box box{};
  box.ndim = 0;
  uint64_t covered = 0;
  EXPECT_EQ(ckptdb_restore_slice(db_, 1, "x", &box, y_, 64, 0, &covered), CKPTDB_ENOTSUP);
}

TEST_F(GpuTest, AFailedCopyFailsTheVersionWithAStatus) {
  // Past the end of the allocation: the copy engine refuses a chunk, the version fails with the
  // runtime's error, and the store goes on.
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes + (256 << 20), nullptr, CKPTDB_PUT_DEVICE),
            CKPTDB_OK);
  EXPECT_NE(ckptdb_commit(db_, 1, 0), CKPTDB_OK);
  EXPECT_NE(std::string(ckptdb_last_error()).find("CUDA"), std::string::npos)
      << ckptdb_last_error();
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(RestoreToHost(2), want_);
}

TEST_F(GpuTest, AFullDeviceDoesNotMatter) {
  // Past opening the device (its context, and each thread's stream on first use), ckptdb needs no
  // device memory: with none left, capture and restore still work.
  ASSERT_EQ(ckptdb_put_shard(db_, 1, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(db_, 1, 0), CKPTDB_OK) << ckptdb_last_error();
  ASSERT_EQ(ckptdb_restore(db_, 1, "x", y_, kBytes, 0), CKPTDB_OK) << ckptdb_last_error();
  std::vector<void*> hog;
  for (void* p = nullptr; cudaMalloc(&p, 256 << 20) == cudaSuccess;) hog.push_back(p);
  for (void* p = nullptr; cudaMalloc(&p, 4 << 20) == cudaSuccess;) hog.push_back(p);
  (void)cudaGetLastError();
  CUDA_OK(cudaMemset(y_, 0, kBytes));
  ASSERT_EQ(ckptdb_put_shard(db_, 2, "x", x_, kBytes, nullptr, CKPTDB_PUT_DEVICE), CKPTDB_OK);
  EXPECT_EQ(ckptdb_commit(db_, 2, 0), CKPTDB_OK) << ckptdb_last_error();
  EXPECT_EQ(ckptdb_restore(db_, 2, "x", y_, kBytes, 0), CKPTDB_OK) << ckptdb_last_error();
  for (void* p : hog) cudaFree(p);
  std::vector<float> got(kFloats);
  CUDA_OK(cudaMemcpy(got.data(), y_, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want_);
}

}  // namespace
