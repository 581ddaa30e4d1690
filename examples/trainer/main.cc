// memento-trainer: the reference hybrid-parallel GPT trainer (docs/trainer.md).
//
//   memento-trainer --preset tiny --steps 50                     # one process
//   memento-trainer --launch --dp 2 --pp 2 --micro-batches 4     # 4 local ranks
//   memento-trainer --dp 2 --rank 1 --rendezvous /tmp/rdv ...    # one rank of a job
//
// The flags: trainer_cli.h; one rank's run: rank_run.h; --launch:
// local_launch.h.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <utility>

#include "local_launch.h"
#include "rank_run.h"
#include "trainer_cli.h"

namespace memento::trainer {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"memento-trainer: reference hybrid-parallel GPT trainer"};
  TrainerCli cli;
  DefineFlags(&app, &cli);
  CLI11_PARSE(app, argc, argv);
  // The process environment is read here, at the tool's edge, only.
  if (!CompleteFlags(
          app, [](const char* n) -> const char* { return std::getenv(n); }, &cli)) {
    return 2;
  }
  if (cli.launch) {
    return LaunchLocal(argc, argv, cli.options.comm.topology.world(),
                       cli.options.comm.rendezvous_dir, cli.recovery, cli.max_recoveries);
  }
  return RankRun(std::move(cli)).Run();
}

}  // namespace
}  // namespace memento::trainer

int main(int argc, char** argv) { return memento::trainer::Main(argc, argv); }
