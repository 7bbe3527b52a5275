// Crash states (issue 6; docs/testing.md, "Crash-state enumeration"): what a file system may keep
// when the process or the machine stops at any point of a recorded run, in the manner of
// ALICE and CrashMonkey, and of LevelDB's fault-injection Env ("drop unsynced data").
//
// Three parts:
//   - FsTrace: the file-system mutations of a run (create, write, truncate, fsync, close, rename,
//     remove, directory fsync, mkdir) under watched directories, each with a sequence number
//     from a clock that forked processes may share (a MAP_SHARED counter), so that the traces
//     of a job's ranks merge into one order that respects every message between them.
//     Named markers (the engine's crash points) are recorded in the same order.
//   - RecordingIo: an Io that forwards to a base Io and records what it changes in an FsTrace
//     (the catalog's RocksDB files are recorded by engine/catalog.cc's recording file system).
//   - CrashState: replays a prefix of a trace and writes into the watched directories what a
//     crash at that point may leave, by each directory's durability (ops name files by path: a
//     write through a descriptor whose name was renamed or removed since is dropped, so a
//     writer must close before it renames, as ckptdb and RocksDB do):
//       kMemory (ram, tmpfs): a process crash keeps everything; a power loss keeps nothing.
//       kDisk: a process crash keeps everything (the page cache outlives the process). A power
//         loss keeps each file's data as of its last fsync, plus any subset of the writes since
//         (each one kept whole, dropped, or torn: a random subset of its 512-byte sectors),
//         applied in any order (overlapping writes are applied in trace order, so the newest
//         wins where both are kept); directory entries (files and directories made in the
//         trace) as of the directory's last fsync, plus a prefix of the later creates, renames,
//         removes and mkdirs (a journaled file system keeps metadata in order). Each watched
//         directory is its own journal: an fsync of one directory makes nothing in another
//         durable. A name under a directory that did not survive does not either.
//       kNfs (close-to-open): data is on the server once the file is closed or fsynced, and
//         every create, rename and remove is durable when it returns; a client crash loses the
//         rest of an open file's unsynced writes (any subset kept, as for kDisk).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "io/io.h"

namespace ckpt::io {

struct FsOp {
  enum class Kind : uint8_t {
    kCreate,    // path created empty (or truncated to 0)
    kWrite,     // data at offset
    kTruncate,  // to offset bytes
    kSync,      // fsync or fdatasync of path
    kClose,     // the last descriptor of path closed (NFS: flushes to the server)
    kRename,    // path -> to
    kRemove,    // path
    kSyncDir,   // fsync of directory path
    kMkdir,     // path (and its parents)
    kMarker,    // path = a name (an engine crash point); changes nothing
  };
  Kind kind = Kind::kMarker;
  uint64_t seq = 0;
  std::string path;
  std::string to;  // kRename only
  uint64_t offset = 0;
  std::string data;  // kWrite only
};
const char* FsOpKindName(FsOp::Kind kind);

enum class Durability : uint8_t { kMemory, kDisk, kNfs };

class FsTrace {
 public:
  // clock: the sequence source; nullptr: this trace's own. A shared clock must outlive the trace.
  explicit FsTrace(std::atomic<uint64_t>* clock = nullptr)
      : clock_(clock != nullptr ? clock : &own_clock_) {}

  // Ops on paths under dir (a directory path, no trailing '/') are recorded from now on.
  void Watch(const std::string& dir);
  bool Watched(const std::string& path) const;
  // Recording stops (and resumes) without forgetting what was recorded.
  void SetRecording(bool on) { recording_ = on; }

  // Records op (its seq assigned now) when recording and its path is watched (markers always).
  void Record(FsOp op);
  void Mark(const std::string& name);

  std::vector<FsOp> ops() const;
  size_t size() const;

  // A trace saved to a file by a forked process and loaded by its parent.
  Status Save(const std::string& path) const;
  static Status Load(const std::string& path, std::vector<FsOp>* ops);

 private:
  std::atomic<uint64_t> own_clock_{0};
  std::atomic<uint64_t>* clock_;
  std::atomic<bool> recording_{true};
  mutable std::mutex mu_;
  std::vector<std::string> watched_;
  std::vector<FsOp> ops_;
};

// Records every change base makes under the trace's watched directories. Data writes are
// recorded as their completions are reaped (the bytes the kernel took, read from the caller's
// buffer before the caller sees the completion).
class RecordingIo final : public IoWrapper {
 public:
  RecordingIo(Io* base, FsTrace* trace) : IoWrapper(base), trace_(trace) {}

  Status NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) override;
  Status Open(const std::string& path, const OpenOptions& options, int* fd,
              bool* direct_out) override;
  Status Close(int fd) override;
  Status CreateDirs(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Status WriteFileDurably(const std::string& path, const std::string& contents) override;

  // The path a descriptor opened through this Io names; empty if unknown.
  std::string PathOf(int fd) const;
  FsTrace* trace() const { return trace_; }

 private:
  FsTrace* trace_;
  mutable std::mutex mu_;
  std::map<int, std::string> paths_;  // open descriptors
};

// What to leave for one crash: how each watched directory fared.
struct CrashSpec {
  enum class Mode : uint8_t {
    kProcess,    // the process died; the machine (page cache, memory) lived on
    kPowerLoss,  // the machine lost power: each directory keeps what its durability promises
  };
  // Ops with seq < end are replayed.
  uint64_t end = 0;
  // By watched directory; a directory not named uses default_mode.
  std::map<std::string, Mode> modes;
  Mode default_mode = Mode::kPowerLoss;
  // Chooses which unsynced writes survive, and how they tear. The same seed, the same state.
  uint64_t seed = 0;
  // Power loss: keep every unsynced write and metadata change (the luckiest crash) instead of a
  // random choice; with keep_none, none of them (the unluckiest).
  bool keep_all = false;
  bool keep_none = false;
};

struct CrashDirectory {
  std::string path;
  Durability durability = Durability::kDisk;
};

// Empties each directory and writes into it the state spec leaves after replaying ops (sorted
// by seq). Ops on paths outside every directory are ignored. Returns what it chose, for the
// failure message: counts of unsynced writes kept, torn and dropped.
struct CrashChoices {
  uint64_t ops_replayed = 0;
  uint64_t writes_kept = 0;
  uint64_t writes_torn = 0;
  uint64_t writes_dropped = 0;
  uint64_t metadata_kept = 0;
  uint64_t metadata_dropped = 0;
  std::string Describe() const;
};
Status BuildCrashState(const std::vector<FsOp>& ops, const std::vector<CrashDirectory>& dirs,
                       const CrashSpec& spec, CrashChoices* choices);

}  // namespace ckpt::io
