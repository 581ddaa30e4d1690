#include "client/eager_path.h"

#include "common/clock.h"

namespace memento::client {

Status EagerPath::Begin(std::vector<snap::CopyChunk> chunks, int slot, int64_t step) {
  copy_cpu_ns_.store(0, std::memory_order_relaxed);
  snapshot_thread_ = std::this_thread::get_id();
  job_ = engine_->Submit(
      std::move(chunks), [this](size_t, uint64_t) { CountWorkerCpu(); },
      [this, slot, step](const Status& copied) -> Status {
        if (!copied.ok()) return copied;
        sink_->CompleteSlot(slot, step);  // node-local complete, last
        CountWorkerCpu();
        return Status::Ok();
      },
      // The first snapshot after a restart: its copiers (never the
      // Snapshot() call) finish touching the target slot first.
      [sink = sink_, slot] { sink->PrefaultSlot(slot); });
  step_ = step;
  helped_bytes_ = 0;
  return Status::Ok();
}

Status EagerPath::Fence(Deadline deadline, SnapshotStats* stats) {
  if (job_ == nullptr) return Status::Ok();
  Stopwatch sw;
  bool was_done = job_->done();
  // Idle-priority workers may be starved by the trainers of this node: the
  // waiting trainer thread copies what is left itself.
  Status st =
      help_in_fence_ ? engine_->HelpAndWait(*job_, deadline, &helped_bytes_) : job_->Wait(deadline);
  if (st.code() == StatusCode::kDeadlineExceeded && !job_->done()) return st;
  stats->step = step_;
  stats->bytes = job_->bytes();
  stats->copy_s = job_->copy_seconds();
  stats->fence_wait_s = was_done ? 0 : sw.Seconds();
  stats->bytes_fence = helped_bytes_;
  stats->bytes_compute = stats->bytes;  // eager: all beside computation; bytes_fence is a part
  stats->copy_cpu_s = static_cast<double>(copy_cpu_ns_.load(std::memory_order_relaxed)) * 1e-9;
  job_.reset();
  return st;
}

void EagerPath::Drain() {
  if (job_ != nullptr) engine_->HelpAndWait(*job_, Deadline::Infinite()).IgnoreError();
}

void EagerPath::CountWorkerCpu() {
  if (std::this_thread::get_id() == snapshot_thread_) return;
  copy_cpu_ns_.fetch_add(ThreadCpuSinceLastCallNs(), std::memory_order_relaxed);
}

}  // namespace memento::client
