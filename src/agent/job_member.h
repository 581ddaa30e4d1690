// JobMember: the agent as a member of a multi-node job, what `memento agent
// --store ...` adds to the single-node agent (docs/cluster.md calls it the
// agent's "cluster mode": "Save path of version s", "Agent in cluster mode").
// Its parts: the commit word (agent/commit_hold.h), T1 production of one
// version (agent/t1_producer.h), the peer service (agent/peer_service.h);
// this class joins them to the coordination store.
//
//   - publishes each local rank's inventory (inventory/<rank>, from the
//     rank's seal or its adopted slots), waits for the job's topology and
//     every rank's inventory, computes the plan (topo::MakePlan, the same on
//     every node) and checks it against plan_hash when the launcher set one;
//   - joins the membership (lease; endpoint = the peer service address),
//     follows commits into <root>/commit.log and the commit word
//     (<root>/commit.word, shm/commit_word.h) that the trainers read;
//   - when every local rank has step s complete: produces this node's T1
//     entries of s (parities by the codec and ARC / local copies, from its own
//     T0 slots, no network) and pushes the peer / AOR copies other nodes hold
//     of its pieces; then, with its T0 slots of s verified and every T1 entry
//     of s done (the pushed ones included), SetSignal(COMPLETED, s) and
//     ReportCompleted(s). A trainer that overwrites a slot during this
//     abandons s (hold word + claims + slot generation; nothing torn is kept).
//
// Thread model: one member thread (setup, then T1 production one step at a
// time, hold timeouts); the commit follower's watcher thread (OnCommit); the
// membership heartbeat; the peer service's threads. The agent's connection
// threads call OnSeal / OnComplete / OnTrainerGone / RestoreTarget.
//
// Thread safety: every public method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/aor_holder.h"
#include "agent/commit_hold.h"
#include "agent/durable.h"
#include "agent/peer_service.h"
#include "agent/redundancy.h"
#include "agent/t1_producer.h"
#include "common/mutex.h"
#include "coord/commit.h"
#include "coord/membership.h"
#include "coord/store.h"
#include "memento/status.h"
#include "memento/types.h"
#include "net/job_token.h"
#include "net/rpc.h"
#include "shm/agent_messages.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "topo/plan.h"

namespace memento::agent {

struct JobMemberOptions {
  std::string store_url;   // tcp://host:port (coord::OpenStore)
  std::string token_file;  // the job token (else MEMENTO_JOB_TOKEN)
  // Address of this node's peer service: "host:port" (port 0: ephemeral).
  // The endpoint published in the membership is host:<bound port>.
  std::string listen = "127.0.0.1:0";
  double lease_ttl_s = 3.0;
  // How long the agent keeps the hold on a reported step that has not
  // committed (and waits for the copies its peers push) before it lets the
  // trainers overwrite it. Keeps a node from stalling on a step that another
  // node abandoned.
  double hold_timeout_s = 10.0;
  // How long Start() waits for the store to answer.
  double store_timeout_s = 30.0;
  // The peer service's receive caps (PeerServiceOptions).
  uint64_t peer_max_request_bytes = kDefaultPeerMaxRequestBytes;
  uint64_t peer_max_buffered_bytes = kDefaultPeerMaxBufferedBytes;
  // The peer service's recovery data path variants (PeerServiceOptions).
  bool recover_legacy_reads = false;
  bool recover_staged_receive = false;
  // How long a peer's request for one of this node's T0 pieces, and a
  // local rank's `assemble`, wait for the plan when this agent has none yet
  // (it restarted and is reading the topology and inventories again).
  double plan_wait_s = kDefaultPlanWaitS;
  // T1 entries whose bytes already lie in a local rank's T0 slot (ARC and
  // local_full copies) reference that slot instead of copying the bytes
  // (docs/reft.md section 4). `memento agent` takes it from MEMENTO_T1_RESIDENT
  // (on, the default, or off: copy them as before, for comparisons).
  bool t1_resident = true;
  // A replacement agent (docs/recovery.md, "Pre-allocated slots"): before it
  // joins the membership, every local rank of the job's topology that has no
  // slot on this node and whose inventory the store holds gets slot 0 at the
  // size a rebuild writes (whole tensors), its pages faulted in then, so
  // that the recovery that follows the join writes into memory the kernel
  // has already zeroed. `memento agent --preallocate-slots on|off`.
  bool preallocate_slots = true;
};

// The codecs of the records this file reads and writes live next to their
// types: coord::NodeName (membership names), topo::ParseJobTopology
// (/memento/<job>/topology), memento::TensorListToJson / ParseTensorList
// (/memento/<job>/inventory/<rank>).

// Counters of the save path (tests, logs).
struct JobMemberStats {
  int64_t produced = 0;   // versions whose T1 this node produced and reported
  int64_t abandoned = 0;  // versions given up (slot rewritten, claim, timeout)
  int64_t pushed_bytes = 0;
  int64_t committed = -1;
  // Seconds from the local ranks' completion of a step to its COMPLETED
  // report (T1 produced, copies pushed), summed over produced versions.
  double produce_s = 0;
  // Commit lag: seconds from this node's COMPLETED report of a step to the
  // commit of that step (the slowest node's report closes it).
  int64_t commit_lags = 0;  // commits of steps this node had reported
  double commit_lag_s = 0;  // summed
  double last_commit_lag_s = 0;
  // PreallocateSlots at Start: slots made, their bytes, wall seconds.
  int preallocated_slots = 0;
  uint64_t preallocated_bytes = 0;
  double preallocate_s = 0;
  double preallocate_cpu_s = 0;
  // CPU-seconds of the threads that did it (CLOCK_THREAD_CPUTIME_ID):
  // T1 production and reporting of each version (member thread, Produce),
  // following commits (the commit follower's callback).
  double produce_cpu_s = 0;
  double commit_cpu_s = 0;
  // Parts of produce_cpu_s: hashing the local ranks' T0 slots before the
  // redundancy is made of them, and the COMPLETED report (two store calls).
  double t0_verify_cpu_s = 0;
  double report_cpu_s = 0;
  // The whole agent process's CPU-seconds (every thread) from this node's
  // first COMPLETED report to its newest, and the versions reported in
  // between (produced - 1): the steady cost per version, without the start,
  // the slots' allocation and the plan's setup.
  double steady_process_cpu_s = 0;
  int64_t steady_versions = 0;
  // The per-thread account (common/thread_cpu.h) at the first COMPLETED
  // report: a report at stop minus this is the steady part by thread.
  std::map<std::string, double> thread_cpu_at_first_report;
  int64_t last_reported = -1;     // newest step reported COMPLETED
  int64_t restore_target = -1;    // RestoreTarget()
  uint64_t redundancy_bytes = 0;  // the redundancy store's version files (T1 held here)
  PeerServiceStats peer;          // recoveries this node served
};

class JobMember {
 public:
  // Opens the store, the commit log and commit word, the redundancy store,
  // starts the peer service, joins the membership and the commit follower,
  // and starts the member thread (which waits for the topology and the
  // inventories in the background: Start() does not).
  // With `durable` (the agent's durable stream, which must outlive the
  // JobMember) the member drives it (docs/durable_tier.md, "Cluster mode"):
  // the plan once known, the epoch (/memento/<job>/epoch, watched) and every
  // commit (DurableStreamer::OnCommitted).
  [[nodiscard]] static Result<std::unique_ptr<JobMember>> Start(const JobMemberOptions& options,
                                                                const std::string& job, int node,
                                                                const std::string& root,
                                                                shm::NodeStore* store,
                                                                DurableStreamer* durable = nullptr);
  ~JobMember();
  JobMember(const JobMember&) = delete;
  JobMember& operator=(const JobMember&) = delete;

  // A trainer sealed `rank` with these tensors (the slot manifest's JSON).
  void OnSeal(int rank, const std::string& manifest) EXCLUDES(mu_);
  // Rank `rank` wrote step `step` into `slot` and marked it complete.
  void OnComplete(int rank, int slot, int64_t step) EXCLUDES(mu_);
  // Rank `rank` skipped its snapshot of `step` (its slot was held): this node
  // will never have `step`, so no node keeps protecting it. Published at
  // /memento/<job>/skipped/<step>/<node>[@<epoch>] (deleted once a newer
  // step commits).
  void OnSkipped(int rank, int64_t step) EXCLUDES(mu_);
  // The trainer of `rank` disconnected (exited or died): UNHEALTHY.
  void OnTrainerGone(int rank) EXCLUDES(mu_);
  // The step trainers restore: the launcher's restore target, else the
  // newest step of the commit log; -1 when none.
  int64_t RestoreTarget() EXCLUDES(mu_);
  // The `plan` op (agent.sock; docs/reft.md section 1): the byte ranges
  // `rank`'s T0 slot holds under the plan (topo::RankSaveRanges), or
  // sharded=false (whole tensors) when the topology does not ask for sharded
  // snapshots or the plan gives the rank every byte of its state.
  // Unavailable ("not ready") until the plan is known; InvalidArgument for a
  // rank outside the plan. `client_parity`: the client computes the
  // parities its rank produces (docs/reft.md section 4): they are listed
  // (shm::PlanParity) and their stripe inputs left out of the ranges.
  // `step` (>= 0: the snapshot the client lays out with the answer): an
  // answer with parities tells the redundancy store that the rank's slots
  // hold them from that step on, so its versions reference them in T0
  // (RedundancyStore::SetClientParity); any other answer forgets it.
  Result<shm::PlanReply> SaveRanges(int rank, bool client_parity = false, int64_t step = -1)
      EXCLUDES(plan_mu_);
  // The `aor_register` op (docs/reft.md section 5): the AOR replicas `rank`
  // feeds under the plan (its kAor copies: the owners' optimizer shards as
  // ranges of the flat buffer). A dp_shard piece AOR cannot recompute (its
  // tensors are not `num_state` whole fp32 shards of one range) gets none
  // and keeps its network copy (logged). Unavailable ("not ready") until the
  // plan is known.
  Result<std::vector<AorRange>> AorRanges(int rank, int num_state) EXCLUDES(plan_mu_);
  // The agent's AOR holder (owned by the agent; outlives this member).
  void SetAorHolder(AorHolder* holder) {
    aor_ = holder;
    aor_budget_.store(holder);
  }
  // Whether `more` bytes for `why` fit the node's --budget, which covers
  // the slots, the redundancy held and the AOR files and replicas
  // (AorHolder::bytes_in_use); OK when there is no budget.
  Status CheckNodeRoom(uint64_t more, const std::string& why);
  // The `aor_checksum` op: local rank `rank`'s own ShardChecksum after
  // `step`, published at aor/sum/<rank> (the recent steps) for the nodes
  // that hold replicas of its shard.
  // Also called by the AOR holder's watchers (AorHolder::OnChecksum) with
  // the checksums the ranks left in their staging files.
  Status OnShardChecksum(int rank, int64_t step, uint64_t checksum) EXCLUDES(aor_mu_, aor_sum_mu_);
  // AorHolder::SeedSource: the owner's shard at `step` from the network copy
  // its node pushed (this node's T1 entry of the kAor copy) and its
  // published checksum; Unavailable while either is missing. A replica that
  // needs a seed is no longer current: the owner's node pushes again.
  Result<AorHolder::SeedBytes> AorSeed(const AorRange& range, int64_t step) EXCLUDES(aor_mu_);
  // AorHolder::OnAdvanced: once the replica of a copy has been confirmed
  // against its owner's checksum, each step it computes becomes this node's
  // T1 entry of the copy (no network).
  void OnAorAdvanced(const AorRange& range, int64_t step, const opt::AorReplica& replica)
      EXCLUDES(aor_mu_);
  struct AorStats {
    int64_t entries_from_replica = 0;  // T1 entries written from a replica
    int64_t confirmed = 0;             // replica steps checked against the owner's checksum
    int64_t refused = 0;               // replica steps that differed (replica seeded again)
    int64_t skipped_pushes = 0;        // kAor pushes not made (the holder recomputes)
    uint64_t skipped_push_bytes = 0;
    // Steps abandoned because a kAor copy this node holds was neither
    // pushed nor made from the replica by the hold timeout.
    int64_t missing = 0;
    // Entries not made from a replica because its bytes no longer hashed to
    // its step's state hash when copied (changed in memory since the step;
    // opt::AorReplica::CopyStateTo): the replica is refused and seeded again.
    int64_t copy_refused = 0;
  };
  AorStats aor_stats() EXCLUDES(aor_mu_);

  // kPeerSetRestoreTarget: the job restores `step`; kept until a newer
  // step commits. The job goes back to `step`, so what this node knew of
  // later steps belongs to the failed attempt and is forgotten: its
  // completions, its skips (also this node's skip records in the store), the
  // hold and the report of a later step, its T1 versions of later steps.
  // With `epoch` above the node's (the recovery's new commit epoch,
  // coord::CommitId) the job's history restarts at `step`: it is this
  // node's newest commit from now on (the commit word, the durable stream),
  // and the steps after it are reported in `epoch`, so that they commit
  // again even where the abandoned history had committed them (a durable
  // fallback to an older version).
  void SetRestoreTarget(int64_t step, uint64_t epoch = 0) EXCLUDES(mu_);

  // The agent's `assemble` op (agent/assemble.h): rank's whole state at
  // `step`, staged from its plan pieces. FailedPrecondition "no plan yet"
  // before the plan is known; AssembleRank's errors otherwise.
  Result<shm::AssembleReply> Assemble(int rank, int64_t step) EXCLUDES(plan_mu_);

  std::string endpoint() const { return endpoint_; }
  JobMemberStats stats() EXCLUDES(mu_);
  // Whether this node knows that some node skipped the uncommitted `step`
  // (so it cannot commit).
  bool Dead(int64_t step) EXCLUDES(mu_);

 private:
  // The deadline of one call to the coordination store.
  static constexpr double kStoreCallS = 10.0;

  JobMember() = default;
  static int64_t SteadyNowNs();
  void Run();
  // The membership re-registered with a store that lost this node's lease
  // (restarted empty): republishes what the store lost that this node knows
  // (commit record, inventories, skip records, the pending report). Runs on
  // the heartbeat thread; an error makes the membership retry it.
  Status OnReregister() EXCLUDES(mu_);
  void PublishInventories() EXCLUDES(mu_);
  void TrySetup() EXCLUDES(mu_);
  void OnCommit(const coord::CommitId& id) EXCLUDES(mu_);
  // The job's history restarts at `step` in `epoch` (SetRestoreTarget, or
  // the first commit of an epoch this node was not told about). False when
  // the node is already in `epoch` or a newer one.
  bool StartEpoch(int64_t step, uint64_t epoch);
  // T1 of `step` (T1Producer), then COMPLETED; false (and the hold
  // released) when the step is abandoned.
  bool Produce(int64_t step);
  Result<std::string> NodeEndpoint(int node);
  // The peer service (RPC server: inventory, read, push, recover, restore
  // target): started before the membership join (its address is the node's
  // endpoint), told the plan once it is known, stopped first.
  Status StartPeerService();
  // preallocate_slots (Start, before the membership join); logs what it did.
  void PreallocateSlots();
  void SetPeerPlan();
  void StopPeerService();
  void Abandon(int64_t step, const std::string& why) EXCLUDES(mu_);
  // Records (and publishes at skipped/<step>/<node>, with `why` as the
  // value) that this node will never report `step`: every node releases its
  // hold on it. The launcher reads `why` (a redundancy that could not be
  // written leaves the step unprotected).
  void PublishDead(int64_t step, const std::string& why = "") EXCLUDES(mu_);
  // This node's skip record of `step` in its current epoch.
  std::string SkippedKey(int64_t step) const;

  JobMemberOptions options_;
  std::string job_;
  int node_ = 0;
  std::string node_name_;
  std::string root_;
  std::string endpoint_;
  shm::NodeStore* node_store_ = nullptr;  // owned by the Agent, outlives this
  std::unique_ptr<coord::Store> store_;
  std::unique_ptr<net::JobToken> token_;
  std::unique_ptr<coord::CommitLog> log_;
  std::unique_ptr<CommitHold> hold_;  // <root>/commit.word
  std::unique_ptr<RedundancyStore> red_;
  std::unique_ptr<PeerService> peer_;
  std::unique_ptr<coord::Membership> membership_;
  std::unique_ptr<coord::CommitFollower> follower_;
  std::unique_ptr<coord::Watcher> skip_watcher_;   // skipped/: steps that cannot commit
  DurableStreamer* durable_ = nullptr;             // the agent's; null without --durable-dir
  std::unique_ptr<coord::Watcher> epoch_watcher_;  // epoch -> durable_
  std::atomic<int64_t> committed_{-1};
  // The commit epoch of this node's reports (the newest it was told or saw).
  std::atomic<uint64_t> epoch_{0};
  // The epoch of the newest commit OnCommit saw (commit follower thread).
  uint64_t commit_epoch_ = 0;
  std::atomic<int64_t> last_reported_{-1};  // the newest step reported COMPLETED
  // When last_reported_ was reported (commit lag); written before it.
  std::atomic<int64_t> last_reported_ns_{0};

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::map<int, std::string> manifests_ GUARDED_BY(mu_);  // rank -> tensor list JSON
  std::set<int> published_ GUARDED_BY(mu_);
  std::map<int64_t, std::set<int>> completes_ GUARDED_BY(mu_);  // step -> local ranks
  std::set<int64_t> dead_ GUARDED_BY(mu_);  // uncommitted steps some node skipped
  int64_t restore_target_ GUARDED_BY(mu_) = -1;
  int64_t rollback_ GUARDED_BY(mu_) = -1;          // SetRestoreTarget's step (kept; -1: none)
  bool rollback_pending_ GUARDED_BY(mu_) = false;  // the member thread has not applied it yet
  // The store revision SetRestoreTarget listed the skip records at: a skip
  // record of a step after rollback_ written at or before it belongs to the
  // failed attempt, however late its watch event arrives (0: none; reset
  // when the store is replaced, whose revisions start again).
  int64_t rollback_revision_ GUARDED_BY(mu_) = 0;
  // The newest epoch SetRestoreTarget was given (0: none): skip records of
  // it or a newer one belong to the new history, whatever their revision.
  uint64_t rollback_epoch_ GUARDED_BY(mu_) = 0;
  bool unhealthy_ GUARDED_BY(mu_) = false;
  JobMemberStats stats_ GUARDED_BY(mu_);
  double first_report_process_cpu_s_ GUARDED_BY(mu_) = 0;  // ProcessCpuSeconds() then
  int64_t lag_counted_ GUARDED_BY(mu_) = -1;  // the newest step whose commit lag was counted
  // Set once by the member thread (then read-only): the plan and topology.
  std::atomic<bool> ready_{false};
  topo::Plan plan_;
  std::vector<int> local_ranks_;
  topo::Inventory inventory_;
  // What the peer service acts on (null until the plan is known).
  Mutex plan_mu_;
  std::shared_ptr<const ClusterPlan> cluster_plan_ GUARDED_BY(plan_mu_);
  bool sharded_ GUARDED_BY(plan_mu_) = false;  // the topology's "sharded"

  // Member thread only.
  int64_t last_attempt_ = -1;
  int64_t reported_ = -1;
  TimePoint reported_at_{};
  std::unique_ptr<T1Producer> producer_;  // made once the plan is known

  // AOR (docs/reft.md section 5).
  // Checks this node's replicas of `step` against their owners' checksums
  // (after its T1 entries are complete, before COMPLETED). An error: an
  // entry made from a replica that does not match (the step is abandoned).
  Status CheckAorCopies(int64_t step) EXCLUDES(aor_mu_);
  Result<uint64_t> OwnerSum(int owner, int64_t step);
  // Whether the owner's node may skip pushing kAor copy `copy` of `step`.
  bool AorHeld(uint32_t copy, int64_t step);
  // This node keeps no replica current (a fresh agent, a restore): the
  // owners' nodes push every kAor copy it holds until a replica is
  // confirmed again.
  void ForgetAorHeld() EXCLUDES(aor_mu_);
  // The replicas whose bytes changed in memory after a step of `step` or
  // before (their entry not made, aor_copy_bad_): refused (seeded again,
  // the owner's node pushes again); DataLoss when `step` then lacks the
  // copy. Whether there is one, for the wait for the step's entries.
  [[nodiscard]] Status RefuseChangedAorReplicas(int64_t step) EXCLUDES(aor_mu_);
  bool AorReplicaChanged(int64_t step) EXCLUDES(aor_mu_);
  // The copies this node holds of `step` (pushed or made from a replica)
  // that are not finished, named for the abandon message; counts a step
  // missing a kAor copy in AorStats::missing.
  std::string MissingCopies(int64_t step) EXCLUDES(aor_mu_);
  AorHolder* aor_ = nullptr;
  std::atomic<AorHolder*> aor_budget_{nullptr};  // aor_, for the budget check's threads
  Mutex aor_mu_;
  Mutex aor_sum_mu_;  // serialises OnShardChecksum's publications (taken before aor_mu_)
  std::map<int, std::map<int64_t, uint64_t>> own_sums_ GUARDED_BY(aor_mu_);  // local ranks
  std::map<uint32_t, int64_t> aor_confirmed_ GUARDED_BY(aor_mu_);  // copy -> step first confirmed
  // copy -> the newest step its replica advanced to (OnAorAdvanced), made
  // into an entry or not: the first step the owner's node may skip is past it.
  std::map<uint32_t, int64_t> aor_advanced_ GUARDED_BY(aor_mu_);
  std::map<uint32_t, std::set<int64_t>> aor_entries_ GUARDED_BY(aor_mu_);  // made from the replica
  // copy -> the first step whose entry the replica's bytes failed to make
  // (CopyStateTo) and why: no entry is made from that replica until
  // CheckAorCopies refuses it.
  std::map<uint32_t, std::pair<int64_t, std::string>> aor_copy_bad_ GUARDED_BY(aor_mu_);
  AorStats aor_stats_ GUARDED_BY(aor_mu_);
  std::thread thread_;
};

}  // namespace memento::agent
