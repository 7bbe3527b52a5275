// ckptdb gc [DIR...] [--remove]: shared memory that outlives its store (ckptdb_gc;
// engine/arena_gc.h). Lists the arenas and the replica and parity directories in each DIR
// (default /dev/shm) with their store's root, rank, size, newest version and state; --remove
// deletes the orphans no process has open.
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace ckpt::tools {
namespace {

struct GcArgs {
  std::vector<std::string> dirs;
  bool remove = false;
};

struct Tally {
  bool remove = false;
  uint64_t entries = 0;
  uint64_t orphans = 0;
  uint64_t orphan_bytes = 0;
  uint64_t removed = 0;
  uint64_t removed_bytes = 0;
  uint64_t failed = 0;
};

// A path or message from a file's bytes, safe for a terminal: control bytes and bytes above
// 0x7e as \xNN, at most 200 bytes of it shown.
std::string Quoted(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c > 0x7e || c == '\\') {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > 200) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

const char* KindName(uint32_t kind) {
  return kind == CKPTDB_SHM_ARENA ? "arena" : kind == CKPTDB_SHM_REPLICAS ? "replicas" : "parity";
}

std::string State(const ckptdb_shm_entry& e) {
  if (e.removed) return "removed (orphan)";
  if (e.in_use) return "in use";
  if (e.owned) return "owned by its root";
  if (e.orphan) {
    if (e.kind != CKPTDB_SHM_ARENA)
      return "orphan: no owned arena of rank " + std::to_string(e.rank);
    return e.root_exists ? "orphan: its root owns another store or arena" : "orphan: root gone";
  }
  return "kept: whose it is cannot be told";
}

int Print(void* arg, const ckptdb_shm_entry* e) {
  auto* t = static_cast<Tally*>(arg);
  t->entries++;
  const bool orphan = e->orphan && !e->in_use;
  if (orphan) {
    t->orphans++;
    t->orphan_bytes += e->bytes;
  }
  if (e->removed) {
    t->removed++;
    t->removed_bytes += e->bytes;
  } else if (t->remove && orphan) {
    t->failed++;
  }
  std::printf("%-8s %s\n", KindName(e->kind), Quoted(e->path).c_str());
  std::printf("         rank %u, %s, newest version %s\n", e->rank, HumanBytes(e->bytes).c_str(),
              e->has_version ? std::to_string(e->newest_version).c_str() : "none");
  if (e->kind == CKPTDB_SHM_ARENA) {
    std::printf("         root %s (%s)\n", e->root[0] != '\0' ? Quoted(e->root).c_str() : "unknown",
                e->root_exists ? "exists" : "gone");
  }
  std::printf("         %s\n", State(*e).c_str());
  if (e->problem[0] != '\0') std::printf("         note: %s\n", Quoted(e->problem).c_str());
  return 0;
}

int RunGc(const GcArgs& args) {
  std::vector<std::string> dirs = args.dirs;
  if (dirs.empty()) dirs.push_back("/dev/shm");
  Tally t;
  t.remove = args.remove;
  for (const std::string& dir : dirs) {
    const int rc = ckptdb_gc(dir.c_str(), args.remove ? 1 : 0, Print, &t);
    if (rc != CKPTDB_OK) {
      std::fprintf(stderr, "ckptdb gc: %s: %s\n", dir.c_str(), ErrorText(rc).c_str());
      return ExitCodeFor(rc);
    }
  }
  if (args.remove) {
    std::printf("%" PRIu64 " found, %" PRIu64 " orphan(s) removed (%s)%s\n", t.entries, t.removed,
                HumanBytes(t.removed_bytes).c_str(),
                t.failed ? (", " + std::to_string(t.failed) + " could not be").c_str() : "");
  } else {
    std::printf("%" PRIu64 " found, %" PRIu64 " orphan(s) holding %s; --remove deletes them\n",
                t.entries, t.orphans, HumanBytes(t.orphan_bytes).c_str());
  }
  return t.failed ? kExitProblem : kExitOk;
}

}  // namespace

void AddGcCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GcArgs>();
  CLI::App* cmd = app.add_subcommand(
      "gc", "List the ram arenas and replica files in shared memory; --remove the orphans");
  cmd->add_option("dirs", args->dirs, "Directories to look in (default: /dev/shm)");
  cmd->add_flag("--remove", args->remove,
                "Delete the orphans (root gone, or the root owns another) no process has open");
  cmd->callback([args, exit_code] { *exit_code = RunGc(*args); });
}

}  // namespace ckpt::tools
