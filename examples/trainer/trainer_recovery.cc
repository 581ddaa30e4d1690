// In-process recovery by undo (docs/swift.md): a survivor undoes its
// partial optimizer update (Trainer::UndoStep), the ranks agree on a step
// and a lost rank is rebuilt from a DP replica (Trainer::RecoverByUndo);
// Trainer::Reconnect rebuilds the Gloo groups a recovery does not keep.
// Moved out of trainer.cc unchanged.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/checksum.h"
#include "common/clock.h"
#include "trainer.h"

namespace memento::trainer {

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

}  // namespace memento::trainer
