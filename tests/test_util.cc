#include "tests/test_util.h"

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

std::map<uint64_t, int> ResidencyOn(ckptdb* db, const std::string& tier) {
  struct Arg {
    std::string tier;
    std::map<uint64_t, int> out;
  } arg{tier, {}};
  const int rc = ckptdb_list_versions(
      db,
      [](void* p, const ckptdb_version_info* i) {
        auto* a = static_cast<Arg*>(p);
        for (uint32_t k = 0; k < i->residency_count; ++k) {
          if (a->tier == i->residency[k].tier) a->out[i->version] = i->residency[k].state;
        }
        return 0;
      },
      &arg);
  if (rc != CKPTDB_OK) std::fprintf(stderr, "ResidencyOn: %s\n", ckptdb_last_error());
  return arg.out;
}

std::vector<uint64_t> CommittedVersions(ckptdb* db) {
  std::vector<uint64_t> out;
  const int rc = ckptdb_list_versions(
      db,
      [](void* p, const ckptdb_version_info* i) {
        if (i->state == CKPTDB_STATE_COMMITTED)
          static_cast<std::vector<uint64_t>*>(p)->push_back(i->version);
        return 0;
      },
      &out);
  if (rc != CKPTDB_OK) std::fprintf(stderr, "CommittedVersions: %s\n", ckptdb_last_error());
  return out;
}

std::map<std::string, std::string> SnapshotFiles(const std::string& dir, bool without_lock) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string path = e.path().string();
    if (!e.is_regular_file() || (without_lock && path.ends_with("/LOCK"))) continue;
    files[path] = ReadWholeFile(path);
  }
  return files;
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

uint64_t EnvCount(const char* name, uint64_t fallback) {
  const char* env = std::getenv(name);
  return env != nullptr ? std::strtoull(env, nullptr, 10) : fallback;
}

}  // namespace ckpt::test
