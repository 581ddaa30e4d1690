#include "model/recommend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace memento::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Goodputs closer than this count as equal when choosing the interval.
constexpr double kGoodputTolerance = 1e-4;

std::string Gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
  return buf;
}

std::string Duration(double s) {
  char buf[48];
  if (std::isinf(s)) return "never";
  if (s >= 86400) {
    std::snprintf(buf, sizeof buf, "%.3g days", s / 86400);
  } else if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%.3g hours", s / 3600);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g min", s / 60);
  }
  return buf;
}

// Per-second system rate of a renewal process whose items fail as `w`.
double SystemRate(const Weibull& w, int count, double unit_s) {
  const double mean = w.Mean();
  return std::isinf(mean) ? 0.0 : count / (mean * unit_s);
}

// P(an outage is unrecoverable) given the nodes it starts with (`forced`),
// when every other node fails within the window with probability q.
double FatalGiven(const Structure& s, const std::vector<int>& forced, double q) {
  // Only the groups that hold a forced node matter to first order.
  std::vector<char> is_forced(s.num_nodes, 0);
  for (int n : forced) is_forced[n] = 1;
  double survive = 1.0;
  std::vector<double> qv;
  for (const auto& g : s.groups) {
    bool touched = false;
    qv.assign(g.nodes.size(), q);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (is_forced[g.nodes[i]]) qv[i] = 1.0, touched = true;
    }
    if (touched) survive *= GroupSurvival(g.rule, qv);
  }
  return 1.0 - survive;
}

// Marks `c` as not fitting when its bytes exceed a budget of `f`.
void ApplyBudgets(PolicyCost& c, const ClusterFigures& f) {
  c.fits = true;
  c.why_not.clear();
  if (f.host_budget > 0 && c.host_bytes > static_cast<double>(f.host_budget)) {
    c.fits = false;
    c.why_not = "needs " + Gb(c.host_bytes) + " host memory per node, budget " +
                Gb(static_cast<double>(f.host_budget));
  } else if (f.network_budget > 0 && c.network_bytes > static_cast<double>(f.network_budget)) {
    c.fits = false;
    c.why_not = "sends " + Gb(c.network_bytes) + " per node per snapshot, budget " +
                Gb(static_cast<double>(f.network_budget));
  } else if (f.copy_budget > 0 && c.copy_bytes > static_cast<double>(f.copy_budget)) {
    c.fits = false;
    c.why_not = "copies " + Gb(c.copy_bytes) + " device -> host per node per snapshot, budget " +
                Gb(static_cast<double>(f.copy_budget));
  }
}

}  // namespace

Result<PolicyCost> CostOf(const std::string& policy, int n, const ClusterFigures& f) {
  PolicyCost c;
  c.policy = policy;
  const double S = f.state_bytes_per_node;
  if (!(S > 0) || !(f.rebuild_bps > 0) || !(f.durable_read_bps > 0) || !(f.durable_write_bps > 0) ||
      !(f.memory_restore_bps > 0)) {
    return InvalidArgumentError("state bytes and bandwidths must be > 0");
  }
  c.costs.step_s = f.step_s;
  c.costs.restart_s = f.restart_s;
  c.costs.memory_restore_s = S / f.memory_restore_bps;
  c.costs.durable_restore_s = S / f.durable_read_bps;
  c.costs.snapshot_overhead = f.snapshot_overhead;
  c.costs.durable_write_s = f.durable_block_s;
  if (policy == "durable") {
    // Plain checkpointing: nothing in host memory; every version is written
    // while training waits.
    c.costs.snapshot_overhead = 0;
    c.costs.durable_write_s = S / f.durable_write_bps;
    c.costs.memory_restore_s = c.costs.durable_restore_s;
    c.costs.rebuild_s = c.costs.durable_restore_s;
    return c;
  }
  MEMENTO_ASSIGN_OR_RETURN(GroupRule rule, RuleForPolicy(policy, n));
  c.host_bytes = S;
  c.rebuild_bytes = S;
  if (policy == "replicate" && n >= 2) {
    c.host_bytes = 2 * S;
  } else if (policy.rfind("peer:", 0) == 0) {
    const int m = std::atoi(policy.c_str() + 5);
    c.host_bytes = m * S;
    c.network_bytes = (m - 1) * S;
  } else if (rule.kind == GroupRule::Kind::kMds && rule.tolerate > 0) {
    const int fp = rule.tolerate, k = n - fp;
    c.host_bytes = S + fp * S / k;
    c.rebuild_bytes = k * S;
  }
  c.costs.rebuild_s = c.rebuild_bytes / f.rebuild_bps;
  ApplyBudgets(c, f);
  return c;
}

double Goodput(const Evaluation& e, const FailureRates& rates, double unit_s, int num_nodes,
               int num_racks, double interval_s) {
  const Costs& c = e.cost.costs;
  const double hw = SystemRate(rates.hardware, num_nodes, unit_s);
  const double sw = SystemRate(rates.software, num_nodes, unit_s);
  const double rack = SystemRate(rates.rack, num_racks, unit_s);
  const double cycle = (1 + c.snapshot_overhead) * interval_s + c.durable_write_s;
  const double fall_loss = cycle / 2 + c.restart_s + c.durable_restore_s;
  double lost;
  if (e.policy == "durable") {
    // Every failure falls back: Daly's expected wall time (exact for
    // exponential failures, failures during the restart included).
    const double total = hw + sw + rack;
    if (total <= 0) return interval_s / cycle;
    return DalyGoodput(interval_s, c.durable_write_s, c.restart_s + c.durable_restore_s, 1 / total);
  } else {
    const double half_step = (1 + c.snapshot_overhead) * c.step_s / 2;
    const double fatal = hw * e.p_fatal_node + rack * e.p_fatal_rack;
    lost = sw * (half_step + c.restart_s + c.memory_restore_s) +
           (hw * (1 - e.p_fatal_node) + rack * (1 - e.p_fatal_rack)) *
               (half_step + c.restart_s + c.rebuild_s) +
           fatal * fall_loss;
  }
  return std::max(0.0, 1 - lost) * interval_s / cycle;
}

Result<Recommendation> Recommend(const std::vector<Structure>& structures,
                                 const FailureRates& rates, double unit_s, double threshold,
                                 const ClusterFigures& f, int grid,
                                 const std::vector<MeasuredBytes>* measured) {
  if (structures.empty()) return InvalidArgumentError("no policy to compare");
  if (measured != nullptr && measured->size() != structures.size()) {
    return InvalidArgumentError(std::to_string(measured->size()) + " measured plans for " +
                                std::to_string(structures.size()) + " policies");
  }
  if (grid < 2) return InvalidArgumentError("grid of " + std::to_string(grid) + " points");
  Recommendation rec;
  const int K = structures[0].num_nodes, R = structures[0].num_racks;
  for (size_t si = 0; si < structures.size(); ++si) {
    const Structure& s = structures[si];
    const int n = s.groups.empty() ? 1 : static_cast<int>(s.groups[0].nodes.size());
    Evaluation e;
    e.policy = s.policy;
    MEMENTO_ASSIGN_OR_RETURN(e.cost, CostOf(s.policy, n, f));
    if (measured != nullptr) {
      e.cost.host_bytes = (*measured)[si].host;
      e.cost.copy_bytes = (*measured)[si].copy;
      e.cost.network_bytes = (*measured)[si].network;
      ApplyBudgets(e.cost, f);
    }
    MEMENTO_ASSIGN_OR_RETURN(e.safe_interval, TimeToThreshold(s, rates, threshold));
    e.safe_interval_s = e.safe_interval * unit_s;
    if (!s.in_memory) {
      e.p_fatal_node = e.p_fatal_rack = 1;
    } else {
      // The outage window: restart and rebuild. Other nodes fail in it at
      // their mean rate (renewal), racks likewise.
      const double window = e.cost.costs.restart_s + e.cost.costs.rebuild_s;
      const double mean_hw = rates.hardware.Mean() * unit_s;
      const double q = std::isinf(mean_hw) ? 0.0 : -std::expm1(-window / mean_hw);
      const int groups = static_cast<int>(s.groups.size());
      const int samples = std::min(groups, 64);
      double sum = 0;
      for (int i = 0; i < samples; ++i) {
        const auto& g = s.groups[static_cast<size_t>(i) * groups / samples];
        sum += FatalGiven(s, {g.nodes[0]}, q);
      }
      e.p_fatal_node = samples > 0 ? sum / samples : 1.0;
      if (R > 0) {
        std::vector<std::vector<int>> rack_nodes(R);
        for (int n = 0; n < K; ++n) rack_nodes[s.node_rack[n]].push_back(n);
        const int rs = std::min(R, 16);
        double rsum = 0;
        for (int i = 0; i < rs; ++i) rsum += FatalGiven(s, rack_nodes[i * R / rs], q);
        e.p_fatal_rack = rsum / rs;
      }
    }
    const double cap = s.in_memory ? e.safe_interval_s : kInf;
    // In-memory policies: the agent streams a version from host memory in
    // the background, so versions cannot come faster than one persist time.
    const double floor_s = s.in_memory ? f.state_bytes_per_node / f.durable_write_bps : 0.0;
    const double lo = std::log(60.0), hi = std::log(1000 * 86400.0);
    double best = -1;
    for (int i = 0; i < grid; ++i) {
      const double I = std::exp(lo + (hi - lo) * i / (grid - 1));
      const double g = Goodput(e, rates, unit_s, K, R, I);
      e.curve.emplace_back(I, g);
      if (I >= floor_s && I <= cap) best = std::max(best, g);
    }
    // In-memory policies: the longest interval within kGoodputTolerance of
    // the best (a flat curve, durable writes that cost training nothing,
    // should not ask for a version every minute); durable-only: the optimum.
    const double tol = s.in_memory ? kGoodputTolerance : 0.0;
    e.best_goodput = -1;
    bool beyond_cap = false;
    for (auto [I, g] : e.curve) {
      if (I < floor_s || g < best - tol) continue;
      if (I > cap) {
        beyond_cap = true;
        continue;
      }
      e.best_interval_s = I;
      e.best_goodput = g;
    }
    if (e.best_goodput < 0) {  // the safe interval is below a minute or a persist
      e.best_interval_s = std::max(floor_s, std::min(cap, 60.0));
      e.best_goodput = Goodput(e, rates, unit_s, K, R, e.best_interval_s);
    }
    e.capped = s.in_memory && beyond_cap;
    rec.ranked.push_back(std::move(e));
  }
  std::stable_sort(rec.ranked.begin(), rec.ranked.end(),
                   [](const Evaluation& a, const Evaluation& b) {
                     if (a.cost.fits != b.cost.fits) return a.cost.fits;
                     // Equal goodput (e.g. no node ever loses its memory):
                     // the one that holds less host memory.
                     if (a.best_goodput != b.best_goodput) return a.best_goodput > b.best_goodput;
                     return a.cost.host_bytes < b.cost.host_bytes;
                   });
  // Durable-only baseline.
  const double total = SystemRate(rates.hardware, K, unit_s) +
                       SystemRate(rates.software, K, unit_s) + SystemRate(rates.rack, R, unit_s);
  rec.mtbf_s = total > 0 ? 1 / total : kInf;
  const double write = f.state_bytes_per_node / f.durable_write_bps;
  const double restore = f.restart_s + f.state_bytes_per_node / f.durable_read_bps;
  rec.young_s = YoungInterval(write, rec.mtbf_s);
  rec.daly_s = DalyInterval(write, rec.mtbf_s);
  rec.daly_goodput =
      std::isinf(rec.mtbf_s) ? 1.0 : DalyGoodput(rec.daly_s, write, restore, rec.mtbf_s);

  const Evaluation& best = rec.ranked[0];
  char buf[512];
  if (!best.cost.fits) {
    rec.reason = "no policy fits the budgets; the best would be " + best.policy + " (" +
                 best.cost.why_not + ")";
    return rec;
  }
  std::snprintf(buf, sizeof buf, "%s: goodput %.5f with a durable version every %s (%s)",
                best.policy.c_str(), best.best_goodput, Duration(best.best_interval_s).c_str(),
                best.policy == "durable" ? "the goodput optimum"
                : best.capped            ? "capped by the survival threshold"
                                         : "the longest interval within 1e-4 of the best goodput");
  rec.reason = buf;
  if (rec.ranked.size() > 1) {
    const Evaluation& next = rec.ranked[1];
    std::snprintf(buf, sizeof buf, "; next %s at %.5f", next.policy.c_str(), next.best_goodput);
    rec.reason += buf;
  }
  for (const auto& e : rec.ranked) {
    if (!e.cost.fits) rec.reason += "; " + e.policy + " excluded: " + e.cost.why_not;
  }
  return rec;
}

}  // namespace memento::model
