// The planner's recommendation: which protection policy and which interval
// between durable versions give the most goodput on this cluster, within the
// host-memory and network budgets and the survival threshold; with the classic
// Young/Daly optimum for durable-only checkpointing as the baseline.
//
// Goodput per (policy, interval) is a first-order renewal-reward estimate
// (docs/reliability.md, "Goodput"): every failure stops the job; it restarts
// from memory (losing half a step on average plus the restart and rebuild)
// unless further losses during the outage window make the group
// unrecoverable, then from the durable tier (losing half an interval on
// average plus the durable restore). SimulateTraining (simulate.h) plays the
// same model event by event; a test checks the two agree.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memento/status.h"
#include "model/reliability.h"
#include "model/simulate.h"

namespace memento::model {

// What the cluster measured or the operator set (bytes, bytes/s, seconds).
struct ClusterFigures {
  double state_bytes_per_node = 16e9;  // unique training state per node
  double rebuild_bps = 1.25e9;         // peer-memory rebuild (bench recover effective_gbps)
  double memory_restore_bps = 5e9;     // restore from own memory (bench persist restore_memory)
  double durable_read_bps = 1e9;       // durable restore (bench persist restore_durable)
  double durable_write_bps = 1e9;      // durable persist (bench persist persist_MiB_s)
  double step_s = 10;                  // step time without snapshots (bench overhead step_s_off)
  double snapshot_overhead = 0.01;     // per-step snapshot cost (bench overhead overhead_pct/100)
  double restart_s = 60;               // relaunch of the job after a failure
  // Training time blocked per durable version for in-memory policies (the
  // agent streams the committed version from host memory in the background).
  double durable_block_s = 0;
  uint64_t host_budget = 0;     // host bytes per node for snapshots; 0: unlimited
  uint64_t network_budget = 0;  // bytes a node may send per snapshot; 0: unlimited
  uint64_t copy_budget = 0;     // device -> host bytes per node per snapshot; 0: unlimited
};

// A real plan's largest per-node bytes (topo::MaxNodeCosts): given to
// Recommend, they replace CostOf's formulas in the budget checks.
struct MeasuredBytes {
  double host = 0;
  double copy = 0;     // device -> host per snapshot
  double network = 0;  // received from peers per snapshot
};

// Costs of one policy on a group of n nodes. Host bytes: the unique state
// plus its redundancy (docs/planner.md: replicate 2S, xor S + S/(n-1), rs:f
// S + fS/(n-f), peer:m mS); rebuild moves S (a copy) or (n-f)S (a decode).
struct PolicyCost {
  std::string policy;
  double host_bytes = 0;
  double network_bytes = 0;  // per node per snapshot (peer copies)
  double copy_bytes = 0;     // device -> host per node per snapshot (measured plans only)
  double rebuild_bytes = 0;
  Costs costs;  // for SimulateTraining
  bool fits = true;
  std::string why_not;  // when !fits: which budget
};
[[nodiscard]] Result<PolicyCost> CostOf(const std::string& policy, int group_size,
                                        const ClusterFigures& f);

struct Evaluation {
  std::string policy;
  PolicyCost cost;
  double safe_interval = 0;    // rate units; inf when never below the threshold
  double safe_interval_s = 0;  // the same in seconds
  double p_fatal_node = 0;     // P(an outage that starts with a node loss falls back)
  double p_fatal_rack = 0;     // same for a rack loss
  // The longest interval whose goodput is within 1e-4 of the best, no longer
  // than the safe interval and, for in-memory policies, no shorter than one
  // persist (state bytes / durable write bandwidth).
  double best_interval_s = 0;
  double best_goodput = 0;
  bool capped = false;                           // the safe interval, not goodput, set the interval
  std::vector<std::pair<double, double>> curve;  // (interval s, goodput)
};

struct Recommendation {
  std::vector<Evaluation> ranked;  // fitting policies by best goodput, then the others
  std::string reason;              // why the first one, in words
  // Durable-only baseline (classic Young/Daly): system MTBF and intervals.
  double mtbf_s = 0, young_s = 0, daly_s = 0, daly_goodput = 0;
};

// Analytic goodput of one policy at one durable interval (seconds).
double Goodput(const Evaluation& e, const FailureRates& rates, double unit_s, int num_nodes,
               int num_racks, double interval_s);

// Evaluates every policy (structures built by the caller, same nodes) on a
// log grid of intervals (`grid` points from 1 minute to 1000 days).
// `measured` (one per structure, or null): the real plans' bytes for the
// budget checks instead of the formulas.
[[nodiscard]] Result<Recommendation> Recommend(
    const std::vector<Structure>& structures, const FailureRates& rates, double unit_s,
    double threshold, const ClusterFigures& f, int grid = 200,
    const std::vector<MeasuredBytes>* measured = nullptr);

}  // namespace memento::model
