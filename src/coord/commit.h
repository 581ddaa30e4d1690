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
//                      in (epoch, step) order (CommitId).
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
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "coord/keys.h"
#include "coord/store.h"

namespace memento::coord {

// A commit's place in the job's history. Every recovery starts a new epoch
// (the job's history restarts at the restored step S): the recovery
// publishes S as the first commit of the new epoch, so the steps trained
// again after S commit even when an abandoned history had committed them
// (after a fallback to an older durable version), while no commit or report
// of the abandoned history is ever taken for one of the new history
// (docs/coordination.md, "Epochs"). Ordered by epoch, then step.
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
// commit/latest's text: "<step>" in epoch 0 (what older builds wrote),
// "<step>@<epoch>" otherwise.
std::string FormatCommitId(const CommitId& id);
// DataLoss naming the text when it is neither form.
[[nodiscard]] Result<CommitId> ParseCommitId(const std::string& text);

// The commit rule. Not thread-safe (callers serialise).
//
// `members` is the set of nodes whose reports a step needs: the job's nodes,
// not merely the live ones, so a node failure blocks new commits until the
// recovery path changes the set (SetMembers) — a step is never committed
// without every node's pieces.
//
// Epochs: a report counts only in its own epoch. Reports of an older epoch
// than the tracker's (the abandoned history) are ignored; reports of a newer
// one are kept until the tracker learns that epoch's first commit
// (ObserveCommitted), which drops everything older.
class CommitTracker {
 public:
  explicit CommitTracker(std::set<std::string> members, int64_t committed = -1, uint64_t epoch = 0);

  // Records COMPLETED(step, node) of `epoch`. Returns the step that this
  // report commits (in epoch()), if any. Reports at or below
  // (epoch(), committed()) are ignored; reports from non-members are kept
  // (they count if the node becomes a member).
  std::optional<int64_t> OnCompleted(int64_t step, const std::string& node, uint64_t epoch = 0);
  // Replaces the member set; returns a newly committed step, if any.
  std::optional<int64_t> SetMembers(std::set<std::string> members);
  // Raises (epoch(), committed()) to `id` (a commit learned from elsewhere:
  // a new epoch's first commit). Monotonic in CommitId order; returns a
  // step the kept reports of the new epoch now commit, if any.
  std::optional<int64_t> ObserveCommitted(const CommitId& id);
  void ObserveCommitted(int64_t step) { ObserveCommitted(CommitId{epoch_, step}); }

  // Highest committed step of epoch(), -1 before the first.
  int64_t committed() const { return committed_; }
  uint64_t epoch() const { return epoch_; }
  const std::set<std::string>& members() const { return members_; }
  // Members that have not reported `step`.
  std::set<std::string> Missing(int64_t step) const;
  std::vector<int64_t> PendingSteps() const;
  // Steps that some member reported but that a newer commit passed over
  // (they will never commit), oldest first, since the last call. A step is
  // passed over when a member skipped it or when its reports were lost; the
  // launcher reports these (docs/launch.md, "Commit history").
  std::vector<int64_t> TakeSuperseded();

 private:
  std::optional<int64_t> Evaluate();
  std::set<std::string> members_;
  int64_t committed_;
  uint64_t epoch_;
  // Reports above (epoch_, committed_), by (epoch, step).
  std::map<CommitId, std::set<std::string>> reports_;
  std::vector<int64_t> superseded_;
};

struct CommitRecord {
  int64_t step = -1;
  int64_t wall_ns = 0;
  uint64_t epoch = 0;  // CommitId::epoch
};

// An append-only file of commit records: fixed-size records (magic, version,
// step, time, [epoch,] xxHash3; version 1, older builds: 32 bytes, epoch 0;
// version 2, written now: 40 bytes with the epoch), fdatasync'ed on each
// append. A torn last record (crash mid-write) is dropped on Open.
// (epoch, step) only increases.
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

// Writes completed/<step>/<node> = "<wall ns>[@<epoch>]" (the reporter's
// epoch: the report counts only in that epoch).
[[nodiscard]] Status ReportCompleted(Store& store, const std::string& job, const std::string& node,
                                     int64_t step, Deadline deadline, uint64_t epoch = 0);
// The epoch of a completed/ report's value (0 without one); DataLoss when
// the value is not "<digits>[@<digits>]".
[[nodiscard]] Result<uint64_t> ParseReportEpoch(const std::string& value);
// Writes commit/<step> and raises commit/latest to (epoch, step) if it is
// lower in CommitId order. Returns whether commit/latest moved.
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
// store or on the first node's agent. It commits in the epoch of
// commit/latest: read at Start, then followed (a recovery publishes the
// restored step as a new epoch's first commit; the coordinator goes on in
// that epoch without a restart, dropping the reports of older ones).
//
// Thread model: one Watcher thread on completed/ (feeds the tracker, publishes
// commits), one on commit/latest (epochs), and one cleaner thread that
// deletes the reports of committed steps (1,000 nodes' reports are 1,000
// deletes: on the watcher thread they held up the next step's reports;
// `memento bench store`).
class CommitCoordinator {
 public:
  // Called on the watcher thread after each published commit (its step and
  // epoch), with the steps of that epoch this commit passed over
  // (CommitTracker::TakeSuperseded).
  using OnCommit = std::function<void(const CommitId& id, const std::vector<int64_t>& superseded)>;
  [[nodiscard]] static Result<std::unique_ptr<CommitCoordinator>> Start(
      Store* store, std::string job, std::set<std::string> members, Deadline deadline,
      OnCommit on_commit = nullptr);
  ~CommitCoordinator();
  void SetMembers(std::set<std::string> members) EXCLUDES(mu_);
  int64_t committed() EXCLUDES(mu_);
  uint64_t epoch() EXCLUDES(mu_);
  // Publishes the newest commit again (a store restarted empty: it may have
  // been published on the lost store before any member saw it, and this
  // coordinator does not count that step's reports again). Never lowers
  // commit/latest; nothing to do before the first commit.
  [[nodiscard]] Status RepublishCommitted(Deadline deadline) EXCLUDES(mu_);

 private:
  CommitCoordinator(Store* store, std::string job, std::set<std::string> members,
                    CommitId committed, OnCommit on_commit);
  void OnEvent(const WatchEvent& ev) EXCLUDES(mu_);
  void OnLatest(const WatchEvent& ev) EXCLUDES(mu_);
  // Publishes `step` in `epoch` (the tracker's when it decided).
  void Commit(int64_t step, uint64_t epoch, std::vector<int64_t> superseded) EXCLUDES(mu_);
  // The cleaner deletes reports at or below `id` from now on.
  void CleanThrough(const CommitId& id) EXCLUDES(clean_mu_);
  void Clean() EXCLUDES(clean_mu_);

  Store* const store_;
  const std::string job_;
  const JobKeys keys_;
  const OnCommit on_commit_;
  Mutex mu_;
  CommitTracker tracker_ GUARDED_BY(mu_);
  Mutex clean_mu_;
  CondVar clean_cv_;
  // Delete reports at or below this (their (epoch, step)).
  CommitId clean_through_ GUARDED_BY(clean_mu_);
  bool clean_stop_ GUARDED_BY(clean_mu_) = false;
  std::thread cleaner_;
  std::unique_ptr<Watcher> watcher_;
  std::unique_ptr<Watcher> latest_watcher_;
};

// Every agent runs one: follows commit/latest, appends each new commit to the
// agent's CommitLog, then calls on_commit(id) (outside any lock) so the
// agent flips slots and frees older versions. Commits arrive strictly
// increasing in CommitId order: within an epoch steps increase; the first
// commit of a newer epoch may have a lower step (the job's history restarted
// there).
class CommitFollower {
 public:
  [[nodiscard]] static Result<std::unique_ptr<CommitFollower>> Start(
      Store* store, std::string job, CommitLog* log, std::function<void(const CommitId&)> on_commit,
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
  std::function<void(const CommitId&)> on_commit_;
  // Observe runs on one thread at a time (the initial listing, then the
  // watcher's thread); the lock orders it with last_seen().
  Mutex mu_;
  CommitId last_ GUARDED_BY(mu_);
  std::unique_ptr<Watcher> watcher_;
};

}  // namespace memento::coord
