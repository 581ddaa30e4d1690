// `memento agent`: the node agent (src/agent). Runs until SIGTERM or SIGINT;
// the slots stay in shared memory after it exits, and the next agent on the
// same root adopts them.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/agent.h"
#include "common/byte_flag.h"
#include "common/human.h"
#include "common/log.h"
#include "coord/store.h"
#include "fmt/format.h"
#include "launch/job_recovery.h"
#include "launch/recovery_leader.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "topo/topology_json.h"

namespace memento::tools {
namespace {

agent::Agent* g_agent = nullptr;

void OnSignal(int) {
  if (g_agent != nullptr) g_agent->Stop();
}

// MEMENTO_RECOVER_DATA_PATH=stream|legacy and MEMENTO_RECOVER_RECEIVE=
// direct|staged (docs/peer_service.md, docs/recovery.md "Staged receive").
Status RecoverPathFromEnvironment(agent::JobMemberOptions* o) {
  if (const char* v = std::getenv("MEMENTO_RECOVER_DATA_PATH"); v != nullptr && *v) {
    const std::string path = v;
    if (path != "stream" && path != "legacy") {
      return InvalidArgumentError("MEMENTO_RECOVER_DATA_PATH must be 'stream' or 'legacy', not '" +
                                  path + "'");
    }
    o->recover_legacy_reads = path == "legacy";
  }
  if (const char* v = std::getenv("MEMENTO_RECOVER_RECEIVE"); v != nullptr && *v) {
    const std::string receive = v;
    if (receive != "direct" && receive != "staged") {
      return InvalidArgumentError("MEMENTO_RECOVER_RECEIVE must be 'direct' or 'staged', not '" +
                                  receive + "'");
    }
    o->recover_staged_receive = receive == "staged";
  }
  // MEMENTO_T1_RESIDENT=on|off (docs/reft.md section 4): ARC / local_full
  // copies referenced in their producer's T0 slot (on) or copied into T1.
  if (const char* v = std::getenv("MEMENTO_T1_RESIDENT"); v != nullptr && *v) {
    const std::string mode = v;
    if (mode != "on" && mode != "off") {
      return InvalidArgumentError("MEMENTO_T1_RESIDENT must be 'on' or 'off', not '" + mode + "'");
    }
    o->t1_resident = mode == "on";
  }
  return Status::Ok();
}

int RunAgent(const agent::AgentOptions& base, agent::DurableOptions durable,
             const std::string& budget, const std::string& bandwidth, const std::string& scrub_rate,
             const std::string& durable_io, const std::string& recovery_leader,
             double recovery_timeout_s, double agent_wait_s, bool coordinate_commits,
             const std::string& topology) {
  agent::AgentOptions options = base;
  InitLogging("agent node" + std::to_string(options.node), LogOptionsFromEnvironment());
  {
    auto engine = tier::ParseIoEngine(durable_io);
    if (!engine.ok()) return ReportStatus(engine.status());
    durable.io_engine = *engine;
  }
  if (!budget.empty()) {
    auto b = ParseBytes(budget);
    if (!b.ok()) return ReportStatus(b.status());
    options.budget_bytes = *b;
  }
  if (!bandwidth.empty()) {
    auto b = ParseBytes(bandwidth);
    if (!b.ok()) return ReportStatus(b.status());
    durable.bandwidth_bytes_per_sec = *b;
  }
  if (!scrub_rate.empty()) {
    auto b = ParseBytes(scrub_rate);
    if (!b.ok()) return ReportStatus(b.status());
    options.scrub_bytes_per_s = *b;
  }
  if (!(options.scrub_interval_s >= 0)) {
    return ReportStatus(InvalidArgumentError("--scrub-interval must be >= 0 seconds"));
  }
  // A peer pushes copies in parts of kMaxPushPartBytes: a smaller request
  // cap would refuse the cluster's own traffic.
  const uint64_t min_request = agent::kMaxPushPartBytes + (uint64_t{1} << 20);
  if (options.cluster.peer_max_request_bytes < min_request) {
    return ReportStatus(InvalidArgumentError(
        fmt::format("--peer-max-request {} is below {} ({}): peers push copies in parts of {}",
                    options.cluster.peer_max_request_bytes, min_request, HumanBytes(min_request),
                    HumanBytes(agent::kMaxPushPartBytes))));
  }
  if (options.cluster.peer_max_buffered_bytes < options.cluster.peer_max_request_bytes) {
    return ReportStatus(InvalidArgumentError(fmt::format(
        "--peer-max-buffered {} is below --peer-max-request {}: one request could "
        "never be held",
        options.cluster.peer_max_buffered_bytes, options.cluster.peer_max_request_bytes)));
  }
  auto leader_mode = launch::ParseRecoveryLeaderMode(recovery_leader);
  if (!leader_mode.ok()) return ReportStatus(leader_mode.status());
  if (*leader_mode != launch::RecoveryLeaderMode::kOff && options.cluster.store_url.empty()) {
    return ReportStatus(
        InvalidArgumentError("--recovery-leader " + recovery_leader + " needs --store"));
  }
  if (coordinate_commits && *leader_mode == launch::RecoveryLeaderMode::kOff) {
    return ReportStatus(InvalidArgumentError(
        "--coordinate-commits needs --recovery-leader request or auto (the recovery leader "
        "coordinates the commits)"));
  }
  // The recovery data path variants (`memento bench recover --data-path,
  // --receive` sets them for the agents it starts): read here and nowhere
  // else in the library.
  if (Status st = RecoverPathFromEnvironment(&options.cluster); !st.ok()) {
    return ReportStatus(st);
  }
  if (!topology.empty()) {
    // Before the agent joins: its job member plans from the topology.
    if (options.cluster.store_url.empty()) {
      return ReportStatus(InvalidArgumentError("--topology needs --store (cluster mode)"));
    }
    auto t = topo::ParseJobTopology(topology);
    if (!t.ok()) return ReportStatus(t.status().WithContext("--topology"));
    auto store = coord::OpenStore(options.cluster.store_url, options.cluster.token_file,
                                  Deadline::AfterSeconds(30));
    if (!store.ok()) return ReportStatus(store.status());
    Status st =
        launch::PublishTopologyIfAbsent(**store, options.job_id, *t, Deadline::AfterSeconds(10));
    if (!st.ok()) return ReportStatus(st);
  }
  if (!options.cluster.store_url.empty()) {
    // A trainer restarted by torchrun (not by a launcher that waits for the
    // recovery) asks for its restore target while the leader may still be
    // rebuilding: the answer waits for the recovery.
    options.await_recovery = [url = options.cluster.store_url, token = options.cluster.token_file,
                              job = options.job_id](Deadline deadline) -> Status {
      MEMENTO_ASSIGN_OR_RETURN(auto store,
                               coord::OpenStore(url, token, Deadline::AfterSeconds(10)));
      return launch::AwaitRecoveryIdle(*store, job, deadline);
    };
  }
  auto agent = agent::Agent::Start(options, durable);
  if (!agent.ok()) return ReportStatus(agent.status());
  // The agents' own recovery (docs/recovery.md, "Recovery run by the agents").
  launch::RecoveryLeaderOptions lo;
  lo.job = options.job_id;
  lo.node = options.node;
  lo.store_url = options.cluster.store_url;
  lo.token_file = options.cluster.token_file;
  lo.mode = *leader_mode;
  lo.lease_ttl_s = options.cluster.lease_ttl_s;
  lo.recovery_timeout_s = recovery_timeout_s;
  lo.agent_wait_s = agent_wait_s;
  lo.durable_dir = durable.dir;
  lo.coordinate_commits = coordinate_commits;
  auto leader = launch::RecoveryLeader::Start(lo);
  if (!leader.ok()) return ReportStatus(leader.status());
  g_agent = agent->get();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // The ready line (tests and launchers wait for "memento agent ready"):
  // with MEMENTO_LOG_FORMAT=json a JSON object like every other line.
  std::string ready = fmt::format("memento agent ready: job={} node={} root={}", options.job_id,
                                  options.node, (*agent)->root());
  const std::string endpoint =
      (*agent)->job_member() != nullptr ? (*agent)->job_member()->endpoint() : "";
  if (!endpoint.empty()) ready += " endpoint=" + endpoint;
  const std::string metrics = (*agent)->metrics_address();
  if (!metrics.empty()) ready += " metrics=" + metrics;
  if (JsonLogging()) {
    nlohmann::json j;
    j["msg"] = ready;
    j["event"] = "ready";
    j["job"] = options.job_id;
    j["node"] = options.node;
    j["root"] = (*agent)->root();
    if (!endpoint.empty()) j["endpoint"] = endpoint;
    if (!metrics.empty()) j["metrics"] = metrics;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", ready.c_str());
  }
  std::fflush(stdout);
  Status st = (*agent)->Serve();
  leader->reset();  // steps down (revokes its lease) before the agent goes
  g_agent = nullptr;
  return ReportStatus(st);
}

void Setup(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("agent", "Run the node agent that owns the snapshot slots");
  static agent::AgentOptions options;
  static std::string budget;
  static std::string bandwidth;
  static agent::DurableOptions durable;
  static std::string durable_io = "auto";
  cmd->add_option("--job", options.job_id, "Job id")->required();
  cmd->add_option("--node", options.node, "Node index")->default_val(0);
  cmd->add_option("--root", options.root,
                  "Directory of the slots and socket (default /dev/shm/memento/<job>/node<N>)");
  cmd->add_option("--budget", budget,
                  "Most bytes all slots of this node may take (e.g. 8G; default: what the "
                  "shared-memory filesystem holds)")
      ->transform(ByteSize());
  cmd->add_flag("--verify-on-complete", options.verify_on_complete,
                "Verify each completed slot's checksums in the background right away");
  cmd->add_option("--durable-dir", durable.dir,
                  "Stream committed versions to this directory (the durable tier; NFS, Lustre, a "
                  "bucket mount or a disk)");
  cmd->add_option("--persist-every", durable.every_k_steps,
                  "Persist committed versions whose step is a multiple of K (0: off)")
      ->default_val(1);
  cmd->add_option("--persist-every-s", durable.every_seconds,
                  "Also persist one version every T seconds (0: off)")
      ->default_val(0);
  cmd->add_option("--persist-bandwidth", bandwidth,
                  "Durable write cap in bytes per second (e.g. 200M; default unlimited)")
      ->transform(ByteSize());
  cmd->add_option("--keep-last", durable.keep_last, "Durable versions to keep (newest N)")
      ->default_val(3);
  cmd->add_option("--keep-every", durable.keep_every,
                  "Also keep durable versions whose step is a multiple of M (0: none)")
      ->default_val(0);
  cmd->add_option("--durable-hold-max-s", durable.hold_max_s,
                  "Longest time (s) the trainers skip snapshots rather than overwrite the slot "
                  "being persisted; after it the version is abandoned if overwritten (0: no hold)")
      ->default_val(30.0);
  cmd->add_option("--durable-drain-s", durable.drain_s,
                  "On stop (SIGTERM): longest time (s) to finish writing the versions already "
                  "given to the durable tier before cancelling them (0: stop at once)")
      ->default_val(30.0)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--durable-io", durable_io,
                  "Durable data-file writes: auto (io_uring where the kernel has it), uring, "
                  "pwrite")
      ->default_val("auto");
  // Cluster mode (docs/cluster.md, "Agent in cluster mode").
  cmd->add_option("--store", options.cluster.store_url,
                  "Coordination store (tcp://HOST:PORT or etcd://HOST:PORT[,...]): run in cluster "
                  "mode (membership, commits, redundancy for the other nodes, peer service)");
  cmd->add_option("--token-file", options.cluster.token_file,
                  "The job token file (mode 0600; default $MEMENTO_JOB_TOKEN)");
  cmd->add_option("--listen", options.cluster.listen,
                  "Peer service address HOST:PORT (port 0: any free port)")
      ->default_val("127.0.0.1:0");
  cmd->add_option("--lease-ttl", options.cluster.lease_ttl_s,
                  "Membership lease in seconds (the node reads OFFLINE this long after it dies)")
      ->default_val(3.0);
  cmd->add_option("--peer-max-request", options.cluster.peer_max_request_bytes,
                  "Largest request one peer connection may send the peer service (what one "
                  "connection can make the agent hold); larger frames close the connection")
      ->transform(ByteSize())
      ->default_val("64M");
  cmd->add_option("--peer-max-buffered", options.cluster.peer_max_buffered_bytes,
                  "Most bytes of received requests all peer connections together may make the "
                  "agent hold; a request beyond it is dropped unread and answered "
                  "ResourceExhausted")
      ->transform(ByteSize())
      ->default_val("256M");
  cmd->add_option("--hold-timeout", options.cluster.hold_timeout_s,
                  "Seconds a reported step that does not commit stays protected from the "
                  "trainers, and the longest wait for the copies peers push")
      ->default_val(10.0);
  cmd->add_option_function<std::string>(
         "--preallocate-slots",
         [](const std::string& v) { options.cluster.preallocate_slots = v == "on"; },
         "Before joining the job: give every local rank of the topology that has no slot on "
         "this node (a replacement node) its slot at the size a recovery rebuilds, pages faulted "
         "in, so that the recovery after the join does not wait for the kernel to zero them "
         "(costs that slot's memory from the start; docs/recovery.md \"Pre-allocated slots\")")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str("on");
  static std::string scrub_rate;
  cmd->add_option("--scrub-rate", scrub_rate,
                  "Background scrub of the slots at rest: most bytes hashed per second (e.g. "
                  "64M; 0: off)")
      ->transform(ByteSize())
      ->default_val("64M");
  cmd->add_option("--scrub-interval", options.scrub_interval_s,
                  "Seconds between two scrub passes (the first starts one interval after start)")
      ->default_val(60.0);
  cmd->add_option("--metrics-listen", options.metrics_listen,
                  "Serve Prometheus metrics (text format) at http://HOST:PORT/metrics (port 0: "
                  "any free port, printed in the ready line; default off). docs/operating.md");
  cmd->add_flag("--remove-on-exit", options.remove_on_exit,
                "Remove the root (slots, socket, lock) on a clean stop (SIGTERM/SIGINT); by "
                "default the state stays for the next agent to adopt");
  static std::string recovery_leader = "off";
  static double recovery_timeout_s = 300;
  cmd->add_option("--recovery-leader", recovery_leader,
                  "The agents' own recovery (cluster mode): off; request (stand for election "
                  "as the job's recovery leader and run the recoveries `memento recover "
                  "--trigger` asks for); auto (also request one when a node's agent vanishes "
                  "and recover once every node's agent is back). docs/recovery.md")
      ->default_val("off");
  cmd->add_option("--recovery-timeout", recovery_timeout_s,
                  "Leader: longest wait (s) for every node's agent and for the recovery")
      ->default_val(300);
  static double agent_wait_s = 60;
  cmd->add_option("--agent-wait", agent_wait_s,
                  "Leader, durable-tier fallback: longest wait (s) for a node's agent that is "
                  "missing while a version loads (a replacement host still starting) before the "
                  "recovery fails naming that node; progress is logged every 5 s. "
                  "docs/recovery.md")
      ->default_val(60)
      ->check(CLI::NonNegativeNumber);
  static bool coordinate_commits = false;
  cmd->add_flag("--coordinate-commits", coordinate_commits,
                "With --recovery-leader: the recovery leader also runs the job's commit "
                "coordinator while it leads (a successor takes it over), so no `memento store "
                "--job --nodes` is needed (`memento launch --coordinate-commits` passes it to its "
                "agents and runs no coordinator of its own). docs/coordination.md \"Who "
                "coordinates the commits\"");
  static std::string topology;
  cmd->add_option("--topology", topology,
                  "Cluster mode without `memento launch` (torchrun on every host): the job's "
                  "topology record to publish at /memento/<job>/topology unless the job has one, "
                  "as JSON, e.g. "
                  "'{\"dp\":3,\"rank_node\":[0,1,2],\"policy\":\"replicate\"}' (fields: "
                  "docs/cluster.md); an agent whose record differs from the job's refuses to "
                  "start. docs/deploy.md");
  cmd->callback([&ctx] {
    ctx.exit_code =
        RunAgent(options, durable, budget, bandwidth, scrub_rate, durable_io, recovery_leader,
                 recovery_timeout_s, agent_wait_s, coordinate_commits, topology);
  });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(agent, memento::tools::Setup);
