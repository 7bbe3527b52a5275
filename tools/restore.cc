// ckptdb restore ROOT --out DIR [--version V] [--name N]...: writes each tensor of a committed
// version (default: the latest restorable one) to its own file in DIR, plus DIR/index.json that
// maps tensor names to files. Tensor names come from the store and are not trusted: each becomes
// one flat file name in DIR (bytes outside [A-Za-z0-9._-] percent-encoded, ".bin" appended, long
// names shortened with a hash), so no name can be absolute, contain "..", or reach outside DIR.
// Files are created with O_EXCL | O_NOFOLLOW: nothing that exists is overwritten or followed.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "format/checksum.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "util/status.h"
#include "util/text.h"

namespace ckpt::tools {
namespace {

struct RestoreArgs {
  std::string root;
  std::string version;
  std::string out;
  std::vector<std::string> names;
};

// Creates `file` in dirfd (never following or replacing anything) and writes bytes to it; on
// failure removes what it created.
Status WriteNewFile(int dirfd, const std::string& file, const std::string& what,
                    const uint8_t* data, uint64_t bytes) {
  int fd = openat(dirfd, file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "create " + what);
  Status s = WriteAll(fd, data, bytes, what);
  if (s.ok() && fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + what);
  if (close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + what);
  if (!s.ok()) unlinkat(dirfd, file.c_str(), 0);
  return s;
}

int RunRestore(const RestoreArgs& args) {
  DbHandle db;
  uint64_t version = 0;
  if (!args.version.empty() && !ParseVersion(args.version, &version)) {
    std::fprintf(stderr, "ckptdb restore: --version %s is not a version number\n",
                 QuoteName(args.version).c_str());
    return kExitUsage;
  }
  if (int rc = OpenReadOnly(args.root, &db); rc != kExitOk) return rc;
  if (args.version.empty()) {
    if (int rc = ckptdb_latest(db.get(), &version); rc != CKPTDB_OK) {
      std::fprintf(stderr, "ckptdb restore: store %s has no restorable version: %s\n",
                   args.root.c_str(), ErrorText(rc).c_str());
      return ExitCodeFor(rc);
    }
  }
  std::vector<TensorRecord> tensors;
  if (int rc = ListTensors(db.get(), version, &tensors); rc != CKPTDB_OK) {
    std::fprintf(stderr, "ckptdb restore: %s\n", ErrorText(rc).c_str());
    return rc == CKPTDB_ENOTFOUND || rc == CKPTDB_ESTATE ? kExitUsage : kExitProblem;
  }
  if (!args.names.empty()) {
    std::set<std::string> wanted(args.names.begin(), args.names.end());
    std::vector<TensorRecord> selected;
    for (TensorRecord& t : tensors) {
      if (wanted.erase(t.name) > 0) selected.push_back(std::move(t));
    }
    if (!wanted.empty()) {
      std::fprintf(stderr, "ckptdb restore: version %" PRIu64 " has no tensor named %s\n", version,
                   QuoteName(*wanted.begin()).c_str());
      return kExitUsage;
    }
    tensors = std::move(selected);
  }

  // The output directory: created when missing; nothing in it is overwritten.
  std::error_code ec;
  std::filesystem::create_directories(args.out, ec);
  int dirfd = open(args.out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) {
    std::fprintf(stderr, "ckptdb restore: cannot use --out %s: %s\n", args.out.c_str(),
                 ec ? ec.message().c_str() : std::strerror(errno));
    return kExitUsage;
  }
  struct CloseDir {
    int fd;
    ~CloseDir() { close(fd); }
  } close_dir{dirfd};

  std::vector<std::string> files;
  std::set<std::string> seen;
  uint64_t largest = 0;
  for (const TensorRecord& t : tensors) {
    files.push_back(RestoreFileName(t.name));
    largest = std::max(largest, t.bytes);
    if (!seen.insert(files.back()).second) {
      std::fprintf(stderr, "ckptdb restore: two tensor names map to the file name %s\n",
                   files.back().c_str());
      return kExitProblem;
    }
  }
  files.push_back("index.json");
  for (const std::string& file : files) {
    struct stat st;
    if (fstatat(dirfd, file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) {
      std::fprintf(stderr, "ckptdb restore: %s/%s already exists; nothing was written\n",
                   args.out.c_str(), file.c_str());
      return kExitUsage;
    }
  }
  files.pop_back();

  Mapping buffer;
  buffer.bytes = std::max<uint64_t>(largest, 1);
  buffer.data =
      mmap(nullptr, buffer.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buffer.data == MAP_FAILED) {
    std::fprintf(stderr, "ckptdb restore: cannot map %s for the largest tensor: %s\n",
                 HumanBytes(largest).c_str(), std::strerror(errno));
    return kExitProblem;
  }

  nlohmann::ordered_json index;
  index["format"] = "ckptdb-restore";
  index["format_version"] = 1;
  index["root"] = args.root;
  index["version"] = version;
  index["tensors"] = nlohmann::ordered_json::array();
  index["failed"] = nlohmann::ordered_json::array();
  uint64_t restored_bytes = 0;
  size_t failures = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const TensorRecord& t = tensors[i];
    std::string what = args.out + "/" + files[i];
    int rc = ckptdb_restore(db.get(), version, t.name.c_str(), buffer.data, t.bytes, 0);
    std::string error;
    if (rc != CKPTDB_OK) {
      error = ErrorText(rc);  // ECORRUPT: the bytes are not trusted, so no file is written
    } else {
      Status s = WriteNewFile(dirfd, files[i], what, static_cast<uint8_t*>(buffer.data), t.bytes);
      if (!s.ok()) error = s.message();
    }
    if (!error.empty()) {
      failures++;
      std::fprintf(stderr, "ckptdb restore: tensor %s not restored: %s\n",
                   QuoteName(t.name).c_str(), SafeMessage(error).c_str());
      index["failed"].push_back({{"name", t.name}, {"error", error}});
      continue;
    }
    restored_bytes += t.bytes;
    index["tensors"].push_back({{"name", t.name},
                                {"file", files[i]},
                                {"dtype", ckptdb_dtype_name(t.dtype)},
                                {"shape", t.shape},
                                {"global_shape", t.global_shape},
                                {"global_offset", t.global_offset},
                                {"bytes", t.bytes}});
  }
  std::string text =
      JsonForTerminal(index.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace)) +
      "\n";
  Status s = WriteNewFile(dirfd, "index.json", args.out + "/index.json",
                          reinterpret_cast<const uint8_t*>(text.data()), text.size());
  if (s.ok() && fsync(dirfd) != 0) s = Status::FromErrno(errno, "fsync " + args.out);
  if (!s.ok()) {
    std::fprintf(stderr, "ckptdb restore: %s\n", SafeMessage(s.message()).c_str());
    return kExitProblem;
  }
  ckptdb_stats_t stats;
  std::string source = ckptdb_stats(db.get(), &stats) == CKPTDB_OK ? stats.last_restore_tier : "";
  std::printf("restored %zu of %zu tensor(s), %s, of version %" PRIu64 " into %s%s%s\n",
              tensors.size() - failures, tensors.size(), HumanBytes(restored_bytes).c_str(),
              version, args.out.c_str(), source.empty() ? "" : " from ", source.c_str());
  return failures == 0 ? kExitOk : kExitProblem;
}

}  // namespace

void AddRestoreCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<RestoreArgs>();
  CLI::App* cmd = app.add_subcommand(
      "restore", "Write each tensor of a committed version to its own file, with index.json");
  cmd->add_option("root", args->root, "The store's root directory")->required();
  cmd->add_option("--out,-o", args->out, "Directory to write into (created when missing)")
      ->required();
  cmd->add_option("--version,-v", args->version,
                  "The committed version (default: the latest restorable one)");
  cmd->add_option("--name,-n", args->names, "Restore only this tensor (repeatable)");
  cmd->callback([args, exit_code] { *exit_code = RunRestore(*args); });
}

}  // namespace ckpt::tools
