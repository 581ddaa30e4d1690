#include "toy/toy_run.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "client/testing_hooks.h"
#include "common/clock.h"
#include "fmt/format.h"
#include "toy/commit_pace.h"

namespace memento::toy {

void ApplyCopyDelayFromEnvironment() {
  if (const char* d = std::getenv("MEMENTO_TEST_COPY_DELAY_US")) {
    client::testing_hooks::SetCopyDelayUs(std::atoi(d));
  }
}

Result<StartReport> RegisterSealRestore(Client& client, ToyState& state) {
  for (const ToyBuffer& b : state.buffers()) {
    const Status st = b.is_blob ? client.RegisterBlob(b.meta.name, b.data, b.bytes)
                                : client.RegisterTensor(b.meta, b.data);
    if (!st.ok()) return st.WithContext("register " + b.meta.name);
  }
  StartReport report;
  Stopwatch seal;
  MEMENTO_RETURN_IF_ERROR(client.Seal());
  report.seal_s = seal.Seconds();
  auto restored = client.Restore();
  if (!restored.ok()) {
    if (restored.status().code() == StatusCode::kNotFound) return report;
    return restored.status().WithContext("restore");
  }
  if (state.step() != *restored) {
    return DataLossError(
        fmt::format("restored step {} but the state's blob says {}", *restored, state.step()));
  }
  report.restored_step = *restored;
  report.restore_s = client.LastRestoreStats().restore_s;
  return report;
}

void ReportStart(const ProgressLog& log, const StartReport& start, const ToyState& state,
                 FreshStart fresh) {
  if (start.restored_step >= 0) {
    log.Emit(fmt::format("R {} {} {} {}", start.restored_step, state.Digest(), start.restore_s,
                         start.seal_s));
  } else if (fresh == FreshStart::kStepZero) {
    log.Emit(fmt::format("R 0 {} 0 {}", state.Digest(), start.seal_s));
  } else {
    log.Emit(fmt::format("N {}", start.seal_s));
  }
}

Status FileBarrier(const std::string& dir, int64_t step, int rank, int world, double timeout_s) {
  if (dir.empty()) return Status::Ok();
  const std::string base = fmt::format("{}/{}.", dir, step);
  const std::string mine = base + std::to_string(rank);
  const int fd = open(mine.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("barrier file " + mine, errno);
  close(fd);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int r = 0; r < world; ++r) {
    const std::string path = base + std::to_string(r);
    while (access(path.c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        return DeadlineExceededError(
            fmt::format("barrier of step {}: rank {} never arrived", step, r));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }
  return Status::Ok();
}

namespace {

// Fences the pending snapshot and writes its C or K line; with `pace`, waits
// for its commit (commit_pace.h). `context` names the fence in an error.
Status FenceAndReport(Client& client, int64_t* pending, const ProgressLog& log,
                      const StepLoopOptions& o, bool pace, const std::string& context) {
  const Deadline deadline =
      o.fence_timeout_s > 0 ? Deadline::AfterSeconds(o.fence_timeout_s) : Deadline::Infinite();
  MEMENTO_RETURN_IF_ERROR(client.Fence(deadline).WithContext(context));
  if (*pending < 0) return Status::Ok();
  const int64_t step = *pending;
  *pending = -1;
  const SnapshotStats s = client.LastSnapshotStats();
  if (s.skipped) {
    log.Emit(fmt::format("K {}", step));
    return Status::Ok();
  }
  log.Emit(fmt::format("C {} {} {}", step, s.copy_s, s.fence_wait_s));
  if (!pace || !o.pace_commits) return Status::Ok();
  const PaceEnd end = WaitForCommitOrRelease(o.agent_dir, step, o.barrier_dir, 30);
  if (end != PaceEnd::kCommitted) {
    std::fprintf(stderr, "%s: step %lld did not commit (pace end %d)\n", log.program().c_str(),
                 static_cast<long long>(step), static_cast<int>(end));
  }
  return Status::Ok();
}

// Snapshot(step) and its S line; a step skipped at once gets its K line
// here (and, when pacing, its mark for the other ranks), else it is pending.
Status SnapshotStep(Client& client, int64_t step, const ProgressLog& log, const StepLoopOptions& o,
                    int64_t* pending) {
  log.Emit(fmt::format("S {}", step));
  MEMENTO_RETURN_IF_ERROR(client.Snapshot(step).WithContext(fmt::format("snapshot {}", step)));
  // (A snapshot's own stats come with its Fence; these are a skip's.)
  const SnapshotStats s = client.LastSnapshotStats();
  if (s.skipped && s.step == step) {
    log.Emit(fmt::format("K {}", step));
    if (o.pace_commits) MarkSkipped(o.barrier_dir, step);
    *pending = -1;
  } else {
    *pending = step;
  }
  return Status::Ok();
}

}  // namespace

Status RunSteps(Client* client, ToyState& state, const ProgressLog& log, const StepLoopOptions& o) {
  int64_t pending = -1;  // the step whose snapshot is not fenced yet
  while (state.step() < o.steps) {
    const int64_t step = state.step() + 1;
    if (client != nullptr) {
      MEMENTO_RETURN_IF_ERROR(FenceAndReport(*client, &pending, log, o, /*pace=*/true,
                                             fmt::format("fence before step {}", step)));
    }
    if (o.barrier_at == BarrierAt::kBeforeStep) {
      MEMENTO_RETURN_IF_ERROR(FileBarrier(o.barrier_dir, step, o.rank, o.world));
    }
    state.Step();
    if (client != nullptr) MEMENTO_RETURN_IF_ERROR(SnapshotStep(*client, step, log, o, &pending));
    if (client != nullptr && o.report_phases) client->OnPhase(Phase::kCompute);
    if (log.enabled()) log.Emit(fmt::format("D {} {}", step, state.Digest()));
    if (client != nullptr && o.report_phases) client->OnPhase(Phase::kIdle);
    if (o.step_sleep_s > 0) usleep(static_cast<useconds_t>(o.step_sleep_s * 1e6));
    if (o.barrier_at == BarrierAt::kAfterStep) {
      MEMENTO_RETURN_IF_ERROR(FileBarrier(o.barrier_dir, step, o.rank, o.world));
    }
  }
  if (client != nullptr) {
    MEMENTO_RETURN_IF_ERROR(
        FenceAndReport(*client, &pending, log, o, /*pace=*/false, "final fence"));
  }
  log.Emit("X done");
  return Status::Ok();
}

}  // namespace memento::toy
