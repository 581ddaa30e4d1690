// The `memento agent`s of a bench run (`bench overhead`, `bench has --loop
// trainer`): one per node, each with its root `<dir>/node<n>` and its log
// `<dir>/agent<n>.log`, started from this binary and waited for until their
// sockets exist. The agents die with the bench (PR_SET_PDEATHSIG) and are
// stopped (SIGTERM, then SIGKILL) by StopBenchAgents or their destructors.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/subprocess.h"
#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::tools {

// Starts `nodes` agents of `job` for the run directory `dir` and waits up to
// `timeout_s` for each one's socket; `extra` is appended to every agent's
// arguments (cluster mode: --store, --token-file, --listen). On failure the agents already started
// are stopped and the error names the node and the end of its log.
inline Result<std::vector<Subprocess>> StartBenchAgents(
    const std::string& self, const std::string& job, const std::string& dir, int nodes,
    double timeout_s = 30, const std::vector<std::string>& extra = {}) {
  std::vector<Subprocess> agents;
  auto fail = [&agents](Status st) {
    for (Subprocess& p : agents) p.Terminate(10);
    return st;
  };
  for (int n = 0; n < nodes; ++n) {
    const std::string root = dir + "/node" + std::to_string(n);
    SpawnOptions so;
    so.argv = {self, "agent", "--job", job, "--node", std::to_string(n), "--root", root};
    so.argv.insert(so.argv.end(), extra.begin(), extra.end());
    so.log_path = dir + "/agent" + std::to_string(n) + ".log";
    auto agent = Subprocess::Spawn(so);
    if (!agent.ok()) return fail(agent.status());
    agents.push_back(std::move(*agent));
    const Deadline ready = Deadline::AfterSeconds(timeout_s);
    struct stat st;
    while (stat((root + "/agent.sock").c_str(), &st) != 0) {
      const bool exited = agents.back().Poll().has_value();
      if (exited || ready.expired()) {
        return fail(InternalError("memento agent for node " + std::to_string(n) +
                                  (exited ? " exited" : " did not start in time") + ": " +
                                  TailFile(so.log_path, 2000)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return agents;
}

// CPU-seconds (user + system) a running process has used so far, from
// /proc/<pid>/stat; -1 when unreadable.
inline double ProcessCpuSeconds(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Fields after the command name (which may hold spaces): from the last ')'.
  const char* p = nullptr;
  for (size_t i = n; i-- > 0;) {
    if (buf[i] == ')') {
      p = buf + i + 1;
      break;
    }
  }
  if (p == nullptr) return -1;
  // Field 3 is the state; utime and stime are fields 14 and 15.
  unsigned long long utime = 0, stime = 0;
  if (std::sscanf(p, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) !=
      2) {
    return -1;
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  return ticks > 0 ? static_cast<double>(utime + stime) / static_cast<double>(ticks) : -1;
}

// The agents' CPU-seconds so far, summed (-1 when one is unreadable), then
// stops them.
inline double StopBenchAgents(std::vector<Subprocess>* agents) {
  double cpu = 0;
  for (Subprocess& p : *agents) {
    const double c = p.running() ? ProcessCpuSeconds(p.pid()) : -1;
    cpu = (cpu < 0 || c < 0) ? -1 : cpu + c;
    p.Terminate(10);
  }
  agents->clear();
  return cpu;
}

}  // namespace memento::tools
