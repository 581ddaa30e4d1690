// `memento bench recover --nodes 4 --state BYTES --policy xor [--store S] [--json]`:
// time to rebuild one lost node's state from its peers' memory (REFT-load,
// docs/cluster.md "Recovery"), against raw loopback TCP measured in the same
// run.
//
//   1. tcp_gbps: net::MeasureRawTcp (two processes, plain sockets), before
//      anything else runs (it forks); again in step 7.
//   2. A coordination store (--store: embedded, the default, in this
//      process; etcd, a real etcd started here on loopback with its data in
//      the work dir; or etcd://HOST:PORT of a running one) and a commit
//      coordinator in this process, the job
//      topology (DP = nodes, one rank per node, --policy), and one real
//      `memento agent` process per node in cluster mode on a private root
//      under /dev/shm.
//   3. One client per rank (in this process) registers --state bytes of
//      replicated state (identical on every DP replica, as a DP job's
//      parameters and optimizer state are), snapshots step 1 and fences; the
//      bench waits until the store commits step 1 (every node made its
//      redundancy).
//   4. Node 1 is lost: the clients go (the launcher stops every trainer),
//      node 1's agent is killed with SIGKILL and its root deleted; a fresh
//      agent starts on an empty root.
//   5. launch::RecoverJob (the launcher's own orchestration: inventories,
//      recover::Decide, kPeerRecover, restore target) rebuilds node 1's T0
//      slot from the peers; recover_s is its wall time.
//   6. A client of rank 1 restores from the rebuilt slot and the bench
//      checks every byte against what rank 1 held.
//
//   7. tcp_gbps again, --tcp-repeat runs after the recovery.
//
// Prints one JSON object: lost_bytes, recover_s (and its breakdown),
// effective_gbps = lost_bytes * 8 / recover_s, tcp_gbps (the best of every
// baseline sample, all in tcp_samples), ratio (ratio_median against their
// median), and the CPU
// both kept busy (recover_cores: the bench and every agent process during
// recovery; tcp_cores: sender + receiver of the baseline), and per byte:
// recover_cpu_s_per_gib (those CPU-seconds per rebuilt GiB),
// tcp_cpu_s_per_gib (sender + receiver per GiB moved, the best sample;
// _median over all samples, each sample's in tcp_samples) and
// cpu_per_gib_ratio = recover_cpu_s_per_gib / tcp_cpu_s_per_gib_median;
// recover_cpu_s_by_process splits recover_cpu_s: the bench, then agent 0,
// 1, ... (agent 1 rebuilds, the others serve). replacement_start_cpu_s is
// the CPU the fresh agent spent from its start to its join (step 4; with
// --preallocate on, the default, that includes faulting in the rebuilt
// slot's pages), outside recover_cpu_s; recover_cpu_s_per_gib_with_start
// and cpu_per_gib_ratio_with_start add it back.
#if __has_include("launch/job_recovery.h") && __has_include("agent/job_member.h")

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_flag.h"
#include "common/clock.h"
#include "common/log.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/etcd_process.h"
#include "launch/job_recovery.h"
#include "memento/client.h"
#include "net/job_token.h"
#include "net/throughput.h"
#include "tools/bench_node.h"
#include "tools/bench_stats.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"
#include "topo/plan.h"

namespace memento::tools {
namespace {

struct Args {
  int nodes = 4;
  double state = 256.0 * (1 << 20);
  std::string policy = "xor";
  double tcp_bytes = 0;  // 0: max(state, 256 MiB)
  int tcp_repeat = 2;
  bool json = true;
  bool keep = false;
  std::string data_path = "stream";  // or "legacy" (kPeerRead, 4 MiB windows)
  std::string receive = "direct";    // or "staged" (MEMENTO_RECOVER_RECEIVE)
  // The coordination store: "embedded" (in this process, tcp://), "etcd" (a
  // real etcd started here on loopback, coord::EtcdProcess) or an
  // etcd://HOST:PORT[,...] URL of a running one.
  std::string store = "embedded";
  std::string preallocate = "on";  // the agents' --preallocate-slots
};

// The job name; with an external etcd "benchrecover-<pid>", so that the keys
// of an earlier run there (its commits, its membership) are not this run's.
std::string JobName(const Args& a) {
  return a.store.rfind("etcd://", 0) == 0 ? "benchrecover-" + std::to_string(getpid())
                                          : std::string("benchrecover");
}

// MEMENTO_BENCH_PERF_CTL=CTL[,ACK]: the control (and ack) FIFOs of a
// `perf record -D -1 --control fifo:CTL,ACK` started around the bench
// (docs/benchmarks.md, "Profiling the recovery window"): "enable" is written
// right before the recovery (step 5) and "disable" right after, so the
// profile holds the recovery window only. Unset: nothing.
void PerfControl(const char* cmd) {
  const char* env = std::getenv("MEMENTO_BENCH_PERF_CTL");
  if (env == nullptr || *env == '\0') return;
  std::string spec(env);
  std::string ctl = spec, ack;
  if (size_t comma = spec.find(','); comma != std::string::npos) {
    ctl = spec.substr(0, comma);
    ack = spec.substr(comma + 1);
  }
  std::ofstream(ctl) << cmd << std::endl;
  if (!ack.empty()) {
    std::ifstream in(ack);
    std::string line;
    std::getline(in, line);  // "ack": perf has applied it
  }
}

// One `memento agent` process in cluster mode.
struct AgentProcess {
  pid_t pid = -1;
  std::string root;
};

Result<AgentProcess> StartAgent(const std::string& job, int node, const std::string& base,
                                const std::string& store_url, const std::string& token_file,
                                const std::string& preallocate) {
  AgentProcess a;
  a.root = base + "/node" + std::to_string(node);
  const std::string log = base + "/agent" + std::to_string(node) + ".log";
  std::vector<std::string> args = {"/proc/self/exe",
                                   "agent",
                                   "--job",
                                   job,
                                   "--node",
                                   std::to_string(node),
                                   "--root",
                                   a.root,
                                   "--store",
                                   store_url,
                                   "--token-file",
                                   token_file,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--lease-ttl",
                                   "2",
                                   "--preallocate-slots",
                                   preallocate};
  pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  a.pid = pid;
  return a;
}

void StopAgent(AgentProcess& a, int sig) {
  if (a.pid <= 0) return;
  kill(a.pid, sig);
  int st = 0;
  waitpid(a.pid, &st, 0);
  a.pid = -1;
}

// Fills `n` bytes with a pattern that is the same for every replica.
void FillPattern(uint8_t* p, size_t n) {
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (size_t i = n & ~size_t{7}; i < n; ++i) p[i] = static_cast<uint8_t>(i);
}

// User + system CPU seconds of the processes `pids` so far (all threads),
// from /proc/<pid>/stat; a process that cannot be read counts 0.
double CpuSecondsOf(const std::vector<pid_t>& pids) {
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  for (pid_t pid : pids) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // Fields after the command (which may hold spaces) start after ')'.
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(text.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    total += static_cast<double>(utime + stime) / tick;
  }
  return total;
}

// Waits until `node`'s endpoint in the store is set and differs from `old`.
Result<std::string> WaitEndpoint(coord::Store& store, const std::string& job, int nodes, int node,
                                 const std::string& old, Deadline deadline) {
  while (true) {
    auto eps = launch::ReadEndpoints(store, job, nodes, deadline);
    if (eps.ok() && !(*eps)[node].empty() && (*eps)[node] != old) return (*eps)[node];
    if (deadline.expired()) {
      return DeadlineExceededError("node " + std::to_string(node) +
                                   " did not join the membership (see its agent log)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<nlohmann::json> Run(const Args& a) {
  if (a.nodes < 2) return InvalidArgumentError("--nodes must be >= 2 (one is lost)");
  if (a.state < 4096) return InvalidArgumentError("--state must be >= 4096 bytes");
  if (a.tcp_repeat < 1) return InvalidArgumentError("--tcp-repeat must be >= 1");
  if (a.store != "embedded" && a.store != "etcd" && a.store.rfind("etcd://", 0) != 0) {
    return InvalidArgumentError("--store '" + a.store +
                                "': expected embedded, etcd (one started here) or "
                                "etcd://HOST:PORT[,HOST:PORT...]");
  }
  const std::string job = JobName(a);
  MEMENTO_ASSIGN_OR_RETURN(topo::Policy policy, topo::ParsePolicy(a.policy));
  // Logs (also of the forked trainers' clients) go to stderr: stdout is the
  // one JSON object.
  InitLogging("bench", LogOptionsFromEnvironment());
  if (a.data_path != "stream" && a.data_path != "legacy") {
    return InvalidArgumentError("--data-path must be 'stream' or 'legacy', not '" + a.data_path +
                                "'");
  }
  if (a.receive != "staged" && a.receive != "direct") {
    return InvalidArgumentError("--receive must be 'staged' or 'direct', not '" + a.receive + "'");
  }
  // The `memento agent` processes read them at start (tools/cmd_agent.cc).
  setenv("MEMENTO_RECOVER_DATA_PATH", a.data_path.c_str(), 1);
  setenv("MEMENTO_RECOVER_RECEIVE", a.receive.c_str(), 1);
  const size_t state = static_cast<size_t>(a.state);
  const int lost = 1;

  // 1. The raw TCP baseline: --tcp-repeat runs now, before anything else
  //    runs (it forks), and as many after the recovery (step 7), so that
  //    both sides of the ratio see the same machine. Measured the way
  //    recovery moves bytes: from a state-sized buffer into another one
  //    (distinct memory for every byte, as a slot is served and rebuilt),
  //    4 MiB per send. The same with one 4 MiB buffer on each side
  //    (cache-resident: an upper bound the recovery cannot reach) is
  //    reported as tcp_hot_gbps. Every sample is reported; `ratio` uses the
  //    best (the fastest TCP the machine gave during the run: the
  //    conservative choice), `ratio_median` the median.
  const size_t tcp_bytes =
      a.tcp_bytes > 0 ? static_cast<size_t>(a.tcp_bytes) : std::max(state, size_t{256} << 20);
  const size_t tcp_chunk = size_t{4} << 20;
  std::vector<net::ThroughputResult> tcp_samples, hot_samples;
  std::vector<std::string> tcp_when;
  auto measure_tcp = [&](const char* when) -> Status {
    for (int i = 0; i < a.tcp_repeat; ++i) {
      MEMENTO_ASSIGN_OR_RETURN(net::ThroughputResult r,
                               net::MeasureRawTcp(tcp_bytes, tcp_chunk, tcp_bytes));
      tcp_samples.push_back(r);
      tcp_when.push_back(when);
      MEMENTO_ASSIGN_OR_RETURN(net::ThroughputResult h, net::MeasureRawTcp(tcp_bytes, tcp_chunk));
      hot_samples.push_back(h);
    }
    return Status::Ok();
  };
  MEMENTO_RETURN_IF_ERROR(measure_tcp("before"));

  // 2. Store, coordinator, topology, agents.
  char tmpl[] = "/dev/shm/memento-bench-recover-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    return ErrnoError("mkdtemp /dev/shm/memento-bench-recover-*", errno);
  const std::string base = tmpl;
  std::fprintf(stderr, "bench recover: work dir %s\n", base.c_str());
  std::vector<AgentProcess> agents;
  std::vector<std::unique_ptr<Client>> clients;
  // Outlive the agents: they are stopped first (an agent without its store
  // retries until its deadlines pass).
  std::unique_ptr<coord::EmbeddedStoreServer> server;
  std::unique_ptr<coord::EtcdProcess> etcd;
  std::unique_ptr<coord::Store> etcd_store;
  std::unique_ptr<coord::CommitCoordinator> coordinator;
  auto cleanup = [&] {
    clients.clear();
    for (AgentProcess& p : agents) StopAgent(p, SIGTERM);
    coordinator.reset();
    etcd_store.reset();
    etcd.reset();
    server.reset();
    if (!a.keep) {
      std::error_code ec;
      std::filesystem::remove_all(base, ec);
    } else {
      // The slots live in shared memory (RAM): say where, so they are not
      // forgotten there.
      std::fprintf(stderr,
                   "memento bench recover: --keep: the agents' slots and logs stay in %s "
                   "(shared memory, held until removed: rm -rf %s)\n",
                   base.c_str(), base.c_str());
    }
  };
  auto result = [&]() -> Result<nlohmann::json> {
    MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Generate());
    const std::string token_file = base + "/job.token";
    MEMENTO_RETURN_IF_ERROR(token.WriteFile(token_file));
    std::string url;
    if (a.store == "embedded") {
      MEMENTO_ASSIGN_OR_RETURN(server, coord::EmbeddedStoreServer::Start("127.0.0.1", 0, token));
      url = "tcp://127.0.0.1:" + std::to_string(server->port());
    } else {
      if (a.store == "etcd") {
        auto started = coord::EtcdProcess::Start(base, Deadline::AfterSeconds(30),
                                                 EtcdBinaryFromEnvironment());
        if (!started.ok()) return started.status().WithContext("--store etcd: starting etcd");
        etcd = std::move(*started);
        url = etcd->url();
        std::fprintf(stderr, "bench recover: etcd %s, data in %s\n", url.c_str(),
                     etcd->data_dir().c_str());
      } else {
        url = a.store;
      }
      MEMENTO_ASSIGN_OR_RETURN(etcd_store,
                               coord::OpenStore(url, token_file, Deadline::AfterSeconds(30)));
    }
    coord::Store& store = server ? server->store() : *etcd_store;
    std::fprintf(stderr,
                 "bench recover: store %s (memento inspect --store %s --job %s --token-file %s)\n",
                 url.c_str(), url.c_str(), job.c_str(), token_file.c_str());
    std::set<std::string> members;
    for (int i = 0; i < a.nodes; ++i) members.insert(coord::NodeName(i));
    MEMENTO_ASSIGN_OR_RETURN(coordinator, coord::CommitCoordinator::Start(
                                              &store, job, members, Deadline::AfterSeconds(10)));
    launch::JobTopology jt;
    jt.topology.dp = a.nodes;
    for (int i = 0; i < a.nodes; ++i) jt.topology.rank_node.push_back(i);
    jt.policy = policy;
    MEMENTO_RETURN_IF_ERROR(launch::PublishTopology(store, job, jt, Deadline::AfterSeconds(10)));
    for (int i = 0; i < a.nodes; ++i) {
      MEMENTO_ASSIGN_OR_RETURN(AgentProcess p,
                               StartAgent(job, i, base, url, token_file, a.preallocate));
      agents.push_back(p);
    }

    // 3. Every rank registers, seals, snapshots step 1.
    WarmBuffer buf(state, 0);
    if (buf.data() == nullptr) return ResourceExhaustedError("cannot map the state buffer");
    FillPattern(buf.data(), state);
    for (int r = 0; r < a.nodes; ++r) {
      ClientOptions o;
      o.job_id = job;
      o.rank = r;
      o.world_size = a.nodes;
      o.node = r;
      o.agent_dir = agents[r].root;
      o.copy_threads = 2;
      o.connect_timeout_s = 30;
      MEMENTO_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
      // Every replica registers the same memory: the bytes are identical.
      MEMENTO_RETURN_IF_ERROR(RegisterQuarters(*c, buf.data(), state));
      MEMENTO_RETURN_IF_ERROR(c->Seal());
      clients.push_back(std::move(c));
    }
    for (auto& c : clients) MEMENTO_RETURN_IF_ERROR(c->Snapshot(1));
    for (auto& c : clients) MEMENTO_RETURN_IF_ERROR(c->Fence(Deadline::AfterSeconds(120)));
    Deadline commit_deadline = Deadline::AfterSeconds(120);
    while (true) {
      auto latest = coord::ReadLatestCommit(store, job, commit_deadline);
      if (latest.ok() && *latest >= 1) break;
      if (commit_deadline.expired()) {
        return DeadlineExceededError("step 1 was not committed in 120 s (agent logs in " + base +
                                     ", --keep keeps them)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }

    // 4. Node `lost` is lost with its memory; a fresh agent replaces it.
    MEMENTO_ASSIGN_OR_RETURN(
        auto before, launch::ReadEndpoints(store, job, a.nodes, Deadline::AfterSeconds(10)));
    clients.clear();
    StopAgent(agents[lost], SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(agents[lost].root, ec);
    Stopwatch join_sw;
    MEMENTO_ASSIGN_OR_RETURN(agents[lost],
                             StartAgent(job, lost, base, url, token_file, a.preallocate));
    MEMENTO_RETURN_IF_ERROR(
        WaitEndpoint(store, job, a.nodes, lost, before[lost], Deadline::AfterSeconds(60)).status());
    // What the replacement agent spent before it joined (with
    // --preallocate on: its slot's pages faulted in), outside the recovery
    // window: reported next to it, and added in the _with_start figure.
    const double join_s = join_sw.Seconds();
    const double replacement_start_cpu_s = CpuSecondsOf({agents[lost].pid});

    // 5. Recovery, timed.
    MEMENTO_ASSIGN_OR_RETURN(topo::Plan plan,
                             launch::PlanFromStore(store, job, Deadline::AfterSeconds(10)));
    launch::RecoverOptions ro;
    ro.job = job;
    ro.num_nodes = a.nodes;
    ro.committed = 1;
    std::vector<pid_t> pids = {getpid()};
    for (const AgentProcess& p : agents) pids.push_back(p.pid);
    const double cpu0 = CpuSecondsOf(pids);
    std::vector<double> cpu0_each;
    for (pid_t pid : pids) cpu0_each.push_back(CpuSecondsOf({pid}));
    PerfControl("enable");
    Stopwatch sw;
    Result<launch::JobRecovery> recovered =
        launch::RecoverJob(store, plan, token, ro, Deadline::AfterSeconds(300));
    const double recover_s = sw.Seconds();
    const double recover_cpu_s = CpuSecondsOf(pids) - cpu0;
    PerfControl("disable");
    MEMENTO_ASSIGN_OR_RETURN(launch::JobRecovery rec, std::move(recovered));
    // Per process: the bench (the launcher's orchestration), then agent
    // 0, 1, ... (agent `lost` rebuilds, the others serve).
    nlohmann::json cpu_each = nlohmann::json::array();
    for (size_t i = 0; i < pids.size(); ++i)
      cpu_each.push_back(CpuSecondsOf({pids[i]}) - cpu0_each[i]);
    if (!rec.decision.from_memory) {
      return FailedPreconditionError("memory cannot rebuild step 1: " + rec.decision.reason);
    }

    // 6. Rank `lost` restores from the rebuilt slot: every byte as it was.
    WarmBuffer check(state, 0);
    if (check.data() == nullptr) return ResourceExhaustedError("cannot map the check buffer");
    {
      ClientOptions o;
      o.job_id = job;
      o.rank = lost;
      o.world_size = a.nodes;
      o.node = lost;
      o.agent_dir = agents[lost].root;
      o.connect_timeout_s = 30;
      MEMENTO_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
      MEMENTO_RETURN_IF_ERROR(RegisterQuarters(*c, check.data(), state));
      MEMENTO_RETURN_IF_ERROR(c->Seal());
      MEMENTO_ASSIGN_OR_RETURN(int64_t step, c->Restore());
      if (step != 1) return DataLossError("rank 1 restored step " + std::to_string(step));
    }
    if (std::memcmp(check.data(), buf.data(), state) != 0) {
      return DataLossError("the rebuilt state of rank 1 differs from what it held");
    }

    const uint64_t lost_bytes = rec.rebuilt_bytes;
    const double eff = recover_s > 0 ? lost_bytes * 8.0 / recover_s / 1e9 : 0;
    nlohmann::json j;
    j["bench"] = "recover";
    j["nodes"] = a.nodes;
    j["policy"] = topo::PolicyName(policy);
    j["data_path"] = a.data_path;
    j["store"] = server ? "embedded" : "etcd";
    j["store_url"] = url;
    j["receive"] = a.receive;
    j["state_bytes"] = state;
    j["lost_node"] = lost;
    j["lost_bytes"] = lost_bytes;
    j["step"] = rec.decision.step;
    j["recover_s"] = recover_s;
    j["inventory_plan_s"] = rec.inventory_plan_s;
    j["transfer_s"] = rec.transfer_s;
    j["decode_s"] = rec.decode_s;
    j["write_s"] = rec.write_s;
    j["rebuild_s"] = rec.rebuild_s;
    j["recover_cpu_s"] = recover_cpu_s;
    j["recover_cpu_s_by_process"] = cpu_each;
    j["recover_cores"] = recover_s > 0 ? recover_cpu_s / recover_s : 0.0;
    j["recover_cpu_s_per_gib"] =
        lost_bytes > 0 ? recover_cpu_s / (static_cast<double>(lost_bytes) / (1 << 30)) : 0.0;
    j["preallocate"] = a.preallocate;
    j["replacement_join_s"] = join_s;
    j["replacement_start_cpu_s"] = replacement_start_cpu_s;
    j["recover_cpu_s_per_gib_with_start"] = lost_bytes > 0
                                                ? (recover_cpu_s + replacement_start_cpu_s) /
                                                      (static_cast<double>(lost_bytes) / (1 << 30))
                                                : 0.0;
    j["effective_gbps"] = eff;
    j["cores"] = static_cast<int>(std::thread::hardware_concurrency());
    j["verified"] = true;
    // The survivors' deferred verification (docs/recovery.md, "The
    // survivors' verification"): bytes the agents hashed for it, bytes their
    // receivers checked instead, whether the leader had to decide again.
    j["verification"] = rec.ToJson()["verification"];
    j["reason"] = rec.decision.reason;
    return j;
  }();
  cleanup();
  if (!result.ok()) return result;
  // 7. The baseline again, after the recovery (the agents are gone).
  MEMENTO_RETURN_IF_ERROR(measure_tcp("after"));
  nlohmann::json& j = *result;
  const net::ThroughputResult* best = nullptr;
  const net::ThroughputResult* best_hot = nullptr;
  std::vector<double> gbps, tcp_per_gib;
  // CPU-seconds of sender and receiver per GiB moved: the cost the
  // recovery's recover_cpu_s_per_gib is compared with.
  auto cpu_per_gib = [](const net::ThroughputResult& t) {
    return t.bytes > 0
               ? (t.sender_cpu_s + t.receiver_cpu_s) / (static_cast<double>(t.bytes) / (1 << 30))
               : 0.0;
  };
  nlohmann::json samples = nlohmann::json::array();
  for (size_t i = 0; i < tcp_samples.size(); ++i) {
    const net::ThroughputResult& t = tcp_samples[i];
    if (best == nullptr || t.gbps > best->gbps) best = &t;
    gbps.push_back(t.gbps);
    tcp_per_gib.push_back(cpu_per_gib(t));
    samples.push_back(
        {{"when", tcp_when[i]},
         {"gbps", t.gbps},
         {"seconds", t.seconds},
         {"cpu_s_per_gib", cpu_per_gib(t)},
         {"cores", t.seconds > 0 ? (t.sender_cpu_s + t.receiver_cpu_s) / t.seconds : 0.0}});
  }
  for (const net::ThroughputResult& h : hot_samples) {
    if (best_hot == nullptr || h.gbps > best_hot->gbps) best_hot = &h;
  }
  const double eff = j["effective_gbps"].get<double>();
  const double median = Median(gbps);
  j["tcp_gbps"] = best->gbps;
  j["tcp_bytes"] = best->bytes;
  j["tcp_cores"] =
      best->seconds > 0 ? (best->sender_cpu_s + best->receiver_cpu_s) / best->seconds : 0.0;
  j["tcp_samples"] = samples;
  j["tcp_cpu_s_per_gib"] = cpu_per_gib(*best);
  j["tcp_cpu_s_per_gib_median"] = Median(tcp_per_gib);
  // Recovery CPU per rebuilt GiB against raw TCP's per GiB moved (the
  // median sample: per-byte CPU varies less than throughput under load).
  const double tcp_gib_cost = Median(tcp_per_gib);
  j["cpu_per_gib_ratio"] =
      tcp_gib_cost > 0 ? j["recover_cpu_s_per_gib"].get<double>() / tcp_gib_cost : 0.0;
  j["cpu_per_gib_ratio_with_start"] =
      tcp_gib_cost > 0 ? j["recover_cpu_s_per_gib_with_start"].get<double>() / tcp_gib_cost : 0.0;
  j["tcp_gbps_median"] = median;
  j["tcp_baseline"] = "best of tcp_samples (before and after the recovery)";
  j["tcp_hot_gbps"] = best_hot->gbps;
  j["ratio"] = best->gbps > 0 ? eff / best->gbps : 0.0;
  j["ratio_median"] = median > 0 ? eff / median : 0.0;
  j["ratio_hot"] = best_hot->gbps > 0 ? eff / best_hot->gbps : 0.0;
  return result;
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto args = std::make_shared<Args>();
  auto* cmd = bench.add_subcommand(
      "recover", "Rebuild a lost node's state from peers' memory vs raw loopback TCP");
  cmd->add_option("--nodes", args->nodes, "nodes (one DP rank each)")->capture_default_str();
  cmd->add_option("--state", args->state, "bytes of replicated state per rank")
      ->transform(ByteSize())
      ->capture_default_str();
  cmd->add_option("--policy", args->policy, "redundancy policy: xor, replicate, rs:2, ...")
      ->capture_default_str();
  cmd->add_option("--tcp-bytes", args->tcp_bytes,
                  "bytes of the raw TCP baseline (default max(state, 256 MiB))")
      ->transform(ByteSize());
  cmd->add_option("--tcp-repeat", args->tcp_repeat,
                  "baseline runs before and again after the recovery (all reported; the ratio "
                  "uses the best)")
      ->capture_default_str();
  cmd->add_option("--preallocate", args->preallocate,
                  "the agents' --preallocate-slots: on (the replacement agent makes its rank's "
                  "slot, pages faulted in, before it joins) or off (the recovery allocates it)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print JSON (the only format; accepted for symmetry)");
  cmd->add_flag("--keep", args->keep, "keep the work directory (agent logs)");
  cmd->add_option("--store", args->store,
                  "coordination store: embedded (in this process), etcd (a real etcd started "
                  "here on loopback) or etcd://HOST:PORT[,HOST:PORT...] (a running etcd; the "
                  "job is then benchrecover-<pid>). docs/etcd.md")
      ->capture_default_str();
  cmd->add_option("--data-path", args->data_path,
                  "recovery data path of the agents: stream (kPeerReadStream) or legacy "
                  "(kPeerRead, 4 MiB windows; the path before streaming, for comparison)")
      ->capture_default_str();
  cmd->add_option("--receive", args->receive,
                  "how the rebuilding agent receives streamed bytes: direct (into the slot, "
                  "digests checked there trusted) or staged (through a reused buffer, every chunk "
                  "verified in the slot at the end)")
      ->capture_default_str();
  cmd->callback([args, &ctx] {
    auto r = Run(*args);
    if (!r.ok()) {
      ctx.exit_code = ReportStatus(r.status());
      return;
    }
    memento::tools::PrintJson("memento.bench.recover/1", std::move(*r));
  });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(recover, memento::tools::Setup);

#endif  // launch/job_recovery.h and agent/job_member.h
