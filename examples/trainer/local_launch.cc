// memento-trainer --launch: every rank as a local child process, and the
// trainer's own recovery loop over them (docs/swift.md). Moved out of
// main.cc unchanged.
#include "local_launch.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "launch/swift_protocol.h"

namespace memento::trainer {

// In-process recovery speaks the launchers' shared protocol
// (launch/swift_protocol.h): generation file, exit status 75, reports.
using launch::swift::kExitRecoveryFailed;
using launch::swift::ReadGeneration;
using launch::swift::WallSeconds;
using launch::swift::WriteGeneration;

// Starts one child per rank (this binary, the same flags, plus --rank and
// --rendezvous) and waits for all. When one fails: with recovery "none" the
// rest are stopped and the launch fails; "restart" stops the rest and starts
// every rank again (generation + 1; they load the last --save-every state);
// "undo" and "log" start only the lost rank again (--replace), the
// survivors stay alive and recover in process. At most `max_recoveries`.
int LaunchLocal(int argc, char** argv, int world, const std::string& rendezvous,
                const std::string& recovery, int max_recoveries) {
  std::string dir = rendezvous;
  bool made_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/memento-trainer-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
    made_dir = true;
  }
  std::vector<pid_t> pids(world, -1);
  const pid_t parent = getpid();
  int generation = 0;
  auto spawn = [&](int r, bool replace) -> bool {
    std::vector<std::string> args;
    for (int i = 0; i < argc; ++i) {
      if (std::strcmp(argv[i], "--launch") != 0) args.push_back(argv[i]);
    }
    args.push_back("--rank");
    args.push_back(std::to_string(r));
    if (rendezvous.empty()) {
      args.push_back("--rendezvous");
      args.push_back(dir);
    }
    if (generation > 0) {
      args.push_back("--generation");
      args.push_back(std::to_string(generation));
    }
    if (replace) args.push_back("--replace");
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return false;
    }
    if (pid == 0) {
      // A rank must not outlive its launcher (killed launcher, no orphans).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      std::vector<char*> cargs;
      for (std::string& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      std::perror("execv");
      _exit(127);
    }
    pids[r] = pid;
    return true;
  };
  auto stop_all = [&] {
    for (pid_t p : pids) {
      if (p > 0) kill(p, SIGKILL);
    }
    for (pid_t& p : pids) {
      if (p > 0) waitpid(p, nullptr, 0);
      p = -1;
    }
  };
  bool ok = true;
  for (int r = 0; r < world && ok; ++r) ok = spawn(r, false);
  int failures = ok ? 0 : 1;
  if (!ok) stop_all();
  int recoveries = 0;
  while (ok) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    int rank = -1;
    for (int r = 0; r < world; ++r) {
      if (pids[r] == pid) rank = r;
    }
    if (rank < 0) continue;
    pids[rank] = -1;
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (!failed) {
      if (std::all_of(pids.begin(), pids.end(), [](pid_t p) { return p < 0; })) break;
      continue;
    }
    std::printf(
        "{\"swift_failure\": {\"rank\": %d, \"pid\": %d, \"status\": %d, "
        "\"generation\": %d, \"wall_s\": %.6f}}\n",
        rank, pid, status, generation, WallSeconds());
    std::fflush(stdout);
    if (recovery == "none" || recoveries >= max_recoveries) {
      std::fprintf(stderr, "memento-trainer: rank %d (pid %d) failed (status %d); stopping\n", rank,
                   pid, status);
      ++failures;
      stop_all();
      break;
    }
    ++recoveries;
    ++generation;
    // A rank whose in-process recovery failed exits kExitRecoveryFailed:
    // fall back to the whole-job restart from the saved state.
    const bool fallback = WIFEXITED(status) && WEXITSTATUS(status) == kExitRecoveryFailed;
    if (fallback) {
      std::printf("{\"swift_fallback\": {\"rank\": %d, \"generation\": %d}}\n", rank, generation);
      std::fflush(stdout);
    }
    if (recovery == "restart" || fallback) {
      stop_all();
      for (int r = 0; r < world && ok; ++r) ok = spawn(r, false);
    } else {
      Status st = WriteGeneration(dir, generation);
      ok = st.ok() && spawn(rank, true);
      if (!st.ok()) std::fprintf(stderr, "memento-trainer: %s\n", st.ToString().c_str());
    }
    if (!ok) {
      ++failures;
      stop_all();
    }
  }
  if (made_dir) {
    std::string cmd = "rm -rf '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace memento::trainer
