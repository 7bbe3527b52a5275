// What the parts of Cluster and rank 0's Coordinator share (cluster.cc: starting, membership,
// heartbeats, requests, the rank's calls; coordinator.cc and coordinator_replica_checks.cc: the
// coordinator; cluster_replication.cc: replicas in peers' memory, fetches; cluster_coding.cc,
// cluster_rma.cc). Not part of any interface.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/cluster_wire.h"
#include "redundancy/erasure_code.h"
#include "redundancy/placement.h"
#include "transport/transport.h"
#include "transport/wire.h"
#include "util/status.h"

namespace ckpt::engine::cluster_internal {

using redundancy::CodeSpec;
using redundancy::ComputeCodingGroups;
using redundancy::ComputePlacement;
using redundancy::ParseCodeSpec;
using redundancy::PlacementStrategy;
using transport::Reply;
using transport::Request;
using transport::WireReader;
using transport::WireWriter;
using namespace cluster_wire;

// One replica call's payload. Large: each piece is a rendezvous with its own round trips and
// service-thread hops, and on tcp 8 MiB pieces held replication to 2.1 GB/s where 64 MiB ones
// reach 3 GB/s (docs/performance.md). The receiver never buffers one: it lands in the replica.
inline constexpr uint64_t kMaxPieceBytes = 64ull << 20;
inline constexpr uint32_t kPiecesInFlight = 4;  // 256 MiB of a replica on the wire at once
inline constexpr size_t kMaxTable = 1 << 20;

// A kReplica call is one of: the begin (no payload; the receiver makes room for the replica, off
// its progress thread), a piece (payload), the seal (no payload; the receiver checks the image),
// or a piece the sender put into a slot of the receiver's window (no payload:
// engine/cluster_rma.h).
inline constexpr uint8_t kPhasePiece = 0;
inline constexpr uint8_t kPhaseBegin = 1;
inline constexpr uint8_t kPhaseSeal = 2;
inline constexpr uint8_t kPhaseLanded = 3;

// The body of a kReplica call (Cluster::Replicate writes it).
struct ReplicaPiece {
  uint32_t owner = 0;
  uint64_t version = 0;
  uint64_t file_bytes = 0;
  uint64_t offset = 0;
  uint8_t phase = 0;  // kPiecePhase*
  // kPhaseLanded: where the piece is, and its length.
  uint64_t window = 0;
  uint32_t slot = 0;
  uint64_t bytes = 0;
};

Status DecodeReplicaPiece(std::span<const uint8_t> body, const std::string& what,
                          ReplicaPiece* out);

// "0 1 2 3", or "0 1 2 3 4 5 6 7 ... (1024 ranks)": error replies must fit a message body.
inline std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    text += (text.empty() ? "" : " ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > 8) text += " ... (" + std::to_string(ranks.size()) + " ranks)";
  return text;
}

// Whether a holdings list names owner's replica of `version`.
inline bool Holds(const std::vector<std::pair<uint32_t, uint64_t>>& replicas, uint32_t owner,
                  uint64_t version) {
  return std::find(replicas.begin(), replicas.end(), std::make_pair(owner, version)) !=
         replicas.end();
}

// Whether member m can serve its units of `version` to a rebuild: they are read from its ram tier
// only (read_own). Its holdings list which versions are there, those it has voted for included;
// a version it voted for after it listed them is there (its commit tier is ram) until holdings
// listed after that vote say otherwise.
// Whether member m holds its parity of `version` for group g: its holdings list it, or it voted
// for the version after it listed them (its vote follows its group's parity being sealed).
template <typename M>
bool HoldsParity(const M& m, uint32_t g, uint64_t version) {
  return Holds(m.parity, g, version) ||
         (m.voted.count(version) && version > m.memory_voted_through);
}

template <typename M>
bool InMemory(const M& m, uint64_t version) {
  if (std::find(m.memory_versions.begin(), m.memory_versions.end(), version) !=
      m.memory_versions.end()) {
    return true;
  }
  return m.voted.count(version) && version > m.memory_voted_through;
}

// The protocol version this process announces (kProtocolVersion but in tests).
extern std::atomic<uint32_t> g_protocol;

// Ok when a peer's announced protocol is this build's; Invalid naming both otherwise.
Status CheckProtocol(WireReader* r, const std::string& who);

}  // namespace ckpt::engine::cluster_internal
