// The simulated 1F1B step of the benchmark loop: phase order and bubble plan.
#include "snap/has/bench_loop.h"

#include <gtest/gtest.h>

#include <vector>

namespace memento::has {
namespace {

class CountingLoop : public TrainingLoop {
 public:
  std::string Describe() const override { return "counting"; }
  bool on_device() const override { return false; }
  std::vector<StateRegion> State() const override { return {}; }
  void OptimizerStep() override {}
  void Forward() override { ++forwards; }
  void Backward() override { ++backwards; }
  void Communicate() override { ++sends; }
  int forwards = 0, backwards = 0, sends = 0;
};

TEST(BenchLoopTest, PipelineStepPhases) {
  CountingLoop loop;
  PipelineShape shape{4, 1, 3};
  BubblePlan plan;
  plan.start_s = 1e-4;
  plan.gap_s = 1e-4;
  plan.end_s = 1e-4;
  std::vector<Phase> phases;
  RunPipelineStep(&loop, shape, plan, [&](Phase p) { phases.push_back(p); });
  EXPECT_EQ(loop.forwards, 3);
  EXPECT_EQ(loop.backwards, 3);
  EXPECT_EQ(loop.sends, 6);
  const Phase I = Phase::kIdle, C = Phase::kCompute, M = Phase::kCommunicate;
  const std::vector<Phase> want = {I, C, M, C, M, I, C, M, C, M, I, C, M, C, M, I, C};
  EXPECT_EQ(phases, want);
}

TEST(BenchLoopTest, CalibrateSpreadsTheOneF1BBubble) {
  CountingLoop loop;
  for (int p = 0; p < 4; ++p) {
    PipelineShape shape{4, p, 8};
    BubblePlan plan = Calibrate(&loop, shape);
    const double total = plan.start_s + plan.end_s + plan.gap_s * (shape.microbatches - 1);
    EXPECT_NEAR(total, 3 * (plan.fwd_s + plan.bwd_s), 1e-9) << p;
    EXPECT_NEAR(plan.start_s, p * plan.fwd_s, 1e-12);
    PipelineSchedule s = ScheduleOf(shape, plan);
    EXPECT_EQ(s.num_stages, 4);
    EXPECT_EQ(s.stage, p);
    EXPECT_EQ(s.num_microbatches, 8);
  }
}

TEST(BenchLoopTest, CpuLoopRejectsBadSizes) {
  CpuLoopOptions o;
  o.hidden = 0;
  EXPECT_EQ(MakeCpuLoop(o).status().code(), StatusCode::kInvalidArgument);
  o = CpuLoopOptions{};
  o.hidden = 16;
  o.state_bytes = 1 << 20;
  o.activation_bytes = 1 << 16;
  o.comm_bytes = 1 << 16;
  auto loop = MakeCpuLoop(o);
  ASSERT_TRUE(loop.ok());
  auto state = (*loop)->State();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].bytes, size_t{1} << 20);
  const float before = static_cast<float*>(state[0].data)[0];
  (*loop)->OptimizerStep();
  EXPECT_NE(static_cast<float*>(state[0].data)[0], before);  // the step mutates state
}

}  // namespace
}  // namespace memento::has
