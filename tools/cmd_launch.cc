// `memento launch`: runs a cluster job of N simulated nodes on this machine
// (store, agents, trainers), restarts it after failures, injects failures.
// docs/launch.md.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/byte_flag.h"
#include "common/log.h"
#include "launch/launcher.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

launch::Launcher *g_launcher = nullptr;
constexpr const char *kLaunchSchema = "memento.launch/1";

void OnSignal(int) {
  if (g_launcher != nullptr) g_launcher->RequestStop();
}

int RunLaunch(const launch::LaunchOptions &options, const std::string &summary_json, bool json) {
  InitLogging("launch", LogOptionsFromEnvironment());
  if ((options.host_budget || options.copy_budget || options.network_budget) &&
      options.policy != "auto") {
    return ReportStatus(InvalidArgumentError(
        "--host-budget, --copy-budget and --network-budget apply to --policy auto only (got "
        "--policy " +
        options.policy + ")"));
  }
  // --json: stdout carries the summary's JSON object alone; everything else
  // this process writes to stdout (the progress lines, the human summary) is
  // sent to stderr until then.
  int json_fd = -1;
  if (json) {
    std::fflush(stdout);
    json_fd = ::dup(STDOUT_FILENO);
    if (json_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
      return ReportStatus(ErrnoError("launch --json: redirecting stdout", errno));
    }
  }
  auto launcher = launch::Launcher::Create(options);
  if (!launcher.ok()) return ReportStatus(launcher.status());
  g_launcher = launcher->get();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  auto summary = (*launcher)->Run();
  g_launcher = nullptr;
  if (!summary.ok()) return ReportStatus(summary.status());
  std::printf("%s", summary->ToString().c_str());
  std::fflush(stdout);
  if (!summary_json.empty()) {
    nlohmann::json j = summary->ToJson();
    j["schema"] = kLaunchSchema;
    std::ofstream out(summary_json);
    out << j.dump() << "\n";
  }
  if (json_fd >= 0) {
    ::dup2(json_fd, STDOUT_FILENO);
    ::close(json_fd);
    PrintJson(kLaunchSchema, summary->ToJson());
  }
  return summary->exit_code;
}

void Setup(CLI::App &app, CommandContext &ctx) {
  auto *cmd = app.add_subcommand("launch",
                                 "Run a job on N simulated nodes: coordination "
                                 "store, one agent per node, the trainers; "
                                 "restart after failures, recover lost nodes "
                                 "from memory, inject failures");
  static launch::LaunchOptions o;
  static std::string summary_json;
  cmd->add_option("--job", o.job, "Job id (default launch-<pid>)");
  cmd->add_option("--nodes", o.nodes, "Nodes (one agent each)")->default_val(1);
  cmd->add_option("--ranks-per-node", o.ranks_per_node, "Trainer ranks per node")->default_val(1);
  cmd->add_option("--dp", o.dp, "Data-parallel size (default: world / (tp x pp))");
  cmd->add_option("--tp", o.tp, "Tensor-parallel size")->default_val(1);
  cmd->add_option("--pp", o.pp, "Pipeline-parallel size")->default_val(1);
  cmd->add_option("--zero", o.zero, "ZeRO stage (0, 1; 3 = no inherent redundancy)")
      ->default_val(0);
  cmd->add_option("--policy", o.policy,
                  "Protection: none, replicate, xor, rs:F, peer:M, auto (the reliability "
                  "model's choice within the budgets below; docs/reliability.md)")
      ->default_val("xor");
  cmd->add_option("--host-budget", o.host_budget,
                  "--policy auto: host bytes a node may hold per version (plan bytes; 0: "
                  "unlimited); every agent gets it with the job topology")
      ->transform(ByteSize());
  cmd->add_option("--copy-budget", o.copy_budget,
                  "--policy auto: device->host bytes a node may copy per snapshot (plan bytes; "
                  "0: unlimited)")
      ->transform(ByteSize());
  cmd->add_option("--network-budget", o.network_budget,
                  "--policy auto: bytes a node receives from peers per snapshot (0: unlimited)")
      ->transform(ByteSize());
  o.sharded = true;  // REFT's save path is the default (docs/reft.md section 1)
  cmd->add_flag("--sharded,!--no-sharded", o.sharded,
                "Sharded snapshots, the default (docs/reft.md): each rank's T0 slot holds only "
                "the byte ranges the plan gives it (its pieces, and what its memory produces "
                "copies and parity from) instead of its whole state; published in the job "
                "topology, so trainers need no flag. --no-sharded: every rank's slot holds its "
                "whole state");
  cmd->add_option("--durable-dir", o.durable_dir,
                  "Agents stream committed versions to this directory (the durable tier)");
  cmd->add_option("--inject", o.inject,
                  "Failures to inject: kill-rank:R@step=N, kill-agent:I@step=N, "
                  "kill-node:I@step=N, corrupt-rank:R@step=N, corrupt-durable@step=N, "
                  "kill-store@step=N, kill-store@recovery=K, kill-agent:I@recovery=K, "
                  "kill-node:I@recovery=K (during recovery K, 0-based; I may be 'leader' with "
                  "--recovery-by agents: the agents' recovery leader, killed while it waits for "
                  "a lost node's replacement), comma-separated");
  cmd->add_flag("--store-process", o.store_process,
                "Run the coordination store as a child process (`memento store`); "
                "kill-store implies it");
  cmd->add_option("--store", o.store_url,
                  "Use this external coordination store instead of hosting one: "
                  "tcp://HOST:PORT (an embedded store; the token comes from --token-file or "
                  "MEMENTO_JOB_TOKEN) or etcd://HOST:PORT[,...] (a real etcd, docs/etcd.md)");
  cmd->add_option("--token-file", o.token_file,
                  "The job token file (mode 0600) to use instead of a fresh random token");
  cmd->add_option("--store-down-s", o.store_down_s,
                  "Seconds a killed store stays down before a fresh, empty one starts")
      ->default_val(1.0);
  cmd->add_option("--max-restarts", o.max_restarts, "Failures to recover from before giving up")
      ->default_val(3);
  cmd->add_option("--recovery", o.recovery,
                  "What a trainer rank's failure triggers: restart (stop every trainer, recover "
                  "from memory, start all again), undo (in process, SWIFT: the survivors stay, "
                  "undo a partial update and reconnect; only the lost rank starts again, its "
                  "state from a data-parallel replica, under --zero 1 its moment shard from its "
                  "node's T0; needs --dp >= 2; falls back to restart when it cannot proceed), "
                  "log (in process, SWIFT's log replay: the survivors stay; only the lost "
                  "pipeline stage starts again, loads its last snapshot (its node's T0, or the "
                  "trainer's --save state) and replays the messages its neighbours logged; with "
                  "--dp >= 2 the lost rank's DP peers roll back to their own snapshots and replay "
                  "with it, with --tp >= 2 its TP peers too; needs --pp >= 2; a log entry failing "
                  "its checksum or a replay that diverges falls back to restart), auto (undo "
                  "where dp >= 2, log where dp 1 and pp >= 2, else restart). A lost node or "
                  "agent always "
                  "restarts. The trainer must speak the protocol of docs/swift.md "
                  "(memento-trainer does). docs/launch.md")
      ->default_val("restart");
  cmd->add_option("--recovery-by", o.recovery_by,
                  "Who runs a whole-job recovery (a lost node or agent, --recovery restart): "
                  "agents (default: the agents elect a recovery leader, --recovery-leader "
                  "request, and it runs inventory, decide, rebuild, restore target and the "
                  "durable fallback as under torchrun or Slurm; the launcher only restarts "
                  "processes, asks for the recovery and waits for the leader's outcome) or "
                  "launcher (this process runs them itself). The commit coordinator (unless "
                  "--coordinate-commits) and the "
                  "in-process (--recovery undo|log) recoveries stay the launcher's either way. "
                  "docs/launch.md \"Who recovers\"")
      ->default_val("agents");
  cmd->add_flag("--coordinate-commits", o.coordinate_commits,
                "With --recovery-by agents: the agents' recovery leader coordinates the commits "
                "(every agent runs with --coordinate-commits; a successor takes them over) "
                "instead of this launcher, as in a job without `memento launch`. The report's "
                "commit history then follows commit/latest (commits.coordinator \"agents\"; "
                "passed-over steps are not known). docs/coordination.md \"Who coordinates the "
                "commits\"");
  cmd->add_option("--in-process-timeout", o.in_process_timeout_s,
                  "--recovery undo|log|auto: seconds from a failure until every rank reported its "
                  "in-process recovery; past it (a survivor wedged) the whole job restarts")
      ->default_val(60);
  cmd->add_option("--run-dir", o.run_dir,
                  "Node roots, logs, token file (default /dev/shm/memento-launch/<job>)");
  cmd->add_flag("--keep-run-dir", o.keep_run_dir, "Keep the node roots after the job");
  cmd->add_flag("--require-protection", o.require_protection,
                "End the job (exit 4) as soon as a step cannot be protected because a node "
                "could not write its redundancy (shared memory full, the agent's --budget); "
                "without it the launcher warns and goes on unprotected");
  cmd->add_option("--memento", o.memento_binary,
                  "The memento binary the agents run (default: this one)");
  // One value per --agent-arg: without allow_extra_args(false) a last
  // --agent-arg=X before "--" swallowed the trainer's own flags.
  cmd->add_option("--agent-arg", o.agent_args, "Extra flag for every agent (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--netns", o.netns,
                "Each node's agent and trainers in their own network namespace, on a bridge "
                "(root and iproute2 needed)");
  cmd->add_flag("--quiet", o.quiet, "Only failures, recoveries and the summary");
  static bool json = false;
  cmd->add_option("--summary-json", summary_json, "Write the final summary as JSON to this file");
  cmd->add_flag("--json", json,
                "Print the final summary as one JSON object on stdout (schema "
                "memento.launch/1); the progress lines and the human summary go to stderr");
  cmd->add_option("trainer", o.trainer,
                  "-- TRAINER ARGS: the trainer command; {rank} {node} "
                  "{world_size} {job} "
                  "{run_dir} {node_dir} {attempt} {rendezvous} {dp} {tp} {pp} "
                  "are substituted")
      ->required();
  cmd->footer(
      "Exit codes: 0 every trainer finished; 1 the job failed (a failure it could not recover "
      "from, more than --max-restarts failures, a setup error); 2 bad usage or invalid "
      "options; 3 a node loss beyond the protection with no durable version to fall back to "
      "(the plan says which pieces are gone); 4 --require-protection and a step could not be "
      "protected (a node could not write its redundancy: shared memory full, the agent's "
      "--budget); 130 stopped by SIGINT/SIGTERM.");
  cmd->callback([&ctx] { ctx.exit_code = RunLaunch(o, summary_json, json); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(launch, memento::tools::Setup);
