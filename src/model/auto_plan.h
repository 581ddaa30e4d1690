// Policy `auto`: the protection the reliability model recommends for this job.
//
// Every candidate policy is planned for the job's topology and inventory
// (topo::MakePlan); a plan whose largest node exceeds a budget of the policy
// (host bytes per node, device -> host bytes or bytes received from peers per
// snapshot) is excluded; the others are ranked by goodput (Recommend, with the
// plans' structures and the largest node's unique state) and the best one's
// plan is returned, its `reason` saying why (the ranking, the durable interval
// and every exclusion). When nothing fits: `none`. The launcher, every agent
// and `memento plan layout` call this one function with the budgets of the
// job's topology, so they reach the same plan (plan hash). docs/reliability.md.
//
// Thread safety: a pure function.
#pragma once

#include <string>
#include <vector>

#include "memento/status.h"
#include "model/recommend.h"
#include "model/reliability.h"
#include "topo/plan.h"

namespace memento::model {

struct AutoInputs {
  // Per node-day (unit_s), Weibull shape 1: REFT's hardware and software
  // rates, the defaults of `memento plan reliability`.
  FailureRates rates{{1e-4, 1.0}, {1e-5, 1.0}, {0.0, 1.0}};
  double unit_s = 86400;
  double threshold = 0.9;
  // Speeds and times (defaults or `--bench` files); state_bytes_per_node and
  // the budgets are replaced by the plan's and the policy's.
  ClusterFigures figures;
  std::vector<std::string> candidates = {"none", "replicate", "xor", "rs:2"};
};

// topo::MakePlan for a concrete policy; for Scheme::kAuto the model's choice
// as above (`rec`, when given, receives the ranking). InvalidArgument as
// topo::MakePlan, or when no candidate can be planned.
[[nodiscard]] Result<topo::Plan> MakeJobPlan(const topo::Topology& topology,
                                             const topo::Inventory& inventory,
                                             const topo::Policy& policy,
                                             const AutoInputs& in = AutoInputs(),
                                             Recommendation* rec = nullptr);

}  // namespace memento::model
