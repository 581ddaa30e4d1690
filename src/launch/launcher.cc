#include "launch/launcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/log.h"
#include "coord/membership.h"
#include "launch/launcher_state.h"

namespace memento::launch {

// ---- options ------------------------------------------------------------------

std::string InProcessMode(const LaunchOptions& o) {
  if (o.recovery == "undo" || o.recovery == "log") return o.recovery;
  if (o.recovery != "auto") return "";
  if (o.dp >= 2) return "undo";
  if (o.pp >= 2) return "log";
  return "";
}

Result<std::unique_ptr<Launcher>> Launcher::Create(LaunchOptions o) {
  if (o.nodes < 1)
    return InvalidArgumentError("--nodes must be >= 1, got " + std::to_string(o.nodes));
  if (o.ranks_per_node < 1) {
    return InvalidArgumentError("--ranks-per-node must be >= 1, got " +
                                std::to_string(o.ranks_per_node));
  }
  if (o.tp < 1 || o.pp < 1 || o.dp < 0) {
    return InvalidArgumentError("--dp, --tp and --pp must be >= 1");
  }
  const int world = o.nodes * o.ranks_per_node;
  if (o.dp == 0) {
    if (world % (o.tp * o.pp) != 0) {
      return InvalidArgumentError("world size " + std::to_string(world) +
                                  " (nodes x ranks-per-node) is not a multiple of tp x pp = " +
                                  std::to_string(o.tp * o.pp));
    }
    o.dp = world / (o.tp * o.pp);
  }
  if (o.dp * o.tp * o.pp != world) {
    return InvalidArgumentError("dp x tp x pp = " + std::to_string(o.dp * o.tp * o.pp) +
                                " but nodes x ranks-per-node = " + std::to_string(world));
  }
  MEMENTO_RETURN_IF_ERROR(
      topo::Topology::Uniform(o.dp, o.tp, o.pp, o.zero, o.ranks_per_node).status());
  MEMENTO_RETURN_IF_ERROR(topo::ParsePolicy(o.policy).status());
  if (o.trainer.empty()) return InvalidArgumentError("no trainer command (give it after --)");
  if (o.max_restarts < 0) return InvalidArgumentError("--max-restarts must be >= 0");
  if (o.recovery != "restart" && o.recovery != "undo" && o.recovery != "log" &&
      o.recovery != "auto") {
    return InvalidArgumentError("--recovery '" + o.recovery +
                                "': expected restart, undo, log or auto");
  }
  if (o.recovery_by != "launcher" && o.recovery_by != "agents") {
    return InvalidArgumentError("--recovery-by '" + o.recovery_by +
                                "': expected launcher or agents");
  }
  if (o.coordinate_commits && o.recovery_by != "agents") {
    return InvalidArgumentError(
        "--coordinate-commits needs --recovery-by agents (the agents' recovery leader "
        "coordinates the commits); with --recovery-by " +
        o.recovery_by + " the launcher coordinates them");
  }
  if (o.recovery == "log" && o.pp < 2) {
    return InvalidArgumentError(
        "--recovery log needs --pp >= 2 (a lost pipeline stage replays its neighbours' logged "
        "messages); pp is " +
        std::to_string(o.pp));
  }
  if (!(o.in_process_timeout_s > 0)) {
    return InvalidArgumentError("--in-process-timeout must be > 0");
  }
  if (o.recovery == "undo" && o.dp < 2) {
    return InvalidArgumentError(
        "--recovery undo needs --dp >= 2 (the lost rank is rebuilt from a data-parallel "
        "replica); dp is " +
        std::to_string(o.dp) + " (use restart, or auto)");
  }
  if (o.job.empty()) o.job = "launch-" + std::to_string(getpid());
  MEMENTO_RETURN_IF_ERROR(coord::ValidateName("job", o.job));
  if (o.run_dir.empty()) o.run_dir = "/dev/shm/memento-launch/" + o.job;
  if (o.memento_binary.empty()) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return ErrnoError("readlink /proc/self/exe", errno);
    o.memento_binary.assign(buf, static_cast<size_t>(n));
  }
  auto inj = ParseInjections(o.inject, world, o.nodes);
  if (!inj.ok()) return inj.status();
  if (!o.store_url.empty() && o.store_process) {
    return InvalidArgumentError("--store " + o.store_url +
                                " (an external store) and --store-process exclude each other");
  }
  if (!(o.store_down_s >= 0)) return InvalidArgumentError("--store-down-s must be >= 0");
  for (const Injection& i : *inj) {
    if (i.target == Injection::kLeader && o.recovery_by != "agents") {
      return InvalidArgumentError("injection " + i.ToString() +
                                  ": the recovery leader is the agents' (--recovery-by agents); "
                                  "with --recovery-by " +
                                  o.recovery_by + " no agent leads");
    }
    if (i.in_transfer && o.recovery_by == "agents") {
      return InvalidArgumentError("injection " + i.ToString() +
                                  ": '@transfer=K' fires while the launcher's own recovery "
                                  "moves bytes; with --recovery-by agents the agents' leader "
                                  "runs it (use kill-agent|kill-node:leader@recovery=K)");
    }
    if (i.in_durable_load && (o.recovery_by == "agents" || o.durable_dir.empty())) {
      return InvalidArgumentError(
          "injection " + i.ToString() +
          ": '@durable=K' fires while the launcher's own recovery loads a durable version; " +
          (o.durable_dir.empty() ? std::string("the job has no --durable-dir")
                                 : std::string("with --recovery-by agents the agents' leader "
                                               "loads it")));
    }
    if (i.kind != InjectKind::kKillStore) continue;
    if (!o.store_url.empty()) {
      return InvalidArgumentError("injection " + i.ToString() + ": the store " + o.store_url +
                                  " is external; the launcher can only kill a store process "
                                  "it runs (--store-process)");
    }
    o.store_process = true;  // a store that can be lost needs its own process
  }
  if (o.netns) {
    if (std::string why = NodeNetwork::Unsupported(); !why.empty()) {
      return FailedPreconditionError(why);
    }
    if (o.store_url.rfind("tcp://127.", 0) == 0 || o.store_url.rfind("tcp://localhost", 0) == 0 ||
        o.store_url.rfind("etcd://127.", 0) == 0 || o.store_url.rfind("etcd://localhost", 0) == 0) {
      return InvalidArgumentError("--netns: the store " + o.store_url +
                                  " is on loopback, which the nodes' namespaces cannot reach");
    }
  }
  std::unique_ptr<Launcher> l(new Launcher(std::move(o)));
  l->injections_ = std::move(*inj);
  return l;
}

Launcher::~Launcher() = default;

// ---- helpers shared by launcher*.cc ---------------------------------------------

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return InternalError("mkdir -p " + path + ": " + ec.message());
  chmod(path.c_str(), 0700);
  return Status::Ok();
}

void RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string Seconds3(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", s);
  return b;
}

// ---- the supervisor -------------------------------------------------------------

Status Launcher::State::SetUp(Deadline setup, StoreMode* store_mode) {
  world = o.nodes * o.ranks_per_node;
  MEMENTO_ASSIGN_OR_RETURN(topology.topology,
                           topo::Topology::Uniform(o.dp, o.tp, o.pp, o.zero, o.ranks_per_node));
  MEMENTO_ASSIGN_OR_RETURN(topology.policy, topo::ParsePolicy(o.policy));
  topology.policy.host_bytes_per_node = o.host_budget;
  topology.policy.copy_bytes_per_node = o.copy_budget;
  topology.policy.network_bytes_per_node = o.network_budget;
  topology.sharded = o.sharded;
  fired.assign(injections.size(), false);
  agents.resize(static_cast<size_t>(o.nodes));
  node_lost.assign(static_cast<size_t>(o.nodes), false);

  MEMENTO_RETURN_IF_ERROR(MakeDirs(o.run_dir));
  logs = o.run_dir + "/logs";
  MEMENTO_RETURN_IF_ERROR(MakeDirs(logs));
  token_path = o.run_dir + "/job.token";
  MEMENTO_RETURN_IF_ERROR(token.WriteFile(token_path));
  if (o.netns) {
    MEMENTO_ASSIGN_OR_RETURN(network, NodeNetwork::Create(o.nodes));
    if (!o.quiet) Say("network namespaces: " + network->Describe());
  }
  StoreHostOptions sho;
  if (network) sho.listen_host = network->BridgeAddress();
  sho.mode = !o.store_url.empty() ? StoreMode::kExternal
             : o.store_process    ? StoreMode::kProcess
                                  : StoreMode::kInProcess;
  *store_mode = sho.mode;
  sho.url = o.store_url;
  sho.memento_binary = o.memento_binary;
  sho.token_path = token_path;
  sho.log_path = logs + "/store.log";
  sho.port_file = port_file = o.run_dir + "/store.port";
  MEMENTO_ASSIGN_OR_RETURN(store_host, StoreHost::Start(sho, token, setup));
  store = &store_host->store();
  store_url = store_host->url();
  if (sho.mode == StoreMode::kExternal) {
    // A job name reused in a long-lived store would inherit old commits.
    auto old = coord::ReadLatestCommit(*store, o.job, setup);
    if (old.ok()) {
      return FailedPreconditionError("the store " + o.store_url + " already holds commits of job " +
                                     o.job + " (step " + std::to_string(*old) +
                                     "): choose another --job");
    }
  }
  MEMENTO_RETURN_IF_ERROR(PublishTopology(*store, o.job, topology, setup));
  if (o.coordinate_commits) {
    // The agents' leader coordinates (--coordinate-commits on every agent).
    commit_history.WatchCommits(store, o.job);
  } else {
    MEMENTO_RETURN_IF_ERROR(StartCoordinator(setup));
  }
  commit_history.WatchSkips(store, o.job);
  return Status::Ok();
}

std::optional<JobEnd> Launcher::State::CheckProtection() {
  const auto [n, why] = commit_history.Unprotected();
  if (n <= unprotected_warned) return std::nullopt;
  if (unprotected_warned == 0) {
    Say("WARNING: the job is running UNPROTECTED: a node could not write the redundancy "
        "of a step (" +
        why + ")" +
        (o.require_protection ? ""
                              : "; going on without protection (--require-protection "
                                "would end the job)"));
  } else if (n >= 2 * unprotected_warned) {
    Say("WARNING: " + std::to_string(n) + " step(s) unprotected so far");
  }
  if (unprotected_warned == 0 || n >= 2 * unprotected_warned) unprotected_warned = n;
  if (o.require_protection) {
    return JobEnd{
        false, kExitUnprotected,
        "--require-protection: a step could not be protected (" + why + "); the job is stopped"};
  }
  return std::nullopt;
}

std::vector<NodeMemory> Launcher::State::MeasureMemory(int64_t step) const {
  std::vector<NodeMemory> out;
  for (int n = 0; n < o.nodes; ++n) {
    std::vector<int> ranks;
    const auto& rank_node = topology.topology.rank_node;
    for (size_t r = 0; r < rank_node.size(); ++r) {
      if (rank_node[r] == n) ranks.push_back(static_cast<int>(r));
    }
    auto m = MeasureNodeMemory(n, Root(n), ranks, step);
    if (!m.ok()) {
      MEMENTO_LOG_INFO("host memory of node {} not measured: {}", n, m.status().ToString());
      continue;
    }
    AddPlanBytes(*plan, &*m);
    out.push_back(*m);
  }
  return out;
}

LaunchSummary Launcher::State::Finish(JobEnd end) {
  StopTrainers();
  WatchRecoveries();
  if (in_process.has_value()) FinishInProcess();  // the job ended before it resumed
  ReportUnappliedCorruptions();
  StopAgents();
  summary.final_committed = Committed();
  if (plan.has_value() && summary.final_committed >= 0) {
    summary.memory = MeasureMemory(summary.final_committed);
  }
  summary.store_restarts = store_restarts;
  coordinator.reset();
  commit_history.WatchCommits(nullptr, o.job);
  commit_history.WatchSkips(nullptr, o.job);
  summary.commits = commit_history.Summary();
  summary.commits.coordinator = o.coordinate_commits ? "agents" : "launcher";
  store_host->Stop();
  if (!o.keep_run_dir) {
    for (int i = 0; i < o.nodes; ++i) RemoveAll(Root(i));
    for (int a = 0; a <= attempt; ++a) {
      RemoveAll(o.run_dir + "/rendezvous." + std::to_string(a));
    }
    unlink(token_path.c_str());
    unlink(port_file.c_str());
  }
  summary.success = end.success;
  summary.exit_code = end.exit_code;
  summary.message = std::move(end.message);
  summary.attempts = attempt + 1;
  return summary;
}

namespace {

// The job's token: the one named (--token-file, MEMENTO_JOB_TOKEN), which an
// external embedded store was started with; else a fresh one (etcd has its
// own authentication, so the agents' token is generated as for a hosted
// store).
Result<net::JobToken> JobTokenFor(const LaunchOptions& o) {
  const bool store_has_token = !o.store_url.empty() && o.store_url.rfind("etcd://", 0) != 0;
  Result<net::JobToken> token = (!o.token_file.empty() || store_has_token)
                                    ? net::JobToken::Load(o.token_file)
                                    : net::JobToken::Generate();
  if (!token.ok()) {
    return token.status().WithContext(o.store_url.empty()
                                          ? "the job token (--token-file)"
                                          : "the job token of the store " + o.store_url +
                                                " (--token-file or MEMENTO_JOB_TOKEN)");
  }
  return token;
}

}  // namespace

void Launcher::State::Announce(StoreMode store_mode) const {
  if (o.quiet) return;
  Say("job " + o.job + ": " + std::to_string(o.nodes) + " node(s) x " +
      std::to_string(o.ranks_per_node) + " rank(s), dp " + std::to_string(o.dp) + " tp " +
      std::to_string(o.tp) + " pp " + std::to_string(o.pp) + " zero " + std::to_string(o.zero) +
      ", policy " + o.policy + "; store " + store_url + " (" +
      std::string(StoreModeName(store_mode)) + "); run dir " + o.run_dir);
  for (const Injection& inj : injections) Say("will inject " + inj.ToString());
}

Status Launcher::State::StartNodes(Deadline setup) {
  for (int i = 0; i < o.nodes; ++i) {
    MEMENTO_RETURN_IF_ERROR(StartAgent(i, /*fresh_root=*/false));
  }
  MEMENTO_RETURN_IF_ERROR(WaitAgentsReady(setup));
  if (!o.quiet) Say("agents ready; starting " + std::to_string(world) + " trainer(s)");
  return StartTrainers();
}

std::optional<JobEnd> Launcher::State::OnFailure(const std::string& cause, int failed_rank,
                                                 const ExitStatus& failed_status) {
  // --recovery undo|auto: a lost rank is replaced in process when it can
  // be; otherwise (and for lost nodes and agents) the whole job restarts.
  const std::string fallback = TryInProcess(cause, failed_rank, failed_status);
  if (fallback.empty()) return std::nullopt;
  return Recover(cause, fallback == "restart" ? "" : fallback);
}

JobEnd Launcher::State::Supervise(const std::atomic<bool>& stop_requested) {
  while (true) {
    if (stop_requested.load()) return {false, 130, "stopped by a signal"};
    // The store: restart a killed one when its down time is over; notice one
    // that died or forgot the job. Nothing below waits on a store that is down.
    if (Status st = RestartStoreIfDue(); !st.ok()) return {false, 1, st.ToString()};
    if (Status st = CheckStore(); !st.ok()) return {false, 1, st.ToString()};
    if (!StoreDown()) MaybePublishPlan();

    // Steps whose redundancy could not be written ran unprotected: loud, and
    // with --require-protection the end of the job.
    if (auto end = CheckProtection()) return std::move(*end);

    if (!injections.empty() && !StoreDown()) FireInjections();

    bool all_done = false;
    int failed_rank = -1;
    ExitStatus failed_status;
    const std::string cause = PollChildren(&all_done, &failed_rank, &failed_status);
    if (cause.empty() && all_done) {
      if (!o.quiet) Say("every trainer finished");
      return {true, 0, "every trainer exited 0"};
    }
    if (!cause.empty()) {
      if (auto end = OnFailure(cause, failed_rank, failed_status)) return std::move(*end);
      continue;
    }
    if (const std::string stuck = WatchRecoveries(); !stuck.empty()) {
      if (auto end = Recover(stuck)) return std::move(*end);
      continue;
    }
    ReportProgress();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<LaunchSummary> Launcher::Run() {
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, JobTokenFor(options_));
  State s(options_, injections_, std::move(token));
  // The agents' start counts from here (the store's start included).
  const Deadline setup = Deadline::AfterSeconds(options_.agent_start_timeout_s);
  StoreMode store_mode = StoreMode::kInProcess;
  MEMENTO_RETURN_IF_ERROR(s.SetUp(setup, &store_mode));
  s.Announce(store_mode);
  // Everything below ends through Finish, which stops the children.
  if (Status st = s.StartNodes(setup); !st.ok()) return s.Finish({false, 1, st.ToString()});
  return s.Finish(s.Supervise(stop_requested_));
}

}  // namespace memento::launch
