// Recovery after a failure (REFT-load, DESIGN.md "Recovery path"):
//
//   Decide()             pure planner: from the plan and the inventories of the
//                        live agents, the newest committed version that memory
//                        can rebuild, and for every rank whose T0 slot of it is
//                        missing or corrupt, where each of its bytes comes from
//                        (its pieces' primary nodes, a copy, or a decode).
//   ExecuteAssemblies()  on the agent of the node that must rebuild ranks:
//                        reads through a ByteReader (parallel), decodes with
//                        the codecs, writes each rank's complete, verified T0
//                        slot in the node's shared memory.
//
// docs/recovery.md. Thread safety: Decide is pure and reentrant;
// ExecuteAssemblies uses its own worker threads and the thread-safe ByteReader.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"
#include "recover/source.h"
#include "shm/node_store.h"
#include "topo/plan.h"

namespace memento::recover {

// xxHash3 of topo::PlanToJson(plan).dump(): agents and the launcher compare it
// to make sure they act on the same plan.
uint64_t PlanHash(const topo::Plan& plan);

// How to rebuild one rank's whole T0 slot (every tensor it registered) at a
// version. Produced by Decide, serialised to the agent of `node`.
struct RankAssembly {
  int rank = -1;
  int node = -1;
  // Implementation-defined recipe (which ranges come from which node's
  // piece, copy or parity, and which are decoded); see recover.cc.
  nlohmann::json recipe;
};

struct Decision {
  bool from_memory = false;              // a version memory can rebuild was found
  int64_t step = -1;                     // that version
  std::vector<int> lost_nodes;           // nodes without usable holdings of `step`
  std::vector<RankAssembly> assemblies;  // ranks to rebuild, grouped by node
  // In words: why this step (or why none: names the pieces memory cannot
  // rebuild and what was lost), for the log and `memento inspect`.
  std::string reason;
};

// `live`: the inventories of the agents that answered (a node with no entry is
// lost). `committed`: the newest step known committed (store or CommitLog).
// Chooses the newest committed step <= `committed` that every rank can be
// restored at: from its own T0 slot when intact there, else rebuilt. Never
// mixes versions. from_memory=false (OK status) when no step can be rebuilt.
[[nodiscard]] Result<Decision> Decide(const topo::Plan& plan,
                                      const std::vector<NodeInventory>& live, int64_t committed);

// The same with `plan_hash` == PlanHash(plan) computed once by the caller:
// hashing serialises the whole plan (about 0.25 s per 1000 ranks), most of
// Decide's time on a large plan.
[[nodiscard]] Result<Decision> Decide(const topo::Plan& plan, uint64_t plan_hash,
                                      const std::vector<NodeInventory>& live, int64_t committed);

// What recovery would do if exactly `failed_nodes` were lost and every other
// node held all the plan gives it, intact, at one version: per piece whose
// primary node failed, where its bytes come from (a copy, or a decode from
// surviving stripe blocks), or why memory cannot rebuild it. This is what
// `memento plan --fail` and `plan`'s whole-rack check print. It runs the
// source planner Decide runs (the same per-plan indexes and source choice),
// so the plan tool cannot disagree with recovery (recover_test,
// PlanToolAgreesWithRecovery). Pure and deterministic. InvalidArgument for a
// node id out of range.
[[nodiscard]] Result<topo::RecoveryPlan> PlanFailure(const topo::Plan& plan,
                                                     const std::vector<int>& failed_nodes);

nlohmann::json DecisionToJson(const Decision& d);
[[nodiscard]] Result<Decision> DecisionFromJson(const nlohmann::json& j);

struct AssemblyStats {
  std::vector<int> ranks;
  uint64_t bytes = 0;       // bytes written into T0 slots
  uint64_t read_bytes = 0;  // bytes read through the ByteReader
  double transfer_s = 0;
  double decode_s = 0;
  double write_s = 0;
  double total_s = 0;
};
nlohmann::json AssemblyStatsToJson(const AssemblyStats& s);

// Rebuilds the T0 slots of `assemblies` (all for this node) at `step`:
// layout from `inventory` (each rank's registered tensors, as the client
// computes it), bytes through `reader`, decode with the codecs, checksums, and
// the slot left complete (crash-consistent: a crash mid-way leaves it not
// complete). Overwrites only slots that do not hold `step` intact.
[[nodiscard]] Result<AssemblyStats> ExecuteAssemblies(const topo::Plan& plan,
                                                      const topo::Inventory& inventory,
                                                      const std::string& job_id, int64_t step,
                                                      const std::vector<RankAssembly>& assemblies,
                                                      ByteReader& reader, shm::NodeStore& store,
                                                      Deadline deadline);

}  // namespace memento::recover
