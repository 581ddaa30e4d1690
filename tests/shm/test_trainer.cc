// A small trainer process for the crash tests: deterministic state of a given
// size (toy::AdamState: three tensors and a blob), mutated in full every
// step, snapshotted through memento after every step. Writes its progress
// lines to --progress (src/toy/progress.h: R, S, C, K, D, E, X; a fresh
// start is "R 0 <digest>").
// --no-memento runs the same training without snapshots (the reference).
// --schedule has: snapshots are scheduled by HAS; the trainer reports the
// digest computation as compute and the rest of the step as idle.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "common/log.h"
#include "fmt/format.h"
#include "memento/client.h"
#include "toy/toy_run.h"

int main(int argc, char** argv) {
  CLI::App app{"memento crash-test trainer"};
  std::string job, dir, progress;
  int rank = 0, threads = 1;
  size_t bytes = 64 << 20;
  bool no_memento = false;
  std::string schedule = "eager";
  uint64_t param_seed = 0;
  memento::toy::StepLoopOptions loop;
  loop.steps = 20;
  loop.report_phases = true;
  app.add_option("--job", job)->required();
  app.add_option("--dir", dir);
  app.add_option("--rank", rank);
  app.add_option("--bytes", bytes);
  app.add_option("--steps", loop.steps);
  app.add_option("--threads", threads);
  app.add_option("--progress", progress)->required();
  app.add_option("--step-sleep", loop.step_sleep_s);
  app.add_option("--param-seed", param_seed,
                 "Initial parameters from this seed (0: the default; ranks with different seeds "
                 "stand for different pipeline stages registering `params`)");
  app.add_flag("--no-memento", no_memento);
  app.add_option("--schedule", schedule);
  CLI11_PARSE(app, argc, argv);
  memento::InitLogging("trainer rank" + std::to_string(rank));
  memento::toy::ApplyCopyDelayFromEnvironment();
  memento::toy::ProgressLog log("test_trainer");
  if (!log.Open(progress).ok()) return 2;

  memento::toy::AdamState state(bytes, param_seed);
  std::unique_ptr<memento::Client> client;
  if (no_memento) {
    log.Emit(fmt::format("D 0 {}", state.Digest()));
  } else {
    memento::ClientOptions o;
    o.job_id = job;
    o.rank = rank;
    o.world_size = rank + 1;
    o.agent_dir = dir;
    o.copy_threads = threads;
    o.connect_timeout_s = 20;
    auto parsed = memento::ParseSchedule(schedule);
    if (!parsed.ok()) log.Exit(parsed.status());
    o.schedule = *parsed;
    auto c = memento::Client::Connect(o);
    if (!c.ok()) log.Exit(c.status());
    client = std::move(*c);
    auto start = memento::toy::RegisterSealRestore(*client, state);
    if (!start.ok()) log.Exit(start.status());
    memento::toy::ReportStart(log, *start, state, memento::toy::FreshStart::kStepZero);
  }
  memento::Status st = memento::toy::RunSteps(client.get(), state, log, loop);
  if (!st.ok()) log.Exit(st);
  return 0;
}
