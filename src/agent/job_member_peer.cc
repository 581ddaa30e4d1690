// JobMember: the peer service (the node's RPC server: reads, pushes, the
// restore target), the slots preallocated before the join, and the
// `assemble` op.

#include "agent/assemble.h"
#include "agent/job_member.h"
#include "agent/thread_cpu.h"
#include "common/clock.h"
#include "common/human.h"
#include "common/log.h"
#include "common/tensor_json.h"
#include "coord/keys.h"
#include "fmt/format.h"
#include "net/socket.h"
#include "recover/recover.h"
#include "shm/slot.h"
#include "topo/topology_json.h"

namespace memento::agent {

// ---- peer service ------------------------------------------------------------

void JobMember::PreallocateSlots() {
  Stopwatch sw;
  const double cpu0 = ThreadCpuSeconds();
  coord::JobKeys keys(job_);
  auto topo_kv = store_->Get(keys.Topology(), Deadline::AfterSeconds(kStoreCallS));
  if (!topo_kv.ok()) return;  // a job that has not started: the seals allocate
  auto ct = topo::ParseJobTopology(topo_kv->value);
  if (!ct.ok()) return;  // TrySetup reports it
  const int ranks = ct->topology.num_ranks();
  int made = 0;
  uint64_t bytes = 0;
  for (int r = 0; r < ranks && r < static_cast<int>(ct->topology.rank_node.size()); ++r) {
    if (ct->topology.rank_node[r] != node_) continue;
    // A rank with a slot here (adopted from the root) needs none.
    if (node_store_->SlotSegment(r, 0) != nullptr || node_store_->SlotSegment(r, 1) != nullptr) {
      continue;
    }
    auto kv = store_->Get(keys.Inventory(r), Deadline::AfterSeconds(kStoreCallS));
    if (!kv.ok()) continue;  // the rank never registered: nothing to rebuild
    auto metas = ParseTensorList(kv->value);
    if (!metas.ok()) continue;
    // The layout a rebuild writes (recover::ExecuteAssemblies: whole
    // tensors, the executor's chunk size).
    auto layout = shm::ComputeSlotLayout(job_, r, *metas, recover::ExecuteOptions{}.chunk_bytes);
    if (!layout.ok()) continue;
    auto seg = node_store_->EnsureSlot(r, 0, layout->total_bytes);
    if (!seg.ok()) {
      MEMENTO_LOG_WARN(
          "preallocate: slot 0 of rank {} ({}) not made: {}; a recovery allocates it when it "
          "rebuilds the rank",
          r, HumanBytes(layout->total_bytes), seg.status().ToString());
      continue;
    }
    ++made;
    bytes += (*seg)->size();
  }
  if (made == 0) return;
  const double s = sw.Seconds();
  MEMENTO_LOG_INFO(
      "preallocate: {} slot(s) of this node's ranks made before joining, {} in {:.3f} s", made,
      HumanBytes(bytes), s);
  MutexLock l(&mu_);
  stats_.preallocated_slots = made;
  stats_.preallocated_bytes = bytes;
  stats_.preallocate_s = s;
  stats_.preallocate_cpu_s = ThreadCpuSeconds() - cpu0;
}

Status JobMember::StartPeerService() {
  Result<net::HostPort> hp = net::ParseHostPort(options_.listen, net::PortUse::kListen);
  if (!hp.ok()) return hp.status().WithContext("--listen");
  PeerServiceOptions po;
  po.job = job_;
  po.node = node_;
  po.host = hp->host;
  po.port = hp->port;
  po.store = node_store_;
  po.redundancy = red_.get();
  po.max_request_bytes = options_.peer_max_request_bytes;
  po.max_buffered_bytes = options_.peer_max_buffered_bytes;
  po.plan_wait_s = options_.plan_wait_s;
  po.legacy_reads = options_.recover_legacy_reads;
  po.staged_receive = options_.recover_staged_receive;
  po.plan = [this]() -> Result<std::shared_ptr<const ClusterPlan>> {
    MutexLock l(&plan_mu_);
    if (cluster_plan_ == nullptr) {
      return FailedPreconditionError(
          fmt::format("node {} has no plan yet (waiting for the topology and every rank's "
                      "inventory)",
                      node_));
    }
    return cluster_plan_;
  };
  po.endpoint_of = [this](int node) { return NodeEndpoint(node); };
  po.committed = [this] { return committed_.load(); };
  po.on_push_finished = [this](int64_t, recover::ByteSource) { cv_.SignalAll(); };
  po.aor_copies = [this](int64_t step) {
    std::vector<uint32_t> out;
    MutexLock l(&aor_mu_);
    for (const auto& [copy, steps] : aor_entries_) {
      if (steps.count(step) > 0) out.push_back(copy);
    }
    return out;
  };
  po.set_restore_target = [this](int64_t step, uint64_t epoch) {
    SetRestoreTarget(step, epoch);
    return Status::Ok();
  };
  MEMENTO_ASSIGN_OR_RETURN(peer_, PeerService::Start(std::move(po), *token_));
  endpoint_ = peer_->endpoint();
  return Status::Ok();
}

void JobMember::SetPeerPlan() {
  auto cp = MakeClusterPlan(plan_, inventory_);
  if (durable_ != nullptr) durable_->SetClusterPlan(cp);
  MutexLock l(&plan_mu_);
  cluster_plan_ = std::move(cp);
}

Result<shm::AssembleReply> JobMember::Assemble(int rank, int64_t step) {
  const Deadline deadline = Deadline::AfterSeconds(300);
  // Right after this agent restarted, its plan comes back once it has read
  // the topology and the ranks' inventories again: waited for (bounded), as
  // the peers' piece requests wait for it (WaitForPlan).
  MEMENTO_ASSIGN_OR_RETURN(
      std::shared_ptr<const ClusterPlan> cp,
      WaitForPlan(
          [this]() -> Result<std::shared_ptr<const ClusterPlan>> {
            MutexLock l(&plan_mu_);
            if (cluster_plan_ == nullptr || peer_ == nullptr) {
              return FailedPreconditionError(fmt::format(
                  "node {} has no plan yet (waiting for the topology and every rank's inventory)",
                  node_));
            }
            return cluster_plan_;
          },
          options_.plan_wait_s, deadline));
  return AssembleRank(*cp, job_, rank, step, peer_->reader(), *node_store_, deadline);
}

void JobMember::StopPeerService() {
  if (peer_) peer_->Stop();
}

}  // namespace memento::agent
