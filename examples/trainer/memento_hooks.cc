#include "memento_hooks.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "memento/client.h"
#include "opt/optimizer.h"

namespace memento::trainer {
namespace {

// Sums of the snapshot statistics of a run (SummaryJson).
struct SnapshotTally {
  int64_t snapshots = 0, skipped = 0, last_step = -1;
  uint64_t bytes = 0, bytes_idle = 0, bytes_compute = 0, bytes_communicate = 0, bytes_fence = 0;
  // The newest snapshot's bytes: the steady layout (a sharded client's
  // first snapshots are whole until the cluster's plan exists, so the
  // mean over the run depends on how soon the plan came).
  uint64_t last_bytes = 0;
  double fence_wait_s = 0, copy_s = 0, copy_cpu_s = 0;
  // Cluster mode: every Snapshot()'s distance to the newest commit, and
  // the lag of each version seen committed (SnapshotStats).
  std::vector<double> behind_steps, lag_steps, lag_s;

  void Add(const SnapshotStats& s) {
    if (s.step < 0 || s.step == last_step) return;
    last_step = s.step;
    if (s.committed >= 0) behind_steps.push_back(static_cast<double>(s.step - s.committed));
    if (s.commit_lag_steps >= 0) {
      lag_steps.push_back(static_cast<double>(s.commit_lag_steps));
      lag_s.push_back(s.commit_lag_s);
    }
    if (s.skipped) {
      ++skipped;
      return;
    }
    ++snapshots;
    bytes += s.bytes;
    last_bytes = s.bytes;
    bytes_idle += s.bytes_idle;
    bytes_compute += s.bytes_compute;
    bytes_communicate += s.bytes_communicate;
    bytes_fence += s.bytes_fence;
    fence_wait_s += s.fence_wait_s;
    copy_s += s.copy_s;
    copy_cpu_s += s.copy_cpu_s;
  }
};

// The q-quantile of `v` (nearest rank, q in [0, 1]); -1 when empty.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

class MementoHooks : public TrainerHooks {
 public:
  MementoHooks(std::unique_ptr<Client> client, std::string mode, std::string schedule,
               int64_t every, Trainer* aor_trainer, float aor_lr_scale)
      : client_(std::move(client)),
        mode_(std::move(mode)),
        schedule_(std::move(schedule)),
        every_(std::max<int64_t>(1, every)),
        aor_trainer_(aor_trainer),
        aor_lr_scale_(aor_lr_scale) {}

  void OnPhase(TrainPhase phase) override {
    switch (phase) {
      case TrainPhase::kCompute:
        client_->OnPhase(Phase::kCompute);
        break;
      case TrainPhase::kIdle:
        client_->OnPhase(Phase::kIdle);
        break;
      case TrainPhase::kCommunicate:
        client_->OnPhase(Phase::kCommunicate);
        break;
    }
  }
  Status BeforeOptimizerStep(int64_t step) override {
    Status st = client_->Fence();
    tally_.Add(client_->LastSnapshotStats());
    if (st.ok() && aor_trainer_ != nullptr) {
      // The gradient is final (all-reduced, clipped); the parameters are
      // still those of step - 1.
      const float lr = aor_trainer_->optimizer().LearningRate(step) * aor_lr_scale_;
      Stopwatch w;
      Status aor = client_->CaptureGradients(step, lr);
      // The first call registers with the agent: not timed, as the
      // trainer's mean step leaves out its first step.
      if (aor_.capture_calls++ > 0) {
        ++aor_.captures;
        aor_.capture_s += w.Seconds();
      }
      // The replicas are redundancy, never a reason to stop training.
      if (!aor.ok())
        std::fprintf(stderr, "memento: aor capture of step %" PRId64 ": %s\n", step,
                     aor.ToString().c_str());
    }
    return st;
  }
  Status AfterOptimizerStep(int64_t step) override {
    if (aor_trainer_ != nullptr && step > held_through_) {
      Trainer* t = aor_trainer_;
      const size_t lo = t->optimizer_offset(), n = t->optimizer_numel();
      Stopwatch w;
      const uint64_t sum = opt::ShardChecksum(lo, n, t->params() + lo, {t->adam_m(), t->adam_v()});
      const double checksum_s = w.Seconds();
      w.Reset();
      Status aor = Status::Ok();
      if (step > 1 && step < late_sums_) {
        late_.emplace_back(step, sum);  // --aor-test-late-sums
      } else {
        for (const auto& [s, c] : late_) {
          Status st = client_->ReportShardChecksum(s, c);
          if (aor.ok()) aor = st;
        }
        late_.clear();
        Status st = client_->ReportShardChecksum(step, sum);
        if (aor.ok()) aor = st;
      }
      if (aor_.report_calls++ > 0) {
        ++aor_.reports;
        aor_.checksum_s += checksum_s;
        aor_.report_s += w.Seconds();
      }
      if (!aor.ok())
        std::fprintf(stderr, "memento: aor checksum of step %" PRId64 ": %s\n", step,
                     aor.ToString().c_str());
    }
    // After an in-process recovery, a step this rank already snapshotted
    // before the failure (recomputed now to the same bytes) is not taken
    // again: the client refuses a step that is not newer.
    if (step <= held_through_ || step % every_ != 0) return Status::Ok();
    if (step == skip_step_) {
      std::fprintf(stderr, "memento: fault injection: no snapshot of step %" PRId64 "\n", step);
      return Status::Ok();
    }
    MEMENTO_RETURN_IF_ERROR(client_->Snapshot(step));
    // A survivor that rolled back and replayed takes the agreed step's
    // snapshot here, still in flight when AfterRecovery lists its versions:
    // without this AfterRecovery would take it again and the client refuse.
    held_through_ = std::max(held_through_, step);
    Status st = Status::Ok();
    if (mode_ == "sync") {
      // sync: the copy blocks the step (the baseline every other mode beats).
      st = client_->Fence();
      tally_.Add(client_->LastSnapshotStats());
    }
    if (st.ok()) PaceCommit(step);
    return st;
  }

  void set_skip_step(int64_t step) { skip_step_ = step; }
  void set_pace_commits(int64_t n) { pace_commits_ = n; }
  void set_late_sums(int64_t step) { late_sums_ = step; }

  Status BeforeRecovery() override {
    // The state is about to be rewritten: the snapshot in flight reads it.
    Status st = client_->Fence();
    tally_.Add(client_->LastSnapshotStats());
    return st;
  }

  Status AfterRecovery(int64_t step, int64_t held_through) override {
    held_through_ = std::max(held_through_, held_through);
    // A replacement's slots may hold a newer version its dead process took.
    auto versions = client_->ListVersions(Deadline::AfterSeconds(60));
    if (versions.ok()) {
      for (const VersionInfo& v : *versions) held_through_ = std::max(held_through_, v.step);
    }
    if (held_through_ > step) {
      std::fprintf(stderr,
                   "memento: recovered to step %" PRId64
                   "; this rank already holds snapshots through step %" PRId64
                   ", not taken again\n",
                   step, held_through_);
    }
    if (held_through_ >= step || step % every_ != 0) return Status::Ok();
    // A replacement whose state came from a replica holds no snapshot of
    // the agreed step: without one the step never commits.
    held_through_ = step;
    return client_->Snapshot(step);
  }

  Status RestoreStep(int64_t step) {
    auto r = client_->Restore(step);
    return r.status();
  }

  Result<std::vector<int64_t>> HeldIntact() {
    MEMENTO_ASSIGN_OR_RETURN(std::vector<VersionInfo> versions,
                             client_->ListVersions(Deadline::AfterSeconds(60)));
    std::vector<int64_t> steps;
    for (const VersionInfo& v : versions) {
      if (v.intact) steps.push_back(v.step);
    }
    return steps;
  }

  Result<int64_t> NewestIntact(int64_t step) {
    MEMENTO_ASSIGN_OR_RETURN(std::vector<VersionInfo> versions,
                             client_->ListVersions(Deadline::AfterSeconds(60)));
    int64_t best = -1;
    std::string held;
    for (const VersionInfo& v : versions) {
      held +=
          (held.empty() ? "" : ", ") + std::to_string(v.step) + (v.intact ? "" : " (not intact)");
      // The slots' newest version, whole or not: not taken again.
      held_through_ = std::max(held_through_, v.step);
      if (v.intact && v.step <= step) best = std::max(best, v.step);
    }
    if (best < 0) {
      return NotFoundError("no intact snapshot at or before step " + std::to_string(step) +
                           " in this rank's slots (held: " + (held.empty() ? "none" : held) + ")");
    }
    std::fprintf(stderr,
                 "memento: the newest intact snapshot at or before step %" PRId64
                 " is step %" PRId64 " (versions held: %s)\n",
                 step, best, held.c_str());
    return best;
  }

  std::string SummaryJson() override {
    Status st = client_->Fence();  // the last snapshot
    tally_.Add(client_->LastSnapshotStats());
    char buf[704];
    std::snprintf(buf, sizeof(buf),
                  "{\"mode\": \"%s\", \"schedule\": \"%s\", \"ok\": %s, \"snapshots\": %" PRId64
                  ", \"skipped\": %" PRId64 ", \"bytes\": %" PRIu64 ", \"last_bytes\": %" PRIu64
                  ", \"bytes_idle\": %" PRIu64 ", \"bytes_compute\": %" PRIu64
                  ", \"bytes_communicate\": %" PRIu64 ", \"bytes_fence\": %" PRIu64
                  ", \"fence_wait_s\": %.6f, \"copy_s\": %.6f, \"copy_cpu_s\": %.6f",
                  mode_.c_str(), schedule_.c_str(), st.ok() ? "true" : "false", tally_.snapshots,
                  tally_.skipped, tally_.bytes, tally_.last_bytes, tally_.bytes_idle,
                  tally_.bytes_compute, tally_.bytes_communicate, tally_.bytes_fence,
                  tally_.fence_wait_s, tally_.copy_s, tally_.copy_cpu_s);
    std::string out = buf;
    // Cluster mode only (docs/cluster.md, "Commit lag").
    if (!tally_.behind_steps.empty()) {
      std::snprintf(
          buf, sizeof(buf),
          ", \"commit_lag\": {\"versions\": %zu, \"steps_p50\": %.1f, \"steps_p90\": %.1f, "
          "\"steps_max\": %.1f, \"s_p50\": %.6f, \"s_p90\": %.6f, \"s_max\": %.6f, "
          "\"samples\": %zu, \"behind_p50\": %.1f, \"behind_p90\": %.1f, \"behind_max\": "
          "%.1f}",
          tally_.lag_steps.size(), Quantile(tally_.lag_steps, 0.5), Quantile(tally_.lag_steps, 0.9),
          Quantile(tally_.lag_steps, 1.0), Quantile(tally_.lag_s, 0.5), Quantile(tally_.lag_s, 0.9),
          Quantile(tally_.lag_s, 1.0), tally_.behind_steps.size(),
          Quantile(tally_.behind_steps, 0.5), Quantile(tally_.behind_steps, 0.9),
          Quantile(tally_.behind_steps, 1.0));
      out += buf;
    }
    if (aor_trainer_ != nullptr) {
      // What AOR costs this rank's training thread, per call (the host
      // step itself runs in the agent; docs/reft.md section 5).
      std::snprintf(buf, sizeof(buf),
                    ", \"aor\": {\"captures\": %" PRId64
                    ", \"capture_s\": %.6f, \"reports\": %" PRId64
                    ", \"checksum_s\": %.6f, \"report_s\": %.6f}",
                    aor_.captures, aor_.captures > 0 ? aor_.capture_s / aor_.captures : 0.0,
                    aor_.reports, aor_.reports > 0 ? aor_.checksum_s / aor_.reports : 0.0,
                    aor_.reports > 0 ? aor_.report_s / aor_.reports : 0.0);
      out += buf;
    }
    return out + "}";
  }

  // --memento-pace-commits: waits until the snapshot of `step` committed (or
  // cannot commit), while fewer than pace_commits_ snapshots have committed
  // that way (-1: always). A job then has versions committed at known steps
  // however slow the machine is: bench overhead --cluster waits for its
  // first commit (the first step is not timed), so the ranks see a commit
  // lag; bench swift's failure runs pace every snapshot, so a kill at step
  // N finds the snapshot before it committed (tests/bench).
  void PaceCommit(int64_t step) {
    if (pace_commits_ == 0 || (pace_commits_ > 0 && paced_ >= pace_commits_)) return;
    Stopwatch w;
    auto r = client_->WaitForCommit(step, Deadline::AfterSeconds(kPaceMaxS));
    if (r.ok()) {
      ++paced_;
      return;
    }
    std::fprintf(stderr, "memento: --memento-pace-commits: %s (after %.2f s)\n",
                 r.status().ToString().c_str(), w.Seconds());
    // Not a cluster job: nothing to wait for, ever.
    if (r.status().code() == StatusCode::kFailedPrecondition) pace_commits_ = 0;
  }

  std::string ProgressNote() override {
    const SnapshotStats s = client_->LastSnapshotStats();
    if (s.step < 0) return "";
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "snap_step %lld snap_bytes %llu copy_ms %.2f copy_cpu_ms %.2f fence_wait_ms %.2f "
                  "idle_bytes %llu fence_bytes %llu",
                  static_cast<long long>(s.step), static_cast<unsigned long long>(s.bytes),
                  s.copy_s * 1e3, s.copy_cpu_s * 1e3, s.fence_wait_s * 1e3,
                  static_cast<unsigned long long>(s.bytes_idle),
                  static_cast<unsigned long long>(s.bytes_fence));
    return buf;
  }

 private:
  std::unique_ptr<Client> client_;
  const std::string mode_;
  const std::string schedule_;
  SnapshotTally tally_;
  int64_t held_through_ = -1;
  int64_t skip_step_ = -1;
  // --memento-pace-commits: how many snapshots to pace (-1: all), and how
  // many paced ones committed so far.
  int64_t pace_commits_ = 0;
  int64_t paced_ = 0;
  static constexpr double kPaceMaxS = 60;
  int64_t late_sums_ = -1;                          // --aor-test-late-sums
  std::vector<std::pair<int64_t, uint64_t>> late_;  // its held-back checksums
  const int64_t every_;
  Trainer* const aor_trainer_;  // null: no AOR
  // Time the training thread spends on AOR (sums; SummaryJson: means).
  struct {
    int64_t capture_calls = 0, report_calls = 0;
    int64_t captures = 0, reports = 0;  // timed: all calls but the first
    double capture_s = 0, checksum_s = 0, report_s = 0;
  } aor_;
  const float aor_lr_scale_;
};

}  // namespace

Status RestoreMementoStep(TrainerHooks* hooks, int64_t step) {
  auto* m = dynamic_cast<MementoHooks*>(hooks);
  if (m == nullptr) return FailedPreconditionError("no memento client to restore from");
  return m->RestoreStep(step);
}

Result<std::vector<int64_t>> HeldMementoSteps(TrainerHooks* hooks) {
  auto* m = dynamic_cast<MementoHooks*>(hooks);
  if (m == nullptr) return FailedPreconditionError("no memento client to list versions of");
  return m->HeldIntact();
}

Result<int64_t> NewestMementoStep(TrainerHooks* hooks, int64_t step) {
  auto* m = dynamic_cast<MementoHooks*>(hooks);
  if (m == nullptr) return FailedPreconditionError("no memento client to restore from");
  return m->NewestIntact(step);
}

Status CheckSnapshotMode(const std::string& mode) {
  for (const char* m : {"", "sync", "host", "host_device", "has"}) {
    if (mode == m) return Status::Ok();
  }
  return InvalidArgumentError("snapshot mode '" + mode +
                              "' is not one of: off, sync, host, host_device, has");
}

Result<std::unique_ptr<TrainerHooks>> ConnectMemento(Trainer* trainer,
                                                     const MementoHookOptions& options,
                                                     int64_t* restored_step) {
  *restored_step = -1;
  const TrainerOptions& to = trainer->options();
  ClientOptions co;
  co.job_id = options.job_id;
  co.rank = to.comm.rank;
  co.world_size = to.comm.topology.world();
  co.agent_dir = options.agent_dir;
  co.node = options.node;
  MEMENTO_ASSIGN_OR_RETURN(co.schedule, ParseSchedule(options.schedule));
  MEMENTO_ASSIGN_OR_RETURN(co.copy_priority, ParseCopyPriority(options.copy_priority));
  if (options.chunk_bytes > 0) co.chunk_bytes = options.chunk_bytes;
  MEMENTO_RETURN_IF_ERROR(CheckSnapshotMode(options.snapshot_mode));
  if (options.snapshot_mode == "has") {
    co.schedule = Schedule::kHas;
  } else if (!options.snapshot_mode.empty()) {
    co.schedule = Schedule::kEager;
    // host: one chunk per tensor (the largest chunk the slot layout takes
    // that still fits every tensor of these presets whole).
    if (options.snapshot_mode == "host") co.chunk_bytes = size_t{1} << 30;
  }
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));

  TensorMeta params;
  params.name = "params";
  params.dtype = DType::kFloat32;
  params.shape = {static_cast<int64_t>(trainer->padded_params())};
  params.state_class = StateClass::kReplicated;
  MEMENTO_RETURN_IF_ERROR(client->RegisterTensor(params, trainer->params()));

  for (int i = 0; i < 2; ++i) {
    TensorMeta moment;
    moment.name = i == 0 ? "adam_m" : "adam_v";
    moment.dtype = DType::kFloat32;
    moment.shape = {static_cast<int64_t>(trainer->optimizer_numel())};
    if (to.zero1 && to.comm.topology.dp > 1) {
      moment.state_class = StateClass::kDpSharded;
      moment.global_numel = static_cast<int64_t>(trainer->padded_params());
      moment.shard_offset = static_cast<int64_t>(trainer->optimizer_offset());
    } else {
      moment.state_class = StateClass::kReplicated;
    }
    MEMENTO_RETURN_IF_ERROR(
        client->RegisterTensor(moment, i == 0 ? trainer->adam_m() : trainer->adam_v()));
  }
  MEMENTO_RETURN_IF_ERROR(
      client->RegisterBlob("train_state", trainer->mutable_state(), sizeof(TrainState)));
  // AOR: the node that holds a peer's optimizer shard brings it forward
  // from this gradient (docs/reft.md section 5).
  const bool aor = options.aor && to.zero1 && to.comm.topology.dp > 1;
  if (aor) {
    GradientRegistration g;
    g.grads = trainer->grads();
    g.numel = trainer->padded_params();
    g.params_tensor = "params";
    g.optimizer_encoding = trainer->optimizer().Encode();
    MEMENTO_RETURN_IF_ERROR(client->RegisterGradients(g));
  }
  MEMENTO_RETURN_IF_ERROR(client->Seal());

  if (options.restore) {
    Result<int64_t> restored = client->Restore();
    if (restored.ok()) {
      *restored_step = *restored;
      if (trainer->state().step != *restored) {
        return DataLossError("restored version " + std::to_string(*restored) +
                             " holds train_state.step " + std::to_string(trainer->state().step));
      }
    } else if (restored.status().code() != StatusCode::kNotFound) {
      return restored.status();
    }
  }
  auto hooks = std::make_unique<MementoHooks>(std::move(client), options.snapshot_mode,
                                              std::string(ScheduleName(co.schedule)), options.every,
                                              aor ? trainer : nullptr, options.aor_test_lr_scale);
  hooks->set_skip_step(options.skip_step);
  hooks->set_pace_commits(options.pace_commits);
  hooks->set_late_sums(options.aor_test_late_sums);
  return std::unique_ptr<TrainerHooks>(std::move(hooks));
}

}  // namespace memento::trainer
