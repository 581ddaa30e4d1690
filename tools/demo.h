// `memento demo` (docs/demo.md): its options and its three parts, one file
// each (tools/cmd_demo.cc parses the command line and picks one):
//   demo_trainer.cc      the single-node demo's trainer (`memento demo --trainer`)
//   demo_single_node.cc  `memento demo --single-node`: an agent and that trainer,
//                        SIGKILL mid-snapshot, restart, restore, bit-identity
//   demo_multi_node.cc   `memento demo`: the Launcher runs memento-trainer on
//                        4 nodes with failures, then without (launch layer only)
#pragma once

#include <cstdint>
#include <string>

namespace memento::tools {

struct DemoArgs {
  uint64_t mib = 256;
  int64_t steps = 20;
  int64_t kill_after = 6;
  int threads = 2;
  bool keep = false;
  bool single_node = false;
  // multi-node demo (--steps defaults to 300 there)
  std::string trainer_bin;
  std::string preset = "small";
  int nodes = 4;
  int dp = 2, pp = 2;
  std::string policy = "xor";
  bool sharded = true;  // --no-sharded: every rank snapshots its whole state
  int64_t kill_rank_at = 100;
  int kill_rank = 3;
  int64_t kill_node_at = 200;
  int kill_node = 1;
  int64_t progress_every = 25;
  std::string store_url;  // empty: the launcher hosts the embedded store
  // trainer mode
  bool trainer = false;
  std::string root;
  std::string progress;
};

// `memento demo --trainer`: the trainer process of the single-node demo.
int RunDemoTrainer(const DemoArgs& a);
// `memento demo --single-node`.
int RunSingleNodeDemo(const DemoArgs& a);
// `memento demo` (defined only when the build has src/launch).
int RunMultiNodeDemo(const DemoArgs& a, int64_t steps);

}  // namespace memento::tools
