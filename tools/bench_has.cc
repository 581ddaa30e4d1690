// `memento bench has`: snapshot overhead of HAS against the baselines REFT
// compares with, on a training-like loop (one stage of a simulated 1F1B
// pipeline, src/snap/has/bench_loop.h), snapshotting every step.
//
// Modes, run in the same process, alternating in rotated order each round:
//   off          no snapshot
//   sync         blocking copy after the optimizer step
//   host         a host thread copies with no coordination with the device
//                (REFT "host coordination": on GPU a cudaMemcpy on the legacy
//                default stream, which the training stream synchronises with)
//   host_device  asynchronous copies on a side stream started right after the
//                step (REFT "host-device coordination"); on the CPU, a side
//                thread copying chunk after chunk at full speed
//   has          HasScheduler + HasRunner: idle windows first, then paced
//                beside computation; on GPU through CudaCopyEngine
// Each step: Fence() (waits for the previous snapshot), optimizer step,
// Snapshot(step), then the next step's forwards and backwards.
//
// Prints one JSON object: {"modes": {"off": {"step_s", "overhead_pct", ...},
// ...}, "has": {bytes per layer, plans}, "copy": {throughputs}, ...}.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_flag.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "memento/config.h"
#include "snap/has/bench_loop.h"
#include "snap/has/has_runner.h"
#include "snap/has/has_scheduler.h"
#include "tools/bench_has_trainer.h"
#include "tools/bench_stats.h"
#include "tools/command.h"

#if MEMENTO_HAVE_CUDA
#include <cuda_runtime.h>

#include "snap/cuda/cuda_copy_engine.h"
#include "snap/cuda/gpu_bench_loop.h"
#endif

namespace memento::tools {
namespace {

using has::HasStepStats;
using has::StateRegion;
using has::TrainingLoop;
using json = nlohmann::json;

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct BenchArgs {
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

std::vector<Chunk> ChunkState(const std::vector<StateRegion>& state, uint64_t chunk_bytes) {
  std::vector<Chunk> out;
  for (size_t r = 0; r < state.size(); ++r) {
    for (uint64_t off = 0; off < state[r].bytes; off += chunk_bytes) {
      out.push_back({r, off, std::min<uint64_t>(chunk_bytes, state[r].bytes - off)});
    }
  }
  return out;
}

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
    HasStepStats last;
  } tally;

 private:
  std::unique_ptr<has::HasRunner> runner_;
  std::vector<uint64_t> chunk_bytes_;
  bool began_ = false;
  HasStepStats stats_;
};

struct ModeResult {
  std::vector<double> step_s;
  std::vector<double> fence_s;
};

Status RunSegment(TrainingLoop* loop, const has::PipelineShape& shape, const has::BubblePlan& plan,
                  Snapshotter* snap, int warmup, int steps, int64_t* step_counter,
                  ModeResult* out) {
  auto hook = [snap](Phase p) { snap->OnPhase(p); };
  for (int s = 0; s < warmup + steps; ++s) {
    const TimePoint t0 = Now();
    MEMENTO_RETURN_IF_ERROR(snap->Fence());
    const double fence = SecondsBetween(t0, Now());
    loop->OptimizerStep();
    MEMENTO_RETURN_IF_ERROR(snap->Begin(++*step_counter));
    has::RunPipelineStep(loop, shape, plan, hook);
    const double step = SecondsBetween(t0, Now());
    if (s >= warmup) {
      out->step_s.push_back(step);
      out->fence_s.push_back(fence);
    }
  }
  return snap->Fence();
}

// ---- CPU modes ------------------------------------------------------------------

Status CopyChunks(const std::vector<StateRegion>& state, const std::vector<Chunk>& chunks,
                  Slots* slots, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const Chunk& c = chunks[i];
    (void)CopyAndChecksum(slots->region[c.region] + c.offset,
                          static_cast<const uint8_t*>(state[c.region].data) + c.offset, c.bytes);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Snapshotter>> MakeCpuMode(const std::string& mode, TrainingLoop* loop,
                                                 const std::vector<Chunk>* chunks, Slots* slots,
                                                 const has::HasOptions& has_options, int threads) {
  const std::vector<StateRegion> state = loop->State();
  if (mode == "off") return std::unique_ptr<Snapshotter>(new OffSnapshotter());
  if (mode == "sync") {
    return std::unique_ptr<Snapshotter>(
        new SyncSnapshotter([=] { return CopyChunks(state, *chunks, slots, 0, chunks->size()); }));
  }
  if (mode == "host") {
    // Whole regions, one pass each, no chunking and no phase awareness.
    return std::unique_ptr<Snapshotter>(new ThreadSnapshotter([=] {
      for (size_t r = 0; r < state.size(); ++r) {
        CopyAndChecksum(slots->region[r], state[r].data, state[r].bytes);
      }
      return Status::Ok();
    }));
  }
  if (mode == "host_device") {
    return std::unique_ptr<Snapshotter>(new ThreadSnapshotter(
        [=] { return CopyChunks(state, *chunks, slots, 0, chunks->size()); }));
  }
  if (mode == "has") {
    has::HasRunnerOptions ro;
    ro.has = has_options;
    ro.threads = threads;
    MEMENTO_ASSIGN_OR_RETURN(auto runner, has::HasRunner::Create(ro, [=](size_t i) {
                               return CopyChunks(state, *chunks, slots, i, i + 1);
                             }));
    std::vector<uint64_t> sizes;
    for (const Chunk& c : *chunks) sizes.push_back(c.bytes);
    return std::unique_ptr<Snapshotter>(new HasSnapshotter(std::move(runner), sizes));
  }
  return Status(StatusCode::kInvalidArgument, "unknown mode '" + mode + "'");
}

json CpuCopyThroughput(const std::vector<StateRegion>& state, Slots* slots) {
  std::vector<double> plain, fused;
  uint64_t bytes = 0;
  for (const auto& r : state) bytes += r.bytes;
  for (int i = 0; i < 3; ++i) {
    Stopwatch sw;
    for (size_t r = 0; r < state.size(); ++r)
      std::memcpy(slots->region[r], state[r].data, state[r].bytes);
    plain.push_back(sw.Seconds());
    sw.Reset();
    for (size_t r = 0; r < state.size(); ++r) {
      CopyAndChecksum(slots->region[r], state[r].data, state[r].bytes);
    }
    fused.push_back(sw.Seconds());
  }
  const double p = bytes / Median(plain) / 1e9, f = bytes / Median(fused) / 1e9;
  return {{"bytes", bytes}, {"memcpy_gbps", p}, {"copy_and_checksum_gbps", f}, {"ratio", f / p}};
}

// ---- GPU modes ------------------------------------------------------------------

#if MEMENTO_HAVE_CUDA
struct GpuContext {
  std::vector<std::unique_ptr<cuda::PinnedRegion>> pins;
  std::unique_ptr<cuda::CudaCopyEngine> engine;
  cudaStream_t side = nullptr;  // host_device's side stream
  cudaEvent_t side_done = nullptr;
  ~GpuContext() {
    if (side_done) cudaEventDestroy(side_done);
    if (side) cudaStreamDestroy(side);
  }
};

Status CudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}

class SideStreamSnapshotter : public Snapshotter {
 public:
  SideStreamSnapshotter(std::vector<StateRegion> state, Slots* slots, GpuContext* g,
                        uint64_t piece_bytes)
      : state_(std::move(state)), slots_(slots), g_(g), piece_bytes_(piece_bytes) {}
  Status Begin(int64_t) override {
    // One copy per tensor (piece_bytes stands for a tensor size; 0: whole
    // regions), all queued at once, as a framework's async .to("cpu") does.
    for (size_t r = 0; r < state_.size(); ++r) {
      const uint64_t piece = piece_bytes_ ? piece_bytes_ : state_[r].bytes;
      for (uint64_t off = 0; off < state_[r].bytes; off += piece) {
        MEMENTO_RETURN_IF_ERROR(CudaOk(
            cudaMemcpyAsync(
                slots_->region[r] + off, static_cast<const uint8_t*>(state_[r].data) + off,
                std::min<uint64_t>(piece, state_[r].bytes - off), cudaMemcpyDeviceToHost, g_->side),
            "side copy"));
      }
    }
    pending_ = true;
    return CudaOk(cudaEventRecord(g_->side_done, g_->side), "event record");
  }
  Status Fence() override {
    if (!pending_) return Status::Ok();
    pending_ = false;
    return CudaOk(cudaEventSynchronize(g_->side_done), "event synchronize");
  }

 private:
  std::vector<StateRegion> state_;
  Slots* slots_;
  GpuContext* g_;
  uint64_t piece_bytes_;
  bool pending_ = false;
};

Result<std::unique_ptr<Snapshotter>> MakeGpuMode(const std::string& mode,
                                                 cuda::GpuTrainingLoop* loop,
                                                 const std::vector<Chunk>* chunks, Slots* slots,
                                                 GpuContext* g, const has::HasOptions& has_options,
                                                 uint64_t a_chunk_bytes, int threads,
                                                 uint64_t piece_bytes) {
  const std::vector<StateRegion> state = loop->State();
  auto train = static_cast<cudaStream_t>(loop->stream());
  if (mode == "off") return std::unique_ptr<Snapshotter>(new OffSnapshotter());
  if (mode == "sync") {
    return std::unique_ptr<Snapshotter>(new SyncSnapshotter([=] {
      for (size_t r = 0; r < state.size(); ++r) {
        MEMENTO_RETURN_IF_ERROR(
            CudaOk(cudaMemcpyAsync(slots->region[r], state[r].data, state[r].bytes,
                                   cudaMemcpyDeviceToHost, train),
                   "sync copy"));
      }
      return CudaOk(cudaStreamSynchronize(train), "stream synchronize");
    }));
  }
  if (mode == "host") {
    // A host thread with plain cudaMemcpy: legacy default stream, which the
    // (blocking) training stream synchronises with.
    return std::unique_ptr<Snapshotter>(new ThreadSnapshotter([=] {
      for (size_t r = 0; r < state.size(); ++r) {
        MEMENTO_RETURN_IF_ERROR(CudaOk(
            cudaMemcpy(slots->region[r], state[r].data, state[r].bytes, cudaMemcpyDeviceToHost),
            "host copy"));
      }
      return Status::Ok();
    }));
  }
  if (mode == "host_device") {
    return std::unique_ptr<Snapshotter>(new SideStreamSnapshotter(state, slots, g, piece_bytes));
  }
  if (mode == "has") {
    has::HasRunnerOptions ro;
    ro.has = has_options;
    ro.threads = threads;  // chunks in flight on the engine's low-priority streams
    ro.has.compute_burst_bytes = threads * a_chunk_bytes;
    cuda::CudaCopyEngine* engine = g->engine.get();
    MEMENTO_ASSIGN_OR_RETURN(
        auto runner, has::HasRunner::Create(ro, [=](size_t i) -> Status {
          const Chunk& c = (*chunks)[i];
          MEMENTO_ASSIGN_OR_RETURN(
              uint64_t t,
              engine->SubmitD2H(slots->region[c.region] + c.offset,
                                static_cast<const uint8_t*>(state[c.region].data) + c.offset,
                                c.bytes));
          return engine->Wait(t);
        }));
    std::vector<uint64_t> sizes;
    for (const Chunk& c : *chunks) sizes.push_back(c.bytes);
    return std::unique_ptr<Snapshotter>(new HasSnapshotter(std::move(runner), sizes));
  }
  return Status(StatusCode::kInvalidArgument, "unknown mode '" + mode + "'");
}

Result<json> GpuCopyThroughput(const std::vector<StateRegion>& state, Slots* slots, GpuContext* g) {
  uint64_t bytes = 0;
  for (const auto& r : state) bytes += r.bytes;
  std::vector<double> plain, engine;
  for (int i = 0; i < 3; ++i) {
    MEMENTO_RETURN_IF_ERROR(CudaOk(cudaDeviceSynchronize(), "synchronize"));
    Stopwatch sw;
    for (size_t r = 0; r < state.size(); ++r) {
      MEMENTO_RETURN_IF_ERROR(CudaOk(
          cudaMemcpy(slots->region[r], state[r].data, state[r].bytes, cudaMemcpyDeviceToHost),
          "plain copy"));
    }
    plain.push_back(sw.Seconds());
    sw.Reset();
    for (size_t r = 0; r < state.size(); ++r) {
      MEMENTO_RETURN_IF_ERROR(g->engine->CopyD2H(slots->region[r], state[r].data, state[r].bytes));
    }
    engine.push_back(sw.Seconds());
  }
  // Restore path (H2D) and device XOR parity of 4 equal parts of region 0.
  std::vector<double> h2d, parity;
  const size_t part = state[0].bytes / 4 / 16 * 16;
  const void* srcs[4];
  for (int j = 0; j < 4; ++j) srcs[j] = static_cast<const uint8_t*>(state[0].data) + j * part;
  for (int i = 0; i < 3; ++i) {
    Stopwatch sw;
    MEMENTO_RETURN_IF_ERROR(g->engine->CopyH2D(state[0].data, slots->region[0], state[0].bytes));
    h2d.push_back(sw.Seconds());
    sw.Reset();
    MEMENTO_RETURN_IF_ERROR(g->engine->XorParityD2H(srcs, 4, part, slots->region[0]));
    parity.push_back(sw.Seconds());
  }
  const double p = bytes / Median(plain) / 1e9, e = bytes / Median(engine) / 1e9;
  return json{{"bytes", bytes},
              {"plain_cudamemcpy_d2h_gbps", p},
              {"engine_d2h_gbps", e},
              {"ratio", e / p},
              {"engine_h2d_gbps", state[0].bytes / Median(h2d) / 1e9},
              {"xor_parity_k4_input_gbps", 4.0 * part / Median(parity) / 1e9},
              {"xor_parity_pcie_bytes_fraction", 0.25}};
}
#endif  // MEMENTO_HAVE_CUDA

Status RunBench(const BenchArgs& a) {
  if (a.steps < 1 || a.rounds < 1 || a.warmup < 0 || a.stages < 1 || a.stage < 0 ||
      a.stage >= a.stages || a.microbatches < 1 || a.chunk_kib < 64) {
    return Status(StatusCode::kInvalidArgument,
                  "bench has: need steps, rounds, stages, microbatches >= 1, 0 <= stage < "
                  "stages and chunk_kib >= 64");
  }
  const std::vector<std::string> modes = SplitCommas(a.modes);
  if (modes.empty() || std::find(modes.begin(), modes.end(), "off") == modes.end()) {
    return Status(StatusCode::kInvalidArgument, "bench has: --modes must include 'off'");
  }
  bool use_gpu = false;
#if MEMENTO_HAVE_CUDA
  const int devices = cuda::DeviceCount();
  if (a.device == "gpu" && devices == 0) {
    return Status(StatusCode::kUnavailable, "bench has: --device gpu but no CUDA device");
  }
  use_gpu = a.device != "cpu" && devices > 0;
#else
  if (a.device == "gpu") {
    return Status(StatusCode::kUnavailable, "bench has: built without CUDA");
  }
#endif

  std::unique_ptr<TrainingLoop> loop;
#if MEMENTO_HAVE_CUDA
  cuda::GpuTrainingLoop* gpu_loop = nullptr;
  GpuContext gctx;
#endif
  if (use_gpu) {
#if MEMENTO_HAVE_CUDA
    cuda::GpuLoopOptions o;
    if (a.state_mib > 0) o.state_bytes = static_cast<size_t>(a.state_mib) * kMiB;
    if (a.hidden > 0) o.hidden = a.hidden;
    if (a.layers > 0) o.layers = a.layers;
    if (a.comm_mib >= 0) o.comm_bytes = static_cast<size_t>(a.comm_mib) * kMiB;
    MEMENTO_ASSIGN_OR_RETURN(auto l, cuda::MakeGpuLoop(o));
    gpu_loop = l.get();
    loop = std::move(l);
#endif
  } else {
    has::CpuLoopOptions o;
    if (a.state_mib > 0) o.state_bytes = static_cast<size_t>(a.state_mib) * kMiB;
    if (a.hidden > 0) o.hidden = a.hidden;
    if (a.layers > 0) o.layers = a.layers;
    if (a.comm_mib >= 0) o.comm_bytes = static_cast<size_t>(a.comm_mib) * kMiB;
    MEMENTO_ASSIGN_OR_RETURN(loop, has::MakeCpuLoop(o));
  }

  const std::vector<StateRegion> state = loop->State();
  uint64_t state_bytes = 0;
  for (const auto& r : state) state_bytes += r.bytes;
  Slots slots;
  for (const auto& r : state) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, (r.bytes + 4095) / 4096 * 4096));
    if (p == nullptr) return Status(StatusCode::kResourceExhausted, "bench has: slot allocation");
    std::memset(p, 0, r.bytes);  // pre-fault, like the agent's slots
    slots.region.push_back(p);
  }
  const std::vector<Chunk> chunks = ChunkState(state, a.chunk_kib * 1024);

  json copy;
#if MEMENTO_HAVE_CUDA
  if (use_gpu) {
    for (size_t r = 0; r < state.size(); ++r) {
      MEMENTO_ASSIGN_OR_RETURN(auto pin,
                               cuda::PinnedRegion::Register(slots.region[r], state[r].bytes));
      gctx.pins.push_back(std::move(pin));
    }
    cuda::CudaCopyOptions co;
    co.chunk_bytes = a.chunk_kib * 1024;
    MEMENTO_ASSIGN_OR_RETURN(gctx.engine, cuda::CudaCopyEngine::Create(co));
    MEMENTO_RETURN_IF_ERROR(
        CudaOk(cudaStreamCreateWithFlags(&gctx.side, cudaStreamNonBlocking), "side stream"));
    MEMENTO_RETURN_IF_ERROR(CudaOk(
        cudaEventCreateWithFlags(&gctx.side_done, cudaEventDisableTiming | cudaEventBlockingSync),
        "event"));
    MEMENTO_ASSIGN_OR_RETURN(copy, GpuCopyThroughput(state, &slots, &gctx));
  }
#endif
  if (!use_gpu) copy = CpuCopyThroughput(state, &slots);

  has::PipelineShape shape{a.stages, a.stage, a.microbatches};
  const has::BubblePlan plan = has::Calibrate(loop.get(), shape);
  has::HasOptions has_options;
  has_options.initial_bandwidth = 1e9;
  if (!a.online_bubbles) has_options.schedule = has::ScheduleOf(shape, plan);

  // Modes live for the whole run (HAS keeps its estimates across rounds).
  std::map<std::string, std::unique_ptr<Snapshotter>> snaps;
  for (const std::string& m : modes) {
    Result<std::unique_ptr<Snapshotter>> s = Status(StatusCode::kInternal, "unset");
#if MEMENTO_HAVE_CUDA
    if (use_gpu) {
      s = MakeGpuMode(m, gpu_loop, &chunks, &slots, &gctx, has_options, a.chunk_kib * 1024,
                      a.has_threads > 0 ? a.has_threads : 2,
                      static_cast<uint64_t>(std::max<int64_t>(0, a.tensor_mib)) * kMiB);
    }
#endif
    if (!use_gpu) {
      s = MakeCpuMode(m, loop.get(), &chunks, &slots, has_options,
                      a.has_threads > 0 ? a.has_threads : 1);
    }
    if (!s.ok()) return s.status();
    snaps[m] = std::move(*s);
  }

  std::map<std::string, ModeResult> results;
  int64_t step_counter = 0;
  for (int round = 0; round < a.rounds; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const std::string& m = modes[(k + round) % modes.size()];
      MEMENTO_RETURN_IF_ERROR(RunSegment(loop.get(), shape, plan, snaps[m].get(), a.warmup, a.steps,
                                         &step_counter, &results[m]));
    }
  }

  const double off = Median(results["off"].step_s);
  json out;
  out["bench"] = "has";
  out["device"] = use_gpu ? "gpu" : "cpu";
  out["loop"] = {{"describe", loop->Describe()},
                 {"state_bytes", state_bytes},
                 {"chunk_bytes", a.chunk_kib * 1024},
                 {"stages", shape.stages},
                 {"stage", shape.stage},
                 {"microbatches", shape.microbatches},
                 {"fwd_s", plan.fwd_s},
                 {"bwd_s", plan.bwd_s},
                 {"bubble_s", plan.start_s + plan.end_s + plan.gap_s * (shape.microbatches - 1)},
                 {"bubbles", a.online_bubbles ? "online (phase hooks)" : "1F1B schedule (REFT)"},
                 {"steps_per_mode", a.steps * a.rounds},
                 {"has_threads", a.has_threads > 0 ? a.has_threads : (use_gpu ? 2 : 1)},
                 {"host_device_tensor_mib", a.tensor_mib},
                 {"rounds", a.rounds}};
  json jm = json::object();
  for (const std::string& m : modes) {
    const ModeResult& r = results[m];
    const double med = Median(r.step_s);
    jm[m] = {{"step_s", med},
             {"step_s_mean", Mean(r.step_s)},
             {"overhead_pct", off > 0 ? (med / off - 1) * 100 : 0},
             {"fence_wait_s", Mean(r.fence_s)},
             {"steps", r.step_s.size()}};
  }
  out["modes"] = jm;
  if (snaps.count("has")) {
    const auto& t = static_cast<HasSnapshotter*>(snaps["has"].get())->tally;
    const double n = std::max<double>(1, t.snapshots);
    out["has"] = {{"snapshots", t.snapshots},
                  {"bytes_idle_per_step", t.bytes_idle / n},
                  {"bytes_compute_per_step", t.bytes_compute / n},
                  {"bytes_communicate_per_step", t.bytes_communicate / n},
                  {"bytes_fence_per_step", t.bytes_fence / n},
                  {"demoted_bytes_per_step", t.demoted / n},
                  {"plan_reasons", t.plan_reasons},
                  {"last",
                   {{"bandwidth_estimate_gbps", t.last.bandwidth / 1e9},
                    {"planned_bubble_bytes", t.last.planned_bubble_bytes},
                    {"planned_compute_bytes", t.last.planned_compute_bytes},
                    {"t_ss_s", t.last.t_ss_s},
                    {"t_bubble_s", t.last.t_bubble_s},
                    {"compute_rate_gbps", t.last.compute_rate / 1e9},
                    {"bytes_idle", t.last.bytes_idle},
                    {"bytes_compute", t.last.bytes_compute},
                    {"bytes_fence", t.last.bytes_fence},
                    {"fence_wait_s", t.last.fence_wait_s},
                    {"window_s", t.last.window_s},
                    {"idle_s", t.last.idle_s}}}};
    if (results.count("host_device")) {
      out["has_vs_host_device_pct"] =
          jm["has"]["overhead_pct"].get<double>() - jm["host_device"]["overhead_pct"].get<double>();
    }
  }
  out["copy"] = copy;
  out["notes"] = use_gpu ? "gpu modes copy without checksums; has uses CudaCopyEngine "
                           "(low-priority streams, has_threads chunks in flight)"
                         : "cpu: no device, so host and host_device differ only in chunking "
                           "(whole regions vs chunks); every mode uses CopyAndChecksum";
  std::printf("%s\n", a.json ? out.dump().c_str() : out.dump(2).c_str());
  return Status::Ok();
}

void Setup(CLI::App& app, CommandContext& ctx) {
  auto* args = new BenchArgs();  // lives as long as the process
  auto* cmd = app.add_subcommand("has", "HAS snapshot overhead against REFT's baselines");
  cmd->add_flag("--json", args->json, "Print compact JSON");
  cmd->add_option("--device", args->device, "auto | cpu | gpu");
  cmd->add_option("--steps", args->steps, "Measured steps per mode and round");
  cmd->add_option("--warmup", args->warmup, "Unmeasured steps per mode and round");
  cmd->add_option("--rounds", args->rounds, "Rounds (modes alternate in each)");
  cmd->add_option("--stages", args->stages, "Pipeline stages |P|");
  cmd->add_option("--stage", args->stage, "This stage p");
  cmd->add_option("--microbatches", args->microbatches, "Micro-batches m");
  cmd->add_option("--state-mib", args->state_mib, "State size (MiB)")
      ->transform(ByteSize(uint64_t{1} << 20));
  cmd->add_option("--hidden", args->hidden, "Matrix size of a layer");
  cmd->add_option("--layers", args->layers, "Layers per forward");
  cmd->add_option("--comm-mib", args->comm_mib, "Bytes sent per pass to the next stage (MiB)")
      ->transform(ByteSize(uint64_t{1} << 20));
  cmd->add_option("--chunk-kib", args->chunk_kib, "Copy chunk (KiB)")
      ->transform(ByteSize(uint64_t{1} << 10));
  cmd->add_option("--has-threads", args->has_threads,
                  "HasRunner workers = chunks in flight (default 1 on CPU, 2 on GPU)");
  cmd->add_option("--tensor-mib", args->tensor_mib,
                  "GPU host_device: one async copy per this many MiB (0: one per region)")
      ->transform(ByteSize(uint64_t{1} << 20));
  cmd->add_flag("--online-bubbles", args->online_bubbles,
                "Do not tell HAS the 1F1B schedule; measure bubbles from phase hooks");
  cmd->add_option("--modes", args->modes, "Comma-separated modes (must include off)");
  cmd->add_option("--loop", args->loop,
                  "auto | trainer | blas: the training loop (auto: trainer on the CPU, blas on "
                  "a GPU)");
  HasTrainerBenchArgs* t = &args->trainer;
  cmd->add_option("--trainer", t->trainer, "trainer loop: memento-trainer binary");
  cmd->add_option("--preset", t->preset, "trainer loop: model preset")->capture_default_str();
  cmd->add_option("--d-model", t->d_model, "trainer loop: override the preset's width");
  cmd->add_option("--model-layers", t->layers, "trainer loop: override the preset's layers");
  cmd->add_option("--seq", t->seq, "trainer loop: override the preset's context length");
  cmd->add_option("--pp", t->pp, "trainer loop: pipeline stages")->capture_default_str();
  cmd->add_option("--dp", t->dp, "trainer loop: data-parallel size")->capture_default_str();
  cmd->add_option("--micro-batches", t->micro_batches, "trainer loop: micro-batches per step")
      ->capture_default_str();
  cmd->add_option("--batch", t->batch,
                  "trainer loop: global batch (0: one sequence per micro-batch)");
  cmd->add_option("--trainer-steps", t->steps, "trainer loop: optimizer steps per run")
      ->capture_default_str();
  cmd->add_option("--ranks-per-node", t->ranks_per_node,
                  "trainer loop: ranks per node (0: all on one node, one agent)");
  cmd->add_option("--run-timeout", t->run_timeout_s, "trainer loop: seconds one run may take");
  cmd->add_flag("--keep", t->keep, "trainer loop: keep the run directories under /dev/shm");
  cmd->callback([args, cmd, &ctx] {
    bool trainer_loop = args->loop == "trainer";
    if (args->loop == "auto") {
      bool gpu = false;
#if MEMENTO_HAVE_CUDA
      gpu = args->device != "cpu" && cuda::DeviceCount() > 0;
#endif
      trainer_loop = !gpu && args->device != "gpu";
    } else if (args->loop != "blas" && args->loop != "trainer") {
      ctx.exit_code = ReportStatus(
          InvalidArgumentError("--loop '" + args->loop + "' is not one of: auto, trainer, blas"));
      return;
    }
    if (!trainer_loop) {
      ctx.exit_code = ReportStatus(RunBench(*args));
      return;
    }
    if (args->device == "gpu") {
      ctx.exit_code = ReportStatus(InvalidArgumentError(
          "--loop trainer runs the reference trainer on the CPU; use --loop blas with a GPU"));
      return;
    }
    HasTrainerBenchArgs t = args->trainer;
    if (cmd->count("--preset") == 0) {
      // The default workload: the small preset widened so that the state
      // (about 45 MB per rank) takes a copy of the order of the bubbles.
      if (t.d_model == 0) t.d_model = 384;
      if (t.seq == 0) t.seq = 32;
    }
    t.json = args->json;
    t.modes = args->modes;
    if (cmd->count("--rounds") > 0) t.rounds = args->rounds;
    if (cmd->count("--microbatches") > 0) t.micro_batches = args->microbatches;
    if (cmd->count("--chunk-kib") > 0) t.chunk_kib = args->chunk_kib;
    ctx.exit_code = ReportStatus(RunHasTrainerBench(t));
  });
}

}  // namespace
}  // namespace memento::tools

MEMENTO_REGISTER_BENCH(has, memento::tools::Setup);
