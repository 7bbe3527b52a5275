// Reading a tier directory alone (engine/tier_view.h).
#include "engine/tier_view.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>

#include "engine/catalog.h"
#include "engine/tier.h"
#include "engine/witness.h"
#include "format/segment_format.h"
#include "io/tier_spec.h"

namespace ckpt::engine {

namespace {

// What the tier directories prove for one rank (engine/tier_view.h).
struct ViewRecords {
  Identity id;
  std::map<uint64_t, WitnessFile> witnesses;   // valid ones, the first of a version per tier order
  std::map<uint64_t, DecisionFile> decisions;  // valid ones naming the job and its world size
  std::vector<std::string> problems;           // witnesses that failed to decode
};

Status LoadViewRecords(const std::vector<io::TierSpec>& specs, io::Io* io, uint32_t rank,
                       const std::string& what, ViewRecords* out) {
  for (const io::TierSpec& spec : specs) {
    if (spec.kind == io::TierKind::kRam) {
      return Status::Invalid(what + ": a ram tier cannot be read without its store's root");
    }
    std::map<uint64_t, WitnessFile> found;
    CKPTDB_RETURN_IF_ERROR(WitnessDir(io, spec.path).Load(rank, 0, &found).WithContext(what));
    for (auto& [v, f] : found) {
      if (!f.status.ok()) {
        out->problems.push_back(f.status.message());
      } else if (!out->witnesses.count(v)) {
        out->witnesses.emplace(v, std::move(f));
      }
    }
  }
  if (out->witnesses.empty()) {
    std::string why = what + ": no commit witness of rank " + std::to_string(rank) +
                      " (<tier>/commits): nothing there was committed and demoted by that rank";
    if (!out->problems.empty()) why += "; " + out->problems.front();
    return Status::NotFound(why);
  }
  const format::CommitWitness& newest = out->witnesses.rbegin()->second.witness;
  Identity& id = out->id;
  id.job_id = newest.job_id;
  id.rank = rank;
  id.world_size = newest.world_size;
  id.chunk_bytes = newest.chunk_bytes;
  id.created_unix_ns = newest.store_created_unix_ns;
  if (id.world_size == 1) return Status::Ok();
  for (const io::TierSpec& spec : specs) {
    std::map<uint64_t, DecisionFile> found;
    CKPTDB_RETURN_IF_ERROR(DecisionDir(io, spec.path).Load(id.job_id, &found).WithContext(what));
    for (auto& [v, f] : found) {
      if (f.status.ok() && f.decision.world_size == id.world_size) out->decisions.emplace(v, f);
    }
  }
  return Status::Ok();
}

// The committed records and copies of every version the directories prove; *left_out says why
// each other witnessed version is not among them.
Status ListViewVersions(const std::vector<io::TierSpec>& specs, io::Io* io, const ViewRecords& r,
                        const std::string& what, CatalogBatch* batch,
                        std::vector<std::string>* left_out) {
  const Identity& id = r.id;
  for (const auto& [v, f] : r.witnesses) {
    const format::CommitWitness& w = f.witness;
    const std::string version = "version " + std::to_string(v);
    if (w.job_id != id.job_id || w.world_size != id.world_size) {
      left_out->push_back(version + " (its witness names another job)");
      continue;
    }
    if (id.world_size > 1 && !r.decisions.count(v)) {
      left_out->push_back(version + " (no decision record of the job: rank 0's copy is not there)");
      continue;
    }
    VersionRecord rec;
    rec.version = v;
    rec.state = CKPTDB_STATE_COMMITTED;
    rec.rank = id.rank;
    rec.data_bytes = w.data_bytes;
    rec.tensor_count = w.tensor_count;
    rec.chunk_count = w.chunk_count;
    rec.created_unix_ns = w.created_unix_ns;
    rec.committed_unix_ns = w.committed_unix_ns;
    rec.manifest_xxh3 = w.manifest_xxh3;
    size_t copies = 0;
    for (const io::TierSpec& spec : specs) {
      const std::string path = Tier(io, spec).SegmentPath(v, id.rank);
      uint64_t bytes = 0;
      Status st = io->PathSize(path, &bytes);
      if (st.code() == CKPTDB_ENOTFOUND) continue;
      CKPTDB_RETURN_IF_ERROR(st.WithContext(what));
      ResidencyRecord res;
      res.tier = spec.name;
      res.state = CKPTDB_RESIDENT_DURABLE;
      res.path = path;
      res.file_bytes = bytes;
      batch->put_residency.emplace_back(v, res);
      ++copies;
    }
    if (copies == 0) {
      left_out->push_back(version + " (its segment is not on these tiers)");
      continue;
    }
    batch->put_versions.push_back(rec);
  }
  return Status::Ok();
}

}  // namespace

Status BuildTierView(const DbOptions& options, io::Io* io, std::string* root) {
  std::vector<io::TierSpec> specs;
  CKPTDB_RETURN_IF_ERROR(io::ParseTierSpecs(options.tiers, "", &specs));
  const std::string what =
      "reading tiers \"" + options.tiers + "\" alone (rank " + std::to_string(options.rank) + ")";
  ViewRecords records;
  CKPTDB_RETURN_IF_ERROR(LoadViewRecords(specs, io, options.rank, what, &records));
  CatalogBatch batch;
  std::vector<std::string> left_out;
  CKPTDB_RETURN_IF_ERROR(ListViewVersions(specs, io, records, what, &batch, &left_out));
  for (const std::string& s : left_out) {
    std::fprintf(stderr, "ckptdb: %s: left out %s\n", what.c_str(), s.c_str());
  }
  if (batch.put_versions.empty()) {
    return Status::NotFound(what + ": no version is complete there (" + left_out.front() + ")");
  }
  // The view's catalog, in a private directory (mkdtemp: mode 0700, a name no one else has).
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp") + "/ckptdb-view-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    return Status::FromErrno(errno,
                             what + ": creating a directory for its catalog from " + pattern);
  }
  std::string spec_text;
  for (const io::TierSpec& spec : specs) {
    spec_text += (spec_text.empty() ? "" : ";") + io::FormatTierSpec(spec);
  }
  std::unique_ptr<Catalog> catalog;
  Status st = Catalog::Open(pattern + "/catalog", /*read_only=*/false, /*create=*/true, &catalog);
  if (st.ok()) st = catalog->PutIdentity(records.id);
  if (st.ok()) st = catalog->PutTiers(spec_text);
  if (st.ok()) st = catalog->Apply(batch, /*sync=*/false);
  catalog.reset();
  if (!st.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(pattern, ec);
    return st.WithContext(what);
  }
  *root = pattern;
  return Status::Ok();
}

}  // namespace ckpt::engine
