#include "client/commit_lag.h"

namespace memento::client {

CommitLagTracker::Observation CommitLagTracker::Observe(int64_t step, int64_t committed,
                                                        TimePoint now) {
  Observation o;
  if (committed < 0) return o;
  o.behind_steps = step - committed;
  if (committed > seen_) {
    auto it = taken_.find(committed);
    if (it != taken_.end()) {
      o.lag_steps = step - committed;
      o.lag_s = SecondsBetween(it->second, now);
    }
    seen_ = committed;
    // Older pending steps were passed over by this commit.
    taken_.erase(taken_.begin(), taken_.upper_bound(committed));
  }
  return o;
}

void CommitLagTracker::Taken(int64_t step, TimePoint now) {
  if (step <= seen_) return;
  taken_[step] = now;
  while (taken_.size() > kMaxPending) taken_.erase(taken_.begin());
}

}  // namespace memento::client
