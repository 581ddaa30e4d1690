// Helpers for the multi-process tests: spawn real processes, kill them with
// real signals, read the test trainer's progress lines.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "toy/progress.h"

namespace memento::shm::testing {

// fork + exec with stdout and stderr appended to `log`. Extra environment
// entries ("K=V") are added to the child's. -1 when it cannot start.
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& log,
                   const std::vector<std::string>& env = {}) {
  SpawnOptions options;
  options.argv = argv;
  options.log_path = log;
  options.env = env;
  // Tests spawn from helper threads too; PR_SET_PDEATHSIG would kill the
  // child when that thread ends.
  options.die_with_parent = false;
  auto child = Subprocess::Spawn(options);
  return child.ok() ? child->Release() : -1;  // the tests kill and reap by pid
}

inline void KillAndReap(pid_t pid, int sig = SIGKILL) {
  kill(pid, sig);
  int st;
  waitpid(pid, &st, 0);
}

// Waits for `pid` to exit; returns its wait status, or -1 after `timeout_s`
// (the process is then killed).
inline int WaitExit(pid_t pid, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (std::chrono::steady_clock::now() > end) {
      KillAndReap(pid);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The toy trainers' progress lines (src/toy/progress.h).
using toy::Progress;
using toy::ReadProgress;

// Polls `pred` every millisecond until it holds or `timeout_s` passes.
template <typename Pred>
bool WaitFor(Pred pred, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The states of a rank's slots as their headers say now.
inline std::vector<SlotState> SlotStates(const std::string& root, int rank) {
  std::vector<SlotState> out;
  for (int s = 0; s < kSlotsPerRank; ++s) {
    // pread, not mmap: cheap enough to poll every millisecond.
    int fd = open(SlotPath(root, rank, s).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    SlotHeader h{};
    if (pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h))) {
      out.push_back(static_cast<SlotState>(h.state));
    }
    close(fd);
  }
  return out;
}

inline bool AnySlotWriting(const std::string& root, int rank) {
  for (SlotState s : SlotStates(root, rank)) {
    if (s == SlotState::kWriting) return true;
  }
  return false;
}

inline bool AgentAnswers(const std::string& root) {
  auto fd = ConnectUnix(AgentSocketPath(root));
  if (!fd.ok()) return false;
  close(*fd);
  return true;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace memento::shm::testing
