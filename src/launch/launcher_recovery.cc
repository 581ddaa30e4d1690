// The launcher's recovery orchestration (docs/launch.md, docs/recovery.md):
// agents back (a lost node on an empty root), RecoverJob, the durable
// fallback, the new attempt's records. See launcher_state.h.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <mutex>
#include <thread>

#include "fmt/format.h"
#include "launch/launcher_state.h"
#include "launch/swift_protocol.h"
#include "tier/discovery.h"
#include "tier/env.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::launch {

std::optional<JobEnd> Launcher::State::Recover(const std::string& cause,
                                               const std::string& fallback) {
  TimePoint detected = Now();
  double detected_wall = swift::WallSeconds();
  RecoveryReport rep;
  if (in_process.has_value()) {
    // The in-process recovery of an earlier failure did not get the job
    // going again: the same failure, now by the whole-job restart.
    rep = in_process->rep;
    detected = in_process->detected;
    detected_wall = in_process->detected_wall;
    in_process.reset();
    rep.fallback = "in-process recovery (" + rep.mode + ", generation " +
                   std::to_string(rep.generation) + ") failed: " + cause;
    Say("in-process recovery failed (" + cause + "); falling back to restarting the whole job");
  } else {
    rep.n = static_cast<int>(summary.recoveries.size());
    rep.cause = cause;
    rep.detect_s = injected_at ? SecondsBetween(*injected_at, detected) : 0.0;
    rep.fallback = fallback;
    injected_at.reset();
    summary.failures.push_back(cause);
    Say("failure: " + cause);
    if (!fallback.empty()) Say("in-process recovery not possible: " + fallback);
    if (restarts >= o.max_restarts) {
      return JobEnd{false, 1,
                    "giving up: " + std::to_string(summary.failures.size()) +
                        " failure(s), --max-restarts " + std::to_string(o.max_restarts)};
    }
    ++restarts;
  }
  rep.mode = "restart";
  rep.processes_restarted += world;
  StopTrainers();
  // Recovery needs the store: a killed one comes back now.
  if (StoreDown()) {
    if (Status st = RestartStore(); !st.ok()) return JobEnd{false, 1, st.ToString()};
  }
  // A new incarnation of the job's history: the commit epoch the agents
  // report the steps after the restored one in (sent with the restore
  // target; docs/coordination.md, "Epochs"), and once the restored version
  // is loaded everywhere the durable epoch (PublishRecovery).
  // (--recovery-by agents: the leader chooses it, above the newest epoch
  // the launcher saw; its status says which.)
  Committed();
  if (o.recovery_by == "agents") {
    agents_epoch_floor = std::max({agents_epoch_floor, known_commit.epoch, recovery_epoch});
    recovery_epoch = 0;
  } else if (auto epoch = NextEpoch(*store, o.job, Deadline::AfterSeconds(5),
                                    std::max(known_commit.epoch, recovery_epoch));
             epoch.ok()) {
    recovery_epoch = *epoch;
  } else {
    recovery_epoch = 0;
    Say("cannot choose the new epoch: " + epoch.status().ToString());
  }
  std::optional<JobRecovery> recovered;
  std::optional<RecoveryStatus> by_agents;
  if (auto end = RestartAgentsAndRecover(detected, &rep, &recovered, &by_agents)) return end;
  if (by_agents.has_value()) {
    if (auto end = TakeAgentsOutcome(*by_agents, &rep)) return end;
  } else if (recovered.has_value()) {
    if (auto end = TakeLauncherOutcome(*recovered, &rep)) return end;
  } else {
    rep.source = "scratch";
    rep.reason = plan.has_value() ? "no committed version yet: the trainers start over"
                                  : "not every rank registered its state yet: the "
                                    "trainers start over";
    Say(rep.reason);
  }

  // The restored step is the new epoch's first commit: the steps trained
  // again after it commit, even those the abandoned history had committed
  // (a durable fallback to S < C), and no report of that history counts.
  if (recovery_epoch > 0 && rep.step >= 0) {
    Status st =
        StartCommitEpoch(*store, o.job, recovery_epoch, rep.step, Deadline::AfterSeconds(10));
    if (!st.ok()) {
      return JobEnd{false, 1,
                    "cannot start commit epoch " + std::to_string(recovery_epoch) + " at step " +
                        std::to_string(rep.step) + ": " + st.ToString()};
    }
    LearnCommit(coord::CommitId{recovery_epoch, rep.step});
  }
  // The commit rule starts over from the restored step: reports of later
  // steps from the failed attempt must not count towards new commits.
  if (Status st = RestartCommitRule(); !st.ok()) return JobEnd{false, 1, st.ToString()};
  PublishRecovery(detected, &rep);
  // The nodes' signals from before now are the failed attempt's (ahead of
  // the restored step after a rewind): injections wait for this attempt's.
  attempt_wall_ns = WallNanos();
  if (Status st = StartTrainers(); !st.ok()) return JobEnd{false, 1, st.ToString()};
  // The trainers report their first step in the new rendezvous dir.
  resume_watch = ResumeWatch{summary.recoveries.size() - 1, swift::ResumedPath(Rendezvous(), 0),
                             detected_wall};
  return std::nullopt;
}

// ---- in-process recovery (--recovery undo|log|auto; docs/swift.md) ------------

std::string Launcher::State::TryInProcess(const std::string& cause, int rank,
                                          const ExitStatus& status) {
  if (o.recovery == "restart") return "restart";
  const std::string mode = InProcessMode(o);
  if (in_process.has_value()) return "a failure during an in-process recovery";
  if (rank < 0) return "a node or agent is lost, not only a trainer rank: the whole job restarts";
  if (status.signal == 0 && status.code == swift::kExitRecoveryFailed) {
    return "rank " + std::to_string(rank) + "'s in-process recovery failed (exit code " +
           std::to_string(swift::kExitRecoveryFailed) + ", see its log)";
  }
  if (mode.empty()) {
    return "dp 1 and no pipeline to replay: no data-parallel replica to rebuild the lost rank "
           "from, no neighbour stage's log to replay";
  }
  const int node = NodeOf(rank);
  if (node_lost[static_cast<size_t>(node)] || !agents[static_cast<size_t>(node)].running()) {
    return "the agent of node " + std::to_string(node) + " is gone too";
  }
  if (restarts >= o.max_restarts) return "--max-restarts " + std::to_string(o.max_restarts);
  // In process: the survivors stay; the lost rank starts again as a
  // replacement in generation g + 1 of this attempt.
  InProcess ip;
  ip.detected = Now();
  ip.detected_wall = swift::WallSeconds();
  RecoveryReport& rep = ip.rep;
  rep.n = static_cast<int>(summary.recoveries.size());
  rep.cause = cause;
  rep.detect_s = injected_at ? SecondsBetween(*injected_at, ip.detected) : 0.0;
  injected_at.reset();
  rep.attempt = attempt;
  rep.mode = mode;
  rep.source = mode == "log" ? "snapshot+log" : o.zero > 0 ? "replica+tiers" : "replica";
  rep.committed = Committed();
  rep.replaced_rank = rank;
  rep.generation = generation + 1;
  rep.processes_restarted = 1;
  summary.failures.push_back(cause);
  ++restarts;
  Say("failure: " + cause);
  Say("in-process recovery (" + mode + "), generation " + std::to_string(rep.generation) +
      ": the survivors stay; rank " + std::to_string(rank) + " starts again, its state from " +
      (mode == "log"
           ? std::string("its stage's last snapshot and its neighbours' logged messages") +
                 (o.dp > 1 ? " (its stage's DP peers roll back to theirs and replay with it)" : "")
       : o.zero > 0
           ? "a DP replica and its moment shard from node " + std::to_string(node) + "'s T0"
           : std::string("a DP replica")));
  ++generation;
  Status st = swift::WriteGeneration(Rendezvous(), generation);
  if (st.ok()) {
    st = StartTrainer(rank, {std::string(swift::kEnvGeneration) + "=" + std::to_string(generation),
                             std::string(swift::kEnvReplace) + "=1"});
  }
  in_process = std::move(ip);
  if (!st.ok()) {
    // Recover() takes the in-process report over.
    return "cannot start the replacement: " + st.ToString();
  }
  return "";
}

std::string Launcher::State::WatchRecoveries() {
  using json = nlohmann::json;
  auto read = [](const std::string& path) -> std::optional<json> {
    const std::string text = swift::ReadFileOrEmpty(path);
    if (text.empty()) return std::nullopt;
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    return j;
  };
  if (resume_watch.has_value()) {
    if (auto j = read(resume_watch->path)) {
      RecoveryReport& rep = summary.recoveries[resume_watch->index];
      rep.resume_s = j->value("wall_s", 0.0) - resume_watch->detected_wall;
      recovery_records[rep.n] = rep.ToJson().dump();
      if (!StoreDown()) {
        store
            ->Set(coord::JobKeys(o.job).Recovery(rep.n), recovery_records[rep.n],
                  Deadline::AfterSeconds(5))
            .status()
            .IgnoreError();
      }
      Say("recovery " + std::to_string(rep.n) + ": the job resumed " + Seconds3(rep.resume_s) +
          " s after the failure (" + std::to_string(rep.processes_restarted) +
          " process(es) restarted)");
      resume_watch.reset();
    }
  }
  if (!in_process.has_value()) return "";
  InProcess& ip = *in_process;
  RecoveryReport& rep = ip.rep;
  const std::string rdzv = Rendezvous();
  if (!ip.recovered) {
    int64_t agreed = -1, reached = -1, replayed_steps = 0, snapshot_step = -1;
    int replayed_stages = 0;
    uint64_t bytes_replayed = 0;
    double last_wall = 0;
    std::string missing;
    for (int r = 0; r < world; ++r) {
      auto j = read(swift::RecoveredPath(rdzv, ip.rep.generation, r));
      if (!j) {
        missing += " " + std::to_string(r);
        continue;
      }
      agreed = j->value("step", int64_t{-1});
      // Log replay: the replacement, and with selective logging its log
      // group's survivors, replayed.
      replayed_steps += j->value("replayed_steps", int64_t{0});
      bytes_replayed += j->value("bytes_replayed", uint64_t{0});
      if (j->value("replayed_steps", int64_t{0}) > 0) ++replayed_stages;
      if (j->value("replacement", false)) {
        // (A replacement's from_step is the snapshot it replayed from.)
        snapshot_step = j->value("from_step", int64_t{-1});
      } else {
        reached = std::max<int64_t>(reached, j->value("from_step", int64_t{-1}));
      }
      last_wall = std::max(last_wall, j->value("wall_s", 0.0));
    }
    if (!missing.empty()) {
      if (SecondsBetween(ip.detected, Now()) < o.in_process_timeout_s) return "";
      return "no in-process recovery report from rank(s)" + missing + " within " +
             Seconds3(o.in_process_timeout_s) +
             " s (--in-process-timeout; a survivor wedged, or a trainer that does not speak "
             "docs/swift.md's protocol)";
    }
    ip.recovered = true;
    rep.step = agreed;
    rep.reached_step = reached;
    rep.steps_lost = std::max<int64_t>(0, reached - agreed);
    rep.total_s = last_wall - ip.detected_wall + rep.detect_s;
    rep.replayed_steps = replayed_steps;
    rep.bytes_replayed = bytes_replayed;
    rep.replayed_stages = replayed_stages;
    if (rep.mode == "log") {
      rep.reason = "survivors at step " + std::to_string(agreed) + " (the newest had completed " +
                   std::to_string(reached) + "); rank " + std::to_string(rep.replaced_rank) +
                   " loaded its snapshot of step " + std::to_string(snapshot_step) + "; " +
                   std::to_string(replayed_stages) + " stage(s) replayed " +
                   std::to_string(replayed_steps) + " step(s) in all, " +
                   std::to_string(bytes_replayed) + " logged bytes";
    } else {
      rep.reason = "survivors undid to step " + std::to_string(agreed) +
                   " (the newest had completed " + std::to_string(reached) + "); rank " +
                   std::to_string(rep.replaced_rank) + " rebuilt from a DP replica" +
                   (o.zero > 0 ? " and its node's T0" : "");
    }
    if (!o.quiet) {
      Say("recovery " + std::to_string(rep.n) + ": every rank recovered in process at step " +
          std::to_string(agreed));
    }
  }
  if (auto j = read(swift::ResumedPath(rdzv, rep.generation))) {
    rep.resume_s = j->value("wall_s", 0.0) - ip.detected_wall;
    FinishInProcess();
  }
  return "";
}

void Launcher::State::FinishInProcess() {
  RecoveryReport rep = std::move(in_process->rep);
  in_process.reset();
  recovery_records[rep.n] = rep.ToJson().dump();
  if (!StoreDown()) {
    store
        ->Set(coord::JobKeys(o.job).Recovery(rep.n), recovery_records[rep.n],
              Deadline::AfterSeconds(5))
        .status()
        .IgnoreError();
  }
  Say(rep.ToString());
  summary.recoveries.push_back(std::move(rep));
}

std::optional<JobEnd> Launcher::State::RestartAgentsAndRecover(
    TimePoint detected, RecoveryReport* rep, std::optional<JobRecovery>* recovered,
    std::optional<RecoveryStatus>* by_agents) {
  const Deadline agents_deadline = Deadline::AfterSeconds(o.agent_start_timeout_s);
  // An agent killed together with its trainer may still be dying when the
  // trainer's death is noticed (its stale socket and lease look alive):
  // when an agent turns out dead during the recovery, it is restarted on
  // its root and the recovery starts over (at most kRecoveryRounds times).
  constexpr int kRecoveryRounds = 3;
  filed_request = 0;
  for (int round = 0;; ++round) {
    std::string failed;
    if (o.recovery_by == "agents") {
      // kill-*:leader@recovery=N: the leader lost while it waits for the
      // agents still down here.
      if (Status st = KillLeaderMidRecovery(rep->n); !st.ok()) {
        return JobEnd{false, 1, st.ToString()};
      }
    }
    for (int i = 0; i < o.nodes && failed.empty(); ++i) {
      Subprocess& a = agents[static_cast<size_t>(i)];
      if (a.running()) continue;  // reaps one that died unnoticed
      const bool lost = node_lost[static_cast<size_t>(i)];
      if (lost &&
          std::find(rep->lost_nodes.begin(), rep->lost_nodes.end(), i) == rep->lost_nodes.end()) {
        rep->lost_nodes.push_back(i);
      }
      Say(lost ? "replacing node " + std::to_string(i) + " by a fresh agent on an empty root"
               : "restarting the agent of node " + std::to_string(i) + " on its root" +
                     (a.exit_status() ? " (it " + a.exit_status()->ToString() + ")" : ""));
      if (Status st = StartAgent(i, lost); !st.ok()) return JobEnd{false, 1, st.ToString()};
    }
    if (Status st = WaitAgentsReady(agents_deadline); !st.ok()) failed = st.ToString();
    // kill-store|kill-agent|kill-node@recovery=N: lost in the middle of this
    // recovery (agents restarted, inventory round not begun); a killed agent
    // fails this round, and the next one restarts or replaces it.
    if (failed.empty()) {
      Result<std::string> killed = FireRecoveryInjections(rep->n);
      if (!killed.ok()) return JobEnd{false, 1, killed.status().ToString()};
      failed = *killed;
    }
    if (failed.empty()) {
      rep->committed = Committed();
      if (plan.has_value() && rep->committed >= 0) {
        if (Status st = WaitEndpoints(agents_deadline); !st.ok()) failed = st.ToString();
      }
    }
    if (failed.empty()) {
      rep->restart_s = SecondsBetween(detected, Now());
      ApplyPendingCorruptions(rep->committed, rep->lost_nodes);
      if (!plan.has_value() || rep->committed < 0) return std::nullopt;
      if (o.recovery_by == "agents") {
        // The agents' leader runs it (the same path as under torchrun or
        // Slurm); the launcher only waits for its outcome.
        Say(filed_request == 0
                ? "recovery " + std::to_string(rep->n) + " asked of the agents' recovery leader"
                : "recovery " + std::to_string(rep->n) +
                      ": waiting for the agents' recovery leader to finish "
                      "request " +
                      std::to_string(filed_request));
        auto outcome = RecoverByAgents();
        if (outcome.ok()) {
          if (DeadAgents().empty()) {
            *by_agents = std::move(*outcome);
            return std::nullopt;
          }
          failed = "the recovery's decision was made while an agent was dying";
        } else {
          failed = "recovery by the agents failed: " + outcome.status().ToString();
        }
      }
    }
    if (failed.empty() && o.recovery_by != "agents") {
      RecoverOptions ro;
      ro.job = o.job;
      ro.num_nodes = o.nodes;
      ro.committed = rep->committed;
      ro.epoch = recovery_epoch;
      const int n = rep->n;
      ro.on_transfer = [this, n] { FireTransferInjections(n); };
      auto rec = RecoverJob(*store, *plan, token, ro, Deadline::AfterSeconds(o.recovery_timeout_s));
      if (rec.ok() && rec->nodes.empty()) FireTransferInjections(n, /*moved=*/false);
      if (rec.ok()) {
        // An agent that died meanwhile would fail the restarted trainers.
        if (DeadAgents().empty()) {
          *recovered = std::move(*rec);
          return std::nullopt;
        }
        failed = "the recovery's decision was made while an agent was dying";
      } else {
        failed = "recovery failed: " + rec.status().ToString();
      }
    }
    const std::string dead = DeadAgents();
    if (dead.empty() || round + 1 >= kRecoveryRounds) return JobEnd{false, 1, failed};
    Say("the agent(s) of node(s)" + dead + " died during recovery " + std::to_string(rep->n) +
        " (" + failed + "); restarting them and trying again");
  }
}

Result<RecoveryStatus> Launcher::State::RecoverByAgents() {
  const Deadline deadline = Deadline::AfterSeconds(o.recovery_timeout_s);
  // corrupt-durable applies before the leader may look at the durable tier.
  ApplyPendingDurableCorruption();
  int64_t id = filed_request;
  filed_request = 0;
  if (id == 0) {
    MEMENTO_ASSIGN_OR_RETURN(
        id, RequestRecovery(*store, o.job, Deadline::AfterSeconds(5), agents_epoch_floor));
  }
  std::string last = "no status yet";
  while (true) {
    auto view = ReadRecoveryView(*store, o.job, Deadline::AfterSeconds(5));
    if (view.ok() && view->has_status) {
      const RecoveryStatus& st = view->status;
      if (st.id >= id && st.final()) {
        // A leader must not restart the history in an epoch the launcher
        // already saw (its commits would not be above the abandoned ones).
        if (st.state == "done" && st.restore_step >= 0 && st.epoch <= agents_epoch_floor) {
          return FailedPreconditionError(
              "the agents' leader " + st.leader + " finished recovery " + std::to_string(st.id) +
              " in commit epoch " + std::to_string(st.epoch) + ", not above epoch " +
              std::to_string(agents_epoch_floor) + " the launcher already saw");
        }
        return st;
      }
      last = "recovery " + std::to_string(st.id) + " " + st.state +
             (st.leader.empty() ? "" : " (leader " + st.leader + ")") +
             (st.message.empty() ? "" : ": " + st.message);
    } else if (!view.ok()) {
      last = view.status().ToString();
    }
    if (const std::string dead = DeadAgents(); !dead.empty()) {
      return UnavailableError("the agent(s) of node(s)" + dead + " died while recovery " +
                              std::to_string(id) + " ran (" + last + ")");
    }
    if (deadline.expired()) {
      return DeadlineExceededError("the agents' recovery leader did not finish recovery " +
                                   std::to_string(id) + " within --recovery-timeout " +
                                   Seconds3(o.recovery_timeout_s) + " s (" + last + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<JobEnd> Launcher::State::TakeAgentsOutcome(const RecoveryStatus& s,
                                                         RecoveryReport* rep) {
  const json& rec = s.recovery;
  rep->recovered_by = "agents";
  rep->leader = s.leader;
  rep->takeover = s.takeover;
  // The durable versions the leader passed over, said as FallBackToDurableTier
  // says them ("step N <why>").
  rep->durable_skipped = s.durable_skipped;
  for (const std::string& skipped : s.durable_skipped) {
    const size_t space = skipped.rfind("step ", 0) == 0 ? skipped.find(' ', 5) : std::string::npos;
    if (space == std::string::npos) {
      Say("durable tier: " + skipped);
      continue;
    }
    Say("durable version " + skipped.substr(5, space - 5) +
        " skipped: " + skipped.substr(space + 1) + " (the agents' leader)");
  }
  if (s.state != "done") {
    // As EndWithNothingRestored: exit 3 when neither memory nor the durable
    // tier holds a version to restore, 1 for any other failure.
    const bool nothing = s.message.rfind("memory cannot rebuild", 0) == 0;
    const std::string msg = "the agents' recovery (request " + std::to_string(s.id) + ", leader " +
                            s.leader + ") failed: " + s.message;
    Say(msg);
    rep->source = "none";
    rep->reason = msg;
    json record = rep->ToJson();
    record["status"] = s.ToJson();
    store->Set(coord::JobKeys(o.job).Recovery(rep->n), record.dump(), Deadline::AfterSeconds(5))
        .status()
        .IgnoreError();
    summary.recoveries.push_back(*rep);
    return JobEnd{false, nothing ? 3 : 1, msg};
  }
  Say("recovery " + std::to_string(rep->n) + " by the agents' leader " + s.leader + " (request " +
      std::to_string(s.id) + "): " +
      (s.source == "none" ? "nothing to restore"
                          : s.source + ", step " + std::to_string(s.restore_step)) +
      (s.takeover ? " (taken over from a lost leader)" : ""));
  rep->reason = s.message;
  if (s.source == "none" || s.restore_step < 0) {
    rep->source = "scratch";
    return std::nullopt;
  }
  // The leader may have seen a newer commit than the launcher did (one
  // republished into a restarted store while the launcher was detecting the
  // failure): the report names the commit the decision was made against.
  if (rec.is_object() && rec.contains("committed") && rec["committed"].is_number_integer()) {
    rep->committed = std::max(rep->committed, rec["committed"].get<int64_t>());
  }
  rep->step = s.restore_step;
  rep->steps_lost = std::max<int64_t>(0, rep->committed - rep->step);
  recovery_epoch = s.epoch;
  auto num = [&](const char* key) { return rec.is_object() ? rec.value(key, 0.0) : 0.0; };
  if (s.source == "durable") {
    rep->source = "durable";
    rep->load_s = num("total_s");
    rep->write_s = num("write_s");
    rep->read_bytes = rec.is_object() ? rec.value("read_bytes", uint64_t{0}) : 0;
    rep->rebuilt_bytes = rec.is_object() ? rec.value("bytes", uint64_t{0}) : 0;
    rep->reason = "restored from the durable tier at step " + std::to_string(rep->step) +
                  " by the agents' leader, " + std::to_string(rep->steps_lost) +
                  " steps lost (committed " + std::to_string(rep->committed) + "; " + s.message +
                  ")";
    Say(rep->reason);
    return std::nullopt;
  }
  rep->source =
      s.message.find("source aor replica") != std::string::npos ? "memory (aor replica)" : "memory";
  rep->inventory_plan_s = num("inventory_plan_s");
  rep->transfer_s = num("transfer_s");
  rep->decode_s = num("decode_s");
  rep->write_s = num("write_s");
  rep->rebuilt_bytes = rec.is_object() ? rec.value("rebuilt_bytes", uint64_t{0}) : 0;
  if (rec.is_object() && rec.contains("decision") && rec["decision"].contains("lost_nodes")) {
    for (const json& n : rec["decision"]["lost_nodes"]) {
      if (!n.is_number_integer()) continue;
      const int node = n.get<int>();
      if (std::find(rep->lost_nodes.begin(), rep->lost_nodes.end(), node) ==
          rep->lost_nodes.end()) {
        rep->lost_nodes.push_back(node);
      }
    }
  }
  Say("decision: " + s.message);
  return std::nullopt;
}

std::optional<JobEnd> Launcher::State::TakeLauncherOutcome(const JobRecovery& rec,
                                                           RecoveryReport* rep) {
  rep->reason = rec.decision.reason;
  for (int n : rec.decision.lost_nodes) {
    if (std::find(rep->lost_nodes.begin(), rep->lost_nodes.end(), n) == rep->lost_nodes.end()) {
      rep->lost_nodes.push_back(n);
    }
  }
  if (!rec.decision.from_memory) {
    Result<bool> from_durable(false);
    if (!o.durable_dir.empty()) from_durable = FallBackToDurableTier(rec, rep);
    if (!from_durable.ok()) {
      return EndUnrestored(
          rec, rep, "the durable tier's fallback failed: " + from_durable.status().ToString(), 1);
    }
    if (!*from_durable) return EndWithNothingRestored(rec, rep);
    if (!rep->durable_skipped.empty()) {
      rep->reason += "; newer durable version(s) skipped: ";
      for (size_t k = 0; k < rep->durable_skipped.size(); ++k) {
        rep->reason += (k ? "; " : "") + rep->durable_skipped[k];
      }
    }
    rep->inventory_plan_s = rec.inventory_plan_s;
    return std::nullopt;
  }
  // The inventories may name a newer commit than the launcher saw.
  rep->committed = std::max(rep->committed, rec.committed);
  rep->step = rec.decision.step;
  rep->steps_lost = std::max<int64_t>(0, rep->committed - rep->step);
  rep->inventory_plan_s = rec.inventory_plan_s;
  rep->transfer_s = rec.transfer_s;
  rep->decode_s = rec.decode_s;
  rep->write_s = rec.write_s;
  rep->rebuilt_bytes = rec.rebuilt_bytes;
  // A lost optimizer shard rebuilt from a host-recomputed replica
  // (docs/reft.md section 5) is named as such.
  if (rec.decision.reason.find("source aor replica") != std::string::npos) {
    rep->source = "memory (aor replica)";
  }
  Say("decision: " + rec.decision.reason);
  return std::nullopt;
}

// Fallback: the newest durable version that verifies now (every piece's
// checksum) is loaded by every node into its T0; a newer one that fails
// verification or loading is skipped, and said why. Returns whether a
// version was loaded.
Result<bool> Launcher::State::FallBackToDurableTier(const JobRecovery& rec, RecoveryReport* rep) {
  ApplyPendingDurableCorruption();
  auto versions = tier::ListVersions(tier::Env::Default(), o.durable_dir);
  if (!versions.ok()) {
    rep->durable_skipped.push_back("cannot list " + o.durable_dir + ": " +
                                   versions.status().ToString());
    return false;
  }
  for (auto it = versions->rbegin(); it != versions->rend(); ++it) {
    if (!it->complete) continue;
    tier::VersionCheck check = tier::VerifyVersion(tier::Env::Default(), o.durable_dir, it->step);
    std::string why;
    if (!check.ok) {
      why =
          "fails verification: " + (check.problems.empty() ? std::string("?") : check.problems[0]);
      if (check.problems.size() > 1) {
        why += " (and " + std::to_string(check.problems.size() - 1) + " more)";
      }
    } else {
      bool agents_failed = false;
      Result<DurableLoad> load =
          FallBackToDurable(it->step, rec.decision.reason, rep, &agents_failed);
      if (load.ok()) return true;
      // The version is complete and verifies: an older one would lose steps
      // for a fault of the agents, not of the version.
      if (agents_failed) return load.status();
      why = "loading it failed: " + load.status().ToString();
    }
    rep->durable_skipped.push_back("step " + std::to_string(it->step) + " " + why);
    Say("durable version " + std::to_string(it->step) + " skipped: " + why +
        "; trying an older one");
  }
  return false;
}

// The durable-tier fallback (docs/recovery.md): memory cannot rebuild any
// committed version, and `step` is the newest complete durable version.
// Every node loads it into its T0 (kPeerLoadDurable, in parallel) and
// targets it, a node whose agent dies meanwhile after its agent is restarted;
// fills the report's durable fields.
Result<DurableLoad> Launcher::State::FallBackToDurable(int64_t step,
                                                       const std::string& memory_reason,
                                                       RecoveryReport* rep, bool* agents_failed) {
  Say("memory cannot rebuild any committed version: " + memory_reason);
  Say("falling back to the durable tier " + o.durable_dir + ": loading step " +
      std::to_string(step) + " on " + std::to_string(o.nodes) + " node(s)");
  MEMENTO_ASSIGN_OR_RETURN(DurableLoad load, LoadDurableRestartingAgents(step, rep, agents_failed));
  rep->source = "durable";
  rep->step = step;
  rep->steps_lost = std::max<int64_t>(0, rep->committed - step);
  rep->load_s = load.total_s;
  rep->read_bytes = load.read_bytes;
  rep->rebuilt_bytes = load.bytes;
  rep->write_s = load.write_s;
  rep->reason = "restored from the durable tier at step " + std::to_string(step) + ", " +
                std::to_string(rep->steps_lost) + " steps lost (committed " +
                std::to_string(rep->committed) + "; memory: " + memory_reason + ")";
  return load;
}

// (docs/recovery.md, "An agent lost while a durable version loads")
Result<DurableLoad> Launcher::State::LoadDurableRestartingAgents(int64_t step, RecoveryReport* rep,
                                                                 bool* agents_failed) {
  const Deadline deadline = Deadline::AfterSeconds(o.recovery_timeout_s);
  std::mutex mu;  // the per-node load threads fire the injections
  const int n = rep->n;
  auto on_request = [&](int node) {
    std::lock_guard<std::mutex> lock(mu);
    FireDurableLoadInjection(n, node);
  };
  for (int attempt = 1;; ++attempt) {
    std::vector<int> missing;
    Result<DurableLoad> load =
        LoadDurableOnEveryNode(*store, token, o.job, o.nodes, o.durable_dir, step, deadline,
                               recovery_epoch, /*agent_wait_s=*/0, &missing, on_request);
    // An agent that answered and died after it would fail the trainers.
    for (int i = 0; i < o.nodes; ++i) {
      if (!agents[static_cast<size_t>(i)].running() &&
          std::find(missing.begin(), missing.end(), i) == missing.end()) {
        missing.push_back(i);
      }
    }
    std::sort(missing.begin(), missing.end());
    if (missing.empty()) return load;  // loaded, or failed for the version itself
    std::string nodes;
    for (int i : missing) nodes += (nodes.empty() ? "" : ", ") + std::to_string(i);
    const std::string why = load.ok() ? "it died after loading" : load.status().ToString();
    if (attempt >= kDurableLoadTries || deadline.expired()) {
      *agents_failed = true;
      return UnavailableError(fmt::format(
          "loading durable version {} on every node failed {} time(s): the agent of node(s) {} "
          "was gone each time (last: {}); version {} is complete on {}, so no older one is "
          "loaded instead",
          step, attempt, nodes, why, step, o.durable_dir));
    }
    for (int i : missing) {
      Say(fmt::format(
          "loading durable version {} (try {} of {}): the agent of node {} is gone ({}); {} and "
          "loading step {} again on every node",
          step, attempt, kDurableLoadTries, i, why,
          node_lost[static_cast<size_t>(i)] ? "replacing it by a fresh agent on an empty root"
                                            : "restarting it on its root",
          step));
      if (Status st = RestartAgentForLoad(i, rep); !st.ok()) {
        *agents_failed = true;
        return st.WithContext(fmt::format("loading durable version {}: node {}'s agent", step, i));
      }
    }
  }
}

Status Launcher::State::RestartAgentForLoad(int node, RecoveryReport* rep) {
  Subprocess& a = agents[static_cast<size_t>(node)];
  if (a.running()) {
    // Alive but unreachable: a wedged agent is replaced like a dead one.
    a.Kill(SIGKILL).IgnoreError();
    (void)a.Wait(Deadline::AfterSeconds(10));
  }
  const bool lost = node_lost[static_cast<size_t>(node)];
  if (lost &&
      std::find(rep->lost_nodes.begin(), rep->lost_nodes.end(), node) == rep->lost_nodes.end()) {
    rep->lost_nodes.push_back(node);
  }
  MEMENTO_RETURN_IF_ERROR(StartAgent(node, lost));
  const Deadline ready = Deadline::AfterSeconds(o.agent_start_timeout_s);
  MEMENTO_RETURN_IF_ERROR(WaitAgentsReady(ready));
  return WaitEndpoints(ready);
}

// Memory cannot rebuild any committed version and the durable tier gave none:
// the job ends with exit 3, saying what each tier holds.
JobEnd Launcher::State::EndWithNothingRestored(const JobRecovery& rec, RecoveryReport* rep) {
  std::string msg = "memory cannot rebuild any committed version: " + rec.decision.reason;
  if (!o.durable_dir.empty() && !rep->durable_skipped.empty()) {
    msg += "; the durable tier " + o.durable_dir + " holds no version that verifies and loads:";
    for (size_t k = 0; k < rep->durable_skipped.size(); ++k) {
      msg += (k ? "; " : " ") + rep->durable_skipped[k];
    }
  } else if (!o.durable_dir.empty()) {
    tier::DurableVersionSource durable(tier::Env::Default(), o.durable_dir);
    auto latest = durable.LatestComplete(Deadline::AfterSeconds(30));
    if (latest.ok() && latest->has_value()) {
      // Only when it completed after the look-up above.
      msg += "; the durable tier " + o.durable_dir + " holds step " + std::to_string(**latest) +
             ": restart the job from it";
    } else {
      msg += "; the durable tier " + o.durable_dir + " holds no complete version" +
             (latest.ok() ? "" : " (" + latest.status().ToString() + ")");
    }
  } else {
    msg += " (no --durable-dir to fall back to)";
  }
  return EndUnrestored(rec, rep, msg, 3);
}

JobEnd Launcher::State::EndUnrestored(const JobRecovery& rec, RecoveryReport* rep,
                                      const std::string& msg, int code) {
  Say(msg);
  rep->source = "none";
  rep->reason = msg;
  json record = rep->ToJson();
  record["recovery"] = rec.ToJson();
  record["from_memory"] = false;
  coord::JobKeys keys(o.job);
  store->Set(keys.Recovery(rep->n), record.dump(), Deadline::AfterSeconds(5))
      .status()
      .IgnoreError();
  summary.recoveries.push_back(*rep);
  return JobEnd{false, code, msg};
}

// A new incarnation of the job's history (the durable epoch, the attempt) and
// the records restore and recovery/<n> in the store.
void Launcher::State::PublishRecovery(TimePoint detected, RecoveryReport* rep) {
  // Durable parts written from now on carry the new epoch (chosen when the
  // recovery began), so that node 0 never commits a version from parts of
  // two histories (docs/durable_tier.md, "Cluster mode").
  if (recovery_epoch > 0) {
    if (Status st = SetEpoch(*store, o.job, recovery_epoch, Deadline::AfterSeconds(5)); st.ok()) {
      rep->epoch = recovery_epoch;
    } else {
      Say("cannot bump the durable epoch: " + st.ToString());
    }
  }
  ++attempt;
  commit_history.SetAttempt(attempt);
  rep->attempt = attempt;
  rep->total_s = SecondsBetween(detected, Now()) + rep->detect_s;
  coord::JobKeys keys(o.job);
  json restore = {{"step", rep->step}, {"attempt", attempt}};
  restore_record = restore;
  recovery_records[rep->n] = rep->ToJson().dump();
  store->Set(keys.Restore(), restore.dump(), Deadline::AfterSeconds(5)).status().IgnoreError();
  store->Set(keys.Recovery(rep->n), rep->ToJson().dump(), Deadline::AfterSeconds(5))
      .status()
      .IgnoreError();
  Say(rep->ToString());
  summary.recoveries.push_back(*rep);
}

}  // namespace memento::launch
