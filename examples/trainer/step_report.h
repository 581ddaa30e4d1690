// What one rank of memento-trainer prints about its steps (main.cc's loop,
// docs/trainer.md): a line per step or per --progress-every steps, the
// --loss-log lines, and with --json the summaries at the end. Split out of
// main.cc unchanged: the same lines and JSON.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "trainer.h"
#include "trainer_cli.h"

namespace memento::trainer {

// Not thread-safe: the training loop's thread only.
class StepReport {
 public:
  // `cli` outlives the report. Steps after `first_step` are timed (the first
  // one warms up), or `first_step` itself when it is the only one.
  StepReport(const TrainerCli& cli, int64_t first_step) : cli_(cli), first_step_(first_step) {}
  ~StepReport() { Close(); }
  StepReport(const StepReport&) = delete;
  StepReport& operator=(const StepReport&) = delete;

  // Opens --loss-log for appending where this rank reports the loss; false
  // after printing why it could not (the process exits 1).
  [[nodiscard]] bool OpenLossLog(bool reports_loss);
  void Close();

  // A completed step: its statistics, `step_cpu_s` of process CPU time, and
  // the lines it prints.
  void Add(const Trainer& trainer, const StepResult& r, double step_cpu_s);

  // With --json, at the end: every rank's own summary, and the reporting
  // rank's summary of the job (when any step was timed).
  void PrintSummaries(Trainer& trainer) const;

 private:
  void PrintProgress(const StepResult& r);
  void PrintStep(const Trainer& trainer, const StepResult& r);

  const TrainerCli& cli_;
  const int64_t first_step_;
  FILE* loss_log_ = nullptr;
  int64_t timed_steps_ = 0;
  double sum_s_ = 0, sum_idle_ = 0, sum_comm_ = 0, sum_fence_ = 0, sum_snap_ = 0, last_loss_ = 0;
  double sum_cpu_ = 0;                           // this rank's process CPU-seconds, timed steps
  double sum_log_s_ = 0, sum_log_bytes_ = 0;     // pipeline log (--recovery log)
  double sum_log_cpu_ = 0;                       // the trainer thread's CPU-seconds in it
  int64_t logged_steps_ = 0;                     // timed steps that logged a message
  std::vector<double> step_times_;               // timed steps, for the median
  double window_s_ = 0, window_overhead_s_ = 0;  // since the last progress line
  int64_t window_steps_ = 0;
};

}  // namespace memento::trainer
