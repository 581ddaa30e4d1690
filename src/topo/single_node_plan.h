// The plan of a job whose ranks all run on one node, for the single-node
// agent (`memento agent --topology` without --store; docs/reft.md section
// 1, "Single-node jobs"). Pure function; no I/O.
//
// Thread safety: pure and reentrant.
#pragma once

#include "memento/status.h"
#include "topo/plan.h"

namespace memento::topo {

// REFT's global parameter sharding (REFT 4.1) at rank granularity: the
// node-level planner (MakePlan) gives a sharding group whose DP ranks all
// share one node a single replicated piece, copied by its lowest-dp rank,
// because its ring has one node. Here that piece is cut into one piece per
// DP rank of the group (keys "sg<g>/r<i>", piece i copied by the group's
// i-th DP rank, cuts at multiples of kPieceAlignment of the piece's bytes),
// so each of the D ranks copies about 1/D of the replicated state. dp_sharded
// and private state stay one piece per rank. No redundancy (policy none):
// another copy in the same node's memory does not survive the node, and a
// rank's pieces survive its process in shared memory.
// InvalidArgument as MakePlan, and when the topology spans more than one
// node.
[[nodiscard]] Result<Plan> MakeSingleNodePlan(const Topology& topology, const Inventory& inventory);

}  // namespace memento::topo
