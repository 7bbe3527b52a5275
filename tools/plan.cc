// ckptdb plan --nodes N [--replicas M] [--strategy group|ring|mixed] [--ec K+M [--ranks-per-node
// R]] [--dp M --reft arc|arc:S|aec ...] [--failures K] [--weibull LAMBDA,C --days D] [--json]:
// where each node's in-memory checkpoint copies go (GEMINI Algorithm 1 by default) and how likely
// a restart from memory is when K nodes fail at once (exact, beside GEMINI's Corollary 1), or over
// D days of Weibull node lifetimes (REFT section 5); REFT's sharding groups with stacked schemes,
// and a check of REFT's claim that N stacked schemes tolerate N failures. Opens no store: the
// arithmetic is redundancy/placement.h's and redundancy/failure_model.h's. Exit 0, or 2 for bad
// arguments. The JSON schema ("format": "ckptdb-plan", "format_version": 1) is in docs/cli.md.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "redundancy/failure_model.h"
#include "redundancy/placement.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "util/assert.h"

namespace ckpt::tools {
namespace {

using redundancy::CodingPlacement;
using redundancy::Placement;
using redundancy::PlacementStrategy;

struct PlanArgs {
  int nodes = 0;
  int replicas = 2;
  int failures = 0;
  bool failures_given = false;
  std::string strategy = "mixed";
  std::string ec;
  std::string weibull;
  double days = 0;
  bool json = false;
  bool replicas_given = false;
  int ranks_per_node = 1;
  int dp = 0;                     // REFT sharding groups of this many nodes
  std::vector<std::string> reft;  // their schemes, stacked
  bool compare = false;           // --dp S --compare: the protections side by side
  double private_share = 0;       // --private F: each member's private (ZeRO-1) shard
};

struct Weibull {
  double lambda = 0;
  double shape = 0;
};

// One row of the failure table.
struct Row {
  int failures = 0;
  double recovery = 0;
  double loss = 0;                   // 1 - recovery, counted directly (keeps a tiny loss)
  std::optional<double> corollary1;  // GEMINI Corollary 1, where it applies
  bool corollary1_exact = false;     // the bound is the exact value (k < 2m)
};

struct WeibullFigures {
  double node_survival = 0;            // REFT's P_s = exp(-lambda t^c)
  double survival = 0;                 // every checkpoint still in memory (eq. 5, generalised)
  double survival_without_copies = 0;  // every node survives (eq. 6 with P_tr = 1)
};

// A share as the user would write it back ("0.5", "3").
std::string FormatShare(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", share);
  return text;
}

// A count in decimal digits only ("12"), at most 9 of them.
bool ParseCount(const std::string& text, int* out) {
  if (text.empty() || text.size() > 9) return false;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  *out = value;
  return true;
}

// A whole decimal number ("0.0001", "1.3e-4"); range checks are the caller's.
bool ParseNumber(const std::string& text, double* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = value;
  return true;
}

// "93.3%"; ">99.9%" and "<0.1%" where one decimal would round a possible outcome to a certain
// one. `complement` is 1 - value, passed in when it is known more precisely than 1 - value
// (redundancy/placement.h counts both sides, so a certain outcome is exactly 0 on the other).
std::string Percent(double value, double complement) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * value);
  std::string s = text;
  if (s == "100.0%" && complement > 0) return ">99.9%";
  if (s == "0.0%" && value > 0) return "<0.1%";
  return s;
}

std::string Percent(double value) { return Percent(value, 1.0 - value); }

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

std::string NodeList(const std::vector<int>& nodes) {
  std::string text;
  for (int node : nodes) text += (text.empty() ? "" : " ") + std::to_string(node);
  return text;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "ckptdb plan: %s\n", message.c_str());
  return kExitUsage;
}

// The failure counts to tabulate: the one asked for, or 1 up to three past the first count that
// can lose a checkpoint (m failures with replicas, parity + 1 with coding), at most N.
std::vector<int> FailureCounts(const PlanArgs& args, int first_lossy) {
  if (args.failures_given) return {args.failures};
  std::vector<int> counts;
  for (int k = 1; k <= std::min(args.nodes, first_lossy + 3); k++) counts.push_back(k);
  return counts;
}

// --ec DATA+PARITY; false (and *error set) when it is not that form.
bool ParseEc(const std::string& text, int* data, int* parity, std::string* error) {
  size_t plus = text.find('+');
  if (plus == std::string::npos || !ParseCount(text.substr(0, plus), data) ||
      !ParseCount(text.substr(plus + 1), parity)) {
    *error = "--ec '" + text + "' is not DATA+PARITY, e.g. 4+2";
    return false;
  }
  return true;
}

void PrintRows(const std::vector<Row>& rows, bool with_corollary) {
  if (with_corollary) {
    std::printf("\n%-9s %-21s  %s\n", "failures", "recovery from memory", "GEMINI Corollary 1");
  } else {
    std::printf("\n%-9s %s\n", "failures", "recovery from memory");
  }
  for (const Row& r : rows) {
    std::string recovery = Percent(r.recovery, r.loss);
    if (with_corollary && r.corollary1) {
      std::string bound = Percent(*r.corollary1);
      std::printf("%-9d %-21s  %s\n", r.failures, recovery.c_str(),
                  (r.corollary1_exact ? bound : ">= " + bound).c_str());
    } else {
      std::printf("%-9d %s\n", r.failures, recovery.c_str());
    }
  }
}

void PrintWeibull(const PlanArgs& args, const Weibull& w, const WeibullFigures& f) {
  std::printf("\nWeibull node lifetimes (REFT section 5): lambda %g, shape c %g, %g days\n",
              w.lambda, w.shape, args.days);
  std::printf("  %-58s %s\n", "one node survives, P_s = exp(-lambda t^c)",
              Percent(f.node_survival).c_str());
  std::printf("  %-58s %s\n", "every checkpoint still in memory (REFT eq. 5, this layout)",
              Percent(f.survival).c_str());
  std::printf("  %-58s %s\n", "no copies elsewhere: every node survives (REFT eq. 6)",
              Percent(f.survival_without_copies).c_str());
}

nlohmann::ordered_json RowsJson(const std::vector<Row>& rows) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    nlohmann::ordered_json j;
    j["failures"] = r.failures;
    j["recovery_probability"] = r.recovery;
    j["loss_probability"] = r.loss;
    if (r.corollary1) {
      j["corollary1"] = *r.corollary1;
      j["corollary1_exact"] = r.corollary1_exact;
    }
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::ordered_json WeibullJson(const PlanArgs& args, const Weibull& w,
                                   const WeibullFigures& f) {
  nlohmann::ordered_json j;
  j["lambda"] = w.lambda;
  j["shape"] = w.shape;
  j["days"] = args.days;
  j["node_survival"] = f.node_survival;
  j["survival"] = f.survival;
  j["survival_without_copies"] = f.survival_without_copies;
  return j;
}

// Layouts that redundancy/failure_model.h enumerates: REFT sharding groups with their schemes
// (stacked, and optionally under replicas or coding across nodes), and coding groups of several
// ranks per node. The REFT stacking claim is checked on sharding group 0.
int RunModelPlan(const PlanArgs& args, const std::string& nodes_text) {
  redundancy::FailureModel model(args.nodes);
  nlohmann::ordered_json json;
  json["format"] = "ckptdb-plan";
  json["format_version"] = 1;
  json["nodes"] = args.nodes;
  std::string options = nodes_text;
  std::vector<int> claim_nodes;
  int schemes_stacked = 0;
  if (args.dp > 0) {
    std::vector<redundancy::ReftScheme> schemes;
    std::vector<std::string> names;
    for (const std::string& text : args.reft) {
      redundancy::ReftScheme scheme;
      if (Status st = redundancy::ParseReftScheme(text, &scheme); !st.ok()) {
        return Usage("--reft " + st.message());
      }
      schemes.push_back(scheme);
      names.push_back(scheme.Name());
      options += " --reft " + text;
    }
    options += " --dp " + std::to_string(args.dp);
    std::optional<Placement> replicas;
    std::optional<CodingPlacement> coding;
    std::string across = "none";
    if (!args.ec.empty()) {
      int data = 0;
      int parity = 0;
      if (std::string error; !ParseEc(args.ec, &data, &parity, &error)) return Usage(error);
      CodingPlacement c;
      if (Status st = redundancy::ComputeCodingPlacement(args.nodes, data, parity, &c); !st.ok()) {
        return Usage(options + " --ec " + args.ec + ": " + st.message());
      }
      coding = c;
      across = "ec:" + args.ec;
      options += " --ec " + args.ec;
    } else if (args.replicas_given) {
      Placement r;
      PlacementStrategy requested = args.strategy == "group"  ? PlacementStrategy::kGroup
                                    : args.strategy == "ring" ? PlacementStrategy::kRing
                                                              : PlacementStrategy::kMixed;
      if (Status st = redundancy::ComputePlacement(args.nodes, args.replicas, requested, &r);
          !st.ok()) {
        return Usage(options + " --replicas " + std::to_string(args.replicas) + ": " +
                     st.message());
      }
      replicas = r;
      across = "replicate:" + std::to_string(args.replicas) + " (" +
               redundancy::PlacementStrategyName(r.strategy) + ")";
      options += " --replicas " + std::to_string(args.replicas);
    }
    if (args.private_share > 0) options += " --private " + FormatShare(args.private_share);
    if (Status st = redundancy::BuildReftModel(
            args.nodes, args.dp, schemes, replicas ? &*replicas : nullptr,
            coding ? &*coding : nullptr, &model, args.private_share);
        !st.ok()) {
      return Usage(options + ": " + st.message());
    }
    for (int i = 0; i < args.dp; ++i) claim_nodes.push_back(i);
    schemes_stacked = static_cast<int>(schemes.size()) + (across == "none" ? 0 : 1);
    if (args.json) {
      json["scheme"] = "reft";
      json["sharding_group"] = args.dp;
      json["private_share"] = args.private_share;
      json["reft_schemes"] = names;
      json["across_nodes"] = across;
    } else {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : " + ") + n;
      std::printf(
          "placement: REFT sharding groups of %d nodes holding the same state (each saves 1/%d "
          "of it); protection %s; across nodes: %s; %d nodes\n",
          args.dp, args.dp, list.empty() ? "none" : list.c_str(), across.c_str(), args.nodes);
      for (int base = 0; base < args.nodes; base += args.dp) {
        std::vector<int> g;
        for (int i = base; i < base + args.dp; ++i) g.push_back(i);
        std::printf("sharding group %d: nodes %s\n", base / args.dp, NodeList(g).c_str());
      }
    }
  } else {
    int data = 0;
    int parity = 0;
    if (std::string error; !ParseEc(args.ec, &data, &parity, &error)) return Usage(error);
    options += " --ec " + args.ec + " --ranks-per-node " + std::to_string(args.ranks_per_node);
    std::vector<std::vector<int>> groups;
    if (Status st = redundancy::BuildCodingModel(args.nodes, args.ranks_per_node, data, parity,
                                                 &model, &groups);
        !st.ok()) {
      return Usage(options + ": " + st.message());
    }
    if (args.json) {
      json["scheme"] = "ec";
      json["data_shards"] = data;
      json["parity_shards"] = parity;
      json["ranks_per_node"] = args.ranks_per_node;
      json["groups"] = groups;
    } else {
      std::printf(
          "placement: erasure coding %d+%d, %d nodes of %d ranks, %zu groups of ranks on distinct "
          "nodes (each survives up to %d of its nodes failing)\n",
          data, parity, args.nodes, args.ranks_per_node, groups.size(), parity);
      for (size_t g = 0; g < groups.size(); g++) {
        std::printf("group %zu: nodes %s\n", g, NodeList(groups[g]).c_str());
      }
    }
  }
  // The claim, and the default table's end: the smallest loss within sharding group 0.
  int smallest = 0;
  std::vector<int> loss_set;
  std::string lost;
  std::string claim_unchecked;  // why the claim could not be checked
  if (!claim_nodes.empty()) {
    if (Status st = model.SmallestLoss(claim_nodes, &smallest, &loss_set, &lost); !st.ok()) {
      if (st.code() != CKPTDB_ENOTSUP) return Usage(options + ": " + st.message());
      claim_unchecked = st.message();
    }
  }
  std::vector<Row> rows;
  std::string cut;  // the default table stops at the first count too large to enumerate
  const int first_lossy = smallest > 0 ? smallest : std::min(args.nodes, 3);
  for (int k : FailureCounts(args, first_lossy)) {
    Row r;
    r.failures = k;
    if (Status st = model.RecoveryProbability(k, &r.recovery, &r.loss); !st.ok()) {
      if (args.failures_given || st.code() != CKPTDB_ENOTSUP) {
        return Usage(options + " --failures " + std::to_string(k) + ": " + st.message());
      }
      cut = std::to_string(k) + " or more failures: " + st.message();
      break;
    }
    rows.push_back(r);
  }
  const int tolerated = smallest > 0 ? smallest - 1 : args.dp;
  const bool holds = tolerated >= schemes_stacked;
  if (args.json) {
    json["memory_per_node"] = model.memory_per_node;
    json["failures"] = RowsJson(rows);
    if (!cut.empty()) json["failures_cut"] = cut;
    if (!claim_nodes.empty()) {
      nlohmann::ordered_json claim;
      claim["schemes_stacked"] = schemes_stacked;
      if (!claim_unchecked.empty()) {
        claim["unchecked"] = claim_unchecked;
      } else {
        claim["tolerated_in_sharding_group"] = tolerated;
        claim["holds"] = holds;
        if (smallest > 0) {
          claim["smallest_loss"] = loss_set;
          claim["lost"] = lost;
        }
      }
      json["reft_stacking_claim"] = claim;
    }
    std::printf("%s\n", json.dump(2).c_str());
    return kExitOk;
  }
  std::printf("memory per node: %.4g x %s\n", model.memory_per_node,
              args.dp > 0 ? "its sharding group's state" : "its ranks' checkpoints");
  PrintRows(rows, false);
  if (!cut.empty()) std::printf("(not shown: %s)\n", cut.c_str());
  if (!claim_nodes.empty()) {
    std::printf(
        "\nREFT's stacking claim (section 4.2: N protections tolerate N failed nodes in a "
        "sharding group): %d stacked; ",
        schemes_stacked);
    if (!claim_unchecked.empty()) {
      std::printf("not checked: %s\n", claim_unchecked.c_str());
    } else if (smallest > 0) {
      std::printf("losing nodes %s of sharding group 0 loses %s, so it tolerates %d: %s\n",
                  NodeList(loss_set).c_str(), lost.c_str(), tolerated,
                  holds ? "the claim holds here" : "the claim does NOT hold here");
    } else {
      std::printf("no loss of sharding group 0's nodes alone loses data: the claim holds here\n");
    }
  }
  return kExitOk;
}

// --dp S --compare: REFT's protections within the sharding groups as ckptdb builds them
// (ckptdb_declare_replicas), next to each other and to copies or coding of each node's whole
// snapshot across nodes, on the same N nodes: memory per node, the losses a sharding group
// tolerates, and the exact odds of a restart from memory for 1 to 3 failures.
int RunComparePlan(const PlanArgs& args, const std::string& nodes_text) {
  struct Candidate {
    std::string name;
    std::vector<std::string> reft;
    int replicas = 0;  // > 1: replicate:M of each node's snapshot
    bool coding = false;
  };
  std::vector<Candidate> list = {{"none", {}}, {"arc", {"arc"}}};
  if (args.dp >= 3) {
    list.push_back({"aec", {"aec"}});
    list.push_back({"arc+aec", {"arc", "aec"}});
  }
  if (args.private_share > 0) {  // REFT's AOR protects the private shards the others do not
    list.push_back({"arc+aor", {"arc", "aor"}});
    if (args.dp >= 3) {
      list.push_back({"aec+aor", {"aec", "aor"}});
      list.push_back({"arc+aec+aor", {"arc", "aec", "aor"}});
    }
  }
  list.push_back({"replicate:2", {}, 2});
  if (!args.ec.empty()) list.push_back({"ec:" + args.ec, {}, 0, true});
  std::vector<int> counts;
  if (args.failures_given) {
    counts.push_back(args.failures);
  } else {
    for (int k = 1; k <= std::min(args.nodes, 3); ++k) counts.push_back(k);
  }
  const std::string options =
      nodes_text + " --dp " + std::to_string(args.dp) + " --compare" +
      (args.private_share > 0 ? " --private " + FormatShare(args.private_share) : "");
  nlohmann::ordered_json json = nlohmann::ordered_json::array();
  if (!args.json) {
    std::printf(
        "REFT sharding groups of %d nodes holding the same state, %d nodes; memory per node in "
        "units of the group's state; tolerated: the fewest of a group's nodes whose loss loses "
        "data, minus one\n",
        args.dp, args.nodes);
    if (args.private_share > 0) {
      std::printf(
          "each node also holds a private shard of %s (its ZeRO-1 optimizer shard), kept by "
          "that node alone unless AOR recomputes it on the node before it\n",
          FormatShare(args.private_share).c_str());
    }
    std::printf("\n%-14s %8s %10s", "protection", "memory", "tolerated");
    for (int k : counts) std::printf("  %d failure%s", k, k == 1 ? " " : "s");
    std::printf("\n");
  }
  for (const Candidate& c : list) {
    std::vector<redundancy::ReftScheme> schemes;
    for (const std::string& text : c.reft) {
      redundancy::ReftScheme s;
      const Status parsed = redundancy::ParseReftScheme(text, &s);
      CKPTDB_ASSERT(parsed.ok());  // the names above
      schemes.push_back(s);
    }
    std::optional<Placement> replicas;
    std::optional<CodingPlacement> coding;
    if (c.replicas > 1) {
      Placement r;
      if (Status st =
              redundancy::ComputePlacement(args.nodes, c.replicas, PlacementStrategy::kMixed, &r);
          !st.ok()) {
        return Usage(options + ": " + c.name + ": " + st.message());
      }
      replicas = r;
    }
    if (c.coding) {
      int data = 0, parity = 0;
      if (std::string error; !ParseEc(args.ec, &data, &parity, &error)) return Usage(error);
      CodingPlacement p;
      if (Status st = redundancy::ComputeCodingPlacement(args.nodes, data, parity, &p); !st.ok()) {
        return Usage(options + " --ec " + args.ec + ": " + st.message());
      }
      coding = p;
    }
    redundancy::FailureModel model(args.nodes);
    if (Status st = redundancy::BuildReftModel(
            args.nodes, args.dp, schemes, replicas ? &*replicas : nullptr,
            coding ? &*coding : nullptr, &model, args.private_share);
        !st.ok()) {
      return Usage(options + ": " + c.name + ": " + st.message());
    }
    std::vector<int> group;
    for (int i = 0; i < args.dp; ++i) group.push_back(i);
    int smallest = 0;
    std::vector<int> loss_set;
    std::string lost;
    std::optional<int> tolerated;
    if (model.SmallestLoss(group, &smallest, &loss_set, &lost).ok()) {
      tolerated = smallest > 0 ? smallest - 1 : args.dp;
    }
    nlohmann::ordered_json row;
    row["protection"] = c.name;
    row["memory_per_node"] = model.memory_per_node;
    if (tolerated) row["tolerated_in_sharding_group"] = *tolerated;
    row["failures"] = nlohmann::ordered_json::array();
    if (!args.json) {
      std::printf("%-14s %8.4g %10s", c.name.c_str(), model.memory_per_node,
                  tolerated ? std::to_string(*tolerated).c_str() : "-");
    }
    for (int k : counts) {
      double recovery = 0, loss = 0;
      const bool known = model.RecoveryProbability(k, &recovery, &loss).ok();
      if (known) row["failures"].push_back({{"failures", k}, {"recovery_probability", recovery}});
      if (!args.json) {
        std::printf("  %10s", known ? Percent(recovery, loss).c_str() : "-");
      }
    }
    if (!args.json) std::printf("\n");
    json.push_back(row);
  }
  if (args.json) {
    nlohmann::ordered_json doc;
    doc["format"] = "ckptdb-plan";
    doc["format_version"] = 1;
    doc["nodes"] = args.nodes;
    doc["sharding_group"] = args.dp;
    doc["private_share"] = args.private_share;
    doc["comparison"] = json;
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("\n(\"-\": too many failure sets to enumerate.%s)\n",
                args.private_share > 0
                    ? ""
                    : " REFT's AOR protects private shards: --private F adds them "
                      "and the aor rows");
  }
  return kExitOk;
}

int RunPlan(const PlanArgs& args) {
  const std::string nodes_text = "--nodes " + std::to_string(args.nodes);
  if (args.nodes < 1 || args.nodes > redundancy::kMaxPlacementNodes) {
    return Usage(nodes_text + " is outside 1.." + std::to_string(redundancy::kMaxPlacementNodes));
  }
  if (args.failures_given && (args.failures < 0 || args.failures > args.nodes)) {
    return Usage("--failures " + std::to_string(args.failures) + " is outside 0.." +
                 std::to_string(args.nodes) + " (" + nodes_text + ")");
  }
  if (args.compare) {
    if (args.dp == 0) return Usage("--compare needs --dp S");
    if (!args.reft.empty() || args.replicas_given || !args.weibull.empty() ||
        args.ranks_per_node != 1) {
      return Usage(
          "--compare picks the protections itself: not with --reft, --replicas, "
          "--weibull or --ranks-per-node (--ec adds a coding row)");
    }
    return RunComparePlan(args, nodes_text);
  }
  if (args.dp > 0 || !args.reft.empty() || args.ranks_per_node != 1) {
    if (!args.weibull.empty()) {
      return Usage("--weibull is for --replicas and --ec layouts of one rank per node");
    }
    if (!args.reft.empty() && args.dp == 0) return Usage("--reft needs --dp M");
    if (args.dp > 0 && args.ranks_per_node != 1) {
      return Usage("--ranks-per-node is for --ec alone, not with --dp");
    }
    if (args.dp == 0 && args.ec.empty()) return Usage("--ranks-per-node is for --ec");
    return RunModelPlan(args, nodes_text);
  }
  std::optional<Weibull> weibull;
  if (!args.weibull.empty()) {
    size_t comma = args.weibull.find(',');
    Weibull w;
    if (comma == std::string::npos || !ParseNumber(args.weibull.substr(0, comma), &w.lambda) ||
        !ParseNumber(args.weibull.substr(comma + 1), &w.shape)) {
      return Usage("--weibull '" + args.weibull +
                   "' is not LAMBDA,SHAPE (failures per day^c and the Weibull shape c, e.g. "
                   "0.0001,1.3)");
    }
    double check = 0;
    if (Status st = redundancy::WeibullNodeSurvival(w.lambda, w.shape, args.days, &check);
        !st.ok()) {
      return Usage("--weibull " + args.weibull + " --days " + Number(args.days) + ": " +
                   st.message());
    }
    weibull = w;
  }

  nlohmann::ordered_json json;
  json["format"] = "ckptdb-plan";
  json["format_version"] = 1;
  json["nodes"] = args.nodes;
  std::vector<Row> rows;
  std::optional<WeibullFigures> figures;

  if (!args.ec.empty()) {
    int data = 0;
    int parity = 0;
    if (std::string error; !ParseEc(args.ec, &data, &parity, &error)) return Usage(error);
    CodingPlacement coding;
    if (Status st = redundancy::ComputeCodingPlacement(args.nodes, data, parity, &coding);
        !st.ok()) {
      return Usage(nodes_text + " --ec " + args.ec + ": " + st.message());
    }
    for (int k : FailureCounts(args, parity + 1)) {
      Row r;
      r.failures = k;
      Status st = redundancy::RecoveryProbabilityExact(coding, k, &r.recovery);
      if (st.ok()) st = redundancy::LossProbabilityExact(coding, k, &r.loss);
      if (!st.ok()) {
        return Usage(nodes_text + " --ec " + args.ec + " --failures " + std::to_string(k) + ": " +
                     st.message());
      }
      rows.push_back(r);
    }
    if (weibull) {
      WeibullFigures f;
      (void)redundancy::WeibullNodeSurvival(weibull->lambda, weibull->shape, args.days,
                                            &f.node_survival);
      if (Status st = redundancy::InMemorySurvival(coding, f.node_survival, &f.survival);
          !st.ok()) {
        return Usage(st.message());
      }
      f.survival_without_copies = redundancy::ReftEquation6(args.nodes, f.node_survival, 1.0);
      figures = f;
    }
    if (args.json) {
      json["scheme"] = "ec";
      json["data_shards"] = data;
      json["parity_shards"] = parity;
      json["groups"] = coding.groups;
    } else {
      std::printf(
          "placement: erasure coding %d+%d, %d nodes, %zu groups (each survives up to %d "
          "failed nodes)\n",
          data, parity, args.nodes, coding.groups.size(), parity);
      for (size_t g = 0; g < coding.groups.size(); g++) {
        std::printf("group %zu: nodes %s\n", g, NodeList(coding.groups[g]).c_str());
      }
      PrintRows(rows, false);
    }
  } else {
    PlacementStrategy requested = args.strategy == "group"  ? PlacementStrategy::kGroup
                                  : args.strategy == "ring" ? PlacementStrategy::kRing
                                                            : PlacementStrategy::kMixed;
    const std::string options = nodes_text + " --replicas " + std::to_string(args.replicas) +
                                " --strategy " + args.strategy;
    Placement placement;
    if (Status st = redundancy::ComputePlacement(args.nodes, args.replicas, requested, &placement);
        !st.ok()) {
      return Usage(options + ": " + st.message());
    }
    // Corollary 1 is about group placement, which needs N divisible by m.
    const bool corollary_applies = placement.strategy == PlacementStrategy::kGroup;
    for (int k : FailureCounts(args, args.replicas)) {
      Row r;
      r.failures = k;
      Status st = redundancy::RecoveryProbabilityExact(placement, k, &r.recovery);
      if (st.ok()) st = redundancy::LossProbabilityExact(placement, k, &r.loss);
      if (!st.ok()) {
        return Usage(options + " --failures " + std::to_string(k) + ": " + st.message());
      }
      if (corollary_applies) {
        r.corollary1 = redundancy::GeminiCorollary1(args.nodes, args.replicas, k);
        r.corollary1_exact = redundancy::Corollary1IsExact(args.replicas, k);
      }
      rows.push_back(r);
    }
    if (weibull) {
      WeibullFigures f;
      (void)redundancy::WeibullNodeSurvival(weibull->lambda, weibull->shape, args.days,
                                            &f.node_survival);
      if (Status st = redundancy::InMemorySurvival(placement, f.node_survival, &f.survival);
          !st.ok()) {
        return Usage(options + ": " + st.message());
      }
      f.survival_without_copies = redundancy::ReftEquation6(args.nodes, f.node_survival, 1.0);
      figures = f;
    }
    const char* strategy = redundancy::PlacementStrategyName(placement.strategy);
    if (args.json) {
      json["scheme"] = "replicas";
      json["replicas"] = args.replicas;
      json["strategy"] = strategy;
      json["groups"] = placement.groups;
      json["holders"] = placement.holders;
    } else {
      std::printf("placement: %s%s, %d nodes, %d replicas, %zu group(s)\n", strategy,
                  requested == PlacementStrategy::kMixed ? " (GEMINI Algorithm 1)" : "", args.nodes,
                  args.replicas, placement.groups.size());
      for (size_t g = 0; g < placement.groups.size(); g++) {
        const std::vector<int>& group = placement.groups[g];
        bool ring = static_cast<int>(group.size()) > args.replicas;
        std::printf("group %zu%s: nodes %s\n", g, ring ? " (ring)" : "", NodeList(group).c_str());
      }
      std::printf("\ncopies of each node's checkpoint:\n");
      for (int node = 0; node < args.nodes; node++) {
        std::printf("node %d: on %s\n", node, NodeList(placement.holders[node]).c_str());
      }
      PrintRows(rows, corollary_applies);
      if (!corollary_applies) {
        std::printf(
            "(GEMINI Corollary 1 is for group placement, which needs N divisible by m; "
            "this layout is %s)\n",
            strategy);
      }
    }
  }

  if (args.json) {
    json["failures"] = RowsJson(rows);
    if (figures) json["weibull"] = WeibullJson(args, *weibull, *figures);
    std::printf("%s\n", json.dump(2).c_str());
  } else if (figures) {
    PrintWeibull(args, *weibull, *figures);
  }
  return kExitOk;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Where each node's in-memory checkpoint copies go (GEMINI Algorithm 1) and the odds of "
      "restarting from memory after K failures or over D days; opens no store");
  cmd->add_option("--nodes,-n", args->nodes, "Number of nodes N")->required();
  CLI::Option* replicas = cmd->add_option("--replicas,-m", args->replicas,
                                          "Copies of each node's checkpoint, the local one "
                                          "included")
                              ->capture_default_str();
  CLI::Option* failures = cmd->add_option(
      "--failures,-k", args->failures,
      "Nodes failing at once (default: a table from 1 to three past the first lossy count)");
  CLI::Option* strategy =
      cmd->add_option("--strategy", args->strategy,
                      "group, ring, or mixed (GEMINI Algorithm 1: group when m divides N)")
          ->check(CLI::IsMember({"group", "ring", "mixed"}))
          ->capture_default_str();
  CLI::Option* ec =
      cmd->add_option("--ec", args->ec,
                      "Erasure-coded groups of DATA+PARITY consecutive nodes instead of replicas, "
                      "e.g. 4+2 (N must be divisible by DATA+PARITY, unless --ranks-per-node)")
          ->excludes(replicas)
          ->excludes(strategy);
  cmd->add_option("--ranks-per-node", args->ranks_per_node,
                  "With --ec: ranks on each node, dealt round the nodes into groups of "
                  "DATA+PARITY ranks on distinct nodes as a job forms them")
      ->check(CLI::Range(1, 1024))
      ->needs(ec);
  CLI::Option* dp = cmd->add_option("--dp", args->dp,
                                    "REFT sharding groups of this many consecutive nodes holding "
                                    "the same (data-parallel) state, each saving 1/DP of it")
                        ->check(CLI::Range(2, 4096));
  cmd->add_option("--reft", args->reft,
                  "A REFT protection within each sharding group, repeatable to stack: arc (a "
                  "peer's slice, copied locally), arc:SHIFT (the slice SHIFT nodes on), aec (XOR "
                  "parity of the peers' sub-slices), aor (a peer's private shard, recomputed; "
                  "needs --private); --replicas or --ec on top protect each "
                  "node's snapshot across nodes")
      ->needs(dp);
  CLI::Option* days =
      cmd->add_option("--days", args->days, "How long the checkpoint must survive, for --weibull");
  cmd->add_option("--weibull", args->weibull,
                  "LAMBDA,SHAPE: Weibull node lifetimes, P_s = exp(-LAMBDA t^SHAPE) with t in "
                  "days (REFT section 5); needs --days")
      ->needs(days);
  days->needs("--weibull");
  cmd->add_option("--private", args->private_share,
                  "With --dp: each node also holds a private shard (its ZeRO-1 optimizer shard) "
                  "of this size in units of the group's state; --reft aor keeps it recomputed on "
                  "the node before it (REFT's AOR), and --compare adds the aor rows")
      ->check(CLI::Range(0.0001, 1000.0))
      ->needs(dp);
  cmd->add_flag("--compare", args->compare,
                "With --dp S: none, arc, aec, arc+aec (as ckptdb_declare_replicas builds them) "
                "and replicate:2 (or --ec K+P) of each node's snapshot, side by side: memory per "
                "node, losses tolerated, odds for 1 to 3 failures")
      ->needs(dp);
  cmd->add_flag("--json", args->json,
                "Print one JSON document (schema in docs/cli.md) instead of the table");
  cmd->callback([args, exit_code, failures, replicas] {
    args->failures_given = failures->count() > 0;
    args->replicas_given = replicas->count() > 0;
    *exit_code = RunPlan(*args);
  });
}

}  // namespace ckpt::tools
