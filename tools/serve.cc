// ckptdb serve: a node's daemon that keeps the replicas held in its memory reachable while the
// trainers that received them are down (DESIGN.md section 7): a job restarting on other nodes
// pulls its ranks' segments from here. It runs until SIGINT or SIGTERM (or --seconds), and takes
// the job token from CKPTDB_JOB_TOKEN only, never from the command line (ps shows arguments).
#include <signal.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace ckpt::tools {
namespace {

struct ServeArgs {
  std::string ram_dir;
  std::string tiers;
  std::string coordinator;
  std::string node_id;
  std::string listen;
  std::string tls;
  int seconds = 0;
};

int RunServe(const ServeArgs& a) {
  if (a.ram_dir.empty() == a.tiers.empty()) {
    std::fprintf(stderr,
                 "ckptdb serve: give exactly one of --ram-dir DIR and --tiers SPEC (the node's ram "
                 "tier, whose directory holds the replicas)\n");
    return kExitUsage;
  }
  const char* token = std::getenv("CKPTDB_JOB_TOKEN");
  if (token == nullptr || token[0] == '\0') {
    std::fprintf(stderr,
                 "ckptdb serve: CKPTDB_JOB_TOKEN is not set: the job's ranks only talk to "
                 "holders of its token\n");
    return kExitUsage;
  }
  // The ram tier's size does not matter here: only its directory is served.
  std::string tiers = a.tiers.empty() ? "ram:1M,dir=" + a.ram_dir : a.tiers;
  if (!a.listen.empty()) setenv("CKPTDB_LISTEN", a.listen.c_str(), 1);
  if (!a.tls.empty()) setenv("CKPTDB_UCX_TLS", a.tls.c_str(), 1);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.tiers = tiers.c_str();
  o.coordinator = a.coordinator.empty() ? nullptr : a.coordinator.c_str();
  o.node_id = a.node_id.empty() ? nullptr : a.node_id.c_str();
  o.job_token = token;
  // Stop on SIGINT/SIGTERM: blocked here, before any thread starts, and awaited below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ckptdb_server* server = nullptr;
  int rc = ckptdb_serve(&o, &server);
  if (rc != CKPTDB_OK) {
    std::fprintf(stderr, "ckptdb serve: %s\n", ErrorText(rc).c_str());
    return rc == CKPTDB_EINVAL || rc == CKPTDB_ENOTFOUND ? kExitUsage : kExitProblem;
  }
  ckptdb_server_stats_t st;
  ckptdb_server_stats(server, &st);
  std::printf("ckptdb serve: listening at %s, serving %" PRIu64
              " replicas to the job at %s (stop with SIGINT or SIGTERM)\n",
              st.address, st.replicas,
              a.coordinator.empty() ? "$CKPTDB_COORDINATOR" : a.coordinator.c_str());
  std::fflush(stdout);
  timespec limit{a.seconds, 0};
  int sig = 0;
  while (true) {
    sig = a.seconds > 0 ? sigtimedwait(&stop, nullptr, &limit) : sigwaitinfo(&stop, nullptr);
    if (sig >= 0 || errno != EINTR) break;
  }
  ckptdb_server_stats(server, &st);
  ckptdb_serve_stop(server);
  std::printf("ckptdb serve: stopped (%s); served %.1f MiB, refused %" PRIu64
              " connections without the job token\n",
              sig > 0 ? strsignal(sig) : "--seconds elapsed",
              static_cast<double>(st.served_bytes) / 1048576.0, st.refused);
  return kExitOk;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve the replicas this node's memory holds for its peers to a restarting job while the "
      "trainers are down (job token from CKPTDB_JOB_TOKEN)");
  cmd->add_option("--ram-dir", args->ram_dir,
                  "The node's ram tier directory (the ram tier's dir=, default /dev/shm)");
  cmd->add_option("--tiers", args->tiers, "Or the trainers' tier spec (its ram tier's dir=)");
  cmd->add_option("--coordinator", args->coordinator,
                  "host:port of the job's coordinator (default: CKPTDB_COORDINATOR)");
  cmd->add_option("--node-id", args->node_id,
                  "This node's id (default: CKPTDB_NODE_ID or the host name)");
  cmd->add_option("--listen", args->listen,
                  "host:port to listen at (default: the coordinator's host, any port)");
  cmd->add_option("--tls", args->tls, "UCX_TLS for ckptdb's transport (default: UCX's choice)");
  cmd->add_option("--seconds", args->seconds, "Stop after this many seconds (default: never)")
      ->check(CLI::Range(1, 100000000));
  cmd->callback([args, exit_code]() { *exit_code = RunServe(*args); });
}

}  // namespace ckpt::tools
