// Recovery run by the agents themselves (docs/recovery.md, "Recovery run by
// the agents"; issue 18): every `memento agent --recovery-leader
// request|auto` stands for election; the one that holds
// /memento/<job>/recovery_leader (a CompareAndSwap on an absent key, attached
// to its store lease) is the leader and runs the same RecoverJob as
// `memento launch` (inventory -> decide -> rebuild -> restore target). The
// trainers learn the restore target from their own agent (kPeerSetRestoreTarget,
// op 'target'), whoever started them.
//
//   /memento/<job>/recovery_leader   node name of the leader; gone with its lease
//   /memento/<job>/recovery_request  decimal counter: recovery n is asked by
//                                    raising it to n (`memento recover --trigger`,
//                                    or the leader itself after a node loss in auto mode)
//   /memento/<job>/recovery_status   JSON of the newest recovery (RecoveryStatus)
//   /memento/<job>/recovery_epoch_floor  decimal: the newest commit epoch whoever
//                                    filed a request had seen (`memento launch`
//                                    keeps it across a store restarted empty);
//                                    the leader's new epoch is above it
//
// A recovery n is done when recovery_status holds id n in a final state. A
// leader that dies (or whose node is the lost one) mid-recovery leaves the
// status at id n "waiting" or "running"; its lease expires, another agent
// wins the key, finds request n unfinished and runs it again ("takeover":
// true). RecoverJob may run twice for one request: rebuilding is idempotent
// (a slot that holds the step intact is never rewritten).
//
// auto mode: the leader watches the membership; a node whose key vanished
// (its lease expired: the node or its agent is gone) makes it file a request
// at once, which waits (state "waiting") until every node's agent is back,
// e.g. a replacement host on an empty root, then recovers.
//
// Thread safety: Start/~RecoveryLeader from one thread; status() from any.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "coord/commit.h"
#include "coord/store.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "net/job_token.h"

namespace memento::launch {

enum class RecoveryLeaderMode { kOff, kRequest, kAuto };
// "off", "request", "auto"; InvalidArgument naming the value otherwise.
[[nodiscard]] Result<RecoveryLeaderMode> ParseRecoveryLeaderMode(const std::string& s);

struct RecoveryLeaderOptions {
  std::string job;
  int node = 0;
  std::string store_url;
  std::string token_file;  // the job token (else MEMENTO_JOB_TOKEN)
  RecoveryLeaderMode mode = RecoveryLeaderMode::kRequest;
  double lease_ttl_s = 3.0;
  // Longest wait for every node's agent, then for RecoverJob.
  double recovery_timeout_s = 300.0;
  // Durable fallback when memory cannot rebuild any committed version: the
  // newest complete version here that verifies (empty: none).
  std::string durable_dir;
  // Durable fallback: a node whose agent is missing while a version loads
  // (a killed agent's entry had not expired when the recovery began; its
  // replacement starts late) is waited for, up to this long (s), before the
  // recovery fails naming it. No older version is tried instead: every
  // version needs every node's agent (LoadDurableOnEveryNode).
  double agent_wait_s = 60.0;
  // The leader also runs the job's commit coordinator (coord::CommitCoordinator
  // over nodes 0 .. N-1 of the published topology) for as long as it leads;
  // a successor starts its own. For jobs without `memento store --job
  // --nodes` or `memento launch` to coordinate the commits.
  bool coordinate_commits = false;
};

// The store keys (coord::JobKeys' job prefix).
std::string RecoveryLeaderKey(const std::string& job);
std::string RecoveryRequestKey(const std::string& job);
std::string RecoveryStatusKey(const std::string& job);
std::string RecoveryEpochFloorKey(const std::string& job);

// recovery_status. state: "waiting" (for every node's agent), "running",
// "done" (restore_step set: the target every agent now serves), "failed"
// (message says why). Final: done, failed.
struct RecoveryStatus {
  int64_t id = 0;
  std::string state;
  std::string leader;     // node name of the leader that wrote it
  std::string trigger;    // "request" or "node<N> lost"
  bool takeover = false;  // a previous leader left this id unfinished
  int64_t restore_step = -1;
  uint64_t epoch = 0;  // done: the commit epoch the job continues in (0: none)
  std::string source;  // "memory", "durable", "none"
  std::string message;
  nlohmann::json recovery;  // JobRecovery::ToJson / DurableLoad::ToJson (done)
  // Durable fallback: newer complete versions passed over, each "step N
  // <why>" (fails verification: ..., loading it failed: ...), as the
  // launcher's RecoveryReport::durable_skipped.
  std::vector<std::string> durable_skipped;
  bool final() const { return state == "done" || state == "failed"; }
  nlohmann::json ToJson() const;
  static Result<RecoveryStatus> FromJson(const std::string& text);
};

// What `memento recover` shows: leader, newest request, status (NotFound
// parts are left empty / 0).
struct RecoveryView {
  std::string leader;  // empty: none elected
  int64_t requested = 0;
  bool has_status = false;
  RecoveryStatus status;
};
[[nodiscard]] Result<RecoveryView> ReadRecoveryView(coord::Store& store, const std::string& job,
                                                    Deadline deadline);
// Returns once no recovery of `job` is pending or running: no leader is
// elected (nobody would run one), or the newest request has a final status.
// Unavailable naming the recovery and its state when the deadline passes
// first. What an agent's `target` op waits for (AgentOptions::await_recovery).
[[nodiscard]] Status AwaitRecoveryIdle(coord::Store& store, const std::string& job,
                                       Deadline deadline);
// Raises recovery_request by one; returns the new request id. With
// epoch_floor > 0 it first raises recovery_epoch_floor to it (never lowers
// it): the epoch the leader chooses for this recovery (and any later one) is
// above every epoch the caller saw, even when the store restarted empty and
// lost /memento/<job>/epoch (docs/coordination.md, "Epochs").
[[nodiscard]] Result<int64_t> RequestRecovery(coord::Store& store, const std::string& job,
                                              Deadline deadline, uint64_t epoch_floor = 0);
// recovery_epoch_floor (0 when absent); InvalidArgument naming the key when
// it is not a number.
[[nodiscard]] Result<uint64_t> ReadRecoveryEpochFloor(coord::Store& store, const std::string& job,
                                                      Deadline deadline);

class RecoveryLeader {
 public:
  // Opens its own store connection and starts the campaign thread. Null
  // (OK) for mode kOff.
  [[nodiscard]] static Result<std::unique_ptr<RecoveryLeader>> Start(
      const RecoveryLeaderOptions& options);
  ~RecoveryLeader();  // stops; revokes the lease (a leader steps down at once)
  RecoveryLeader(const RecoveryLeader&) = delete;
  RecoveryLeader& operator=(const RecoveryLeader&) = delete;

  bool leading() const { return leading_.load(); }
  // coordinate_commits: whether this agent's commit coordinator runs now.
  bool coordinating() EXCLUDES(coord_mu_);

 private:
  RecoveryLeader() = default;
  void Run();
  void KeepAliveLoop();
  // False when stopping (at once, or after `d`).
  bool SleepFor(std::chrono::milliseconds d) EXCLUDES(mu_);
  // One step of the campaign: keeps the lease, tries to win the key.
  void Campaign();
  // Leader: files a request for nodes lost since the last look (auto).
  void WatchMembership();
  // Leader: runs request `id` (RecoverJob, durable fallback); publishes status.
  void RunRecovery(int64_t id, const RecoveryStatus* previous);
  bool StillLeader();
  void Publish(const RecoveryStatus& st);
  bool Stopping();
  // coordinate_commits: starts the coordinator when leading and none runs
  // (the topology names the members), stops it when no longer leading.
  void CoordinateCommits() EXCLUDES(coord_mu_);

  RecoveryLeaderOptions options_;
  std::string name_;
  std::unique_ptr<coord::Store> store_;
  std::unique_ptr<net::JobToken> token_;
  std::atomic<coord::LeaseId> lease_{0};  // 0: none (granted by Campaign)
  std::atomic<bool> leading_{false};
  std::set<std::string> members_;  // leader: node names present at the last look
  bool members_known_ = false;
  std::string pending_trigger_;  // leader: why it filed the newest request

  Mutex coord_mu_;
  std::unique_ptr<coord::CommitCoordinator> coordinator_ GUARDED_BY(coord_mu_);
  // The newest commit this agent's coordinators published: republished when
  // it leads again (a store restarted empty may have lost it before any
  // agent saw it; PublishCommit never lowers commit/latest).
  coord::CommitId coordinated_ GUARDED_BY(coord_mu_);

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread keepalive_;
};

}  // namespace memento::launch
