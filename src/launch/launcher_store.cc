// The launcher and the coordination store: the commit coordinator, the plan
// hash, the store's loss and restart (kill-store). See launcher_state.h.
#include <set>

#include "coord/membership.h"
#include "launch/launcher_state.h"
#include "recover/recover.h"

namespace memento::launch {

// Everything the launcher wrote into the store; the topology last (its
// absence is how CheckStore notices a store that lost everything).
Status Launcher::State::RepublishLauncherKeys(Deadline deadline) {
  coord::JobKeys keys(o.job);
  if (plan.has_value()) {
    MEMENTO_RETURN_IF_ERROR(
        store->Set(keys.PlanHash(), std::to_string(recover::PlanHash(*plan)), deadline).status());
  }
  if (!restore_record.is_null()) {
    MEMENTO_RETURN_IF_ERROR(store->Set(keys.Restore(), restore_record.dump(), deadline).status());
  }
  if (!summary.recoveries.empty() && summary.recoveries.back().epoch > 0) {
    MEMENTO_RETURN_IF_ERROR(SetEpoch(*store, o.job, summary.recoveries.back().epoch, deadline));
  }
  for (const auto& [n, text] : recovery_records) {
    MEMENTO_RETURN_IF_ERROR(store->Set(keys.Recovery(n), text, deadline).status());
  }
  // The coordinator's newest commit: the agents republish only the commits
  // they saw, so without it every node would hold a step committed just
  // before the loss until its hold timeout and skip the steps after it
  // (fresh-clone CI, ClusterTest StoreKilledMidRunThenNodeLoss: step 10
  // committed 1 ms before the kill, the agents republished 9, nothing
  // committed after).
  if (coordinator != nullptr) MEMENTO_RETURN_IF_ERROR(coordinator->RepublishCommitted(deadline));
  return PublishTopology(*store, o.job, topology, deadline);
}

// SIGKILLs the store process: a store-host loss. It stays down for
// --store-down-s (RestartStoreIfDue), while the trainers keep training.
void Launcher::State::KillStore(const std::string& cause, int recovery, int64_t reached) {
  StoreRestartReport r;
  r.n = static_cast<int>(store_restarts.size());
  r.cause = cause;
  r.recovery = recovery;
  r.reached_step = reached;
  r.committed_before = Committed();
  if (Status st = store_host->Kill(); !st.ok()) {
    Say("kill-store: " + st.ToString());
    return;
  }
  store_down_since = Now();
  store_restarted_at.reset();
  store_restarts.push_back(r);
  Say("the store process is gone (" + cause + "); commits pause, snapshots go on into T0");
}

// Starts the fresh, empty store on the same address and republishes the
// launcher's keys; the agents notice (their leases are unknown there),
// register again and republish theirs.
Status Launcher::State::RestartStore() {
  const Deadline deadline = Deadline::AfterSeconds(o.agent_start_timeout_s);
  MEMENTO_RETURN_IF_ERROR(store_host->Restart(deadline).WithContext("restarting the store"));
  const TimePoint up = Now();
  if (!store_restarts.empty() && store_down_since) {
    store_restarts.back().down_s = SecondsBetween(*store_down_since, up);
  }
  store_down_since.reset();
  store_restarted_at = up;
  MEMENTO_RETURN_IF_ERROR(
      RepublishLauncherKeys(deadline).WithContext("republishing the launcher's keys"));
  Say("a fresh, empty store listens on " + store_host->url() +
      "; the launcher's keys are republished, the agents re-register");
  return Status::Ok();
}

Status Launcher::State::RestartStoreIfDue() {
  if (!StoreDown()) return Status::Ok();
  if (SecondsBetween(*store_down_since, Now()) < o.store_down_s) return Status::Ok();
  return RestartStore();
}

// Between restarts: a store process that died on its own is replaced at
// once; a store that lost the job's keys (an external one restarted) gets
// the launcher's keys again; after a restart, when commit/latest is back
// and when a newer step commits.
Status Launcher::State::CheckStore() {
  if (StoreDown()) return Status::Ok();
  if (auto st = store_host->PollExited()) {
    StoreRestartReport r;
    r.n = static_cast<int>(store_restarts.size());
    r.cause = "the store process died (" + st->ToString() + ")";
    r.committed_before = known_committed;
    store_restarts.push_back(r);
    store_down_since = Now();
    Say(r.cause + "; starting a fresh one on the same address");
    return RestartStore();
  }
  if (store_restarted_at && !store_restarts.empty()) {
    StoreRestartReport& r = store_restarts.back();
    auto latest = coord::ReadLatestCommit(*store, o.job, Deadline::AfterSeconds(2));
    if (latest.ok()) {
      if (auto id = coord::ReadLatestCommitId(*store, o.job, Deadline::AfterSeconds(2)); id.ok()) {
        LearnCommit(*id);
      }
      const double since = SecondsBetween(*store_restarted_at, Now());
      if (r.republished_s < 0 && *latest >= r.committed_before) {
        r.republished_s = since;
        Say("the agents republished commit " + std::to_string(*latest) + " " + Seconds3(since) +
            " s after the store restart");
      }
      if (*latest > r.committed_before) {
        r.resumed_s = since;
        r.resumed_step = *latest;
        store_restarted_at.reset();
        Say("commits resumed: step " + std::to_string(*latest) + " committed " + Seconds3(since) +
            " s after the store restart");
      }
    }
  }
  if (store_check_clock.Seconds() >= 0.25) {
    store_check_clock.Reset();
    auto kv = store->Get(coord::JobKeys(o.job).Topology(), Deadline::AfterSeconds(2));
    if (!kv.ok() && kv.status().code() == StatusCode::kNotFound) {
      Say("the store lost the job's keys (restarted empty?): republishing the launcher's");
      Status st = RepublishLauncherKeys(Deadline::AfterSeconds(10));
      if (!st.ok()) Say("republishing the launcher's keys (will retry): " + st.ToString());
    }
  }
  return Status::Ok();
}

// The highest step any node signalled (SNAP / COMPLETED), or committed.
int64_t ReachedStepOf(int64_t committed, const std::vector<std::string>& signals,
                      int64_t since_wall_ns) {
  int64_t best = committed;
  for (const std::string& value : signals) {
    auto rec = coord::SignalRecord::Decode(value);
    if (rec.ok() && rec->signal == coord::NodeSignal::kCompleted && rec->wall_ns >= since_wall_ns) {
      best = std::max(best, rec->step);
    }
  }
  return best;
}

int64_t Launcher::State::ReachedStep() {
  const int64_t committed = Committed();
  coord::JobKeys keys(o.job);
  std::vector<std::string> signals;
  auto list = store->List(keys.SignalPrefix(), Deadline::AfterSeconds(5));
  if (list.ok()) {
    for (const auto& kv : list->kvs) signals.push_back(kv.value);
  }
  return ReachedStepOf(committed, signals, attempt_wall_ns);
}

Status Launcher::State::StartCoordinator(Deadline deadline) {
  coordinator.reset();
  std::set<std::string> members;
  for (int i = 0; i < o.nodes; ++i) members.insert(coord::NodeName(i));
  MEMENTO_ASSIGN_OR_RETURN(
      coordinator, coord::CommitCoordinator::Start(
                       store, o.job, members, deadline,
                       [this](const coord::CommitId& id, const std::vector<int64_t>& superseded) {
                         commit_history.OnCommit(id.step, superseded, id.epoch);
                       }));
  return Status::Ok();
}

void Launcher::State::MaybePublishPlan() {
  if (plan.has_value()) return;
  auto p = PlanFromStore(*store, o.job, Deadline::AfterSeconds(5));
  if (!p.ok()) {
    if (p.status().code() != StatusCode::kNotFound) {
      Say("cannot compute the plan: " + p.status().ToString());
    }
    return;
  }
  const uint64_t hash = recover::PlanHash(*p);
  coord::JobKeys keys(o.job);
  auto st = store->Set(keys.PlanHash(), std::to_string(hash), Deadline::AfterSeconds(5));
  if (!st.ok()) {
    Say("cannot publish the plan hash: " + st.status().ToString());
    return;
  }
  if (!o.quiet) {
    Say("plan " + std::to_string(hash) + ": policy " + topo::PolicyName(p->policy) +
        ", protection " + std::to_string(p->protection) + " node failure(s), " +
        std::to_string(p->total_state_bytes) + " state bytes, " +
        std::to_string(p->total_held_bytes) + " bytes held" +
        (p->reason.empty() ? "" : "; " + p->reason));
  }
  plan = std::move(*p);
}

Status Launcher::State::RestartCommitRule() {
  // The agents' leader's coordinator goes on: the recovery's new epoch makes
  // it ignore the failed attempt's reports, and its cleaner deletes them.
  if (o.coordinate_commits) return Status::Ok();
  coord::JobKeys keys(o.job);
  auto list = store->List(keys.CompletedPrefix(), Deadline::AfterSeconds(5));
  coordinator.reset();
  if (list.ok()) {
    for (const auto& kv : list->kvs) {
      store->Delete(kv.key, Deadline::AfterSeconds(5)).status().IgnoreError();
    }
  }
  return StartCoordinator(Deadline::AfterSeconds(10));
}

}  // namespace memento::launch
