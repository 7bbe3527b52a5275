// One-sided puts and gets between two processes of this host (transport/rma.h): which UCX_TLS
// lists allow them, the window descriptor's decoder at every truncation and bad field, puts and
// gets that land bit for bit, bounds, and a window whose owner was killed (the attached side goes
// on without a fault, as the rule in rma.h promises).
#include "transport/rma.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "test_util.h"

namespace ckpt::transport {
namespace {

TEST(RmaTransports, OnlySharedMemoryTheJobAllowsIsUsed) {
  EXPECT_EQ(RmaTransports("tcp"), "");
  EXPECT_EQ(RmaTransports("rc,tcp"), "");
  EXPECT_EQ(RmaTransports("shm,tcp"), "posix");
  EXPECT_EQ(RmaTransports("sm"), "posix");
  EXPECT_EQ(RmaTransports("sysv"), "sysv");
  EXPECT_EQ(RmaTransports("posix,tcp"), "posix");
  EXPECT_EQ(RmaTransports("all"), "posix");
  EXPECT_EQ(RmaTransports("^tcp"), "posix");
  EXPECT_EQ(RmaTransports("^posix"), "sysv");
  EXPECT_EQ(RmaTransports("^shm"), "");
  EXPECT_EQ(RmaTransports("^posix,sysv"), "");
  setenv("UCX_TLS", "tcp", 1);
  EXPECT_EQ(RmaTransports(""), "");
  unsetenv("UCX_TLS");
  EXPECT_EQ(RmaTransports(""), "posix");
  std::shared_ptr<RmaDomain> none;
  ASSERT_TRUE(RmaDomain::Open("test", "tcp", &none).ok());
  EXPECT_EQ(none, nullptr);
}

RmaDescriptor Sample() {
  RmaDescriptor d;
  d.id = 0x1234567890abcdefull;
  d.bytes = 1 << 20;
  d.address = 0x7f0000000000ull;
  d.worker_address.assign(46, 0xAB);
  d.rkey.assign(34, 0xCD);
  return d;
}

TEST(RmaDescriptor, RoundTripsAndRefusesEveryTruncationAndBadField) {
  const std::vector<uint8_t> good = EncodeRmaDescriptor(Sample());
  RmaDescriptor back;
  ASSERT_TRUE(DecodeRmaDescriptor(good, "peer", &back).ok());
  EXPECT_EQ(back.id, Sample().id);
  EXPECT_EQ(back.bytes, Sample().bytes);
  EXPECT_EQ(back.address, Sample().address);
  EXPECT_EQ(back.worker_address, Sample().worker_address);
  EXPECT_EQ(back.rkey, Sample().rkey);
  for (size_t n = 0; n < good.size(); ++n) {
    Status st = DecodeRmaDescriptor(std::span(good.data(), n), "peer rank 1", &back);
    EXPECT_FALSE(st.ok()) << n;
    EXPECT_NE(st.message().find("peer rank 1"), std::string::npos) << st.message();
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_FALSE(DecodeRmaDescriptor(longer, "peer", &back).ok());
  auto bad = [&](auto edit) {
    RmaDescriptor d = Sample();
    edit(d);
    return DecodeRmaDescriptor(EncodeRmaDescriptor(d), "peer", &back);
  };
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.bytes = 0; }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.bytes = kMaxRmaWindowBytes + 1; }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.address = 0; }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.address = UINT64_MAX - 10; }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.worker_address.clear(); }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.rkey.clear(); }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) { d.rkey.assign(kMaxRmaKeyBytes + 1, 1); }).ok());
  EXPECT_FALSE(bad([](RmaDescriptor& d) {
                 d.worker_address.assign(kMaxRmaWorkerAddressBytes + 1, 1);
               }).ok());
  std::vector<uint8_t> magic = good;
  magic[0] ^= 1;
  EXPECT_FALSE(DecodeRmaDescriptor(magic, "peer", &back).ok());
  std::vector<uint8_t> version = good;
  version[4] = 2;
  EXPECT_FALSE(DecodeRmaDescriptor(version, "peer", &back).ok());
  // Every single flipped bit either decodes to a descriptor within the bounds or is refused.
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::vector<uint8_t> flipped = good;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    if (DecodeRmaDescriptor(flipped, "peer", &back).ok()) {
      EXPECT_LE(back.bytes, kMaxRmaWindowBytes);
      EXPECT_FALSE(back.rkey.empty());
    }
  }
  std::mt19937_64 rng(21);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> junk(rng() % 256);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    EXPECT_FALSE(DecodeRmaDescriptor(junk, "peer", &back).ok());
  }
}

// Reads exactly n bytes from fd.
bool ReadAll(int fd, void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    ssize_t got = read(fd, p, n);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const void* in, size_t n) {
  auto* p = static_cast<const uint8_t*>(in);
  while (n > 0) {
    ssize_t put = write(fd, p, n);
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

uint8_t Pattern(uint64_t i, uint8_t seed) { return static_cast<uint8_t>(i * 131 + seed); }

// A child process exposes a window and sends its descriptor up a pipe; on each byte it reads
// from the other pipe it checks the window holds the pattern with that seed (answering 1 or 0),
// then writes the pattern with seed + 1 for the parent to get. It exits on EOF.
constexpr uint64_t kWindowBytes = 8 << 20;

pid_t StartOwner(int* to_child, int* from_child) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    std::shared_ptr<RmaDomain> domain;
    if (!RmaDomain::Open("owner", "posix", &domain).ok() || domain == nullptr) _exit(2);
    std::shared_ptr<RmaWindow> window;
    if (!domain->Expose(kWindowBytes, &window).ok()) _exit(3);
    uint32_t n = static_cast<uint32_t>(window->descriptor().size());
    if (!WriteAll(up[1], &n, 4) || !WriteAll(up[1], window->descriptor().data(), n)) _exit(4);
    uint8_t seed = 0;
    while (ReadAll(down[0], &seed, 1)) {
      uint8_t ok = 1;
      for (uint64_t i = 0; i < kWindowBytes; ++i) {
        if (window->data()[i] != Pattern(i, seed)) {
          ok = 0;
          break;
        }
      }
      for (uint64_t i = 0; i < kWindowBytes; ++i) {
        window->data()[i] = Pattern(i, static_cast<uint8_t>(seed + 1));
      }
      if (!WriteAll(up[1], &ok, 1)) break;
    }
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  *to_child = down[1];
  *from_child = up[0];
  return pid;
}

TEST(RmaWindow, PutsAndGetsLandBitForBitAndSurviveTheOwnersDeath) {
  int to_child = -1, from_child = -1;
  pid_t owner = StartOwner(&to_child, &from_child);
  ASSERT_GT(owner, 0);
  uint32_t n = 0;
  ASSERT_TRUE(ReadAll(from_child, &n, 4));
  ASSERT_LE(n, kMaxRmaDescriptorBytes);
  std::vector<uint8_t> descriptor(n);
  ASSERT_TRUE(ReadAll(from_child, descriptor.data(), n));

  std::shared_ptr<RmaDomain> domain;
  ASSERT_TRUE(RmaDomain::Open("writer", "shm", &domain).ok());
  ASSERT_NE(domain, nullptr);
  EXPECT_EQ(domain->transports(), "posix");
  std::shared_ptr<RemoteWindow> window;
  Status st = domain->Attach(descriptor, "owner", &window);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(window->bytes(), kWindowBytes);

  std::vector<uint8_t> src(kWindowBytes), back(kWindowBytes);
  for (uint8_t seed : {7, 99}) {
    for (uint64_t i = 0; i < kWindowBytes; ++i) src[i] = Pattern(i, seed);
    // In uneven pieces, as a replica's records are.
    for (uint64_t off = 0; off < kWindowBytes;) {
      uint64_t piece = std::min<uint64_t>(kWindowBytes - off, 1234567);
      st = window->Put(off, src.data() + off, piece);
      ASSERT_TRUE(st.ok()) << st.message();
      off += piece;
    }
    ASSERT_TRUE(WriteAll(to_child, &seed, 1));
    uint8_t ok = 0;
    ASSERT_TRUE(ReadAll(from_child, &ok, 1));
    EXPECT_EQ(ok, 1) << "the owner's window does not hold what was put";
    st = window->Get(0, back.data(), kWindowBytes);
    ASSERT_TRUE(st.ok()) << st.message();
    for (uint64_t i = 0; i < kWindowBytes; ++i) src[i] = Pattern(i, static_cast<uint8_t>(seed + 1));
    EXPECT_TRUE(back == src) << "a get does not return what the owner wrote";
  }

  // Bounds: nothing outside the window, named in the error.
  st = window->Put(kWindowBytes - 10, src.data(), 11);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("outside its window"), std::string::npos) << st.message();
  EXPECT_EQ(window->Get(UINT64_MAX, back.data(), 1).code(), CKPTDB_EINVAL);
  EXPECT_TRUE(window->Put(kWindowBytes, src.data(), 0).ok());

  // The owner dies: puts and gets still complete (into and out of the mapping this process
  // holds), and detaching is clean.
  kill(owner, SIGKILL);
  int status = 0;
  waitpid(owner, &status, 0);
  EXPECT_TRUE(window->Put(0, src.data(), kWindowBytes).ok());
  EXPECT_TRUE(window->Get(0, back.data(), kWindowBytes).ok());
  EXPECT_TRUE(back == src);
  window.reset();
  close(to_child);
  close(from_child);

  // A descriptor of a window whose owner is gone does not attach (its memory cannot be found).
  Status late = domain->Attach(descriptor, "a dead owner", &window);
  EXPECT_FALSE(late.ok());
  EXPECT_NE(late.message().find("a dead owner"), std::string::npos) << late.message();
}

TEST(RmaWindow, ExposeRefusesSizesOutsideItsBounds) {
  std::shared_ptr<RmaDomain> domain;
  ASSERT_TRUE(RmaDomain::Open("owner", "posix", &domain).ok());
  ASSERT_NE(domain, nullptr);
  std::shared_ptr<RmaWindow> w;
  EXPECT_EQ(domain->Expose(0, &w).code(), CKPTDB_EINVAL);
  EXPECT_EQ(domain->Expose(kMaxRmaWindowBytes + 1, &w).code(), CKPTDB_EINVAL);
  ASSERT_TRUE(domain->Expose(4096, &w).ok());
  EXPECT_LE(w->descriptor().size(), kMaxRmaDescriptorBytes);
  EXPECT_NE(w->id(), 0u);
}

}  // namespace
}  // namespace ckpt::transport
