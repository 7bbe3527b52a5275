// Where each node's in-memory checkpoint copies live, and how likely a job is to restart from
// memory after nodes fail. Pure arithmetic (no I/O, no store); `ckptdb plan` (tools/plan.cc)
// prints it.
//
// Sources, cited where each piece is implemented:
//  - GEMINI (Wang et al., SOSP'23), section 4: Algorithm 1 (mixed placement), Theorem 1,
//    Corollary 1 (eq. 3 in section 4, restated with its proof as eqs. 4-6 in Appendix B).
//  - REFT (section 5): node time-to-failure is Weibull, P_s(t) = exp(-lambda * t^c), and the
//    survival of in-memory checkpoints over time t (eq. 5 with redundancy, eq. 6 without).
//
// Nodes are numbered 0..N-1 (the papers number machines from 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "redundancy/erasure_code.h"
#include "util/status.h"

namespace ckpt::redundancy {

// Bounds on the inputs: an absurd size is a typo, and the exact computations below are
// polynomial in these.
inline constexpr int kMaxPlacementNodes = 1 << 16;
// A placement lists every node's holders: nodes x replicas entries at most this many (16 MiB of
// them), refused before anything is built (65536 nodes with 65536 replicas once took 13 GB).
inline constexpr int64_t kMaxPlacementHolders = int64_t{1} << 22;
// An exact probability that would take more steps than this is refused (NotSupported) rather
// than left running for minutes; about a second of work.
inline constexpr double kMaxExactSteps = 1e8;

enum class PlacementStrategy {
  // N/m groups of m consecutive nodes; every node of a group holds a copy of every member's
  // checkpoint. Needs N divisible by m.
  kGroup,
  // Node i holds copies of its own checkpoint and those of the m-1 nodes before it: node i's
  // checkpoint is on nodes i, i+1, ..., i+m-1 (mod N).
  kRing,
  // GEMINI Algorithm 1: kGroup when N is divisible by m; otherwise groups of m for the first
  // floor(N/m)-1 groups and a ring over the last m + N%m nodes.
  kMixed,
};

// "group", "ring", "mixed".
const char* PlacementStrategyName(PlacementStrategy strategy);

struct Placement {
  // What was laid out: kGroup or kRing, or kMixed only when N is not divisible by m (Algorithm 1
  // returns "group" when it is).
  PlacementStrategy strategy = PlacementStrategy::kGroup;
  int nodes = 0;
  int replicas = 0;
  // Algorithm 1's group list: consecutive node ids, every node in exactly one group. A group of
  // exactly m nodes is a group in the kGroup sense; a larger one is a ring among its members
  // (kRing has one group of all N nodes).
  std::vector<std::vector<int>> groups;
  // holders[i]: the m distinct nodes holding node i's checkpoint; holders[i][0] == i (GEMINI
  // keeps the local copy, Theorem 1's proof observation 2). For member p of a group of s nodes:
  // members p, p+1, ..., p+m-1 (mod s) of that group.
  std::vector<std::vector<int>> holders;
};

// Lays out `replicas` copies of each of `nodes` checkpoints. `requested` kMixed is GEMINI
// Algorithm 1. No node ever holds two copies of one checkpoint.
// Errors (Invalid): nodes < 1 or > kMaxPlacementNodes; replicas < 1 or > nodes; nodes x replicas
// over kMaxPlacementHolders; kGroup asked for with nodes not divisible by replicas.
Status ComputePlacement(int nodes, int replicas, PlacementStrategy requested, Placement* out);

// The probability that training restarts from CPU memory when `failures` nodes, chosen uniformly
// among all C(N, k) sets of that size, fail at once: a node's checkpoint is lost when every
// holder of it fails, and the restart needs every node's checkpoint. Exact: the failure sets that
// lose a checkpoint are counted (per group, then combined across groups), not sampled or bounded;
// the only error is floating-point rounding in the hypergeometric weights (relative about 1e-12
// at N = 1000, 1e-10 at N = 65536), and a probability that is exactly 0 or 1 comes out as
// exactly 0 or 1.
// Errors: Invalid when failures is outside 0..N or `placement` is not one ComputePlacement makes;
// NotSupported when counting would take more than kMaxExactSteps (about (k+1) * 2N steps, more
// for a large ring).
Status RecoveryProbabilityExact(const Placement& placement, int failures, double* out);
// The probability of the complement, that some checkpoint is lost: 1 - RecoveryProbabilityExact
// up to rounding, but counted directly, so that a tiny loss (1e-20) keeps its digits.
Status LossProbabilityExact(const Placement& placement, int failures, double* out);

// GEMINI Corollary 1 (eq. 3; Appendix B eqs. 4-6) for group placement:
//   Pr(N, m, k) = 1                                        if k < m
//   Pr(N, m, k) >= max{0, 1 - N C(N-m, k-m) / (m C(N, k))}  if m <= k <= N
// The bound is the exact probability for m <= k < 2m (eq. 5: at most one group can fail whole)
// and a lower bound for k >= 2m (eq. 6: a set that fails two whole groups is subtracted twice).
// Preconditions (asserted): 1 <= replicas <= nodes, nodes divisible by replicas (the corollary's
// hypothesis), 0 <= failures <= nodes.
double GeminiCorollary1(int nodes, int replicas, int failures);

// True when GeminiCorollary1 is the exact probability rather than a lower bound (k < 2m).
inline bool Corollary1IsExact(int replicas, int failures) { return failures < 2 * replicas; }

// Erasure-coded groups: groups of data + parity consecutive nodes; a group's checkpoints are
// recoverable while at most `parity` of its nodes fail.
struct CodingPlacement {
  int nodes = 0;
  int data_shards = 0;
  int parity_shards = 0;
  std::vector<std::vector<int>> groups;
};

// Errors (Invalid): nodes outside 1..kMaxPlacementNodes; data_shards < 1; parity_shards < 1;
// nodes not divisible by data_shards + parity_shards.
Status ComputeCodingPlacement(int nodes, int data_shards, int parity_shards, CodingPlacement* out);

// As RecoveryProbabilityExact for replicas: the probability that no group loses more than
// `parity_shards` nodes when `failures` uniformly chosen nodes fail at once.
// Errors: Invalid when failures is outside 0..N or `placement` is not one ComputeCodingPlacement
// makes; NotSupported past kMaxExactSteps.
Status RecoveryProbabilityExact(const CodingPlacement& placement, int failures, double* out);
Status LossProbabilityExact(const CodingPlacement& placement, int failures, double* out);

// REFT section 5 (Assumption 1, "Time-to-Failure"): the probability that one node has not failed
// after `days` days, P_s = exp(-lambda * t^c), t = days, c = shape. `lambda` is REFT's
// lambda_fail in failures per day^c.
// Errors (Invalid): lambda < 0, shape <= 0, days < 0, or any of them not finite.
Status WeibullNodeSurvival(double lambda, double shape, double days, double* out);

// REFT eq. (5), literally: P_re-survive = (P_s^n + n (1 - P_s) P_s^(n-1))^(k/n) * P_re^k, for k
// nodes in k/n sharding groups of n, each group surviving at most one failed node. p_re is the
// probability that one node's snapshot process survives (the paper's text calls it the
// probability of it failing, but it enters as a survival factor). Preconditions (asserted):
// 1 <= n <= k, k divisible by n, probabilities in [0, 1].
double ReftEquation5(int nodes, int group_size, double p_s, double p_re);

// REFT eq. (6): P_ck-survive = P_s^k * P_tr^k: without redundancy every one of the k nodes must
// survive hardware (P_s) and software (P_tr) failures. Preconditions as ReftEquation5.
double ReftEquation6(int nodes, double p_s, double p_tr);

// The probability that every node's checkpoint is still in some holder's memory when each node
// independently survives with probability `node_survival` (e.g. WeibullNodeSurvival): REFT eq. 5
// generalised from "groups of n surviving one failure" to this placement. It is the product over
// groups of P(the group loses no checkpoint): for a group of m, 1 - (1 - P_s)^m; for a ring,
// P(no m cyclically consecutive members fail). Software failures (eq. 5's P_re^k) are not
// modelled, i.e. P_re = 1; multiply by ReftEquation6(N, 1, P_re) to add them.
// Errors: Invalid when node_survival is outside [0, 1] or `placement` is not one ComputePlacement
// makes; NotSupported when a ring's m * s exceeds kMaxExactSteps.
Status InMemorySurvival(const Placement& placement, double node_survival, double* out);

// The same for erasure-coded groups: the product over groups of P(at most parity_shards of its
// nodes fail). For parity 1 and groups of n this is exactly REFT eq. (5) with P_re = 1.
// Errors: Invalid when node_survival is outside [0, 1].
Status InMemorySurvival(const CodingPlacement& placement, double node_survival, double* out);

// The coding groups of a job: its ranks dealt round its nodes (nodes in order of their first
// rank; every node's first rank, then every node's second, ...) and cut into runs of K + M, each
// on K + M distinct nodes. With one rank per node and N a multiple of K + M these are `ckptdb
// plan --ec`'s groups of consecutive nodes; with r ranks on each of N >= K + M nodes, group i
// spans the K + M nodes from (i (K + M)) mod N on, cyclically. groups[i] lists group i's ranks
// by position. Invalid, naming the numbers, for fewer than K + M nodes, ranks not a multiple of
// K + M, or nodes so unequal that a run would put two members on one node.
Status ComputeCodingGroups(const std::vector<std::string>& node_of_rank, const CodeSpec& code,
                           std::vector<std::vector<uint32_t>>* groups);

}  // namespace ckpt::redundancy
