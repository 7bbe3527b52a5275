#include "engine/coordinator_decisions.h"

#include "util/assert.h"

namespace ckpt::engine {

const std::string* DecisionLog::AbortCause(uint64_t version) const {
  auto it = causes_.find(version);
  return it == causes_.end() ? nullptr : &it->second;
}

void DecisionLog::CheckUndecided(uint64_t version) const {
  CKPTDB_ASSERT(!committed_.count(version));
  CKPTDB_ASSERT(!aborted_.count(version));
}

const std::set<uint32_t>& DecisionLog::Vote(uint64_t version, uint32_t rank) {
  CheckUndecided(version);
  std::set<uint32_t>& voters = votes_[version];
  voters.insert(rank);
  return voters;
}

std::set<uint32_t> DecisionLog::Commit(uint64_t version) {
  CheckUndecided(version);
  std::set<uint32_t> voters;
  if (auto it = votes_.find(version); it != votes_.end()) {
    voters = std::move(it->second);
    votes_.erase(it);
  }
  committed_.insert(version);
  CKPTDB_ASSERT(!votes_.count(version));
  return voters;
}

bool DecisionLog::Abort(uint64_t version, const std::string& why) {
  CKPTDB_ASSERT(!committed_.count(version));  // a decision is never taken back
  if (!aborted_.insert(version).second) {
    CKPTDB_ASSERT(!votes_.count(version));
    return false;
  }
  votes_.erase(version);
  causes_[version] = why;
  while (causes_.size() > kMaxCauses) causes_.erase(causes_.begin());
  return true;
}

std::vector<uint64_t> DecisionLog::AbortOpen(const std::string& why) {
  std::vector<uint64_t> open;
  for (const auto& entry : votes_) open.push_back(entry.first);
  for (uint64_t version : open) {
    CheckUndecided(version);  // votes are closed by every decision
    Abort(version, why);
  }
  CKPTDB_ASSERT(votes_.empty());
  return open;
}

}  // namespace ckpt::engine
