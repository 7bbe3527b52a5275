// What the parts of Cluster (engine/cluster*.cc) share: the message types of ckptdb's own
// channel and the helpers every handler uses. Internal to Cluster.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "transport/transport.h"
#include "util/clock.h"
#include "util/status.h"

namespace ckpt::engine::cluster_wire {

enum MessageType : uint16_t {
  kRegister = 20,      // rank -> coordinator
  kHeartbeat = 21,     // rank -> coordinator
  kVote = 22,          // rank -> coordinator
  kDecision = 23,      // coordinator -> rank
  kLatest = 24,        // rank -> coordinator
  kHolders = 25,       // rank -> coordinator
  kDecisions = 26,     // rank -> coordinator
  kReplica = 27,       // rank -> placement peer: a range of a segment image
  kFetch = 28,         // rank -> replica holder: a range of a replica (or of the holder's segment)
  kServe = 29,         // `ckptdb serve` -> coordinator: the replicas a node's daemon serves
  kParity = 30,        // coding group member -> member: building and reading parity
  kRecoverable = 31,   // rank -> coordinator: can every rank restore a version from memory
  kReplicaCheck = 32,  // rank -> coordinator: a replica group's digests of a version, compared
  kWindow = 33,        // rank -> peer: a one-sided window for the asker (engine/cluster_rma.h)
};

// One fetch call's payload at most (restores read chunks, rebuilds read units in such pieces).
inline constexpr uint64_t kMaxFetchBytes = uint64_t{8} << 20;

// The messages' field layout, checked when a rank registers and when `ckptdb serve` announces
// itself: a job runs one build. 2: holdings list the versions in memory, decisions carry a cause.
// 3: holdings list "arc" replica groups' versions, replica checks compare the protection.
// 4: one-sided windows (kWindow; replica pieces "landed" in one; fetches into one).
// 5: holdings' replica-group reports end with the group's protection (arc, aec, arc+aec).
// 6: a replica check's digests carry their kind (replicated, private, recomputed: REFT's AOR),
//    and protections carry bit 4 (aor).
// 7: a parity announce's scheme byte 2: Reed-Solomon encoded at the senders (ec:K+M,encode=sender).
inline constexpr uint32_t kProtocolVersion = 8;  // 8: heartbeats carry the awaited decision

// A heartbeat reply's decision on the version the rank named as awaited.
inline constexpr uint8_t kHeartbeatUndecided = 0;
inline constexpr uint8_t kHeartbeatCommitted = 1;
inline constexpr uint8_t kHeartbeatAborted = 2;

inline void Fail(transport::Reply* reply, const Status& st) {
  reply->status = st.code();
  reply->message = st.message();
  // The message is the reply's body: past transport::kMaxBodyBytes the receiver would drop the
  // connection instead of reading it.
  constexpr size_t kMaxMessage = transport::kMaxBodyBytes - 256;
  if (reply->message.size() > kMaxMessage) {
    reply->message.resize(kMaxMessage);
    reply->message += " ...";
  }
}

}  // namespace ckpt::engine::cluster_wire
