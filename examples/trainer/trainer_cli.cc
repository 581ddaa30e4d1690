// memento-trainer's command line (trainer_cli.h).
#include "trainer_cli.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/byte_flag.h"
#include "launch/swift_protocol.h"

namespace memento::trainer {
namespace {

struct Preset {
  const char* name;
  ModelConfig model;
};

// vocab, seq, d_model, heads, layers, ffn_mult.
const Preset kPresets[] = {
    {"tiny", {64, 16, 32, 4, 2, 4}},         // ~30 k parameters: unit tests
    {"small", {512, 64, 128, 4, 4, 4}},      // ~0.9 M
    {"100m", {8192, 256, 768, 12, 12, 4}},   // ~98 M (GPT-2 small body)
    {"350m", {8192, 512, 1024, 16, 24, 4}},  // ~320 M (GPT-2 medium body)
};

// The model (preset and overrides), the topology, the rendezvous.
void DefineModelFlags(CLI::App* app, TrainerCli* cli) {
  app->add_option("--preset", cli->preset, "model size: tiny | small | 100m | 350m")
      ->capture_default_str();
  app->add_option("--vocab", cli->vocab, "override the preset's vocabulary size");
  app->add_option("--seq", cli->seq, "override the preset's context length");
  app->add_option("--d-model", cli->d_model, "override the preset's width");
  app->add_option("--heads", cli->heads, "override the preset's attention heads");
  app->add_option("--layers", cli->layers, "override the preset's layers");
  app->add_option("--dp", cli->options.comm.topology.dp, "data-parallel size")
      ->capture_default_str();
  app->add_option("--tp", cli->options.comm.topology.tp, "tensor-parallel size")
      ->capture_default_str();
  app->add_option("--pp", cli->options.comm.topology.pp, "pipeline-parallel size")
      ->capture_default_str();
  app->add_flag("--zero", cli->options.zero1, "ZeRO-1: shard the AdamW moments over DP");
  app->add_option("--rank", cli->options.comm.rank,
                  "this process's global rank (default: $RANK or 0)");
  app->add_option("--world", cli->world, "world size, checked against dp x tp x pp ($WORLD_SIZE)");
  app->add_option("--rendezvous", cli->options.comm.rendezvous_dir,
                  "shared directory for Gloo's FileStore ($MEMENTO_TRAINER_RENDEZVOUS)");
  app->add_option("--run-id", cli->options.comm.run_id,
                  "names this attempt in the rendezvous directory; a restart that reuses the "
                  "directory needs a new one ($MEMENTO_TRAINER_RUN_ID)")
      ->capture_default_str();
  app->add_option("--comm-timeout", cli->options.comm.timeout_s, "seconds")->capture_default_str();
  app->add_flag("--launch", cli->launch, "start all dp x tp x pp ranks as local processes");
}

// Batch, optimizer, steps, the state files and what the reporting rank prints.
void DefineTrainingFlags(CLI::App* app, TrainerCli* cli) {
  app->add_option("--batch", cli->options.global_batch, "global batch (sequences per step)")
      ->capture_default_str();
  app->add_option("--micro-batches", cli->options.micro_batches,
                  "micro-batches per DP rank and step")
      ->capture_default_str();
  app->add_option("--steps", cli->steps, "train until this optimizer step")->capture_default_str();
  app->add_option("--seed", cli->options.seed, "model init and corpus seed")->capture_default_str();
  app->add_option("--lr", cli->options.adam.lr, "peak learning rate")->capture_default_str();
  app->add_option("--min-lr", cli->options.adam.min_lr, "final learning rate")
      ->capture_default_str();
  app->add_option("--warmup", cli->options.adam.warmup_steps, "warmup steps")
      ->capture_default_str();
  app->add_option("--decay-steps", cli->options.adam.decay_steps, "cosine decay length")
      ->capture_default_str();
  app->add_option("--weight-decay", cli->options.adam.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  app->add_option("--clip-grad", cli->options.clip_grad, "clip the global gradient norm; 0: off")
      ->capture_default_str();
  app->add_option("--blas-threads", cli->options.blas_threads, "OpenBLAS threads per rank")
      ->capture_default_str();
  app->add_option("--load", cli->load, "load the rank state from PATH ({rank} or .rank<k> suffix)");
  app->add_option("--save", cli->save,
                  "save the rank state at the end to PATH ({rank} or .rank<k>)");
  app->add_option("--save-every", cli->save_every,
                  "also save to --save PATH after every K-th step (atomic replace)");
  app->add_option("--loss-log", cli->loss_log,
                  "reporting rank appends 'step loss loss-bits grad-norm' lines here");
  app->add_flag("--quiet", cli->quiet, "no per-step progress lines");
  app->add_option("--progress-every", cli->progress_every,
                  "reporting rank prints one compact line (step, loss, snapshot overhead) per K "
                  "steps instead of one line per step");
  app->add_option("--digest-file", cli->digest_file,
                  "every rank writes its final state's digest (JSON: step, state and parameter "
                  "xxh3) to PATH ({rank} or .rank<k>)");
  app->add_flag("--json", cli->json,
                "reporting rank prints one JSON summary line at the end (means exclude step 1)");
}

// Fault injection (docs/trainer.md).
void DefineFaultFlags(CLI::App* app, TrainerCli* cli) {
  app->add_option("--fail-at-step", cli->fail_at_step,
                  "fault injection: rank --fail-rank kills itself (SIGKILL) after this step");
  app->add_option("--fail-rank", cli->fail_rank, "the rank that --fail-at-step kills")
      ->capture_default_str();
  app->add_option("--fail-point", cli->fail_point,
                  "where --fail-at-step kills: step (after the step) | update (inside the "
                  "optimizer update of that step, before chunk --fail-chunk) | pipeline (at "
                  "receive --fail-chunk of that step's pipeline schedule; needs --pp > 1) | "
                  "save (after the step, once the other ranks saved it, before its own "
                  "--save-every save: the job holds saves of different steps) | grad-allreduce, "
                  "grad-norm, all-gather (just before that collective of the step: the DP "
                  "gradient allreduce, the world's gradient-norm allreduce, ZeRO-1's parameter "
                  "all-gather; all-gather needs --zero) | grad-norm-commit (inside the gradient "
                  "norm: after the sum, its commit token sent to only the first --fail-chunk other "
                  "ranks, so that some ranks pass the gradient norm and the others do not)")
      ->capture_default_str();
  app->add_option("--wedge-rank", cli->wedge_rank,
                  "fault injection: this rank stops itself (SIGSTOP) when its step fails and it "
                  "would recover in process (a wedged survivor; first generation of attempt 0)");
  app->add_flag("--perturb-replay", cli->perturb_replay,
                "fault injection, with --recovery log: the first replacement (generation 1 of "
                "attempt 0) flips the lowest bit of its first parameter after loading its stage's "
                "snapshot, so that its replay must diverge and the job fall back");
  app->add_option("--corrupt-log-rank", cli->corrupt_log_rank,
                  "fault injection, with --recovery log: this rank, a survivor of the first "
                  "failure (attempt 0), flips one byte of its newest pipeline log file before it "
                  "recovers; a replacement that reads it must report the checksum and fall back");
  app->add_option("--fail-chunk", cli->fail_chunk,
                  "with --fail-point update: the chunk; pipeline: the receive (0-based); "
                  "grad-norm-commit: how many other ranks get its commit token")
      ->capture_default_str();
}

// SWIFT recovery (docs/swift.md) and the flags --launch sets for its children.
void DefineRecoveryFlags(CLI::App* app, TrainerCli* cli) {
  app->add_option("--recovery", cli->recovery,
                  "with --launch, what a failed rank triggers (docs/swift.md): none (stop) | "
                  "restart (all ranks again from the last --save-every state) | undo (in-process: "
                  "survivors undo a partial update, the lost rank is rebuilt from a DP replica) | "
                  "log (in-process: the lost stage replays its neighbours' logged messages from "
                  "its last --save-every state, or without --save under memento from its newest "
                  "memento snapshot in its node's T0)")
      ->capture_default_str();
  app->add_flag("--rebuild-all-groups", cli->options.rebuild_all_groups,
                "benchmarking, with --recovery undo|log: an in-process recovery rebuilds every "
                "Gloo group, also the quiescent ones no lost rank is in (which it keeps by "
                "default; docs/swift.md)");
  app->add_option("--pipeline-log-dir", cli->options.pipeline_log_dir,
                  "with --recovery log: keep the pipeline log in this directory, one file per "
                  "completed step written by a background thread, instead of in the rank's memory "
                  "(a tmpfs directory such as /dev/shm/NAME: shared memory that outlives a killed "
                  "rank; created if missing, not removed at the end)");
  app->add_flag("--log-odd-steps", cli->log_odd_steps,
                "benchmarking, with --recovery log: log only the odd steps' pipeline messages, so "
                "that logging's overhead shows against the adjacent unlogged steps of the same "
                "run; such a log cannot replay an even step (= --log-one-step-in 2)");
  app->add_option("--log-one-step-in", cli->log_period,
                  "benchmarking, with --recovery log: log only the pipeline messages of steps s "
                  "with s % N == 1 (`memento bench swift` uses 4: a logged step, the step after "
                  "it, which the log's background write may slow, and two clean steps); such a "
                  "log cannot replay another step");
  app->add_option("--log-copy", cli->log_copy,
                  "with --recovery log: who copies a logged message: inline (the send or "
                  "receive itself, on the trainer's thread) | thread (a worker thread, while "
                  "this rank computes or waits for its next message; the trainer fences a buffer "
                  "before it writes it; each message wakes the worker)")
      ->capture_default_str();
  app->add_flag("--log-copy-worker-paused", cli->log_worker_paused,
                "tests, with --log-copy thread: the copy worker takes no job, so every copy is "
                "made at the trainer's fences and the step's end (a worker that fell behind)")
      ->group("");
  app->add_option("--log-group-size", cli->options.log_group_size,
                  "with --recovery log: selective logging, stages in log groups of G consecutive "
                  "stages, only messages between groups logged; a lost stage's whole group rolls "
                  "back to its --save state and replays (docs/swift.md)")
      ->capture_default_str();
  app->add_option("--max-recoveries", cli->max_recoveries,
                  "with --recovery: give up after this many")
      ->capture_default_str();
  app->add_option("--generation", cli->generation,
                  "set by --launch: the job's recovery generation (0: first start)")
      ->group("");
  app->add_flag("--replace", cli->replace, "set by --launch: this process replaces a lost rank")
      ->group("");
}

#ifdef MEMENTO_TRAINER_WITH_CLIENT
// memento snapshots (built with the client only).
void DefineMementoFlags(CLI::App* app, TrainerCli* cli) {
  app->add_flag("--memento", cli->use_memento,
                "checkpoint every step with memento (implied under `memento launch`)");
  app->add_flag("--no-memento", cli->no_memento, "no memento even under `memento launch`");
  app->add_option("--job-id", cli->memento.job_id, "memento job id");
  app->add_option("--agent-dir", cli->memento.agent_dir, "memento agent directory");
  app->add_option("--node", cli->memento.node, "memento node of this rank");
  app->add_option("--memento-schedule", cli->memento.schedule,
                  "memento snapshot schedule: auto | eager | has (HAS: idle windows first; auto: "
                  "HAS once the trainer reports idle phases)")
      ->capture_default_str();
  app->add_option("--memento-copy-priority", cli->memento.copy_priority,
                  "memento copy workers: normal | idle (SCHED_IDLE until the fence; wins only "
                  "where the ranks leave CPU idle, docs/bench_overhead.md)")
      ->capture_default_str();
  app->add_flag("!--no-aor", cli->memento.aor,
                "under ZeRO-1 with DP > 1, do not feed memento's host AOR replicas of the peers' "
                "optimizer shards (their copies then cross the network every step; docs/reft.md "
                "section 5)");
  app->add_option("--aor-test-lr-scale", cli->memento.aor_test_lr_scale,
                  "testing: the learning rate handed to memento's host replicas is this multiple "
                  "of the one the trainer uses (a host optimizer given another schedule: the "
                  "replicas must be refused, not restored)")
      ->capture_default_str();
  app->add_option("--aor-test-late-sums", cli->aor_test_late_sums,
                  "testing: rank --fail-rank holds back its AOR shard checksums of steps 2 to "
                  "N-1 and reports them after step N (first generation of attempt 0): its "
                  "replica, seeded at step 1, is confirmed late, its holder's AOR thread ahead");
  app->add_option("--snapshot-mode", cli->snapshot_mode,
                  "off | sync | host | host_device | has: how memento snapshots (REFT's "
                  "baselines, docs/has.md); overrides --memento-schedule, off = --no-memento");
  app->add_option("--snapshot-chunk-kib", cli->snapshot_chunk_kib,
                  "memento copy chunk in KiB (a multiple of 64; default: the client's)")
      ->transform(ByteSize(uint64_t{1} << 10));
  app->add_option("--memento-every", cli->memento.every,
                  "memento snapshots after every K-th step only (a log-replay replacement loads "
                  "the newest and replays the logged steps since; docs/swift.md)")
      ->capture_default_str();
  app->add_option("--memento-pace-commits", cli->memento.pace_commits,
                  "cluster mode: after a snapshot, wait until it commits (or cannot: skipped or "
                  "released; at most 60 s), until N snapshots committed that way (-1: every "
                  "snapshot); for tests and benchmarks that need versions committed by some "
                  "step on a loaded machine")
      ->capture_default_str();
  app->add_option("--skip-snapshot-step", cli->skip_snapshot_step,
                  "fault injection: rank --fail-rank takes no memento snapshot of this step, as "
                  "if the client had skipped it by the commit word rule (first generation of "
                  "attempt 0; docs/swift.md)");
  app->add_option("--ranks-per-node", cli->ranks_per_node,
                  "node = rank / K (overrides --node); {node} in --agent-dir is replaced");
}
#endif

// The preset, then the overrides given.
bool ApplyPreset(TrainerCli* cli) {
  bool found = false;
  for (const Preset& p : kPresets) {
    if (cli->preset == p.name) {
      cli->options.model = p.model;
      found = true;
    }
  }
  if (!found) {
    std::fprintf(stderr, "memento-trainer: unknown preset '%s'\n", cli->preset.c_str());
    return false;
  }
  ModelConfig& m = cli->options.model;
  if (cli->vocab > 0) m.vocab = cli->vocab;
  if (cli->seq > 0) m.seq = cli->seq;
  if (cli->d_model > 0) m.d_model = cli->d_model;
  if (cli->heads > 0) m.heads = cli->heads;
  if (cli->layers > 0) m.layers = cli->layers;
  return true;
}

// The launcher's environment (launch_env.h) for what the flags leave open,
// then the memento flags that depend on whether memento is on.
bool ApplyLauncherSettings(const CLI::App& app, const EnvLookup& env, TrainerCli* cli) {
  GivenFlags given;
  given.rank = app.count("--rank") > 0;
  given.world = app.count("--world") > 0;
  given.dp = app.count("--dp") > 0;
  given.tp = app.count("--tp") > 0;
  given.pp = app.count("--pp") > 0;
  given.rendezvous = app.count("--rendezvous") > 0;
  given.run_id = app.count("--run-id") > 0;
  MementoTarget target;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  MementoHookOptions& mo = cli->memento;
  given.job_id = app.count("--job-id") > 0;
  given.agent_dir = app.count("--agent-dir") > 0;
  given.node = app.count("--node") > 0 || cli->ranks_per_node > 0;
  given.memento = cli->use_memento;
  given.no_memento = cli->no_memento;
  target.job_id = mo.job_id;
  target.agent_dir = mo.agent_dir;
  target.node = mo.node;
#endif
  if (Status st = ApplyLauncherEnv(env, given, &cli->options, &cli->world, &target); !st.ok()) {
    std::fprintf(stderr, "memento-trainer: %s\n", st.ToString().c_str());
    return false;
  }
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  cli->use_memento = target.enabled;
  if (cli->snapshot_mode == "off") {
    cli->use_memento = false;
  } else if (Status st = CheckSnapshotMode(cli->snapshot_mode); !st.ok()) {
    std::fprintf(stderr, "memento-trainer: --snapshot-mode: %s\n", st.ToString().c_str());
    return false;
  }
  mo.snapshot_mode = cli->snapshot_mode == "off" ? "" : cli->snapshot_mode;
  if (cli->snapshot_chunk_kib < 0 || cli->snapshot_chunk_kib % 64 != 0) {
    std::fprintf(stderr,
                 "memento-trainer: --snapshot-chunk-kib %" PRId64
                 " must be a non-negative multiple of 64\n",
                 cli->snapshot_chunk_kib);
    return false;
  }
  mo.chunk_bytes = static_cast<size_t>(cli->snapshot_chunk_kib) << 10;
  if (mo.every < 1) {
    std::fprintf(stderr, "memento-trainer: --memento-every %" PRId64 " must be >= 1\n", mo.every);
    return false;
  }
  if (mo.pace_commits < -1) {
    std::fprintf(stderr, "memento-trainer: --memento-pace-commits %" PRId64 " must be >= -1\n",
                 mo.pace_commits);
    return false;
  }
  mo.job_id = target.job_id;
  mo.agent_dir = target.agent_dir;
  mo.node = target.node;
#endif
  // `memento launch --recovery undo|auto` (launch/swift_protocol.h): the
  // mode for every rank, and generation and role for a replacement.
  if (const char* a = env("MEMENTO_ATTEMPT")) cli->attempt = std::atoi(a);
  if (app.count("--recovery") == 0) {
    if (const char* r = env(launch::swift::kEnvRecovery); r != nullptr && *r != '\0') {
      cli->recovery = r;
    }
  }
  if (app.count("--generation") == 0) {
    if (const char* g = env(launch::swift::kEnvGeneration)) cli->generation = std::atoi(g);
  }
  if (app.count("--replace") == 0) {
    if (const char* r = env(launch::swift::kEnvReplace)) cli->replace = std::string(r) == "1";
  }
  return true;
}

// --world, --recovery and the --fail-* flags.
bool CheckFaultFlags(TrainerCli* cli) {
  const int w = cli->options.comm.topology.world();
  if (cli->world != 0 && cli->world != w) {
    std::fprintf(stderr, "memento-trainer: --world %d but dp x tp x pp = %d\n", cli->world, w);
    return false;
  }
  const std::string& recovery = cli->recovery;
  if (recovery != "none" && recovery != "restart" && recovery != "undo" && recovery != "log") {
    std::fprintf(stderr, "memento-trainer: --recovery '%s': expected none, restart, undo or log\n",
                 recovery.c_str());
    return false;
  }
  const std::string& fail_point = cli->fail_point;
  if (fail_point != "step" && fail_point != "update" && fail_point != "pipeline" &&
      fail_point != "save" && !cli->FailsInCollective() && !cli->FailsInCommit()) {
    std::fprintf(stderr,
                 "memento-trainer: --fail-point '%s': expected step, update, pipeline, save, "
                 "grad-allreduce, grad-norm, grad-norm-commit or all-gather\n",
                 fail_point.c_str());
    return false;
  }
  if (cli->FailsInCommit() && (cli->fail_chunk < 0 || cli->fail_chunk > w - 1)) {
    std::fprintf(stderr,
                 "memento-trainer: --fail-point grad-norm-commit: --fail-chunk %d (the ranks its "
                 "commit token reaches) must be in 0..%d (the other ranks)\n",
                 cli->fail_chunk, w - 1);
    return false;
  }
  if (fail_point == "all-gather" && !cli->options.zero1) {
    std::fprintf(stderr,
                 "memento-trainer: --fail-point all-gather needs --zero (only ZeRO-1 all-gathers "
                 "the parameters)\n");
    return false;
  }
  return true;
}

// The pipeline log's flags (--recovery log) and the state a recovery
// restarts or replays from.
bool CheckLogFlags(const CLI::App& app, TrainerCli* cli) {
  TrainerOptions& o = cli->options;
  std::string& recovery = cli->recovery;
  if (o.log_group_size < 1 || o.log_group_size > o.comm.topology.pp) {
    std::fprintf(stderr, "memento-trainer: --log-group-size %d must be in 1..pp (%d)\n",
                 o.log_group_size, o.comm.topology.pp);
    return false;
  }
  // Under `memento launch` with memento snapshots, a log replacement loads
  // its snapshot from its node's T0 instead of a --save file.
  const bool memento_snapshots = cli->use_memento;
  const bool no_saves = cli->save.empty() || cli->save_every <= 0;
  if (recovery == "log" && app.count("--recovery") == 0 && !memento_snapshots && no_saves) {
    // The launcher asked for log replay (`memento launch --recovery auto`
    // on dp 1), but there is no snapshot to replay from: no in-process
    // recovery; a failed rank makes the launcher restart the whole job.
    std::fprintf(stderr,
                 "memento-trainer: %s=log, but no memento snapshots and no --save/--save-every: "
                 "in-process log recovery off (the launcher restarts the job on a failure)\n",
                 launch::swift::kEnvRecovery);
    recovery = "none";
    o.pipeline_log_dir.clear();
  }
  if ((cli->log_odd_steps || cli->log_period != 0) && recovery != "log") {
    std::fprintf(stderr, "memento-trainer: %s needs --recovery log\n",
                 cli->log_odd_steps ? "--log-odd-steps" : "--log-one-step-in");
    return false;
  }
  if (cli->log_odd_steps && cli->log_period != 0 && cli->log_period != 2) {
    std::fprintf(stderr, "memento-trainer: --log-odd-steps and --log-one-step-in %d disagree\n",
                 cli->log_period);
    return false;
  }
  if (app.count("--log-one-step-in") > 0 && cli->log_period < 1) {
    std::fprintf(stderr, "memento-trainer: --log-one-step-in %d must be >= 1\n", cli->log_period);
    return false;
  }
  o.pipeline_log_period = cli->log_odd_steps ? 2 : std::max(cli->log_period, 1);
  auto mode = PipelineLogWriter::ParseMode(cli->log_copy);
  if (!mode.ok()) {
    std::fprintf(stderr, "memento-trainer: --log-copy: %s\n", mode.status().ToString().c_str());
    return false;
  }
  o.log_copy = *mode;
  if (!o.pipeline_log_dir.empty() && recovery != "log") {
    std::fprintf(stderr, "memento-trainer: --pipeline-log-dir needs --recovery log\n");
    return false;
  }
  if ((recovery == "restart" || (recovery == "log" && !memento_snapshots)) && no_saves) {
    std::fprintf(stderr,
                 "memento-trainer: --recovery %s needs --save PATH and --save-every K (the state "
                 "it restarts or replays from%s)\n",
                 recovery.c_str(), recovery == "log" ? "; or memento's snapshots" : "");
    return false;
  }
  return true;
}

}  // namespace

void DefineFlags(CLI::App* app, TrainerCli* cli) {
  DefineModelFlags(app, cli);
  DefineTrainingFlags(app, cli);
  DefineFaultFlags(app, cli);
  DefineRecoveryFlags(app, cli);
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  DefineMementoFlags(app, cli);
#endif
}

bool CompleteFlags(const CLI::App& app, const EnvLookup& env, TrainerCli* cli) {
  return ApplyPreset(cli) && ApplyLauncherSettings(app, env, cli) && CheckFaultFlags(cli) &&
         CheckLogFlags(app, cli);
}

}  // namespace memento::trainer
