// What a node holds in host memory, measured from its root after (or while)
// a job runs, next to what the plan says it should hold (issue 15: REFT's
// per-node bytes). Used by `memento launch` (the summary's `memory`) and
// `memento bench memory` (docs/reft.md, section 6).
//
// Reads slot files and redundancy entries read-only; a slot being rewritten
// is skipped for one that is complete and unchanged (shm::FindNewestCompleteSlot).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"
#include "topo/plan.h"

namespace memento::launch {

struct NodeMemory {
  int node = -1;
  // One version (`step`): the data bytes of each rank's slot of it (what
  // the node's ranks copy per snapshot), and the node's `red.<step>` entries
  // (T1, headers included).
  int64_t step = -1;
  uint64_t t0_bytes = 0;
  uint64_t t1_bytes = 0;
  // T1 entries of that version resident in T0 (docs/reft.md section 4):
  // their bytes are counted in t0_bytes (the producer's slot), not again in
  // t1_bytes; the sum of those entries' sizes.
  uint64_t t1_resident_bytes = 0;
  // The ranks' whole registered state: what a save path that does not shard
  // copies (the slots' manifests; from the plan once AddPlanBytes ran, since
  // a sharded slot does not name every tensor).
  uint64_t full_bytes = 0;
  // Every file under the root, allocated bytes (both slots of every rank,
  // every version the agent still holds, the commit word).
  uint64_t resident_bytes = 0;
  // The plan's bytes of this node (REFT's formulas); all 0 without a plan.
  uint64_t plan_piece_bytes = 0, plan_copy_bytes = 0, plan_parity_bytes = 0;
  uint64_t plan_total_bytes() const {
    return plan_piece_bytes + plan_copy_bytes + plan_parity_bytes;
  }

  nlohmann::json ToJson() const;
  std::string ToString() const;  // one line
};

// Measures version `step` (a committed step: complete in T0 and T1 on
// every node; -1: each rank's newest complete slot and the newest T1 version)
// of node `node`'s root `root` for the ranks `ranks`. When `inventory` is not
// null, the tensors of each rank's slot are stored at (*inventory)[rank]
// (REQUIRES: large enough; a sharded slot names only the tensors it holds
// ranges of). NotFound when a rank has no complete slot of the
// step; the root's other errors as they come.
[[nodiscard]] Result<NodeMemory> MeasureNodeMemory(int node, const std::string& root,
                                                   const std::vector<int>& ranks, int64_t step,
                                                   topo::Inventory* inventory = nullptr);

// Fills the plan's bytes of `m->node`, and full_bytes from the plan.
void AddPlanBytes(const topo::Plan& plan, NodeMemory* m);

// REFT's formula for what one sharding-group member holds per version under
// `policy` (docs/reft.md, "Notation"; W = the group's replicated bytes, m =
// its nodes, O_r / P_r = the rank's dp_sharded / private bytes), e.g.
// "xor: W/m + W/(m(m-1)) + O_r + a peer's shard + P_r + a peer copy". The
// plan's NodePlan bytes are this formula evaluated (topo_test).
std::string ReftFormula(const topo::Policy& policy);

}  // namespace memento::launch
