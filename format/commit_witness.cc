#include "format/commit_witness.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "format/checksum.h"
#include "format/little_endian.h"
#include "format/segment_format.h"
#include "util/assert.h"

namespace ckpt::format {
namespace {

using le::Get;
using le::Magic;
using le::Put;

constexpr char kWitnessMagic[9] = "CKPTWIT1";
constexpr char kDecisionMagic[9] = "CKPTDEC1";

// 20 decimal digits of name from `at` (no overflow), or false.
bool ParseDigits20(const std::string& name, size_t at, uint64_t* out) {
  uint64_t v = 0;
  for (size_t i = at; i < at + 20; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(name[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

}  // namespace

std::vector<uint8_t> EncodeCommitWitness(const CommitWitness& w) {
  CKPTDB_ASSERT(w.tiers.size() <= kMaxWitnessTiersBytes);
  std::vector<uint8_t> out(kWitnessFixedBytes + w.tiers.size() + 8, 0);
  uint8_t* p = out.data();
  Put<uint64_t>(p, 0, Magic(kWitnessMagic));
  Put<uint32_t>(p, 8, kWitnessFormatVersion);
  Put<uint32_t>(p, 12, w.rank);
  Put<uint64_t>(p, 16, w.job_id);
  Put<uint64_t>(p, 24, w.version);
  Put<uint32_t>(p, 32, w.world_size);
  Put<uint32_t>(p, 36, static_cast<uint32_t>(w.tiers.size()));
  Put<uint64_t>(p, 40, w.chunk_bytes);
  Put<uint64_t>(p, 48, w.data_bytes);
  Put<uint64_t>(p, 56, w.manifest_xxh3);
  Put<uint32_t>(p, 64, w.tensor_count);
  Put<uint32_t>(p, 68, w.chunk_count);
  Put<uint64_t>(p, 72, w.created_unix_ns);
  Put<uint64_t>(p, 80, w.committed_unix_ns);
  Put<uint64_t>(p, 88, w.store_created_unix_ns);
  if (!w.tiers.empty()) std::memcpy(p + kWitnessFixedBytes, w.tiers.data(), w.tiers.size());
  const size_t checked = kWitnessFixedBytes + w.tiers.size();
  Put<uint64_t>(p, checked, Xxh3(p, checked));
  return out;
}

Status DecodeCommitWitness(std::span<const uint8_t> in, const std::string& what,
                           CommitWitness* out) {
  if (in.size() < kWitnessFixedBytes + 8) {
    return Status::Corrupt(what + ": " + std::to_string(in.size()) +
                           " bytes, shorter than a commit witness (" +
                           std::to_string(kWitnessFixedBytes + 8) + " at least)");
  }
  const uint8_t* p = in.data();
  if (Get<uint64_t>(p, 0) != Magic(kWitnessMagic)) {
    return Status::Corrupt(what + ": not a ckptdb commit witness (bad magic at offset 0)");
  }
  const uint32_t tiers_bytes = Get<uint32_t>(p, 36);
  if (tiers_bytes > kMaxWitnessTiersBytes || in.size() != kWitnessFixedBytes + tiers_bytes + 8) {
    return Status::Corrupt(what + ": its tier spec length at offset 36 (" +
                           std::to_string(tiers_bytes) + ") does not match the file's " +
                           std::to_string(in.size()) + " bytes");
  }
  const size_t checked = kWitnessFixedBytes + tiers_bytes;
  CKPTDB_RETURN_IF_ERROR(
      CheckXxh3(p, checked, Get<uint64_t>(p, checked),
                what + ": witness (checksum at offset " + std::to_string(checked) + ")"));
  const uint32_t format_version = Get<uint32_t>(p, 8);
  if (format_version != kWitnessFormatVersion) {
    return Status::NotSupported(what + ": commit witness format version " +
                                std::to_string(format_version) + ", this build reads " +
                                std::to_string(kWitnessFormatVersion));
  }
  CommitWitness w;
  w.rank = Get<uint32_t>(p, 12);
  w.job_id = Get<uint64_t>(p, 16);
  w.version = Get<uint64_t>(p, 24);
  w.world_size = Get<uint32_t>(p, 32);
  w.chunk_bytes = Get<uint64_t>(p, 40);
  w.data_bytes = Get<uint64_t>(p, 48);
  w.manifest_xxh3 = Get<uint64_t>(p, 56);
  w.tensor_count = Get<uint32_t>(p, 64);
  w.chunk_count = Get<uint32_t>(p, 68);
  w.created_unix_ns = Get<uint64_t>(p, 72);
  w.committed_unix_ns = Get<uint64_t>(p, 80);
  w.store_created_unix_ns = Get<uint64_t>(p, 88);
  w.tiers.assign(reinterpret_cast<const char*>(p + kWitnessFixedBytes), tiers_bytes);
  if (w.world_size == 0 || w.rank >= w.world_size) {
    return Status::Corrupt(what + ": rank " + std::to_string(w.rank) + " of world size " +
                           std::to_string(w.world_size));
  }
  *out = std::move(w);
  return Status::Ok();
}

std::string WitnessFileName(uint64_t version, uint32_t rank) {
  char b[64];
  std::snprintf(b, sizeof b, "v%020" PRIu64 "-r%05" PRIu32 ".commit", version, rank);
  return b;
}

bool ParseWitnessFileName(const std::string& name, uint64_t* version, uint32_t* rank) {
  // Exactly the shape WitnessFileName writes: 1 + 20 + 2 + 5 + 7 characters.
  if (name.size() != 35 || name[0] != 'v' || name.compare(21, 2, "-r") != 0 ||
      name.compare(28, 7, ".commit") != 0) {
    return false;
  }
  uint64_t v = 0;
  if (!ParseDigits20(name, 1, &v)) return false;
  uint32_t r = 0;
  for (size_t i = 23; i < 28; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    r = r * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  *version = v;
  *rank = r;
  return true;
}

std::vector<uint8_t> EncodeJobDecision(const JobDecision& d) {
  std::vector<uint8_t> out(kDecisionBytes, 0);
  uint8_t* p = out.data();
  Put<uint64_t>(p, 0, Magic(kDecisionMagic));
  Put<uint32_t>(p, 8, kDecisionFormatVersion);
  Put<uint32_t>(p, 12, d.world_size);
  Put<uint64_t>(p, 16, d.job_id);
  Put<uint64_t>(p, 24, d.version);
  Put<uint64_t>(p, 32, d.decided_unix_ns);
  Put<uint64_t>(p, 40, Xxh3(p, 40));
  return out;
}

Status DecodeJobDecision(std::span<const uint8_t> in, const std::string& what, JobDecision* out) {
  if (in.size() != kDecisionBytes) {
    return Status::Corrupt(what + ": " + std::to_string(in.size()) +
                           " bytes, not a decision record's " + std::to_string(kDecisionBytes));
  }
  const uint8_t* p = in.data();
  if (Get<uint64_t>(p, 0) != Magic(kDecisionMagic)) {
    return Status::Corrupt(what + ": not a ckptdb decision record (bad magic at offset 0)");
  }
  CKPTDB_RETURN_IF_ERROR(
      CheckXxh3(p, 40, Get<uint64_t>(p, 40), what + ": decision record (checksum at offset 40)"));
  const uint32_t format_version = Get<uint32_t>(p, 8);
  if (format_version != kDecisionFormatVersion) {
    return Status::NotSupported(what + ": decision record format version " +
                                std::to_string(format_version) + ", this build reads " +
                                std::to_string(kDecisionFormatVersion));
  }
  JobDecision d;
  d.world_size = Get<uint32_t>(p, 12);
  d.job_id = Get<uint64_t>(p, 16);
  d.version = Get<uint64_t>(p, 24);
  d.decided_unix_ns = Get<uint64_t>(p, 32);
  if (d.world_size == 0) return Status::Corrupt(what + ": a decision record of world size 0");
  *out = d;
  return Status::Ok();
}

std::string DecisionFileName(uint64_t version) {
  char b[64];
  std::snprintf(b, sizeof b, "v%020" PRIu64 ".decision", version);
  return b;
}

bool ParseDecisionFileName(const std::string& name, uint64_t* version) {
  // Exactly the shape DecisionFileName writes: 1 + 20 + 9 characters.
  if (name.size() != 30 || name[0] != 'v' || name.compare(21, 9, ".decision") != 0) return false;
  return ParseDigits20(name, 1, version);
}

}  // namespace ckpt::format
