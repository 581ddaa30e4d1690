// Global commit (docs/coordination.md, "Commit protocol").
//
// A version (step) is committed only when every node of the job reported
// COMPLETED for its pieces and its redundancy of that step (DESIGN.md, save
// path step 5). The pieces:
//
//   CommitTracker      the rule itself: a pure, single-threaded state machine.
//   CommitLog          each agent's local, durable list of commits it has seen.
//   ReportCompleted    an agent's COMPLETED(step, node) report into the store.
//   PublishCommit      writes COMMIT(step); commit/latest only ever grows (CAS),
//                      ordered by (epoch, step): a new epoch of the job's
//                      history (a restart from an older step) starts over.
//   CommitCoordinator  runs a CommitTracker on the store's completed/ reports.
//   CommitFollower     every agent: records commits in its CommitLog and tells
//                      the agent (which then frees versions older than it).
//   RepublishCommits   refills a restarted (empty) store from a CommitLog.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "coord/keys.h"
#include "coord/store.h"

namespace memento::coord {

// The commit rule. Not thread-safe (callers serialise).
//
// `members` is the set of nodes whose reports a step needs: the job's nodes,
// not merely the live ones, so a node failure blocks new commits until the
// recovery path changes the set (SetMembers) — a step is never committed
// without every node's pieces.
class CommitTracker {
 public:
  explicit CommitTracker(std::set<std::string> members, int64_t committed = -1);

  // Records COMPLETED(step, node). Returns the step that this report commits,
  // if any. Reports for steps <= committed() are ignored; reports from
  // non-members are kept (they count if the node becomes a member).
  std::optional<int64_t> OnCompleted(int64_t step, const std::string& node);
  // Replaces the member set; returns a newly committed step, if any.
  std::optional<int64_t> SetMembers(std::set<std::string> members);
  // Raises committed() to `step` (a commit learned from elsewhere). Monotonic.
  void ObserveCommitted(int64_t step);

  // Highest committed step, -1 before the first.
  int64_t committed() const { return committed_; }
  const std::set<std::string>& members() const { return members_; }
  // Members that have not reported `step`.
  std::set<std::string> Missing(int64_t step) const;
  std::vector<int64_t> PendingSteps() const;

 private:
  std::optional<int64_t> Evaluate();
  std::set<std::string> members_;
  int64_t committed_;
  std::map<int64_t, std::set<std::string>> reports_;  // steps > committed_
};

struct CommitRecord {
  int64_t step = -1;
  int64_t wall_ns = 0;
  // The job's history epoch (/memento/<job>/epoch) the commit belongs to.
  uint64_t epoch = 0;
};

// A commit's place in the job's history: commits are ordered by epoch, then
// step. The launcher bumps the epoch at every recovery and publishes the
// restored step as the first commit of the new epoch, so after a restart from
// an older step (the durable fallback) the steps trained again commit, while
// no commit of the abandoned history can ever be taken for a newer one
// (docs/coordination.md, "Epochs").
struct CommitId {
  uint64_t epoch = 0;
  int64_t step = -1;
  friend bool operator<(const CommitId& a, const CommitId& b) {
    return a.epoch != b.epoch ? a.epoch < b.epoch : a.step < b.step;
  }
  friend bool operator==(const CommitId& a, const CommitId& b) {
    return a.epoch == b.epoch && a.step == b.step;
  }
};
// commit/latest's text: "<step>" in epoch 0 (what older builds wrote and
// read), "<step>@<epoch>" otherwise.
std::string FormatCommitId(const CommitId& id);
// DataLoss naming the text when it is neither form.
[[nodiscard]] Result<CommitId> ParseCommitId(const std::string& text);

// An append-only file of commit records: fixed-size records (magic, version,
// step, time, [epoch,] xxHash3; version 1: 32 bytes, epoch 0; version 2, what
// is written now: 40 bytes with the epoch), fdatasync'ed on each append. A
// torn last record (crash mid-write) is dropped on Open. (epoch, step) only
// increases.
//
// Thread safety: all methods are thread-safe.
class CommitLog {
 public:
  // Opens or creates the log at `path` and loads its records. Past
  // `compact_above` records the file is rewritten with the newest
  // min(64, compact_above / 2).
  [[nodiscard]] static Result<std::unique_ptr<CommitLog>> Open(const std::string& path,
                                                               size_t compact_above = 4096);
  ~CommitLog();

  // Appends a record when (epoch, step) > latest()'s; returns false (and
  // writes nothing) for an old or repeated one.
  [[nodiscard]] Result<bool> Append(int64_t step, int64_t wall_ns, uint64_t epoch = 0)
      EXCLUDES(mu_);
  std::optional<CommitRecord> latest() EXCLUDES(mu_);
  std::vector<CommitRecord> records() EXCLUDES(mu_);
  const std::string& path() const { return path_; }

 private:
  CommitLog(std::string path, int fd, size_t compact_above)
      : path_(std::move(path)), compact_above_(std::max<size_t>(compact_above, 2)), fd_(fd) {}
  Status CompactLocked() REQUIRES(mu_);
  const std::string path_;
  const size_t compact_above_;
  Mutex mu_;
  int fd_ GUARDED_BY(mu_);
  std::vector<CommitRecord> records_ GUARDED_BY(mu_);
};

// Writes completed/<step>/<node>.
[[nodiscard]] Status ReportCompleted(Store& store, const std::string& job, const std::string& node,
                                     int64_t step, Deadline deadline);
// Writes commit/<step> and raises commit/latest to (epoch, step) if it is
// lower in (epoch, step) order. Returns whether commit/latest moved.
[[nodiscard]] Result<bool> PublishCommit(Store& store, const std::string& job, int64_t step,
                                         int64_t wall_ns, Deadline deadline, uint64_t epoch = 0);
// commit/latest's step; NotFound before the first commit.
[[nodiscard]] Result<int64_t> ReadLatestCommit(Store& store, const std::string& job,
                                               Deadline deadline);
// commit/latest with its epoch; NotFound before the first commit.
[[nodiscard]] Result<CommitId> ReadLatestCommitId(Store& store, const std::string& job,
                                                  Deadline deadline);
// Publishes the newest record of `log` (a restarted store learns the last
// commit from any agent that saw it).
[[nodiscard]] Status RepublishCommits(Store& store, const std::string& job, CommitLog& log,
                                      Deadline deadline);

// Runs the commit rule against the store. Any number may run at once (each
// publish is a monotonic CAS), typically one in the process that hosts the
// store or on the first node's agent. Its commits carry the epoch of
// commit/latest when it starts (the launcher publishes the restored step of
// a new epoch before it starts the coordinator of that epoch).
//
// Thread model: one Watcher thread on completed/ (feeds the tracker, publishes
// commits, deletes reports of committed steps).
class CommitCoordinator {
 public:
  using OnCommit = std::function<void(int64_t step)>;
  [[nodiscard]] static Result<std::unique_ptr<CommitCoordinator>> Start(
      Store* store, std::string job, std::set<std::string> members, Deadline deadline,
      OnCommit on_commit = nullptr);
  ~CommitCoordinator();
  void SetMembers(std::set<std::string> members) EXCLUDES(mu_);
  int64_t committed() EXCLUDES(mu_);

 private:
  CommitCoordinator(Store* store, std::string job, std::set<std::string> members, int64_t committed,
                    uint64_t epoch, OnCommit on_commit);
  void OnEvent(const WatchEvent& ev) EXCLUDES(mu_);
  void Commit(int64_t step) EXCLUDES(mu_);

  Store* const store_;
  const std::string job_;
  const JobKeys keys_;
  const OnCommit on_commit_;
  const uint64_t epoch_;
  Mutex mu_;
  CommitTracker tracker_ GUARDED_BY(mu_);
  std::unique_ptr<Watcher> watcher_;
};

// Every agent runs one: follows commit/latest, appends each new commit to the
// agent's CommitLog, then calls on_commit(step) (outside any lock) so the
// agent flips slots and frees older versions. Commits arrive strictly
// increasing in (epoch, step) order: within an epoch steps increase; a step
// lower than the previous one is the first commit of a new epoch (the job's
// history restarted there, and everything newer belongs to the abandoned one).
class CommitFollower {
 public:
  [[nodiscard]] static Result<std::unique_ptr<CommitFollower>> Start(
      Store* store, std::string job, CommitLog* log, std::function<void(int64_t)> on_commit,
      Deadline deadline);
  ~CommitFollower() { watcher_.reset(); }
  int64_t last_seen() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return last_.step;
  }

 private:
  CommitFollower() = default;
  void Observe(const CommitId& id) EXCLUDES(mu_);
  CommitLog* log_ = nullptr;
  std::function<void(int64_t)> on_commit_;
  // Observe runs on one thread at a time (the initial listing, then the
  // watcher's thread); the lock orders it with last_seen().
  Mutex mu_;
  CommitId last_ GUARDED_BY(mu_);
  std::unique_ptr<Watcher> watcher_;
};

}  // namespace memento::coord
