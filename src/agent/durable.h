// The agent's durable stream (issue 7): every K-th committed version (or one
// every T seconds) goes from the node's shared-memory slots to a directory
// through one tier::Persister, in the background, under a bandwidth cap,
// without ever blocking a trainer.
//
// Node-local slice: version s is committed on this node once every sealed rank
// has reported s complete. The trainers keep writing while s is persisted, and
// with two slots per rank the slot holding s is overwritten when s+2 starts.
// The durable hold (shm/commit_word.h) keeps the trainers off the slot being
// written, for at most `hold_max_s`: a rank whose target slot holds it skips
// that snapshot. Whatever the hold, the write is validated like a seqlock: the slots'
// generations are recorded when the view is built, and just before the node's
// marker (node-N.done) is renamed into place, every slot must still hold that
// generation and every written piece's xxh3 must equal the slot's checksum of
// that chunk. Otherwise the marker is refused, the version stays incomplete
// (invisible to every reader) and a later version is persisted instead.
// Argument: docs/durable_tier.md, "Persisting from live slots".
//
// Thread safety: all public methods may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "memento/types.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "tier/env.h"
#include "tier/persister.h"

namespace memento::agent {

struct ClusterPlan;  // agent/peer_service.h

struct DurableOptions {
  std::string dir;                       // the durable directory; empty: no durable tier
  int64_t every_k_steps = 1;             // persist committed versions with step % K == 0 (0: off)
  double every_seconds = 0;              // also persist one every T seconds (0: off)
  uint64_t bandwidth_bytes_per_sec = 0;  // 0: unlimited
  int keep_last = 3;
  int64_t keep_every = 0;
  bool direct_io = true;
  // Cluster mode, node 0: how long to wait for every node's part of a version.
  double commit_timeout_s = 30;
  // Data-file writes: auto (io_uring where the kernel has it), uring, pwrite.
  tier::IoEngine io_engine = tier::IoEngine::kAuto;
  // The durable hold: the trainers skip a snapshot rather than overwrite the
  // slot being persisted, for at most this long per version (then the write
  // is abandoned as without the hold). 0: no hold.
  double hold_max_s = 30;
  // On stop (SIGTERM, end of job): how long the agent waits for the versions
  // it already gave the persister (the one being written and the one queued)
  // before it cancels them (a cancelled write is left incomplete, never torn).
  double drain_s = 30;
};

struct DurableStats {
  int64_t committed = 0;              // versions every rank of the node reported complete
  int64_t offered = 0;                // offers the persister accepted (queued)
  int64_t gone = 0;                   // the slot was recycled before the write started
  int64_t abandoned_overwritten = 0;  // a slot was rewritten during the write
  int64_t abandoned_mismatch = 0;     // a written piece differs from the slot's checksum
  int64_t abandoned_claimed = 0;      // a rank had claimed the slot before the hold was seen
  int64_t holds = 0;                  // versions written under the durable hold
  int64_t hold_expired = 0;           // a write outlived --durable-hold-max-s
  tier::PersisterStats persister;
};

// Node-local naming of replicated tensors (docs/durable_tier.md, "Names").
// One rank's copy of one replicated tensor in the version being persisted,
// described by its slot: meta and chunk list (offset within the tensor,
// length, xxh3).
struct ReplicatedCopy {
  struct Chunk {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t checksum = 0;
    friend bool operator==(const Chunk& a, const Chunk& b) {
      return a.offset == b.offset && a.length == b.length && a.checksum == b.checksum;
    }
  };
  int rank = 0;
  TensorMeta meta;
  std::vector<Chunk> chunks;
};
struct ReplicatedName {
  std::string name;        // the stored (durable) name
  std::vector<int> ranks;  // every rank whose copy it is, ascending
  bool writer = false;     // this rank writes it (the lowest of `ranks`)
};
// (rank, registered name) -> where that rank's copy is stored. Copies of one
// name are the same state only when meta and chunk lists are equal (the
// ranks of one (pp, tp) position); such a class is written once, by its
// lowest rank. One class on the node keeps the plain name (the common DP
// case, and what restores into another topology by name); several classes
// (ranks of different pipeline stages or TP positions on one node) are each
// stored as "rank<lowest>/<name>", and every rank's entry says which.
std::map<std::pair<int, std::string>, ReplicatedName> DurableNames(
    const std::vector<ReplicatedCopy>& copies);

// An Env that forwards everything to `base`, except that the rename which
// publishes a node marker of version s first asks `check(s)`; an error refuses
// the rename (the marker is never written).
class MarkerGuardEnv final : public tier::Env {
 public:
  using Check = std::function<Status(int64_t step, const std::string& version_dir)>;
  MarkerGuardEnv(tier::Env* base, Check check) : base_(base), check_(std::move(check)) {}

  Result<std::unique_ptr<tier::WritableFile>> NewWritableFile(const std::string& path,
                                                              bool direct) override {
    return base_->NewWritableFile(path, direct);
  }
  Result<std::unique_ptr<tier::RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                      bool direct) override {
    return base_->NewRandomAccessFile(path, direct);
  }
  Result<std::string> ReadFileToString(const std::string& path) override {
    return base_->ReadFileToString(path);
  }
  Status WriteStringToFileSync(const std::string& path, const std::string& data) override {
    return base_->WriteStringToFileSync(path, data);
  }
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  Status CreateDir(const std::string& path) override { return base_->CreateDir(path); }
  Status RemoveDir(const std::string& path) override { return base_->RemoveDir(path); }
  Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  Result<uint64_t> FileSize(const std::string& path) override { return base_->FileSize(path); }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }

 private:
  tier::Env* const base_;
  const Check check_;
};

class DurableStreamer {
 public:
  // Starts the persister. `store` must outlive the streamer.
  [[nodiscard]] static Result<std::unique_ptr<DurableStreamer>> Start(const DurableOptions& options,
                                                                      const std::string& job_id,
                                                                      int node,
                                                                      const std::string& slot_root,
                                                                      shm::NodeStore* store);
  // Cancels an in-flight write (left incomplete) and logs the counters.
  ~DurableStreamer();

  // A rank reported `step` complete. Returns at once. Node-local mode only:
  // in cluster mode the agent calls OnCommitted instead.
  void OnComplete(int rank, int64_t step) EXCLUDES(mu_);

  // ---- cluster mode (docs/durable_tier.md, "Cluster mode") ----
  // The job's plan: from now on a version is written as this node's share of
  // one cluster version (num_nodes = the plan's nodes, this node's id, the
  // epoch below), made of the plan pieces this node is primary for, so that
  // replicated state is written once in the whole cluster. Tensor names:
  // ClusterDurableName (agent/durable_cluster.h).
  void SetClusterPlan(std::shared_ptr<const ClusterPlan> plan) EXCLUDES(mu_);
  // The cluster's durable epoch (/memento/<job>/epoch, bumped by the launcher
  // at every recovery); used for the versions written from now on.
  void SetEpoch(uint64_t epoch) EXCLUDES(mu_);
  // `step` was committed by the cluster (CommitFollower). Offered to the
  // persister when the plan is known; returns at once.
  void OnCommitted(int64_t step) EXCLUDES(mu_);
  // The job's history restarts at `step` (a new commit epoch,
  // coord::CommitId): the steps after it are offered again as they commit.
  // `step` itself was restored (from a complete durable version or from
  // memory) and is not offered.
  void RestartAt(int64_t step) EXCLUDES(mu_);

  DurableStats stats() EXCLUDES(mu_);
  bool WaitIdle(Deadline deadline) { return persister_->WaitIdle(deadline); }
  // Changes the write cap for the next chunks (0 = unlimited).
  void SetBandwidth(uint64_t bytes_per_sec) { persister_->SetBandwidth(bytes_per_sec); }

 private:
  DurableStreamer(const DurableOptions& options, const std::string& job_id, int node,
                  const std::string& slot_root, shm::NodeStore* store);
  // The persister's provider for `step`: maps the ranks' slots that hold it.
  Result<tier::VersionView> BuildView(int64_t step) EXCLUDES(mu_);
  // A read-only mapping of a slot file, kept across versions: every first
  // touch of a page of a new mapping is slow on virtual machines.
  Result<std::shared_ptr<shm::Segment>> MapSlot(int rank, int slot) EXCLUDES(mu_);
  struct HeldSlot;
  // The slot of `rank` that holds `step` complete (shm::FindCompleteSlot over
  // MapSlot's mappings). NotFound (counted gone) when no slot does, DataLoss
  // when it is one the verifier found corrupt.
  Result<HeldSlot> HoldCompleteSlot(int rank, int64_t step) EXCLUDES(mu_);
  // Runs (through the Env) just before the node marker of `step` is published.
  Status CheckBeforeMarker(int64_t step, const std::string& version_dir) EXCLUDES(mu_);

  // The durable hold. The word is <root>/commit.word in cluster mode (the
  // cluster agent creates it before any trainer connects), else
  // <root>/durable.word, created at Start.
  shm::CommitWord* HoldWord() EXCLUDES(mu_);
  // Publishes `step` (-1: none) as held, with a fresh deadline.
  void SetHoldLocked(int64_t step) REQUIRES(mu_);
  // The write of `step` is over (its marker checked, or it failed): the hold
  // passes to the newest version offered since, if any.
  void ReleaseHold(int64_t step, uint64_t seq) EXCLUDES(mu_);

  // The slots one version is read from, kept mapped while it is written.
  struct HeldSlot {
    int rank = 0;
    std::shared_ptr<shm::Segment> segment;
    shm::SlotInfo info;
  };
  struct Hold {
    int64_t step = 0;
    std::vector<HeldSlot> slots;
    // piece key in the data file -> the slot's xxh3 of those bytes
    std::map<std::string, uint64_t> expected;
  };
  // Offers `step` to the persister and, when queued, holds it (durable hold).
  void OfferAndHold(int64_t step) EXCLUDES(mu_);
  // Cluster mode's view (durable_cluster.cc): the plan pieces this node is
  // primary for, cut at slot chunk boundaries; the slots read go to `hold`.
  Result<tier::VersionView> BuildClusterView(int64_t step, std::shared_ptr<const ClusterPlan> plan,
                                             uint64_t epoch, const std::shared_ptr<Hold>& hold)
      EXCLUDES(mu_);
  // Registers `hold` as the slots of `step` and hands the durable hold to the
  // view's pin (released when the persister drops the view).
  tier::VersionView PinView(tier::VersionView view, std::shared_ptr<Hold> hold, int64_t step,
                            uint64_t seq, bool* release_armed) EXCLUDES(mu_);

  const DurableOptions options_;
  const std::string job_id_;
  const int node_;
  const std::string slot_root_;
  shm::NodeStore* const store_;
  MarkerGuardEnv env_;

  Mutex mu_;
  std::map<int64_t, std::set<int>> reported_ GUARDED_BY(mu_);  // step -> ranks done
  int64_t last_committed_ GUARDED_BY(mu_) = -1;
  std::map<int64_t, std::shared_ptr<Hold>> holds_ GUARDED_BY(mu_);  // views being written
  DurableStats stats_ GUARDED_BY(mu_);
  std::map<std::pair<int, int>, std::shared_ptr<shm::Segment>> mapped_ GUARDED_BY(mu_);
  // (rank, slot, generation) whose bytes failed their checksums: not retried.
  std::set<std::tuple<int, int, uint64_t>> corrupt_ GUARDED_BY(mu_);
  // Cluster mode: the plan (null: node-local mode) and the epoch.
  std::shared_ptr<const ClusterPlan> cluster_plan_ GUARDED_BY(mu_);
  uint64_t epoch_ GUARDED_BY(mu_) = 0;

  // Hold words (mapped once; a segment is never unmapped while the streamer lives).
  std::unique_ptr<shm::Segment> durable_word_seg_;
  std::unique_ptr<shm::Segment> commit_word_seg_ GUARDED_BY(mu_);
  shm::CommitWord* commit_word_ GUARDED_BY(mu_) = nullptr;
  int64_t held_step_ GUARDED_BY(mu_) = -1;        // published in the word, -1: none
  int64_t held_since_ns_ GUARDED_BY(mu_) = 0;     // when held_step_ was published
  int64_t inflight_step_ GUARDED_BY(mu_) = -1;    // BuildView done, write not over
  uint64_t inflight_seq_ GUARDED_BY(mu_) = 0;     // which BuildView call
  int64_t pending_step_ GUARDED_BY(mu_) = -1;     // newest offer not yet started
  int64_t last_built_step_ GUARDED_BY(mu_) = -1;  // newest step BuildView started

  std::unique_ptr<tier::Persister> persister_;  // last: stopped first
};

}  // namespace memento::agent
