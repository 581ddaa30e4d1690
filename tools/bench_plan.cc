// `memento bench plan`: how long the reliability model takes at scale. For
// --nodes nodes (default 100,000) in groups of --group-size, per policy: the
// closed form (the safe interval by bisection plus survival at 5 times) and
// the simulator (SimulateTraining over --days simulated days, default
// 10,000; durable versions daily, durable-only at Daly's interval). Prints
// one JSON object. docs/reliability.md, "Scale".
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/clock.h"
#include "model/recommend.h"
#include "model/reliability.h"
#include "model/simulate.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct PlanBenchOptions {
  int nodes = 100000, group_size = 8, racks = 0;
  double days = 10000, hw_rate = 1e-4, sw_rate = 1e-5, rack_rate = 0, shape = 1.3;
  std::vector<std::string> policies = {"durable", "xor", "rs:2", "replicate"};
  uint64_t seed = 1;
  bool json = true;
};

Result<nlohmann::json> Measure(const PlanBenchOptions& o) {
  model::FailureRates rates;
  rates.hardware = {o.hw_rate, o.shape};
  rates.software = {o.sw_rate, o.shape};
  rates.rack = {o.rack_rate, o.shape};
  nlohmann::json out = {
      {"bench", "plan"},
      {"nodes", o.nodes},
      {"group_size", o.group_size},
      {"racks", o.racks},
      {"days", o.days},
      {"rates_per_day", {{"hw", o.hw_rate}, {"sw", o.sw_rate}, {"rack", o.rack_rate}}},
      {"shape", o.shape}};
  nlohmann::json rows = nlohmann::json::array();
  double max_closed = 0, max_sim = 0;
  for (const auto& policy : o.policies) {
    MEMENTO_ASSIGN_OR_RETURN(model::Structure s,
                             model::UniformStructure(policy, o.nodes, o.group_size, o.racks));
    Stopwatch closed;
    MEMENTO_ASSIGN_OR_RETURN(double safe, model::TimeToThreshold(s, rates, 0.9));
    std::vector<double> surv;
    for (double t : {0.1, 1.0, 10.0, 100.0, 1000.0}) {
      MEMENTO_ASSIGN_OR_RETURN(double v, model::Survival(s, rates, t));
      surv.push_back(v);
    }
    const double closed_s = closed.Seconds();
    MEMENTO_ASSIGN_OR_RETURN(model::PolicyCost cost,
                             model::CostOf(policy, o.group_size, model::ClusterFigures{}));
    // Durable versions daily; durable-only at Daly's optimum for its MTBF.
    double interval = 86400;
    if (!s.in_memory) {
      const double per_s =
          o.nodes / (rates.hardware.Mean() * 86400) + o.nodes / (rates.software.Mean() * 86400);
      interval = model::DalyInterval(cost.costs.durable_write_s, 1 / per_s);
    }
    Stopwatch sim;
    MEMENTO_ASSIGN_OR_RETURN(
        model::TrainingResult r,
        model::SimulateTraining(s, rates, 86400, cost.costs, interval, o.days, o.seed));
    const double sim_s = sim.Seconds();
    max_closed = std::max(max_closed, closed_s);
    max_sim = std::max(max_sim, sim_s);
    rows.push_back(
        {{"policy", policy},
         {"closed_form_s", closed_s},
         {"safe_interval_days", std::isinf(safe) ? nlohmann::json(nullptr) : nlohmann::json(safe)},
         {"survival_at_0.1_1_10_100_1000_days", surv},
         {"simulate_s", sim_s},
         {"durable_interval_s", interval},
         {"simulated_failures", r.failures},
         {"goodput", r.goodput},
         {"durable_fallbacks", r.durable_fallbacks}});
  }
  out["policies"] = std::move(rows);
  out["max_closed_form_s"] = max_closed;
  out["max_simulate_s"] = max_sim;
  return out;
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto* cmd = bench.add_subcommand(
      "plan", "Reliability model at scale: closed form and simulated days per policy (JSON)");
  auto o = std::make_shared<PlanBenchOptions>();
  cmd->add_option("--nodes", o->nodes, "nodes")->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "nodes per sharding group")->capture_default_str();
  cmd->add_option("--racks", o->racks, "racks (0: none)")->capture_default_str();
  cmd->add_option("--days", o->days, "simulated days per policy")->capture_default_str();
  cmd->add_option("--hw-rate", o->hw_rate, "hardware Weibull rate per node per day")
      ->capture_default_str();
  cmd->add_option("--sw-rate", o->sw_rate, "software Weibull rate per node per day")
      ->capture_default_str();
  cmd->add_option("--rack-rate", o->rack_rate, "rack Weibull rate per rack per day")
      ->capture_default_str();
  cmd->add_option("--shape", o->shape, "Weibull shape")->capture_default_str();
  cmd->add_option("--policy", o->policies, "policies (comma-separated)")->delimiter(',');
  cmd->add_option("--seed", o->seed, "simulator seed")->capture_default_str();
  cmd->add_flag("--json", o->json, "print JSON (always on)");
  cmd->callback([o, &ctx] {
    Result<nlohmann::json> j = Measure(*o);
    if (!j.ok()) {
      ctx.exit_code = ReportStatus(j.status());
      return;
    }
    memento::tools::PrintJson("memento.bench.plan/1", std::move(*j));
  });
}

}  // namespace
}  // namespace memento::tools

MEMENTO_REGISTER_BENCH(plan, memento::tools::Setup);
