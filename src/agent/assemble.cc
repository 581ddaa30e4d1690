#include "agent/assemble.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/log.h"
#include "recover/recipe.h"
#include "recover/recover.h"

namespace memento::agent {

Result<shm::AssembleReply> AssembleRank(const ClusterPlan& cp, const std::string& job_id, int rank,
                                        int64_t step, recover::ByteReader& reader,
                                        shm::NodeStore& store, Deadline deadline,
                                        const AssembleOptions& options) {
  const topo::Plan& plan = cp.plan;
  const int node = store.options().node;
  if (rank < 0 || rank >= static_cast<int>(plan.ranks.size()) ||
      rank >= static_cast<int>(cp.inventory.size())) {
    return InvalidArgumentError(
        fmt::format("assemble: rank {} is not in the plan ({} ranks)", rank, plan.ranks.size()));
  }
  if (plan.ranks[rank].node != node) {
    return InvalidArgumentError(
        fmt::format("assemble: rank {} runs on node {}, not on this node {}", rank,
                    plan.ranks[rank].node, node));
  }
  MEMENTO_ASSIGN_OR_RETURN(recover::Recipe recipe, recover::PrimaryRecipe(plan, rank, step));
  recover::RankAssembly a;
  a.rank = rank;
  a.node = node;
  a.recipe = recover::RecipeToJson(recipe);
  const std::string path = shm::AssembledSlotPath(store.options().root, rank);
  recover::ExecuteOptions eo;
  eo.threads = options.threads;
  eo.chunk_bytes = options.chunk_bytes;
  eo.stage_path = [&path](int) { return path; };
  auto stats = recover::ExecuteAssembliesWithOptions(plan, cp.inventory, job_id, step, {a}, reader,
                                                     store, deadline, eo);
  if (!stats.ok()) {
    unlink(path.c_str());  // a half-written staging file is never used
    return stats.status().WithContext(
        fmt::format("assembling rank {} at step {} on node {}", rank, step, node));
  }
  MEMENTO_LOG_INFO("assemble: rank {} step {}: {} bytes ({} read) in {:.3f} s", rank, step,
                   stats->bytes, stats->read_bytes, stats->total_s);
  return shm::AssembleReply{path, stats->bytes};
}

}  // namespace memento::agent
