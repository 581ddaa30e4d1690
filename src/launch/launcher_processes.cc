// The launcher's children: starting, watching and stopping the agents and the
// trainers. See launcher_state.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <map>
#include <thread>

#include "common/log.h"
#include "launch/launcher_state.h"
#include "launch/swift_protocol.h"

namespace memento::launch {

namespace {

std::string Substitute(std::string arg, const std::map<std::string, std::string>& vars) {
  for (const auto& [name, value] : vars) {
    const std::string pat = "{" + name + "}";
    size_t pos = 0;
    while ((pos = arg.find(pat, pos)) != std::string::npos) {
      arg.replace(pos, pat.size(), value);
      pos += value.size();
    }
  }
  return arg;
}

void AppendLine(const std::string& path, const std::string& line) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  std::string l = line + "\n";
  (void)!write(fd, l.data(), l.size());
  close(fd);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

Status Launcher::State::StartAgent(int node, bool fresh_root) {
  const std::string root = Root(node);
  if (fresh_root) RemoveAll(root);
  unlink((root + "/agent.sock").c_str());  // a stale socket would look ready
  // A dead agent's lease would keep its old endpoint in the store for a TTL.
  coord::JobKeys keys(o.job);
  auto kv = store->Get(keys.Node(coord::NodeName(node)), Deadline::AfterSeconds(5));
  if (kv.ok() && kv->lease != 0) {
    store->RevokeLease(kv->lease, Deadline::AfterSeconds(5)).IgnoreError();
  }
  if (o.recovery_by == "agents") {
    // The dead agent may have been the recovery leader: another one takes
    // over now instead of after the leader lease's TTL.
    auto leader = store->Get(RecoveryLeaderKey(o.job), Deadline::AfterSeconds(5));
    if (leader.ok() && leader->value == coord::NodeName(node) && leader->lease != 0) {
      store->RevokeLease(leader->lease, Deadline::AfterSeconds(5)).IgnoreError();
    }
  }
  SpawnOptions so;
  so.argv = {o.memento_binary, "agent",
             "--job",          o.job,
             "--node",         std::to_string(node),
             "--root",         root,
             "--store",        store_url,
             "--token-file",   token_path,
             "--listen",       NodeAddress(node) + ":0"};
  if (!o.durable_dir.empty()) {
    so.argv.push_back("--durable-dir");
    so.argv.push_back(o.durable_dir);
  }
  if (o.recovery_by == "agents") {
    // The agents run the whole-job recoveries (launch/recovery_leader.h);
    // the launcher files the requests.
    for (const std::string& a :
         {std::string("--recovery-leader"), std::string("request"),
          std::string("--recovery-timeout"), std::to_string(o.recovery_timeout_s)}) {
      so.argv.push_back(a);
    }
    if (o.coordinate_commits) so.argv.push_back("--coordinate-commits");
  }
  for (const auto& a : o.agent_args) so.argv.push_back(a);
  so.argv = InNode(node, std::move(so.argv));
  if (network && fresh_root) {
    // A replaced host comes back on the network.
    MEMENTO_RETURN_IF_ERROR(network->SetNodeLink(node, true));
  }
  so.log_path = logs + "/agent" + std::to_string(node) + ".log";
  AppendLine(so.log_path, "---- memento launch: agent for node " + std::to_string(node) +
                              (fresh_root ? " on an empty root" : "") + " ----");
  MEMENTO_ASSIGN_OR_RETURN(agents[static_cast<size_t>(node)], Subprocess::Spawn(so));
  node_lost[static_cast<size_t>(node)] = false;
  return Status::Ok();
}

// " 1 3": the nodes whose agent is no longer running (reaps them).
std::string Launcher::State::DeadAgents() {
  std::string out;
  for (int i = 0; i < o.nodes; ++i) {
    if (!agents[static_cast<size_t>(i)].running()) out += " " + std::to_string(i);
  }
  return out;
}

Status Launcher::State::WaitAgentsReady(Deadline deadline) {
  for (int i = 0; i < o.nodes; ++i) {
    const std::string sock = Root(i) + "/agent.sock";
    while (!FileExists(sock)) {
      Subprocess& a = agents[static_cast<size_t>(i)];
      if (auto st = a.Poll()) {
        const std::string log = logs + "/agent" + std::to_string(i) + ".log";
        return UnavailableError("the agent of node " + std::to_string(i) + " exited (" +
                                st->ToString() + ") before it was ready; " + log + ":\n" +
                                TailFile(log, 1500));
      }
      if (deadline.expired()) {
        return DeadlineExceededError("the agent of node " + std::to_string(i) +
                                     " did not start listening in time (no " + sock + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return Status::Ok();
}

// Every node's agent has (re)joined the membership with an endpoint.
Status Launcher::State::WaitEndpoints(Deadline deadline) {
  while (true) {
    MEMENTO_ASSIGN_OR_RETURN(auto eps, ReadEndpoints(*store, o.job, o.nodes, deadline));
    std::string missing;
    for (int i = 0; i < o.nodes; ++i) {
      if (eps[static_cast<size_t>(i)].empty()) missing += " " + std::to_string(i);
    }
    if (missing.empty()) return Status::Ok();
    for (int i = 0; i < o.nodes; ++i) {
      if (auto st = agents[static_cast<size_t>(i)].Poll()) {
        return UnavailableError("the agent of node " + std::to_string(i) + " exited (" +
                                st->ToString() + ") while rejoining");
      }
    }
    if (deadline.expired()) {
      return DeadlineExceededError("agents of nodes" + missing +
                                   " did not join the membership in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status Launcher::State::StartTrainers() {
  const std::string rdzv = Rendezvous();
  RemoveAll(rdzv);
  MEMENTO_RETURN_IF_ERROR(MakeDirs(rdzv));
  generation = 0;
  trainers.clear();
  trainers.resize(static_cast<size_t>(world));
  trainer_done.assign(static_cast<size_t>(world), false);
  for (int r = 0; r < world; ++r) MEMENTO_RETURN_IF_ERROR(StartTrainer(r, {}));
  return Status::Ok();
}

Status Launcher::State::StartTrainer(int r, const std::vector<std::string>& extra_env) {
  const std::string rdzv = Rendezvous();
  const int node = NodeOf(r);
  std::map<std::string, std::string> vars = {{"rank", std::to_string(r)},
                                             {"node", std::to_string(node)},
                                             {"world_size", std::to_string(world)},
                                             {"job", o.job},
                                             {"run_dir", o.run_dir},
                                             {"node_dir", Root(node)},
                                             {"attempt", std::to_string(attempt)},
                                             {"rendezvous", rdzv},
                                             {"dp", std::to_string(o.dp)},
                                             {"tp", std::to_string(o.tp)},
                                             {"pp", std::to_string(o.pp)}};
  SpawnOptions so;
  for (const std::string& a : o.trainer) so.argv.push_back(Substitute(a, vars));
  so.argv = InNode(node, std::move(so.argv));
  so.env = {"MEMENTO_JOB=" + o.job,
            "MEMENTO_RANK=" + std::to_string(r),
            "MEMENTO_WORLD_SIZE=" + std::to_string(world),
            "MEMENTO_NODE=" + std::to_string(node),
            "MEMENTO_RUN_DIR=" + Root(node),
            "MEMENTO_RENDEZVOUS=" + rdzv,
            "MEMENTO_ATTEMPT=" + std::to_string(attempt),
            "MEMENTO_DP=" + std::to_string(o.dp),
            "MEMENTO_TP=" + std::to_string(o.tp),
            "MEMENTO_PP=" + std::to_string(o.pp),
            "MEMENTO_ZERO=" + std::to_string(o.zero),
            "MEMENTO_STORE=" + store_url,
            "MEMENTO_TOKEN_FILE=" + token_path,
            "MEMENTO_NODE_ADDR=" + NodeAddress(node)};
  // In-process recovery: every rank learns the mode (launch/swift_protocol.h).
  if (const std::string mode = InProcessMode(o); !mode.empty()) {
    so.env.push_back(std::string(swift::kEnvRecovery) + "=" + mode);
  }
  so.env.insert(so.env.end(), extra_env.begin(), extra_env.end());
  so.log_path = logs + "/rank" + std::to_string(r) + ".log";
  AppendLine(so.log_path, "---- memento launch: rank " + std::to_string(r) + " attempt " +
                              std::to_string(attempt) +
                              (generation > 0 ? " generation " + std::to_string(generation) +
                                                    " (replacement, in-process recovery)"
                                              : "") +
                              " ----");
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return p.status().WithContext("start trainer rank " + std::to_string(r));
  trainers[static_cast<size_t>(r)] = std::move(*p);
  trainer_done[static_cast<size_t>(r)] = false;
  return Status::Ok();
}

void Launcher::State::StopTrainers() {
  for (Subprocess& t : trainers) {
    if (t.running()) t.Kill(SIGTERM).IgnoreError();
  }
  for (Subprocess& t : trainers) {
    if (t.pid() > 0) t.Terminate(2.0);
  }
}

void Launcher::State::StopAgents() {
  for (Subprocess& a : agents) {
    if (a.running()) a.Kill(SIGTERM).IgnoreError();
  }
  for (Subprocess& a : agents) {
    if (a.pid() > 0) a.Terminate(5.0);
  }
}

std::string Launcher::State::PollChildren(bool* all_done_out, int* failed_rank,
                                          ExitStatus* failed_status) {
  std::string cause;
  *failed_rank = -1;
  for (int i = 0; i < o.nodes && cause.empty(); ++i) {
    if (auto st = agents[static_cast<size_t>(i)].Poll()) {
      cause = node_lost[static_cast<size_t>(i)]
                  ? "node " + std::to_string(i) + " lost (agent and trainers killed, memory gone)"
                  : "the agent of node " + std::to_string(i) + " died (" + st->ToString() + ")";
    }
  }
  bool all_done = true;
  for (int r = 0; r < world; ++r) {
    if (trainer_done[static_cast<size_t>(r)]) continue;
    auto st = trainers[static_cast<size_t>(r)].Poll();
    if (!st.has_value()) {
      all_done = false;
      continue;
    }
    if (st->ok()) {
      trainer_done[static_cast<size_t>(r)] = true;
      continue;
    }
    all_done = false;
    // The rank an injection killed wins over a peer its death took down in
    // the same poll (rank 2 reported "killed by signal 13" for a kill of
    // rank 3: demo_cluster_test failed on it).
    if (cause.empty() || (r == injected_rank && *failed_rank >= 0)) {
      cause = "rank " + std::to_string(r) + " (node " + std::to_string(NodeOf(r)) +
              ") failed: " + st->ToString();
      *failed_rank = r;
      *failed_status = *st;
    }
  }
  if (*failed_rank >= 0 && *failed_rank == injected_rank) injected_rank = -1;
  *all_done_out = all_done;
  return cause;
}

void Launcher::State::ReportProgress() {
  if (o.quiet || progress_clock.Seconds() < 2.0) return;
  progress_clock.Reset();
  const int64_t c = Committed();
  if (c == last_progress_step) return;
  int running = 0;
  for (Subprocess& t : trainers) running += t.running() ? 1 : 0;
  Say("attempt " + std::to_string(attempt) + ": committed step " + std::to_string(c) + ", " +
      std::to_string(running) + "/" + std::to_string(world) + " trainer(s) running");
  last_progress_step = c;
}

}  // namespace memento::launch
