// memento-trainer's command line (main.cc, docs/trainer.md): the flags with
// their defaults and help text, and what completes them after parsing (the
// model preset, the launcher's environment, the checks of flags that must
// agree). Split out of main.cc unchanged: the same flags, help and messages.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "launch_env.h"
#include "memento_hooks.h"
#include "trainer.h"

namespace memento::trainer {

// Everything the command line and the launcher's environment set. The
// memento fields keep their defaults when the trainer is built without the
// client (MEMENTO_TRAINER_WITH_CLIENT unset: no memento flags).
struct TrainerCli {
  TrainerOptions options;  // model, topology, optimizer, SWIFT logging
  std::string preset = "tiny";
  int vocab = 0, seq = 0, d_model = 0, heads = 0, layers = 0;  // preset overrides
  int world = 0;                                               // 0: unchecked
  int64_t steps = 20;
  bool launch = false, quiet = false, json = false;
  std::string load, save, loss_log, digest_file;
  int64_t save_every = 0;
  int64_t progress_every = 0;
  // Fault injection (--fail-*, --wedge-rank, --perturb-replay, ...).
  int64_t fail_at_step = -1;
  int fail_rank = 0;
  std::string fail_point = "step";
  int fail_chunk = 0;
  int wedge_rank = -1;
  bool perturb_replay = false;
  int corrupt_log_rank = -1;
  // SWIFT recovery (docs/swift.md).
  std::string recovery = "none";
  int max_recoveries = 3;
  int generation = 0;  // the launcher's recovery generation; advances in process
  bool replace = false;
  bool log_odd_steps = false;
  int log_period = 0;               // --log-one-step-in
  std::string log_copy = "thread";  // --log-copy: sets options.log_copy
  bool log_worker_paused = false;   // --log-copy-worker-paused (tests)
  int attempt = 0;                  // MEMENTO_ATTEMPT: the launcher's restart of the whole job
  // memento (MEMENTO_TRAINER_WITH_CLIENT).
  bool use_memento = false, no_memento = false;
  MementoHookOptions memento;
  int ranks_per_node = 0;
  int64_t aor_test_late_sums = -1;
  std::string snapshot_mode;
  int64_t snapshot_chunk_kib = 0;
  int64_t skip_snapshot_step = -1;

  // --fail-point grad-allreduce, grad-norm or all-gather.
  bool FailsInCollective() const {
    return fail_point == "grad-allreduce" || fail_point == "grad-norm" ||
           fail_point == "all-gather";
  }
  bool FailsInCommit() const { return fail_point == "grad-norm-commit"; }
  // The one-shot fault injections fire in the first generation of the
  // launcher's first attempt only (a restarted or recovered job runs clean).
  bool FirstRun() const { return generation == 0 && attempt == 0; }
  // ... and on rank --fail-rank.
  bool IsFaultRank(int rank) const { return rank == fail_rank && FirstRun(); }
};

// Adds every flag to `app`, bound to `cli`'s fields, in the order of --help.
void DefineFlags(CLI::App* app, TrainerCli* cli);

// After app.parse: the preset and its overrides, the launcher's environment
// (`env`, std::getenv at the tool's edge) for what the flags leave open, and
// the checks. Returns false after printing what is wrong to stderr (the
// process then exits 2).
[[nodiscard]] bool CompleteFlags(const CLI::App& app, const EnvLookup& env, TrainerCli* cli);

}  // namespace memento::trainer
