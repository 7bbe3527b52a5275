// Tier spec strings (DESIGN.md section 5): tiers fastest first, separated by ';', each
// KIND:ARG[,key=value]...
//   ram:8G,keep=2;disk:/nvme/ck,every=10,keep=3
// Kinds this build stores on: ram (a shared-memory arena of SIZE bytes, ARG = SIZE), tmpfs (a
// directory on a memory file system) and disk (a directory on a block device, O_DIRECT where
// allowed). nfs is recognised and refused with NotSupported until its issue lands. Options:
// keep=N (newest N committed versions kept, N >= 1; default: all), every=N (the tier takes
// versions divisible by N; default 1), and for ram only dir=PATH (where the arena file lives;
// default /dev/shm) and replicas=SIZE (the most memory the rank keeps its peers' replicas in, in
// that directory; default: what the file system has). A ram tier, if any, is the first tier.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace ckpt::io {

enum class TierKind : uint8_t { kTmpfs, kDisk, kRam };

struct TierSpec {
  TierKind kind = TierKind::kDisk;
  // Directory tiers: the directory, as written, made absolute by ParseTierSpecs' base.
  // ram: the directory that holds the arena file (dir=, default /dev/shm).
  std::string path;
  uint64_t keep = 0;  // 0 = keep every committed version
  uint64_t every = 1;
  uint64_t capacity_bytes = 0;  // ram only: the arena's size, a multiple of 4096
  uint64_t replica_bytes = 0;   // ram only: peers' replicas' budget (replicas=); 0: none set
  // The tier's identity in the catalog: "kind:path" for directory tiers, "ram" for the ram tier
  // (a store has at most one, and its copies belong to it wherever its arena file lives).
  std::string name;
};

const char* TierKindName(TierKind kind);

// Smallest and largest ram arena: room for a header and a few chunk records; the largest keeps
// every offset arithmetic far from overflow and is more memory than any node has.
inline constexpr uint64_t kMinRamBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxRamBytes = uint64_t{1} << 50;
inline constexpr std::string_view kDefaultRamDir = "/dev/shm";

// Parses a whole spec. Relative paths are resolved against base_dir (the process's working
// directory when empty). Every malformed input gets an Invalid status naming the tier (by its
// 1-based position and text), the offending piece and what was expected: empty spec, empty
// tier, missing ':', unknown kind, empty path, bad ram size, unknown or repeated option, option
// without '=', non-numeric, zero or overflowing numbers, dir= on a directory tier, a ram tier
// that is not the first, two tiers with the same path, more than CKPTDB_MAX_TIERS tiers.
Status ParseTierSpecs(std::string_view spec, const std::string& base_dir,
                      std::vector<TierSpec>* out);

// The spec text of one parsed tier, with its options, that parses back to the same TierSpec:
// "ram:1073741824,dir=/dev/shm,keep=2", "disk:/nvme/ck,keep=3,every=10". The catalog records the
// tiers of the last read-write open in this form for the read-only tools.
std::string FormatTierSpec(const TierSpec& tier);

}  // namespace ckpt::io
