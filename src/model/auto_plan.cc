#include "model/auto_plan.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace memento::model {

Result<topo::Plan> MakeJobPlan(const topo::Topology& topology, const topo::Inventory& inventory,
                               const topo::Policy& policy, const AutoInputs& in,
                               Recommendation* rec_out) {
  if (policy.scheme != topo::Scheme::kAuto) return topo::MakePlan(topology, inventory, policy);
  if (in.candidates.empty()) return InvalidArgumentError("policy auto: no candidate policy");
  std::vector<topo::Plan> plans;
  std::vector<Structure> structures;
  std::vector<MeasuredBytes> measured;
  std::string skipped;
  Status first_error = Status::Ok();
  uint64_t state = 0;
  for (const std::string& name : in.candidates) {
    MEMENTO_ASSIGN_OR_RETURN(topo::Policy p, topo::ParsePolicy(name));
    if (p.scheme == topo::Scheme::kAuto) {
      return InvalidArgumentError("policy auto: 'auto' cannot be its own candidate");
    }
    p.local_copy = policy.local_copy;
    p.host_bytes_per_node = policy.host_bytes_per_node;
    p.copy_bytes_per_node = policy.copy_bytes_per_node;
    p.network_bytes_per_node = policy.network_bytes_per_node;
    Result<topo::Plan> plan = topo::MakePlan(topology, inventory, p);
    Result<Structure> s = plan.ok() ? StructureFromPlan(*plan) : Result<Structure>(plan.status());
    if (!s.ok()) {
      if (first_error.ok()) first_error = s.status();
      skipped += "; " + name + " not planned: " + s.status().message();
      continue;
    }
    s->policy = name;  // without "+full": CostOf's rule for the scheme
    const topo::NodeCosts c = topo::MaxNodeCosts(*plan);
    measured.push_back(
        {static_cast<double>(c.host), static_cast<double>(c.copy), static_cast<double>(c.network)});
    for (const topo::NodePlan& n : plan->nodes) state = std::max(state, n.piece_bytes);
    structures.push_back(std::move(*s));
    plans.push_back(std::move(*plan));
  }
  if (plans.empty()) return first_error;
  ClusterFigures f = in.figures;
  // Nothing to protect still needs a positive size for the model's times.
  f.state_bytes_per_node = static_cast<double>(std::max<uint64_t>(state, 1));
  f.host_budget = policy.host_bytes_per_node;
  f.copy_budget = policy.copy_bytes_per_node;
  f.network_budget = policy.network_bytes_per_node;
  MEMENTO_ASSIGN_OR_RETURN(Recommendation rec, Recommend(structures, in.rates, in.unit_s,
                                                         in.threshold, f, 200, &measured));
  char unit[32];
  if (in.unit_s == 86400) {
    std::snprintf(unit, sizeof unit, "day");
  } else if (in.unit_s == 3600) {
    std::snprintf(unit, sizeof unit, "hour");
  } else {
    std::snprintf(unit, sizeof unit, "%g s", in.unit_s);
  }
  char model[320];
  std::snprintf(model, sizeof model,
                " [reliability model: per node-%s hardware %g, software %g, per rack-%s %g, "
                "Weibull shape %g; docs/reliability.md]",
                unit, in.rates.hardware.rate, in.rates.software.rate, unit, in.rates.rack.rate,
                in.rates.hardware.shape);
  std::string chosen = rec.ranked[0].policy;
  std::string reason;
  if (rec.ranked[0].cost.fits) {
    reason = "auto chose " + rec.reason;
  } else {
    chosen = "none";
    reason =
        "auto: nothing fits the budgets: no redundancy (node failures need the durable "
        "tier); " +
        rec.reason;
  }
  size_t index = plans.size();
  for (size_t i = 0; i < structures.size(); ++i) {
    if (structures[i].policy == chosen) index = i;
  }
  if (index == plans.size()) {  // "none" was not a candidate or did not plan
    MEMENTO_ASSIGN_OR_RETURN(topo::Policy p, topo::ParsePolicy("none"));
    p.local_copy = policy.local_copy;
    p.host_bytes_per_node = policy.host_bytes_per_node;
    p.copy_bytes_per_node = policy.copy_bytes_per_node;
    p.network_bytes_per_node = policy.network_bytes_per_node;
    MEMENTO_ASSIGN_OR_RETURN(topo::Plan none, topo::MakePlan(topology, inventory, p));
    plans.push_back(std::move(none));
  }
  topo::Plan plan = std::move(plans[index]);
  if (plan.protection == 0 && topology.num_nodes() > 1 && chosen != "none") {
    reason += "; protection 0 because the topology offers no second failure domain";
  }
  plan.reason = reason + skipped + model;
  if (rec_out != nullptr) *rec_out = std::move(rec);
  return plan;
}

}  // namespace memento::model
