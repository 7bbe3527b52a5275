#include "redundancy/failure_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "util/assert.h"

namespace ckpt::redundancy {
namespace {

std::string Str(int v) { return std::to_string(v); }

// C(n, k) as a double (exact below 2^53).
double Choose(int n, int k) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  double c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return std::round(c);
}

// Calls fn for each k-subset of `among` (as a vector of chosen indices into it) until fn
// returns false.
template <typename F>
void ForEachSubset(int n, int k, F fn) {
  std::vector<int> pick(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) pick[static_cast<size_t>(i)] = i;
  while (true) {
    if (!fn(pick)) return;
    int i = k - 1;
    while (i >= 0 && pick[static_cast<size_t>(i)] == n - k + i) --i;
    if (i < 0) return;
    ++pick[static_cast<size_t>(i)];
    for (int j = i + 1; j < k; ++j)
      pick[static_cast<size_t>(j)] = pick[static_cast<size_t>(j - 1)] + 1;
  }
}

}  // namespace

int FailureModel::AddItem(std::string name) {
  names_.push_back(std::move(name));
  holders_.emplace_back();
  return static_cast<int>(names_.size()) - 1;
}

void FailureModel::Hold(int item, int node) {
  CKPTDB_ASSERT(item >= 0 && static_cast<size_t>(item) < names_.size());
  CKPTDB_ASSERT(node >= 0 && node < nodes_);
  holders_[static_cast<size_t>(item)].push_back(node);
}

void FailureModel::AddCode(std::vector<int> blocks, int k) {
  CKPTDB_ASSERT(k >= 1 && static_cast<size_t>(k) <= blocks.size());
  codes_.push_back({std::move(blocks), k});
}

void FailureModel::AddWhole(int whole, std::vector<int> parts) {
  wholes_.push_back({whole, std::move(parts)});
}

void FailureModel::AddImplication(int from, int to) { implications_.emplace_back(from, to); }

void FailureModel::AddTarget(int item) { targets_.push_back(item); }

bool FailureModel::Survives(const std::vector<bool>& failed, std::string* lost) const {
  CKPTDB_ASSERT(failed.size() == static_cast<size_t>(nodes_));
  std::vector<char> known(names_.size(), 0);
  for (size_t i = 0; i < names_.size(); ++i) {
    for (int node : holders_[i]) known[i] |= !failed[static_cast<size_t>(node)];
  }
  // Each pass marks at least one more item known or ends: at most items() passes.
  for (bool changed = true; changed;) {
    changed = false;
    for (const Code& c : codes_) {
      int there = 0;
      for (int b : c.blocks) there += known[static_cast<size_t>(b)];
      if (there >= c.k && there < static_cast<int>(c.blocks.size())) {
        for (int b : c.blocks) known[static_cast<size_t>(b)] = 1;
        changed = true;
      }
    }
    for (const auto& [from, to] : implications_) {
      if (known[static_cast<size_t>(from)] && !known[static_cast<size_t>(to)]) {
        known[static_cast<size_t>(to)] = 1;
        changed = true;
      }
    }
    for (const Whole& w : wholes_) {
      bool all = true;
      for (int p : w.parts) all &= known[static_cast<size_t>(p)] != 0;
      if (known[static_cast<size_t>(w.whole)] && !all) {
        for (int p : w.parts) known[static_cast<size_t>(p)] = 1;
        changed = true;
      } else if (!known[static_cast<size_t>(w.whole)] && all) {
        known[static_cast<size_t>(w.whole)] = 1;
        changed = true;
      }
    }
  }
  for (int t : targets_) {
    if (!known[static_cast<size_t>(t)]) {
      if (lost != nullptr) *lost = names_[static_cast<size_t>(t)];
      return false;
    }
  }
  return true;
}

Status FailureModel::RecoveryProbability(int failures, double* recovery, double* loss) const {
  if (failures < 0 || failures > nodes_) {
    return Status::Invalid("failures " + Str(failures) + " is outside 0.." + Str(nodes_));
  }
  const double sets = Choose(nodes_, failures);
  const double size = static_cast<double>(names_.size() + codes_.size() + wholes_.size() +
                                          implications_.size() + 1);
  if (sets * size > kMaxExactSteps) {
    return Status::NotSupported("enumerating all " + Str(static_cast<int>(std::min(sets, 2e9))) +
                                " sets of " + Str(failures) + " failed nodes of " + Str(nodes_) +
                                " would take too long (fewer nodes or failures)");
  }
  double kept = 0;
  double lost = 0;
  std::vector<bool> failed(static_cast<size_t>(nodes_));
  ForEachSubset(nodes_, failures, [&](const std::vector<int>& pick) {
    std::fill(failed.begin(), failed.end(), false);
    for (int p : pick) failed[static_cast<size_t>(p)] = true;
    (Survives(failed, nullptr) ? kept : lost) += 1;
    return true;
  });
  *recovery = kept / sets;
  *loss = lost / sets;
  return Status::Ok();
}

Status FailureModel::SmallestLoss(const std::vector<int>& among, int* size, std::vector<int>* nodes,
                                  std::string* lost) const {
  const int n = static_cast<int>(among.size());
  const double size_cost = static_cast<double>(names_.size() + codes_.size() + wholes_.size() +
                                               implications_.size() + 1);
  *size = 0;
  std::vector<bool> failed(static_cast<size_t>(nodes_));
  double spent = 0;
  for (int k = 1; k <= n && *size == 0; ++k) {
    // Smallest sets first, so only the sizes up to the answer are paid for.
    spent += Choose(n, k) * size_cost;
    if (spent > kMaxExactSteps) {
      return Status::NotSupported("no loss of up to " + Str(k - 1) + " of the " + Str(n) +
                                  " nodes loses data, and enumerating larger sets would take "
                                  "too long");
    }
    ForEachSubset(n, k, [&](const std::vector<int>& pick) {
      std::fill(failed.begin(), failed.end(), false);
      for (int p : pick) failed[static_cast<size_t>(among[static_cast<size_t>(p)])] = true;
      std::string what;
      if (Survives(failed, &what)) return true;
      *size = k;
      nodes->clear();
      for (int p : pick) nodes->push_back(among[static_cast<size_t>(p)]);
      *lost = what;
      return false;
    });
  }
  return Status::Ok();
}

std::string ReftScheme::Name() const {
  if (kind == kAec) return "aec";
  if (kind == kAor) return "aor";
  return shift == 1 ? "arc" : "arc:" + Str(shift);
}

Status ParseReftScheme(const std::string& text, ReftScheme* out) {
  ReftScheme s;
  if (text == "aec") {
    s.kind = ReftScheme::kAec;
  } else if (text == "aor") {
    s.kind = ReftScheme::kAor;
  } else if (text == "arc") {
    s.kind = ReftScheme::kArc;
  } else if (text.rfind("arc:", 0) == 0 && text.size() > 4 && text.size() <= 8 &&
             text.find_first_not_of("0123456789", 4) == std::string::npos) {
    s.kind = ReftScheme::kArc;
    s.shift = std::stoi(text.substr(4));
  } else {
    return Status::Invalid("'" + text + "' is not a REFT scheme: arc, arc:SHIFT, aec or aor");
  }
  *out = s;
  return Status::Ok();
}

Status BuildReftModel(int nodes, int group_size, const std::vector<ReftScheme>& schemes,
                      const Placement* replicas, const CodingPlacement* coding, FailureModel* out,
                      double private_share) {
  const int m = group_size;
  if (nodes < 1 || nodes > kMaxPlacementNodes) {
    return Status::Invalid("nodes " + Str(nodes) + " is outside 1.." + Str(kMaxPlacementNodes));
  }
  if (m < 2 || nodes % m != 0) {
    return Status::Invalid("sharding groups of " + Str(m) + " nodes: needs 2 or more that divide " +
                           Str(nodes) + " nodes");
  }
  if (int64_t{nodes} * m > kMaxModelCells) {
    // Each group's model has about m x m pieces per scheme (AEC's units): nodes x m in all.
    return Status::Invalid(Str(nodes) + " nodes in sharding groups of " + Str(m) + ": " +
                           std::to_string(int64_t{nodes} * m) +
                           " node-slices to model, more than " + std::to_string(kMaxModelCells) +
                           " (fewer nodes or smaller groups)");
  }
  if (replicas != nullptr && coding != nullptr) {
    return Status::Invalid("replicas and erasure coding across nodes cannot both be stacked");
  }
  for (const ReftScheme& s : schemes) {
    if (s.kind == ReftScheme::kAec && m < 3) {
      return Status::Invalid(
          "aec needs sharding groups of 3 or more (with 2, the parity of the "
          "one peer's slice is that slice: arc)");
    }
    if (s.kind == ReftScheme::kArc && (s.shift < 1 || s.shift >= m)) {
      return Status::Invalid(s.Name() + ": the shift must be 1.." + Str(m - 1) +
                             " in sharding groups of " + Str(m));
    }
  }
  if (!(private_share >= 0 && private_share <= 1000)) {
    return Status::Invalid("a private share of " + std::to_string(private_share) +
                           " is outside 0..1000 (units of the group's state)");
  }
  const bool aor = std::any_of(schemes.begin(), schemes.end(),
                               [](const ReftScheme& s) { return s.kind == ReftScheme::kAor; });
  if (aor && private_share == 0) {
    return Status::Invalid("aor protects each member's private shard: give their size");
  }
  FailureModel model(nodes);
  // Each node's snapshot: everything it saved.
  std::vector<std::vector<int>> saved(static_cast<size_t>(nodes));
  // AEC's parity of slice j spans the m - 1 other members (REFT's layout), or with ARC (shift 1)
  // beside it the m - 2 members other than j - 1, which keeps j's copy: ckptdb's "arc+aec"
  // (format::AecSpread), which survives any two losses where REFT's layout does not.
  bool arc1 = false, aec = false;
  for (const ReftScheme& s : schemes) {
    arc1 |= s.kind == ReftScheme::kArc && s.shift == 1;
    aec |= s.kind == ReftScheme::kAec;
  }
  const int subs = arc1 && aec ? m - 2 : m - 1;
  for (int base = 0; base < nodes; base += m) {
    const std::string sg = "SG " + Str(base / m);
    std::vector<int> slice(static_cast<size_t>(m));
    std::vector<std::vector<int>> sub(static_cast<size_t>(m));
    for (int j = 0; j < m; ++j) {
      const std::string name = "slice " + Str(j) + " of " + sg + " (node " + Str(base + j) + ")";
      slice[static_cast<size_t>(j)] = model.AddItem(name);
      for (int t = 0; t < subs; ++t) {
        sub[static_cast<size_t>(j)].push_back(model.AddItem("sub-slice " + Str(t) + " of " + name));
      }
      model.AddWhole(slice[static_cast<size_t>(j)], sub[static_cast<size_t>(j)]);
      model.AddTarget(slice[static_cast<size_t>(j)]);
    }
    auto save = [&](int item, int member) {
      model.Hold(item, base + member);
      saved[static_cast<size_t>(base + member)].push_back(item);
    };
    for (int j = 0; j < m; ++j) save(slice[static_cast<size_t>(j)], j);
    for (int j = 0; j < m && private_share > 0; ++j) {
      const int own = model.AddItem("private shard of node " + Str(base + j) + " of " + sg);
      model.AddTarget(own);
      save(own, j);
      if (aor) save(own, (j + m - 1) % m);  // recomputed by the member before it
    }
    for (const ReftScheme& s : schemes) {
      if (s.kind == ReftScheme::kAor) continue;  // above
      if (s.kind == ReftScheme::kArc) {
        for (int j = 0; j < m; ++j)
          save(slice[static_cast<size_t>(j)], ((j - s.shift) % m + m) % m);
      } else {
        for (int p = 0; p < m; ++p) {
          const int parity = model.AddItem("AEC parity on node " + Str(base + p) + " of " + sg);
          save(parity, p);
          std::vector<int> blocks;
          for (int i = 0; i < m; ++i) {
            const int k = ((p - i - 1) % m + m) % m;  // m - 1 for i == p
            if (k < subs) blocks.push_back(sub[static_cast<size_t>(i)][static_cast<size_t>(k)]);
          }
          const int data = static_cast<int>(blocks.size());
          blocks.push_back(parity);
          model.AddCode(std::move(blocks), data);
        }
      }
    }
  }
  std::vector<int> snapshot(static_cast<size_t>(nodes));
  for (int node = 0; node < nodes; ++node) {
    snapshot[static_cast<size_t>(node)] = model.AddItem("snapshot of node " + Str(node));
    model.AddWhole(snapshot[static_cast<size_t>(node)], saved[static_cast<size_t>(node)]);
    model.Hold(snapshot[static_cast<size_t>(node)], node);
  }
  double per_node = 1.0 / m + private_share * (aor ? 2 : 1);
  for (const ReftScheme& s : schemes) {
    if (s.kind == ReftScheme::kAor) continue;
    per_node += s.kind == ReftScheme::kArc ? 1.0 / m : 1.0 / (m * static_cast<double>(subs));
  }
  if (replicas != nullptr) {
    if (replicas->nodes != nodes) return Status::Invalid("the replica placement has other nodes");
    for (int node = 0; node < nodes; ++node) {
      for (int holder : replicas->holders[static_cast<size_t>(node)]) {
        if (holder != node) model.Hold(snapshot[static_cast<size_t>(node)], holder);
      }
    }
    per_node *= replicas->replicas;
  }
  if (coding != nullptr) {
    if (coding->nodes != nodes) return Status::Invalid("the coding placement has other nodes");
    for (size_t g = 0; g < coding->groups.size(); ++g) {
      std::vector<int> columns;
      for (int node : coding->groups[g]) {
        const int column = model.AddItem("column of node " + Str(node) + " in coding group " +
                                         Str(static_cast<int>(g)));
        model.Hold(column, node);
        model.AddImplication(column, snapshot[static_cast<size_t>(node)]);
        columns.push_back(column);
      }
      model.AddCode(std::move(columns), coding->data_shards);
    }
    per_node *=
        static_cast<double>(coding->data_shards + coding->parity_shards) / coding->data_shards;
  }
  model.memory_per_node = per_node;
  *out = std::move(model);
  return Status::Ok();
}

Status BuildCodingModel(int nodes, int ranks_per_node, int data_shards, int parity_shards,
                        FailureModel* out, std::vector<std::vector<int>>* group_nodes) {
  if (nodes < 1 || nodes > kMaxPlacementNodes) {
    return Status::Invalid("nodes " + Str(nodes) + " is outside 1.." + Str(kMaxPlacementNodes));
  }
  if (ranks_per_node < 1 || ranks_per_node > 1024) {
    return Status::Invalid("ranks per node " + Str(ranks_per_node) + " is outside 1..1024");
  }
  if (int64_t{nodes} * ranks_per_node > kMaxModelCells) {
    return Status::Invalid(Str(nodes) + " nodes of " + Str(ranks_per_node) +
                           " ranks: " + std::to_string(int64_t{nodes} * ranks_per_node) +
                           " ranks to model, more than " + std::to_string(kMaxModelCells));
  }
  CodeSpec code;
  CKPTDB_RETURN_IF_ERROR(ParseCodeSpec("ec:" + Str(data_shards) + "+" + Str(parity_shards), &code));
  std::vector<std::string> node_of_rank;
  for (int n = 0; n < nodes; ++n) {
    for (int r = 0; r < ranks_per_node; ++r) node_of_rank.push_back(Str(n));
  }
  std::vector<std::vector<uint32_t>> groups;
  CKPTDB_RETURN_IF_ERROR(ComputeCodingGroups(node_of_rank, code, &groups));
  FailureModel model(nodes);
  group_nodes->clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    // A member's column: its blocks of every stripe; any K columns give the rest.
    std::vector<int> columns;
    std::vector<int> on;
    for (uint32_t rank : groups[g]) {
      const int node = static_cast<int>(rank) / ranks_per_node;
      const int item = model.AddItem("rank " + Str(static_cast<int>(rank)) + " (node " + Str(node) +
                                     ", coding group " + Str(static_cast<int>(g)) + ")");
      model.Hold(item, node);
      model.AddTarget(item);
      columns.push_back(item);
      on.push_back(node);
    }
    model.AddCode(std::move(columns), data_shards);
    group_nodes->push_back(std::move(on));
  }
  model.memory_per_node = static_cast<double>(data_shards + parity_shards) / data_shards;
  *out = std::move(model);
  return Status::Ok();
}

}  // namespace ckpt::redundancy
