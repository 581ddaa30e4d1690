// JobMember: commits and rollbacks (docs/cluster.md). The commit follower's
// callback, abandoned and skipped steps (skipped/<step>/<node>), the restore
// target and commit epochs, and what a restarted store is told again.

#include <algorithm>
#include <iterator>

#include "agent/job_member.h"
#include "common/log.h"
#include "common/tensor_json.h"
#include "coord/keys.h"
#include "fmt/format.h"

namespace memento::agent {

std::string JobMember::SkippedKey(int64_t step) const {
  // In the epoch this node reports in (its completed/ reports carry the
  // same): a skip of step s says nothing about step s of a later epoch.
  return coord::JobKeys(job_).Skipped(step, node_name_, epoch_.load());
}

void JobMember::OnSkipped(int rank, int64_t step) {
  PublishDead(step, fmt::format("rank {} skipped its snapshot", rank));
}

void JobMember::PublishDead(int64_t step, const std::string& why) {
  if (step <= committed_.load()) return;
  {
    MutexLock l(&mu_);
    if (!dead_.insert(step).second) return;  // told already
  }
  cv_.SignalAll();
  auto r = store_->Set(SkippedKey(step), why, Deadline::AfterSeconds(2));
  if (!r.ok())
    MEMENTO_LOG_WARN("could not publish the skip of step {}: {}", step, r.status().ToString());
}

bool JobMember::Dead(int64_t step) {
  MutexLock l(&mu_);
  return dead_.count(step) != 0;
}

int64_t JobMember::RestoreTarget() {
  MutexLock l(&mu_);
  if (restore_target_ >= 0) return restore_target_;
  auto latest = log_->latest();
  return latest ? latest->step : -1;
}

void JobMember::SetRestoreTarget(int64_t step, uint64_t epoch) {
  // The job goes back to `step` and computes the later steps again. Skips
  // and completions of those steps from the failed attempt must not count:
  // a skip of step s keeps s from committing in the new attempt too (seed
  // 0x5f3f57eb of the chaos campaign lost 5 steps that way: every step
  // between the restored one and the next failure had a stale skip).
  // The listing comes first: its revision separates the failed attempt's
  // skip records (erased below, and ignored by the skip watcher however late
  // their events arrive) from the new attempt's. With an epoch, the records
  // name theirs (coord::JobKeys::Skipped): those of an older epoch never
  // count again (even after a store restart, whose revisions start afresh),
  // and those of `epoch` or newer (another node already in the new history
  // skipped a step; its event may have come before this call) are kept.
  coord::JobKeys keys(job_);
  auto listing = store_->List(keys.SkippedPrefix(), Deadline::AfterSeconds(kStoreCallS));
  std::vector<coord::SkippedKey> records;
  if (listing.ok()) {
    for (const auto& kv : listing->kvs) {
      auto k = coord::ParseSkippedKey(keys, kv.key);
      if (k.ok()) records.push_back(std::move(*k));
    }
  }
  size_t forgotten = 0;
  {
    MutexLock l(&mu_);
    restore_target_ = step;
    rollback_ = step;
    rollback_epoch_ = std::max(rollback_epoch_, epoch);
    rollback_pending_ = true;
    if (listing.ok()) rollback_revision_ = std::max(rollback_revision_, listing->revision);
    forgotten = static_cast<size_t>(std::distance(dead_.upper_bound(step), dead_.end()));
    dead_.erase(dead_.upper_bound(step), dead_.end());
    completes_.erase(completes_.upper_bound(step), completes_.end());
    for (const coord::SkippedKey& k : records) {
      if (epoch > 0 && k.epoch >= epoch && k.step > step) dead_.insert(k.step);
    }
  }
  // A hold of a later step would make the trainers skip every snapshot that
  // targets its slot until the hold times out.
  const int64_t hold = hold_->held();
  if (hold > step) hold_->Release(hold);
  // So would a trainer's claim of a later step (it claimed that step's slot
  // to overwrite it in the failed attempt): the new attempt's step of that
  // number would be abandoned as being overwritten, and never commit.
  hold_->ForgetClaimsAbove(step);
  // T1 entries of later steps (made here or pushed by peers) would refuse
  // the new attempt's entries of the same step ("already finished").
  red_->DropAbove(step);
  // The replicas this node keeps are seeded again after the restore: the
  // owners' nodes push their copies until then.
  if (ready_.load()) ForgetAorHeld();
  // This node's skip records of later steps in the abandoned history (the
  // other nodes delete theirs).
  if (listing.ok()) {
    for (const coord::SkippedKey& k : records) {
      if (k.node != node_name_ || k.step <= step || (epoch > 0 && k.epoch >= epoch)) continue;
      store_->Delete(keys.Skipped(k.step, k.node, k.epoch), Deadline::AfterSeconds(kStoreCallS))
          .status()
          .IgnoreError();
    }
  } else {
    MEMENTO_LOG_WARN("restore target {}: cannot list the skip records: {}", step,
                     listing.status().ToString());
  }
  if (epoch > 0) StartEpoch(step, epoch);
  cv_.SignalAll();
  MEMENTO_LOG_INFO("restore target: step {}{}{}", step,
                   epoch > 0 ? fmt::format(" (commit epoch {})", epoch) : std::string(),
                   forgotten > 0 ? fmt::format(" ({} skip(s) of later steps forgotten)", forgotten)
                                 : std::string());
}

bool JobMember::StartEpoch(int64_t step, uint64_t epoch) {
  uint64_t cur = epoch_.load();
  do {
    if (cur >= epoch) return false;
  } while (!epoch_.compare_exchange_weak(cur, epoch));
  // `step` is the newest commit of the new history (it is published as the
  // epoch's first commit): the steps after it are accepted again (the
  // trainers' completions, the copies peers push) though the abandoned
  // history may have committed them.
  const int64_t was = committed_.exchange(step);
  hold_->Commit(step);
  if (durable_ != nullptr) durable_->RestartAt(step);
  MEMENTO_LOG_INFO("commit epoch {} starts at step {} (the newest commit was {})", epoch, step,
                   was);
  return true;
}

// ---- store loss ----------------------------------------------------------------

Status JobMember::OnReregister() {
  const Deadline deadline = Deadline::AfterSeconds(kStoreCallS);
  coord::JobKeys keys(job_);
  // 1. The newest commit this node saw: commit/latest comes back.
  MEMENTO_RETURN_IF_ERROR(coord::RepublishCommits(*store_, job_, *log_, deadline));
  // 2. Inventories: every rank's once this node has the plan (a replacement
  //    node computes its plan from them), else those of its own ranks.
  {
    MutexLock l(&mu_);
    published_.clear();      // the member thread publishes the local ones again
    rollback_revision_ = 0;  // a new store numbers its revisions afresh
  }
  int republished = 0;
  if (ready_.load()) {
    for (size_t r = 0; r < inventory_.size(); ++r) {
      MEMENTO_RETURN_IF_ERROR(store_
                                  ->Set(keys.Inventory(static_cast<int>(r)),
                                        TensorListToJson(inventory_[r]).dump(), deadline)
                                  .status());
      ++republished;
    }
  }
  // 3. Steps this node will never report: nobody keeps holding them.
  std::vector<int64_t> dead;
  {
    MutexLock l(&mu_);
    dead.assign(dead_.begin(), dead_.end());
  }
  for (int64_t step : dead) {
    if (step <= committed_.load()) continue;
    MEMENTO_RETURN_IF_ERROR(store_->Set(SkippedKey(step), "", deadline).status());
  }
  // 4. A step this node reported and still holds, uncommitted: its report may
  //    have died with the store. Reporting it again is idempotent.
  const int64_t reported = last_reported_.load();
  if (reported > committed_.load() && hold_->held() == reported) {
    MEMENTO_RETURN_IF_ERROR(
        coord::ReportCompleted(*store_, job_, node_name_, reported, deadline, epoch_.load()));
  }
  cv_.SignalAll();
  MEMENTO_LOG_INFO(
      "store lost node {}'s lease: registered again, republished commit {}, {} inventories{}",
      node_, committed_.load(), republished,
      reported > committed_.load() ? fmt::format(", the report of step {}", reported) : "");
  return Status::Ok();
}

// ---- commits -------------------------------------------------------------------

void JobMember::OnCommit(const coord::CommitId& id) {
  // The log already has the record (CommitFollower appends first).
  const int64_t step = id.step;
  // The first commit of a new epoch: the history restarted at `step`
  // (docs/coordination.md, "Epochs"). A node the recovery did not reach
  // (an agent started after it) rewinds here as SetRestoreTarget would.
  const bool new_epoch = id.epoch != commit_epoch_;
  commit_epoch_ = id.epoch;
  if (new_epoch && epoch_.load() < id.epoch) SetRestoreTarget(step, id.epoch);
  if (new_epoch) {
    committed_.store(step);
  } else {
    int64_t prev = committed_.load();
    while (prev < step && !committed_.compare_exchange_weak(prev, step)) {
    }
  }
  hold_->Commit(step);
  red_->DropBelow(step);
  const int64_t reported_ns = last_reported_ns_.load();
  const bool reported_here = last_reported_.load() == step;
  {
    MutexLock l(&mu_);
    if (reported_here && step > lag_counted_) {
      lag_counted_ = step;
      const double lag = std::max(0.0, static_cast<double>(SteadyNowNs() - reported_ns) / 1e9);
      ++stats_.commit_lags;
      stats_.commit_lag_s += lag;
      stats_.last_commit_lag_s = lag;
    }
    if (restore_target_ >= 0 && step > restore_target_) restore_target_ = -1;
    completes_.erase(completes_.begin(), completes_.upper_bound(step));
    dead_.erase(dead_.begin(), dead_.upper_bound(step));
  }
  // This node's skip records of steps that can no longer matter: this
  // history's steps up to `step`, and every step of an older epoch.
  coord::JobKeys keys(job_);
  auto listing = store_->List(keys.SkippedPrefix(), Deadline::AfterSeconds(kStoreCallS));
  if (listing.ok()) {
    for (const auto& kv : listing->kvs) {
      auto k = coord::ParseSkippedKey(keys, kv.key);
      if (k.ok() && k->node == node_name_ && (k->step <= step || k->epoch < id.epoch)) {
        store_->Delete(kv.key, Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
      }
    }
  }
  cv_.SignalAll();
  MEMENTO_LOG_DEBUG("committed step {}", step);
  // The durable stream writes globally committed versions only. A new
  // epoch's first commit is the restored version, not written again.
  if (durable_ != nullptr && !new_epoch) durable_->OnCommitted(step);
}

void JobMember::Abandon(int64_t step, const std::string& why) {
  hold_->Release(step);
  {
    MutexLock l(&mu_);
    ++stats_.abandoned;
  }
  MEMENTO_LOG_INFO("step {} abandoned: {}", step, why);
  // This node will never report `step`: the others must not keep it either
  // (the same record as a trainer's skip, with the reason).
  PublishDead(step, why);
}

}  // namespace memento::agent
