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
// The device-neutral part; tools/bench_has.h says where each device's is.
#include "tools/bench_has.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/byte_flag.h"
#include "common/clock.h"
#include "tools/bench_has_trainer.h"
#include "tools/bench_stats.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

using has::StateRegion;
using has::TrainingLoop;
using json = nlohmann::json;

std::vector<Chunk> ChunkState(const std::vector<StateRegion>& state, uint64_t chunk_bytes) {
  std::vector<Chunk> out;
  for (size_t r = 0; r < state.size(); ++r) {
    for (uint64_t off = 0; off < state[r].bytes; off += chunk_bytes) {
      out.push_back({r, off, std::min<uint64_t>(chunk_bytes, state[r].bytes - off)});
    }
  }
  return out;
}

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

Status RunBench(const HasBenchArgs& a) {
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
  std::unique_ptr<HasBenchDevice> device;
  const HasBenchGpu* gpu = HasBenchGpuBackend();
  if (gpu == nullptr) {
    if (a.device == "gpu") {
      return Status(StatusCode::kUnavailable, "bench has: built without CUDA");
    }
  } else {
    const int devices = gpu->device_count();
    if (a.device == "gpu" && devices == 0) {
      return Status(StatusCode::kUnavailable, "bench has: --device gpu but no CUDA device");
    }
    if (a.device != "cpu" && devices > 0) {
      MEMENTO_ASSIGN_OR_RETURN(device, gpu->make(a));
    }
  }
  if (device == nullptr) {
    MEMENTO_ASSIGN_OR_RETURN(device, MakeCpuHasBenchDevice(a));
  }
  TrainingLoop* loop = device->loop();

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

  MEMENTO_ASSIGN_OR_RETURN(json copy, device->PrepareSlots(state, &slots));

  has::PipelineShape shape{a.stages, a.stage, a.microbatches};
  const has::BubblePlan plan = has::Calibrate(loop, shape);
  has::HasOptions has_options;
  has_options.initial_bandwidth = 1e9;
  if (!a.online_bubbles) has_options.schedule = has::ScheduleOf(shape, plan);

  // Modes live for the whole run (HAS keeps its estimates across rounds).
  std::map<std::string, std::unique_ptr<Snapshotter>> snaps;
  for (const std::string& m : modes) {
    Result<std::unique_ptr<Snapshotter>> s = device->MakeMode(m, &chunks, &slots, has_options);
    if (!s.ok()) return s.status();
    snaps[m] = std::move(*s);
  }

  std::map<std::string, ModeResult> results;
  int64_t step_counter = 0;
  for (int round = 0; round < a.rounds; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const std::string& m = modes[(k + round) % modes.size()];
      MEMENTO_RETURN_IF_ERROR(RunSegment(loop, shape, plan, snaps[m].get(), a.warmup, a.steps,
                                         &step_counter, &results[m]));
    }
  }

  const double off = Median(results["off"].step_s);
  json out;
  out["bench"] = "has";
  out["device"] = device->name();
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
                 {"has_threads", device->has_threads()},
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
  out["notes"] = device->notes();
  memento::tools::PrintJson("memento.bench.has/1", std::move(out));
  return Status::Ok();
}

void Setup(CLI::App& app, CommandContext& ctx) {
  static auto* args =
      new HasBenchArgs();  // lives as long as the process (reachable: no leak report)
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
  cmd->callback([cmd, &ctx] {  // args: static storage, not captured
    bool trainer_loop = args->loop == "trainer";
    if (args->loop == "auto") {
      const HasBenchGpu* backend = HasBenchGpuBackend();
      const bool gpu = backend != nullptr && args->device != "cpu" && backend->device_count() > 0;
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

const HasBenchGpu*& HasBenchGpuBackend() {
  static const HasBenchGpu* backend = nullptr;
  return backend;
}

}  // namespace memento::tools

MEMENTO_REGISTER_BENCH(has, memento::tools::Setup);
