// Db: one rank's store (DESIGN.md sections 3-6). The only place that knows what a version is.
//
// Threads (docs/architecture.md draws them):
//   - callers: put_shard validates and queues a shard's chunks and returns (lazy capture,
//     DataStates-LLM); wait_capture waits until no chunk of the version is still read from the
//     caller's buffers; commit asks for the commit and, unless ASYNC, waits for its outcome.
//   - capture workers (options.capture_threads): copy each queued chunk from the caller's buffer
//     into staging memory, hashing it while it is in cache. Staging is the ram tier's arena when
//     the first tier is ram (the copy is then already the ram copy), else the staging ring, from
//     which the manager writes the chunk to the first tier's file. When staging is full the
//     back-pressure policy decides: block, direct (write from the caller's buffer) or skip.
//   - the device thread (ckpt-device, started with the device, engine/device_pipeline.h): a
//     device chunk's worker only queues its D2H copy into staging; this thread reaps the copies
//     (the caller's buffer is then free: wait_capture counts the chunk captured) and hashes them.
//   - the tier manager (one thread): owns the io_uring write queue and every change to files and
//     to the catalog. It opens versions on the first tier, writes ring chunks, runs commits
//     (tail, fsync, rename, PREPARED, COMMITTED), demotes committed versions to slower tiers
//     re-verifying each chunk, and evicts copies the tier policy no longer wants.
//   - readers (restore, list, verify; serialized by read_mu_): read the fastest tier holding a
//     copy, check every chunk, fall back chunk by chunk. A ram copy being read is pinned so the
//     manager does not evict it meanwhile.
//
// Locking: mu_ guards every field below it that is not marked otherwise, and is held only for
// bookkeeping, never across a copy, a file operation or a catalog write (the manager's eventfd
// wake and io_uring submissions of small requests are the exceptions). read_mu_ is taken before
// mu_ when both are held.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/catalog.h"
#include "engine/cluster.h"
#include "engine/config.h"
#include "engine/device_pipeline.h"
#include "engine/figures.h"
#include "engine/job_commit.h"
#include "engine/ram_tier.h"
#include "engine/restore_plan.h"
#include "engine/staging_ring.h"
#include "engine/tier.h"
#include "engine/witness.h"
#include "format/manifest.h"
#include "format/segment_reader.h"
#include "io/io.h"
#include "util/spare_vector.h"
#include "util/status.h"

namespace ckpt::engine {

// `ckptdb serve` (ckptdb_serve): serves the replicas kept in the directory of options.tiers' ram
// tier to the job whose coordinator is options.coordinator, until *out is destroyed.
Status ServeNodeMemory(const DbOptions& options, std::unique_ptr<Cluster>* out);

// Named points in the commit, demotion and recovery sequences where tests may stop the process.
// A hook that returns makes the point a no-op. Called from whichever thread reaches the point.
using CrashHook = void (*)(const char* point);
void SetCrashHookForTesting(CrashHook hook);

// Tests: the Io every Db this process opens from now on uses when DbOptions.io is nullptr (the
// multi-process crash tests record their ranks' file changes through it); nullptr: the real one.
void SetIoForTesting(io::Io* io);

class Db {
 public:
  static Status Open(const DbOptions& options, std::unique_ptr<Db>* out);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  Status Close();

  Status PutShard(uint64_t version, const char* name, const void* data, size_t nbytes,
                  const ckptdb_tensor_info* info, unsigned flags);
  // ckptdb_put_shards: all of `shards` or none, under one lock.
  Status PutShards(uint64_t version, const ckptdb_shard* shards, size_t count);
  Status WaitCapture(uint64_t version, int timeout_ms);
  Status Commit(uint64_t version, unsigned flags);
  Status WaitCommit(uint64_t version, const char* tier, int timeout_ms);
  Status Abort(uint64_t version);

  Status Latest(uint64_t* version);
  Status Recoverable(uint64_t version, ckptdb_recoverable_t* out);
  // `wanted` (restore_slice): sorted, disjoint byte ranges of the shard the caller needs; chunks
  // that meet none of them are not read and their bytes in dst are left as they were.
  using ByteRanges = std::vector<std::pair<uint64_t, uint64_t>>;  // [begin, end)
  Status Restore(uint64_t version, const char* name, void* dst, size_t nbytes, unsigned flags,
                 const ByteRanges* wanted = nullptr);
  Status RestoreSlice(uint64_t version, const char* name, const ckptdb_box* box, void* dst,
                      size_t nbytes, unsigned flags, uint64_t* covered);
  Status List(uint64_t version, ckptdb_list_fn fn, void* arg);
  Status ListChunks(uint64_t version, const char* name, ckptdb_chunk_fn fn, void* arg,
                    const char** source);
  Status ListVersions(ckptdb_version_fn fn, void* arg);
  Status Verify(uint64_t version, const char* tier, ckptdb_verify_fn fn, void* arg,
                ckptdb_verify_report* report);
  Status Stats(ckptdb_stats_t* out);
  const std::vector<std::string>& open_problems() const { return witness_problems_; }
  Status Hint(unsigned hints);
  Status DeclareReplicas(uint32_t group, const uint32_t* members, size_t count,
                         const char* protection);
  // world_size > 1: where this rank's last restore came from, replication figures.
  Cluster* cluster() { return cluster_.get(); }
  Status GetVersionStats(uint64_t version, ckptdb_version_stats_t* out);

  // ---- For a coding group's check across its members' stores (engine/group_check.h) ----------
  uint32_t rank() const { return identity_.rank; }
  uint64_t job_id() const { return identity_.job_id; }
  // Where this rank keeps the parity it holds for its coding group (ParityStore); "": no ram.
  std::string ParityDir() const;
  // Every file call of this handle goes through it (verify opens parity segments with it).
  io::Io* io() const { return io_; }
  // One copy of a committed version, read and checked chunk by chunk.
  struct CopyCheck {
    std::string tier;
    bool ram = false;
    uint64_t file_bytes = 0;
    Status readable;  // not Ok: unreadable as a whole (gone, framing, manifest); bad is empty
    std::vector<std::pair<uint64_t, uint64_t>> bad;  // [begin, end) of records failing checks
  };
  struct CopiesOf {
    uint64_t version = 0;
    std::vector<CopyCheck> copies;  // fastest tier first
    // The coding group's layout from the first readable manifest; nullopt when none says one.
    std::optional<CodingGroup> group;
    uint32_t position = 0;  // this rank's in group->members
  };
  // Every copy of every committed version (or of `version`): opened (framing and manifest) and,
  // with check_chunks, every chunk checked.
  Status CheckCopies(uint64_t version, bool check_chunks, std::vector<CopiesOf>* out);
  // Bytes [offset, offset + bytes) of the segment image of `version` on tier `tier` (a name
  // CheckCopies gave), unchecked: the caller knows which ranges failed.
  Status ReadCopy(uint64_t version, const std::string& tier, uint64_t offset, uint64_t bytes,
                  uint8_t* out);

 private:
  // ---- Tiers -----------------------------------------------------------------------------------
  struct TierState {
    explicit TierState(io::TierSpec s) : spec(std::move(s)) {}
    io::TierSpec spec;
    std::unique_ptr<Tier> dir;     // tmpfs and disk tiers
    std::unique_ptr<RamTier> ram;  // the ram tier (index 0 when present)
    bool is_ram() const { return ram != nullptr; }
    const std::string& name() const { return spec.name; }
    bool Takes(uint64_t version) const { return version % spec.every == 0; }
    // An nfs tier whose server does not answer (at open, or probed after a demotion to it
    // failed) is offline: nothing is demoted to or from it, nothing of it is swept, and its
    // catalog records stand. The manager tries it again at retry_ns (also after a demotion that
    // failed while the server answered: it is tried again, kNfsDemotionTries times in all).
    Status offline;
    uint64_t retry_ns = 0;
    uint64_t backoff_ns = 0;
    bool online() const { return offline.ok(); }
    bool is_nfs() const { return spec.kind == io::TierKind::kNfs; }
    // Counters for ckptdb_stats (mu_).
    uint64_t bytes_written = 0;
    uint64_t write_ns = 0;
    uint64_t bytes_read = 0;
    uint64_t fsyncs = 0;
    uint32_t demotions = 0;
    uint32_t evictions = 0;
    uint32_t demotion_failures = 0;
  };

  // ---- A version between its first put and its commit or abort (mu_) ---------------------------
  enum class Home : uint8_t {
    kQueued,   // waiting for a capture worker; its bytes are still in the caller's buffer
    kCopying,  // a worker is copying it into its staging region (device: its copy is queued)
    kHashing,  // device: copied (the caller's buffer is free), the device thread hashes it
    kStaged,   // copied and hashed into a ring region, awaiting its write (a ram chunk goes
               // straight to kDone: the arena region is its copy)
    kDirect,   // being written to the first tier straight from the caller's buffer
    kWriting,  // its write from a ring region is in flight
    kDone,     // on the first tier (ram: in the arena; directory: written to the file)
    kDropped,  // the version failed or was skipped; nothing of it is kept
  };
  struct ChunkSlot {
    uint64_t record_offset = 0;  // in the segment file (and the ram image)
    uint64_t payload_bytes = 0;
    uint64_t xxh3 = 0;
    const uint8_t* src = nullptr;        // the caller's bytes
    StagingRing::Region region{};        // arena or ring region, when it has one
    uint32_t header_block = UINT32_MAX;  // kDirect: its header block in direct_headers_
    uint8_t direct_writes = 0;           // kDirect: its writes still in flight
    int device = -1;                     // >= 0: src is that GPU's memory, read by its copy engine
    uint32_t pack = kNoPack;             // a pack of small shards: its parts, v->packs[pack]
    bool parity = false;                 // the pack's parts are XORed: an AEC parity unit
    Home home = Home::kQueued;
  };
  // A small shard in a pack (a chunk that several shards of one put call share, docs/format.md):
  // copied from src to `offset` of the pack's payload; its xxh3 goes to v->tensors[tensor].
  struct PackPart {
    const uint8_t* src = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t tensor = 0;
  };
  static constexpr uint32_t kNoPack = UINT32_MAX;
  enum class CommitPhase : uint8_t {
    kNone,
    kTail,       // the header block (ram), manifest record and footer are being placed or written
    kSync,       // directory capture: the file is being fsynced
    kDemote,     // the commit tier is slower than tier 0: demoting to the tiers up to it
    kDecide,     // safe on the commit tier: PREPARED and COMMITTED are next
    kReplicate,  // world_size > 1: the cluster worker is pushing the image to placement peers
    kVoting,     // PREPARED is durable and the vote is cast: waiting for the coordinator
  };
  struct LiveVersion {
    uint64_t version = 0;
    uint64_t created_unix_ns = 0;
    uint64_t first_put_mono_ns = 0;
    bool ram = false;      // captured into the ram arena; otherwise through the ring to tier 0
    bool opened = false;   // the manager created its file (or header region) and OPEN record
    int fd = -1;           // tier 0's temporary file (directory capture)
    int buffered_fd = -1;  // the same file without O_DIRECT, for unaligned direct writes
    bool fd_direct = false;
    StagingRing::Region header_region{};  // ram: the segment header block
    uint64_t next_offset = 0;             // where the next record goes
    std::vector<format::TensorEntry> tensors;
    std::unordered_set<std::string> names;   // hashed: a version may hold millions
    std::set<std::string> replicated_names;  // put with CKPTDB_PUT_REPLICATED
    // Once the manifest is built (and has taken `tensors`): the replicated shards' entries.
    std::vector<format::TensorEntry> replicated_tensors;
    std::deque<ChunkSlot> chunks;  // a deque: workers hold references while puts append
    // Each pack's parts, in payload order, never changed once made: workers read them unlocked.
    std::deque<std::vector<PackPart>> packs;
    // REFT's ARC: the pieces of deduplicated shards that other members save, only hashed (so
    // the commit compares whole replicas and a restore checks what peers send).
    struct HashPiece {
      const uint8_t* src = nullptr;
      uint64_t bytes = 0;
      uint64_t xxh3 = 0;
    };
    std::deque<HashPiece> hash_pieces;
    // Each deduplicated shard's pieces, by name: >= 0 chunk index, < 0 hash piece -1 - index.
    std::map<std::string, std::vector<int64_t>> piece_sources;
    uint64_t data_bytes = 0;
    uint64_t uncaptured = 0;         // chunks kQueued, kCopying or kDirect: callers' bytes in use
    uint64_t unwritten = 0;          // directory capture: chunks not yet kDone
    uint64_t unhashed = 0;           // chunks kHashing
    std::vector<uint32_t> to_write;  // kStaged ring chunks and kDirect chunks for the manager
    uint32_t writes_in_flight = 0;   // the manager's requests for this version
    Status error;                    // the first failure: the version can only be aborted
    bool abort_requested = false;    // abort, close, a failure, or a newer commit
    bool commit_requested = false;
    CommitPhase phase = CommitPhase::kNone;
    uint64_t commit_requested_mono_ns = 0;
    // Arena waiters (chunk index, or kCommitWaiter for the commit's own regions) and the arena's
    // frees() at their last failed attempt: one that has not retried since space was freed may
    // still succeed, so the manager does not call the wait a deadlock yet.
    std::map<uint32_t, uint64_t> arena_waiters;
    uint64_t generation = 0;  // tells a version number put again after an abort from the first
    // Commit state (the manager).
    std::vector<uint8_t> manifest;
    uint64_t manifest_xxh3 = 0;
    // Directory capture: the header block until its write completes, then the tail's.
    std::unique_ptr<uint8_t, void (*)(void*)> tail{nullptr, std::free};
    uint64_t tail_bytes = 0;
    RamImage image;                          // ram capture: the image being committed
    std::vector<ResidencyRecord> residency;  // the copies PREPARED will record durable
    std::vector<size_t> demote_to;           // commit-path demotions still to run
    uint64_t tier0_started_mono_ns = 0;
    bool synced = false;  // directory capture: the fsync of the commit completed
    // world_size > 1: its push to the peers, its vote and the coordinator's decision, changed
    // only through DeliverLocked's messages and the worker's yes claim (ClaimYesLocked). While
    // job.replicating() the worker reads the arena image: an abort waits for it.
    JobCommit job;
    VersionStatsRecord stats;
  };

  // ---- A committed copy being read (restore, list, verify, demotion) ---------------------------
  struct OpenSegment {
    size_t tier = 0;
    int fd = -1;     // directory tiers
    RamImage image;  // the ram tier
    std::unique_ptr<format::SegmentReader> reader;
  };

  // A member of this rank's replica group whose own segment (or a replica of it) a restore
  // gathers slices from, its manifest read once per version restored.
  struct ArcMember {
    ReplicaHolder holder;  // the member itself, or a holder of its replica
    std::unique_ptr<format::SegmentReader> reader;
    bool failed = false;
  };
  // A peer's replica of this rank's segment, its manifest read once per version restored.
  struct PeerReplica {
    ReplicaHolder holder;
    std::unique_ptr<format::SegmentReader> reader;  // nullptr: not opened yet
    bool failed = false;                            // vanished or unreadable: skipped
    std::unique_ptr<PeerPrefetch> prefetch;         // its records, fetched at its opening
  };

  // ---- Demotion: copying a version from a faster tier to a slower one (manager only) ----------
  struct Demotion {
    uint64_t version = 0;
    size_t source = 0;
    size_t target = 0;
    bool for_commit = false;  // part of a commit whose commit tier is slower than tier 0
    OpenSegment segment;      // the source copy, manifest checked
    int fd = -1;
    bool direct = false;
    uint64_t file_bytes = 0;
    // Records to copy in file order: the header block, each chunk record, the tail.
    struct Record {
      uint64_t offset = 0;
      uint64_t bytes = 0;
      int64_t chunk = -1;                // the chunk index, -1 for the header block and the tail
      StagingRing::Region ring{};        // directory source: where it was read to
      bool read_done = false;            // directory source: the read completed, to check and write
      bool written = false;              // its write was submitted
      const uint8_t* encoded = nullptr;  // the header block or tail: written from `encoded`
    };
    std::vector<Record> records;
    // The header block and the tail, encoded again from the source's checked header, footer and
    // manifest rather than copied: what is written is what was verified.
    std::unique_ptr<uint8_t, void (*)(void*)> head{nullptr, std::free};
    std::unique_ptr<uint8_t, void (*)(void*)> tail{nullptr, std::free};
    size_t next = 0;       // the next record to start
    size_t unwritten = 0;  // directory source: every record before it is written
    uint32_t in_flight = 0;
    bool syncing = false;
    bool synced = false;
    Status error;
    uint64_t started_mono_ns = 0;
  };

  // ---- In-flight requests of the write queue (manager only) -------------------------------------
  enum class RequestKind : uint8_t {
    kWake,          // the eventfd read that wakes the manager
    kHeader,        // a version's segment header block (directory capture)
    kChunk,         // a chunk record from a ring region
    kDirectHeader,  // a direct chunk's record header block
    kDirectData,    // a direct chunk's payload from the caller's buffer
    kTail,          // a version's manifest record and footer
    kSync,          // a version's fsync at commit
    kDemoteRead,
    kDemoteWrite,
    kDemoteSync,
  };
  struct Request {
    RequestKind kind;
    uint64_t version = 0;
    uint32_t chunk = 0;  // chunk index or demotion record index
    uint64_t bytes = 0;
    int64_t result = 0;
  };

  // ---- Worker pool ------------------------------------------------------------------------------
  struct ParallelJob {
    std::function<void(size_t)> fn;
    size_t count = 0;
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
  };
  static constexpr uint32_t kNoPiece = UINT32_MAX;
  struct Task {
    uint64_t version = 0;  // a capture task: chunk `chunk` of `version`
    uint32_t chunk = 0;
    uint32_t piece = kNoPiece;          // or hash piece `piece` of `version` (hash_pieces)
    std::shared_ptr<ParallelJob> help;  // or help with a caller's parallel job
  };

  explicit Db(DbOptions options);
  Status OpenImpl();
  // OpenImpl's steps, in order (ValidateOptions, engine/config.h, first).
  Status ParseWriterTiers(const std::string& cwd, const std::string& spec,  // tier_choice.cc
                          std::vector<io::TierSpec>* specs);
  void ChooseIo();
  Status OpenRoot();
  Status OpenCatalog(bool* reopen_read_write);
  Status CheckIdentity(Status identity_read, bool reopen_read_write);
  Status ParseReaderTiers(const std::string& cwd, std::vector<io::TierSpec>* specs);
  Status ChooseWriterTiers(const std::string& cwd, std::vector<io::TierSpec>* specs);
  Status ReleaseDroppedCopies(bool release);
  Status AllocateWriteBuffers(const io::QueueOptions& qo);
  void RegisterFixedBuffers();
  Status OpenTiers(const std::vector<io::TierSpec>& specs);
  // Open's check of a catalog opened read-only (Catalog::Open): every commit witness of this
  // rank must be accounted for by a COMMITTED (or RETIRED) record with the same manifest;
  // Corrupt otherwise. A damaged witness of a committed version is noted (witness_problems_).
  Status CheckWitnesses(Catalog& catalog, const std::string& root);
  // The witness of a version whose COMMITTED record is durable. A failure is printed and
  // returned; the version stays committed (the witness is the redundant record of that), and
  // its commit reports the failure (witness_errors_; invariant 14).
  Status WriteWitness(const VersionRecord& rec);
  std::string CanonicalTiers() const;
  // After recovery (read-write opens): a witness for every committed version that has none (a
  // damaged one is left for verify to report and ckptdb repair to rewrite).
  void WriteMissingWitnesses(const std::string& root);
  // Ok when the file at `path` is a whole segment of this rank's `version` with that manifest
  // (footer, manifest record and checksums; the chunks are checked when read).
  Status CheckPublishedSegment(const std::string& path, uint64_t version, uint64_t manifest_xxh3,
                               uint64_t* file_bytes);
  Status Recover();
  void RefreshResidencyLocked(CatalogBatch* batch);
  Status CheckNotClosed() const;
  void StartThreads();

  // capture.cc. A shard of a put, checked without the lock (ValidatePut, the device check).
  struct PreparedShard {
    format::TensorEntry t;
    const uint8_t* data = nullptr;
    size_t nbytes = 0;
    unsigned flags = 0;
    int device = -1;  // >= 0: the data is that GPU's memory
  };
  Status PrepareShard(uint64_t version, const char* name, const void* data, size_t nbytes,
                      const ckptdb_tensor_info* info, unsigned flags, PreparedShard* out);
  // The refusals that need the lock, for a shard that comes after `batch_chunks` chunks and
  // `batch_tensors` tensors of the same call.
  Status CheckPutLocked(uint64_t version, const PreparedShard& s, uint64_t batch_chunks,
                        uint64_t batch_tensors);
  // Lays a checked shard out in v and queues its chunks (COPY_NOW: into own_*, for the caller's
  // thread). Cannot fail.
  void AddShardLocked(LiveVersion* v, PreparedShard&& s, std::vector<uint32_t>* own_chunks,
                      std::vector<uint32_t>* own_pieces);
  // Lays the small host shards `packable` of one call out in packs (chunks they share) and
  // queues each pack's chunk. Cannot fail.
  void AddPacksLocked(LiveVersion* v, std::vector<PreparedShard>* shards,
                      const std::vector<uint32_t>& packable, std::vector<uint32_t>* own_chunks);
  // A pack's payload at most: kPackBytes, or chunk_bytes when smaller.
  uint64_t PackLimit() const;
  // REFT's AEC: lays out and queues this member's parity units of deduplicated shard s (t).
  void AddParityLocked(LiveVersion* v, const PreparedShard& s, uint32_t count, uint32_t position,
                       format::TensorEntry* t, std::vector<uint32_t>* own_chunks);
  // The shards of one call put into `version` (PutShard: one, PutShards: many): checked in
  // order, the first refusal returned with `context(i)` and nothing changed; then laid out and
  // queued under one lock.
  Status PutPrepared(uint64_t version, std::vector<PreparedShard>* shards,
                     const std::function<std::string(size_t)>& context, uint64_t start);
  Status CaptureOnCallerLocked(std::unique_lock<std::mutex>& lock, uint64_t version,
                               uint64_t generation, const std::vector<uint32_t>& own_pieces,
                               const std::vector<uint32_t>& own_chunks);
  void WorkerLoop();
  void CaptureChunk(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index);
  // A worker's run of small host chunks of v (the queue's front ones): their staging taken in
  // one hold of the lock, copied and hashed in one release, finished in one more hold. Returns
  // false, taking nothing, when the front task is not such a chunk or its staging is not free
  // at once (CaptureChunk then applies back-pressure).
  bool CaptureSmallChunks(std::unique_lock<std::mutex>& lock, LiveVersion* v);
  bool ChunkCapturedLocked(LiveVersion* v, uint32_t index, uint64_t xxh3);
  static uint64_t CopyPack(uint8_t* payload, const std::vector<PackPart>& parts,
                           std::vector<uint64_t>* part_xxh3);
  // An AEC parity unit's payload: the XOR of `parts` (host memory), zero-padded.
  static void XorParts(uint8_t* payload, uint64_t bytes, const std::vector<PackPart>& parts);
  bool AcquireStaging(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index,
                      uint64_t bytes, StagingRing::Region* out);
  void FailLocked(LiveVersion* v, const Status& st);
  void DropQueuedLocked(LiveVersion* v);
  void SkipLocked(LiveVersion* v, const std::string& why);
  // wake_waiters = false: a capture worker's chunk, which no waiter looks for on its own (they
  // wait for the version's last one, always announced): not a wake-up a chunk.
  void FinishChunkLocked(LiveVersion* v, ChunkSlot* c, bool wake_waiters = true);
  // Hashes piece `index` of v's hash_pieces (ARC) from the caller's buffer; lock held, dropped.
  void HashPiece(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index);
  // One more task no longer reads the caller's buffer (uncaptured drops by one).
  void CapturedOneLocked(LiveVersion* v, bool wake_waiters = true);
  Status ValidatePut(uint64_t version, const char* name, const void* data, size_t nbytes,
                     const ckptdb_tensor_info* info, unsigned flags, format::TensorEntry* t);
  Status LiveVersionFor(uint64_t version, LiveVersion** out);
  void RunParallel(size_t count, std::function<void(size_t)> fn);
  std::optional<Status> FindOutcome(uint64_t version, const std::string& what) const;
  Status Outcome(uint64_t version, const std::string& what) const;
  void RememberOutcome(uint64_t version, const Status& st, bool may_put_again);

  // The tier manager: manager.cc (the loop, opening, writing), commit.cc (commits, aborts),
  // demotion.cc (demotions, evictions, retention).
  void ManagerLoop();
  void WakeManager();
  // Staging space back to the ring or the arena; every free goes through these (manager.cc).
  void SpaceFreedLocked();
  void FreeRingLocked(StagingRing::Region* region);
  void FreeArenaLocked(StagingRing::Region* region);
  void FreeChunkRegionLocked(const LiveVersion* v, ChunkSlot* c);
  bool ManagerStepLocked(std::unique_lock<std::mutex>& lock);
  void EncodeSegmentHeaderBlock(const LiveVersion& v, uint8_t* block) const;
  Status OpenOnFirstTier(std::unique_lock<std::mutex>& lock, LiveVersion* v);
  void SubmitWrites(std::unique_lock<std::mutex>& lock, LiveVersion* v);
  void DropUnwrittenLocked(LiveVersion* v);
  void HandleCompletion(std::unique_lock<std::mutex>& lock, const Request& r);
  void DemotionCompletedLocked(const Request& r);
  bool WriteReadRecordsLocked(std::unique_lock<std::mutex>& lock);
  bool RunCommit(std::unique_lock<std::mutex>& lock, LiveVersion* v);
  // What a round of RunCommit started from, to tell whether the round changed anything.
  struct CommitRound {
    CommitPhase phase;
    size_t copies;  // the version's residency entries
    bool demoting;  // a demotion was under way
  };
  bool CommitRoundChanged(uint64_t version, const CommitRound& round) const;
  bool FailCommitLocked(LiveVersion* v, const Status& st);
  // RunCommit's phases (commit.cc): nullopt goes on to the next phase in the same round; a
  // value is what RunCommit returns.
  std::optional<bool> CommitManifest(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                     const CommitRound& round);
  std::optional<bool> CommitTailInArena(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                        const CommitRound& round);
  std::optional<bool> CommitTailToFile(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                       const CommitRound& round);
  std::optional<bool> CommitPublishFile(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                        const CommitRound& round);
  std::optional<bool> CommitStartReplication(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                             const CommitRound& round);
  std::optional<bool> CommitVote(std::unique_lock<std::mutex>& lock, LiveVersion* v,
                                 const CommitRound& round);
  Status DecideCommit(std::unique_lock<std::mutex>& lock, LiveVersion* v);
  Status WritePrepared(std::unique_lock<std::mutex>& lock, LiveVersion* v, VersionRecord* rec);
  Status WriteCommitted(std::unique_lock<std::mutex>& lock, LiveVersion* v, VersionRecord rec);
  // cluster.cc hooks and the cluster worker (engine/distributed.cc); restoring from the job's
  // memory (engine/peer_restore.cc).
  Status ClusterOptionsFor(ClusterOptions* co) const;
  Status StartCluster();
  Status ResolveInDoubt();
  // A rank whose catalog was lost (a replacement node) finds its committed segments on tiers
  // that outlived the node (a shared file system) and records them (DESIGN.md section 7).
  Status AdoptSegments();
  // After recovery: which of the newest committed versions this rank holds recorded an "arc"
  // replica group in their manifests (arc_versions_), for its holdings.
  void LearnArcVersions();
  Status OnDecision(uint64_t version, bool committed, const std::string& why);
  // The one way the cluster's outcomes reach a live version (mu_ held; job_commit.h): applied to
  // its JobCommit, then what they mean for the version (failed, in doubt), and the manager woken.
  // A message for a version no longer live, or for an earlier attempt at it, changes nothing.
  void DeliverLocked(const JobCommit::Message& m);
  // The cluster worker, right before the yes vote for `version` leaves: false when the version
  // was given up (FinishAbort then votes no), else the vote is claimed (mu_ held).
  bool ClaimYesLocked(uint64_t version);
  // Two lanes, each its own thread, so that a vote never waits behind the next version's push
  // (which may wait a whole iteration for the trainer's idle spans: GEMINI's interleaving).
  enum ClusterLane : size_t { kProtectLane = 0, kVoteLane = 1, kClusterLanes = 2 };
  void ClusterWorkerLoop(size_t lane);
  void PostClusterJob(ClusterLane lane, std::function<void()> job);
  // The planner's peer step (peer_restore.cc): `name`'s pending chunks from peers' replicas of
  // this rank's segment, each checked against its xxh3. Non-Ok: no peer could be asked (why: in
  // plan->errors) or no such tensor / another size. PrefetchReplica: a replica's records whole.
  Status RestoreFromPeers(uint64_t version, const std::string& name, size_t nbytes, uint8_t* out,
                          RestorePlan* plan);
  std::unique_ptr<PeerPrefetch> PrefetchReplica(const ReplicaHolder& h, uint64_t version,
                                                const format::ManifestView& m);
  // The restore planner's rebuild step (a coding group: the other members' units and parity,
  // decoded; peer_restore.cc).
  Status RestoreFromRebuild(uint64_t version, const std::string& name, size_t nbytes, uint8_t* out,
                            RestorePlan* plan);
  // The restore planner's last step for a deduplicated shard (REFT's ARC and AEC,
  // peer_restore.cc): the pieces this rank does not keep, from each slice's owner, then from the
  // member keeping its ARC copy, then decoded from AEC's parity units (DecodeSlices,
  // aec_restore.cc), each checked against this rank's own xxh3 of it. What none supplies stays
  // !have.
  void GatherSlices(uint64_t version, const std::string& name, uint8_t* out, RestorePlan* plan);
  void DecodeSlices(uint64_t version, const std::string& name, uint8_t* out, RestorePlan* plan);
  void ReadOwnParityUnits(uint64_t version, const std::string& name,
                          const std::vector<uint64_t>& units, const std::vector<uint64_t>& bytes,
                          uint8_t* out, std::vector<Status>* results);
  void FetchParityUnits(uint64_t version, const std::string& name, RestorePlan* plan,
                        uint32_t holder, const std::vector<uint64_t>& units,
                        const std::vector<uint64_t>& bytes, uint8_t* out,
                        std::vector<Status>* results);
  void GatherSlice(uint64_t version, const std::string& name, uint8_t* out, RestorePlan* plan,
                   uint32_t s, uint32_t q, const ReplicaHolder& holder);
  // Opens member `owner`'s segment of `version` (its framing and manifest, fetched) on `holder`:
  // the member itself (any of its tiers), or a holder of its replica. Its manifest must record
  // the group `members` (ascending) cut in `piece_bytes`, or with members empty any group that
  // holds this rank and `owner`.
  Status OpenArcMember(uint64_t version, uint32_t owner, const ReplicaHolder& holder,
                       const std::vector<uint32_t>& members, uint64_t piece_bytes,
                       const std::string& what, ArcMember** out);
  // A rank with no copy of its own segment, in an "arc" group of a job without redundancy: lays
  // `name` out from a member's manifest (every shard of it was replicated), nothing kept here.
  Status LayOutFromGroup(uint64_t version, const std::string& name, size_t nbytes,
                         RestorePlan* plan);
  // REFT's AOR: a rank with no copy of its own reads `name` from the recomputed replica the
  // member before it keeps (aor_restore.cc); nothing when that member keeps none by the name.
  Status RestoreFromRecomputed(uint64_t version, const std::string& name, size_t nbytes,
                               uint8_t* out, RestorePlan* plan);
  // Lets the next gather ask the members that failed again (at most every 5 s).
  void RetryArcMembers();
  // Drops what arc_members_ and arc_holders_ know when they are of another version.
  void ForgetArcStateUnless(uint64_t version);
  // Bytes of this rank's own segment of `version` from its ram tier (a member rebuilding a lost
  // one reads them).
  Status ReadOwnSegment(uint64_t version, uint64_t offset, uint64_t bytes, uint8_t* out);
  void FinishAbort(std::unique_lock<std::mutex>& lock, LiveVersion* v);
  bool PlanDemotion(std::unique_lock<std::mutex>& lock);
  // An offline tier whose retry time came: opened again (its marker checked, its copies looked
  // for). True when one came back.
  bool RetryOfflineTiers(std::unique_lock<std::mutex>& lock);
  // An nfs tier's own witness of a version (and rank 0's decision record): written after its
  // copy there is recorded, removed before the copy goes. Without mu_.
  void WriteTierWitness(size_t tier, const VersionRecord& record);
  Status RemoveTierWitness(size_t tier, uint64_t version);
  // One offline tier tried again on tier_retry_ (RetryOfflineTiers starts it), without mu_.
  void RetryTier(size_t tier, std::vector<std::pair<uint64_t, ResidencyRecord>> copies);
  // The manager's longest wait for completions: until the next tier retry, or -1 (none).
  int ManagerWaitMsLocked() const;
  // A failed demotion: an nfs target backs off (offline if its server is gone), else the source
  // is given up for the version. Unlocks around the probe of an nfs target.
  void DemotionFailedLocked(std::unique_lock<std::mutex>& lock, uint64_t version, size_t source,
                            size_t target, const Status& st);
  // The tier waits before the next try (doubling, bounded); `offline` not Ok takes it offline.
  void BackOffLocked(size_t tier, const Status& offline);
  Status StartDemotion(std::unique_lock<std::mutex>& lock, uint64_t version, size_t source,
                       size_t target, bool for_commit);
  void PumpDemotion(std::unique_lock<std::mutex>& lock);
  Status PlanDemotionRecords(Demotion* d, const std::string& what);
  Status CheckAndWriteDemoted(const Demotion& d, size_t i, uint8_t* p, int buffer_index);
  void EndDemotion(std::unique_lock<std::mutex>& lock, const Status& st);
  bool EvictLocked(std::unique_lock<std::mutex>& lock);
  void RetireLocked(std::unique_lock<std::mutex>& lock);
  void DetectStagingDeadlockLocked();
  Status SubmitRequest(io::IoRequest request, Request meta);

  // Tier policy (policy.cc): which tiers want which committed versions.
  bool Wants(size_t tier, uint64_t version) const;
  bool Keeps(size_t tier, uint64_t version) const;
  bool Durable(const VersionEntry& e, size_t tier) const;
  bool Evictable(size_t tier, uint64_t version, bool for_space) const;
  bool HasSource(uint64_t version, size_t tier) const;
  std::optional<uint64_t> NewestCommitted() const;
  std::optional<uint64_t> LastCommitted() const;
  int TierIndex(const std::string& name) const;
  Status ResolveTier(const std::string& name_or_kind, size_t* index) const;
  uint64_t PendingBytes(size_t tier) const;

  // read.cc (restore, list) and verify.cc (verify, the group check's copies, figures)
  // The restore planner's sources (restore_sources.cc; DESIGN.md section 7), tried in the order
  // RestoreOrder gives: this rank's ram tiers, the job's memory (peers' replicas, or a coding
  // group's rebuild), this rank's slower tiers, and last the slices an "arc" replica group's
  // members keep. Each reads what it can of the chunks still pending, each checked against its
  // xxh3, and leaves the rest pending for the next, noting why.
  struct RestoreCall {
    uint64_t version = 0;
    const char* name = nullptr;
    size_t nbytes = 0;
    uint8_t* out = nullptr;
    RestorePlan* plan = nullptr;
    uint64_t read_by_tier[CKPTDB_MAX_TIERS] = {};  // bytes each tier served (its figures)
    uint64_t pieces_missing = 0;  // a deduplicated shard's pieces no member supplied (zeroed)
  };
  class RestoreSource {
   public:
    virtual ~RestoreSource() = default;
    // Nothing left for it to do: the tensor is laid out and nothing is pending.
    virtual bool Done(const RestorePlan& plan) const {
      return plan.laid_out && plan.pending.empty();
    }
    // Reads into call->out what it can. Non-Ok ends the restore: the version has no such tensor
    // (NotFound) or it has another size (Size), or the buffer can no longer be vouched for.
    virtual Status Read(RestoreCall* call) = 0;
    // The tier an empty tensor is said to come from, when this source is first: a local tier's
    // name; empty for the others.
    virtual std::string TierName() const { return ""; }
  };
  class TierSource;
  class PeerSource;
  class RebuildSource;
  class GroupSliceSource;
  class RecomputedSource;
  std::vector<std::unique_ptr<RestoreSource>> RestoreOrder(const std::vector<size_t>& candidates);
  // Into device memory (device_restore.cc): pipelined from this rank's tiers, else via the host.
  Status RestoreToDevice(uint64_t version, const char* name, uint8_t* dst, size_t nbytes,
                         int device, const std::string& what);
  Status PipeToDevice(OpenSegment* seg, RestorePlan* plan, uint8_t* dst, int device,
                      uint64_t* bytes);
  Status RestoreViaHost(uint64_t version, const char* name, void* dst, size_t nbytes, int device,
                        const std::string& what);
  uint64_t GatherDedupPieces(uint64_t version, const char* name, uint8_t* out, RestorePlan* plan);
  void RecordRestoreLocked(const RestorePlan& plan, const std::string& first_tier, size_t nbytes,
                           const ByteRanges* wanted, uint64_t start);
  // A copy Verify checks, and one Verify call's running account (its report, its progress, the
  // caller's callback).
  struct VerifyTarget {
    uint64_t version;
    ResidencyRecord res;
    uint64_t manifest_xxh3;
    int tier;  // index, -1 when the tier is not configured
  };
  struct VerifyRun {
    ckptdb_verify_fn fn = nullptr;
    void* arg = nullptr;
    ckptdb_verify_report rep{};
    uint64_t done_bytes = 0;
    uint64_t total = 0;
    std::vector<uint8_t> scratch;
    void Emit(int kind, const VerifyTarget& t, int64_t chunk, uint64_t offset, uint64_t expected,
              uint64_t actual, const std::string& message);
  };
  Status VerifyTargetsLocked(uint64_t version, const char* tier, std::vector<VerifyTarget>* out,
                             uint64_t* total);
  void VerifyCopy(const VerifyTarget& t, VerifyRun* run);
  void VerifySegment(const VerifyTarget& t, const std::string& what, uint64_t size,
                     const format::ReadAtFn& read, Status st, VerifyRun* run);
  Status ReadSegment(uint64_t version, size_t tier, OpenSegment** out);
  void WarmManifests();
  Status CheckCommittedLocked(uint64_t version, const std::string& what) const;
  Status CommittedCopies(uint64_t version, const std::string& what,
                         std::vector<size_t>* candidates);
  Status WithManifest(uint64_t version, const std::string& what,
                      const std::function<Status(const format::ManifestView&, size_t tier)>& visit);
  Status OpenSegmentAt(uint64_t version, size_t tier, const ResidencyRecord& res,
                       const VersionRecord& record, RamImage image, OpenSegment* out,
                       io::IoQueue* queue);
  Status ReadChunks(OpenSegment* seg, const RestorePlan& plan, const std::vector<uint32_t>& chunks,
                    const std::vector<uint64_t>& dst_offset, uint8_t* dst,
                    std::vector<uint32_t>* failed, uint64_t* bytes_read);
  // Lays the plan out from a source's manifest, or checks that the source lays `name` out the
  // same way. NotFound / Size when the first source has no such tensor or another size (the
  // caller's error); Corrupt when a later source disagrees (that source is skipped).
  Status LayOut(const format::ManifestView& m, const std::string& name, size_t nbytes,
                const std::string& source, RestorePlan* plan);
  void Pin(uint64_t version);
  void Unpin(uint64_t version);
  class RamPin;  // engine/internal.h

  const DbOptions options_;
  std::unique_ptr<io::Io> owned_io_;
  io::Io* io_ = nullptr;
  std::unique_ptr<Catalog> catalog_;
  Identity identity_;
  std::vector<TierState> tiers_;
  size_t commit_tier_ = 0;
  int lock_fd_ = -1;
  bool created_root_ = false;                  // this Open created the root directory
  bool created_catalog_ = false;               // this Open created the catalog in an existing root
  std::vector<std::string> witness_problems_;  // damage Open went past: witnesses, the arena
  std::map<uint64_t, WitnessFile> early_witnesses_;  // listed by Open before the catalog is read
  // Committed versions whose witness could not be written, for their commit and wait_commit to
  // report (bounded as outcomes_).
  std::map<uint64_t, Status> witness_errors_;
  std::vector<std::string> markers_written_;  // tier markers this Open created
  std::string ram_created_;                   // the arena file this Open created
  std::string ram_replaced_;  // where the arena it replaced waits until the Open succeeds

  // Staging ring (read-write handles): staging_bytes of memory mapped once, mlocked where
  // allowed, registered with io_uring as a fixed buffer.
  uint8_t* staging_ = nullptr;
  uint64_t staging_bytes_ = 0;
  // GPU memory (engine/device_pipeline.h): opened outside mu_, under device_mu_; device_open_ is
  // set once it is ready and never cleared before close: from then on device_.device, .capture
  // and .restore are only read, by any thread.
  std::mutex device_mu_;
  DevicePipeline device_;
  std::atomic<bool> device_open_{false};
  Status OpenDeviceOnce();
  bool DeviceConfigured() const { return io::DeviceBuild() || options_.device == "sim"; }
  void DeviceLoop();  // the device thread: capture's copies reaped, their chunks hashed
  void HashCopiedChunk(std::unique_lock<std::mutex>& lock, LiveVersion* v, uint32_t index);
  // Where p points (-1: host memory). `flagged`: the caller named it device memory, so the device
  // is opened and host memory is an error; otherwise p is host memory unless the device is
  // already open and says otherwise (an error asking it counts as host memory).
  Status LocateDevice(const void* p, bool flagged, const std::string& what, int* device);
  std::unique_ptr<StagingRing> ring_;
  bool fixed_buffers_ = false;  // the ring is io_uring fixed buffer 0
  int fixed_arena_base_ = -1;   // the arena's first fixed buffer (1 GiB each), -1: not fixed
  // Header blocks for chunks written straight from callers' buffers (policy direct).
  uint8_t* direct_headers_ = nullptr;
  std::vector<uint32_t> free_direct_headers_;
  static constexpr uint32_t kDirectHeaders = 64;

  std::mutex mu_;
  std::condition_variable state_cv_;  // any change a waiter may care about
  std::condition_variable work_cv_;   // capture tasks or stop, for workers
  bool closed_ = false;
  bool closing_ = false;       // Close has begun: no new calls
  bool manager_idle_ = false;  // closing, and the manager has finished what close waits for
  bool stopping_ = false;      // threads are asked to stop
  Status poisoned_;            // set when the outcome of a commit is unknown: only Close is allowed

  std::map<uint64_t, VersionEntry> versions_;  // the catalog's view
  static constexpr uint32_t kCommitWaiter = UINT32_MAX;
  std::map<uint64_t, LiveVersion> live_;
  // The memory of a version's tensor list and of a batched put's shards, kept for the next one
  // (util/spare_vector.h): pages of megabytes not mapped and faulted again every version.
  SpareVector<format::TensorEntry> spare_entries_{size_t{256} << 20};
  SpareVector<PreparedShard> spare_batch_{size_t{256} << 20};
  // Failed, skipped or aborted versions, newest kMaxOutcomes. A version that failed or was
  // skipped may not be put again: the rest of its shards would make a checkpoint without the
  // first ones. One its caller aborted may.
  struct Finished {
    Status status;
    bool may_put_again = false;
  };
  std::map<uint64_t, Finished> outcomes_;
  std::deque<Task> tasks_;
  std::map<uint64_t, RamImage> ram_images_;  // committed copies in the arena
  std::map<uint64_t, uint32_t> ram_pins_;    // readers of a ram copy
  uint64_t next_generation_ = 1;
  uint64_t ram_reserve_bytes_ = 0;  // arena space the next version is likely to need
  std::optional<Demotion> demotion_;
  // Demotions that failed, by (version, target): the sources that failed, and the last error.
  // A target with no source left is given up until the next open.
  std::map<std::pair<uint64_t, size_t>, std::set<size_t>> failed_sources_;
  std::map<std::pair<uint64_t, size_t>, Status> demotion_errors_;
  // Demotions to an nfs tier that failed while its server answered, by (version, target): tried
  // again after the tier's backoff until kNfsDemotionTries.
  std::map<std::pair<uint64_t, size_t>, uint32_t> demotion_tries_;
  // The thread that tries an offline tier again (one at a time; busy while it runs, mu_).
  std::thread tier_retry_;
  bool tier_retry_busy_ = false;
  std::set<uint64_t> stats_dirty_;  // versions whose figures changed since they were persisted
  Figures figures_;                 // ckptdb_stats' counters: atomics of their own, not under mu_

  // Manager thread state (the manager alone).
  std::unique_ptr<io::IoQueue> queue_;
  // Small synchronous reads of a demotion source's header, footer and manifest: through the Io
  // like every file access, on a queue of their own (queue_ has other requests in flight).
  std::unique_ptr<io::IoQueue> metadata_queue_;
  // A read-only open of tier directories alone: the private root of its catalog (tier_view.h),
  // removed at close.
  std::string view_root_;
  int wake_fd_ = -1;
  uint64_t wake_buffer_ = 0;
  uint64_t next_request_ = 1;
  std::map<uint64_t, Request> requests_;
  std::atomic<bool> wake_pending_{false};

  std::thread manager_;
  std::unique_ptr<Cluster> cluster_;  // world_size > 1
  // Off the manager thread: replication pushes and parity (kProtectLane), votes (kVoteLane).
  std::array<std::thread, kClusterLanes> cluster_workers_;
  std::array<std::deque<std::function<void()>>, kClusterLanes> cluster_jobs_;  // mu_
  std::array<std::condition_variable, kClusterLanes> cluster_cv_;  // a lane's job wakes it alone
  bool cluster_stop_ = false;                                      // mu_
  std::set<uint64_t> job_committed_;  // mu_: versions the coordinator committed
  uint64_t newest_vote_sent_ = 0;     // mu_: the newest version this rank sent a yes vote for
  // ckptdb_declare_replicas (mu_): the replica group whose members compare their replicated
  // shards at every commit.
  struct ReplicaGroup {
    uint32_t group = 0;
    std::vector<uint32_t> members;  // ascending
    bool arc = false;  // "arc", "arc+aec": members keep the next member's slice (REFT's ARC)
    bool aec = false;  // "aec", "arc+aec": and parity of the others' slices (REFT's AEC)
    bool aor = false;  // "...+aor": and the next member's private shards recomputed (REFT's AOR)
    bool dedup() const { return arc || aec; }  // replicated shards are cut into slices
    uint8_t protection() const {               // fb::ReplicaProtection, with format::kProtectionAor
      return (arc ? 1 : 0) | (aec ? 2 : 0) | (aor ? format::kProtectionAor : 0);
    }
    // The member that keeps this rank's private shards recomputed (AOR): the one before it.
    uint32_t Before(uint32_t rank) const {
      const size_t i = std::find(members.begin(), members.end(), rank) - members.begin();
      return members[(i + members.size() - 1) % members.size()];
    }
  };
  std::optional<ReplicaGroup> replica_group_;
  // Versions whose manifest records an "arc" replica group (mu_): written at commit, read back
  // at open; holdings report them so the coordinator counts a member's slices.
  struct ArcVersion {
    uint32_t group = 0;
    std::vector<uint32_t> members;
    bool replicated_only = false;
    uint8_t protection = 1;  // fb::ReplicaProtection
  };
  std::map<uint64_t, ArcVersion> arc_versions_;
  std::vector<std::thread> workers_;

  // Readers (read_mu_).
  std::mutex read_mu_;
  std::unique_ptr<io::IoQueue> read_queue_;
  std::map<std::pair<uint64_t, size_t>, OpenSegment> segments_;  // (version, tier) readers
  std::string last_problem_;         // the first chunk failure of the current restore
  uint64_t arc_version_ = 0;         // the version arc_members_ are of (0: none)
  uint64_t arc_retry_after_ns_ = 0;  // MonoNs before which failed members stay failed
  std::map<std::pair<uint32_t, std::string>, ArcMember> arc_members_;  // (owner, holder address)
  std::map<uint32_t, std::vector<ReplicaHolder>> arc_holders_;  // by member: its replicas' holders
  uint64_t peer_replicas_version_ = 0;  // the version peer_replicas_ are of (0: none)
  std::vector<PeerReplica> peer_replicas_;
  // The rebuild of one version (a restore of a model is a call per tensor): its units decoded
  // once. Under read_mu_.
  uint64_t rebuild_version_ = 0;
  std::unique_ptr<Cluster::Rebuild> rebuild_;
  std::unique_ptr<format::SegmentReader> rebuild_reader_;
};

}  // namespace ckpt::engine
