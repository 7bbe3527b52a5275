// The commit protocol at scale, simulated (docs/testing.md, "Simulation"): the real Coordinator,
// each rank's JobCommit and the membership protocol's messages in their wire form, driven by
// thousands of simulated ranks in one process over a simulated network, in simulated time,
// deterministic from a seed (in the manner of FoundationDB's simulation and TigerBeetle's VOPR).
//
// The network delays, drops and reorders messages and partitions nodes; ranks, the coordinator,
// whole nodes (their catalogs wiped) and the whole job are killed and restarted. After every
// seed it checks what must hold: a version is committed only with every rank's yes and no
// accepted no (presumed abort), no rank records COMMITTED a version another was told aborted, no
// committed version is lost, the job keeps committing once the faults stop, and at the end every
// rank agrees with the coordinator on the latest version.
//
// What it does not model: the data path (replication is a delay that may fail), the ranks' own
// stores (a rank's catalog is its map of PREPARED and COMMITTED versions), and UCX.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::engine {

struct SimulationOptions {
  uint32_t ranks = 1000;
  uint32_t ranks_per_node = 8;
  uint64_t seed = 1;
  // Versions the job must commit after the last fault (the run's end); a run that cannot is a
  // liveness violation.
  uint32_t versions = 5;
  bool faults = true;
  // Where the coordinator's catalog lives, one directory per seed, removed after it.
  std::string dir = "/tmp";
  // Lines of what happened (faults, violations), for a reader; may be empty.
  std::function<void(const std::string&)> trace;
};

struct SimulationFigures {
  uint64_t sim_ms = 0;  // simulated time
  uint64_t committed = 0;
  uint64_t aborted = 0;  // decisions told as aborted
  uint64_t messages = 0;
  uint64_t dropped = 0;
  uint64_t faults = 0;  // kills, wipes, partitions and drop bursts
  uint64_t coordinator_opens = 0;
  // The coordinator's CPU time (the thread's clock) in its handlers and its loop, by message.
  uint64_t votes = 0, vote_ns = 0;
  uint64_t heartbeats = 0, heartbeat_ns = 0;
  uint64_t registers = 0, register_ns = 0;
  uint64_t queries = 0, query_ns = 0;  // latest and decisions
  uint64_t steps = 0, step_ns = 0;     // failure detection and announcements
  uint64_t coordinator_ns() const {
    return vote_ns + heartbeat_ns + register_ns + query_ns + step_ns;
  }
};

struct SimulationResult {
  SimulationFigures figures;
  std::vector<std::string> violations;
};

// One seed. Non-Ok only when the simulation itself cannot run (its catalog directory); what the
// protocol gets wrong is in result->violations.
Status Simulate(const SimulationOptions& options, SimulationResult* result);

}  // namespace ckpt::engine
