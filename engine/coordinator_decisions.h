// The coordinator's decisions (rank 0; docs/commit-protocol.md): the versions it committed (each
// durable in its catalog before anyone hears of it), those it aborted (presumed abort: an abort
// is never written), and the yes votes of versions still open.
//
// Every change asserts the two-phase commit's invariants, on in release builds (util/assert.h):
// a version is never both committed and aborted, a decision is never taken back, and a decided
// version has no open votes. Its owner's lock guards it (Coordinator::mu_, under which decisions
// are taken against the members' table and the epoch).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ckpt::engine {

class DecisionLog {
 public:
  // Abort causes kept, the newest versions' (for late questions about them).
  static constexpr size_t kMaxCauses = 256;

  bool Committed(uint64_t version) const { return committed_.count(version) != 0; }
  bool Aborted(uint64_t version) const { return aborted_.count(version) != 0; }
  // Why `version` was aborted, when that is still kept; nullptr otherwise.
  const std::string* AbortCause(uint64_t version) const;
  // Every committed version, oldest first.
  const std::set<uint64_t>& committed() const { return committed_; }

  // `rank` votes yes for `version`, which is undecided; returns the voters so far.
  const std::set<uint32_t>& Vote(uint64_t version, uint32_t rank);
  // `version` is committed (the caller made the decision durable first; a version learned from a
  // rank's catalog has no votes here). Returns the ranks that voted for it, its votes closed.
  std::set<uint32_t> Commit(uint64_t version);
  // `version` is aborted for `why`, its votes dropped; false when it already was. It must not be
  // committed: a rank that gives up a committed version is refused before this is asked.
  bool Abort(uint64_t version, const std::string& why);
  // Presumed abort: every version with open votes (none decided) aborted for `why`, returned
  // oldest first.
  std::vector<uint64_t> AbortOpen(const std::string& why);

 private:
  void CheckUndecided(uint64_t version) const;

  std::map<uint64_t, std::set<uint32_t>> votes_;  // open versions only
  std::set<uint64_t> committed_;
  std::set<uint64_t> aborted_;
  std::map<uint64_t, std::string> causes_;  // of aborted versions, the newest kMaxCauses
};

}  // namespace ckpt::engine
