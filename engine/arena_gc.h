// Shared memory that outlives its store (`ckptdb gc`, ckptdb_gc; docs/cli.md "gc"). A ram tier's
// arena and a rank's peers' replicas and parity live in a memory file system so that they
// outlive a crashed trainer; they also outlive a store whose root was deleted, and then nothing
// frees them. This finds them and removes the orphans.
//
// In a directory (default /dev/shm) it lists:
//   - arenas, ckptdb-<job id>-r<rank>.ram: their header names the store's root (absolute), job
//     and rank. The root owns the arena when it exists and its catalog (opened read-only) names
//     the same job and rank and a ram tier whose arena file is this one. An arena is an
//     **orphan** when its header reads and its root is gone, or exists and owns another arena.
//     A header that does not read, or a root whose catalog cannot be read, is never an orphan:
//     nothing is removed on a guess.
//   - replica and parity directories, ckptdb-replicas-r<rank> and ckptdb-parity-r<rank>: an
//     orphan when no arena of that rank in the directory is owned by its root or has an owner
//     that cannot be told (a `ckptdb serve` daemon's have no arena beside them).
//   - a root that cannot be looked at (EACCES, EIO: not ENOENT) is not gone.
// Whatever a process has open is **in use** and never removed: every process that maps an arena,
// replica or parity file holds a shared flock on it (io/shared_memory.h, LockShared), and a
// replica or parity store one on its directory for its life (io::DirLock); removal takes an
// exclusive one without waiting, checks that the name is still the file it examined, and
// unlinks it under that lock; a replica or parity directory goes file by file under its own
// exclusive lock, and stays (with what is left) when one of its files is in use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::engine {

struct ShmEntry {
  enum class Kind : uint8_t { kArena, kReplicas, kParity };
  Kind kind = Kind::kArena;
  std::string path;
  uint32_t rank = 0;
  uint64_t job_id = 0;  // arenas: the header's
  std::string root;     // arenas: the header's ("" when it does not read)
  uint64_t bytes = 0;   // the file's size; a directory's files' sizes
  bool has_version = false;
  uint64_t newest_version = 0;  // the newest copy indexed in the arena, or held in the directory
  bool in_use = false;          // a process has it (one of its files) open
  bool root_exists = false;
  bool owned = false;   // arenas: its root's store uses it; directories: an owned arena is beside
  bool orphan = false;  // removable (when not in use)
  bool removed = false;
  std::string problem;  // why the header did not read, why ownership is unknown, why not removed
};

// Lists what lies in `dir` (its arenas and replica and parity directories; other names are left
// alone), and with `remove`, removes the orphans not in use. NotFound when dir is missing.
// Bounded: at most 2^20 names in dir and in each directory it descends into.
Status CollectSharedMemory(const std::string& dir, bool remove, std::vector<ShmEntry>* out);

}  // namespace ckpt::engine
