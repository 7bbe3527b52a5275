#include "tests/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ckpt::test {

TempDir::TempDir(const std::string& parent) {
  std::string tmpl = parent + "/ckptdb-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void FillRandom(void* dst, size_t n, uint64_t seed) {
  uint8_t* p = static_cast<uint8_t*>(dst);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  auto next = [&x]() {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (; i + 8 <= n; i += 8) {
    uint64_t v = next();
    std::memcpy(p + i, &v, 8);
  }
  if (i < n) {
    uint64_t v = next();
    std::memcpy(p + i, &v, n - i);
  }
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  FillRandom(v.data(), n, seed);
  return v;
}

int RunCommand(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* f = popen(full.c_str(), "r");
  if (f == nullptr) return -1;
  output->clear();
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) output->append(buf, n);
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteWholeFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

void FlipByte(const std::string& path, uint64_t offset, uint8_t mask) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) throw std::runtime_error("open " + path);
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  std::fputc(c ^ mask, f);
  std::fclose(f);
}

std::vector<int> RunForked(uint32_t count, const std::function<int(uint32_t)>& fn) {
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < count; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(90);  // never outlive the test
      _exit(fn(r));
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

uint64_t EnvCount(const char* name, uint64_t fallback) {
  const char* env = std::getenv(name);
  return env != nullptr ? std::strtoull(env, nullptr, 10) : fallback;
}

// A port for a coordinator to listen at later. Below the kernel's ephemeral range (32768 and up
// here), where the job's own outgoing connections take their local ports: a port picked there
// was seen taken by one of them by the time the restarted coordinator bound it ("Device is
// busy"). Each candidate must bind now (no SO_REUSEADDR: a port with connections in TIME_WAIT
// is skipped too); successive calls walk on, so two phases never share a port.
int FreePort() {
  static int next = 10000 + static_cast<int>((getpid() * 7919u) % 20000u);
  for (int tries = 0; tries < 22000; ++tries) {
    const int port = next++;
    if (next >= 32000) next = 10000;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    if (fd >= 0) close(fd);
    if (free) return port;
  }
  std::fprintf(stderr, "no free port in 10000..31999\n");
  return 0;
}

}  // namespace ckpt::test
