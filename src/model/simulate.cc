#include "model/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <sstream>

namespace memento::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Where each node sits: (group, ring position) for every group holding it.
struct NodeIndex {
  std::vector<std::vector<std::pair<int, int>>> at;
  explicit NodeIndex(const Structure& s) : at(s.num_nodes) {
    for (size_t g = 0; g < s.groups.size(); ++g) {
      for (size_t i = 0; i < s.groups[g].nodes.size(); ++i) {
        at[s.groups[g].nodes[i]].emplace_back(static_cast<int>(g), static_cast<int>(i));
      }
    }
  }
};

// The time a group becomes unrecoverable, given when each node's memory is
// lost (no repair).
double GroupDeath(const Structure::Group& g, const std::vector<double>& node_t,
                  std::vector<double>& scratch) {
  const int n = static_cast<int>(g.nodes.size());
  scratch.resize(n);
  for (int i = 0; i < n; ++i) scratch[i] = node_t[g.nodes[i]];
  if (g.rule.kind == GroupRule::Kind::kMds) {
    if (g.rule.tolerate >= n) return kInf;
    std::nth_element(scratch.begin(), scratch.begin() + g.rule.tolerate, scratch.end());
    return scratch[g.rule.tolerate];  // the (tolerate + 1)-th loss
  }
  const int r = g.rule.copies;
  if (r > n) return kInf;
  double best = kInf;
  for (int s = 0; s < n; ++s) {
    double worst = 0;
    for (int k = 0; k < r; ++k) worst = std::max(worst, scratch[(s + k) % n]);
    best = std::min(best, worst);
  }
  return best;
}

}  // namespace

Result<SurvivalEstimate> SimulateSurvival(const Structure& s, const FailureRates& rates,
                                          const std::vector<double>& times, int trials,
                                          uint64_t seed) {
  if (trials < 1) {
    return InvalidArgumentError("--trials " + std::to_string(trials) + ": expected >= 1");
  }
  std::mt19937_64 rng(seed);
  std::vector<double> death(trials);
  std::vector<double> node_t(s.num_nodes), rack_t(s.num_racks), scratch;
  for (int trial = 0; trial < trials; ++trial) {
    for (auto& r : rack_t) r = rates.rack.Sample(rng);
    for (int n = 0; n < s.num_nodes; ++n) {
      double t = rates.hardware.Sample(rng);
      if (!s.in_memory) t = std::min(t, rates.software.Sample(rng));
      if (s.num_racks > 0) t = std::min(t, rack_t[s.node_rack[n]]);
      node_t[n] = t;
    }
    double d = kInf;
    if (!s.in_memory) {
      for (double t : node_t) d = std::min(d, t);
    } else {
      for (const auto& g : s.groups) d = std::min(d, GroupDeath(g, node_t, scratch));
    }
    death[trial] = d;
  }
  std::sort(death.begin(), death.end());
  SurvivalEstimate out;
  out.trials = trials;
  for (double t : times) {
    const auto alive = death.end() - std::upper_bound(death.begin(), death.end(), t);
    const double p = static_cast<double>(alive) / trials;
    out.t.push_back(t);
    out.survival.push_back(p);
    out.std_error.push_back(std::sqrt(p * (1 - p) / trials));
  }
  return out;
}

Result<std::vector<TraceEvent>> ParseTrace(const std::string& text, const Structure& s) {
  std::vector<TraceEvent> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  double last = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    TraceEvent e;
    if (!(ls >> e.t_s)) {
      std::string rest;
      if (std::istringstream(line) >> rest) {
        return InvalidArgumentError("trace line " + std::to_string(lineno) + " '" + line +
                                    "': expected '<seconds> hw|sw|rack <id>'");
      }
      continue;  // blank
    }
    std::string extra;
    if (!(ls >> e.kind >> e.id) || (ls >> extra) ||
        (e.kind != "hw" && e.kind != "sw" && e.kind != "rack")) {
      return InvalidArgumentError("trace line " + std::to_string(lineno) + " '" + line +
                                  "': expected '<seconds> hw|sw|rack <id>'");
    }
    const int limit = e.kind == "rack" ? s.num_racks : s.num_nodes;
    if (e.id < 0 || e.id >= limit) {
      return InvalidArgumentError("trace line " + std::to_string(lineno) + ": " + e.kind + " id " +
                                  std::to_string(e.id) + " not in [0, " + std::to_string(limit) +
                                  ")");
    }
    if (!(e.t_s >= last) || std::isinf(e.t_s)) {
      return InvalidArgumentError("trace line " + std::to_string(lineno) + ": time " +
                                  std::to_string(e.t_s) + " is before the previous event's");
    }
    last = e.t_s;
    out.push_back(e);
  }
  return out;
}

Result<TrainingResult> SimulateTraining(const Structure& s, const FailureRates& rates,
                                        double unit_s, const Costs& c, double interval_s,
                                        double days, uint64_t seed,
                                        const std::vector<TraceEvent>* trace) {
  if (!(days > 0)) return InvalidArgumentError("--days " + std::to_string(days) + ": expected > 0");
  if (!(c.step_s > 0)) {
    return InvalidArgumentError("step time " + std::to_string(c.step_s) + " s: expected > 0");
  }
  if (!(interval_s > 0)) {
    return InvalidArgumentError("durable interval " + std::to_string(interval_s) +
                                " s: expected > 0");
  }
  std::mt19937_64 rng(seed);
  const NodeIndex index(s);
  std::vector<std::vector<int>> rack_nodes(s.num_racks);
  for (int n = 0; n < s.num_nodes && s.num_racks > 0; ++n) rack_nodes[s.node_rack[n]].push_back(n);

  // Next failure of every node (hw, sw) and rack: a min-heap of (time, kind, id).
  enum Kind : int { kHw = 0, kSw = 1, kRack = 2 };
  using Event = std::tuple<double, int, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> heap;
  const Weibull* dist[3] = {&rates.hardware, &rates.software, &rates.rack};
  auto schedule = [&](double from, int kind, int id) {
    const double dt = dist[kind]->Sample(rng);
    if (!std::isinf(dt)) heap.emplace(from + dt * unit_s, kind, id);
  };
  size_t trace_next = 0;
  if (trace == nullptr) {
    for (int n = 0; n < s.num_nodes; ++n) {
      schedule(0, kHw, n);
      schedule(0, kSw, n);
    }
    for (int r = 0; r < s.num_racks; ++r) schedule(0, kRack, r);
  }
  auto next_failure = [&]() -> double {
    if (trace) return trace_next < trace->size() ? (*trace)[trace_next].t_s : kInf;
    return heap.empty() ? kInf : std::get<0>(heap.top());
  };

  const double horizon = days * 86400.0;
  const double wall_per_progress = 1.0 + c.snapshot_overhead;
  enum Phase { kRun, kWrite, kDown } phase = kRun;
  double now = 0, progress = 0, durable_progress = 0, next_durable = interval_s;
  double phase_end = 0;  // kWrite / kDown
  TrainingResult out;
  out.days = days;
  double lost = 0, down = 0;
  // Batch means for the confidence interval.
  constexpr int kBatches = 20;
  std::vector<double> batch_progress;
  double next_batch = horizon / kBatches;

  // The outage in progress: nodes whose memory is gone, lost counts per group.
  std::vector<char> node_lost(s.num_nodes, 0);
  std::vector<int> lost_nodes, group_lost(s.groups.size(), 0);
  bool outage = false, outage_fatal = false, outage_memory = false;

  auto advance = [&](double to) {
    while (next_batch <= to && static_cast<int>(batch_progress.size()) < kBatches) {
      const double at = next_batch;
      batch_progress.push_back(progress + (phase == kRun ? (at - now) / wall_per_progress : 0));
      next_batch += horizon / kBatches;
    }
    if (phase == kRun) progress += (to - now) / wall_per_progress;
    if (phase == kDown) down += to - now;
    now = to;
  };
  auto lose_node = [&](int n) {
    if (node_lost[n]) return;
    node_lost[n] = 1;
    lost_nodes.push_back(n);
    outage_memory = true;
    for (auto [g, pos] : index.at[n]) {
      const auto& grp = s.groups[g];
      const int size = static_cast<int>(grp.nodes.size());
      if (grp.rule.kind == GroupRule::Kind::kMds) {
        if (++group_lost[g] > grp.rule.tolerate) outage_fatal = true;
        continue;
      }
      int run = 1;
      for (int k = 1; k < size && node_lost[grp.nodes[(pos + k) % size]]; ++k) ++run;
      for (int k = 1; k < size && node_lost[grp.nodes[(pos - k + size) % size]]; ++k) ++run;
      if (run >= grp.rule.copies) outage_fatal = true;
    }
  };

  while (now < horizon) {
    const double tf = next_failure();
    double te = horizon;
    if (phase == kRun) {
      te = now + std::max(0.0, next_durable - progress) * wall_per_progress;
    } else {
      te = phase_end;
    }
    const double t = std::min({tf, te, horizon});
    advance(t);
    if (t >= horizon) break;
    if (te <= tf) {
      if (phase == kRun) {
        progress = next_durable;
        phase = kWrite;
        phase_end = now + c.durable_write_s;
      } else if (phase == kWrite) {
        durable_progress = progress;
        next_durable = progress + interval_s;
        ++out.durable_versions;
        phase = kRun;
      } else {
        phase = kRun;  // outage over: replacements rebuilt, protection whole again
        for (int n : lost_nodes) node_lost[n] = 0;
        lost_nodes.clear();
        std::fill(group_lost.begin(), group_lost.end(), 0);
        outage = outage_fatal = outage_memory = false;
      }
      continue;
    }
    // A failure at `now`.
    int kind, id;
    if (trace) {
      const auto& e = (*trace)[trace_next++];
      kind = e.kind == "hw" ? kHw : e.kind == "sw" ? kSw : kRack;
      id = e.id;
    } else {
      std::tie(std::ignore, kind, id) = heap.top();
      heap.pop();
      schedule(now, kind, id);  // the node, process or rack is replaced
    }
    ++out.failures;
    const bool new_outage = !outage;
    const bool was_fatal = outage_fatal;
    outage = true;
    if (kind == kHw) lose_node(id);
    if (kind == kRack) {
      for (int n : rack_nodes[id]) lose_node(n);
    }
    if (!s.in_memory) outage_fatal = true;
    const double before = progress;
    if (outage_fatal) {
      progress = durable_progress;
      next_durable = durable_progress + interval_s;
      if (!was_fatal) ++out.durable_fallbacks;
      phase_end = now + c.restart_s + c.durable_restore_s;
    } else {
      progress = std::floor(progress / c.step_s + 1e-9) * c.step_s;
      progress = std::max(progress, durable_progress);
      if (new_outage) ++out.memory_recoveries;
      phase_end = now + c.restart_s + (outage_memory ? c.rebuild_s : c.memory_restore_s);
    }
    if (!new_outage && !was_fatal && outage_fatal) --out.memory_recoveries;
    lost += before - progress;
    phase = kDown;
  }
  advance(horizon);
  while (static_cast<int>(batch_progress.size()) < kBatches) batch_progress.push_back(progress);

  out.goodput = progress / horizon;
  out.lost_work_s_per_day = lost / days;
  out.down_s_per_day = down / days;
  const int64_t outages = out.memory_recoveries + out.durable_fallbacks;
  out.fallback_probability =
      outages > 0 ? static_cast<double>(out.durable_fallbacks) / static_cast<double>(outages) : 0;
  double mean = 0, sq = 0, prev = 0;
  for (double p : batch_progress) {
    const double g = (p - prev) / (horizon / kBatches);
    prev = p;
    mean += g;
    sq += g * g;
  }
  mean /= kBatches;
  const double var = std::max(0.0, sq / kBatches - mean * mean) * kBatches / (kBatches - 1);
  out.goodput_std_error = std::sqrt(var / kBatches);
  return out;
}

double DalyGoodput(double tau_s, double write_s, double restart_s, double mtbf_s) {
  const double m = mtbf_s;
  return tau_s / (m * std::exp(restart_s / m) * std::expm1((tau_s + write_s) / m));
}

double YoungInterval(double write_s, double mtbf_s) { return std::sqrt(2 * write_s * mtbf_s); }

double DalyInterval(double write_s, double mtbf_s) {
  if (write_s >= 2 * mtbf_s) return mtbf_s;
  const double x = write_s / (2 * mtbf_s);
  return std::sqrt(2 * write_s * mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - write_s;
}

}  // namespace memento::model
