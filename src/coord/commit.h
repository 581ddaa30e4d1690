// Global commit (docs/coordination.md, "Commit protocol").
//
// A version (step) is committed only when every node of the job reported
// COMPLETED for its pieces and its redundancy of that step (DESIGN.md, save
// path step 5). The pieces:
//
//   CommitTracker      the rule itself: a pure, single-threaded state machine.
//   CommitLog          each agent's local, durable list of commits it has seen.
//   ReportCompleted    an agent's COMPLETED(step, node) report into the store.
//   PublishCommit      writes COMMIT(step); commit/latest only ever grows (CAS).
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
  // Steps that some member reported but that a newer commit passed over
  // (they will never commit), oldest first, since the last call. A step is
  // passed over when a member skipped it or when its reports were lost; the
  // launcher reports these (docs/launch.md, "Commit history").
  std::vector<int64_t> TakeSuperseded();

 private:
  std::optional<int64_t> Evaluate();
  std::set<std::string> members_;
  int64_t committed_;
  std::map<int64_t, std::set<std::string>> reports_;  // steps > committed_
  std::vector<int64_t> superseded_;
};

struct CommitRecord {
  int64_t step = -1;
  int64_t wall_ns = 0;
};

// An append-only file of commit records: fixed 32-byte records (magic,
// version, step, time, xxHash3), fdatasync'ed on each append. A torn last
// record (crash mid-write) is dropped on Open. Steps only increase.
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

  // Appends a record when `step` > latest(); returns false (and writes
  // nothing) for an old or repeated step.
  [[nodiscard]] Result<bool> Append(int64_t step, int64_t wall_ns) EXCLUDES(mu_);
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
// Writes commit/<step> and raises commit/latest to `step` if it is lower.
// Returns whether commit/latest moved.
[[nodiscard]] Result<bool> PublishCommit(Store& store, const std::string& job, int64_t step,
                                         int64_t wall_ns, Deadline deadline);
// commit/latest; NotFound before the first commit.
[[nodiscard]] Result<int64_t> ReadLatestCommit(Store& store, const std::string& job,
                                               Deadline deadline);
// Publishes the newest record of `log` (a restarted store learns the last
// commit from any agent that saw it).
[[nodiscard]] Status RepublishCommits(Store& store, const std::string& job, CommitLog& log,
                                      Deadline deadline);

// Runs the commit rule against the store. Any number may run at once (each
// publish is a monotonic CAS), typically one in the process that hosts the
// store or on the first node's agent.
//
// Thread model: one Watcher thread on completed/ (feeds the tracker, publishes
// commits) and one cleaner thread that deletes the reports of committed steps
// (1,000 nodes' reports are 1,000 deletes: on the watcher thread they held up
// the next step's reports; `memento bench store`).
class CommitCoordinator {
 public:
  // Called on the watcher thread after each published commit, with the steps
  // this commit passed over (CommitTracker::TakeSuperseded).
  using OnCommit = std::function<void(int64_t step, const std::vector<int64_t>& superseded)>;
  [[nodiscard]] static Result<std::unique_ptr<CommitCoordinator>> Start(
      Store* store, std::string job, std::set<std::string> members, Deadline deadline,
      OnCommit on_commit = nullptr);
  ~CommitCoordinator();
  void SetMembers(std::set<std::string> members) EXCLUDES(mu_);
  int64_t committed() EXCLUDES(mu_);

 private:
  CommitCoordinator(Store* store, std::string job, std::set<std::string> members, int64_t committed,
                    OnCommit on_commit);
  void OnEvent(const WatchEvent& ev) EXCLUDES(mu_);
  void Commit(int64_t step, std::vector<int64_t> superseded) EXCLUDES(mu_);
  void Clean() EXCLUDES(clean_mu_);

  Store* const store_;
  const std::string job_;
  const JobKeys keys_;
  const OnCommit on_commit_;
  Mutex mu_;
  CommitTracker tracker_ GUARDED_BY(mu_);
  Mutex clean_mu_;
  CondVar clean_cv_;
  int64_t clean_through_ GUARDED_BY(clean_mu_) = -1;  // delete reports of steps <= this
  bool clean_stop_ GUARDED_BY(clean_mu_) = false;
  std::thread cleaner_;
  std::unique_ptr<Watcher> watcher_;
};

// Every agent runs one: follows commit/latest, appends each new commit to the
// agent's CommitLog, then calls on_commit(step) (outside any lock) so the
// agent flips slots and frees older versions. Steps arrive strictly increasing.
class CommitFollower {
 public:
  [[nodiscard]] static Result<std::unique_ptr<CommitFollower>> Start(
      Store* store, std::string job, CommitLog* log, std::function<void(int64_t)> on_commit,
      Deadline deadline);
  ~CommitFollower() { watcher_.reset(); }
  int64_t last_seen() const { return last_.load(); }

 private:
  CommitFollower() = default;
  void Observe(int64_t step);
  CommitLog* log_ = nullptr;
  std::function<void(int64_t)> on_commit_;
  std::atomic<int64_t> last_{-1};
  std::unique_ptr<Watcher> watcher_;
};

}  // namespace memento::coord
