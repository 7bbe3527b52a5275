// Rank 0's coordinator (docs/commit-protocol.md, docs/architecture.md): the job's membership as
// rank 0 sees it (registrations, heartbeats, failure detection, epochs), its votes and
// decisions, the replica groups' digest comparisons, and the answers about where data lives
// (latest, holders, recoverable) from every member's and serving daemon's holdings.
//
// It has its own lock and thread. Cluster::Handle routes the coordinator's requests to it; the
// coordinator talks back only through its Tell, which Cluster implements with its transport (and
// rank 0's own hook), called on the coordinator's thread without the coordinator's lock held.
//
// Invariants, asserted in release builds too (util/assert.h): a version is never both committed
// and aborted and no decision is taken back (DecisionLog); the epoch only grows, each one durable
// in the catalog before any reply names it; a decision is durable before it is announced.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/catalog.h"
#include "engine/coordinator_decisions.h"
#include "engine/holdings.h"
#include "redundancy/erasure_code.h"
#include "transport/transport.h"
#include "util/status.h"

namespace ckpt::engine {

// The rank field of a ReplicaHolder that is a `ckptdb serve` daemon rather than a rank.
inline constexpr uint32_t kServeRank = 0xFFFFFFFFu;

// The coordinator's answer to Recoverable (ckptdb_recoverable_t).
struct RecoverableInfo {
  bool recoverable = false;
  int32_t spare_losses = -1;
  uint32_t ranks_local = 0;
  uint32_t ranks_from_peers = 0;
  uint32_t ranks_lost = 0;
  std::string detail;
};

// A replicated shard as a member of a replica group reports it to the coordinator
// (Cluster::CheckReplicas): its name, size, and the xxh3 of its chunks' xxh3s.
struct ReplicaDigest {
  // What the shard is to its member: replicated (every member's), or with REFT's AOR the
  // member's own private shard, or its recomputed replica of the next member's (by that name).
  enum Kind : uint8_t { kReplicated = 0, kPrivate = 1, kRecomputed = 2 };
  std::string name;
  uint64_t bytes = 0;
  uint64_t digest = 0;
  uint8_t kind = kReplicated;
  bool operator==(const ReplicaDigest&) const = default;
};

class Coordinator {
 public:
  struct Options {
    uint32_t world_size = 1;
    uint32_t replicas = 1;
    std::optional<redundancy::CodeSpec> code;
    int heartbeat_ms = 200;
    int dead_after_ms = 3000;
    // Its clock (monotonic milliseconds) and its log of decisions and epochs; empty: MonoMs and
    // a line to stderr. The simulation (engine/simulation.h) gives its own.
    std::function<int64_t()> now_ms;
    std::function<void(const std::string&)> log;
  };
  // A decision to tell the ranks, in the order taken.
  struct Announcement {
    uint64_t version = 0;
    bool committed = false;
    std::string why;  // an abort's cause
  };
  // Tells rank `rank` (listening at `address`) of a decision, waiting for its acknowledgement.
  // Non-Ok: that rank learns it when it next asks (Cluster::Decisions, at its open).
  using Tell =
      std::function<Status(uint32_t rank, const std::string& address, const Announcement& d)>;

  // A rank as the coordinator knows it.
  struct Member {
    std::string node_id;
    std::string address;
    uint64_t incarnation = 0;
    bool registered = false;
    bool dead = false;
    bool ready = false;  // recovered in this incarnation: its holdings are final
    int64_t last_seen_ms = 0;
    std::vector<uint64_t> local_versions;   // newest first
    std::vector<uint64_t> memory_versions;  // in its ram tier, newest first
    uint64_t memory_voted_through = 0;      // its newest vote sent when it listed them
    std::vector<ArcReport> arc;             // its "arc" replica groups' versions in memory
    std::vector<std::pair<uint32_t, uint64_t>> replicas;  // (owner rank, version) it holds
    std::vector<std::pair<uint32_t, uint64_t>> parity;    // (coding group, version) it holds
    std::set<uint64_t> voted;  // committed with its vote in this incarnation: safe at its commit
    void Take(HoldingsReport&& h);
  };

  // The coordinator over rank 0's catalog: a new epoch is recorded first (every vote cast to an
  // older coordinator is void), then the committed decisions are read back.
  static Status Open(const Options& options, Catalog* catalog, Tell tell,
                     std::unique_ptr<Coordinator>* out);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Starts the thread that detects failed ranks and announces decisions; Stop ends it (the
  // requests may still be answered until the transport stops).
  void Start();
  void Stop();
  // The thread's work, for a caller that drives the coordinator without it (the simulation):
  // failure detection, then every pending decision told, in order. Returns how many were told.
  size_t Step();
  size_t pending_announcements() const;

  uint64_t epoch() const { return epoch_.load(); }
  // How many ranks were told the job cannot run (its nodes fit no coding groups).
  size_t refused() const;

  // The requests (Cluster::Handle), each checked as hostile input: a bad body fails the reply,
  // naming the sender, and changes nothing.
  void HandleRegister(const transport::Request& request, transport::Reply* reply);
  void HandleHeartbeat(const transport::Request& request, transport::Reply* reply);
  void HandleVote(const transport::Request& request, transport::Reply* reply);
  void HandleDecisions(const transport::Request& request, transport::Reply* reply);
  void HandleLatest(const transport::Request& request, transport::Reply* reply);
  void HandleHolders(const transport::Request& request, transport::Reply* reply);
  void HandleRecoverable(const transport::Request& request, transport::Reply* reply);
  void HandleReplicaCheck(const transport::Request& request, transport::Reply* reply);
  void HandleServe(const transport::Request& request, transport::Reply* reply);

 private:
  struct ReplicaCheckState {
    std::vector<uint32_t> members;
    uint8_t protection = 0;  // the one every member must have declared (fb::ReplicaProtection)
    uint64_t chunk_bytes = 0;
    std::map<uint32_t, std::vector<ReplicaDigest>> posted;  // by rank
    std::optional<Status> result;
  };
  struct Server {
    std::string node_id;
    std::vector<std::pair<uint32_t, uint64_t>> replicas;
    int64_t last_seen_ms = 0;
  };

  Coordinator(const Options& options, Catalog* catalog, Tell tell);
  // Where a decision is told: a live member's rank, node and address.
  struct Listener {
    uint32_t rank = 0;
    std::string node_id;
    std::string address;
  };
  void Loop();
  int64_t NowMs() const;
  void Log(const std::string& line) const;
  void DetectFailuresLocked();
  std::vector<Listener> ListenersLocked() const;
  void Announce(const Announcement& d, const std::vector<Listener>& listeners);
  Status BumpEpochLocked(const std::string& why);
  Status LearnDecisionsLocked(uint32_t rank, const std::vector<uint64_t>& committed);
  void AbortUndecidedLocked(const std::string& why);
  Status SettledLocked() const;  // Busy while holdings may still change
  bool RebuildableLocked(uint32_t rank, uint64_t version) const;
  std::map<uint32_t, int32_t> ArcSparesLocked(uint64_t version) const;
  Status CompareRecomputed(const ReplicaCheckState& c, const std::string& what) const;
  void AnswerReplicaCheckLocked(uint64_t version, uint32_t group, ReplicaCheckState* check,
                                transport::Reply* reply);

  const Options options_;
  Catalog* const catalog_;  // decisions and the epoch
  const Tell tell_;
  const int64_t started_ms_;
  std::atomic<uint64_t> epoch_{0};  // written under mu_, after the catalog has it
  std::atomic<bool> stop_{false};
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a decision to announce, or stop
  std::vector<Member> members_;
  size_t live_members_ = 0;  // registered and not dead
  // The membership table's wire form (rank order: node_id, address), while no address changes.
  std::shared_ptr<const std::vector<uint8_t>> table_;
  bool complete_ = false;
  bool assembled_ = false;      // complete_ was true once: decisions are no longer learned
  std::set<uint32_t> refused_;  // ranks told the job cannot run (its nodes fit no coding groups)
  DecisionLog decisions_;       // committed (durable in the catalog), aborted, and open votes
  std::map<std::pair<uint64_t, uint32_t>, ReplicaCheckState> replica_checks_;
  std::deque<Announcement> to_announce_;
  std::map<std::string, Server> servers_;  // `ckptdb serve` daemons, by address
};

}  // namespace ckpt::engine
