#include "snap/has/has_runner.h"

#include <chrono>
#include <utility>

#include "common/clock.h"

namespace memento::has {

Result<std::unique_ptr<HasRunner>> HasRunner::Create(HasRunnerOptions options, CopyFn copy) {
  if (options.threads < 1) {
    return Status(
        StatusCode::kInvalidArgument,
        "HasRunner: threads = " + std::to_string(options.threads) + "; expected at least 1");
  }
  if (!copy) return Status(StatusCode::kInvalidArgument, "HasRunner: no copy function");
  std::unique_ptr<HasRunner> runner(new HasRunner(std::move(options), std::move(copy)));
  for (int i = 0; i < runner->options_.threads; ++i) {
    runner->workers_.emplace_back([r = runner.get()] { r->Worker(); });
  }
  return runner;
}

HasRunner::HasRunner(HasRunnerOptions options, CopyFn copy)
    : options_(std::move(options)), copy_(std::move(copy)), epoch_(Now()), sched_(options_.has) {}

HasRunner::~HasRunner() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (auto& t : workers_) t.join();
}

double HasRunner::Seconds() const { return SecondsBetween(epoch_, Now()); }

Status HasRunner::Begin(int64_t step, std::vector<uint64_t> chunk_bytes) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(sched_.BeginSnapshot(step, std::move(chunk_bytes), Seconds()));
  error_ = Status::Ok();
  work_cv_.SignalAll();
  return Status::Ok();
}

void HasRunner::OnPhase(Phase phase) {
  MutexLock l(&mu_);
  sched_.OnPhase(phase, Seconds());
  work_cv_.SignalAll();
}

double HasRunner::bandwidth_estimate() {
  MutexLock l(&mu_);
  return sched_.bandwidth_estimate();
}

Result<HasStepStats> HasRunner::Fence(Deadline deadline) {
  MutexLock l(&mu_);
  if (!sched_.active()) {
    return Status(StatusCode::kFailedPrecondition, "HasRunner: Fence without a snapshot");
  }
  sched_.OnFenceBegin(Seconds());
  work_cv_.SignalAll();
  while (!sched_.AllDone()) {
    if (deadline.infinite()) {
      done_cv_.Wait(&l);
    } else if (!done_cv_.WaitUntil(&l, deadline.when()) && !sched_.AllDone()) {
      return Status(StatusCode::kDeadlineExceeded, "HasRunner: snapshot copy still running");
    }
  }
  HasStepStats stats = sched_.OnFenceEnd(Seconds());
  if (!error_.ok()) return error_;
  return stats;
}

void HasRunner::Worker() {
  MutexLock l(&mu_);
  while (!stop_) {
    if (!sched_.active() || sched_.AllReleased()) {
      work_cv_.Wait(&l);
      continue;
    }
    const double now = Seconds();
    Release r = sched_.NextChunks(now, 1);  // one chunk per worker in flight
    if (r.chunks.empty()) {
      if (r.retry_at == kNever) {
        work_cv_.Wait(&l);
      } else {
        const auto wait =
            std::chrono::duration_cast<Duration>(std::chrono::duration<double>(r.retry_at - now));
        work_cv_.WaitUntil(&l, Now() + wait);
      }
      continue;
    }
    for (size_t index : r.chunks) {
      if (active_copies_++ == 0) {
        busy_start_ = Now();
        busy_bytes_ = 0;
        busy_reported_ = 0;
      }
      l.native().unlock();
      Status s = copy_(index);
      const TimePoint t1 = Now();
      l.native().lock();
      sched_.OnChunkDone(index, SecondsBetween(epoch_, t1));
      // Bandwidth samples cover busy periods (at least one copy running), so
      // concurrent copies add up instead of each reporting its own latency. A
      // long period reports its running average every kSampleBytes.
      busy_bytes_ += r.bytes / r.chunks.size();
      const double busy_s = SecondsBetween(busy_start_, t1);
      const bool idle_now = --active_copies_ == 0;
      if (idle_now || busy_bytes_ >= busy_reported_ + kSampleBytes) {
        sched_.ReportCopy(busy_bytes_, busy_s);
        busy_reported_ = busy_bytes_;
      }
      if (!s.ok() && error_.ok()) error_ = std::move(s);
    }
    if (sched_.AllDone()) done_cv_.SignalAll();
  }
}

}  // namespace memento::has
