// The C API (include/ckptdb/ckptdb.h) over engine::Db: argument checks that need no state and
// the thread-local last error; the options and the environment are resolved in engine/config.cc.

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/arena_gc.h"
#include "engine/db.h"
#include "engine/group_check.h"
#include "engine/repair.h"
#include "engine/simulation.h"
#include "format/manifest.h"
#include "util/assert.h"
#include "util/text.h"

// A handle counts the calls inside it, so that ckptdb_close frees it only once none is (a put
// whose caller released Python's GIL, a restore on another thread); calls that begin after the
// close did are refused (ESTATE) while it waits. A call that begins after ckptdb_close returned
// uses freed memory, as with any freed pointer.
struct ckptdb {
  std::unique_ptr<ckpt::engine::Db> db;
  std::mutex mu;
  std::condition_variable idle;
  uint32_t calls = 0;  // inside the handle, refused ones too until they have their answer
  bool closing = false;
};

struct ckptdb_server {
  std::unique_ptr<ckpt::engine::Cluster> cluster;
};

namespace {

thread_local std::string t_last_error;

int Fail(const ckpt::Status& st) {
  // Names and paths in a message are escaped where it is put together; this is the last guard
  // (no control byte, no invalid UTF-8, no megabyte message leaves the library).
  t_last_error = ckpt::SafeMessage(st.message());
  return st.code();
}
int Done(const ckpt::Status& st) {
  if (st.ok()) return CKPTDB_OK;
  return Fail(st);
}
// No C++ exception may cross the C boundary: allocation failure becomes CKPTDB_ENOMEM, anything
// else CKPTDB_EINTERNAL with its message.
template <typename F>
int Guard(const char* call, F body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    t_last_error = std::string(call) + ": out of memory";
    return CKPTDB_ENOMEM;
  } catch (const std::exception& e) {
    t_last_error = ckpt::SafeMessage(std::string(call) + ": internal error: " + e.what());
    return CKPTDB_EINTERNAL;
  } catch (...) {
    t_last_error = std::string(call) + ": internal error";
    return CKPTDB_EINTERNAL;
  }
}

int NullHandle(const char* call) {
  t_last_error = std::string(call) + ": the ckptdb handle is NULL";
  return CKPTDB_EINVAL;
}

// Guard for a call on an open handle: counted in the handle while it runs (see struct ckptdb).
// The handles this thread is inside (a callback's thread): closing one of them would wait for
// itself.
thread_local std::vector<const ckptdb*> t_inside;

template <typename F>
int GuardDb(ckptdb* db, const char* call, F body) {
  bool closing = false;
  {
    std::lock_guard<std::mutex> lock(db->mu);
    closing = db->closing;
    ++db->calls;  // a refused call too: the close must not free the mutex under its unlock
  }
  int rc = CKPTDB_ESTATE;
  if (closing) {
    rc = Fail(ckpt::Status::State(std::string(call) + ": the handle is being closed"));
  } else {
    t_inside.push_back(db);
    rc = Guard(call, body);
    t_inside.pop_back();
  }
  std::lock_guard<std::mutex> lock(db->mu);
  CKPTDB_ASSERT(db->calls > 0);
  if (--db->calls == 0) db->idle.notify_all();
  return rc;
}

}  // namespace

extern "C" {

size_t ckptdb_dtype_bytes(int dtype) {
  return dtype < 0 ? 0 : ckpt::format::DTypeBytes(static_cast<uint32_t>(dtype));
}

const char* ckptdb_dtype_name(int dtype) {
  static const char* const kNames[] = {"raw", "bool", "u8",      "i8",     "u16", "i16",
                                       "u32", "i32",  "u64",     "i64",    "f16", "bf16",
                                       "f32", "f64",  "f8_e4m3", "f8_e5m2"};
  if (dtype < 0 || dtype >= CKPTDB_DTYPE_COUNT_) return "?";
  return kNames[dtype];
}

const char* ckptdb_state_name(int state) {
  switch (state) {
    case CKPTDB_STATE_OPEN:
      return "OPEN";
    case CKPTDB_STATE_CAPTURED:
      return "CAPTURED";
    case CKPTDB_STATE_PREPARED:
      return "PREPARED";
    case CKPTDB_STATE_COMMITTED:
      return "COMMITTED";
    case CKPTDB_STATE_ABORTED:
      return "ABORTED";
    case CKPTDB_STATE_RETIRED:
      return "RETIRED";
    default:
      return "UNKNOWN";
  }
}

const char* ckptdb_last_error(void) { return t_last_error.c_str(); }

const char* ckptdb_status_name(int status) { return ckpt::StatusCodeName(status); }

void ckptdb_options_init(ckptdb_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->rank = CKPTDB_UNSET;
  o->world_size = CKPTDB_UNSET;
  o->create_if_missing = 1;
  o->drain_on_close = 1;
}

int ckptdb_open(const ckptdb_options* o, ckptdb** out) {
  if (o == nullptr || out == nullptr) {
    t_last_error = "ckptdb_open: options or out is NULL";
    return CKPTDB_EINVAL;
  }
  *out = nullptr;
  ckpt::engine::DbOptions d;
  if (ckpt::Status st = ckpt::engine::ResolveOpenOptions(*o, &d); !st.ok()) return Fail(st);
  return Guard("ckptdb_open", [&] {
    auto h = std::make_unique<ckptdb>();
    ckpt::Status open = ckpt::engine::Db::Open(d, &h->db);
    if (!open.ok()) return Fail(open);
    *out = h.release();
    return CKPTDB_OK;
  });
}

int ckptdb_close(ckptdb* db) {
  if (db == nullptr) return CKPTDB_OK;
  if (std::find(t_inside.begin(), t_inside.end(), db) != t_inside.end()) {
    return Fail(ckpt::Status::State(
        "ckptdb_close: called from inside a call on the same handle (a callback); close it "
        "once that call has returned"));
  }
  {
    std::unique_lock<std::mutex> lock(db->mu);
    if (db->closing) return Fail(ckpt::Status::State("ckptdb_close: the handle is being closed"));
    db->closing = true;
    db->idle.wait(lock, [db] { return db->calls == 0; });
  }
  return Guard("ckptdb_close", [&] {
    ckpt::Status st = db->db->Close();
    delete db;
    return Done(st);
  });
}

int ckptdb_put_shard(ckptdb* db, uint64_t version, const char* name, const void* data,
                     size_t nbytes, const ckptdb_tensor_info* info, unsigned flags) {
  if (db == nullptr) return NullHandle("ckptdb_put_shard");
  return GuardDb(db, "ckptdb_put_shard",
                 [&] { return Done(db->db->PutShard(version, name, data, nbytes, info, flags)); });
}

int ckptdb_put_shards(ckptdb* db, uint64_t version, const ckptdb_shard* shards, size_t count) {
  if (db == nullptr) return NullHandle("ckptdb_put_shards");
  return GuardDb(db, "ckptdb_put_shards",
                 [&] { return Done(db->db->PutShards(version, shards, count)); });
}

int ckptdb_wait_capture(ckptdb* db, uint64_t version, int timeout_ms) {
  if (db == nullptr) return NullHandle("ckptdb_wait_capture");
  return GuardDb(db, "ckptdb_wait_capture",
                 [&] { return Done(db->db->WaitCapture(version, timeout_ms)); });
}

int ckptdb_commit(ckptdb* db, uint64_t version, unsigned flags) {
  if (db == nullptr) return NullHandle("ckptdb_commit");
  return GuardDb(db, "ckptdb_commit", [&] { return Done(db->db->Commit(version, flags)); });
}

int ckptdb_wait_commit(ckptdb* db, uint64_t version, const char* tier, int timeout_ms) {
  if (db == nullptr) return NullHandle("ckptdb_wait_commit");
  return GuardDb(db, "ckptdb_wait_commit",
                 [&] { return Done(db->db->WaitCommit(version, tier, timeout_ms)); });
}

int ckptdb_abort(ckptdb* db, uint64_t version) {
  if (db == nullptr) return NullHandle("ckptdb_abort");
  return GuardDb(db, "ckptdb_abort", [&] { return Done(db->db->Abort(version)); });
}

int ckptdb_recoverable(ckptdb* db, uint64_t version, ckptdb_recoverable_t* out) {
  if (db == nullptr) return NullHandle("ckptdb_recoverable");
  if (out == nullptr) return Fail(ckpt::Status::Invalid("ckptdb_recoverable: out is NULL"));
  return GuardDb(db, "ckptdb_recoverable", [&] { return Done(db->db->Recoverable(version, out)); });
}

int ckptdb_latest(ckptdb* db, uint64_t* version) {
  if (db == nullptr) return NullHandle("ckptdb_latest");
  if (version == nullptr) return Fail(ckpt::Status::Invalid("ckptdb_latest: version is NULL"));
  return GuardDb(db, "ckptdb_latest", [&] { return Done(db->db->Latest(version)); });
}

int ckptdb_restore(ckptdb* db, uint64_t version, const char* name, void* dst, size_t nbytes,
                   unsigned flags) {
  if (db == nullptr) return NullHandle("ckptdb_restore");
  return GuardDb(db, "ckptdb_restore",
                 [&] { return Done(db->db->Restore(version, name, dst, nbytes, flags)); });
}

int ckptdb_restore_slice(ckptdb* db, uint64_t version, const char* name, const ckptdb_box* box,
                         void* dst, size_t nbytes, unsigned flags, uint64_t* covered) {
  if (db == nullptr) return NullHandle("ckptdb_restore_slice");
  return GuardDb(db, "ckptdb_restore_slice", [&] {
    return Done(db->db->RestoreSlice(version, name, box, dst, nbytes, flags, covered));
  });
}

int ckptdb_list(ckptdb* db, uint64_t version, ckptdb_list_fn fn, void* arg) {
  if (db == nullptr) return NullHandle("ckptdb_list");
  return GuardDb(db, "ckptdb_list", [&] { return Done(db->db->List(version, fn, arg)); });
}

int ckptdb_list_chunks(ckptdb* db, uint64_t version, const char* name, ckptdb_chunk_fn fn,
                       void* arg, const char** source) {
  if (db == nullptr) return NullHandle("ckptdb_list_chunks");
  return GuardDb(db, "ckptdb_list_chunks",
                 [&] { return Done(db->db->ListChunks(version, name, fn, arg, source)); });
}

int ckptdb_list_versions(ckptdb* db, ckptdb_version_fn fn, void* arg) {
  if (db == nullptr) return NullHandle("ckptdb_list_versions");
  return GuardDb(db, "ckptdb_list_versions", [&] { return Done(db->db->ListVersions(fn, arg)); });
}

int ckptdb_verify(ckptdb* db, uint64_t version, const char* tier, ckptdb_verify_fn fn, void* arg,
                  ckptdb_verify_report* out) {
  if (db == nullptr) return NullHandle("ckptdb_verify");
  return GuardDb(db, "ckptdb_verify",
                 [&] { return Done(db->db->Verify(version, tier, fn, arg, out)); });
}

int ckptdb_verify_groups(ckptdb* const* dbs, size_t count, uint64_t version, unsigned flags,
                         ckptdb_group_fn fn, void* arg) {
  return Guard("ckptdb_verify_groups", [&] {
    if (dbs == nullptr && count > 0)
      return Done(ckpt::Status::Invalid("verify_groups: dbs is NULL"));
    if ((flags & ~CKPTDB_GROUPS_LAYOUT_ONLY) != 0) {
      return Done(ckpt::Status::Invalid("verify_groups: unknown flags " + std::to_string(flags)));
    }
    std::vector<ckpt::engine::Db*> stores;
    for (size_t i = 0; i < count; ++i) {
      if (dbs[i] == nullptr) {
        return Done(
            ckpt::Status::Invalid("verify_groups: handle " + std::to_string(i) + " is NULL"));
      }
      stores.push_back(dbs[i]->db.get());
    }
    return Done(ckpt::engine::CheckCodingGroups(
        stores, version, (flags & CKPTDB_GROUPS_LAYOUT_ONLY) != 0,
        [&](const ckpt::engine::GroupCheck& c) {
          if (fn == nullptr) return;
          const std::string code = c.group.code.Name();
          std::vector<const char*> sources;
          std::vector<const char*> parity;
          for (const std::string& s : c.sources) sources.push_back(s.c_str());
          for (const std::string& s : c.parity) parity.push_back(s.c_str());
          std::string problems;
          for (const std::string& p : c.problems) problems += p + "\n";
          ckptdb_group_check out{};
          out.version = c.version;
          out.group = c.group.group;
          out.code = code.c_str();
          out.k = c.group.code.k;
          out.m = c.group.code.m;
          out.members = static_cast<uint32_t>(c.group.members.size());
          out.ranks = c.group.members.data();
          out.member_bytes = c.member_bytes.data();
          out.sources = sources.data();
          out.parity = parity.data();
          out.stripes = c.stripes;
          out.parity_blocks = c.parity_blocks;
          out.parity_checked = c.parity_checked;
          out.parity_bad = c.parity_bad;
          out.recoverable = c.recoverable ? 1 : 0;
          out.from_memory = c.from_memory ? 1 : 0;
          out.spare_losses = c.spare;
          out.problems = problems.c_str();
          fn(arg, &out);
        }));
  });
}

int ckptdb_declare_replicas(ckptdb* db, uint32_t group, const uint32_t* members, size_t count,
                            const char* protection) {
  if (db == nullptr) return NullHandle("ckptdb_declare_replicas");
  return GuardDb(db, "ckptdb_declare_replicas",
                 [&] { return Done(db->db->DeclareReplicas(group, members, count, protection)); });
}

int ckptdb_hint(ckptdb* db, unsigned hints) {
  if (db == nullptr) return NullHandle("ckptdb_hint");
  return GuardDb(db, "ckptdb_hint", [&] { return Done(db->db->Hint(hints)); });
}

int ckptdb_stats(ckptdb* db, ckptdb_stats_t* out) {
  if (db == nullptr) return NullHandle("ckptdb_stats");
  if (out == nullptr) return Fail(ckpt::Status::Invalid("ckptdb_stats: out is NULL"));
  return GuardDb(db, "ckptdb_stats", [&] { return Done(db->db->Stats(out)); });
}

int ckptdb_open_problems(ckptdb* db, ckptdb_repair_fn fn, void* arg, uint64_t* count) {
  if (db == nullptr) return NullHandle("ckptdb_open_problems");
  return GuardDb(db, "ckptdb_open_problems", [&] {
    const std::vector<std::string>& problems = db->db->open_problems();
    if (count != nullptr) *count = problems.size();
    for (const std::string& p : problems) {
      if (fn != nullptr) fn(arg, p.c_str());
    }
    return CKPTDB_OK;
  });
}

int ckptdb_version_stats(ckptdb* db, uint64_t version, ckptdb_version_stats_t* out) {
  if (db == nullptr) return NullHandle("ckptdb_version_stats");
  if (out == nullptr) return Fail(ckpt::Status::Invalid("ckptdb_version_stats: out is NULL"));
  return GuardDb(db, "ckptdb_version_stats",
                 [&] { return Done(db->db->GetVersionStats(version, out)); });
}

int ckptdb_serve(const ckptdb_options* o, ckptdb_server** out) {
  if (o == nullptr || out == nullptr) {
    t_last_error = "ckptdb_serve: options or out is NULL";
    return CKPTDB_EINVAL;
  }
  *out = nullptr;
  ckpt::engine::DbOptions d;
  if (ckpt::Status st = ckpt::engine::ResolveServeOptions(*o, &d); !st.ok()) return Fail(st);
  return Guard("ckptdb_serve", [&] {
    auto h = std::make_unique<ckptdb_server>();
    ckpt::Status st = ckpt::engine::ServeNodeMemory(d, &h->cluster);
    if (!st.ok()) return Fail(st);
    *out = h.release();
    return CKPTDB_OK;
  });
}

int ckptdb_gc(const char* dir, int remove, ckptdb_shm_fn fn, void* arg) {
  return Guard("ckptdb_gc", [&] {
    std::vector<ckpt::engine::ShmEntry> entries;
    ckpt::Status st =
        ckpt::engine::CollectSharedMemory(dir != nullptr ? dir : "/dev/shm", remove != 0, &entries);
    if (!st.ok()) return Fail(st);
    for (const ckpt::engine::ShmEntry& e : entries) {
      ckptdb_shm_entry c{};
      c.path = e.path.c_str();
      c.kind = e.kind == ckpt::engine::ShmEntry::Kind::kArena      ? CKPTDB_SHM_ARENA
               : e.kind == ckpt::engine::ShmEntry::Kind::kReplicas ? CKPTDB_SHM_REPLICAS
                                                                   : CKPTDB_SHM_PARITY;
      c.rank = e.rank;
      c.job_id = e.job_id;
      c.root = e.root.c_str();
      c.bytes = e.bytes;
      c.has_version = e.has_version ? 1 : 0;
      c.newest_version = e.newest_version;
      c.in_use = e.in_use ? 1 : 0;
      c.root_exists = e.root_exists ? 1 : 0;
      c.owned = e.owned ? 1 : 0;
      c.orphan = e.orphan ? 1 : 0;
      c.removed = e.removed ? 1 : 0;
      c.problem = e.problem.c_str();
      if (fn != nullptr && fn(arg, &c) != 0) break;
    }
    return CKPTDB_OK;
  });
}

int ckptdb_repair(const ckptdb_options* o, ckptdb_repair_fn fn, void* arg,
                  ckptdb_repair_report* out) {
  if (o == nullptr) return Fail(ckpt::Status::Invalid("ckptdb_repair: options is NULL"));
  ckpt::engine::DbOptions d;
  if (ckpt::Status st = ckpt::engine::ResolveRepairOptions(*o, &d); !st.ok()) return Fail(st);
  return Guard("ckptdb_repair", [&] {
    ckpt::engine::RepairOutcome outcome;
    ckpt::Status st = ckpt::engine::RepairStore(
        d,
        [fn, arg](const std::string& line) {
          if (fn != nullptr) fn(arg, line.c_str());
        },
        &outcome);
    if (out != nullptr) {
      *out = ckptdb_repair_report{};
      out->catalog_rebuilt = outcome.catalog_rebuilt ? 1 : 0;
      out->versions_recovered = outcome.versions_recovered;
      out->versions_lost = outcome.versions_lost;
      out->copies_recovered = outcome.copies_recovered;
      out->files_moved_aside = outcome.files_moved_aside;
      out->witnesses_written = outcome.witnesses_written;
    }
    if (!st.ok()) return Fail(st);
    return CKPTDB_OK;
  });
}

int ckptdb_simulate(const ckptdb_simulate_options* o, ckptdb_repair_fn fn, void* arg,
                    ckptdb_simulate_report* out) {
  if (o == nullptr) return Fail(ckpt::Status::Invalid("ckptdb_simulate: options is NULL"));
  if (o->ranks == 0 || o->ranks > 100000 || o->ranks_per_node > o->ranks) {
    return Fail(ckpt::Status::Invalid("ckptdb_simulate: " + std::to_string(o->ranks) + " ranks, " +
                                      std::to_string(o->ranks_per_node) +
                                      " a node: ranks must be 1 to 100000, at least a node's"));
  }
  ckpt::engine::SimulationOptions so;
  so.ranks = o->ranks;
  so.ranks_per_node = o->ranks_per_node == 0 ? std::min<uint32_t>(8, o->ranks) : o->ranks_per_node;
  so.seed = o->seed;
  so.versions = o->versions == 0 ? 5 : o->versions;
  so.faults = o->faults != 0;
  if (o->dir != nullptr) so.dir = o->dir;
  auto line = [fn, arg](const std::string& text) {
    if (fn != nullptr) fn(arg, text.c_str());
  };
  if (o->trace) so.trace = line;
  return Guard("ckptdb_simulate", [&] {
    ckpt::engine::SimulationResult result;
    ckpt::Status st = ckpt::engine::Simulate(so, &result);
    if (!st.ok()) return Fail(st);
    if (!o->trace) {
      for (const std::string& v : result.violations) line(v);
    }
    if (out != nullptr) {
      const ckpt::engine::SimulationFigures& f = result.figures;
      *out = ckptdb_simulate_report{};
      out->simulated_ms = f.sim_ms;
      out->committed = f.committed;
      out->aborted = f.aborted;
      out->messages = f.messages;
      out->dropped = f.dropped;
      out->faults = f.faults;
      out->coordinator_opens = f.coordinator_opens;
      out->votes = f.votes;
      out->vote_ns = f.vote_ns;
      out->heartbeats = f.heartbeats;
      out->heartbeat_ns = f.heartbeat_ns;
      out->registers = f.registers;
      out->register_ns = f.register_ns;
      out->queries = f.queries;
      out->query_ns = f.query_ns;
      out->steps = f.steps;
      out->step_ns = f.step_ns;
      out->violations = result.violations.size();
    }
    return CKPTDB_OK;
  });
}

int ckptdb_server_stats(ckptdb_server* s, ckptdb_server_stats_t* out) {
  if (s == nullptr || out == nullptr) {
    t_last_error = "ckptdb_server_stats: the server or out is NULL";
    return CKPTDB_EINVAL;
  }
  return Guard("ckptdb_server_stats", [&] {
    *out = ckptdb_server_stats_t{};
    ckpt::engine::ClusterStats cs = s->cluster->stats();
    out->replicas = s->cluster->HeldReplicas().size();
    out->served_bytes = cs.served_bytes;
    out->refused = cs.refused;
    std::snprintf(out->address, sizeof out->address, "%s", s->cluster->address().c_str());
    return CKPTDB_OK;
  });
}

int ckptdb_serve_stop(ckptdb_server* s) {
  if (s == nullptr) return CKPTDB_OK;
  return Guard("ckptdb_serve_stop", [&] {
    delete s;
    return CKPTDB_OK;
  });
}

}  // extern "C"
