// `memento launch`: runs a cluster job of N simulated nodes on this machine
// (docs/launch.md, docs/cluster.md).
//
//   - hosts the coordination store (launch/store_host.h: in-process by
//     default, a child `memento store` process, or an external store) and
//     runs the CommitCoordinator over all N nodes against it; when the store
//     loses everything (its process killed and restarted empty) it republishes
//     its own keys (topology, plan hash, restore target, recovery records)
//     while the agents republish theirs;
//   - writes the job token file (0600) and /memento/<job>/topology, and
//     /memento/<job>/plan_hash once every rank's inventory is in the store;
//   - starts one `memento agent` per node (root RUN/node<i>) and the trainers
//     with the environment of docs/cluster.md ("{rank}"... substituted in
//     their arguments);
//   - on a failure (a trainer exits non-zero or dies, an agent dies), stops
//     every trainer like torchrun's elastic agent, replaces a lost node by a
//     fresh agent on an empty root (an agent that died alone restarts on its
//     root and adopts it), runs the recovery (launch/job_recovery.h), stores
//     /memento/<job>/restore and /memento/<job>/recovery/<n>, and restarts
//     every trainer with attempt + 1 and a fresh rendezvous directory;
//   - injects failures (launch/inject.h).
//
// Thread model: Run() is a single supervisor loop on the caller's thread
// (polls children, the store and the injections every 20 ms); the store
// server and the commit coordinator have their own threads (src/coord);
// RecoverJob uses short-lived threads, one per node. RequestStop() is
// async-signal-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/commit_history.h"
#include "launch/inject.h"
#include "launch/node_memory.h"
#include "memento/status.h"

namespace memento::launch {

struct LaunchOptions {
  std::string job;  // empty: "launch-<pid>"
  int nodes = 1;
  int ranks_per_node = 1;
  int dp = 0;  // 0: world / (tp * pp)
  int tp = 1;
  int pp = 1;
  int zero = 0;  // ZeRO stage (0 or 1; 3 = no inherent redundancy)
  std::string policy = "xor";
  // `auto`'s budgets (0 = unlimited), published with the job topology so
  // that every agent resolves `auto` as the launcher does: host bytes a node
  // may hold per version, device -> host bytes a node may copy per snapshot.
  // Checked against the plan's bytes (docs/reft.md); ignored by other
  // policies.
  uint64_t host_budget = 0;
  uint64_t copy_budget = 0;
  // Bytes a node may receive from peers per snapshot (model::MakeJobPlan).
  uint64_t network_budget = 0;
  // Sharded snapshots (docs/reft.md): published in the job topology
  // ("sharded": true); each rank's slot then holds its plan ranges only.
  bool sharded = false;
  // Agents stream committed versions here (`memento agent --durable-dir`).
  std::string durable_dir;
  std::string inject;  // launch/inject.h
  int max_restarts = 3;
  // What a trainer rank's failure triggers (docs/launch.md, "Recovery
  // modes"; a lost node or agent is always a whole-job restart):
  //   restart  stop every trainer, recover from memory, start all again
  //   undo     in process (SWIFT, docs/swift.md): the survivors stay alive,
  //            undo a partial update and reconnect; only the lost rank is
  //            started again, its state from a DP replica (ZeRO-1: its moment
  //            shard from its node's T0). Needs dp > 1. Falls back to restart
  //            when it cannot proceed.
  //   log      in process (SWIFT's logging-based recovery): the survivors
  //            stay (undo a partial update if needed); the lost pipeline
  //            stage starts again, loads its last snapshot (its node's T0,
  //            or the trainer's --save state) and replays its neighbours'
  //            logged messages up to the survivors' step; with dp > 1 the
  //            lost rank's DP peers roll back to their snapshots and replay
  //            with it. Needs tp 1, pp > 1. Falls back to restart when it
  //            cannot proceed (a log entry that fails its checksum, a replay
  //            that diverges).
  //   auto     undo where dp > 1, log where dp 1, tp 1 and pp > 1, restart
  //            otherwise
  std::string recovery = "restart";
  // undo: seconds from the failure until every rank reported its in-process
  // recovery; past it (a survivor wedged, a trainer that does not speak the
  // protocol) the launcher falls back to restarting the whole job.
  double in_process_timeout_s = 60;
  // Node roots (node<i>), logs (logs/), the token file and rendezvous dirs.
  // Empty: /dev/shm/memento-launch/<job>.
  std::string run_dir;
  bool keep_run_dir = false;  // keep node roots (shared memory) after the job
  // A step whose redundancy a node could not write (ResourceExhausted: shared
  // memory full, the agent's --budget) ran unprotected. The launcher always
  // warns (log and summary); with this it ends the job instead, exit code
  // kExitUnprotected.
  bool require_protection = false;
  // The `memento` binary that runs the agents; empty: this executable.
  std::string memento_binary;
  std::vector<std::string> agent_args;  // extra flags for every agent
  // TRAINER ARGS ({rank}, {node}, {world_size}, {job}, {run_dir}, {attempt},
  // {rendezvous}, {dp}, {tp}, {pp}, {node_dir} are substituted).
  std::vector<std::string> trainer;
  double agent_start_timeout_s = 60;
  double recovery_timeout_s = 120;
  // Who runs a whole-job recovery (docs/launch.md, "Who recovers"):
  //   launcher  this process: inventory -> decide -> rebuild -> restore
  //             target (launch/job_recovery.h), the durable fallback
  //   agents    the agents' elected recovery leader (launch/recovery_leader.h,
  //             the agents run with --recovery-leader request), the same code
  //             path as under torchrun or Slurm: the launcher only (re)places
  //             the processes, raises /memento/<job>/recovery_request and
  //             waits for the leader's recovery_status (restore step, source)
  std::string recovery_by = "agents";
  // With recovery_by "agents": the agents' recovery leader coordinates the
  // commits (`memento agent --coordinate-commits`; a successor takes them
  // over) and the launcher runs no coordinator of its own; its commit
  // history follows commit/latest (CommitHistory::WatchCommits).
  bool coordinate_commits = false;
  // Progress lines on stdout (failures and recoveries are always printed).
  bool quiet = false;
  // The coordination store (launch/store_host.h): in this process (default),
  // in a child `memento store` process (store_process; a kill-store injection
  // implies it), or an external store at store_url (tcp://H:P; the job token
  // then comes from token_file or MEMENTO_JOB_TOKEN).
  bool store_process = false;
  std::string store_url;
  // The job token to use instead of a fresh random one (copied to RUN/job.token).
  std::string token_file;
  // How long a killed store process stays down before the launcher starts a
  // fresh, empty one on the same address (kill-store).
  double store_down_s = 1.0;
  // Every node's agent and trainers in their own network namespace
  // (launch/netns.h; root and iproute2 needed).
  bool netns = false;
};

// One loss of the store process (kill-store, or the process died) and how the
// job came back from it.
struct StoreRestartReport {
  int n = 0;
  std::string cause;
  int recovery = -1;              // killed during this recovery; -1: while training
  int64_t reached_step = -1;      // the job's step when it was lost
  int64_t committed_before = -1;  // commit/latest when it was lost
  double down_s = 0;              // loss to the fresh store answering
  // From the fresh store answering: until commit/latest was back at
  // committed_before (republished by the agents), and until a newer step
  // committed (commits resumed). -1: not (yet) seen.
  double republished_s = -1;
  double resumed_s = -1;
  int64_t resumed_step = -1;
  nlohmann::json ToJson() const;
  std::string ToString() const;
};

struct RecoveryReport {
  int n = 0;
  int attempt = 0;  // the attempt the trainers restart with
  std::string cause;
  int64_t committed = -1;  // newest committed step at the failure
  int64_t step = -1;       // the step restored; -1: restarted from scratch
  std::vector<int> lost_nodes;
  double detect_s = 0, restart_s = 0, inventory_plan_s = 0, transfer_s = 0, decode_s = 0,
         write_s = 0, total_s = 0;
  uint64_t rebuilt_bytes = 0;
  // Where the restored step came from: "memory" (T0/T1 of the survivors),
  // "durable" (the durable tier, when memory could not rebuild any committed
  // version), "scratch" (nothing to restore: the trainers start over), or
  // "none" (nothing could be restored: the job ended with exit 3);
  // "memory (aor replica)" when a lost ZeRO-1 optimizer shard came from the
  // replica a peer's node recomputed on the host (docs/reft.md section 5).
  std::string source = "memory";
  int64_t steps_lost = 0;   // committed - step when restoring an older step
  double load_s = 0;        // durable: kPeerLoadDurable on every node (wall)
  uint64_t read_bytes = 0;  // durable: bytes read from the durable tier
  uint64_t epoch = 0;       // the durable epoch the job continues with
  // Durable fallback: newer versions passed over, each "step N <why>" (fails
  // verification, or loading it failed).
  std::vector<std::string> durable_skipped;
  std::string reason;
  // Which recovery ran: "restart" (every trainer stopped and started again),
  // "undo" or "log" (in process: only the lost rank restarted).
  std::string mode = "restart";
  // A restart's recovery ran by "launcher" (this process) or "agents" (their
  // elected leader, --recovery-by agents: `leader` names its node, `takeover`
  // when a leader took over a recovery its lost predecessor left unfinished).
  std::string recovered_by = "launcher";
  std::string leader;
  bool takeover = false;
  // Why an in-process recovery was not possible or failed (empty: none).
  std::string fallback;
  int processes_restarted = 0;  // trainer processes started for this failure
  int replaced_rank = -1;       // undo: the rank started again
  int generation = 0;           // undo: the in-process generation
  int64_t reached_step = -1;    // undo: the newest step a survivor had completed
  // log: steps replayed, summed over the stages that replayed (the
  // replacement; with selective logging its log group too), how many
  // stages replayed, and the logged payload bytes they replayed.
  int64_t replayed_steps = 0;
  int replayed_stages = 0;
  uint64_t bytes_replayed = 0;
  // From the failure to the first step completed after the recovery (the
  // trainer reports it in the rendezvous dir, launch/swift_protocol.h); -1:
  // not reported.
  double resume_s = -1;
  nlohmann::json ToJson() const;
  std::string ToString() const;  // one line with the breakdown
};

// `memento launch` exit codes besides 0, 1, 2 (usage), 3 (a loss beyond the
// protection, nothing to fall back to) and 130 (a signal).
inline constexpr int kExitUnprotected = 4;  // --require-protection: a step went unprotected

struct LaunchSummary {
  bool success = false;
  int exit_code = 1;
  int attempts = 1;
  int64_t final_committed = -1;
  CommitHistorySummary commits;
  std::vector<std::string> failures;
  std::vector<RecoveryReport> recoveries;
  std::vector<StoreRestartReport> store_restarts;
  // At the end, per node: the host bytes of the newest committed version
  // (T0 + T1) and the bytes copied per snapshot, next to the plan's (REFT's
  // formulas). Empty when the job never had a plan (no rank sealed) or no
  // step committed; a node whose root could not be measured (lost, no slot
  // of that step) is left out.
  std::vector<NodeMemory> memory;
  std::string message;  // why it ended
  nlohmann::json ToJson() const;
  std::string ToString() const;
};

// The in-process recovery `o.recovery` runs on a lost trainer rank: "undo",
// "log", or "" (none: a whole-job restart). For "auto": undo where dp > 1,
// log where dp 1, tp 1 and pp > 1. The trainers learn it from
// MEMENTO_RECOVERY (launch/swift_protocol.h).
std::string InProcessMode(const LaunchOptions& o);

class Launcher {
 public:
  // InvalidArgument naming the bad option (sizes, policy, injections, no trainer).
  [[nodiscard]] static Result<std::unique_ptr<Launcher>> Create(LaunchOptions options);
  ~Launcher();

  // Runs the job to its end: every trainer exited 0 (success), a failure that
  // cannot be recovered, more than max_restarts failures, or RequestStop().
  // Children are stopped and node roots removed (unless keep_run_dir) before
  // it returns. An error Status only for setup failures (store, run dir).
  [[nodiscard]] Result<LaunchSummary> Run();

  // Async-signal-safe: makes Run() stop the job and return.
  void RequestStop() { stop_requested_.store(true); }

  const LaunchOptions& options() const { return options_; }

 private:
  explicit Launcher(LaunchOptions options) : options_(std::move(options)) {}
  struct State;
  LaunchOptions options_;
  std::vector<Injection> injections_;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace memento::launch
