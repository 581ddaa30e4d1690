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

// Header of a saved rank state; fixed layout, written raw.
struct SaveHeader {
  char magic[8];
  uint32_t version;
  int32_t rank;
  int32_t dp, tp, pp, zero1;
  int32_t vocab, seq, d_model, heads, layers, ffn_mult;
  uint64_t padded_params;
  uint64_t optimizer_numel;
  uint64_t optimizer_offset;
};
static_assert(sizeof(SaveHeader) == 80, "SaveHeader is saved raw");
constexpr char kSaveMagic[8] = {'M', 'M', 'T', 'R', 'A', 'I', 'N', '1'};

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
  if (o.pipeline_log) tr->plog_ = std::make_unique<PipelineLog>();
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
  auto input = [&](int from, float* data, int mb, MessageKind kind) -> Status {
    const MessageKey key{step, mb, from, stage, kind};
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
  if (spool_) {
    // The step's entries move to the spool's writer (no copy here).
    Stopwatch w;
    spool_->Submit(r.step, plog_->TakeStep(r.step));
    log_seconds_ += w.Seconds();
  }
  r.log_seconds = log_seconds_;
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

Status Trainer::UndoStep() {
  if (!undo_log_) return FailedPreconditionError("undo: the trainer keeps no undo log");
  if (!undo_ready_) {
    return FailedPreconditionError("undo: rank " + std::to_string(rank()) + " at step " +
                                   std::to_string(state_.step) +
                                   " has no optimizer step to undo (none yet, or undone)");
  }
  std::vector<opt::UndoTarget> targets = {{params_.data(), 0, params_.size()},
                                          {m_.data(), opt_offset_, m_.size()},
                                          {v_.data(), opt_offset_, v_.size()}};
  MEMENTO_RETURN_IF_ERROR(undo_log_->Undo(targets));
  state_ = undo_state_;
  undo_ready_ = false;
  in_update_ = false;
  return Status::Ok();
}

Result<int64_t> Trainer::RecoverByUndo(bool replacement,
                                       const std::function<Status(int64_t)>& restore,
                                       const std::function<Result<std::vector<int64_t>>()>& held) {
  // A survivor is either at the agreed step t (clean, or half into step
  // t + 1: in_update_) or it completed t + 1. The gradient allreduce before
  // every optimizer step keeps ranks within one step of each other. A
  // replacement has no step yet: it does not take part in the minimum.
  double step = replacement ? 1e18 : static_cast<double>(state_.step);
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(&step, 1));
  const int64_t target = static_cast<int64_t>(step);
  // Which ranks are replacements (every rank learns all of them).
  const Topology& t = options_.comm.topology;
  std::vector<double> replaced(t.world(), 0.0);
  replaced[rank()] = replacement ? 1.0 : 0.0;
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorld(replaced.data(), replaced.size()));
  // The root of this rank's DP group: its lowest surviving DP rank.
  int root = -1;
  bool group_has_replacement = false;
  for (int d = 0; d < t.dp; ++d) {
    const int r = t.Rank(d, comm_->tp_rank(), comm_->pp_rank());
    if (replaced[r] > 0.0) {
      group_has_replacement = true;
    } else if (root < 0) {
      root = d;
    }
  }
  // A ZeRO-1 replacement's moment shard has no replica: it comes from the
  // tiers (`restore`) at `target`, or when they hold no version of it, at an
  // older step every rank holds (below).
  const bool shard_from_tiers = replacement && options_.zero1;
  Status mine, at_target;
  if (replacement) {
    if (root < 0) {
      mine = FailedPreconditionError("no surviving DP replica of rank " + std::to_string(rank()));
    } else if (options_.zero1 && !restore) {
      mine = FailedPreconditionError(
          "ZeRO-1: the lost moment shard has no DP replica (recover from a snapshot)");
    } else if (options_.zero1) {
      at_target = restore(target);
      if (at_target.ok() && state_.step != target) {
        at_target =
            DataLossError("ZeRO-1: the moment shard restored for step " + std::to_string(target) +
                          " holds step " + std::to_string(state_.step));
      }
    }
  } else if (state_.step == target + 1 || (state_.step == target && in_update_)) {
    mine = UndoStep();
  } else if (state_.step != target) {
    mine = FailedPreconditionError("rank at step " + std::to_string(state_.step) +
                                   " is more than one step past " + std::to_string(target));
  }
  // Whether every rank got there, and whether every replacement has its
  // shard of `target`.
  double agree[2] = {mine.ok() ? 1.0 : 0.0, at_target.ok() ? 1.0 : 0.0};
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(agree, 2));
  if (!mine.ok()) {
    return FailedPreconditionError("update-undo to step " + std::to_string(target) +
                                   " failed on rank " + std::to_string(rank()) + ": " +
                                   mine.ToString());
  }
  if (agree[0] < 1.0) {
    return FailedPreconditionError("update-undo to step " + std::to_string(target) +
                                   " failed on another rank (fall back to a snapshot)");
  }
  int64_t agreed = target;
  if (agree[1] < 1.0) {
    // Back, in process, to the newest older step every rank holds in the
    // tiers (at worst the committed one): can[i] is step target - 1 - i.
    std::vector<double> can(kUndoStepsBack, 0.0);
    if (replacement && !options_.zero1) {
      std::fill(can.begin(), can.end(), 1.0);  // its state comes from the replica
    } else if (held) {
      auto steps = held();
      if (steps.ok()) {
        for (int64_t s : *steps) {
          if (s < target && s >= target - kUndoStepsBack) can[target - 1 - s] = 1.0;
        }
      } else {
        std::fprintf(stderr, "memento-trainer rank %d: the versions in the tiers: %s\n", rank(),
                     steps.status().ToString().c_str());
      }
    }
    MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(can.data(), can.size()));
    agreed = -1;
    for (int64_t i = 0; i < kUndoStepsBack && agreed < 0; ++i) {
      if (can[i] > 0.0 && target - 1 - i >= 1) agreed = target - 1 - i;
    }
    const std::string why = shard_from_tiers && !at_target.ok()
                                ? "ZeRO-1: the lost moment shard has no DP replica and the tiers "
                                  "have no version of step " +
                                      std::to_string(target) + ": " + at_target.ToString()
                                : "a replacement's moment shard of step " + std::to_string(target) +
                                      " is not in the tiers";
    if (agreed < 0) {
      return FailedPreconditionError(why + "; and no step in " +
                                     std::to_string(std::max<int64_t>(1, target - kUndoStepsBack)) +
                                     ".." + std::to_string(target - 1) +
                                     " that every rank holds (fall back to a snapshot)");
    }
    std::fprintf(stderr, "memento-trainer rank %d: %s: the job goes back to step %" PRId64 "\n",
                 rank(), why.c_str(), agreed);
    // Every rank that holds its own state loads its version of `agreed`.
    Status back;
    if (!replacement || options_.zero1) {
      back = restore ? restore(agreed)
                     : FailedPreconditionError("no snapshots to load step " +
                                               std::to_string(agreed) + " from");
      if (back.ok() && state_.step != agreed) {
        back = DataLossError("the state restored for step " + std::to_string(agreed) +
                             " holds step " + std::to_string(state_.step));
      }
      undo_ready_ = false;
      in_update_ = false;
      if (back.ok() && !replacement) {
        std::fprintf(stderr,
                     "memento-trainer rank %d: loaded its own snapshot of step %" PRId64
                     " from the tiers\n",
                     rank(), agreed);
      }
    }
    double ok = back.ok() ? 1.0 : 0.0;
    MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(&ok, 1));
    if (!back.ok()) {
      return FailedPreconditionError("going back to step " + std::to_string(agreed) +
                                     " failed on rank " + std::to_string(rank()) + ": " +
                                     back.ToString());
    }
    if (ok < 1.0) {
      return FailedPreconditionError("going back to step " + std::to_string(agreed) +
                                     " failed on another rank (fall back to a snapshot)");
    }
  }
  if (group_has_replacement) {
    // Replication-based recovery: the root's state to the replacement(s).
    // (ZeRO-1: the moments are shards, each rank's own; the replacement's
    // came from the tiers above.)
    MEMENTO_RETURN_IF_ERROR(
        comm_->BroadcastDp(params_.data(), params_.size() * sizeof(float), root));
    if (!options_.zero1) {
      MEMENTO_RETURN_IF_ERROR(comm_->BroadcastDp(m_.data(), m_.size() * sizeof(float), root));
      MEMENTO_RETURN_IF_ERROR(comm_->BroadcastDp(v_.data(), v_.size() * sizeof(float), root));
    }
    MEMENTO_RETURN_IF_ERROR(comm_->BroadcastDp(&state_, sizeof(state_), root));
    if (replacement) {
      undo_ready_ = false;
      in_update_ = false;
    }
  }
  MEMENTO_RETURN_IF_ERROR(CheckSameStep());
  return agreed;
}

Status Trainer::TakeTpStatus() {
  Status st = std::move(tp_status_);
  tp_status_ = Status::Ok();
  if (!st.ok()) Phase(TrainPhase::kCompute);
  return st;
}

bool Trainer::LoggedStep(int64_t step) const {
  const int n = options_.pipeline_log_period;
  return n <= 1 || step % n == 1;
}

void Trainer::LogSent(const MessageKey& key, const void* data, size_t bytes) {
  if (!plog_ || !LoggedStep(key.step)) return;
  Stopwatch w;
  plog_->AppendSent(key, data, bytes);
  log_seconds_ += w.Seconds();
  log_bytes_ += bytes;
}

void Trainer::LogReceived(const MessageKey& key, const void* data, size_t bytes) {
  if (!plog_ || !LoggedStep(key.step)) return;
  Stopwatch w;
  plog_->RecordReceived(key, data, bytes);
  log_seconds_ += w.Seconds();
}

Status Trainer::ReplayInput(const MessageKey& key, void* data, size_t bytes) {
  MEMENTO_ASSIGN_OR_RETURN(const std::string* payload, replay_->Sent(key));
  if (payload->size() != bytes) {
    return DataLossError("pipeline log: " + key.ToString() + " holds " +
                         std::to_string(payload->size()) + " bytes, the stage expects " +
                         std::to_string(bytes));
  }
  std::memcpy(data, payload->data(), bytes);
  replayed_bytes_ += bytes;
  return Status::Ok();
}

Status Trainer::ReplayCheckOutput(const MessageKey& key, const void* data, size_t bytes) {
  MEMENTO_ASSIGN_OR_RETURN(uint64_t want, replay_->ReceivedChecksum(key));
  if (MessageChecksum(key, data, bytes) != want) {
    return FailedPreconditionError("replay diverged: the recomputed " + key.ToString() +
                                   " differs from the one sent before (nondeterministic stage?)");
  }
  return Status::Ok();
}

Status Trainer::WritePipelineLog(const std::string& path) const {
  if (!plog_) return FailedPreconditionError("the trainer keeps no pipeline log");
  return plog_->WriteFile(path);
}

Result<int64_t> Trainer::RecoverByReplay(const std::vector<std::string>& log_paths,
                                         bool replacement) {
  return ReplayRecovery([&](const std::vector<int>&) { return log_paths; }, replacement, nullptr,
                        nullptr);
}

Result<int64_t> Trainer::RecoverByReplay(const std::function<std::string(int rank)>& log_path,
                                         bool replacement,
                                         const std::function<Status()>& load_snapshot,
                                         const SnapshotSource* source) {
  return ReplayRecovery(
      [&](const std::vector<int>& stages) {
        std::vector<std::string> paths;
        // The neighbours in this rank's own pipeline (DP and TP index kept).
        for (int s : stages) {
          paths.push_back(
              log_path(options_.comm.topology.Rank(comm_->dp_rank(), comm_->tp_rank(), s)));
        }
        return paths;
      },
      replacement, load_snapshot, source);
}

Result<int64_t> Trainer::ReplayRecovery(
    const std::function<std::vector<std::string>(const std::vector<int>& stages)>& paths,
    bool replacement, const std::function<Status()>& load_snapshot, const SnapshotSource* source) {
  const Topology& t = options_.comm.topology;
  // Which stages were replaced, and so which log groups replay.
  std::vector<double> replaced(t.world(), 0.0);
  replaced[rank()] = replacement ? 1.0 : 0.0;
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorld(replaced.data(), replaced.size()));
  const int my_stage = comm_->pp_rank();
  auto group_replays = [&](int group) {
    for (int r = 0; r < t.world(); ++r) {
      if (replaced[r] > 0.0 && LogGroup(r / (t.dp * t.tp)) == group) return true;
    }
    return false;
  };
  // With DP > 1 or TP > 1 every rank of a replaying stage replays (a lost
  // rank's DP and TP peers roll back with it): a replayed step's gradient
  // allreduce over DP needs each peer's own gradient of that step, and its
  // layers' TP allreduces each TP peer's partial sums of it, recomputed live
  // from each rank's own pipeline neighbours' logs (same DP and TP index).
  const bool replayer = replacement || group_replays(LogGroup(my_stage));
  bool all_replay = true;
  for (int s = 0; s < t.pp; ++s) all_replay = all_replay && group_replays(LogGroup(s));
  // The target: the last step every survivor that keeps its state
  // completed (the replayers roll back to a snapshot and replay up to it
  // anyway, so a replayer half into an update, e.g. a lost rank's DP peer
  // that failed in ZeRO-1's all-gather, does not hold the others back).
  // When every stage replays: the last step every survivor completed. A
  // survivor can be one step behind the others (the failure hit its
  // gradient-norm allreduce after the others had left it) or half into an
  // update: survivors ahead of the target undo theirs (SWIFT: "if
  // necessary, the surviving workers will undo the update"; needs
  // TrainerOptions::undo_log).
  double step = replayer ? 1e18 : static_cast<double>(state_.step);
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(&step, 1));
  if (step >= 1e18) {  // (every rank computes the same minimum)
    step = replacement ? 1e18 : static_cast<double>(state_.step);
    MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(&step, 1));
  }
  const int64_t target = static_cast<int64_t>(step);
  // Replayers that load their snapshot from `source` agree on one step: the
  // oldest of their newest snapshots at or before the target (-1: one has
  // none).
  const bool from_source = source != nullptr && replayer && (replacement || !load_snapshot);
  double common = 1e18;
  Status pick;
  if (from_source) {
    Result<int64_t> newest = source->newest(target);
    if (newest.ok()) {
      common = static_cast<double>(std::min(*newest, target));
    } else {
      pick = newest.status();
      common = -1.0;
    }
  }
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(&common, 1));
  Status mine;
  if (!plog_) {
    mine = FailedPreconditionError("the trainer keeps no pipeline log");
  } else if (from_source) {
    // The stage's snapshot of the replayers' common step.
    if (!pick.ok()) {
      mine = pick;
    } else if (common < 0) {
      mine = FailedPreconditionError("another replaying stage has no snapshot at or before step " +
                                     std::to_string(target));
    } else {
      const int64_t step = static_cast<int64_t>(common);
      mine = source->load(step);
      in_update_ = false;
      undo_ready_ = false;
      if (mine.ok() && state_.step != step) {
        mine = DataLossError("the snapshot of step " + std::to_string(step) + " holds step " +
                             std::to_string(state_.step));
      }
    }
  } else if (replayer && !replacement) {
    // A survivor in the lost stage's log group (what it received from the
    // lost stage was not logged), or a DP peer of a lost rank: it rolls back
    // with it.
    if (!load_snapshot) {
      mine = FailedPreconditionError(
          "stage " + std::to_string(my_stage) +
          " replays (a lost rank's DP peer, or in a lost stage's log group) and has no snapshot "
          "to roll back to");
    } else {
      mine = load_snapshot();
      in_update_ = false;
      undo_ready_ = false;
    }
  } else if (!replayer && (state_.step == target + 1 || (state_.step == target && in_update_))) {
    mine = UndoStep();
  } else if (!replayer && state_.step != target) {
    mine = FailedPreconditionError("survivor at step " + std::to_string(state_.step) +
                                   " is more than one step past " + std::to_string(target));
  }
  // The replayers of a group run its messages live, so they must start
  // from the same step (and everyone must be ready) before any replays.
  PipelineLog inputs;
  if (mine.ok() && replayer) {
    std::vector<int> outside;  // the stages just outside this log group
    const int first = my_stage - my_stage % std::max(1, options_.log_group_size);
    const int last = std::min(t.pp, first + std::max(1, options_.log_group_size)) - 1;
    if (first > 0) outside.push_back(first - 1);
    if (last + 1 < t.pp) outside.push_back(last + 1);
    for (const std::string& path : paths(outside)) {
      auto log = PipelineLog::ReadAny(path);
      if (!log.ok()) {
        mine = log.status();
        break;
      }
      inputs.Merge(*log);
    }
  }
  const double from = static_cast<double>(state_.step);
  double gate[3] = {mine.ok() ? 1.0 : 0.0, replayer ? from : 1e18, replayer ? -from : 1e18};
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(gate, 3));
  if (mine.ok() && gate[0] >= 1.0 && replayer && gate[1] != -gate[2]) {
    mine = FailedPreconditionError("the replaying stages start from different snapshots (steps " +
                                   std::to_string(static_cast<int64_t>(gate[1])) + " .. " +
                                   std::to_string(static_cast<int64_t>(-gate[2])) + ")");
  }
  replayed_steps_ = 0;
  replayed_bytes_ = 0;
  if (mine.ok() && gate[0] >= 1.0 && gate[1] == -gate[2] && replayer) {
    replay_all_ = all_replay;
    while (mine.ok() && state_.step < target) {
      replay_ = &inputs;
      auto r = Step();
      replay_ = nullptr;
      if (!r.ok()) mine = r.status();
      if (r.ok()) ++replayed_steps_;
    }
    replay_all_ = false;
  }
  double ok = mine.ok() && gate[0] >= 1.0 && gate[1] == -gate[2] ? 1.0 : 0.0;
  MEMENTO_RETURN_IF_ERROR(comm_->AllreduceWorldMin(&ok, 1));
  if (!mine.ok()) {
    return FailedPreconditionError("log replay to step " + std::to_string(target) +
                                   " failed on rank " + std::to_string(rank()) + ": " +
                                   mine.ToString());
  }
  if (ok < 1.0) {
    return FailedPreconditionError("log replay to step " + std::to_string(target) +
                                   " failed on another rank (fall back to a snapshot)");
  }
  MEMENTO_RETURN_IF_ERROR(CheckSameStep());
  return target;
}

Status Trainer::Reconnect(const std::string& run_id) {
  CommOptions c = options_.comm;
  c.run_id = run_id;
  // A rank offers to keep only groups it knows quiescent: no operation on
  // them failed or is pending, and no peer can wait in one. A step that
  // failed in the DP gradient allreduce, after this rank's pipeline
  // schedule, left its PP and TP groups so: every message of the schedule
  // went through, and no peer can be in a later pipeline or TP operation,
  // since the step's gradient-norm allreduce over the world, which each
  // needs first, still lacks this rank's part. A step that failed in that
  // gradient-norm allreduce (before its commit token went out, so nobody
  // passed the gradient norm) left its DP group so too (its gradient
  // allreduce completed here, hence every member's part of it is sent; the
  // next DP operation, ZeRO-1's all-gather or the next step's allreduce,
  // comes after the gradient norm). A failure anywhere else (inside the
  // schedule, in the gradient norm's commit round, in ZeRO-1's all-gather:
  // after the gradient norm a peer of another DP group may already be in
  // the next step's schedule, waiting on this rank) offers nothing. Everything not offered is
  // closed at once by Comm::Reconnect (peers blocked on this rank fail now) and rebuilt, like every
  // group a lost rank is in.
  Comm::Offer offer;
  if (quiescent_step_ >= 0 && !options_.rebuild_all_groups) {
    offer.tp = offer.pp = true;
    offer.dp = quiescent_dp_;
    offer.step = quiescent_step_;
  }
  quiescent_step_ = -1;
  quiescent_dp_ = false;
  MEMENTO_ASSIGN_OR_RETURN(comm_, Comm::Reconnect(c, std::move(comm_), offer));
  options_.comm.run_id = run_id;
  return Status::Ok();
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

namespace {
SaveHeader MakeHeader(const TrainerOptions& o, size_t padded, size_t opt, size_t offset) {
  SaveHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kSaveMagic, sizeof(h.magic));
  h.version = 1;
  h.rank = o.comm.rank;
  h.dp = o.comm.topology.dp;
  h.tp = o.comm.topology.tp;
  h.pp = o.comm.topology.pp;
  h.zero1 = o.zero1 ? 1 : 0;
  h.vocab = o.model.vocab;
  h.seq = o.model.seq;
  h.d_model = o.model.d_model;
  h.heads = o.model.heads;
  h.layers = o.model.layers;
  h.ffn_mult = o.model.ffn_mult;
  h.padded_params = padded;
  h.optimizer_numel = opt;
  h.optimizer_offset = offset;
  return h;
}
}  // namespace

Status Trainer::Save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoError("open " + tmp, errno);
  SaveHeader h = MakeHeader(options_, params_.size(), m_.size(), opt_offset_);
  bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1 &&
            std::fwrite(params_.data(), sizeof(float), params_.size(), f) == params_.size() &&
            std::fwrite(m_.data(), sizeof(float), m_.size(), f) == m_.size() &&
            std::fwrite(v_.data(), sizeof(float), v_.size(), f) == v_.size() &&
            std::fwrite(&state_, sizeof(state_), 1, f) == 1;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return ErrnoError("write " + tmp, errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  return Status::Ok();
}

// Opens a file written by Save and checks its header against this rank's
// (model, topology, rank, sizes); `*f` is positioned after the header.
Status Trainer::OpenSaved(const std::string& path, FILE** f) const {
  *f = std::fopen(path.c_str(), "rb");
  if (*f == nullptr) return ErrnoError("open " + path, errno);
  SaveHeader h, want = MakeHeader(options_, params_.size(), m_.size(), opt_offset_);
  if (std::fread(&h, sizeof(h), 1, *f) != 1) {
    std::fclose(*f);
    *f = nullptr;
    return DataLossError(path + ": truncated");
  }
  if (std::memcmp(&h, &want, sizeof(h)) != 0) {
    std::fclose(*f);
    *f = nullptr;
    return InvalidArgumentError(
        path + ": saved by another model, topology or rank (header mismatch: rank " +
        std::to_string(h.rank) + " dp " + std::to_string(h.dp) + " tp " + std::to_string(h.tp) +
        " pp " + std::to_string(h.pp) + " params " + std::to_string(h.padded_params) +
        "; this rank " + std::to_string(want.rank) + " dp " + std::to_string(want.dp) + " tp " +
        std::to_string(want.tp) + " pp " + std::to_string(want.pp) + " params " +
        std::to_string(want.padded_params) + ")");
  }
  return Status::Ok();
}

Status Trainer::Load(const std::string& path) {
  FILE* f = nullptr;
  MEMENTO_RETURN_IF_ERROR(OpenSaved(path, &f));
  std::vector<float> params(params_.size()), m(m_.size()), v(v_.size());
  TrainState state;
  bool ok = std::fread(params.data(), sizeof(float), params.size(), f) == params.size() &&
            std::fread(m.data(), sizeof(float), m.size(), f) == m.size() &&
            std::fread(v.data(), sizeof(float), v.size(), f) == v.size() &&
            std::fread(&state, sizeof(state), 1, f) == 1;
  std::fclose(f);
  if (!ok) return DataLossError(path + ": truncated");
  if (state.magic != TrainState::kMagic) return DataLossError(path + ": bad state magic");
  // Copy into the existing buffers: their addresses may be registered.
  std::copy(params.begin(), params.end(), params_.begin());
  std::copy(m.begin(), m.end(), m_.begin());
  std::copy(v.begin(), v.end(), v_.begin());
  state_ = state;
  return Status::Ok();
}

Result<int64_t> Trainer::SavedStep(const std::string& path) const {
  FILE* f = nullptr;
  MEMENTO_RETURN_IF_ERROR(OpenSaved(path, &f));
  const long at = static_cast<long>(sizeof(SaveHeader) +
                                    (params_.size() + m_.size() + v_.size()) * sizeof(float));
  TrainState state;
  const bool ok = std::fseek(f, at, SEEK_SET) == 0 && std::fread(&state, sizeof(state), 1, f) == 1;
  std::fclose(f);
  if (!ok) return DataLossError(path + ": truncated");
  if (state.magic != TrainState::kMagic) return DataLossError(path + ": bad state magic");
  return state.step;
}

uint64_t Trainer::StateChecksum() const {
  uint64_t h = Checksum(params_.data(), params_.size() * sizeof(float));
  h = ChecksumWithSeed(m_.data(), m_.size() * sizeof(float), h);
  h = ChecksumWithSeed(v_.data(), v_.size() * sizeof(float), h);
  return ChecksumWithSeed(&state_, sizeof(state_), h);
}

}  // namespace memento::trainer
