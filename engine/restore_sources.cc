// The restore planner's sources (Db::RestoreSource, db.h; DESIGN.md section 7): a tier of this
// rank, peers' replicas, a coding group's rebuild, and the slices an "arc" replica group's
// members keep, in the order RestoreOrder gives. Db::Restore (read.cc) asks each in turn for the
// chunks still pending and turns what is left into its answer.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/db.h"
#include "engine/internal.h"

namespace ckpt::engine {

// A tier of this rank: its copy of the segment, opened once per version (ReadSegment), the
// tensor laid out from its manifest when no earlier source did, the pending chunks read and
// checked (a ram copy pinned while it is read).
class Db::TierSource final : public Db::RestoreSource {
 public:
  TierSource(Db* db, size_t tier) : db_(db), tier_(tier) {}
  std::string TierName() const override { return db_->tiers_[tier_].name(); }

  Status Read(RestoreCall* call) override {
    RestorePlan& plan = *call->plan;
    OpenSegment* seg = nullptr;
    Status st = db_->ReadSegment(call->version, tier_, &seg);
    if (!st.ok()) {
      plan.Note(st.message());
      return Status::Ok();
    }
    RamPin pin(db_, call->version, db_->tiers_[tier_].is_ram());
    st = db_->LayOut(seg->reader->manifest(), call->name, call->nbytes, seg->reader->what(), &plan);
    if (st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESIZE) return st;
    if (!st.ok()) {
      plan.Note(st.message());
      return Status::Ok();
    }
    std::vector<uint32_t> failed;
    uint64_t& read = call->read_by_tier[tier_];
    const uint64_t before = read;
    std::vector<uint64_t> offsets;
    for (uint32_t c : plan.pending) offsets.push_back(plan.dst_offset[c - plan.first]);
    Status rs = db_->ReadChunks(seg, plan, plan.pending, offsets, call->out, &failed, &read);
    pin.Release();
    if (!rs.ok()) {
      // Nothing in the buffer can be vouched for after a queue failure.
      if (call->nbytes > 0) std::memset(call->out, 0, call->nbytes);
      return rs.WithContext(plan.what + " (the buffer is zeroed)");
    }
    plan.chunk_failures += failed.size();
    plan.Served(db_->tiers_[tier_].name(), read - before);
    plan.pending = std::move(failed);
    return Status::Ok();
  }

 private:
  Db* const db_;
  const size_t tier_;
};

// Peers' replicas of this rank's segment (replicate:M), in their memory or on a serving daemon.
class Db::PeerSource final : public Db::RestoreSource {
 public:
  explicit PeerSource(Db* db) : db_(db) {}
  Status Read(RestoreCall* call) override {
    Status st =
        db_->RestoreFromPeers(call->version, call->name, call->nbytes, call->out, call->plan);
    return st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESIZE ? st : Status::Ok();
  }

 private:
  Db* const db_;
};

// This rank's segment decoded from its coding group's other members and parity (ec:K+M, xor:K).
class Db::RebuildSource final : public Db::RestoreSource {
 public:
  explicit RebuildSource(Db* db) : db_(db) {}
  Status Read(RestoreCall* call) override {
    Status st =
        db_->RestoreFromRebuild(call->version, call->name, call->nbytes, call->out, call->plan);
    return st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESIZE ? st : Status::Ok();
  }

 private:
  Db* const db_;
};

// REFT's ARC: a member of an "arc" replica group whose own copy is lost lays its shard out from
// the group (in a job); a deduplicated shard's pieces other members keep are gathered once this
// rank's own are in (outside a job none can be: they are zeroed and counted missing). Last, and
// always asked: the pieces it gathers are not pending chunks of this rank's segment.
class Db::GroupSliceSource final : public Db::RestoreSource {
 public:
  explicit GroupSliceSource(Db* db) : db_(db) {}
  bool Done(const RestorePlan&) const override { return false; }
  Status Read(RestoreCall* call) override {
    RestorePlan& plan = *call->plan;
    if (!plan.laid_out && db_->cluster_ != nullptr) {
      CKPTDB_RETURN_IF_ERROR(db_->LayOutFromGroup(call->version, call->name, call->nbytes, &plan));
    }
    if (plan.dedup) {
      call->pieces_missing = db_->GatherDedupPieces(call->version, call->name, call->out, &plan);
    }
    return Status::Ok();
  }

 private:
  Db* const db_;
};

// REFT's AOR: a member of a "...+aor" group whose own copies are lost, or failed some chunks,
// reads its private shard (or those chunks) from the recomputed replica the member before it
// keeps; a replicated shard is then left to the group's slices (GroupSliceSource).
class Db::RecomputedSource final : public Db::RestoreSource {
 public:
  explicit RecomputedSource(Db* db) : db_(db) {}
  Status Read(RestoreCall* call) override {
    if (call->plan->dedup) return Status::Ok();  // a replicated shard's pieces: the group's
    return db_->RestoreFromRecomputed(call->version, call->name, call->nbytes, call->out,
                                      call->plan);
  }

 private:
  Db* const db_;
};

std::vector<std::unique_ptr<Db::RestoreSource>> Db::RestoreOrder(
    const std::vector<size_t>& candidates) {
  std::vector<std::unique_ptr<RestoreSource>> order;
  for (size_t ti : candidates) {
    if (tiers_[ti].is_ram()) order.push_back(std::make_unique<TierSource>(this, ti));
  }
  if (cluster_ != nullptr) {
    if (cluster_->Group()) {
      order.push_back(std::make_unique<RebuildSource>(this));
    } else {
      order.push_back(std::make_unique<PeerSource>(this));
    }
  }
  for (size_t ti : candidates) {
    if (!tiers_[ti].is_ram()) order.push_back(std::make_unique<TierSource>(this, ti));
  }
  if (cluster_ != nullptr) order.push_back(std::make_unique<RecomputedSource>(this));
  order.push_back(std::make_unique<GroupSliceSource>(this));
  return order;
}

}  // namespace ckpt::engine
