// The device path of a build with CUDA (device_path.h).
#include <thread>

#include "client/device_path.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "snap/copy_kernel.h"
#include "snap/cuda/cuda_copy_engine.h"
#include "snap/cuda/device_copy.h"

namespace memento::client {
namespace {

class CudaDeviceCopier final : public DeviceCopier {
 public:
  CudaDeviceCopier(std::vector<std::unique_ptr<cuda::PinnedRegion>> pins,
                   std::unique_ptr<cuda::CudaCopyEngine> engine, std::vector<bool> on_device)
      : pins_(std::move(pins)), engine_(std::move(engine)), on_device_(std::move(on_device)) {}
  ~CudaDeviceCopier() override {
    engine_.reset();  // waits for queued copies
    pins_.clear();    // unregistered before the slots are unmapped
  }

  bool OnDevice(size_t index) const override {
    return index < on_device_.size() && on_device_[index];
  }

  Status CopyToSlot(const std::vector<snap::CopyChunk>& chunks) override {
    std::vector<cuda::DeviceChunk> dc;
    dc.reserve(chunks.size());
    for (const snap::CopyChunk& c : chunks) {
      cuda::DeviceChunk d;
      d.host = c.dst;
      d.device = const_cast<void*>(c.src);
      d.bytes = c.length;
      d.checksum_out = c.checksum_out;
      d.label = c.label;
      dc.push_back(d);
    }
    return cuda::SnapshotDeviceChunks(engine_.get(), dc);
  }

  Status CopyFromSlot(const std::vector<snap::CopyChunk>& chunks, uint64_t* bytes) override {
    std::vector<cuda::DeviceChunk> dc;
    for (const snap::CopyChunk& c : chunks) {
      cuda::DeviceChunk d;
      d.host = const_cast<void*>(c.src);
      d.device = c.dst;
      d.bytes = c.length;
      d.expected_checksum = c.expected_checksum;
      d.label = c.label;
      dc.push_back(d);
      *bytes += c.length;
    }
    return cuda::RestoreDeviceChunks(engine_.get(), dc);
  }

 private:
  std::vector<std::unique_ptr<cuda::PinnedRegion>> pins_;
  std::unique_ptr<cuda::CudaCopyEngine> engine_;
  std::vector<bool> on_device_;  // per chunk of the slot layout
};

class DevicePath final : public SnapshotPath {
 public:
  DevicePath(DeviceCopier* device, SlotSink* sink) : device_(device), sink_(sink) {}
  ~DevicePath() override { Drain(); }

  Status Begin(std::vector<snap::CopyChunk> chunks, int slot, int64_t step) override {
    {
      MutexLock l(&mu_);
      done_ = false;
      status_ = Status::Ok();
    }
    bytes_ = 0;
    for (const snap::CopyChunk& c : chunks) bytes_ += c.length;
    step_ = step;
    active_ = true;
    thread_ = std::thread([this, chunks = std::move(chunks), slot, step] {
      Stopwatch sw;
      std::vector<snap::CopyChunk> on_device;
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (device_->OnDevice(i)) {
          on_device.push_back(chunks[i]);
        } else {
          *chunks[i].checksum_out =
              snap::CopyAndChecksumStreaming(chunks[i].dst, chunks[i].src, chunks[i].length);
        }
      }
      Status st = device_->CopyToSlot(on_device);
      if (st.ok()) sink_->CompleteSlot(slot, step);  // node-local complete, last
      MutexLock l(&mu_);
      status_ = st;
      copy_s_ = sw.Seconds();
      done_ = true;
      cv_.SignalAll();
    });
    return Status::Ok();
  }

  Status Fence(Deadline deadline, SnapshotStats* stats) override {
    if (!active_) return Status::Ok();
    Stopwatch sw;
    bool was_done;
    Status st;
    double copy_s;
    {
      MutexLock l(&mu_);
      was_done = done_;
      while (!done_) {
        if (!cv_.WaitUntil(&l, deadline.when()) && !done_) {
          return DeadlineExceededError(
              fmt::format("snapshot {} of device tensors still copying", step_));
        }
      }
      st = status_;
      copy_s = copy_s_;
    }
    thread_.join();
    active_ = false;
    stats->step = step_;
    stats->bytes = bytes_;
    stats->copy_s = copy_s;
    stats->fence_wait_s = was_done ? 0 : sw.Seconds();
    stats->bytes_compute = bytes_;
    return st;
  }

  bool InFlight() const override { return active_; }

  void Drain() override {
    if (thread_.joinable()) thread_.join();
    active_ = false;
  }

 private:
  DeviceCopier* const device_;
  SlotSink* const sink_;
  // The snapshot in flight runs on thread_; the trainer thread starts and
  // joins it.
  std::thread thread_;
  bool active_ = false;
  int64_t step_ = -1;
  uint64_t bytes_ = 0;
  Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  Status status_ GUARDED_BY(mu_);
  double copy_s_ GUARDED_BY(mu_) = 0;
};

}  // namespace

Status CheckDeviceTensor(const TensorMeta& meta, Device device,
                         const std::vector<RegisteredTensor>& registered) {
  const int count = cuda::DeviceCount();
  if (count == 0) {
    return FailedPreconditionError(
        fmt::format("tensor '{}' lives on {}, but no CUDA device is visible to this process "
                    "(cudaGetDeviceCount found none); register it from host memory instead",
                    meta.name, DeviceName(device)));
  }
  if (device.index < 0 || device.index >= count) {
    return InvalidArgumentError(
        fmt::format("tensor '{}' lives on {}, but only {} CUDA device{} "
                    "{} visible (cuda:0..cuda:{})",
                    meta.name, DeviceName(device), count, count == 1 ? "" : "s",
                    count == 1 ? "is" : "are", count - 1));
  }
  for (const RegisteredTensor& r : registered) {
    if (!r.device.is_host() && r.device != device) {
      return FailedPreconditionError(fmt::format(
          "tensor '{}' lives on {} but '{}' on {}: one client (one rank) copies from one CUDA "
          "device",
          meta.name, DeviceName(device), r.meta.name, DeviceName(r.device)));
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<DeviceCopier>> MakeDeviceCopier(
    const ClientOptions& options, const std::vector<RegisteredTensor>& tensors,
    const shm::SlotLayout& layout, const shm::Segment* const (&slots)[shm::kSlotsPerRank]) {
  int device = -1;
  for (const RegisteredTensor& r : tensors) {
    if (!r.device.is_host()) device = r.device.index;
  }
  if (device < 0) return std::unique_ptr<DeviceCopier>();
  std::vector<std::unique_ptr<cuda::PinnedRegion>> pins;
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    MEMENTO_ASSIGN_OR_RETURN(auto pin,
                             cuda::PinnedRegion::Register(slots[s]->data(), slots[s]->size()));
    pins.push_back(std::move(pin));
  }
  cuda::CudaCopyOptions co;
  co.device = device;
  co.chunk_bytes = options.chunk_bytes;
  co.low_priority = true;
  MEMENTO_ASSIGN_OR_RETURN(auto engine, cuda::CudaCopyEngine::Create(co));
  std::vector<bool> on_device(layout.chunks.size(), false);
  for (size_t i = 0; i < layout.chunks.size(); ++i) {
    on_device[i] = !tensors[layout.chunks[i].tensor_index].device.is_host();
  }
  MEMENTO_LOG_INFO(
      "rank {}: device tensors on cuda:{}: slots page-locked, copy streams at "
      "priority {}",
      options.rank, device, engine->stream_priority());
  return std::unique_ptr<DeviceCopier>(
      new CudaDeviceCopier(std::move(pins), std::move(engine), std::move(on_device)));
}

std::unique_ptr<SnapshotPath> MakeDeviceSnapshotPath(DeviceCopier* device, SlotSink* sink) {
  return std::make_unique<DevicePath>(device, sink);
}

}  // namespace memento::client
