// GEMINI Algorithm 1 placement and the exact recovery probabilities of redundancy/placement.h.
//
// How the exact probability is counted. Every placement here splits the nodes into disjoint
// groups, and a group's checkpoints live only on its own members, so whether a failure set loses
// a checkpoint is decided group by group. For each group we compute R(i) and G(i), the fractions
// of its i-node failure sets that keep every checkpoint and that lose one; the groups are then
// merged one at a time: a uniformly chosen j-set of the S + s merged nodes puts i of its nodes in
// the new group of s with the hypergeometric probability H(i) = C(S, j-i) C(s, i) / C(S+s, j); it
// keeps everything iff both its parts do, and loses a checkpoint iff the old part does, or the
// old part does not and the new part does:
//   r'(j) = sum_i H(i) r(j-i) R(i),   l'(j) = sum_i H(i) (l(j-i) + r(j-i) G(i)).
// Fractions rather than counts keep every number in [0, 1] (C(65536, k) overflows a double).
// Both sides are carried, each a sum of positive terms, rather than one taken from 1 minus the
// other: an impossible outcome then stays exactly 0 and a tiny one keeps its digits (1 - 1e-20
// is 1 in a double).
#include "redundancy/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "util/assert.h"

namespace ckpt::redundancy {
namespace {

std::string Str(int value) { return std::to_string(value); }

// "0.0001", "1.3", "-3": as a user typed it, not std::to_string's "0.000100".
std::string Str(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// ln C(n, r) from a table of ln(i!) for i = 0..n_max.
class LogChoose {
 public:
  explicit LogChoose(int n_max) : log_factorial_(static_cast<size_t>(n_max) + 1) {
    for (int i = 0; i <= n_max; i++) log_factorial_[i] = std::lgamma(static_cast<double>(i) + 1);
  }
  double operator()(int n, int r) const {
    CKPTDB_ASSERT(0 <= r && r <= n && n < static_cast<int>(log_factorial_.size()));
    return log_factorial_[n] - log_factorial_[r] - log_factorial_[n - r];
  }

 private:
  std::vector<double> log_factorial_;
};

// A group as the counting sees it: `size` members, each member's checkpoint on itself and the
// next window-1 members (cyclically), or, for coding, recoverable while at most `parity` fail.
struct GroupShape {
  int size = 0;
  int window = 0;  // replicas; 0 for a coding group
  int parity = 0;  // coding groups only

  bool operator==(const GroupShape&) const = default;
};

// The fractions of a group's i-node failure sets that keep every checkpoint and that lose one,
// for i = 0..max_failures (capped at the group's size).
struct GroupOdds {
  std::vector<double> keep;
  std::vector<double> lose;
};

// GroupOdds of a ring of `size` members, each member's checkpoint on itself and the next
// window-1 members. A set loses a checkpoint iff it holds `window` cyclically consecutive
// members; a group (size == window) is the ring whose windows are all the whole group.
//
// With i failed and z = size - i survivors, the failed members form z runs, one after each
// survivor (some empty). Reading the runs from a marked survivor gives a weak composition of i
// into z parts, and each (set, marked survivor) pair is one (starting position, composition)
// pair, so the sets whose runs are all shorter than `window` number (size / z) W, W being those
// compositions. As C(size, i) = (size / z) C(i + z - 1, z - 1) and C(i + z - 1, z - 1) counts all
// weak compositions, the fraction kept is P(z, i), the probability that a uniformly chosen weak
// composition of i into z parts has every part below `window`, and the fraction lost is
// Q(z, i) = 1 - P(z, i). Conditioning on the first part c, which is c with probability
// w(z, j, c) = C(j - c + z - 2, z - 2) / C(j + z - 1, z - 1):
//   P(1, j) = [j < window],   P(z, j) = sum_{c < window, c <= j} w(z, j, c) P(z - 1, j - c),
//   Q(1, j) = [j >= window],  Q(z, j) = sum_{c < window, c <= j} w(z, j, c) Q(z - 1, j - c)
//                                       + T(z, j),
//   w(z, j, 0) = (z - 1) / (j + z - 1),  w(z, j, c) = w(z, j, c - 1) (j - c + 1) / (j - c + z - 1),
//   T(z, j) = P(first part >= window) = prod_{t < window} (j - t) / (j + z - 1 - t).
// Check: a ring of 16, window 2, 3 failures: P(13, 3) = C(13, 3) / C(15, 3) = 286 / 455, so
// 16/13 * 286 = 352 of the 560 sets keep every checkpoint.
GroupOdds RingOdds(int size, int window, int max_failures) {
  const int top = std::min(max_failures, size);
  GroupOdds odds;
  odds.keep.assign(static_cast<size_t>(top) + 1, 0.0);  // a whole ring failed keeps nothing
  odds.lose.assign(static_cast<size_t>(top) + 1, 1.0);
  const int j_max = std::min(top, size - 1);
  std::vector<double> keep(static_cast<size_t>(j_max) + 1);
  std::vector<double> lose(keep.size());
  std::vector<double> next_keep(keep.size());
  std::vector<double> next_lose(keep.size());
  for (int j = 0; j <= j_max; j++) {  // z = 1
    keep[j] = j < window ? 1.0 : 0.0;
    lose[j] = 1.0 - keep[j];
  }
  for (int z = 1; z <= size; z++) {
    if (z > 1) {
      for (int j = 0; j <= j_max; j++) {
        double sum_keep = 0;
        double sum_lose = 0;
        if (j >= window) {
          double tail = 1.0;
          for (int t = 0; t < window; t++) {
            tail *= static_cast<double>(j - t) / static_cast<double>(j + z - 1 - t);
          }
          sum_lose = tail;
        }
        double weight = static_cast<double>(z - 1) / static_cast<double>(j + z - 1);
        for (int c = 0; c < window && c <= j; c++) {
          if (c > 0) {
            weight *= static_cast<double>(j - c + 1) / static_cast<double>(j - c + z - 1);
          }
          sum_keep += weight * keep[j - c];
          sum_lose += weight * lose[j - c];
        }
        next_keep[j] = std::min(sum_keep, 1.0);
        next_lose[j] = std::min(sum_lose, 1.0);
      }
      keep.swap(next_keep);
      lose.swap(next_lose);
    }
    const int i = size - z;
    if (i <= j_max) {
      odds.keep[i] = keep[i];
      odds.lose[i] = lose[i];
    }
  }
  return odds;
}

GroupOdds OddsOfGroup(const GroupShape& shape, int max_failures) {
  if (shape.window > 0) return RingOdds(shape.size, shape.window, max_failures);
  const int top = std::min(max_failures, shape.size);
  GroupOdds odds;
  for (int i = 0; i <= top; i++) {
    odds.keep.push_back(i <= shape.parity ? 1.0 : 0.0);
    odds.lose.push_back(i <= shape.parity ? 0.0 : 1.0);
  }
  return odds;
}

double RingSteps(const GroupShape& shape, int failures) {
  if (shape.window == 0) return 0;
  return static_cast<double>(shape.size) * (std::min(failures, shape.size) + 1) * 2 * shape.window;
}

struct Odds {
  double keep = 0;
  double lose = 0;
};

// The merge described at the top of the file, for a uniformly chosen set of `failures` nodes.
// `groups` in node order; their sizes sum to nodes.
Status ExactOverGroups(int nodes, const std::vector<GroupShape>& groups, int failures, Odds* out) {
  if (failures < 0 || failures > nodes) {
    return Status::Invalid("failures " + Str(failures) + " is outside 0.." + Str(nodes) +
                           " (the number of nodes)");
  }
  // Estimate the work first; groups of one shape share their odds.
  double steps = 0;
  std::vector<GroupShape> distinct;
  for (const GroupShape& g : groups) {
    steps += static_cast<double>(failures + 1) * (std::min(g.size, failures) + 1);
    if (std::find(distinct.begin(), distinct.end(), g) == distinct.end()) {
      distinct.push_back(g);
      steps += RingSteps(g, failures);
    }
  }
  if (steps > kMaxExactSteps) {
    return Status::NotSupported(
        "the exact probability for " + Str(nodes) + " nodes and " + Str(failures) +
        " failures would take about " + std::to_string(static_cast<long long>(steps)) +
        " steps, more than the bound of " + std::to_string(static_cast<long long>(kMaxExactSteps)) +
        "; ask for fewer failures");
  }
  std::vector<GroupOdds> group_odds;
  group_odds.reserve(distinct.size());
  for (const GroupShape& d : distinct) group_odds.push_back(OddsOfGroup(d, failures));

  LogChoose log_choose(nodes);
  // keep[j], lose[j]: over the groups merged so far, the fractions of their j-node failure sets.
  std::vector<double> keep{1.0};
  std::vector<double> lose{0.0};
  std::vector<double> next_keep;
  std::vector<double> next_lose;
  int merged_nodes = 0;
  for (const GroupShape& g : groups) {
    const GroupOdds& odds =
        group_odds[std::find(distinct.begin(), distinct.end(), g) - distinct.begin()];
    const int total = merged_nodes + g.size;
    const size_t count = static_cast<size_t>(std::min(failures, total)) + 1;
    next_keep.assign(count, 0.0);
    next_lose.assign(count, 0.0);
    for (int j = 0; j < static_cast<int>(count); j++) {
      double sum_keep = 0;
      double sum_lose = 0;
      const int i_first = std::max(0, j - merged_nodes);
      const int i_last = std::min(g.size, j);
      for (int i = i_first; i <= i_last; i++) {
        const double both_keep = keep[j - i] * odds.keep[i];
        const double some_lose = lose[j - i] + keep[j - i] * odds.lose[i];
        if (both_keep == 0 && some_lose == 0) continue;
        const double hypergeometric = std::exp(log_choose(merged_nodes, j - i) +
                                               log_choose(g.size, i) - log_choose(total, j));
        sum_keep += hypergeometric * both_keep;
        sum_lose += hypergeometric * some_lose;
      }
      // Rounding may push a certain outcome a hair above 1.
      next_keep[j] = std::min(sum_keep, 1.0);
      next_lose[j] = std::min(sum_lose, 1.0);
    }
    keep.swap(next_keep);
    lose.swap(next_lose);
    merged_nodes = total;
  }
  CKPTDB_ASSERT(merged_nodes == nodes);
  // A side that no failure set reaches is exactly 0, which makes the other certain: say so
  // exactly rather than as a sum of hypergeometric terms within rounding of 1.
  out->keep = lose[failures] == 0 ? 1.0 : keep[failures];
  out->lose = keep[failures] == 0 ? 1.0 : lose[failures];
  return Status::Ok();
}

// Checks that `p` has the shape ComputePlacement gives (groups of consecutive ids covering
// 0..N-1, holders a cyclic window of m members of the node's group starting at the node), which
// the counting relies on, and returns the groups' shapes.
Status PlacementShapes(const Placement& p, std::vector<GroupShape>* out) {
  auto bad = [&](const std::string& why) {
    return Status::Invalid("placement of " + Str(p.nodes) + " nodes, " + Str(p.replicas) +
                           " replicas is not one ComputePlacement makes: " + why);
  };
  if (p.nodes < 1 || p.nodes > kMaxPlacementNodes || p.replicas < 1 || p.replicas > p.nodes) {
    return bad("nodes or replicas out of range");
  }
  if (static_cast<int>(p.holders.size()) != p.nodes) {
    return bad(Str(static_cast<int>(p.holders.size())) + " holder lists");
  }
  out->clear();
  int next_node = 0;
  for (const std::vector<int>& group : p.groups) {
    const int size = static_cast<int>(group.size());
    if (size < p.replicas) return bad("a group of " + Str(size) + " nodes");
    for (int member = 0; member < size; member++) {
      if (group[member] != next_node + member) {
        return bad("group members are not consecutive node ids from " + Str(next_node));
      }
      const std::vector<int>& holders = p.holders[group[member]];
      if (static_cast<int>(holders.size()) != p.replicas) {
        return bad("node " + Str(group[member]) + " has " + Str(static_cast<int>(holders.size())) +
                   " holders");
      }
      for (int r = 0; r < p.replicas; r++) {
        if (holders[r] != group[(member + r) % size]) {
          return bad("holder " + Str(r) + " of node " + Str(group[member]) + " is node " +
                     Str(holders[r]));
        }
      }
    }
    next_node += size;
    out->push_back({size, p.replicas, 0});
  }
  if (next_node != p.nodes) return bad("the groups cover " + Str(next_node) + " nodes");
  return Status::Ok();
}

// As PlacementShapes, for coding groups: consecutive ids, data + parity nodes each.
Status CodingShapes(const CodingPlacement& p, std::vector<GroupShape>* out) {
  auto bad = [&](const std::string& why) {
    return Status::Invalid("coding placement of " + Str(p.nodes) + " nodes, " + Str(p.data_shards) +
                           "+" + Str(p.parity_shards) +
                           " is not one ComputeCodingPlacement makes: " + why);
  };
  if (p.nodes < 1 || p.nodes > kMaxPlacementNodes || p.data_shards < 1 || p.parity_shards < 1 ||
      p.data_shards > kMaxPlacementNodes || p.parity_shards > kMaxPlacementNodes) {
    return bad("nodes or shards out of range");
  }
  const int group_size = p.data_shards + p.parity_shards;
  out->clear();
  int next_node = 0;
  for (const std::vector<int>& group : p.groups) {
    if (static_cast<int>(group.size()) != group_size) {
      return bad("a group of " + Str(static_cast<int>(group.size())) + " nodes");
    }
    for (int member = 0; member < group_size; member++) {
      if (group[member] != next_node + member) {
        return bad("group members are not consecutive node ids from " + Str(next_node));
      }
    }
    next_node += group_size;
    out->push_back({group_size, 0, p.parity_shards});
  }
  if (next_node != p.nodes) return bad("the groups cover " + Str(next_node) + " nodes");
  return Status::Ok();
}

Status CheckProbability(double value, const char* what) {
  if (!(value >= 0.0 && value <= 1.0)) {  // NaN fails both
    return Status::Invalid(std::string(what) + " " + Str(value) +
                           " is not a probability in [0, 1]");
  }
  return Status::Ok();
}

// P(at most `most` of n independent nodes fail), each failing with probability `fail`.
double AtMostFail(int n, int most, double fail) {
  if (fail <= 0) return 1.0;
  if (fail >= 1) return most >= n ? 1.0 : 0.0;
  double sum = 0;
  double log_choose = 0;  // ln C(n, j)
  for (int j = 0; j <= std::min(most, n); j++) {
    if (j > 0) log_choose += std::log(static_cast<double>(n - j + 1) / static_cast<double>(j));
    sum += std::exp(log_choose + j * std::log(fail) + (n - j) * std::log1p(-fail));
  }
  return std::min(sum, 1.0);
}

// P(no `window` cyclically consecutive members of a ring of `size` fail), each failing
// independently with probability `fail`. A group (size == window) is the case 1 - fail^size.
// Otherwise: unless every member fails (which loses a checkpoint, size >= window), let a be the
// first surviving member. Members 0..a-1 failed (probability fail^a), which wraps around onto the
// failed run at the end of the ring, so with t the length of that run, the ring is safe iff
// a + t < window and no run in between reaches `window`. A forward pass over members a+1..size-1
// tracks the distribution of the current failed run's length; it is the same chain for every a,
// only its length (size - 1 - a) differs, so one pass serves them all.
double RingSurvival(int size, int window, double fail) {
  if (size == window) return 1.0 - std::pow(fail, size);
  const double live = 1.0 - fail;
  std::vector<double> run(static_cast<size_t>(window), 0.0);  // run[t]: P(run length t, safe)
  std::vector<double> next(run.size());
  run[0] = 1.0;
  double total = 0;
  // After `steps` members past a, the distribution is `run`; a = size - 1 - steps.
  for (int steps = 0; steps <= size - 1; steps++) {
    const int a = size - 1 - steps;
    if (a < window) {
      double safe = 0;
      for (int t = 0; t + a < window; t++) safe += run[t];
      total += std::pow(fail, a) * live * safe;
    }
    if (steps == size - 1) break;
    double mass = 0;
    for (double v : run) mass += v;
    next[0] = live * mass;
    for (int t = 1; t < window; t++) next[t] = fail * run[t - 1];
    run.swap(next);
  }
  return std::min(total, 1.0);
}

}  // namespace

const char* PlacementStrategyName(PlacementStrategy strategy) {
  switch (strategy) {
    case PlacementStrategy::kGroup:
      return "group";
    case PlacementStrategy::kRing:
      return "ring";
    case PlacementStrategy::kMixed:
      return "mixed";
  }
  return "unknown";
}

Status ComputePlacement(int nodes, int replicas, PlacementStrategy requested, Placement* out) {
  if (nodes < 1 || nodes > kMaxPlacementNodes) {
    return Status::Invalid("nodes " + Str(nodes) + " is outside 1.." + Str(kMaxPlacementNodes));
  }
  if (replicas < 1) {
    return Status::Invalid("replicas " + Str(replicas) +
                           " is less than 1: every checkpoint needs its local copy");
  }
  if (replicas > nodes) {
    return Status::Invalid("replicas " + Str(replicas) + " is more than nodes " + Str(nodes) +
                           ": some node would hold two copies of one checkpoint");
  }
  if (int64_t{nodes} * replicas > kMaxPlacementHolders) {
    return Status::Invalid("nodes " + Str(nodes) + " x replicas " + Str(replicas) + " = " +
                           std::to_string(int64_t{nodes} * replicas) +
                           " copies to place, more than " + std::to_string(kMaxPlacementHolders));
  }
  if (requested == PlacementStrategy::kGroup && nodes % replicas != 0) {
    return Status::Invalid("group placement needs nodes divisible by replicas, and " + Str(nodes) +
                           " is not divisible by " + Str(replicas) +
                           "; mixed placement (GEMINI Algorithm 1) handles the remainder");
  }
  Placement p;
  p.nodes = nodes;
  p.replicas = replicas;
  if (requested == PlacementStrategy::kRing) {
    p.strategy = PlacementStrategy::kRing;
    p.groups.emplace_back();
    for (int node = 0; node < nodes; node++) p.groups[0].push_back(node);
  } else {
    // GEMINI Algorithm 1 (lines 3-10): g = floor(N/m) groups of m consecutive machines; when m
    // does not divide N (lines 12-17) the remaining N - g m machines join the last group, which
    // then uses ring placement among its m + N%m members (section 4).
    const int group_count = nodes / replicas;
    for (int i = 0; i < group_count; i++) {
      p.groups.emplace_back();
      for (int j = 0; j < replicas; j++) p.groups.back().push_back(replicas * i + j);
    }
    for (int node = group_count * replicas; node < nodes; node++) p.groups.back().push_back(node);
    p.strategy = nodes % replicas == 0 ? PlacementStrategy::kGroup : PlacementStrategy::kMixed;
  }
  // Within a group of s members, member q's checkpoint goes to members q, q+1, ..., q+m-1
  // (mod s): for s == m that is the whole group, otherwise the ring in which each machine "sends
  // checkpoints to the consecutive m - 1 machines" (section 4).
  p.holders.assign(static_cast<size_t>(nodes), {});
  for (const std::vector<int>& group : p.groups) {
    const int size = static_cast<int>(group.size());
    for (int member = 0; member < size; member++) {
      std::vector<int>& holders = p.holders[group[member]];
      for (int r = 0; r < replicas; r++) holders.push_back(group[(member + r) % size]);
    }
  }
  // Two copies on one node would silently count as one (Theorem 1's proof, observation 1): the
  // holders of every node are distinct because a group has at least m members.
  for (const std::vector<int>& holders : p.holders) {
    std::vector<int> sorted = holders;
    std::sort(sorted.begin(), sorted.end());
    CKPTDB_ASSERT(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  }
  *out = std::move(p);
  return Status::Ok();
}

Status RecoveryProbabilityExact(const Placement& placement, int failures, double* out) {
  std::vector<GroupShape> shapes;
  CKPTDB_RETURN_IF_ERROR(PlacementShapes(placement, &shapes));
  Odds odds;
  CKPTDB_RETURN_IF_ERROR(ExactOverGroups(placement.nodes, shapes, failures, &odds));
  *out = odds.keep;
  return Status::Ok();
}

Status LossProbabilityExact(const Placement& placement, int failures, double* out) {
  std::vector<GroupShape> shapes;
  CKPTDB_RETURN_IF_ERROR(PlacementShapes(placement, &shapes));
  Odds odds;
  CKPTDB_RETURN_IF_ERROR(ExactOverGroups(placement.nodes, shapes, failures, &odds));
  *out = odds.lose;
  return Status::Ok();
}

double GeminiCorollary1(int nodes, int replicas, int failures) {
  CKPTDB_ASSERT(1 <= replicas && replicas <= nodes && nodes % replicas == 0);
  CKPTDB_ASSERT(0 <= failures && failures <= nodes);
  if (failures < replicas) return 1.0;
  // C(N-m, k-m) / C(N, k) = prod_{t<m} (k-t) / (N-t): exact, no large numbers.
  double ratio = 1.0;
  for (int t = 0; t < replicas; t++) {
    ratio *= static_cast<double>(failures - t) / static_cast<double>(nodes - t);
  }
  return std::max(0.0, 1.0 - static_cast<double>(nodes) / replicas * ratio);
}

Status ComputeCodingPlacement(int nodes, int data_shards, int parity_shards, CodingPlacement* out) {
  if (nodes < 1 || nodes > kMaxPlacementNodes) {
    return Status::Invalid("nodes " + Str(nodes) + " is outside 1.." + Str(kMaxPlacementNodes));
  }
  if (data_shards < 1 || data_shards > kMaxPlacementNodes) {
    return Status::Invalid("data shards " + Str(data_shards) + " is outside 1.." +
                           Str(kMaxPlacementNodes));
  }
  if (parity_shards < 1 || parity_shards > kMaxPlacementNodes) {
    return Status::Invalid("parity shards " + Str(parity_shards) + " is outside 1.." +
                           Str(kMaxPlacementNodes) +
                           " (without parity any failure loses a checkpoint)");
  }
  const int group_size = data_shards + parity_shards;
  if (nodes % group_size != 0) {
    return Status::Invalid("nodes " + Str(nodes) + " is not divisible by the coding group size " +
                           Str(data_shards) + "+" + Str(parity_shards) + " = " + Str(group_size));
  }
  CodingPlacement p;
  p.nodes = nodes;
  p.data_shards = data_shards;
  p.parity_shards = parity_shards;
  for (int first = 0; first < nodes; first += group_size) {
    p.groups.emplace_back();
    for (int node = first; node < first + group_size; node++) p.groups.back().push_back(node);
  }
  *out = std::move(p);
  return Status::Ok();
}

Status RecoveryProbabilityExact(const CodingPlacement& placement, int failures, double* out) {
  std::vector<GroupShape> shapes;
  CKPTDB_RETURN_IF_ERROR(CodingShapes(placement, &shapes));
  Odds odds;
  CKPTDB_RETURN_IF_ERROR(ExactOverGroups(placement.nodes, shapes, failures, &odds));
  *out = odds.keep;
  return Status::Ok();
}

Status LossProbabilityExact(const CodingPlacement& placement, int failures, double* out) {
  std::vector<GroupShape> shapes;
  CKPTDB_RETURN_IF_ERROR(CodingShapes(placement, &shapes));
  Odds odds;
  CKPTDB_RETURN_IF_ERROR(ExactOverGroups(placement.nodes, shapes, failures, &odds));
  *out = odds.lose;
  return Status::Ok();
}

Status WeibullNodeSurvival(double lambda, double shape, double days, double* out) {
  if (!std::isfinite(lambda) || lambda < 0) {
    return Status::Invalid("Weibull lambda " + Str(lambda) + " is not a finite rate >= 0");
  }
  if (!std::isfinite(shape) || shape <= 0) {
    return Status::Invalid("Weibull shape " + Str(shape) + " is not a finite number > 0");
  }
  if (!std::isfinite(days) || days < 0) {
    return Status::Invalid("days " + Str(days) + " is not a finite number >= 0");
  }
  *out = std::exp(-lambda * std::pow(days, shape));  // REFT section 5: P = e^(-lambda t^c)
  return Status::Ok();
}

double ReftEquation5(int nodes, int group_size, double p_s, double p_re) {
  CKPTDB_ASSERT(1 <= group_size && group_size <= nodes && nodes % group_size == 0);
  CKPTDB_ASSERT(0 <= p_s && p_s <= 1 && 0 <= p_re && p_re <= 1);
  const double n = group_size;
  const double group = std::pow(p_s, n) + n * (1 - p_s) * std::pow(p_s, n - 1);
  return std::pow(group, nodes / group_size) * std::pow(p_re, nodes);
}

double ReftEquation6(int nodes, double p_s, double p_tr) {
  CKPTDB_ASSERT(nodes >= 1 && 0 <= p_s && p_s <= 1 && 0 <= p_tr && p_tr <= 1);
  return std::pow(p_s, nodes) * std::pow(p_tr, nodes);
}

Status InMemorySurvival(const Placement& placement, double node_survival, double* out) {
  CKPTDB_RETURN_IF_ERROR(CheckProbability(node_survival, "node survival"));
  std::vector<GroupShape> shapes;
  CKPTDB_RETURN_IF_ERROR(PlacementShapes(placement, &shapes));
  for (const GroupShape& g : shapes) {
    if (static_cast<double>(g.size) * g.window > kMaxExactSteps) {
      return Status::NotSupported("the survival of a ring of " + Str(g.size) + " nodes with " +
                                  Str(g.window) + " replicas would take more than " +
                                  std::to_string(static_cast<long long>(kMaxExactSteps)) +
                                  " steps");
    }
  }
  const double fail = 1.0 - node_survival;
  double survival = 1.0;
  for (const GroupShape& g : shapes) survival *= RingSurvival(g.size, g.window, fail);
  *out = survival;
  return Status::Ok();
}

Status InMemorySurvival(const CodingPlacement& placement, double node_survival, double* out) {
  CKPTDB_RETURN_IF_ERROR(CheckProbability(node_survival, "node survival"));
  std::vector<GroupShape> shapes;
  CKPTDB_RETURN_IF_ERROR(CodingShapes(placement, &shapes));
  const double fail = 1.0 - node_survival;
  double survival = 1.0;
  for (const GroupShape& g : shapes) survival *= AtMostFail(g.size, g.parity, fail);
  *out = survival;
  return Status::Ok();
}

Status ComputeCodingGroups(const std::vector<std::string>& node_of_rank, const CodeSpec& code,
                           std::vector<std::vector<uint32_t>>* groups) {
  std::vector<std::string> nodes;
  std::vector<std::vector<uint32_t>> ranks_on;
  for (uint32_t r = 0; r < node_of_rank.size(); ++r) {
    auto it = std::find(nodes.begin(), nodes.end(), node_of_rank[r]);
    if (it == nodes.end()) {
      nodes.push_back(node_of_rank[r]);
      ranks_on.push_back({r});
    } else {
      ranks_on[it - nodes.begin()].push_back(r);
    }
  }
  const uint32_t g = code.k + code.m;
  if (nodes.size() < g) {
    return Status::Invalid("redundancy " + code.Name() + " needs groups of " + std::to_string(g) +
                           " distinct nodes; the job has " + std::to_string(nodes.size()) +
                           " (check CKPTDB_NODE_ID)");
  }
  if (node_of_rank.size() % g != 0) {
    return Status::Invalid("redundancy " + code.Name() + " needs the job's ranks in groups of " +
                           std::to_string(g) + " on distinct nodes; the job has " +
                           std::to_string(node_of_rank.size()) + " ranks");
  }
  // The ranks dealt round the nodes (every node's first rank, then every node's second, ...),
  // cut into runs of K + M: with as many ranks on every node, a run is K + M cyclically
  // consecutive nodes, so distinct ones.
  std::vector<uint32_t> order;
  size_t most = 0;
  for (const auto& ranks : ranks_on) most = std::max(most, ranks.size());
  for (size_t local = 0; local < most; ++local) {
    for (const auto& ranks : ranks_on) {
      if (local < ranks.size()) order.push_back(ranks[local]);
    }
  }
  groups->clear();
  for (size_t at = 0; at < order.size(); at += g) {
    std::vector<uint32_t> members(order.begin() + static_cast<ptrdiff_t>(at),
                                  order.begin() + static_cast<ptrdiff_t>(at + g));
    for (size_t a = 0; a < members.size(); ++a) {
      for (size_t b = a + 1; b < members.size(); ++b) {
        if (node_of_rank[members[a]] == node_of_rank[members[b]]) {
          return Status::Invalid(
              "redundancy " + code.Name() + ": ranks " + std::to_string(members[a]) + " and " +
              std::to_string(members[b]) + " of coding group " + std::to_string(groups->size()) +
              " would share node " + node_of_rank[members[a]] +
              " (the job's nodes run too unequal numbers of ranks; check CKPTDB_NODE_ID)");
        }
      }
    }
    groups->push_back(std::move(members));
  }
  return Status::Ok();
}

}  // namespace ckpt::redundancy
