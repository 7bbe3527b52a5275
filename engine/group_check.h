// CheckCodingGroups: `ckptdb verify`'s check of coding groups (DESIGN.md section 7), across the
// stores of a group's members opened in one process (a job's roots seen from one machine: a
// simulated job, or stores on a shared file system).
//
// For each committed version that a coding group protects, and each of its groups:
//   1. Every member's copies are read and checked chunk by chunk (Db::CheckCopies); a unit of a
//      member's segment image is good in memory when its ram copy reads and no failing record
//      overlaps it.
//   2. Every member's parity segment (<ram dir>/ckptdb-parity-r<rank>/g<group>-v<version>.par)
//      is opened as a segment, its layout compared with the members' and each block checked
//      against its xxh3.
//   3. Parity is recomputed: for each stripe whose K data units all read from some checked copy,
//      the M parity blocks are encoded again (RS re-encode; XOR for xor:K, whose single parity
//      makes the syndrome data ^ parity zero) and compared with every block held.
//   4. Recoverability is counted per stripe, as a rebuild would: a block is there when its
//      member's ram copy of the unit is good, or its parity block checked out; units past a
//      member's segment are zeros and always there. A member's segment restores from its ram
//      copy, else from the group (every stripe of its missing units has K blocks), else from a
//      clean copy on a slower tier. Spare: how many more members (nodes) the group can lose, any
//      of them, and still rebuild every member from memory.
// A member whose store was not given counts as lost: the answer is about what was given.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/db.h"
#include "engine/parity_store.h"
#include "util/status.h"

namespace ckpt::engine {

struct GroupCheck {
  uint64_t version = 0;
  CodingGroup group;
  std::vector<uint64_t> member_bytes;  // per member, 0 where not known
  // Per member: where its segment restores from: "ram", "ram+rebuild" (chunks its ram copy
  // lost, decoded), "rebuild", a slower tier's name, or "lost".
  std::vector<std::string> sources;
  // Per member, its parity segment: "ok", "bad" (a block fails its xxh3 or its recomputation),
  // "missing", "unreadable", or "not given" (its store was not given).
  std::vector<std::string> parity;
  uint64_t stripes = 0;
  uint64_t parity_blocks = 0;   // M per stripe
  uint64_t parity_checked = 0;  // recomputed from the data and compared
  uint64_t parity_bad = 0;      // failing their xxh3 or unequal to the recomputation
  bool recoverable = false;     // every member's segment restores from somewhere
  bool from_memory = false;     // ... from ram copies and the group's parity alone
  int spare = -1;               // more members it may lose, from memory; -1: not from memory
  std::vector<std::string> problems;
};

// Checks every coding group of `version` (CKPTDB_ALL_VERSIONS: of every committed version) that
// has a member among `stores`, calling fn for each. The manifests are read first: versions no
// group protects cost no data reads, and stores with none are not checked further. Ok when each
// group checked is recoverable and its parity clean, with no problem; Corrupt otherwise (the
// checks say what). `layout_only`: only the groups' layouts, from the manifests (sources and
// parity "unchecked", nothing read or recomputed). Invalid: no store, a null one, or, when some
// version is coded, stores of different jobs or two of one rank; NotFound: `version` is
// committed in none of them.
Status CheckCodingGroups(std::span<Db* const> stores, uint64_t version, bool layout_only,
                         const std::function<void(const GroupCheck&)>& fn);

// The count behind GroupCheck's from_memory and spare, kept apart so that a test can hold it
// against an enumeration of loss sets. Per stripe, its K + M blocks are:
struct StripeBlocks {
  uint32_t zeros = 0;           // data units past their member's segment: there, never lost
  uint32_t data_present = 0;    // data units whose member's ram copy of them is good
  uint32_t data_missing = 0;    // data units that are not (they need decoding)
  uint32_t parity_present = 0;  // parity blocks that checked out
};
// -1 when some stripe with a missing unit has fewer than K blocks (not recoverable from memory);
// else the largest x such that losing any x more members leaves every stripe that then misses a
// unit with K blocks, at most M. Each member holds one block of every stripe, so a loss set fails
// a stripe alone: the answer is the least, over stripes, of the smallest set that fails it, less 1.
int SpareMemberLosses(uint32_t k, uint32_t m, std::span<const StripeBlocks> stripes);

}  // namespace ckpt::engine
