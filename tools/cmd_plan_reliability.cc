// `memento plan reliability`: how long each protection policy keeps the
// in-memory snapshots recoverable under Weibull node, process and rack
// failures (REFT Eq. 5/6 generalised, src/model), i.e. the longest safe
// interval between durable versions. docs/reliability.md.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/byte_flag.h"
#include "model/charts.h"
#include "model/recommend.h"
#include "model/reliability.h"
#include "model/simulate.h"
#include "model/svg.h"
#include "tools/command.h"
#include "tools/json_output.h"
#include "tools/plan_reliability.h"
#include "topo/plan.h"

namespace memento::tools {
namespace {

struct ReliabilityOptions {
  // Topology: --nodes/--group-size, or the plan layout flags.
  int nodes = 0, group_size = 0;
  int dp = 8, tp = 4, pp = 4, zero = 1, ranks_per_node = 4, racks = 0;
  std::vector<std::string> policies;
  double hw_rate = 1e-4, sw_rate = 1e-5, rack_rate = 0, shape = 1.0, threshold = 0.9;
  std::string rate_unit = "day";
  std::vector<double> at;
  bool json = false;
  // Pictures.
  std::string svg, goodput_svg;
  double horizon = 0;  // survival picture's time axis; 0: 2 x the longest finite safe interval
  int svg_points = 201;
  // Recommendation and simulation.
  bool recommend = false, simulate = false;
  std::vector<std::string> bench_files;
  std::string trace_file;
  uint64_t state_bytes = 16000000000ull, host_budget = 0, network_budget = 0;
  double step_s = -1, restart_s = 60, durable_interval_h = 0, days = 365;
  int trials = 2000;
  uint64_t seed = 1;
};

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return InvalidArgumentError("cannot write '" + path + "'");
  out << text;
  out.close();
  if (!out) return InternalError("writing '" + path + "' failed");
  return Status::Ok();
}

const std::vector<std::string> kDefaultPolicies = {"durable", "none", "replicate", "xor", "rs:2"};

Result<model::Structure> BuildStructure(const ReliabilityOptions& o, const std::string& policy) {
  if (o.nodes > 0 || o.group_size > 0) {
    if (o.nodes <= 0 || o.group_size <= 0) {
      return InvalidArgumentError("--nodes and --group-size go together (got --nodes " +
                                  std::to_string(o.nodes) + " --group-size " +
                                  std::to_string(o.group_size) + ")");
    }
    return model::UniformStructure(policy, o.nodes, o.group_size, o.racks);
  }
  // The topology of `plan layout`, planned with small synthetic tensors (the
  // layout of groups does not depend on the byte counts).
  MEMENTO_ASSIGN_OR_RETURN(topo::Topology topology,
                           topo::Topology::Uniform(o.dp, o.tp, o.pp, o.zero, o.ranks_per_node));
  const int num_nodes = topology.num_nodes();
  if (o.racks < 0 || o.racks > num_nodes) {
    return InvalidArgumentError("--racks " + std::to_string(o.racks) + ": expected 0.." +
                                std::to_string(num_nodes));
  }
  if (o.racks > 0) {
    const int per = (num_nodes + o.racks - 1) / o.racks;
    topology.node_rack.resize(num_nodes);
    for (int n = 0; n < num_nodes; ++n) topology.node_rack[n] = "rack" + std::to_string(n / per);
  }
  const bool durable = policy == "durable";
  MEMENTO_ASSIGN_OR_RETURN(topo::Policy pol, topo::ParsePolicy(durable ? "none" : policy));
  if (pol.scheme == topo::Scheme::kAuto) {
    return InvalidArgumentError("--policy auto: name the policies to compare instead");
  }
  topo::Inventory inv(topology.num_ranks());
  for (auto& tensors : inv) {
    TensorMeta t;
    t.name = "params";
    t.dtype = DType::kFloat32;
    t.shape = {1024};
    t.state_class = StateClass::kReplicated;
    tensors.push_back(t);
    if (o.zero != 0) {
      t.name = "optimizer";
      t.state_class = StateClass::kDpSharded;
      tensors.push_back(t);
    }
    t.name = "rng";
    t.shape = {16};
    t.state_class = StateClass::kPrivate;
    tensors.push_back(t);
  }
  MEMENTO_ASSIGN_OR_RETURN(topo::Plan plan, topo::MakePlan(topology, inv, pol));
  MEMENTO_ASSIGN_OR_RETURN(model::Structure s, model::StructureFromPlan(plan));
  if (durable) {
    s.policy = "durable";
    s.in_memory = false;
    s.groups.clear();
  }
  return s;
}

std::string Days(double t, const std::string& unit) {
  if (std::isinf(t)) return "never";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g %s%s", t, unit.c_str(), t == 1 ? "" : "s");
  return buf;
}

Status RunReliability(const ReliabilityOptions& o) {
  if (o.rate_unit != "day" && o.rate_unit != "hour") {
    return InvalidArgumentError("--rate-unit '" + o.rate_unit + "': expected day or hour");
  }
  if (!(o.shape > 0)) {
    return InvalidArgumentError("--shape " + std::to_string(o.shape) + ": expected > 0");
  }
  for (auto [name, v] : {std::pair<const char*, double>{"--hw-rate", o.hw_rate},
                         {"--sw-rate", o.sw_rate},
                         {"--rack-rate", o.rack_rate}}) {
    if (!(v >= 0) || std::isinf(v)) {
      return InvalidArgumentError(std::string(name) + " " + std::to_string(v) +
                                  ": expected a rate >= 0");
    }
  }
  for (double t : o.at) {
    if (!(t >= 0)) return InvalidArgumentError("--at " + std::to_string(t) + ": expected >= 0");
  }
  if (o.trials < 1)
    return InvalidArgumentError("--trials " + std::to_string(o.trials) + ": expected >= 1");
  if (!(o.days > 0))
    return InvalidArgumentError("--days " + std::to_string(o.days) + ": expected > 0");
  if (!(o.restart_s >= 0)) {
    return InvalidArgumentError("--restart-s " + std::to_string(o.restart_s) + ": expected >= 0");
  }
  if (o.state_bytes == 0) return InvalidArgumentError("--state-bytes 0: expected > 0");
  if (!o.trace_file.empty() && !o.simulate) {
    return InvalidArgumentError("--trace needs --simulate");
  }
  model::FailureRates rates;
  rates.hardware = {o.hw_rate, o.shape};
  rates.software = {o.sw_rate, o.shape};
  rates.rack = {o.rack_rate, o.shape};
  const std::vector<std::string>& policies = o.policies.empty() ? kDefaultPolicies : o.policies;

  nlohmann::json out;
  out["assumptions"] = {{"hw_rate", o.hw_rate},     {"sw_rate", o.sw_rate},
                        {"rack_rate", o.rack_rate}, {"shape", o.shape},
                        {"rate_unit", o.rate_unit}, {"threshold", o.threshold}};
  nlohmann::json rows = nlohmann::json::array();
  std::vector<model::Structure> structures;
  bool header = false;
  for (const auto& policy : policies) {
    MEMENTO_ASSIGN_OR_RETURN(model::Structure s, BuildStructure(o, policy));
    if (!header) {
      out["nodes"] = s.num_nodes;
      out["racks"] = s.num_racks;
      if (!o.json) {
        std::printf(
            "%d nodes, %d racks; Weibull shape %g, per %s: hardware %g, software %g, "
            "rack %g; threshold %g\n",
            s.num_nodes, s.num_racks, o.shape, o.rate_unit.c_str(), o.hw_rate, o.sw_rate,
            o.rack_rate, o.threshold);
        std::printf("%-12s %-10s %-34s %s\n", "policy", "groups", "group rule",
                    "safe durable interval (survival >= threshold)");
      }
      header = true;
    }
    MEMENTO_ASSIGN_OR_RETURN(double safe, model::TimeToThreshold(s, rates, o.threshold));
    nlohmann::json row;
    row["policy"] = policy;
    row["groups"] = s.groups.size();
    std::string rule = s.in_memory ? "" : "every failure loses the state (Eq. 6)";
    if (s.in_memory && !s.groups.empty()) {
      rule = std::to_string(s.groups[0].nodes.size()) + " nodes, " + s.groups[0].rule.Describe();
    }
    row["rule"] = rule;
    row["exact"] = s.exact;
    if (!s.exact) {
      rule += " (+ peer groups across groups: survival is a lower bound)";
    }
    row["safe_interval"] = std::isinf(safe) ? nlohmann::json(nullptr) : nlohmann::json(safe);
    if (s.num_racks > 0 && !std::isinf(safe)) {
      const double gap = model::RackEnumerationGap(s, rates, safe);
      row["rack_gap"] = gap;
      if (gap > 1e-7) {
        char note[128];
        std::snprintf(note, sizeof note, " (lower bound: rack sets of mass %.2g left out)", gap);
        rule += note;
      }
    }
    nlohmann::json surv = nlohmann::json::array();
    for (double t : o.at) {
      MEMENTO_ASSIGN_OR_RETURN(double v, model::Survival(s, rates, t));
      surv.push_back({{"t", t}, {"survival", v}});
    }
    row["survival"] = surv;
    if (!o.json) {
      std::printf("%-12s %-10zu %-34s %s\n", policy.c_str(), s.groups.size(), rule.c_str(),
                  Days(safe, o.rate_unit).c_str());
      for (const auto& p : surv) {
        std::printf("%-12s   S(%g %s) = %.6f\n", "", p["t"].get<double>(), o.rate_unit.c_str(),
                    p["survival"].get<double>());
      }
    }
    rows.push_back(std::move(row));
    structures.push_back(std::move(s));
  }
  const double unit_s = o.rate_unit == "day" ? 86400.0 : 3600.0;
  model::ClusterFigures f;
  f.state_bytes_per_node = static_cast<double>(o.state_bytes);
  f.host_budget = o.host_budget;
  f.network_budget = o.network_budget;
  f.restart_s = o.restart_s;
  for (const auto& path : o.bench_files) MEMENTO_RETURN_IF_ERROR(ApplyBenchFile(path, f));
  if (o.step_s > 0) f.step_s = o.step_s;
  const bool need_rec = o.recommend || !o.goodput_svg.empty() || o.simulate;
  model::Recommendation rec;
  if (need_rec) {
    MEMENTO_ASSIGN_OR_RETURN(rec, model::Recommend(structures, rates, unit_s, o.threshold, f));
  }
  if (o.recommend) {
    nlohmann::json r;
    r["figures"] = {{"state_bytes_per_node", f.state_bytes_per_node},
                    {"rebuild_bps", f.rebuild_bps},
                    {"memory_restore_bps", f.memory_restore_bps},
                    {"durable_read_bps", f.durable_read_bps},
                    {"durable_write_bps", f.durable_write_bps},
                    {"step_s", f.step_s},
                    {"snapshot_overhead", f.snapshot_overhead},
                    {"restart_s", f.restart_s},
                    {"host_budget", f.host_budget},
                    {"network_budget", f.network_budget}};
    nlohmann::json ranked = nlohmann::json::array();
    for (const auto& e : rec.ranked) {
      ranked.push_back({{"policy", e.policy},
                        {"fits", e.cost.fits},
                        {"why_not", e.cost.why_not},
                        {"host_bytes_per_node", e.cost.host_bytes},
                        {"network_bytes_per_snapshot", e.cost.network_bytes},
                        {"rebuild_s", e.cost.costs.rebuild_s},
                        {"durable_restore_s", e.cost.costs.durable_restore_s},
                        {"p_fallback_node_loss", e.p_fatal_node},
                        {"p_fallback_rack_loss", e.p_fatal_rack},
                        {"durable_interval_s", e.best_interval_s},
                        {"capped_by_threshold", e.capped},
                        {"goodput", e.best_goodput}});
    }
    r["ranked"] = std::move(ranked);
    r["recommended"] =
        rec.ranked[0].cost.fits ? nlohmann::json(rec.ranked[0].policy) : nlohmann::json(nullptr);
    r["reason"] = rec.reason;
    r["baseline_durable_only"] = {{"mtbf_s", rec.mtbf_s},
                                  {"young_interval_s", rec.young_s},
                                  {"daly_interval_s", rec.daly_s},
                                  {"daly_goodput", rec.daly_goodput}};
    out["recommendation"] = r;
    if (!o.json) {
      std::printf(
          "\nrecommendation (state %.3g GB per node, rebuild %.3g GB/s, durable write %.3g "
          "GB/s, read %.3g GB/s, step %g s, snapshot overhead %.2f%%, restart %g s)\n",
          f.state_bytes_per_node / 1e9, f.rebuild_bps / 1e9, f.durable_write_bps / 1e9,
          f.durable_read_bps / 1e9, f.step_s, f.snapshot_overhead * 100, f.restart_s);
      std::printf("%-12s %-9s %-16s %-12s %s\n", "policy", "goodput", "durable every", "host/node",
                  "note");
      for (const auto& e : rec.ranked) {
        char every[32];
        std::snprintf(every, sizeof every, "%.3g h", e.best_interval_s / 3600);
        std::printf(
            "%-12s %-9.5f %-16s %-12s %s\n", e.policy.c_str(), e.best_goodput, every,
            (std::to_string(static_cast<int>(e.cost.host_bytes / 1e9 + 0.5)) + " GB").c_str(),
            !e.cost.fits ? e.cost.why_not.c_str()
            : e.capped   ? "interval capped by the survival threshold"
                         : "");
      }
      std::printf("baseline   durable-only: MTBF %.3g h, Young %.3g h, Daly %.3g h, goodput %.5f\n",
                  rec.mtbf_s / 3600, rec.young_s / 3600, rec.daly_s / 3600, rec.daly_goodput);
      std::printf("recommend  %s\n", rec.reason.c_str());
    }
  }
  if (o.simulate) {
    std::vector<model::TraceEvent> trace;
    if (!o.trace_file.empty()) {
      std::ifstream in(o.trace_file);
      if (!in) return InvalidArgumentError("--trace " + o.trace_file + ": cannot open");
      std::stringstream ss;
      ss << in.rdbuf();
      MEMENTO_ASSIGN_OR_RETURN(trace, model::ParseTrace(ss.str(), structures[0]));
    }
    nlohmann::json sims = nlohmann::json::array();
    if (!o.json)
      std::printf("\nsimulation (seed %llu, %d trials, %g days%s)\n",
                  static_cast<unsigned long long>(o.seed), o.trials, o.days,
                  o.trace_file.empty() ? "" : (", trace " + o.trace_file).c_str());
    for (size_t i = 0; i < structures.size(); ++i) {
      const auto& s = structures[i];
      const model::Evaluation* e = nullptr;
      for (const auto& ev : rec.ranked) {
        if (ev.policy == s.policy) e = &ev;
      }
      std::vector<double> times = o.at;
      const double safe =
          rows[i]["safe_interval"].is_null() ? 0 : rows[i]["safe_interval"].get<double>();
      if (times.empty() && safe > 0) times = {safe};
      MEMENTO_ASSIGN_OR_RETURN(model::SurvivalEstimate est,
                               model::SimulateSurvival(s, rates, times, o.trials, o.seed));
      const double interval =
          o.durable_interval_h > 0 ? o.durable_interval_h * 3600 : e->best_interval_s;
      MEMENTO_ASSIGN_OR_RETURN(
          model::TrainingResult tr,
          model::SimulateTraining(s, rates, unit_s, e->cost.costs, interval, o.days, o.seed,
                                  trace.empty() ? nullptr : &trace));
      nlohmann::json js;
      js["policy"] = s.policy;
      nlohmann::json sv = nlohmann::json::array();
      for (size_t k = 0; k < est.t.size(); ++k) {
        MEMENTO_ASSIGN_OR_RETURN(double exact, model::Survival(s, rates, est.t[k]));
        sv.push_back({{"t", est.t[k]},
                      {"simulated", est.survival[k]},
                      {"std_error", est.std_error[k]},
                      {"closed_form", exact}});
        if (!o.json) {
          std::printf("%-12s S(%g %s): simulated %.4f +- %.4f, closed form %.4f\n",
                      s.policy.c_str(), est.t[k], o.rate_unit.c_str(), est.survival[k],
                      1.96 * est.std_error[k], exact);
        }
      }
      js["survival"] = sv;
      const double g_model = model::Goodput(*e, rates, unit_s, s.num_nodes, s.num_racks, interval);
      js["training"] = {{"durable_interval_s", interval},
                        {"days", tr.days},
                        {"goodput", tr.goodput},
                        {"goodput_std_error", tr.goodput_std_error},
                        {"goodput_model", g_model},
                        {"lost_work_s_per_day", tr.lost_work_s_per_day},
                        {"down_s_per_day", tr.down_s_per_day},
                        {"failures", tr.failures},
                        {"memory_recoveries", tr.memory_recoveries},
                        {"durable_fallbacks", tr.durable_fallbacks},
                        {"fallback_probability", tr.fallback_probability}};
      if (!o.json) {
        std::printf(
            "%-12s durable every %.3g h: goodput %.5f +- %.5f (model %.5f), lost work %.3g "
            "h/day, %lld failures, %lld from memory, %lld from durable (P %.3g)\n",
            s.policy.c_str(), interval / 3600, tr.goodput, 1.96 * tr.goodput_std_error, g_model,
            tr.lost_work_s_per_day / 3600, static_cast<long long>(tr.failures),
            static_cast<long long>(tr.memory_recoveries),
            static_cast<long long>(tr.durable_fallbacks), tr.fallback_probability);
      }
      sims.push_back(std::move(js));
    }
    out["simulation"] = std::move(sims);
  }
  if (!o.svg.empty()) {
    double horizon = o.horizon;
    if (horizon <= 0) {
      for (const auto& r : rows) {
        if (!r["safe_interval"].is_null())
          horizon = std::max(horizon, 2 * r["safe_interval"].get<double>());
      }
      if (horizon <= 0) horizon = 30;
    }
    MEMENTO_ASSIGN_OR_RETURN(
        model::Chart chart,
        model::SurvivalChart(structures, rates, o.threshold, horizon, o.svg_points, o.rate_unit));
    MEMENTO_RETURN_IF_ERROR(WriteFile(o.svg, model::RenderSvg(chart)));
    out["svg"] = o.svg;
    if (!o.json)
      std::printf("wrote %s (survival against time, %zu curves)\n", o.svg.c_str(),
                  structures.size());
  }
  if (!o.goodput_svg.empty()) {
    MEMENTO_RETURN_IF_ERROR(WriteFile(o.goodput_svg, model::RenderSvg(model::GoodputChart(rec))));
    out["goodput_svg"] = o.goodput_svg;
    if (!o.json)
      std::printf("wrote %s (goodput against durable interval)\n", o.goodput_svg.c_str());
  }
  out["policies"] = std::move(rows);
  if (o.json) memento::tools::PrintJson("memento.plan.reliability/1", std::move(out));
  return Status::Ok();
}

}  // namespace

Status ApplyBenchFile(const std::string& path, model::ClusterFigures& f) {
  std::ifstream in(path);
  if (!in) return InvalidArgumentError("--bench " + path + ": cannot open");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    return InvalidArgumentError("--bench " + path + ": not JSON (" + e.what() + ")");
  }
  const std::string kind = j.is_object() ? j.value("bench", "") : "";
  auto number = [&](const char* key) -> Result<double> {
    if (!j.contains(key) || !j[key].is_number() || !(j[key].get<double>() >= 0)) {
      return InvalidArgumentError("--bench " + path + " (bench " + kind + "): no number '" + key +
                                  "'");
    }
    return j[key].get<double>();
  };
  if (kind == "recover") {
    MEMENTO_ASSIGN_OR_RETURN(double gbps, number("effective_gbps"));
    if (gbps > 0) f.rebuild_bps = gbps * 1e9 / 8;
  } else if (kind == "persist") {
    MEMENTO_ASSIGN_OR_RETURN(double w, number("persist_MiB_s"));
    MEMENTO_ASSIGN_OR_RETURN(double r, number("restore_durable_MiB_s"));
    MEMENTO_ASSIGN_OR_RETURN(double m, number("restore_memory_MiB_s"));
    if (w > 0) f.durable_write_bps = w * 1048576;
    if (r > 0) f.durable_read_bps = r * 1048576;
    if (m > 0) f.memory_restore_bps = m * 1048576;
  } else if (kind == "overhead") {
    MEMENTO_ASSIGN_OR_RETURN(double step, number("step_s_off"));
    if (!j.contains("overhead_pct") || !j["overhead_pct"].is_number()) {
      return InvalidArgumentError("--bench " + path +
                                  " (bench overhead): no number 'overhead_pct'");
    }
    if (step > 0) f.step_s = step;
    f.snapshot_overhead = std::max(0.0, j["overhead_pct"].get<double>() / 100);
  } else {
    return InvalidArgumentError(
        "--bench " + path + ": \"bench\" is '" + kind +
        "'; expected the JSON of memento bench recover, persist or overhead");
  }
  return Status::Ok();
}

void SetupPlanReliability(CLI::App* plan, CommandContext& ctx) {
  auto* cmd = plan->add_subcommand(
      "reliability",
      "Survival of in-memory snapshots per protection policy under Weibull failures "
      "(REFT Eq. 5/6 generalised) and the longest safe interval between durable versions");
  auto o = std::make_shared<ReliabilityOptions>();
  cmd->add_option("--nodes", o->nodes, "K nodes (with --group-size; instead of --dp/--tp/--pp)");
  cmd->add_option("--group-size", o->group_size, "N nodes per sharding group (divides --nodes)");
  cmd->add_option("--dp", o->dp, "data-parallel size (as plan layout)")->capture_default_str();
  cmd->add_option("--tp", o->tp, "tensor-parallel size")->capture_default_str();
  cmd->add_option("--pp", o->pp, "pipeline-parallel size")->capture_default_str();
  cmd->add_option("--zero", o->zero, "ZeRO stage: 0, 1 or 3")->capture_default_str();
  cmd->add_option("--ranks-per-node", o->ranks_per_node, "ranks per node")->capture_default_str();
  cmd->add_option("--racks", o->racks, "racks (failure domains; 0: none)")->capture_default_str();
  cmd->add_option("--policy", o->policies,
                  "none|replicate|xor|rs:F|peer:M|durable (plain checkpointing, Eq. 6); "
                  "repeat or comma-separate (default durable,none,replicate,xor,rs:2)")
      ->delimiter(',');
  cmd->add_option("--hw-rate", o->hw_rate,
                  "hardware failures (node and its memory lost): Weibull rate per node, "
                  "P(alive at t) = exp(-rate t^shape)")
      ->capture_default_str();
  cmd->add_option("--sw-rate", o->sw_rate, "software failures (process lost, memory kept)")
      ->capture_default_str();
  cmd->add_option("--rack-rate", o->rack_rate, "whole-rack failures, per rack")
      ->capture_default_str();
  cmd->add_option("--rate-unit", o->rate_unit, "unit of t: day|hour")->capture_default_str();
  cmd->add_option("--shape", o->shape, "Weibull shape c (1: exponential)")->capture_default_str();
  cmd->add_option("--threshold", o->threshold, "survival probability that must hold")
      ->capture_default_str();
  cmd->add_option("--at", o->at, "also print survival at these times (comma-separated)")
      ->delimiter(',');
  cmd->add_flag("--json", o->json, "print every figure as JSON");
  cmd->add_option("--svg", o->svg,
                  "write survival against time per policy, with the threshold "
                  "line (REFT Figure 8's analogue), as SVG to this file");
  cmd->add_option("--goodput-svg", o->goodput_svg,
                  "write goodput against the durable interval per policy as SVG to this file");
  cmd->add_option("--horizon", o->horizon,
                  "--svg time axis length in rate units (default: 2 x the longest safe interval)");
  cmd->add_option("--svg-points", o->svg_points, "points per survival curve")
      ->capture_default_str();
  cmd->add_flag("--recommend", o->recommend,
                "rank the policies and durable intervals by goodput within the budgets and the "
                "threshold, with the Young/Daly durable-only baseline");
  cmd->add_flag("--simulate", o->simulate,
                "also run the Monte-Carlo simulator: survival at --at (or the safe interval) and "
                "a --days training run per policy at its recommended (or --durable-interval) "
                "interval");
  cmd->add_option("--bench", o->bench_files,
                  "JSON from memento bench recover|persist|overhead --json: use this cluster's "
                  "measured rebuild, durable and step figures (repeatable)");
  cmd->add_option(
      "--trace", o->trace_file,
      "with --simulate: replay failures from this file, lines '<seconds> hw|sw|rack <id>'");
  cmd->add_option("--state-bytes", o->state_bytes, "unique training state per node")
      ->transform(ByteSize())
      ->capture_default_str();
  cmd->add_option("--host-budget", o->host_budget,
                  "host memory per node for snapshots (0: unlimited)")
      ->transform(ByteSize());
  cmd->add_option("--network-budget", o->network_budget,
                  "bytes a node may send per snapshot (0: unlimited)")
      ->transform(ByteSize());
  cmd->add_option("--step-s", o->step_s, "training step time in seconds (default 10 or --bench)");
  cmd->add_option("--restart-s", o->restart_s, "job relaunch time after a failure, seconds")
      ->capture_default_str();
  cmd->add_option("--durable-interval", o->durable_interval_h,
                  "with --simulate: durable interval in hours (default: the recommended one)");
  cmd->add_option("--days", o->days, "simulated days of training")->capture_default_str();
  cmd->add_option("--trials", o->trials, "simulated histories for survival")->capture_default_str();
  cmd->add_option("--seed", o->seed, "simulator seed")->capture_default_str();
  cmd->callback([o, &ctx] { ctx.exit_code = ReportStatus(RunReliability(*o)); });
}

}  // namespace memento::tools
