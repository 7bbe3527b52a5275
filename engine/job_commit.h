// A version's part in the job's two-phase commit on this rank (world_size > 1;
// docs/commit-protocol.md steps 5-8): its redundancy pushed to the placement peers, its vote, and
// the coordinator's decision.
//
// The cluster's threads never write a version's fields. Each outcome they see (the push ended,
// the coordinator refused the vote, the vote may not have arrived, the coordinator decided)
// reaches the version as a JobCommit::Message, which Db::DeliverLocked routes to the version's
// JobCommit under Db::mu_; the manager reads the state back and takes the next step. Only the yes
// vote is claimed from the cluster worker itself (ClaimYes), because it must be taken, under the
// lock, at the moment the vote leaves: from then on only the coordinator decides.
//
// Every change asserts the protocol's order, on in release builds (util/assert.h): the push
// starts once and ends once; the yes is claimed once, only after the redundancy is safe, never
// after a commit; a decision is never taken back; and this rank hears a commit only after its
// own yes (the coordinator commits a version only with every rank's vote).
#pragma once

#include <cstdint>
#include <string>

#include "util/status.h"

namespace ckpt::engine {

class JobCommit {
 public:
  struct Message {
    enum class Kind : uint8_t {
      kReplicated,       // the push to the peers ended; `status` says how
      kVoteRefused,      // the coordinator refused the yes (fenced, or already aborted): `status`
      kVoteUndelivered,  // the yes may or may not have arrived: the version is in doubt
      kDecided,          // the coordinator's decision: `committed`, or aborted for `why`
    };
    // The coordinator's decisions name a version, not the attempt at it.
    static constexpr uint64_t kAnyGeneration = UINT64_MAX;

    Kind kind = Kind::kReplicated;
    uint64_t version = 0;
    uint64_t generation = kAnyGeneration;  // the live version's (LiveVersion::generation)
    Status status;
    bool committed = false;
    std::string why;
  };

  enum class Replication : uint8_t { kNotStarted, kRunning, kSafe, kFailed };
  enum class Vote : uint8_t { kNone, kYes, kRefused };
  enum class Decision : uint8_t { kNone, kCommitted, kAborted };

  // The manager hands the version to the cluster worker to push.
  void StartReplication();
  // kReplicated: the push ended with `result`.
  void Replicated(const Status& result);
  // The cluster worker, right before the yes leaves (the caller checked the version is still
  // wanted).
  void ClaimYes();
  // kVoteRefused: the coordinator will never commit it; `why` is kept when no cause is yet.
  void Refused(const std::string& why);
  // kDecided. `why` is the abort's cause (it replaces an earlier one: the coordinator's is the
  // job's).
  void Decide(bool committed, const std::string& why);

  Replication replication() const { return replication_; }
  bool replicating() const { return replication_ == Replication::kRunning; }
  const Status& replication_error() const { return replication_error_; }
  Vote vote() const { return vote_; }
  // The yes left (refused or not): the arena copy is whole, and only the coordinator decides.
  bool yes_sent() const { return vote_ != Vote::kNone; }
  Decision decision() const { return decision_; }
  const std::string& abort_why() const { return abort_why_; }
  // A version given up now must tell the coordinator: no yes left and no decision came.
  bool MustVoteNo() const { return vote_ == Vote::kNone && decision_ == Decision::kNone; }

 private:
  Replication replication_ = Replication::kNotStarted;
  Status replication_error_;
  Vote vote_ = Vote::kNone;
  Decision decision_ = Decision::kNone;
  std::string abort_why_;  // the coordinator's (or its refusal's) cause of an abort
};

}  // namespace ckpt::engine
