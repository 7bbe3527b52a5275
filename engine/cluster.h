// Cluster: one rank's part in a job of world_size ranks (DESIGN.md sections 6-7,
// docs/commit-protocol.md): membership, the cross-rank two-phase commit, replication of each
// version to the rank's placement peers' memory, and fetching a rank's segment back from them.
//
// Every rank runs a Transport with a listener. Rank 0 also runs the coordinator: it keeps the
// membership table (rank -> node_id, address, incarnation), the epoch (bumped, durably, at every
// coordinator start and every membership change; a vote carries the epoch and incarnation it was
// cast in, and any other is refused, which fences a zombie), the votes, and the decisions, which
// it writes to its catalog (synced) before telling anyone. A rank that is silent for
// dead_after_ms is declared dead: undecided versions are aborted and the epoch moves on.
//
// Placement is GEMINI's Algorithm 1 over nodes (redundancy/placement.h): node i's ranks send their
// segment to one rank on each other node of i's holder set. A replica is stored in the receiving
// node's memory (the ram tier's directory, a tmpfs) as a segment file, every chunk checked against
// its xxh3 before it is acknowledged. The receiving rank's process (or `ckptdb serve` after the
// trainer died) serves it back by byte range.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/catalog.h"
#include "engine/coordinator.h"
#include "engine/holdings.h"
#include "engine/parity_store.h"
#include "engine/replica_store.h"
#include "engine/traffic_interleaver.h"
#include "redundancy/erasure_code.h"
#include "redundancy/placement.h"
#include "transport/transport.h"
#include "util/status.h"

namespace ckpt::transport {
class RmaDomain;
class RmaWindow;
}  // namespace ckpt::transport

namespace ckpt::engine {

struct PeerWindow;  // engine/cluster_rma.h

struct ClusterOptions {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string node_id;
  std::string coordinator;  // host:port of rank 0's listener
  std::string listen;       // host:port (port 0: any); empty: the coordinator's host, any port
  std::string job_token;
  // Every call on the replica and parity files (nullptr: the cluster's own POSIX Io); the Db
  // passes its own, so that fault injection reaches them. Must outlive the cluster.
  io::Io* io = nullptr;
  // Once listening, "host:port\n" (the address bound, port 0 resolved) is written here: how a
  // launcher learns the port of a rank 0 given port 0 (CKPTDB_REPORT_FD). -1: nowhere.
  int report_fd = -1;
  std::string tls;                     // UCX_TLS; empty: UCX's choice
  uint32_t replicas = 1;               // copies of each rank's segment in memory, its own included
  std::string replica_dir;             // where this node keeps peers' replicas (a tmpfs directory)
  uint32_t replica_keep = 2;           // replicas kept per peer rank (newest first)
  uint64_t replica_budget_bytes = 0;   // the most memory peers' replicas take; 0: the file system's
  uint64_t bandwidth_bytes_per_s = 0;  // replication cap; 0: none
  InterleaveOptions interleave;        // GEMINI's interleaving with the trainer's traffic
  int heartbeat_ms = 200;
  int dead_after_ms = 3000;
  int join_timeout_ms = 60000;
  int call_timeout_ms = 30000;
  // ec:K+M or xor:K instead of replicas: the rank's coding group (K + M ranks on distinct nodes)
  // keeps parity of each member's segment in the others' memory (redundancy/stripe_layout.h).
  std::optional<redundancy::CodeSpec> code;
  uint64_t code_unit_bytes = uint64_t{4} << 20;  // the unit segments are cut into for coding
  std::string parity_dir;                        // where this rank keeps the parity it holds
  uint64_t job_id = 0;                           // written into the parity segments
  // `ckptdb serve`: not a rank but a node's daemon that serves the replicas kept under
  // replica_dir (the node's ram directory: every ckptdb-replicas-r* in it) to a restarting job,
  // announcing them to the coordinator every heartbeat. rank and world_size are unused.
  bool serve_only = false;
};

// A range of a local segment image to send (the ram arena's extents).
struct SendExtent {
  uint64_t logical_offset = 0;
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

struct ReplicaHolder {
  uint32_t rank = 0;  // kServeRank: a `ckptdb serve` daemon on node_id
  std::string node_id;
  std::string address;
};

struct ClusterStats {
  uint64_t replica_bytes_sent = 0;
  uint64_t replica_bytes_received = 0;
  uint64_t replica_ns = 0;
  uint64_t fetch_bytes = 0;
  uint64_t served_bytes = 0;  // replica bytes sent to ranks that fetched them
  uint64_t refused = 0;
  uint64_t epoch = 0;
  // How this rank's replicas and fetches travel to each peer it used, in rank order:
  // "rank 1 rma:posix; rank 2 socket" (rma: one-sided UCX puts and gets over shared memory;
  // socket: ckptdb's own connection; ucx-am: UCX active messages, RDMA).
  std::string paths;
};

class Cluster {
 public:
  struct Hooks {
    // A decision for `version` arrived from the coordinator. Must record it before returning.
    // `why`: for an abort, what made the coordinator abort it ("" when not known).
    std::function<Status(uint64_t version, bool committed, const std::string& why)> decided;
    // The oldest version whose yes this rank sent and whose decision it still waits for (0:
    // none). Each heartbeat names it, and its reply carries the decision once there is one: a
    // decision whose telling failed (a partition, a dropped connection) still arrives.
    std::function<uint64_t()> waiting;
    // Committed versions this rank can restore from its own tiers, newest first.
    std::function<std::vector<uint64_t>()> local_versions;
    // Whether `version` is at or below the newest version this rank's catalog records committed
    // (COMMITTED or RETIRED): no rank may put it again. A peer that begins a replica of a
    // version this rank holds sealed replaces it unless so: every rank takes part in every
    // version, so a version above this rank's newest commit never committed, and the sealed
    // replica is what a killed incarnation of its owner left of a version that was aborted or
    // never decided (the restarted job puts that version number again, with the new run's bytes).
    std::function<bool(uint64_t version)> committed;
    // What it can serve a rebuild (read_own): the versions in its ram tier, newest first
    // (committed ones, and those it has voted for, whose ram copy is their commit tier's), and
    // the newest version it had sent a vote for when it listed them.
    struct InMemory {
      std::vector<uint64_t> versions;
      uint64_t voted_through = 0;
      std::vector<ArcReport> arc;  // those of `versions` an "arc" replica group deduplicated
    };
    std::function<InMemory()> memory_versions;
    // Bytes [offset, offset + bytes) of this rank's own segment of `version`, from its memory:
    // the other members of its coding group read its units to rebuild a lost member.
    std::function<Status(uint64_t version, uint64_t offset, uint64_t bytes, uint8_t* out)> read_own;
    // The size of this rank's own segment of `version` in its memory (read_own's bounds).
    std::function<Status(uint64_t version, uint64_t* bytes)> own_bytes;
    // A durable file copy of this rank's own segment of `version` on one of its directory tiers
    // (served when it is not in memory and the asker takes any tier).
    std::function<Status(uint64_t version, std::string* path)> own_file;
  };

  // Joins the job: starts the transport (and the coordinator on rank 0), registers and waits
  // until every rank has (join_timeout_ms). `catalog` is rank 0's, for decisions and the epoch.
  static Status Start(const ClusterOptions& options, Hooks hooks, Catalog* catalog,
                      std::unique_ptr<Cluster>* out);
  ~Cluster();

  const ClusterOptions& options() const { return options_; }
  // The job's epoch as this rank's votes carry it: the one it joined in, or on rank 0 its
  // coordinator's current one.
  uint64_t epoch() const { return coordinator_ != nullptr ? coordinator_->epoch() : epoch_.load(); }
  const std::string& address() const { return transport_->address(); }

  // Makes a version's redundancy safe before the rank may vote: its replicas in its placement
  // peers' memory (each acknowledged verified), or its part of its coding group's parity (sealed
  // at every member). Ok at once without redundancy.
  Status Protect(uint64_t version, uint64_t file_bytes, const std::vector<SendExtent>& extents);

  // REFT's check before replicas are trusted (ckptdb_declare_replicas): this rank's digests of
  // the shards it put as replicated in `version`, sorted by name, go to the coordinator, which
  // answers once every member of replica group `group` has sent its own (Busy until then, asked
  // again up to the call timeout): Ok when all are equal, Corrupt naming the first shard and the
  // ranks that differ, or the members' disagreement on the group itself.
  using ReplicaDigest = engine::ReplicaDigest;
  Status CheckReplicas(uint64_t version, uint32_t group, const std::vector<uint32_t>& members,
                       uint8_t protection, uint64_t chunk_bytes,
                       const std::vector<ReplicaDigest>& digests);
  // Pushes a version's segment image to this rank's placement peers and waits for each to
  // acknowledge a verified copy. Ok at once when replicas = 1.
  Status Replicate(uint64_t version, uint64_t file_bytes, const std::vector<SendExtent>& extents);
  // This rank's coding group and its position in it (nullopt without a code). Valid after Start.
  const std::optional<CodingGroup>& Group() const { return group_; }
  uint32_t GroupPosition() const { return group_position_; }
  // This rank's segment of `version`, rebuilt from its coding group: the other members' units
  // and the parity they hold, decoded unit by unit as it is read (engine/cluster_coding.cc).
  class Rebuild;
  Status OpenRebuild(uint64_t version, std::unique_ptr<Rebuild>* out);
  // Casts this rank's vote for `version` (after PREPARED is durable). The decision arrives
  // later through Hooks::decided.
  Status Vote(uint64_t version);
  // Tells the coordinator this rank cannot prepare `version` (`why`, for its log): it aborts the
  // version for every rank at once. ESTATE when the coordinator had committed it.
  Status VoteAbort(uint64_t version, const std::string& why);
  // Committed versions the coordinator has decided, and for versions newer than any this
  // rank holds, whether they are committed: used to resolve PREPARED versions at open.
  Status Decisions(std::set<uint64_t>* committed);
  // The newest committed version every live rank can restore (from its own tiers or from a
  // peer's replica), as the coordinator computes it: the same answer on every rank.
  Status Latest(uint64_t* version);
  // Whether every rank can restore committed `version` from memory, and how many more node
  // losses that survives, as the coordinator computes it from every rank's holdings.
  Status Recoverable(uint64_t version, RecoverableInfo* out);
  // Ranks holding a verified replica of `owner`'s segment of `version`.
  Status Holders(uint32_t owner, uint64_t version, std::vector<ReplicaHolder>* out);
  // Reads [offset, offset + bytes) of owner's replica of `version` from `holder` into dst.
  // owner == holder.rank reads the holder's own segment: from its memory, or with any_tier from
  // whichever of its tiers holds it (a replica group's member gathering slices).
  Status Fetch(const ReplicaHolder& holder, uint32_t owner, uint64_t version, uint64_t offset,
               void* dst, uint64_t bytes, bool any_tier = false);

  // Several ranges of owner's replica of `version` on `holder`, kept in flight together (a
  // restore's missing chunks): (*results)[i] says how range i went. The returned status is the
  // first failure of the holder itself (vanished, timed out); ranges not attempted then carry it.
  struct FetchRange {
    uint64_t offset = 0;
    uint8_t* dst = nullptr;
    uint64_t bytes = 0;
  };
  Status FetchRanges(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                     const std::vector<FetchRange>& ranges, std::vector<Status>* results,
                     bool any_tier = false);

  // The size of owner's replica of `version` on `holder`.
  Status ReplicaBytes(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                      uint64_t* bytes, bool any_tier = false);
  // The rank has recovered (its holdings are final for this incarnation): tells the
  // coordinator at once. Latest and Holders wait for every live rank's Ready, so that no answer
  // is computed from what a rank held before it recovered.
  void Ready();
  // The trainer's hints (CKPTDB_HINT_* bits, already checked): its network busy or idle, an
  // iteration begun (engine/traffic_interleaver.h).
  void Hint(unsigned hints);
  TrafficInterleaver::Stats interleave_stats() const { return interleaver_.stats(); }
  // The trainer waits on this rank's store (engine/traffic_interleaver.h): begins, then ends.
  void TrainerWaits(bool begins) { interleaver_.TrainerWaits(begins); }
  // From now on replication waits for no idle span (the store is closing).
  void StopInterleaving() { interleaver_.Stop(); }
  ClusterStats stats() const;
  // The placement over this job's nodes (valid after Start).
  const redundancy::Placement& placement() const { return placement_; }
  std::vector<uint32_t> ReplicaTargets() const;  // the ranks this rank's segment goes to
  // Rank `rank`'s node and address, from the membership table (to read its own segment with
  // ReplicaBytes and FetchRanges, owner == rank: a replica group's member gathering slices).
  Status MemberAt(uint32_t rank, ReplicaHolder* out) const;
  // serve_only: the replicas this daemon holds now, (owner rank, version).
  std::vector<std::pair<uint32_t, uint64_t>> HeldReplicas() const;

  // A member as the membership table names it (what the coordinator sent at join).
  struct MemberAddress {
    std::string node_id;
    std::string address;
  };

 private:
  explicit Cluster(ClusterOptions options, Hooks hooks, Catalog* catalog);
  Status Join();
  Status ReportAddress() const;  // to options_.report_fd
  void Handle(const transport::Request& request, transport::Reply* reply);
  void HeartbeatLoop();
  void SendHeartbeat();
  // Counts bytes this rank sent to protect a version (replicas or parity) and the time it took.
  void RecordRedundancyTraffic(uint64_t sent, std::chrono::steady_clock::time_point start);
  Status PeerFor(const std::string& address, transport::PeerId* out);
  void DropPeer(const std::string& address);
  // Drops the connection to `address` when `st` says the peer vanished or timed out (the next
  // call reconnects); true if it did.
  bool DropIfGone(const Status& st, const std::string& address);
  // Replica store (this node's memory).
  // The directories replicas are read from: replica_dir, or for serve_only every
  // ckptdb-replicas-r* under it.
  std::vector<std::string> ReplicaDirs() const;
  std::string FindReplica(uint32_t owner, uint64_t version) const;  // empty: not held
  transport::PayloadPlace PlaceReplicaPiece(uint16_t type, std::span<const uint8_t> body,
                                            size_t payload_bytes);
  // The first call of a replica's push (kPhaseBegin): the holder maps its memory.
  Status BeginReplica(transport::PeerId peer, std::vector<uint8_t> body, uint64_t file_bytes);
  void HandleReplica(const transport::Request& request, transport::Reply* reply);
  void HandleFetch(const transport::Request& request, transport::Reply* reply);
  // One-sided windows (engine/cluster_rma.cc, engine/cluster_rma.h).
  void HandleWindow(const transport::Request& request, transport::Reply* reply);
  // Where slot `slot` of the window `id` this rank granted connection `from` is, for `bytes`
  // (checked against the grant, the slot count and the slot size; `what` names the call).
  Status WindowSlot(transport::PeerId from, uint64_t id, uint32_t slot, uint64_t bytes,
                    const std::string& what, uint8_t** at,
                    std::shared_ptr<transport::RmaWindow>* keep);
  // The window of the peer at `address` (rank `rank`, or kServeRank) for this rank, asked for
  // and attached on first use; nullptr where no one-sided path reaches it (remembered until the
  // peer is dropped). Records the path in stats().paths.
  std::shared_ptr<PeerWindow> WindowFor(const std::string& address, transport::PeerId peer,
                                        uint32_t rank);
  void DropWindow(const std::string& address);
  void WindowMakerLoop();
  bool PeerOnThisHost() const;     // another member's address names this rank's listening host
  bool ListensOnLoopback() const;  // its listener is on 127.0.0.0/8 or ::1
  // Sends [offset, offset + bytes) of `map` to `to` as the reply's payload (from the file, on the
  // socket path), or copies it into a window's slot (in_window) for the asker to get.
  void ServeMapped(std::shared_ptr<MappedFile> map, uint64_t offset, uint64_t bytes,
                   uint8_t* in_window, transport::PeerId to, transport::Reply* reply);
  // Coding groups (engine/cluster_coding.cc).
  Status ComputeGroupLocked();
  Status AnnounceToGroup(uint64_t version, uint64_t file_bytes, int wait_ms,
                         const std::string& what);
  Status BuildParity(uint64_t version, uint64_t file_bytes, const std::vector<SendExtent>& extents);
  Status SendUnits(uint64_t version, uint64_t file_bytes, const std::vector<SendExtent>& extents,
                   int64_t start_ms, uint64_t* sent);
  // Encoded at the senders: buffers of a piece's M partial products, (8 + M) x 4 MiB at most,
  // reused by every version (SendUnits, on the push lane only).
  std::vector<std::shared_ptr<std::vector<uint8_t>>> partial_pool_;
  void HandleParity(const transport::Request& request, transport::Reply* reply);
  // Sends a kParity call to member `position` of this rank's group (to the local store when it
  // is this rank), retrying while the answer is Busy, for up to timeout_ms.
  Status CallParity(uint32_t position, const std::vector<uint8_t>& body, const void* payload,
                    size_t payload_bytes, int timeout_ms, std::vector<uint8_t>* reply_body,
                    void* reply_buffer = nullptr, size_t reply_capacity = 0);
  // Waits while the hint says the network is busy and while the bandwidth cap says `sent`
  // bytes since start_ms are ahead of it (GEMINI's traffic interleaving).
  void Pace(uint64_t sent, int64_t start_ms);
  std::vector<uint8_t> Holdings() const;
  void ServeLoop();  // serve_only: announces the held replicas to the coordinator
  Status CastVote(uint64_t version, bool yes, const std::string& why);
  Status TellDecision(uint32_t rank, const std::string& address,
                      const Coordinator::Announcement& d);
  Status AskCoordinator(uint16_t type, std::vector<uint8_t> body, std::vector<uint8_t>* reply);
  Status ComputePlacementLocked();

  const ClusterOptions options_;
  TrafficInterleaver interleaver_{options_.interleave};
  std::unique_ptr<io::Io> owned_io_;  // when options_.io is nullptr
  io::Io* io_ = nullptr;              // set in Start, before anything uses it
  // Where rank 0's coordinator listens: options_.coordinator, its port resolved when it was 0.
  // Resolved in Start before anyone can know the port, so before anything reads it.
  std::string coordinator_address_;
  Hooks hooks_;
  Catalog* catalog_;  // rank 0: the coordinator's decisions and epoch
  // Rank 0 (not serve_only): the coordinator, its own lock and thread (coordinator.h). Stopped
  // first and destroyed after the transport, whose service threads call it.
  std::unique_ptr<Coordinator> coordinator_;
  uint64_t incarnation_ = 0;
  std::unique_ptr<ReplicaStore> replicas_;  // peers' replicas in this node's memory (replicas > 1)
  std::unique_ptr<ParityStore> parity_;     // the parity this rank holds for its coding group
  std::optional<CodingGroup> group_;        // set at join, with a code
  uint32_t group_position_ = 0;
  std::unique_ptr<transport::Transport> transport_;
  std::shared_ptr<transport::RmaDomain> rma_;  // nullptr: no one-sided path (UCX_TLS)
  mutable std::mutex rma_mu_;                  // the windows below
  std::map<transport::PeerId, std::shared_ptr<transport::RmaWindow>> windows_;  // granted
  std::deque<transport::PeerId> window_order_;                                  // oldest first
  std::map<std::string, std::shared_ptr<PeerWindow>> remote_windows_;  // attached, by address
  std::set<std::string> no_window_;        // addresses without a one-sided path
  std::map<uint32_t, std::string> paths_;  // by peer rank (rma_mu_)
  // Made ahead by window_maker_ (rma_mu_), which runs where a peer listens on this host.
  std::shared_ptr<transport::RmaWindow> spare_window_;
  std::condition_variable rma_cv_;  // a spare was taken, or stop
  std::thread window_maker_;
  std::atomic<uint64_t> epoch_{0};  // the epoch this rank joined in (rank 0: its coordinator's)
  std::atomic<bool> stop_{false};
  std::atomic<bool> ready_{false};
  std::thread heartbeat_;
  std::thread serve_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, transport::PeerId> peers_;  // by address
  std::vector<MemberAddress> table_;                // the membership as last received
  redundancy::Placement placement_;
  ClusterStats stats_;
};

// Tests: the protocol version this process's ranks and daemons announce (kProtocolVersion
// unless set).
void SetProtocolVersionForTesting(uint32_t version);

// Parses "none", "replicate:M" (M copies in memory on M distinct nodes, 1 <= M <= 8), "ec:K+M"
// and "xor:K" (a coding group of K + M ranks on distinct nodes; *code set, *replicas 1).
Status ParseRedundancy(const std::string& text, uint32_t* replicas,
                       std::optional<redundancy::CodeSpec>* code);

class Cluster::Rebuild {
 public:
  ~Rebuild();
  uint64_t file_bytes() const;
  // Reads [offset, offset + bytes) of the rebuilt segment image, decoding the units it touches
  // (kept for later reads).
  Status Read(uint64_t offset, void* out, uint64_t bytes);
  // What was read of [offset, offset + bytes) failed a check: the units it touches are decoded
  // again from another choice of K blocks by the next Read. False when no choice is left.
  bool Retry(uint64_t offset, uint64_t bytes);
  // Forgets which members and holders failed (a later restore may find them back); what failed
  // its checks stays known.
  void Refresh();
  // The source's name for last_restore_sources ("rebuild:ec:2+2").
  std::string Source() const;

 private:
  friend class Cluster;
  struct Impl;
  explicit Rebuild(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::engine
