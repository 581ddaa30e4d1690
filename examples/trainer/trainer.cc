#include "trainer.h"

#include <cblas.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/checksum.h"
#include "common/clock.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace memento::trainer {
namespace {

uint64_t TokenTag(int micro_batch, bool backward) {
  return static_cast<uint64_t>(micro_batch) * 2 + (backward ? 1 : 0);
}

}  // namespace

Trainer::Trainer(const TrainerOptions& options, TrainerHooks* hooks)
    : options_(options), hooks_(hooks), corpus_(options.model.vocab, options.seed) {}

bool Trainer::reports_loss() const {
  return comm_->dp_rank() == 0 && comm_->tp_rank() == 0 && stage_->geometry().last();
}

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& o, TrainerHooks* hooks) {
  const ModelConfig& m = o.model;
  const Topology& t = o.comm.topology;
  auto need = [](bool ok, const std::string& what) {
    return ok ? Status::Ok() : InvalidArgumentError(what);
  };
  MEMENTO_RETURN_IF_ERROR(need(m.vocab >= 2 && m.seq >= 1 && m.d_model >= 1 && m.heads >= 1 &&
                                   m.layers >= 1 && m.ffn_mult >= 1,
                               "model sizes must be positive (vocab >= 2)"));
  MEMENTO_RETURN_IF_ERROR(need(m.d_model % m.heads == 0, "d_model " + std::to_string(m.d_model) +
                                                             " not divisible by heads " +
                                                             std::to_string(m.heads)));
  MEMENTO_RETURN_IF_ERROR(
      need(m.heads % t.tp == 0,
           "heads " + std::to_string(m.heads) + " not divisible by tp " + std::to_string(t.tp)));
  MEMENTO_RETURN_IF_ERROR(
      need(m.layers % t.pp == 0,
           "layers " + std::to_string(m.layers) + " not divisible by pp " + std::to_string(t.pp)));
  MEMENTO_RETURN_IF_ERROR(need(
      o.micro_batches >= 1 && o.global_batch >= 1 && o.global_batch % (t.dp * o.micro_batches) == 0,
      "global batch " + std::to_string(o.global_batch) +
          " not divisible by dp x micro-batches = " + std::to_string(t.dp * o.micro_batches)));
  MEMENTO_RETURN_IF_ERROR(
      need(o.adam.decay_steps > o.adam.warmup_steps, "decay steps must exceed warmup steps"));
  openblas_set_num_threads(std::max(1, o.blas_threads));

  std::unique_ptr<Trainer> tr(new Trainer(o, hooks));
  MEMENTO_ASSIGN_OR_RETURN(tr->comm_, Comm::Create(o.comm));
  StageGeometry g;
  g.tp = t.tp;
  g.tp_rank = tr->comm_->tp_rank();
  g.pp = t.pp;
  g.pp_rank = tr->comm_->pp_rank();
  tr->stage_ = std::make_unique<Stage>(m, g);
  tr->local_batch_ = o.global_batch / t.dp;
  tr->micro_batch_ = tr->local_batch_ / o.micro_batches;
  // 1F1B keeps at most pp - stage micro-batches in flight.
  tr->stage_->Reserve(std::min(o.micro_batches, t.pp - g.pp_rank), tr->micro_batch_);
  Trainer* self = tr.get();
  // Through self->comm_: Reconnect() replaces the Comm.
  tr->stage_->tp_allreduce = [self](float* data, size_t count) {
    // A failed TP allreduce has no way back into Stage: the failure is kept
    // and the stage's later TP allreduces of the micro-batch are skipped;
    // what it computes from then on is never used (RunSchedule returns the
    // failure right after the Forward or Backward, before anything is sent;
    // the update is not reached; the step's buffers are reset by the next).
    // So a TP peer lost mid-step fails the step, like a lost pipeline peer,
    // and the rank can recover in process.
    if (!self->tp_status_.ok()) return;
    self->Phase(TrainPhase::kCommunicate);
    Stopwatch w;
    Status st = self->comm_->AllreduceTp(data, count);
    self->tp_comm_seconds_ += w.Seconds();
    if (!st.ok()) {
      self->tp_status_ = st;
      return;
    }
    self->Phase(TrainPhase::kCompute);
  };

  const size_t n = tr->stage_->num_params();
  size_t padded = n;
  if (o.zero1) padded = (n + t.dp - 1) / t.dp * t.dp;
  // One parameter group per tensor: weight decay only on matrices (GPT-2 /
  // nanoGPT practice), not on layer norms and biases.
  std::vector<opt::ParamGroup> groups;
  for (const ParamTensor& pt : tr->stage_->tensors()) {
    if (pt.numel == 0) continue;
    groups.push_back({pt.offset, pt.numel, pt.cols > 0 ? o.adam.weight_decay : 0.0f});
  }
  MEMENTO_ASSIGN_OR_RETURN(tr->optimizer_, opt::AdamW::Create(o.adam, std::move(groups)));
  tr->params_.assign(padded, 0.0f);
  tr->grads_.assign(padded, 0.0f);
  tr->stage_->InitParameters(tr->params_.data(), o.seed);
  size_t opt = o.zero1 ? padded / t.dp : padded;
  tr->opt_offset_ = o.zero1 ? opt * tr->comm_->dp_rank() : 0;
  tr->m_.assign(opt, 0.0f);
  tr->v_.assign(opt, 0.0f);
  if (o.pipeline_log) {
    tr->plog_ = std::make_unique<PipelineLog>();
    tr->log_writer_ = std::make_unique<PipelineLogWriter>(tr->plog_.get(), o.log_copy);
  }
  if (o.pipeline_log && !o.pipeline_log_dir.empty()) {
    MEMENTO_ASSIGN_OR_RETURN(tr->spool_, PipelineLogSpool::Create(o.pipeline_log_dir, o.comm.rank));
  }
  if (o.undo_log) tr->undo_log_ = std::make_unique<opt::UndoLog>(1 + tr->optimizer_->num_state());
  tr->state_.cursor = InitialCursor(o.seed);
  tr->tokens_.assign(static_cast<size_t>(tr->local_batch_) * (m.seq + 1), 0);
  const size_t act = static_cast<size_t>(tr->micro_batch_) * m.seq * m.d_model;
  tr->dout_.assign(act, 0.0f);
  tr->dinput_.assign(o.micro_batches, std::vector<float>(g.first() ? 0 : act, 0.0f));
  return tr;
}

void Trainer::Phase(TrainPhase phase) {
  if (hooks_ != nullptr) hooks_->OnPhase(phase);
}

// The 1F1B schedule (PipeDream-Flush / Megatron-LM): stage s runs
// min(pp - s - 1, M) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards.
Status Trainer::RunSchedule(int64_t step, const int32_t* tokens, double* loss_sum, double* idle_s,
                            double* comm_s) {
  const int mbs = options_.micro_batches;
  const StageGeometry& g = stage_->geometry();
  const int stage = g.pp_rank;
  const size_t act = dout_.size();
  const int slots = stage_->slots();
  const size_t tokens_per_mb = static_cast<size_t>(micro_batch_) * (options_.model.seq + 1);
  const float scale =
      1.0f / (static_cast<float>(options_.global_batch) * static_cast<float>(options_.model.seq));

  auto recv = [&](int from, float* data, uint64_t tag) -> Status {
    Phase(TrainPhase::kIdle);
    Stopwatch w;
    Status st = comm_->RecvStage(from, data, act, tag);
    *idle_s += w.Seconds();
    Phase(TrainPhase::kCompute);
    return st;
  };
  const size_t bytes = act * sizeof(float);
  // With replay_ (RecoverByReplay) inputs come from the neighbours' logs and
  // outputs are checked against their receipts instead of being sent.
  // Selective logging: only messages that cross a log group's edge are
  // logged, and replayed from the log; inside a group they stay live.
  auto across = [&](int peer) { return LogGroup(peer) != LogGroup(stage); };
  // With the log's copy worker (PipelineLogWriter), a buffer that holds a
  // logged message is fenced before the trainer writes it again: a receive
  // buffer before the next receive into it, a slot's output before the
  // forward that rewrites it (dinput_ is per micro-batch: its copies are
  // made by the end of the step, Step's LogDrain).
  auto input = [&](int from, float* data, int mb, MessageKind kind) -> Status {
    const MessageKey key{step, mb, from, stage, kind};
    LogFence(step, data, bytes);
    if (replay_ != nullptr && across(from)) {
      MEMENTO_RETURN_IF_ERROR(ReplayInput(key, data, bytes));
    } else {
      MEMENTO_RETURN_IF_ERROR(recv(from, data, TokenTag(mb, kind == MessageKind::kGradient)));
    }
    if (across(from)) LogReceived(key, data, bytes);
    return Status::Ok();
  };
  bool sent = false;
  auto output = [&](int to, const float* data, int mb, MessageKind kind) -> Status {
    const MessageKey key{step, mb, stage, to, kind};
    if (replay_ != nullptr && across(to)) {
      MEMENTO_RETURN_IF_ERROR(ReplayCheckOutput(key, data, bytes));
    } else {
      MEMENTO_RETURN_IF_ERROR(
          comm_->SendStage(to, data, act, TokenTag(mb, kind == MessageKind::kGradient)));
      sent = true;
    }
    if (across(to)) LogSent(key, data, bytes);
    return Status::Ok();
  };
  auto forward = [&](int mb) -> Status {
    const int slot = mb % slots;
    if (!g.first())
      MEMENTO_RETURN_IF_ERROR(input(stage - 1, stage_->input(slot), mb, MessageKind::kActivation));
    if (!g.last()) LogFence(step, stage_->output(slot), bytes);
    *loss_sum += stage_->Forward(slot, params_.data(), tokens + tokens_per_mb * mb);
    MEMENTO_RETURN_IF_ERROR(TakeTpStatus());
    if (!g.last())
      MEMENTO_RETURN_IF_ERROR(
          output(stage + 1, stage_->output(slot), mb, MessageKind::kActivation));
    return Status::Ok();
  };
  auto backward = [&](int mb) -> Status {
    const int slot = mb % slots;
    if (!g.last())
      MEMENTO_RETURN_IF_ERROR(input(stage + 1, dout_.data(), mb, MessageKind::kGradient));
    float* dinput = g.first() ? nullptr : dinput_[mb].data();
    if (dinput != nullptr) LogFence(step, dinput, bytes);
    stage_->Backward(slot, params_.data(), grads_.data(), dout_.data(), dinput,
                     tokens + tokens_per_mb * mb, scale);
    MEMENTO_RETURN_IF_ERROR(TakeTpStatus());
    if (!g.first()) MEMENTO_RETURN_IF_ERROR(output(stage - 1, dinput, mb, MessageKind::kGradient));
    return Status::Ok();
  };

  const int warmup = std::min(g.pp - stage - 1, mbs);
  for (int i = 0; i < warmup; ++i) MEMENTO_RETURN_IF_ERROR(forward(i));
  for (int i = 0; i < mbs - warmup; ++i) {
    MEMENTO_RETURN_IF_ERROR(forward(warmup + i));
    MEMENTO_RETURN_IF_ERROR(backward(i));
  }
  for (int i = mbs - warmup; i < mbs; ++i) MEMENTO_RETURN_IF_ERROR(backward(i));
  if (replay_ != nullptr && !sent) return Status::Ok();
  Phase(TrainPhase::kCommunicate);
  Stopwatch w;
  Status st = comm_->WaitSends();
  *comm_s += w.Seconds();
  return st;
}

Result<StepResult> Trainer::Step() {
  // On every return, also a failed step's: no copy is left pending outside
  // Step, so the buffers are the trainer's again and the log, read by a
  // recovery or the spool, is complete (PipelineLogWriter's rules).
  struct DrainOnReturn {
    Trainer* t;
    ~DrainOnReturn() { t->LogDrain(); }
  } drain_on_return{this};
  Stopwatch total;
  StepResult r;
  r.step = state_.step + 1;
  quiescent_step_ = -1;
  quiescent_dp_ = false;
  Phase(TrainPhase::kCompute);
  DataCursor next = state_.cursor;
  corpus_.NextBatch(&next, options_.global_batch, comm_->dp_rank() * local_batch_, local_batch_,
                    options_.model.seq, tokens_.data());
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  tp_comm_seconds_ = 0.0;
  log_seconds_ = 0.0;
  log_cpu_seconds_ = 0.0;
  log_bytes_ = 0;
  double loss_sum = 0.0;
  MEMENTO_RETURN_IF_ERROR(
      RunSchedule(r.step, tokens_.data(), &loss_sum, &r.idle_seconds, &r.comm_seconds));

  Phase(TrainPhase::kCommunicate);
  if (hooks_ != nullptr) hooks_->BeforeCollective(r.step, StepCollective::kGradAllreduce);
  Stopwatch comm_watch;
  Status dp_st = comm_->AllreduceDp(grads_.data(), stage_->num_params());
  if (dp_st.ok() && stage_->geometry().last()) dp_st = comm_->AllreduceDp(&loss_sum, 1);
  if (!dp_st.ok()) {
    // Failed after this rank's whole pipeline schedule (its TP and PP
    // traffic of the step received and sent): Reconnect offers to keep
    // those groups.
    quiescent_step_ = r.step;
    return dp_st;
  }
  r.comm_seconds += comm_watch.Seconds();
  Phase(TrainPhase::kCompute);

  MEMENTO_ASSIGN_OR_RETURN(r.grad_norm, GradNorm(r.step));
  if (options_.clip_grad > 0 && r.grad_norm > options_.clip_grad) {
    const float s = static_cast<float>(options_.clip_grad / (r.grad_norm + 1e-6));
    for (float& g : grads_) g *= s;
  }

  if (hooks_ != nullptr) {
    Stopwatch w;
    MEMENTO_RETURN_IF_ERROR(hooks_->BeforeOptimizerStep(r.step));
    r.fence_seconds = w.Seconds();
  }
  const float lr = optimizer_->LearningRate(r.step);
  if (undo_log_) {
    undo_log_->Begin(r.step, lr);
    undo_state_ = state_;
    undo_ready_ = true;
  }
  in_update_ = true;
  MEMENTO_RETURN_IF_ERROR(ApplyAdamW(r.step, lr));
  if (options_.zero1) {
    if (undo_log_) {
      // The all-gather overwrites the other shards' params.
      const size_t lo = opt_offset_, hi = opt_offset_ + m_.size();
      MEMENTO_RETURN_IF_ERROR(undo_log_->RecordBuffer(0, 0, lo, params_.data()));
      MEMENTO_RETURN_IF_ERROR(
          undo_log_->RecordBuffer(0, hi, params_.size() - hi, params_.data() + hi));
    }
    Phase(TrainPhase::kCommunicate);
    if (hooks_ != nullptr) hooks_->BeforeCollective(r.step, StepCollective::kParamAllgather);
    comm_watch.Reset();
    MEMENTO_RETURN_IF_ERROR(comm_->AllgatherDp(params_.data(), m_.size()));
    r.comm_seconds += comm_watch.Seconds();
    Phase(TrainPhase::kCompute);
  }
  state_.step = r.step;
  state_.cursor = next;
  in_update_ = false;
  if (hooks_ != nullptr) {
    Stopwatch w;
    MEMENTO_RETURN_IF_ERROR(hooks_->AfterOptimizerStep(r.step));
    r.snapshot_seconds = w.Seconds();
  }

  r.has_loss = reports_loss();
  r.loss = loss_sum / (static_cast<double>(options_.global_batch) * options_.model.seq);
  r.comm_seconds += tp_comm_seconds_;
  // The copy worker has had the step's DP allreduce, gradient norm and
  // update to finish the last micro-batch's copies: this rarely copies.
  LogDrain();
  if (spool_) {
    // The step's entries move to the spool's writer (no copy here).
    Stopwatch w;
    const double cpu0 = ThreadCpuSeconds();
    spool_->Submit(r.step, plog_->TakeStep(r.step));
    log_cpu_seconds_ += ThreadCpuSeconds() - cpu0;
    log_seconds_ += w.Seconds();
  }
  r.log_seconds = log_seconds_;
  r.log_cpu_seconds = log_cpu_seconds_;
  r.log_bytes = log_bytes_;
  r.seconds = total.Seconds();
  return r;
}

// Logs each chunk, then lets the hooks see it (OnOptimizerChunk).
class Trainer::StepSink : public opt::UndoSink {
 public:
  StepSink(Trainer* trainer, int64_t step) : trainer_(trainer), step_(step) {}
  Status BeforeWrite(uint64_t offset, uint64_t count, const float* const* buffers,
                     int num_buffers) override {
    if (trainer_->undo_log_) {
      MEMENTO_RETURN_IF_ERROR(
          trainer_->undo_log_->BeforeWrite(offset, count, buffers, num_buffers));
    }
    if (trainer_->hooks_ == nullptr) return Status::Ok();
    return trainer_->hooks_->OnOptimizerChunk(step_, offset, count);
  }

 private:
  Trainer* trainer_;
  int64_t step_;
};

Status Trainer::ApplyAdamW(int64_t step, float lr) {
  // This rank's optimizer range of the flat buffer (ZeRO-1: its shard).
  const size_t lo = opt_offset_;
  opt::Shard shard{lo, m_.size(), params_.data() + lo, grads_.data() + lo, {m_.data(), v_.data()}};
  if (!undo_log_ && hooks_ == nullptr) return optimizer_->Step(step, lr, shard);
  StepSink sink(this, step);
  return optimizer_->Step(step, lr, shard, &sink);
}

Status Trainer::TakeTpStatus() {
  Status st = std::move(tp_status_);
  tp_status_ = Status::Ok();
  if (!st.ok()) Phase(TrainPhase::kCompute);
  return st;
}

Status Trainer::CheckSameStep() {
  // All steps are equal iff W * sum(s^2) == sum(s)^2; every rank computes
  // the same verdict. Steps are far below 2^26, so the doubles are exact.
  const double s = static_cast<double>(state_.step);
  double sums[3] = {s, s * s, 1.0};
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorld(sums, 3));
  if (sums[2] * sums[1] != sums[0] * sums[0]) {
    return FailedPreconditionError("ranks are at different steps after load/restore (this rank " +
                                   std::to_string(rank()) + " at step " +
                                   std::to_string(state_.step) + ", mean step " +
                                   std::to_string(sums[0] / sums[2]) + ")");
  }
  return Status::Ok();
}

Result<double> Trainer::GradNorm(int64_t step) {
  double sumsq = 0.0;
  if (comm_->dp_rank() == 0) {
    for (const ParamTensor& t : stage_->tensors()) {
      if (!t.tp_split && comm_->tp_rank() != 0) continue;  // count replicas once
      const float* g = grads_.data() + t.offset;
      for (size_t i = 0; i < t.numel; ++i) sumsq += static_cast<double>(g[i]) * g[i];
    }
  }
  // The job-wide sum: logged by every stage under sender = receiver = -1, so
  // a replayed stage finds it in any neighbour's log.
  const MessageKey key{step, 0, -1, -1, MessageKind::kGradNormSq};
  if (replay_ != nullptr && !replay_all_) {
    MEMENTO_RETURN_IF_ERROR(ReplayInput(key, &sumsq, sizeof(sumsq)));
  } else {
    Phase(TrainPhase::kCommunicate);
    if (hooks_ != nullptr) hooks_->BeforeCollective(step, StepCollective::kGradNormAllreduce);
    // The commit round (below) only where groups may be kept: with the
    // undo log (the in-process recovery modes), unless every group is
    // rebuilt anyway.
    const bool commit = options_.undo_log && !options_.rebuild_all_groups;
    Status st = comm_->AllreduceWorld(&sumsq, 1);
    if (!st.ok()) {
      // Failed after this rank's schedule and its DP allreduce, before its
      // commit token went out, so no rank can have passed the gradient norm
      // (below): Reconnect offers to keep its PP, TP and DP groups
      // (docs/swift.md). Without the round a peer may have passed: nothing.
      if (commit) {
        quiescent_step_ = step;
        quiescent_dp_ = true;
      }
      return st;
    }
    // The commit round. A lost rank whose part of the sum went out may let
    // some peers complete the allreduce and not others; without this round
    // such a peer would go on into the next step (or ZeRO-1's all-gather)
    // and wait on a rank that failed here and kept its groups open. No rank
    // passes the round before every rank entered it: a failure before this
    // rank's token went out (above) proves that nobody passed. A failure in
    // the round does not (a peer may have all tokens), so it offers nothing:
    // every group is closed at once, freeing a peer that waits on this rank.
    const int partial = hooks_ != nullptr ? hooks_->PartialCommit(step) : -1;
    if (commit) st = comm_->CommitWorld(partial);
    if (partial >= 0) {
      hooks_->AfterPartialCommit(step);
      return UnavailableError("fault injection: left the commit round of step " +
                              std::to_string(step) + " after " + std::to_string(partial) +
                              " token(s)");
    }
    MEMENTO_RETURN_IF_ERROR(st);
    Phase(TrainPhase::kCompute);
  }
  LogSent(key, &sumsq, sizeof(sumsq));
  return std::sqrt(sumsq);
}

}  // namespace memento::trainer
