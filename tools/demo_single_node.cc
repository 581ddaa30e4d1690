// `memento demo --single-node` (tools/demo.h, docs/demo.md): an agent and the
// demo trainer, SIGKILL in the middle of a snapshot, restart, restore,
// continue, bit-identical check.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_flag.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "fmt/format.h"
#include "memento/client.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/slot.h"
#include "shm/slot_format.h"
#include "tools/command.h"
#include "tools/demo.h"
#include "tools/trainer_binary.h"
#include "toy/progress.h"
#include "toy/toy_state.h"

namespace memento::tools {
namespace {

// ---- the orchestrator -------------------------------------------------------------

using toy::Progress;
using toy::ReadProgress;

// The step an R line reports, -1 before one was read.
int64_t RestoredStep(const Progress& p) { return p.restored.empty() ? -1 : p.restored[0].first; }
int Completes(const Progress& p) { return static_cast<int>(p.completed.size()); }

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  SpawnOptions options;
  options.argv = argv;
  options.log_path = log;
  auto child = Subprocess::Spawn(options);
  if (!child.ok()) {
    MEMENTO_LOG_ERROR("{}", child.status().ToString());
    return -1;
  }
  return child->Release();  // waited for and killed by pid below
}

template <typename Pred>
bool WaitFor(Pred pred, double timeout_s) {
  Stopwatch sw;
  while (!pred()) {
    if (sw.Seconds() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Slot states from the headers (pread: cheap enough to poll).
std::vector<std::pair<shm::SlotState, int64_t>> Slots(const std::string& root) {
  std::vector<std::pair<shm::SlotState, int64_t>> out;
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    const shm::SlotPeek peek = shm::PeekSlotFile(shm::SlotPath(root, 0, s));
    out.emplace_back(peek.state, peek.step);
  }
  return out;
}

std::string SlotsText(const std::string& root) {
  std::string s;
  int i = 0;
  for (auto [state, step] : Slots(root)) {
    if (!s.empty()) s += ", ";
    s += fmt::format("slot{} {}", i++, shm::SlotStateName(state));
    if (state != shm::SlotState::kEmpty) s += fmt::format(" (step {})", step);
  }
  return s;
}

}  // namespace

int RunSingleNodeDemo(const DemoArgs& a) {
  Stopwatch total;
  auto t = [&total] { return fmt::format("[{:6.2f}s]", total.Seconds()); };
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  char tmpl[] = "/dev/shm/memento-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportStatus(ErrnoError("mkdtemp /dev/shm", errno));
  std::string dir = tmpl, root = dir + "/node0";
  if (a.kill_after < 1 || a.kill_after + 2 > a.steps) {
    return ReportStatus(InvalidArgumentError("need 1 <= --kill-after <= --steps - 2"));
  }
  std::printf(
      "memento demo: one node, one trainer with %llu MiB of state (parameters + two optimizer "
      "moments + a cursor blob), a snapshot after every one of %lld steps, SIGKILL in the middle "
      "of a snapshot after step %lld.\n",
      static_cast<unsigned long long>(a.mib), static_cast<long long>(a.steps),
      static_cast<long long>(a.kill_after));
  std::printf("working directory: %s\n", dir.c_str());

  // 1. The uninterrupted reference run (same code, no memento).
  Stopwatch ref_sw;
  std::map<int64_t, uint64_t> ref;
  {
    toy::AdamState model(a.mib << 20);
    ref[0] = model.Digest();
    while (model.step() < a.steps) {
      model.Step();
      ref[model.step()] = model.Digest();
    }
  }
  std::printf("%s reference: %lld uninterrupted steps without memento in %.2f s (%.0f ms/step)\n",
              t().c_str(), static_cast<long long>(a.steps), ref_sw.Seconds(),
              1000 * ref_sw.Seconds() / a.steps);

  // 2. The agent.
  std::string agent_log = dir + "/agent.log", trainer_log = dir + "/trainer.log";
  pid_t agent = Spawn({self, "agent", "--job", "demo", "--node", "0", "--root", root}, agent_log);
  bool up = WaitFor(
      [&] {
        auto fd = shm::ConnectUnix(shm::AgentSocketPath(root));
        if (fd.ok()) close(*fd);
        return fd.ok();
      },
      30);
  int rc = 0;
  auto finish = [&](int code) {
    kill(agent, SIGTERM);
    waitpid(agent, nullptr, 0);
    if (code != 0 || a.keep) {
      std::printf("logs and slots kept in %s\n", dir.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    return code;
  };
  if (!up) {
    std::printf("agent did not start; its log:\n%s\n", agent_log.c_str());
    return finish(1);
  }
  std::printf("%s agent started (pid %d): owns %s, socket %s\n", t().c_str(), agent, root.c_str(),
              shm::AgentSocketPath(root).c_str());

  // 3. The first trainer, killed mid-snapshot.
  auto trainer_argv = [&](const std::string& progress) {
    return std::vector<std::string>{self,
                                    "demo",
                                    "--trainer",
                                    "--root",
                                    root,
                                    "--progress",
                                    progress,
                                    "--mib",
                                    std::to_string(a.mib),
                                    "--steps",
                                    std::to_string(a.steps),
                                    "--threads",
                                    std::to_string(a.threads)};
  };
  std::string p1 = dir + "/progress.1", p2 = dir + "/progress.2";
  pid_t trainer = Spawn(trainer_argv(p1), trainer_log);
  if (!WaitFor([&] { return ReadProgress(p1).seal_s > 0 || !ReadProgress(p1).error.empty(); },
               60)) {
    std::printf("trainer did not start\n");
    return finish(1);
  }
  Progress first = ReadProgress(p1);
  if (!first.error.empty()) {
    std::printf("trainer failed: %s\n", first.error.c_str());
    return finish(1);
  }
  std::printf(
      "%s trainer 1 started (pid %d): registered 4 tensors, slots mapped in %.2f s, no "
      "saved version: starting at step 0\n",
      t().c_str(), trainer, first.seal_s);
  if (!WaitFor([&] { return ReadProgress(p1).max_complete >= a.kill_after; }, 120)) {
    std::printf("trainer made no progress; see %s\n", trainer_log.c_str());
    return finish(1);
  }
  WaitFor(
      [&] {
        for (auto [state, step] : Slots(root)) {
          if (state == shm::SlotState::kWriting) return true;
        }
        return false;
      },
      10);
  kill(trainer, SIGKILL);
  waitpid(trainer, nullptr, 0);
  first = ReadProgress(p1);
  std::printf(
      "%s SIGKILL trainer 1 after %d snapshots (mean copy %.0f ms, mean Fence wait %.1f "
      "ms); last snapshot it saw complete: step %lld, last one it started: step %lld\n",
      t().c_str(), Completes(first), 1000 * first.copy_s_sum / std::max(1, Completes(first)),
      1000 * first.fence_wait_s_sum / std::max(1, Completes(first)),
      static_cast<long long>(first.max_complete), static_cast<long long>(first.max_started));
  std::printf("%s slots left in shared memory: %s\n", t().c_str(), SlotsText(root).c_str());

  // 4. The restarted trainer restores and continues.
  Stopwatch restart;
  trainer = Spawn(trainer_argv(p2), trainer_log);
  WaitFor(
      [&] {
        Progress p = ReadProgress(p2);
        return !p.restored.empty() || p.fresh || !p.error.empty();
      },
      60);
  Progress second = ReadProgress(p2);
  const int64_t restored = RestoredStep(second);
  if (restored < 0) {
    std::printf("restarted trainer did not restore: %s\n",
                second.error.empty() ? "no saved version" : second.error.c_str());
    return finish(1);
  }
  bool restored_ok = ref.count(restored) && ref[restored] == second.restored[0].second &&
                     restored >= first.max_complete && restored <= first.max_started;
  std::printf(
      "%s trainer 2 restored step %lld in %.3f s from shared memory, checksums verified "
      "(%.2f s from restart to restored: process start and building its state %.2f s, "
      "mapping and prefaulting the slots %.2f s): %s\n",
      t().c_str(), static_cast<long long>(restored), second.restore_s, restart.Seconds(),
      restart.Seconds() - second.seal_s - second.restore_s, second.seal_s,
      restored_ok ? "bit-identical to the reference at that step" : "DIFFERENT from the reference");
  int st = 0;
  waitpid(trainer, &st, 0);
  second = ReadProgress(p2);
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) || !second.done) {
    std::printf("restarted trainer failed: %s (see %s)\n", second.error.c_str(),
                trainer_log.c_str());
    return finish(1);
  }
  bool diverged = false;
  for (auto [step, digest] : second.digests) diverged |= ref[step] != digest;
  std::printf(
      "%s trainer 2 continued to step %lld (%d more snapshots, mean copy %.0f ms, mean "
      "Fence wait %.1f ms)\n",
      t().c_str(), static_cast<long long>(a.steps), Completes(second),
      1000 * second.copy_s_sum / std::max(1, Completes(second)),
      1000 * second.fence_wait_s_sum / std::max(1, Completes(second)));
  std::printf("%s slots now: %s\n", t().c_str(), SlotsText(root).c_str());
  bool same = restored_ok && !diverged && second.digests.count(a.steps) &&
              second.digests[a.steps] == ref[a.steps];
  rc = same ? 0 : 1;
  std::printf("final state after step %lld: digest %016llx, uninterrupted run %016llx\n",
              static_cast<long long>(a.steps),
              static_cast<unsigned long long>(second.digests[a.steps]),
              static_cast<unsigned long long>(ref[a.steps]));
  std::printf("RESULT: the final state %s bit-identical to an uninterrupted run (%.1f s in all)\n",
              same ? "IS" : "is NOT", total.Seconds());
  return finish(rc);
}

}  // namespace memento::tools
