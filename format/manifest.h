// The manifest: a FlatBuffers table (format/manifest.fbs) built once at commit and read in place.
// ManifestView::Open runs flatbuffers::Verifier and then the semantic checks a reader relies on
// (names sorted and unique, chunk ranges in bounds and in file order, byte counts that add up,
// shapes that match byte counts), so code holding a ManifestView never re-checks them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/manifest_generated.h"
#include "util/status.h"

namespace ckpt::format {

inline constexpr uint32_t kMaxDims = 8;
inline constexpr uint32_t kMaxTensorsPerSegment = 1u << 24;
inline constexpr uint32_t kMaxGroupMembers = 32;      // a coding group's K + M at most
inline constexpr uint32_t kMaxReplicaMembers = 1024;  // a replica group's members at most
// A manifest recording an "arc" replica group (fb::Replicas), whose replicated shards may be
// deduplicated, has format version 2, which a reader of version 1 refuses; every other manifest
// is written as version 1.
inline constexpr uint32_t kManifestVersionDedup = 2;
// A manifest with packed tensors (small shards sharing a chunk, TensorEntry::packed) has format
// version 3, with or without a replica group; readers of versions 1 and 2 refuse it.
inline constexpr uint32_t kManifestVersionPacked = 3;
// A manifest of an "aec" or "arc+aec" replica group (parity units of the other members'
// slices, TensorEntry::parity_chunks) has format version 4, with or without packed tensors;
// readers of versions 1 to 3 refuse it.
inline constexpr uint32_t kManifestVersionParity = 4;
// A manifest of a replica group with REFT's AOR (ReplicasEntry::aor: recomputed replicas of the
// next member's private shards, TensorEntry::recomputed, and replicated shards marked as such)
// has format version 5, with or without AEC or packed tensors; readers of 1 to 4 refuse it.
inline constexpr uint32_t kManifestVersionRecomputed = 5;
// A recomputed replica's name in its keeper's segment: the prefix, then the owner's name (a put
// of a name with this prefix is refused, so no shard of the keeper's own can take it).
inline constexpr std::string_view kRecomputedPrefix = "@aor:";

struct TensorEntry {
  std::string name;
  uint8_t dtype = 0;  // ckptdb_dtype
  std::vector<uint64_t> shape;
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> global_offset;
  uint64_t bytes = 0;
  uint32_t first_chunk = 0;
  uint32_t chunk_count = 0;
  // A deduplicated replicated shard (REFT's ARC): its whole length, the [offset, offset + bytes)
  // ranges of it the segment holds (sorted; `bytes` above is their sum) and the xxh3 of every
  // piece of the whole shard. full_bytes 0: held whole.
  uint64_t full_bytes = 0;
  std::vector<std::pair<uint64_t, uint64_t>> slices{};
  std::vector<uint64_t> piece_xxh3{};
  // A packed shard: its bytes lie at [pack_offset, pack_offset + bytes) of chunk first_chunk's
  // payload (chunk_count 1), which it shares with other packed shards, and hash to pack_xxh3.
  bool packed = false;
  uint64_t pack_offset = 0;
  uint64_t pack_xxh3 = 0;
  // A deduplicated shard of an "aec" group: its parity units, in the parity_chunks chunks after
  // its slices' (fb::Tensor.parity_chunks).
  uint32_t parity_chunks = 0;
  // Format version 5 only (fb::Tensor.replicated, .recomputed).
  bool replicated = false;
  bool recomputed = false;
};

struct ChunkEntry {
  uint64_t record_offset = 0;
  uint64_t payload_bytes = 0;
  uint64_t xxh3 = 0;
};

// A coding group's layout, as a segment records it (format/manifest.fbs, Redundancy).
struct RedundancyEntry {
  uint8_t scheme = 0;  // fb::RedundancyScheme: 0 none (then nothing else is written)
  uint32_t group = 0;
  uint32_t k = 0;
  uint32_t m = 0;
  uint64_t stripe_bytes = 0;
  std::vector<uint32_t> member_ranks;
  std::vector<uint64_t> member_bytes;  // parity segments only
  bool parity = false;
  uint32_t position = 0;
};

// The replica group whose deduplicated shards a segment holds slices of (fb::Replicas).
struct ReplicasEntry {
  bool present = false;
  uint32_t group = 0;
  std::vector<uint32_t> members;  // ascending
  uint32_t position = 0;
  uint64_t piece_bytes = 0;
  bool replicated_only = false;  // no member put private shards (a job without redundancy)
  bool arc = true;               // members keep the next member's slice (REFT's ARC)
  bool aec = false;              // members keep parity units of the others' slices (REFT's AEC)
  bool aor = false;  // member s keeps member s+1's private shards recomputed (REFT's AOR)
};

// Pieces [first, end) of n that member `position` of `count` keeps as slice `position` of a
// deduplicated shard (fb::Replicas): slice s is [s*n/count, (s+1)*n/count).
inline std::pair<uint64_t, uint64_t> SlicePieces(uint64_t n, uint32_t count, uint32_t s) {
  return {n * s / count, n * (s + 1) / count};
}

// A replica group's protection as a byte: its fb::ReplicaProtection value (bits 0 arc, 1 aec),
// with bit 2 for REFT's AOR; what travels in holdings and replica checks.
inline constexpr uint8_t kProtectionAor = 4;

// A replica group's protection as ckptdb_declare_replicas names it: "none", "arc", "aec",
// "arc+aec", and with kProtectionAor "arc+aor", "aec+aor", "arc+aec+aor" ("?" out of range).
inline const char* ProtectionName(uint8_t protection) {
  constexpr const char* kNames[] = {"none", "arc",     "aec",     "arc+aec",
                                    "?",    "arc+aor", "aec+aor", "arc+aec+aor"};
  return protection < 8 ? kNames[protection] : "?";
}

// Whether a deduplicated replica group of `count` members (3 or more with AEC) can restore every
// member's shards when only the members `alive` says (by position) keep their copies, slice by
// slice: a slice whose member, or with ARC the member before it, is alive is read whole; one
// that is not is decoded (AEC) when every member protecting it is alive and every other slice
// their units hold pieces of is read whole. Conservative: a shard too small to give every
// protecting member a piece may be restored where this says no.
bool GroupRestores(uint32_t count, bool arc, bool aec, const std::vector<bool>& alive);
// The same for a protection byte (kProtectionAor included): with AOR, a lost member's private
// shards are also restored, from the recomputed replicas the member before it keeps, so that
// member must be alive too.
bool GroupRestores(uint32_t count, uint8_t protection, const std::vector<bool>& alive);

// The slice of `count` that piece p of n lies in (n > p).
uint32_t SliceOf(uint64_t n, uint32_t count, uint64_t p);

// The pieces a member keeps of a deduplicated shard of n pieces: its own slice and, with `arc`,
// the next member's (its ARC copy), as sorted disjoint [first, end) ranges.
std::vector<std::pair<uint64_t, uint64_t>> HeldPieces(uint64_t n, uint32_t count, uint32_t position,
                                                      bool arc = true);

// REFT's AEC, cut at pieces (count >= 3). Each slice is protected by `spread` other members:
// count - 1 (all the others) for "aec", count - 2 for "arc+aec" (all but the member before it,
// which keeps the slice's ARC copy, so that any two lost members can be restored). Piece t of
// slice s (t counted from the slice's first piece) is protected by the parity that member
// h = (s + 1 + t mod spread) mod count keeps, in its unit t / spread; h's unit u is the XOR of
// the u-th piece each slice gives it. A member so keeps about 1 / (count * spread) of the shard
// as parity. A slice lost with its ARC copy is decoded from its holders' units and the other
// pieces of each unit.
inline uint32_t AecSpread(uint32_t count, bool arc) { return arc ? count - 2 : count - 1; }
struct AecPlace {
  uint32_t holder = 0;
  uint64_t unit = 0;
};
AecPlace AecPlaceOf(uint64_t n, uint32_t count, bool arc, uint64_t p);
// How many parity units member `holder` keeps.
uint64_t AecUnits(uint64_t n, uint32_t count, bool arc, uint32_t holder);
// The pieces XORed into unit `unit` of member `holder`, ascending (one per slice at most).
std::vector<uint64_t> AecUnitPieces(uint64_t n, uint32_t count, bool arc, uint32_t holder,
                                    uint64_t unit);
// The length of a unit: its longest piece's (only the shard's last piece may be short).
uint64_t AecUnitBytes(uint64_t n, uint64_t piece_bytes, uint64_t full_bytes,
                      const std::vector<uint64_t>& pieces);

struct ManifestContents {
  uint64_t job_id = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t version = 0;
  std::string node_id;
  uint64_t created_unix_ns = 0;
  std::string writer;
  std::vector<TensorEntry> tensors;  // any order: Build sorts by name
  std::vector<ChunkEntry> chunks;    // in file order
  RedundancyEntry redundancy;
  ReplicasEntry replicas;  // a deduplicating replica group's; required by a deduplicated tensor
};

// Serializes contents (tensors sorted by name). Asserts that names are unique.
std::vector<uint8_t> BuildManifest(const ManifestContents& contents);

// The piece of the whole shard each chunk of deduplicated tensor `t` holds, in chunk order (its
// slices cut in piece_bytes pieces; ManifestView checked that they match its chunks).
std::vector<uint64_t> KeptPieces(const fb::Tensor& t, uint64_t piece_bytes);

// A tensor's whole length: full_bytes for a deduplicated shard, else bytes.
inline uint64_t ShardBytes(const fb::Tensor& t) {
  return t.full_bytes() != 0 ? t.full_bytes() : t.bytes();
}

// Bytes per element of a ckptdb_dtype, 0 when out of range.
size_t DTypeBytes(uint32_t dtype);

class ManifestView {
 public:
  // Verifies `bytes` (which must outlive the view) as the manifest of a segment whose data
  // records end at data_end (the manifest record's offset). `what` names the segment.
  static Status Open(std::span<const uint8_t> bytes, uint64_t data_end, const std::string& what,
                     ManifestView* out);

  const fb::Manifest& root() const { return *root_; }
  uint32_t tensor_count() const { return root_->tensors() ? root_->tensors()->size() : 0; }
  uint32_t chunk_count() const { return root_->chunks() ? root_->chunks()->size() : 0; }
  const fb::Tensor& tensor(uint32_t i) const { return *root_->tensors()->Get(i); }
  const fb::Chunk& chunk(uint32_t i) const { return *root_->chunks()->Get(i); }
  // Binary search by name; nullptr when absent.
  const fb::Tensor* Find(std::string_view name) const;

 private:
  const fb::Manifest* root_ = nullptr;
};

}  // namespace ckpt::format
