// `memento demo` (docs/demo.md; the parts in tools/demo.h):
//
//   memento demo                 the multi-node demo: `memento launch`'s
//                                Launcher runs memento-trainer (DP 2 x PP 2,
//                                ZeRO-1) on 4 simulated nodes with a trainer
//                                crash and a whole-node loss injected, then
//                                the same job without failures, and reports
//                                every recovery, the snapshot overhead, the
//                                bytes protected per node and whether the
//                                final parameters are bit-identical.
//   memento demo --single-node   the first slice on one node: an agent and a
//                                trainer that snapshots every step, SIGKILL
//                                in the middle of a snapshot, restart,
//                                restore, continue, bit-identical check. Its
//                                trainer is this same binary (`memento demo
//                                --trainer ...`).
#include <string>

#include "common/byte_flag.h"
#include "fmt/format.h"
#include "tools/command.h"
#include "tools/demo.h"

#if __has_include("launch/launcher.h")
#define MEMENTO_DEMO_HAVE_LAUNCH 1
#endif

namespace memento::tools {
namespace {

void Setup(CLI::App& app, CommandContext& ctx) {
  static DemoArgs args;
  auto* cmd = app.add_subcommand(
      "demo",
      "Run the end-to-end demo: 4 nodes, a trainer crash and a node loss, recovery, and a "
      "bit-identity check against a failure-free run (--single-node: the one-node demo)");
  cmd->add_flag("--single-node", args.single_node,
                "the one-node demo: snapshot, SIGKILL, restart, restore, continue");
  auto* steps =
      cmd->add_option("--steps", args.steps, "Training steps (default 300; --single-node: 20)");
  cmd->add_flag("--keep", args.keep, "Keep the working directory (logs, slots)");
  // multi-node
  cmd->add_option("--trainer-bin", args.trainer_bin,
                  "memento-trainer binary (default: the one next to this build)");
  cmd->add_option("--preset", args.preset, "memento-trainer model preset")->capture_default_str();
  cmd->add_option("--nodes", args.nodes, "nodes (one rank each; dp x pp)")->capture_default_str();
  cmd->add_option("--dp", args.dp, "data-parallel size")->capture_default_str();
  cmd->add_option("--pp", args.pp, "pipeline-parallel size")->capture_default_str();
  cmd->add_option("--policy", args.policy, "redundancy policy")->capture_default_str();
  cmd->add_flag("!--no-sharded", args.sharded,
                "every rank snapshots its whole state instead of its plan pieces (memento launch "
                "without --sharded; docs/reft.md)");
  cmd->add_option("--kill-rank", args.kill_rank, "the rank the trainer crash kills")
      ->capture_default_str();
  cmd->add_option("--kill-rank-at", args.kill_rank_at, "step of the trainer crash; 0: none")
      ->capture_default_str();
  cmd->add_option("--kill-node", args.kill_node, "the node that is lost")->capture_default_str();
  cmd->add_option("--kill-node-at", args.kill_node_at, "step of the node loss; 0: none")
      ->capture_default_str();
  cmd->add_option("--progress-every", args.progress_every, "a progress line every K steps")
      ->capture_default_str();
  cmd->add_option("--store", args.store_url,
                  "coordinate through this store instead of the launcher's embedded one, e.g. "
                  "etcd://HOST:PORT[,...] (a real etcd, docs/etcd.md); each run uses a new job "
                  "name there");
  // single-node
  cmd->add_option("--mib", args.mib, "--single-node: MiB of trainer state")
      ->transform(ByteSize(uint64_t{1} << 20))
      ->default_val(args.mib);
  cmd->add_option("--kill-after", args.kill_after,
                  "--single-node: kill once this step's snapshot is complete")
      ->default_val(args.kill_after);
  cmd->add_option("--threads", args.threads, "--single-node: copy engine threads")
      ->default_val(args.threads);
  cmd->add_flag("--trainer", args.trainer, "(internal) run as the demo's trainer")->group("");
  cmd->add_option("--root", args.root, "(internal)")->group("");
  cmd->add_option("--progress", args.progress, "(internal)")->group("");
  cmd->callback([&ctx, steps] {
    if (args.trainer) {
      ctx.exit_code = RunDemoTrainer(args);
    } else if (args.single_node) {
      ctx.exit_code = RunSingleNodeDemo(args);
    } else {
#ifdef MEMENTO_DEMO_HAVE_LAUNCH
      if (args.nodes != args.dp * args.pp) {
        ctx.exit_code = ReportStatus(InvalidArgumentError(
            fmt::format("--nodes {} but dp x pp = {}", args.nodes, args.dp * args.pp)));
        return;
      }
      ctx.exit_code = RunMultiNodeDemo(args, steps->count() > 0 ? args.steps : 300);
#else
      ctx.exit_code = ReportStatus(FailedPreconditionError(
          "the multi-node demo needs the launch layer (src/launch) in the build; "
          "`memento demo --single-node` runs the one-node demo"));
#endif
    }
  });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(demo, memento::tools::Setup);
