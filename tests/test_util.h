// Helpers shared by the tests: temporary directories that clean up after themselves, and
// deterministic test data.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"

namespace ckpt::test {

// A fresh directory under `parent` (/dev/shm for tmpfs, /var/tmp for a disk file system),
// removed with everything in it when the object goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/dev/shm");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic pseudo-random bytes (splitmix64 of seed and position). The streams of seeds s and
// s + 1 overlap, shifted by 8 bytes: a test that looks for one seed's bytes inside a file must
// use seeds far apart.
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed);
void FillRandom(void* dst, size_t n, uint64_t seed);

// Runs a shell command, returns its exit status and stdout+stderr.
int RunCommand(const std::string& command, std::string* output);

// The unsigned number in environment variable `name` (a test's size, raised by hand), or `fallback`
// when unset.
uint64_t EnvCount(const char* name, uint64_t fallback);

// In a forked rank's body (a `uint32_t rank` in scope, returning its exit code; ckptdb/ckptdb.h
// included): when cond is false, say why on stderr, with ckptdb_last_error(), and return 1.
#define RANK_CHECK(cond, ...)                                           \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "rank %u: check failed: %s: ", rank, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                \
      std::fprintf(stderr, " (%s)\n", ckptdb_last_error());             \
      return 1;                                                         \
    }                                                                   \
  } while (0)

// version -> state of its copy on `tier` (by name) in db's list of versions (ckptdb_list_versions;
// no entry when none is listed).
std::map<uint64_t, int> ResidencyOn(ckptdb* db, const std::string& tier);
// The versions db lists as COMMITTED, ascending.
std::vector<uint64_t> CommittedVersions(ckptdb* db);
// Every regular file under `dir`, by path, with its bytes (the store's LOCK left out when
// `without_lock`: an open takes it, and that is no change).
std::map<std::string, std::string> SnapshotFiles(const std::string& dir, bool without_lock);

std::string ReadWholeFile(const std::string& path);
void WriteWholeFile(const std::string& path, const std::string& contents);
// XORs one byte of a file in place with `mask`.
void FlipByte(const std::string& path, uint64_t offset, uint8_t mask = 0x01);

}  // namespace ckpt::test
