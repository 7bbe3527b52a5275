// Restoring from the job's memory (DESIGN.md section 7): a lost rank's segment fetched back from
// the peers that hold its replicas, an "arc" group's slices gathered from its members, and a
// coding group's member rebuilt from the others' units and parity.
#include <sys/mman.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "io/io.h"
#include "io/tier_spec.h"
#include "util/text.h"

namespace ckpt::engine {

// The restore planner's peer step (DESIGN.md section 7). The holders and each holder's manifest
// are asked once per version restored (a restore of a model is a call per tensor), then only the
// pending chunks of each tensor cross, several in flight, each checked against its xxh3 as it
// lands in out; what one holder cannot supply (gone, corrupt) is asked of the next.
Status Db::RestoreFromPeers(uint64_t version, const std::string& name, size_t nbytes, uint8_t* out,
                            RestorePlan* plan) {
  const std::string& what = plan->what;
  uint64_t manifest_xxh3 = 0;  // the catalog's, when this rank has the version's record
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it != versions_.end() && it->second.has_record) {
      manifest_xxh3 = it->second.record.manifest_xxh3;
    }
  }
  if (peer_replicas_version_ != version) {
    std::vector<ReplicaHolder> holders;
    Status st = cluster_->Holders(options_.rank, version, &holders).WithContext(what);
    if (!st.ok()) {
      plan->Note(st.message());
      return Status::Peer(st.message());
    }
    peer_replicas_.clear();
    for (ReplicaHolder& h : holders) peer_replicas_.emplace_back().holder = std::move(h);
    peer_replicas_version_ = version;
  }
  bool asked = false;
  for (PeerReplica& p : peer_replicas_) {
    if (plan->laid_out && plan->pending.empty()) break;
    if (p.failed) continue;
    asked = true;
    const ReplicaHolder& h = p.holder;
    const bool daemon = h.rank == kServeRank;
    const std::string source = daemon ? "serve:" + h.node_id : "peer:rank" + std::to_string(h.rank);
    const std::string src =
        (daemon ? "replica served by ckptdb serve" : "replica on rank " + std::to_string(h.rank)) +
        " (node " + h.node_id + ")";
    if (p.reader == nullptr) {
      uint64_t file_bytes = 0;
      Status st = cluster_->ReplicaBytes(h, options_.rank, version, &file_bytes);
      if (st.ok()) {
        st = format::SegmentReader::Open(
            what + " from " + src, file_bytes,
            [this, &h, version](uint64_t off, void* buf, size_t len) {
              return cluster_->Fetch(h, options_.rank, version, off, buf, len);
            },
            &p.reader);
      }
      if (st.ok() && manifest_xxh3 != 0 && p.reader->footer().manifest_xxh3 != manifest_xxh3) {
        st = Status::Corrupt(src + ": its manifest xxh3 " +
                             format::Hex64(p.reader->footer().manifest_xxh3) +
                             " differs from the catalog's " + format::Hex64(manifest_xxh3));
      }
      if (!st.ok()) {
        p.reader.reset();
        p.failed = true;
        plan->Note(st.message());
        continue;
      }
      p.prefetch = PrefetchReplica(h, version, p.reader->manifest());
    }
    const format::ManifestView& m = p.reader->manifest();
    Status st = LayOut(m, name, nbytes, src, plan);
    if (!st.ok()) {
      if (st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESIZE) return st;
      plan->Note(st.message());
      continue;
    }
    std::vector<Cluster::FetchRange> ranges;
    for (uint32_t c : plan->pending) {
      const fb::Chunk& chunk = m.chunk(c);
      const RestorePlan::ChunkPart part = plan->PartOf(chunk);
      ranges.push_back({chunk.record_offset() + format::kBlockBytes + part.offset,
                        out + plan->dst_offset[c - plan->first], part.bytes});
    }
    std::vector<Status> results;
    Status gone;
    if (p.prefetch != nullptr && p.prefetch->data() != nullptr) {
      // From the records fetched at the opening; each still checked below.
      results.assign(ranges.size(), Status::Ok());
      for (size_t i = 0; i < ranges.size(); ++i) {
        if (!p.prefetch->holds(ranges[i].offset, ranges[i].bytes)) {
          results[i] =
              Status::Corrupt(src + ": chunk at offset " + std::to_string(ranges[i].offset) +
                              " lies past the records fetched");
          continue;
        }
        std::memcpy(ranges[i].dst, p.prefetch->data() + ranges[i].offset, ranges[i].bytes);
      }
      uint64_t copied = 0;
      for (const Cluster::FetchRange& r : ranges) copied += r.bytes;
      p.prefetch->Served(copied);
    } else {
      gone = cluster_->FetchRanges(h, options_.rank, version, ranges, &results);
    }
    std::vector<uint64_t> xxh3s;
    for (uint32_t c : plan->pending) xxh3s.push_back(plan->PartOf(m.chunk(c)).xxh3);
    const std::vector<uint32_t> chunks = plan->pending;
    const uint64_t served = plan->KeepVerified(ranges, results, xxh3s, chunks, src, &last_problem_);
    if (!gone.ok()) {
      p.failed = true;  // vanished or timed out: not asked again for this version
      plan->Note(gone.message());
    }
    plan->Served(source, served);
  }
  if (!asked) {
    const std::string why = what +
                            ": no live peer holds a verified replica of this rank's segment" +
                            (peer_replicas_.empty() ? "" : " (every holder failed)");
    plan->Note(why);
    peer_replicas_version_ = 0;  // ask the coordinator again next time: holders may have come
    return Status::Peer(why);
  }
  return Status::Ok();
}

// The replica's chunk records, bytes [0, end of the last record), in one pipelined transfer;
// nullptr when the segment is larger than PeerPrefetch::kMaxBytes, the memory cannot be had or
// the transfer fails (the restores then fetch a tensor at a time, and report what fails).
std::unique_ptr<PeerPrefetch> Db::PrefetchReplica(const ReplicaHolder& h, uint64_t version,
                                                  const format::ManifestView& m) {
  uint64_t end = 0;
  uint64_t payload = 0;
  for (uint32_t c = 0; c < m.chunk_count(); ++c) {
    const fb::Chunk& chunk = m.chunk(c);
    end = std::max(end, chunk.record_offset() + format::kBlockBytes + chunk.payload_bytes());
    payload += chunk.payload_bytes();
  }
  auto prefetch = std::make_unique<PeerPrefetch>();
  if (end == 0 || end > PeerPrefetch::kMaxBytes || !prefetch->Allocate(end)) return nullptr;
  prefetch->set_payload_bytes(payload);
  std::vector<Status> results;
  Status st =
      cluster_->FetchRanges(h, options_.rank, version, {{0, prefetch->data(), end}}, &results);
  if (!st.ok() || results.empty() || !results[0].ok()) return nullptr;
  return prefetch;
}

bool PeerPrefetch::Allocate(uint64_t bytes) {
  Release();
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  (void)::madvise(p, bytes, MADV_HUGEPAGE);  // best effort
  data_ = static_cast<uint8_t*>(p);
  bytes_ = bytes;
  served_ = 0;
  return true;
}

void PeerPrefetch::Release() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

void Db::LearnArcVersions() {
  std::vector<uint64_t> newest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = versions_.rbegin(); it != versions_.rend() && newest.size() < kMaxArcReports;
         ++it) {
      if (it->second.record.state == CKPTDB_STATE_COMMITTED) newest.push_back(it->first);
    }
  }
  for (uint64_t version : newest) {
    // A copy that cannot be read is not reported: the coordinator then counts only its own.
    (void)WithManifest(version, "reading " + V(version) + "'s replica group",
                       [&](const format::ManifestView& m, size_t) {
                         if (const fb::Replicas* g = m.root().replicas()) {
                           const auto kept = static_cast<uint8_t>(g->protection());
                           const uint8_t aor = g->recomputed() ? format::kProtectionAor : 0;
                           std::lock_guard<std::mutex> lock(mu_);
                           arc_versions_[version] = {g->group(),
                                                     {g->members()->begin(), g->members()->end()},
                                                     g->replicated_only(),
                                                     static_cast<uint8_t>(kept | aor)};
                         }
                         return Status::Ok();
                       });
  }
}

namespace {

// The xxh3 of every piece of shard `t` cut in piece_bytes pieces (xxh3 may be null), and the
// chunk of m holding each piece t keeps: a deduplicated shard's slices, or every piece of one
// kept whole. False when a whole shard's chunks are not cut so.
bool PiecesOf(const format::ManifestView& m, const fb::Tensor& t, uint64_t piece_bytes,
              std::vector<uint64_t>* xxh3, std::map<uint64_t, uint32_t>* chunk_of) {
  uint32_t c = t.first_chunk();
  if (t.packed()) return false;  // a private shard: replicated ones are never packed
  if (t.full_bytes() != 0) {
    if (xxh3 != nullptr) xxh3->assign(t.piece_xxh3()->begin(), t.piece_xxh3()->end());
    for (uint64_t piece : format::KeptPieces(t, piece_bytes)) (*chunk_of)[piece] = c++;
    return true;
  }
  if (xxh3 != nullptr) xxh3->clear();
  for (uint32_t i = 0; i < t.chunk_count(); ++i, ++c) {
    const uint64_t bytes = m.chunk(c).payload_bytes();
    if (bytes != std::min(piece_bytes, t.bytes() - uint64_t{i} * piece_bytes)) return false;
    if (xxh3 != nullptr) xxh3->push_back(m.chunk(c).xxh3());
    (*chunk_of)[i] = c;
  }
  return true;
}

}  // namespace

Status Db::OpenArcMember(uint64_t version, uint32_t owner, const ReplicaHolder& holder,
                         const std::vector<uint32_t>& members, uint64_t piece_bytes,
                         const std::string& what, ArcMember** out) {
  ForgetArcStateUnless(version);
  ArcMember& a = arc_members_[{owner, holder.address}];
  *out = &a;
  const bool own = holder.rank == owner;
  const std::string src = own ? "the segment of " + R(owner) + " (of this rank's replica group)"
                              : "the replica of " + R(owner) + "'s segment on " +
                                    (holder.rank == kServeRank ? "ckptdb serve" : R(holder.rank));
  if (a.failed) return Status::Peer(src + " failed earlier in this version's restore");
  if (a.reader != nullptr) return Status::Ok();
  a.holder = holder;
  uint64_t file_bytes = 0;
  Status st = cluster_->ReplicaBytes(holder, owner, version, &file_bytes, own);
  if (st.ok()) {
    st = format::SegmentReader::Open(
        what + " from " + src, file_bytes,
        [this, holder, owner, version, own](uint64_t off, void* buf, size_t len) {
          return cluster_->Fetch(holder, owner, version, off, buf, len, own);
        },
        &a.reader);
  }
  if (st.ok()) {
    // The member's own segment of the same group (members empty: of any group holding this rank
    // and the member): the member at its place in it.
    const fb::Replicas* g = a.reader->manifest().root().replicas();
    bool same = g != nullptr;
    if (same && members.empty()) {
      const auto* list = g->members();
      same = g->position() < list->size() && list->Get(g->position()) == owner &&
             std::find(list->begin(), list->end(), options_.rank) != list->end();
    } else if (same) {
      const auto position =
          static_cast<uint32_t>(std::find(members.begin(), members.end(), owner) - members.begin());
      same = g->position() == position && g->piece_bytes() == piece_bytes &&
             std::equal(members.begin(), members.end(), g->members()->begin(), g->members()->end());
    }
    if (!same) st = Status::Corrupt(src + " is not of this rank's replica group");
  }
  if (!st.ok()) {
    a.reader.reset();
    a.failed = true;
    return st.WithContext(what);
  }
  return Status::Ok();
}

Status Db::LayOutFromGroup(uint64_t version, const std::string& name, size_t nbytes,
                           RestorePlan* plan) {
  std::vector<uint32_t> declared;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!replica_group_ || !replica_group_->dedup()) {
      return Status::Ok();  // nothing to lay out from: the caller reports the missing copy
    }
    declared = replica_group_->members;
  }
  // The group and its piece size as the version recorded them, from the first member that has
  // it (the declaration only says whom to ask).
  for (uint32_t rank : declared) {
    if (rank == options_.rank) continue;
    ReplicaHolder holder;
    ArcMember* member = nullptr;
    Status st = cluster_->MemberAt(rank, &holder);
    if (st.ok()) st = OpenArcMember(version, rank, holder, {}, 0, plan->what, &member);
    if (!st.ok()) {
      plan->Note(st.message());
      continue;
    }
    const format::ManifestView& m = member->reader->manifest();
    const fb::Replicas& g = *m.root().replicas();
    if (!g.replicated_only()) {
      // Written with the job's redundancy: members kept private shards, which no other
      // member's manifest lists; this rank's own segment comes from its replicas or not at all.
      plan->Note(R(rank) + "'s segment of the version was written with the job's redundancy: " +
                 "a member's lost segment is not its group's slices");
      return Status::Ok();
    }
    // Every member put the same replicated shards (compared at commit), and this rank put no
    // others (an "arc" group without redundancy refuses them): a member's list is this rank's.
    const std::vector<uint32_t> members(g.members()->begin(), g.members()->end());
    const fb::Tensor* t = m.Find(name);
    if (t != nullptr && g.recomputed() && !t->replicated()) {
      // With AOR a member puts private shards too: another member's by this name is not this
      // rank's (its own come from the recomputed replica the member before it keeps).
      return Status::NotFound(
          plan->what +
          ": this rank's own copy is lost, the shard is not replicated in "
          "replica group [" +
          JoinRanks(std::vector<uint32_t>(g.members()->begin(), g.members()->end())) +
          "], and no recomputed replica of it could be read (" + plan->errors + ")");
    }
    if (t == nullptr) {
      return Status::NotFound(plan->what +
                              ": this rank's own copy is lost and the version has no replicated "
                              "shard by that name in replica group [" +
                              JoinRanks(members) + "]");
    }
    if (format::ShardBytes(*t) != nbytes) {
      return Status::Size(plan->what + ": the tensor is " + std::to_string(format::ShardBytes(*t)) +
                          " bytes, the buffer is " + std::to_string(nbytes));
    }
    RestorePlan::Dedup d;
    std::map<uint64_t, uint32_t> chunk_of;
    if (!PiecesOf(m, *t, g.piece_bytes(), &d.piece_xxh3, &chunk_of)) {
      plan->Note(R(rank) + " cuts " + QuoteName(name) + " in other pieces");
      continue;
    }
    d.full_bytes = format::ShardBytes(*t);
    d.piece_bytes = g.piece_bytes();
    d.members = members;
    d.position = static_cast<uint32_t>(std::find(members.begin(), members.end(), options_.rank) -
                                       members.begin());
    d.arc = g.protection() != fb::ReplicaProtection::Aec;
    d.aec = g.protection() == fb::ReplicaProtection::Aec ||
            g.protection() == fb::ReplicaProtection::ArcAec;
    d.have.assign(d.piece_xxh3.size(), false);
    plan->laid_out = true;
    plan->first = 0;
    plan->count = 0;
    plan->dedup = std::move(d);
    plan->Note("this rank's own copy is lost: the shard is laid out from " + R(rank) +
               "'s manifest");
    return Status::Ok();
  }
  RetryArcMembers();
  return Status::Ok();
}

void Db::ForgetArcStateUnless(uint64_t version) {
  if (arc_version_ == version) return;
  arc_members_.clear();
  arc_holders_.clear();
  arc_version_ = version;
}

void Db::RetryArcMembers() {
  // At most every 5 s: a member that is gone for good would be dialled again by every tensor.
  const uint64_t now = MonoNs();
  if (now < arc_retry_after_ns_) return;
  arc_retry_after_ns_ = now + uint64_t{5'000'000'000};
  for (auto& [key, member] : arc_members_) member.failed = false;
  arc_holders_.clear();  // replicas may have moved
}

// Slice s's missing pieces of a deduplicated shard from member q's segment on `holder` (the
// member itself or a holder of its replica), each checked against this rank's xxh3 of it.
void Db::GatherSlice(uint64_t version, const std::string& name, uint8_t* out, RestorePlan* plan,
                     uint32_t s, uint32_t q, const ReplicaHolder& holder) {
  RestorePlan::Dedup& d = *plan->dedup;
  const std::string& what = plan->what;
  const auto count = static_cast<uint32_t>(d.members.size());
  const uint64_t n = d.piece_xxh3.size();
  ArcMember* member = nullptr;
  Status st = OpenArcMember(version, d.members[q], holder, d.members, d.piece_bytes, what, &member);
  if (!st.ok()) {
    plan->Note(st.message());
    return;
  }
  const std::string src = "slice " + std::to_string(s) + " of " + R(d.members[q]) +
                          (holder.rank == d.members[q] ? "" : " (a replica)");
  const format::ManifestView& m = member->reader->manifest();
  const fb::Tensor* t = m.Find(name);
  std::vector<uint64_t> xxh3;
  std::map<uint64_t, uint32_t> chunk_of;
  if (t == nullptr || format::ShardBytes(*t) != d.full_bytes ||
      !PiecesOf(m, *t, d.piece_bytes, &xxh3, &chunk_of) || xxh3 != d.piece_xxh3) {
    plan->Note(src + ": its shard " + QuoteName(name) + " is not this rank's replica of it");
    return;
  }
  std::vector<Cluster::FetchRange> ranges;
  std::vector<uint64_t> pieces;
  const auto [first, end] = format::SlicePieces(n, count, s);
  for (uint64_t p = first; p < end; ++p) {
    auto it = chunk_of.find(p);
    if (d.have[p] || it == chunk_of.end()) continue;
    const fb::Chunk& chunk = m.chunk(it->second);
    ranges.push_back({chunk.record_offset() + format::kBlockBytes, out + p * d.piece_bytes,
                      chunk.payload_bytes()});
    pieces.push_back(p);
  }
  std::vector<Status> results;
  Status gone = cluster_->FetchRanges(member->holder, d.members[q], version, ranges, &results,
                                      holder.rank == d.members[q]);
  uint64_t served = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    Status cs = results[i];
    if (cs.ok()) {
      cs = format::CheckXxh3(ranges[i].dst, ranges[i].bytes, d.piece_xxh3[pieces[i]],
                             "piece " + std::to_string(pieces[i]) + " of " + src);
    }
    if (cs.ok()) {
      d.have[pieces[i]] = true;
      served += ranges[i].bytes;
    } else if (cs.code() == CKPTDB_ECORRUPT) {
      plan->chunk_failures++;
      if (last_problem_.empty()) last_problem_ = cs.message();
    }
  }
  if (!gone.ok()) {
    member->failed = true;  // vanished or timed out: not asked again for this version
    plan->Note(gone.message());
  }
  // "arc:rank2", or "arc:rank2@rank3" for rank 2's segment read from a replica on rank 3.
  plan->Served("arc:rank" + std::to_string(d.members[q]) +
                   (holder.rank == d.members[q] ? ""
                    : holder.rank == kServeRank ? "@serve:" + holder.node_id
                                                : "@rank" + std::to_string(holder.rank)),
               served);
}

// Every slice from the member that owns it (the load spread over the group), then what is still
// missing from the member before it, which keeps its ARC copy, then (a job with replicas) from
// holders of either one's replica, then (AEC) decoded from the members' parity units. A piece is
// used only when it matches this rank's own xxh3 of it (taken from its own replica at capture;
// from a member's manifest when its own is lost).
void Db::GatherSlices(uint64_t version, const std::string& name, uint8_t* out, RestorePlan* plan) {
  RestorePlan::Dedup& d = *plan->dedup;
  if (cluster_ == nullptr) {
    plan->Note(
        "the other members' slices of this deduplicated shard are read from their "
        "segments, which needs the job (world_size > 1)");
    return;
  }
  ForgetArcStateUnless(version);
  const auto count = static_cast<uint32_t>(d.members.size());
  const uint64_t n = d.piece_xxh3.size();
  auto missing = [&](uint32_t s) {
    const auto [first, end] = format::SlicePieces(n, count, s);
    for (uint64_t p = first; p < end; ++p) {
      if (!d.have[p]) return true;
    }
    return false;
  };
  for (int pass = 0; pass < (d.arc ? 2 : 1); ++pass) {
    for (uint32_t s = 0; s < count; ++s) {
      const uint32_t q = pass == 0 ? s : (s + count - 1) % count;
      if (q == d.position || !missing(s)) continue;
      ReplicaHolder holder;
      Status st = cluster_->MemberAt(d.members[q], &holder);
      if (st.ok()) {
        GatherSlice(version, name, out, plan, s, q, holder);
      } else {
        plan->Note(st.message());
      }
    }
  }
  if (cluster_->options().replicas > 1) {
    for (uint32_t s = 0; s < count; ++s) {
      for (uint32_t q : {s, (s + count - 1) % count}) {
        if (q == d.position || !missing(s) || (q != s && !d.arc)) continue;
        // Asked of the coordinator once per member and version, not per tensor.
        auto known = arc_holders_.find(d.members[q]);
        if (known == arc_holders_.end()) {
          std::vector<ReplicaHolder> holders;
          Status st = cluster_->Holders(d.members[q], version, &holders);
          if (!st.ok()) {
            plan->Note(st.message());
            continue;
          }
          known = arc_holders_.emplace(d.members[q], std::move(holders)).first;
        }
        for (const ReplicaHolder& h : known->second) {
          if (missing(s)) GatherSlice(version, name, out, plan, s, q, h);
        }
      }
    }
  }
  bool any_missing = false;
  for (uint32_t s = 0; s < count && !any_missing; ++s) any_missing = missing(s);
  if (d.aec && any_missing) DecodeSlices(version, name, out, plan);
  // Members that failed are skipped for the rest of this version's tensors while restores
  // succeed; one that fails lets a later call ask them again (they may be back).
  for (uint32_t s = 0; s < count; ++s) {
    if (missing(s)) {
      RetryArcMembers();
      break;
    }
  }
}

// The ram copy only: a coding group protects the copies in memory, and a member that has its
// version only on a slower tier is as good as lost for a rebuild (the rebuilder tries others).
// Pinned while it is read, without read_mu_: a rank's restore may be waiting on a peer that is
// reading from this one.
Status Db::ReadOwnSegment(uint64_t version, uint64_t offset, uint64_t bytes, uint8_t* out) {
  RamImage image;
  const RamTier* ram = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ram_images_.find(version);
    if (tiers_.empty() || !tiers_[0].is_ram() || it == ram_images_.end()) {
      return Status::NotFound(V(version) + " is not in this rank's ram tier");
    }
    image = it->second;
    ram = tiers_[0].ram.get();
    Pin(version);
  }
  Status st = offset > image.file_bytes || bytes > image.file_bytes - offset
                  ? Status::Invalid(V(version) + ": the range [" + std::to_string(offset) + ", +" +
                                    std::to_string(bytes) + ") is past its " +
                                    std::to_string(image.file_bytes) + " bytes")
                  : ram->ReadAt(image, offset, out, bytes, "ram copy of " + V(version));
  std::lock_guard<std::mutex> lock(mu_);
  Unpin(version);
  return st;
}

// The restore planner's rebuild step: this rank's segment decoded from its coding group (the
// other members' units and the parity they hold), opened once per version, its units decoded
// once. Each pending chunk read from it is checked against its xxh3; one that fails is decoded
// again from another choice of blocks (a survivor's corrupt unit or parity block is an erasure
// too) before it stays pending for the slower tiers.
Status Db::RestoreFromRebuild(uint64_t version, const std::string& name, size_t nbytes,
                              uint8_t* out, RestorePlan* plan) {
  const std::string& what = plan->what;
  if (rebuild_version_ != version || rebuild_ == nullptr) {
    rebuild_.reset();
    rebuild_reader_.reset();
    rebuild_version_ = version;
    std::unique_ptr<Cluster::Rebuild> rebuild;
    Status st = cluster_->OpenRebuild(version, &rebuild);
    // A survivor's corrupt unit in the header, manifest or footer fails the open: the blocks
    // are chosen again, a few times.
    for (int attempt = 0; st.ok(); ++attempt) {
      Cluster::Rebuild* r = rebuild.get();
      st = format::SegmentReader::Open(
          what + " (rebuilt from its coding group)", r->file_bytes(),
          [r](uint64_t off, void* buf, size_t len) { return r->Read(off, buf, len); },
          &rebuild_reader_);
      if (st.code() != CKPTDB_ECORRUPT || attempt == 3 || !r->Retry(0, r->file_bytes())) break;
      st = Status::Ok();
    }
    uint64_t manifest_xxh3 = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = versions_.find(version);
      if (it != versions_.end() && it->second.has_record) {
        manifest_xxh3 = it->second.record.manifest_xxh3;
      }
    }
    if (st.ok() && manifest_xxh3 != 0 && rebuild_reader_->footer().manifest_xxh3 != manifest_xxh3) {
      st = Status::Corrupt(what + ": the rebuilt segment's manifest xxh3 " +
                           format::Hex64(rebuild_reader_->footer().manifest_xxh3) +
                           " differs from the catalog's " + format::Hex64(manifest_xxh3));
    }
    if (!st.ok()) {
      rebuild_reader_.reset();
      rebuild_version_ = 0;  // members may come back: try again next time
      plan->Note(st.message());
      return Status::Peer(st.message());
    }
    rebuild_ = std::move(rebuild);
  } else {
    rebuild_->Refresh();  // members that failed a restore before may be back
  }
  const format::ManifestView& m = rebuild_reader_->manifest();
  Status st = LayOut(m, name, nbytes, "rebuilt segment", plan);
  if (!st.ok()) {
    if (st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESIZE) return st;
    plan->Note(st.message());
    return Status::Ok();
  }
  std::vector<uint32_t> failed;
  uint64_t served = 0;
  for (uint32_t c : plan->pending) {
    const RestorePlan::ChunkPart part = plan->PartOf(m.chunk(c));
    uint8_t* dst = out + plan->dst_offset[c - plan->first];
    const uint64_t offset = m.chunk(c).record_offset() + format::kBlockBytes + part.offset;
    Status cs;
    // Bounded: Retry says when no other choice of blocks is left.
    for (bool again = true; again;) {
      cs = rebuild_->Read(offset, dst, part.bytes);
      if (cs.ok()) {
        cs = format::CheckXxh3(dst, part.bytes, part.xxh3,
                               "chunk " + std::to_string(c) + " rebuilt");
      }
      again = cs.code() == CKPTDB_ECORRUPT && rebuild_->Retry(offset, part.bytes);
      if (again) plan->chunk_failures++;
    }
    if (cs.ok()) {
      served += part.bytes;
      continue;
    }
    failed.push_back(c);
    if (last_problem_.empty()) last_problem_ = cs.message();
    plan->Note(cs.message());
  }
  plan->Served(rebuild_->Source(), served);
  plan->pending = std::move(failed);
  return Status::Ok();
}

}  // namespace ckpt::engine
