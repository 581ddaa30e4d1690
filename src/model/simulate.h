// Monte-Carlo failure simulator: draws node, process and rack failures from
// the same Weibull distributions as the closed form (reliability.h), or
// replays a trace, and plays them against a protection structure.
//
//   SimulateSurvival  no repair, as REFT Eq. 5/6: the fraction of histories in
//                     which state snapshotted at 0 is still recoverable at t.
//                     Tests check it against Survival() within its
//                     confidence interval.
//   SimulateTraining  a job run for `days` with repair: every failure stops
//                     the job; it restarts from memory (the step in flight
//                     lost) when the nodes lost in this outage leave every
//                     group recoverable, else from the newest durable
//                     version. Failed nodes are replaced (renewal: each node
//                     draws its next failure from the moment it failed), and
//                     protection is whole again once the outage ends. Reports
//                     goodput (useful training time / wall time), lost work
//                     and how often the durable tier was needed.
//
// Thread safety: pure functions of their arguments; deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memento/status.h"
#include "model/reliability.h"

namespace memento::model {

struct SurvivalEstimate {
  std::vector<double> t;
  std::vector<double> survival;   // fraction of trials recoverable at t[i]
  std::vector<double> std_error;  // sqrt(s (1 - s) / trials)
  int trials = 0;
};

// InvalidArgument for trials < 1.
[[nodiscard]] Result<SurvivalEstimate> SimulateSurvival(const Structure& s,
                                                        const FailureRates& rates,
                                                        const std::vector<double>& times,
                                                        int trials, uint64_t seed);

// Costs of the running system, in seconds (from `memento bench` results or
// defaults; docs/reliability.md says which).
struct Costs {
  double step_s = 10;              // one training step
  double snapshot_overhead = 0.0;  // per-step snapshot cost as a fraction of step_s
  double restart_s = 60;           // relaunch after any failure
  double memory_restore_s = 5;     // restore from the node's own memory (software failure)
  double rebuild_s = 30;           // rebuild lost nodes' state from peers' memory
  double durable_restore_s = 900;  // restore from the durable tier
  double durable_write_s = 0;      // training time blocked per durable version
};

// One failure from a trace: at `t_s` seconds from the start, `kind` "hw"
// (node and memory lost), "sw" (process lost) or "rack" (`id` is a rack).
struct TraceEvent {
  double t_s = 0;
  std::string kind;
  int id = 0;
};

// Lines "<seconds> hw|sw|rack <id>", '#' comments; InvalidArgument naming the
// line for anything else, an id out of range or times that go backwards.
[[nodiscard]] Result<std::vector<TraceEvent>> ParseTrace(const std::string& text,
                                                         const Structure& s);

struct TrainingResult {
  double days = 0;
  double goodput = 0;              // useful training time / wall time
  double goodput_std_error = 0;    // from 20 batch means
  double lost_work_s_per_day = 0;  // training time redone per day
  double down_s_per_day = 0;       // restart + restore time per day
  int64_t failures = 0;            // events that stopped the job
  int64_t memory_recoveries = 0;
  int64_t durable_fallbacks = 0;
  double fallback_probability = 0;  // durable_fallbacks / failures
  int64_t durable_versions = 0;
};

// `unit_s`: seconds per rate unit (86400 for --rate-unit day). With `trace`,
// failures come from it only. InvalidArgument for non-positive days, step or
// interval.
[[nodiscard]] Result<TrainingResult> SimulateTraining(
    const Structure& s, const FailureRates& rates, double unit_s, const Costs& costs,
    double durable_interval_s, double days, uint64_t seed,
    const std::vector<TraceEvent>* trace = nullptr);

// Daly's expected wall time for durable-only checkpointing with exponential
// failures (J. T. Daly, "A higher order estimate of the optimum checkpoint
// interval for restart dumps", FGCS 2006, Eq. 13 with failures during restart):
// goodput = tau / (M e^{R/M} (e^{(tau+C)/M} - 1)), M the system MTBF.
double DalyGoodput(double tau_s, double write_s, double restart_s, double mtbf_s);
// Young's sqrt(2 C M) and Daly's higher-order optimum interval (Daly Eq. 37).
double YoungInterval(double write_s, double mtbf_s);
double DalyInterval(double write_s, double mtbf_s);

}  // namespace memento::model
