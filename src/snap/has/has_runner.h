// HasRunner: drives a HasScheduler with real time and worker threads.
//
// It is the executor the CPU copy engine and the benchmark plug in: the owner
// gives a CopyFn that copies one chunk (by index into the chunk list of the
// current snapshot: the owner keeps the index -> (src, dst, len) map), and
// forwards the trainer's phase hooks. Per snapshot:
//
//   runner->Begin(step, chunk_bytes);   // returns at once
//   runner->OnPhase(Phase::kIdle); ...  // from any thread
//   MEMENTO_ASSIGN_OR_RETURN(HasStepStats st, runner->Fence(deadline));
//
// Thread model: `threads` workers (one chunk each in flight, so at most
// `threads` chunks are being copied at any time). All scheduler state is under
// one mutex; CopyFn runs without it. Callbacks fire on worker threads only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "memento/types.h"
#include "snap/has/has_scheduler.h"

namespace memento::has {

struct HasRunnerOptions {
  HasOptions has;
  int threads = 1;
};

class HasRunner {
 public:
  // Copies chunk `index` of the current snapshot. Runs on a worker thread;
  // a failure is returned by the snapshot's Fence().
  using CopyFn = std::function<Status(size_t index)>;

  // InvalidArgument when threads < 1 or copy is empty.
  static Result<std::unique_ptr<HasRunner>> Create(HasRunnerOptions options, CopyFn copy);
  ~HasRunner();  // waits for chunks being copied, then stops the workers
  HasRunner(const HasRunner&) = delete;
  HasRunner& operator=(const HasRunner&) = delete;

  // Starts a snapshot. FailedPrecondition when the previous one is not fenced.
  Status Begin(int64_t step, std::vector<uint64_t> chunk_bytes) EXCLUDES(mu_);
  // The trainer's phase hook (any thread).
  void OnPhase(Phase phase) EXCLUDES(mu_);
  // Releases everything left and waits until every chunk is copied. Returns
  // the step's statistics, the first copy error, DeadlineExceeded (call
  // again to keep waiting) or FailedPrecondition when nothing was begun.
  Result<HasStepStats> Fence(Deadline deadline = Deadline::Infinite()) EXCLUDES(mu_);

  double bandwidth_estimate() EXCLUDES(mu_);

 private:
  HasRunner(HasRunnerOptions options, CopyFn copy);
  double Seconds() const;
  void Worker() EXCLUDES(mu_);

  const HasRunnerOptions options_;
  const CopyFn copy_;
  const TimePoint epoch_;
  Mutex mu_;
  CondVar work_cv_;  // new snapshot, phase change, fence, stop
  CondVar done_cv_;  // a chunk finished
  HasScheduler sched_ GUARDED_BY(mu_);
  Status error_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  // Bandwidth measurement over busy periods.
  static constexpr uint64_t kSampleBytes = uint64_t{64} << 20;
  int active_copies_ GUARDED_BY(mu_) = 0;
  TimePoint busy_start_ GUARDED_BY(mu_);
  uint64_t busy_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t busy_reported_ GUARDED_BY(mu_) = 0;
  std::vector<std::thread> workers_;
};

}  // namespace memento::has
