// `memento plan reliability` (tools/cmd_plan_reliability.cc), added to the
// `plan` command by cmd_plan.cc.
#pragma once

#include "tools/command.h"

namespace memento::tools {

void SetupPlanReliability(CLI::App* plan, CommandContext& ctx);

}  // namespace memento::tools
