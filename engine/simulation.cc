// The commit protocol at scale, simulated (simulation.h). One Simulation is one seed: an event
// queue in simulated microseconds, a network whose every fate (delay, drop, partition) is drawn
// from the seed's generator, the real Coordinator over a real catalog, and SimRanks that follow
// the rank's side of docs/commit-protocol.md (register, resolve what is in doubt, ask latest,
// then per version: replicate, vote, wait for the decision) with the real JobCommit.
#include "engine/simulation.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>

#include "engine/catalog.h"
#include "engine/cluster_internal.h"
#include "engine/cluster_wire.h"
#include "engine/coordinator.h"
#include "engine/holdings.h"
#include "engine/internal.h"
#include "engine/job_commit.h"
#include "util/assert.h"

namespace ckpt::engine {

using namespace cluster_internal;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMs = 1000;  // simulated time is in microseconds
constexpr int kHeartbeatMs = 200;
constexpr int kDeadAfterMs = 3000;
constexpr int64_t kCallTimeout = 1000 * kMs;    // a message lost: the caller hears in a second
constexpr int64_t kVoteDeadline = 30000 * kMs;  // ClusterOptions::call_timeout_ms
constexpr int64_t kComputeUs = 300 * kMs;       // an iteration's forward and backward pass
constexpr uint32_t kKeep = 2;                   // replicas a holder keeps of its partner's versions

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// splitmix64: the same numbers from the same seed on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  int64_t Between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Below(hi - lo + 1)); }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }

 private:
  uint64_t state_;
};

struct Event {
  int64_t at;
  uint64_t seq;
  std::function<void()> fn;
  bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

// A rank as the simulation runs it. `catalog` is what its store keeps across restarts.
struct SimRank {
  enum class Phase : uint8_t { kDown, kJoining, kResolving, kAsking, kTraining };
  uint32_t rank = 0;
  uint32_t node = 0;
  Phase phase = Phase::kDown;
  uint64_t incarnation = 0;  // 0: never started
  std::string address;
  uint64_t epoch = 0;
  bool ready = false;
  std::map<uint64_t, bool> catalog;                 // version -> COMMITTED (false: PREPARED)
  std::map<uint32_t, std::set<uint64_t>> replicas;  // owner -> versions held in memory
  uint64_t version = 0;                             // the version in flight; 0: none
  std::optional<JobCommit> job;
  bool waiting = false;  // voted yes, the vote arrived, no decision yet
  int64_t waiting_since = 0;
};

class Simulation {
 public:
  Simulation(const SimulationOptions& o, SimulationResult* out)
      : o_(o), out_(out), f_(out->figures), rng_(o.seed * 0x2545F4914F6CDD1Dull + 1) {}
  Status Run();

 private:
  // ---- time and network ----
  void After(int64_t delay, std::function<void()> fn) {
    queue_.push(Event{now_ + delay, seq_++, std::move(fn)});
  }
  bool Cut(uint32_t node) const {
    auto it = cut_until_.find(node);
    return it != cut_until_.end() && it->second > now_;
  }
  // The fate of one message between the coordinator's node and `node`: its delay, or -1 lost.
  int64_t Fate(uint32_t node) {
    ++f_.messages;
    // A partitioned node is cut off from the others; within a node messages still pass.
    const bool cut = node != 0 && (Cut(node) || Cut(0));
    if (cut || (now_ < drop_until_ && rng_.Chance(0.05))) {
      ++f_.dropped;
      return -1;
    }
    return rng_.Chance(0.01) ? rng_.Between(5 * kMs, 80 * kMs) : rng_.Between(30, 600);
  }
  using Done =
      std::function<void(const Status&, const std::vector<uint8_t>&, const std::vector<uint8_t>&)>;
  void Call(uint32_t rank, uint16_t type, std::vector<uint8_t> body, std::vector<uint8_t> payload,
            Done done);
  void Handle(uint16_t type, const transport::Request& request, transport::Reply* reply);
  Status Tell(uint32_t rank, const std::string& address, const Coordinator::Announcement& d);

  // ---- the coordinator ----
  Status OpenCoordinator();
  void StepCoordinator();
  void CoordinatorLoop(uint64_t opened);
  void Violation(const std::string& what) {
    out_->violations.push_back("seed " + std::to_string(o_.seed) + " at " +
                               std::to_string(now_ / kMs) + " ms: " + what);
    Trace("VIOLATION " + what);
  }
  void Trace(const std::string& line) {
    if (o_.trace) o_.trace(std::to_string(now_ / kMs) + " ms: " + line);
  }

  // ---- ranks ----
  void StartRank(uint32_t rank);
  void KillRank(uint32_t rank);
  // `step` of this incarnation of `rank` again in `ms` (a reply it must ask again for).
  void Again(uint32_t rank, int64_t ms, void (Simulation::*step)(uint32_t)) {
    const uint64_t inc = ranks_[rank].incarnation;
    After(ms * kMs, [this, rank, inc, step] {
      if (Alive(rank, inc)) (this->*step)(rank);
    });
  }
  void Register(uint32_t rank);
  void AskDecisions(uint32_t rank);
  void AskLatest(uint32_t rank);
  void Heartbeat(uint32_t rank, uint64_t incarnation);
  void Train(uint32_t rank, uint64_t version);
  void Next(uint32_t rank, uint64_t version);  // the trainer goes on to version + 1
  void Vote(uint32_t rank, uint64_t version, bool yes, const std::string& why, int64_t first = -1);
  void Decided(uint32_t rank, const Coordinator::Announcement& d);
  void RecordCommitted(SimRank& r, uint64_t version);
  std::vector<uint8_t> HoldingsOf(const SimRank& r) const;
  bool Alive(uint32_t rank, uint64_t incarnation) const {
    return ranks_[rank].phase != SimRank::Phase::kDown && ranks_[rank].incarnation == incarnation;
  }

  // ---- faults and checks ----
  void Fault();
  void WipeNode(uint32_t node);
  void RestartJob(const std::string& why);
  void Finish();

  const SimulationOptions o_;
  SimulationResult* const out_;
  SimulationFigures& f_;
  Rng rng_;
  int64_t now_ = 0;
  uint64_t seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  std::map<uint32_t, int64_t> cut_until_;  // partitioned nodes
  int64_t drop_until_ = 0;
  int64_t faults_end_ = 0;
  bool stopping_ = false;  // no new versions: the run is ending
  std::string catalog_dir_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Coordinator> coordinator_;
  bool step_scheduled_ = false;
  uint64_t outside_ns_ = 0;  // ranks' work inside the coordinator's calls, not counted as its
  std::vector<SimRank> ranks_;
  uint64_t incarnations_ = 0;
  // What happened, for the checks: the ranks whose yes left per version, the versions a no was
  // accepted for, told aborted, recorded COMMITTED (by which ranks), and the coordinator's own
  // committed decisions as its replies have shown them.
  std::map<uint64_t, std::set<uint32_t>> yes_;
  std::set<uint64_t> accepted_no_;
  std::set<uint64_t> told_aborted_;
  std::map<uint64_t, std::set<uint32_t>> recorded_;
  std::set<uint64_t> told_committed_;
  std::vector<uint64_t> resume_from_;  // per rank: the newest decision it heard at its open
  uint64_t committed_after_faults_ = 0;
  bool wiped_ = false;
  bool restart_pending_ = false;  // one node wipe a seed: two could lose a version legitimately
};

// ---- network ----------------------------------------------------------------------------------

// A call from a rank to the coordinator: the request and its reply each take the network's fate;
// a lost one is a timeout, seen by the caller after kCallTimeout (a killed caller sees nothing).
void Simulation::Call(uint32_t rank, uint16_t type, std::vector<uint8_t> body,
                      std::vector<uint8_t> payload, Done done) {
  const uint64_t inc = ranks_[rank].incarnation;
  const uint32_t node = ranks_[rank].node;
  auto timeout = [this, rank, inc, done, type] {
    if (Alive(rank, inc)) {
      done(Status::TimedOut("message " + std::to_string(type) + " timed out"), {}, {});
    }
  };
  const int64_t there = Fate(node);
  if (there < 0) return After(kCallTimeout, timeout);
  After(there, [this, rank, inc, node, type, body = std::move(body), payload = std::move(payload),
                done, timeout]() mutable {
    if (coordinator_ == nullptr) return After(kCallTimeout, timeout);
    transport::Request request;
    request.type = type;
    request.peer = R(rank) + " incarnation " + std::to_string(inc);
    request.body = std::move(body);
    request.payload = std::move(payload);
    transport::Reply reply;
    Handle(type, request, &reply);
    const int64_t back = Fate(node);
    if (back < 0) return After(kCallTimeout, timeout);
    std::vector<uint8_t> table;
    if (reply.payload_bytes > 0) {
      const auto* p = static_cast<const uint8_t*>(reply.payload);
      table.assign(p, p + reply.payload_bytes);
    }
    Status st = reply.status == 0 ? Status::Ok() : Status::FromCode(reply.status, reply.message);
    After(back,
          [this, rank, inc, done, st, body = std::move(reply.body), table = std::move(table)] {
            if (Alive(rank, inc)) done(st, body, table);
          });
  });
}

// The coordinator's work on one request, on its thread's CPU clock, then its loop's if a
// decision is waiting to be told.
void Simulation::Handle(uint16_t type, const transport::Request& request, transport::Reply* reply) {
  Coordinator& c = *coordinator_;
  const uint64_t t0 = ThreadCpuNs();
  uint64_t* count = &f_.queries;
  uint64_t* ns = &f_.query_ns;
  switch (type) {
    case kRegister:
      c.HandleRegister(request, reply);
      count = &f_.registers, ns = &f_.register_ns;
      break;
    case kHeartbeat:
      c.HandleHeartbeat(request, reply);
      count = &f_.heartbeats, ns = &f_.heartbeat_ns;
      break;
    case kVote:
      c.HandleVote(request, reply);
      count = &f_.votes, ns = &f_.vote_ns;
      break;
    case kDecisions:
      c.HandleDecisions(request, reply);
      break;
    case kLatest:
      c.HandleLatest(request, reply);
      break;
    default:
      CKPTDB_ASSERT(false);
  }
  *ns += ThreadCpuNs() - t0;
  ++*count;
  if (!step_scheduled_ && c.pending_announcements() > 0) {
    step_scheduled_ = true;
    After(0, [this] { StepCoordinator(); });
  }
}

// The coordinator tells a rank of a decision and waits for its acknowledgement: delivered, the
// rank has taken it in before the next rank is told (the real call is synchronous).
Status Simulation::Tell(uint32_t rank, const std::string& address,
                        const Coordinator::Announcement& d) {
  SimRank& r = ranks_[rank];
  if (r.address != address || r.phase == SimRank::Phase::kDown || Fate(r.node) < 0 ||
      Fate(r.node) < 0) {
    return Status::TimedOut(R(rank) + " did not acknowledge the decision");
  }
  const uint64_t t0 = ThreadCpuNs();  // the rank's work is not the coordinator's
  Decided(rank, d);
  outside_ns_ += ThreadCpuNs() - t0;
  return Status::Ok();
}

// ---- the coordinator ----------------------------------------------------------------------------

Status Simulation::OpenCoordinator() {
  ++f_.coordinator_opens;
  Status st = Catalog::Open(catalog_dir_, false, true, &catalog_);
  if (!st.ok()) return st;
  Coordinator::Options co;
  co.world_size = o_.ranks;
  co.heartbeat_ms = kHeartbeatMs;
  co.dead_after_ms = kDeadAfterMs;
  co.now_ms = [this] { return now_ / kMs; };
  co.log = [this](const std::string& line) { Trace("coordinator: " + line); };
  st = Coordinator::Open(
      co, catalog_.get(),
      [this](uint32_t rank, const std::string& address, const Coordinator::Announcement& d) {
        return Tell(rank, address, d);
      },
      &coordinator_);
  if (!st.ok()) return st;
  // Aborts are never written (presumed abort): a new coordinator knows only the committed
  // versions, and the job may put an aborted version number again. Its attempts so far are over.
  std::map<std::string, std::string> meta;
  if (st = catalog_->ListMeta("coord/committed/", &meta); !st.ok()) return st;
  std::set<uint64_t> committed;
  for (const auto& [key, value] : meta) {
    committed.insert(std::strtoull(key.c_str() + std::strlen("coord/committed/"), nullptr, 16));
  }
  // (A committed version stays one even when this coordinator's catalog was wiped with its
  // node: it learns it back from the ranks.)
  committed.insert(told_committed_.begin(), told_committed_.end());
  std::erase_if(yes_, [&](const auto& e) { return !committed.count(e.first); });
  std::erase_if(accepted_no_, [&](uint64_t v) { return !committed.count(v); });
  std::erase_if(told_aborted_, [&](uint64_t v) { return !committed.count(v); });
  // Its loop, in simulated time: failure detection every heartbeat.
  const uint64_t opened = f_.coordinator_opens;
  After(kHeartbeatMs * kMs, [this, opened] { CoordinatorLoop(opened); });
  return Status::Ok();
}

// One turn of the loop of the coordinator opened `opened`-th; a newer one has its own loop.
void Simulation::CoordinatorLoop(uint64_t opened) {
  if (coordinator_ == nullptr || f_.coordinator_opens != opened) return;
  StepCoordinator();
  After(kHeartbeatMs * kMs, [this, opened] { CoordinatorLoop(opened); });
}

void Simulation::StepCoordinator() {
  step_scheduled_ = false;
  if (coordinator_ == nullptr) return;
  const uint64_t t0 = ThreadCpuNs();
  const uint64_t outside = outside_ns_;
  coordinator_->Step();
  f_.step_ns += ThreadCpuNs() - t0 - (outside_ns_ - outside);
  ++f_.steps;
}

// ---- ranks --------------------------------------------------------------------------------------

void Simulation::StartRank(uint32_t rank) {
  SimRank& r = ranks_[rank];
  CKPTDB_ASSERT(r.phase == SimRank::Phase::kDown);
  r.incarnation = ++incarnations_;
  r.address = "sim:" + std::to_string(rank) + "/" + std::to_string(r.incarnation);
  r.phase = SimRank::Phase::kJoining;
  r.epoch = 0;
  r.ready = false;
  r.version = 0;
  r.job.reset();
  r.waiting = false;
  if (rank == 0 && coordinator_ == nullptr) {
    if (Status st = OpenCoordinator(); !st.ok()) {
      Violation("the coordinator cannot open: " + st.message());
      return;
    }
  }
  Register(rank);
  const uint64_t inc = r.incarnation;
  After(kHeartbeatMs * kMs, [this, rank, inc] { Heartbeat(rank, inc); });
}

// The process is gone: what it had in flight with it. Its catalog and the node's memory (the
// replicas it holds) stay; rank 0 takes the coordinator with it.
void Simulation::KillRank(uint32_t rank) {
  SimRank& r = ranks_[rank];
  if (r.phase == SimRank::Phase::kDown) return;
  r.phase = SimRank::Phase::kDown;
  r.address.clear();
  r.version = 0;
  r.job.reset();
  r.waiting = false;
  if (rank == 0) {
    coordinator_.reset();
    catalog_.reset();
  }
}

std::vector<uint8_t> Simulation::HoldingsOf(const SimRank& r) const {
  HoldingsReport h;
  for (auto it = r.catalog.rbegin(); it != r.catalog.rend() && h.local.size() < kMaxLocalVersions;
       ++it) {
    if (it->second) h.local.push_back(it->first);
  }
  for (const auto& [owner, versions] : r.replicas) {
    for (uint64_t v : versions) h.replicas.push_back({owner, v});
  }
  return EncodeHoldings(std::move(h));
}

void Simulation::Register(uint32_t rank) {
  SimRank& r = ranks_[rank];
  WireWriter w;
  w.U32(rank);
  w.U32(o_.ranks);
  w.U64(r.incarnation);
  w.Str("node" + std::to_string(r.node));
  w.Str(r.address);
  w.U32(kProtocolVersion);
  auto again = [this, rank](int64_t ms) { Again(rank, ms, &Simulation::Register); };
  Call(rank, kRegister, w.Take(), HoldingsOf(r),
       [this, rank, again](const Status& st, const std::vector<uint8_t>& body,
                           const std::vector<uint8_t>&) {
         if (st.code() == CKPTDB_ETIMEDOUT) return again(100);
         if (st.code() == CKPTDB_ESTATE) return RestartJob(R(rank) + "'s join failed");
         if (!st.ok()) return Violation(R(rank) + " refused at its register: " + st.message());
         WireReader rd(body, "register reply");
         const uint64_t epoch = rd.U64("epoch");
         const bool complete = rd.U8("complete") != 0;
         if (!rd.Finish().ok()) return Violation(R(rank) + ": a register reply it cannot read");
         if (!complete) return again(50);
         SimRank& r = ranks_[rank];
         r.epoch = epoch;
         r.phase = SimRank::Phase::kResolving;
         AskDecisions(rank);
       });
}

// At open, the versions left PREPARED are decided by the coordinator's list (presumed abort:
// one not in it is aborted), then the rank is ready and asks where to resume.
void Simulation::AskDecisions(uint32_t rank) {
  Call(rank, kDecisions, {}, {},
       [this, rank](const Status& st, const std::vector<uint8_t>& body,
                    const std::vector<uint8_t>&) {
         if (!st.ok()) return Again(rank, 100, &Simulation::AskDecisions);
         WireReader rd(body, "decisions");
         std::set<uint64_t> committed;
         const uint32_t n = rd.U32("count");
         for (uint32_t i = 0; i < n && rd.ok(); ++i) committed.insert(rd.U64("version"));
         if (!rd.Finish().ok()) return Violation(R(rank) + ": a decision list it cannot read");
         SimRank& r = ranks_[rank];
         resume_from_[rank] = committed.empty() ? 0 : *committed.rbegin();
         for (auto it = r.catalog.begin(); it != r.catalog.end();) {
           if (it->second) {
             ++it;
           } else if (committed.count(it->first)) {
             RecordCommitted(r, (it++)->first);
           } else {
             it = r.catalog.erase(it);
           }
         }
         r.ready = true;
         r.phase = SimRank::Phase::kAsking;
         Heartbeat(rank, 0);  // at once: its holdings are final
         AskLatest(rank);
       });
}

void Simulation::AskLatest(uint32_t rank) {
  const uint64_t inc = ranks_[rank].incarnation;
  Call(rank, kLatest, {}, {},
       [this, rank, inc](const Status& st, const std::vector<uint8_t>& body,
                         const std::vector<uint8_t>&) {
         // Committed versions but none every rank can restore now (a rank declared dead whose
         // replicas' node was lost): asked again, the answer changes when that rank is back,
         // and the liveness check catches a job that never resumes.
         const bool none_now = st.code() == CKPTDB_ENOTFOUND &&
                               st.message().find("no committed version") == std::string::npos;
         if (st.code() == CKPTDB_EBUSY || st.code() == CKPTDB_ETIMEDOUT || none_now) {
           return Again(rank, st.code() == CKPTDB_EBUSY ? 50 : 200, &Simulation::AskLatest);
         }
         uint64_t latest = 0;
         if (st.ok()) {
           WireReader rd(body, "latest");
           latest = rd.U64("version");
           if (!rd.Finish().ok()) return Violation(R(rank) + ": a latest reply it cannot read");
         } else if (st.code() != CKPTDB_ENOTFOUND) {
           return Violation(R(rank) + " cannot resume: " + st.message());
         }
         SimRank& r = ranks_[rank];
         r.phase = SimRank::Phase::kTraining;
         // The trainer resumes from `latest`; its versions go on above every decided one (the
         // store refuses a version at or below one it committed).
         uint64_t next = std::max(latest, resume_from_[rank]);
         if (!r.catalog.empty()) next = std::max(next, r.catalog.rbegin()->first);
         After(kComputeUs + rng_.Between(0, 20 * kMs), [this, rank, inc, next] {
           if (Alive(rank, inc)) Train(rank, next + 1);
         });
       });
}

void Simulation::Heartbeat(uint32_t rank, uint64_t incarnation) {
  SimRank& r = ranks_[rank];
  if (incarnation != 0) {  // the periodic one (0: one sent at once, outside the period)
    if (!Alive(rank, incarnation)) return;
    After(kHeartbeatMs * kMs, [this, rank, incarnation] { Heartbeat(rank, incarnation); });
  }
  if (r.phase == SimRank::Phase::kJoining) return;  // its heartbeats start once it has joined
  WireWriter w;
  w.U32(rank);
  w.U64(r.incarnation);
  w.U64(r.epoch);
  w.U8(r.ready ? 1 : 0);
  const uint64_t waiting = r.waiting ? r.version : 0;
  w.U64(waiting);
  const uint64_t inc = r.incarnation;
  Call(rank, kHeartbeat, w.Take(), HoldingsOf(r),
       [this, rank, inc, waiting](const Status& st, const std::vector<uint8_t>& body,
                                  const std::vector<uint8_t>&) {
         if (st.code() == CKPTDB_ESTATE) {
           // Declared dead or replaced: the trainer fails, and with it the job's collectives.
           return RestartJob(R(rank) + " is no longer a member");
         }
         if (!st.ok()) return;
         WireReader rd(body, "heartbeat reply");
         const uint64_t epoch = rd.U64("epoch");
         const uint8_t decision = rd.U8("decision");
         const std::string why = rd.Str("why", 2048);
         if (!rd.Finish().ok()) return Violation(R(rank) + ": a heartbeat reply it cannot read");
         SimRank& r = ranks_[rank];
         r.epoch = epoch;
         if (waiting != 0 && decision != kHeartbeatUndecided && r.waiting && r.version == waiting) {
           Decided(rank, {waiting, decision == kHeartbeatCommitted, why});
         }
       });
}

// One version: the redundancy pushed (a delay that may fail), PREPARED, then the vote.
void Simulation::Train(uint32_t rank, uint64_t version) {
  if (stopping_) return;
  SimRank& r = ranks_[rank];
  r.version = version;
  r.job.emplace();
  r.job->StartReplication();
  const uint64_t inc = r.incarnation;
  const bool fails = now_ < faults_end_ && rng_.Chance(0.002);
  After(rng_.Between(2, 40) * kMs, [this, rank, inc, version, fails] {
    SimRank& r = ranks_[rank];
    if (!Alive(rank, inc) || r.version != version) return;
    r.job->Replicated(fails ? Status::IoError("the push to its peer failed") : Status::Ok());
    if (r.job->decision() != JobCommit::Decision::kNone) {
      // Aborted before it voted (another rank failed): nothing to vote.
      return Next(rank, version);
    }
    if (fails) return Vote(rank, version, false, "the push to its peer failed");
    r.job->ClaimYes();
    r.catalog[version] = false;  // PREPARED, before the yes leaves
    yes_[version].insert(rank);
    Vote(rank, version, true, "");
  });
}

void Simulation::Next(uint32_t rank, uint64_t version) {
  SimRank& r = ranks_[rank];
  r.version = 0;
  r.job.reset();
  r.waiting = false;
  const uint64_t inc = r.incarnation;
  After(kComputeUs + rng_.Between(0, 20 * kMs), [this, rank, inc, version] {
    if (Alive(rank, inc)) Train(rank, version + 1);
  });
}

// Cast again while it times out, until kVoteDeadline (Cluster::CastVote).
void Simulation::Vote(uint32_t rank, uint64_t version, bool yes, const std::string& why,
                      int64_t first) {
  SimRank& r = ranks_[rank];
  if (first < 0) first = now_;
  WireWriter w;
  w.U32(rank);
  w.U64(r.incarnation);
  w.U64(r.epoch);
  w.U64(version);
  w.U8(yes ? 1 : 0);
  w.Str(why);
  Call(rank, kVote, w.Take(), {},
       [this, rank, version, yes, why, first](const Status& st, const std::vector<uint8_t>&,
                                              const std::vector<uint8_t>&) {
         SimRank& r = ranks_[rank];
         if (st.code() == CKPTDB_ETIMEDOUT && now_ < first + kVoteDeadline &&
             (!yes || r.version == version)) {
           return Vote(rank, version, yes, why, first);
         }
         if (!yes) {
           if (st.ok()) {
             accepted_no_.insert(version);
             if (recorded_.count(version)) {
               Violation("a no for v" + std::to_string(version) + " from " + R(rank) +
                         " was accepted after it was committed");
             }
           }
           return Next(rank, version);
         }
         if (r.version != version) return;  // the decision came before the vote's reply
         if (st.ok()) {
           r.waiting = true;
           r.waiting_since = now_;
           return;
         }
         if (st.code() == CKPTDB_ESTATE) {
           r.job->Refused(st.message());  // fenced or already aborted: it cannot commit
           r.catalog.erase(version);
         }
         // Otherwise in doubt: it stays PREPARED until the rank's next open asks.
         Next(rank, version);
       });
}

void Simulation::Decided(uint32_t rank, const Coordinator::Announcement& d) {
  SimRank& r = ranks_[rank];
  if (d.committed && !told_committed_.count(d.version)) {
    told_committed_.insert(d.version);
    if (now_ > faults_end_) ++committed_after_faults_;
  }
  if (!d.committed) {
    told_aborted_.insert(d.version);
    if (recorded_.count(d.version)) {
      Violation("v" + std::to_string(d.version) + " told aborted to " + R(rank) +
                " but recorded COMMITTED by " + R(*recorded_[d.version].begin()));
    }
  }
  if (!r.job || r.version != d.version) return;  // not in flight here: its open decides it
  if (!r.job->yes_sent()) {
    if (d.committed) {
      return Violation(R(rank) + " heard v" + std::to_string(d.version) +
                       " committed before its own yes");
    }
    r.job->Decide(false, d.why);  // aborted before it voted: its push's end moves on
    return;
  }
  r.job->Decide(d.committed, d.why);
  if (d.committed) {
    RecordCommitted(r, d.version);
  } else {
    r.catalog.erase(d.version);
  }
  Next(rank, d.version);
}

// COMMITTED in the rank's catalog: only with every rank's yes, no no accepted and no abort told
// (the two-phase commit's promise), and its partner on the next node keeps a replica.
void Simulation::RecordCommitted(SimRank& r, uint64_t version) {
  const std::string v = "v" + std::to_string(version);
  if (yes_[version].size() != o_.ranks) {
    Violation(R(r.rank) + " records " + v + " COMMITTED with " +
              std::to_string(yes_[version].size()) + " of " + std::to_string(o_.ranks) +
              " yes votes");
  }
  if (accepted_no_.count(version)) Violation(R(r.rank) + " records " + v + " after a no");
  if (told_aborted_.count(version)) {
    Violation(R(r.rank) + " records " + v + " COMMITTED, which was told aborted");
  }
  r.catalog[version] = true;
  recorded_[version].insert(r.rank);
  SimRank& holder = ranks_[(r.rank + o_.ranks_per_node) % o_.ranks];
  if (holder.node == r.node) return;  // one node: no replicas
  std::set<uint64_t>& kept = holder.replicas[r.rank];
  kept.insert(version);
  while (kept.size() > kKeep) kept.erase(kept.begin());
}

// ---- faults and checks --------------------------------------------------------------------------

void Simulation::Fault() {
  ++f_.faults;
  const uint32_t nodes = (o_.ranks + o_.ranks_per_node - 1) / o_.ranks_per_node;
  auto restart = [this](uint32_t rank, int64_t lo_ms, int64_t hi_ms) {
    After(rng_.Between(lo_ms, hi_ms) * kMs, [this, rank] {
      if (ranks_[rank].phase == SimRank::Phase::kDown) StartRank(rank);
    });
  };
  switch (rng_.Below(6)) {
    case 0: {  // one rank's process; the others see their collectives fail a moment later
      const uint32_t rank = o_.ranks > 1 ? 1 + static_cast<uint32_t>(rng_.Below(o_.ranks - 1)) : 0;
      Trace("kill " + R(rank));
      KillRank(rank);
      return After(rng_.Between(50, 1500) * kMs,
                   [this, rank] { RestartJob(R(rank) + " was killed"); });
    }
    case 1:
      Trace("kill rank 0 and its coordinator");
      KillRank(0);
      return restart(0, 200, 2000);  // the others find out from their heartbeats
    case 2:
      return RestartJob("the job was killed");
    case 3:
      if (!wiped_ && nodes > 1) return WipeNode(static_cast<uint32_t>(rng_.Below(nodes)));
      [[fallthrough]];
    case 4: {
      const uint32_t node = static_cast<uint32_t>(rng_.Below(nodes));
      const int64_t ms = rng_.Between(500, 6000);
      Trace("partition node" + std::to_string(node) + " for " + std::to_string(ms) + " ms");
      cut_until_[node] = std::max(cut_until_[node], now_ + ms * kMs);
      return;
    }
    default:
      Trace("drop 5% of messages for 1 s");
      drop_until_ = now_ + 1000 * kMs;
      return;
  }
}

// The scheduler tears the job down and starts it again (as torchrun does when a worker fails):
// a data-parallel job's ranks go on together or not at all. Once for a burst of reasons.
void Simulation::RestartJob(const std::string& why) {
  if (restart_pending_) return;
  restart_pending_ = true;
  Trace("restart the job: " + why);
  for (uint32_t rank = 0; rank < o_.ranks; ++rank) KillRank(rank);
  After(500 * kMs, [this] { restart_pending_ = false; });
  for (uint32_t rank = 0; rank < o_.ranks; ++rank) {
    After(rng_.Between(500, 2500) * kMs, [this, rank] {
      if (ranks_[rank].phase == SimRank::Phase::kDown) StartRank(rank);
    });
  }
}

// A node lost with its disks and memory: its ranks come back on empty stores (rank 0's node:
// the coordinator on an empty catalog, which learns the decisions back from the others).
void Simulation::WipeNode(uint32_t node) {
  wiped_ = true;
  Trace("wipe node" + std::to_string(node));
  for (SimRank& r : ranks_) {
    if (r.node != node) continue;
    KillRank(r.rank);
    r.catalog.clear();
    r.replicas.clear();
    for (auto it = recorded_.begin(); it != recorded_.end();) {
      it->second.erase(r.rank);
      it = it->second.empty() ? recorded_.erase(it) : std::next(it);
    }
  }
  if (node == 0) fs::remove_all(catalog_dir_);
  RestartJob("node" + std::to_string(node) + " was lost");
}

// The end, once the faults stopped and the job committed o_.versions more: nobody waits for a
// decision, no committed version is lost, and after a reopen (its in-doubt versions resolved)
// every rank's newest COMMITTED is the coordinator's.
void Simulation::Finish() {
  if (catalog_ == nullptr) return Violation("the coordinator is down at the end");
  std::map<std::string, std::string> meta;
  if (Status st = catalog_->ListMeta("coord/committed/", &meta); !st.ok()) {
    return Violation("the coordinator's catalog cannot be read: " + st.message());
  }
  std::set<uint64_t> committed;
  for (const auto& [key, value] : meta) {
    committed.insert(std::strtoull(key.c_str() + std::strlen("coord/committed/"), nullptr, 16));
  }
  for (const auto& [version, by] : recorded_) {
    if (!committed.count(version)) {
      Violation("v" + std::to_string(version) + ", recorded COMMITTED by " + R(*by.begin()) +
                ", is not in the coordinator's decisions");
    }
  }
  const uint64_t newest = committed.empty() ? 0 : *committed.rbegin();
  for (SimRank& r : ranks_) {
    if (r.phase == SimRank::Phase::kDown) {
      Violation(R(r.rank) + " is down at the end");
      continue;
    }
    if (r.waiting) {
      Violation(R(r.rank) + " has waited " + std::to_string((now_ - r.waiting_since) / kMs) +
                " ms for the decision on v" + std::to_string(r.version) +
                (committed.count(r.version)       ? ", which was committed"
                 : told_aborted_.count(r.version) ? ", which was aborted"
                                                  : ", still undecided"));
    }
    for (auto& [version, is_committed] : r.catalog) {
      if (!is_committed && committed.count(version)) RecordCommitted(r, version);
    }
    uint64_t mine = 0;
    for (const auto& [version, is_committed] : r.catalog) {
      if (is_committed) mine = version;
    }
    if (mine != newest) {
      Violation(R(r.rank) + "'s newest COMMITTED version is v" + std::to_string(mine) +
                ", the coordinator's v" + std::to_string(newest));
    }
  }
}

Status Simulation::Run() {
  if (o_.ranks == 0 || o_.ranks_per_node == 0) {
    return Status::Invalid("simulate: ranks and ranks per node must be at least 1");
  }
  const std::string dir =
      o_.dir + "/ckptdb-sim-" + std::to_string(::getpid()) + "-" + std::to_string(o_.seed);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return Status::FromErrno(ec.value(), "simulate: creating " + dir);
  catalog_dir_ = dir + "/catalog";
  ranks_.resize(o_.ranks);
  resume_from_.assign(o_.ranks, 0);
  for (uint32_t rank = 0; rank < o_.ranks; ++rank) {
    ranks_[rank].rank = rank;
    ranks_[rank].node = rank / o_.ranks_per_node;
  }
  if (o_.faults) {
    faults_end_ = 20000 * kMs;
    for (int i = 0; i < 8; ++i) {
      After(rng_.Between(1000, faults_end_ / kMs) * kMs, [this] { Fault(); });
    }
  }
  StartRank(0);
  for (uint32_t rank = 1; rank < o_.ranks; ++rank) {
    After(rng_.Between(0, 500) * kMs, [this, rank] { StartRank(rank); });
  }
  const int64_t give_up = faults_end_ + 120000 * kMs;
  int64_t end = -1;
  while (!queue_.empty()) {
    Event e = queue_.top();
    queue_.pop();
    now_ = e.at;
    e.fn();
    if (end < 0 && now_ > faults_end_ &&
        (committed_after_faults_ >= o_.versions || now_ > give_up)) {
      if (committed_after_faults_ < o_.versions) {
        Violation("the job committed " + std::to_string(committed_after_faults_) + " of " +
                  std::to_string(o_.versions) + " versions in the " +
                  std::to_string((now_ - faults_end_) / kMs) + " ms after the last fault");
      }
      stopping_ = true;  // in flight finishes, nothing new starts
      end = now_ + 5000 * kMs;
    }
    if (end >= 0 && now_ >= end) break;
  }
  Finish();
  f_.sim_ms = static_cast<uint64_t>(now_ / kMs);
  f_.committed = told_committed_.size();
  f_.aborted = told_aborted_.size();
  coordinator_.reset();
  catalog_.reset();
  fs::remove_all(dir, ec);
  return Status::Ok();
}

}  // namespace

Status Simulate(const SimulationOptions& options, SimulationResult* result) {
  *result = SimulationResult{};
  Simulation sim(options, result);
  return sim.Run();
}

}  // namespace ckpt::engine
