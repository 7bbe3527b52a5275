#include "engine/job_commit.h"

#include "util/assert.h"

namespace ckpt::engine {

void JobCommit::StartReplication() {
  CKPTDB_ASSERT(replication_ == Replication::kNotStarted);  // one push a version
  CKPTDB_ASSERT(vote_ == Vote::kNone);
  replication_ = Replication::kRunning;
}

void JobCommit::Replicated(const Status& result) {
  CKPTDB_ASSERT(replication_ == Replication::kRunning);  // it ends once, after it started
  replication_ = result.ok() ? Replication::kSafe : Replication::kFailed;
  replication_error_ = result;
}

void JobCommit::ClaimYes() {
  CKPTDB_ASSERT(replication_ == Replication::kSafe);  // no yes before the redundancy is safe
  CKPTDB_ASSERT(vote_ == Vote::kNone);                // one vote a version
  CKPTDB_ASSERT(decision_ != Decision::kCommitted);   // a commit needs this very vote
  vote_ = Vote::kYes;
}

void JobCommit::Refused(const std::string& why) {
  CKPTDB_ASSERT(vote_ == Vote::kYes);                // only a vote that left is refused
  CKPTDB_ASSERT(decision_ != Decision::kCommitted);  // a refused vote commits nothing
  vote_ = Vote::kRefused;
  decision_ = Decision::kAborted;
  if (abort_why_.empty()) abort_why_ = why;
}

void JobCommit::Decide(bool committed, const std::string& why) {
  const Decision d = committed ? Decision::kCommitted : Decision::kAborted;
  CKPTDB_ASSERT(decision_ == Decision::kNone || decision_ == d);  // never taken back
  if (committed) CKPTDB_ASSERT(vote_ == Vote::kYes);  // the coordinator counted this rank's yes
  decision_ = d;
  if (!committed) abort_why_ = why;
}

}  // namespace ckpt::engine
