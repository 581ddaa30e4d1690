#include "snap/has/bench_loop.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/clock.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace memento::has {
namespace {

void Sleep(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

class CpuLoop : public TrainingLoop {
 public:
  explicit CpuLoop(const CpuLoopOptions& o) : o_(o) {
    const size_t n = static_cast<size_t>(o.hidden) * o.hidden;
    a_.assign(n, 0.5f);
    w_.assign(n, 0.001f);
    c_.assign(n, 0.f);
    act_.assign(o.activation_bytes / sizeof(float), 1.f);
    send_.assign(o.comm_bytes, 0);
    state_ = static_cast<float*>(std::aligned_alloc(4096, RoundUp(o.state_bytes)));
    for (size_t i = 0; i < o.state_bytes / sizeof(float); ++i) state_[i] = 1.f;
  }
  ~CpuLoop() override { std::free(state_); }

  std::string Describe() const override {
    return "cpu: openblas sgemm " + std::to_string(o_.hidden) + "^3 x " +
           std::to_string(o_.layers) + " layers + " + std::to_string(o_.activation_bytes >> 20) +
           " MiB elementwise per layer";
  }
  bool on_device() const override { return false; }
  std::vector<StateRegion> State() const override { return {{state_, o_.state_bytes}}; }

  void OptimizerStep() override {
    const size_t n = o_.state_bytes / sizeof(float);
    for (size_t i = 0; i < n; ++i) state_[i] = state_[i] * 0.9999f + 1e-6f;
  }
  void Forward() override {
    for (int l = 0; l < o_.layers; ++l) Layer();
  }
  void Backward() override {
    for (int l = 0; l < 2 * o_.layers; ++l) Layer();
  }
  void Communicate() override {
    const size_t n = std::min(send_.size(), act_.size() * sizeof(float));
    std::memcpy(send_.data(), act_.data(), n);
  }

 private:
  static size_t RoundUp(size_t n) { return (n + 4095) / 4096 * 4096; }
  void Layer() {
    const int h = o_.hidden;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, h, h, h, 1.f, a_.data(), h, w_.data(), h,
                0.f, c_.data(), h);
    // Memory-bound part (activation function, norm): streams act_ once.
    const float s = c_[0] * 1e-9f;
    for (float& x : act_) x = x * 0.5f + s;
  }

  CpuLoopOptions o_;
  std::vector<float> a_, w_, c_, act_;
  std::vector<uint8_t> send_;
  float* state_ = nullptr;
};

}  // namespace

BubblePlan Calibrate(TrainingLoop* loop, const PipelineShape& shape) {
  std::vector<double> f, b;
  for (int i = 0; i < 5; ++i) {
    Stopwatch sw;
    loop->Forward();
    f.push_back(sw.Seconds());
    sw.Reset();
    loop->Backward();
    b.push_back(sw.Seconds());
  }
  BubblePlan plan;
  plan.fwd_s = Median(f);
  plan.bwd_s = Median(b);
  const int P = shape.stages, p = shape.stage, m = shape.microbatches;
  if (P <= 1) return plan;
  const double total = (P - 1) * (plan.fwd_s + plan.bwd_s);
  plan.start_s = p * plan.fwd_s;
  plan.end_s = (P - 1 - p) * plan.bwd_s;
  const double rest = std::max(0.0, total - plan.start_s - plan.end_s);
  plan.gap_s = m > 1 ? rest / (m - 1) : 0;
  if (m <= 1) plan.end_s += rest;
  return plan;
}

PipelineSchedule ScheduleOf(const PipelineShape& shape, const BubblePlan& plan) {
  PipelineSchedule s;
  s.num_stages = shape.stages;
  s.stage = shape.stage;
  s.num_microbatches = shape.microbatches;
  s.fwd_s = plan.fwd_s;
  s.bwd_s = plan.bwd_s;
  return s;
}

void RunPipelineStep(TrainingLoop* loop, const PipelineShape& shape, const BubblePlan& plan,
                     const std::function<void(Phase)>& hook) {
  auto phase = [&](Phase ph) {
    if (hook) hook(ph);
  };
  auto idle = [&](double s) {
    if (s <= 0) return;
    phase(Phase::kIdle);
    Sleep(s);
  };
  idle(plan.start_s);
  for (int mb = 0; mb < shape.microbatches; ++mb) {
    if (mb > 0) idle(plan.gap_s);
    phase(Phase::kCompute);
    loop->Forward();
    phase(Phase::kCommunicate);
    loop->Communicate();
    phase(Phase::kCompute);
    loop->Backward();
    phase(Phase::kCommunicate);
    loop->Communicate();
  }
  idle(plan.end_s);
  phase(Phase::kCompute);  // the optimizer step follows
}

Result<std::unique_ptr<TrainingLoop>> MakeCpuLoop(const CpuLoopOptions& options) {
  if (options.hidden < 1 || options.layers < 1 || options.state_bytes < sizeof(float) ||
      options.activation_bytes < sizeof(float)) {
    return Status(StatusCode::kInvalidArgument,
                  "cpu loop: hidden, layers, state and activation sizes must be positive");
  }
  openblas_set_num_threads(1);  // the trainer has one core; copies get the other
  return std::unique_ptr<TrainingLoop>(new CpuLoop(options));
}

}  // namespace memento::has
