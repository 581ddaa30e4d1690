// The GPU training-like loop of `memento bench has`: cuBLAS bf16 matrix
// products and a memory-bound saxpy per layer on the training stream, and an
// optimizer step (sscal) over the fp32 state in device memory. Each forward or
// backward synchronises its stream at the end, as a pipeline stage does when
// it waits for its neighbour, so the host knows when the device is idle.
#pragma once

#include <cstddef>
#include <memory>

#include "memento/status.h"
#include "snap/has/bench_loop.h"

namespace memento::cuda {

struct GpuLoopOptions {
  int device = 0;
  int hidden = 4096;
  int layers = 8;
  size_t activation_bytes = size_t{256} << 20;
  size_t state_bytes = size_t{4} << 30;
  // Per pass, through pinned host buffers on the training stream (D2H then
  // H2D): PCIe traffic standing for the send to / receive from the next
  // stage. 0: none.
  size_t comm_bytes = size_t{32} << 20;
};

class GpuTrainingLoop : public has::TrainingLoop {
 public:
  // The training stream (a cudaStream_t).
  virtual void* stream() const = 0;
};

// Unavailable without a device; Internal for CUDA / cuBLAS failures.
Result<std::unique_ptr<GpuTrainingLoop>> MakeGpuLoop(const GpuLoopOptions& options);

}  // namespace memento::cuda
