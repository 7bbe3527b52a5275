// The Db's side of a job of world_size > 1 ranks (DESIGN.md sections 6-7): joining through the
// Cluster, resolving versions left in doubt, the worker that pushes replicas and casts votes off
// the manager thread, decisions from the coordinator, and replica groups. Restoring from peers'
// memory is in peer_restore.cc.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "io/io.h"
#include "io/tier_spec.h"
#include "util/assert.h"
#include "util/thread_name.h"

namespace ckpt::engine {

// The Cluster's options from the handle's, checked: Invalid naming
// what a job of world_size > 1 needs and lacks.
Status Db::ClusterOptionsFor(ClusterOptions* co) const {
  co->rank = options_.rank;
  co->world_size = options_.world_size;
  co->node_id = options_.node_id;
  co->coordinator = options_.coordinator;
  co->listen = options_.listen;
  co->job_token = options_.job_token;
  co->report_fd = options_.report_fd;
  co->io = io_;
  co->tls = options_.ucx_tls;
  co->heartbeat_ms = options_.heartbeat_ms;
  co->dead_after_ms = options_.dead_after_ms;
  co->join_timeout_ms = options_.join_timeout_ms;
  co->bandwidth_bytes_per_s = options_.replicate_bytes_per_s;
  co->interleave = options_.interleave;
  CKPTDB_RETURN_IF_ERROR(ParseRedundancy(options_.redundancy, &co->replicas, &co->code));
  if (!tiers_[0].is_ram()) {
    return Status::Invalid("options: world_size " + std::to_string(options_.world_size) +
                           " needs a ram first tier (checkpoints live in host memory and are "
                           "replicated to peers' memory), e.g. \"ram:8G;disk:/nvme/ck\"");
  }
  co->replica_dir = tiers_[0].spec.path + "/ckptdb-replicas-r" + std::to_string(options_.rank);
  co->replica_keep = std::max<uint32_t>(2, tiers_[0].spec.keep);
  co->replica_budget_bytes = tiers_[0].spec.replica_bytes;
  co->parity_dir = tiers_[0].spec.path + "/ckptdb-parity-r" + std::to_string(options_.rank);
  co->job_id = identity_.job_id;
  co->code_unit_bytes = options_.ec_unit_bytes;
  return Status::Ok();
}

Status Db::StartCluster() {
  ClusterOptions co;
  CKPTDB_RETURN_IF_ERROR(ClusterOptionsFor(&co));
  Cluster::Hooks hooks;
  hooks.decided = [this](uint64_t version, bool committed, const std::string& why) {
    return OnDecision(version, committed, why);
  };
  hooks.waiting = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [version, v] : live_) {
      if (v.phase == CommitPhase::kVoting && v.job.yes_sent() &&
          v.job.decision() == JobCommit::Decision::kNone) {
        return version;
      }
    }
    return uint64_t{0};
  };
  hooks.local_versions = [this] {
    std::vector<uint64_t> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = versions_.rbegin(); it != versions_.rend() && out.size() < 256; ++it) {
      if (it->second.record.state != CKPTDB_STATE_COMMITTED) continue;
      for (size_t ti = 0; ti < tiers_.size(); ++ti) {
        if (Durable(it->second, ti)) {
          out.push_back(it->first);
          break;
        }
      }
    }
    return out;
  };
  hooks.committed = [this](uint64_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<uint64_t> last = LastCommitted();  // COMMITTED or RETIRED
    return last && version <= *last;
  };
  hooks.memory_versions = [this] {
    Cluster::Hooks::InMemory out;
    std::lock_guard<std::mutex> lock(mu_);
    std::set<uint64_t, std::greater<>> in_ram;
    for (const auto& [version, v] : live_) {
      // Voted for: its ram copy is whole (the commit tier of a job's rank is ram).
      if (v.ram && v.job.yes_sent()) in_ram.insert(version);
    }
    for (auto it = ram_images_.rbegin(); it != ram_images_.rend(); ++it) {
      auto entry = versions_.find(it->first);
      if (entry != versions_.end() && entry->second.record.state == CKPTDB_STATE_COMMITTED &&
          Durable(entry->second, 0)) {
        in_ram.insert(it->first);
      }
    }
    for (uint64_t v : in_ram) {
      if (out.versions.size() == 256) break;
      out.versions.push_back(v);
    }
    out.voted_through = newest_vote_sent_;
    // The versions it holds (in memory, or committed on a tier) that an "arc" replica group
    // deduplicated, newest first; the others are forgotten.
    for (auto it = arc_versions_.begin(); it != arc_versions_.end();) {
      auto entry = versions_.find(it->first);
      const bool held =
          in_ram.count(it->first) || live_.count(it->first) ||
          (entry != versions_.end() && entry->second.record.state == CKPTDB_STATE_COMMITTED);
      it = held ? std::next(it) : arc_versions_.erase(it);
    }
    for (auto it = arc_versions_.rbegin();
         it != arc_versions_.rend() && out.arc.size() < kMaxArcReports; ++it) {
      if (live_.count(it->first) && !in_ram.count(it->first)) continue;  // not voted for yet
      out.arc.push_back({it->first, it->second.group, it->second.replicated_only,
                         it->second.members, it->second.protection});
    }
    return out;
  };
  hooks.read_own = [this](uint64_t version, uint64_t offset, uint64_t bytes, uint8_t* out) {
    return ReadOwnSegment(version, offset, bytes, out);
  };
  hooks.own_file = [this](uint64_t version, std::string* path) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it != versions_.end() && it->second.record.state == CKPTDB_STATE_COMMITTED) {
      for (size_t ti = 1; ti < tiers_.size(); ++ti) {
        for (const ResidencyRecord& r : it->second.residency) {
          if (r.tier == tiers_[ti].name() && r.state == CKPTDB_RESIDENT_DURABLE) {
            *path = r.path;
            return Status::Ok();
          }
        }
      }
    }
    return Status::NotFound(V(version) + " is committed on none of this rank's directory tiers");
  };
  hooks.own_bytes = [this](uint64_t version, uint64_t* bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ram_images_.find(version);
    if (tiers_.empty() || !tiers_[0].is_ram() || it == ram_images_.end()) {
      return Status::NotFound(V(version) + " is not in this rank's ram tier");
    }
    *bytes = it->second.file_bytes;
    return Status::Ok();
  };
  CKPTDB_RETURN_IF_ERROR(Cluster::Start(co, std::move(hooks), catalog_.get(), &cluster_));
  for (size_t lane = 0; lane < kClusterLanes; ++lane) {
    cluster_workers_[lane] = std::thread([this, lane] { ClusterWorkerLoop(lane); });
  }
  return Status::Ok();
}

Status ServeNodeMemory(const DbOptions& options, std::unique_ptr<Cluster>* out) {
  std::vector<io::TierSpec> tiers;
  if (options.tiers.empty()) {
    return Status::Invalid(
        "ckptdb serve: no tiers: give the ram tier whose directory to serve "
        "(e.g. \"ram:1G,dir=/dev/shm/job\")");
  }
  CKPTDB_RETURN_IF_ERROR(io::ParseTierSpecs(options.tiers, "", &tiers));
  if (tiers.empty() || tiers[0].kind != io::TierKind::kRam) {
    return Status::Invalid("ckptdb serve: tiers '" + options.tiers +
                           "' have no ram tier: replicas live in the ram tier's directory");
  }
  if (options.node_id.empty()) return Status::Invalid("ckptdb serve: no node_id");
  ClusterOptions co;
  co.serve_only = true;
  co.node_id = options.node_id;
  co.coordinator = options.coordinator;
  co.listen = options.listen;
  co.job_token = options.job_token;
  co.report_fd = options.report_fd;
  co.tls = options.ucx_tls;
  co.heartbeat_ms = options.heartbeat_ms;
  co.dead_after_ms = options.dead_after_ms;
  co.replica_dir = tiers[0].path;
  co.world_size = 65536;  // owners above the job's size are dropped by the coordinator
  return Cluster::Start(co, Cluster::Hooks{}, nullptr, out);
}

// PREPARED versions are decided by the coordinator: committed ones become COMMITTED here, the
// rest are left to Recover, which aborts every undecided version (presumed abort: the
// coordinator aborted them when this incarnation registered).
Status Db::ResolveInDoubt() {
  std::set<uint64_t> committed;
  CKPTDB_RETURN_IF_ERROR(cluster_->Decisions(&committed)
                             .WithContext("rank " + std::to_string(options_.rank) +
                                          ": asking the coordinator about versions in doubt"));
  std::lock_guard<std::mutex> lock(mu_);
  job_committed_ = committed;
  CatalogBatch batch;
  for (auto& [version, e] : versions_) {
    if (e.record.state == CKPTDB_STATE_PREPARED && committed.count(version)) {
      e.record.state = CKPTDB_STATE_COMMITTED;
      e.record.committed_unix_ns = WallNs();
      batch.put_versions.push_back(e.record);
    }
  }
  if (batch.put_versions.empty()) return Status::Ok();
  CKPTDB_RETURN_IF_ERROR(catalog_->Apply(batch, /*sync=*/true));
  // At open no commit call waits for these: a failure is printed (and ckptdb repair writes
  // the witness later).
  for (const VersionRecord& r : batch.put_versions) (void)WriteWitness(r);
  return Status::Ok();
}

// Segments of this rank on directory tiers that the catalog does not know, of versions the
// coordinator committed: checked (framing, footer, manifest) and recorded COMMITTED with their
// residency, so that Recover keeps them and restore and latest see them. Anything else unknown
// is left to Recover, which removes it.
Status Db::AdoptSegments() {
  std::lock_guard<std::mutex> lock(mu_);
  CatalogBatch batch;
  for (const TierState& tier : tiers_) {
    if (tier.is_ram() || !tier.online()) continue;
    std::vector<SegmentFileName> files;
    CKPTDB_RETURN_IF_ERROR(tier.dir->ListSegments(&files));
    for (const SegmentFileName& f : files) {
      if (f.temporary || f.rank != identity_.rank || versions_.count(f.version) ||
          !job_committed_.count(f.version)) {
        continue;
      }
      const std::string path = tier.spec.path + "/" + f.name;
      const std::string what = "segment " + path + " (tier " + tier.name() + ")";
      int fd = -1;
      bool direct = false;
      Status st = io_->Open(path, io::OpenOptions{}, &fd, &direct).WithContext(what);
      uint64_t size = 0;
      if (st.ok()) st = io_->FileSize(fd, &size);
      std::unique_ptr<format::SegmentReader> reader;
      if (st.ok()) {
        io::IoQueue* q = read_queue_.get();
        st = format::SegmentReader::Open(
            what, size,
            [q, fd, what](uint64_t off, void* buf, size_t len) {
              return io::ReadAt(*q, fd, off, buf, len, what);
            },
            &reader);
      }
      if (fd >= 0) (void)io_->Close(fd);
      if (st.ok() && (reader->footer().version != f.version || reader->footer().rank != f.rank)) {
        st = Status::Corrupt(what + ": its footer says v" +
                             std::to_string(reader->footer().version) + " of rank " +
                             std::to_string(reader->footer().rank));
      }
      if (!st.ok()) {
        std::fprintf(stderr, "ckptdb[rank %u]: not adopting %s\n", identity_.rank,
                     st.message().c_str());
        continue;  // Recover removes it
      }
      VersionRecord rec;
      rec.version = f.version;
      rec.state = CKPTDB_STATE_COMMITTED;
      rec.rank = f.rank;
      const format::ManifestView& m = reader->manifest();
      rec.tensor_count = m.tensor_count();
      for (uint32_t i = 0; i < m.tensor_count(); ++i) rec.data_bytes += m.tensor(i).bytes();
      rec.chunk_count = reader->footer().chunk_count;
      rec.created_unix_ns = rec.committed_unix_ns = WallNs();
      rec.manifest_xxh3 = reader->footer().manifest_xxh3;
      ResidencyRecord res;
      res.tier = tier.name();
      res.state = CKPTDB_RESIDENT_DURABLE;
      res.path = path;
      res.file_bytes = size;
      VersionEntry& e = versions_[f.version];
      if (!e.has_record) {
        e.has_record = true;
        e.record = rec;
        batch.put_versions.push_back(rec);
      }
      e.residency.push_back(res);
      batch.put_residency.emplace_back(f.version, res);
      std::fprintf(stderr,
                   "ckptdb[rank %u]: adopted v%" PRIu64
                   " from %s: the coordinator committed it and this rank's catalog did not know "
                   "it (a replacement node)\n",
                   identity_.rank, f.version, what.c_str());
    }
  }
  if (batch.put_versions.empty() && batch.put_residency.empty()) return Status::Ok();
  CKPTDB_RETURN_IF_ERROR(catalog_->Apply(batch, /*sync=*/true));
  // At open no commit call waits for these: a failure is printed (and ckptdb repair writes
  // the witness later).
  for (const VersionRecord& r : batch.put_versions) (void)WriteWitness(r);
  return Status::Ok();
}

Status Db::OnDecision(uint64_t version, bool committed, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (committed) job_committed_.insert(version);
  JobCommit::Message m;
  m.kind = JobCommit::Message::Kind::kDecided;
  m.version = version;
  m.committed = committed;
  m.why = why;
  DeliverLocked(m);
  return Status::Ok();
}

void Db::DeliverLocked(const JobCommit::Message& m) {
  using Kind = JobCommit::Message::Kind;
  auto it = live_.find(m.version);
  if (it == live_.end()) return;
  LiveVersion& v = it->second;
  if (m.generation != JobCommit::Message::kAnyGeneration && m.generation != v.generation) return;
  switch (m.kind) {
    case Kind::kReplicated:
      v.job.Replicated(m.status);
      break;
    case Kind::kVoteRefused:
      // Fenced, or already aborted: it cannot commit; RunCommit fails it.
      v.job.Refused(m.status.message());
      break;
    case Kind::kVoteUndelivered:
      CKPTDB_ASSERT(v.job.yes_sent());
      if (v.job.decision() != JobCommit::Decision::kNone) break;  // the decision came anyway
      // The vote may or may not have arrived (the coordinator may have committed and died): the
      // version stays PREPARED with its copies, in doubt, until an open asks the coordinator.
      // Nothing here may abort it.
      RememberOutcome(
          m.version,
          m.status.WithContext(V(m.version) + " is PREPARED and in doubt; reopen to learn the "
                                              "coordinator's decision"),
          /*may_put_again=*/false);
      if (v.ram) v.image = RamImage{};
      live_.erase(it);
      state_cv_.notify_all();
      break;
    case Kind::kDecided:
      if (v.phase == CommitPhase::kVoting) {
        v.job.Decide(m.committed, m.why);  // RunCommit records it
      } else if (!m.committed) {
        // Aborted before this rank voted (another rank failed): stop here, no vote needed.
        v.job.Decide(false, m.why);
        FailLocked(&v, Status::State(V(m.version) + " was aborted by the coordinator" +
                                     (m.why.empty() ? "" : ": " + m.why)));
      }
      break;
  }
  WakeManager();
}

bool Db::ClaimYesLocked(uint64_t version) {
  auto it = live_.find(version);
  // Given up since (a newer commit, a failure): FinishAbort votes no instead.
  if (it == live_.end() || it->second.abort_requested) return false;
  it->second.job.ClaimYes();
  newest_vote_sent_ = std::max(newest_vote_sent_, version);
  return true;
}

void Db::PostClusterJob(ClusterLane lane, std::function<void()> job) {
  cluster_jobs_[lane].push_back(std::move(job));  // mu_ held by the caller (the manager)
  cluster_cv_[lane].notify_one();
}

void Db::ClusterWorkerLoop(size_t lane) {
  SetThreadName(lane == kVoteLane ? "ckpt-vote" : "ckpt-protect");
  std::unique_lock<std::mutex> lock(mu_);
  std::deque<std::function<void()>>& jobs = cluster_jobs_[lane];
  while (true) {
    cluster_cv_[lane].wait(lock, [&] { return cluster_stop_ || !jobs.empty(); });
    if (jobs.empty()) return;  // stopping, and nothing left
    auto job = std::move(jobs.front());
    jobs.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

Status Db::Hint(unsigned hints) {
  static_assert(CKPTDB_HINT_NET_BUSY == kHintNetBusy && CKPTDB_HINT_NET_IDLE == kHintNetIdle &&
                CKPTDB_HINT_ITERATION == kHintIteration);
  if (hints & ~(CKPTDB_HINT_NET_BUSY | CKPTDB_HINT_NET_IDLE | CKPTDB_HINT_ITERATION)) {
    return Status::Invalid("hint: unknown bits " + std::to_string(hints));
  }
  if ((hints & CKPTDB_HINT_NET_BUSY) && (hints & CKPTDB_HINT_NET_IDLE)) {
    return Status::Invalid("hint: NET_BUSY and NET_IDLE at once");
  }
  if (cluster_ != nullptr && hints != 0) cluster_->Hint(hints);
  return Status::Ok();
}

Status Db::DeclareReplicas(uint32_t group, const uint32_t* members, size_t count,
                           const char* protection) {
  const std::string what = "declare_replicas group " + std::to_string(group);
  std::string scheme = protection == nullptr ? "none" : protection;
  // REFT's AOR goes with ARC or AEC for the replicated shards: "aor" alone is "arc+aor".
  if (scheme == "aor") scheme = "arc+aor";
  const bool aor = scheme.ends_with("+aor");
  if (aor) scheme.resize(scheme.size() - 4);
  if ((scheme != "none" || aor) && scheme != "arc" && scheme != "aec" && scheme != "arc+aec") {
    return Status::Invalid(what + ": protection '" + std::string(protection).substr(0, 64) +
                           "' is not none, arc, aec, arc+aec, aor, arc+aor, aec+aor or "
                           "arc+aec+aor");
  }
  if (options_.read_only) return Status::State(what + ": the store is open read-only");
  if (cluster_ == nullptr) {
    return Status::Invalid(what + ": a replica group needs a job (world_size > 1)");
  }
  if (members == nullptr || count < 2 || count > 1024) {
    return Status::Invalid(what + ": members must list 2 to 1024 ranks");
  }
  std::vector<uint32_t> list(members, members + count);
  std::sort(list.begin(), list.end());  // the same set in any order is the same group
  std::set<uint32_t> distinct(list.begin(), list.end());
  if (distinct.size() != list.size()) {
    return Status::Invalid(what + ": a rank is listed twice");
  }
  if (*distinct.rbegin() >= options_.world_size) {
    return Status::Invalid(what + ": rank " + std::to_string(*distinct.rbegin()) +
                           " is not below world_size " + std::to_string(options_.world_size));
  }
  if (!distinct.count(options_.rank)) {
    return Status::Invalid(what + ": this rank (" + std::to_string(options_.rank) +
                           ") is not among its members");
  }
  const bool arc = scheme == "arc" || scheme == "arc+aec";
  const bool aec = scheme == "aec" || scheme == "arc+aec";
  if (aor) scheme += "+aor";  // named whole in the messages below
  const bool job_redundancy = cluster_->options().replicas > 1 || cluster_->options().code;
  if ((arc || aec) && cluster_->options().code) {
    return Status::NotSupported(what + ": protection '" + scheme +
                                "' with a coding group (ec:K+M, xor:K): a "
                                "member's slices are read from its tiers or its replicas, not "
                                "rebuilt; use redundancy none or replicate:M");
  }
  if (aec && count < 3) {
    return Status::Invalid(what + ": protection '" + scheme +
                           "' needs 3 or more members (with 2, the parity of the other's slice "
                           "is a copy of it: use \"arc\")");
  }
  if (arc || aec) {
    // ARC's copy of a member's slice is kept by the member before it, AEC's parity of it by the
    // members after it: each on another node, or the loss of one node would take both.
    std::map<std::string, uint32_t> on_node;
    for (uint32_t rank : list) {
      ReplicaHolder m;
      CKPTDB_RETURN_IF_ERROR(cluster_->MemberAt(rank, &m).WithContext(what));
      auto [it, fresh] = on_node.emplace(m.node_id, rank);
      if (!fresh) {
        return Status::Invalid(what + ": protection '" + scheme +
                               "' needs its members on distinct nodes; " + R(it->second) + " and " +
                               R(rank) + " are both on node " + m.node_id);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  if (replica_group_) {
    if (replica_group_->group == group && replica_group_->members == list &&
        replica_group_->arc == arc && replica_group_->aec == aec && replica_group_->aor == aor) {
      return Status::Ok();
    }
    return Status::State(what + ": this handle declared replica group " +
                         std::to_string(replica_group_->group) + " already");
  }
  if ((arc || aec) && !aor && !job_redundancy) {
    // Without the job's redundancy a member's whole segment must be derivable from its group:
    // shards put before, not replicated, would have no copy on another node.
    for (const auto& [version, v] : live_) {
      if (v.names.size() != v.replicated_names.size()) {
        return Status::State(what + ": " + V(version) +
                             " already holds shards that are not replicated; declare the group "
                             "before the first put");
      }
    }
  }
  replica_group_ = ReplicaGroup{group, std::move(list), arc, aec, aor};
  return Status::Ok();
}

}  // namespace ckpt::engine
