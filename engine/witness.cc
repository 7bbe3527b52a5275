#include "engine/witness.h"

#include <vector>

#include "format/checksum.h"
#include "format/segment_format.h"

namespace ckpt::engine {

format::CommitWitness MakeWitness(const Identity& id, const VersionRecord& rec,
                                  const std::string& tiers) {
  format::CommitWitness w;
  w.rank = id.rank;
  w.job_id = id.job_id;
  w.version = rec.version;
  w.world_size = id.world_size;
  w.chunk_bytes = id.chunk_bytes;
  w.data_bytes = rec.data_bytes;
  w.manifest_xxh3 = rec.manifest_xxh3;
  w.tensor_count = rec.tensor_count;
  w.chunk_count = rec.chunk_count;
  w.created_unix_ns = rec.created_unix_ns;
  w.committed_unix_ns = rec.committed_unix_ns;
  w.store_created_unix_ns = id.created_unix_ns;
  if (tiers.size() <= format::kMaxWitnessTiersBytes) w.tiers = tiers;
  return w;
}

Status WitnessDir::Write(const format::CommitWitness& w) {
  CKPTDB_RETURN_IF_ERROR(io_->CreateDirs(dir_).WithContext("commit witnesses"));
  std::vector<uint8_t> bytes = format::EncodeCommitWitness(w);
  return io_->WriteFileDurably(
      PathOf(w.version, w.rank),
      std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Status WitnessDir::Remove(uint64_t version, uint32_t rank) {
  uint64_t ignored;
  const std::string path = PathOf(version, rank);
  if (io_->PathSize(path, &ignored).code() == CKPTDB_ENOTFOUND) return Status::Ok();
  CKPTDB_RETURN_IF_ERROR(io_->Remove(path));
  return io_->SyncDir(dir_);
}

Status WitnessDir::Load(uint32_t rank, uint64_t job_id,
                        std::map<uint64_t, WitnessFile>* out) const {
  out->clear();
  std::vector<std::string> names;
  Status st = io_->ListDir(dir_, &names);
  if (st.code() == CKPTDB_ENOTFOUND) return Status::Ok();
  if (st.code() == CKPTDB_EINVAL) {
    // Not a directory (ENOTDIR): the store's metadata is damaged, not the caller's input.
    return Status::Corrupt("commit witnesses: " + dir_ + " is not a directory (" + st.message() +
                           "); nothing was changed: move it aside, then run ckptdb repair");
  }
  CKPTDB_RETURN_IF_ERROR(st.WithContext("commit witnesses"));
  for (const std::string& name : names) {
    uint64_t version = 0;
    uint32_t file_rank = 0;
    if (!format::ParseWitnessFileName(name, &version, &file_rank)) continue;
    if (rank != kAnyRank && file_rank != rank) continue;
    WitnessFile& f = (*out)[version];
    f.path = dir_ + "/" + name;
    f.rank = file_rank;
    const std::string what = "commit witness " + f.path;
    uint64_t bytes = 0;
    f.status = io_->PathSize(f.path, &bytes);
    if (f.status.ok() && bytes > format::kWitnessFixedBytes + format::kMaxWitnessTiersBytes + 8) {
      f.status = Status::Corrupt(what + ": " + std::to_string(bytes) +
                                 " bytes, longer than any commit witness");
    }
    std::string contents;
    if (f.status.ok()) f.status = io_->ReadFile(f.path, &contents);
    if (f.status.code() == CKPTDB_EINVAL) {
      f.status = Status::Corrupt(what + ": not a regular file (" + f.status.message() + ")");
    }
    if (f.status.ok()) {
      f.status = format::DecodeCommitWitness(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(contents.data()),
                                   contents.size()),
          what, &f.witness);
    }
    if (f.status.ok() && (f.witness.version != version || f.witness.rank != file_rank)) {
      f.status = Status::Corrupt(what + ": it records v" + std::to_string(f.witness.version) +
                                 " of rank " + std::to_string(f.witness.rank) +
                                 ", not what its name says");
    }
    if (f.status.ok() && job_id != 0 && f.witness.job_id != job_id) {
      f.status = Status::Corrupt(what + ": it names job id " + format::Hex64(f.witness.job_id) +
                                 ", not this store's " + format::Hex64(job_id));
    }
  }
  return Status::Ok();
}

Status DecisionDir::Write(const format::JobDecision& d) {
  CKPTDB_RETURN_IF_ERROR(io_->CreateDirs(dir_).WithContext("decision records"));
  std::vector<uint8_t> bytes = format::EncodeJobDecision(d);
  return io_->WriteFileDurably(
      PathOf(d.version), std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Status DecisionDir::Remove(uint64_t version) {
  uint64_t ignored;
  const std::string path = PathOf(version);
  if (io_->PathSize(path, &ignored).code() == CKPTDB_ENOTFOUND) return Status::Ok();
  CKPTDB_RETURN_IF_ERROR(io_->Remove(path));
  return io_->SyncDir(dir_);
}

Status DecisionDir::Load(uint64_t job_id, std::map<uint64_t, DecisionFile>* out) const {
  out->clear();
  std::vector<std::string> names;
  Status st = io_->ListDir(dir_, &names);
  if (st.code() == CKPTDB_ENOTFOUND) return Status::Ok();
  CKPTDB_RETURN_IF_ERROR(st.WithContext("decision records"));
  for (const std::string& name : names) {
    uint64_t version = 0;
    if (!format::ParseDecisionFileName(name, &version)) continue;
    DecisionFile& f = (*out)[version];
    f.path = dir_ + "/" + name;
    const std::string what = "decision record " + f.path;
    uint64_t bytes = 0;
    f.status = io_->PathSize(f.path, &bytes);
    if (f.status.ok() && bytes != format::kDecisionBytes) {
      f.status = Status::Corrupt(what + ": " + std::to_string(bytes) + " bytes, not " +
                                 std::to_string(format::kDecisionBytes));
    }
    std::string contents;
    if (f.status.ok()) f.status = io_->ReadFile(f.path, &contents);
    if (f.status.ok()) {
      f.status = format::DecodeJobDecision(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(contents.data()),
                                   contents.size()),
          what, &f.decision);
    }
    if (f.status.ok() && f.decision.version != version) {
      f.status = Status::Corrupt(what + ": it records v" + std::to_string(f.decision.version) +
                                 ", not what its name says");
    }
    if (f.status.ok() && job_id != 0 && f.decision.job_id != job_id) {
      f.status = Status::Corrupt(what + ": it names job id " + format::Hex64(f.decision.job_id) +
                                 ", not " + format::Hex64(job_id));
    }
  }
  return Status::Ok();
}

Status CheckWitnessesAgainst(const std::map<uint64_t, WitnessFile>& witnesses,
                             const std::map<uint64_t, VersionEntry>& versions, uint64_t job_id,
                             const std::string& catalog_dir, const std::string& root,
                             std::vector<std::string>* problems) {
  const std::string repair = "; nothing was changed (run ckptdb repair " + root + ")";
  for (const auto& [version, f] : witnesses) {
    auto it = versions.find(version);
    const bool known = it != versions.end() && it->second.has_record;
    const int state = known ? it->second.record.state : CKPTDB_STATE_OPEN;
    const bool committed = state == CKPTDB_STATE_COMMITTED || state == CKPTDB_STATE_RETIRED;
    const std::string v = "version " + std::to_string(version);
    if (!f.status.ok()) {
      if (committed) {
        problems->push_back(f.status.message() + " (the catalog records " + v +
                            " as committed; ckptdb repair rewrites the witness)");
        continue;
      }
      return Status::Corrupt(f.status.message() + "; the catalog " + catalog_dir +
                             " does not record " + v +
                             " as committed, so whether it committed cannot be told" + repair);
    }
    if (job_id != 0 && f.witness.job_id != job_id) {
      return Status::Corrupt("commit witness " + f.path + " names job id " +
                             format::Hex64(f.witness.job_id) + ", not this store's " +
                             format::Hex64(job_id) + repair);
    }
    if (!committed) {
      return Status::Corrupt(
          "catalog " + catalog_dir + " does not record " + v + " as committed (" +
          (known ? std::string("it is ") + ckptdb_state_name(state) : std::string("no record")) +
          "), but its commit witness " + f.path +
          " verifies: the catalog lost synced records (a damaged or truncated log or table)" +
          repair);
    }
    const uint64_t recorded = it->second.record.manifest_xxh3;
    if (recorded != 0 && recorded != f.witness.manifest_xxh3) {
      return Status::Corrupt("commit witness " + f.path + " records manifest xxh3 " +
                             format::Hex64(f.witness.manifest_xxh3) + " for " + v +
                             ", the catalog " + format::Hex64(recorded) + repair);
    }
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
