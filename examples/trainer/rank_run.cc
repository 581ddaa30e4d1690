// One rank of a memento-trainer job (rank_run.h).
#include "rank_run.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "common/clock.h"
#include "launch/swift_protocol.h"
#include "memento_hooks.h"
#include "rank_files.h"

namespace memento::trainer {
namespace {

// In-process recovery speaks the launchers' shared protocol
// (launch/swift_protocol.h): generation file, exit status 75, reports.
using launch::swift::kExitRecoveryFailed;
using launch::swift::ReadGeneration;
using launch::swift::WallSeconds;

// CPU time of this process (all its threads: training, Gloo, memento's copy
// workers), in seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

void RankRun::PrintError(const Status& st, const char* context) const {
  std::fprintf(stderr, "memento-trainer rank %d: %s%s\n", rank_, context, st.ToString().c_str());
}

std::string RankRun::LogOfRank(int r) const {
  // Files in the rendezvous dir, or with --pipeline-log-dir the spool's step
  // files there (PipelineLog::ReadAny).
  const TrainerOptions& o = cli_.options;
  const std::string& log_dir =
      o.pipeline_log_dir.empty() ? o.comm.rendezvous_dir : o.pipeline_log_dir;
  return log_dir + "/pipeline_log.rank" + std::to_string(r);
}

int RankRun::Run() {
  TrainerOptions& o = cli_.options;
  // A write to a dead peer's socket must be an error Gloo reports, not a
  // SIGPIPE that kills a survivor in the middle of its recovery.
  if (cli_.recovery != "none") signal(SIGPIPE, SIG_IGN);
  // Log replay also undoes a survivor's step when another survivor is one
  // step behind (docs/swift.md).
  o.undo_log = InProcessRecovery();
  o.pipeline_log = cli_.recovery == "log";
  base_run_id_ = o.comm.run_id;
  if (cli_.generation > 0) o.comm.run_id = base_run_id_ + "-g" + std::to_string(cli_.generation);
  if (Exit e = CreateTrainer()) return *e;
  InstallFaultHooks();
  report_resume_ = cli_.generation > 0 || cli_.attempt > 0;
  SetUpMementoSource();
  if (cli_.replace && InProcessRecovery()) {
    if (Exit e = RecoverAsReplacement()) return *e;
  }
  if (Exit e = LoadState()) return *e;
  PrintHeader();
  StepReport report(cli_, trainer_->state().step + 1);
  if (!report.OpenLossLog(trainer_->reports_loss())) return 1;
  if (Exit e = Train(&report)) return *e;
  report.Close();
  report.PrintSummaries(*trainer_);
  if (Exit e = Finish()) return *e;
  return 0;
}

RankRun::Exit RankRun::CreateTrainer() {
  auto created = Trainer::Create(cli_.options, nullptr);
  if (!created.ok()) {
    std::fprintf(stderr, "memento-trainer rank %d: %s\n", cli_.options.comm.rank,
                 created.status().ToString().c_str());
    // A replacement that cannot join the survivors: fall back to restart.
    return cli_.replace ? kExitRecoveryFailed : 1;
  }
  trainer_ = std::move(*created);
  rank_ = cli_.options.comm.rank;
  if (cli_.log_worker_paused && trainer_->pipeline_log_writer() != nullptr)
    trainer_->pipeline_log_writer()->PauseWorkerForTest();
  return std::nullopt;
}

void RankRun::InstallFaultHooks() {
  const std::string& point = cli_.fail_point;
  if ((point == "update" || point == "pipeline" || cli_.FailsInCollective() ||
       cli_.FailsInCommit()) &&
      cli_.fail_at_step > 0 && cli_.IsFaultRank(rank_)) {
    using Where = KillInsideStep::Where;
    const Where where = cli_.FailsInCollective() ? Where::kCollective
                        : cli_.FailsInCommit()   ? Where::kCommit
                        : point == "pipeline"    ? Where::kPipeline
                                                 : Where::kUpdate;
    const StepCollective which = point == "grad-norm"    ? StepCollective::kGradNormAllreduce
                                 : point == "all-gather" ? StepCollective::kParamAllgather
                                                         : StepCollective::kGradAllreduce;
    fault_hooks_ = std::make_unique<KillInsideStep>(trainer_.get(), cli_.fail_at_step,
                                                    cli_.fail_chunk, where, which);
    trainer_->SetHooks(fault_hooks_.get());
  }
}

void RankRun::ReportRecovery(const std::string& mode, bool replacement, int64_t from_step,
                             double seconds) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "{\"rank\": %d, \"mode\": \"%s\", \"generation\": %d, "
                "\"replacement\": %s, \"from_step\": %" PRId64 ", \"step\": %" PRId64
                ", \"replayed_steps\": %" PRId64
                ", \"bytes_replayed\": %llu"
                ", \"recover_s\": %.6f, \"wall_s\": %.6f}",
                rank_, mode.c_str(), cli_.generation, replacement ? "true" : "false", from_step,
                trainer_->state().step, trainer_->replayed_steps(),
                static_cast<unsigned long long>(trainer_->replayed_bytes()), seconds,
                WallSeconds());
  std::printf("{\"swift_recovery\": %s}\n", line);
  std::fflush(stdout);
  // For `memento launch` (its report per failure): launch/swift_protocol.h.
  const std::string& rendezvous = cli_.options.comm.rendezvous_dir;
  if (mode != "restart" && !rendezvous.empty()) {
    launch::swift::WriteFileAtomic(launch::swift::RecoveredPath(rendezvous, cli_.generation, rank_),
                                   std::string(line) + "\n")
        .IgnoreError();
  }
}

Status RankRun::ConnectToMemento(bool restore) {
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  MementoHookOptions& mo = cli_.memento;
  int64_t restored = -1;
  if (cli_.ranks_per_node > 0) mo.node = rank_ / cli_.ranks_per_node;
  const std::string key = "{node}";
  if (size_t pos = mo.agent_dir.find(key); pos != std::string::npos) {
    mo.agent_dir.replace(pos, key.size(), std::to_string(mo.node));
  }
  mo.restore = restore;
  mo.skip_step = cli_.IsFaultRank(rank_) ? cli_.skip_snapshot_step : int64_t{-1};
  mo.aor_test_late_sums = cli_.IsFaultRank(rank_) ? cli_.aor_test_late_sums : int64_t{-1};
  auto connected = ConnectMemento(trainer_.get(), mo, &restored);
  if (!connected.ok()) return connected.status().WithContext("memento");
  hooks_ = std::move(*connected);
  if (fault_hooks_) {
    fault_hooks_->set_inner(hooks_.get());  // the fault point stays in front
  } else {
    trainer_->SetHooks(hooks_.get());
  }
  if (restored >= 0) std::printf("rank %d restored step %" PRId64 "\n", rank_, restored);
  return Status::Ok();
#else
  (void)restore;
  return FailedPreconditionError("memento-trainer was built without the memento client");
#endif
}

void RankRun::Perturb() {
  // --perturb-replay: the loaded snapshot no longer matches what the
  // neighbours received from this stage.
  if (!cli_.perturb_replay || !cli_.replace || cli_.generation != 1 || cli_.attempt != 0) return;
  uint32_t bits;
  std::memcpy(&bits, trainer_->params(), sizeof(bits));
  bits ^= 1u;
  std::memcpy(trainer_->params(), &bits, sizeof(bits));
  std::fprintf(stderr, "memento-trainer rank %d: fault injection: perturbed parameter 0\n", rank_);
}

void RankRun::SetUpMementoSource() {
  // Under memento without --save, a log replayer's snapshot comes from its
  // node's T0: the newest intact version at or before the agreed step, the
  // same step on every replayer (Trainer::SnapshotSource).
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  memento_source_.newest = [this](int64_t target) -> Result<int64_t> {
    auto n = NewestMementoStep(hooks_.get(), target);
    if (!n.ok()) return n.status().WithContext("the stage's snapshot");
    return n;
  };
  memento_source_.load = [this](int64_t step) -> Status {
    Status st = RestoreMementoStep(hooks_.get(), step);
    if (!st.ok()) return st.WithContext("the stage's snapshot of step " + std::to_string(step));
    loaded_step_ = step;
    std::fprintf(stderr,
                 "memento-trainer rank %d: loaded this stage's snapshot of step %" PRId64
                 " from its node's T0\n",
                 rank_, step);
    Perturb();
    return Status::Ok();
  };
#endif
}

const Trainer::SnapshotSource* RankRun::ReplaySource() const {
  return cli_.save.empty() && cli_.use_memento ? &memento_source_ : nullptr;
}

RankRun::Exit RankRun::RecoverAsReplacement() {
  Stopwatch w_recover;
  Result<int64_t> agreed = int64_t{0};
  int64_t from_step = -1;
  std::function<Status(int64_t)> restore_shard;
  std::function<Result<std::vector<int64_t>>()> held_shard;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  // The replacement's state comes from the recovery, not from a restore;
  // under ZeRO-1 its moment shard from its node's tiers (Restore(step)).
  if (cli_.use_memento) {
    if (Status st = ConnectToMemento(/*restore=*/false); !st.ok()) {
      PrintError(st);
      return kExitRecoveryFailed;
    }
    if (cli_.options.zero1) {
      restore_shard = [this](int64_t step) { return RestoreMementoStep(hooks_.get(), step); };
      held_shard = [this] { return HeldMementoSteps(hooks_.get()); };
    }
  }
#endif
  auto log_of_rank = [this](int r) { return LogOfRank(r); };
  if (cli_.recovery == "undo") {
    agreed = trainer_->RecoverByUndo(/*replacement=*/true, restore_shard, held_shard);
  } else if (!cli_.save.empty()) {
    Status st = trainer_->Load(RankPath(cli_.save, rank_));
    from_step = trainer_->state().step;
    if (st.ok()) Perturb();
    agreed = st.ok() ? trainer_->RecoverByReplay(log_of_rank, /*replacement=*/true, nullptr)
                     : Result<int64_t>(st);
  } else {
    // No --save: the stage's snapshot from memento (its node's T0).
    agreed = trainer_->RecoverByReplay(log_of_rank, /*replacement=*/true, nullptr, ReplaySource());
    from_step = loaded_step_;
  }
  if (!agreed.ok()) {
    PrintError(agreed.status(), "recovery: ");
    return kExitRecoveryFailed;
  }
  if (trainer_->hooks() != nullptr) {
    if (Status st = trainer_->hooks()->AfterRecovery(*agreed, -1); !st.ok()) {
      PrintError(st, "after recovery: ");
      return kExitRecoveryFailed;
    }
  }
  ReportRecovery(cli_.recovery, true, from_step, w_recover.Seconds());
  return std::nullopt;
}

RankRun::Exit RankRun::LoadState() {
  // A restarted rank (generation > 0, also the fallback of undo and log: a
  // rank of a later generation that replaces no one) resumes from the newest
  // step every rank saved (ResumeFromSaves).
  const bool resume_from_saves =
      cli_.generation > 0 && !cli_.replace && cli_.recovery != "none" && !cli_.save.empty();
  if (resume_from_saves) {
    Status st = ResumeFromSaves(*trainer_, RankPath(cli_.save, rank_),
                                cli_.load.empty() ? std::string() : RankPath(cli_.load, rank_));
    if (!st.ok()) {
      PrintError(st);
      return 1;
    }
  } else if (!cli_.load.empty() && !cli_.replace) {
    Status st = trainer_->Load(RankPath(cli_.load, rank_));
    if (!st.ok()) {
      PrintError(st);
      return 1;
    }
  }
  if (cli_.use_memento && hooks_ == nullptr) {
    if (Status st = ConnectToMemento(/*restore=*/true); !st.ok()) {
      PrintError(st);
      return 1;
    }
  }
  const std::string& spool_dir = cli_.options.pipeline_log_dir;
  if (!spool_dir.empty() && !cli_.replace) {
    // A restarted job (or one in a reused directory): this rank's spool
    // files beyond the step it starts from are an earlier attempt's; a
    // replay must not read them (they are rewritten as the steps are run).
    const int removed = RemoveSpoolFilesAfter(spool_dir, rank_, trainer_->state().step);
    if (removed > 0) {
      std::fprintf(stderr,
                   "memento-trainer rank %d: removed %d stale pipeline log step file(s) after "
                   "step %" PRId64 "\n",
                   rank_, removed, trainer_->state().step);
    }
  }
  if (cli_.generation > 0 && !cli_.replace) ReportRecovery("restart", false, -1, 0.0);
  // (A replacement's recovery already checked it, with the survivors.)
  if (Status st = cli_.replace ? Status::Ok() : trainer_->CheckSameStep(); !st.ok()) {
    PrintError(st);
    return 1;
  }
  return std::nullopt;
}

void RankRun::PrintHeader() {
  if (rank_ != 0) return;
  const TrainerOptions& o = cli_.options;
  std::printf("memento-trainer: %" PRId64 " parameters, dp %d tp %d pp %d%s, batch %d x %d\n",
              o.model.NumParameters(), o.comm.topology.dp, o.comm.topology.tp, o.comm.topology.pp,
              o.zero1 ? " zero1" : "", o.global_batch, o.model.seq);
  std::fflush(stdout);
}

RankRun::Exit RankRun::Train(StepReport* report) {
  while (trainer_->state().step < cli_.steps) {
    const double cpu0 = ProcessCpuSeconds();
    auto r = trainer_->Step();
    const double step_cpu_s = ProcessCpuSeconds() - cpu0;
    if (!r.ok() && InProcessRecovery()) {
      if (Exit e = RecoverInProcess(r.status())) return e;
      continue;
    }
    if (!r.ok()) {
      std::fprintf(stderr, "memento-trainer rank %d: step %" PRId64 ": %s\n", rank_,
                   trainer_->state().step + 1, r.status().ToString().c_str());
      return 1;
    }
    ReportResumed(*r);
    if (Exit e = SaveAfterStep(*r)) return e;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
    const int64_t every = cli_.memento.every;
    if (cli_.recovery == "log" && cli_.save.empty() && cli_.use_memento && r->step % every == 0) {
      // Every rank holds a memento version of step - every intact by now (it
      // fenced it before its update of the step after): older log entries
      // are garbage; one interval more is kept for a rank whose newest
      // version was cut short.
      trainer_->TruncatePipelineLog(r->step - 2 * every);
    }
#endif
    report->Add(*trainer_, *r, step_cpu_s);
    if (cli_.IsFaultRank(rank_) && r->step == cli_.fail_at_step && cli_.fail_point == "step") {
      std::fprintf(stderr, "memento-trainer rank %d: killing myself after step %" PRId64 "\n",
                   rank_, r->step);
      std::fflush(nullptr);
      raise(SIGKILL);
    }
  }
  return std::nullopt;
}

RankRun::Exit RankRun::RecoverInProcess(const Status& step_error) {
  // In-process recovery: keep the state, wait for the launcher's new
  // generation (the lost rank restarted), reconnect, recover.
  std::fprintf(stderr, "memento-trainer rank %d: step %" PRId64 ": %s; recovering (%s)\n", rank_,
               trainer_->state().step + 1, step_error.ToString().c_str(), cli_.recovery.c_str());
  if (rank_ == cli_.wedge_rank && cli_.FirstRun()) {
    std::fprintf(stderr, "memento-trainer rank %d: wedging myself (SIGSTOP)\n", rank_);
    std::fflush(nullptr);
    raise(SIGSTOP);
  }
  Stopwatch w_recover;
  const int64_t from_step = trainer_->state().step;
  const TrainerOptions& o = cli_.options;
  const std::string memory_log =
      o.comm.rendezvous_dir + "/pipeline_log.rank" + std::to_string(rank_);
  // A snapshot still reading the state finishes before anything rewrites it.
  Status st = trainer_->hooks() != nullptr ? trainer_->hooks()->BeforeRecovery() : Status::Ok();
  if (st.ok() && cli_.recovery == "log") {
    // The log is in the spool's files already (wait for the writer), or
    // written out of this rank's memory now.
    st = o.pipeline_log_dir.empty() ? trainer_->WritePipelineLog(memory_log)
                                    : trainer_->FlushPipelineLog();
  }
  if (st.ok() && cli_.recovery == "log" && rank_ == cli_.corrupt_log_rank && cli_.FirstRun()) {
    st = CorruptNewestLogFile(
        o.pipeline_log_dir.empty()
            ? memory_log
            : PipelineLogSpool::StepPath(o.pipeline_log_dir, rank_, from_step));
  }
  if (st.ok()) st = WaitAndReconnect();
  if (st.ok()) st = RecoverAsSurvivor(from_step);
  if (!st.ok()) {
    PrintError(st, "recovery: ");
    return kExitRecoveryFailed;
  }
  ReportRecovery(cli_.recovery, false, from_step, w_recover.Seconds());
  report_resume_ = true;
  return std::nullopt;
}

Status RankRun::WaitAndReconnect() {
  const std::string& rendezvous = cli_.options.comm.rendezvous_dir;
  const double deadline = WallSeconds() + cli_.options.comm.timeout_s;
  while (ReadGeneration(rendezvous) <= cli_.generation) {
    if (WallSeconds() > deadline)
      return DeadlineExceededError("no new generation from the launcher");
    usleep(5000);
  }
  cli_.generation = ReadGeneration(rendezvous);
  MEMENTO_RETURN_IF_ERROR(
      trainer_->Reconnect(base_run_id_ + "-g" + std::to_string(cli_.generation)));
  std::string kept;
  for (const std::string& g : trainer_->comm().kept_groups()) kept += " " + g;
  std::fprintf(stderr,
               "memento-trainer rank %d: reconnected (generation %d); kept Gloo "
               "group(s):%s\n",
               rank_, cli_.generation, kept.empty() ? " none" : kept.c_str());
  return Status::Ok();
}

Status RankRun::RecoverAsSurvivor(int64_t from_step) {
  // (Selective logging: a survivor in the lost stage's log group rolls back
  // to its --save state, or without one to its memento snapshot.)
  std::function<Status()> rollback;
  if (!cli_.save.empty()) {
    rollback = [this] { return trainer_->Load(RankPath(cli_.save, rank_)); };
  }
  // (Undo: a survivor goes back to its own memento snapshot when a ZeRO-1
  // replacement's moment shard of the agreed step is missing.)
  std::function<Status(int64_t)> restore_own;
  std::function<Result<std::vector<int64_t>>()> held;
#ifdef MEMENTO_TRAINER_WITH_CLIENT
  if (hooks_ != nullptr) {
    restore_own = [this](int64_t step) { return RestoreMementoStep(hooks_.get(), step); };
    held = [this] { return HeldMementoSteps(hooks_.get()); };
  }
#endif
  auto log_of_rank = [this](int r) { return LogOfRank(r); };
  auto agreed = cli_.recovery == "undo"
                    ? trainer_->RecoverByUndo(false, restore_own, held)
                    : trainer_->RecoverByReplay(log_of_rank, false, rollback, ReplaySource());
  MEMENTO_RETURN_IF_ERROR(agreed.status());
  if (trainer_->hooks() != nullptr) return trainer_->hooks()->AfterRecovery(*agreed, from_step);
  return Status::Ok();
}

void RankRun::ReportResumed(const StepResult& r) {
  if (report_resume_ && r.has_loss) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "{\"rank\": %d, \"step\": %" PRId64 ", \"generation\": %d, \"wall_s\": %.6f}",
                  rank_, r.step, cli_.generation, WallSeconds());
    std::printf("{\"swift_resumed\": %s}\n", line);
    const std::string& rendezvous = cli_.options.comm.rendezvous_dir;
    if (!rendezvous.empty()) {
      launch::swift::WriteFileAtomic(launch::swift::ResumedPath(rendezvous, cli_.generation),
                                     std::string(line) + "\n")
          .IgnoreError();
    }
    std::fflush(stdout);
  }
  report_resume_ = false;
}

void RankRun::KillBeforeSave(const StepResult& r) {
  // Once the other ranks saved this step: the job holds saves of different
  // steps.
  const int w = cli_.options.comm.topology.world();
  const double deadline = WallSeconds() + cli_.options.comm.timeout_s;
  for (int other = 0; other < w && WallSeconds() < deadline; ++other) {
    while (other != rank_ && SavedStepOfFile(RankPath(cli_.save, other)) != r.step &&
           WallSeconds() < deadline) {
      usleep(5000);
    }
  }
  std::fprintf(stderr,
               "memento-trainer rank %d: killing myself before the save of step %" PRId64 "\n",
               rank_, r.step);
  std::fflush(nullptr);
  raise(SIGKILL);
}

RankRun::Exit RankRun::SaveAfterStep(const StepResult& r) {
  if (cli_.save_every <= 0 || cli_.save.empty() || r.step % cli_.save_every != 0) {
    return std::nullopt;
  }
  if (cli_.IsFaultRank(rank_) && r.step == cli_.fail_at_step && cli_.fail_point == "save") {
    KillBeforeSave(r);
  }
  // With recovery the previous save is kept (PATH.prev): until every rank
  // has saved this step, it is the newest one all ranks have.
  const std::string path = RankPath(cli_.save, rank_);
  if (cli_.recovery != "none" && access(path.c_str(), R_OK) == 0) {
    // A hard link, so PATH itself never goes missing (Save replaces it
    // atomically).
    const std::string prev = path + ".prev";
    if ((unlink(prev.c_str()) != 0 && errno != ENOENT) || link(path.c_str(), prev.c_str()) != 0) {
      std::perror(prev.c_str());
      return 1;
    }
  }
  if (Status st = trainer_->Save(path); !st.ok()) {
    PrintError(st);
    return 1;
  }
  // The save before this one is on every rank (all completed this step):
  // log entries up to it are garbage.
  trainer_->TruncatePipelineLog(r.step - cli_.save_every);
  return std::nullopt;
}

RankRun::Exit RankRun::Finish() {
  if (!cli_.save.empty()) {
    if (Status st = trainer_->Save(RankPath(cli_.save, rank_)); !st.ok()) {
      PrintError(st);
      return 1;
    }
  }
  std::printf("rank %d step %" PRId64 " checksum %016" PRIx64 "\n", rank_, trainer_->state().step,
              trainer_->StateChecksum());
  if (!cli_.digest_file.empty()) {
    if (Status st = WriteDigest(*trainer_, RankPath(cli_.digest_file, rank_)); !st.ok()) {
      PrintError(st);
      return 1;
    }
  }
  if (Status st = trainer_->comm().Barrier(); !st.ok()) {
    PrintError(st);
    return 1;
  }
  return std::nullopt;
}

}  // namespace memento::trainer
