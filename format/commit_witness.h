// The commit witness (docs/format.md, "The commit witness"): a small file per committed version,
// written and fsynced beside the catalog after the catalog's COMMITTED record is durable, and
// removed before the version's record is retired. It is the second, independent record of a
// commit: a catalog that lost a synced record (a damaged or truncated RocksDB log, a lost
// table) is caught at open by a witness it does not account for, and `ckptdb repair` rebuilds
// the catalog from the witnesses and the segments that verify. All integers little-endian.
//
// <root>/commits/v<version, 20 digits>-r<rank, 5 digits>.commit:
//   0   magic "CKPTWIT1"        8  format_version u32     12 rank u32
//   16  job_id u64              24 version u64            32 world_size u32
//   36  tiers_bytes u32         40 chunk_bytes u64        48 data_bytes u64
//   56  manifest_xxh3 u64       64 tensor_count u32       68 chunk_count u32
//   72  created_unix_ns u64     80 committed_unix_ns u64  88 store_created_unix_ns u64
//   96  tiers: tiers_bytes bytes (the store's tier spec when it committed)
//   96 + tiers_bytes: xxh3 u64 of every byte before it
// The file is exactly 104 + tiers_bytes bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::format {

inline constexpr uint32_t kWitnessFormatVersion = 1;
inline constexpr size_t kWitnessFixedBytes = 96;
inline constexpr size_t kMaxWitnessTiersBytes = 16384;
inline constexpr const char* kWitnessDirName = "commits";

struct CommitWitness {
  uint32_t rank = 0;
  uint64_t job_id = 0;
  uint64_t version = 0;
  uint32_t world_size = 1;
  uint64_t chunk_bytes = 0;
  uint64_t data_bytes = 0;
  uint64_t manifest_xxh3 = 0;
  uint32_t tensor_count = 0;
  uint32_t chunk_count = 0;
  uint64_t created_unix_ns = 0;
  uint64_t committed_unix_ns = 0;
  uint64_t store_created_unix_ns = 0;
  std::string tiers;  // at most kMaxWitnessTiersBytes
};

// The witness's bytes. tiers longer than kMaxWitnessTiersBytes is a caller's bug (asserted).
std::vector<uint8_t> EncodeCommitWitness(const CommitWitness& w);
// Checks length, magic, format version and checksum; Corrupt (naming `what` and the offset at
// fault) otherwise.
Status DecodeCommitWitness(std::span<const uint8_t> in, const std::string& what,
                           CommitWitness* out);

// "v00000000000000000003-r00000.commit"; ParseWitnessFileName gives version and rank back, and
// refuses any other name (temporary files included).
std::string WitnessFileName(uint64_t version, uint32_t rank);
bool ParseWitnessFileName(const std::string& name, uint64_t* version, uint32_t* rank);

// The job's decision record (docs/format.md, "The decision record"): in a job of many ranks,
// rank 0 (whose coordinator decides every version) writes one per committed version on each nfs
// tier, beside its own witness, when its copy of the version reaches that tier; a reader of the
// tier directory alone (ckptdb_open with an nfs spec and no root) learns from it that the job
// as a whole committed the version, and how many ranks it had. 48 bytes, little-endian:
//
// <tier>/decisions/v<version, 20 digits>.decision:
//   0   magic "CKPTDEC1"        8  format_version u32     12 world_size u32
//   16  job_id u64              24 version u64            32 decided_unix_ns u64
//   40  xxh3 u64 of bytes 0-39
inline constexpr uint32_t kDecisionFormatVersion = 1;
inline constexpr size_t kDecisionBytes = 48;
inline constexpr const char* kDecisionDirName = "decisions";

struct JobDecision {
  uint64_t job_id = 0;
  uint64_t version = 0;
  uint32_t world_size = 1;
  uint64_t decided_unix_ns = 0;
};

std::vector<uint8_t> EncodeJobDecision(const JobDecision& d);
// Checks length, magic, checksum, format version and world size; Corrupt naming `what`
// otherwise (NotSupported for another format version).
Status DecodeJobDecision(std::span<const uint8_t> in, const std::string& what, JobDecision* out);
// "v00000000000000000003.decision", and back (any other name: false).
std::string DecisionFileName(uint64_t version);
bool ParseDecisionFileName(const std::string& name, uint64_t* version);

}  // namespace ckpt::format
