// The ram tier (DESIGN.md section 5): an arena of shared memory that holds the newest committed
// versions of one rank, and outlives the trainer process (GEMINI's local CPU-memory checkpoint;
// REFT's tmpfs copy without the dump). It is the capture destination when it is the first tier:
// capture copies each chunk from the caller's buffer straight into its arena region, hashing it
// while it is in cache, so a checkpoint costs one copy (docs/performance.md has the figures).
//
// The arena is one file, <dir>/ckptdb-<job id in hex>-r<rank>.ram (docs/format.md, "The ram
// tier's arena"):
//   [0, 8192)          header copy A: ArenaHeader (64 bytes), the root path extension, zeros
//   [8192, 16384)      header copy B, the same; the one with the higher sequence wins
//   [16384, capacity)  regions of 4096-byte multiples, handed out by a StagingRing allocator
// A version's copy is a segment image: exactly the records its segment file has (header block,
// chunk records, the manifest record with the footer block), each in a region of its own, and an
// index region listing where each record lies. The catalog's residency record names the index
// (offset, size) and the arena's generation; nothing else in the arena is trusted. Regions of
// versions that were never committed belong to nobody: after a crash they are simply free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/staging_ring.h"
#include "format/ram_format.h"
#include "io/io.h"
#include "io/tier_spec.h"
#include "util/status.h"

namespace ckpt::engine {

// Where one record of a segment image lies.
struct RamExtent {
  uint64_t logical_offset = 0;  // its offset in the segment file it stands for
  uint64_t arena_offset = 0;
  uint64_t bytes = 0;  // a multiple of 4096
};

// A committed version's copy in the arena, as its index describes it.
struct RamImage {
  uint64_t version = 0;
  uint64_t file_bytes = 0;  // of the segment the image stands for
  uint64_t index_offset = 0;
  uint64_t index_bytes = 0;
  std::vector<RamExtent> extents;  // by logical offset, contiguous from 0 to file_bytes
};

class RamTier {
 public:
  RamTier(io::Io* io, io::TierSpec spec) : io_(io), spec_(std::move(spec)) {}

  static std::string ArenaPath(const std::string& dir, uint64_t job_id, uint32_t rank);

  // Read-write: maps the arena, creating it when absent, and replacing it when its header names
  // another store or is of format version 1 (the old file set aside: replaced()). One damaged
  // header copy is rewritten from the other (a line on stderr says so); with both damaged the arena
  // is left exactly as it is and Open fails Corrupt, naming both reasons and `ckptdb repair` (its
  // copies may all be intact); an arena of a newer format is NotSupported. root_path (the store's
  // root, as its options give it; at most 4095 bytes, else Invalid) is recorded in the header,
  // which is rewritten when it names another. Read-only: maps it for reading; when it is absent,
  // not this store's, or has no readable header, available() is false and every copy the catalog
  // places there reads as missing.
  Status Open(uint64_t job_id, uint32_t rank, const std::string& root_path, bool read_only);

  // ckptdb repair's, after a read-write Open failed Corrupt because neither header copy can be
  // believed (header_unreadable(): both damaged, or both valid and disagreeing): a new header
  // from the indexes the arena holds. Its job id and rank are this store's, its generation the
  // first of `known` (the catalog's records of copies here) that some index of this store
  // carries, else the one every such index carries (else the one most carry, when no other
  // ties it), its capacity the file's size and its root the one Open was given. Corrupt,
  // changing nothing, when no index of this store is found or nothing decides the generation.
  Status RebuildHeader(uint64_t job_id, uint32_t rank, const std::vector<uint64_t>& known);
  bool header_unreadable() const { return header_unreadable_; }
  // Read-only: why Open went on without the arena although it is there and this store's (its
  // header copies both damaged, or disagreeing); empty otherwise.
  const std::string& unreadable_why() const { return unreadable_why_; }

  const io::TierSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  const std::string& path() const { return path_; }
  bool available() const { return memory_ != nullptr; }
  bool created() const { return created_; }  // Open made a new arena (first open, or reboot)
  // Where Open set aside the arena it replaced (another store's, an older format's), for its
  // caller to remove once the store's open succeeded or to rename back when it failed; empty
  // when it replaced none.
  const std::string& replaced() const { return replaced_; }
  uint64_t generation() const { return generation_; }
  // The root path the arena's header records: the store's root as the last read-write open gave
  // it (ckptdb repair finds the store an arena belongs to by it). Empty when !available().
  const std::string& root_path() const { return header_.root_path; }
  uint64_t capacity() const { return memory_ ? memory_->bytes() : 0; }
  bool locked() const { return memory_ && memory_->locked(); }
  uint8_t* base() const { return memory_->data(); }

  // ---- Allocation (read-write; the caller serializes these calls) ------------------------------
  // Regions are arena offsets; they never cover the header block.
  bool Allocate(uint64_t bytes, StagingRing::Region* out);
  void Free(const StagingRing::Region& region);
  void FreeImage(const RamImage& image);  // every record region and the index region
  // At open: marks a committed copy's regions live. Fails (changing nothing) when a region lies
  // outside the arena or overlaps one already claimed.
  Status Claim(const RamImage& image);
  // After every committed copy is claimed: makes the arena the spec's size. Growing always
  // works; shrinking only when no live region lies past the new end.
  Status ResizeToSpec();
  uint64_t live_bytes() const { return allocator_ ? allocator_->live_bytes() : 0; }
  uint64_t high_water_bytes() const { return allocator_ ? allocator_->high_water_bytes() : 0; }
  // Counts every Free: a capture that failed to allocate after the last one need not retry.
  uint64_t frees() const { return frees_; }
  uint64_t free_bytes() const { return allocator_ ? allocator_->capacity() - live_bytes() : 0; }
  uint64_t largest_free_run() const { return allocator_ ? allocator_->LargestFreeRun() : 0; }

  // ---- Images ----------------------------------------------------------------------------------
  // Allocates the index region of `image` (extents set, offsets filled in) and writes it.
  // False when the arena has no room for it.
  bool WriteIndex(uint64_t job_id, uint32_t rank, RamImage* image);
  // Reads and checks the index named by a catalog record. Corrupt when it does not decode, does
  // not describe `version` of this store, or has an extent out of bounds or out of order.
  Status LoadImage(uint64_t job_id, uint32_t rank, uint64_t version, uint64_t file_bytes,
                   uint64_t index_offset, uint64_t index_bytes, RamImage* out) const;
  // Every copy the arena holds, found without the catalog (for ckptdb repair): each 4096-byte
  // block past the header area that starts with the index magic and decodes as an index of this
  // store and generation whose extents pass LoadImage's checks gives one image, by version. An
  // index is erased when its copy is evicted, but one whose commit never reached the catalog is
  // found too, and a copy's records are only as good as their checksums: a caller reads them
  // with SegmentReader and claims them before it believes them. Never fails on damage: a
  // damaged index loses its version and nothing else.
  Status ScanImages(uint64_t job_id, uint32_t rank, std::vector<RamImage>* out) const;
  // Copies [offset, offset + bytes) of the segment the image stands for; Corrupt past its end.
  Status ReadAt(const RamImage& image, uint64_t offset, void* dst, size_t bytes,
                const std::string& what) const;
  // The record that starts at logical `offset`, or nullptr when no extent starts there.
  const RamExtent* ExtentAt(const RamImage& image, uint64_t offset) const;

  static constexpr uint64_t kHeaderBytes = format::kArenaHeaderAreaBytes;  // both copies
  static constexpr uint32_t kMaxIndexEntries = (1u << 24) + 8;

 private:
  // Open's choice between the two header copies of an existing arena (read-write or read-only).
  Status OpenExisting(uint64_t job_id, uint32_t rank, const std::string& root_path);
  Status OpenWithoutHeader(uint64_t job_id, uint32_t rank, const std::string& root_path,
                           const format::ArenaHeader h[2], const Status st[2],
                           const std::string& what);
  Status Unreadable(const Status& why);
  Status CreateArena(uint64_t job_id, uint32_t rank, const std::string& root_path);
  Status ReplaceArena(uint64_t job_id, uint32_t rank, const std::string& root_path,
                      const std::string& why);
  // header_ with this capacity and the next sequence, into copy A and then copy B.
  void WriteHeader(uint64_t capacity_bytes);
  void WriteHeaderCopy(int copy);  // header_ as it is, into copy 0 (A) or 1 (B)
  // The checks every index passes before its image is believed, whoever names it (the catalog
  // through LoadImage, or ScanImages): this store, this generation, at least a header and a
  // tail, extents inside the arena's regions and contiguous from 0 to file_bytes.
  Status ImageFromIndex(const format::RamIndex& index, uint64_t job_id, uint32_t rank,
                        uint64_t index_offset, uint64_t index_bytes, const std::string& what,
                        RamImage* out) const;
  bool InArena(uint64_t offset, uint64_t bytes) const;

  io::Io* io_;
  io::TierSpec spec_;
  std::string path_;
  std::unique_ptr<io::SharedMemory> memory_;
  std::unique_ptr<StagingRing> allocator_;  // over [kHeaderBytes, capacity)
  io::SharedMemoryOptions open_options_;    // as Open mapped the arena (ReplaceArena remaps)
  format::ArenaHeader header_;              // as in the arena (read-write) or as read at Open
  uint64_t generation_ = 0;
  uint64_t frees_ = 0;
  bool created_ = false;
  bool read_only_ = false;
  bool header_unreadable_ = false;  // Open found no header copy to believe (read-write)
  std::string open_root_path_;      // the root Open was given, made absolute
  std::string unreadable_why_;
  std::string replaced_;
};

}  // namespace ckpt::engine
