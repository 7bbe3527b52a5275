#include "format/manifest.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "format/segment_format.h"
#include "util/assert.h"
#include "util/text.h"

namespace ckpt::format {
namespace {

constexpr size_t kDTypeBytes[] = {1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1};
constexpr size_t kMaxNameBytes = 1024;  // CKPTDB_MAX_NAME_BYTES
constexpr uint32_t kMaxTensors = kMaxTensorsPerSegment;

std::string_view NameOf(const fb::Tensor& t) {
  return std::string_view(t.name()->data(), t.name()->size());
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// flatbuffers 2.0.8's Verifier checks only the 4-byte alignment of a vector's length field, not
// the 8-byte alignment that ulong elements and Chunk structs need, and reading a misaligned one is
// undefined behaviour (fuzz_manifest found this). A writer's vectors are always aligned.
template <typename V>
bool ElementsAligned(const V* v) {
  return v == nullptr || v->size() == 0 || reinterpret_cast<uintptr_t>(v->Data()) % 8 == 0;
}

bool HasArc(const fb::Replicas& group) {
  return group.protection() == fb::ReplicaProtection::Arc ||
         group.protection() == fb::ReplicaProtection::ArcAec;
}
bool HasAec(const fb::Replicas& group) {
  return group.protection() == fb::ReplicaProtection::Aec ||
         group.protection() == fb::ReplicaProtection::ArcAec;
}

// A deduplicated tensor (REFT's ARC and AEC): the slices it holds are exactly the pieces its
// member keeps by the group's layout, and its chunks are those pieces in order, each one the
// piece's length and hash; then, with AEC, its parity units, each of its unit's length.
template <typename Bad>
Status CheckSlices(const fb::Manifest& m, const fb::Tensor& t, const fb::Replicas& group,
                   const std::string& label, const Bad& bad) {
  const uint64_t piece = group.piece_bytes();
  const uint64_t full = t.full_bytes();
  const uint64_t n = full / piece + (full % piece != 0);
  const uint32_t slice_count = t.slices() ? t.slices()->size() : 0;
  if (!t.piece_xxh3() || t.piece_xxh3()->size() != n || !ElementsAligned(t.piece_xxh3()) ||
      !t.slices() || !ElementsAligned(t.slices())) {
    return bad(label + " does not list its slices and the xxh3 of each of its " +
               std::to_string(n) + " pieces");
  }
  const uint32_t count = group.members()->size();
  const auto held = HeldPieces(n, count, group.position(), HasArc(group));
  bool same = held.size() == slice_count;
  for (uint32_t i = 0; same && i < slice_count; ++i) {
    const fb::Slice* s = t.slices()->Get(i);
    const uint64_t end = std::min(held[i].second * piece, full);
    same = s->offset() == held[i].first * piece && s->bytes() == end - s->offset();
  }
  if (!same) {
    return bad(label + " holds slices other than member " + std::to_string(group.position()) +
               " of " + std::to_string(count) + " keeps");
  }
  uint32_t c = t.first_chunk();
  const uint32_t end_chunk = t.first_chunk() + t.chunk_count();
  for (const auto& [first, end] : held) {
    for (uint64_t p = first; p < end; ++p, ++c) {
      const uint64_t bytes = std::min(piece, full - p * piece);
      if (c >= end_chunk || m.chunks()->Get(c)->payload_bytes() != bytes ||
          m.chunks()->Get(c)->xxh3() != t.piece_xxh3()->Get(static_cast<uint32_t>(p))) {
        return bad(label + " piece " + std::to_string(p) + " disagrees with its chunk");
      }
    }
  }
  if (c != end_chunk) return bad(label + " has chunks past its slices");
  const bool arc = HasArc(group);
  const uint64_t units = HasAec(group) ? AecUnits(n, count, arc, group.position()) : 0;
  if (t.parity_chunks() != units) {
    return bad(label + " has " + std::to_string(t.parity_chunks()) + " parity units; member " +
               std::to_string(group.position()) + " of " + std::to_string(count) + " keeps " +
               std::to_string(units));
  }
  for (uint64_t u = 0; u < units; ++u) {
    const uint64_t bytes =
        AecUnitBytes(n, piece, full, AecUnitPieces(n, count, arc, group.position(), u));
    if (m.chunks()->Get(end_chunk + static_cast<uint32_t>(u))->payload_bytes() != bytes) {
      return bad(label + " parity unit " + std::to_string(u) + " is not " + std::to_string(bytes) +
                 " bytes");
    }
  }
  return Status::Ok();
}

}  // namespace

uint32_t SliceOf(uint64_t n, uint32_t count, uint64_t p) {
  CKPTDB_ASSERT(p < n && count >= 1);
  // n * s / count <= p < n * (s + 1) / count; the estimate is off by at most one either way.
  auto s = static_cast<uint32_t>(std::min<uint64_t>(count - 1, p * count / n));
  while (s > 0 && SlicePieces(n, count, s).first > p) --s;
  while (s + 1 < count && SlicePieces(n, count, s).second <= p) ++s;
  return s;
}

std::vector<std::pair<uint64_t, uint64_t>> HeldPieces(uint64_t n, uint32_t count, uint32_t position,
                                                      bool arc) {
  CKPTDB_ASSERT(count >= 2 && position < count);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint32_t s : {position, (position + 1) % count}) {
    auto [first, end] = SlicePieces(n, count, s);
    if (first < end) ranges.emplace_back(first, end);
    if (!arc) break;
  }
  std::sort(ranges.begin(), ranges.end());
  if (ranges.size() == 2 && ranges[0].second == ranges[1].first) {
    ranges[0].second = ranges[1].second;  // the own slice and the next are adjacent
    ranges.pop_back();
  }
  return ranges;
}

AecPlace AecPlaceOf(uint64_t n, uint32_t count, bool arc, uint64_t p) {
  CKPTDB_ASSERT(count >= 3);
  const uint32_t spread = AecSpread(count, arc);
  const uint32_t s = SliceOf(n, count, p);
  const uint64_t t = p - SlicePieces(n, count, s).first;
  return {static_cast<uint32_t>((s + 1 + t % spread) % count), t / spread};
}

namespace {
// The first piece (counted within slice s) that slice s gives member h's units, or spread and
// above when h does not protect slice s.
uint32_t AecFirst(uint32_t count, uint32_t s, uint32_t h) { return (h + count - s - 1) % count; }
}  // namespace

uint64_t AecUnits(uint64_t n, uint32_t count, bool arc, uint32_t holder) {
  CKPTDB_ASSERT(count >= 3 && holder < count);
  const uint32_t spread = AecSpread(count, arc);
  uint64_t units = 0;
  for (uint32_t s = 0; s < count; ++s) {
    const uint64_t k = AecFirst(count, s, holder);
    const auto [first, end] = SlicePieces(n, count, s);
    if (k < spread && end - first > k) units = std::max(units, (end - first - k - 1) / spread + 1);
  }
  return units;
}

std::vector<uint64_t> AecUnitPieces(uint64_t n, uint32_t count, bool arc, uint32_t holder,
                                    uint64_t unit) {
  CKPTDB_ASSERT(count >= 3 && holder < count);
  const uint32_t spread = AecSpread(count, arc);
  std::vector<uint64_t> pieces;
  for (uint32_t s = 0; s < count; ++s) {
    const uint64_t k = AecFirst(count, s, holder);
    if (k >= spread) continue;  // its own slice (k = count - 1), or the one before with ARC
    const auto [first, end] = SlicePieces(n, count, s);
    const uint64_t t = k + unit * spread;
    if (t < end - first) pieces.push_back(first + t);
  }
  return pieces;  // slices ascend, so their pieces do
}

bool GroupRestores(uint32_t count, bool arc, bool aec, const std::vector<bool>& alive) {
  CKPTDB_ASSERT(alive.size() == count && (!aec || count >= 3));
  std::vector<uint32_t> broken;  // slices no member keeps whole
  for (uint32_t s = 0; s < count; ++s) {
    if (!alive[s] && !(arc && alive[(s + count - 1) % count])) broken.push_back(s);
  }
  if (broken.empty()) return true;
  if (!aec) return false;
  // A broken slice is decoded from each protecting member's units, whose other pieces must be
  // read whole: so no protecting member may be lost or protect another broken slice.
  const uint32_t spread = AecSpread(count, arc);
  std::vector<uint32_t> broken_protected(count, 0);
  for (uint32_t s : broken) {
    for (uint32_t k = 0; k < spread; ++k) ++broken_protected[(s + 1 + k) % count];
  }
  for (uint32_t s : broken) {
    for (uint32_t k = 0; k < spread; ++k) {
      const uint32_t h = (s + 1 + k) % count;
      if (!alive[h] || broken_protected[h] > 1) return false;
    }
  }
  return true;
}

bool GroupRestores(uint32_t count, uint8_t protection, const std::vector<bool>& alive) {
  const bool aec = (protection & 2) != 0 && count >= 3;
  if (!GroupRestores(count, (protection & 1) != 0, aec, alive)) return false;
  if (!(protection & kProtectionAor)) return true;
  for (uint32_t q = 0; q < count; ++q) {
    if (!alive[q] && !alive[(q + count - 1) % count]) return false;
  }
  return true;
}

uint64_t AecUnitBytes(uint64_t n, uint64_t piece_bytes, uint64_t full_bytes,
                      const std::vector<uint64_t>& pieces) {
  uint64_t bytes = 0;
  for (uint64_t p : pieces) {
    bytes = std::max(bytes, p + 1 == n ? full_bytes - p * piece_bytes : piece_bytes);
  }
  return bytes;
}

std::vector<uint64_t> KeptPieces(const fb::Tensor& t, uint64_t piece_bytes) {
  std::vector<uint64_t> pieces;
  pieces.reserve(t.chunk_count());
  for (const fb::Slice* s : *t.slices()) {
    for (uint64_t off = s->offset(); off < s->offset() + s->bytes(); off += piece_bytes) {
      pieces.push_back(off / piece_bytes);
    }
  }
  return pieces;
}

size_t DTypeBytes(uint32_t dtype) {
  return dtype < std::size(kDTypeBytes) ? kDTypeBytes[dtype] : 0;
}

std::vector<uint8_t> BuildManifest(const ManifestContents& c) {
  // Sorted by name, as bytes (unsigned), through keys that hold each name's first 16 bytes: an
  // entry is a string and five vectors, and comparing names in place chases two pointers a
  // comparison (a version of 100,000 tensors sorted in 30 ms that way). Names hold no NUL, so
  // padding a short one with zeros keeps the order.
  struct Key {
    uint64_t head[2];
    const TensorEntry* t;
  };
  auto head = [](const std::string& name, size_t at) {
    uint64_t v = 0;
    for (size_t i = at; i < at + 8; ++i) {
      v = (v << 8) | (i < name.size() ? static_cast<uint8_t>(name[i]) : 0);
    }
    return v;
  };
  std::vector<Key> keys;
  keys.reserve(c.tensors.size());
  for (const TensorEntry& t : c.tensors) keys.push_back({{head(t.name, 0), head(t.name, 8)}, &t});
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.head[0] != b.head[0]) return a.head[0] < b.head[0];
    if (a.head[1] != b.head[1]) return a.head[1] < b.head[1];
    return a.t->name < b.t->name;
  });
  std::vector<const TensorEntry*> sorted;
  sorted.reserve(keys.size());
  for (const Key& k : keys) sorted.push_back(k.t);
  for (size_t i = 1; i < sorted.size(); ++i) {
    CKPTDB_ASSERT(sorted[i - 1]->name != sorted[i]->name);
  }
  flatbuffers::FlatBufferBuilder b(1024 + c.tensors.size() * 128 + c.chunks.size() * 24);
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  tensors.reserve(c.tensors.size());
  uint64_t data_bytes = 0;
  bool dedup = false;
  bool packed = false;
  for (const TensorEntry* entry : sorted) {
    const TensorEntry& t = *entry;
    auto name = b.CreateString(t.name);
    auto shape = b.CreateVector(t.shape);
    auto gshape = b.CreateVector(t.global_shape);
    auto goffset = b.CreateVector(t.global_offset);
    flatbuffers::Offset<flatbuffers::Vector<const fb::Slice*>> slices;
    flatbuffers::Offset<flatbuffers::Vector<uint64_t>> piece_xxh3;
    if (t.full_bytes != 0) {
      std::vector<fb::Slice> list;
      for (const auto& [offset, bytes] : t.slices) list.emplace_back(offset, bytes);
      slices = b.CreateVectorOfStructs(list);
      piece_xxh3 = b.CreateVector(t.piece_xxh3);
      dedup = true;
    }
    CKPTDB_ASSERT(!t.packed || (t.full_bytes == 0 && t.chunk_count == 1 && t.bytes > 0));
    CKPTDB_ASSERT(t.parity_chunks == 0 || (t.full_bytes != 0 && c.replicas.aec));
    CKPTDB_ASSERT(!(t.replicated || t.recomputed) || (c.replicas.present && c.replicas.aor));
    CKPTDB_ASSERT(t.recomputed == t.name.starts_with(kRecomputedPrefix) || !c.replicas.aor);
    packed |= t.packed;
    tensors.push_back(fb::CreateTensor(b, name, static_cast<fb::DType>(t.dtype), shape, gshape,
                                       goffset, t.bytes, t.first_chunk, t.chunk_count, t.full_bytes,
                                       slices, piece_xxh3, t.packed, t.pack_offset, t.pack_xxh3,
                                       t.parity_chunks, t.replicated, t.recomputed));
    data_bytes += t.bytes;
  }
  CKPTDB_ASSERT(!dedup || c.replicas.present);
  auto tensor_vec = b.CreateVector(tensors);
  std::vector<fb::Chunk> chunks;
  chunks.reserve(c.chunks.size());
  for (const ChunkEntry& ch : c.chunks)
    chunks.emplace_back(ch.record_offset, ch.payload_bytes, ch.xxh3);
  auto chunk_vec = b.CreateVectorOfStructs(chunks);
  flatbuffers::Offset<fb::Redundancy> redundancy;
  if (c.redundancy.scheme == 0) {
    redundancy = fb::CreateRedundancy(b, fb::RedundancyScheme::None);
  } else {
    const RedundancyEntry& r = c.redundancy;
    auto members = b.CreateVector(r.member_ranks);
    auto member_bytes = r.member_bytes.empty() ? 0 : b.CreateVector(r.member_bytes);
    redundancy =
        fb::CreateRedundancy(b, static_cast<fb::RedundancyScheme>(r.scheme), r.group, r.k, r.m,
                             r.stripe_bytes, members, 0, member_bytes, r.parity, r.position);
  }
  auto prov =
      fb::CreateProvenance(b, c.job_id, c.rank, c.world_size, c.version, b.CreateString(c.node_id),
                           c.created_unix_ns, b.CreateString(c.writer));
  flatbuffers::Offset<fb::Replicas> replicas;
  if (c.replicas.present) {
    CKPTDB_ASSERT(c.replicas.arc || c.replicas.aec);
    const fb::ReplicaProtection protection = !c.replicas.aec  ? fb::ReplicaProtection::Arc
                                             : c.replicas.arc ? fb::ReplicaProtection::ArcAec
                                                              : fb::ReplicaProtection::Aec;
    replicas = fb::CreateReplicas(
        b, protection, c.replicas.group, b.CreateVector(c.replicas.members), c.replicas.position,
        c.replicas.piece_bytes, c.replicas.replicated_only, c.replicas.aor);
  }
  // The oldest format version that can hold the manifest, so older readers read what they can.
  const uint32_t version = c.replicas.present && c.replicas.aor   ? kManifestVersionRecomputed
                           : c.replicas.present && c.replicas.aec ? kManifestVersionParity
                           : packed                               ? kManifestVersionPacked
                           : c.replicas.present                   ? kManifestVersionDedup
                                                                  : kFormatVersion;
  auto root =
      fb::CreateManifest(b, version, prov, tensor_vec, chunk_vec, redundancy, data_bytes, replicas);
  b.Finish(root, fb::ManifestIdentifier());
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

Status ManifestView::Open(std::span<const uint8_t> bytes, uint64_t data_end,
                          const std::string& what, ManifestView* out) {
  auto bad = [&](const std::string& m) { return Status::Corrupt(what + ": manifest " + m); };
  if (bytes.size() < 8 || !fb::ManifestBufferHasIdentifier(bytes.data())) {
    return bad("is not a ckptdb manifest (no CKMF identifier)");
  }
  // Bounds for the verifier: depth and table count well above what a real manifest needs.
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), /*max_depth=*/16,
                                 /*max_tables=*/4 * kMaxTensors);
  if (!fb::VerifyManifestBuffer(verifier)) return bad("fails FlatBuffers verification");
  const fb::Manifest* m = fb::GetManifest(bytes.data());
  const uint32_t format_version = m->format_version();
  if (format_version != kFormatVersion && format_version != kManifestVersionDedup &&
      format_version != kManifestVersionPacked && format_version != kManifestVersionParity &&
      format_version != kManifestVersionRecomputed) {
    return bad("has format version " + std::to_string(format_version));
  }
  // Format version 2: the replica group whose deduplicated shards the segment holds slices of.
  // Version 3 (packed tensors) may have one or not; version 4 (AEC's parity) and 5 (AOR) have.
  const fb::Replicas* group = m->replicas();
  const bool v5 = format_version == kManifestVersionRecomputed;
  if (format_version != kManifestVersionPacked &&
      (group != nullptr) != (format_version == kManifestVersionDedup ||
                             format_version == kManifestVersionParity || v5)) {
    return bad("has format version " + std::to_string(m->format_version()) +
               (group != nullptr ? " and a replica group" : " and no replica group"));
  }
  if (group != nullptr) {
    const uint32_t count = group->members() ? group->members()->size() : 0;
    bool ascending = true;
    for (uint32_t i = 1; i < count; ++i) {
      ascending = ascending && group->members()->Get(i - 1) < group->members()->Get(i);
    }
    // ARC alone up to version 3; AEC (parity of 2 or more other slices) in version 4, or 5
    // with AOR (recomputed replicas), which only version 5 has.
    const bool aec = HasAec(*group);
    if (!(HasArc(*group) || aec) || group->recomputed() != v5 ||
        (!v5 && aec != (format_version == kManifestVersionParity)) || count < (aec ? 3u : 2u) ||
        count > kMaxReplicaMembers || !ascending || group->position() >= count ||
        group->piece_bytes() == 0 || !IsAligned(group->piece_bytes()) ||
        group->piece_bytes() > kMaxChunkBytes) {
      return bad("replica group is out of range or inconsistent");
    }
  }
  uint32_t chunk_count = m->chunks() ? m->chunks()->size() : 0;
  uint32_t tensor_count = m->tensors() ? m->tensors()->size() : 0;
  if (chunk_count > kMaxChunksPerSegment || tensor_count > kMaxTensors) {
    return bad("lists too many chunks or tensors");
  }
  if (!ElementsAligned(m->chunks())) return bad("chunk list is not 8-byte aligned");
  // Chunks: in file order, non-overlapping, all before the manifest record.
  uint64_t next = kBlockBytes;
  for (uint32_t i = 0; i < chunk_count; ++i) {
    const fb::Chunk* c = m->chunks()->Get(i);
    if (c->record_offset() != next || c->payload_bytes() > kMaxChunkBytes ||
        c->payload_bytes() > data_end) {
      return bad("chunk " + std::to_string(i) + " at offset " + std::to_string(c->record_offset()) +
                 " (" + std::to_string(c->payload_bytes()) +
                 " bytes) is out of place; expected offset " + std::to_string(next));
    }
    next += RecordBytes(c->payload_bytes());
    if (next > data_end) return bad("chunk " + std::to_string(i) + " runs past the data records");
  }
  if (next != data_end)
    return bad("chunks end at " + std::to_string(next) + ", records at " +
               std::to_string(data_end));
  // Tensors: sorted unique names, chunk ranges that tile the chunk list, consistent sizes.
  uint64_t data_bytes = 0;
  uint64_t expected_first = 0;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  ranges.reserve(tensor_count);
  struct Part {
    uint32_t chunk;
    uint64_t offset;
    uint64_t bytes;
    bool operator<(const Part& o) const {
      return chunk != o.chunk ? chunk < o.chunk : offset < o.offset;
    }
  };
  std::vector<Part> parts;  // packed tensors, by chunk
  for (uint32_t i = 0; i < tensor_count; ++i) {
    const fb::Tensor* t = m->tensors()->Get(i);
    std::string_view name = NameOf(*t);
    std::string label = "tensor " + std::to_string(i);
    if (name.empty() || name.size() > kMaxNameBytes || name.find('\0') != std::string_view::npos) {
      return bad(label + " has an empty, overlong or NUL-containing name");
    }
    label = "tensor " + QuoteName(name);
    if (i > 0 && !(NameOf(*m->tensors()->Get(i - 1)) < name)) {
      return bad(label + " is out of order or duplicated");
    }
    if (static_cast<uint32_t>(t->dtype()) >= std::size(kDTypeBytes)) {
      return bad(label + " has unknown dtype " + std::to_string(static_cast<int>(t->dtype())));
    }
    if (!ElementsAligned(t->shape()) || !ElementsAligned(t->global_shape()) ||
        !ElementsAligned(t->global_offset())) {
      return bad(label + " has a shape vector that is not 8-byte aligned");
    }
    uint32_t ndim = t->shape() ? t->shape()->size() : 0;
    uint32_t gdim = t->global_shape() ? t->global_shape()->size() : 0;
    uint32_t odim = t->global_offset() ? t->global_offset()->size() : 0;
    if (ndim > kMaxDims || (gdim != 0 && gdim != ndim) || odim != gdim) {
      return bad(label + " has inconsistent dimensions");
    }
    const bool dedup = t->full_bytes() != 0;
    // Version 5: a recomputed replica is named by the prefix, is not marked replicated and is
    // kept whole; a name with the prefix is a recomputed replica; versions 1 to 4 mark neither.
    if (t->recomputed() != (v5 && name.starts_with(kRecomputedPrefix)) ||
        (t->replicated() && (!v5 || t->recomputed())) || (t->recomputed() && dedup) ||
        (dedup && v5 && !t->replicated())) {
      return bad(label + " is marked replicated or recomputed inconsistently (format version " +
                 std::to_string(format_version) + ")");
    }
    if (!dedup &&
        ((t->slices() && t->slices()->size()) || (t->piece_xxh3() && t->piece_xxh3()->size()))) {
      return bad(label + " lists slices but is not deduplicated");
    }
    if (dedup && group == nullptr) return bad(label + " is deduplicated without a replica group");
    const uint64_t shard_bytes = dedup ? t->full_bytes() : t->bytes();
    if (ndim > 0) {
      uint64_t elements = 1;
      for (uint32_t d = 0; d < ndim; ++d) {
        if (MulOverflows(elements, t->shape()->Get(d), &elements))
          return bad(label + " shape overflows");
        if (gdim) {
          uint64_t end;
          if (__builtin_add_overflow(t->global_offset()->Get(d), t->shape()->Get(d), &end) ||
              end > t->global_shape()->Get(d)) {
            return bad(label + " lies outside its global shape in dimension " + std::to_string(d));
          }
        }
      }
      uint64_t shape_bytes;
      if (MulOverflows(elements, DTypeBytes(static_cast<uint32_t>(t->dtype())), &shape_bytes) ||
          shape_bytes != shard_bytes) {
        return bad(label + " shape does not match its " + std::to_string(shard_bytes) + " bytes");
      }
    }
    uint64_t end = uint64_t{t->first_chunk()} + t->chunk_count();
    if (end > chunk_count) return bad(label + " names chunks beyond the chunk list");
    if (t->packed()) {
      if (format_version < kManifestVersionPacked || dedup || t->chunk_count() != 1 ||
          t->bytes() == 0 || t->parity_chunks() != 0 || t->recomputed()) {
        return bad(label + " is packed but is not one non-empty shard in one chunk of a version " +
                   std::to_string(kManifestVersionPacked) + " to " +
                   std::to_string(kManifestVersionRecomputed) + " manifest (nor recomputed)");
      }
      const uint64_t payload = m->chunks()->Get(t->first_chunk())->payload_bytes();
      if (t->pack_offset() > payload || t->bytes() > payload - t->pack_offset()) {
        return bad(label + " lies outside its chunk " + std::to_string(t->first_chunk()));
      }
      parts.push_back({t->first_chunk(), t->pack_offset(), t->bytes()});
      data_bytes += t->bytes();
      continue;
    }
    if (t->pack_offset() != 0 || t->pack_xxh3() != 0) {
      return bad(label + " has a pack offset or hash but is not packed");
    }
    if (t->parity_chunks() != 0 && (!dedup || t->parity_chunks() > chunk_count - end)) {
      return bad(label + " has parity units but is not deduplicated, or they run past the " +
                 "chunk list");
    }
    uint64_t sum = 0;
    for (uint32_t c = t->first_chunk(); c < end; ++c) {
      uint64_t p = m->chunks()->Get(c)->payload_bytes();
      if (p == 0) return bad(label + " has an empty chunk " + std::to_string(c));
      sum += p;
    }
    if (sum != t->bytes()) {
      return bad(label + " has " + std::to_string(t->bytes()) + " bytes but its chunks hold " +
                 std::to_string(sum));
    }
    if (dedup) CKPTDB_RETURN_IF_ERROR(CheckSlices(*m, *t, *group, label, bad));
    const uint32_t owned = t->chunk_count() + t->parity_chunks();  // both bounded by chunk_count
    if (owned > 0) ranges.emplace_back(t->first_chunk(), owned);
    data_bytes += t->bytes();
  }
  // A chunk of packed tensors holds only them, without overlap, and ends where the last ends
  // (the gaps between them are the writer's alignment).
  std::sort(parts.begin(), parts.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    const bool last = i + 1 == parts.size() || parts[i + 1].chunk != p.chunk;
    if (!last && p.offset + p.bytes > parts[i + 1].offset) {
      return bad("packed tensors overlap in chunk " + std::to_string(p.chunk));
    }
    if (last) {
      if (p.offset + p.bytes != m->chunks()->Get(p.chunk)->payload_bytes()) {
        return bad("chunk " + std::to_string(p.chunk) + " holds bytes past its packed tensors");
      }
      ranges.emplace_back(p.chunk, 1);
    }
  }
  // Every chunk belongs to exactly one tensor, or to packed tensors only.
  std::sort(ranges.begin(), ranges.end());
  for (const auto& [first, count] : ranges) {
    if (first != expected_first) return bad("chunk ranges of tensors overlap or leave gaps");
    expected_first = first + count;
  }
  if (expected_first != chunk_count) return bad("some chunks belong to no tensor");
  if (data_bytes != m->data_bytes()) return bad("data_bytes disagrees with its tensors");
  // A coding group's layout, where there is one: in range and self-consistent.
  if (const fb::Redundancy* r = m->redundancy();
      r != nullptr && r->scheme() != fb::RedundancyScheme::None) {
    const uint32_t scheme = static_cast<uint32_t>(r->scheme());
    const uint32_t members = r->member_ranks() ? r->member_ranks()->size() : 0;
    const uint32_t sized = r->member_bytes() ? r->member_bytes()->size() : 0;
    if (scheme > static_cast<uint32_t>(fb::RedundancyScheme::Xor) ||
        r->scheme() == fb::RedundancyScheme::Replica || r->k() < 1 || r->m() < 1 ||
        (r->scheme() == fb::RedundancyScheme::Xor && (r->m() != 1 || r->k() < 2)) ||
        r->k() + r->m() > kMaxGroupMembers || members != r->k() + r->m() ||
        r->position() >= members || r->stripe_bytes() == 0 || !IsAligned(r->stripe_bytes()) ||
        r->stripe_bytes() > kMaxChunkBytes || (r->parity() ? sized != members : sized != 0) ||
        !ElementsAligned(r->member_bytes())) {
      return bad("redundancy layout is out of range or inconsistent");
    }
  }
  out->root_ = m;
  return Status::Ok();
}

const fb::Tensor* ManifestView::Find(std::string_view name) const {
  if (!root_->tensors()) return nullptr;
  const auto* v = root_->tensors();
  uint32_t lo = 0, hi = v->size();
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    std::string_view n = NameOf(*v->Get(mid));
    if (n == name) return v->Get(mid);
    if (n < name)
      lo = mid + 1;
    else
      hi = mid;
  }
  return nullptr;
}

}  // namespace ckpt::format
