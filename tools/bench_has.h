// `memento bench has` (tools/bench_has.cc): its options, the snapshot modes
// every device shares, and the interface of a device's side, one file per
// device: tools/bench_has_cpu.cc, tools/bench_has_gpu.cc (built only with
// CUDA; it registers itself, so the device-neutral code has no #if).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "memento/status.h"
#include "snap/has/bench_loop.h"
#include "snap/has/has_runner.h"
#include "snap/has/has_scheduler.h"
#include "tools/bench_has_trainer.h"

namespace memento::tools {

inline constexpr uint64_t kHasBenchMiB = uint64_t{1} << 20;

struct HasBenchArgs {
  bool json = false;
  // trainer: the reference trainer (CPU default; bench_has_trainer.h);
  // blas: the OpenBLAS / cuBLAS loop below (the GPU default).
  std::string loop = "auto";
  HasTrainerBenchArgs trainer;
  std::string device = "auto";  // auto | cpu | gpu
  int steps = 6;
  int warmup = 2;
  int rounds = 3;
  int stages = 4, stage = 1, microbatches = 8;
  int64_t state_mib = -1;  // default per device
  int hidden = -1;
  int layers = -1;
  int64_t comm_mib = -1;
  uint64_t chunk_kib = 4096;
  int has_threads = -1;    // default: 1 on CPU, 2 on GPU
  int64_t tensor_mib = 0;  // host_device on GPU: one copy per this many MiB (0: per region)
  bool online_bubbles = false;
  std::string modes = "off,sync,host,host_device,has";
};

// A chunk of the state: region r, [offset, offset + bytes).
struct Chunk {
  size_t region;
  uint64_t offset;
  uint64_t bytes;
};

// Host "slots" the snapshot is written to: page-aligned host memory, one
// per state region (registered with CUDA when the state is on the device).
struct Slots {
  std::vector<uint8_t*> region;
  ~Slots() {
    for (uint8_t* p : region) std::free(p);
  }
};

// One way of snapshotting (a mode).
class Snapshotter {
 public:
  virtual ~Snapshotter() = default;
  virtual Status Begin(int64_t step) = 0;
  // Blocks until the last snapshot is complete.
  virtual Status Fence() = 0;
  virtual void OnPhase(Phase) {}
};

class OffSnapshotter : public Snapshotter {
 public:
  Status Begin(int64_t) override { return Status::Ok(); }
  Status Fence() override { return Status::Ok(); }
};

// Runs one job per snapshot on its own thread; Fence waits for it.
class ThreadSnapshotter : public Snapshotter {
 public:
  explicit ThreadSnapshotter(std::function<Status()> job) : job_(std::move(job)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~ThreadSnapshotter() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Status Begin(int64_t) override {
    std::lock_guard<std::mutex> l(mu_);
    pending_ = true;
    cv_.notify_all();
    return Status::Ok();
  }
  Status Fence() override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return !pending_; });
    return result_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [this] { return stop_ || pending_; });
      if (stop_) return;
      l.unlock();
      Status s = job_();
      l.lock();
      result_ = s;
      pending_ = false;
      cv_.notify_all();
    }
  }
  std::function<Status()> job_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, stop_ = false;
  Status result_;
  std::thread thread_;
};

// Synchronous: the copy runs inside Begin (after the optimizer step).
class SyncSnapshotter : public Snapshotter {
 public:
  explicit SyncSnapshotter(std::function<Status()> job) : job_(std::move(job)) {}
  Status Begin(int64_t) override { return job_(); }
  Status Fence() override { return Status::Ok(); }

 private:
  std::function<Status()> job_;
};

class HasSnapshotter : public Snapshotter {
 public:
  HasSnapshotter(std::unique_ptr<has::HasRunner> runner, std::vector<uint64_t> chunk_bytes)
      : runner_(std::move(runner)), chunk_bytes_(std::move(chunk_bytes)) {}
  Status Begin(int64_t step) override {
    began_ = true;
    return runner_->Begin(step, chunk_bytes_);
  }
  Status Fence() override {
    if (!began_) return Status::Ok();
    began_ = false;
    MEMENTO_ASSIGN_OR_RETURN(stats_, runner_->Fence());
    ++tally.snapshots;
    tally.bytes_idle += stats_.bytes_idle;
    tally.bytes_compute += stats_.bytes_compute;
    tally.bytes_communicate += stats_.bytes_communicate;
    tally.bytes_fence += stats_.bytes_fence;
    tally.demoted += stats_.demoted_bytes;
    if (stats_.replanned) tally.plan_reasons[stats_.plan_reason]++;
    tally.last = stats_;
    return Status::Ok();
  }
  void OnPhase(Phase p) override { runner_->OnPhase(p); }

  struct Tally {
    uint64_t snapshots = 0;
    uint64_t bytes_idle = 0, bytes_compute = 0, bytes_communicate = 0, bytes_fence = 0;
    uint64_t demoted = 0;
    std::map<std::string, int> plan_reasons;
    has::HasStepStats last;
  } tally;

 private:
  std::unique_ptr<has::HasRunner> runner_;
  std::vector<uint64_t> chunk_bytes_;
  bool began_ = false;
  has::HasStepStats stats_;
};

// One device's side of the bench: the training loop, the raw copy paths'
// throughput and the snapshot modes.
class HasBenchDevice {
 public:
  virtual ~HasBenchDevice() = default;
  virtual const char* name() const = 0;  // "cpu" | "gpu"
  virtual has::TrainingLoop* loop() = 0;
  // Readies `slots` for the device (GPU: registers them) and measures the
  // raw copy paths into them (the JSON's "copy").
  [[nodiscard]] virtual Result<nlohmann::json> PrepareSlots(
      const std::vector<has::StateRegion>& state, Slots* slots) = 0;
  // One mode ("off", "sync", "host", "host_device", "has"); InvalidArgument
  // for another name.
  [[nodiscard]] virtual Result<std::unique_ptr<Snapshotter>> MakeMode(
      const std::string& mode, const std::vector<Chunk>* chunks, Slots* slots,
      const has::HasOptions& has_options) = 0;
  virtual int has_threads() const = 0;  // HasRunner workers
  virtual const char* notes() const = 0;
};

// The CPU side (tools/bench_has_cpu.cc).
[[nodiscard]] Result<std::unique_ptr<HasBenchDevice>> MakeCpuHasBenchDevice(const HasBenchArgs& a);

// The GPU side, registered by tools/bench_has_gpu.cc when the build has CUDA;
// null otherwise.
struct HasBenchGpu {
  int (*device_count)();
  Result<std::unique_ptr<HasBenchDevice>> (*make)(const HasBenchArgs& a);
};
const HasBenchGpu*& HasBenchGpuBackend();

}  // namespace memento::tools
