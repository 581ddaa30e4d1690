// memento-trainer's fault injection (the --fail-* flags, docs/trainer.md):
// kills inside a step (KillInsideStep), and the file helpers of
// --fail-point save and --corrupt-log-rank. Moved out of main.cc unchanged.
#pragma once

#include <signal.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "memento/status.h"
#include "trainer.h"

namespace memento::trainer {

// Fault injection (--fail-point save): the step of any rank's save file
// (its TrainState is the file's last bytes), or -1.
int64_t SavedStepOfFile(const std::string& path);

// Fault injection (--corrupt-log-rank): flips one byte in the middle of the
// log file at `path` (a rank's log, or its newest spool step file).
Status CorruptNewestLogFile(const std::string& path);

// Fault injection inside a step: --fail-point update kills the rank before
// chunk `chunk` of step `step`'s optimizer update is written; --fail-point
// pipeline at its `chunk`-th pipeline receive of that step (forward or
// backward, while the other stages are mid-schedule); --fail-point
// grad-allreduce, grad-norm or all-gather just before it enters that
// collective of the step (StepCollective; all-gather needs ZeRO-1);
// --fail-point grad-norm-commit inside the gradient norm: after the sum, its
// commit token sent to the first `chunk` other ranks only (some survivors
// pass the gradient norm, the others do not).
class KillInsideStep : public TrainerHooks {
 public:
  enum class Where { kUpdate, kPipeline, kCollective, kCommit };
  // `trainer` outlives the hooks (Main owns both; the hooks are set on it).
  // `collective`: with Where::kCollective, which one.
  KillInsideStep(const Trainer* trainer, int64_t step, int chunk, Where where,
                 StepCollective collective = StepCollective::kGradAllreduce)
      : trainer_(trainer),
        rank_(trainer->rank()),
        step_(step),
        chunk_(chunk),
        pipeline_(where == Where::kPipeline),
        update_(where == Where::kUpdate),
        commit_(where == Where::kCommit),
        collective_(collective) {}
  // Hooks that run behind these (memento's), or null.
  void set_inner(TrainerHooks* inner) { inner_ = inner; }
  void BeforeCollective(int64_t step, StepCollective which) override {
    if (inner_ != nullptr) inner_->BeforeCollective(step, which);
    if (pipeline_ || update_ || commit_ || step != step_ || which != collective_) return;
    static const char* const kNames[] = {"gradient allreduce", "gradient-norm allreduce",
                                         "parameter all-gather"};
    std::fprintf(stderr,
                 "memento-trainer rank %d: killing myself before the %s of step %" PRId64 "\n",
                 rank_, kNames[static_cast<int>(which)], step);
    std::fflush(nullptr);
    raise(SIGKILL);
  }
  int PartialCommit(int64_t step) override {
    if (commit_ && step == step_) return chunk_;
    return inner_ != nullptr ? inner_->PartialCommit(step) : -1;
  }
  void AfterPartialCommit(int64_t step) override {
    if (!commit_ || step != step_) {
      if (inner_ != nullptr) inner_->AfterPartialCommit(step);
      return;
    }
    std::fprintf(stderr,
                 "memento-trainer rank %d: killing myself inside the gradient norm of step %" PRId64
                 ", its commit token sent to %d rank(s)\n",
                 rank_, step, chunk_);
    std::fflush(nullptr);
    raise(SIGKILL);
  }
  void OnPhase(TrainPhase phase) override {
    if (inner_ != nullptr) inner_->OnPhase(phase);
    if (!pipeline_ || phase != TrainPhase::kIdle || trainer_->state().step + 1 != step_ ||
        idle_++ != chunk_) {
      return;
    }
    std::fprintf(stderr,
                 "memento-trainer rank %d: killing myself at receive %d of step %" PRId64 "\n",
                 rank_, chunk_, step_);
    std::fflush(nullptr);
    raise(SIGKILL);
  }
  Status BeforeOptimizerStep(int64_t step) override {
    return inner_ != nullptr ? inner_->BeforeOptimizerStep(step) : Status::Ok();
  }
  Status AfterOptimizerStep(int64_t step) override {
    return inner_ != nullptr ? inner_->AfterOptimizerStep(step) : Status::Ok();
  }
  std::string ProgressNote() override { return inner_ != nullptr ? inner_->ProgressNote() : ""; }
  std::string SummaryJson() override { return inner_ != nullptr ? inner_->SummaryJson() : ""; }
  Status BeforeRecovery() override {
    return inner_ != nullptr ? inner_->BeforeRecovery() : Status::Ok();
  }
  Status AfterRecovery(int64_t step, int64_t held_through) override {
    return inner_ != nullptr ? inner_->AfterRecovery(step, held_through) : Status::Ok();
  }
  Status OnOptimizerChunk(int64_t step, uint64_t offset, uint64_t count) override {
    if (inner_ != nullptr) MEMENTO_RETURN_IF_ERROR(inner_->OnOptimizerChunk(step, offset, count));
    if (!update_ || step != step_ || seen_++ != chunk_) return Status::Ok();
    std::fprintf(stderr,
                 "memento-trainer rank %d: killing myself inside the update of step %" PRId64
                 " (chunk %d, elements %" PRIu64 "+%" PRIu64 ")\n",
                 rank_, step, chunk_, offset, count);
    std::fflush(nullptr);
    raise(SIGKILL);
    return Status::Ok();
  }

 private:
  const Trainer* trainer_;
  int rank_;
  int64_t step_;
  int chunk_;
  bool pipeline_, update_, commit_;
  StepCollective collective_;
  int seen_ = 0, idle_ = 0;
  TrainerHooks* inner_ = nullptr;
};

}  // namespace memento::trainer
