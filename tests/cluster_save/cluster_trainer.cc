// A trainer process for the cluster save tests: one rank of a DP job
// (toy::DpState: "params" replicated, "opt" this rank's ZeRO-1 shard, the
// "cursor" blob), in lock step with the other ranks like a data-parallel
// trainer whose gradient all-reduce makes every rank finish step s together
// (here: a file barrier in --barrier before each optimizer step). Progress
// lines on --progress: src/toy/progress.h (R, N, S, D, C, K, E, X).
// --pace-commits: after each snapshot it wrote, wait until the agent's commit
// word says that step committed or was let go uncommitted, or another rank
// marked it skipped in --barrier (at most 30 s; src/toy/commit_pace.h), so
// that on a loaded machine the steps still become versions one after the
// other instead of being skipped.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "common/log.h"
#include "memento/client.h"
#include "toy/toy_run.h"

int main(int argc, char** argv) {
  CLI::App app{"memento cluster-test trainer"};
  std::string job, progress;
  size_t bytes = 1 << 20;
  memento::toy::StepLoopOptions loop;
  loop.steps = 10;
  loop.barrier_at = memento::toy::BarrierAt::kBeforeStep;
  app.add_option("--job", job)->required();
  app.add_option("--dir", loop.agent_dir)->required();
  app.add_option("--rank", loop.rank);
  app.add_option("--world", loop.world);
  app.add_option("--bytes", bytes);
  app.add_option("--steps", loop.steps);
  app.add_option("--step-sleep", loop.step_sleep_s);
  app.add_option("--progress", progress)->required();
  app.add_option("--barrier", loop.barrier_dir);
  app.add_flag("--pace-commits", loop.pace_commits);
  CLI11_PARSE(app, argc, argv);
  memento::InitLogging("trainer rank" + std::to_string(loop.rank));
  memento::toy::ApplyCopyDelayFromEnvironment();
  memento::toy::ProgressLog log("cluster_trainer");
  if (!log.Open(progress).ok()) return 2;

  memento::toy::DpState state(bytes, loop.rank, loop.world);
  memento::ClientOptions o;
  o.job_id = job;
  o.rank = loop.rank;
  o.world_size = loop.world;
  o.agent_dir = loop.agent_dir;
  o.chunk_bytes = 256 << 10;
  o.connect_timeout_s = 20;
  auto client = memento::Client::Connect(o);
  if (!client.ok()) log.Exit(client.status());
  auto start = memento::toy::RegisterSealRestore(**client, state);
  if (!start.ok()) log.Exit(start.status());
  memento::toy::ReportStart(log, *start, state, memento::toy::FreshStart::kNLine);
  memento::Status st = memento::toy::RunSteps(client->get(), state, log, loop);
  if (!st.ok()) log.Exit(st);
  return 0;
}
