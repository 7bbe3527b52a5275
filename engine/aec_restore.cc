// REFT's AEC at restore (docs/format.md, "AEC parity units"): the pieces of a deduplicated
// shard that no member of its replica group could give whole (a member lost, with its ARC copy
// where there is one), each decoded from the parity unit that protects it and the unit's other
// pieces, which GatherSlices has put in the caller's buffer by then.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "redundancy/erasure_code.h"
#include "util/text.h"

namespace ckpt::engine {

namespace {

uint64_t PieceBytes(const RestorePlan::Dedup& d, uint64_t p) {
  return std::min(d.piece_bytes, d.full_bytes - p * d.piece_bytes);
}

}  // namespace

// This rank's own units `units` of shard `name`, from the first of its tiers holding a copy that
// reads and checks: into out (units' bytes back to back), each unit's outcome in *results.
void Db::ReadOwnParityUnits(uint64_t version, const std::string& name,
                            const std::vector<uint64_t>& units, const std::vector<uint64_t>& bytes,
                            uint8_t* out, std::vector<Status>* results) {
  results->assign(units.size(), Status::NotFound("this rank's own parity units of " +
                                                 QuoteName(name) + " are on none of its tiers"));
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    OpenSegment* seg = nullptr;
    if (!ReadSegment(version, ti, &seg).ok()) continue;
    RamPin pin(this, version, tiers_[ti].is_ram());
    const format::ManifestView& m = seg->reader->manifest();
    const fb::Tensor* t = m.Find(name);
    std::vector<uint32_t> chunks;
    std::vector<uint64_t> offsets;
    std::vector<size_t> which;  // chunks[i] is units[which[i]]
    uint64_t at = 0;
    for (size_t i = 0; i < units.size(); ++i) {
      const uint64_t here = at;
      at += bytes[i];
      if ((*results)[i].ok()) continue;
      if (t == nullptr || t->parity_chunks() <= units[i]) continue;
      const uint32_t c = t->first_chunk() + t->chunk_count() + static_cast<uint32_t>(units[i]);
      if (m.chunk(c).payload_bytes() != bytes[i]) continue;
      chunks.push_back(c);
      offsets.push_back(here);
      which.push_back(i);
    }
    if (chunks.empty()) continue;
    std::vector<uint32_t> failed;
    uint64_t read = 0;
    if (!ReadChunks(seg, RestorePlan{}, chunks, offsets, out, &failed, &read).ok()) continue;
    for (size_t k = 0; k < chunks.size(); ++k) {
      if (std::find(failed.begin(), failed.end(), chunks[k]) == failed.end()) {
        (*results)[which[k]] = Status::Ok();
      }
    }
  }
}

// Units `units` of member `holder` (a position in d.members), from its own segment on any of its
// tiers, each checked against the xxh3 its manifest gives it.
void Db::FetchParityUnits(uint64_t version, const std::string& name, RestorePlan* plan,
                          uint32_t holder, const std::vector<uint64_t>& units,
                          const std::vector<uint64_t>& bytes, uint8_t* out,
                          std::vector<Status>* results) {
  RestorePlan::Dedup& d = *plan->dedup;
  const uint32_t rank = d.members[holder];
  const std::string src = "the parity units of " + QuoteName(name) + " that " + R(rank) + " keeps";
  results->assign(units.size(), Status::Ok());
  auto fail_all = [&](const Status& st) { results->assign(units.size(), st); };
  ReplicaHolder where;
  ArcMember* member = nullptr;
  Status st = cluster_->MemberAt(rank, &where);
  if (st.ok()) {
    st = OpenArcMember(version, rank, where, d.members, d.piece_bytes, plan->what, &member);
  }
  if (!st.ok()) return fail_all(st);
  const format::ManifestView& m = member->reader->manifest();
  const fb::Tensor* t = m.Find(name);
  if (t == nullptr || t->full_bytes() != d.full_bytes) {
    return fail_all(Status::Corrupt(src + ": its manifest has no such deduplicated shard"));
  }
  std::vector<Cluster::FetchRange> ranges;
  std::vector<uint32_t> chunks;
  uint64_t at = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const uint32_t c = t->first_chunk() + t->chunk_count() + static_cast<uint32_t>(units[i]);
    if (t->parity_chunks() <= units[i] || m.chunk(c).payload_bytes() != bytes[i]) {
      return fail_all(Status::Corrupt(src + ": its manifest lays unit " + std::to_string(units[i]) +
                                      " out otherwise"));
    }
    ranges.push_back({m.chunk(c).record_offset() + format::kBlockBytes, out + at, bytes[i]});
    chunks.push_back(c);
    at += bytes[i];
  }
  Status gone = cluster_->FetchRanges(member->holder, rank, version, ranges, results, true);
  if (!gone.ok()) {
    member->failed = true;  // vanished or timed out: not asked again for this version
    plan->Note(gone.message());
  }
  for (size_t i = 0; i < units.size(); ++i) {
    if ((*results)[i].ok()) {
      (*results)[i] = format::CheckXxh3(ranges[i].dst, bytes[i], m.chunk(chunks[i]).xxh3(),
                                        "parity unit " + std::to_string(units[i]) + " of " + src);
    }
  }
}

void Db::DecodeSlices(uint64_t version, const std::string& name, uint8_t* out, RestorePlan* plan) {
  RestorePlan::Dedup& d = *plan->dedup;
  const auto count = static_cast<uint32_t>(d.members.size());
  const uint64_t n = d.piece_xxh3.size();
  // The units to read, by holder: each with the missing piece it decodes.
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> wanted;
  for (uint64_t p = 0; p < n; ++p) {
    if (d.have[p]) continue;
    const format::AecPlace place = format::AecPlaceOf(n, count, d.arc, p);
    wanted[place.holder].emplace_back(place.unit, p);
  }
  for (const auto& [holder, list] : wanted) {
    std::vector<uint64_t> units, bytes;
    uint64_t total = 0;
    for (const auto& [unit, piece] : list) {
      units.push_back(unit);
      bytes.push_back(format::AecUnitBytes(n, d.piece_bytes, d.full_bytes,
                                           format::AecUnitPieces(n, count, d.arc, holder, unit)));
      total += bytes.back();
    }
    std::vector<uint8_t> buffer(total);
    std::vector<Status> results;
    if (holder == d.position) {
      ReadOwnParityUnits(version, name, units, bytes, buffer.data(), &results);
    } else {
      FetchParityUnits(version, name, plan, holder, units, bytes, buffer.data(), &results);
    }
    uint64_t at = 0;
    uint64_t served = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      uint8_t* unit = buffer.data() + at;
      at += bytes[i];
      const uint64_t p = list[i].second;
      Status st = results[i];
      for (uint64_t q : format::AecUnitPieces(n, count, d.arc, holder, units[i])) {
        if (!st.ok() || q == p) continue;
        if (!d.have[q]) {
          st = Status::NotFound("piece " + std::to_string(q) + ", which parity unit " +
                                std::to_string(units[i]) + " of " + R(d.members[holder]) +
                                " also holds, is missing too");
          continue;
        }
        redundancy::XorInto(unit, out + q * d.piece_bytes, PieceBytes(d, q));
      }
      if (st.ok()) {
        st = format::CheckXxh3(unit, PieceBytes(d, p), d.piece_xxh3[p],
                               "piece " + std::to_string(p) + " decoded from parity unit " +
                                   std::to_string(units[i]) + " of " + R(d.members[holder]));
        if (st.code() == CKPTDB_ECORRUPT) plan->chunk_failures++;
      }
      if (!st.ok()) {
        if (last_problem_.empty()) last_problem_ = st.message();
        continue;
      }
      std::memcpy(out + p * d.piece_bytes, unit, PieceBytes(d, p));
      d.have[p] = true;
      served += PieceBytes(d, p);
    }
    // "aec:rank2": pieces decoded from the parity units rank 2 keeps.
    plan->Served("aec:rank" + std::to_string(d.members[holder]), served);
  }
}

}  // namespace ckpt::engine
