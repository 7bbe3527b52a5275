/* ckptdb: a checkpoint storage engine for large-model training.
 *
 * The only public header. Conventions (after LevelDB's c.h): opaque handles, pointer plus length,
 * no C++ types. Every call returns an int status: CKPTDB_OK (0) or a negative CKPTDB_E* code.
 * After a failed call, ckptdb_last_error() gives a thread-local message that names the object at
 * fault (file, chunk, tensor, version). docs/api.md documents each call at length.
 *
 * Thread safety: one ckptdb handle may be used from several threads at once. It runs threads of
 * its own (capture workers, a tier manager); restore, list, list_chunks and verify run one at a
 * time; no call may start once ckptdb_close has begun. Different handles are independent. One
 * process opens one handle per rank. docs/api.md ("Thread safety") has the details.
 */
#ifndef CKPTDB_CKPTDB_H_
#define CKPTDB_CKPTDB_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPTDB_VERSION_MAJOR 0
#define CKPTDB_VERSION_MINOR 2
#define CKPTDB_VERSION_PATCH 0

/* ---- Status codes ------------------------------------------------------------------------- */
#define CKPTDB_OK 0
#define CKPTDB_EINVAL -1    /* a bad argument: NULL or empty name, bad options, bad tier spec */
#define CKPTDB_ENOTFOUND -2 /* no such version, tensor or store */
#define CKPTDB_EEXIST -3    /* a name already put in this version */
#define CKPTDB_ESTATE -4    /* the call does not fit the version's state (put after commit, ...) */
#define CKPTDB_ECORRUPT -5  /* a checksum or format check failed on every copy */
#define CKPTDB_EIO -6       /* the operating system reported an I/O error */
#define CKPTDB_ENOSPC -7    /* a tier is full */
#define CKPTDB_ETIMEDOUT -8 /* a wait ran out of time */
#define CKPTDB_ENOMEM -9    /* memory for staging or metadata could not be had */
#define CKPTDB_ESIZE -10    /* a buffer's size does not match the stored tensor */
#define CKPTDB_ENOTSUP -11  /* valid, but not supported by this build or configuration */
#define CKPTDB_EBUSY \
  -12 /* the store is locked by another process; or the job is still recovering */
#define CKPTDB_EINTERNAL -13 /* an unexpected exception inside ckptdb: please report it */
#define CKPTDB_ESKIPPED                                                    \
  -14 /* back-pressure policy "skip" dropped the version: it will never be \
         committed, and the caller's buffers are free */
#define CKPTDB_EPEER                                                                              \
  -15                    /* a peer rank, the coordinator or a serving node vanished, timed out or \
                            broke the protocol */
#define CKPTDB_EAUTH -16 /* a peer does not hold this job's token (CKPTDB_JOB_TOKEN) */

/* A version value that means "every version" where a call accepts it. Not a valid version. */
#define CKPTDB_ALL_VERSIONS UINT64_MAX
/* An unset integer option: ckptdb_open fills it from the environment or a default. */
#define CKPTDB_UNSET 0xFFFFFFFFu

#define CKPTDB_MAX_DIMS 8
#define CKPTDB_MAX_NAME_BYTES 1024
#define CKPTDB_MAX_TIERS 8

/* ---- Element types ------------------------------------------------------------------------ */
typedef enum ckptdb_dtype {
  CKPTDB_DTYPE_UNKNOWN = 0, /* raw bytes: shape, if given, counts bytes */
  CKPTDB_DTYPE_BOOL = 1,
  CKPTDB_DTYPE_U8 = 2,
  CKPTDB_DTYPE_I8 = 3,
  CKPTDB_DTYPE_U16 = 4,
  CKPTDB_DTYPE_I16 = 5,
  CKPTDB_DTYPE_U32 = 6,
  CKPTDB_DTYPE_I32 = 7,
  CKPTDB_DTYPE_U64 = 8,
  CKPTDB_DTYPE_I64 = 9,
  CKPTDB_DTYPE_F16 = 10,
  CKPTDB_DTYPE_BF16 = 11,
  CKPTDB_DTYPE_F32 = 12,
  CKPTDB_DTYPE_F64 = 13,
  CKPTDB_DTYPE_F8_E4M3 = 14,
  CKPTDB_DTYPE_F8_E5M2 = 15,
  CKPTDB_DTYPE_COUNT_ = 16
} ckptdb_dtype;

/* Bytes per element of a dtype (1 for UNKNOWN), 0 for a value out of range. */
size_t ckptdb_dtype_bytes(int dtype);
/* "f32", "bf16", ...; "?" for a value out of range. */
const char* ckptdb_dtype_name(int dtype);

/* Describes a shard as a tensor. ndim = 0 with dtype UNKNOWN means "raw bytes" of any length;
 * ndim = 0 with another dtype is a scalar (nbytes must equal the dtype's size). When ndim > 0,
 * the product of shape[] times the dtype's size must equal the shard's byte count. global_shape
 * and global_offset place the shard in the full tensor (for resharding restores); all zero means
 * "this shard is the whole tensor". */
typedef struct ckptdb_tensor_info {
  int dtype;
  uint32_t ndim;
  uint64_t shape[CKPTDB_MAX_DIMS];
  uint64_t global_shape[CKPTDB_MAX_DIMS];
  uint64_t global_offset[CKPTDB_MAX_DIMS];
} ckptdb_tensor_info;

/* ---- Options ------------------------------------------------------------------------------ */
typedef struct ckptdb_options {
  /* Directory holding this rank's catalog. Env: CKPTDB_ROOT. Required, except for a read-only
   * open with tiers, which then reads those tier directories alone (a job's nfs tier after its
   * roots are gone; docs/api.md, "Reading a tier directory alone"). */
  const char* root;
  /* Tier spec, fastest first, e.g. "ram:8G,keep=2;disk:/nvme/ck,every=10,keep=3".
   * Env: CKPTDB_TIERS. Default: the store's own (the tiers of its last read-write open, which
   * its catalog records), or "disk:<root>/segments" for a new store. See docs/api.md for the
   * grammar. */
  const char* tiers;
  /* The tier a version must be safe on before ckptdb_commit records it committed: a tier's name
   * ("ram", "disk:/nvme/ck") or kind ("disk": the first disk tier). Tiers faster than it that
   * take the version must hold it too. Env: CKPTDB_COMMIT_TIER. Default: the first tier. */
  const char* commit_tier;
  /* What capture does when staging memory (the staging ring, or the ram tier's arena) is full:
   * "block" (wait for space), "direct" (write the chunk to its tier straight from the caller's
   * buffer), "skip" (drop the version: CKPTDB_ESKIPPED). Env: CKPTDB_BACKPRESSURE. Default
   * "block". */
  const char* backpressure;
  uint32_t rank;            /* Env: CKPTDB_RANK. Default 0. */
  uint32_t world_size;      /* Env: CKPTDB_WORLD_SIZE. Default 1. Above 1, ckptdb_open joins the
                               job through the coordinator and blocks until every rank has. */
  const char* node_id;      /* Env: CKPTDB_NODE_ID. Default: the host name. */
  const char* coordinator;  /* host:port where rank 0 listens. Env: CKPTDB_COORDINATOR. Used
                               when world_size > 1. */
  const char* redundancy;   /* "none" (default); "replicate:M": M copies in memory on M distinct
                               nodes (GEMINI placement); "ec:K+M" (Reed-Solomon) or "xor:K"
                               (M = 1): coding groups of K + M ranks on distinct nodes keep
                               parity of each other's segments in memory (ECHECK, REFT).
                               Env: CKPTDB_REDUNDANCY. */
  const char* job_token;    /* Env: CKPTDB_JOB_TOKEN. Every connection between ranks proves it
                               holds this secret; required when world_size > 1. */
  uint64_t staging_bytes;   /* Staging memory, allocated once at open. 0: 64 MiB. */
  uint64_t chunk_bytes;     /* Checksummed chunk size, a multiple of 4096. 0: 4 MiB. */
  uint32_t queue_depth;     /* io_uring submission queue entries. 0: 64. */
  uint32_t capture_threads; /* Threads that copy shards out of callers' buffers. 0: 2. */
  int read_only;            /* Open without recovery, locks or writes (inspect, verify). */
  int create_if_missing;    /* Create root if it does not exist (default 1). */
  int drain_on_close;       /* ckptdb_close waits for pending demotions (default 1); 0 leaves
                               them to the next open, which resumes them. */
  const char* cpus;         /* The CPUs the threads ckptdb_open starts (capture workers, the
                               tier manager, the job's transport and coordinator) run on, a Linux
                               CPU list such as "2-7,12": keep them off the training threads'
                               CPUs. Env: CKPTDB_CPUS. Default: those of the calling thread. */
  int drop_tiers;           /* A read-write open whose tiers leave out a tier that holds committed
                               copies is refused (EINVAL, naming the tier and the versions)
                               unless this is 1: then those copies are released (their files, or
                               the arena, removed) when every such version has a copy on a tier
                               that stays; a version whose only copy is there is refused even
                               then. Env: CKPTDB_DROP_TIERS=1. Default 0. */
  const char* device;       /* Where device memory (CKPTDB_PUT_DEVICE, CKPTDB_RESTORE_DEVICE) is
                               copied by: "auto", the build's GPU runtime (CUDA or HIP; none in a
                               host build); "sim", the simulated device of every build
                               (docs/api.md, "The simulated device"). Env: CKPTDB_DEVICE.
                               Default "auto". */
} ckptdb_options;

void ckptdb_options_init(ckptdb_options* o);

/* ---- Handles ------------------------------------------------------------------------------ */
typedef struct ckptdb ckptdb;

/* Opens (or creates) the store at o->root, maps (or creates) a ram tier's arena, and starts the
 * capture workers and the tier manager. Recovery: every version that was not committed is
 * aborted and its files on every tier are deleted; tier files no catalog record accounts for
 * are collected; ram copies are found again in the arena; demotions left undone resume. Blocks
 * on that recovery (and on touching a new arena's pages once). Errors: EINVAL, ENOTFOUND (no
 * store, read_only or create_if_missing = 0; an unknown commit_tier), EBUSY (another process
 * holds it), ENOTSUP, EIO, ENOMEM, ENOSPC, ECORRUPT. */
int ckptdb_open(const ckptdb_options* o, ckptdb** out);

/* Aborts versions that were put but not asked to commit, lets the commits asked for finish, waits
 * (with drain_on_close, the default) for every pending demotion and eviction, stops the threads
 * and releases everything (also after a failed commit left the handle unusable). Committed data
 * is never touched; undone demotions resume at the next open. NULL is a no-op. Returns
 * CKPTDB_OK; failures of what it waited for are reported on stderr. */
int ckptdb_close(ckptdb* db);

/* ---- Saving ------------------------------------------------------------------------------- */
#define CKPTDB_PUT_COPY_NOW 0x1u /* copy out of `data` before returning */
#define CKPTDB_PUT_DEVICE 0x2u   /* data is device memory: ENOTSUP without a device */
/* The shard is identical on every member of this rank's declared replica group (data-parallel
 * replicas, ckptdb_declare_replicas): the members compare it at commit, and the members of an
 * "arc", "aec" or "arc+aec" group each keep only their slices of it (and AEC's parity units). */
#define CKPTDB_PUT_REPLICATED 0x4u
/* REFT's AOR (a group declared with "...+aor"): the shard is this rank's recomputed replica of
 * the private shard of the same name that the next member of its replica group puts (members in
 * ascending order, the last one's next being the first), e.g. that member's optimizer state
 * brought forward by applying the same update to a host copy from the gradients this rank has
 * too. It is stored in this rank's segment as "@aor:" followed by the name, never packed, compared
 * at commit with the owner's shard (name, length and digest, as replicated shards are), and read by
 * the owner's restore when the owner's own copies are lost (source "aor:rankN"). Not with
 * CKPTDB_PUT_REPLICATED. A name that begins with "@aor:" is reserved (EINVAL). */
#define CKPTDB_PUT_RECOMPUTED 0x8u

/* Adds one shard (name, bytes) to `version` of this rank. The first put of a version opens it.
 * Lazy capture (DataStates-LLM): the shard is queued and the call returns; capture threads copy
 * it chunk by chunk into staging memory, hashing each chunk while it is in cache. `data` must not
 * change until ckptdb_wait_capture(version) returns, or until this call returns when flags has
 * CKPTDB_PUT_COPY_NOW. Errors: EINVAL (NULL/empty/too long name, NULL data with nbytes > 0, bad
 * info, bad flags, too many chunks), ESTATE (version not above the last committed one, already
 * committing/committed/aborted, or too many open versions), EEXIST (name already put in this
 * version), ESKIPPED (back-pressure dropped the version), and with COPY_NOW any capture error. */
int ckptdb_put_shard(ckptdb* db, uint64_t version, const char* name, const void* data,
                     size_t nbytes, const ckptdb_tensor_info* info, unsigned flags);

/* One shard of a batched put: ckptdb_put_shard's arguments. */
typedef struct ckptdb_shard {
  const char* name;
  const void* data;
  size_t nbytes;
  const ckptdb_tensor_info* info; /* NULL: raw bytes */
  unsigned flags;                 /* CKPTDB_PUT_* for this shard */
} ckptdb_shard;

/* Adds `count` shards to `version` in one call and under one lock, as many ckptdb_put_shard calls
 * would, with the same checks and the same lazy-capture contract (each shard's data must not
 * change until ckptdb_wait_capture, unless its flags have CKPTDB_PUT_COPY_NOW). All or nothing:
 * every shard is checked first, in order, and the first refusal is returned with "shard I of
 * COUNT" in its message; then nothing is queued or changed. Names must differ within the call
 * too (EEXIST naming both indexes). Two or more host shards of at most 64 KiB, not REPLICATED,
 * are packed into shared chunks, each still restored and checked alone (docs/format.md, "Packed
 * shards"). count = 0 puts nothing (shards may then be NULL). Errors:
 * those of ckptdb_put_shard, and EINVAL for NULL shards with count > 0 or count above 2^24. */
int ckptdb_put_shards(ckptdb* db, uint64_t version, const ckptdb_shard* shards, size_t count);

/* REFT's replica groups (DESIGN.md section 7): ranks that hold identical data-parallel replicas
 * declare it, every member with the same `group` number and `members` (count ranks, 2..1024,
 * distinct, below world_size, this rank among them). Shards put with CKPTDB_PUT_REPLICATED are
 * then compared at every commit: each member's digest of each such shard (its name, length and
 * the xxh3 of its chunk-sized pieces' xxh3s) goes to the coordinator, and a version whose
 * replicas differ, or that one member put as replicated and another did not, or whose members
 * declared different protections, fails to commit on every rank with an error naming the shard
 * and the ranks (nothing of it is committed). `protection`:
 *  - NULL or "none": every member keeps its whole shards; the comparison only.
 *  - "arc" (REFT's ARC): each replicated shard is cut into count slices of whole chunks; member i
 *    (its index in the sorted members) keeps slice i and, as the ARC copy of its neighbour,
 *    slice i+1 mod count, copied from its own replica (no network bytes), and only hashes the
 *    rest. A restore gathers the slices it lacks from the members that keep them (any of their
 *    tiers; in a job with replicate:M, from their replicas too), each checked against this
 *    rank's own hash. Members must be on distinct nodes. In a job without redundancy a member
 *    puts only replicated shards (a private one is EINVAL: it would have no copy elsewhere), so
 *    a member that lost its node restores from its group alone; ckptdb_latest and
 *    ckptdb_recoverable count each slice's two keepers. Not with ec:K+M or xor:K (ENOTSUP).
 *    Declare it again after a restart, before restoring.
 *  - "aec" (REFT's AEC): member i keeps slice i and, instead of a copy of another's slice,
 *    parity units of the other members' slices: piece t of slice s is XORed into a unit kept by
 *    member s + 1 + (t mod (count - 1)) (docs/format.md, "AEC parity units"), so a member keeps
 *    about 1/(count (count - 1)) of each shard as parity, computed at capture from its own
 *    replica (no network bytes). One lost member's slices are decoded from the others' units and
 *    slices, each piece checked against this rank's own hash. Needs 3 or more members.
 *  - "arc+aec": both; the parity of slice s is then kept by the count - 2 members other than s
 *    and s - 1 (which keeps its ARC copy), so any two lost members are restored (about
 *    1/(count (count - 2)) more per shard).
 *  Each of "arc", "aec" and "arc+aec": members on distinct nodes; in a job without redundancy,
 *  replicated shards only; latest and recoverable count what the members left can restore.
 * Call it after open, before the first put that uses it; again with the same arguments is a
 * no-op. Errors: EINVAL (bad arguments, world_size 1, members not as above or two on one node
 * with "arc"), ESTATE (declared before with other arguments, read-only handle, "arc" without
 * redundancy after shards were put unreplicated into an open version), ENOTSUP. */
int ckptdb_declare_replicas(ckptdb* db, uint32_t group, const uint32_t* members, size_t count,
                            const char* protection);

/* Returns once every byte of every shard put so far for `version` is out of the caller's
 * buffers: call it before the buffers change (the optimizer step). For device memory that is
 * once its copies have completed; hashing follows in the background (docs/api.md, "Device
 * memory"). timeout_ms < 0 waits forever.
 * Errors: ENOTFOUND (version never put), ETIMEDOUT, ESKIPPED (dropped by back-pressure; buffers
 * free), ESTATE (aborted; buffers free), or the capture error that aborted it (EIO, ENOSPC, ...;
 * buffers free). */
int ckptdb_wait_capture(ckptdb* db, uint64_t version, int timeout_ms);

#define CKPTDB_COMMIT_ASYNC 0x1u /* return at once; the commit completes in the background */

/* Commits `version` atomically once every shard is captured and the version is safe on the
 * commit tier (options.commit_tier): PREPARED then COMMITTED are written synced to the catalog.
 * After success ckptdb_latest returns it and no crash can lose it (short of losing the commit
 * tier). Older versions still open are aborted; slower tiers receive it in the background
 * (demotion) and retention runs. With CKPTDB_COMMIT_ASYNC the call returns after its checks and
 * ckptdb_wait_commit reports the outcome. Errors: ENOTFOUND (never put), ESTATE (already
 * committed, committing or aborted), ESKIPPED, EIO/ENOSPC/... (the version is aborted, nothing
 * becomes visible). */
int ckptdb_commit(ckptdb* db, uint64_t version, unsigned flags);

/* Waits until `version` is committed (tier NULL), or committed and durable on `tier` (a name or
 * kind, as options.commit_tier), which the background demotion brings about for slower tiers.
 * timeout_ms < 0 waits forever. Errors: ENOTFOUND (unknown version or tier), ETIMEDOUT, ESTATE
 * (aborted, retired, never committed in this handle, or the tier will not receive the version
 * under its policy), ESKIPPED, or the error that failed the commit or the demotion. */
int ckptdb_wait_commit(ckptdb* db, uint64_t version, const char* tier, int timeout_ms);

/* Drops an open version and deletes its files; OK for a version already aborted.
 * Errors: ENOTFOUND, ESTATE (committed or retired). */
int ckptdb_abort(ckptdb* db, uint64_t version);

/* ---- Restoring ---------------------------------------------------------------------------- */
/* The newest committed version that some configured tier still holds whole.
 * Errors: ENOTFOUND (nothing restorable). */
int ckptdb_latest(ckptdb* db, uint64_t* version);

/* Whether committed `version` can be restored by every rank from memory, and how many more node
 * losses it can take. Alone (world_size 1): from this rank's tiers, with no loss to spare. In a
 * job the coordinator answers from every rank's holdings: a rank counts as covered by its own
 * copy, by replicas on live peers (the distinct nodes holding a copy, minus one, are its spare
 * losses) or by its coding group (M minus the members lacking their copy or parity). */
typedef struct ckptdb_recoverable_t {
  int recoverable;           /* 1: every rank has a source for every byte */
  int32_t spare_losses;      /* node losses it survives still; -1 when not recoverable */
  uint32_t ranks_local;      /* ranks that hold their own copy */
  uint32_t ranks_from_peers; /* ranks that need a peer's replica or a rebuild */
  uint32_t ranks_lost;       /* ranks with no source: the version is not recoverable */
  char detail[512];          /* a sentence: which ranks depend on what, the tightest group */
} ckptdb_recoverable_t;
/* Errors: ENOTFOUND (never committed), ESTATE (not committed), EBUSY (the job is recovering:
 * retry), EPEER (the coordinator is gone). */
int ckptdb_recoverable(ckptdb* db, uint64_t version, ckptdb_recoverable_t* out);

/* Reads tensor `name` of committed `version` into dst, which must be exactly the tensor's size.
 * Tiers are tried fastest first; each chunk is checked against its xxh3 and a failing chunk is
 * read from the next tier. If no tier has a good copy the call fails with ECORRUPT and the
 * failing chunks' bytes in dst are zeroed: never wrong bytes. ckptdb_stats' last_restore_tier
 * names the fastest tier that served it. Errors: ENOTFOUND (version or name), ESTATE (not
 * committed), ESIZE (nbytes differs; the message gives the stored size), ECORRUPT, EIO. */
int ckptdb_restore(ckptdb* db, uint64_t version, const char* name, void* dst, size_t nbytes,
                   unsigned flags);
/* ckptdb_restore flag: dst is device memory (recognized without the flag too once the device is
 * open). Each chunk is read and verified on the host (in place from a pinned ram arena, or
 * through a pinned pool), then copied to dst on the device's streams, the stages overlapped.
 * ENOTSUP without a device (a host build with options.device "auto"). */
#define CKPTDB_RESTORE_DEVICE 0x1u

/* A box of a global tensor: elements offset[d] .. offset[d] + shape[d] - 1 of each dimension. */
typedef struct ckptdb_box {
  uint32_t ndim;
  uint64_t offset[CKPTDB_MAX_DIMS];
  uint64_t shape[CKPTDB_MAX_DIMS];
} ckptdb_box;

/* Resharding: copies into dst the part of `box` of the global tensor that this store's shard
 * `name` of committed `version` holds. The shard's place in the global tensor is the global
 * shape and offset it was put with (none: the shard is the whole tensor). dst is the box in
 * row-major order, exactly its elements times the dtype's size; the elements the shard does not
 * hold are left as they were, and *covered receives the number copied (0 when the shard misses
 * the box). A box split over several ranks' shards is filled by calling this on each rank's store
 * (opened read-only where that rank is gone) and summing *covered. Only the chunks the part lies
 * in are read, each checked against its xxh3 with the same fallback across tiers as
 * ckptdb_restore. On any error dst is left unchanged, except when the box is exactly the shard:
 * that is read in place, and a failed read leaves the failed chunks zeroed, as ckptdb_restore.
 * Errors: EINVAL (box NULL, its ndim not the tensor's, outside the global shape; raw bytes), ESIZE
 * (nbytes is not the box's size), ENOTFOUND, ESTATE, ECORRUPT, EIO as ckptdb_restore. */
int ckptdb_restore_slice(ckptdb* db, uint64_t version, const char* name, const ckptdb_box* box,
                         void* dst, size_t nbytes, unsigned flags, uint64_t* covered);

/* ---- Listing and checking ----------------------------------------------------------------- */
typedef struct ckptdb_tensor_desc {
  const char* name;
  int dtype;
  uint32_t ndim;
  const uint64_t* shape;         /* ndim entries */
  const uint64_t* global_shape;  /* ndim entries, or NULL when the shard is the whole tensor */
  const uint64_t* global_offset; /* ndim entries, or NULL when the shard is the whole tensor */
  uint64_t nbytes;               /* the shard's size (what ckptdb_restore fills) */
  uint32_t chunk_count;          /* the chunks this rank's segment keeps of it: of a shard an "arc"
                                    replica group deduplicated, only its slices' */
  uint64_t kept_bytes;           /* the bytes those chunks hold: nbytes, or less for such a
                                    shard */
  uint32_t parity_chunks;        /* of a shard an "aec" or "arc+aec" group deduplicated: the
                                    parity units this segment keeps of the other members' slices
                                    (REFT's AEC), in chunks of their own; 0 otherwise */
  uint64_t parity_bytes;         /* the bytes those units hold */
  uint32_t recomputed;           /* 1: this rank's recomputed replica (REFT's AOR) of the next
                                    member's private shard, named "@aor:" + its name; 0 otherwise */
} ckptdb_tensor_desc;

/* Return nonzero to stop the listing early. */
typedef int (*ckptdb_list_fn)(void* arg, const ckptdb_tensor_desc* tensor);

/* Calls fn for each tensor of committed `version`, in name order. The descriptor's pointers are
 * valid only during the call. Errors: EINVAL (fn NULL), ENOTFOUND (unknown version, or no
 * configured tier holds a copy), ESTATE (not committed), ECORRUPT (no copy has a readable
 * manifest). The callback holds the readers' turn: it must not call restore, list, list_chunks,
 * verify or close on the same handle. */
int ckptdb_list(ckptdb* db, uint64_t version, ckptdb_list_fn fn, void* arg);

typedef struct ckptdb_chunk_desc {
  uint32_t index;         /* the chunk's index in the version's segment */
  uint64_t record_offset; /* where its record starts in the segment (the payload is 4096 later) */
  uint64_t payload_bytes;
  uint64_t xxh3; /* XXH3-64 of the payload */
} ckptdb_chunk_desc;

typedef int (*ckptdb_chunk_fn)(void* arg, const ckptdb_chunk_desc* chunk);

/* Calls fn for each chunk of tensor `name` in committed `version`, in order, as the manifest of
 * the fastest readable copy records them; *source (may be NULL) receives that copy's tier name
 * (valid until the handle closes). A packed shard lists the one chunk it shares with its pack.
 * Errors: as ckptdb_list, and ENOTFOUND for an unknown name.
 * Callbacks run on the calling thread; a nonzero return stops the listing. */
int ckptdb_list_chunks(ckptdb* db, uint64_t version, const char* name, ckptdb_chunk_fn fn,
                       void* arg, const char** source);

typedef enum ckptdb_version_state {
  CKPTDB_STATE_OPEN = 1,
  CKPTDB_STATE_CAPTURED = 2,
  CKPTDB_STATE_PREPARED = 3,
  CKPTDB_STATE_COMMITTED = 4,
  CKPTDB_STATE_ABORTED = 5,
  CKPTDB_STATE_RETIRED = 6
} ckptdb_version_state;

const char* ckptdb_state_name(int state);

typedef enum ckptdb_residency_state {
  CKPTDB_RESIDENT_WRITING = 1, /* being written; not yet durable */
  CKPTDB_RESIDENT_DURABLE = 2, /* synced and renamed (ram: indexed in the arena): readable */
  CKPTDB_RESIDENT_MISSING = 3, /* recorded durable, but the copy is gone (tmpfs or ram after a
                                  reboot) */
  CKPTDB_RESIDENT_EVICTED = 4, /* deleted by retention or eviction */
  CKPTDB_RESIDENT_PENDING = 5  /* not in the catalog: the tier's policy wants the version and
                                  demotion has not brought it there yet */
} ckptdb_residency_state;

typedef struct ckptdb_residency {
  const char* tier; /* the tier's name, e.g. "ram", "tmpfs:/dev/shm/ck" */
  const char* path; /* the segment file (ram: the arena file); "" when PENDING */
  int state;        /* ckptdb_residency_state */
  int configured;   /* 1 when the tier is in this handle's tier spec */
} ckptdb_residency;

typedef struct ckptdb_version_info {
  uint64_t version;
  int state; /* ckptdb_version_state */
  uint32_t rank;
  uint64_t data_bytes; /* sum of tensor bytes */
  uint32_t tensor_count;
  uint32_t chunk_count;
  uint64_t created_unix_ns;
  uint64_t committed_unix_ns; /* 0 unless committed */
  uint32_t residency_count;
  const ckptdb_residency* residency;
} ckptdb_version_info;

typedef int (*ckptdb_version_fn)(void* arg, const ckptdb_version_info* info);

/* Calls fn for every version the catalog knows, oldest first (aborted ones included), with the
 * copies each tier holds; a tier that wants a committed version it does not hold yet is listed
 * CKPTDB_RESIDENT_PENDING. fn runs with no lock held. */
int ckptdb_list_versions(ckptdb* db, ckptdb_version_fn fn, void* arg);

typedef enum ckptdb_verify_kind {
  CKPTDB_VERIFY_PROGRESS = 0, /* bytes_done / bytes_total advanced */
  CKPTDB_VERIFY_OK = 1,       /* one segment checked clean */
  CKPTDB_VERIFY_PROBLEM = 2   /* something is wrong: see message and the fields */
} ckptdb_verify_kind;

typedef struct ckptdb_verify_event {
  int kind;
  uint64_t version;
  const char* tier;
  const char* path;
  int64_t chunk_index;  /* -1 when the problem is not one chunk's */
  uint64_t file_offset; /* of the chunk record or the damaged structure */
  uint64_t expected_xxh3;
  uint64_t actual_xxh3;
  const char* message; /* a full sentence naming all of the above */
  uint64_t bytes_done;
  uint64_t bytes_total;
} ckptdb_verify_event;

typedef void (*ckptdb_verify_fn)(void* arg, const ckptdb_verify_event* event);

typedef struct ckptdb_verify_report {
  uint64_t segments_checked;
  uint64_t chunks_checked;
  uint64_t bytes_checked;
  uint64_t problems;
} ckptdb_verify_report;

/* Re-reads every chunk of `version` (or CKPTDB_ALL_VERSIONS committed ones) on `tier` (or every
 * tier when NULL; a name such as "ram", a kind, or any spelling that parses to the tier's name),
 * a ram copy through its index in the arena, and checks framing, manifest and
 * every xxh3. Returns CKPTDB_OK when clean, ECORRUPT when any problem was found (each one
 * reported through fn), ENOTFOUND for an unknown version or tier, ESTATE for a version that is
 * not committed. fn may be NULL. out may be NULL. */
int ckptdb_verify(ckptdb* db, uint64_t version, const char* tier, ckptdb_verify_fn fn, void* arg,
                  ckptdb_verify_report* out);

/* ---- Repair ------------------------------------------------------------------------------ */
typedef void (*ckptdb_repair_fn)(void* arg, const char* line);

typedef struct ckptdb_repair_report {
  int catalog_rebuilt;         /* 0: the catalog was intact (only witnesses were rewritten) */
  uint64_t versions_recovered; /* committed versions restorable after the repair */
  uint64_t versions_lost;      /* committed versions with no copy that verifies */
  uint64_t copies_recovered;   /* copies recorded in the rebuilt catalog */
  uint64_t files_moved_aside;  /* segments (".orphan") and witnesses (".damaged") renamed */
  uint64_t witnesses_written;
} ckptdb_repair_report;

/* Rebuilds the catalog of the store at o->root from what verifies (docs/cli.md, "repair"), an
 * explicit act for a store whose open failed with ECORRUPT. Uses o->root and, when set, o->tiers
 * (else the tiers the damaged catalog or the newest commit witness records). Takes the store's
 * lock: EBUSY while a trainer has it open. When the catalog opens intact and agrees with every
 * commit witness it only rewrites missing or damaged witnesses. Otherwise it keeps every
 * version that a valid witness or a readable COMMITTED record proves committed and whose copy
 * (on any tier) has a footer and manifest that verify, writes a new catalog and keeps the old
 * as catalog.damaged-<ns>; it deletes nothing: segments no recovered version accounts for are
 * renamed "<name>.orphan". fn (may be NULL) gets one line per finding. Returns CKPTDB_OK when
 * every committed version is restorable, ECORRUPT when some could not be recovered (each named
 * through fn), EINVAL, ENOTFOUND, EBUSY, EIO, ENOSPC otherwise. out may be NULL. */
int ckptdb_repair(const ckptdb_options* o, ckptdb_repair_fn fn, void* arg,
                  ckptdb_repair_report* out);

/* The damage ckptdb_open noted and went past, one message per problem through fn (may be NULL),
 * their number in *count (may be NULL): a commit witness of a committed version that fails its
 * checks, and (read-only opens, which read on without it) a ram arena whose two header copies
 * both fail, so that its copies read as missing. ckptdb repair mends both. Returns CKPTDB_OK, or
 * EINVAL for a NULL handle. */
int ckptdb_open_problems(ckptdb* db, ckptdb_repair_fn fn, void* arg, uint64_t* count);

/* ---- The commit protocol, simulated (ckptdb simulate) --------------------------------------- */
typedef struct ckptdb_simulate_options {
  uint32_t ranks;          /* simulated ranks (1 to 100000) */
  uint32_t ranks_per_node; /* 0: 8 */
  uint64_t seed;
  uint32_t versions; /* versions the job must commit after the last fault; 0: 5 */
  int faults;        /* kill, wipe, partition and drop; 0: a quiet network */
  int trace;         /* every fault and coordinator line through fn, not only the violations */
  const char* dir;   /* where the coordinator's catalog lives (removed after); NULL: /tmp */
} ckptdb_simulate_options;

typedef struct ckptdb_simulate_report {
  uint64_t simulated_ms, committed, aborted, messages, dropped, faults, coordinator_opens;
  /* The coordinator's CPU time (its thread's clock) and count, by message: */
  uint64_t votes, vote_ns, heartbeats, heartbeat_ns, registers, register_ns;
  uint64_t queries, query_ns, steps, step_ns; /* latest and decisions; failure detection */
  uint64_t violations;
} ckptdb_simulate_report;

/* One seed of the deterministic simulation of the job's commit protocol (docs/testing.md,
 * "Simulation"): the real coordinator and JobCommit, simulated ranks, network and faults. Each
 * invariant violation is a line through fn (may be NULL) and counted in out->violations.
 * Returns CKPTDB_OK when the seed ran (violations or not), EINVAL for bad options, EIO when its
 * catalog directory cannot be made. out may be NULL. */
int ckptdb_simulate(const ckptdb_simulate_options* o, ckptdb_repair_fn fn, void* arg,
                    ckptdb_simulate_report* out);

/* ---- Shared memory that outlives its store (ckptdb gc) ------------------------------------- */
enum {
  CKPTDB_SHM_ARENA = 0,    /* a ram tier's arena, ckptdb-<job id>-r<rank>.ram */
  CKPTDB_SHM_REPLICAS = 1, /* a rank's peers' replicas, ckptdb-replicas-r<rank>/ */
  CKPTDB_SHM_PARITY = 2    /* a rank's coding-group parity, ckptdb-parity-r<rank>/ */
};

/* One arena or replica or parity directory, as ckptdb_gc found it; strings are valid during the
 * callback only. */
typedef struct ckptdb_shm_entry {
  const char* path;
  uint32_t kind; /* CKPTDB_SHM_* */
  uint32_t rank;
  uint64_t job_id;         /* arenas: the header's */
  const char* root;        /* arenas: the store's root the header names ("" when unreadable) */
  uint64_t bytes;          /* the file's size, or the directory's files' */
  uint32_t has_version;    /* 1: newest_version is set */
  uint64_t newest_version; /* the newest copy indexed in the arena, or held in the directory */
  uint32_t in_use;         /* a process has it (one of its files) open: never removed */
  uint32_t root_exists;
  uint32_t owned;  /* arenas: the root's store uses it; directories: an owned arena of the rank */
  uint32_t orphan; /* arenas: root gone, or the root owns another arena; directories: no owned
                      arena of the rank beside it */
  uint32_t removed;
  const char* problem; /* "" or why the header did not read, ownership is unknown, or the
                          removal did not happen */
} ckptdb_shm_entry;
typedef int (*ckptdb_shm_fn)(void* arg, const ckptdb_shm_entry* entry);

/* Lists the arenas and the replica and parity directories in dir (NULL: /dev/shm) and, with
 * remove nonzero, removes the orphans no process has open (docs/cli.md, "gc"; every process that
 * maps one holds a shared flock on it, and removal takes an exclusive one without waiting).
 * Nothing is removed on a guess: an arena whose header does not read, or whose root's catalog
 * cannot be read, is no orphan. fn (may be NULL) gets each entry after its removal was tried;
 * a nonzero return stops the listing (CKPTDB_OK). ENOTFOUND: no directory dir. */
int ckptdb_gc(const char* dir, int remove, ckptdb_shm_fn fn, void* arg);

/* One coding group's version, as ckptdb_verify_groups found it. Arrays have `members` entries, in
 * the group's position order; everything is valid during the callback only. */
typedef struct ckptdb_group_check {
  uint64_t version;
  uint32_t group;
  const char* code; /* "ec:4+2", "xor:3" */
  uint32_t k;       /* data blocks per stripe */
  uint32_t m;       /* parity blocks per stripe */
  uint32_t members; /* k + m */
  const uint32_t* ranks;
  const uint64_t* member_bytes; /* each member's segment, 0 where unknown */
  /* Where each member's segment restores from: "ram", "ram+rebuild" (the chunks its ram copy
   * lost, decoded from the group), "rebuild", a slower tier's name, or "lost". */
  const char* const* sources;
  /* Each member's parity segment: "ok", "bad", "missing", "unreadable" or "not given". */
  const char* const* parity;
  uint64_t stripes;
  uint64_t parity_blocks;  /* m per stripe */
  uint64_t parity_checked; /* recomputed from the stripe's data and compared */
  uint64_t parity_bad;     /* failing their xxh3 or unequal to the recomputation */
  int recoverable;         /* 1: every member's segment restores from somewhere */
  int from_memory;         /* 1: ... from ram copies and the group's parity alone */
  int spare_losses;        /* more nodes the group may lose, any of them, and still rebuild every
                              member from memory; -1 when not recoverable from memory */
  const char* problems;    /* one per line; "" when none */
} ckptdb_group_check;

typedef void (*ckptdb_group_fn)(void* arg, const ckptdb_group_check* check);

/* ckptdb_verify_groups flag: report each group's layout from the manifests only (sources and
 * parity "unchecked", nothing read, recomputed or counted), e.g. to say that a store is coded. */
#define CKPTDB_GROUPS_LAYOUT_ONLY 1u

/* Checks the coding groups (redundancy "ec:K+M" or "xor:K") of `version` (or of every committed
 * version with CKPTDB_ALL_VERSIONS) across the stores of their members, `count` handles of one
 * job opened in this process (read-only is enough): each member's copies chunk by chunk, each
 * parity block's xxh3, each stripe's parity recomputed from its data (Reed-Solomon re-encode, XOR
 * syndrome), and whether the version is recoverable, from what, with how many more node losses to
 * spare. A member whose store is not among `dbs` counts as lost. Versions no group protects are
 * skipped after reading their manifests. fn is called once per group and version checked.
 * flags: 0 or CKPTDB_GROUPS_LAYOUT_ONLY. Returns CKPTDB_OK when every group checked is
 * recoverable, its parity clean and nothing else is wrong (also when nothing is coded), ECORRUPT
 * otherwise, EINVAL for no handle, a NULL one, unknown flags, or (when something is coded)
 * handles of different jobs or two of one rank, ENOTFOUND when `version` is committed in none of
 * them. */
int ckptdb_verify_groups(ckptdb* const* dbs, size_t count, uint64_t version, unsigned flags,
                         ckptdb_group_fn fn, void* arg);

/* ---- Statistics --------------------------------------------------------------------------- */
/* Rates are bytes over the ns beside them: capture_bytes / capture_ns is the capture rate. */
typedef struct ckptdb_tier_stats {
  char name[256];
  uint32_t kind_ram;      /* 1 for the ram tier */
  uint32_t direct_io;     /* 1 when the tier writes with O_DIRECT */
  uint64_t bytes_written; /* capture and demotion writes into this tier */
  uint64_t write_ns;      /* time from the first write of a version into this tier to its copy
                             being durable, summed: bytes_written / write_ns is its drain rate */
  uint64_t bytes_read;    /* restore and demotion reads from this tier */
  uint64_t pending_bytes; /* committed versions this tier wants and does not hold yet */
  uint64_t resident_bytes;
  uint32_t resident_versions;
  uint32_t demotions; /* copies this tier received by demotion */
  uint32_t evictions;
  uint32_t demotion_failures;
  uint64_t fsyncs;
  uint64_t capacity_bytes;   /* ram: the arena's size; 0 for directory tiers */
  uint64_t high_water_bytes; /* ram: most arena bytes in use at once; 0 for directory tiers */
} ckptdb_tier_stats;

typedef struct ckptdb_stats_t {
  uint64_t put_calls;
  uint64_t put_bytes;
  uint64_t put_blocked_ns; /* time callers spent inside put_shard */
  uint64_t wait_capture_calls;
  uint64_t wait_capture_blocked_ns; /* time callers spent inside wait_capture */
  uint64_t capture_bytes;           /* bytes copied out of callers' buffers */
  uint64_t capture_ns;              /* per version, first put to last byte captured, summed */
  uint64_t commits;
  uint64_t commit_blocked_ns; /* time callers spent inside ckptdb_commit */
  uint64_t aborts;
  uint64_t skipped_versions;         /* dropped by back-pressure policy skip */
  uint64_t backpressure_waits;       /* chunks that found staging memory full */
  uint64_t backpressure_wait_ns;     /* time capture waited for staging memory (policy block) */
  uint64_t direct_chunks;            /* chunks written from callers' buffers (policy direct) */
  uint64_t staging_bytes;            /* the staging ring's size */
  uint64_t staging_high_water_bytes; /* most ring bytes in use at once */
  uint64_t fsyncs;                   /* file fsyncs, all tiers */
  uint64_t restore_calls;
  uint64_t restore_bytes;
  uint64_t restore_ns;
  uint64_t checksum_failures; /* chunk reads that failed (xxh3 mismatch, short or failed read) */
  uint32_t fixed_buffers;     /* 1 when the staging ring or the ram arena is io_uring fixed */
  uint32_t tier_count;
  ckptdb_tier_stats tiers[CKPTDB_MAX_TIERS];
  char last_restore_tier[256]; /* the fastest tier that served any chunk of the last restore;
                                  "peer:rankN" or "serve:NODE" when from another node's memory */
  /* world_size > 1 (zero otherwise): replication traffic and time, this rank's part. */
  uint64_t replica_bytes_sent;     /* this rank's segments pushed into peers' memory */
  uint64_t replica_ns;             /* time spent pushing them, acknowledgements included */
  uint64_t replica_bytes_received; /* peers' segments this rank stored for them */
  uint64_t peer_fetch_bytes;       /* bytes restored from other nodes' memory */
  uint64_t epoch;                  /* the job's membership epoch as last heard */
  char last_restore_sources[512];  /* where each byte of the last restore came from, fastest
                                      first: "SOURCE BYTES" pairs joined by "; ", a source
                                      being a tier name, "peer:rankN" or "serve:NODE" */
  char peer_paths[256];            /* how replicas and fetches travel to each peer this rank
                                      used: "rank 1 rma:posix; rank 2 socket" (rma: UCX one-sided
                                      puts and gets over shared memory; socket: ckptdb's own
                                      connection; ucx-am: UCX active messages, RDMA) */
  /* GEMINI's interleaving (ckptdb_hint), world_size > 1: */
  uint64_t interleave_iterations;     /* iterations in the idle-span profile (0: none yet) */
  uint64_t interleave_spans;          /* idle spans an iteration has, as profiled */
  uint64_t interleave_idle_ns;        /* their mean total per iteration */
  uint64_t interleave_bytes;          /* replica bytes sent inside the idle spans planned */
  uint64_t interleave_overflow_bytes; /* sent in the unbounded last span (did not fit) */
  uint64_t interleave_late;           /* spans met late, or waits that ran out */
} ckptdb_stats_t;

/* The trainer's timeline, for GEMINI's traffic interleaving (docs/api.md, "Interleaving"):
 * ITERATION at the start of each iteration (alone, or with NET_BUSY when it opens with
 * communication), NET_BUSY when the job's own collectives start using the network, NET_IDLE
 * when they stop. Once CKPTDB_INTERLEAVE_PROFILE iterations (default 20) are profiled, each
 * version's replication is cut into pieces that fit the idle spans ahead (GEMINI Algorithm 2) and
 * sent span by span; what does not fit goes into the span one iteration on, busy or not. Before
 * that, or without ITERATION hints, or with CKPTDB_INTERLEAVE=off, replication pauses while
 * NET_BUSY holds (at most 2 s per piece). Never blocks. A no-op while world_size = 1. EINVAL
 * for unknown bits or NET_BUSY and NET_IDLE at once. */
#define CKPTDB_HINT_NET_BUSY 0x1u
#define CKPTDB_HINT_NET_IDLE 0x2u
#define CKPTDB_HINT_ITERATION 0x4u
int ckptdb_hint(ckptdb* db, unsigned hints);

/* ---- Serving a node's memory (`ckptdb serve`) ---------------------------------------------- */
/* A node's daemon that serves the replicas this node's ranks keep for their peers (under the
 * directory of the ram tier in o->tiers) to a restarting job while the trainers that kept them
 * are down: every CKPTDB_HEARTBEAT_MS it tells the coordinator at o->coordinator what it holds,
 * and it answers fetches from ranks holding o->job_token. Reads o->tiers (the first tier must be
 * ram; only its dir= matters), o->node_id, o->coordinator, o->job_token and the environment's
 * CKPTDB_LISTEN, CKPTDB_UCX_TLS and CKPTDB_HEARTBEAT_MS; not root, rank or world_size. It never
 * takes new replicas and never changes the directory. Errors: EINVAL (options), ENOTFOUND (no
 * such directory), EPEER (cannot listen). */
typedef struct ckptdb_server ckptdb_server;
typedef struct ckptdb_server_stats_t {
  uint64_t replicas;     /* replicas held now */
  uint64_t served_bytes; /* bytes sent to ranks that fetched them */
  uint64_t refused;      /* connections refused for a wrong or missing token */
  char address[64];      /* host:port where it listens */
} ckptdb_server_stats_t;
int ckptdb_serve(const ckptdb_options* o, ckptdb_server** out);
int ckptdb_server_stats(ckptdb_server* s, ckptdb_server_stats_t* out);
int ckptdb_serve_stop(ckptdb_server* s); /* stops serving and frees s; NULL is a no-op */

/* This handle's figures since it opened. On a read-only handle (the tools), the sums of the
 * per-version figures the catalog holds, and each tier's resident and pending bytes. */
int ckptdb_stats(ckptdb* db, ckptdb_stats_t* out);

typedef struct ckptdb_version_stats_t {
  uint64_t version;
  uint64_t bytes; /* data bytes put */
  uint64_t put_calls;
  uint64_t put_blocked_ns;
  uint64_t wait_capture_blocked_ns;
  uint64_t commit_blocked_ns;
  uint64_t capture_ns; /* first put to last byte out of the caller's buffers */
  uint64_t commit_ns;  /* commit called to COMMITTED recorded */
  uint64_t backpressure_waits;
  uint64_t backpressure_wait_ns;
  uint64_t direct_chunks;
  uint64_t staging_high_water_bytes; /* most ring bytes in use while this version was captured */
  uint64_t fsyncs;
  uint32_t tier_count;
  uint64_t tier_bytes_written[CKPTDB_MAX_TIERS]; /* in the order of ckptdb_stats_t.tiers */
  uint64_t tier_write_ns[CKPTDB_MAX_TIERS];      /* first write to durable, per tier */
} ckptdb_version_stats_t;

/* The figures of one version, recorded in the catalog when it commits and updated as it is
 * demoted, so the tools see them too. Errors: ENOTFOUND (no figures for that version: never
 * committed, or pruned with its record). */
int ckptdb_version_stats(ckptdb* db, uint64_t version, ckptdb_version_stats_t* out);

/* ---- Errors ------------------------------------------------------------------------------- */
/* The message of this thread's last failed call ("" if none). Successful calls leave it as it
 * is; valid until the next failing call on this thread. */
const char* ckptdb_last_error(void);
/* "CKPTDB_OK", "CKPTDB_ECORRUPT", ... */
const char* ckptdb_status_name(int status);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CKPTDB_CKPTDB_H_ */
