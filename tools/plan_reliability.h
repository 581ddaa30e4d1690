// `memento plan reliability` (tools/cmd_plan_reliability.cc), added to the
// `plan` command by cmd_plan.cc.
#pragma once

#include <string>

#include "memento/status.h"
#include "model/recommend.h"
#include "tools/command.h"

namespace memento::tools {

void SetupPlanReliability(CLI::App* plan, CommandContext& ctx);

// Reads `memento bench recover|persist|overhead --json` output into the
// cluster figures of the recommendation; InvalidArgument naming the file and
// the missing field.
[[nodiscard]] Status ApplyBenchFile(const std::string& path, model::ClusterFigures& f);

}  // namespace memento::tools
