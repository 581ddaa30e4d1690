// The HAS schedule (ClientOptions::schedule "has", and "auto" once the
// trainer reported an idle phase; docs/has.md): the chunk list goes to a
// has::HasRunner, whose workers call CopyChunk(i) when the scheduler
// releases chunk i. The worker that finishes the last chunk completes the
// slot, exactly as the eager engine's on_done does.
//
// Thread safety: Begin/Fence/Drain on the trainer thread; OnPhase from any
// thread; CopyChunk on the runner's workers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <vector>

#include "client/device_path.h"
#include "client/snapshot_path.h"
#include "common/mutex.h"
#include "snap/has/has_runner.h"

namespace memento::client {

class HasPath final : public SnapshotPath {
 public:
  // `device` (null without device tensors) and `sink` outlive the path.
  // The runner starts in phase `phase` (the phase the trainer is in carries
  // over). `chunk_delay_us`: a test hook that slows every chunk down.
  static Result<std::unique_ptr<HasPath>> Create(const ClientOptions& options, Phase phase,
                                                 int chunk_delay_us, DeviceCopier* device,
                                                 SlotSink* sink);
  ~HasPath() override;

  Status Begin(std::vector<snap::CopyChunk> chunks, int slot, int64_t step) override;
  Status Fence(Deadline deadline, SnapshotStats* stats) override;
  bool InFlight() const override { return active_; }
  void Drain() override;
  void OnPhase(Phase phase) { runner_->OnPhase(phase); }

 private:
  HasPath(const ClientOptions& options, int chunk_delay_us, DeviceCopier* device, SlotSink* sink)
      : rank_(options.rank),
        idle_priority_(options.copy_priority == CopyPriority::kIdle),
        chunk_delay_us_(chunk_delay_us),
        device_(device),
        sink_(sink) {}

  // Runs on a HAS worker, without the runner's lock.
  Status CopyChunk(size_t index);
  // Runs on a HAS worker at its first chunk: records its thread id and gives
  // it the priority the others have. With copy_priority "idle" it first
  // checks that the OS lets a SCHED_IDLE thread be raised back; if not, the
  // HAS workers keep the normal priority.
  void RegisterWorker();
  void SetWorkersIdle(bool idle) EXCLUDES(prio_mu_);
  void SetWorkersIdleLocked(bool idle) REQUIRES(prio_mu_);

  const int rank_;
  const bool idle_priority_;
  const int chunk_delay_us_;
  DeviceCopier* const device_;
  SlotSink* const sink_;
  std::unique_ptr<has::HasRunner> runner_;
  // The chunk list and target of the snapshot in flight, written by the
  // trainer thread only while no HAS snapshot runs.
  bool active_ = false;
  std::vector<snap::CopyChunk> chunks_;
  std::atomic<size_t> remaining_{0};
  int slot_ = -1;
  int64_t step_ = -1;
  // CPU time of the workers for the snapshot in flight (copy_cpu_s).
  std::atomic<uint64_t> copy_cpu_ns_{0};
  // Workers' priority (copy_priority "idle"): SCHED_IDLE from Begin until
  // the fence, SCHED_OTHER while a fence waits. Workers register at their
  // first chunk; idle_ok_ turns false for good when the OS refuses to raise
  // a worker back (no CAP_SYS_NICE, RLIMIT_NICE < 20): a fence must never
  // wait on a starved worker, so they then stay at normal priority.
  Mutex prio_mu_;
  std::vector<pid_t> worker_tids_ GUARDED_BY(prio_mu_);
  bool workers_idle_ GUARDED_BY(prio_mu_) = false;
  bool idle_ok_ GUARDED_BY(prio_mu_) = true;
};

}  // namespace memento::client
