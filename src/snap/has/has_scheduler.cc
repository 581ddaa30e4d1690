#include "snap/has/has_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/check.h"

namespace memento::has {

const char* LayerName(Layer layer) {
  switch (layer) {
    case Layer::kIdle:
      return "idle";
    case Layer::kCompute:
      return "compute";
    case Layer::kCommunicate:
      return "communicate";
    case Layer::kFence:
      return "fence";
  }
  return "?";
}

double EstimateSnapshotTime(uint64_t bytes, double bandwidth_bytes_per_s) {
  if (bytes == 0) return 0;
  if (!(bandwidth_bytes_per_s > 0)) return kNever;
  return static_cast<double>(bytes) / bandwidth_bytes_per_s;
}

double PipelineIdleTime(const PipelineSchedule& s) {
  if (s.num_stages <= 1) return 0;
  return (s.num_stages - 1) * (s.fwd_s + s.bwd_s);
}

double EstimateBubbleTime(const PipelineSchedule& s) {
  if (s.num_stages <= 1) return 0;
  // REFT Alg. 1, EstimateBubbleTime: (0.8p + 2|P| - p - 2) * C_FB,BP. We read
  // C_FB,BP as the mean time of one pass (forward or backward) of one
  // micro-batch, (fwd + bwd) / 2: then stage 0 gets the textbook 1F1B idle
  // time (|P| - 1)(fwd + bwd) and each later stage 0.1 (fwd + bwd) less.
  const double p = s.stage;
  const double stages = s.num_stages;
  const double c = (s.fwd_s + s.bwd_s) / 2;
  const double reft = (0.8 * p + 2 * stages - p - 2) * c;
  return std::clamp(reft, 0.0, PipelineIdleTime(s));
}

size_t SplitParameter(const std::vector<uint64_t>& chunk_bytes, double t_ss, double t_bubble) {
  if (t_bubble >= t_ss) return chunk_bytes.size();
  if (!(t_bubble > 0) || !(t_ss > 0)) return 0;
  uint64_t total = 0;
  for (uint64_t b : chunk_bytes) total += b;
  // REFT Alg. 1, SplitParameter: W_bubble = W[: floor(n * t_bubble / t_ss)].
  const auto target =
      static_cast<uint64_t>(std::floor(static_cast<double>(total) * t_bubble / t_ss));
  uint64_t acc = 0;
  size_t k = 0;
  while (k < chunk_bytes.size() && acc + chunk_bytes[k] <= target) acc += chunk_bytes[k++];
  return k;
}

std::vector<uint64_t> SplitIntoChunks(uint64_t bytes, uint64_t chunk_bytes) {
  MEMENTO_CHECK(chunk_bytes > 0);
  std::vector<uint64_t> out;
  out.reserve(bytes / chunk_bytes + 1);
  for (uint64_t off = 0; off < bytes; off += chunk_bytes) {
    out.push_back(std::min(chunk_bytes, bytes - off));
  }
  return out;
}

// ---- TokenBucket ----------------------------------------------------------------

TokenBucket::TokenBucket(double rate, double capacity, double now)
    : rate_(rate), capacity_(capacity), tokens_(capacity), last_(now) {}

void TokenBucket::Refill(double now) {
  if (now > last_) {
    tokens_ = std::min(capacity_, tokens_ + (now - last_) * rate_);
    last_ = now;
  }
}

void TokenBucket::SetRate(double rate, double now) {
  Refill(now);
  rate_ = rate;
}

void TokenBucket::SetCapacity(double capacity) {
  capacity_ = capacity;
  tokens_ = std::min(tokens_, capacity_);
}

double TokenBucket::tokens(double now) {
  Refill(now);
  return tokens_;
}

bool TokenBucket::TryTake(double bytes, double now) {
  Refill(now);
  if (tokens_ + 1e-6 < bytes) return false;
  tokens_ -= bytes;
  return true;
}

double TokenBucket::TimeUntil(double bytes, double now) {
  Refill(now);
  if (tokens_ >= bytes) return 0;
  if (!(rate_ > 0)) return kNever;
  return (bytes - tokens_) / rate_;
}

// ---- HasScheduler ----------------------------------------------------------------

void FillSnapshotStats(const HasStepStats& in, SnapshotStats* out) {
  out->step = in.step;
  out->bytes = in.bytes;
  out->copy_s = in.copy_s;
  out->fence_wait_s = in.fence_wait_s;
  out->bytes_idle = in.bytes_idle;
  out->bytes_compute = in.bytes_compute + in.bytes_fence;
  out->bytes_communicate = in.bytes_communicate;
  out->bytes_fence = in.bytes_fence;
}

HasScheduler::HasScheduler(HasOptions options)
    : options_(std::move(options)), bandwidth_(options_.initial_bandwidth) {
  MEMENTO_CHECK(options_.initial_bandwidth > 0);
  MEMENTO_CHECK(options_.ewma_alpha > 0 && options_.ewma_alpha <= 1);
}

double HasScheduler::BubbleEstimate() const {
  if (options_.schedule.known() && !use_measured_bubble_) {
    return EstimateBubbleTime(options_.schedule);
  }
  return measured_steps_ > 0 ? idle_ewma_ : 0;
}

double HasScheduler::ExpectedWindow() const {
  if (measured_steps_ > 0) return window_ewma_;
  const PipelineSchedule& s = options_.schedule;
  if (s.known() && s.num_microbatches > 0) {
    return (s.num_microbatches + s.num_stages - 1) * (s.fwd_s + s.bwd_s);
  }
  return 0;  // unknown
}

bool HasScheduler::AllReleased() const {
  return bubble_q_.empty() && compute_q_.empty() && comm_q_.empty();
}

Status HasScheduler::BeginSnapshot(int64_t step, std::vector<uint64_t> chunk_bytes, double now) {
  if (active_) {
    return Status(StatusCode::kFailedPrecondition,
                  "HAS: snapshot " + std::to_string(step) + " begun while snapshot " +
                      std::to_string(cur_.step) + " is not fenced");
  }
  for (size_t i = 0; i < chunk_bytes.size(); ++i) {
    if (chunk_bytes[i] == 0) {
      return Status(StatusCode::kInvalidArgument,
                    "HAS: chunk " + std::to_string(i) + " has 0 bytes; expected at least 1");
    }
  }
  chunk_bytes_ = std::move(chunk_bytes);

  // Drift detector: keep the plan while the chunks, the bandwidth and the
  // bubble estimate stay within drift_threshold of the plan's values.
  std::string reason;
  const double bubble = BubbleEstimate();
  if (!have_plan_) {
    reason = "first";
  } else if (plan_chunks_ != chunk_bytes_) {
    reason = "chunks";
  } else if (std::fabs(bandwidth_ - plan_bandwidth_) > options_.drift_threshold * plan_bandwidth_) {
    reason = "bandwidth";
  } else if (std::max(bubble, plan_bubble_) > options_.drift_floor_s &&
             std::fabs(bubble - plan_bubble_) >
                 options_.drift_threshold * std::max(plan_bubble_, options_.drift_floor_s)) {
    reason = "bubble";
  } else if (plan_measured_steps_ == 0 && measured_steps_ > 0) {
    reason = "measured";  // the plan so far was made without any measurement
  } else if (options_.separate_comm_link &&
             std::max(comm_ewma_, plan_comm_) > options_.drift_floor_s &&
             std::fabs(comm_ewma_ - plan_comm_) >
                 options_.drift_threshold * std::max(plan_comm_, options_.drift_floor_s)) {
    reason = "communicate";
  }

  cur_ = HasStepStats{};
  cur_.step = step;
  if (!reason.empty()) {
    Plan(now);
    cur_.replanned = true;
    cur_.plan_reason = reason;
    ++replans_;
  }

  const size_t n = chunk_bytes_.size();
  done_.assign(n, 0);
  done_count_ = 0;
  bubble_q_.clear();
  compute_q_.clear();
  comm_q_.clear();
  bubble_q_bytes_ = compute_q_bytes_ = 0;
  uint64_t max_chunk = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = chunk_bytes_[i];
    max_chunk = std::max(max_chunk, b);
    cur_.bytes += b;
    if (i < plan_split_) {
      bubble_q_.push_back(i);
      bubble_q_bytes_ += b;
      cur_.planned_bubble_bytes += b;
    } else if (i < plan_comm_split_) {
      compute_q_.push_back(i);
      compute_q_bytes_ += b;
      cur_.planned_compute_bytes += b;
    } else {
      comm_q_.push_back(i);
      cur_.planned_communicate_bytes += b;
    }
  }
  cur_.t_ss_s = EstimateSnapshotTime(cur_.bytes, plan_bandwidth_);
  cur_.t_bubble_s = plan_bubble_;
  cur_.bandwidth = plan_bandwidth_;

  const double capacity =
      static_cast<double>(std::max<uint64_t>(options_.compute_burst_bytes, max_chunk));
  bucket_ = TokenBucket(options_.compute_max_fraction * bandwidth_, capacity, now);

  active_ = true;
  fencing_ = false;
  begin_ = now;
  acc_from_ = now;
  last_done_ = now;
  idle_acc_ = compute_acc_ = comm_acc_ = 0;
  if (n == 0) cur_.copy_s = 0;
  return Status::Ok();
}

void HasScheduler::Plan(double /*now*/) {
  const size_t n = chunk_bytes_.size();
  uint64_t total = 0;
  for (uint64_t b : chunk_bytes_) total += b;
  const double bw = bandwidth_;
  const double t_ss = EstimateSnapshotTime(total, bw);
  const double t_bubble = BubbleEstimate();
  const double usable_bubble = t_bubble * options_.idle_safety;

  // REFT Alg. 1: all of W into bubbles when they suffice, else split.
  size_t split = t_ss >= usable_bubble ? SplitParameter(chunk_bytes_, t_ss, usable_bubble) : n;

  // Layer 3 (beside communication) takes the tail that layer 2 is not
  // expected to fit, and only with a separate link and measured
  // communication time.
  size_t comm_split = n;
  const double window = ExpectedWindow();
  if (options_.separate_comm_link && measured_steps_ > 0 && comm_ewma_ > 0 && window > 0) {
    const double compute_time =
        std::max(0.0, window * options_.finish_fraction - t_bubble - comm_ewma_);
    const double layer2_capacity = compute_time * options_.compute_max_fraction * bw;
    uint64_t rest = 0;
    for (size_t i = split; i < n; ++i) rest += chunk_bytes_[i];
    if (static_cast<double>(rest) > layer2_capacity) {
      const double excess = std::min(static_cast<double>(rest) - layer2_capacity, comm_ewma_ * bw);
      double tail = 0;
      while (comm_split > split &&
             tail + static_cast<double>(chunk_bytes_[comm_split - 1]) <= excess) {
        tail += static_cast<double>(chunk_bytes_[--comm_split]);
      }
    }
  }

  have_plan_ = true;
  plan_chunks_ = chunk_bytes_;
  plan_split_ = split;
  plan_comm_split_ = comm_split;
  plan_bandwidth_ = bw;
  plan_bubble_ = t_bubble;
  plan_comm_ = comm_ewma_;
  plan_measured_steps_ = measured_steps_;
}

void HasScheduler::Account(double now) {
  if (!active_ || fencing_ || now <= acc_from_) {
    acc_from_ = std::max(acc_from_, now);
    return;
  }
  const double dt = now - acc_from_;
  switch (phase_) {
    case Phase::kIdle:
      idle_acc_ += dt;
      break;
    case Phase::kCompute:
      compute_acc_ += dt;
      break;
    case Phase::kCommunicate:
      comm_acc_ += dt;
      break;
  }
  acc_from_ = now;
}

void HasScheduler::OnPhase(Phase phase, double now) {
  Account(now);
  phase_ = phase;
}

double HasScheduler::RemainingIdle(double now) const {
  double left = std::max(0.0, BubbleEstimate() * options_.idle_safety - idle_acc_);
  // No more idle time than window left.
  const double window = ExpectedWindow();
  if (window > 0) left = std::min(left, std::max(0.0, window - (now - begin_)));
  return left;
}

void HasScheduler::Demote(double now) {
  // The bubble part must fit into the idle time still expected in this
  // window; the tail that no longer fits goes to layer 2 (front of its queue,
  // so the copy order stays close to sequential).
  const double remaining = RemainingIdle(now);
  while (!bubble_q_.empty() && static_cast<double>(bubble_q_bytes_) / bandwidth_ > remaining) {
    const size_t i = bubble_q_.back();
    bubble_q_.pop_back();
    bubble_q_bytes_ -= chunk_bytes_[i];
    compute_q_.push_front(i);
    compute_q_bytes_ += chunk_bytes_[i];
    cur_.demoted_bytes += chunk_bytes_[i];
  }
}

double HasScheduler::RemainingComm() const {
  // Without a separate link nothing is copied while training communicates.
  if (options_.separate_comm_link || measured_steps_ == 0) return 0;
  return std::max(0.0, comm_ewma_ - comm_acc_);
}

void HasScheduler::UpdatePacing(double now) {
  const double bw = bandwidth_;
  double soft_cap = options_.compute_max_fraction * bw;
  double hard_cap = bw;
  if (options_.compute_max_rate > 0) {
    hard_cap = std::min(hard_cap, options_.compute_max_rate);
    soft_cap = std::min(soft_cap, hard_cap);
  }
  const double min_rate = std::min(soft_cap, options_.compute_min_fraction * bw);
  double rate = soft_cap;
  const double window = ExpectedWindow();
  if (window > 0) {
    // Spread layer 2 over the computation still expected before the fence.
    // The soft cap yields when layer 2 would otherwise still run at the
    // fence: a fence wait stops training, a faster copy only slows it.
    const double left =
        window * options_.finish_fraction - (now - begin_) - RemainingIdle(now) - RemainingComm();
    const double need = static_cast<double>(compute_q_bytes_);
    if (left <= 0) {
      rate = hard_cap;
    } else if (need / left > soft_cap) {
      rate = std::min(need / left, hard_cap);
    } else {
      rate = std::max(need / left, min_rate);
    }
  }
  bucket_.SetRate(rate, now);
  cur_.compute_rate = rate;
}

void HasScheduler::Take(std::deque<size_t>* queue, uint64_t max_bytes, Release* out) {
  while (!queue->empty()) {
    const size_t i = queue->front();
    const uint64_t b = chunk_bytes_[i];
    if (!out->chunks.empty() && out->bytes + b > max_bytes) break;
    queue->pop_front();
    if (queue == &bubble_q_) bubble_q_bytes_ -= b;
    if (queue == &compute_q_) compute_q_bytes_ -= b;
    out->chunks.push_back(i);
    out->bytes += b;
  }
}

Release HasScheduler::NextChunks(double now, uint64_t max_bytes) {
  Release out;
  if (!active_ || AllReleased()) return out;
  Account(now);
  if (fencing_) {
    out.layer = Layer::kFence;
    Take(&bubble_q_, max_bytes, &out);
    Take(&compute_q_, max_bytes, &out);
    Take(&comm_q_, max_bytes, &out);
  } else if (phase_ == Phase::kIdle) {
    // Layer 1: anything may go while the device idles, bubble part first.
    out.layer = Layer::kIdle;
    Take(&bubble_q_, max_bytes, &out);
    Take(&compute_q_, max_bytes, &out);
    Take(&comm_q_, max_bytes, &out);
  } else if (phase_ == Phase::kCompute) {
    // Layer 2: paced by the token bucket.
    out.layer = Layer::kCompute;
    Demote(now);
    UpdatePacing(now);
    while (!compute_q_.empty()) {
      const size_t i = compute_q_.front();
      const uint64_t b = chunk_bytes_[i];
      if (!out.chunks.empty() && out.bytes + b > max_bytes) break;
      if (!bucket_.TryTake(static_cast<double>(b), now)) {
        if (out.chunks.empty()) out.retry_at = now + bucket_.TimeUntil(static_cast<double>(b), now);
        break;
      }
      compute_q_.pop_front();
      compute_q_bytes_ -= b;
      out.chunks.push_back(i);
      out.bytes += b;
    }
  } else if (options_.separate_comm_link) {
    // Layer 3: the copy uses another link than training's communication.
    out.layer = Layer::kCommunicate;
    Demote(now);
    Take(&comm_q_, max_bytes, &out);
    Take(&compute_q_, max_bytes, &out);
  }
  switch (out.layer) {
    case Layer::kIdle:
      cur_.bytes_idle += out.bytes;
      break;
    case Layer::kCompute:
      cur_.bytes_compute += out.bytes;
      break;
    case Layer::kCommunicate:
      cur_.bytes_communicate += out.bytes;
      break;
    case Layer::kFence:
      cur_.bytes_fence += out.bytes;
      break;
  }
  return out;
}

void HasScheduler::OnChunkDone(size_t index, double now) {
  MEMENTO_CHECK(active_);
  MEMENTO_CHECK(index < done_.size());
  MEMENTO_CHECK(!done_[index]);
  done_[index] = 1;
  ++done_count_;
  last_done_ = std::max(last_done_, now);
  if (done_count_ == done_.size()) cur_.copy_s = last_done_ - begin_;
}

void HasScheduler::ReportCopy(uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0)) return;
  const double sample = static_cast<double>(bytes) / seconds;
  if (!have_bandwidth_) {
    bandwidth_ = sample;
    have_bandwidth_ = true;
  } else {
    bandwidth_ += options_.ewma_alpha * (sample - bandwidth_);
  }
}

void HasScheduler::OnFenceBegin(double now) {
  MEMENTO_CHECK(active_);
  if (fencing_) return;
  Account(now);
  fencing_ = true;
  fence_begin_ = now;
  cur_.window_s = now - begin_;
  cur_.idle_s = idle_acc_;
  cur_.compute_s = compute_acc_;
  cur_.communicate_s = comm_acc_;
}

HasStepStats HasScheduler::OnFenceEnd(double now) {
  MEMENTO_CHECK(active_ && fencing_);
  MEMENTO_CHECK(AllDone());
  cur_.fence_wait_s = std::max(0.0, now - fence_begin_);
  auto ewma = [this](double* avg, double sample) {
    *avg = measured_steps_ == 0 ? sample : *avg + options_.ewma_alpha * (sample - *avg);
  };
  ewma(&window_ewma_, cur_.window_s);
  ewma(&idle_ewma_, cur_.idle_s);
  ewma(&compute_ewma_, cur_.compute_s);
  ewma(&comm_ewma_, cur_.communicate_s);
  ++measured_steps_;
  // A known schedule whose bubbles do not show up in the phase hooks (or
  // show up much larger) is replaced by the online measurement.
  if (options_.schedule.known() && !use_measured_bubble_) {
    const double formula = EstimateBubbleTime(options_.schedule);
    if (std::fabs(idle_ewma_ - formula) >
        options_.drift_threshold * std::max(formula, options_.drift_floor_s)) {
      use_measured_bubble_ = true;
    }
  }
  active_ = false;
  fencing_ = false;
  last_stats_ = cur_;
  return cur_;
}

}  // namespace memento::has
