// The tier policy (DESIGN.md section 5): which committed versions each tier should hold, which
// copies may be evicted, and where a demotion can read from. Pure functions of the catalog's
// view (versions_), called with mu_ held.
//
//   Wants(t, v):     t takes v (v % every == 0) and v is among the newest `keep` committed
//                    versions that t takes (keep=0: all): demotion brings it there. The first
//                    tier captures every version.
//   Keeps(t, v):     fewer than `keep` newer versions are durable on t itself. A copy is dropped
//                    for keep= only once its successors are really there, so a tier never holds
//                    fewer than `keep` copies while a newer one is still on its way to it.
//   Evictable(t, v): a durable copy of v on t may be deleted when v is not the newest committed
//                    version, no reader or demotion is using it, and v is safe on a slower tier
//                    or no slower tier will ever want it (superseded); and either t no longer
//                    keeps it, or (ram, for_space) the arena needs the room.
#include <algorithm>
#include <map>

#include "engine/db.h"
#include "engine/internal.h"

namespace ckpt::engine {

int Db::TierIndex(const std::string& name) const {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i].name() == name) return static_cast<int>(i);
  }
  return -1;
}

// A tier by name ("ram", "disk:/nvme/ck", any spelling that parses to it) or by kind ("disk":
// the first tier of that kind). Empty: the first tier.
Status Db::ResolveTier(const std::string& name_or_kind, size_t* index) const {
  if (name_or_kind.empty()) {
    *index = 0;
    return Status::Ok();
  }
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i].name() == name_or_kind || io::TierKindName(tiers_[i].spec.kind) == name_or_kind) {
      *index = i;
      return Status::Ok();
    }
  }
  std::vector<io::TierSpec> parsed;
  if (io::ParseTierSpecs(name_or_kind, "", &parsed).ok() && parsed.size() == 1) {
    int i = TierIndex(parsed[0].name);
    if (i >= 0) {
      *index = static_cast<size_t>(i);
      return Status::Ok();
    }
  }
  std::string names;
  for (const TierState& t : tiers_) names += (names.empty() ? "" : ", ") + t.name();
  return Status::NotFound("no tier named \"" + name_or_kind + "\" (tiers: " + names +
                          "; a kind such as \"disk\" names the first tier of that kind)");
}

std::optional<uint64_t> Db::NewestCommitted() const {
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second.record.state == CKPTDB_STATE_COMMITTED) return it->first;
  }
  return std::nullopt;
}

// The floor for "versions must increase": retired versions count.
std::optional<uint64_t> Db::LastCommitted() const {
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second.record.state == CKPTDB_STATE_COMMITTED ||
        it->second.record.state == CKPTDB_STATE_RETIRED) {
      return it->first;
    }
  }
  return std::nullopt;
}

bool Db::Durable(const VersionEntry& e, size_t tier) const {
  return std::any_of(e.residency.begin(), e.residency.end(), [&](const ResidencyRecord& r) {
    return r.tier == tiers_[tier].name() && r.state == CKPTDB_RESIDENT_DURABLE;
  });
}

namespace {

// Fewer than `keep` committed versions newer than `version` count (keep=0: no limit).
template <typename Counts>
bool FewerNewerThan(const std::map<uint64_t, VersionEntry>& versions, uint64_t version,
                    uint64_t keep, Counts counts) {
  if (keep == 0) return true;
  uint64_t newer = 0;
  for (auto it = versions.upper_bound(version); it != versions.end(); ++it) {
    if (it->second.record.state == CKPTDB_STATE_COMMITTED && counts(*it) && ++newer >= keep) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool Db::Wants(size_t tier, uint64_t version) const {
  const TierState& t = tiers_[tier];
  return t.Takes(version) && FewerNewerThan(versions_, version, t.spec.keep,
                                            [&](const auto& e) { return t.Takes(e.first); });
}

bool Db::Keeps(size_t tier, uint64_t version) const {
  return FewerNewerThan(versions_, version, tiers_[tier].spec.keep,
                        [&](const auto& e) { return Durable(e.second, tier); });
}

// A copy a demotion to `tier` could read from: durable on another tier, not given up on.
bool Db::HasSource(uint64_t version, size_t tier) const {
  auto it = versions_.find(version);
  if (it == versions_.end()) return false;
  auto failed = failed_sources_.find({version, tier});
  for (size_t s = 0; s < tiers_.size(); ++s) {
    if (s == tier || !Durable(it->second, s)) continue;
    if (failed != failed_sources_.end() && failed->second.count(s)) continue;
    return true;
  }
  return false;
}

bool Db::Evictable(size_t tier, uint64_t version, bool for_space) const {
  auto it = versions_.find(version);
  if (it == versions_.end() || it->second.record.state != CKPTDB_STATE_COMMITTED) return false;
  const VersionEntry& e = it->second;
  if (!Durable(e, tier)) return false;
  if (NewestCommitted() == version) return false;  // never the last committed version
  if (tiers_[tier].is_ram() && ram_pins_.count(version)) return false;
  if (demotion_ && demotion_->version == version) return false;
  if (!for_space && Keeps(tier, version)) return false;
  for (size_t slower = tier + 1; slower < tiers_.size(); ++slower) {
    if (Durable(e, slower)) return true;  // safe on a slower tier
  }
  for (size_t slower = tier + 1; slower < tiers_.size(); ++slower) {
    // A slower tier still wants it and could get it from here: keep it until it has.
    // An offline tier does not hold the arena's room hostage: under memory pressure the copy
    // goes, and the tier gets the version from a slower tier that holds it, or not at all.
    if (for_space && !tiers_[slower].online()) continue;
    if (Wants(slower, version) && HasSource(version, slower)) return false;
  }
  return true;  // superseded: no slower tier will ever take it
}

uint64_t Db::PendingBytes(size_t tier) const {
  uint64_t bytes = 0;
  for (const auto& [version, e] : versions_) {
    if (e.record.state != CKPTDB_STATE_COMMITTED || Durable(e, tier)) continue;
    if (Wants(tier, version) && HasSource(version, tier)) bytes += e.record.data_bytes;
  }
  return bytes;
}

}  // namespace ckpt::engine
