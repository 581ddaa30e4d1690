#include "client/has_path.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "snap/copy_kernel.h"

namespace memento::client {

Result<std::unique_ptr<HasPath>> HasPath::Create(const ClientOptions& options, Phase phase,
                                                 int chunk_delay_us, DeviceCopier* device,
                                                 SlotSink* sink) {
  std::unique_ptr<HasPath> path(new HasPath(options, chunk_delay_us, device, sink));
  has::HasRunnerOptions ro;
  ro.threads = std::max(1, options.copy_threads);
  ro.has.separate_comm_link = options.has.separate_comm_link;
  ro.has.compute_max_rate = options.has.compute_max_rate;
  ro.has.schedule.num_stages = options.has.pipeline_stages;
  ro.has.schedule.stage = options.has.pipeline_stage;
  ro.has.schedule.num_microbatches = options.has.pipeline_microbatches;
  ro.has.schedule.fwd_s = options.has.pipeline_fwd_s;
  ro.has.schedule.bwd_s = options.has.pipeline_bwd_s;
  HasPath* p = path.get();
  MEMENTO_ASSIGN_OR_RETURN(path->runner_,
                           has::HasRunner::Create(ro, [p](size_t i) { return p->CopyChunk(i); }));
  path->runner_->OnPhase(phase);
  return path;
}

HasPath::~HasPath() { Drain(); }

Status HasPath::Begin(std::vector<snap::CopyChunk> chunks, int slot, int64_t step) {
  copy_cpu_ns_.store(0, std::memory_order_relaxed);
  std::vector<uint64_t> sizes;
  sizes.reserve(chunks.size());
  for (const snap::CopyChunk& c : chunks) sizes.push_back(c.length);
  chunks_ = std::move(chunks);
  remaining_.store(chunks_.size(), std::memory_order_relaxed);
  slot_ = slot;
  step_ = step;
  // Idle priority: the copy runs on CPU time no trainer wants (this node's
  // other ranks included) until the fence.
  SetWorkersIdle(true);
  // Begin() takes the runner's lock: the workers see the chunk list above.
  MEMENTO_RETURN_IF_ERROR(runner_->Begin(step, std::move(sizes)));
  active_ = true;
  return Status::Ok();
}

Status HasPath::Fence(Deadline deadline, SnapshotStats* stats) {
  if (!active_) return Status::Ok();
  // A waiting fence is never starved: the workers run at normal priority
  // until the next snapshot begins.
  SetWorkersIdle(false);
  Result<has::HasStepStats> r = runner_->Fence(deadline);
  if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded) return r.status();
  active_ = false;
  stats->step = step_;
  if (r.ok()) {
    has::FillSnapshotStats(*r, stats);
    stats->copy_cpu_s = static_cast<double>(copy_cpu_ns_.load(std::memory_order_relaxed)) * 1e-9;
    MEMENTO_LOG_DEBUG(
        "snapshot {} (HAS): {} bytes, idle {} compute {} communicate {} fence {}, fence wait "
        "{:.4f} s{}",
        stats->step, r->bytes, r->bytes_idle, r->bytes_compute, r->bytes_communicate,
        r->bytes_fence, r->fence_wait_s, r->replanned ? ", replanned: " + r->plan_reason : "");
  }
  return r.status();
}

void HasPath::Drain() {
  if (!active_) return;
  SetWorkersIdle(false);  // a fence is never starved
  runner_->Fence().status().IgnoreError();
  active_ = false;
}

void HasPath::RegisterWorker() {
  thread_local const void* registered = nullptr;
  if (registered == this) return;
  registered = this;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  MutexLock l(&prio_mu_);
  worker_tids_.push_back(tid);
  if (!idle_priority_ || !idle_ok_) return;
  sched_param param{};
  if (sched_setscheduler(tid, SCHED_IDLE, &param) != 0 ||
      sched_setscheduler(tid, SCHED_OTHER, &param) != 0) {
    const int err = errno;
    idle_ok_ = false;
    MEMENTO_LOG_INFO(
        "rank {}: HAS copy workers keep the normal priority: a SCHED_IDLE thread cannot be "
        "raised back here ({})",
        rank_, std::strerror(err));
    SetWorkersIdleLocked(false);
    return;
  }
  if (workers_idle_) sched_setscheduler(tid, SCHED_IDLE, &param);
}

void HasPath::SetWorkersIdle(bool idle) {
  if (!idle_priority_) return;
  MutexLock l(&prio_mu_);
  SetWorkersIdleLocked(idle && idle_ok_);
}

// Best effort, as the eager engine's workers (snap/copy_engine.cc).
void HasPath::SetWorkersIdleLocked(bool idle) {
  if (workers_idle_ == idle) return;
  workers_idle_ = idle;
  sched_param param{};
  for (pid_t tid : worker_tids_) {
    (void)sched_setscheduler(tid, idle ? SCHED_IDLE : SCHED_OTHER, &param);
  }
}

Status HasPath::CopyChunk(size_t index) {
  RegisterWorker();
  const uint64_t cpu0 = ThreadCpuNs();
  const snap::CopyChunk& c = chunks_[index];
  sink_->PrefaultSlot(slot_);
  if (device_ != nullptr && device_->OnDevice(index)) {
    MEMENTO_RETURN_IF_ERROR(device_->CopyToSlot({c}));
  } else {
    Result<uint64_t> ran = snap::RunSaveChunk(c);
    if (!ran.ok()) {
      // The slot stays incomplete (kWriting): no version is published.
      copy_cpu_ns_.fetch_add(ThreadCpuNs() - cpu0, std::memory_order_relaxed);
      return ran.status();
    }
  }
  if (chunk_delay_us_ > 0) usleep(static_cast<useconds_t>(chunk_delay_us_));
  // acq_rel: the last worker sees every other chunk's writes before it
  // publishes the slot.
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    sink_->CompleteSlot(slot_, step_);  // node-local complete, last
  }
  // Before returning: the runner's Fence() sees it (its lock orders them).
  copy_cpu_ns_.fetch_add(ThreadCpuNs() - cpu0, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace memento::client
