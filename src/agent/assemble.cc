#include "agent/assemble.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "recover/recipe.h"
#include "recover/recover.h"
#include "shm/slot.h"
#include "topo/save_ranges.h"

namespace memento::agent {

Result<shm::PlanReply> PlanReplyFor(const ClusterPlan& cp, int rank, bool sharded,
                                    bool client_parity) {
  if (rank < 0 || rank >= static_cast<int>(cp.inventory.size())) {
    return InvalidArgumentError(
        fmt::format("rank {} is not in the plan ({} ranks)", rank, cp.inventory.size()));
  }
  shm::PlanReply reply;
  reply.plan_hash = fmt::format("{:016x}", cp.hash);
  if (!sharded) return reply;
  const std::vector<TensorMeta>& tensors = cp.inventory[static_cast<size_t>(rank)];
  // Whole tensors when the rank's ranges cover every byte of its state,
  // its parity inputs included (the agent then encodes from the whole slot).
  MEMENTO_ASSIGN_OR_RETURN(std::vector<topo::Segment> with_inputs,
                           topo::RankSaveRanges(cp.plan, rank, tensors));
  if (topo::CoversEveryTensor(with_inputs, tensors)) return reply;  // whole tensors
  std::vector<topo::Segment> ranges = std::move(with_inputs);
  if (client_parity) {
    MEMENTO_ASSIGN_OR_RETURN(ranges, topo::RankSaveRanges(cp.plan, rank, tensors,
                                                          /*parity_inputs=*/false));
    for (uint32_t pid : cp.plan.ranks[static_cast<size_t>(rank)].parities) {
      const topo::Parity& par = cp.plan.parities[pid];
      const topo::Stripe& stripe = cp.plan.stripes[par.stripe];
      shm::PlanParity p;
      p.id = par.id;
      p.xor_code = stripe.xor_code;
      p.k = stripe.k;
      p.f = stripe.f;
      p.index = par.index;
      p.block_bytes = stripe.block_bytes;
      for (std::vector<topo::Segment>& block : topo::StripeBlockSegments(cp.plan, stripe)) {
        std::vector<shm::SaveRange> b;
        for (topo::Segment& s : block) {
          b.push_back(shm::SaveRange{std::move(s.tensor), s.offset, s.length});
        }
        p.blocks.push_back(std::move(b));
      }
      reply.parities.push_back(std::move(p));
    }
  }
  // A slot of no byte (only zero-byte tensors listed, no parity) could not
  // be told from an empty whole-tensor slot: such a rank keeps whole tensors.
  if (reply.parities.empty() && std::none_of(ranges.begin(), ranges.end(),
                                             [](const topo::Segment& s) { return s.length > 0; })) {
    reply.parities.clear();
    return reply;
  }
  reply.sharded = true;
  reply.ranges.reserve(ranges.size());
  for (topo::Segment& s : ranges) {
    reply.ranges.push_back(shm::SaveRange{std::move(s.tensor), s.offset, s.length});
  }
  return reply;
}

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

std::optional<std::vector<TensorMeta>> SealedTensors(int rank, const std::string& manifest) {
  auto tensors = shm::ParseManifest(manifest);
  if (!tensors.ok()) {
    MEMENTO_LOG_ERROR("rank {} sealed with an unreadable manifest: {}", rank,
                      tensors.status().ToString());
    return std::nullopt;
  }
  std::vector<TensorMeta> metas;
  for (const shm::SavedTensor& t : *tensors) metas.push_back(t.meta);
  return metas;
}

}  // namespace memento::agent
