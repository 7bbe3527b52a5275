// Rank 0's coordinator (coordinator.h): registrations and epochs, votes and decisions and their
// causes, failure detection, latest, holders, recoverability, and ckptdb serve's announcements.
// The replica groups' comparisons are in coordinator_replica_checks.cc.
#include "engine/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/cluster_internal.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "util/assert.h"
#include "util/clock.h"
#include "util/thread_name.h"

namespace ckpt::engine {

using namespace cluster_internal;

void Coordinator::Member::Take(HoldingsReport&& h) {
  local_versions = std::move(h.local);
  memory_versions = std::move(h.memory);
  memory_voted_through = h.voted_through;
  replicas = std::move(h.replicas);
  parity = std::move(h.parity);
  arc = std::move(h.arc);
}

Coordinator::Coordinator(const Options& options, Catalog* catalog, Tell tell)
    : options_(options),
      catalog_(catalog),
      tell_(std::move(tell)),
      started_ms_(NowMs()),
      members_(options.world_size) {}

Status Coordinator::Open(const Options& options, Catalog* catalog, Tell tell,
                         std::unique_ptr<Coordinator>* out) {
  CKPTDB_ASSERT(catalog != nullptr && tell);
  std::unique_ptr<Coordinator> c(new Coordinator(options, catalog, std::move(tell)));
  std::string value;
  Status st = catalog->GetMeta("coord/epoch", &value);
  if (!st.ok() && st.code() != CKPTDB_ENOTFOUND) return st;
  const uint64_t epoch = st.ok() ? std::strtoull(value.c_str(), nullptr, 10) : 0;
  // A new coordinator incarnation: every vote cast to an older one is void.
  CKPTDB_RETURN_IF_ERROR(catalog->PutMeta("coord/epoch", std::to_string(epoch + 1), true));
  c->epoch_ = epoch + 1;
  std::map<std::string, std::string> decided;
  CKPTDB_RETURN_IF_ERROR(catalog->ListMeta("coord/committed/", &decided));
  for (const auto& [key, v] : decided) {
    c->decisions_.Commit(std::strtoull(key.c_str() + std::strlen("coord/committed/"), nullptr, 16));
  }
  *out = std::move(c);
  return Status::Ok();
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  CKPTDB_ASSERT(!thread_.joinable());
  thread_ = std::thread([this] { Loop(); });
}

void Coordinator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t Coordinator::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_.size();
}

// The epoch only grows, and a reply names an epoch only once the catalog has it.
Status Coordinator::BumpEpochLocked(const std::string& why) {
  const uint64_t next = epoch_ + 1;
  CKPTDB_RETURN_IF_ERROR(catalog_->PutMeta("coord/epoch", std::to_string(next), true));
  CKPTDB_ASSERT(next > epoch_.load());
  epoch_ = next;
  Log("epoch " + std::to_string(next) + ": " + why);
  return Status::Ok();
}

// Presumed abort: a version without a durable COMMITTED decision is aborted.
void Coordinator::AbortUndecidedLocked(const std::string& why) {
  for (uint64_t version : decisions_.AbortOpen(why)) {
    to_announce_.push_back({version, false, why});
    Log("v" + std::to_string(version) + " aborted: " + why);
  }
  cv_.notify_all();
}

void Coordinator::HandleRegister(const Request& request, Reply* reply) {
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
  if (m.registered && m.dead && m.incarnation == incarnation) {
    // Declared dead while it was still joining (a partition): its undecided versions were
    // aborted and the epoch moved on. It must come back as a new incarnation, at once, rather
    // than ask again until its join times out (ckptdb simulate found such a job never assemble).
    return Fail(reply, Status::State(R(rank) + " (" + request.peer +
                                     ") was declared dead in this job; restart it"));
  }
  if (m.registered && m.incarnation != incarnation) {
    // A restarted rank: its old incarnation is fenced, and what it left undecided is aborted.
    AbortUndecidedLocked(R(rank) + " restarted");
    if (complete_) {
      st = BumpEpochLocked(R(rank) + " rejoined as a new incarnation");
      if (!st.ok()) return Fail(reply, st);
    }
  }
  if (!m.registered || m.incarnation != incarnation) {
    if (!m.registered || m.dead) ++live_members_;
    m.registered = true;
    m.dead = false;
    table_.reset();  // its address is new
    m.ready = false;
    m.incarnation = incarnation;
    m.voted.clear();
    m.node_id = node;
    m.address = address;
  }
  m.Take(std::move(held));
  m.last_seen_ms = NowMs();
  // Counted, not scanned: a scan per registration made the job's assembly quadratic in its
  // ranks (ckptdb simulate at 10,000 ranks: 12.5 us a registration against 1.4 at 64).
  CKPTDB_ASSERT(live_members_ <= members_.size());
  complete_ = live_members_ == members_.size();
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
    // One encoding of the table for every registration until a member's address changes.
    if (table_ == nullptr) {
      WireWriter t;
      t.U32(static_cast<uint32_t>(members_.size()));
      for (const Member& x : members_) {
        t.Str(x.node_id);
        t.Str(x.address);
      }
      table_ = std::make_shared<std::vector<uint8_t>>(t.Take());
    }
    reply->payload = table_->data();
    reply->payload_bytes = table_->size();
    reply->keep = table_;
  }
}

void Coordinator::HandleHeartbeat(const Request& request, Reply* reply) {
  WireReader r(request.body, "heartbeat from " + request.peer);
  uint32_t rank = r.U32("rank");
  uint64_t incarnation = r.U64("incarnation");
  (void)r.U64("epoch");
  bool ready = r.U8("ready") != 0;
  const uint64_t waiting = r.U64("waiting");
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
  // The decision on the version the rank waits for: the telling of it may have been lost.
  const std::string* cause = waiting != 0 ? decisions_.AbortCause(waiting) : nullptr;
  w.U8(waiting == 0                    ? kHeartbeatUndecided
       : decisions_.Committed(waiting) ? kHeartbeatCommitted
       : decisions_.Aborted(waiting)   ? kHeartbeatAborted
                                       : kHeartbeatUndecided);
  w.Str(cause != nullptr ? cause->substr(0, 2048) : "");
  reply->body = w.Take();
}

// A vote: yes once the rank's segment and its replicas are safe (PREPARED), or no when the rank
// cannot prepare the version (its capture, its commit tier or its replication failed, it was
// skipped, or the trainer aborted it). A no aborts the version for every rank at once: without
// it the others, having voted, would wait until the rank is declared dead, which a live rank
// never is. Only a current member's vote counts, either way.
void Coordinator::HandleVote(const Request& request, Reply* reply) {
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
    if (decisions_.Committed(version)) {
      // Every rank's yes made it so: this rank gave up what it had voted for.
      return Fail(reply, Status::State("v" + std::to_string(version) + " is already committed; " +
                                       R(rank) + " voted for it"));
    }
    if (const std::string cause = R(rank) + " could not prepare it: " + why;
        decisions_.Abort(version, cause)) {
      to_announce_.push_back({version, false, cause});
      Log("v" + std::to_string(version) + " aborted: " + R(rank) + " cannot prepare it: " + why);
      cv_.notify_all();
    }
    return;
  }
  if (decisions_.Aborted(version)) {
    const std::string* cause = decisions_.AbortCause(version);
    return Fail(reply, Status::State("v" + std::to_string(version) + " was already aborted" +
                                     (cause != nullptr ? ": " + *cause : "")));
  }
  if (decisions_.Committed(version)) return;  // a repeated vote
  if (decisions_.Vote(version, rank).size() == options_.world_size) {
    // Every vote is in: the decision is durable before anyone hears of it.
    CrashPoint("coordinator:before_committed_written");
    Status w = catalog_->PutMeta("coord/committed/" + format::Hex64(version).substr(2), "1", true);
    if (!w.ok()) {
      const std::string cause = "the coordinator could not record it: " + w.message();
      decisions_.Abort(version, cause);
      to_announce_.push_back({version, false, cause});
      cv_.notify_all();
      return Fail(reply, w.WithContext("recording the decision for v" + std::to_string(version)));
    }
    for (uint32_t voter : decisions_.Commit(version)) {
      members_[voter].voted.insert(version);
      if (members_[voter].voted.size() > 64)
        members_[voter].voted.erase(members_[voter].voted.begin());
    }
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
// coordinator tells the other nodes first (Announce), so no rank's commit of it returned
// but on the node that was lost, and presumed abort decides it.
Status Coordinator::LearnDecisionsLocked(uint32_t rank, const std::vector<uint64_t>& committed) {
  for (uint64_t v : committed) {
    if (decisions_.Committed(v)) continue;
    if (decisions_.Aborted(v)) {
      return Status::Corrupt(R(rank) + " holds v" + std::to_string(v) +
                             " COMMITTED, which this coordinator aborted: is its catalog from "
                             "another job with the same token?");
    }
    CKPTDB_RETURN_IF_ERROR(
        catalog_->PutMeta("coord/committed/" + format::Hex64(v).substr(2), "1", true)
            .WithContext("recording the decision for v" + std::to_string(v) + " learned from " +
                         R(rank)));
    decisions_.Commit(v);
    Log("v" + std::to_string(v) + " is COMMITTED in " + R(rank) +
        "'s catalog and was not in the decision log (lost with rank 0's node?): recorded");
  }
  return Status::Ok();
}

int64_t Coordinator::NowMs() const { return options_.now_ms ? options_.now_ms() : MonoMs(); }

void Coordinator::Log(const std::string& line) const {
  if (options_.log) return options_.log(line);
  std::fprintf(stderr, "ckptdb[coordinator]: %s\n", line.c_str());
}

// Detects failed ranks and tells every rank each decision, in order, until it acknowledges, is
// declared dead, or the coordinator stops.
void Coordinator::Loop() {
  SetThreadName("ckpt-coordinat");
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms),
                   [this] { return stop_ || !to_announce_.empty(); });
      if (stop_) return;
    }
    Step();
  }
}

size_t Coordinator::pending_announcements() const {
  std::lock_guard<std::mutex> lock(mu_);
  return to_announce_.size();
}

size_t Coordinator::Step() {
  std::vector<Announcement> told;
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DetectFailuresLocked();
    if (to_announce_.empty()) return 0;
    for (; !to_announce_.empty(); to_announce_.pop_front()) {
      const Announcement& d = to_announce_.front();
      CKPTDB_ASSERT(d.committed ? decisions_.Committed(d.version) : decisions_.Aborted(d.version));
      told.push_back(d);
    }
    // Who listens, once for all of them: a copy of the members' holdings per decision would
    // cost the coordinator O(ranks x holdings) a version.
    listeners = ListenersLocked();
  }
  for (const Announcement& d : told) Announce(d, listeners);
  return told.size();
}

// A member silent for dead_after_ms is declared dead: what it left undecided is aborted and the
// epoch moves on.
void Coordinator::DetectFailuresLocked() {
  const int64_t now = NowMs();
  for (uint32_t rank = 1; rank < members_.size(); ++rank) {
    Member& m = members_[rank];
    if (complete_ && m.registered && !m.dead && now - m.last_seen_ms > options_.dead_after_ms) {
      m.dead = true;
      --live_members_;
      complete_ = false;
      std::string why = R(rank) + " (node " + m.node_id + ") sent no heartbeat for " +
                        std::to_string(now - m.last_seen_ms) + " ms";
      AbortUndecidedLocked(why);
      (void)BumpEpochLocked(why + ": declared dead");
    }
  }
}

// Ranks on other nodes than the coordinator's first, rank 0 itself last: by the time a rank on
// the coordinator's node has returned from its commit, the rest of the job has the decision in
// its catalogs, where a coordinator that lost this node's log learns it back.
std::vector<Coordinator::Listener> Coordinator::ListenersLocked() const {
  std::vector<Listener> out;
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t rank = members_.size(); rank-- > 0;) {
      const Member& m = members_[rank];
      if ((m.node_id != members_[0].node_id) != (pass == 0)) continue;
      if (m.registered && !m.dead) out.push_back({rank, m.node_id, m.address});
    }
  }
  return out;
}

void Coordinator::Announce(const Announcement& d, const std::vector<Listener>& listeners) {
  for (const Listener& l : listeners) {
    Status st = tell_(l.rank, l.address, d);
    if (!st.ok() && l.rank != 0) {
      Log("telling " + R(l.rank) + " about v" + std::to_string(d.version) +
          " failed: " + st.message());
    }
  }
}

void Coordinator::HandleDecisions(const Request&, Reply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  WireWriter w;
  std::vector<uint64_t> newest(decisions_.committed().rbegin(), decisions_.committed().rend());
  if (newest.size() > 256) newest.resize(256);
  w.U32(static_cast<uint32_t>(newest.size()));
  for (uint64_t v : newest) w.U64(v);
  reply->body = w.Take();
}

// The newest committed version every rank can restore: from its own tiers, or from a live
// peer holding its replica.
void Coordinator::HandleLatest(const Request&, Reply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status busy = SettledLocked(); !busy.ok()) return Fail(reply, busy);
  const int64_t now = NowMs();
  for (auto it = decisions_.committed().rbegin(); it != decisions_.committed().rend(); ++it) {
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
  Fail(reply, Status::NotFound(decisions_.committed().empty()
                                   ? "the job has no committed version"
                                   : std::to_string(decisions_.committed().size()) +
                                         " committed versions, but none that every rank can "
                                         "still restore from its tiers or a peer's memory"));
}

void Coordinator::HandleHolders(const Request& request, Reply* reply) {
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
void Coordinator::HandleRecoverable(const Request& request, Reply* reply) {
  WireReader r(request.body, "recoverable query from " + request.peer);
  const uint64_t version = r.U64("version");
  Status st = r.Finish();
  if (!st.ok()) return Fail(reply, st);
  std::lock_guard<std::mutex> lock(mu_);
  if (Status busy = SettledLocked(); !busy.ok()) return Fail(reply, busy);
  const std::string v = "v" + std::to_string(version);
  if (!decisions_.Committed(version)) {
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
      how = "its replica group's slices (and parity)";
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

// Whether `rank`'s segment of `version` can be rebuilt from its coding group: at most M of the
// group's members lack either their own copy of the version in memory (a member serves a rebuild
// from its ram tier only) or their parity of it (any M lost members leave K blocks of every
// stripe, redundancy/stripe_layout.h).
bool Coordinator::RebuildableLocked(uint32_t rank, uint64_t version) const {
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

std::map<uint32_t, int32_t> Coordinator::ArcSparesLocked(uint64_t version) const {
  std::map<uint32_t, int32_t> spares;
  // The groups whose every member's segment holds only replicated shards, with their
  // protection: from this coordinator's own comparisons of the version (until the members'
  // holdings list it; a group compared in a job without redundancy), or from live members'
  // holdings.
  std::map<std::vector<uint32_t>, uint8_t> groups;
  if (!options_.code && options_.replicas <= 1) {
    for (auto it = replica_checks_.lower_bound({version, 0});
         it != replica_checks_.end() && it->first.first == version; ++it) {
      const ReplicaCheckState& c = it->second;
      if (c.protection != 0 && c.result && c.result->ok()) groups[c.members] = c.protection;
    }
  }
  for (const Member& m : members_) {
    if (!m.registered || m.dead) continue;
    for (const ArcReport& a : m.arc) {
      if (a.version == version && a.replicated_only) groups[a.members] = a.protection;
    }
  }
  // A member keeps its slices (and parity) on any of its tiers, each member on its own node
  // (declare_replicas refuses two on one). Its spare: how many more members the group can lose,
  // any of them, and still restore every member (format::GroupRestores), counted up to 2.
  for (const auto& [g, protection] : groups) {
    const auto count = static_cast<uint32_t>(g.size());
    std::vector<bool> alive(count);
    std::vector<uint32_t> up;
    for (uint32_t q = 0; q < count; ++q) {
      const Member* m = g[q] < members_.size() ? &members_[g[q]] : nullptr;
      alive[q] =
          m != nullptr && m->registered && !m->dead &&
          (m->voted.count(version) || std::find(m->local_versions.begin(), m->local_versions.end(),
                                                version) != m->local_versions.end());
      if (alive[q]) up.push_back(q);
    }
    auto survives = [&](std::initializer_list<uint32_t> lost) {
      std::vector<bool> left = alive;
      for (uint32_t q : lost) left[q] = false;
      return format::GroupRestores(count, protection, left);
    };
    int32_t spare = survives({}) ? 0 : -1;
    bool singles = spare == 0;
    for (size_t i = 0; i < up.size() && singles; ++i) singles = survives({up[i]});
    if (singles) spare = 1;
    // Pairs only in groups of up to 64 (2,016 pairs): a larger group reports at most 1.
    bool pairs = singles && up.size() <= 64;
    for (size_t i = 0; i < up.size() && pairs; ++i) {
      for (size_t j = i + 1; j < up.size() && pairs; ++j) pairs = survives({up[i], up[j]});
    }
    if (pairs) spare = 2;
    for (uint32_t rank : g) spares[rank] = spare;
  }
  return spares;
}

// Busy (the asker retries) while a restarted coordinator gives serving daemons two heartbeats to
// announce themselves, or while a live rank has not yet recovered: no answer about where data
// lives is computed from holdings that are about to change. Never blocks a service thread.
Status Coordinator::SettledLocked() const {
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

// A `ckptdb serve` daemon announces (again) what it serves. Kept for dead_after_ms.
void Coordinator::HandleServe(const Request& request, Reply* reply) {
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
    Log("ckptdb serve on node " + node + " (" + address + ") holds " +
        std::to_string(held.replicas.size()) + " replicas");
  }
  s.node_id = node;
  s.replicas = std::move(held.replicas);
  s.last_seen_ms = NowMs();
  WireWriter w;
  w.U64(epoch_);
  reply->body = w.Take();
}

}  // namespace ckpt::engine
