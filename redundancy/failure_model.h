// FailureModel: which pieces of a job's in-memory checkpoint survive a set of failed nodes, for
// layouts that stack several protections, decoded jointly, and the exact odds over every failure
// set (`ckptdb plan`). Pure arithmetic, like redundancy/placement.h, whose replica and coding
// layouts it also expresses, so that they can be mixed with REFT's replica-group schemes:
//
//   - REFT (reft-paper.txt section 4.1): data-parallel replicas form a sharding group (SG) of m
//     nodes that all hold the same state W_n; node j of the SG saves only slice j (1/m of it).
//   - ARC (section 4.2): node j also saves a peer's slice, copied from its own replica (no network
//     bytes): slice j on node j - shift (mod m); shift 1 by default, other shifts stack.
//   - AEC (section 4.2, eqs. 1-2): each slice is cut into m - 1 sub-slices; node p saves the XOR
//     of one sub-slice of every other member's slice, s_i[(p - i - 1) mod m] for i != p, so that
//     each sub-slice is covered by exactly one parity (that of node i + 1 + t) and any one lost
//     node is decoded from the others: memory W_n / (m (m - 1)) per node.
//   - Replicas (GEMINI) or ec:K+M groups across nodes of each node's whole snapshot (its slice and
//     the redundancy it saved), on top. A coding group is modelled by its members' columns (each
//     member's blocks of every stripe, data and parity): any K columns give all. A member whose
//     snapshot REFT's schemes rebuilt still lacks the parity it held, so it counts towards the
//     code only through its live node or the code itself: a lower bound on recovery.
//
// Decoding is joint, as a restore would do it: pieces held by a live node are known; a code (any
// K of its blocks give all) fills in its blocks once K are known; a whole (a snapshot, a slice) is
// known when all its parts are, and its parts when it is. Repeat until nothing changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "redundancy/placement.h"
#include "util/status.h"

namespace ckpt::redundancy {

// The models below are refused before anything is built past this many node-slices (nodes x
// sharding group size) or ranks (nodes x ranks per node): 65536 nodes in groups of 4096 once
// took 22 GB.
inline constexpr int64_t kMaxModelCells = int64_t{1} << 21;

class FailureModel {
 public:
  explicit FailureModel(int nodes) : nodes_(nodes) {}

  int nodes() const { return nodes_; }
  // A piece; `name` is for reports ("slice 2 of SG 0").
  int AddItem(std::string name);
  void Hold(int item, int node);                 // a copy of item lives on node
  void AddCode(std::vector<int> blocks, int k);  // any k of blocks give all of them
  void AddWhole(int whole, std::vector<int> parts);
  void AddImplication(int from, int to);  // knowing `from` gives `to` (not the other way)
  void AddTarget(int item);               // the restart needs it

  // With `failed` nodes lost: true when every target is known; otherwise *lost names one that
  // is not.
  bool Survives(const std::vector<bool>& failed, std::string* lost) const;

  // Exactly, over all C(N, k) sets of `failures` nodes (each equally likely): the probability
  // that every target survives. NotSupported when C(N, k) times the model's size exceeds
  // kMaxExactSteps; Invalid for failures outside 0..N.
  Status RecoveryProbability(int failures, double* recovery, double* loss) const;

  // The smallest set of nodes among `among` whose loss loses a target (its size in *size, the
  // set in *nodes, the piece in *lost); *size = 0 when no subset of `among` loses one. Sizes are
  // tried smallest first; NotSupported once the sets tried would pass kMaxExactSteps.
  Status SmallestLoss(const std::vector<int>& among, int* size, std::vector<int>* nodes,
                      std::string* lost) const;

  size_t items() const { return names_.size(); }
  // Bytes per node in units of a sharding group's state (filled by the builders).
  double memory_per_node = 0;

 private:
  int nodes_;
  std::vector<std::string> names_;
  std::vector<std::vector<int>> holders_;
  struct Code {
    std::vector<int> blocks;
    int k;
  };
  std::vector<Code> codes_;
  struct Whole {
    int whole;
    std::vector<int> parts;
  };
  std::vector<Whole> wholes_;
  std::vector<std::pair<int, int>> implications_;
  std::vector<int> targets_;
};

// REFT's protections within a sharding group.
struct ReftScheme {
  // kAor (REFT's AOR): each member's private shard is also kept, recomputed, by the member
  // before it (BuildReftModel's private_share).
  enum Kind { kArc, kAec, kAor } kind = kArc;
  int shift = 1;  // ARC: slice j on node j - shift
  std::string Name() const;
};
// "arc", "arc:2" (shift 2), "aec", "aor". Invalid names the text.
Status ParseReftScheme(const std::string& text, ReftScheme* out);

// Nodes 0..N-1 in sharding groups of `group_size` consecutive nodes (N divisible by it), each
// saving its slice and every scheme's redundancy; then, optionally, each node's whole snapshot
// protected across nodes by `replicas` (a Placement, nullptr: none) or `coding` (nullptr: none).
// private_share > 0: each member also holds a private shard (its ZeRO-1 optimizer shard, which
// no other member holds) of that size in units of the group's state, a target of its own kept
// by its member alone, or with kAor by the member before it too; in the snapshots, and counted
// in memory_per_node.
// Invalid: group_size < 2 or not dividing N, a scheme that needs more members (AEC needs 3: with
// 2 its parity is the peer's slice, ARC), an ARC shift outside 1..m-1, both replicas and coding,
// kAor without private shards, a private_share outside 0..1000.
Status BuildReftModel(int nodes, int group_size, const std::vector<ReftScheme>& schemes,
                      const Placement* replicas, const CodingPlacement* coding, FailureModel* out,
                      double private_share = 0);

// ec:K+M groups of ranks over N nodes with `ranks_per_node` ranks each, as Cluster forms them
// (ComputeCodingGroups in placement.h: ranks dealt round the nodes, runs of K + M): each
// rank's checkpoint a target. Invalid as ComputeCodingGroups refuses.
Status BuildCodingModel(int nodes, int ranks_per_node, int data_shards, int parity_shards,
                        FailureModel* out, std::vector<std::vector<int>>* group_nodes);

}  // namespace ckpt::redundancy
