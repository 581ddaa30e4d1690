// JSON form of plans and recovery plans (docs/planner.md, "JSON"). Field names
// follow the structs in plan.h; ids are indices into the top-level arrays.
#pragma once

#include <nlohmann/json.hpp>

#include "memento/status.h"
#include "topo/plan.h"

namespace memento::topo {

nlohmann::json PlanToJson(const Plan& plan);
// InvalidArgument naming the field when the document is not a plan.
[[nodiscard]] Result<Plan> PlanFromJson(const nlohmann::json& doc);

nlohmann::json RecoveryToJson(const Plan& plan, const RecoveryPlan& recovery);

}  // namespace memento::topo
