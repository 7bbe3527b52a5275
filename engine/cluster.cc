// Cluster (see cluster.h): starting, membership (joining, heartbeats), dispatching requests, and
// the rank's side of the two-phase commit and of a replica group's comparison. Rank 0's
// coordinator is its own class (coordinator.h), replicas in peers' memory in
// cluster_replication.cc (what they share: cluster_internal.h). Message bodies are WireWriter
// fields in the order written here; docs/commit-protocol.md lists the messages and the order of
// durable steps.
#include "engine/cluster.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <filesystem>

#include "engine/cluster_internal.h"
#include "engine/cluster_rma.h"
#include "engine/cluster_wire.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "transport/rma.h"
#include "transport/wire.h"
#include "util/assert.h"
#include "util/thread_name.h"

namespace ckpt::engine {
namespace cluster_internal {

Status DecodeReplicaPiece(std::span<const uint8_t> body, const std::string& what,
                          ReplicaPiece* out) {
  WireReader r(body, what);
  out->owner = r.U32("owner");
  out->version = r.U64("version");
  (void)r.U64("epoch");
  out->file_bytes = r.U64("file_bytes");
  out->offset = r.U64("offset");
  out->phase = r.U8("phase");
  if (out->phase == kPhaseLanded) {
    out->window = r.U64("window");
    out->slot = r.U32("slot");
    out->bytes = r.U64("bytes");
  }
  Status st = r.Finish();
  if (st.ok() && out->phase > kPhaseLanded) {
    st = Status::Invalid(what + ": unknown phase " + std::to_string(out->phase));
  }
  return st;
}

std::atomic<uint32_t> g_protocol{kProtocolVersion};

// Ok when a peer's announced protocol is this build's; Invalid naming both otherwise.
Status CheckProtocol(WireReader* r, const std::string& who) {
  const uint32_t protocol = r->U32("protocol");
  if (!r->ok() || protocol != kProtocolVersion) {
    return Status::Invalid(
        who + " speaks ckptdb protocol " +
        (r->ok() ? std::to_string(protocol)
                 : "1 (or another older than " + std::to_string(kProtocolVersion) + ")") +
        "; this coordinator speaks " + std::to_string(kProtocolVersion) +
        ": every rank and ckptdb serve of a job must run the same ckptdb build");
  }
  return Status::Ok();
}

}  // namespace cluster_internal

using namespace cluster_internal;

void SetProtocolVersionForTesting(uint32_t version) { g_protocol = version; }

Status ParseRedundancy(const std::string& text, uint32_t* replicas, std::optional<CodeSpec>* code) {
  *replicas = 1;
  code->reset();
  if (text.empty() || text == "none") return Status::Ok();
  const std::string prefix = "replicate:";
  if (text.rfind(prefix, 0) == 0) {
    std::string n = text.substr(prefix.size());
    if (!n.empty() && n.size() <= 2 && std::all_of(n.begin(), n.end(), ::isdigit)) {
      uint32_t m = static_cast<uint32_t>(std::stoul(n));
      if (m >= 1 && m <= 8) {
        *replicas = m;
        return Status::Ok();
      }
    }
    return Status::Invalid("redundancy '" + text + "': replicate:M needs M in 1..8");
  }
  if (text.rfind("ec:", 0) == 0 || text.rfind("xor:", 0) == 0) {
    CodeSpec spec;
    CKPTDB_RETURN_IF_ERROR(ParseCodeSpec(text, &spec));
    *code = spec;
    return Status::Ok();
  }
  return Status::Invalid("redundancy '" + text +
                         "': expected none, replicate:M, ec:K+M[,encode=holder|sender] or xor:K");
}

Cluster::Cluster(ClusterOptions options, Hooks hooks, Catalog* catalog)
    : options_(std::move(options)), hooks_(std::move(hooks)), catalog_(catalog) {}

namespace {

// "host:0": whatever port is free.
bool IsAnyPort(const std::string& address) { return address.substr(address.rfind(':') + 1) == "0"; }

// What Cluster::Start refuses before it makes anything: Invalid or NotFound, naming `who`.
Status CheckClusterOptions(const ClusterOptions& options, const std::string& who) {
  if (!options.serve_only && (options.world_size < 2 || options.world_size > 65536 ||
                              options.rank >= options.world_size)) {
    return Status::Invalid(who + ": rank must be below world_size (2..65536)");
  }
  if (options.coordinator.empty()) {
    return Status::Invalid(who + ": no coordinator address (set CKPTDB_COORDINATOR=host:port)");
  }
  // Port 0: rank 0 binds any free port and reports it (CKPTDB_REPORT_FD); nobody else can bind
  // the coordinator's port, and without the report no rank could find it.
  const bool any_port = IsAnyPort(options.coordinator);
  if (any_port && (options.rank != 0 || options.serve_only)) {
    return Status::Invalid(who + ": coordinator " + options.coordinator +
                           " has port 0, which only rank 0 may be given (it binds a free port "
                           "and reports it); give this one the port rank 0 reported");
  }
  if (any_port && options.report_fd < 0) {
    return Status::Invalid(who + ": coordinator " + options.coordinator +
                           " has port 0 but CKPTDB_REPORT_FD is not set: no rank could learn "
                           "the port rank 0 binds");
  }
  if (options.job_token.empty()) {
    return Status::Invalid(who +
                           ": no job token (set CKPTDB_JOB_TOKEN): every connection "
                           "between ranks is authenticated with it");
  }
  if ((options.replicas > 1 || options.serve_only) && options.replica_dir.empty()) {
    return Status::Invalid(who + ": replication needs a ram tier (replicas live in its directory)");
  }
  if (options.code && !options.serve_only && options.parity_dir.empty()) {
    return Status::Invalid(who +
                           ": a coding group needs a ram tier (parity lives in its "
                           "directory)");
  }
  if (options.serve_only) {
    std::error_code ec;
    if (!std::filesystem::is_directory(options.replica_dir, ec)) {
      return Status::NotFound(who + ": " + options.replica_dir +
                              " is not a directory (the node's ram tier directory, where ranks "
                              "keep their peers' replicas)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status Cluster::Start(const ClusterOptions& options, Hooks hooks, Catalog* catalog,
                      std::unique_ptr<Cluster>* out) {
  const std::string who = options.serve_only
                              ? "ckptdb serve on node " + options.node_id
                              : R(options.rank) + " of " + std::to_string(options.world_size);
  CKPTDB_RETURN_IF_ERROR(CheckClusterOptions(options, who));
  std::unique_ptr<Cluster> c(new Cluster(options, std::move(hooks), catalog));
  c->coordinator_address_ = options.coordinator;
  if (options.io == nullptr) c->owned_io_ = io::NewPosixIo();
  c->io_ = options.io != nullptr ? options.io : c->owned_io_.get();
  randombytes_buf(&c->incarnation_, sizeof c->incarnation_);
  c->incarnation_ |= 1;
  if (options.replicas > 1 && !options.serve_only) {
    CKPTDB_RETURN_IF_ERROR(ReplicaStore::Open(c->io_, options.replica_dir, options.replica_keep,
                                              options.replica_budget_bytes, &c->replicas_)
                               .WithContext(who));
  }
  if (options.code && !options.serve_only) {
    ParityStore::Writer writer{options.job_id, options.rank, options.world_size, options.node_id};
    CKPTDB_RETURN_IF_ERROR(ParityStore::Open(c->io_, options.parity_dir, writer,
                                             options.replica_keep, options.replica_budget_bytes,
                                             &c->parity_)
                               .WithContext(who));
  }
  if (options.rank == 0 && !options.serve_only) {
    Coordinator::Options co;
    co.world_size = options.world_size;
    co.replicas = options.replicas;
    co.code = options.code;
    co.heartbeat_ms = options.heartbeat_ms;
    co.dead_after_ms = options.dead_after_ms;
    Cluster* self = c.get();
    CKPTDB_RETURN_IF_ERROR(Coordinator::Open(
        co, catalog,
        [self](uint32_t rank, const std::string& address, const Coordinator::Announcement& d) {
          return self->TellDecision(rank, address, d);
        },
        &c->coordinator_));
  }
  transport::TransportOptions to;
  to.name = options.serve_only ? "serve:" + options.node_id : R(options.rank);
  to.job_token = options.job_token;
  to.tls = options.tls;
  to.max_payload_bytes = kMaxPieceBytes + format::kBlockBytes;
  // A replica's begin may hold a service thread for seconds (its new pages, ReplicaStore::Begin)
  // and a rank may hold replicas of several owners: enough threads that heartbeats, votes and
  // fetches are still answered meanwhile.
  to.service_threads = 4;
  to.max_in_flight = 16;
  if (options.rank == 0 && !options.serve_only) {
    to.listen = options.coordinator;  // the coordinator is where the job says it is
  } else if (!options.listen.empty()) {
    to.listen = options.listen;
  } else {
    to.listen = options.coordinator.substr(0, options.coordinator.rfind(':')) + ":0";
  }
  Cluster* self = c.get();
  // One-sided windows where the job's UCX_TLS allows shared memory; without, the socket.
  if (Status rma = transport::RmaDomain::Open(to.name + " (one-sided)", options.tls, &c->rma_);
      !rma.ok()) {
    std::fprintf(stderr, "ckptdb[%s]: no one-sided path: %s\n", to.name.c_str(),
                 rma.message().c_str());
    c->rma_.reset();
  }
  if (c->replicas_ != nullptr) {
    to.placer = [self](uint16_t type, std::span<const uint8_t> body, size_t payload_bytes) {
      return self->PlaceReplicaPiece(type, body, payload_bytes);
    };
  }
  CKPTDB_RETURN_IF_ERROR(transport::Transport::Start(
      to, [self](const Request& r, Reply* reply) { self->Handle(r, reply); }, &c->transport_));
  if (options.rank == 0 && !options.serve_only && IsAnyPort(options.coordinator)) {
    // Given port 0, rank 0 joins its own coordinator at the port it bound.
    c->coordinator_address_ = c->transport_->address();
  }
  if (options.report_fd >= 0) CKPTDB_RETURN_IF_ERROR(c->ReportAddress());
  // Listening on loopback, every peer that can connect is on this host: the spare window is made
  // now, while the job assembles, not when a restarted peer's first restore asks for it.
  if (c->rma_ != nullptr && !options.serve_only && c->ListensOnLoopback()) {
    c->window_maker_ = std::thread([self] { self->WindowMakerLoop(); });
  }
  if (options.serve_only) {
    c->serve_ = std::thread([self] { self->ServeLoop(); });
    *out = std::move(c);
    return Status::Ok();
  }
  if (c->coordinator_ != nullptr) c->coordinator_->Start();
  Status st = c->Join();
  if (!st.ok() && options.rank == 0 && st.code() == CKPTDB_EINVAL) {
    // The coordinator refused the job (coding groups that do not fit its nodes): it stays a
    // moment, until every rank has been told why, so none waits its join timeout for it.
    for (int waited = 0; waited < 3000; waited += 20) {
      if (c->coordinator_->refused() >= options.world_size) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (!st.ok()) return st;
  c->heartbeat_ = std::thread([self] { self->HeartbeatLoop(); });
  // A spare window only where a peer listens on this rank's host (engine/cluster_rma.h): on a
  // cluster whose placement peers are all on other nodes, no one would ever ask for it.
  if (c->rma_ != nullptr && !c->window_maker_.joinable() && c->PeerOnThisHost()) {
    c->window_maker_ = std::thread([self] { self->WindowMakerLoop(); });
  }
  *out = std::move(c);
  return Status::Ok();
}

// One line, "host:port\n", written whole to CKPTDB_REPORT_FD (a pipe's reader sees it at once).
Status Cluster::ReportAddress() const {
  const std::string line = transport_->address() + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(options_.report_fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::FromErrno(errno, "reporting the address " + transport_->address() +
                                          " to CKPTDB_REPORT_FD " +
                                          std::to_string(options_.report_fd));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Cluster::~Cluster() {
  stop_ = true;
  interleaver_.Stop();
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (coordinator_ != nullptr) coordinator_->Stop();
  if (serve_.joinable()) serve_.join();
  {
    std::lock_guard<std::mutex> lock(rma_mu_);
    rma_cv_.notify_all();
  }
  if (window_maker_.joinable()) window_maker_.join();
  transport_.reset();
}

Status Cluster::PeerFor(const std::string& address, transport::PeerId* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(address);
    if (it != peers_.end()) {
      *out = it->second;
      return Status::Ok();
    }
  }
  transport::PeerId id = 0;
  CKPTDB_RETURN_IF_ERROR(transport_->Connect(address, options_.call_timeout_ms, &id));
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = peers_.emplace(address, id);
  if (!inserted) transport_->Disconnect(id);
  *out = it->second;
  return Status::Ok();
}

bool Cluster::DropIfGone(const Status& st, const std::string& address) {
  if (st.code() != CKPTDB_EPEER && st.code() != CKPTDB_ETIMEDOUT) return false;
  DropPeer(address);
  return true;
}

void Cluster::DropPeer(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(address);
  if (it == peers_.end()) return;
  transport_->Disconnect(it->second);
  peers_.erase(it);
  DropWindow(address);  // a restarted peer grants a new one
}

// ---- Joining and heartbeats ---------------------------------------------------------------

Status Cluster::Join() {
  const int64_t deadline = MonoMs() + options_.join_timeout_ms;
  Status last;
  while (MonoMs() < deadline && !stop_) {
    // Until the coordinator listens, the connect is refused at once (ckptdb's own socket, not
    // UCX's): try again shortly.
    transport::PeerId coord = 0;
    last = PeerFor(coordinator_address_, &coord);
    if (!last.ok()) {
      if (last.code() == CKPTDB_EAUTH) return last;
      DropPeer(coordinator_address_);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    WireWriter w;
    w.U32(options_.rank);
    w.U32(options_.world_size);
    w.U64(incarnation_);
    w.Str(options_.node_id);
    w.Str(transport_->address());
    w.U32(g_protocol);
    auto holdings = Holdings();
    std::vector<uint8_t> body;
    std::vector<uint8_t> table(kMaxTable);
    size_t got = 0;
    last = transport_->CallSync(coord, kRegister, w.Take(), holdings.data(), holdings.size(),
                                options_.call_timeout_ms, &body, table.data(), table.size(), &got);
    if (!last.ok()) {
      if (DropIfGone(last, coordinator_address_)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      return last.WithContext(R(options_.rank) + " joining the job at " + coordinator_address_);
    }
    WireReader r(body, "the coordinator's reply to register");
    uint64_t epoch = r.U64("epoch");
    bool complete = r.U8("complete") != 0;
    CKPTDB_RETURN_IF_ERROR(r.Finish());
    if (!complete) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    WireReader t({table.data(), got}, "the membership table");
    uint32_t n = t.U32("ranks");
    if (n != options_.world_size) {
      return Status::Corrupt("the membership table has " + std::to_string(n) + " ranks, expected " +
                             std::to_string(options_.world_size));
    }
    std::vector<MemberAddress> members(n);
    for (MemberAddress& m : members) {
      m.node_id = t.Str("node_id", 256);
      m.address = t.Str("address", 256);
    }
    CKPTDB_RETURN_IF_ERROR(t.Finish());
    std::lock_guard<std::mutex> lock(mu_);
    epoch_ = epoch;
    stats_.epoch = epoch;
    table_ = std::move(members);
    CKPTDB_RETURN_IF_ERROR(ComputePlacementLocked());
    return options_.code ? ComputeGroupLocked() : Status::Ok();
  }
  return Status::TimedOut(R(options_.rank) + ": the job did not assemble within " +
                          std::to_string(options_.join_timeout_ms) + " ms (coordinator " +
                          coordinator_address_ + (last.ok() ? "" : ": " + last.message()) + ")");
}

// Nodes in order of their first rank; GEMINI's placement over them.
Status Cluster::ComputePlacementLocked() {
  std::vector<std::string> nodes;
  for (const MemberAddress& m : table_) {
    if (std::find(nodes.begin(), nodes.end(), m.node_id) == nodes.end()) nodes.push_back(m.node_id);
  }
  if (options_.replicas > nodes.size()) {
    return Status::Invalid("redundancy replicate:" + std::to_string(options_.replicas) + " needs " +
                           std::to_string(options_.replicas) + " distinct nodes; the job has " +
                           std::to_string(nodes.size()) +
                           " (never two copies on one node: check CKPTDB_NODE_ID)");
  }
  return ComputePlacement(static_cast<int>(nodes.size()), static_cast<int>(options_.replicas),
                          PlacementStrategy::kMixed, &placement_);
}

Status Cluster::MemberAt(uint32_t rank, ReplicaHolder* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank >= table_.size() || table_[rank].address.empty()) {
    return Status::NotFound(R(rank) + " is not in the job's membership table");
  }
  out->rank = rank;
  out->node_id = table_[rank].node_id;
  out->address = table_[rank].address;
  return Status::Ok();
}

std::vector<uint32_t> Cluster::ReplicaTargets() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> nodes;
  std::vector<std::vector<uint32_t>> ranks_on;
  for (uint32_t r = 0; r < table_.size(); ++r) {
    auto it = std::find(nodes.begin(), nodes.end(), table_[r].node_id);
    if (it == nodes.end()) {
      nodes.push_back(table_[r].node_id);
      ranks_on.push_back({r});
    } else {
      ranks_on[it - nodes.begin()].push_back(r);
    }
  }
  std::vector<uint32_t> out;
  if (options_.replicas <= 1 || table_.empty()) return out;
  size_t my_node =
      std::find(nodes.begin(), nodes.end(), table_[options_.rank].node_id) - nodes.begin();
  const auto& mine = ranks_on[my_node];
  size_t local = std::find(mine.begin(), mine.end(), options_.rank) - mine.begin();
  for (int holder : placement_.holders[my_node]) {
    if (static_cast<size_t>(holder) == my_node) continue;
    const auto& there = ranks_on[holder];
    out.push_back(there[local % there.size()]);
  }
  return out;
}

// What this rank can restore from its own tiers and which peers' replicas it holds: the
// coordinator's input for Latest and Holders.
std::vector<uint8_t> Cluster::Holdings() const {
  HoldingsReport r;
  if (hooks_.local_versions) r.local = hooks_.local_versions();
  r.replicas = HeldReplicas();
  // What is in memory, and through which vote, before the parity: a version voted for by then
  // has its parity sealed (BuildParity precedes the vote), so the parity list has it too.
  Hooks::InMemory memory = hooks_.memory_versions ? hooks_.memory_versions() : Hooks::InMemory{};
  if (parity_ != nullptr) r.parity = parity_->Held();
  r.voted_through = memory.voted_through;
  r.memory = std::move(memory.versions);
  r.arc = std::move(memory.arc);
  return EncodeHoldings(std::move(r));
}

void Cluster::HeartbeatLoop() {
  SetThreadName("ckpt-heartbeat");
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms),
                   [this] { return stop_.load(); });
    }
    if (stop_) return;
    SendHeartbeat();
  }
}

void Cluster::Ready() {
  ready_ = true;
  SendHeartbeat();
}

void Cluster::RecordRedundancyTraffic(uint64_t sent, std::chrono::steady_clock::time_point start) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now() - start);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.replica_bytes_sent += sent;
  stats_.replica_ns += static_cast<uint64_t>(ns.count());
}

void Cluster::SendHeartbeat() {
  transport::PeerId coord = 0;
  if (!PeerFor(coordinator_address_, &coord).ok()) return;
  WireWriter w;
  w.U32(options_.rank);
  w.U64(incarnation_);
  w.U64(epoch());
  w.U8(ready_ ? 1 : 0);
  const uint64_t waiting = hooks_.waiting ? hooks_.waiting() : 0;
  w.U64(waiting);
  auto payload = Holdings();
  std::vector<uint8_t> reply;
  Status st = transport_->CallSync(coord, kHeartbeat, w.Take(), payload.data(), payload.size(),
                                   options_.call_timeout_ms, &reply);
  if (DropIfGone(st, coordinator_address_)) return;
  if (!st.ok()) return;
  WireReader r(reply, "heartbeat reply");
  const uint64_t e = r.U64("epoch");
  const uint8_t decision = r.U8("decision");
  std::string why = r.Str("why", 2048);
  if (!r.Finish().ok() || decision > kHeartbeatAborted) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.epoch = e;
  }
  // The decision the rank waits for, when the coordinator's telling of it never arrived.
  if (waiting != 0 && decision != kHeartbeatUndecided && hooks_.decided) {
    (void)hooks_.decided(waiting, decision == kHeartbeatCommitted, why);
  }
}

// ---- Requests -------------------------------------------------------------------------------

void Cluster::Handle(const Request& request, Reply* reply) {
  switch (request.type) {
    case kReplica:
      return HandleReplica(request, reply);
    case kFetch:
      return HandleFetch(request, reply);
    case kWindow:
      return HandleWindow(request, reply);
    case kParity:
      return HandleParity(request, reply);
    case kDecision: {
      WireReader r(request.body, "decision from " + request.peer);
      uint64_t version = r.U64("version");
      bool committed = r.U8("committed") != 0;
      std::string why = r.Str("why", 2048);
      Status st = r.Finish();
      if (st.ok() && hooks_.decided) st = hooks_.decided(version, committed, why);
      if (!st.ok()) Fail(reply, st);
      return;
    }
    default:
      break;
  }
  if (coordinator_ == nullptr) {
    Fail(reply, Status::Invalid(R(options_.rank) + " is not the coordinator; " + request.peer +
                                " sent it message type " + std::to_string(request.type)));
    return;
  }
  Coordinator& c = *coordinator_;
  switch (request.type) {
    case kRegister:
      return c.HandleRegister(request, reply);
    case kHeartbeat:
      return c.HandleHeartbeat(request, reply);
    case kVote:
      return c.HandleVote(request, reply);
    case kLatest:
      return c.HandleLatest(request, reply);
    case kHolders:
      return c.HandleHolders(request, reply);
    case kDecisions:
      return c.HandleDecisions(request, reply);
    case kRecoverable:
      return c.HandleRecoverable(request, reply);
    case kReplicaCheck:
      return c.HandleReplicaCheck(request, reply);
    case kServe:
      return c.HandleServe(request, reply);
    default:
      Fail(reply, Status::Invalid("unknown message type " + std::to_string(request.type) +
                                  " from " + request.peer));
  }
}

// ---- Rank side ------------------------------------------------------------------------------

Status Cluster::Vote(uint64_t version) { return CastVote(version, true, ""); }

Status Cluster::VoteAbort(uint64_t version, const std::string& why) {
  return CastVote(version, false, why);
}

// A vote is cast again while the connection to the coordinator breaks, until call_timeout_ms:
// a vote lost on the way would leave the version waiting for it forever, with this rank gone on
// to the next (ckptdb simulate found it). Votes are idempotent: a repeated yes of a committed
// version is answered Ok, of an aborted one refused; a coordinator restarted in between fences
// the vote (its epoch is old).
Status Cluster::CastVote(uint64_t version, bool yes, const std::string& why) {
  WireWriter w;
  w.U32(options_.rank);
  w.U64(incarnation_);
  w.U64(epoch());
  w.U64(version);
  w.U8(yes ? 1 : 0);
  w.Str(why.substr(0, 1024));
  const std::vector<uint8_t> body = w.Take();
  const int64_t deadline = MonoMs() + options_.call_timeout_ms;
  Status st;
  for (int attempt = 0;; ++attempt) {
    transport::PeerId coord = 0;
    st = PeerFor(coordinator_address_, &coord);
    if (st.ok()) {
      std::vector<uint8_t> reply;
      const int left = static_cast<int>(std::max<int64_t>(1, deadline - MonoMs()));
      st = transport_->CallSync(coord, kVote, body, nullptr, 0, left, &reply);
      if (!DropIfGone(st, coordinator_address_)) break;  // answered (Ok or refused)
    } else if (st.code() == CKPTDB_EAUTH) {
      break;
    }
    if (MonoMs() + 50 >= deadline || stop_) break;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(50 << std::min(attempt, 4), 500)));
  }
  return st.WithContext(R(options_.rank) + (yes ? " voting for v" : " voting no for v") +
                        std::to_string(version));
}

Status Cluster::Decisions(std::set<uint64_t>* committed) {
  transport::PeerId coord = 0;
  CKPTDB_RETURN_IF_ERROR(PeerFor(coordinator_address_, &coord));
  std::vector<uint8_t> reply;
  CKPTDB_RETURN_IF_ERROR(
      transport_->CallSync(coord, kDecisions, {}, nullptr, 0, options_.call_timeout_ms, &reply));
  WireReader r(reply, "the coordinator's decisions");
  uint32_t n = r.U32("count");
  for (uint32_t i = 0; i < n && r.ok() && i < 256; ++i) committed->insert(r.U64("version"));
  return r.Finish();
}

Status Cluster::Latest(uint64_t* version) {
  std::vector<uint8_t> reply;
  CKPTDB_RETURN_IF_ERROR(AskCoordinator(kLatest, {}, &reply));
  WireReader r(reply, "the coordinator's latest");
  *version = r.U64("version");
  return r.Finish();
}

Status Cluster::Holders(uint32_t owner, uint64_t version, std::vector<ReplicaHolder>* out) {
  WireWriter w;
  w.U32(owner);
  w.U64(version);
  std::vector<uint8_t> reply;
  CKPTDB_RETURN_IF_ERROR(AskCoordinator(kHolders, w.Take(), &reply));
  WireReader r(reply, "the coordinator's holders");
  uint32_t n = r.U32("count");
  if (n > options_.world_size + 1024u) {
    return Status::Corrupt("the coordinator lists " + std::to_string(n) + " holders");
  }
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    ReplicaHolder h;
    h.rank = r.U32("rank");
    h.node_id = r.Str("node_id", 256);
    h.address = r.Str("address", 256);
    out->push_back(std::move(h));
  }
  return r.Finish();
}

void Cluster::Hint(unsigned hints) { interleaver_.Hint(hints, MonoNs()); }

ClusterStats Cluster::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterStats s = stats_;
  s.refused = transport_->stats().refused;
  if (coordinator_ != nullptr) s.epoch = coordinator_->epoch();  // ahead of its own heartbeat
  std::lock_guard<std::mutex> rma_lock(rma_mu_);
  for (const auto& [rank, path] : paths_) {
    s.paths += (s.paths.empty() ? "" : "; ") + R(rank) + " " + path;
  }
  return s;
}
// ---- Asking the coordinator ----------------------------------------------------------------

// The coordinator's Tell (coordinator.h): rank 0 hears its own decisions through its hook; the
// others by a kDecision call, acknowledged. A rank that does not answer is dropped (the next call
// reconnects) and learns the decision when it next asks.
Status Cluster::TellDecision(uint32_t rank, const std::string& address,
                             const Coordinator::Announcement& d) {
  if (rank == 0)
    return hooks_.decided ? hooks_.decided(d.version, d.committed, d.why) : Status::Ok();
  WireWriter w;
  w.U64(d.version);
  w.U8(d.committed ? 1 : 0);
  w.Str(d.why.size() > 2048 ? d.why.substr(0, 2048) : d.why);
  transport::PeerId peer = 0;
  Status st = PeerFor(address, &peer);
  if (st.ok()) {
    std::vector<uint8_t> reply;
    st = transport_->CallSync(peer, kDecision, w.Take(), nullptr, 0, options_.call_timeout_ms,
                              &reply);
  }
  if (!st.ok()) DropPeer(address);
  return st;
}

Status Cluster::Recoverable(uint64_t version, RecoverableInfo* out) {
  WireWriter w;
  w.U64(version);
  std::vector<uint8_t> reply;
  CKPTDB_RETURN_IF_ERROR(AskCoordinator(kRecoverable, w.Take(), &reply));
  WireReader r(reply, "the coordinator's recoverable answer");
  out->recoverable = r.U8("recoverable") != 0;
  out->spare_losses = static_cast<int32_t>(r.U32("spare"));
  out->ranks_local = r.U32("local");
  out->ranks_from_peers = r.U32("from peers");
  out->ranks_lost = r.U32("lost");
  out->detail = r.Str("detail", 4096);
  return r.Finish();
}

// Calls the coordinator, again while it answers Busy, until call_timeout_ms.
Status Cluster::AskCoordinator(uint16_t type, std::vector<uint8_t> body,
                               std::vector<uint8_t>* reply) {
  const int64_t deadline = MonoMs() + options_.call_timeout_ms;
  while (true) {
    transport::PeerId coord = 0;
    CKPTDB_RETURN_IF_ERROR(PeerFor(coordinator_address_, &coord));
    reply->clear();
    Status st =
        transport_->CallSync(coord, type, body, nullptr, 0, options_.call_timeout_ms, reply);
    DropIfGone(st, coordinator_address_);
    if (st.code() != CKPTDB_EBUSY || MonoMs() >= deadline || stop_) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status Cluster::CheckReplicas(uint64_t version, uint32_t group,
                              const std::vector<uint32_t>& members, uint8_t protection,
                              uint64_t chunk_bytes, const std::vector<ReplicaDigest>& digests) {
  const std::string what = "v" + std::to_string(version) + ": comparing replica group " +
                           std::to_string(group) + " (ranks " + RankList(members) + ")";
  auto body = [&](bool poll) {
    WireWriter w;
    w.U64(version);
    w.U32(group);
    w.U32(options_.rank);
    w.U8(poll ? 1 : 0);  // 1: only asking for the answer; the list was sent before
    return w.Take();
  };
  WireWriter list;
  list.U64(chunk_bytes);
  list.U8(protection);
  list.U32(static_cast<uint32_t>(members.size()));
  for (uint32_t r : members) list.U32(r);
  list.U32(static_cast<uint32_t>(digests.size()));
  for (const ReplicaDigest& d : digests) {
    list.Str(d.name);
    list.U64(d.bytes);
    list.U64(d.digest);
    list.U8(d.kind);
  }
  const std::vector<uint8_t> payload = list.Take();
  bool sent = false;  // the coordinator has this member's list (until it says otherwise)
  const int64_t deadline = MonoMs() + options_.call_timeout_ms;
  // Bounded by the deadline: the coordinator answers Busy until every member has sent its own.
  // Members reach their commits together (a training step's barrier), so the first asks again
  // after 1 ms, backing off to 20 ms while a late member is awaited.
  int pause_us = 1000;
  while (true) {
    transport::PeerId coord = 0;
    CKPTDB_RETURN_IF_ERROR(PeerFor(coordinator_address_, &coord).WithContext(what));
    std::vector<uint8_t> reply;
    Status st =
        transport_->CallSync(coord, kReplicaCheck, body(sent), sent ? nullptr : payload.data(),
                             sent ? 0 : payload.size(), options_.call_timeout_ms, &reply);
    DropIfGone(st, coordinator_address_);
    if (sent && st.code() == CKPTDB_ENOTFOUND) {
      sent = false;  // a restarted coordinator (or an evicted comparison): send the list again
      continue;
    }
    if (st.code() != CKPTDB_EBUSY) return st;
    sent = true;
    if (MonoMs() >= deadline || stop_) {
      return Status::TimedOut(what + ": " + st.message() + " after " +
                              std::to_string(options_.call_timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    pause_us = std::min(2 * pause_us, 20000);
  }
}

}  // namespace ckpt::engine
