// What a rank (or a `ckptdb serve` daemon) reports holding in its registration and heartbeats
// (docs/commit-protocol.md): the coordinator's input for latest, holders and recoverable. Its
// wire form is written by EncodeHoldings and read by ParseHoldings, a message from the network
// checked field by field (fuzz/fuzz_holdings.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace ckpt::engine {

// A version in a member's memory whose replicated shards an "arc" replica group deduplicated
// (its manifest records the group): each member keeps its own slice and the next member's.
struct ArcReport {
  uint64_t version = 0;
  uint32_t group = 0;
  bool replicated_only = false;   // written in a job without redundancy: no member has private
                                  // shards, so a lost member's segment is its group's slices
  std::vector<uint32_t> members;  // ascending
  uint8_t protection = 1;         // fb::ReplicaProtection: Arc 1, Aec 2, ArcAec 3
  bool operator==(const ArcReport&) const = default;
};

// The most entries of each list a report carries; EncodeHoldings keeps the first (for parity:
// the last, the newest) and ParseHoldings refuses more.
inline constexpr size_t kMaxLocalVersions = 256;
inline constexpr size_t kMaxHeldReplicas = 4096;
inline constexpr size_t kMaxHeldParity = 4096;
inline constexpr size_t kMaxMemoryVersions = 256;
inline constexpr size_t kMaxArcReports = 16;  // the newest versions a member reports

struct HoldingsReport {
  std::vector<uint64_t> local;                          // committed, on its own tiers
  std::vector<std::pair<uint32_t, uint64_t>> replicas;  // (owner rank, version)
  std::vector<std::pair<uint32_t, uint64_t>> parity;    // (coding group, version)
  uint64_t voted_through = 0;    // its newest vote sent when it listed `memory`
  std::vector<uint64_t> memory;  // committed or voted for, in its ram tier
  std::vector<ArcReport> arc;    // of the versions it holds
  bool operator==(const HoldingsReport&) const = default;
};

// The report's wire form, each list cut to its bound.
std::vector<uint8_t> EncodeHoldings(HoldingsReport report);

// Reads a report from `in` (from a peer: `what` names it); Corrupt for anything EncodeHoldings
// would not have written.
Status ParseHoldings(std::span<const uint8_t> in, const std::string& what, HoldingsReport* out);

}  // namespace ckpt::engine
