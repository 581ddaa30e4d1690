#include "tier/persister.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/clock.h"
#include "common/log.h"
#include "common/thread_cpu.h"

namespace memento::tier {

Result<std::unique_ptr<Persister>> Persister::Start(PersisterOptions options) {
  if (options.root.empty()) return InvalidArgumentError("persister: durable root is empty");
  if (options.every_k_steps < 0 || options.every_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("persister: every_k_steps={} every_seconds={} must be >= 0",
                    options.every_k_steps, options.every_seconds));
  }
  std::unique_ptr<Persister> p(new Persister(std::move(options)));
  p->worker_ = std::thread([raw = p.get()] {
    NameThisThread("persister");
    raw->Run();
  });
  return p;
}

Persister::Persister(PersisterOptions options)
    : options_(std::move(options)),
      env_(options_.env ? options_.env : Env::Default()),
      limiter_(options_.bandwidth_bytes_per_sec),
      next_attempt_(Now()),
      backoff_s_(options_.retry_initial_s) {}

Persister::~Persister() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  cancel_ = true;
  if (worker_.joinable()) worker_.join();
}

OfferResult Persister::Offer(int64_t step, VersionViewProvider provider) {
  MutexLock l(&mu_);
  if (stop_) return OfferResult::kStopped;
  bool due = options_.every_k_steps > 0 && step % options_.every_k_steps == 0;
  if (!due && options_.every_seconds > 0) {
    due = !last_persist_start_ ||
          SecondsBetween(*last_persist_start_, Now()) >= options_.every_seconds;
  }
  if (!due) return OfferResult::kSkippedByPolicy;
  OfferResult r = OfferResult::kQueued;
  if (pending_) {
    if (pending_->step >= step) return OfferResult::kSkippedByPolicy;  // already have newer
    ++stats_.dropped;
    r = OfferResult::kReplacedPending;
  }
  pending_ = Pending{step, std::move(provider)};
  next_attempt_ = Now();  // a fresh version is tried at once, even after errors
  // Time-based policy counts from the offer that was accepted, so that a slow
  // write does not make every following offer due.
  last_persist_start_ = Now();
  cv_.SignalAll();
  return r;
}

bool Persister::WaitIdle(Deadline deadline) {
  MutexLock l(&mu_);
  while (pending_ || in_flight_) {
    if (deadline.infinite()) {
      cv_.Wait(&l);
    } else if (!cv_.WaitUntil(&l, deadline.when())) {
      return !(pending_ || in_flight_);
    }
  }
  return true;
}

PersisterStats Persister::stats() const {
  MutexLock l(&mu_);
  PersisterStats s = stats_;
  s.busy = pending_.has_value() || in_flight_;
  return s;
}

void Persister::Run() {
  MutexLock l(&mu_);
  while (true) {
    while (!stop_ && (!pending_ || Now() < next_attempt_)) {
      if (pending_) {
        cv_.WaitUntil(&l, next_attempt_);
      } else {
        cv_.Wait(&l);
      }
    }
    if (stop_) return;
    Pending job = std::move(*pending_);
    pending_.reset();
    in_flight_ = true;
    l.native().unlock();

    Status status;
    WriteStats ws;
    bool skipped = false;
    Stopwatch watch;
    Result<VersionView> view = job.provider();
    if (!view.ok()) {
      skipped = true;
      MEMENTO_LOG_WARN("durable: version {} not persisted, its bytes are gone: {}", job.step,
                       view.status().ToString());
    } else {
      MEMENTO_LOG_INFO("durable: persisting version {} of node {} ({:.1f} MiB) to {}", job.step,
                       view->node, view->total_bytes() / 1048576.0, options_.root);
      WriteOptions wo = options_.write;
      wo.limiter = &limiter_;
      wo.cancel = &cancel_;
      auto r = WriteVersion(env_, options_.root, *view, wo,
                            Deadline::AfterSeconds(options_.commit_timeout_s));
      if (r.ok()) {
        ws = *r;
      } else if (r.status().code() == StatusCode::kAlreadyExists) {
        MEMENTO_LOG_INFO("durable: version {} is already committed", job.step);
      } else {
        status = r.status();
      }
      if (status.ok() && view->node == 0 && options_.apply_retention) {
        auto ret = ApplyRetention(env_, options_.root, options_.retention);
        if (!ret.ok()) {
          MEMENTO_LOG_WARN("durable: retention failed (will retry after the next version): {}",
                           ret.status().ToString());
        } else if (!ret->deleted.empty() || !ret->cleaned_incomplete.empty()) {
          MEMENTO_LOG_INFO("durable: retention deleted {} version(s), cleaned {} incomplete",
                           ret->deleted.size(), ret->cleaned_incomplete.size());
        }
      }
    }
    const double seconds = watch.Seconds();
    // Drop the view (and its pin) before taking the lock again.
    view = Result<VersionView>(AbortedError("released"));

    l.native().lock();
    in_flight_ = false;
    if (skipped) {
      ++stats_.skipped;
    } else if (status.ok()) {
      ++stats_.persisted;
      stats_.last_persisted_step = std::max(stats_.last_persisted_step, job.step);
      stats_.bytes_written += ws.data_bytes;
      stats_.last_seconds = seconds;
      stats_.last_bytes_per_sec = seconds > 0 ? ws.data_bytes / seconds : 0;
      stats_.last_error.clear();
      backoff_s_ = options_.retry_initial_s;
      MEMENTO_LOG_INFO("durable: version {} persisted: {:.1f} MiB in {:.2f} s ({:.0f} MiB/s, {})",
                       job.step, ws.data_bytes / 1048576.0, seconds,
                       stats_.last_bytes_per_sec / 1048576.0,
                       ws.direct ? "O_DIRECT, " + ws.engine : std::string("buffered"));
    } else {
      ++stats_.failures;
      stats_.last_error = status.ToString();
      if (!stop_ && !pending_) {
        // Retry the same version later unless a newer one has been offered.
        pending_ = std::move(job);
        next_attempt_ =
            Now() + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(backoff_s_));
        MEMENTO_LOG_WARN("durable: version {} failed, retry in {:.1f} s: {}", pending_->step,
                         backoff_s_, status.ToString());
        backoff_s_ = std::min(options_.retry_max_s, backoff_s_ * 2);
      } else {
        MEMENTO_LOG_WARN("durable: version {} failed, superseded by a newer one: {}", job.step,
                         status.ToString());
      }
    }
    cv_.SignalAll();
  }
}

}  // namespace memento::tier
