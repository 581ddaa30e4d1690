// Commit lag as the training sees it (docs/cluster.md, "Commit lag"): in
// cluster mode each Snapshot(step) reads the agent's commit word; a version
// seen committed for the first time has its lag measured from its own
// Snapshot() call to this one, in steps and seconds. The observation is as
// fine as the snapshots: a commit that lands during step s+1 is seen at
// Snapshot(s+1), one step after Snapshot(s).
//
// Thread safety: the trainer thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "common/clock.h"

namespace memento::client {

class CommitLagTracker {
 public:
  struct Observation {
    // step - committed (how far the training is ahead of its newest
    // committed version: the steps a failure now would lose); -1 before the
    // first commit.
    int64_t behind_steps = -1;
    // A version newly seen committed: Snapshot() calls and seconds since
    // its own Snapshot(); -1 when none (or its Snapshot() was not seen by
    // this tracker, e.g. a version of an earlier process).
    int64_t lag_steps = -1;
    double lag_s = -1;
  };

  // At Snapshot(step), before anything is written: `committed` is the
  // commit word now (-1: none yet).
  Observation Observe(int64_t step, int64_t committed, TimePoint now);
  // Snapshot(step) was taken at `now` (not called for a skipped one: it
  // never becomes a version).
  void Taken(int64_t step, TimePoint now);

 private:
  static constexpr size_t kMaxPending = 4096;
  std::map<int64_t, TimePoint> taken_;  // steps not yet seen committed
  int64_t seen_ = -1;                   // the newest commit seen
};

}  // namespace memento::client
