// AOR in the agent (REFT 4.2, Eq. 4; docs/reft.md section 5): the host
// replicas of peers' ZeRO-1 optimizer shards that this node's ranks feed.
//
// A rank that feeds replicas (the plan's kAor copies whose producer_rank it
// is) registers its flat gradient buffer once (`aor_register`: the
// optimizer's Encode() bytes and the buffer's length); the agent answers
// with the ranges and a staging file, <root>/aor_stage.<rank>, that the
// client maps. Each step, after the all-reduce and clipping and before its
// optimizer step t, the client copies the ranges' gradient slices and
// pre-update parameter slices into the staging file's slot of t (double
// buffered) and rings the file's doorbell (shm/aor_stage.h): no request, so
// the trainer never waits for the agent. The file's watcher thread (one per
// staging file, woken by the doorbell) queues each new ready slot once (by
// its sequence number; an older client's `aor_capture` goes through Submit
// to the same queue) and publishes the rank's own shard checksums from the
// file's ring (OnChecksum: the cluster writes them to the store). The AOR
// thread then (Capture), off the training path, takes
// the slot (refused when torn, overwritten early or not hashing right:
// counted in Stats::stage_refused) and, for each range:
//
//   - when its replica holds step t-1: Prepare(t) from the staged slices
//     (one pass: their hashes, the host step into the replica's spare area,
//     the result's checksums), then the local check ConfirmParams(t-1)
//     against the staged parameters' hash (they are the owner's updated
//     slice of t-1, which the all-gather brought) and Commit(t);
//   - otherwise (new, restored to another step, diverged): seeds it from the
//     owner's shard at t-1 (SeedSource: in the cluster the network copy the
//     owner's node pushed, with the owner's checksum), then Advance(t);
//   - the replica's state lives in <root>/aor.<owner> (below), mapped and
//     updated in place, so it outlives the trainer (and the agent: a new
//     agent adopts the file).
//
// Nothing crosses the network for a replica that stays current.
//
// Staging file layout: shm/aor_stage.h.
// Replica file layout: below (AorFileBytes): two headers, two state areas,
// updated in place. A file with no intact, complete step is refused (never
// adopted) and the replica is seeded again.
//
// Thread safety: every public method is thread-safe (mu_ guards the
// replicas, q_mu_ the AOR thread's queue and the watchers; q_mu_ is never
// held while taking mu_; sum_mu_ serialises the checksum publications and
// is never held while taking q_mu_ or mu_).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "opt/aor.h"
#include "opt/optimizer.h"
#include "shm/agent_messages.h"
#include "shm/aor_stage.h"
#include "shm/segment.h"

namespace memento::agent {

inline constexpr char kAorFileMagic[8] = {'M', 'E', 'M', 'A', 'O', 'R', 'R', '2'};

// One of the replica file's two headers: header k describes state area k.
struct AorFileHeader {
  char magic[8];
  uint32_t version;  // 2
  uint32_t num_state;
  int32_t owner;
  int32_t holder;
  uint64_t offset;
  uint64_t count;
  uint64_t optimizer_hash;  // xxHash3 of the optimizer's Encode() bytes
  int64_t step;
  int64_t seed_step;
  uint64_t seed_checksum;
  uint64_t checksum;
  uint64_t state_hash;
  uint64_t params_hash;
  uint32_t diverged;
  uint32_t writing;  // 1: its area is being overwritten (a step in progress): never adopted
  uint32_t area;     // the area it describes (0 or 1)
  uint32_t reserved;
  uint64_t pad;
  uint64_t header_checksum;  // xxHash3 of the 120 bytes before it
};
static_assert(sizeof(AorFileHeader) == 128);

// One replica's identity.
struct AorRange {
  int owner = -1;     // the rank whose shard it is
  int holder = -1;    // the local rank that feeds it
  uint32_t copy = 0;  // the plan's kAor Copy id
  uint64_t offset = 0;
  uint64_t count = 0;
};

// <root>/aor.<owner>, updated in place (mapped): two headers (128 bytes
// each), then two state areas of num_state * count floats (the replica's
// double buffer, opt::AorReplica::Areas). A step is computed into the area
// the replica does not hold: its header is first marked `writing`, the area
// is written, and the header is then rewritten with the new step. The other
// area and its header hold the previous step, intact, all along; so an
// agent that dies mid-step leaves a file whose newest step is the previous
// one, never a half-written one (agent_aor_test
// AHalfWrittenStepIsNeverAdoptedThePreviousOneIs).
inline constexpr uint64_t kAorFileHeaders = 2 * sizeof(AorFileHeader);
inline uint64_t AorFileBytes(uint64_t count, int num_state) {
  return kAorFileHeaders + 2 * uint64_t(num_state) * count * sizeof(float);
}
// Creates (replacing any old one) and maps the file for `range`; both
// headers invalid until a step is published.
[[nodiscard]] Result<std::shared_ptr<shm::Segment>> CreateAorFile(const std::string& path,
                                                                  const AorRange& range,
                                                                  int num_state);
// The replica's areas in the mapped file (current: the one it holds).
opt::AorReplica::Areas AorFileAreas(const std::shared_ptr<shm::Segment>& file, uint64_t count,
                                    int num_state, int current);
// Marks area `area`'s header being written (before the area is touched).
void MarkAorAreaWriting(shm::Segment& file, int area);
// Writes the header of the replica's current area (after its step is
// complete).
void PublishAorArea(shm::Segment& file, const AorRange& range, uint64_t optimizer_hash,
                    const opt::AorReplica& replica);

// Adopts a replica file: the newest step whose header checks, is not being
// written and whose area hashes to it. InvalidArgument / DataLoss naming
// what is wrong with each header otherwise (size, magic, version, header
// checksum: "torn header"; "being written"; another owner, range or
// optimizer; state that does not hash to the header's).
struct AdoptedAor {
  std::shared_ptr<shm::Segment> file;
  std::unique_ptr<opt::AorReplica> replica;
};
[[nodiscard]] Result<AdoptedAor> ReadAorFile(const std::string& path, const AorRange& range,
                                             std::shared_ptr<const opt::Optimizer> optimizer,
                                             uint64_t optimizer_hash);

class AorHolder {
 public:
  // The owner's shard at `step`: its state slices back to back
  // (num_state * count floats) and the owner's ShardChecksum of that step.
  struct SeedBytes {
    std::vector<float> state;
    uint64_t owner_checksum = 0;
  };
  // NotFound / Unavailable: not (yet) available; the replica stays unseeded
  // and the next capture tries again.
  using SeedSource = std::function<Result<SeedBytes>(const AorRange& range, int64_t step)>;
  // Called after each replica reached `step` by a capture (holder's lock
  // held: keep it short): the cluster writes the T1 entry from it.
  using OnAdvanced =
      std::function<void(const AorRange& range, int64_t step, const opt::AorReplica& replica)>;
  // Whether `more` bytes for `why` fit the node's budget (--budget; the
  // cluster's JobMember::CheckNodeRoom): ResourceExhausted saying what is
  // in use when not.
  using RoomCheck = std::function<Status(uint64_t more, const std::string& why)>;
  // A local rank's own ShardChecksum of `step`, read from its staging
  // file's ring (in step order; a rollback's recomputed step again): the
  // cluster publishes it (JobMember::OnShardChecksum). Called with no lock
  // of the holder held but sum_mu_, so calls never overlap.
  using OnChecksum = std::function<Status(int rank, int64_t step, uint64_t checksum)>;

  AorHolder(std::string root, SeedSource seed, OnAdvanced on_advanced = nullptr,
            OnChecksum on_checksum = nullptr);
  ~AorHolder();

  // Before the first Register: the budget check (none: no limit).
  void SetRoomCheck(RoomCheck check) EXCLUDES(mu_);
  // aor_register of `rank`: `ranges` (this rank's, from the plan; may be
  // empty) are checked against `numel`; the optimizer is decoded. Creates
  // the staging file. InvalidArgument naming what is wrong. When the room
  // check refuses the bytes the registration needs (RegistrationBytes), the
  // rank is registered with no ranges (logged, counted in budget_refused):
  // its replicas are not kept and their copies stay network copies.
  // What a registration of `ranges` holds on the node: the staging file,
  // and per replica its file (two headers and two state areas; the state
  // lives there, mapped, not in the agent's heap).
  static uint64_t RegistrationBytes(const std::vector<AorRange>& ranges, int num_state);
  // The bytes the registrations hold now (what the budget counts for AOR).
  uint64_t bytes_in_use() EXCLUDES(mu_);
  [[nodiscard]] Result<shm::AorRegisterReply> Register(int rank, std::string_view encoding,
                                                       uint64_t numel, std::vector<AorRange> ranges)
      EXCLUDES(mu_);
  // aor_capture of `rank` at step `step` (lr NaN: the optimizer's own
  // schedule), the agent's answer: checks that the rank registered and that
  // the slot of `step` is ready with that step (FailedPrecondition naming
  // what it holds otherwise, counted in stage_refused), queues it for the
  // AOR thread and returns; the host step runs there (Capture), not while
  // the trainer waits.
  [[nodiscard]] Status Submit(int rank, int64_t step, float lr) EXCLUDES(mu_, q_mu_);
  // Stops the AOR thread and the watchers (the captures still queued are
  // dropped; one in progress finishes) and joins them; Submit answers
  // Unavailable from then on. The agent calls it before its JobMember goes (the thread calls into
  // it); the destructor too.
  void StopThread() EXCLUDES(q_mu_);
  // Waits until every capture of a step <= `step` has been processed by
  // the AOR thread: first queues the staging files' ready slots that no
  // watcher queued yet (the doorbell rang, the watcher has not run), then
  // waits for the queue; false at the deadline (or when stopped).
  bool WaitCaptured(int64_t step, Deadline deadline) EXCLUDES(q_mu_);
  // Publishes (OnChecksum) every valid checksum in the staging files'
  // rings not published yet, now, in the caller's thread: the node's step
  // path calls it so that it never reports step t complete before its
  // ranks' checksums up to t are published, even when a watcher lags.
  void PublishChecksums() EXCLUDES(q_mu_, sum_mu_);
  // Processes the capture now (the AOR thread; tests): takes the slot of
  // `step` (Ready -> Reading; the client does not write a slot in that
  // state), runs each replica's host step straight from the slot's slices
  // in one pass that also hashes them (opt::AorReplica::Prepare), checks
  // the hashes against the client's, and only then commits the steps and
  // marks the slot Done. FailedPrecondition when the rank did not register or the slot is not
  // ready with `step` (torn: left Writing by a killed trainer; overwritten
  // early: it holds another step); DataLoss when the slices do not hash to
  // the client's checksum. Each such refusal counts in stage_refused and
  // leaves the replica where it was. A replica that fails its check is
  // logged, marked diverged and seeded again (never kept); that is not an
  // error of the capture.
  [[nodiscard]] Status Capture(int rank, int64_t step, float lr) EXCLUDES(mu_);

  // A replica of `owner` (nullptr when none): for tests and the cluster.
  struct View {
    AorRange range;
    opt::AorReplica::Saved saved;
    std::vector<float> state;  // num_state slices back to back
    int64_t reseeds = 0;       // seeds after the first (divergence, restore)
  };
  std::unique_ptr<View> Replica(int owner) EXCLUDES(mu_);
  // The replica's checksum of `step` if it computed that step recently
  // (Advance; a seeded step is not one).
  Result<uint64_t> ChecksumOf(int owner, int64_t step) EXCLUDES(mu_);
  // Marks the replica of `owner` diverged (a failed Confirm against the
  // owner's checksum): seeded again at the next capture.
  void Refuse(int owner, const std::string& why) EXCLUDES(mu_);

  struct Stats {
    int64_t advanced = 0;  // replica steps computed on the host
    int64_t seeded = 0;
    int64_t refused = 0;         // divergences caught
    int64_t submitted = 0;       // captures queued for the AOR thread
    int64_t rang = 0;            // of which found by a doorbell or a scan (no request)
    int64_t sums_published = 0;  // own shard checksums published from the rings
    int64_t budget_refused = 0;  // registrations whose replicas did not fit the budget
    int64_t stage_refused = 0;   // stage slots not used (torn, overwritten, bad hash)
    int64_t capture_errors = 0;  // queued captures that failed (logged)
  };
  Stats stats() EXCLUDES(mu_);

  std::string StagePath(int rank) const;
  std::string ReplicaPath(int owner) const;

 private:
  struct Held {
    AorRange range;
    std::shared_ptr<shm::Segment> file;  // <root>/aor.<owner>, the replica's areas
    std::unique_ptr<opt::AorReplica> r;
    std::map<int64_t, uint64_t> checksums;  // step -> checksum (recent)
    int64_t seeds = 0;
  };
  struct Feeder {
    std::shared_ptr<const opt::Optimizer> optimizer;
    uint64_t optimizer_hash = 0;
    uint64_t numel = 0;
    std::vector<AorRange> ranges;
    std::shared_ptr<shm::Segment> stage;
  };
  Status SeedLocked(Held& rep, const Feeder& f, int64_t step, const float* params) REQUIRES(mu_);
  // Advance (Prepare + Commit) with the file's headers kept right.
  Status AdvanceLocked(Held& rep, const Feeder& f, int64_t step, float lr, const float* grads,
                       const float* params) REQUIRES(mu_);

  const std::string root_;
  const SeedSource seed_;
  const OnAdvanced on_advanced_;
  const OnChecksum on_checksum_;
  Mutex mu_;
  std::map<int, Feeder> feeders_ GUARDED_BY(mu_);  // holder rank ->
  std::map<int, Held> replicas_ GUARDED_BY(mu_);   // owner rank ->
  RoomCheck room_ GUARDED_BY(mu_);
  std::map<int, uint64_t> charged_ GUARDED_BY(mu_);  // holder rank -> RegistrationBytes
  Stats stats_ GUARDED_BY(mu_);
  // Capture's per-range work, reused (no allocation per step).
  std::vector<uint64_t> slice_hashes_ GUARDED_BY(mu_);
  std::vector<int> prepared_ GUARDED_BY(mu_);
  std::vector<float> seed_slices_ GUARDED_BY(mu_);  // slices of the replicas to seed, copied out

  // The AOR thread and its queue.
  struct Queued {
    int rank;
    int64_t step;
    float lr;
  };
  void Worker() EXCLUDES(q_mu_);
  // Queues the slot of `step` of `rank` unless its sequence number was
  // queued already (false then).
  bool EnqueueLocked(int rank, const shm::AorStageSlot* slot, int64_t step, float lr)
      REQUIRES(q_mu_);
  // Queues the ready slots of `rank`'s staging file not queued yet.
  void ScanLocked(int rank, const shm::Segment& stage) REQUIRES(q_mu_);
  // Publishes the new valid entries of the ring of `rank`'s staging file.
  void PublishRing(int rank, const shm::Segment& stage) EXCLUDES(sum_mu_);
  // A staging file's watcher: waits on its doorbell, scans, publishes.
  struct Watcher {
    std::shared_ptr<shm::Segment> stage;
    std::atomic<bool> stop{false};
    std::thread thread;
  };
  void Watch(int rank, Watcher* w) EXCLUDES(q_mu_, sum_mu_);
  static void StopWatcher(std::unique_ptr<Watcher> w);
  Mutex sum_mu_;
  // rank -> ring entry -> the (step, checksum) published from it.
  std::map<int, std::map<int, std::pair<int64_t, uint64_t>>> published_ GUARDED_BY(sum_mu_);
  int64_t sums_published_ GUARDED_BY(sum_mu_) = 0;
  Mutex q_mu_;
  CondVar q_cv_;
  std::deque<Queued> queue_ GUARDED_BY(q_mu_);
  // Registered rank -> its staging file (null: it feeds no replica), what
  // Submit checks without waiting for a host step in progress (mu_).
  std::map<int, std::shared_ptr<shm::Segment>> stages_ GUARDED_BY(q_mu_);
  int64_t submitted_ GUARDED_BY(q_mu_) = 0;
  int64_t rang_ GUARDED_BY(q_mu_) = 0;
  // rank -> stage slot -> the sequence number last queued from it.
  std::map<int, std::map<int, uint32_t>> queued_seq_ GUARDED_BY(q_mu_);
  std::map<int, std::unique_ptr<Watcher>> watchers_ GUARDED_BY(q_mu_);
  int64_t submit_refused_ GUARDED_BY(q_mu_) = 0;
  std::multiset<int64_t> pending_ GUARDED_BY(q_mu_);  // queued or in flight
  bool stop_ GUARDED_BY(q_mu_) = false;
  std::thread worker_;  // started at the first Submit
};

}  // namespace memento::agent
