// The store's commit witnesses (format/commit_witness.h, docs/format.md "The commit witness"):
// the directory <root>/commits, one fsynced file per committed version of this rank. The
// engine writes a witness after the version's COMMITTED record is durable in the catalog and
// removes it before the version is retired, so at every point "witnessed implies committed in
// the catalog" holds; a catalog that breaks it has lost synced records.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/catalog.h"
#include "format/commit_witness.h"
#include "io/io.h"
#include "util/status.h"

namespace ckpt::engine {

struct WitnessFile {
  std::string path;
  uint32_t rank = 0;              // from the file name
  Status status;                  // Ok when the file decodes and names this store; else why not
  format::CommitWitness witness;  // valid when status is Ok
};

class WitnessDir {
 public:
  WitnessDir(io::Io* io, const std::string& root)
      : io_(io), dir_(root + "/" + format::kWitnessDirName) {}

  const std::string& dir() const { return dir_; }
  std::string PathOf(uint64_t version, uint32_t rank) const {
    return dir_ + "/" + format::WitnessFileName(version, rank);
  }
  // Writes the witness durably (a temporary name, fsync, rename, fsync of the directory).
  Status Write(const format::CommitWitness& w);
  // Removes the witness of (version, rank), absent is fine, and fsyncs the directory.
  Status Remove(uint64_t version, uint32_t rank);
  // Every witness file of `rank` (kAnyRank: of every rank) by version, each decoded and checked
  // against job_id (0: any). A witness that fails keeps its version's entry with the reason in
  // status. An absent directory is no witness. Bounded by what ListDir returns; each file by its
  // format's bound.
  Status Load(uint32_t rank, uint64_t job_id, std::map<uint64_t, WitnessFile>* out) const;

  static constexpr uint32_t kAnyRank = UINT32_MAX;

 private:
  io::Io* io_;
  std::string dir_;
};

// A tier directory's decision records (<tier>/decisions, format/commit_witness.h): written by
// rank 0 of a job beside its own witness on each nfs tier, so that a reader of the directory
// alone knows which versions the job committed as a whole.
struct DecisionFile {
  std::string path;
  Status status;  // Ok when the file decodes and names the job; else why not
  format::JobDecision decision;
};

class DecisionDir {
 public:
  DecisionDir(io::Io* io, const std::string& tier_dir)
      : io_(io), dir_(tier_dir + "/" + format::kDecisionDirName) {}
  std::string PathOf(uint64_t version) const {
    return dir_ + "/" + format::DecisionFileName(version);
  }
  Status Write(const format::JobDecision& d);
  Status Remove(uint64_t version);  // absent is fine
  // Every decision record by version, each checked against job_id (0: any); bounded as
  // WitnessDir::Load.
  Status Load(uint64_t job_id, std::map<uint64_t, DecisionFile>* out) const;

 private:
  io::Io* io_;
  std::string dir_;
};

// The witness of `rec`, a committed version of the store `id` whose tiers are `tiers` (left
// empty in the witness when longer than the format allows).
format::CommitWitness MakeWitness(const Identity& id, const VersionRecord& rec,
                                  const std::string& tiers);

// The open's cross-check (docs/commit-protocol.md, "Commit witnesses"): every witness that
// verifies must be accounted for by a COMMITTED (or RETIRED) record of `versions` with the same
// manifest, and name job_id (0: not checked). Corrupt otherwise, saying that the catalog lost
// synced records and that nothing was changed. A damaged witness is Corrupt too, unless the
// catalog records its version as committed: then it is only added to *problems.
Status CheckWitnessesAgainst(const std::map<uint64_t, WitnessFile>& witnesses,
                             const std::map<uint64_t, VersionEntry>& versions, uint64_t job_id,
                             const std::string& catalog_dir, const std::string& root,
                             std::vector<std::string>* problems);

}  // namespace ckpt::engine
