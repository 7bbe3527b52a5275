// Tier spec strings (DESIGN.md section 5): tiers fastest first, separated by ';', each
// KIND:ARG[,key=value]...
//   tmpfs:/dev/shm/ck,keep=2;disk:/nvme/ck,every=10,keep=3
// Kinds this build stores on: tmpfs (a directory on a memory file system) and disk (a directory
// on a block device, O_DIRECT where allowed). ram and nfs are recognised and refused with
// NotSupported until their issues land. Options: keep=N (newest N committed versions kept,
// N >= 1; default: all), every=N (the tier takes versions divisible by N; default 1).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace ckpt::io {

enum class TierKind : uint8_t { kTmpfs, kDisk };

struct TierSpec {
  TierKind kind = TierKind::kDisk;
  std::string path;   // as written, made absolute by ParseTierSpecs' base
  uint64_t keep = 0;  // 0 = keep every committed version
  uint64_t every = 1;
  std::string name;  // canonical "kind:path", used as the tier's identity in the catalog
};

const char* TierKindName(TierKind kind);

// Parses a whole spec. Relative paths are resolved against base_dir (the process's working
// directory when empty). Every malformed input gets an Invalid status naming the tier (by its
// 1-based position and text), the offending piece and what was expected: empty spec, empty
// tier, missing ':', unknown kind, empty path, unknown or repeated option, option without '=',
// non-numeric, zero or overflowing numbers, two tiers with the same path, more than
// CKPTDB_MAX_TIERS tiers.
Status ParseTierSpecs(std::string_view spec, const std::string& base_dir,
                      std::vector<TierSpec>* out);

}  // namespace ckpt::io
