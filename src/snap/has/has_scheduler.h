// Hierarchical Asynchronous Snapshotting (HAS): decides which chunks of a
// snapshot the copy engine may copy, and when, so that the copy disturbs
// training as little as possible (REFT, section 4.1, Algorithm 1).
//
//   layer 1  inside reported idle windows (pipeline bubbles, waits on peers)
//   layer 2  beside computation: chunked and paced by a token bucket so that
//            copies never take more than a set share of copy bandwidth
//   layer 3  beside communication, only when the copy uses a separate link
//            (options.separate_comm_link: e.g. NVLink for training traffic,
//            PCIe for the snapshot)
//   fence    whatever is left when the trainer calls Fence() is released at
//            once; that wait is the only time training is delayed
//
// The scheduler is pure and deterministic: it reads no clock and starts no
// thread. Every input carries its own time stamp `now` (seconds on any
// monotonic clock), so tests drive it with a simulated clock. The copy engine
// (src/snap, or HasRunner in has_runner.h) calls, per snapshot:
//
//   sched.BeginSnapshot(step, chunk_bytes, now);
//   loop: r = sched.NextChunks(now, budget);   // copy r.chunks, then
//         sched.OnChunkDone(i, now);           // for each copied chunk
//         sched.ReportCopy(bytes, seconds);    // bandwidth sample
//         if r.chunks is empty: wait until r.retry_at or the next OnPhase
//   sched.OnFenceBegin(now);  ... copy the rest ...  sched.OnFenceEnd(now);
//
// and forwards the trainer's phase hooks with OnPhase(phase, now).
//
// Thread safety: none; a HasScheduler is used under its owner's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"

namespace memento::has {

inline constexpr double kNever = std::numeric_limits<double>::infinity();

// The layer a chunk was released in (what SnapshotStats reports).
enum class Layer : uint8_t { kIdle = 0, kCompute = 1, kCommunicate = 2, kFence = 3 };
const char* LayerName(Layer layer);  // "idle", "compute", "communicate", "fence"

// A 1F1B pipeline schedule as seen by one stage (REFT Algorithm 1 inputs).
// num_stages == 0 means "unknown": bubbles are then measured online from the
// phase hooks.
struct PipelineSchedule {
  int num_stages = 0;        // |P|
  int stage = 0;             // p, 0-based
  int num_microbatches = 0;  // m
  double fwd_s = 0;          // forward time of one micro-batch on this stage
  double bwd_s = 0;          // backward time of one micro-batch on this stage
  bool known() const { return num_stages > 0; }
};

// REFT Alg. 1, EstimateSnapshotTime: size(W_p) / B_io.
double EstimateSnapshotTime(uint64_t bytes, double bandwidth_bytes_per_s);

// REFT Alg. 1, EstimateBubbleTime for 1F1B:
//   (0.8 p + 2|P| - p - 2) * C_FB,BP
// with C_FB,BP the forward plus backward time of one micro-batch. The
// formula is taken as printed in the paper. It is capped by the idle time a
// 1F1B step can have at all: (|P| - 1) * (fwd + bwd) of each stage's
// (m + |P| - 1) * (fwd + bwd) step (Narayanan et al., PipeDream-Flush), so
// that a wrong estimate cannot plan more bubble than exists.
double EstimateBubbleTime(const PipelineSchedule& schedule);

// The 1F1B idle time of one stage: (|P| - 1) * (fwd + bwd).
double PipelineIdleTime(const PipelineSchedule& schedule);

// REFT Alg. 1, SplitParameter: the bubble part is the leading
// floor(n * t_bubble / t_ss) of the vectorised state, here rounded down to
// whole chunks. Returns how many leading chunks form the bubble part (all of
// them when t_bubble >= t_ss).
size_t SplitParameter(const std::vector<uint64_t>& chunk_bytes, double t_ss, double t_bubble);

// Cuts `bytes` into chunks of at most `chunk_bytes` (the last may be shorter).
std::vector<uint64_t> SplitIntoChunks(uint64_t bytes, uint64_t chunk_bytes);

// A token bucket in bytes: `rate` bytes/s flow in up to `capacity`.
class TokenBucket {
 public:
  TokenBucket() = default;
  TokenBucket(double rate, double capacity, double now);
  void SetRate(double rate, double now);
  void SetCapacity(double capacity);
  // Takes `bytes` when that many tokens are there.
  bool TryTake(double bytes, double now);
  // Seconds from `now` until `bytes` tokens are there (0 when they are).
  double TimeUntil(double bytes, double now);
  double rate() const { return rate_; }
  double tokens(double now);

 private:
  void Refill(double now);
  double rate_ = 0;
  double capacity_ = 0;
  double tokens_ = 0;
  double last_ = 0;
};

struct HasOptions {
  // Copy bandwidth (bytes/s) assumed before the first measurement.
  double initial_bandwidth = 4e9;
  // Weight of a new sample in the exponentially weighted moving averages of
  // bandwidth and of per-step phase times.
  double ewma_alpha = 0.3;
  // Layer 2 pacing: the copy beside computation is spread so that it ends at
  // `finish_fraction` of the expected snapshot window (Snapshot() to Fence()),
  // at no less than `compute_min_fraction` of the measured bandwidth and at
  // no more than `compute_max_fraction` of it unless that would leave bytes
  // for the fence (a soft cap: a fence wait stops training outright). An
  // absolute hard cap (bytes/s) applies when compute_max_rate > 0.
  double compute_max_fraction = 0.5;
  double compute_min_fraction = 0.05;
  double compute_max_rate = 0;
  double finish_fraction = 0.6;
  // Bucket depth in bytes; at least the largest chunk. 0: the largest chunk.
  uint64_t compute_burst_bytes = 0;
  // Layer 3: copy beside communication (only when it uses another link).
  bool separate_comm_link = false;
  // Share of the estimated bubble time that is planned for (margin for
  // windows too short to use).
  double idle_safety = 0.8;
  // Re-plan when bandwidth or bubble time moved by more than this fraction
  // from the values of the current plan.
  double drift_threshold = 0.25;
  // Bubble times below this many seconds count as no bubble when comparing
  // for drift (noise floor).
  double drift_floor_s = 1e-3;
  // Known 1F1B schedule; else bubbles are measured online.
  PipelineSchedule schedule;
};

// What one snapshot did, per layer (HAS observability).
struct HasStepStats {
  int64_t step = -1;
  uint64_t bytes = 0;
  uint64_t bytes_idle = 0;
  uint64_t bytes_compute = 0;
  uint64_t bytes_communicate = 0;
  uint64_t bytes_fence = 0;  // released only when Fence() was waiting
  double fence_wait_s = 0;   // OnFenceBegin -> OnFenceEnd
  double copy_s = 0;         // BeginSnapshot -> last chunk done
  double window_s = 0;       // BeginSnapshot -> OnFenceBegin
  double idle_s = 0;         // measured phase times inside the window
  double compute_s = 0;
  double communicate_s = 0;
  // The plan used (Algorithm 1) and why.
  bool replanned = false;
  std::string plan_reason;  // "first", "chunks", "bandwidth", "bubble", "measured",
                            // "communicate"; empty when the plan was kept
  uint64_t planned_bubble_bytes = 0;
  uint64_t planned_compute_bytes = 0;
  uint64_t planned_communicate_bytes = 0;
  uint64_t demoted_bytes = 0;  // bubble-part bytes moved to layer 2 mid-step
  double t_ss_s = 0;           // EstimateSnapshotTime of the plan
  double t_bubble_s = 0;       // bubble estimate of the plan
  double bandwidth = 0;        // bandwidth estimate at plan time (bytes/s)
  double compute_rate = 0;     // last layer 2 pacing rate (bytes/s)
};

// Maps per-layer bytes into the public SnapshotStats (fence bytes are
// counted with layer 2: they were copied while computation had stopped,
// and fence_wait_s says for how long).
void FillSnapshotStats(const HasStepStats& in, SnapshotStats* out);

// Chunks released by NextChunks.
struct Release {
  std::vector<size_t> chunks;  // indices into BeginSnapshot's chunk list
  Layer layer = Layer::kIdle;
  uint64_t bytes = 0;
  // When nothing (more) may be released now: the earliest time at which
  // asking again can release something, unless a phase change, fence or new
  // snapshot comes first. kNever: only such an event can.
  double retry_at = kNever;
};

class HasScheduler {
 public:
  explicit HasScheduler(HasOptions options);

  const HasOptions& options() const { return options_; }

  // Starts snapshot `step` of chunks with these sizes (in copy order).
  // FailedPrecondition when the previous snapshot has not been fenced;
  // InvalidArgument for a zero-byte chunk.
  Status BeginSnapshot(int64_t step, std::vector<uint64_t> chunk_bytes, double now);

  // The trainer entered `phase` at `now`. Calls must come in time order.
  void OnPhase(Phase phase, double now);

  // Chunks that may be copied now, at most `max_bytes` of them (at least one
  // chunk when any is releasable, even if larger than max_bytes).
  Release NextChunks(double now, uint64_t max_bytes);

  // The engine finished copying chunk `index`.
  void OnChunkDone(size_t index, double now);
  // A bandwidth sample: `bytes` copied in `seconds` of copy time.
  void ReportCopy(uint64_t bytes, double seconds);

  // The trainer is blocked in Fence(): everything left is released.
  void OnFenceBegin(double now);
  // Fence() returned (every chunk done). Finishes the step's statistics and
  // feeds its phase times into the online estimates.
  // REQUIRES: OnFenceBegin was called and all chunks are done.
  HasStepStats OnFenceEnd(double now);

  bool active() const { return active_; }
  bool fencing() const { return fencing_; }
  bool AllReleased() const;
  bool AllDone() const { return active_ && done_count_ == chunk_bytes_.size(); }
  Phase phase() const { return phase_; }
  double bandwidth_estimate() const { return bandwidth_; }
  // Bubble time per step the next plan would use.
  double BubbleEstimate() const;
  const HasStepStats& last_stats() const { return last_stats_; }
  // Plans made so far (the first one included).
  int replans() const { return replans_; }
  // True once a known schedule's bubble estimate was replaced by the
  // measured one (drift).
  bool using_measured_bubble() const { return use_measured_bubble_; }

 private:
  enum class Part : uint8_t { kBubble, kCompute, kCommunicate };
  void Plan(double now);
  void Account(double now);
  void Demote(double now);
  double RemainingIdle(double now) const;
  double RemainingComm() const;
  void UpdatePacing(double now);
  double ExpectedWindow() const;
  void Take(std::deque<size_t>* queue, uint64_t max_bytes, Release* out);

  HasOptions options_;

  // Online estimates.
  double bandwidth_;
  bool have_bandwidth_ = false;
  double idle_ewma_ = 0, compute_ewma_ = 0, comm_ewma_ = 0, window_ewma_ = 0;
  int measured_steps_ = 0;
  bool use_measured_bubble_ = false;
  int replans_ = 0;

  // The current plan (kept across steps until measurements drift).
  bool have_plan_ = false;
  std::vector<uint64_t> plan_chunks_;
  size_t plan_split_ = 0;       // chunks [0, split) bubble part
  size_t plan_comm_split_ = 0;  // chunks [comm_split, n) layer 3 part
  double plan_bandwidth_ = 0;
  double plan_bubble_ = 0;
  double plan_comm_ = 0;
  int plan_measured_steps_ = 0;

  // The snapshot in progress.
  bool active_ = false;
  bool fencing_ = false;
  std::vector<uint64_t> chunk_bytes_;
  std::vector<uint8_t> done_;
  size_t done_count_ = 0;
  std::deque<size_t> bubble_q_, compute_q_, comm_q_;
  uint64_t bubble_q_bytes_ = 0, compute_q_bytes_ = 0;
  double begin_ = 0, fence_begin_ = 0, last_done_ = 0;
  Phase phase_ = Phase::kCompute;
  double acc_from_ = 0;
  double idle_acc_ = 0, compute_acc_ = 0, comm_acc_ = 0;
  TokenBucket bucket_;
  HasStepStats cur_;
  HasStepStats last_stats_;
};

}  // namespace memento::has
