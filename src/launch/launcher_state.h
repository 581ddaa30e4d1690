// Internal to the launcher (src/launch/launcher*.cc), not for other layers:
// the state of the supervisor behind Launcher::Run and its steps, one file per
// seam:
//   launcher.cc            the options, Run's steps (setup, start, the
//                          supervisor loop, the end)
//   launcher_store.cc      the store: the commit coordinator, the plan hash,
//                          the store's loss and restart (kill-store)
//   launcher_processes.cc  starting, watching and stopping agents and trainers
//   launcher_inject.cc     firing the injections (launch/inject.h)
//   launcher_recovery.cc   recovery orchestration: agents back, RecoverJob,
//                          the durable fallback, the trainers' restart
//   launcher_reports.cc    the reports and the summary (text and JSON)
// Thread model: launcher.h (everything here runs on Run()'s thread).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "coord/commit.h"
#include "coord/keys.h"
#include "launch/commit_history.h"
#include "launch/inject.h"
#include "launch/job_recovery.h"
#include "launch/launcher.h"
#include "launch/netns.h"
#include "launch/node_memory.h"
#include "launch/recovery_leader.h"
#include "launch/store_host.h"
#include "net/job_token.h"
#include "topo/plan.h"

namespace memento::launch {

// How the job ends: LaunchSummary's success, exit_code and message.
struct JobEnd {
  bool success = false;
  int exit_code = 1;
  std::string message;
};

// The newest step the job reached in the current attempt: `committed`, or a
// newer COMPLETED step among the nodes' signal records (`signals`, encoded
// coord::SignalRecord values) sent at or after `since_wall_ns`. Older
// records are the abandoned history's: after a rewind to an older step (a
// durable fallback) a node's last signal can name a step the new attempt has
// not reached yet. Records that do not decode are skipped.
int64_t ReachedStepOf(int64_t committed, const std::vector<std::string>& signals,
                      int64_t since_wall_ns);

// Helpers shared by the launcher*.cc files.
Status MakeDirs(const std::string& path);  // mkdir -p, mode 0700
void RemoveAll(const std::string& path);   // rm -rf, errors ignored
std::string Seconds3(double s);            // "%.3f"

struct Launcher::State {
  using json = nlohmann::json;

  const LaunchOptions& o;
  const std::vector<Injection>& injections;
  // --netns: first member after the options, so it is torn down last (after
  // every child died).
  std::unique_ptr<NodeNetwork> network;
  int world = 0;
  JobTopology topology;
  net::JobToken token;
  std::string token_path, store_url, logs, port_file;
  std::unique_ptr<StoreHost> store_host;
  coord::Store* store = nullptr;  // store_host->store(); valid while store_host lives
  // Declared after store_host and before coordinator: it outlives the
  // coordinator that feeds it, and its skip watcher dies before the store.
  CommitHistory commit_history;
  std::unique_ptr<coord::CommitCoordinator> coordinator;
  std::optional<topo::Plan> plan;
  std::vector<Subprocess> agents;
  std::vector<bool> node_lost;
  std::vector<Subprocess> trainers;
  std::vector<bool> trainer_done;
  int attempt = 0;
  int restarts = 0;                      // failures recovered from (--max-restarts)
  std::optional<TimePoint> injected_at;  // the last injected failure
  // The rank the last kill-rank injection killed, until a poll reports it:
  // when its death makes a peer fail too (a SIGPIPE, a Gloo error) in the
  // same poll, the injected rank is the failure reported.
  int injected_rank = -1;
  std::vector<bool> fired;
  std::vector<int> pending_corruptions;  // corrupt-rank targets
  bool corrupt_durable_pending = false;  // corrupt-durable fired
  int64_t unprotected_warned = 0;        // unprotected steps at the last warning
  Stopwatch progress_clock;
  int64_t last_progress_step = -2;
  // The store (docs/launch.md, "The store"). commit/latest only grows (in
  // (epoch, step) order, coord::CommitId), but a restarted store forgets it
  // until the agents republish it: the launcher keeps the newest it saw
  // (known_committed is its step).
  int64_t known_committed = -1;
  coord::CommitId known_commit;
  // When the current attempt's trainers were started (CLOCK_REALTIME ns; 0:
  // the first attempt): ReachedStep counts no signal sent before it.
  int64_t attempt_wall_ns = 0;
  // The commit epoch of the recovery in progress (BumpEpoch; 0: none).
  uint64_t recovery_epoch = 0;
  // --recovery-by agents: the newest epoch the launcher saw (its commits',
  // the last recovery's), sent with the request (RequestRecovery's
  // epoch_floor): the leader's epoch is above it even after the store
  // restarted empty.
  uint64_t agents_epoch_floor = 0;
  std::optional<TimePoint> store_down_since;    // killed; the fresh one is not started yet
  std::optional<TimePoint> store_restarted_at;  // watching for the commits to come back
  std::vector<StoreRestartReport> store_restarts;
  Stopwatch store_check_clock;
  // What the launcher wrote besides the topology and plan hash, to republish.
  json restore_record;                          // null before the first recovery
  std::map<int, std::string> recovery_records;  // recovery/<n>
  LaunchSummary summary;
  // In-process recovery (--recovery undo|log|auto; launch/swift_protocol.h). The
  // generation counts in-process recoveries within the current attempt (the
  // rendezvous dir is per attempt).
  int generation = 0;
  struct InProcess {
    RecoveryReport rep;
    TimePoint detected;
    double detected_wall = 0;  // CLOCK_REALTIME, as the trainers report
    bool recovered = false;    // every rank reported its recovery
  };
  std::optional<InProcess> in_process;  // started, not yet resumed
  // A whole-job restart waiting for the trainers' first step
  // (RecoveryReport::resume_s of summary.recoveries[index]).
  struct ResumeWatch {
    size_t index = 0;
    std::string path;
    double detected_wall = 0;
  };
  std::optional<ResumeWatch> resume_watch;

  State(const LaunchOptions& options, const std::vector<Injection>& injections_in, net::JobToken t)
      : o(options), injections(injections_in), token(std::move(t)) {}

  std::string Rendezvous() const { return o.run_dir + "/rendezvous." + std::to_string(attempt); }
  std::string Root(int node) const { return o.run_dir + "/node" + std::to_string(node); }
  // The address node `node`'s agent listens on and its argv prefix (--netns).
  std::string NodeAddress(int node) const {
    return network ? network->NodeAddress(node) : "127.0.0.1";
  }
  std::vector<std::string> InNode(int node, std::vector<std::string> argv) const {
    if (!network) return argv;
    std::vector<std::string> out = network->ExecPrefix(node);
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  int NodeOf(int rank) const { return rank / o.ranks_per_node; }

  void Say(const std::string& line) const {
    std::printf("[launch] %s\n", line.c_str());
    std::fflush(stdout);
  }

  bool StoreDown() const { return store_down_since.has_value(); }

  // The newest committed step: commit/latest, or the newest the launcher saw
  // (a restarted store has none until an agent republishes it).
  int64_t Committed() {
    if (StoreDown()) return known_committed;
    auto r = coord::ReadLatestCommitId(*store, o.job, Deadline::AfterSeconds(5));
    if (r.ok()) LearnCommit(*r);
    return known_committed;
  }
  void LearnCommit(const coord::CommitId& id) {
    if (known_commit < id) {
      known_commit = id;
      known_committed = id.step;
    }
  }

  // ---- launcher.cc ----
  // Launcher::Run's steps: SetUp, Announce, StartNodes, Supervise (which
  // calls OnFailure for each failure), Finish.
  // The run dir, the token file, the network namespaces, the store, the
  // topology and the commit coordinator, by `setup`. Fills `store_mode`.
  Status SetUp(Deadline setup, StoreMode* store_mode);
  // The job's first lines (unless quiet): its shape, store, run dir and
  // the injections.
  void Announce(StoreMode store_mode) const;
  // Every node's agent, by `setup` ready, then every trainer.
  Status StartNodes(Deadline setup);
  // The supervisor loop: the store, protection, injections, the children's
  // failures and recoveries, progress; until the job ends (every trainer
  // exited 0, a failure it cannot recover from, or `stop_requested`).
  JobEnd Supervise(const std::atomic<bool>& stop_requested);
  // A failed child (`cause`; a trainer's rank and status, else -1): the
  // in-process recovery when it can run, else the whole-job recovery.
  // Returns the job's end, or nothing when the job goes on.
  std::optional<JobEnd> OnFailure(const std::string& cause, int failed_rank,
                                  const ExitStatus& failed_status);
  // Steps whose redundancy could not be written: warns; the job's end with
  // --require-protection.
  std::optional<JobEnd> CheckProtection();
  // Stops the children and the store, removes the node roots (unless
  // keep_run_dir) and fills the summary.
  LaunchSummary Finish(JobEnd end);
  // Every node's host bytes next to the plan's (LaunchSummary::memory).
  std::vector<NodeMemory> MeasureMemory(int64_t step) const;

  // ---- launcher_store.cc ----
  Status RepublishLauncherKeys(Deadline deadline);
  void KillStore(const std::string& cause, int recovery, int64_t reached);
  Status RestartStore();
  Status RestartStoreIfDue();
  Status CheckStore();
  int64_t ReachedStep();
  Status StartCoordinator(Deadline deadline);
  void MaybePublishPlan();
  // The commit rule starts over (after a recovery): drops the completion
  // reports of the failed attempt and restarts the coordinator.
  Status RestartCommitRule();

  // ---- launcher_processes.cc ----
  Status StartAgent(int node, bool fresh_root);
  std::string DeadAgents();
  Status WaitAgentsReady(Deadline deadline);
  Status WaitEndpoints(Deadline deadline);
  Status StartTrainers();
  // One trainer rank into the current rendezvous dir; `extra_env` besides
  // the job's environment.
  Status StartTrainer(int rank, const std::vector<std::string>& extra_env);
  void StopTrainers();
  void StopAgents();
  // Polls every child. Returns the cause of a failure (empty: none) and sets
  // *all_done when every trainer exited 0. A failed trainer: *failed_rank and
  // *failed_status (else -1).
  std::string PollChildren(bool* all_done, int* failed_rank, ExitStatus* failed_status);
  // Every 2 s (unless quiet): the committed step and the running trainers.
  void ReportProgress();

  // ---- launcher_inject.cc ----
  // Fires the injections due at the job's step (not the @recovery ones).
  void FireInjections();
  // kill-agent / kill-node (also at a recovery): SIGKILL node inj.target's
  // agent; kill-node also its trainers, removes its root and marks it lost.
  void KillAgentOrNode(const Injection& inj);
  // The @recovery=N injections of recovery `recovery`: kill-store (the store
  // is restarted before this returns), kill-agent and kill-node. Returns
  // what was killed ("injected kill-node:1@recovery=0"; empty: nothing), so
  // the caller restarts that recovery's round.
  // (kill-agent|kill-node:leader@recovery=N not fired before: the node
  // whose agent leads at this point.)
  Result<std::string> FireRecoveryInjections(int recovery);
  // kill-agent|kill-node:I@transfer=N of recovery `recovery`, while its
  // rebuild moves bytes (RecoverOptions::on_transfer): the agent is dead
  // (reaped) when this returns, so the round fails and the next one
  // restarts or replaces it. With `moved` false (the recovery rebuilt
  // nothing) they do not fire; the launcher says so.
  void FireTransferInjections(int recovery, bool moved = true);
  // kill-agent|kill-node:`node`@durable=N of recovery `recovery` (the first
  // one not fired yet), as node `node`'s durable load request goes out
  // (LoadDurableOnEveryNode's on_request; the caller serializes the calls):
  // the agent is dead (reaped) when this returns.
  void FireDurableLoadInjection(int recovery, int node);
  // --recovery-by agents, kill-agent|kill-node:leader@recovery=N while an
  // agent of recovery N is still down (the lost node's, before it is
  // replaced): files the request (filed_request), waits until the leader
  // took it up (its status "waiting": it waits for that agent) and kills
  // the leader's node; the next leader takes the request over. Nothing
  // when no such injection is due or no agent is down (then
  // FireRecoveryInjections fires it).
  Status KillLeaderMidRecovery(int recovery);
  // corrupt-rank: applied to `committed` once the trainers are stopped;
  // one whose node lost its memory (node_lost, or in `lost_nodes`: this
  // failure's, already replaced by a fresh agent) says it did not fire.
  void ApplyPendingCorruptions(int64_t committed, const std::vector<int>& lost_nodes);
  // At the job's end: says which corruptions never applied (no failure, or
  // no durable fallback, came after them) and which @durable kills never
  // fired.
  void ReportUnappliedCorruptions();
  // corrupt-durable: applied when a recovery falls back to the durable tier.
  void ApplyPendingDurableCorruption();

  // ---- launcher_recovery.cc ----
  // The recovery after a failure: returns the job's end, or nothing when the
  // trainers run again. `fallback`: why the in-process recovery did not run
  // or failed (the report says so); an in-process recovery in progress is
  // taken over (same failure, same report).
  std::optional<JobEnd> Recover(const std::string& cause, const std::string& fallback = "");
  // --recovery undo|log|auto and a trainer rank failed: starts the in-process
  // recovery (new generation, only that rank again) and returns "", or
  // returns why it cannot run (then Recover with it as the fallback).
  std::string TryInProcess(const std::string& cause, int rank, const ExitStatus& status);
  // Follows the in-process recovery and a restart's resume through the
  // trainers' reports; finishes their reports. Returns a cause (then
  // Recover falls back to the restart) when not every rank reported its
  // in-process recovery within --in-process-timeout.
  std::string WatchRecoveries();
  void FinishInProcess();
  // Agents back, then the recovery: RecoverJob here (--recovery-by
  // launcher: *recovered) or by the agents' leader (--recovery-by agents:
  // *by_agents, its final recovery_status). Neither set: nothing to recover
  // (no plan or no commit yet).
  std::optional<JobEnd> RestartAgentsAndRecover(TimePoint detected, RecoveryReport* rep,
                                                std::optional<JobRecovery>* recovered,
                                                std::optional<RecoveryStatus>* by_agents);
  // --recovery-by agents: raises recovery_request and waits for the leader's
  // final recovery_status of that request (or a newer one). Unavailable when
  // an agent died meanwhile, DeadlineExceeded past --recovery-timeout.
  // Waits on filed_request instead when KillLeaderMidRecovery filed it.
  Result<RecoveryStatus> RecoverByAgents();
  int64_t filed_request = 0;  // the request of the recovery in progress (0: none yet)
  // Fills the report from the leader's final status; the job's end when it
  // failed (exit 3 when nothing can be restored, as the launcher's own path).
  std::optional<JobEnd> TakeAgentsOutcome(const RecoveryStatus& s, RecoveryReport* rep);
  // Fills the report from the launcher's own RecoverJob (*rec): memory, or
  // the durable tier when memory cannot rebuild a committed version; the
  // job's end when neither restores one.
  std::optional<JobEnd> TakeLauncherOutcome(const JobRecovery& rec, RecoveryReport* rep);
  // The newest complete durable version that verifies and loads: true when
  // one was loaded, false when none (each skipped one in
  // rep->durable_skipped). An error when a version failed to load because
  // a node's agent kept dying (LoadDurableRestartingAgents): no older
  // version is tried while that one is complete.
  Result<bool> FallBackToDurableTier(const JobRecovery& rec, RecoveryReport* rep);
  // *agents_failed: set when the load failed for a node's agent, not for
  // the version.
  Result<DurableLoad> FallBackToDurable(int64_t step, const std::string& memory_reason,
                                        RecoveryReport* rep, bool* agents_failed);
  // LoadDurableOnEveryNode of `step` on every node; a node whose agent is
  // gone (died mid-load, or unreachable) gets its agent restarted on its
  // root (replaced on an empty one when its node was lost) and the load
  // runs again on every node, at most kDurableLoadTries times in all, each
  // retry said. Fires the kill-agent|kill-node:I@durable=K injections.
  // Errors: the version's own (*agents_failed false), or Unavailable naming
  // the node(s) whose agent was still gone after the last try
  // (*agents_failed true).
  static constexpr int kDurableLoadTries = 3;
  Result<DurableLoad> LoadDurableRestartingAgents(int64_t step, RecoveryReport* rep,
                                                  bool* agents_failed);
  // Kills what is left of `node`'s agent, starts it again (on an empty root
  // when the node was lost: then a lost node of the report) and waits until
  // it listens and has joined the membership.
  Status RestartAgentForLoad(int node, RecoveryReport* rep);
  JobEnd EndWithNothingRestored(const JobRecovery& rec, RecoveryReport* rep);
  // The recovery ends with nothing restored (`msg`, exit `code`): recorded as
  // recovery/<n> and in the summary.
  JobEnd EndUnrestored(const JobRecovery& rec, RecoveryReport* rep, const std::string& msg,
                       int code);
  void PublishRecovery(TimePoint detected, RecoveryReport* rep);
};

}  // namespace memento::launch
