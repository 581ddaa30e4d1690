// Sharded snapshots for a single-node agent (no --store; docs/reft.md
// section 1, "Single-node jobs"). Given the job's topology (`memento agent
// --topology` without --store: every rank on this node), the agent plans
// once every rank of the topology has sealed (its tensors come with `seal`):
// topo::MakeSingleNodePlan cuts each sharding group's replicated state into
// one piece per DP rank, so each of D ranks copies about 1/D of it. The
// `plan` op answers each rank its ranges (PlanReplyFor, as in cluster mode);
// the `assemble` op builds a rank's whole state at a step from its own
// pieces and the other local ranks' pieces in this node's shared memory
// (PieceReader: every chunk the bytes lie in verified against its source
// slot's checksum during that assembly; no network) into the staging file the client restores
// from. Without "sharded": true in the record, or with DP = 1, the plan op
// answers whole tensors as before.
//
// Thread safety: thread-safe (the agent's connection threads call it).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/peer_service.h"
#include "agent/piece_reader.h"
#include "common/mutex.h"
#include "memento/status.h"
#include "shm/agent_messages.h"
#include "shm/node_store.h"
#include "topo/topology_json.h"

namespace memento::agent {

class SingleNodeSharding {
 public:
  // InvalidArgument when `topology` places a rank on another node than 0
  // (a single-node job's agent is node 0) or `store` is not node 0's.
  // `store` outlives this object.
  static Result<std::unique_ptr<SingleNodeSharding>> Create(topo::JobTopology topology,
                                                            std::string job_id,
                                                            shm::NodeStore* store);

  // A rank sealed with `manifest` (shm::ParseManifest text: its registered
  // tensors). Once every rank of the topology has, the plan is (re)made.
  void OnSeal(int rank, const std::string& manifest) EXCLUDES(mu_);

  // The `plan` op: the rank's ranges, or whole tensors (sharded false).
  // Unavailable ("not ready", naming the ranks not sealed yet) until the plan
  // exists; InvalidArgument for a rank outside the topology; the planner's
  // error when the ranks' tensors cannot be planned (e.g. replicated tensors
  // that differ between DP ranks).
  [[nodiscard]] Result<shm::PlanReply> SaveRanges(int rank, bool client_parity) EXCLUDES(mu_);

  // The `assemble` op (AssembleRank over this node's slots). Waits for the
  // plan at most `plan_wait_s` (ranks seal one by one after a restart).
  [[nodiscard]] Result<shm::AssembleReply> Assemble(int rank, int64_t step,
                                                    double plan_wait_s = kDefaultPlanWaitS)
      EXCLUDES(mu_);

 private:
  SingleNodeSharding(topo::JobTopology topology, std::string job_id, shm::NodeStore* store);
  // The plan, or FailedPrecondition naming the ranks not sealed yet (or
  // why the last planning failed).
  Result<std::shared_ptr<const ClusterPlan>> Plan() EXCLUDES(mu_);

  const topo::JobTopology topology_;
  const std::string job_id_;
  shm::NodeStore* const store_;
  Mutex mu_;
  std::map<int, std::vector<TensorMeta>> tensors_ GUARDED_BY(mu_);  // by rank, from seal
  std::shared_ptr<const ClusterPlan> plan_ GUARDED_BY(mu_);
  Status plan_error_ GUARDED_BY(mu_);  // why the last planning failed
};

}  // namespace memento::agent
