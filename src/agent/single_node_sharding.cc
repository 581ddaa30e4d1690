#include "agent/single_node_sharding.h"

#include <utility>

#include "agent/assemble.h"
#include "common/log.h"
#include "fmt/format.h"
#include "shm/slot.h"
#include "topo/single_node_plan.h"

namespace memento::agent {
namespace {

// recover::ByteReader over this node's T0 slots only: in a single-node job
// every piece lies in a local rank's slot, so nothing is read over the
// network (REFT-load step 2 within one node).
class LocalPieceReader final : public recover::ByteReader {
 public:
  LocalPieceReader(PieceReader* pieces, const topo::Plan* plan) : pieces_(pieces), plan_(plan) {}
  Status Read(int node, const recover::ReadRequest& req, void* dst, Deadline deadline) override {
    (void)node;
    (void)deadline;
    if (req.source.kind != recover::SourceKind::kPiece) {
      return FailedPreconditionError(
          fmt::format("a single-node job holds no redundancy: cannot read {} {}",
                      recover::SourceKindName(req.source.kind), req.source.id));
    }
    return pieces_->ReadPiece(*plan_, req.source.id, req.step, req.offset, req.length, dst);
  }

 private:
  PieceReader* const pieces_;
  const topo::Plan* const plan_;
};

}  // namespace

Result<std::unique_ptr<SingleNodeSharding>> SingleNodeSharding::Create(topo::JobTopology topology,
                                                                       std::string job_id,
                                                                       shm::NodeStore* store) {
  MEMENTO_RETURN_IF_ERROR(topology.topology.Validate());
  if (topology.topology.num_nodes() != 1) {
    return InvalidArgumentError(fmt::format(
        "a single-node agent (no --store) plans a topology of one node, node 0; 'rank_node' "
        "names {} nodes",
        topology.topology.num_nodes()));
  }
  if (store->options().node != 0) {
    return InvalidArgumentError(fmt::format(
        "a single-node agent with a topology must be node 0 (its ranks' 'rank_node'), not node {}",
        store->options().node));
  }
  return std::unique_ptr<SingleNodeSharding>(
      new SingleNodeSharding(std::move(topology), std::move(job_id), store));
}

SingleNodeSharding::SingleNodeSharding(topo::JobTopology topology, std::string job_id,
                                       shm::NodeStore* store)
    : topology_(std::move(topology)), job_id_(std::move(job_id)), store_(store) {}

void SingleNodeSharding::OnSeal(int rank, const std::string& manifest) {
  std::optional<std::vector<TensorMeta>> sealed = SealedTensors(rank, manifest);
  if (!sealed) return;
  std::vector<TensorMeta> metas = std::move(*sealed);
  const int ranks = topology_.topology.num_ranks();
  MutexLock l(&mu_);
  auto it = tensors_.find(rank);
  if (it != tensors_.end() && it->second == metas && (plan_ != nullptr || !plan_error_.ok())) {
    return;  // the same tensors again (a restarted trainer): the plan stands
  }
  tensors_[rank] = std::move(metas);
  if (static_cast<int>(tensors_.size()) < ranks) return;
  topo::Inventory inventory(ranks);
  for (const auto& [r, m] : tensors_) {
    if (r >= 0 && r < ranks) inventory[r] = m;
  }
  auto plan = topo::MakeSingleNodePlan(topology_.topology, inventory);
  if (!plan.ok()) {
    plan_ = nullptr;
    plan_error_ = plan.status();
    MEMENTO_LOG_ERROR("single-node plan: {}; the ranks save whole tensors",
                      plan.status().ToString());
    return;
  }
  plan_error_ = Status::Ok();
  plan_ = MakeClusterPlan(std::move(*plan), std::move(inventory));
  MEMENTO_LOG_INFO(
      "single-node plan {:016x}: {} ranks (dp {} tp {} pp {}), {} pieces, {} bytes of state; "
      "sharded snapshots {}",
      plan_->hash, ranks, topology_.topology.dp, topology_.topology.tp, topology_.topology.pp,
      plan_->plan.pieces.size(), plan_->plan.total_state_bytes,
      topology_.sharded ? "on" : "off (the topology does not say \"sharded\": true)");
}

Result<std::shared_ptr<const ClusterPlan>> SingleNodeSharding::Plan() {
  MutexLock l(&mu_);
  if (plan_ != nullptr) return plan_;
  if (!plan_error_.ok()) return plan_error_;
  std::vector<int> missing;
  for (int r = 0; r < topology_.topology.num_ranks(); ++r) {
    if (tensors_.count(r) == 0) missing.push_back(r);
  }
  return FailedPreconditionError(
      fmt::format("the single-node agent has no plan yet: rank(s) [{}] of {} have not sealed",
                  fmt::join(missing, ", "), topology_.topology.num_ranks()));
}

Result<shm::PlanReply> SingleNodeSharding::SaveRanges(int rank, bool client_parity) {
  if (rank < 0 || rank >= topology_.topology.num_ranks()) {
    return InvalidArgumentError(fmt::format("rank {} is not in the agent's topology ({} ranks)",
                                            rank, topology_.topology.num_ranks()));
  }
  auto cp = Plan();
  if (!cp.ok()) {
    // "Not ready": this snapshot writes whole tensors, the next asks again.
    if (cp.status().code() == StatusCode::kFailedPrecondition) {
      return UnavailableError("not ready: " + cp.status().message());
    }
    return cp.status();
  }
  return PlanReplyFor(**cp, rank, topology_.sharded, client_parity);
}

Result<shm::AssembleReply> SingleNodeSharding::Assemble(int rank, int64_t step,
                                                        double plan_wait_s) {
  const Deadline deadline = Deadline::AfterSeconds(300);
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> cp,
                           WaitForPlan([this] { return Plan(); }, plan_wait_s, deadline));
  // A reader of its own: every chunk the pieces lie in is verified in this
  // assembly, never taken as good from an earlier read of the same slot
  // generation (bytes can rot at rest in between; PieceReader's cache).
  PieceReader pieces(store_->options().root, job_id_, store_);
  LocalPieceReader reader(&pieces, &cp->plan);
  return AssembleRank(*cp, job_id_, rank, step, reader, *store_, deadline);
}

}  // namespace memento::agent
