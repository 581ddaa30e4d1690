// The placement picture of `memento plan layout --svg`: one row per sharding
// group (groups with equal node sets share a row), each node a box in ring
// order with its rack, its pieces, copies and parities (counts and bytes);
// nodes from `--fail` drawn lost; and for a recovery, one arrow per
// (survivor, lost node, copy|decode) saying which survivor sends what.
//
// SVG elements a reader (or a test) can rely on:
//   <g class="node" data-node="N" data-rack="R">, class "node lost" when lost;
//   <g class="group" data-nodes="a,b,c">, one per row;
//   <path class="rebuild" data-from="S" data-to="L" data-kind="copy|decode">.
//
// Thread safety: pure function.
#pragma once

#include <string>

#include "topo/plan.h"

namespace memento::model {

// `recovery` may be null (no failure set given).
std::string RenderLayoutSvg(const topo::Plan& plan, const topo::RecoveryPlan* recovery);

}  // namespace memento::model
