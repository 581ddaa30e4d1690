// A training-like loop for `memento bench has`: one stage of a simulated 1F1B
// pipeline. Computation is real (matrix products and memory-bound passes);
// the waits for the neighbouring stages (pipeline bubbles) are sleeps with the
// lengths the 1F1B schedule gives, and are reported as idle phases.
//
// The reference trainer (examples/trainer) replaces this loop once it exists;
// until then this is the workload the HAS comparisons run on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"
#include "snap/has/has_scheduler.h"

namespace memento::has {

// One region of training state (host or device memory, see the loop).
struct StateRegion {
  void* data = nullptr;
  size_t bytes = 0;
};

class TrainingLoop {
 public:
  virtual ~TrainingLoop() = default;
  virtual std::string Describe() const = 0;
  virtual bool on_device() const = 0;
  // The state a snapshot copies (stays at the same address).
  virtual std::vector<StateRegion> State() const = 0;
  // Mutates the state (the optimizer step). REQUIRES: the snapshot is fenced.
  virtual void OptimizerStep() = 0;
  // One micro-batch's forward / backward; returns when the work is done.
  virtual void Forward() = 0;
  virtual void Backward() = 0;
  // Sends the micro-batch's activations (after a forward) or gradients
  // (after a backward) to the neighbouring stage; returns when done.
  virtual void Communicate() {}
};

struct PipelineShape {
  int stages = 4;        // |P|
  int stage = 1;         // p
  int microbatches = 8;  // m
};

// Idle windows of one step of stage p (1F1B): p*fwd before the first
// forward (warm-up), (|P|-1-p)*bwd after the last backward (cool-down), and
// the rest of the (|P|-1)(fwd+bwd) bubble spread over the gaps between
// micro-batches.
struct BubblePlan {
  double start_s = 0;
  double gap_s = 0;
  double end_s = 0;
  double fwd_s = 0;  // measured
  double bwd_s = 0;
};

// Times a few forward/backward passes and derives the bubble plan.
BubblePlan Calibrate(TrainingLoop* loop, const PipelineShape& shape);

// The schedule HAS is told when the pipeline is "known".
PipelineSchedule ScheduleOf(const PipelineShape& shape, const BubblePlan& plan);

// Runs one step's forwards and backwards with the plan's idle windows and a
// Communicate() after each pass, reporting each phase change to `hook` (may
// be empty).
void RunPipelineStep(TrainingLoop* loop, const PipelineShape& shape, const BubblePlan& plan,
                     const std::function<void(Phase)>& hook);

struct CpuLoopOptions {
  int hidden = 384;                            // square sgemm size
  int layers = 4;                              // sgemms per forward (backward: twice as many)
  size_t activation_bytes = size_t{16} << 20;  // memory-bound pass per layer
  size_t state_bytes = size_t{256} << 20;      // parameters + optimizer state
  size_t comm_bytes = size_t{8} << 20;         // sent per pass (memcpy); 0: none
};

// The CPU loop: OpenBLAS sgemm (one thread) plus a memory-bound elementwise
// pass per layer, a memcpy of comm_bytes per pass standing for the send to
// the next stage, and an optimizer step that reads and writes all state.
Result<std::unique_ptr<TrainingLoop>> MakeCpuLoop(const CpuLoopOptions& options);

}  // namespace memento::has
