// The toy trainers' run: register a ToyState with the Client, seal, restore,
// then the step loop (Fence, optimizer step, Snapshot) with its progress
// lines (progress.h), lock step with the other ranks and, on request, paced
// on the agent's commits (commit_pace.h). The mains of the test trainers
// (tests/shm/test_trainer.cc, tests/cluster_save/cluster_trainer.cc,
// tests/cluster/workload.cc) and of `memento demo --trainer`
// (tools/demo_trainer.cc) parse their flags, connect and call these.
//
// Thread safety: the trainer's one thread.
#pragma once

#include <cstdint>
#include <string>

#include "memento/client.h"
#include "memento/status.h"
#include "toy/progress.h"
#include "toy/toy_state.h"

namespace memento::toy {

// Test trainers only: MEMENTO_TEST_COPY_DELAY_US from this process's
// environment slows every chunk copy down (client/testing_hooks.h; the
// library reads no such variable), so that a test's kill lands mid-snapshot.
void ApplyCopyDelayFromEnvironment();

struct StartReport {
  int64_t restored_step = -1;  // -1: nothing to restore
  double seal_s = 0;           // how long Seal() took
  double restore_s = 0;        // LastRestoreStats().restore_s
};

// Registers every buffer of `state` (tensors, then the blob), seals and
// restores the newest version into it. NotFound from Restore is a fresh
// start (restored_step -1). DataLoss when the restored blob's step is not
// the step Restore returned; the Client's error otherwise.
[[nodiscard]] Result<StartReport> RegisterSealRestore(Client& client, ToyState& state);

// How a trainer that restored nothing says so: an N line, or (the
// single-node crash tests, which check the initial state too) "R 0 <digest>".
enum class FreshStart { kNLine, kStepZero };

// The R or N line of `start`.
void ReportStart(const ProgressLog& log, const StartReport& start, const ToyState& state,
                 FreshStart fresh);

// Every rank creates <dir>/<step>.<rank> and waits until all `world` ranks'
// files of `step` exist, like the collectives of a real job. DeadlineExceeded
// naming the missing rank after `timeout_s`. An empty `dir` returns at once.
[[nodiscard]] Status FileBarrier(const std::string& dir, int64_t step, int rank, int world,
                                 double timeout_s = 120);

enum class BarrierAt {
  kBeforeStep,  // before the optimizer step s: every rank fenced s - 1
  kAfterStep,   // after Snapshot(s) and the step's sleep: every rank started s
};

struct StepLoopOptions {
  int64_t steps = 0;  // run until the state is at this step
  // OnPhase(kCompute) around the digest, kIdle after it (HAS schedules the
  // copies in the idle part: --schedule has).
  bool report_phases = false;
  double step_sleep_s = 0;     // after each step (the forward/backward pass)
  double fence_timeout_s = 0;  // 0: Fence waits without a deadline
  // Lock step (FileBarrier) in this directory; empty: none.
  std::string barrier_dir;
  BarrierAt barrier_at = BarrierAt::kBeforeStep;
  int rank = 0, world = 1;
  // After each snapshot it wrote, wait (at most 30 s) until the agent whose
  // commit word is in agent_dir says that step committed or was let go, or
  // another rank marked it skipped in barrier_dir; a step this rank skipped
  // is marked there (commit_pace.h).
  bool pace_commits = false;
  std::string agent_dir;
};

// Trains `state` up to options.steps, snapshotting every step through
// `client` (null: no memento, the reference run that writes D lines only),
// and writes the S, K, C, D and X lines to `log`. The first failing call's
// Status, with the step it failed at.
[[nodiscard]] Status RunSteps(Client* client, ToyState& state, const ProgressLog& log,
                              const StepLoopOptions& options);

}  // namespace memento::toy
