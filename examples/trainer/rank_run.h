// One rank of a memento-trainer job (main.cc without --launch; docs/trainer.md
// and docs/swift.md): builds the rank's trainer, gets its state (a
// replacement's in-process recovery, a restarted job's saves, --load,
// memento's restore), trains to --steps while recovering failed steps in
// process (--recovery undo|log), saves, and reports. Split out of main.cc
// unchanged: the same outputs, files and exit statuses.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fault_injection.h"
#include "memento/status.h"
#include "step_report.h"
#include "trainer.h"
#include "trainer_cli.h"

namespace memento::trainer {

// Not thread-safe: the process's main thread runs it (the trainer's and
// memento's threads are their own).
class RankRun {
 public:
  // `cli` completed by CompleteFlags.
  explicit RankRun(TrainerCli cli) : cli_(std::move(cli)) {}
  RankRun(const RankRun&) = delete;
  RankRun& operator=(const RankRun&) = delete;

  // Runs the rank to the end; the process exit status: 0, 1 (an error),
  // launch::swift::kExitRecoveryFailed (an in-process recovery failed: the
  // launcher falls back to a restart).
  int Run();

 private:
  // Set: exit the process with this status; unset: go on.
  using Exit = std::optional<int>;

  Exit CreateTrainer();
  void InstallFaultHooks();
  void SetUpMementoSource();
  // The state before the first step.
  Exit RecoverAsReplacement();
  Exit LoadState();
  void PrintHeader();
  // The loop, and its parts.
  Exit Train(StepReport* report);
  Exit RecoverInProcess(const Status& step_error);
  [[nodiscard]] Status WaitAndReconnect();
  [[nodiscard]] Status RecoverAsSurvivor(int64_t from_step);
  void ReportResumed(const StepResult& r);
  Exit SaveAfterStep(const StepResult& r);
  void KillBeforeSave(const StepResult& r);
  Exit Finish();

  bool InProcessRecovery() const { return cli_.recovery == "undo" || cli_.recovery == "log"; }
  // The stage's log (a file, or a spool's step files) of rank `r`.
  std::string LogOfRank(int r) const;
  // Prints the recovery's JSON line and leaves it for `memento launch`.
  void ReportRecovery(const std::string& mode, bool replacement, int64_t from_step, double seconds);
  // Connects this rank to its node's agent; `restore`: loads the version
  // the cluster (or the agent's commit log) names.
  [[nodiscard]] Status ConnectToMemento(bool restore);
  // --perturb-replay on the first replacement.
  void Perturb();
  // Where a log replayer's snapshot comes from: memento's T0 without --save.
  const Trainer::SnapshotSource* ReplaySource() const;
  // Prints "memento-trainer rank R: <context>STATUS" to stderr.
  void PrintError(const Status& st, const char* context = "") const;

  TrainerCli cli_;
  int rank_ = 0;
  std::string base_run_id_;
  // Destroyed in this order's reverse: the hooks before the trainer.
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<KillInsideStep> fault_hooks_;
  std::unique_ptr<TrainerHooks> hooks_;  // memento's (MEMENTO_TRAINER_WITH_CLIENT)
  Trainer::SnapshotSource memento_source_;
  int64_t loaded_step_ = -1;  // the step memento_source_ loaded
  bool report_resume_ = false;
};

}  // namespace memento::trainer
