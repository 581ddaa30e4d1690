// One rank of the hybrid-parallel trainer: owns the training state in a few
// flat buffers, runs a step (1F1B pipeline schedule over micro-batches,
// Megatron tensor parallelism, data parallelism with optional ZeRO-1), and
// saves/loads its full state to a plain file.
//
// Training state (what a checkpoint must hold), per rank:
//   params()  fp32[padded_params()]   replicated over DP
//   adam_m(), adam_v()  fp32[optimizer_numel()]  ZeRO-1: this DP rank's
//             shard [optimizer_offset(), +optimizer_numel()) of the flat
//             (padded) parameter buffer; otherwise the whole buffer
//   state()   TrainState POD (step, data cursor)   private
// Gradients are scratch, zeroed every step.
//
// Step protocol and where the hooks fire (what memento needs):
//   forward/backward of all micro-batches  (OnPhase: compute, idle while a
//       pipeline receive waits, communicate during collectives)
//   gradient allreduce over DP
//   BeforeOptimizerStep(step)  <- Fence: nothing registered was written yet
//   AdamW (ZeRO-1: on the own shard, then all-gather parameters over DP)
//   state().step = step, data cursor advanced
//   AfterOptimizerStep(step)   <- Snapshot(step)
// Registered memory (params, moments, state) is only written between the two
// hooks.
//
// Determinism: for a given seed and topology every step is bitwise
// reproducible, including after Load of a state saved by Save.
//
// Thread safety: none; one thread drives a Trainer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "data.h"
#include "memento/status.h"
#include "model.h"
#include "opt/adamw.h"
#include "opt/undo_log.h"
#include "pipeline_log.h"

namespace memento::trainer {

// AdamW and its schedule live in src/opt (one implementation for the trainer
// and memento's host optimizer: AOR, update-undo).
using opt::AdamWConfig;
using opt::LearningRate;

enum class TrainPhase : uint8_t { kCompute = 0, kIdle = 1, kCommunicate = 2 };

// The collectives of a step after its pipeline schedule, in order: the DP
// gradient allreduce, the world's gradient-norm allreduce (and its commit
// round, Comm::CommitWorld), ZeRO-1's parameter all-gather
// (TrainerHooks::BeforeCollective).
enum class StepCollective : uint8_t {
  kGradAllreduce = 0,
  kGradNormAllreduce = 1,
  kParamAllgather = 2
};

// Callbacks into an integration (memento, tracing). Called on the trainer
// thread. A failing hook fails the step.
class TrainerHooks {
 public:
  virtual ~TrainerHooks() = default;
  virtual void OnPhase(TrainPhase phase) {}
  // Called just before this rank enters collective `which` of step `step`
  // (not while a replay reads the gradient norm from a log).
  virtual void BeforeCollective(int64_t step, StepCollective which) {}
  // Fault injection inside the commit round of step `step`'s gradient norm
  // (a rank lost after its part of the collective went out): a value >= 0
  // sends this rank's token only to that many other ranks (in rank order),
  // then calls AfterPartialCommit (which is expected to end the process)
  // and fails the step. -1 (the default): the normal round.
  virtual int PartialCommit(int64_t step) { return -1; }
  virtual void AfterPartialCommit(int64_t step) {}
  [[nodiscard]] virtual Status BeforeOptimizerStep(int64_t step) { return Status::Ok(); }
  [[nodiscard]] virtual Status AfterOptimizerStep(int64_t step) { return Status::Ok(); }
  // Called before the optimizer writes elements [offset, offset + count) of
  // the flat buffer in step `step`, chunk by chunk (with
  // TrainerOptions::undo_log after the chunk's pre-update values are
  // logged). A failure here is a failure inside the optimizer update: the
  // rank is left half updated, which RecoverByUndo() repairs.
  [[nodiscard]] virtual Status OnOptimizerChunk(int64_t step, uint64_t offset, uint64_t count) {
    return Status::Ok();
  }
  // Extra text for the progress line (for example the last snapshot's
  // statistics); empty for none.
  virtual std::string ProgressNote() { return ""; }
  // A JSON object summing up the run (for example snapshot statistics per
  // HAS layer), printed by --json on every rank; empty for none. Called once,
  // after the last step.
  virtual std::string SummaryJson() { return ""; }
  // In-process recovery (docs/swift.md): called before the rank's state is
  // rewritten (an undo, a replica's or a tier's state written over it), so
  // that a snapshot still reading it is finished first.
  [[nodiscard]] virtual Status BeforeRecovery() { return Status::Ok(); }
  // After an in-process recovery to step `step`: the rank may already hold
  // snapshots of later steps (taken before the failure, from the same
  // bytes the steps recomputed now give), up to `held_through`; a rank that
  // holds none of `step` (a replacement whose state came from a replica)
  // snapshots it now, so that the step can commit.
  [[nodiscard]] virtual Status AfterRecovery(int64_t step, int64_t held_through) {
    return Status::Ok();
  }
};

// The private part of a rank's state; fixed layout (saved raw).
struct TrainState {
  uint64_t magic = kMagic;
  int64_t step = 0;  // optimizer steps done
  DataCursor cursor;
  static constexpr uint64_t kMagic = 0x3174617473747274ULL;  // "trtstat1"
};
static_assert(sizeof(TrainState) == 32, "TrainState is saved raw");

struct TrainerOptions {
  ModelConfig model;
  CommOptions comm;       // topology, rank, rendezvous
  int global_batch = 8;   // sequences per optimizer step (all DP ranks)
  int micro_batches = 1;  // per DP rank and step
  bool zero1 = false;     // shard the AdamW moments over DP
  AdamWConfig adam;
  float clip_grad = 1.0f;  // global gradient-norm clip; 0: off
  uint64_t seed = 1;       // model init and corpus
  int blas_threads = 1;
  // Keep the undo log of each optimizer step (SWIFT update-undo,
  // docs/swift.md): 12 bytes per element of the rank's optimizer range,
  // plus the other shards' params under ZeRO-1. Changes no bit of training.
  bool undo_log = false;
  // Keep the pipeline message log (SWIFT logging-based recovery,
  // docs/swift.md): a copy of every activation and gradient this stage
  // sends, the checksum of every one it receives, the step's gradient norm.
  bool pipeline_log = false;
  // With pipeline_log: keep the log in this directory instead of the
  // trainer's memory, a file per completed step written by a background
  // thread (PipelineLogSpool; a tmpfs directory such as /dev/shm/...: the
  // node's shared memory, which outlives a crashed rank). Empty: in memory.
  std::string pipeline_log_dir;
  // Benchmarking only (`memento bench swift`, logging's overhead from
  // adjacent steps): with pipeline_log and a period N > 1, log only the
  // messages of steps s with s % N == 1 (N = 2: the odd steps). Such a log
  // cannot replay another step.
  int pipeline_log_period = 1;
  // With pipeline_log: where a logged message is copied and checksummed.
  // kThread (default): by a worker thread while the trainer computes or
  // waits for its next message, the trainer fencing each buffer before it
  // writes it (PipelineLogWriter; issue 19, logging off the critical path).
  // kInline: in the send or receive call, on the trainer's thread.
  PipelineLogWriter::Mode log_copy = PipelineLogWriter::Mode::kThread;
  // Selective logging (SWIFT 2.2): consecutive stages form log groups of
  // this many stages (stage s is in group s / log_group_size); only
  // messages between groups are logged. A lost stage's whole group rolls
  // back to its snapshot and replays together (live messages inside the
  // group, logged ones across its edges). 1: every stage its own group.
  int log_group_size = 1;
  // Benchmarking (`memento bench swift`, resume_s against the old way):
  // Reconnect rebuilds every Gloo group instead of keeping the quiescent
  // ones that no lost rank is in.
  bool rebuild_all_groups = false;
};

struct StepResult {
  int64_t step = 0;
  bool has_loss = false;   // only the reporting rank (dp 0, tp 0, last stage)
  double loss = 0.0;       // mean token loss of the global batch
  double grad_norm = 0.0;  // global L2 norm of the gradient (before clipping)
  double seconds = 0.0;
  double idle_seconds = 0.0;      // waiting for activations or gradients
  double comm_seconds = 0.0;      // in collectives
  double fence_seconds = 0.0;     // in BeforeOptimizerStep (memento: Fence)
  double snapshot_seconds = 0.0;  // in AfterOptimizerStep (memento: Snapshot)
  double log_seconds = 0.0;       // copying messages into the pipeline log
  // The trainer thread's CPU seconds in the pipeline log this step: queueing
  // (or, inline, copying) messages, the copies its fences and the step's
  // end had to make themselves, handing the step to the spool.
  double log_cpu_seconds = 0.0;
  uint64_t log_bytes = 0;  // payload bytes the pipeline log took this step
};

class Trainer {
 public:
  // Validates the options, connects the process groups and initialises the
  // state of step 0. `hooks` may be null; it must outlive the Trainer.
  static Result<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                 TrainerHooks* hooks);

  // Replaces the hooks (may be null; must outlive every later Step()).
  void SetHooks(TrainerHooks* hooks) { hooks_ = hooks; }
  TrainerHooks* hooks() const { return hooks_; }

  // Runs optimizer step state().step + 1.
  Result<StepResult> Step();

  // Full rank state to/from a file; Load checks that the file was written by
  // the same model, topology and rank.
  [[nodiscard]] Status Save(const std::string& path) const;
  [[nodiscard]] Status Load(const std::string& path);
  // The step of the state saved in `path` (header checked as by Load), without
  // loading it.
  [[nodiscard]] Result<int64_t> SavedStep(const std::string& path) const;

  // Checks that every rank of the job is at the same step (after a load or
  // a restore: ranks that resumed from different versions must not train
  // on). FailedPrecondition names this rank's step and the spread.
  [[nodiscard]] Status CheckSameStep();

  // ---- update-undo (SWIFT 2.1, docs/swift.md); needs options().undo_log.
  // Puts this rank back to the bytes it held before its last optimizer step
  // began (params, moments, step, data cursor), whether that step was
  // interrupted or completed. FailedPrecondition when there is nothing to
  // undo (no log, or already undone); the log's DataLoss when it is corrupt
  // (nothing is written then).
  [[nodiscard]] Status UndoStep();
  // Collective over the world (every rank calls it, after a failure, on a
  // working Comm: see Reconnect): the ranks agree on the last step every
  // surviving rank completed, and each survivor that is ahead of it or half
  // way into the next step undoes that step. A `replacement` (a new process
  // for a lost rank, its state empty) then receives params, moments and
  // TrainState from a surviving DP replica (replication-based recovery;
  // needs DP > 1 without ZeRO-1: a ZeRO-1 moment shard has no replica).
  // Returns the agreed step. FailedPrecondition on every rank when some rank
  // cannot get there (two steps ahead, its log gone or corrupt, no replica):
  // the job must fall back to a snapshot.
  // Under ZeRO-1 a replacement's moment shard has no replica: it is loaded by
  // `restore(step)` instead (memento's tiers: the client's Restore(step) of
  // the agreed step), which must leave state().step == step; params and
  // TrainState still come from the replica. Without `restore`, ZeRO-1 is
  // FailedPrecondition ("no DP replica"). When the replacement's tiers hold
  // no version of the agreed step (its snapshot was skipped by the commit
  // word rule, or cut short by the kill), the job goes back, in process, to
  // the newest of the kUndoStepsBack steps before it that every rank holds
  // (`held`): the replacement and every survivor load their own version of
  // it with `restore`. None: FailedPrecondition on every rank (fall back).
  static constexpr int64_t kUndoStepsBack = 16;
  // `held`: the steps of the intact versions this rank holds in the tiers
  // (null: none known).
  Result<int64_t> RecoverByUndo(
      bool replacement = false, const std::function<Status(int64_t)>& restore = nullptr,
      const std::function<Result<std::vector<int64_t>>()>& held = nullptr);
  // True between the first write of an optimizer step and the end of Step()
  // (a failure in between leaves the rank half updated).
  bool in_update() const { return in_update_; }
  const opt::UndoLog* undo_log() const { return undo_log_.get(); }

  // In-process recovery: drops the process groups (pending sends are
  // abandoned, so peers blocked on this rank fail at once) and connects new
  // ones under run id `run_id` (every rank of the job passes the same, new
  // id). The training state is kept. A group no lost rank is in is kept
  // instead when every member knows it quiescent (Comm::Reconnect's vote):
  // a step that failed in the DP gradient allreduce, after its whole
  // pipeline schedule, offers the PP and TP groups; one that failed in the
  // gradient-norm allreduce, after the DP allreduce too, also the DP group
  // (docs/swift.md "Which Gloo groups are rebuilt"). comm().kept_groups()
  // names them.
  [[nodiscard]] Status Reconnect(const std::string& run_id);

  // ---- logging-based recovery (SWIFT 2.2, docs/swift.md); needs
  // options().pipeline_log. null without it.
  const PipelineLog* pipeline_log() const { return plog_.get(); }
  // Drops log entries of steps <= `step` (a version at `step` committed).
  void TruncatePipelineLog(int64_t step) {
    if (plog_) plog_->Truncate(step);
    if (spool_) spool_->Truncate(step);
  }
  [[nodiscard]] Status WritePipelineLog(const std::string& path) const;
  // With options().pipeline_log_dir: waits until every completed step's log
  // is in its file there (a survivor before a neighbour's replay). OK
  // without a spool.
  [[nodiscard]] Status FlushPipelineLog() { return spool_ ? spool_->Flush() : Status::Ok(); }
  const PipelineLogSpool* pipeline_log_spool() const { return spool_.get(); }
  // The pipeline log's copy worker (null without the log).
  PipelineLogWriter* pipeline_log_writer() { return log_writer_.get(); }
  // Collective over the world after a stage was lost and replaced (every
  // rank calls it on a working Comm, see Reconnect): the ranks agree on the
  // last step every survivor completed; a survivor ahead of it or half into
  // the next update undoes that step (needs options().undo_log); the
  // replacement (`replacement` true; it loaded the stage's last snapshot)
  // reads its neighbours' logs from `log_paths` and replays the steps up to
  // it with the logged inputs, checking that every output it recomputes is
  // what it sent before (the receivers' checksums). Returns the step.
  // FailedPrecondition on every rank when any rank cannot (a log entry
  // missing or failing its checksum, a replayed output that differs, an
  // undo that is not possible, TP > 1): the job must fall back to a
  // snapshot. With DP > 1 the lost rank's DP peers (the other ranks of its
  // stage) roll back and replay with it, each from its own snapshot and its
  // own pipeline neighbours' logs, the DP allreduces live among them; this
  // needs the rolling-back overload below (`load_snapshot` or `source`).
  Result<int64_t> RecoverByReplay(const std::vector<std::string>& log_paths, bool replacement);
  // The same with selective logging (options().log_group_size > 1): the
  // ranks learn which stages were replaced; every stage in a replaced
  // stage's log group replays: a replacement from the snapshot it loaded, a
  // surviving group-mate after rolling back with `load_snapshot` (its last
  // snapshot; all of the group's must be of the same step). The replayers
  // read the logs of the stages just outside their group (`log_path(rank)`)
  // and run the group's messages live. With one group for the whole
  // pipeline nothing but the gradient norm is logged and every rank rolls
  // back (an in-process restart). A replayer that fails mid-replay leaves
  // its group-mates waiting on it until --comm-timeout.
  // `source`, when given, is where the replayers without `load_snapshot`
  // (the replacement, and group-mates) load their stage's snapshot once the
  // step t to reach is agreed, e.g. memento's tiers: each finds the newest
  // snapshot it can load at or before t (`newest`), all of them agree on the
  // oldest of those, and each loads that step (`load`). Without it the
  // replacement replays from the state it holds. (Every rank of a job passes
  // a source or none.)
  struct SnapshotSource {
    std::function<Result<int64_t>(int64_t target)> newest;
    std::function<Status(int64_t step)> load;
  };
  Result<int64_t> RecoverByReplay(const std::function<std::string(int rank)>& log_path,
                                  bool replacement, const std::function<Status()>& load_snapshot,
                                  const SnapshotSource* source = nullptr);
  // Steps this rank replayed in its last RecoverByReplay (0: it did not).
  int64_t replayed_steps() const { return replayed_steps_; }
  // Payload bytes of the logged inputs (activations, gradients) it replayed.
  uint64_t replayed_bytes() const { return replayed_bytes_; }
  // The log group of pipeline stage `stage`.
  int LogGroup(int stage) const { return stage / std::max(1, options_.log_group_size); }

  // Checksum (xxHash3) of params, moments and state: equal on two runs iff
  // their state is bitwise equal (up to hash collisions).
  uint64_t StateChecksum() const;

  const TrainerOptions& options() const { return options_; }
  Comm& comm() { return *comm_; }
  const Stage& stage() const { return *stage_; }
  bool reports_loss() const;
  int rank() const { return options_.comm.rank; }

  float* params() { return params_.data(); }
  size_t num_params() const { return stage_->num_params(); }
  size_t padded_params() const { return params_.size(); }
  float* adam_m() { return m_.data(); }
  float* adam_v() { return v_.data(); }
  // The gradient of the current step (after the DP allreduce and clipping
  // once BeforeOptimizerStep fires); scratch, fp32[padded_params()].
  const float* grads() const { return grads_.data(); }
  // The optimizer ApplyAdamW runs: groups are the stage's tensors (weight
  // decay on matrices only), the padding is in no group.
  const opt::AdamW& optimizer() const { return *optimizer_; }
  size_t optimizer_numel() const { return m_.size(); }
  size_t optimizer_offset() const { return opt_offset_; }
  TrainState* mutable_state() { return &state_; }
  const TrainState& state() const { return state_; }

 private:
  Trainer(const TrainerOptions& options, TrainerHooks* hooks);
  // Opens a Save file and checks its header; *f is positioned after it.
  Status OpenSaved(const std::string& path, FILE** f) const;
  void Phase(TrainPhase phase);
  // Global gradient L2 norm over all stages and TP slices (after the DP
  // allreduce, so every DP replica holds the same gradient).
  Result<double> GradNorm(int64_t step);
  // AdamW on this rank's optimizer range (ZeRO-1: its shard).
  Status ApplyAdamW(int64_t step, float lr);
  Status RunSchedule(int64_t step, const int32_t* tokens, double* loss_sum, double* idle_s,
                     double* comm_s);
  // Pipeline log of a sent / received message (no-op without the log).
  // Whether step `step`'s messages are logged (pipeline_log_period).
  bool LoggedStep(int64_t step) const;
  void LogSent(const MessageKey& key, const void* data, size_t bytes);
  void LogReceived(const MessageKey& key, const void* data, size_t bytes);
  // Before the trainer writes data[0, bytes): waits until the log's copy of
  // a message of step `step` there is made (PipelineLogWriter::Fence).
  void LogFence(int64_t step, const void* data, size_t bytes);
  // Every queued copy made (the log is complete); Step calls it on every
  // return.
  void LogDrain();
  // CPU seconds of the calling thread: the trainer's own logging cost, which
  // other processes' load does not inflate as it does wall time.
  static double ThreadCpuSeconds();
  // Replay: the logged input `key` into `data`, and the check of a
  // recomputed output against its receiver's receipt.
  Status ReplayInput(const MessageKey& key, void* data, size_t bytes);
  Status ReplayCheckOutput(const MessageKey& key, const void* data, size_t bytes);

  TrainerOptions options_;
  TrainerHooks* hooks_;  // not owned; may be null
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Stage> stage_;
  MarkovCorpus corpus_;
  int local_batch_ = 0, micro_batch_ = 0;

  class StepSink;

  std::unique_ptr<opt::AdamW> optimizer_;
  std::unique_ptr<opt::UndoLog> undo_log_;  // with options_.undo_log
  TrainState undo_state_;                   // state_ when the log began
  bool undo_ready_ = false;                 // the log can undo the last step
  bool in_update_ = false;
  std::unique_ptr<PipelineLog> plog_;        // with options_.pipeline_log
  std::unique_ptr<PipelineLogSpool> spool_;  // with options_.pipeline_log_dir
  // Declared after plog_: destroyed (drained) before it.
  std::unique_ptr<PipelineLogWriter> log_writer_;  // with options_.pipeline_log
  const PipelineLog* replay_ = nullptr;            // during RecoverByReplay: the inputs
  bool replay_all_ = false;  // every rank replays: the gradient norm is computed live
  int64_t replayed_steps_ = 0;
  // The groups the last failed step left quiescent (offered by Reconnect):
  // -1 when none; else the step, whose schedule (PP, TP) completed, and
  // with quiescent_dp_ its DP gradient allreduce too.
  int64_t quiescent_step_ = -1;
  bool quiescent_dp_ = false;
  uint64_t replayed_bytes_ = 0;
  Result<int64_t> ReplayRecovery(
      const std::function<std::vector<std::string>(const std::vector<int>& stages)>& paths,
      bool replacement, const std::function<Status()>& load_snapshot, const SnapshotSource* source);
  double log_seconds_ = 0.0;  // this step's
  double log_cpu_seconds_ = 0.0;
  uint64_t log_bytes_ = 0;
  std::vector<float> params_, grads_, m_, v_;
  size_t opt_offset_ = 0;
  double tp_comm_seconds_ = 0.0;  // this step's TP allreduces
  // A TP allreduce that failed inside the stage's computation (Create's
  // tp_allreduce); TakeTpStatus returns and clears it.
  Status tp_status_;
  [[nodiscard]] Status TakeTpStatus();
  TrainState state_;

  std::vector<int32_t> tokens_;
  std::vector<float> dout_;                 // received output gradient
  std::vector<std::vector<float>> dinput_;  // per micro-batch, sent upstream
};

}  // namespace memento::trainer
