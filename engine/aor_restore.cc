// REFT's AOR at restore (DESIGN.md section 7; docs/format.md, "Recomputed replicas"): a member
// of a replica group declared with "...+aor" keeps, under format::kRecomputedPrefix, the replica
// of the next member's private shards that it brought forward itself (the owner's optimizer
// update applied to a host copy). The commit compared each one with its owner's shard, digest
// for digest, so a member that lost its own copies reads them from there, every chunk checked
// against the keeper's hash of it.
#include <string>
#include <vector>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "util/text.h"

namespace ckpt::engine {

Status Db::RestoreFromRecomputed(uint64_t version, const std::string& name, size_t nbytes,
                                 uint8_t* out, RestorePlan* plan) {
  uint32_t keeper = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!replica_group_ || !replica_group_->aor) return Status::Ok();
    keeper = replica_group_->Before(options_.rank);
  }
  ReplicaHolder holder;
  ArcMember* member = nullptr;
  Status st = cluster_->MemberAt(keeper, &holder);
  if (st.ok()) st = OpenArcMember(version, keeper, holder, {}, 0, plan->what, &member);
  if (!st.ok()) {
    plan->Note("no recomputed replica: " + st.message());
    return Status::Ok();
  }
  const format::ManifestView& m = member->reader->manifest();
  const fb::Replicas* g = m.root().replicas();
  const std::string stored = std::string(format::kRecomputedPrefix) + name;
  // The keeper's replicas are of the member after it in the group the version recorded (which
  // the declaration now need not repeat): that member must be this rank.
  const uint32_t count = g != nullptr ? g->members()->size() : 0;
  if (g == nullptr || !g->recomputed() ||
      g->members()->Get((g->position() + 1) % count) != options_.rank) {
    plan->Note(R(keeper) + "'s segment of the version keeps no recomputed replicas of this " +
               "rank's shards (its replica group recorded no AOR, or another member after it)");
    return Status::Ok();
  }
  const fb::Tensor* t = m.Find(stored);
  if (t == nullptr) {
    // A replicated shard (laid out from the group next): nothing recomputed by this name.
    plan->Note(R(keeper) + " keeps no recomputed replica of this rank's " + QuoteName(name));
    return Status::Ok();
  }
  const std::string src = R(keeper) + "'s recomputed replica";
  // Where each pending chunk of the plan lies in the keeper's replica: all of them when this
  // rank has no copy of its own; when its own copy was laid out but some chunks failed, the
  // same chunks of the replica, cut alike (the commit compared their hashes one by one).
  std::vector<uint32_t> theirs;
  if (!plan->laid_out) {
    CKPTDB_RETURN_IF_ERROR(LayOut(m, stored, nbytes, src, plan));
    theirs = plan->pending;
  } else {
    if (plan->packed || plan->dedup || t->packed() || t->chunk_count() != plan->count ||
        format::ShardBytes(*t) != nbytes) {
      plan->Note(src + " is cut in other chunks than this rank's copy");
      return Status::Ok();
    }
    for (uint32_t c : plan->pending) {
      const uint32_t i = c - plan->first;
      if (m.chunk(t->first_chunk() + i).payload_bytes() != plan->chunk_bytes[i]) {
        plan->Note(src + " is cut in other chunks than this rank's copy");
        return Status::Ok();
      }
      theirs.push_back(t->first_chunk() + i);
    }
  }
  std::vector<Cluster::FetchRange> ranges;
  for (size_t i = 0; i < theirs.size(); ++i) {
    const fb::Chunk& chunk = m.chunk(theirs[i]);
    ranges.push_back({chunk.record_offset() + format::kBlockBytes,
                      out + plan->dst_offset[plan->pending[i] - plan->first],
                      chunk.payload_bytes()});
  }
  std::vector<Status> results;
  Status gone = cluster_->FetchRanges(member->holder, keeper, version, ranges, &results,
                                      /*any_tier=*/true);
  std::vector<uint64_t> xxh3s;
  for (uint32_t c : theirs) xxh3s.push_back(m.chunk(c).xxh3());
  const uint64_t served = plan->KeepVerified(ranges, results, xxh3s, theirs, src, &last_problem_);
  if (!gone.ok()) {
    member->failed = true;
    plan->Note(gone.message());
  }
  plan->Served("aor:rank" + std::to_string(keeper), served);
  return Status::Ok();
}

}  // namespace ckpt::engine
