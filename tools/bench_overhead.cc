// `memento bench overhead --json`: what per-step snapshotting costs a real
// training job (issue 5). Runs the reference trainer (`memento-trainer`, a
// subprocess: tools/ does not link examples/) with and without `--memento`
// on the same topology, alternating in ABBA order (off,on / on,off / ...) so
// that a slow drift of the shared machine falls on both sides, and compares
// the trainer's own mean step time (its `--json` summary, which leaves out
// the first step: warm-up, rendezvous, seal and first touch of the slots).
//
// An "on" run starts one `memento agent` per node under a fresh root below
// a private /dev/shm directory and a fresh job id, so nothing is restored and
// every step is snapshotted; agents and roots are removed after each run.
//
// With --cluster the on runs are a cluster job as under `memento launch`:
// an embedded coordination store and commit coordinator in this process,
// the job's topology published, every agent in cluster mode (--store), so
// that each snapshot becomes a committed version only once every node has
// made its redundancy (T1). The ranks' summaries then carry the commit lag
// (docs/cluster.md, "Commit lag"): commit_lag_* in the JSON, per round and
// over the rounds (the worst rank's quantiles). --sharded publishes
// "sharded": true in that topology: each rank snapshots only its plan ranges
// of replicated state (docs/reft.md section 1). --compare sharded runs the
// same cluster job on both sides, whole-tensor slots ("off") against
// sharded ones ("on"), and reports each side's bytes copied per step, copy
// CPU and hook times next to the step times (issue 15: the per-step
// snapshot cost before and after sharding).
//
// Output (one JSON object): step_s_off, step_s_on, overhead_pct (the means
// over rounds), overhead_pct_median (the median of the rounds' overheads:
// robust to one disturbed round on a shared machine), preset, params,
// topology, the load average, and every round's values.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "launch/job_recovery.h"
#include "memento/status.h"
#include "net/job_token.h"
#include "tools/bench_agents.h"
#include "tools/bench_stats.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"
#include "tools/trainer_binary.h"
#include "topo/plan.h"

namespace memento::tools {
namespace {

struct OverheadArgs {
  std::string trainer;
  std::string preset = "100m";
  int64_t steps = 5;
  int rounds = 2;
  int dp = 2, pp = 2, tp = 1;
  bool no_zero = false;
  int batch = 2;
  int micro_batches = 1;
  int ranks_per_node = 1;
  double run_timeout_s = 900;
  std::string copy_priority;   // empty: the client's default
  std::string schedule;        // empty: the trainer's default (auto)
  bool cluster = false;        // on runs as a cluster job (store, commits, T1)
  std::string policy = "xor";  // --cluster: the job's redundancy policy
  bool sharded = false;        // --cluster: sharded snapshots (memento launch --sharded)
  // "memento": off = no memento, on = memento. "aor": both sides are
  // memento cluster runs, off = the trainer's --no-aor, on = AOR (the
  // trainer's default under ZeRO-1 with DP > 1). "sharded": both sides are
  // memento cluster runs, off = whole-tensor slots, on = sharded slots.
  std::string compare = "memento";
  bool keep = false;
  bool json = true;
};

// The 1-minute load average (/proc/loadavg), -1 when unreadable: how busy
// the shared machine was, next to the numbers.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one = -1;
  if (!(in >> one)) return -1;
  return one;
}

// Starts argv with stdout and stderr appended to `log`; the child dies with us.
Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) {
  SpawnOptions options;
  options.argv = argv;
  options.log_path = log;
  MEMENTO_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(options));
  return child.Release();  // waited for and killed by pid below
}

// Waits for pid until the deadline; kills it (SIGKILL) after that.
// Returns the wait status, or -1 when it had to be killed.
int WaitOrKill(pid_t pid, Deadline deadline) {
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    if (deadline.expired()) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string Tail(const std::string& path) { return TailFile(path, 2000); }

struct RunResult {
  nlohmann::json summary;  // the trainer's --json line
  double wall_s = 0;
  // CPU accounting, per step summed over all ranks: the ranks' process
  // CPU-seconds (training, Gloo and copy threads) and the copy workers' part.
  double cpu_s = 0;
  double copy_cpu_s = 0;
  double agent_cpu_s = 0;  // the agents' CPU-seconds for the whole run (on)
  double snap_bytes = 0;   // bytes snapshotted per step, all ranks (on)
  // The newest snapshot's bytes, all ranks: the steady layout. A sharded
  // client writes whole tensors until the cluster's plan exists, so the
  // per-step mean above depends on how soon the plan came (load).
  double snap_bytes_last = 0;
  // --cluster: the commit lag the ranks saw (the worst rank's quantiles;
  // null without --cluster).
  nlohmann::json commit_lag;
  // The agents' own accounting of their CPU by activity, summed over the
  // agents (the "agent cpu by activity:" line each logs when it stops;
  // empty when none logged it).
  nlohmann::json agent_activity;
  // Every CPU-second of the agents by thread name, summed over the agents:
  // the whole run (s), and per version after each agent's first report.
  nlohmann::json agent_by_thread;
  nlohmann::json agent_by_thread_per_version;
  // The trainer's AOR time per call, the mean over the ranks that fed
  // replicas (the "aor" object of their snapshot summaries; null: none).
  nlohmann::json aor;
};

// Sums the numeric fields of the last "<prefix>{...}" line of each agent log
// <dir>/agent<n>.log: "agent cpu by activity: ", "agent cpu by thread: "
// (seconds over the whole run by thread, common/thread_cpu.h) or "agent cpu
// by thread per version after the first: " (the steady part per version).
nlohmann::json AgentLogSums(const std::string& dir, int nodes, const std::string& key) {
  nlohmann::json sum = nlohmann::json::object();
  for (int n = 0; n < nodes; ++n) {
    std::ifstream in(dir + "/agent" + std::to_string(n) + ".log");
    std::string line, last;
    while (std::getline(in, line)) {
      const size_t pos = line.find(key);
      if (pos != std::string::npos) last = line.substr(pos + key.size());
    }
    auto j = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) continue;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it->is_number()) sum[it.key()] = sum.value(it.key(), 0.0) + it->get<double>();
    }
  }
  return sum;
}

// The embedded store, token file and commit coordinator of one --cluster run,
// with the job's topology published (what `memento launch` sets up).
struct ClusterJob {
  std::unique_ptr<coord::EmbeddedStoreServer> server;
  std::unique_ptr<coord::CommitCoordinator> coordinator;
  std::vector<std::string> agent_args;  // --store, --token-file, --listen
};

Result<ClusterJob> StartClusterJob(const OverheadArgs& a, const std::string& job,
                                   const std::string& dir, int nodes, bool sharded) {
  ClusterJob c;
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Generate());
  const std::string token_file = dir + "/job.token";
  MEMENTO_RETURN_IF_ERROR(token.WriteFile(token_file));
  MEMENTO_ASSIGN_OR_RETURN(c.server, coord::EmbeddedStoreServer::Start("127.0.0.1", 0, token));
  coord::Store& store = c.server->store();
  launch::JobTopology jt;
  const int zero = (!a.no_zero && a.dp > 1) ? 1 : 0;
  MEMENTO_ASSIGN_OR_RETURN(jt.topology,
                           topo::Topology::Uniform(a.dp, a.tp, a.pp, zero, a.ranks_per_node));
  MEMENTO_ASSIGN_OR_RETURN(jt.policy, topo::ParsePolicy(a.policy));
  jt.sharded = sharded;
  MEMENTO_RETURN_IF_ERROR(launch::PublishTopology(store, job, jt, Deadline::AfterSeconds(10)));
  std::set<std::string> members;
  for (int i = 0; i < nodes; ++i) members.insert(coord::NodeName(i));
  MEMENTO_ASSIGN_OR_RETURN(c.coordinator, coord::CommitCoordinator::Start(
                                              &store, job, members, Deadline::AfterSeconds(10)));
  c.agent_args = {"--store",      "tcp://127.0.0.1:" + std::to_string(c.server->port()),
                  "--token-file", token_file,
                  "--listen",     "127.0.0.1:0"};
  return c;
}

// One trainer run (all ranks via --launch), with agents when `on`; with
// --compare aor, `aor` says whether the trainer feeds AOR replicas;
// `sharded`: the cluster job's slots are sharded.
Result<RunResult> RunOnce(const OverheadArgs& a, const std::string& trainer,
                          const std::string& self, const std::string& base, int index, bool on,
                          bool aor, bool sharded) {
  const int world = a.dp * a.pp * a.tp;
  const int nodes = (world + a.ranks_per_node - 1) / a.ranks_per_node;
  const std::string dir = base + "/run" + std::to_string(index);
  if (mkdir(dir.c_str(), 0700) != 0) return ErrnoError("mkdir " + dir, errno);
  const std::string job =
      "bench-overhead-" + std::to_string(getpid()) + "-" + std::to_string(index);
  std::vector<Subprocess> agents;
  ClusterJob cluster;
  auto cleanup = [&] {
    StopBenchAgents(&agents);
    // The agents first: without their store they retry until deadlines pass.
    cluster.coordinator.reset();
    cluster.server.reset();
    if (!a.keep) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  if (on && a.cluster) {
    auto c = StartClusterJob(a, job, dir, nodes, sharded);
    if (!c.ok()) {
      cleanup();
      return c.status();
    }
    cluster = std::move(*c);
  }
  if (on) {
    auto started = StartBenchAgents(self, job, dir, nodes, 30, cluster.agent_args);
    if (!started.ok()) {
      cleanup();
      return started.status();
    }
    agents = std::move(*started);
  }
  std::vector<std::string> argv = {trainer,
                                   "--launch",
                                   "--preset",
                                   a.preset,
                                   "--dp",
                                   std::to_string(a.dp),
                                   "--pp",
                                   std::to_string(a.pp),
                                   "--tp",
                                   std::to_string(a.tp),
                                   "--batch",
                                   std::to_string(a.batch),
                                   "--micro-batches",
                                   std::to_string(a.micro_batches),
                                   "--steps",
                                   std::to_string(a.steps),
                                   "--quiet",
                                   "--json"};
  if (!a.no_zero && a.dp > 1) argv.push_back("--zero");
  if (on) {
    for (const char* s : {"--memento", "--job-id"}) argv.push_back(s);
    argv.push_back(job);
    argv.push_back("--agent-dir");
    argv.push_back(dir + "/node{node}");
    argv.push_back("--ranks-per-node");
    argv.push_back(std::to_string(a.ranks_per_node));
    if (!a.copy_priority.empty()) {
      argv.push_back("--memento-copy-priority");
      argv.push_back(a.copy_priority);
    }
    if (!a.schedule.empty()) {
      argv.push_back("--memento-schedule");
      argv.push_back(a.schedule);
    }
    if (!aor) argv.push_back("--no-aor");
    // A cluster job's ranks wait for their first snapshot to commit (in
    // the first step, which is not timed): the timed steps start with the
    // cluster committing (store, coordinator, plan and T1 production up),
    // and the ranks see at least one version committed (commit_lag) however
    // loaded the machine.
    if (a.cluster) {
      argv.push_back("--memento-pace-commits");
      argv.push_back("1");
    }
  }
  const std::string log = dir + "/trainer.log";
  Stopwatch wall;
  auto pid = Spawn(argv, log);
  if (!pid.ok()) {
    cleanup();
    return pid.status();
  }
  int status = WaitOrKill(*pid, Deadline::AfterSeconds(a.run_timeout_s));
  RunResult out;
  out.wall_s = wall.Seconds();
  if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string tail = Tail(log);
    cleanup();
    return InternalError(std::string("memento-trainer ") + (on ? "(memento on)" : "(off)") +
                         (status < 0 ? " timed out" : " failed") + ": " + tail);
  }
  std::ifstream in(log);
  std::string line;
  int rank_summaries = 0;
  int aor_ranks = 0;
  while (std::getline(in, line)) {
    for (const char* key : {"{\"params\"", "{\"rank_summary\""}) {
      size_t pos = line.find(key);
      if (pos == std::string::npos) continue;
      auto j = nlohmann::json::parse(line.substr(pos), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;
      if (j.contains("mean_step_s")) out.summary = j;
      if (!j.contains("rank_summary")) continue;
      const nlohmann::json& rs = j["rank_summary"];
      ++rank_summaries;
      out.cpu_s += rs.value("mean_cpu_s", 0.0);
      const nlohmann::json& snap = rs.contains("snapshot") ? rs["snapshot"] : nlohmann::json();
      if (snap.is_object() && snap.value("snapshots", int64_t{0}) > 0) {
        const double snaps = static_cast<double>(snap["snapshots"].get<int64_t>());
        out.copy_cpu_s += snap.value("copy_cpu_s", 0.0) / snaps;
        out.snap_bytes += snap.value("bytes", 0.0) / snaps;
        out.snap_bytes_last += snap.value("last_bytes", 0.0);
      }
      if (snap.is_object() && snap.contains("aor") && snap["aor"].is_object()) {
        ++aor_ranks;
        if (out.aor.is_null()) out.aor = nlohmann::json::object();
        for (auto it = snap["aor"].begin(); it != snap["aor"].end(); ++it) {
          if (it->is_number()) out.aor[it.key()] = out.aor.value(it.key(), 0.0) + it->get<double>();
        }
      }
      if (snap.is_object() && snap.contains("commit_lag") && snap["commit_lag"].is_object()) {
        const nlohmann::json& lag = snap["commit_lag"];
        if (out.commit_lag.is_null()) {
          out.commit_lag = lag;
        } else {
          // The worst rank: the largest quantiles, the fewest versions seen.
          for (auto it = lag.begin(); it != lag.end(); ++it) {
            if (!it->is_number()) continue;
            const double v = it->get<double>();
            const double have = out.commit_lag.value(it.key(), v);
            out.commit_lag[it.key()] = (it.key() == "versions" || it.key() == "samples")
                                           ? std::min(have, v)
                                           : std::max(have, v);
          }
        }
      }
    }
  }
  if (aor_ranks > 0) {
    for (auto it = out.aor.begin(); it != out.aor.end(); ++it) {
      *it = it->get<double>() / aor_ranks;
    }
    out.aor["ranks"] = aor_ranks;
  }
  if (on) {
    out.agent_cpu_s = StopBenchAgents(&agents);
    out.agent_activity = AgentLogSums(dir, nodes, "agent cpu by activity: ");
    out.agent_by_thread = AgentLogSums(dir, nodes, "agent cpu by thread: ");
    out.agent_by_thread_per_version =
        AgentLogSums(dir, nodes, "agent cpu by thread per version after the first: ");
  }
  cleanup();
  if (out.summary.is_null()) {
    return InternalError("no JSON summary in the trainer's output: " + Tail(log));
  }
  if (rank_summaries != world) {
    return InternalError("expected " + std::to_string(world) + " rank summaries, got " +
                         std::to_string(rank_summaries) + ": " + Tail(log));
  }
  return out;
}

int RunOverheadBench(const OverheadArgs& a) {
  if (a.steps < 2) return ReportStatus(InvalidArgumentError("--steps must be >= 2"));
  if (a.rounds < 1) return ReportStatus(InvalidArgumentError("--rounds must be >= 1"));
  if (a.dp < 1 || a.pp < 1 || a.tp < 1 || a.ranks_per_node < 1) {
    return ReportStatus(InvalidArgumentError("--dp, --pp, --tp, --ranks-per-node must be >= 1"));
  }
  if (a.sharded && !a.cluster) {
    return ReportStatus(
        InvalidArgumentError("--sharded needs --cluster (sharded snapshots follow the plan the "
                             "cluster agents compute)"));
  }
  const bool compare_aor = a.compare == "aor";
  const bool compare_sharded = a.compare == "sharded";
  if (!compare_aor && !compare_sharded && a.compare != "memento") {
    return ReportStatus(
        InvalidArgumentError("--compare: '" + a.compare + "' is not one of memento, aor, sharded"));
  }
  if (compare_sharded && !a.cluster) {
    return ReportStatus(InvalidArgumentError(
        "--compare sharded needs --cluster (sharded snapshots follow the plan the cluster "
        "agents compute)"));
  }
  if (compare_sharded && a.sharded) {
    return ReportStatus(InvalidArgumentError(
        "--compare sharded runs both sides (whole and sharded): leave out --sharded"));
  }
  if (compare_aor && (!a.cluster || a.no_zero || a.dp < 2)) {
    return ReportStatus(InvalidArgumentError(
        "--compare aor needs --cluster, ZeRO-1 (no --no-zero) and --dp >= 2: AOR replicates "
        "ZeRO-1 optimizer shards between the nodes of a cluster job"));
  }
  if (a.cluster) {
    if (auto p = topo::ParsePolicy(a.policy); !p.ok()) {
      return ReportStatus(InvalidArgumentError("--policy: " + p.status().message()));
    }
  }
  // Logs (the --cluster coordinator's commits) go to stderr: stdout is the
  // one JSON object.
  InitLogging("bench", LogOptionsFromEnvironment());
  auto trainer = FindTrainer(a.trainer);
  if (!trainer.ok()) return ReportStatus(trainer.status());
  const std::string self = SelfExe();
  if (!IsExecutable(self)) return ReportStatus(InternalError("cannot find /proc/self/exe"));
  char tmpl[] = "/dev/shm/memento-bench-overhead-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportStatus(ErrnoError("mkdtemp", errno));
  const std::string base = tmpl;
  std::fprintf(stderr, "bench overhead: trainer %s, work dir %s\n", trainer->c_str(), base.c_str());
  Stopwatch total;
  const double load_start = LoadAverage();
  nlohmann::json rounds = nlohmann::json::array();
  double sum_off = 0, sum_on = 0, sum_fence = 0, sum_snap = 0, sum_fence_off = 0, sum_snap_off = 0;
  double sum_cpu_off = 0, sum_cpu_on = 0, sum_copy_cpu = 0, sum_agent_cpu = 0, snap_bytes = 0;
  double sum_copy_cpu_off = 0, sum_agent_cpu_off = 0, snap_bytes_off = 0;
  double snap_bytes_last = 0, snap_bytes_last_off = 0;
  std::vector<double> offs, ons, pcts;
  nlohmann::json first;
  nlohmann::json lag_worst;  // --cluster: the worst round's value of each quantile
  nlohmann::json activity_sum = nlohmann::json::object();  // agents' CPU by activity, all rounds
  nlohmann::json thread_sum = nlohmann::json::object();    // agents' CPU by thread, all rounds
  nlohmann::json thread_version_sum = nlohmann::json::object();  // the same per version
  auto add_into = [](nlohmann::json* into, const nlohmann::json& from) {
    if (!from.is_object()) return;
    for (auto it = from.begin(); it != from.end(); ++it) {
      (*into)[it.key()] = into->value(it.key(), 0.0) + it->get<double>();
    }
  };
  Status failed;
  int index = 0;
  for (int r = 0; r < a.rounds && failed.ok(); ++r) {
    // ABBA: off,on then on,off.
    const bool on_first = (r % 2) == 1;
    RunResult res[2];  // [0] off, [1] on
    for (int k = 0; k < 2 && failed.ok(); ++k) {
      const bool on = (k == 0) == on_first;
      // --compare aor / sharded: both sides run memento; `on` is AOR on,
      // or sharded slots.
      const bool both = compare_aor || compare_sharded;
      auto run = RunOnce(a, *trainer, self, base, index++, on || both, on || !compare_aor,
                         compare_sharded ? on : a.sharded);
      if (!run.ok()) {
        failed = run.status();
        break;
      }
      res[on ? 1 : 0] = *run;
      std::fprintf(stderr,
                   "bench overhead: round %d %s %s: mean_step_s %.6f, hooks: fence %.3f ms + "
                   "snapshot %.3f ms%s%s (load %.1f)\n",
                   r, compare_aor ? "aor" : (compare_sharded ? "sharded" : "memento"),
                   on ? "on " : "off", run->summary["mean_step_s"].get<double>(),
                   run->summary.value("mean_fence_s", 0.0) * 1e3,
                   run->summary.value("mean_snapshot_s", 0.0) * 1e3,
                   run->aor.is_object()
                       ? fmt::format("; aor per call: capture {:.3f} ms, checksum {:.3f} ms, "
                                     "report {:.3f} ms",
                                     run->aor.value("capture_s", 0.0) * 1e3,
                                     run->aor.value("checksum_s", 0.0) * 1e3,
                                     run->aor.value("report_s", 0.0) * 1e3)
                             .c_str()
                       : "",
                   compare_sharded
                       ? fmt::format("; snapshot bytes/step (all ranks) {:.0f} (newest "
                                     "snapshot {:.0f}), copy cpu/step (all ranks) "
                                     "{:.3f} ms",
                                     run->snap_bytes, run->snap_bytes_last, run->copy_cpu_s * 1e3)
                             .c_str()
                       : "",
                   LoadAverage());
    }
    if (!failed.ok()) break;
    if (first.is_null()) first = res[0].summary;
    const double off = res[0].summary["mean_step_s"].get<double>();
    const double on = res[1].summary["mean_step_s"].get<double>();
    sum_off += off;
    sum_on += on;
    offs.push_back(off);
    ons.push_back(on);
    pcts.push_back(off > 0 ? (on - off) / off * 100 : 0.0);
    sum_cpu_off += res[0].cpu_s;
    sum_cpu_on += res[1].cpu_s;
    sum_copy_cpu += res[1].copy_cpu_s;
    sum_agent_cpu += res[1].agent_cpu_s;
    snap_bytes = res[1].snap_bytes;
    snap_bytes_last = res[1].snap_bytes_last;
    snap_bytes_last_off = res[0].snap_bytes_last;
    sum_copy_cpu_off += res[0].copy_cpu_s;
    sum_agent_cpu_off += res[0].agent_cpu_s;
    snap_bytes_off = res[0].snap_bytes;
    add_into(&activity_sum, res[1].agent_activity);
    add_into(&thread_sum, res[1].agent_by_thread);
    add_into(&thread_version_sum, res[1].agent_by_thread_per_version);
    if (res[1].commit_lag.is_object()) {
      for (auto it = res[1].commit_lag.begin(); it != res[1].commit_lag.end(); ++it) {
        if (!it->is_number()) continue;
        const double v = it->get<double>();
        const double have = lag_worst.is_object() ? lag_worst.value(it.key(), v) : v;
        lag_worst[it.key()] = (it.key() == "versions" || it.key() == "samples") ? std::min(have, v)
                                                                                : std::max(have, v);
      }
    }
    sum_fence += res[1].summary.value("mean_fence_s", 0.0);
    sum_fence_off += res[0].summary.value("mean_fence_s", 0.0);
    sum_snap_off += res[0].summary.value("mean_snapshot_s", 0.0);
    sum_snap += res[1].summary.value("mean_snapshot_s", 0.0);
    rounds.push_back({{"order", on_first ? "on,off" : "off,on"},
                      {"step_s_off", off},
                      {"step_s_on", on},
                      {"overhead_pct", off > 0 ? (on - off) / off * 100 : 0.0},
                      {"fence_s_on", res[1].summary.value("mean_fence_s", 0.0)},
                      {"snapshot_s_on", res[1].summary.value("mean_snapshot_s", 0.0)},
                      {"fence_s_off", res[0].summary.value("mean_fence_s", 0.0)},
                      {"snapshot_s_off", res[0].summary.value("mean_snapshot_s", 0.0)},
                      {"aor_per_call_on", res[1].aor},
                      {"cpu_s_per_step_off", res[0].cpu_s},
                      {"cpu_s_per_step_on", res[1].cpu_s},
                      {"copy_cpu_s_on", res[1].copy_cpu_s},
                      {"copy_cpu_s_off", res[0].copy_cpu_s},
                      {"snap_bytes_per_step_on", res[1].snap_bytes},
                      {"snap_bytes_per_step_off", res[0].snap_bytes},
                      {"snap_bytes_last_on", res[1].snap_bytes_last},
                      {"snap_bytes_last_off", res[0].snap_bytes_last},
                      {"agent_cpu_s_on", res[1].agent_cpu_s},
                      {"agent_cpu_s_off", res[0].agent_cpu_s},
                      {"agent_cpu_s_per_step_off",
                       a.steps > 0 ? res[0].agent_cpu_s / static_cast<double>(a.steps) : 0.0},
                      {"agent_cpu_s_per_step_on",
                       a.steps > 0 ? res[1].agent_cpu_s / static_cast<double>(a.steps) : 0.0},
                      {"commit_lag_on", res[1].commit_lag},
                      {"agent_cpu_by_activity_on", res[1].agent_activity},
                      {"agent_cpu_s_by_thread_on", res[1].agent_by_thread},
                      {"agent_cpu_s_per_version_by_thread_on", res[1].agent_by_thread_per_version},
                      {"wall_s_off", res[0].wall_s},
                      {"wall_s_on", res[1].wall_s},
                      {"loadavg_1m", LoadAverage()}});
  }
  if (!a.keep) {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
  }
  if (!failed.ok()) return ReportStatus(failed);
  const int n = a.rounds;
  const double off = sum_off / n, on = sum_on / n;
  const int world = a.dp * a.pp * a.tp;
  // The agents' steady CPU per version (= per step: every step is
  // snapshotted), all agents, by thread and in all; then the ranks' CPU
  // overhead with it added to the on side.
  nlohmann::json per_version_by_thread = nlohmann::json::object();
  double agent_per_version = 0;
  for (auto it = thread_version_sum.begin(); it != thread_version_sum.end(); ++it) {
    per_version_by_thread[it.key()] = it->get<double>() / n;
    agent_per_version += it->get<double>() / n;
  }
  nlohmann::json by_thread_per_step = nlohmann::json::object();
  for (auto it = thread_sum.begin(); it != thread_sum.end(); ++it) {
    by_thread_per_step[it.key()] = it->get<double>() / n / static_cast<double>(a.steps);
  }
  nlohmann::json out = {
      {"bench", "overhead"},
      {"preset", a.preset},
      {"params", first.value("params", int64_t{0})},
      {"topology",
       {{"dp", a.dp},
        {"pp", a.pp},
        {"tp", a.tp},
        {"zero1", !a.no_zero && a.dp > 1},
        {"world", world},
        {"nodes", (world + a.ranks_per_node - 1) / a.ranks_per_node},
        {"ranks_per_node", a.ranks_per_node}}},
      {"batch", a.batch},
      {"micro_batches", a.micro_batches},
      {"steps", a.steps},
      {"timed_steps_per_run", a.steps - 1},
      {"rounds", n},
      {"step_s_off", off},
      {"step_s_on", on},
      {"overhead_pct", off > 0 ? (on - off) / off * 100 : 0.0},
      {"step_s_off_median", Median(offs)},
      {"step_s_on_median", Median(ons)},
      {"overhead_pct_median", Median(pcts)},
      {"cpu_s_per_step_off", sum_cpu_off / n},
      {"cpu_s_per_step_on", sum_cpu_on / n},
      {"cpu_overhead_pct", sum_cpu_off > 0 ? (sum_cpu_on - sum_cpu_off) / sum_cpu_off * 100 : 0.0},
      {"agent_steady_cpu_s_per_version", agent_per_version},
      {"agent_steady_cpu_s_per_version_by_thread", per_version_by_thread},
      {"agent_cpu_s_per_step_by_thread", by_thread_per_step},
      {"cpu_overhead_with_agents_pct",
       // Only where the off side has no agents and the on side's reported
       // versions (--cluster); null otherwise.
       sum_cpu_off > 0 && !compare_aor && !compare_sharded && thread_version_sum.size() > 0
           ? nlohmann::json((sum_cpu_on / n + agent_per_version - sum_cpu_off / n) /
                            (sum_cpu_off / n) * 100)
           : nlohmann::json(nullptr)},
      {"copy_cpu_s_on", sum_copy_cpu / n},
      {"agent_cpu_s_on", sum_agent_cpu / n},
      {"agent_cpu_s_per_step_on",
       a.steps > 0 ? sum_agent_cpu / n / static_cast<double>(a.steps) : 0.0},
      {"cluster", a.cluster},
      {"policy", a.cluster ? a.policy : std::string("none (agents without a store)")},
      {"sharded", a.sharded},  // --compare sharded: off whole, on sharded
      {"commit_lag", lag_worst},
      {"agent_cpu_s_per_step_by_activity",
       [&] {
         // Means over rounds, per step (the counts, e.g. "produced", per run).
         nlohmann::json per = nlohmann::json::object();
         for (auto it = activity_sum.begin(); it != activity_sum.end(); ++it) {
           const double mean = it->get<double>() / n;
           // Counts and the agents' own per-version figures stay as they are.
           const bool as_is = it.key() == "produced" || it.key().rfind("steady_", 0) == 0;
           per[it.key()] = as_is ? mean : mean / static_cast<double>(a.steps);
         }
         return per;
       }()},
      {"snap_bytes_per_step", snap_bytes},
      {"snap_bytes_per_step_off", snap_bytes_off},
      {"snap_bytes_last", snap_bytes_last},
      {"snap_bytes_last_off", snap_bytes_last_off},
      {"copy_cpu_s_off", sum_copy_cpu_off / n},
      {"agent_cpu_s_off", sum_agent_cpu_off / n},
      {"agent_cpu_s_per_step_off",
       a.steps > 0 ? sum_agent_cpu_off / n / static_cast<double>(a.steps) : 0.0},
      {"copy_priority", a.copy_priority.empty() ? "default" : a.copy_priority},
      {"schedule", a.schedule.empty() ? "default" : a.schedule},
      {"loadavg_1m_start", load_start},
      {"loadavg_1m_end", LoadAverage()},
      {"fence_s_on", sum_fence / n},
      {"snapshot_s_on", sum_snap / n},
      {"fence_s_off", sum_fence_off / n},
      {"snapshot_s_off", sum_snap_off / n},
      {"compare", a.compare},
      {"per_round", rounds},
      {"wall_s", total.Seconds()},
      {"trainer", *trainer}};
  memento::tools::PrintJson("memento.bench.overhead/1", std::move(out));
  return 0;
}

void Setup(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "overhead", "Step time of the reference trainer with and without per-step snapshots");
  static OverheadArgs args;
  cmd->add_option("--trainer", args.trainer,
                  "memento-trainer binary (default: next to memento, ../examples/trainer, PATH)");
  cmd->add_option("--preset", args.preset, "trainer model preset: tiny | small | 100m | 350m")
      ->default_val(args.preset);
  cmd->add_option("--steps", args.steps, "optimizer steps per run (the first is not timed)")
      ->default_val(args.steps);
  cmd->add_option("--rounds", args.rounds, "rounds of one off and one on run (ABBA order)")
      ->default_val(args.rounds);
  cmd->add_option("--dp", args.dp, "data-parallel size")->default_val(args.dp);
  cmd->add_option("--pp", args.pp, "pipeline-parallel size")->default_val(args.pp);
  cmd->add_option("--tp", args.tp, "tensor-parallel size")->default_val(args.tp);
  cmd->add_flag("--no-zero", args.no_zero, "do not shard the AdamW moments (ZeRO-1) over DP");
  cmd->add_option("--batch", args.batch, "global batch (sequences per step)")
      ->default_val(args.batch);
  cmd->add_option("--micro-batches", args.micro_batches, "micro-batches per DP rank")
      ->default_val(args.micro_batches);
  cmd->add_option("--ranks-per-node", args.ranks_per_node, "ranks per node (one agent per node)")
      ->default_val(args.ranks_per_node);
  cmd->add_option("--run-timeout", args.run_timeout_s, "seconds one trainer run may take")
      ->default_val(args.run_timeout_s);
  cmd->add_option("--copy-priority", args.copy_priority,
                  "memento copy workers of the on runs: idle | normal (default: the client's)");
  cmd->add_option("--schedule", args.schedule,
                  "memento snapshot schedule of the on runs: auto | eager | has (default: the "
                  "trainer's, auto)");
  cmd->add_flag("--cluster", args.cluster,
                "on runs as a cluster job: embedded store + commit coordinator, topology "
                "published, agents in cluster mode (T1 redundancy, commits); reports the commit "
                "lag the ranks saw (commit_lag: steps and seconds, p50/p90/max)");
  cmd->add_option("--policy", args.policy,
                  "--cluster: the job's redundancy policy (xor, replicate, rs:F, ...)")
      ->default_val(args.policy);
  cmd->add_flag("--sharded", args.sharded,
                "--cluster: sharded snapshots, each rank copies only its plan ranges of "
                "replicated state (as `memento launch --sharded`, docs/reft.md)");
  cmd->add_option("--compare", args.compare,
                  "memento: off runs without memento, on runs with it; aor: both with memento "
                  "(needs --cluster, ZeRO-1, --dp >= 2), off runs the trainer with --no-aor (the "
                  "optimizer shards' copies cross the network), on feeds the host AOR replicas; "
                  "sharded: both with memento (needs --cluster), off with whole-tensor slots, on "
                  "with sharded slots (each side's bytes and copy CPU per step reported)")
      ->default_val(args.compare);
  cmd->add_flag("--keep", args.keep, "keep the run directories (logs, slots) under /dev/shm");
  cmd->add_flag("--json", args.json, "one-line JSON (the only output format)");
  cmd->callback([&ctx] { ctx.exit_code = RunOverheadBench(args); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(overhead, memento::tools::Setup);
