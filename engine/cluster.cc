// Cluster (see cluster.h): membership, the coordinator's half of the two-phase commit, and
// replicas in peers' memory. Message bodies are WireWriter fields in the order written here;
// docs/commit-protocol.md lists the messages and the order of durable steps.
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

namespace ckpt::engine {
namespace {

using transport::Reply;
using transport::Request;
using transport::WireReader;
using transport::WireWriter;
using namespace cluster_wire;

// One replica call's payload. Large: each piece is a rendezvous with its own round trips and
// service-thread hops, and on tcp 8 MiB pieces held replication to 2.1 GB/s where 64 MiB ones
// reach 3 GB/s (docs/performance.md). The receiver never buffers one: it lands in the replica.
constexpr uint64_t kMaxPieceBytes = 64ull << 20;
constexpr uint32_t kPiecesInFlight = 4;  // 256 MiB of a replica on the wire at once
constexpr size_t kMaxTable = 1 << 20;

// A kReplica call is one of: the begin (no payload; the receiver makes room for the replica, off
// its progress thread), a piece (payload), the seal (no payload; the receiver checks the image),
// or a piece the sender put into a slot of the receiver's window (no payload:
// engine/cluster_rma.h).
constexpr uint8_t kPhasePiece = 0;
constexpr uint8_t kPhaseBegin = 1;
constexpr uint8_t kPhaseSeal = 2;
constexpr uint8_t kPhaseLanded = 3;

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

// Whether a holdings list names owner's replica of `version`.
bool Holds(const std::vector<std::pair<uint32_t, uint64_t>>& replicas, uint32_t owner,
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

}  // namespace

namespace {
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
}  // namespace

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
  return Status::Invalid("redundancy '" + text + "': expected none, replicate:M, ec:K+M or xor:K");
}

Cluster::Cluster(ClusterOptions options, Hooks hooks, Catalog* catalog)
    : options_(std::move(options)), hooks_(std::move(hooks)), catalog_(catalog) {}

Status Cluster::Start(const ClusterOptions& options, Hooks hooks, Catalog* catalog,
                      std::unique_ptr<Cluster>* out) {
  const std::string who = options.serve_only
                              ? "ckptdb serve on node " + options.node_id
                              : R(options.rank) + " of " + std::to_string(options.world_size);
  if (!options.serve_only && (options.world_size < 2 || options.world_size > 65536 ||
                              options.rank >= options.world_size)) {
    return Status::Invalid(who + ": rank must be below world_size (2..65536)");
  }
  if (options.coordinator.empty()) {
    return Status::Invalid(who + ": no coordinator address (set CKPTDB_COORDINATOR=host:port)");
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
  std::unique_ptr<Cluster> c(new Cluster(options, std::move(hooks), catalog));
  c->started_ms_ = NowMs();
  randombytes_buf(&c->incarnation_, sizeof c->incarnation_);
  c->incarnation_ |= 1;
  if (options.replicas > 1 && !options.serve_only) {
    CKPTDB_RETURN_IF_ERROR(ReplicaStore::Open(options.replica_dir, options.replica_keep,
                                              options.replica_budget_bytes, &c->replicas_)
                               .WithContext(who));
  }
  if (options.code && !options.serve_only) {
    ParityStore::Writer writer{options.job_id, options.rank, options.world_size, options.node_id};
    CKPTDB_RETURN_IF_ERROR(ParityStore::Open(options.parity_dir, writer, options.replica_keep,
                                             options.replica_budget_bytes, &c->parity_)
                               .WithContext(who));
  }
  if (options.rank == 0 && !options.serve_only) {
    CKPTDB_ASSERT(catalog != nullptr);
    std::string value;
    Status st = catalog->GetMeta("coord/epoch", &value);
    uint64_t epoch = st.ok() ? std::strtoull(value.c_str(), nullptr, 10) : 0;
    if (!st.ok() && st.code() != CKPTDB_ENOTFOUND) return st;
    // A new coordinator incarnation: every vote cast to an older one is void.
    CKPTDB_RETURN_IF_ERROR(catalog->PutMeta("coord/epoch", std::to_string(epoch + 1), true));
    c->epoch_ = epoch + 1;
    std::map<std::string, std::string> decided;
    CKPTDB_RETURN_IF_ERROR(catalog->ListMeta("coord/committed/", &decided));
    for (const auto& [key, v] : decided) {
      c->committed_.insert(
          std::strtoull(key.c_str() + std::strlen("coord/committed/"), nullptr, 16));
    }
    c->members_.resize(options.world_size);
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
  if (options.rank == 0) c->coordinator_ = std::thread([self] { self->CoordinatorLoop(); });
  Status st = c->Join();
  if (!st.ok() && options.rank == 0 && st.code() == CKPTDB_EINVAL) {
    // The coordinator refused the job (coding groups that do not fit its nodes): it stays a
    // moment, until every rank has been told why, so none waits its join timeout for it.
    for (int waited = 0; waited < 3000; waited += 20) {
      {
        std::lock_guard<std::mutex> lock(c->mu_);
        if (c->refused_.size() >= options.world_size) break;
      }
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

Cluster::~Cluster() {
  stop_ = true;
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (coordinator_.joinable()) coordinator_.join();
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
  const int64_t deadline = NowMs() + options_.join_timeout_ms;
  Status last;
  while (NowMs() < deadline && !stop_) {
    // Until the coordinator listens, the connect is refused at once (ckptdb's own socket, not
    // UCX's): try again shortly.
    transport::PeerId coord = 0;
    last = PeerFor(options_.coordinator, &coord);
    if (!last.ok()) {
      if (last.code() == CKPTDB_EAUTH) return last;
      DropPeer(options_.coordinator);
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
      if (DropIfGone(last, options_.coordinator)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      return last.WithContext(R(options_.rank) + " joining the job at " + options_.coordinator);
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
    std::vector<Member> members(n);
    for (Member& m : members) {
      m.node_id = t.Str("node_id", 256);
      m.address = t.Str("address", 256);
      m.registered = true;
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
                          options_.coordinator + (last.ok() ? "" : ": " + last.message()) + ")");
}

// Nodes in order of their first rank; GEMINI's placement over them.
Status Cluster::ComputePlacementLocked() {
  std::vector<std::string> nodes;
  for (const Member& m : table_) {
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
  if (!PeerFor(options_.coordinator, &coord).ok()) return;
  WireWriter w;
  w.U32(options_.rank);
  w.U64(incarnation_);
  w.U64(epoch_);
  w.U8(ready_ ? 1 : 0);
  auto payload = Holdings();
  std::vector<uint8_t> reply;
  Status st = transport_->CallSync(coord, kHeartbeat, w.Take(), payload.data(), payload.size(),
                                   options_.call_timeout_ms, &reply);
  if (DropIfGone(st, options_.coordinator)) return;
  if (st.ok()) {
    WireReader r(reply, "heartbeat reply");
    uint64_t e = r.U64("epoch");
    if (r.Finish().ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.epoch = e;
    }
  }
}

// ---- Requests -------------------------------------------------------------------------------

void Cluster::Handle(const Request& request, Reply* reply) {
  const bool coordinator = options_.rank == 0 && !options_.serve_only;
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
  if (!coordinator) {
    Fail(reply, Status::Invalid(R(options_.rank) + " is not the coordinator; " + request.peer +
                                " sent it message type " + std::to_string(request.type)));
    return;
  }
  switch (request.type) {
    case kRegister:
      return HandleRegister(request, reply);
    case kHeartbeat:
      return HandleHeartbeat(request, reply);
    case kVote:
      return HandleVote(request, reply);
    case kLatest:
      return HandleLatest(request, reply);
    case kHolders:
      return HandleHolders(request, reply);
    case kDecisions:
      return HandleDecisions(request, reply);
    case kRecoverable:
      return HandleRecoverable(request, reply);
    case kReplicaCheck:
      return HandleReplicaCheck(request, reply);
    case kServe:
      return HandleServe(request, reply);
    default:
      Fail(reply, Status::Invalid("unknown message type " + std::to_string(request.type) +
                                  " from " + request.peer));
  }
}

// ---- Coordinator ----------------------------------------------------------------------------

Status Cluster::BumpEpochLocked(const std::string& why) {
  uint64_t next = epoch_ + 1;
  CKPTDB_RETURN_IF_ERROR(catalog_->PutMeta("coord/epoch", std::to_string(next), true));
  epoch_ = next;
  stats_.epoch = next;
  std::fprintf(stderr, "ckptdb[coordinator]: epoch %" PRIu64 ": %s\n", next, why.c_str());
  return Status::Ok();
}

void Cluster::NoteAbortCauseLocked(uint64_t version, const std::string& why) {
  abort_causes_[version] = why;
  while (abort_causes_.size() > 256) abort_causes_.erase(abort_causes_.begin());
}

// Presumed abort: a version without a durable COMMITTED decision is aborted.
void Cluster::AbortUndecidedLocked(const std::string& why) {
  for (auto& [version, voters] : votes_) {
    if (committed_.count(version) || aborted_.count(version)) continue;
    aborted_.insert(version);
    to_announce_.push_back({version, false, why});
    NoteAbortCauseLocked(version, why);
    std::fprintf(stderr, "ckptdb[coordinator]: v%" PRIu64 " aborted: %s\n", version, why.c_str());
  }
  votes_.clear();
  cv_.notify_all();
}

void Cluster::HandleRegister(const Request& request, Reply* reply) {
  WireReader r(request.body, "register from " + request.peer);
  uint32_t rank = r.U32("rank");
  uint32_t world = r.U32("world_size");
  uint64_t incarnation = r.U64("incarnation");
  std::string node = r.Str("node_id", 256);
  std::string address = r.Str("address", 256);
  Status st = CheckProtocol(&r, request.peer + " (" + R(rank) + ")");
  if (!st.ok()) return Fail(reply, st);
  st = r.Finish();
  HoldingsReport held;
  if (st.ok()) st = ParseHoldings(request.payload, "holdings from " + request.peer, &held);
  if (st.ok() && (world != options_.world_size || rank >= world)) {
    st =
        Status::Invalid(request.peer + " registers as " + R(rank) + " of " + std::to_string(world) +
                        "; this job has " + std::to_string(options_.world_size) + " ranks");
  }
  if (st.ok() && node.empty()) st = Status::Invalid(request.peer + ": an empty node_id");
  if (!st.ok()) return Fail(reply, st);
  std::lock_guard<std::mutex> lock(mu_);
  if (!assembled_) {
    st = LearnDecisionsLocked(rank, held.local);
    if (!st.ok()) return Fail(reply, st);
  }
  if (assembled_ && options_.code) {
    // A rank rejoining an assembled job on a node that breaks its coding groups is refused
    // before anything of it is recorded (the groups of everyone else stay computable).
    std::vector<std::string> node_of_rank;
    for (const Member& x : members_) node_of_rank.push_back(x.node_id);
    node_of_rank[rank] = node;
    std::vector<std::vector<uint32_t>> groups;
    st = ComputeCodingGroups(node_of_rank, *options_.code, &groups);
    if (!st.ok()) return Fail(reply, st.WithContext(R(rank) + " rejoining on node " + node));
  }
  Member& m = members_[rank];
  if (m.registered && m.incarnation != incarnation) {
    // A restarted rank: its old incarnation is fenced, and what it left undecided is aborted.
    AbortUndecidedLocked(R(rank) + " restarted");
    if (complete_) {
      st = BumpEpochLocked(R(rank) + " rejoined as a new incarnation");
      if (!st.ok()) return Fail(reply, st);
    }
  }
  if (!m.registered || m.incarnation != incarnation) {
    m.registered = true;
    m.dead = false;
    m.ready = false;
    m.incarnation = incarnation;
    m.voted.clear();
    m.node_id = node;
    m.address = address;
  }
  m.Take(std::move(held));
  m.last_seen_ms = NowMs();
  complete_ = std::all_of(members_.begin(), members_.end(),
                          [](const Member& x) { return x.registered && !x.dead; });
  assembled_ = assembled_ || complete_;
  if (complete_ && options_.code) {
    // A job whose nodes do not form coding groups is refused to every rank at once, each with
    // the reason (a rank would otherwise wait its join timeout for a coordinator that quit).
    std::vector<std::string> node_of_rank;
    for (const Member& x : members_) node_of_rank.push_back(x.node_id);
    std::vector<std::vector<uint32_t>> groups;
    st = ComputeCodingGroups(node_of_rank, *options_.code, &groups);
    if (!st.ok()) {
      refused_.insert(rank);
      return Fail(reply, st);
    }
  }
  WireWriter w;
  w.U64(epoch_);
  w.U8(complete_ ? 1 : 0);
  reply->body = w.Take();
  if (complete_) {
    WireWriter t;
    t.U32(static_cast<uint32_t>(members_.size()));
    for (const Member& x : members_) {
      t.Str(x.node_id);
      t.Str(x.address);
    }
    auto table = std::make_shared<std::vector<uint8_t>>(t.Take());
    reply->payload = table->data();
    reply->payload_bytes = table->size();
    reply->keep = table;
  }
}

void Cluster::HandleHeartbeat(const Request& request, Reply* reply) {
  WireReader r(request.body, "heartbeat from " + request.peer);
  uint32_t rank = r.U32("rank");
  uint64_t incarnation = r.U64("incarnation");
  (void)r.U64("epoch");
  bool ready = r.U8("ready") != 0;
  Status st = r.Finish();
  HoldingsReport held;
  if (st.ok()) st = ParseHoldings(request.payload, "holdings from " + request.peer, &held);
  if (st.ok() && rank >= options_.world_size)
    st = Status::Invalid("heartbeat from rank " + std::to_string(rank));
  if (!st.ok()) return Fail(reply, st);
  std::lock_guard<std::mutex> lock(mu_);
  Member& m = members_[rank];
  if (!m.registered || m.incarnation != incarnation || m.dead) {
    return Fail(reply, Status::State(R(rank) + " (" + request.peer +
                                     ") is not a member of this epoch: it was declared dead or "
                                     "replaced; restart it"));
  }
  m.last_seen_ms = NowMs();
  m.Take(std::move(held));
  if (ready && !m.ready) {
    m.ready = true;
    cv_.notify_all();
  }
  WireWriter w;
  w.U64(epoch_);
  reply->body = w.Take();
}

// A vote: yes once the rank's segment and its replicas are safe (PREPARED), or no when the rank
// cannot prepare the version (its capture, its commit tier or its replication failed, it was
// skipped, or the trainer aborted it). A no aborts the version for every rank at once: without
// it the others, having voted, would wait until the rank is declared dead, which a live rank
// never is. Only a current member's vote counts, either way.
void Cluster::HandleVote(const Request& request, Reply* reply) {
  WireReader r(request.body, "vote from " + request.peer);
  uint32_t rank = r.U32("rank");
  uint64_t incarnation = r.U64("incarnation");
  uint64_t epoch = r.U64("epoch");
  uint64_t version = r.U64("version");
  const bool yes = r.U8("yes") != 0;
  std::string why = r.Str("why", 1024);
  Status st = r.Finish();
  if (st.ok() && rank >= options_.world_size)
    st = Status::Invalid("vote from rank " + std::to_string(rank));
  if (!st.ok()) return Fail(reply, st);
  std::lock_guard<std::mutex> lock(mu_);
  const Member& m = members_[rank];
  if (!m.registered || m.dead || m.incarnation != incarnation || epoch != epoch_) {
    return Fail(reply, Status::State("fenced: the vote of " + R(rank) + " for v" +
                                     std::to_string(version) + " was cast in epoch " +
                                     std::to_string(epoch) + "; the job is in epoch " +
                                     std::to_string(epoch_.load()) + " and has " +
                                     (m.incarnation == incarnation ? "declared that rank dead"
                                                                   : "a newer incarnation of it")));
  }
  if (!yes) {
    if (committed_.count(version)) {
      // Every rank's yes made it so: this rank gave up what it had voted for.
      return Fail(reply, Status::State("v" + std::to_string(version) + " is already committed; " +
                                       R(rank) + " voted for it"));
    }
    if (aborted_.insert(version).second) {
      votes_.erase(version);
      to_announce_.push_back({version, false, R(rank) + " could not prepare it: " + why});
      NoteAbortCauseLocked(version, to_announce_.back().why);
      std::fprintf(stderr, "ckptdb[coordinator]: v%" PRIu64 " aborted: %s cannot prepare it: %s\n",
                   version, R(rank).c_str(), why.c_str());
      cv_.notify_all();
    }
    return;
  }
  if (aborted_.count(version)) {
    auto cause = abort_causes_.find(version);
    return Fail(reply, Status::State("v" + std::to_string(version) + " was already aborted" +
                                     (cause != abort_causes_.end() ? ": " + cause->second : "")));
  }
  if (committed_.count(version)) return;  // a repeated vote
  auto& voters = votes_[version];
  voters.insert(rank);
  if (voters.size() == options_.world_size) {
    // Every vote is in: the decision is durable before anyone hears of it.
    CrashPoint("coordinator:before_committed_written");
    Status w = catalog_->PutMeta("coord/committed/" + format::Hex64(version).substr(2), "1", true);
    if (!w.ok()) {
      aborted_.insert(version);
      to_announce_.push_back(
          {version, false, "the coordinator could not record it: " + w.message()});
      NoteAbortCauseLocked(version, to_announce_.back().why);
      votes_.erase(version);
      cv_.notify_all();
      return Fail(reply, w.WithContext("recording the decision for v" + std::to_string(version)));
    }
    committed_.insert(version);
    for (uint32_t voter : votes_[version]) {
      members_[voter].voted.insert(version);
      if (members_[voter].voted.size() > 64)
        members_[voter].voted.erase(members_[voter].voted.begin());
    }
    votes_.erase(version);
    CrashPoint("coordinator:after_committed_written");
    to_announce_.push_back({version, true, ""});
    cv_.notify_all();
  }
}

// A rank records COMMITTED only once a coordinator of the job decided it and wrote that decision
// down, so every committed version a rank reports stands, whether or not this coordinator's log
// has it: a coordinator that lost its log with its node (rank 0 replaced, on an empty catalog)
// learns the job's decisions back from the ranks that heard them (the newest 256 each can
// restore from its own tiers; a store of another job or of a rank alone cannot join, Db::Open).
// It learns while the job first assembles, before any vote, and no rank asks for decisions
// (Decisions, at open) before the job is complete, that is before every rank has registered.
// A decision nobody outside rank 0's node recorded is lost with the log, and that is safe: the
// coordinator tells the other nodes first (CoordinatorLoop), so no rank's commit of it returned
// but on the node that was lost, and presumed abort decides it.
Status Cluster::LearnDecisionsLocked(uint32_t rank, const std::vector<uint64_t>& committed) {
  for (uint64_t v : committed) {
    if (committed_.count(v)) continue;
    if (aborted_.count(v)) {
      return Status::Corrupt(R(rank) + " holds v" + std::to_string(v) +
                             " COMMITTED, which this coordinator aborted: is its catalog from "
                             "another job with the same token?");
    }
    CKPTDB_RETURN_IF_ERROR(
        catalog_->PutMeta("coord/committed/" + format::Hex64(v).substr(2), "1", true)
            .WithContext("recording the decision for v" + std::to_string(v) + " learned from " +
                         R(rank)));
    committed_.insert(v);
    std::fprintf(stderr,
                 "ckptdb[coordinator]: v%" PRIu64
                 " is COMMITTED in %s's catalog and was not "
                 "in the decision log (lost with rank 0's node?): recorded\n",
                 v, R(rank).c_str());
  }
  return Status::Ok();
}

// Tells every rank each decision, in order, retrying until the rank acknowledges, is declared
// dead, or the cluster stops. Rank 0's own decision goes straight to its hook.
void Cluster::CoordinatorLoop() {
  while (!stop_) {
    Announcement d;
    std::vector<Member> members;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms),
                   [this] { return stop_ || !to_announce_.empty(); });
      if (stop_) return;
      // Failure detection.
      int64_t now = NowMs();
      for (uint32_t rank = 1; rank < members_.size(); ++rank) {
        Member& m = members_[rank];
        if (complete_ && m.registered && !m.dead && now - m.last_seen_ms > options_.dead_after_ms) {
          m.dead = true;
          complete_ = false;
          std::string why = R(rank) + " (node " + m.node_id + ") sent no heartbeat for " +
                            std::to_string(now - m.last_seen_ms) + " ms";
          AbortUndecidedLocked(why);
          (void)BumpEpochLocked(why + ": declared dead");
        }
      }
      if (to_announce_.empty()) continue;
      d = to_announce_.front();
      to_announce_.pop_front();
      members = members_;
    }
    // Ranks on other nodes than the coordinator's first, rank 0 itself last: by the time a rank
    // on the coordinator's node has returned from its commit, the rest of the job has the
    // decision in its catalogs, where a coordinator that lost this node's log learns it back.
    std::vector<uint32_t> order;
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t rank = members.size(); rank-- > 0;) {
        if ((members[rank].node_id != members[0].node_id) == (pass == 0)) order.push_back(rank);
      }
    }
    for (uint32_t rank : order) {
      if (!members[rank].registered || members[rank].dead) continue;
      if (rank == 0) {
        if (hooks_.decided) (void)hooks_.decided(d.version, d.committed, d.why);
        continue;
      }
      WireWriter w;
      w.U64(d.version);
      w.U8(d.committed ? 1 : 0);
      w.Str(d.why.size() > 2048 ? d.why.substr(0, 2048) : d.why);
      transport::PeerId peer = 0;
      Status st = PeerFor(members[rank].address, &peer);
      if (st.ok()) {
        std::vector<uint8_t> reply;
        st = transport_->CallSync(peer, kDecision, w.Take(), nullptr, 0, options_.call_timeout_ms,
                                  &reply);
      }
      if (!st.ok()) {
        // The rank learns it when it next asks (at its next open, Decisions()).
        DropPeer(members[rank].address);
        std::fprintf(stderr, "ckptdb[coordinator]: telling %s about v%" PRIu64 " failed: %s\n",
                     R(rank).c_str(), d.version, st.message().c_str());
      }
    }
  }
}

void Cluster::HandleDecisions(const Request&, Reply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  WireWriter w;
  std::vector<uint64_t> newest(committed_.rbegin(), committed_.rend());
  if (newest.size() > 256) newest.resize(256);
  w.U32(static_cast<uint32_t>(newest.size()));
  for (uint64_t v : newest) w.U64(v);
  reply->body = w.Take();
}

// The newest committed version every rank can restore: from its own tiers, or from a live
// peer holding its replica.
void Cluster::HandleLatest(const Request&, Reply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status busy = SettledLocked(); !busy.ok()) return Fail(reply, busy);
  const int64_t now = NowMs();
  for (auto it = committed_.rbegin(); it != committed_.rend(); ++it) {
    uint64_t v = *it;
    bool all = true;
    const std::map<uint32_t, int32_t> arc = ArcSparesLocked(v);
    for (uint32_t rank = 0; rank < members_.size() && all; ++rank) {
      const Member& m = members_[rank];
      bool ok = m.registered && !m.dead &&
                (m.voted.count(v) || std::find(m.local_versions.begin(), m.local_versions.end(),
                                               v) != m.local_versions.end());
      for (uint32_t other = 0; other < members_.size() && !ok; ++other) {
        const Member& o = members_[other];
        if (!o.registered || o.dead) continue;
        ok = Holds(o.replicas, rank, v);
      }
      for (auto s = servers_.begin(); s != servers_.end() && !ok; ++s) {
        ok = now - s->second.last_seen_ms <= options_.dead_after_ms &&
             Holds(s->second.replicas, rank, v);
      }
      if (!ok && options_.code) ok = RebuildableLocked(rank, v);
      // A member of an "arc" group whose segments hold replicated shards only: every slice of
      // its shards must have a keeper, its own copy or not.
      if (auto a = arc.find(rank); a != arc.end()) ok = a->second >= 0;
      all = ok;
    }
    if (all) {
      WireWriter w;
      w.U64(v);
      reply->body = w.Take();
      return;
    }
  }
  Fail(reply, Status::NotFound(committed_.empty()
                                   ? "the job has no committed version"
                                   : std::to_string(committed_.size()) +
                                         " committed versions, but none that every rank can "
                                         "still restore from its tiers or a peer's memory"));
}

void Cluster::HandleHolders(const Request& request, Reply* reply) {
  WireReader r(request.body, "holders query from " + request.peer);
  uint32_t owner = r.U32("owner");
  uint64_t version = r.U64("version");
  Status st = r.Finish();
  if (!st.ok()) return Fail(reply, st);
  std::lock_guard<std::mutex> lock(mu_);
  if (Status busy = SettledLocked(); !busy.ok()) return Fail(reply, busy);
  WireWriter w;
  std::vector<uint32_t> holders;
  for (uint32_t rank = 0; rank < members_.size(); ++rank) {
    const Member& m = members_[rank];
    if (!m.registered || m.dead) continue;
    if (Holds(m.replicas, owner, version)) {
      holders.push_back(rank);
    }
  }
  // Then the serving daemons, after the ranks: a live rank serves from memory it also uses.
  std::vector<const std::pair<const std::string, Server>*> serving;
  const int64_t now = NowMs();
  for (const auto& entry : servers_) {
    const Server& s = entry.second;
    if (now - s.last_seen_ms <= options_.dead_after_ms && Holds(s.replicas, owner, version)) {
      serving.push_back(&entry);
    }
  }
  w.U32(static_cast<uint32_t>(holders.size() + serving.size()));
  for (uint32_t h : holders) {
    w.U32(h);
    w.Str(members_[h].node_id);
    w.Str(members_[h].address);
  }
  for (const auto* entry : serving) {
    w.U32(kServeRank);
    w.Str(entry->second.node_id);
    w.Str(entry->first);
  }
  reply->body = w.Take();
}

// Per rank: its own copy, else the distinct nodes holding a replica of it (live ranks and serve
// daemons), else its coding group; the spare losses are the fewest any rank has.
void Cluster::HandleRecoverable(const Request& request, Reply* reply) {
  WireReader r(request.body, "recoverable query from " + request.peer);
  const uint64_t version = r.U64("version");
  Status st = r.Finish();
  if (!st.ok()) return Fail(reply, st);
  std::lock_guard<std::mutex> lock(mu_);
  if (Status busy = SettledLocked(); !busy.ok()) return Fail(reply, busy);
  const std::string v = "v" + std::to_string(version);
  if (!committed_.count(version)) {
    return Fail(reply, Status::State(v + " is not committed by the job"));
  }
  auto has = [&](const Member& m) {
    return m.registered && !m.dead &&
           (m.voted.count(version) || std::find(m.local_versions.begin(), m.local_versions.end(),
                                                version) != m.local_versions.end());
  };
  std::vector<std::vector<uint32_t>> groups;
  if (options_.code) {
    std::vector<std::string> node_of_rank;
    for (const Member& m : members_) node_of_rank.push_back(m.node_id);
    if (!ComputeCodingGroups(node_of_rank, *options_.code, &groups).ok()) groups.clear();
  }
  const int64_t now = NowMs();
  const std::map<uint32_t, int32_t> arc = ArcSparesLocked(version);
  RecoverableInfo info;
  int32_t spare = INT32_MAX;
  std::string peers, lost, tightest;
  for (uint32_t rank = 0; rank < members_.size(); ++rank) {
    const bool own = has(members_[rank]);
    int32_t mine = own ? 0 : -1;  // without a group to count on (none computed): its own copy
    std::string how = "its own copy only";
    if (options_.code) {
      for (uint32_t g = 0; g < groups.size(); ++g) {
        if (std::find(groups[g].begin(), groups[g].end(), rank) == groups[g].end()) continue;
        int32_t missing = 0;
        for (uint32_t q : groups[g]) {
          // A member whose yes vote committed it had its group's parity sealed (its holdings
          // say so only from its next heartbeat).
          const Member& mq = members_[q];
          missing += has(mq) && InMemory(mq, version) && HoldsParity(mq, g, version) ? 0 : 1;
        }
        const int32_t m = static_cast<int32_t>(options_.code->m);
        mine = missing <= m ? m - missing : (own ? 0 : -1);
        how = "a rebuild from coding group " + std::to_string(g) + " (" + std::to_string(missing) +
              " of " + std::to_string(groups[g].size()) +
              " members lack it in memory or its parity)";
      }
    } else {
      std::set<std::string> nodes;
      if (own) nodes.insert(members_[rank].node_id);
      for (const Member& o : members_) {
        if (o.registered && !o.dead && Holds(o.replicas, rank, version)) nodes.insert(o.node_id);
      }
      for (const auto& [address, s] : servers_) {
        if (now - s.last_seen_ms <= options_.dead_after_ms && Holds(s.replicas, rank, version)) {
          nodes.insert(s.node_id);
        }
      }
      mine = static_cast<int32_t>(nodes.size()) - 1;
      how = "replicas on " + std::to_string(own ? nodes.size() - 1 : nodes.size()) + " node(s)";
    }
    if (auto a = arc.find(rank); a != arc.end()) {
      mine = a->second;
      how = "its replica group's slices, each kept by two members";
    }
    if (mine < 0) {
      ++info.ranks_lost;
      if (lost.size() < 200) lost += " " + std::to_string(rank);
    } else if (own) {
      ++info.ranks_local;
    } else {
      ++info.ranks_from_peers;
      if (peers.size() < 300) peers += "; rank " + std::to_string(rank) + " from " + how;
    }
    if (mine < spare) {
      spare = mine;
      tightest = "rank " + std::to_string(rank) + (own ? " (its own copy and " : " (") + how + ")";
    }
  }
  info.recoverable = info.ranks_lost == 0;
  info.spare_losses = info.recoverable ? spare : -1;
  info.detail = v + ": " + std::to_string(info.ranks_local) + " rank(s) from their own copies" +
                peers + (lost.empty() ? "" : "; no source for rank(s)" + lost) +
                (info.recoverable ? "; " + std::to_string(spare) +
                                        " more node loss(es) to spare, the tightest " + tightest
                                  : "");
  WireWriter w;
  w.U8(info.recoverable ? 1 : 0);
  w.U32(static_cast<uint32_t>(info.spare_losses));
  w.U32(info.ranks_local);
  w.U32(info.ranks_from_peers);
  w.U32(info.ranks_lost);
  w.Str(info.detail);
  reply->body = w.Take();
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

// Whether `rank`'s segment of `version` can be rebuilt from its coding group: at most M of the
// group's members lack either their own copy of the version in memory (a member serves a rebuild
// from its ram tier only) or their parity of it (any M lost members leave K blocks of every
// stripe, engine/stripe_layout.h).
bool Cluster::RebuildableLocked(uint32_t rank, uint64_t version) const {
  std::vector<std::string> node_of_rank;
  for (const Member& m : members_) node_of_rank.push_back(m.node_id);
  std::vector<std::vector<uint32_t>> groups;
  if (!ComputeCodingGroups(node_of_rank, *options_.code, &groups).ok()) return false;
  for (uint32_t g = 0; g < groups.size(); ++g) {
    if (std::find(groups[g].begin(), groups[g].end(), rank) == groups[g].end()) continue;
    uint32_t missing = 0;
    for (uint32_t member : groups[g]) {
      const Member& m = members_[member];
      const bool has =
          m.registered && !m.dead &&
          (m.voted.count(version) || std::find(m.local_versions.begin(), m.local_versions.end(),
                                               version) != m.local_versions.end()) &&
          InMemory(m, version) && HoldsParity(m, g, version);
      missing += has ? 0 : 1;
    }
    return missing <= options_.code->m;
  }
  return false;
}

std::map<uint32_t, int32_t> Cluster::ArcSparesLocked(uint64_t version) const {
  std::map<uint32_t, int32_t> spares;
  // The groups whose every member's segment holds only replicated shards: from this
  // coordinator's own comparisons of the version (until the members' holdings list it; a group
  // compared in a job without redundancy), or from live members' holdings.
  std::set<std::vector<uint32_t>> groups;
  if (!options_.code && options_.replicas <= 1) {
    for (auto it = replica_checks_.lower_bound({version, 0});
         it != replica_checks_.end() && it->first.first == version; ++it) {
      const ReplicaCheckState& c = it->second;
      if (c.arc && c.result && c.result->ok()) groups.insert(c.members);
    }
  }
  for (const Member& m : members_) {
    if (!m.registered || m.dead) continue;
    for (const ArcReport& a : m.arc) {
      if (a.version == version && a.replicated_only) groups.insert(a.members);
    }
  }
  // Slice s is kept by member s and, as its ARC copy, by member s - 1, each on its own node
  // (declare_replicas refuses two on one), from any of its tiers.
  for (const std::vector<uint32_t>& g : groups) {
    const auto count = static_cast<uint32_t>(g.size());
    auto keeps = [&](uint32_t q) {
      if (g[q] >= members_.size()) return false;
      const Member& m = members_[g[q]];
      return m.registered && !m.dead &&
             (m.voted.count(version) || std::find(m.local_versions.begin(), m.local_versions.end(),
                                                  version) != m.local_versions.end());
    };
    int32_t spare = INT32_MAX;
    for (uint32_t s = 0; s < count; ++s) {
      const int32_t keepers = (keeps(s) ? 1 : 0) + (keeps((s + count - 1) % count) ? 1 : 0);
      spare = std::min(spare, keepers - 1);
    }
    for (uint32_t rank : g) spares[rank] = spare;
  }
  return spares;
}

// Busy (the asker retries) while a restarted coordinator gives serving daemons two heartbeats to
// announce themselves, or while a live rank has not yet recovered: no answer about where data
// lives is computed from holdings that are about to change. Never blocks a service thread.
Status Cluster::SettledLocked() const {
  if (NowMs() < started_ms_ + 2 * options_.heartbeat_ms) {
    return Status::Busy("the coordinator just started; serving daemons are still announcing");
  }
  for (uint32_t rank = 0; rank < members_.size(); ++rank) {
    const Member& m = members_[rank];
    if (!m.dead && !(m.registered && m.ready)) {
      return Status::Busy(R(rank) + " has not finished recovering");
    }
  }
  return Status::Ok();
}

// Calls the coordinator, again while it answers Busy, until call_timeout_ms.
Status Cluster::AskCoordinator(uint16_t type, std::vector<uint8_t> body,
                               std::vector<uint8_t>* reply) {
  const int64_t deadline = NowMs() + options_.call_timeout_ms;
  while (true) {
    transport::PeerId coord = 0;
    CKPTDB_RETURN_IF_ERROR(PeerFor(options_.coordinator, &coord));
    reply->clear();
    Status st =
        transport_->CallSync(coord, type, body, nullptr, 0, options_.call_timeout_ms, reply);
    DropIfGone(st, options_.coordinator);
    if (st.code() != CKPTDB_EBUSY || NowMs() >= deadline || stop_) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---- Replica groups (ckptdb_declare_replicas) ---------------------------------------------------

namespace {

constexpr size_t kMaxReplicaChecks = 256;
constexpr uint32_t kMaxReplicaDigests = uint32_t{1} << 24;

// "0 1 2 3", or "0 1 2 3 4 5 6 7 ... (1024 ranks)": error replies must fit a message body.
std::string Members(const std::vector<uint32_t>& members) {
  std::string text;
  for (size_t i = 0; i < members.size() && i < 8; ++i) {
    text += (text.empty() ? "" : " ") + std::to_string(members[i]);
  }
  if (members.size() > 8) text += " ... (" + std::to_string(members.size()) + " ranks)";
  return text;
}

}  // namespace

Status Cluster::CheckReplicas(uint64_t version, uint32_t group,
                              const std::vector<uint32_t>& members, bool arc, uint64_t chunk_bytes,
                              const std::vector<ReplicaDigest>& digests) {
  const std::string what = "v" + std::to_string(version) + ": comparing replica group " +
                           std::to_string(group) + " (ranks " + Members(members) + ")";
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
  list.U8(arc ? 1 : 0);
  list.U32(static_cast<uint32_t>(members.size()));
  for (uint32_t r : members) list.U32(r);
  list.U32(static_cast<uint32_t>(digests.size()));
  for (const ReplicaDigest& d : digests) {
    list.Str(d.name);
    list.U64(d.bytes);
    list.U64(d.digest);
  }
  const std::vector<uint8_t> payload = list.Take();
  bool sent = false;  // the coordinator has this member's list (until it says otherwise)
  const int64_t deadline = NowMs() + options_.call_timeout_ms;
  // Bounded by the deadline: the coordinator answers Busy until every member has sent its own.
  // Members reach their commits together (a training step's barrier), so the first asks again
  // after 1 ms, backing off to 20 ms while a late member is awaited.
  int pause_us = 1000;
  while (true) {
    transport::PeerId coord = 0;
    CKPTDB_RETURN_IF_ERROR(PeerFor(options_.coordinator, &coord).WithContext(what));
    std::vector<uint8_t> reply;
    Status st =
        transport_->CallSync(coord, kReplicaCheck, body(sent), sent ? nullptr : payload.data(),
                             sent ? 0 : payload.size(), options_.call_timeout_ms, &reply);
    DropIfGone(st, options_.coordinator);
    if (sent && st.code() == CKPTDB_ENOTFOUND) {
      sent = false;  // a restarted coordinator (or an evicted comparison): send the list again
      continue;
    }
    if (st.code() != CKPTDB_EBUSY) return st;
    sent = true;
    if (NowMs() >= deadline || stop_) {
      return Status::TimedOut(what + ": " + st.message() + " after " +
                              std::to_string(options_.call_timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    pause_us = std::min(2 * pause_us, 20000);
  }
}

void Cluster::HandleReplicaCheck(const Request& request, Reply* reply) {
  WireReader r(request.body, "replica check from " + request.peer);
  const uint64_t version = r.U64("version");
  const uint32_t group = r.U32("group");
  const uint32_t rank = r.U32("rank");
  const bool poll = r.U8("poll") != 0;
  Status st = r.Finish();
  if (!st.ok()) return Fail(reply, st);
  if (poll) {
    // Only the answer: from the comparison this member's list went into.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = replica_checks_.find(std::make_pair(version, group));
    const bool known = it != replica_checks_.end() &&
                       std::find(it->second.members.begin(), it->second.members.end(), rank) !=
                           it->second.members.end() &&
                       (it->second.result || it->second.posted.count(rank));
    if (!known) {
      return Fail(reply, Status::NotFound("v" + std::to_string(version) + ": replica group " +
                                          std::to_string(group) + ": no list of " + R(rank) +
                                          " here; send it again"));
    }
    return AnswerReplicaCheckLocked(version, group, &it->second, reply);
  }
  WireReader p(request.payload, "replica digests from " + R(rank));
  const uint64_t chunk_bytes = p.U64("chunk_bytes");
  const bool arc = p.U8("protection") != 0;
  const uint32_t n = p.U32("members");
  if (n < 2 || n > format::kMaxReplicaMembers) {
    return Fail(reply, Status::Invalid(R(rank) + ": a replica group of " + std::to_string(n)));
  }
  std::vector<uint32_t> members;
  for (uint32_t i = 0; i < n && p.ok(); ++i) members.push_back(p.U32("member"));
  const uint32_t count = p.U32("digests");
  if (count > kMaxReplicaDigests) {
    return Fail(reply, Status::Invalid(R(rank) + ": " + std::to_string(count) + " digests"));
  }
  std::vector<ReplicaDigest> digests;
  for (uint32_t i = 0; i < count && p.ok(); ++i) {
    ReplicaDigest d;
    d.name = p.Str("name", CKPTDB_MAX_NAME_BYTES);
    d.bytes = p.U64("bytes");
    d.digest = p.U64("digest");
    digests.push_back(std::move(d));
  }
  st = p.Finish();
  if (st.ok() && (rank >= options_.world_size ||
                  std::find(members.begin(), members.end(), rank) == members.end())) {
    st = Status::Invalid(R(rank) + " is not a member of the replica group it reports for");
  }
  if (!st.ok()) return Fail(reply, st);
  const std::string what = "v" + std::to_string(version) + ": replica group " +
                           std::to_string(group) + " (ranks " + Members(members) + ")";
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(version, group);
  auto it = replica_checks_.find(key);
  if (aborted_.count(version)) return AnswerReplicaCheckLocked(version, group, nullptr, reply);
  if (it == replica_checks_.end()) {
    // Bounded: decided comparisons go first, oldest first; an undecided one only past the cap
    // (one per group for many versions in flight).
    const size_t cap = std::max<size_t>(kMaxReplicaChecks, 4 * size_t{options_.world_size});
    for (auto old = replica_checks_.begin();
         replica_checks_.size() >= cap && old != replica_checks_.end();) {
      old = old->second.result ? replica_checks_.erase(old) : std::next(old);
    }
    while (replica_checks_.size() >= cap) replica_checks_.erase(replica_checks_.begin());
    it =
        replica_checks_.emplace(key, ReplicaCheckState{members, arc, chunk_bytes, {}, std::nullopt})
            .first;
  }
  ReplicaCheckState& c = it->second;
  // Every post is held against the group as first reported, decided or not.
  if (c.members != members) {
    Status mismatch =
        Status::Corrupt(what + ": " + R(rank) + " declared the group as ranks " + Members(members) +
                        ", another member as ranks " + Members(c.members));
    if (!c.result) c.result = mismatch;
    c.posted.clear();
    return Fail(reply, mismatch);
  }
  if (!c.result) {
    if (c.arc != arc) {
      c.result = Status::Corrupt(what + ": " + R(rank) + " declared protection '" +
                                 (arc ? "arc" : "none") + "', another member '" +
                                 (c.arc ? "arc" : "none") + "' (every member must declare one)");
      c.posted.clear();
    } else if (c.chunk_bytes != chunk_bytes) {
      c.result = Status::Corrupt(what + ": " + R(rank) + " cuts its shards in chunks of " +
                                 std::to_string(chunk_bytes) + " bytes, another member in " +
                                 std::to_string(c.chunk_bytes) + " (the digests need one size)");
      c.posted.clear();
    } else {
      c.posted[rank] = std::move(digests);
    }
  }
  AnswerReplicaCheckLocked(version, group, &c, reply);
}

void Cluster::AnswerReplicaCheckLocked(uint64_t version, uint32_t group, ReplicaCheckState* check,
                                       Reply* reply) {
  const std::string what = "v" + std::to_string(version) + ": replica group " +
                           std::to_string(group) +
                           (check != nullptr ? " (ranks " + Members(check->members) + ")" : "");
  if (aborted_.count(version) && (check == nullptr || !check->result || check->result->ok())) {
    // A member that learned of the abort first never reports: the others stop waiting for it.
    // A comparison that failed keeps its answer (the abort's cause); one that passed does not
    // send a member on to protect a version the job has given up.
    auto cause = abort_causes_.find(version);
    return Fail(reply, Status::State(what + ": the version was aborted" +
                                     (cause != abort_causes_.end() ? ": " + cause->second : "")));
  }
  ReplicaCheckState& c = *check;
  if (!c.result) {
    // A member declared dead will never report: the others are told now, not at their timeout.
    for (uint32_t m : c.members) {
      if (members_[m].dead) {
        c.result = Status::State(what + ": " + R(m) + " was declared dead");
        c.posted.clear();
        break;
      }
    }
  }
  if (!c.result && c.posted.size() == c.members.size()) {
    // Every member is in: each one's list against the first member's, shard by shard.
    const uint32_t first = c.members.front();
    const std::vector<ReplicaDigest>& want = c.posted.at(first);
    Status result;
    for (uint32_t other : c.members) {
      const std::vector<ReplicaDigest>& have = c.posted.at(other);
      if (have == want) continue;
      size_t i = 0;
      while (i < want.size() && i < have.size() && want[i] == have[i]) ++i;
      std::string why;
      if (i < want.size() && i < have.size() && want[i].name == have[i].name) {
        why = "shard '" + want[i].name + "' differs: " + R(first) + " has " +
              std::to_string(want[i].bytes) + " bytes of digest " + format::Hex64(want[i].digest) +
              ", " + R(other) + " " + std::to_string(have[i].bytes) + " bytes of digest " +
              format::Hex64(have[i].digest);
      } else {
        // A name one of them lacks: the smaller name at the first difference.
        const bool first_has = i < want.size() && (i >= have.size() || want[i].name < have[i].name);
        const std::string& name = first_has ? want[i].name : have[i].name;
        why = "shard '" + name + "' was put as replicated by " + R(first_has ? first : other) +
              " and not by " + R(first_has ? other : first);
      }
      result = Status::Corrupt(what + ": the replicas are not identical: " + why +
                               "; the version is not committed");
      break;
    }
    c.result = result;
    c.posted.clear();  // decided: the lists are no longer needed
  }
  if (!c.result) {
    return Fail(reply, Status::Busy(what + ": " + std::to_string(c.posted.size()) + " of " +
                                    std::to_string(c.members.size()) + " members have reported"));
  }
  if (!c.result->ok()) return Fail(reply, *c.result);
}

// A `ckptdb serve` daemon announces (again) what it serves. Kept for dead_after_ms.
void Cluster::HandleServe(const Request& request, Reply* reply) {
  WireReader r(request.body, "serve announcement from " + request.peer);
  std::string node = r.Str("node_id", 256);
  std::string address = r.Str("address", 256);
  Status st = CheckProtocol(&r, "ckptdb serve at " + request.peer);
  if (!st.ok()) return Fail(reply, st);
  st = r.Finish();
  HoldingsReport held;
  if (st.ok()) st = ParseHoldings(request.payload, "holdings from " + request.peer, &held);
  if (st.ok() && (node.empty() || address.empty()))
    st = Status::Invalid(request.peer + ": a serve announcement without node_id or address");
  if (!st.ok()) return Fail(reply, st);
  std::erase_if(held.replicas, [this](const auto& p) { return p.first >= options_.world_size; });
  std::lock_guard<std::mutex> lock(mu_);
  Server& s = servers_[address];
  if (s.node_id.empty()) {
    std::fprintf(stderr, "ckptdb[coordinator]: ckptdb serve on node %s (%s) holds %zu replicas\n",
                 node.c_str(), address.c_str(), held.replicas.size());
  }
  s.node_id = node;
  s.replicas = std::move(held.replicas);
  s.last_seen_ms = NowMs();
  WireWriter w;
  w.U64(epoch_);
  reply->body = w.Take();
}

// ---- Rank side ------------------------------------------------------------------------------

Status Cluster::Vote(uint64_t version) { return CastVote(version, true, ""); }

Status Cluster::VoteAbort(uint64_t version, const std::string& why) {
  return CastVote(version, false, why);
}

Status Cluster::CastVote(uint64_t version, bool yes, const std::string& why) {
  transport::PeerId coord = 0;
  CKPTDB_RETURN_IF_ERROR(PeerFor(options_.coordinator, &coord));
  WireWriter w;
  w.U32(options_.rank);
  w.U64(incarnation_);
  w.U64(epoch_);
  w.U64(version);
  w.U8(yes ? 1 : 0);
  w.Str(why.substr(0, 1024));
  std::vector<uint8_t> reply;
  Status st =
      transport_->CallSync(coord, kVote, w.Take(), nullptr, 0, options_.call_timeout_ms, &reply);
  DropIfGone(st, options_.coordinator);
  return st.WithContext(R(options_.rank) + (yes ? " voting for v" : " voting no for v") +
                        std::to_string(version));
}

Status Cluster::Decisions(std::set<uint64_t>* committed) {
  transport::PeerId coord = 0;
  CKPTDB_RETURN_IF_ERROR(PeerFor(options_.coordinator, &coord));
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

void Cluster::Hint(bool net_busy) {
  net_busy_ = net_busy;
  cv_.notify_all();
}

ClusterStats Cluster::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterStats s = stats_;
  s.refused = transport_->stats().refused;
  std::lock_guard<std::mutex> rma_lock(rma_mu_);
  for (const auto& [rank, path] : paths_) {
    s.paths += (s.paths.empty() ? "" : "; ") + R(rank) + " " + path;
  }
  return s;
}

// ---- Replication ----------------------------------------------------------------------------

std::vector<std::string> Cluster::ReplicaDirs() const {
  std::vector<std::string> dirs;
  if (options_.replica_dir.empty()) return dirs;
  if (!options_.serve_only) return {options_.replica_dir};
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.replica_dir, ec)) {
    if (entry.path().filename().string().rfind("ckptdb-replicas-r", 0) == 0 &&
        entry.is_directory(ec)) {
      dirs.push_back(entry.path().string());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::string Cluster::FindReplica(uint32_t owner, uint64_t version) const {
  char name[96];
  std::snprintf(name, sizeof name, "/r%05" PRIu32 "-v%020" PRIu64 ".seg", owner, version);
  for (const std::string& dir : ReplicaDirs()) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(dir + name, ec)) return dir + name;
  }
  return {};
}

std::vector<std::pair<uint32_t, uint64_t>> Cluster::HeldReplicas() const {
  if (replicas_ != nullptr) return replicas_->Held();
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (const std::string& dir : ReplicaDirs()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      unsigned owner = 0;
      unsigned long long version = 0;
      char tail[8] = {};
      std::string name = entry.path().filename().string();
      if (std::sscanf(name.c_str(), "r%5u-v%20llu.se%1s", &owner, &version, tail) == 3 &&
          name.size() == std::strlen("r00000-v00000000000000000000.seg") && tail[0] == 'g') {
        out.emplace_back(owner, version);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// `ckptdb serve`: tells the coordinator (whichever incarnation listens at the address now) what
// this node's memory holds, every heartbeat, for as long as the daemon runs.
void Cluster::ServeLoop() {
  std::string last_error;
  while (!stop_) {
    Status st;
    {
      transport::PeerId coord = 0;
      st = PeerFor(options_.coordinator, &coord);
      if (st.ok()) {
        WireWriter w;
        w.Str(options_.node_id);
        w.Str(transport_->address());
        w.U32(g_protocol);
        auto holdings = Holdings();
        std::vector<uint8_t> reply;
        st = transport_->CallSync(coord, kServe, w.Take(), holdings.data(), holdings.size(),
                                  options_.call_timeout_ms, &reply);
      }
      DropIfGone(st, options_.coordinator);
    }
    if (!st.ok() && st.message() != last_error && st.code() != CKPTDB_EPEER) {
      std::fprintf(stderr, "ckptdb[serve:%s]: %s\n", options_.node_id.c_str(),
                   st.message().c_str());
    }
    last_error = st.ok() ? "" : st.message();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms),
                 [this] { return stop_.load(); });
  }
}

Status Cluster::Protect(uint64_t version, uint64_t file_bytes,
                        const std::vector<SendExtent>& extents) {
  if (options_.code) return BuildParity(version, file_bytes, extents);
  return Replicate(version, file_bytes, extents);
}

void Cluster::Pace(uint64_t sent, int64_t start_ms) {
  // Idle-window hints and the bandwidth cap pace the pushes (GEMINI's interleaving).
  for (int waited = 0; net_busy_ && !stop_ && waited < 2000; waited += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (options_.bandwidth_bytes_per_s > 0 && sent > 0) {
    double due_ms = 1000.0 * static_cast<double>(sent) / options_.bandwidth_bytes_per_s;
    int64_t ahead = static_cast<int64_t>(due_ms) - (NowMs() - start_ms);
    if (ahead > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ahead));
  }
}

Status Cluster::Replicate(uint64_t version, uint64_t file_bytes,
                          const std::vector<SendExtent>& extents) {
  std::vector<uint32_t> targets = ReplicaTargets();
  if (targets.empty()) return Status::Ok();
  const int64_t start = NowMs();
  const auto start_clock = std::chrono::steady_clock::now();
  std::vector<Member> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    table = table_;
  }
  // Pieces of at most `limit` bytes. An extent is one record of the arena (a chunk's, about
  // chunk_bytes); records the capture laid out next to each other, in the image and in the arena,
  // travel together, so a version of 4 MiB chunks crosses in a few large calls, not one per chunk.
  // A piece holds whole records (only a record larger than a piece is cut): the receiver hashes
  // the records of each piece as it lands, while later pieces are on the wire, and leaves only
  // records cut across pieces to the seal, which the vote waits for.
  struct Piece {
    uint64_t offset;
    const uint8_t* data;
    uint64_t bytes;
  };
  auto cut = [&](uint64_t limit) {
    std::vector<Piece> pieces;
    bool mergeable = false;  // the last piece starts at a record (not inside a record cut up)
    for (const SendExtent& e : extents) {
      Piece* last = pieces.empty() ? nullptr : &pieces.back();
      if (mergeable && last->offset + last->bytes == e.logical_offset &&
          last->data + last->bytes == e.data && last->bytes + e.bytes <= limit) {
        last->bytes += e.bytes;
        continue;
      }
      for (uint64_t off = 0; off < e.bytes; off += limit) {
        pieces.push_back({e.logical_offset + off, e.data + off, std::min(limit, e.bytes - off)});
      }
      mergeable = e.bytes <= limit;
    }
    return pieces;
  };
  std::vector<Piece> message_pieces, window_pieces;  // each cut when first needed
  uint64_t sent = 0;
  for (uint32_t target : targets) {
    const std::string what = "replicating v" + std::to_string(version) + " of " + R(options_.rank) +
                             " to " + R(target) + " (node " + table[target].node_id + ")";
    transport::PeerId peer = 0;
    Status st = PeerFor(table[target].address, &peer);
    if (!st.ok()) return st.WithContext(what);
    // One-sided where the target's window attaches (engine/cluster_rma.h): each piece is put
    // into a slot of it, in slot-sized pieces, and a call names the slot; else the pieces travel
    // as the calls' payloads.
    const std::shared_ptr<PeerWindow> window = WindowFor(table[target].address, peer, target);
    std::vector<Piece>& pieces = window != nullptr ? window_pieces : message_pieces;
    if (pieces.empty()) pieces = cut(window != nullptr ? kWindowSlotBytes : kMaxPieceBytes);
    auto header = [&](uint64_t offset, uint8_t phase, uint32_t slot = 0, uint64_t bytes = 0) {
      WireWriter w;
      w.U32(options_.rank);
      w.U64(version);
      w.U64(epoch_);
      w.U64(file_bytes);
      w.U64(offset);
      w.U8(phase);
      if (phase == kPhaseLanded) {
        w.U64(window->window->id());
        w.U32(slot);
        w.U64(bytes);
      }
      return w.Take();
    };
    {
      // The receiver maps the replica's memory first (on a new node, every page new: seconds on
      // a VM), so allow for that beyond the call timeout: 16 MiB/s at the least.
      std::vector<uint8_t> ignored;
      const int begin_timeout_ms = static_cast<int>(std::min<uint64_t>(
          options_.call_timeout_ms + file_bytes / (16 << 10), 24ull * 3600 * 1000));
      st = transport_->CallSync(peer, kReplica, header(0, kPhaseBegin), nullptr, 0,
                                begin_timeout_ms, &ignored);
      if (!st.ok()) {
        DropIfGone(st, table[target].address);
        return st.WithContext(what);
      }
    }
    struct InFlight {
      std::unique_ptr<transport::Call> call;
      uint32_t slot;  // kNoSlot: none
    };
    std::deque<InFlight> in_flight;
    // Waits for the oldest call; its slot is free again once it has returned.
    auto drain_one = [&]() -> Status {
      Status s = in_flight.front().call->Wait(options_.call_timeout_ms);
      if (in_flight.front().slot != kNoSlot) window->Release(in_flight.front().slot);
      in_flight.pop_front();
      return s;
    };
    auto fail = [&](Status s) {
      while (!in_flight.empty()) (void)drain_one();
      // The holder may have dropped the window (or restarted): the next version asks again.
      if (window != nullptr && s.code() == CKPTDB_ESTATE) DropWindow(table[target].address);
      DropIfGone(s, table[target].address);
      return s.WithContext(what);
    };
    for (size_t i = 0; i <= pieces.size(); ++i) {
      Pace(sent, start);
      bool last = i == pieces.size();  // the last call carries no bytes: it seals the replica
      if (last) {
        while (!in_flight.empty()) {
          if (Status s = drain_one(); !s.ok()) return fail(s);
        }
      }
      uint32_t slot = kNoSlot;
      if (!last && window != nullptr) {
        // A slot: this version's own oldest call gives one back, else another thread's will.
        while ((slot = window->TryAcquire()) == kNoSlot && !in_flight.empty()) {
          if (Status s = drain_one(); !s.ok()) return fail(s);
        }
        if (slot == kNoSlot) slot = window->Acquire();
        st =
            window->window->Put(uint64_t{slot} * kWindowSlotBytes, pieces[i].data, pieces[i].bytes);
        if (!st.ok()) {
          window->Release(slot);
          return fail(st);
        }
      }
      std::vector<uint8_t> body =
          last                ? header(file_bytes, kPhaseSeal)
          : window != nullptr ? header(pieces[i].offset, kPhaseLanded, slot, pieces[i].bytes)
                              : header(pieces[i].offset, kPhasePiece);
      const bool with_payload = !last && window == nullptr;
      std::unique_ptr<transport::Call> call;
      st = transport_->Start(peer, kReplica, std::move(body),
                             with_payload ? pieces[i].data : nullptr,
                             with_payload ? pieces[i].bytes : 0, nullptr, 0, &call);
      if (!st.ok()) {
        if (slot != kNoSlot) window->Release(slot);
        while (!in_flight.empty()) (void)drain_one();
        DropPeer(table[target].address);
        return st.WithContext(what);
      }
      in_flight.push_back({std::move(call), slot});
      if (!last) sent += pieces[i].bytes;
      while (in_flight.size() >= kPiecesInFlight || (last && !in_flight.empty())) {
        if (Status s = drain_one(); !s.ok()) return fail(s);
      }
    }
  }
  RecordRedundancyTraffic(sent, start_clock);
  return Status::Ok();
}

// Where a replica piece's payload goes: straight into the replica's mapped memory (ReplicaStore),
// so that the bytes cross once. Anything odd is left to HandleReplica, which says what is wrong.
transport::PayloadPlace Cluster::PlaceReplicaPiece(uint16_t type, std::span<const uint8_t> body,
                                                   size_t payload_bytes) {
  transport::PayloadPlace place;
  if (type != kReplica || replicas_ == nullptr) return place;
  ReplicaPiece piece;
  if (!DecodeReplicaPiece(body, "replica piece", &piece).ok() || piece.phase != kPhasePiece ||
      piece.owner >= options_.world_size || piece.owner == options_.rank) {
    return place;
  }
  std::shared_ptr<MappedFile> keep;
  if (!replicas_
           ->Place(piece.owner, piece.version, piece.file_bytes, piece.offset, payload_bytes,
                   &place.data, &keep)
           .ok()) {
    return {};
  }
  place.keep = std::move(keep);
  return place;
}

// A range of a peer's segment image, received into the replica's memory (see PlaceReplicaPiece);
// the sealing call checks the whole image (framing, manifest, every chunk's xxh3) before it
// becomes visible.
void Cluster::HandleReplica(const Request& request, Reply* reply) {
  ReplicaPiece piece;
  Status st = DecodeReplicaPiece(request.body, "replica piece from " + request.peer, &piece);
  const auto [owner, version, file_bytes, offset, phase, window, slot, landed_bytes] = piece;
  std::span<const uint8_t> payload = request.Payload();
  const std::string what =
      "replica of v" + std::to_string(version) + " of " + R(owner) + " from " + request.peer;
  std::shared_ptr<transport::RmaWindow> keep;  // a landed piece's window, while it is copied
  if (st.ok() && phase == kPhaseLanded) {
    uint8_t* at = nullptr;
    st = payload.empty() ? WindowSlot(request.from, window, slot, landed_bytes, what, &at, &keep)
                         : Status::Invalid(what + ": a landed piece with a payload");
    if (st.ok()) payload = std::span<const uint8_t>(at, landed_bytes);
  }
  if (st.ok() && replicas_ == nullptr) {
    st = Status::State(options_.serve_only ? "ckptdb serve on node " + options_.node_id +
                                                 " only serves replicas, it takes none"
                                           : R(options_.rank) + " keeps no replicas");
  }
  if (st.ok() && (owner >= options_.world_size || owner == options_.rank)) {
    st = Status::Invalid(what + ": bad owner rank");
  }
  if (st.ok() && (file_bytes > (uint64_t{1} << 40) || offset > file_bytes ||
                  payload.size() > file_bytes - offset)) {
    st = Status::Invalid(what + ": range [" + std::to_string(offset) + ", +" +
                         std::to_string(payload.size()) + ") outside its " +
                         std::to_string(file_bytes) + " bytes");
  }
  if (st.ok() && (phase == kPhaseBegin || phase == kPhaseSeal) && !payload.empty()) {
    st = Status::Invalid(what + ": a begin or seal call with a payload");
  }
  if (st.ok() && phase == kPhaseBegin) {
    // Without the hook (it is always set for a rank), a sealed replica stands.
    const bool replace_sealed = hooks_.committed && !hooks_.committed(version);
    st = replicas_->Begin(owner, version, file_bytes, what, replace_sealed);
  } else if (st.ok() && (phase == kPhasePiece || phase == kPhaseLanded)) {
    st = replicas_->Received(owner, version, file_bytes, offset, payload, what);
    if (!st.ok() && st.code() != CKPTDB_ESTATE) {  // ESTATE: after the replica was refused
      std::fprintf(stderr, "ckptdb[%s]: refused %s\n", R(options_.rank).c_str(),
                   st.message().c_str());
    }
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.replica_bytes_received += payload.size();
    }
  } else if (st.ok()) {
    st = replicas_->Seal(owner, version, file_bytes, what);
    if (!st.ok()) {
      std::fprintf(stderr, "ckptdb[%s]: refused %s\n", R(options_.rank).c_str(),
                   st.message().c_str());
    }
  }
  if (!st.ok()) Fail(reply, st);
}

void Cluster::HandleFetch(const Request& request, Reply* reply) {
  WireReader r(request.body, "fetch from " + request.peer);
  uint32_t owner = r.U32("owner");
  uint64_t version = r.U64("version");
  uint64_t offset = r.U64("offset");
  uint64_t bytes = r.U64("bytes");
  const bool any_tier = r.U8("any tier") != 0;
  // Optional: the slot of this rank's window the asker wants the bytes in (engine/cluster_rma.h),
  // the reply then carrying none.
  uint64_t window = 0;
  uint32_t slot = kNoSlot;
  if (r.ok() && r.remaining() != 0) {
    window = r.U64("window");
    slot = r.U32("slot");
  }
  Status st = r.Finish();
  if (st.ok() && bytes > kMaxFetchBytes) st = Status::Invalid("a fetch of more than 8 MiB");
  uint8_t* in_window = nullptr;
  std::shared_ptr<transport::RmaWindow> keep;
  if (st.ok() && slot != kNoSlot) {
    st = WindowSlot(request.from, window, slot, bytes, "a fetch from " + request.peer, &in_window,
                    &keep);
  }
  if (!st.ok()) return Fail(reply, st);
  if (owner == options_.rank && !options_.serve_only) {
    // This rank's own segment: a member of its coding group rebuilding a lost member reads its
    // units from memory; a member of its replica group gathering slices reads any tier. Copied
    // out of the arena (its extents need not lie next to each other), or sent from a file's
    // mapping.
    if (!hooks_.read_own || !hooks_.own_bytes || !hooks_.own_file) {
      return Fail(reply, Status::Invalid(R(options_.rank) + " serves no segment of its own"));
    }
    const std::string mine = R(options_.rank) + "'s own segment";
    // Its memory first; a file copy when the asker takes any tier and memory has none (or
    // dropped it between the size and the read).
    auto from_file = [&](std::shared_ptr<MappedFile>* map, uint64_t* size) {
      std::string path;
      Status fs = hooks_.own_file(version, &path);
      if (fs.ok()) fs = MappedFile::OpenReadOnly(path, map);
      if (fs.ok()) *size = (*map)->bytes();
      return fs;
    };
    std::shared_ptr<MappedFile> map;
    uint64_t size = 0;
    st = hooks_.own_bytes(version, &size);
    if (st.code() == CKPTDB_ENOTFOUND && any_tier) st = from_file(&map, &size);
    auto in_range = [&] {
      return offset > size || bytes > size - offset
                 ? Status::Invalid(V(version) + ": the range [" + std::to_string(offset) + ", +" +
                                   std::to_string(bytes) + ") is past its " + std::to_string(size) +
                                   " bytes")
                 : Status::Ok();
    };
    if (st.ok()) st = in_range();
    if (!st.ok()) return Fail(reply, st.WithContext(mine));
    if (bytes == 0) {  // its size (a member of its replica group opening it)
      WireWriter w;
      w.U64(size);
      reply->body = w.Take();
      return;
    }
    if (map == nullptr) {
      std::shared_ptr<std::vector<uint8_t>> out;
      if (in_window == nullptr) out = std::make_shared<std::vector<uint8_t>>(bytes);
      st = hooks_.read_own(version, offset, bytes, in_window != nullptr ? in_window : out->data());
      if (st.ok()) {
        if (in_window == nullptr) {
          reply->payload = out->data();
          reply->payload_bytes = bytes;
          reply->keep = std::move(out);
        }
        std::lock_guard<std::mutex> lock(mu_);
        stats_.served_bytes += bytes;
        return;
      }
      if (st.code() != CKPTDB_ENOTFOUND || !any_tier) return Fail(reply, st.WithContext(mine));
      st = from_file(&map, &size);
      if (st.ok()) st = in_range();
      if (!st.ok()) return Fail(reply, st.WithContext(mine));
    }
    return ServeMapped(std::move(map), offset, bytes, in_window, request.from, reply);
  }
  // From the replica's mapping: the reply's payload is sent from it, nothing is copied.
  std::shared_ptr<MappedFile> map;
  if (replicas_ != nullptr) {
    map = replicas_->Find(owner, version);
  } else if (std::string path = FindReplica(owner, version); !path.empty()) {
    // Mapped per request (a daemon's replicas are few and read rarely), only the range populated.
    if (!MappedFile::OpenReadOnly(path, &map).ok()) map.reset();  // gone
  }
  if (map == nullptr) {
    return Fail(reply, Status::NotFound(
                           (options_.serve_only ? "ckptdb serve on node " + options_.node_id
                                                : R(options_.rank)) +
                           " holds no replica of v" + std::to_string(version) + " of " + R(owner)));
  }
  if (offset > map->bytes() || bytes > map->bytes() - offset) {
    return Fail(reply, Status::Invalid("the replica of v" + std::to_string(version) + " of " +
                                       R(owner) + ": the range [" + std::to_string(offset) + ", +" +
                                       std::to_string(bytes) + ") is past its end"));
  }
  if (bytes == 0) {  // the replica's size
    WireWriter w;
    w.U64(map->bytes());
    reply->body = w.Take();
    return;
  }
  ServeMapped(std::move(map), offset, bytes, in_window, request.from, reply);
}

void Cluster::ServeMapped(std::shared_ptr<MappedFile> map, uint64_t offset, uint64_t bytes,
                          uint8_t* in_window, transport::PeerId to, Reply* reply) {
  if (in_window != nullptr) {
    // The asker gets it from there. Read, not copied from the mapping: a replica mapped since
    // this process opened would fault at each page (0.9 GB/s on these VMs, LIMITS.md).
    Status st = map->ReadAt(offset, in_window, bytes, "a fetch into a window");
    if (!st.ok()) return Fail(reply, st);
  } else {
    // On the socket the bytes go from the file (sendfile: no page of the mapping is touched);
    // UCX sends from the mapping, whose range is mapped first so that it walks mapped pages.
    if (transport_->PathName(to) == "socket") {
      reply->payload_fd = map->fd();
      reply->payload_file_offset = offset;
    } else {
      map->Populate(offset, bytes);
    }
    reply->payload = map->data() + offset;
    reply->payload_bytes = bytes;
    reply->keep = std::move(map);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.served_bytes += bytes;
}

Status Cluster::ReplicaBytes(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                             uint64_t* bytes, bool any_tier) {
  transport::PeerId peer = 0;
  CKPTDB_RETURN_IF_ERROR(PeerFor(holder.address, &peer));
  WireWriter w;
  w.U32(owner);
  w.U64(version);
  w.U64(0);
  w.U64(0);
  w.U8(any_tier ? 1 : 0);
  std::vector<uint8_t> reply;
  Status st =
      transport_->CallSync(peer, kFetch, w.Take(), nullptr, 0, options_.call_timeout_ms, &reply);
  DropIfGone(st, holder.address);
  CKPTDB_RETURN_IF_ERROR(st);
  WireReader r(reply, "replica size from " + R(holder.rank));
  *bytes = r.U64("bytes");
  return r.Finish();
}

Status Cluster::Fetch(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                      uint64_t offset, void* dst, uint64_t bytes, bool any_tier) {
  std::vector<Status> results;
  Status st = FetchRanges(holder, owner, version, {{offset, static_cast<uint8_t*>(dst), bytes}},
                          &results, any_tier);
  return st.ok() ? results[0] : st;
}

Status Cluster::FetchRanges(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                            const std::vector<FetchRange>& ranges, std::vector<Status>* results,
                            bool any_tier) {
  const std::string what =
      "fetching v" + std::to_string(version) + " of " + R(owner) + " from " +
      (holder.rank == kServeRank ? std::string("ckptdb serve") : R(holder.rank)) + " (node " +
      holder.node_id + ")";
  results->assign(ranges.size(), Status::Ok());
  transport::PeerId peer = 0;
  Status gone = PeerFor(holder.address, &peer);
  if (!gone.ok()) {
    gone = gone.WithContext(what);
    results->assign(ranges.size(), gone);
    return gone;
  }
  // One-sided where the holder's window attaches: the holder copies each piece into a slot the
  // call names, and it is got from there (engine/cluster_rma.h).
  const std::shared_ptr<PeerWindow> window = WindowFor(holder.address, peer, holder.rank);
  struct Piece {
    std::unique_ptr<transport::Call> call;
    size_t range;
    uint64_t bytes;
    uint8_t* dst;
    uint32_t slot;  // kNoSlot: the reply's payload went straight to dst
  };
  std::deque<Piece> in_flight;
  uint64_t fetched = 0;
  size_t range = 0;
  uint64_t off = 0;  // within ranges[range]
  // Bounded: each turn starts a piece or waits for one; pieces are at most kMaxFetchBytes.
  while (true) {
    while (range < ranges.size() && off >= ranges[range].bytes) {
      ++range;
      off = 0;
    }
    if (gone.ok() && range < ranges.size() && in_flight.size() < kPiecesInFlight) {
      // A slot: one this call holds none of waits for another thread's to come back.
      uint32_t slot = kNoSlot;
      if (window != nullptr) {
        slot = window->TryAcquire();
        if (slot == kNoSlot && in_flight.empty()) slot = window->Acquire();
      }
      if (window == nullptr || slot != kNoSlot) {
        const FetchRange& r = ranges[range];
        uint64_t n = std::min(kMaxFetchBytes, r.bytes - off);
        WireWriter w;
        w.U32(owner);
        w.U64(version);
        w.U64(r.offset + off);
        w.U64(n);
        w.U8(any_tier ? 1 : 0);
        if (slot != kNoSlot) {
          w.U64(window->window->id());
          w.U32(slot);
        }
        std::unique_ptr<transport::Call> call;
        gone = slot != kNoSlot
                   ? transport_->Start(peer, kFetch, w.Take(), nullptr, 0, nullptr, 0, &call)
                   : transport_->Start(peer, kFetch, w.Take(), nullptr, 0, r.dst + off, n, &call);
        if (gone.ok()) {
          in_flight.push_back({std::move(call), range, n, r.dst + off, slot});
          off += n;
          continue;
        }
        if (slot != kNoSlot) window->Release(slot);
      }
    }
    if (in_flight.empty()) break;
    Piece& p = in_flight.front();
    Status s = p.call->Wait(options_.call_timeout_ms);
    if (p.slot != kNoSlot) {
      if (s.ok() && p.call->payload_bytes() != 0) s = Status::Corrupt("a payload for a window");
      if (s.ok()) s = window->window->Get(uint64_t{p.slot} * kWindowSlotBytes, p.dst, p.bytes);
      window->Release(p.slot);
      if (s.code() == CKPTDB_ESTATE) DropWindow(holder.address);  // asked again next time
    } else if (s.ok() && p.call->payload_bytes() != p.bytes) {
      s = Status::Corrupt("a short reply");
    }
    if (s.ok()) fetched += p.bytes;
    if (!s.ok() && (*results)[p.range].ok()) (*results)[p.range] = s.WithContext(what);
    if (!s.ok() && (s.code() == CKPTDB_EPEER || s.code() == CKPTDB_ETIMEDOUT) && gone.ok()) {
      gone = s;  // start nothing more
    }
    in_flight.pop_front();
  }
  if (!gone.ok()) {
    gone = gone.WithContext(what);
    for (size_t i = range; i < ranges.size(); ++i) {
      if ((*results)[i].ok()) (*results)[i] = gone;
    }
  }
  DropIfGone(gone, holder.address);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.fetch_bytes += fetched;
  return gone;
}

}  // namespace ckpt::engine
