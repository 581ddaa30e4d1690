// JobMember: the save path of one version (docs/cluster.md): the hold and
// the trainers' claims, the local ranks' T0 slots, T1 production, the
// COMPLETED report; and the `plan` op's save ranges.

#include "agent/assemble.h"
#include "agent/job_member.h"
#include "agent/thread_cpu.h"
#include "common/log.h"
#include "coord/keys.h"
#include "fmt/format.h"
#include "shm/slot.h"

namespace memento::agent {

// ---- the save path of one version -------------------------------------------------------------

Result<std::string> JobMember::NodeEndpoint(int node) {
  coord::JobKeys keys(job_);
  MEMENTO_ASSIGN_OR_RETURN(coord::KeyValue kv, store_->Get(keys.Node(coord::NodeName(node)),
                                                           Deadline::AfterSeconds(kStoreCallS)));
  return kv.value;
}

bool JobMember::Produce(int64_t step) {
  // 1. Hold first, then look at the claims (shm/commit_word.h): a trainer
  //    that already decided to overwrite a slot of `step` wins.
  hold_->Set(step);
  for (int r : local_ranks_) {
    if (hold_->Claimed(r, step)) {
      Abandon(step, fmt::format("rank {} is overwriting its slot of it", r));
      return false;
    }
  }
  // 2. The local ranks' slots of `step`.
  std::map<int, RankSlotView> views;
  for (int r : local_ranks_) {
    RankSlotView v;
    v.rank = r;
    for (int slot = 0; slot < shm::kSlotsPerRank && v.slot < 0; ++slot) {
      auto seg = node_store_->SlotSegment(r, slot);
      if (seg == nullptr) continue;
      auto info = shm::ReadSlot(*seg);
      if (info.ok() && info->state == shm::SlotState::kComplete && info->step == step) {
        v.slot = slot;
        v.segment = std::move(seg);
        v.info = std::move(*info);
      }
    }
    if (v.slot < 0) {
      Abandon(step, fmt::format("rank {} no longer holds it", r));
      return false;
    }
    // The T0 bytes the redundancy is made of must be right.
    const double verify_cpu0 = ThreadCpuSeconds();
    Status st = shm::VerifySlotData(*v.segment, v.info);
    {
      MutexLock l(&mu_);
      stats_.t0_verify_cpu_s += ThreadCpuSeconds() - verify_cpu0;
    }
    if (!st.ok()) {
      Abandon(step, fmt::format("rank {} slot {}: {}", r, v.slot, st.ToString()));
      return false;
    }
    views.emplace(r, std::move(v));
  }
  auto unchanged = [&]() -> std::string {
    for (const auto& [r, v] : views) {
      if (!shm::SlotUnchanged(*v.segment, v.info)) {
        return fmt::format("rank {} rewrote slot {} while it was read", r, v.slot);
      }
    }
    return "";
  };
  // 3. Own entries, then the copies peers hold of this node's pieces.
  Status st = red_->Ensure(step);
  if (st.ok()) st = producer_->ProduceEntries(step, views);
  if (st.ok()) {
    st = producer_->PushCopies(
        step, views, options_.hold_timeout_s,
        [this, step] { return !Dead(step) && committed_.load() < step; },
        [this](uint64_t bytes) {
          MutexLock l(&mu_);
          stats_.pushed_bytes += static_cast<int64_t>(bytes);
        },
        [this](uint32_t copy, int64_t s) { return AorHeld(copy, s); });
  }
  if (!st.ok()) {
    Abandon(step, st.ToString());
    return false;
  }
  std::string changed = unchanged();
  if (!changed.empty()) {
    Abandon(step, changed);
    return false;
  }
  // 4. Every entry of `step`, the ones peers push included.
  Deadline deadline = Deadline::AfterSeconds(options_.hold_timeout_s);
  while (!red_->Complete(step)) {
    if (AorReplicaChanged(step)) {
      // A replica's copy of this step was not made (its bytes changed in
      // memory): refused now; the step is abandoned unless a push of the
      // copy came.
      st = RefuseChangedAorReplicas(step);
      if (!st.ok()) {
        Abandon(step, st.ToString());
        return false;
      }
    }
    if (deadline.expired() || committed_.load() >= step || Dead(step)) {
      if (Dead(step)) {
        Abandon(step, "another node skipped it");
      } else {
        const std::string missing = MissingCopies(step);
        Abandon(step, "the copies peers push of it did not all arrive" +
                          (missing.empty() ? std::string() : " (missing: " + missing + ")"));
      }
      return false;
    }
    MutexLock l(&mu_);
    if (stop_) return false;
    // Woken by the peer service when a pushed copy is finished.
    cv_.WaitUntil(&l, Now() + std::chrono::milliseconds(20));
  }
  changed = unchanged();
  if (!changed.empty()) {
    Abandon(step, changed);
    return false;
  }
  // 4b. AOR: the replicas this node computed of `step` against their
  //     owners' checksums; an entry made from one that differs is not kept.
  st = CheckAorCopies(step);
  if (!st.ok()) {
    Abandon(step, st.ToString());
    return false;
  }
  // 5. COMPLETED. The hold stays until `step` (or a newer one) commits or
  //    the hold timeout passes.
  const double report_cpu0 = ThreadCpuSeconds();
  st = membership_->SetSignal(coord::NodeSignal::kCompleted, step, "",
                              Deadline::AfterSeconds(kStoreCallS));
  if (st.ok()) {
    st = coord::ReportCompleted(*store_, job_, node_name_, step,
                                Deadline::AfterSeconds(kStoreCallS), epoch_.load());
  }
  {
    MutexLock l(&mu_);
    stats_.report_cpu_s += ThreadCpuSeconds() - report_cpu0;
  }
  if (!st.ok()) {
    Abandon(step, "reporting it: " + st.ToString());
    return false;
  }
  last_reported_ns_.store(SteadyNowNs());
  last_reported_.store(step);
  {
    MutexLock l(&mu_);
    ++stats_.produced;
  }
  MEMENTO_LOG_DEBUG("step {}: redundancy done, reported COMPLETED", step);
  return true;
}

Result<shm::PlanReply> JobMember::SaveRanges(int rank, bool client_parity, int64_t step) {
  std::shared_ptr<const ClusterPlan> cp;
  bool sharded = false;
  {
    MutexLock l(&plan_mu_);
    cp = cluster_plan_;
    sharded = sharded_;
  }
  // Until this answer says otherwise, the rank's slots hold no parity entry.
  red_->SetClientParity(rank, -1, 0);
  if (cp == nullptr) {
    return UnavailableError(
        fmt::format("not ready: node {} has no plan yet (waiting for the topology and every rank's "
                    "inventory)",
                    node_));
  }
  Result<shm::PlanReply> reply = PlanReplyFor(*cp, rank, sharded, client_parity);
  if (reply.ok() && !reply->parities.empty() && step >= 0) {
    // From `step` on its slots hold the parities the rank produces: the
    // versions reference them (docs/reft.md section 4).
    red_->SetClientParity(rank, step, cp->hash);
  }
  return reply;
}

}  // namespace memento::agent
