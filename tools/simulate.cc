// ckptdb simulate --ranks N --seeds S: the job's commit protocol at scale, simulated
// (ckptdb_simulate; docs/testing.md, "Simulation"). Runs seeds first..first+S-1, prints one line
// a seed and each invariant violation, and ends with the seeds run, the violations found and the
// coordinator's microseconds of CPU per vote. Exit 0 when no seed violated anything, 1 when one
// did, 2 for bad options.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace ckpt::tools {
namespace {

struct SimulateArgs {
  uint32_t ranks = 1000;
  uint32_t ranks_per_node = 8;
  uint64_t seeds = 1;
  uint64_t first = 1;
  uint32_t versions = 5;
  bool quiet_network = false;
  bool trace = false;
  std::string dir = "/tmp";
};

double Us(uint64_t ns, uint64_t n) { return n == 0 ? 0.0 : static_cast<double>(ns) / n / 1e3; }

int RunSimulate(const SimulateArgs& a) {
  ckptdb_simulate_report total{};
  uint64_t failed_seeds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t seed = a.first; seed < a.first + a.seeds; ++seed) {
    ckptdb_simulate_options o{};
    o.ranks = a.ranks;
    o.ranks_per_node = a.ranks_per_node;
    o.seed = seed;
    o.versions = a.versions;
    o.faults = a.quiet_network ? 0 : 1;
    o.trace = a.trace ? 1 : 0;
    o.dir = a.dir.c_str();
    ckptdb_simulate_report r{};
    const int rc = ckptdb_simulate(
        &o, [](void*, const char* line) { std::printf("  %s\n", line); }, nullptr, &r);
    if (rc != CKPTDB_OK) {
      std::fprintf(stderr, "ckptdb simulate: seed %" PRIu64 ": %s\n", seed, ErrorText(rc).c_str());
      return 2;
    }
    std::printf("seed %" PRIu64 ": %" PRIu64 " ms simulated, %" PRIu64 " committed, %" PRIu64
                " aborted, %" PRIu64 " faults, %" PRIu64 " of %" PRIu64
                " messages dropped, %" PRIu64 " violations\n",
                seed, r.simulated_ms, r.committed, r.aborted, r.faults, r.dropped, r.messages,
                r.violations);
    std::fflush(stdout);
    failed_seeds += r.violations > 0 ? 1 : 0;
    total.violations += r.violations;
    total.votes += r.votes;
    total.vote_ns += r.vote_ns;
    total.heartbeats += r.heartbeats;
    total.heartbeat_ns += r.heartbeat_ns;
    total.registers += r.registers;
    total.register_ns += r.register_ns;
    total.queries += r.queries;
    total.query_ns += r.query_ns;
    total.steps += r.steps;
    total.step_ns += r.step_ns;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t all_ns =
      total.vote_ns + total.heartbeat_ns + total.register_ns + total.query_ns + total.step_ns;
  std::printf("coordinator CPU: vote %.2f us (%" PRIu64 "), heartbeat %.2f us (%" PRIu64
              "), register %.2f us (%" PRIu64 "), latest/decisions %.2f us (%" PRIu64
              "), loop %.2f us a step (%" PRIu64 ")\n",
              Us(total.vote_ns, total.votes), total.votes, Us(total.heartbeat_ns, total.heartbeats),
              total.heartbeats, Us(total.register_ns, total.registers), total.registers,
              Us(total.query_ns, total.queries), total.queries, Us(total.step_ns, total.steps),
              total.steps);
  std::printf("simulate: %" PRIu64 " seeds run (%.2f a second), %" PRIu64
              " invariant violations (in %" PRIu64
              " seeds), coordinator %.2f us of CPU per vote "
              "(all its work %.2f us per vote), %u ranks\n",
              a.seeds, a.seeds / wall, total.violations, failed_seeds,
              Us(total.vote_ns, total.votes), Us(all_ns, total.votes), a.ranks);
  return total.violations > 0 ? 1 : 0;
}

}  // namespace

void AddSimulateCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "simulate",
      "The job's commit protocol at scale, simulated: the real coordinator and JobCommit, "
      "simulated ranks over a simulated network with delays, drops, reordering, partitions, "
      "kills, node wipes and restarts, deterministic from each seed; checks presumed abort, "
      "that no committed version is lost and that every rank agrees on the latest");
  cmd->add_option("--ranks", args->ranks, "Simulated ranks")->check(CLI::Range(1, 100000));
  cmd->add_option("--ranks-per-node", args->ranks_per_node, "Ranks a node")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--seeds", args->seeds, "Seeds to run")->check(CLI::Range(1, 1000000));
  cmd->add_option("--first-seed", args->first, "The first seed (to replay one: --seeds 1)");
  cmd->add_option("--versions", args->versions, "Versions the job must commit after the last fault")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--no-faults", args->quiet_network, "A quiet network: no kills, no drops");
  cmd->add_flag("--trace", args->trace, "Print every fault and coordinator line");
  cmd->add_option("--dir", args->dir, "Where the coordinator's catalog lives (removed after)");
  cmd->callback([args, exit_code] {
    if (args->ranks_per_node > args->ranks) args->ranks_per_node = args->ranks;
    *exit_code = RunSimulate(*args);
  });
}

}  // namespace ckpt::tools
