// In-process recovery by log replay (docs/swift.md): the pipeline log of the
// messages between stages (Trainer::LogSent, LogReceived, WritePipelineLog)
// and the lost stage's replay from its neighbours' logs
// (Trainer::RecoverByReplay, ReplayRecovery). Moved out of trainer.cc
// unchanged.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "common/checksum.h"
#include "common/clock.h"
#include "trainer.h"

namespace memento::trainer {

bool Trainer::LoggedStep(int64_t step) const {
  const int n = options_.pipeline_log_period;
  return n <= 1 || step % n == 1;
}

double Trainer::ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void Trainer::LogSent(const MessageKey& key, const void* data, size_t bytes) {
  if (!plog_ || !LoggedStep(key.step)) return;
  Stopwatch w;
  const double cpu0 = ThreadCpuSeconds();
  log_writer_->AppendSent(key, data, bytes);
  log_cpu_seconds_ += ThreadCpuSeconds() - cpu0;
  log_seconds_ += w.Seconds();
  log_bytes_ += bytes;
}

void Trainer::LogReceived(const MessageKey& key, const void* data, size_t bytes) {
  if (!plog_ || !LoggedStep(key.step)) return;
  Stopwatch w;
  const double cpu0 = ThreadCpuSeconds();
  log_writer_->RecordReceived(key, data, bytes);
  log_cpu_seconds_ += ThreadCpuSeconds() - cpu0;
  log_seconds_ += w.Seconds();
}

void Trainer::LogFence(int64_t step, const void* data, size_t bytes) {
  // Jobs are only pending in a logged step (Step drains at its end).
  if (!log_writer_ || log_writer_->mode() == PipelineLogWriter::Mode::kInline || !LoggedStep(step))
    return;
  Stopwatch w;
  const double cpu0 = ThreadCpuSeconds();
  log_writer_->Fence(data, bytes);
  log_cpu_seconds_ += ThreadCpuSeconds() - cpu0;
  log_seconds_ += w.Seconds();
}

void Trainer::LogDrain() {
  if (!log_writer_ || log_writer_->mode() == PipelineLogWriter::Mode::kInline) return;
  Stopwatch w;
  const double cpu0 = ThreadCpuSeconds();
  log_writer_->Drain();
  log_cpu_seconds_ += ThreadCpuSeconds() - cpu0;
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

}  // namespace memento::trainer
