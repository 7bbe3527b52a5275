// Tier spec strings (DESIGN.md section 5): tiers fastest first, separated by ';', each
// KIND:ARG[,key=value]...
//   ram:8G,keep=2;disk:/nvme/ck,every=10,keep=3
// Kinds: ram (a shared-memory arena of SIZE bytes, ARG = SIZE), tmpfs (a directory on a memory
// file system), disk (a directory on a block device, O_DIRECT where allowed) and nfs (a
// directory on an NFSv3 server, reached through libnfs with no kernel mount: ARG = HOST:/PATH,
// an IPv6 host in brackets). Options: keep=N (newest N committed versions kept, N >= 1; default:
// all), every=N (the tier takes versions divisible by N; default 1); for ram only dir=PATH (where
// the arena file lives; default /dev/shm) and replicas=SIZE (the most memory the rank keeps its
// peers' replicas in, in that directory; default: what the file system has); for nfs only
// port=N (the NFS port; default: ask the server's portmapper) and mountport=N (the MOUNT
// protocol's port; default: ask the portmapper). A ram tier, if any, is the first tier.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace ckpt::io {

enum class TierKind : uint8_t { kTmpfs, kDisk, kRam, kNfs };

struct TierSpec {
  TierKind kind = TierKind::kDisk;
  // Directory tiers: the directory, as written, made absolute by ParseTierSpecs' base.
  // ram: the directory that holds the arena file (dir=, default /dev/shm).
  // nfs: the directory as an nfs:// path of io/nfs_io.h ("nfs://HOST:PORT:MOUNTPORT/PATH"), which
  // the Io of NewPosixIo opens through libnfs.
  std::string path;
  uint64_t keep = 0;  // 0 = keep every committed version
  uint64_t every = 1;
  uint64_t capacity_bytes = 0;  // ram only: the arena's size, a multiple of 4096
  uint64_t replica_bytes = 0;   // ram only: peers' replicas' budget (replicas=); 0: none set
  std::string host;             // nfs only: the server as written (an IPv6 one in brackets)
  std::string remote_dir;       // nfs only: the absolute directory on the server
  uint16_t port = 0;            // nfs only: port=, 0: the portmapper's answer
  uint16_t mount_port = 0;      // nfs only: mountport=, 0: the portmapper's answer
  // The tier's identity in the catalog: "kind:path" for directory tiers, "nfs:HOST:/PATH" for an
  // nfs tier (its ports are not part of it: a server may move), "ram" for the ram tier (a store
  // has at most one, and its copies belong to it wherever its arena file lives).
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
// that is not the first, two tiers with the same path, more than CKPTDB_MAX_TIERS tiers; for
// nfs, a missing or malformed host, a relative or unnormalized server path, a port out of range.
Status ParseTierSpecs(std::string_view spec, const std::string& base_dir,
                      std::vector<TierSpec>* out);

// The spec text of one parsed tier, with its options, that parses back to the same TierSpec:
// "ram:1073741824,dir=/dev/shm,keep=2", "disk:/nvme/ck,keep=3,every=10",
// "nfs:filer:/export/ck,port=2049,mountport=20048". The catalog records the
// tiers of the last read-write open in this form for the read-only tools.
std::string FormatTierSpec(const TierSpec& tier);

}  // namespace ckpt::io
