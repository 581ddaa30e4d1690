// memento run [options] -- COMMAND...: runs a training command (torchrun, a
// script) with the node's agent beside it (docs/python.md, "memento run").
//
// An agent already serving the job's root (started separately: systemd, a
// Kubernetes sidecar, `memento agent`) is used as it is and left running.
// Otherwise `memento run` starts one, keeps it alive for the whole command
// (across torchrun's worker restarts: the agent is the wrapper's child, not
// torchrun's), and stops it cleanly (SIGTERM) when the command ends. The
// command gets MEMENTO_JOB_ID and MEMENTO_RUN_DIR in its environment, which
// the Python Checkpointer and the C++ client read (and MEMENTO_AGENT_PID when
// it started the agent). An agent it started that dies while the command runs
// is started again (it adopts the slots). SIGINT, SIGTERM and SIGHUP sent to
// `memento run` are passed on to the command.
//
// Before it stops an agent it started, it waits (at most --durable-drain-s)
// until the agent's durable tier has written every version it was given:
// an agent that stops drops what it has not written yet, and the versions
// the job wrote last are the ones still in flight.
//
// Exit code: the command's; 128 + N when a signal N ended it; 1 when the
// agent could not be started (nothing is run then).
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "tools/command.h"

namespace memento::tools {

std::vector<std::string>& RunCommandArgs() {
  static auto* args = new std::vector<std::string>();
  return *args;
}

namespace {

std::atomic<pid_t> g_child{-1};
std::atomic<int> g_signal{0};

void Forward(int sig) {
  g_signal.store(sig);
  pid_t pid = g_child.load();
  if (pid > 0) ::kill(pid, sig);
}

// True when something accepts connections on <root>/agent.sock.
bool AgentAnswers(const std::string& root) {
  std::string path = root + "/agent.sock";
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

void MakeParents(const std::string& path) {
  for (size_t pos = 1; (pos = path.find('/', pos)) != std::string::npos; ++pos) {
    ::mkdir(path.substr(0, pos).c_str(), 0700);
  }
}

struct RunOptions {
  std::string job;
  int node = 0;
  std::string root;
  std::string agent_log;
  double agent_start_timeout_s = 60;
  std::vector<std::string> agent_args;
  bool remove_on_exit = false;
  double durable_drain_s = 120;
};

// Waits until the agent's durable tier holds no version in flight or queued
// (its hold word, <root>/durable.word, is clear; the agent keeps it set from
// when a version is offered until it is written), at most o.durable_drain_s.
// Without a durable tier (no word, or --durable-hold-max-s 0) it returns at once.
void WaitDurableDrain(const RunOptions& o, Subprocess* agent) {
  if (o.durable_drain_s <= 0) return;
  const std::string path = shm::DurableWordPath(o.root);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(shm::CommitWord))
    return;
  auto seg = shm::Segment::Open(path, /*writable=*/false);
  if (!seg.ok()) return;
  const auto* w = reinterpret_cast<const shm::CommitWord*>((*seg)->data());
  if (!shm::CommitWordValid(w)) return;
  auto held = [w] { return __atomic_load_n(&w->durable_hold, __ATOMIC_SEQ_CST) - 1; };
  if (held() < 0) return;
  std::fprintf(stderr,
               "memento run: waiting up to %.0f s for the agent's durable tier to write step %lld "
               "(and any queued after it)\n",
               o.durable_drain_s, static_cast<long long>(held()));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(o.durable_drain_s);
  while (held() >= 0) {
    if (agent->Poll()) return;  // the agent is gone: nothing more will be written
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "memento run: the durable tier still writes step %lld after %.0f s; stopping "
                   "the agent anyway (the version stays in the node's slots)\n",
                   static_cast<long long>(held()), o.durable_drain_s);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "memento run: the durable tier has written every version it was given\n");
}

// Starts `memento agent` for o.job and waits until it answers on o.root.
// Prints why on failure.
bool StartAgent(const RunOptions& o, Subprocess* agent) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    ReportStatus(ErrnoError("readlink /proc/self/exe", errno));
    return false;
  }
  self[n] = '\0';
  SpawnOptions so;
  so.argv = {self, "agent", "--job", o.job, "--node", std::to_string(o.node), "--root", o.root};
  if (o.remove_on_exit) so.argv.push_back("--remove-on-exit");
  for (const std::string& a : o.agent_args) so.argv.push_back(a);
  so.log_path = o.agent_log.empty() ? o.root + ".agent.log" : o.agent_log;
  MakeParents(so.log_path);
  auto spawned = Subprocess::Spawn(so);
  if (!spawned.ok()) {
    ReportStatus(spawned.status());
    return false;
  }
  *agent = std::move(*spawned);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(o.agent_start_timeout_s);
  while (!AgentAnswers(o.root)) {
    if (auto st = agent->Poll()) {
      std::fprintf(stderr,
                   "memento run: the agent exited (%s) before it was ready; its log %s:\n%s\n",
                   st->ToString().c_str(), so.log_path.c_str(), TailFile(so.log_path).c_str());
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      agent->Terminate(5);
      std::fprintf(stderr, "memento run: the agent was not ready after %.0f s; its log %s:\n%s\n",
                   o.agent_start_timeout_s, so.log_path.c_str(), TailFile(so.log_path).c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "memento run: started agent pid %d for job %s in %s (log %s)\n",
               static_cast<int>(agent->pid()), o.job.c_str(), o.root.c_str(), so.log_path.c_str());
  return true;
}

int Run(RunOptions o) {
  const std::vector<std::string>& command = RunCommandArgs();
  if (command.empty()) {
    std::fprintf(stderr,
                 "memento run: no command; usage: memento run [options] -- COMMAND [ARGS...]\n");
    return 2;
  }
  if (o.job.empty()) {
    const char* env = std::getenv("MEMENTO_JOB_ID");
    o.job = env && *env ? env : "job";
  }
  if (o.root.empty()) {
    const char* env = std::getenv("MEMENTO_RUN_DIR");
    o.root = env && *env ? env : shm::DefaultNodeRoot(o.job, o.node);
  }
  Subprocess agent;
  bool own_agent = false;
  if (AgentAnswers(o.root)) {
    std::fprintf(stderr, "memento run: using the agent already serving %s\n", o.root.c_str());
  } else {
    if (!StartAgent(o, &agent)) return 1;
    own_agent = true;
  }

  SpawnOptions co;
  co.argv = command;
  co.env = {"MEMENTO_JOB_ID=" + o.job, "MEMENTO_RUN_DIR=" + o.root};
  if (own_agent) co.env.push_back("MEMENTO_AGENT_PID=" + std::to_string(agent.pid()));
  co.die_with_parent = false;
  struct sigaction sa {};
  sa.sa_handler = Forward;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  auto child = Subprocess::Spawn(co);
  if (!child.ok()) {
    if (own_agent) agent.Terminate(30);
    return ReportStatus(child.status());
  }
  g_child.store(child->pid());
  if (int sig = g_signal.load()) ::kill(child->pid(), sig);  // arrived during the spawn
  Result<ExitStatus> end = UnavailableError("");
  while (true) {
    end = child->Wait(Deadline::AfterSeconds(0.5));
    if (end.ok() || end.status().code() != StatusCode::kDeadlineExceeded) break;
    // The agent this run started died (killed, crashed): start it again; it
    // adopts the slots its predecessor left, so the versions survive.
    if (own_agent && g_signal.load() == 0) {
      if (auto st = agent.Poll()) {
        std::fprintf(stderr,
                     "memento run: the agent ended (%s) while the command runs; restarting it\n",
                     st->ToString().c_str());
        if (!StartAgent(o, &agent)) {
          std::fprintf(
              stderr,
              "memento run: the agent could not be restarted; the command goes on without it\n");
          own_agent = false;
        }
      }
    }
  }
  g_child.store(-1);
  int code = 1;
  if (end.ok()) {
    code = end->signal ? 128 + end->signal : end->code;
    if (!end->ok())
      std::fprintf(stderr, "memento run: the command ended with %s\n", end->ToString().c_str());
  } else {
    std::fprintf(stderr, "memento run: waiting for the command: %s\n",
                 end.status().ToString().c_str());
  }
  if (own_agent) {
    WaitDurableDrain(o, &agent);
    ExitStatus st = agent.Terminate(30);
    if (!st.ok())
      std::fprintf(stderr, "memento run: the agent ended with %s\n", st.ToString().c_str());
  }
  return code;
}

void Setup(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "run",
      "Run a training command (e.g. torchrun ...) with the node's agent: memento run [options] "
      "-- COMMAND [ARGS...]. Starts an agent unless one already serves the job's root, keeps it "
      "alive across the command's worker restarts, passes MEMENTO_JOB_ID and MEMENTO_RUN_DIR to "
      "the command, and stops the agent it started when the command ends");
  static RunOptions o;
  cmd->add_option("--job", o.job, "Job id (default: $MEMENTO_JOB_ID, else 'job')");
  cmd->add_option("--node", o.node, "Node index (torchrun's GROUP_RANK)")->default_val(0);
  cmd->add_option("--root", o.root,
                  "The agent's directory (default: $MEMENTO_RUN_DIR, else "
                  "/dev/shm/memento/<job>/node<N>)");
  cmd->add_option("--agent-log", o.agent_log,
                  "The started agent's log (default: <root>.agent.log)");
  cmd->add_option("--agent-start-timeout", o.agent_start_timeout_s,
                  "Seconds to wait for a started agent to answer")
      ->default_val(60);
  cmd->add_flag("--remove-on-exit", o.remove_on_exit,
                "The started agent removes its root (slots, socket) when it stops");
  cmd->add_option("--durable-drain-s", o.durable_drain_s,
                  "Before stopping the agent it started: seconds to wait at most for the agent's "
                  "durable tier (--agent-arg=--durable-dir ...) to write the versions it was given "
                  "(0: do not wait)")
      ->default_val(120)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--agent-arg", o.agent_args,
                  "One more argument for the started agent (repeat it), e.g. "
                  "--agent-arg=--durable-dir --agent-arg=/nfs/ckpt; see `memento agent --help`")
      ->allow_extra_args(false);
  cmd->footer(
      "Everything after the first `--` is the command, passed as is.\n"
      "Exit codes: the command's; 128+N when signal N ended it; 1 when the agent could not be "
      "started; 2 bad usage (no command, a parse error).");
  cmd->callback([&ctx] { ctx.exit_code = Run(o); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(run, memento::tools::Setup);
