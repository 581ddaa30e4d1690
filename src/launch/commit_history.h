// What the launcher saw of the job's commits (docs/launch.md, "Commit
// history"): every commit with its wall time and attempt, the steps a commit
// passed over (some node reported them, they never committed), and the skip
// records agents published (a step a node will never report, e.g. a snapshot
// skipped under the durable hold), each in its commit epoch: after a
// recovery that rolled back, the steps after the restored one are computed
// again in a new epoch, and a skip (or a pass-over) of the abandoned
// history's step s says nothing about the new history's step s. The summary names the largest gap
// between consecutive commits of one attempt, in seconds and in steps, and the passed-over steps
// that no skip record explains: a failure-free job has none (tests/cluster/cluster_test.cc,
// NoFailure).
//
// Thread safety: all methods are thread-safe (commits arrive on the commit
// coordinator's watcher thread, skips on the skip watcher's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "coord/commit.h"
#include "coord/store.h"

namespace memento::launch {

struct CommitHistorySummary {
  int64_t count = 0;  // commits seen
  int64_t first = -1, last = -1;
  // Largest gap between two consecutive commits of the same attempt (the
  // trainers' restart after a failure is not a gap); at_step: the step that
  // ended it.
  double gap_max_s = 0;
  int64_t gap_max_steps = 0;
  int64_t gap_at_step = -1;
  // Passed over, no skip record of the same step in the same epoch.
  std::vector<coord::CommitId> uncommitted;
  // The steps committed in each attempt, in order (after a durable fallback
  // to S < C the next attempt commits steps S+1 .. C again: a new commit
  // epoch, docs/coordination.md "Epochs").
  std::map<int, std::vector<int64_t>> by_attempt;
  struct Skip {
    coord::CommitId id;  // the step and its commit epoch
    std::string node;
    std::string reason;  // the record's value ("" from older agents)
  };
  std::vector<Skip> skipped;  // in (epoch, step, node) order
  // Steps some node abandoned because it could not write their redundancy
  // (a ResourceExhausted reason: shared memory full, the node budget): they
  // ran unprotected. The first such reason, with its step and node.
  int64_t unprotected_steps = 0;
  std::string unprotected_reason;
  // Whose commit coordinator published the commits: "launcher" (its own,
  // with the passed-over steps) or "agents" (`memento launch
  // --coordinate-commits`: the agents' recovery leader's; the launcher
  // follows commit/latest and does not see which steps were passed over, so
  // `uncommitted` stays empty).
  std::string coordinator = "launcher";
  nlohmann::json ToJson() const;
  std::string ToString() const;  // one line
};

class CommitHistory {
 public:
  CommitHistory() = default;
  ~CommitHistory();

  // The attempt that later commits belong to (the launcher's restart count).
  void SetAttempt(int attempt) EXCLUDES(mu_);
  // A commit of `step` in commit epoch `epoch` that passed over `superseded`
  // (steps of the same epoch; CommitCoordinator::OnCommit).
  void OnCommit(int64_t step, const std::vector<int64_t>& superseded, uint64_t epoch = 0)
      EXCLUDES(mu_);
  // The skip record of `step` in commit epoch `epoch` by `node`. `reason`:
  // the record's value (why the node abandoned the step; "" from older
  // agents).
  void OnSkip(int64_t step, const std::string& node, const std::string& reason = "",
              uint64_t epoch = 0) EXCLUDES(mu_);
  // The number of unprotected steps so far and the first one's reason
  // (CommitHistorySummary::unprotected_steps / unprotected_reason).
  std::pair<int64_t, std::string> Unprotected() EXCLUDES(mu_);
  // Whether a skip reason says the step's redundancy could not be written.
  static bool IsUnprotectedReason(const std::string& reason);
  // Follows the job's skip records in `store` (replacing an earlier watch;
  // nullptr stops it). Agents delete old skip records, so they are collected
  // as they appear.
  void WatchSkips(coord::Store* store, const std::string& job) EXCLUDES(mu_);
  // Follows commit/latest instead of a coordinator's callback (nullptr
  // stops it): each commit above the last one seen is recorded, with no
  // passed-over steps; the first commit of a newer epoch (the recovery's
  // restored step, StartCommitEpoch) is not a commit of the trainers' and is
  // only remembered, as the launcher's own coordinator does not report it.
  void WatchCommits(coord::Store* store, const std::string& job) EXCLUDES(mu_);

  CommitHistorySummary Summary() EXCLUDES(mu_);

  // How long the current attempt has gone without a commit: seconds since
  // its newest commit, or since it began (SetAttempt; the launcher's start
  // for the first) when it has none yet. At an injected failure, how far
  // commits lagged behind the job in time (`[launch] injecting ... (job at
  // step N; committed K, commits quiet for T s)`, scripts/chaos.py).
  double QuietSeconds() EXCLUDES(mu_);

 private:
  struct Commit {
    int64_t step;
    int attempt;
    TimePoint at;
  };
  Mutex mu_;
  int attempt_ GUARDED_BY(mu_) = 0;
  TimePoint attempt_began_ GUARDED_BY(mu_) = Now();
  std::vector<Commit> commits_ GUARDED_BY(mu_);
  std::set<coord::CommitId> superseded_ GUARDED_BY(mu_);
  // (epoch, step), node -> the record's value.
  std::map<std::pair<coord::CommitId, std::string>, std::string> skipped_ GUARDED_BY(mu_);
  std::set<coord::CommitId> unprotected_ GUARDED_BY(mu_);
  std::string unprotected_reason_ GUARDED_BY(mu_);
  // Not guarded: replaced only by WatchSkips (the launcher's thread); its
  // callback takes mu_.
  std::unique_ptr<coord::Watcher> skip_watcher_;
  // The same for WatchCommits; last_seen_ is its callback's only.
  std::unique_ptr<coord::Watcher> commit_watcher_;
  std::optional<coord::CommitId> last_seen_;
};

}  // namespace memento::launch
