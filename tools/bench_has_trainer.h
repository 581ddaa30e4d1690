// `memento bench has --loop trainer`: the HAS benchmark on the reference
// trainer (examples/trainer, run as a subprocess: tools/ does not link
// examples/). See bench_has_trainer.cc and docs/has.md.
#pragma once

#include <cstdint>
#include <string>

#include "memento/status.h"

namespace memento::tools {

struct HasTrainerBenchArgs {
  bool json = false;
  std::string trainer;  // memento-trainer binary; empty: found next to memento
  std::string modes = "off,sync,host,host_device,has";
  std::string preset = "small";
  int d_model = 0, layers = 0, seq = 0;  // preset overrides (0: the preset's)
  int pp = 2, dp = 1;
  int micro_batches = 8;
  int batch = 0;             // global batch; 0: micro_batches * dp (one sequence per micro-batch)
  int steps = 12;            // optimizer steps per run (the trainer does not time the first)
  int rounds = 2;            // each round runs every mode once, in rotated order
  uint64_t chunk_kib = 256;  // copy chunk of host_device and has
  int ranks_per_node = 0;    // 0: all ranks on one node (one agent)
  double run_timeout_s = 600;
  bool keep = false;
};

// Runs the benchmark and prints one JSON object on stdout: {"modes": {"off":
// {"step_s", "overhead_pct", ...}, ...}, "has": {bytes per layer}, ...}.
Status RunHasTrainerBench(const HasTrainerBenchArgs& args);

}  // namespace memento::tools
