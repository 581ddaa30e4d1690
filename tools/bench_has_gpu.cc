// `memento bench has` on a GPU (tools/bench_has.h): the cuBLAS loop, copies
// through CudaCopyEngine. Built only with CUDA (tools/CMakeLists.txt); it
// registers itself as HasBenchGpuBackend().
#include <cuda_runtime.h>

#include <algorithm>

#include "common/clock.h"
#include "snap/cuda/cuda_copy_engine.h"
#include "snap/cuda/gpu_bench_loop.h"
#include "tools/bench_has.h"
#include "tools/bench_stats.h"

namespace memento::tools {
namespace {

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
  SideStreamSnapshotter(std::vector<has::StateRegion> state, Slots* slots, GpuContext* g,
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
  std::vector<has::StateRegion> state_;
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
  const std::vector<has::StateRegion> state = loop->State();
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

Result<nlohmann::json> GpuCopyThroughput(const std::vector<has::StateRegion>& state, Slots* slots,
                                         GpuContext* g) {
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
  return nlohmann::json{{"bytes", bytes},
                        {"plain_cudamemcpy_d2h_gbps", p},
                        {"engine_d2h_gbps", e},
                        {"ratio", e / p},
                        {"engine_h2d_gbps", state[0].bytes / Median(h2d) / 1e9},
                        {"xor_parity_k4_input_gbps", 4.0 * part / Median(parity) / 1e9},
                        {"xor_parity_pcie_bytes_fraction", 0.25}};
}

class GpuDevice : public HasBenchDevice {
 public:
  GpuDevice(std::unique_ptr<cuda::GpuTrainingLoop> loop, const HasBenchArgs& a)
      : loop_(std::move(loop)),
        chunk_bytes_(a.chunk_kib * 1024),
        threads_(a.has_threads > 0 ? a.has_threads : 2),
        piece_bytes_(static_cast<uint64_t>(std::max<int64_t>(0, a.tensor_mib)) * kHasBenchMiB) {}
  const char* name() const override { return "gpu"; }
  has::TrainingLoop* loop() override { return loop_.get(); }
  Result<nlohmann::json> PrepareSlots(const std::vector<has::StateRegion>& state,
                                      Slots* slots) override {
    for (size_t r = 0; r < state.size(); ++r) {
      MEMENTO_ASSIGN_OR_RETURN(auto pin,
                               cuda::PinnedRegion::Register(slots->region[r], state[r].bytes));
      ctx_.pins.push_back(std::move(pin));
    }
    cuda::CudaCopyOptions co;
    co.chunk_bytes = chunk_bytes_;
    MEMENTO_ASSIGN_OR_RETURN(ctx_.engine, cuda::CudaCopyEngine::Create(co));
    MEMENTO_RETURN_IF_ERROR(
        CudaOk(cudaStreamCreateWithFlags(&ctx_.side, cudaStreamNonBlocking), "side stream"));
    MEMENTO_RETURN_IF_ERROR(CudaOk(
        cudaEventCreateWithFlags(&ctx_.side_done, cudaEventDisableTiming | cudaEventBlockingSync),
        "event"));
    return GpuCopyThroughput(state, slots, &ctx_);
  }
  Result<std::unique_ptr<Snapshotter>> MakeMode(const std::string& mode,
                                                const std::vector<Chunk>* chunks, Slots* slots,
                                                const has::HasOptions& has_options) override {
    return MakeGpuMode(mode, loop_.get(), chunks, slots, &ctx_, has_options, chunk_bytes_, threads_,
                       piece_bytes_);
  }
  int has_threads() const override { return threads_; }
  const char* notes() const override {
    return "gpu modes copy without checksums; has uses CudaCopyEngine "
           "(low-priority streams, has_threads chunks in flight)";
  }

 private:
  std::unique_ptr<cuda::GpuTrainingLoop> loop_;  // declared first: destroyed after ctx_
  GpuContext ctx_;
  uint64_t chunk_bytes_;
  int threads_;
  uint64_t piece_bytes_;
};

Result<std::unique_ptr<HasBenchDevice>> MakeGpuDevice(const HasBenchArgs& a) {
  cuda::GpuLoopOptions o;
  if (a.state_mib > 0) o.state_bytes = static_cast<size_t>(a.state_mib) * kHasBenchMiB;
  if (a.hidden > 0) o.hidden = a.hidden;
  if (a.layers > 0) o.layers = a.layers;
  if (a.comm_mib >= 0) o.comm_bytes = static_cast<size_t>(a.comm_mib) * kHasBenchMiB;
  MEMENTO_ASSIGN_OR_RETURN(auto loop, cuda::MakeGpuLoop(o));
  return std::unique_ptr<HasBenchDevice>(new GpuDevice(std::move(loop), a));
}

const HasBenchGpu kGpu{[] { return cuda::DeviceCount(); }, MakeGpuDevice};
const bool kGpuRegistered = [] {
  HasBenchGpuBackend() = &kGpu;
  return true;
}();

}  // namespace
}  // namespace memento::tools
