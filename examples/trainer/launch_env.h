// The trainer's view of the environment a launcher sets (docs/cluster.md,
// "Trainer environment under `memento launch`"), plus the torchrun-style
// variables it has always read. Pure: the environment comes in through a
// lookup function, so the precedence rules are unit-tested without touching
// the process environment.
//
// Precedence for every setting: an explicit command-line flag, then the
// MEMENTO_* variable of `memento launch`, then the older generic variable
// (RANK, WORLD_SIZE, MEMENTO_TRAINER_RENDEZVOUS, MEMENTO_TRAINER_RUN_ID).
//
//   MEMENTO_RANK / RANK                 --rank
//   MEMENTO_WORLD_SIZE / WORLD_SIZE     --world (checked against dp x tp x pp)
//   MEMENTO_DP, MEMENTO_TP, MEMENTO_PP  --dp, --tp, --pp
//   MEMENTO_RENDEZVOUS / MEMENTO_TRAINER_RENDEZVOUS   --rendezvous
//   MEMENTO_TRAINER_RUN_ID, else "a<MEMENTO_ATTEMPT>" --run-id
//   MEMENTO_JOB                         --job-id
//   MEMENTO_RUN_DIR                     --agent-dir (the node's agent directory)
//   MEMENTO_NODE ("3", "n3" or "node3") --node
// Under the launcher (MEMENTO_JOB and MEMENTO_RUN_DIR both set) memento is on
// unless --no-memento is given.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "memento/status.h"
#include "trainer.h"

namespace memento::trainer {

// Returns the variable's value or nullptr when unset (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

// Which of the settings above were given as flags (those win over the env).
struct GivenFlags {
  bool rank = false, world = false, dp = false, tp = false, pp = false;
  bool rendezvous = false, run_id = false;
  bool job_id = false, agent_dir = false, node = false;
  bool memento = false, no_memento = false;
};

// The memento settings of a rank (the subset of MementoHookOptions that the
// environment can set; kept here so this file builds without the client).
struct MementoTarget {
  bool enabled = false;
  std::string job_id;
  std::string agent_dir;
  int node = 0;
};

// Applies the environment to `options`, `*world` (0: unchecked) and
// `*memento` for every setting whose flag was not given. InvalidArgument,
// naming the variable and its value, for a value that is not a
// non-negative integer (positive for sizes), or for a node name without a
// trailing number.
[[nodiscard]] Status ApplyLauncherEnv(const EnvLookup& env, const GivenFlags& given,
                                      TrainerOptions* options, int* world, MementoTarget* memento);

}  // namespace memento::trainer
