// Which tiers an open uses (DESIGN.md section 5): the tier spec is part of the store. A handle
// given none uses the store's own, the spec of its last read-write open, which the catalog
// records; only a new store gets the default disk tier under its root. A writer's spec that
// leaves out a tier holding committed copies is refused, naming the tier and the versions,
// unless the caller set drop_tiers; then the open's last step releases those copies (their files
// or the arena), so that nothing is left behind for `ckptdb gc` to take for an orphan's. A copy
// that is some committed version's last is never released this way.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "engine/db.h"
#include "engine/internal.h"
#include "engine/ram_tier.h"
#include "format/segment_format.h"

namespace ckpt::engine {

using format::kBlockBytes;

namespace {

std::string VersionList(const std::vector<uint64_t>& versions) {
  constexpr size_t kShown = 8;
  std::string list;
  for (size_t i = 0; i < versions.size() && i < kShown; ++i) {
    list += (i == 0 ? "" : ", ") + std::to_string(versions[i]);
  }
  if (versions.size() > kShown) list += ", ... (" + std::to_string(versions.size()) + " in all)";
  return list;
}

}  // namespace

// A writer's tiers from `spec` (the options', the catalog's, or the default disk tier under the
// root). Bad input changes nothing: the spec and the commit tier are checked before the store is
// created.
Status Db::ParseWriterTiers(const std::string& cwd, const std::string& given,
                            std::vector<io::TierSpec>* specs) {
  const DbOptions& o = options_;
  const uint64_t record_bytes = format::RecordBytes(o.chunk_bytes);
  std::vector<io::TierSpec>& out = *specs;
  out.clear();
  tiers_.clear();
  const std::string spec = given.empty() ? "disk:" + o.root + "/segments" : given;
  CKPTDB_RETURN_IF_ERROR(io::ParseTierSpecs(spec, cwd, specs));
  for (const io::TierSpec& s : out) tiers_.emplace_back(s);
  CKPTDB_RETURN_IF_ERROR(ResolveTier(o.commit_tier, &commit_tier_));
  if (out[0].kind == io::TierKind::kRam) {
    if (out[0].capacity_bytes < 2 * record_bytes + RamTier::kHeaderBytes + 2 * kBlockBytes) {
      return Status::Invalid("options: the ram tier's " + std::to_string(out[0].capacity_bytes) +
                             " bytes hold fewer than 2 chunks of chunk_bytes " +
                             std::to_string(o.chunk_bytes));
    }
  }
  return Status::Ok();
}

// A read-only handle opens with the tiers of the last read-write open unless told otherwise.
Status Db::ParseReaderTiers(const std::string& cwd, std::vector<io::TierSpec>* specs) {
  std::string spec = options_.tiers;
  if (spec.empty()) {
    Status ts = catalog_->GetTiers(&spec);
    if (!ts.ok() && ts.code() != CKPTDB_ENOTFOUND) return ts;
  }
  if (spec.empty()) spec = "disk:" + options_.root + "/segments";
  CKPTDB_RETURN_IF_ERROR(io::ParseTierSpecs(spec, cwd, specs));
  for (const io::TierSpec& s : *specs) tiers_.emplace_back(s);
  return Status::Ok();
}

// After the catalog is open (versions_ loaded): a writer given no spec takes the store's, and
// any writer's spec is checked against the committed copies it would leave out.
Status Db::ChooseWriterTiers(const std::string& cwd, std::vector<io::TierSpec>* specs) {
  std::string recorded;
  Status ts = catalog_->GetTiers(&recorded);
  if (!ts.ok() && ts.code() != CKPTDB_ENOTFOUND) return ts;
  if (options_.tiers.empty() && !recorded.empty()) {
    CKPTDB_RETURN_IF_ERROR(ParseWriterTiers(cwd, recorded, specs)
                               .WithContext("the store's recorded tiers \"" + recorded + "\""));
  }
  std::set<std::string> names;
  for (const io::TierSpec& s : *specs) names.insert(s.name);
  // The ram tier is always "ram": one whose directory moved leaves the old arena's copies out.
  const std::string arena =
      (*specs)[0].kind == io::TierKind::kRam
          ? RamTier::ArenaPath((*specs)[0].path, identity_.job_id, identity_.rank)
          : std::string();
  auto left_out = [&](const ResidencyRecord& r) {
    std::error_code ec;
    return names.count(r.tier) == 0 || (IsRamName(r.tier) && r.path != arena &&
                                        !std::filesystem::equivalent(r.path, arena, ec));
  };
  std::map<std::string, std::vector<uint64_t>> held;  // a left-out tier -> committed copies on it
  std::map<std::string, std::vector<uint64_t>> only;  // ... the versions it holds alone
  for (const auto& [v, e] : versions_) {
    // A job's PREPARED versions too: the coordinator may decide them committed at this open.
    const bool prepared_in_job = e.record.state == CKPTDB_STATE_PREPARED && options_.world_size > 1;
    if (e.record.state != CKPTDB_STATE_COMMITTED && !prepared_in_job) continue;
    bool stays = false;
    for (const ResidencyRecord& r : e.residency) {
      stays |= !left_out(r) && r.state == CKPTDB_RESIDENT_DURABLE;
    }
    for (const ResidencyRecord& r : e.residency) {
      if (!left_out(r) || r.state != CKPTDB_RESIDENT_DURABLE) continue;
      const std::string tier =
          names.count(r.tier) > 0 ? r.tier + " (the arena " + r.path + ")" : r.tier;
      held[tier].push_back(v);
      if (!stays) only[tier].push_back(v);
    }
  }
  const std::string store =
      recorded.empty() ? std::string() : " (the store's: \"" + recorded + "\")";
  if (!only.empty()) {
    const auto& [tier, versions] = *only.begin();
    return Status::Invalid(
        "options: tiers: the spec leaves out tier " + tier + ", which holds the only copy of " +
        "committed version(s) " + VersionList(versions) + "; nothing was changed: open with the " +
        "store's tiers" + store + " and a new tier behind them until those versions are " +
        "demoted there, then leave " + tier + " out");
  }
  for (const auto& [tier, versions] : held) {
    if (options_.drop_tiers) {
      std::fprintf(stderr,
                   "ckptdb: tier %s is left out (drop_tiers): releasing its copies of "
                   "version(s) %s, which other tiers hold\n",
                   tier.c_str(), VersionList(versions).c_str());
      continue;
    }
    return Status::Invalid(
        "options: tiers: the spec leaves out tier " + tier + ", which holds committed copies of " +
        "version(s) " + VersionList(versions) + "; nothing was changed: leave the tiers unset " +
        "to open with the store's own" + store + ", or set drop_tiers (CKPTDB_DROP_TIERS=1, " +
        "ckptdb import --drop-tiers) to release those copies");
  }
  return Status::Ok();
}

// After Recover (the copies' states refreshed: a directory copy DURABLE only while its file is
// there, a ram copy only while the arena of its generation holds it), twice: with release
// false, a version whose left-out copies were all that is really there fails the open before
// anything is written (ChooseWriterTiers trusted the catalog's word); with release true, the
// open's last step, the records of left-out copies go (synced), then their files and the old
// arena, unless one is the same file as a tier that stays (a directory reached by another
// path). A crash in between leaves files no catalog names, which gc or the sweep collect.
Status Db::ReleaseDroppedCopies(bool release) {
  if (!options_.drop_tiers) return Status::Ok();
  auto left_out = [&](const ResidencyRecord& r) {
    const int t = TierIndex(r.tier);
    if (t < 0) return true;
    if (!tiers_[t].is_ram()) return false;
    std::error_code ec;
    return r.path != tiers_[t].ram->path() &&
           !std::filesystem::equivalent(r.path, tiers_[t].ram->path(), ec);
  };
  auto is_copy = [](const ResidencyRecord& r) {
    return r.state == CKPTDB_RESIDENT_DURABLE || r.state == CKPTDB_RESIDENT_MISSING;
  };
  CatalogBatch batch;
  std::set<std::string> paths;
  for (auto& [version, e] : versions_) {
    bool left = false, left_durable = false, held = false;
    for (const ResidencyRecord& r : e.residency) {
      left |= left_out(r) && is_copy(r);
      left_durable |= left_out(r) && r.state == CKPTDB_RESIDENT_DURABLE;
      held |= !left_out(r) && r.state == CKPTDB_RESIDENT_DURABLE;
    }
    if (left_durable && !held && e.record.state == CKPTDB_STATE_COMMITTED) {
      return Status::Invalid("options: tiers: " + V(version) + " has no copy left on the tiers " +
                             "that stay (the catalog's other copies are gone), only on tiers " +
                             "the spec leaves out; nothing was changed: open with the store's " +
                             "tiers until it is demoted to one that stays");
    }
    if (!release || !left) continue;
    std::vector<ResidencyRecord> kept;
    for (const ResidencyRecord& r : e.residency) {
      if (!(left_out(r) && is_copy(r))) {
        kept.push_back(r);
        continue;
      }
      paths.insert(r.path);  // a segment file, or the arena (one for all its copies)
      batch.delete_residency.emplace_back(version, r.tier);
    }
    e.residency = std::move(kept);
  }
  if (paths.empty()) return Status::Ok();
  CKPTDB_RETURN_IF_ERROR(catalog_->Apply(batch, /*sync=*/true));
  for (const std::string& path : paths) {
    std::error_code ec;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    const bool stays = std::any_of(tiers_.begin(), tiers_.end(), [&](const TierState& t) {
      return t.is_ram() ? std::filesystem::equivalent(path, t.ram->path(), ec)
                        : std::filesystem::equivalent(dir, t.spec.path, ec);
    });
    if (stays) continue;  // the same file as a tier that stays: its copy, not a left-out one
    // The store no longer uses that tier: a file that cannot be removed is only left behind.
    if (Status st = io_->Remove(path); !st.ok()) {
      std::fprintf(stderr, "ckptdb: releasing %s of a left-out tier: %s; left behind\n",
                   path.c_str(), st.message().c_str());
    }
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
