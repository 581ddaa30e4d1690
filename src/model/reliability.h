// Reliability model: how long the in-memory snapshots survive node, process
// and rack failures under each protection policy, in closed form.
//
// REFT section 5 (Assumption 1, Equations 5 and 6) models node time-to-failure
// as Weibull and gives the survival of in-memory checkpoints protected by one
// parity per sharding group of n nodes (Eq. 5) against plain checkpointing
// (Eq. 6). This layer generalises Eq. 5 to what memento protects:
//   - MDS codes (xor, rs:f, local_copy=full): a group survives any f losses;
//   - ring replication (replicate, peer:m): each piece lives on r consecutive
//     ring nodes, so a group is lost only when r ring-consecutive nodes are;
//   - racks as correlated failure domains: a rack loss takes all its nodes;
//   - software failures (the trainer dies, the host memory survives) never
//     lose in-memory state; they do lose a plain checkpointing job's state.
// Failures accumulate over the window (no repair), as in REFT: S(t) is the
// probability that a version snapshotted at time 0 is still recoverable from
// memory at time t, so the time where S drops below a threshold is the
// longest safe interval between durable versions. docs/reliability.md.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::topo {
struct Plan;
}

namespace memento::model {

// Weibull time-to-failure in REFT's form: P(alive at t) = exp(-rate * t^shape)
// (t in the caller's unit: days or hours). rate 0 never fails.
struct Weibull {
  double rate = 0;
  double shape = 1;

  double Survival(double t) const;
  double Cdf(double t) const;  // 1 - Survival, accurate for tiny values
  double Mean() const;         // rate^(-1/shape) * Gamma(1 + 1/shape); inf for rate 0
  // Inverse-CDF sample: (E / rate)^(1 / shape), E ~ Exp(1); inf for rate 0.
  double Sample(std::mt19937_64& rng) const;
};

struct FailureRates {
  Weibull hardware;  // node lost together with its host memory
  Weibull software;  // process lost, host memory survives
  Weibull rack;      // a whole rack (all its nodes) lost; rate 0: none
};

// Which loss patterns of a group the in-memory protection recovers from.
struct GroupRule {
  enum class Kind : uint8_t { kMds, kRing };
  Kind kind = Kind::kMds;
  int tolerate = 0;  // kMds: any `tolerate` lost nodes recover, one more does not
  int copies = 1;    // kRing: lost when `copies` ring-consecutive nodes are lost
  std::string Describe() const;
};

// The protection layout the model reasons about: disjoint groups of nodes (in
// ring order) with a rule each, and the rack of every node.
struct Structure {
  std::string policy;     // "xor", "rs:2", ..., or "durable" (plain checkpointing)
  bool in_memory = true;  // false: Eq. 6, every failure (hw, sw, rack) loses the state
  int num_nodes = 0;
  int num_racks = 0;           // 0: no rack failures modelled
  std::vector<int> node_rack;  // node -> rack in [0, num_racks); empty when num_racks == 0
  struct Group {
    std::vector<int> nodes;  // ring order
    GroupRule rule;
  };
  std::vector<Group> groups;  // a node in no group has no constraint
  // True when the groups are disjoint: Survival() is then exact. False when
  // some overlap (peer groups across sharding groups): Survival() multiplies
  // the groups' survivals, a lower bound (every group's survival event is
  // decreasing in the failure set, so by Harris' inequality they are
  // positively correlated); the simulator stays exact.
  bool exact = true;
};

// The rule a policy ("none", "replicate", "xor", "rs:F", "peer:M") gives a
// sharding group of n nodes (docs/planner.md table): none -> mds 0; xor ->
// mds 1; rs:f -> mds min(f, n-1); replicate -> ring 2; peer:m -> ring
// min(m, n); a single-node group -> mds 0. InvalidArgument for another text.
[[nodiscard]] Result<GroupRule> RuleForPolicy(const std::string& policy, int n);

// K nodes in groups of N (K divisible by N) protected by `policy`, or
// "durable" for plain checkpointing. racks > 0: node i is in rack
// i / ceil(K / racks) (consecutive nodes share a rack, as `plan layout
// --racks`), and group g takes nodes g, g + K/N, g + 2K/N, ... so that its
// members sit in different racks; racks == 0: group g is nodes gN..gN+N-1.
[[nodiscard]] Result<Structure> UniformStructure(const std::string& policy, int num_nodes,
                                                 int group_size, int racks);

// The sharding groups of a placement plan (groups with equal node sets count
// once), with the rule of the plan's policy and its racks, plus every peer
// group that carries data (a ring: lost when m consecutive nodes are) whose loss the
// sharding groups' rules do not already imply; such a group overlaps them
// and makes the structure inexact. FailedPrecondition when two sharding
// groups share some but not all nodes.
[[nodiscard]] Result<Structure> StructureFromPlan(const topo::Plan& plan);

// Probability that a group whose i-th ring node is lost with probability
// q[i] (independently) is still recoverable.
double GroupSurvival(const GroupRule& rule, const std::vector<double>& q);

// S(t): probability that state snapshotted at time 0 is still recoverable
// from memory at t (Eq. 5 generalised; Eq. 6 for !in_memory). Exact for
// independent nodes and disjoint groups; with racks, rack-failure sets are
// enumerated by size until the mass left out is below 1e-7, or until 1
// million sets / 10 million group evaluations; the mass left out counts as
// lost, so the figure is a lower bound within RackEnumerationGap().
[[nodiscard]] Result<double> Survival(const Structure& s, const FailureRates& rates, double t);

// The probability mass of rack-failure sets Survival(t) left out (0 without
// racks; below 1e-7 unless the enumeration hit its limits).
double RackEnumerationGap(const Structure& s, const FailureRates& rates, double t);

// The largest t with S(t) >= threshold (bisection to 1e-9 relative); +inf when
// S stays above it for 1e9 units. InvalidArgument for a threshold outside (0, 1).
[[nodiscard]] Result<double> TimeToThreshold(const Structure& s, const FailureRates& rates,
                                             double threshold);

// REFT Eq. 5 and 6 verbatim, for k nodes in groups of n (k/n groups): the
// reference the generalised form must reproduce. ps / ptr: one node's
// probability of surviving hardware / software failures; pre: of its
// snapshot process surviving (memento: 1, software failures keep memory).
double ReftEq5(double ps, double pre, int k, int n);
double ReftEq6(double ps, double ptr, int k);

}  // namespace memento::model
