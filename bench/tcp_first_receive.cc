// A probe of the machine, not of ckptdb: plain tcp over loopback (no UCX), one sender thread
// sending 512 MiB rounds from one buffer, the receiver receiving each round into a region of its
// own memory, some regions used for the first time (populated with MAP_POPULATE, some also
// written by user space first), some received into before. On the VMs of docs/performance.md a
// region's first receive ran at a fifth of the rate of later ones, whatever user space had done
// to it: the cost is the kernel's first write to each page, so a restore after a restart (new
// processes, buffers the kernel never wrote) pays it and a replication into recycled memory
// does not.
//
// Usage: bench_tcp_first_receive [MiB per round] (default 512)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Die(const char* what) {
  std::perror(what);
  std::exit(2);
}

uint8_t* Populated(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) Die("mmap");
  return static_cast<uint8_t*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 512;
  CLI::App app{"the first receive into new memory over tcp (docs/performance.md)"};
  app.add_option("mib", mib, "MiB per round")->check(CLI::Range(size_t{1}, size_t{4096}));
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = mib << 20;
  // Rounds: the region each is received into, and whether user space wrote it first.
  struct Round {
    int region;
    const char* what;
  };
  const Round rounds[] = {{0, "populated, never written"},
                          {0, "received into before"},
                          {1, "populated, then memset by user space"},
                          {1, "received into before"},
                          {2, "populated, never written"}};
  const int kRounds = sizeof rounds / sizeof rounds[0];

  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0 ||
      listen(listener, 1) != 0) {
    Die("listen");
  }
  std::thread sender([&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) Die("connect");
    uint8_t* src = Populated(bytes);
    std::memset(src, 3, bytes);
    for (int r = 0; r < kRounds; ++r) {
      for (size_t done = 0; done < bytes;) {
        ssize_t n = send(fd, src + done, bytes - done, 0);
        if (n <= 0) Die("send");
        done += static_cast<size_t>(n);
      }
    }
    close(fd);
  });
  int fd = accept(listener, nullptr, nullptr);
  if (fd < 0) Die("accept");
  uint8_t* dst = Populated(3 * bytes);
  std::memset(dst + bytes, 5, bytes);  // region 1: written by user space before any receive
  std::printf("tcp over loopback, %zu MiB a round, into populated memory\n", bytes >> 20);
  for (int r = 0; r < kRounds; ++r) {
    uint8_t* p = dst + rounds[r].region * bytes;
    double t0 = Now();
    for (size_t done = 0; done < bytes;) {
      ssize_t n = recv(fd, p + done, bytes - done, 0);
      if (n <= 0) Die("recv");
      done += static_cast<size_t>(n);
    }
    std::printf("  round %d, region %d (%s): %.2f GB/s\n", r, rounds[r].region, rounds[r].what,
                bytes / (Now() - t0) / 1e9);
  }
  sender.join();
  return 0;
}
