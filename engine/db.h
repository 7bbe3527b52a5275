// Db: one rank's store (DESIGN.md sections 3-6). The only place that knows what a version is.
//
// Write path (this build copies synchronously in put_shard; the asynchronous pipeline replaces
// the copy loop, not the layout): each chunk is copied into a slot of a pre-allocated staging
// area, hashed while hot, framed as a record and written with io_uring to the temporary segment
// file of every tier that takes the version. Commit appends the manifest and footer, fsyncs,
// renames, fsyncs the directory, then records PREPARED and COMMITTED, synced, in the catalog.
//
// Read path: restore reads a tensor's chunks straight into the caller's buffer from the fastest
// tier holding a durable copy, checks each chunk's xxh3 and re-reads a failing chunk from the
// next tier; what no tier can supply is zeroed and reported, never returned as data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/catalog.h"
#include "engine/tier.h"
#include "format/segment_reader.h"
#include "io/io.h"
#include "util/status.h"

namespace ckpt::engine {

struct DbOptions {
  std::string root;
  std::string tiers;  // empty: "disk:<root>/segments", or the catalog's for read-only opens
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string node_id;
  std::string redundancy = "none";
  std::string coordinator;  // host:port; unused while world_size = 1
  std::string job_token;    // unused while world_size = 1
  uint64_t staging_bytes = 64ull << 20;
  uint64_t chunk_bytes = 4ull << 20;
  uint32_t queue_depth = 64;
  bool read_only = false;
  bool create_if_missing = true;
  io::Io* io = nullptr;  // nullptr: the real POSIX + io_uring Io
};

// Named points in the commit and recovery sequence where tests may stop the process.
// A hook that returns makes the point a no-op.
using CrashHook = void (*)(const char* point);
void SetCrashHookForTesting(CrashHook hook);

class Db {
 public:
  static Status Open(const DbOptions& options, std::unique_ptr<Db>* out);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  Status Close();

  Status PutShard(uint64_t version, const char* name, const void* data, size_t nbytes,
                  const ckptdb_tensor_info* info, unsigned flags);
  Status WaitCapture(uint64_t version, int timeout_ms);
  Status Commit(uint64_t version, unsigned flags);
  Status WaitCommit(uint64_t version, int timeout_ms);
  Status Abort(uint64_t version);

  Status Latest(uint64_t* version);
  Status Restore(uint64_t version, const char* name, void* dst, size_t nbytes, unsigned flags);
  Status List(uint64_t version, ckptdb_list_fn fn, void* arg);
  Status ListVersions(ckptdb_version_fn fn, void* arg);
  Status Verify(uint64_t version, const char* tier, ckptdb_verify_fn fn, void* arg,
                ckptdb_verify_report* report);
  Status Stats(ckptdb_stats_t* out);

  const std::vector<std::unique_ptr<Tier>>& tiers() const { return tiers_; }

 private:
  struct TierWriter {
    size_t tier_index = 0;
    int fd = -1;
    bool published = false;
  };
  // A version being put: its segment files are open on every tier that takes it.
  struct OpenVersion {
    uint64_t version = 0;
    uint64_t created_unix_ns = 0;
    std::vector<TierWriter> writers;
    uint64_t next_offset = 0;  // where the next record goes (the same on every tier)
    std::vector<format::TensorEntry> tensors;
    std::set<std::string, std::less<>> names;
    std::vector<format::ChunkEntry> chunks;
    uint64_t data_bytes = 0;
    uint32_t writes_in_flight = 0;
    Status error;  // the first failed write: the version can only be aborted
  };
  // A cached reader of one committed segment on one tier.
  struct OpenSegment {
    int fd = -1;
    std::unique_ptr<format::SegmentReader> reader;
  };

  explicit Db(DbOptions options);
  Status OpenImpl();
  Status Recover();
  Status OpenVersionFor(uint64_t version, OpenVersion** out);
  Status WriteChunk(OpenVersion* v, const uint8_t* src, uint64_t bytes);
  Status AcquireSlot(size_t* slot);
  Status SubmitWrites(OpenVersion* v, size_t slot, uint64_t offset, const void* buf,
                      uint64_t length, bool fixed);
  Status Pump(size_t min_completions);
  Status DrainVersion(OpenVersion* v);
  Status FinishSegments(OpenVersion* v, uint64_t* manifest_xxh3);
  Status AbortOpen(uint64_t version, const std::string& why);
  Status ApplyRetention();
  Status CheckNotClosed() const;
  Status ReadSegment(uint64_t version, size_t tier_index, OpenSegment** out);
  void DropSegments(uint64_t version);
  bool FileDurable(const ResidencyRecord& r) const;
  int TierIndex(const std::string& name) const;
  Status ReadChunksInto(OpenSegment* seg, const std::vector<uint32_t>& chunks, uint64_t first_chunk,
                        uint8_t* dst, size_t tier_index, std::vector<uint32_t>* failed);
  std::optional<uint64_t> LastCommitted() const;

  DbOptions options_;
  std::unique_ptr<io::Io> owned_io_;
  io::Io* io_ = nullptr;
  std::unique_ptr<io::IoQueue> write_queue_;
  std::unique_ptr<io::IoQueue> read_queue_;
  std::unique_ptr<Catalog> catalog_;
  Identity identity_;
  std::vector<std::unique_ptr<Tier>> tiers_;
  int lock_fd_ = -1;
  bool closed_ = false;
  bool created_root_ = false;                 // this Open created the root directory
  std::vector<std::string> markers_written_;  // tier markers this Open created
  Status poisoned_;  // set when the outcome of a commit is unknown: only Close is allowed

  // Staging: slot_count slots of (4096 + chunk_bytes) bytes, one mapping, registered as one
  // io_uring fixed buffer when the kernel lets us.
  uint8_t* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  size_t slot_bytes_ = 0;
  size_t slot_count_ = 0;
  bool fixed_buffers_ = false;
  std::vector<uint32_t> slot_pending_;  // writes in flight from each slot
  std::vector<uint64_t> slot_version_;  // the version each busy slot belongs to
  std::vector<size_t> free_slots_;

  std::map<uint64_t, OpenVersion> open_;
  std::map<uint64_t, VersionEntry> versions_;  // the catalog's view, kept in memory
  std::map<std::pair<uint64_t, size_t>, OpenSegment> segments_;  // (version, tier) readers

  uint64_t committing_version_ = 0;  // owner of kTagCommit completions (one commit at a time)
  std::string last_problem_;         // the first chunk failure of the current restore

  std::mutex mu_;  // serializes every public call
  ckptdb_stats_t stats_{};
};

}  // namespace ckpt::engine
