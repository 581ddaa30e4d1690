// memento-trainer: the reference hybrid-parallel GPT trainer (docs/trainer.md).
//
//   memento-trainer --preset tiny --steps 50                     # one process
//   memento-trainer --launch --dp 2 --pp 2 --micro-batches 4     # 4 local ranks
//   memento-trainer --dp 2 --rank 1 --rendezvous /tmp/rdv ...    # one rank of a job
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/byte_flag.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "fault_injection.h"
#include "launch/swift_protocol.h"
#include "launch_env.h"
#include "local_launch.h"
#include "rank_files.h"
#include "trainer.h"
#ifdef MEMENTO_TRAINER_WITH_CLIENT
#include "memento_hooks.h"
#endif

namespace memento::trainer {
namespace {

// CPU time of this process (all its threads: training, Gloo, memento's copy
// workers), in seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace
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

// In-process recovery speaks the launchers' shared protocol
// (launch/swift_protocol.h): generation file, exit status 75, reports.
using launch::swift::kExitRecoveryFailed;
using launch::swift::ReadGeneration;
using launch::swift::WallSeconds;
using launch::swift::WriteGeneration;

int Main(int argc, char** argv) {
  CLI::App app{"memento-trainer: reference hybrid-parallel GPT trainer"};
  TrainerOptions o;
  std::string preset = "tiny";
  int vocab = 0, seq = 0, d_model = 0, heads = 0, layers = 0;
  int world = 0;
  int64_t steps = 20;
  bool launch = false, quiet = false, json = false;
  int64_t fail_at_step = -1;
  int fail_rank = 0;
  int64_t save_every = 0;
  std::string load, save, loss_log;
  std::string recovery = "none", fail_point = "step";
  int fail_chunk = 0, generation = 0, max_recoveries = 3;
  bool replace = false;
  app.add_option("--preset", preset, "model size: tiny | small | 100m | 350m")
      ->capture_default_str();
  app.add_option("--vocab", vocab, "override the preset's vocabulary size");
  app.add_option("--seq", seq, "override the preset's context length");
  app.add_option("--d-model", d_model, "override the preset's width");
  app.add_option("--heads", heads, "override the preset's attention heads");
  app.add_option("--layers", layers, "override the preset's layers");
  app.add_option("--dp", o.comm.topology.dp, "data-parallel size")->capture_default_str();
  app.add_option("--tp", o.comm.topology.tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--pp", o.comm.topology.pp, "pipeline-parallel size")->capture_default_str();
  app.add_flag("--zero", o.zero1, "ZeRO-1: shard the AdamW moments over DP");
  app.add_option("--rank", o.comm.rank, "this process's global rank (default: $RANK or 0)");
  app.add_option("--world", world, "world size, checked against dp x tp x pp ($WORLD_SIZE)");
  app.add_option("--rendezvous", o.comm.rendezvous_dir,
                 "shared directory for Gloo's FileStore ($MEMENTO_TRAINER_RENDEZVOUS)");
  app.add_option("--run-id", o.comm.run_id,
                 "names this attempt in the rendezvous directory; a restart that reuses the "
                 "directory needs a new one ($MEMENTO_TRAINER_RUN_ID)")
      ->capture_default_str();
  app.add_option("--comm-timeout", o.comm.timeout_s, "seconds")->capture_default_str();
  app.add_flag("--launch", launch, "start all dp x tp x pp ranks as local processes");
  app.add_option("--batch", o.global_batch, "global batch (sequences per step)")
      ->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches, "micro-batches per DP rank and step")
      ->capture_default_str();
  app.add_option("--steps", steps, "train until this optimizer step")->capture_default_str();
  app.add_option("--seed", o.seed, "model init and corpus seed")->capture_default_str();
  app.add_option("--lr", o.adam.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", o.adam.min_lr, "final learning rate")->capture_default_str();
  app.add_option("--warmup", o.adam.warmup_steps, "warmup steps")->capture_default_str();
  app.add_option("--decay-steps", o.adam.decay_steps, "cosine decay length")->capture_default_str();
  app.add_option("--weight-decay", o.adam.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  app.add_option("--clip-grad", o.clip_grad, "clip the global gradient norm; 0: off")
      ->capture_default_str();
  app.add_option("--blas-threads", o.blas_threads, "OpenBLAS threads per rank")
      ->capture_default_str();
  app.add_option("--load", load, "load the rank state from PATH ({rank} or .rank<k> suffix)");
  app.add_option("--save", save, "save the rank state at the end to PATH ({rank} or .rank<k>)");
  app.add_option("--save-every", save_every,
                 "also save to --save PATH after every K-th step (atomic replace)");
  app.add_option("--loss-log", loss_log,
                 "reporting rank appends 'step loss loss-bits grad-norm' lines here");
  app.add_flag("--quiet", quiet, "no per-step progress lines");
  int64_t progress_every = 0;
  app.add_option("--progress-every", progress_every,
                 "reporting rank prints one compact line (step, loss, snapshot overhead) per K "
                 "steps instead of one line per step");
  std::string digest_file;
  app.add_option("--digest-file", digest_file,
                 "every rank writes its final state's digest (JSON: step, state and parameter "
                 "xxh3) to PATH ({rank} or .rank<k>)");
  app.add_flag("--json", json,
               "reporting rank prints one JSON summary line at the end (means exclude step 1)");
  app.add_option("--fail-at-step", fail_at_step,
                 "fault injection: rank --fail-rank kills itself (SIGKILL) after this step");
  app.add_option("--fail-rank", fail_rank, "the rank that --fail-at-step kills")
      ->capture_default_str();
  app.add_option("--fail-point", fail_point,
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
  int wedge_rank = -1;
  app.add_option("--wedge-rank", wedge_rank,
                 "fault injection: this rank stops itself (SIGSTOP) when its step fails and it "
                 "would recover in process (a wedged survivor; first generation of attempt 0)");
  bool perturb_replay = false;
  app.add_flag("--perturb-replay", perturb_replay,
               "fault injection, with --recovery log: the first replacement (generation 1 of "
               "attempt 0) flips the lowest bit of its first parameter after loading its stage's "
               "snapshot, so that its replay must diverge and the job fall back");
  int corrupt_log_rank = -1;
  app.add_option("--corrupt-log-rank", corrupt_log_rank,
                 "fault injection, with --recovery log: this rank, a survivor of the first "
                 "failure (attempt 0), flips one byte of its newest pipeline log file before it "
                 "recovers; a replacement that reads it must report the checksum and fall back");
  app.add_option("--fail-chunk", fail_chunk,
                 "with --fail-point update: the chunk; pipeline: the receive (0-based); "
                 "grad-norm-commit: how many other ranks get its commit token")
      ->capture_default_str();
  app.add_option("--recovery", recovery,
                 "with --launch, what a failed rank triggers (docs/swift.md): none (stop) | "
                 "restart (all ranks again from the last --save-every state) | undo (in-process: "
                 "survivors undo a partial update, the lost rank is rebuilt from a DP replica) | "
                 "log (in-process: the lost stage replays its neighbours' logged messages from "
                 "its last --save-every state, or without --save under memento from its newest "
                 "memento snapshot in its node's T0)")
      ->capture_default_str();
  app.add_flag("--rebuild-all-groups", o.rebuild_all_groups,
               "benchmarking, with --recovery undo|log: an in-process recovery rebuilds every "
               "Gloo group, also the quiescent ones no lost rank is in (which it keeps by "
               "default; docs/swift.md)");
  app.add_option("--pipeline-log-dir", o.pipeline_log_dir,
                 "with --recovery log: keep the pipeline log in this directory, one file per "
                 "completed step written by a background thread, instead of in the rank's memory "
                 "(a tmpfs directory such as /dev/shm/NAME: shared memory that outlives a killed "
                 "rank; created if missing, not removed at the end)");
  bool log_odd_steps = false;
  app.add_flag("--log-odd-steps", log_odd_steps,
               "benchmarking, with --recovery log: log only the odd steps' pipeline messages, so "
               "that logging's overhead shows against the adjacent unlogged steps of the same "
               "run; such a log cannot replay an even step (= --log-one-step-in 2)");
  int log_period = 0;
  app.add_option("--log-one-step-in", log_period,
                 "benchmarking, with --recovery log: log only the pipeline messages of steps s "
                 "with s % N == 1 (`memento bench swift` uses 4: a logged step, the step after "
                 "it, which the log's background write may slow, and two clean steps); such a "
                 "log cannot replay another step");
  app.add_option("--log-group-size", o.log_group_size,
                 "with --recovery log: selective logging, stages in log groups of G consecutive "
                 "stages, only messages between groups logged; a lost stage's whole group rolls "
                 "back to its --save state and replays (docs/swift.md)")
      ->capture_default_str();
  app.add_option("--max-recoveries", max_recoveries, "with --recovery: give up after this many")
      ->capture_default_str();
  app.add_option("--generation", generation,
                 "set by --launch: the job's recovery generation (0: first start)")
      ->group("");
  app.add_flag("--replace", replace, "set by --launch: this process replaces a lost rank")
      ->group("");
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  bool use_memento = false;
  bool no_memento = false;
  MementoHookOptions mo;
  app.add_flag("--memento", use_memento,
               "checkpoint every step with memento (implied under `memento launch`)");
  app.add_flag("--no-memento", no_memento, "no memento even under `memento launch`");
  app.add_option("--job-id", mo.job_id, "memento job id");
  app.add_option("--agent-dir", mo.agent_dir, "memento agent directory");
  int ranks_per_node = 0;
  app.add_option("--node", mo.node, "memento node of this rank");
  app.add_option("--memento-schedule", mo.schedule,
                 "memento snapshot schedule: auto | eager | has (HAS: idle windows first; auto: "
                 "HAS once the trainer reports idle phases)")
      ->capture_default_str();
  app.add_option("--memento-copy-priority", mo.copy_priority,
                 "memento copy workers: normal | idle (SCHED_IDLE until the fence; wins only "
                 "where the ranks leave CPU idle, docs/bench_overhead.md)")
      ->capture_default_str();
  app.add_flag("!--no-aor", mo.aor,
               "under ZeRO-1 with DP > 1, do not feed memento's host AOR replicas of the peers' "
               "optimizer shards (their copies then cross the network every step; docs/reft.md "
               "section 5)");
  app.add_option("--aor-test-lr-scale", mo.aor_test_lr_scale,
                 "testing: the learning rate handed to memento's host replicas is this multiple "
                 "of the one the trainer uses (a host optimizer given another schedule: the "
                 "replicas must be refused, not restored)")
      ->capture_default_str();
  int64_t aor_test_late_sums = -1;
  app.add_option("--aor-test-late-sums", aor_test_late_sums,
                 "testing: rank --fail-rank holds back its AOR shard checksums of steps 2 to "
                 "N-1 and reports them after step N (first generation of attempt 0): its "
                 "replica, seeded at step 1, is confirmed late, its holder's AOR thread ahead");
  std::string snapshot_mode;
  app.add_option("--snapshot-mode", snapshot_mode,
                 "off | sync | host | host_device | has: how memento snapshots (REFT's "
                 "baselines, docs/has.md); overrides --memento-schedule, off = --no-memento");
  int64_t snapshot_chunk_kib = 0;
  app.add_option("--snapshot-chunk-kib", snapshot_chunk_kib,
                 "memento copy chunk in KiB (a multiple of 64; default: the client's)")
      ->transform(ByteSize(uint64_t{1} << 10));
  app.add_option("--memento-every", mo.every,
                 "memento snapshots after every K-th step only (a log-replay replacement loads "
                 "the newest and replays the logged steps since; docs/swift.md)")
      ->capture_default_str();
  app.add_option("--memento-pace-commits", mo.pace_commits,
                 "cluster mode: after a snapshot, wait until it commits (or cannot: skipped or "
                 "released; at most 60 s), until N snapshots committed that way (-1: every "
                 "snapshot); for tests and benchmarks that need versions committed by some step "
                 "on a loaded machine")
      ->capture_default_str();
  int64_t skip_snapshot_step = -1;
  app.add_option("--skip-snapshot-step", skip_snapshot_step,
                 "fault injection: rank --fail-rank takes no memento snapshot of this step, as "
                 "if the client had skipped it by the commit word rule (first generation of "
                 "attempt 0; docs/swift.md)");
  app.add_option("--ranks-per-node", ranks_per_node,
                 "node = rank / K (overrides --node); {node} in --agent-dir is replaced");
#endif
  CLI11_PARSE(app, argc, argv);

  bool found = false;
  for (const Preset& p : kPresets) {
    if (preset == p.name) {
      o.model = p.model;
      found = true;
    }
  }
  if (!found) {
    std::fprintf(stderr, "memento-trainer: unknown preset '%s'\n", preset.c_str());
    return 2;
  }
  if (vocab > 0) o.model.vocab = vocab;
  if (seq > 0) o.model.seq = seq;
  if (d_model > 0) o.model.d_model = d_model;
  if (heads > 0) o.model.heads = heads;
  if (layers > 0) o.model.layers = layers;
  // The launcher's environment (launch_env.h) for what the flags leave open.
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
  given.job_id = app.count("--job-id") > 0;
  given.agent_dir = app.count("--agent-dir") > 0;
  given.node = app.count("--node") > 0 || ranks_per_node > 0;
  given.memento = use_memento;
  given.no_memento = no_memento;
  target.job_id = mo.job_id;
  target.agent_dir = mo.agent_dir;
  target.node = mo.node;
#endif
  if (Status st = ApplyLauncherEnv([](const char* n) -> const char* { return std::getenv(n); },
                                   given, &o, &world, &target);
      !st.ok()) {
    std::fprintf(stderr, "memento-trainer: %s\n", st.ToString().c_str());
    return 2;
  }
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  use_memento = target.enabled;
  if (snapshot_mode == "off") {
    use_memento = false;
  } else if (Status st = CheckSnapshotMode(snapshot_mode); !st.ok()) {
    std::fprintf(stderr, "memento-trainer: --snapshot-mode: %s\n", st.ToString().c_str());
    return 2;
  }
  mo.snapshot_mode = snapshot_mode == "off" ? "" : snapshot_mode;
  if (snapshot_chunk_kib < 0 || snapshot_chunk_kib % 64 != 0) {
    std::fprintf(stderr,
                 "memento-trainer: --snapshot-chunk-kib %" PRId64
                 " must be a non-negative multiple of 64\n",
                 snapshot_chunk_kib);
    return 2;
  }
  mo.chunk_bytes = static_cast<size_t>(snapshot_chunk_kib) << 10;
  if (mo.every < 1) {
    std::fprintf(stderr, "memento-trainer: --memento-every %" PRId64 " must be >= 1\n", mo.every);
    return 2;
  }
  mo.job_id = target.job_id;
  mo.agent_dir = target.agent_dir;
  mo.node = target.node;
#endif
  // `memento launch --recovery undo|auto` (launch/swift_protocol.h): the
  // mode for every rank, and generation and role for a replacement.
  int attempt = 0;
  if (const char* a = std::getenv("MEMENTO_ATTEMPT")) attempt = std::atoi(a);
  if (app.count("--recovery") == 0) {
    if (const char* r = std::getenv(launch::swift::kEnvRecovery); r != nullptr && *r != '\0') {
      recovery = r;
    }
  }
  if (app.count("--generation") == 0) {
    if (const char* g = std::getenv(launch::swift::kEnvGeneration)) generation = std::atoi(g);
  }
  if (app.count("--replace") == 0) {
    if (const char* r = std::getenv(launch::swift::kEnvReplace)) replace = std::string(r) == "1";
  }
  const int w = o.comm.topology.world();
  if (world != 0 && world != w) {
    std::fprintf(stderr, "memento-trainer: --world %d but dp x tp x pp = %d\n", world, w);
    return 2;
  }
  if (recovery != "none" && recovery != "restart" && recovery != "undo" && recovery != "log") {
    std::fprintf(stderr, "memento-trainer: --recovery '%s': expected none, restart, undo or log\n",
                 recovery.c_str());
    return 2;
  }
  const bool fail_in_collective =
      fail_point == "grad-allreduce" || fail_point == "grad-norm" || fail_point == "all-gather";
  const bool fail_in_commit = fail_point == "grad-norm-commit";
  if (fail_point != "step" && fail_point != "update" && fail_point != "pipeline" &&
      fail_point != "save" && !fail_in_collective && !fail_in_commit) {
    std::fprintf(stderr,
                 "memento-trainer: --fail-point '%s': expected step, update, pipeline, save, "
                 "grad-allreduce, grad-norm, grad-norm-commit or all-gather\n",
                 fail_point.c_str());
    return 2;
  }
  if (fail_in_commit && (fail_chunk < 0 || fail_chunk > w - 1)) {
    std::fprintf(stderr,
                 "memento-trainer: --fail-point grad-norm-commit: --fail-chunk %d (the ranks its "
                 "commit token reaches) must be in 0..%d (the other ranks)\n",
                 fail_chunk, w - 1);
    return 2;
  }
  if (fail_point == "all-gather" && !o.zero1) {
    std::fprintf(stderr,
                 "memento-trainer: --fail-point all-gather needs --zero (only ZeRO-1 all-gathers "
                 "the parameters)\n");
    return 2;
  }
  if (o.log_group_size < 1 || o.log_group_size > o.comm.topology.pp) {
    std::fprintf(stderr, "memento-trainer: --log-group-size %d must be in 1..pp (%d)\n",
                 o.log_group_size, o.comm.topology.pp);
    return 2;
  }
  // Under `memento launch` with memento snapshots, a log replacement loads
  // its snapshot from its node's T0 instead of a --save file.
  bool memento_snapshots = false;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  memento_snapshots = use_memento;
#endif
  if (recovery == "log" && app.count("--recovery") == 0 && !memento_snapshots &&
      (save.empty() || save_every <= 0)) {
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
  if ((log_odd_steps || log_period != 0) && recovery != "log") {
    std::fprintf(stderr, "memento-trainer: %s needs --recovery log\n",
                 log_odd_steps ? "--log-odd-steps" : "--log-one-step-in");
    return 2;
  }
  if (log_odd_steps && log_period != 0 && log_period != 2) {
    std::fprintf(stderr, "memento-trainer: --log-odd-steps and --log-one-step-in %d disagree\n",
                 log_period);
    return 2;
  }
  if (app.count("--log-one-step-in") > 0 && log_period < 1) {
    std::fprintf(stderr, "memento-trainer: --log-one-step-in %d must be >= 1\n", log_period);
    return 2;
  }
  o.pipeline_log_period = log_odd_steps ? 2 : std::max(log_period, 1);
  if (!o.pipeline_log_dir.empty() && recovery != "log") {
    std::fprintf(stderr, "memento-trainer: --pipeline-log-dir needs --recovery log\n");
    return 2;
  }
  if ((recovery == "restart" || (recovery == "log" && !memento_snapshots)) &&
      (save.empty() || save_every <= 0)) {
    std::fprintf(stderr,
                 "memento-trainer: --recovery %s needs --save PATH and --save-every K (the state "
                 "it restarts or replays from%s)\n",
                 recovery.c_str(), recovery == "log" ? "; or memento's snapshots" : "");
    return 2;
  }
  if (launch) return LaunchLocal(argc, argv, w, o.comm.rendezvous_dir, recovery, max_recoveries);
  // A write to a dead peer's socket must be an error Gloo reports, not a
  // SIGPIPE that kills a survivor in the middle of its recovery.
  if (recovery != "none") signal(SIGPIPE, SIG_IGN);
  // Log replay also undoes a survivor's step when another survivor is one
  // step behind (docs/swift.md).
  o.undo_log = recovery == "undo" || recovery == "log";
  o.pipeline_log = recovery == "log";
  const std::string base_run_id = o.comm.run_id;
  if (generation > 0) o.comm.run_id = base_run_id + "-g" + std::to_string(generation);
  // A restarted rank (generation > 0, also the fallback of undo and log: a
  // rank of a later generation that replaces no one) resumes from the newest
  // step every rank saved (ResumeFromSaves).
  const bool resume_from_saves = generation > 0 && !replace && recovery != "none" && !save.empty();

  auto created = Trainer::Create(o, nullptr);
  if (!created.ok()) {
    std::fprintf(stderr, "memento-trainer rank %d: %s\n", o.comm.rank,
                 created.status().ToString().c_str());
    // A replacement that cannot join the survivors: fall back to restart.
    return replace ? kExitRecoveryFailed : 1;
  }
  std::unique_ptr<Trainer> trainer = std::move(*created);
  const int rank = o.comm.rank;
  std::unique_ptr<KillInsideStep> fault_hooks;
  if ((fail_point == "update" || fail_point == "pipeline" || fail_in_collective ||
       fail_in_commit) &&
      fail_at_step > 0 && rank == fail_rank && generation == 0 && attempt == 0) {
    using Where = KillInsideStep::Where;
    const Where where = fail_in_collective         ? Where::kCollective
                        : fail_in_commit           ? Where::kCommit
                        : fail_point == "pipeline" ? Where::kPipeline
                                                   : Where::kUpdate;
    const StepCollective which = fail_point == "grad-norm"    ? StepCollective::kGradNormAllreduce
                                 : fail_point == "all-gather" ? StepCollective::kParamAllgather
                                                              : StepCollective::kGradAllreduce;
    fault_hooks =
        std::make_unique<KillInsideStep>(trainer.get(), fail_at_step, fail_chunk, where, which);
    trainer->SetHooks(fault_hooks.get());
  }
  // The stages' logs: files in the rendezvous dir, or with --pipeline-log-dir
  // the spool's step files there (PipelineLog::ReadAny).
  const std::string log_dir =
      o.pipeline_log_dir.empty() ? o.comm.rendezvous_dir : o.pipeline_log_dir;
  // The stage's log (a file, or a spool's step files) of `r`.
  auto log_of_rank = [&](int r) { return log_dir + "/pipeline_log.rank" + std::to_string(r); };
  auto report_recovery = [&](const std::string& mode, bool replacement, int64_t from_step,
                             double seconds) {
    char line[512];
    std::snprintf(line, sizeof(line),
                  "{\"rank\": %d, \"mode\": \"%s\", \"generation\": %d, "
                  "\"replacement\": %s, \"from_step\": %" PRId64 ", \"step\": %" PRId64
                  ", \"replayed_steps\": %" PRId64
                  ", \"bytes_replayed\": %llu"
                  ", \"recover_s\": %.6f, \"wall_s\": %.6f}",
                  rank, mode.c_str(), generation, replacement ? "true" : "false", from_step,
                  trainer->state().step, trainer->replayed_steps(),
                  static_cast<unsigned long long>(trainer->replayed_bytes()), seconds,
                  WallSeconds());
    std::printf("{\"swift_recovery\": %s}\n", line);
    std::fflush(stdout);
    // For `memento launch` (its report per failure): launch/swift_protocol.h.
    if (mode != "restart" && !o.comm.rendezvous_dir.empty()) {
      launch::swift::WriteFileAtomic(
          launch::swift::RecoveredPath(o.comm.rendezvous_dir, generation, rank),
          std::string(line) + "\n")
          .IgnoreError();
    }
  };
  bool report_resume = generation > 0 || attempt > 0;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  std::unique_ptr<TrainerHooks> hooks;
  // Connects this rank to its node's agent; `restore`: loads the version the
  // cluster (or the agent's commit log) names.
  auto connect_memento = [&](bool restore) -> Status {
    int64_t restored = -1;
    if (ranks_per_node > 0) mo.node = rank / ranks_per_node;
    const std::string key = "{node}";
    if (size_t pos = mo.agent_dir.find(key); pos != std::string::npos) {
      mo.agent_dir.replace(pos, key.size(), std::to_string(mo.node));
    }
    mo.restore = restore;
    mo.skip_step =
        rank == fail_rank && generation == 0 && attempt == 0 ? skip_snapshot_step : int64_t{-1};
    mo.aor_test_late_sums =
        rank == fail_rank && generation == 0 && attempt == 0 ? aor_test_late_sums : int64_t{-1};
    auto connected = ConnectMemento(trainer.get(), mo, &restored);
    if (!connected.ok()) return connected.status().WithContext("memento");
    hooks = std::move(*connected);
    if (fault_hooks) {
      fault_hooks->set_inner(hooks.get());  // the fault point stays in front
    } else {
      trainer->SetHooks(hooks.get());
    }
    if (restored >= 0) std::printf("rank %d restored step %" PRId64 "\n", rank, restored);
    return Status::Ok();
  };
#endif
  // --perturb-replay: the loaded snapshot no longer matches what the
  // neighbours received from this stage.
  auto perturb = [&] {
    if (!perturb_replay || !replace || generation != 1 || attempt != 0) return;
    uint32_t bits;
    std::memcpy(&bits, trainer->params(), sizeof(bits));
    bits ^= 1u;
    std::memcpy(trainer->params(), &bits, sizeof(bits));
    std::fprintf(stderr, "memento-trainer rank %d: fault injection: perturbed parameter 0\n", rank);
  };
  // Under memento without --save, a log replayer's snapshot comes from its
  // node's T0: the newest intact version at or before the agreed step, the
  // same step on every replayer (Trainer::SnapshotSource).
  Trainer::SnapshotSource memento_source;
  int64_t loaded_step = -1;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  memento_source.newest = [&](int64_t target) -> Result<int64_t> {
    auto n = NewestMementoStep(hooks.get(), target);
    if (!n.ok()) return n.status().WithContext("the stage's snapshot");
    return n;
  };
  memento_source.load = [&](int64_t step) -> Status {
    Status st = RestoreMementoStep(hooks.get(), step);
    if (!st.ok()) return st.WithContext("the stage's snapshot of step " + std::to_string(step));
    loaded_step = step;
    std::fprintf(stderr,
                 "memento-trainer rank %d: loaded this stage's snapshot of step %" PRId64
                 " from its node's T0\n",
                 rank, step);
    perturb();
    return Status::Ok();
  };
#endif
  const Trainer::SnapshotSource* snapshot_source =
      save.empty() && memento_snapshots ? &memento_source : nullptr;
  if (replace && (recovery == "undo" || recovery == "log")) {
    Stopwatch w_recover;
    Result<int64_t> agreed = int64_t{0};
    int64_t from_step = -1;
    std::function<Status(int64_t)> restore_shard;
    std::function<Result<std::vector<int64_t>>()> held_shard;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
    // The replacement's state comes from the recovery, not from a restore;
    // under ZeRO-1 its moment shard from its node's tiers (Restore(step)).
    if (use_memento) {
      if (Status st = connect_memento(/*restore=*/false); !st.ok()) {
        std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
        return kExitRecoveryFailed;
      }
      if (o.zero1) {
        restore_shard = [&](int64_t step) { return RestoreMementoStep(hooks.get(), step); };
        held_shard = [&] { return HeldMementoSteps(hooks.get()); };
      }
    }
#endif
    if (recovery == "undo") {
      agreed = trainer->RecoverByUndo(/*replacement=*/true, restore_shard, held_shard);
    } else if (!save.empty()) {
      Status st = trainer->Load(RankPath(save, rank));
      from_step = trainer->state().step;
      if (st.ok()) perturb();
      agreed = st.ok() ? trainer->RecoverByReplay(log_of_rank, /*replacement=*/true, nullptr)
                       : Result<int64_t>(st);
    } else {
      // No --save: the stage's snapshot from memento (its node's T0).
      agreed =
          trainer->RecoverByReplay(log_of_rank, /*replacement=*/true, nullptr, snapshot_source);
      from_step = loaded_step;
    }
    if (!agreed.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: recovery: %s\n", rank,
                   agreed.status().ToString().c_str());
      return kExitRecoveryFailed;
    }
    if (trainer->hooks() != nullptr) {
      if (Status st = trainer->hooks()->AfterRecovery(*agreed, -1); !st.ok()) {
        std::fprintf(stderr, "memento-trainer rank %d: after recovery: %s\n", rank,
                     st.ToString().c_str());
        return kExitRecoveryFailed;
      }
    }
    report_recovery(recovery, true, from_step, w_recover.Seconds());
  }
  if (resume_from_saves) {
    Status st = ResumeFromSaves(*trainer, RankPath(save, rank),
                                load.empty() ? std::string() : RankPath(load, rank));
    if (!st.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
  } else if (!load.empty() && !replace) {
    Status st = trainer->Load(RankPath(load, rank));
    if (!st.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
  }
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  if (use_memento && hooks == nullptr) {
    if (Status st = connect_memento(/*restore=*/true); !st.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
  }
#endif
  if (!o.pipeline_log_dir.empty() && !replace) {
    // A restarted job (or one in a reused directory): this rank's spool
    // files beyond the step it starts from are an earlier attempt's; a
    // replay must not read them (they are rewritten as the steps are run).
    const int removed = RemoveSpoolFilesAfter(o.pipeline_log_dir, rank, trainer->state().step);
    if (removed > 0) {
      std::fprintf(stderr,
                   "memento-trainer rank %d: removed %d stale pipeline log step file(s) after "
                   "step %" PRId64 "\n",
                   rank, removed, trainer->state().step);
    }
  }
  if (generation > 0 && !replace) report_recovery("restart", false, -1, 0.0);
  // (A replacement's recovery already checked it, with the survivors.)
  if (Status st = replace ? Status::Ok() : trainer->CheckSameStep(); !st.ok()) {
    std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
    return 1;
  }
  if (rank == 0) {
    std::printf("memento-trainer: %" PRId64 " parameters, dp %d tp %d pp %d%s, batch %d x %d\n",
                o.model.NumParameters(), o.comm.topology.dp, o.comm.topology.tp, o.comm.topology.pp,
                o.zero1 ? " zero1" : "", o.global_batch, o.model.seq);
    std::fflush(stdout);
  }
  FILE* log = nullptr;
  if (!loss_log.empty() && trainer->reports_loss()) {
    log = std::fopen(loss_log.c_str(), "a");
    if (log == nullptr) {
      std::perror(loss_log.c_str());
      return 1;
    }
  }
  const int64_t first_step = trainer->state().step + 1;
  int64_t timed_steps = 0;
  double sum_s = 0, sum_idle = 0, sum_comm = 0, sum_fence = 0, sum_snap = 0, last_loss = 0;
  double sum_cpu = 0;                       // this rank's process CPU-seconds over the timed steps
  double sum_log_s = 0, sum_log_bytes = 0;  // pipeline log (--recovery log)
  std::vector<double> step_times;           // timed steps, for the median
  double window_s = 0, window_overhead_s = 0;  // since the last progress line
  int64_t window_steps = 0;
  while (trainer->state().step < steps) {
    const double cpu0 = ProcessCpuSeconds();
    auto r = trainer->Step();
    const double step_cpu_s = ProcessCpuSeconds() - cpu0;
    if (!r.ok() && (recovery == "undo" || recovery == "log")) {
      // In-process recovery: keep the state, wait for the launcher's new
      // generation (the lost rank restarted), reconnect, recover.
      std::fprintf(stderr, "memento-trainer rank %d: step %" PRId64 ": %s; recovering (%s)\n", rank,
                   trainer->state().step + 1, r.status().ToString().c_str(), recovery.c_str());
      if (rank == wedge_rank && generation == 0 && attempt == 0) {
        std::fprintf(stderr, "memento-trainer rank %d: wedging myself (SIGSTOP)\n", rank);
        std::fflush(nullptr);
        raise(SIGSTOP);
      }
      Stopwatch w_recover;
      const int64_t from_step = trainer->state().step;
      // A snapshot still reading the state finishes before anything rewrites it.
      Status st = trainer->hooks() != nullptr ? trainer->hooks()->BeforeRecovery() : Status::Ok();
      if (st.ok() && recovery == "log") {
        // The log is in the spool's files already (wait for the writer), or
        // written out of this rank's memory now.
        st = o.pipeline_log_dir.empty()
                 ? trainer->WritePipelineLog(o.comm.rendezvous_dir + "/pipeline_log.rank" +
                                             std::to_string(rank))
                 : trainer->FlushPipelineLog();
      }
      if (st.ok() && recovery == "log" && rank == corrupt_log_rank && generation == 0 &&
          attempt == 0) {
        st = CorruptNewestLogFile(
            o.pipeline_log_dir.empty()
                ? o.comm.rendezvous_dir + "/pipeline_log.rank" + std::to_string(rank)
                : PipelineLogSpool::StepPath(o.pipeline_log_dir, rank, from_step));
      }
      const double deadline = WallSeconds() + o.comm.timeout_s;
      while (st.ok() && ReadGeneration(o.comm.rendezvous_dir) <= generation) {
        if (WallSeconds() > deadline) {
          st = DeadlineExceededError("no new generation from the launcher");
          break;
        }
        usleep(5000);
      }
      if (st.ok()) {
        generation = ReadGeneration(o.comm.rendezvous_dir);
        st = trainer->Reconnect(base_run_id + "-g" + std::to_string(generation));
        if (st.ok()) {
          std::string kept;
          for (const std::string& g : trainer->comm().kept_groups()) kept += " " + g;
          std::fprintf(stderr,
                       "memento-trainer rank %d: reconnected (generation %d); kept Gloo "
                       "group(s):%s\n",
                       rank, generation, kept.empty() ? " none" : kept.c_str());
        }
      }
      if (st.ok()) {
        // (Selective logging: a survivor in the lost stage's log group rolls
        // back to its --save state, or without one to its memento snapshot.)
        std::function<Status()> rollback;
        if (!save.empty()) rollback = [&] { return trainer->Load(RankPath(save, rank)); };
        // (Undo: a survivor goes back to its own memento snapshot when a
        // ZeRO-1 replacement's moment shard of the agreed step is missing.)
        std::function<Status(int64_t)> restore_own;
        std::function<Result<std::vector<int64_t>>()> held;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
        if (hooks != nullptr) {
          restore_own = [&](int64_t step) { return RestoreMementoStep(hooks.get(), step); };
          held = [&] { return HeldMementoSteps(hooks.get()); };
        }
#endif
        auto agreed = recovery == "undo"
                          ? trainer->RecoverByUndo(false, restore_own, held)
                          : trainer->RecoverByReplay(log_of_rank, false, rollback, snapshot_source);
        st = agreed.status();
        if (agreed.ok() && trainer->hooks() != nullptr) {
          st = trainer->hooks()->AfterRecovery(*agreed, from_step);
        }
      }
      if (!st.ok()) {
        std::fprintf(stderr, "memento-trainer rank %d: recovery: %s\n", rank,
                     st.ToString().c_str());
        return kExitRecoveryFailed;
      }
      report_recovery(recovery, false, from_step, w_recover.Seconds());
      report_resume = true;
      continue;
    }
    if (!r.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: step %" PRId64 ": %s\n", rank,
                   trainer->state().step + 1, r.status().ToString().c_str());
      return 1;
    }
    if (report_resume && r->has_loss) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "{\"rank\": %d, \"step\": %" PRId64 ", \"generation\": %d, \"wall_s\": %.6f}",
                    rank, r->step, generation, WallSeconds());
      std::printf("{\"swift_resumed\": %s}\n", line);
      if (!o.comm.rendezvous_dir.empty()) {
        launch::swift::WriteFileAtomic(
            launch::swift::ResumedPath(o.comm.rendezvous_dir, generation), std::string(line) + "\n")
            .IgnoreError();
      }
      std::fflush(stdout);
    }
    report_resume = false;
    if (save_every > 0 && !save.empty() && r->step % save_every == 0) {
      if (rank == fail_rank && r->step == fail_at_step && fail_point == "save" && generation == 0 &&
          attempt == 0) {
        // Once the other ranks saved this step: the job holds saves of
        // different steps.
        const double deadline = WallSeconds() + o.comm.timeout_s;
        for (int other = 0; other < w && WallSeconds() < deadline; ++other) {
          while (other != rank && SavedStepOfFile(RankPath(save, other)) != r->step &&
                 WallSeconds() < deadline) {
            usleep(5000);
          }
        }
        std::fprintf(
            stderr, "memento-trainer rank %d: killing myself before the save of step %" PRId64 "\n",
            rank, r->step);
        std::fflush(nullptr);
        raise(SIGKILL);
      }
      // With recovery the previous save is kept (PATH.prev): until every
      // rank has saved this step, it is the newest one all ranks have.
      const std::string path = RankPath(save, rank);
      if (recovery != "none" && access(path.c_str(), R_OK) == 0) {
        // A hard link, so PATH itself never goes missing (Save replaces it
        // atomically).
        const std::string prev = path + ".prev";
        if ((unlink(prev.c_str()) != 0 && errno != ENOENT) ||
            link(path.c_str(), prev.c_str()) != 0) {
          std::perror(prev.c_str());
          return 1;
        }
      }
      Status st = trainer->Save(path);
      if (!st.ok()) {
        std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
        return 1;
      }
      // The save before this one is on every rank (all completed this
      // step): log entries up to it are garbage.
      trainer->TruncatePipelineLog(r->step - save_every);
    }
#ifdef MEMENTO_TRAINER_WITH_CLIENT
    if (recovery == "log" && save.empty() && use_memento && r->step % mo.every == 0) {
      // Every rank holds a memento version of step - every intact by now (it
      // fenced it before its update of the step after): older log entries
      // are garbage; one interval more is kept for a rank whose newest
      // version was cut short.
      trainer->TruncatePipelineLog(r->step - 2 * mo.every);
    }
#endif
    if (r->step > first_step || steps == first_step) {
      ++timed_steps;
      sum_s += r->seconds;
      sum_idle += r->idle_seconds;
      sum_comm += r->comm_seconds;
      sum_fence += r->fence_seconds;
      sum_snap += r->snapshot_seconds;
      sum_cpu += step_cpu_s;
      sum_log_s += r->log_seconds;
      sum_log_bytes += static_cast<double>(r->log_bytes);
      step_times.push_back(r->seconds);
    }
    last_loss = r->loss;
    window_s += r->seconds;
    window_overhead_s += r->fence_seconds + r->snapshot_seconds;
    ++window_steps;
    if (r->has_loss && progress_every > 0 && (r->step % progress_every == 0 || r->step == steps)) {
      const double step_ms = window_s / window_steps * 1e3;
      const double over_ms = window_overhead_s / window_steps * 1e3;
      std::printf(
          "progress step %" PRId64 " loss %.4f step_ms %.1f snapshot_overhead_ms %.2f (%.1f%%)\n",
          r->step, r->loss, step_ms, over_ms, step_ms > 0 ? 100.0 * over_ms / step_ms : 0.0);
      std::fflush(stdout);
    }
    if (progress_every > 0 && (r->step % progress_every == 0 || r->step == steps)) {
      window_s = window_overhead_s = 0;
      window_steps = 0;
    }
    if (r->has_loss) {
      if (!quiet && progress_every <= 0) {
        const std::string note =
            trainer->hooks() != nullptr ? trainer->hooks()->ProgressNote() : std::string();
        std::printf("step %" PRId64
                    " loss %.6f grad_norm %.4f time_ms %.1f idle_ms %.1f comm_ms %.1f"
                    " fence_ms %.2f snapshot_ms %.2f%s%s\n",
                    r->step, r->loss, r->grad_norm, r->seconds * 1e3, r->idle_seconds * 1e3,
                    r->comm_seconds * 1e3, r->fence_seconds * 1e3, r->snapshot_seconds * 1e3,
                    note.empty() ? "" : " ", note.c_str());
        std::fflush(stdout);
      }
      if (log != nullptr) {
        uint64_t bits;
        std::memcpy(&bits, &r->loss, sizeof(bits));
        std::fprintf(log, "%" PRId64 " %.17g %016" PRIx64 " %.17g\n", r->step, r->loss, bits,
                     r->grad_norm);
        std::fflush(log);
      }
    }
    if (rank == fail_rank && r->step == fail_at_step && fail_point == "step" && generation == 0 &&
        attempt == 0) {
      std::fprintf(stderr, "memento-trainer rank %d: killing myself after step %" PRId64 "\n", rank,
                   r->step);
      std::fflush(nullptr);
      raise(SIGKILL);
    }
  }
  if (log != nullptr) std::fclose(log);
  if (json) {
    // Every rank: its own summary (snapshot statistics per HAS layer).
    const std::string hooks_json =
        trainer->hooks() != nullptr ? trainer->hooks()->SummaryJson() : std::string();
    std::printf(
        "{\"rank_summary\": {\"rank\": %d, \"pp_rank\": %d, \"mean_step_s\": %.6f, "
        "\"mean_cpu_s\": %.6f, \"log_bytes_per_step\": %.1f, \"log_s_per_step\": %.6f, "
        "\"log_spool_bytes\": %llu, \"log_spool_write_s\": %.6f, \"snapshot\": %s}}\n",
        rank, trainer->comm().pp_rank(), timed_steps > 0 ? sum_s / timed_steps : 0.0,
        timed_steps > 0 ? sum_cpu / timed_steps : 0.0,
        timed_steps > 0 ? sum_log_bytes / timed_steps : 0.0,
        timed_steps > 0 ? sum_log_s / timed_steps : 0.0,
        trainer->pipeline_log_spool() != nullptr
            ? static_cast<unsigned long long>(trainer->pipeline_log_spool()->bytes_written())
            : 0ULL,
        trainer->pipeline_log_spool() != nullptr ? trainer->pipeline_log_spool()->write_seconds()
                                                 : 0.0,
        hooks_json.empty() ? "null" : hooks_json.c_str());
  }
  if (json && trainer->reports_loss() && timed_steps > 0) {
    const double mean = sum_s / timed_steps;
    std::vector<double> sorted = step_times;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    std::string times;
    for (double t : step_times) {
      char b[32];
      std::snprintf(b, sizeof(b), "%s%.6f", times.empty() ? "" : ", ", t);
      times += b;
    }
    std::printf("{\"params\": %" PRId64
                ", \"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero1\": %s, "
                "\"micro_batches\": %d, \"batch\": %d, \"seq\": %d, \"steps\": %" PRId64
                ", \"final_loss\": %.6f, \"mean_step_s\": %.6f, \"mean_idle_s\": %.6f, "
                "\"mean_comm_s\": %.6f, \"mean_fence_s\": %.6f, \"mean_snapshot_s\": %.6f, "
                "\"mean_cpu_s\": %.6f, \"tokens_per_s\": %.1f, \"median_step_s\": %.6f, "
                "\"step_s\": [%s]}\n",
                o.model.NumParameters(), o.comm.topology.dp, o.comm.topology.tp, o.comm.topology.pp,
                o.zero1 ? "true" : "false", o.micro_batches, o.global_batch, o.model.seq,
                trainer->state().step, last_loss, mean, sum_idle / timed_steps,
                sum_comm / timed_steps, sum_fence / timed_steps, sum_snap / timed_steps,
                sum_cpu / timed_steps, static_cast<double>(o.global_batch) * o.model.seq / mean,
                median, times.c_str());
  }
  if (!save.empty()) {
    Status st = trainer->Save(RankPath(save, rank));
    if (!st.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
  }
  std::printf("rank %d step %" PRId64 " checksum %016" PRIx64 "\n", rank, trainer->state().step,
              trainer->StateChecksum());
  if (!digest_file.empty()) {
    Status st = WriteDigest(*trainer, RankPath(digest_file, rank));
    if (!st.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
  }
  Status st = trainer->comm().Barrier();
  if (!st.ok()) {
    std::fprintf(stderr, "memento-trainer rank %d: %s\n", rank, st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace memento::trainer

int main(int argc, char** argv) { return memento::trainer::Main(argc, argv); }
