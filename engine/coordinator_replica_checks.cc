// The coordinator's side of replica groups (ckptdb_declare_replicas; coordinator.h): each
// member's digests of its replicated shards, compared once every member has sent its own; a
// mismatch fails the version for every member, naming the shard and the ranks.
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/cluster_internal.h"
#include "engine/coordinator.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "util/text.h"

namespace ckpt::engine {

using namespace cluster_internal;

namespace {

constexpr size_t kMaxReplicaChecks = 256;
constexpr uint32_t kMaxReplicaDigests = uint32_t{1} << 24;

// A member's digests of one kind, in name order (the member sorted them by kind, then name).
std::vector<ReplicaDigest> OfKind(const std::vector<ReplicaDigest>& all, uint8_t kind) {
  std::vector<ReplicaDigest> out;
  for (const ReplicaDigest& d : all) {
    if (d.kind == kind) out.push_back(d);
  }
  return out;
}

}  // namespace

// REFT's AOR: each member's private shards against the recomputed replicas the member before it
// keeps of them, name by name. Every replica must equal its owner's shard bit for bit (its
// digest); in a job without redundancy every private shard must have one, since a member's lost
// node is then restored from its group alone.
Status Coordinator::CompareRecomputed(const ReplicaCheckState& c, const std::string& what) const {
  const bool every = options_.replicas <= 1 && !options_.code;
  const auto count = c.members.size();
  for (size_t q = 0; q < count; ++q) {
    const uint32_t owner = c.members[q];
    const uint32_t keeper = c.members[(q + count - 1) % count];
    const std::vector<ReplicaDigest> own = OfKind(c.posted.at(owner), ReplicaDigest::kPrivate);
    const std::vector<ReplicaDigest> kept = OfKind(c.posted.at(keeper), ReplicaDigest::kRecomputed);
    std::map<std::string_view, const ReplicaDigest*> by_name;
    for (const ReplicaDigest& o : own) by_name.emplace(o.name, &o);
    for (const ReplicaDigest& r : kept) {
      auto it = by_name.find(r.name);
      if (it == by_name.end()) {
        return Status::Corrupt(what + ": " + R(keeper) + " put a recomputed replica of " +
                               QuoteName(r.name) + ", which " + R(owner) +
                               " did not put as a private shard; the version is not committed");
      }
      const ReplicaDigest& o = *it->second;
      if (o.bytes != r.bytes || o.digest != r.digest) {
        return Status::Corrupt(
            what + ": " + R(keeper) + "'s recomputed replica of " + R(owner) + "'s shard " +
            QuoteName(r.name) + " differs from it: " + std::to_string(r.bytes) +
            " bytes of digest " + format::Hex64(r.digest) + " against " + std::to_string(o.bytes) +
            " bytes of digest " + format::Hex64(o.digest) +
            " (the recomputation is not the owner's update); the version is not committed");
      }
      by_name.erase(it);
    }
    if (every && !by_name.empty()) {
      return Status::Corrupt(
          what + ": " + R(owner) + "'s private shard " + QuoteName(by_name.begin()->first) +
          " has no recomputed replica on " + R(keeper) +
          " (in a job without redundancy every private shard of a member of an \"" +
          format::ProtectionName(c.protection) +
          "\" group needs one, put with CKPTDB_PUT_RECOMPUTED); the version is not committed");
    }
  }
  return Status::Ok();
}

void Coordinator::HandleReplicaCheck(const Request& request, Reply* reply) {
  WireReader r(request.body, "replica check from " + request.peer);
  const uint64_t version = r.U64("version");
  const uint32_t group = r.U32("group");
  const uint32_t rank = r.U32("rank");
  const bool poll = r.U8("poll") != 0;
  Status st = r.Finish();
  if (!st.ok()) return Fail(reply, st);
  if (poll) {
    // Only the answer: from the comparison this member's list went into.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = replica_checks_.find(std::make_pair(version, group));
    const bool known = it != replica_checks_.end() &&
                       std::find(it->second.members.begin(), it->second.members.end(), rank) !=
                           it->second.members.end() &&
                       (it->second.result || it->second.posted.count(rank));
    if (!known) {
      return Fail(reply, Status::NotFound("v" + std::to_string(version) + ": replica group " +
                                          std::to_string(group) + ": no list of " + R(rank) +
                                          " here; send it again"));
    }
    return AnswerReplicaCheckLocked(version, group, &it->second, reply);
  }
  WireReader p(request.payload, "replica digests from " + R(rank));
  const uint64_t chunk_bytes = p.U64("chunk_bytes");
  const uint8_t protection = p.U8("protection");
  const uint32_t n = p.U32("members");
  const uint8_t kept = protection & 3;  // the replicated shards' scheme; bit 4: REFT's AOR
  if (n < 2 || n > format::kMaxReplicaMembers || protection > 7 ||
      (protection >= format::kProtectionAor && kept == 0) || (kept >= 2 && n < 3)) {
    return Fail(reply, Status::Invalid(R(rank) + ": a replica group of " + std::to_string(n) +
                                       " with protection " + std::to_string(protection)));
  }
  std::vector<uint32_t> members;
  for (uint32_t i = 0; i < n && p.ok(); ++i) members.push_back(p.U32("member"));
  const uint32_t count = p.U32("digests");
  if (count > kMaxReplicaDigests) {
    return Fail(reply, Status::Invalid(R(rank) + ": " + std::to_string(count) + " digests"));
  }
  std::vector<ReplicaDigest> digests;
  for (uint32_t i = 0; i < count && p.ok(); ++i) {
    ReplicaDigest d;
    d.name = p.Str("name", CKPTDB_MAX_NAME_BYTES);
    d.bytes = p.U64("bytes");
    d.digest = p.U64("digest");
    d.kind = p.U8("kind");
    if (p.ok() && d.kind != ReplicaDigest::kReplicated &&
        (d.kind > ReplicaDigest::kRecomputed || !(protection & format::kProtectionAor))) {
      return Fail(reply, Status::Invalid(R(rank) + ": a digest of kind " + std::to_string(d.kind) +
                                         " with protection " + std::to_string(protection)));
    }
    digests.push_back(std::move(d));
  }
  st = p.Finish();
  if (st.ok() && (rank >= options_.world_size ||
                  std::find(members.begin(), members.end(), rank) == members.end())) {
    st = Status::Invalid(R(rank) + " is not a member of the replica group it reports for");
  }
  if (!st.ok()) return Fail(reply, st);
  const std::string what = "v" + std::to_string(version) + ": replica group " +
                           std::to_string(group) + " (ranks " + RankList(members) + ")";
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(version, group);
  auto it = replica_checks_.find(key);
  if (decisions_.Aborted(version)) return AnswerReplicaCheckLocked(version, group, nullptr, reply);
  if (it == replica_checks_.end()) {
    // Bounded: decided comparisons go first, oldest first; an undecided one only past the cap
    // (one per group for many versions in flight).
    const size_t cap = std::max<size_t>(kMaxReplicaChecks, 4 * size_t{options_.world_size});
    for (auto old = replica_checks_.begin();
         replica_checks_.size() >= cap && old != replica_checks_.end();) {
      old = old->second.result ? replica_checks_.erase(old) : std::next(old);
    }
    while (replica_checks_.size() >= cap) replica_checks_.erase(replica_checks_.begin());
    it = replica_checks_
             .emplace(key, ReplicaCheckState{members, protection, chunk_bytes, {}, std::nullopt})
             .first;
  }
  ReplicaCheckState& c = it->second;
  // Every post is held against the group as first reported, decided or not.
  if (c.members != members) {
    Status mismatch =
        Status::Corrupt(what + ": " + R(rank) + " declared the group as ranks " +
                        RankList(members) + ", another member as ranks " + RankList(c.members));
    if (!c.result) c.result = mismatch;
    c.posted.clear();
    return Fail(reply, mismatch);
  }
  if (!c.result) {
    if (c.protection != protection) {
      c.result = Status::Corrupt(what + ": " + R(rank) + " declared protection '" +
                                 format::ProtectionName(protection) + "', another member '" +
                                 format::ProtectionName(c.protection) +
                                 "' (every member must declare one)");
      c.posted.clear();
    } else if (c.chunk_bytes != chunk_bytes) {
      c.result = Status::Corrupt(what + ": " + R(rank) + " cuts its shards in chunks of " +
                                 std::to_string(chunk_bytes) + " bytes, another member in " +
                                 std::to_string(c.chunk_bytes) + " (the digests need one size)");
      c.posted.clear();
    } else {
      c.posted[rank] = std::move(digests);
    }
  }
  AnswerReplicaCheckLocked(version, group, &c, reply);
}

void Coordinator::AnswerReplicaCheckLocked(uint64_t version, uint32_t group,
                                           ReplicaCheckState* check, Reply* reply) {
  const std::string what = "v" + std::to_string(version) + ": replica group " +
                           std::to_string(group) +
                           (check != nullptr ? " (ranks " + RankList(check->members) + ")" : "");
  if (decisions_.Aborted(version) && (check == nullptr || !check->result || check->result->ok())) {
    // A member that learned of the abort first never reports: the others stop waiting for it.
    // A comparison that failed keeps its answer (the abort's cause); one that passed does not
    // send a member on to protect a version the job has given up.
    const std::string* cause = decisions_.AbortCause(version);
    return Fail(reply, Status::State(what + ": the version was aborted" +
                                     (cause != nullptr ? ": " + *cause : "")));
  }
  ReplicaCheckState& c = *check;
  if (!c.result) {
    // A member declared dead will never report: the others are told now, not at their timeout.
    for (uint32_t m : c.members) {
      if (members_[m].dead) {
        c.result = Status::State(what + ": " + R(m) + " was declared dead");
        c.posted.clear();
        break;
      }
    }
  }
  if (!c.result && c.posted.size() == c.members.size()) {
    // Every member is in: each one's list against the first member's, shard by shard.
    const uint32_t first = c.members.front();
    const std::vector<ReplicaDigest> want = OfKind(c.posted.at(first), ReplicaDigest::kReplicated);
    Status result;
    for (uint32_t other : c.members) {
      const std::vector<ReplicaDigest> have =
          OfKind(c.posted.at(other), ReplicaDigest::kReplicated);
      if (have == want) continue;
      size_t i = 0;
      while (i < want.size() && i < have.size() && want[i] == have[i]) ++i;
      std::string why;
      if (i < want.size() && i < have.size() && want[i].name == have[i].name) {
        why = "shard " + QuoteName(want[i].name) + " differs: " + R(first) + " has " +
              std::to_string(want[i].bytes) + " bytes of digest " + format::Hex64(want[i].digest) +
              ", " + R(other) + " " + std::to_string(have[i].bytes) + " bytes of digest " +
              format::Hex64(have[i].digest);
      } else {
        // A name one of them lacks: the smaller name at the first difference.
        const bool first_has = i < want.size() && (i >= have.size() || want[i].name < have[i].name);
        const std::string& name = first_has ? want[i].name : have[i].name;
        why = "shard " + QuoteName(name) + " was put as replicated by " +
              R(first_has ? first : other) + " and not by " + R(first_has ? other : first);
      }
      result = Status::Corrupt(what + ": the replicas are not identical: " + why +
                               "; the version is not committed");
      break;
    }
    if (result.ok() && (c.protection & format::kProtectionAor)) result = CompareRecomputed(c, what);
    c.result = result;
    c.posted.clear();  // decided: the lists are no longer needed
  }
  if (!c.result) {
    return Fail(reply, Status::Busy(what + ": " + std::to_string(c.posted.size()) + " of " +
                                    std::to_string(c.members.size()) + " members have reported"));
  }
  if (!c.result->ok()) return Fail(reply, *c.result);
}

}  // namespace ckpt::engine
