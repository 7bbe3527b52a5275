// libFuzzer target: any bytes as a manifest record's payload (docs/format.md, "The manifest").
// ManifestView::Open must answer Ok or Corrupt for every input, and a view it opens must hold
// every invariant that docs/format.md promises, because code holding a ManifestView never
// re-checks them. The walk below re-derives each one and traps when one is broken, so a
// violated promise is a finding just like a sanitizer report.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/manifest.h"
#include "format/segment_format.h"

namespace ckpt::format {
namespace {

void Check(bool invariant) {
  if (!invariant) __builtin_trap();
}

// Where the data records end for the chunk list in `bytes`, when it passes the FlatBuffers
// verifier: what a valid segment would pass, so that valid-looking inputs reach the semantic
// checks instead of stopping at "chunks end at ...". One block (no chunks) otherwise.
uint64_t DerivedDataEnd(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8) return kBlockBytes;
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), /*max_depth=*/16,
                                 /*max_tables=*/1u << 20);
  if (!fb::VerifyManifestBuffer(verifier)) return kBlockBytes;
  const fb::Manifest* m = fb::GetManifest(bytes.data());
  uint64_t end = kBlockBytes;
  // The verifier does not check the 8-byte alignment of the chunk structs; Open refuses those.
  if (m->chunks() == nullptr || reinterpret_cast<uintptr_t>(m->chunks()->Data()) % 8 != 0) {
    return end;
  }
  // Bounded: the verifier proved the vector lies inside the input, so at most size/24 chunks,
  // and clamping each payload keeps the sum far from overflow.
  for (const fb::Chunk* c : *m->chunks()) {
    end += RecordBytes(c->payload_bytes() < kMaxChunkBytes ? c->payload_bytes() : kMaxChunkBytes);
  }
  return end;
}

std::vector<uint64_t> ToVector(const flatbuffers::Vector<uint64_t>* v) {
  return v ? std::vector<uint64_t>(v->begin(), v->end()) : std::vector<uint64_t>();
}

// Everything ManifestView::Open promises about a manifest it accepts (docs/format.md).
void Walk(const ManifestView& view, uint64_t data_end) {
  const fb::Manifest& m = view.root();
  const uint32_t version = m.format_version();
  const bool v5 = version == kManifestVersionRecomputed;
  Check(version == kFormatVersion || version == kManifestVersionDedup ||
        version == kManifestVersionPacked || version == kManifestVersionParity || v5);
  if (version != kManifestVersionPacked) {
    Check((m.replicas() != nullptr) ==
          (version == kManifestVersionDedup || version == kManifestVersionParity || v5));
  }
  bool aec = false;
  if (const fb::Replicas* g = m.replicas()) {
    aec = g->protection() == fb::ReplicaProtection::Aec ||
          g->protection() == fb::ReplicaProtection::ArcAec;
    Check(aec || g->protection() == fb::ReplicaProtection::Arc);
    Check(g->recomputed() == v5);
    Check(v5 || aec == (version == kManifestVersionParity));
    Check(!aec || g->members()->size() >= 3);
    Check(g->members() != nullptr && g->members()->size() >= 2 &&
          g->members()->size() <= kMaxReplicaMembers && g->position() < g->members()->size());
    Check(g->piece_bytes() > 0 && IsAligned(g->piece_bytes()));
  }
  Check(m.provenance() != nullptr);
  uint32_t chunk_count = view.chunk_count();
  Check(chunk_count <= kMaxChunksPerSegment);
  uint64_t next = kBlockBytes;
  for (uint32_t i = 0; i < chunk_count; ++i) {
    const fb::Chunk& c = view.chunk(i);
    Check(c.record_offset() == next);
    Check(c.payload_bytes() <= kMaxChunkBytes);
    next += RecordBytes(c.payload_bytes());
  }
  Check(next == data_end);

  // 1: a tensor's own chunk; 2: a pack (chunk of packed shards only), with its shards' parts
  // (chunk, offset, bytes).
  std::vector<uint8_t> owner_count(chunk_count, 0);
  std::vector<std::array<uint64_t, 3>> parts;
  uint64_t data_bytes = 0;
  for (uint32_t i = 0; i < view.tensor_count(); ++i) {
    const fb::Tensor& t = view.tensor(i);
    Check(t.name() != nullptr);
    std::string_view name(t.name()->data(), t.name()->size());
    Check(!name.empty() && name.size() <= 1024 && name.find('\0') == std::string_view::npos);
    if (i > 0) {
      const flatbuffers::String* prev = view.tensor(i - 1).name();
      Check(std::string_view(prev->data(), prev->size()) < name);
    }
    Check(view.Find(name) == &t);
    // Version 5 marks recomputed replicas (by their reserved name) and replicated shards.
    Check(t.recomputed() == (v5 && name.starts_with(kRecomputedPrefix)));
    Check(!t.replicated() || (v5 && !t.recomputed()));
    Check(DTypeBytes(static_cast<uint32_t>(t.dtype())) > 0);
    std::vector<uint64_t> shape = ToVector(t.shape());
    std::vector<uint64_t> global_shape = ToVector(t.global_shape());
    std::vector<uint64_t> global_offset = ToVector(t.global_offset());
    Check(shape.size() <= kMaxDims);
    Check(global_shape.empty() || global_shape.size() == shape.size());
    Check(global_offset.size() == global_shape.size());
    if (!shape.empty()) {
      unsigned __int128 elements = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        elements *= shape[d];
        Check(elements <= UINT64_MAX);
        if (!global_shape.empty()) {
          Check(global_offset[d] <= global_shape[d] &&
                shape[d] <= global_shape[d] - global_offset[d]);
        }
      }
      Check(elements * DTypeBytes(static_cast<uint32_t>(t.dtype())) == ShardBytes(t));
    }
    // A deduplicated shard: a piece hash for every piece, slices inside it that add up to bytes.
    if (t.full_bytes() != 0) {
      Check(m.replicas() != nullptr);
      const uint64_t piece = m.replicas()->piece_bytes();
      Check(t.piece_xxh3() != nullptr &&
            t.piece_xxh3()->size() == t.full_bytes() / piece + (t.full_bytes() % piece != 0));
      uint64_t held = 0;
      for (const fb::Slice* s : *t.slices()) {
        Check(s->offset() % piece == 0 && s->bytes() <= t.full_bytes() - s->offset());
        held += s->bytes();
      }
      Check(held == t.bytes());
      Check(aec || t.parity_chunks() == 0);
    } else {
      Check(!t.slices() || t.slices()->size() == 0);
      Check(t.parity_chunks() == 0);
    }
    Check(uint64_t{t.first_chunk()} + t.chunk_count() <= chunk_count);
    if (t.packed()) {
      // A packed shard: one non-empty part of one chunk that only packed shards share.
      Check(version >= kManifestVersionPacked && t.full_bytes() == 0 && t.chunk_count() == 1 &&
            t.bytes() > 0 && !t.recomputed());
      const uint32_t c = t.first_chunk();
      const uint64_t payload = view.chunk(c).payload_bytes();
      Check(t.pack_offset() <= payload && t.bytes() <= payload - t.pack_offset());
      Check(owner_count[c] != 1);
      owner_count[c] = 2;
      parts.push_back({c, t.pack_offset(), t.bytes()});
      data_bytes += t.bytes();
      continue;
    }
    Check(t.pack_offset() == 0 && t.pack_xxh3() == 0);
    uint64_t sum = 0;
    for (uint32_t c = t.first_chunk(); c < t.first_chunk() + t.chunk_count(); ++c) {
      Check(view.chunk(c).payload_bytes() > 0);
      sum += view.chunk(c).payload_bytes();
      Check(owner_count[c] == 0);
      owner_count[c] = 1;
    }
    Check(sum == t.bytes());
    // AEC's parity units follow its slices' chunks, each non-empty and its own.
    const uint64_t parity_end = uint64_t{t.first_chunk()} + t.chunk_count() + t.parity_chunks();
    Check(parity_end <= chunk_count);
    for (uint64_t c = uint64_t{t.first_chunk()} + t.chunk_count(); c < parity_end; ++c) {
      Check(view.chunk(static_cast<uint32_t>(c)).payload_bytes() > 0);
      Check(owner_count[c] == 0);
      owner_count[c] = 1;
    }
    data_bytes += t.bytes();
  }
  for (uint32_t c = 0; c < chunk_count; ++c) Check(owner_count[c] != 0);
  // A pack's parts, in payload order, do not overlap, and the last ends at the chunk's end.
  std::sort(parts.begin(), parts.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& [c, offset, bytes] = parts[i];
    if (i + 1 < parts.size() && parts[i + 1][0] == c) {
      Check(offset + bytes <= parts[i + 1][1]);
    } else {
      Check(offset + bytes == view.chunk(static_cast<uint32_t>(c)).payload_bytes());
    }
  }
  Check(data_bytes == m.data_bytes());

  // A coding layout, where there is one, reads back in range: a caller indexes member_ranks and
  // member_bytes by position without checking again.
  if (const fb::Redundancy* r = m.redundancy();
      r != nullptr && r->scheme() != fb::RedundancyScheme::None) {
    Check(r->scheme() == fb::RedundancyScheme::ReedSolomon ||
          r->scheme() == fb::RedundancyScheme::Xor);
    Check(r->k() >= 1 && r->m() >= 1 && r->k() + r->m() <= kMaxGroupMembers);
    Check(r->member_ranks() != nullptr && r->member_ranks()->size() == r->k() + r->m());
    Check(r->position() < r->member_ranks()->size());
    Check(r->stripe_bytes() > 0 && IsAligned(r->stripe_bytes()));
    const uint32_t sized = r->member_bytes() ? r->member_bytes()->size() : 0;
    Check(r->parity() ? sized == r->k() + r->m() : sized == 0);
    for (uint32_t i = 0; i < sized; ++i) (void)r->member_bytes()->Get(i);
  }

  // Lookups of names that are not there: before the first, after the last, near each one.
  Check(view.Find("") == nullptr);
  for (uint32_t i = 0; i < view.tensor_count(); ++i) {
    std::string near(view.tensor(i).name()->str());
    near.push_back('\0');  // no accepted name holds a NUL, so this one is absent
    Check(view.Find(near) == nullptr);
  }
}

void FuzzManifest(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  // Twice: with the data end the chunk list implies (reaches the tensor checks) and with a fixed
  // one (exercises the chunk placement checks against a disagreeing segment).
  for (uint64_t data_end : {DerivedDataEnd(bytes), kBlockBytes}) {
    ManifestView view;
    Status st = ManifestView::Open(bytes, data_end, "fuzz", &view);
    if (!st.ok()) {
      Check(st.code() == CKPTDB_ECORRUPT && st.message().starts_with("fuzz: manifest "));
      continue;
    }
    Walk(view, data_end);
  }
}

}  // namespace
}  // namespace ckpt::format

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::format::FuzzManifest(data, size);
  return 0;
}
