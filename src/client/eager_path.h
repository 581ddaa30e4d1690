// The eager schedule (ClientOptions::schedule "eager", and "auto" until the
// trainer reports an idle phase): every chunk goes to the copy engine at
// once. With copy_priority "idle" the workers run at SCHED_IDLE and a
// waiting Fence() copies the remaining chunks on the trainer thread.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "client/snapshot_path.h"

namespace memento::client {

class EagerPath final : public SnapshotPath {
 public:
  // `engine` and `sink` outlive the path (both are the client's).
  EagerPath(snap::CopyEngine* engine, bool help_in_fence, SlotSink* sink)
      : engine_(engine), help_in_fence_(help_in_fence), sink_(sink) {}
  Status Begin(std::vector<snap::CopyChunk> chunks, int slot, int64_t step) override;
  Status Fence(Deadline deadline, SnapshotStats* stats) override;
  bool InFlight() const override { return job_ != nullptr; }
  void Drain() override;

 private:
  // Engine callback: adds the calling worker's CPU since its previous call
  // (the chunk it just copied, or the job's completion). Chunks the trainer
  // thread copies itself in Fence() are left out: that time is the fence's.
  void CountWorkerCpu();

  snap::CopyEngine* const engine_;
  const bool help_in_fence_;
  SlotSink* const sink_;
  std::shared_ptr<snap::CopyJob> job_;
  int64_t step_ = -1;
  uint64_t helped_bytes_ = 0;  // copied by the trainer thread in Fence()
  // CPU time of the copy workers for the snapshot in flight (SnapshotStats::
  // copy_cpu_s): reset by Begin() while no copy runs, added to by the
  // workers, read after the fence.
  std::atomic<uint64_t> copy_cpu_ns_{0};
  std::thread::id snapshot_thread_;  // the thread that calls Begin()
};

}  // namespace memento::client
