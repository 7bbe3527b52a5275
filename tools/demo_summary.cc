// The many-rank demo's last word (tools/demo_cluster.cc): what ckptdb saved the trainer in this
// run, against the same checkpoints saved and read back the synchronous way, as a table, as
// ROOT/run.json, and as a plot (ROOT/run.png) drawn by matplotlib when Debian's
// python3-matplotlib is installed.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/demo.h"

namespace ckpt::tools::demo {
namespace {

// Draws run.json as run.png. Exit 3 when matplotlib is missing (said, not an error).
constexpr const char* kPlotScript = R"PY(
import json, sys
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(3)
run = json.load(open(sys.argv[1]))
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
for r in run["ranks"]:
    xs = list(range(1, len(r["blocked_ms"]) + 1))
    left.plot(xs, r["blocked_ms"], marker="o", ms=3, lw=1, label=f"ckptdb, rank {r['rank']}")
sync = [s for r in run["ranks"] for s in r["sync_ms"]]
if sync:
    left.axhspan(min(sync), max(sync), color="tab:red", alpha=0.25,
                 label="synchronous write+fsync (range)")
    left.axhline(sum(sync) / len(sync), color="tab:red", lw=1.5)
left.set_yscale("log")
left.set_xlabel("checkpoint (iteration)")
left.set_ylabel("trainer blocked (ms, log)")
left.set_title(f"blocked per checkpoint, {run['mib_per_rank']:.0f} MiB a rank, "
               f"{run['compute_ms']} ms compute")
left.legend(fontsize=7, loc="center right")
names, ckpt, disk, colors = [], [], [], []
for r in run["ranks"]:
    names.append(f"rank {r['rank']}\n{r['restored_from']}")
    ckpt.append(r["restore_ms"])
    disk.append(r["sync_read_ms"] if r["sync_read_ms"] >= 0 else 0)
    colors.append("tab:orange" if r["lost"] else "tab:blue")
xs = range(len(names))
right.bar([x - 0.2 for x in xs], ckpt, 0.4, color=colors, label="ckptdb restore")
right.bar([x + 0.2 for x in xs], disk, 0.4, color="tab:red", alpha=0.6,
          label="read back from the node's disk")
for x, r in zip(xs, run["ranks"]):
    if r["sync_read_ms"] < 0:
        right.text(x + 0.2, 0, "lost\nwith\nits node", ha="center", va="bottom", fontsize=7)
right.set_xticks(list(xs))
right.set_xticklabels(names, fontsize=7)
right.set_ylabel("restart: restore of the rank's state (ms)")
right.set_title(f"after node{run['lost_node']} was lost (orange: its ranks)")
right.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
)PY";

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// Runs `python3 -c kPlotScript json png` (no shell: the paths are the user's); its exit code.
int RunPlot(const std::string& json, const std::string& png) {
  const char* python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execlp(python, python, "-c", kPlotScript, json.c_str(), png.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

void PrintSummaryAndPlot(const ClusterArgs& a, int lost_node,
                         const std::vector<RankFigures>& ranks) {
  std::vector<double> blocked, blocked_mean, sync, kept_restore, kept_read, lost_restore;
  uint64_t kept_bytes = 0, lost_bytes = 0;
  for (const RankFigures& r : ranks) {
    double sum = 0;
    for (float b : r.blocked_ms) {
      blocked.push_back(b);
      sum += b;
    }
    if (!r.blocked_ms.empty())
      blocked_mean.push_back(sum / static_cast<double>(r.blocked_ms.size()));
    sync.insert(sync.end(), r.sync_ms.begin(), r.sync_ms.end());
    if (r.lost) {
      lost_restore.push_back(r.restore_ms);
      lost_bytes += r.bytes;
    } else {
      kept_restore.push_back(r.restore_ms);
      kept_read.push_back(r.sync_read_ms);
      kept_bytes += r.bytes;
    }
  }
  const double gb_kept = static_cast<double>(kept_bytes) / 1e9;
  const double n_kept = static_cast<double>(std::max<size_t>(kept_restore.size(), 1));
  std::printf("\n== what ckptdb saved the trainer, in this run ==\n");
  std::printf("%-40s %-30s %-34s %s\n", "", "ckptdb", "synchronous write+fsync, same state", "");
  const double ckpt_mean = Mean(blocked_mean), sync_mean = Mean(sync);
  char a1[64], a2[64];
  std::snprintf(a1, sizeof a1, "%.1f ms mean, %.1f worst", ckpt_mean, Max(blocked));
  std::snprintf(a2, sizeof a2, "%.1f ms mean, %.1f worst", sync_mean, Max(sync));
  std::printf("%-40s %-30s %-34s %.0fx less\n", "trainer blocked per checkpoint", a1, a2,
              ckpt_mean > 0 ? sync_mean / ckpt_mean : 0.0);
  std::snprintf(a1, sizeof a1, "%.1f ms (%.2f GB/s, own ram)", Mean(kept_restore),
                Mean(kept_restore) > 0 ? gb_kept / n_kept / (Mean(kept_restore) / 1e3) : 0.0);
  std::snprintf(a2, sizeof a2, "%.1f ms (%.2f GB/s, node disk)", Mean(kept_read),
                Mean(kept_read) > 0 ? gb_kept / n_kept / (Mean(kept_read) / 1e3) : 0.0);
  std::printf("%-40s %-30s %-34s %.0fx faster\n", "restart: a surviving rank's restore", a1, a2,
              Mean(kept_restore) > 0 ? Mean(kept_read) / Mean(kept_restore) : 0.0);
  if (!lost_restore.empty()) {
    std::snprintf(a1, sizeof a1, "%.1f ms (peers' memory)", Mean(lost_restore));
    std::printf("%-40s %-30s %-34s %s\n",
                ("restart: node" + std::to_string(lost_node) + "'s rank(s)").c_str(), a1,
                "lost: it was on that node's disk", "restored vs. lost");
  }
  std::printf(
      "(the synchronous save: each rank's state written to its node's disk with write() and "
      "fsync(), %zu times a rank, every rank at once, after training; read back at the restart "
      "with its pages dropped from the page cache)\n",
      sync.size() / std::max<size_t>(ranks.size(), 1));

  nlohmann::ordered_json run;
  run["format"] = "ckptdb-demo-run";
  run["ranks_count"] = a.ranks;
  run["nodes"] = a.nodes;
  run["mib_per_rank"] = a.mib_per_rank;
  run["compute_ms"] = a.compute_ms;
  run["redundancy"] = a.redundancy;
  run["lost_node"] = lost_node;
  for (const RankFigures& r : ranks) {
    nlohmann::ordered_json j;
    j["rank"] = r.rank;
    j["node"] = r.node;
    j["lost"] = r.lost;
    j["blocked_ms"] = r.blocked_ms;
    j["sync_ms"] = r.sync_ms;
    j["restore_ms"] = r.restore_ms;
    j["sync_read_ms"] = r.sync_read_ms;
    j["bytes"] = r.bytes;
    j["restored_from"] = r.restored_from;
    run["ranks"].push_back(j);
  }
  const std::string json = a.root + "/run.json";
  const std::string png = a.root + "/run.png";
  {
    std::ofstream out(json);
    out << run.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    if (!out) {
      std::printf("could not write %s\n", json.c_str());
      return;
    }
  }
  const int rc = RunPlot(json, png);
  if (rc == 0) {
    std::printf("the run: %s, plotted in %s\n", json.c_str(), png.c_str());
  } else if (rc == 3) {
    std::printf("the run: %s (no plot: apt-get install python3-matplotlib)\n", json.c_str());
  } else {
    std::printf("the run: %s (the plot failed: python3 exited %d)\n", json.c_str(), rc);
  }
}

}  // namespace ckpt::tools::demo
