// update-undo in the reference trainer (SWIFT 2.1, issue 19, docs/swift.md):
// ranks as threads of this process, Gloo over TCP between them. One rank
// fails inside its optimizer update (before a chunk drawn from the test's
// seed); every rank's step then fails (the failed rank drops its process
// groups, so its peers' collectives and receives fail), all reconnect in
// process (new Gloo contexts, state kept), agree on the last step every rank
// completed, undo what lies beyond it, and train on. The state of every rank
// at the agreed step and at the end must equal a failure-free run's, bit for
// bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "trainer.h"

namespace memento::trainer {
namespace {

// Ranks run as threads of this process: a write to a peer's socket that a
// killed rank's side has closed must fail with EPIPE, not kill the test
// (it died of SIGPIPE once in a fresh-clone CI run).
const bool kIgnoreSigpipe = [] {
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

TrainerOptions TinyOptions() {
  TrainerOptions o;
  o.model = ModelConfig{64, 16, 32, 4, 2, 4};
  o.global_batch = 4;
  o.micro_batches = 2;
  o.adam.warmup_steps = 2;
  o.comm.timeout_s = 30;  // a backstop only: a dropped peer fails calls at once
  return o;
}

// Fails optimizer step `fail_step` before its chunk `fail_chunk`, once.
class FailInsideUpdate : public TrainerHooks {
 public:
  Status OnOptimizerChunk(int64_t step, uint64_t offset, uint64_t count) override {
    if (step == fail_step) ++chunks_seen;
    if (fired || step != fail_step || chunks_seen - 1 != fail_chunk) return Status::Ok();
    fired = true;
    return AbortedError("injected failure inside optimizer step " + std::to_string(step));
  }
  int64_t fail_step = -1;
  int fail_chunk = 0;
  int chunks_seen = 0;
  bool fired = false;
};

struct RankRun {
  Status status;
  std::map<int64_t, uint64_t> checksum;  // state after each step reached
  int64_t agreed = -1;                   // the step RecoverByUndo agreed on
  int failures = 0;
  bool fired = false;
  bool undone = false;  // this rank's state moved back (it was past the agreed step)
};

// Runs `ranks` ranks to step `steps`. With fail_rank >= 0 that rank fails
// inside optimizer step fail_step before chunk fail_chunk.
// With `replace`, the failed rank's process is gone: a fresh Trainer (empty
// state) takes its place and gets the state from a DP replica.
std::vector<RankRun> Run(TrainerOptions o, int ranks, int steps, int fail_rank, int64_t fail_step,
                         int fail_chunk, bool replace = false) {
  memento::testing::ScratchDir dir("trainer-swift");
  o.comm.rendezvous_dir = dir.path();
  std::vector<RankRun> runs(ranks);
  auto body = [&](int rank) {
    RankRun& run = runs[rank];
    TrainerOptions ro = o;
    ro.comm.rank = rank;
    FailInsideUpdate hooks;
    if (rank == fail_rank) {
      hooks.fail_step = fail_step;
      hooks.fail_chunk = fail_chunk;
    }
    auto t = Trainer::Create(ro, &hooks);
    if (!t.ok()) {
      run.status = t.status();
      return;
    }
    std::unique_ptr<Trainer> owned = std::move(*t);
    while (owned->state().step < steps) {
      Trainer& tr = *owned;
      auto r = tr.Step();
      if (r.ok()) {
        run.checksum[tr.state().step] = tr.StateChecksum();
        continue;
      }
      if (++run.failures > 1) {
        run.status = r.status();
        return;
      }
      const int64_t before = tr.state().step;
      const bool half = tr.in_update();
      const bool replacement = replace && rank == fail_rank;
      if (replacement) {
        owned.reset();  // drops the groups: the peers fail at once
        TrainerOptions n = ro;
        n.comm.run_id = "recovery1";
        auto fresh = Trainer::Create(n, nullptr);
        if (!fresh.ok()) {
          run.status = fresh.status();
          return;
        }
        owned = std::move(*fresh);
      } else {
        Status st = tr.Reconnect("recovery1");
        if (!st.ok()) {
          run.status = st;
          return;
        }
      }
      Trainer& now = *owned;
      auto agreed = now.RecoverByUndo(replacement);
      if (!agreed.ok()) {
        run.status = agreed.status();
        return;
      }
      run.agreed = *agreed;
      run.undone = !replacement && (half || before > *agreed);
      EXPECT_FALSE(now.in_update());
      EXPECT_EQ(now.state().step, *agreed);
      run.checksum[now.state().step] = now.StateChecksum();
    }
    run.fired = hooks.fired;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(body, r);
  for (std::thread& th : threads) th.join();
  return runs;
}

void CheckRecoveredEqualsFailureFree(const TrainerOptions& o, int ranks, int steps, int fail_rank,
                                     int64_t fail_step, bool replace = false) {
  const uint64_t seed = memento::testing::TestSeed("trainer_swift");
  std::mt19937_64 rng(seed);
  const int fail_chunk = static_cast<int>(rng() % 3);
  std::printf("seed %llu: rank %d fails inside optimizer step %lld before chunk %d\n",
              static_cast<unsigned long long>(seed), fail_rank, static_cast<long long>(fail_step),
              fail_chunk);
  TrainerOptions clean_options = o;
  clean_options.undo_log = false;  // the log must not change a bit
  std::vector<RankRun> clean = Run(clean_options, ranks, steps, -1, -1, 0);
  TrainerOptions undo_options = o;
  undo_options.undo_log = true;
  std::vector<RankRun> failed =
      Run(undo_options, ranks, steps, fail_rank, fail_step, fail_chunk, replace);
  int undone = 0;
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(clean[r].status.ok()) << clean[r].status;
    ASSERT_TRUE(failed[r].status.ok()) << failed[r].status;
    EXPECT_EQ(failed[r].fired, r == fail_rank);
    EXPECT_EQ(failed[r].failures, 1);
    // The failed rank never completed fail_step: the job agrees on the step
    // before it. A replaced rank's step does not count: without ZeRO-1 the
    // survivors all completed fail_step, and no step is lost.
    EXPECT_EQ(failed[r].agreed, replace ? fail_step : fail_step - 1);
    undone += failed[r].undone;
    // Every state reached (the agreed step after the undo included) is the
    // failure-free run's state at that step.
    for (const auto& [step, sum] : failed[r].checksum) {
      ASSERT_TRUE(clean[r].checksum.count(step)) << "step " << step;
      EXPECT_EQ(sum, clean[r].checksum.at(step)) << "step " << step;
    }
    EXPECT_EQ(failed[r].checksum.rbegin()->first, steps);
  }
  if (!replace) {
    EXPECT_GE(undone, 1);  // at least the failed rank was half updated
  }
}

// DP 2 without ZeRO: the surviving replica completes the step (nothing after
// its update waits for the failed one) and must undo a whole step; the
// failed one undoes a partial step.
TEST(UpdateUndoTest, DataParallelReplicaUndoesACompletedStep) {
  TrainerOptions o = TinyOptions();
  o.comm.topology.dp = 2;
  CheckRecoveredEqualsFailureFree(o, 2, 5, 1, 3);
}

// DP 2 x PP 2 with ZeRO-1 (padded buffer): the failed rank's DP peer is
// stuck in the parameter all-gather, the other stage's ranks completed the
// step and went on to the next forward.
TEST(UpdateUndoTest, ZeroOnePipelineUndoesPartialAndCompletedSteps) {
  TrainerOptions o = TinyOptions();
  o.model.vocab = 61;
  o.zero1 = true;
  o.comm.topology.dp = 2;
  o.comm.topology.pp = 2;
  CheckRecoveredEqualsFailureFree(o, 4, 5, 3, 4);
}

// DP 2 x PP 2 without ZeRO: the rank that fails inside its update is
// replaced by a new Trainer with empty state, which receives params, moments
// and TrainState from its surviving DP replica after the survivors undo.
TEST(UpdateUndoTest, ReplacementGetsTheStateFromADataParallelReplica) {
  TrainerOptions o = TinyOptions();
  o.comm.topology.dp = 2;
  o.comm.topology.pp = 2;
  CheckRecoveredEqualsFailureFree(o, 4, 5, 2, 3, /*replace=*/true);
}

TEST(UpdateUndoTest, NothingToUndoIsRefused) {
  TrainerOptions o = TinyOptions();
  auto t = Trainer::Create(o, nullptr);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->UndoStep().code(), StatusCode::kFailedPrecondition);  // no log kept
  o.undo_log = true;
  auto u = Trainer::Create(o, nullptr);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ((*u)->UndoStep().code(), StatusCode::kFailedPrecondition);  // no step yet
  const uint64_t at0 = (*u)->StateChecksum();
  ASSERT_TRUE((*u)->Step().ok());
  const uint64_t at1 = (*u)->StateChecksum();
  ASSERT_TRUE((*u)->UndoStep().ok());
  EXPECT_EQ((*u)->StateChecksum(), at0);
  EXPECT_EQ((*u)->state().step, 0);
  Status again = (*u)->UndoStep();  // one step back only
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again;
  ASSERT_TRUE((*u)->Step().ok());
  EXPECT_EQ((*u)->StateChecksum(), at1);
  // A world of one agrees with itself: nothing to undo at a clean step.
  auto agreed = (*u)->RecoverByUndo();
  ASSERT_TRUE(agreed.ok()) << agreed.status();
  EXPECT_EQ(*agreed, 1);
  EXPECT_EQ((*u)->StateChecksum(), at1);
}

// ---- Logging-based recovery (SWIFT 2.2) -------------------------------------

// Fails the step at BeforeOptimizerStep(fail_step): after the gradient norm,
// so the other stages complete that step.
class LoseStage : public TrainerHooks {
 public:
  Status BeforeOptimizerStep(int64_t step) override {
    if (step != fail_step || fired) return Status::Ok();
    fired = true;
    return AbortedError("stage lost in step " + std::to_string(step));
  }
  int64_t fail_step = -1;
  bool fired = false;
};

enum class ReplayMode { kClean, kReplay, kCorruptLog, kPerturbedSnapshot, kLaggingSurvivor };

struct ReplayRun {
  Status status;
  std::map<int64_t, uint64_t> checksum;
  int64_t agreed = -1;
  Status recovery;  // what RecoverByReplay returned
  bool fell_back = false;
  uint64_t log_bytes = 0;  // after the snapshot at k, at the lost step
  double recover_s = 0;    // RecoverByReplay's wall time on this rank
  int64_t replayed = 0;    // steps this rank replayed
  std::string log_file;    // its in-memory log at step t + 1, as WriteFile writes it
  uint64_t copies_by_trainer = 0, copies_by_worker = 0;  // PipelineLogWriter's, at the end
};

// How the ranks' pipeline logs copy their messages (TrainerOptions::log_copy)
// and whether the copy worker is paused throughout (every copy made by the
// trainer's fences and its step's end: a worker that is always behind).
struct LogCopy {
  PipelineLogWriter::Mode mode = PipelineLogWriter::Mode::kThread;
  bool paused = false;
};

// PP 4 (DP 1): snapshot (Save) at step k and truncate the logs, stage `lost`
// fails in step t + 1; survivors write their logs, everyone reconnects, a
// replacement loads the step-k snapshot and replays to the survivors' step.
// When that fails, every rank falls back to the step-k snapshot.
// `spool`: the logs are kept in a shared-memory directory (/dev/shm) by each
// rank's PipelineLogSpool instead of being written out at the failure.
// `group` > 1: selective logging (TrainerOptions::log_group_size); the lost
// stage's group-mates roll back to their snapshot and replay with it.
std::vector<ReplayRun> RunReplay(ReplayMode mode, int lost, int64_t k, int64_t t, int steps,
                                 bool spool = false, int group = 1, LogCopy copy = {}) {
  memento::testing::ScratchDir dir("trainer-replay");
  const std::string spool_dir = "/dev/shm/memento-test-spool-" + std::to_string(getpid()) + "-" +
                                std::to_string(std::random_device{}());
  struct Cleanup {
    std::string path;
    ~Cleanup() { memento::testing::RemoveTree(path); }
  } cleanup{spool_dir};
  TrainerOptions o = TinyOptions();
  if (spool) o.pipeline_log_dir = spool_dir;
  o.log_group_size = group;
  o.model.layers = 4;
  o.micro_batches = 4;
  o.comm.topology.pp = 4;
  o.comm.rendezvous_dir = dir.path();
  o.pipeline_log = true;
  o.undo_log = true;  // a survivor ahead of a lagging one undoes its step
  o.log_copy = copy.mode;
  const int ranks = 4;
  auto snapshot = [&](int r) { return dir.path() + "/state.rank" + std::to_string(r); };
  auto log_path = [&](int r) {
    return spool ? PipelineLogSpool::BasePath(spool_dir, r)
                 : dir.path() + "/pipeline_log.stage" + std::to_string(r);
  };
  std::vector<ReplayRun> runs(ranks);
  auto body = [&](int rank) {
    ReplayRun& run = runs[rank];
    TrainerOptions ro = o;
    ro.comm.rank = rank;
    LoseStage hooks;
    if (mode != ReplayMode::kClean && rank == lost) hooks.fail_step = t + 1;
    // Stage 0 fails too, before its update of t + 1: it survives one step
    // behind the others, which must undo t + 1.
    if (mode == ReplayMode::kLaggingSurvivor && rank == 0) hooks.fail_step = t + 1;
    auto created = Trainer::Create(ro, &hooks);
    if (!created.ok()) {
      run.status = created.status();
      return;
    }
    std::unique_ptr<Trainer> tr = std::move(*created);
    if (copy.paused) tr->pipeline_log_writer()->PauseWorkerForTest();
    struct Counts {
      ReplayRun* run;
      std::unique_ptr<Trainer>* tr;
      ~Counts() {
        if (*tr == nullptr) return;
        run->copies_by_trainer = (*tr)->pipeline_log_writer()->jobs_by_caller();
        run->copies_by_worker = (*tr)->pipeline_log_writer()->jobs_by_worker();
      }
    } counts{&run, &tr};
    bool recovered = false;
    while (tr->state().step < steps) {
      auto r = tr->Step();
      if (r.ok()) {
        run.checksum[tr->state().step] = tr->StateChecksum();
        if (tr->state().step == k) {
          run.status = tr->Save(snapshot(rank));
          if (!run.status.ok()) return;
          tr->TruncatePipelineLog(k);
        }
        if (tr->state().step == t + 1) {
          run.log_bytes = tr->pipeline_log()->bytes();
          if (!spool) {
            const std::string file = dir.path() + "/log_at_t1.rank" + std::to_string(rank);
            run.status = tr->WritePipelineLog(file);
            if (!run.status.ok()) return;
            std::ifstream in(file, std::ios::binary);
            run.log_file.assign(std::istreambuf_iterator<char>(in), {});
          }
        }
        continue;
      }
      if (mode == ReplayMode::kClean || recovered) {
        run.status = r.status();
        return;
      }
      recovered = true;
      const bool replacement = rank == lost;
      std::vector<std::string> inputs;
      if (replacement) {
        // The process is gone: its state and log with it. A new one joins
        // under the new run id and loads the stage's snapshot.
        tr.reset();
        auto fresh = Trainer::Create(
            [&] {
              TrainerOptions n = ro;
              n.comm.run_id = "recovery1";
              return n;
            }(),
            nullptr);
        if (!fresh.ok()) {
          run.status = fresh.status();
          return;
        }
        tr = std::move(*fresh);
        if (copy.paused) tr->pipeline_log_writer()->PauseWorkerForTest();
        run.status = tr->Load(snapshot(rank));
        if (!run.status.ok()) return;
        if (mode == ReplayMode::kPerturbedSnapshot) tr->params()[5] += 1e-3f;
        for (int n : {rank - 1, rank + 1}) {
          if (n < 0 || n >= ranks) continue;
          inputs.push_back(log_path(n));
          if (mode == ReplayMode::kCorruptLog && n == rank - 1) {
            // One payload byte in the middle of the file (the spool: of
            // the file of step t).
            const std::string file =
                spool ? PipelineLogSpool::StepPath(spool_dir, n, t) : log_path(n);
            FILE* f = std::fopen(file.c_str(), "r+b");
            if (f == nullptr) {
              run.status = InternalError("cannot open " + file + " to corrupt it");
              return;
            }
            std::fseek(f, 0, SEEK_END);
            const long size = std::ftell(f);
            std::fseek(f, size / 2, SEEK_SET);
            int c = std::fgetc(f);
            std::fseek(f, size / 2, SEEK_SET);
            std::fputc(c ^ 0x20, f);
            std::fclose(f);
          }
        }
      } else {
        // With a spool the log is in shared memory already: wait for it.
        run.status = spool ? tr->FlushPipelineLog() : tr->WritePipelineLog(log_path(rank));
        if (!run.status.ok()) return;
        run.status = tr->Reconnect("recovery1");
        if (!run.status.ok()) return;
      }
      const auto recover_start = std::chrono::steady_clock::now();
      auto agreed = group > 1 ? tr->RecoverByReplay(log_path, replacement,
                                                    [&] { return tr->Load(snapshot(rank)); })
                              : tr->RecoverByReplay(inputs, replacement);
      run.recover_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - recover_start).count();
      run.replayed = tr->replayed_steps();
      run.recovery = agreed.status();
      if (agreed.ok()) {
        run.agreed = *agreed;
        run.checksum[tr->state().step] = tr->StateChecksum();
        continue;
      }
      // The snapshot path: every rank loads step k.
      run.fell_back = true;
      run.status = tr->Load(snapshot(rank));
      if (!run.status.ok()) return;
      run.status = tr->CheckSameStep();
      if (!run.status.ok()) return;
      run.checksum[tr->state().step] = tr->StateChecksum();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(body, r);
  for (std::thread& th : threads) th.join();
  return runs;
}

void ExpectSameStates(const std::vector<ReplayRun>& clean, const std::vector<ReplayRun>& runs,
                      int steps) {
  for (size_t r = 0; r < runs.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
    for (const auto& [step, sum] : runs[r].checksum) {
      ASSERT_TRUE(clean[r].checksum.count(step)) << "step " << step;
      EXPECT_EQ(sum, clean[r].checksum.at(step)) << "step " << step;
    }
    EXPECT_EQ(runs[r].checksum.rbegin()->first, steps);
  }
}

TEST(PipelineLogTest, FileRoundTripTruncateAndRefusals) {
  memento::testing::ScratchDir dir("pipeline-log");
  PipelineLog log;
  std::vector<float> a(64), b(32);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f * static_cast<float>(i);
  const MessageKey k1{1, 0, 0, 1, MessageKind::kActivation};
  const MessageKey k2{2, 1, 1, 0, MessageKind::kGradient};
  const MessageKey k3{2, 0, -1, -1, MessageKind::kGradNormSq};
  log.AppendSent(k1, a.data(), a.size() * 4);
  log.AppendSent(k2, b.data(), b.size() * 4);
  const double sumsq = 3.25;
  log.AppendSent(k3, &sumsq, sizeof(sumsq));
  log.RecordReceived(k1, a.data(), a.size() * 4);
  EXPECT_EQ(log.bytes(), 64u * 4 + 32 * 4 + 8);
  const std::string path = dir.path() + "/log";
  ASSERT_TRUE(log.WriteFile(path).ok());
  auto read = PipelineLog::ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bytes(), log.bytes());
  auto got = read->Sent(k2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(0, std::memcmp((*got)->data(), b.data(), b.size() * 4));
  auto receipt = read->ReceivedChecksum(k1);
  ASSERT_TRUE(receipt.ok());
  EXPECT_EQ(*receipt, MessageChecksum(k1, a.data(), a.size() * 4));
  EXPECT_EQ(read->Sent(MessageKey{9, 0, 0, 1, MessageKind::kActivation}).status().code(),
            StatusCode::kNotFound);
  // A committed version at step 1 makes the step-1 entries garbage.
  read->Truncate(1);
  EXPECT_EQ(read->Sent(k1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(read->ReceivedChecksum(k1).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(read->Sent(k2).ok());
  EXPECT_EQ(read->bytes(), 32u * 4 + 8);
  // Refusals: a truncated file, another file, a flipped payload byte.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream out(dir.path() + "/" + name, std::ios::binary);
    out << content;
    return dir.path() + "/" + name;
  };
  EXPECT_EQ(
      PipelineLog::ReadFile(write("cut", bytes.substr(0, bytes.size() - 100))).status().code(),
      StatusCode::kDataLoss);
  EXPECT_EQ(PipelineLog::ReadFile(write("magic", "XXXXXXXX" + bytes.substr(8))).status().code(),
            StatusCode::kInvalidArgument);
  std::string flipped = bytes;
  flipped[32 + 40 + 10] ^= 0x01;  // inside the first entry's payload
  auto bad = PipelineLog::ReadFile(write("flip", flipped));
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find("checksum"), std::string::npos) << bad.status();
  EXPECT_FALSE(PipelineLog::ReadFile(dir.path() + "/missing").ok());
}

// The copy worker (PipelineLogWriter, issue 19): what it logs equals the
// inline copy byte for byte when the caller keeps its rule (fence a buffer
// before writing it): with the worker paused (every copy made by the
// fences and the drain: a worker that fell behind), and with it running
// against a caller that fences and rewrites buffers at random (seeded).
TEST(PipelineLogTest, CopyWorkerLogsWhatTheInlineCopyLogs) {
  const uint64_t seed = memento::testing::TestSeed("pipeline_log_writer");
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kBuffers = 4;
  constexpr size_t kFloats = 2048;  // 8 KiB, above kOwnedBytes
  for (int round = 0; round < 2; ++round) {
    const bool paused = round == 0;
    SCOPED_TRACE(paused ? "worker paused" : "worker running");
    std::vector<std::vector<float>> buffers(kBuffers, std::vector<float>(kFloats));
    PipelineLog inline_log, worker_log;
    uint64_t caller_jobs = 0;
    {
      PipelineLogWriter writer(&worker_log, PipelineLogWriter::Mode::kThread);
      if (paused) writer.PauseWorkerForTest();
      for (int i = 0; i < 400; ++i) {
        const int b = static_cast<int>(rng() % kBuffers);
        // The rule: fence, then write the buffer, then log it.
        writer.Fence(buffers[b].data(), kFloats * 4);
        for (float& x : buffers[b]) x = static_cast<float>(rng() % 1000) * 0.125f;
        const MessageKey key{i / 8, i % 8, 1, 2,
                             i % 2 ? MessageKind::kActivation : MessageKind::kGradient};
        if (rng() % 2) {
          inline_log.AppendSent(key, buffers[b].data(), kFloats * 4);
          writer.AppendSent(key, buffers[b].data(), kFloats * 4);
        } else {
          inline_log.RecordReceived(key, buffers[b].data(), kFloats * 4);
          writer.RecordReceived(key, buffers[b].data(), kFloats * 4);
        }
        if (i % 50 == 49) {
          // A small payload (the gradient norm, a local) may change at once.
          double sumsq = static_cast<double>(i) + 0.5;
          const MessageKey nk{i, 0, -1, -1, MessageKind::kGradNormSq};
          inline_log.AppendSent(nk, &sumsq, sizeof(sumsq));
          writer.AppendSent(nk, &sumsq, sizeof(sumsq));
          sumsq = -1.0;
        }
      }
      writer.Drain();
      caller_jobs = writer.jobs_by_caller();
      if (paused) {
        EXPECT_EQ(writer.jobs_by_worker(), 0u);
        EXPECT_GT(caller_jobs, 0u);
      }
    }
    EXPECT_EQ(worker_log.num_sent(), inline_log.num_sent());
    EXPECT_EQ(worker_log.num_received(), inline_log.num_received());
    EXPECT_EQ(worker_log.bytes(), inline_log.bytes());
    memento::testing::ScratchDir dir("pipeline-log-writer");
    ASSERT_TRUE(inline_log.WriteFile(dir.path() + "/inline").ok());
    ASSERT_TRUE(worker_log.WriteFile(dir.path() + "/worker").ok());
    std::ifstream a(dir.path() + "/inline", std::ios::binary),
        w(dir.path() + "/worker", std::ios::binary);
    const std::string ab(std::istreambuf_iterator<char>(a), {});
    const std::string wb(std::istreambuf_iterator<char>(w), {});
    EXPECT_TRUE(ab == wb) << "the worker's log differs from the inline copy's (" << wb.size()
                          << " and " << ab.size() << " bytes)";
    std::printf("%s: %llu of the copies made by the caller's fences and drain\n",
                paused ? "paused worker" : "running worker",
                static_cast<unsigned long long>(caller_jobs));
  }
}

TEST(LogReplayTest, LostStageReplaysToTheSurvivorsStepBitForBit) {
  const int steps = 7, lost = 2;
  const int64_t k = 2, t = 4;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps);
  for (const ReplayRun& c : clean) ASSERT_TRUE(c.status.ok()) << c.status;
  std::vector<ReplayRun> runs = RunReplay(ReplayMode::kReplay, lost, k, t, steps);
  ExpectSameStates(clean, runs, steps);
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_TRUE(runs[r].recovery.ok()) << "rank " << r << ": " << runs[r].recovery;
    EXPECT_FALSE(runs[r].fell_back);
    // The others completed step t + 1 (the lost stage failed after the
    // gradient norm): no step is lost, the replacement replays k+1 .. t+1.
    EXPECT_EQ(runs[r].agreed, t + 1) << "rank " << r;
  }
  // The replacement's state at t + 1 came from replay alone.
  ASSERT_TRUE(runs[lost].checksum.count(t + 1));
  EXPECT_EQ(runs[lost].checksum.at(t + 1), clean[lost].checksum.at(t + 1));
  for (int r = 0; r < 4; ++r) {
    std::printf("stage %d: pipeline log after %lld steps since the snapshot: %llu bytes\n", r,
                static_cast<long long>(t + 1 - k),
                static_cast<unsigned long long>(clean[r].log_bytes));
  }
}

// The copy worker (issue 19) changes no byte of the log or of training:
// the inline copy, the worker, and a worker paused throughout (every copy
// made by the trainer's fences and its step's end) log the same file at
// step t + 1 on every stage; a replay from the logs of ranks whose worker
// is always behind (the failing step's copies made by the drain on its
// error return) is bit-identical to the failure-free run, in memory and
// from the shared-memory spool.
TEST(LogReplayTest, CopyWorkerBehindOrInlineLogsTheSameAndReplays) {
  const int steps = 7, lost = 1;
  const int64_t k = 2, t = 4;
  using Mode = PipelineLogWriter::Mode;
  std::vector<ReplayRun> inline_clean =
      RunReplay(ReplayMode::kClean, lost, k, t, steps, false, 1, {Mode::kInline, false});
  std::vector<ReplayRun> worker_clean = RunReplay(ReplayMode::kClean, lost, k, t, steps);
  std::vector<ReplayRun> behind_clean =
      RunReplay(ReplayMode::kClean, lost, k, t, steps, false, 1, {Mode::kThread, true});
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(inline_clean[r].status.ok()) << inline_clean[r].status;
    ASSERT_FALSE(inline_clean[r].log_file.empty());
    EXPECT_TRUE(worker_clean[r].log_file == inline_clean[r].log_file);
    EXPECT_TRUE(behind_clean[r].log_file == inline_clean[r].log_file);
    EXPECT_EQ(inline_clean[r].copies_by_worker + inline_clean[r].copies_by_trainer, 0u);
    EXPECT_EQ(behind_clean[r].copies_by_worker, 0u);
    EXPECT_GT(behind_clean[r].copies_by_trainer, 0u);
    EXPECT_GT(worker_clean[r].copies_by_worker + worker_clean[r].copies_by_trainer, 0u);
    std::printf("rank %d: worker made %llu copies, the trainer's fences %llu\n", r,
                static_cast<unsigned long long>(worker_clean[r].copies_by_worker),
                static_cast<unsigned long long>(worker_clean[r].copies_by_trainer));
  }
  ExpectSameStates(inline_clean, worker_clean, steps);
  ExpectSameStates(inline_clean, behind_clean, steps);
  for (bool spool : {false, true}) {
    SCOPED_TRACE(spool ? "spool" : "in memory");
    std::vector<ReplayRun> runs =
        RunReplay(ReplayMode::kReplay, lost, k, t, steps, spool, 1, {Mode::kThread, true});
    ExpectSameStates(inline_clean, runs, steps);
    for (size_t r = 0; r < runs.size(); ++r) {
      EXPECT_TRUE(runs[r].recovery.ok()) << "rank " << r << ": " << runs[r].recovery;
      EXPECT_FALSE(runs[r].fell_back);
      EXPECT_EQ(runs[r].agreed, t + 1) << "rank " << r;
    }
  }
}

TEST(LogReplayTest, SurvivorsAheadOfALaggingOneUndoTheirStep) {
  const int steps = 6, lost = 2;
  const int64_t k = 2, t = 3;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps);
  std::vector<ReplayRun> runs = RunReplay(ReplayMode::kLaggingSurvivor, lost, k, t, steps);
  ExpectSameStates(clean, runs, steps);
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_TRUE(runs[r].recovery.ok()) << "rank " << r << ": " << runs[r].recovery;
    EXPECT_FALSE(runs[r].fell_back);
    EXPECT_EQ(runs[r].agreed, t) << "rank " << r;  // stages 1 and 3 undid t + 1
  }
}

TEST(LogReplayTest, CorruptedLogEntryFallsBackToTheSnapshot) {
  const int steps = 6, lost = 1;
  const int64_t k = 2, t = 3;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps);
  std::vector<ReplayRun> runs = RunReplay(ReplayMode::kCorruptLog, lost, k, t, steps);
  ExpectSameStates(clean, runs, steps);
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].recovery.code(), StatusCode::kFailedPrecondition) << runs[r].recovery;
    EXPECT_TRUE(runs[r].fell_back);
  }
  EXPECT_NE(runs[lost].recovery.message().find("checksum"), std::string::npos)
      << runs[lost].recovery;
}

// The same with the logs in shared memory (PipelineLogSpool, /dev/shm): the
// survivors write nothing at the failure, the replacement reads its
// neighbours' step files.
TEST(LogReplayTest, LostStageReplaysFromTheSharedMemorySpool) {
  const int steps = 7, lost = 2;
  const int64_t k = 2, t = 4;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps, true);
  for (const ReplayRun& c : clean) ASSERT_TRUE(c.status.ok()) << c.status;
  std::vector<ReplayRun> runs = RunReplay(ReplayMode::kReplay, lost, k, t, steps, true);
  ExpectSameStates(clean, runs, steps);
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_TRUE(runs[r].recovery.ok()) << "rank " << r << ": " << runs[r].recovery;
    EXPECT_FALSE(runs[r].fell_back);
    EXPECT_EQ(runs[r].agreed, t + 1) << "rank " << r;
  }
}

// One byte of a neighbour's step file in shared memory flipped: its
// checksum catches it, and every rank falls back to the snapshot.
TEST(LogReplayTest, CorruptedSpoolEntryFallsBackToTheSnapshot) {
  const int steps = 6, lost = 1;
  const int64_t k = 2, t = 3;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps, true);
  std::vector<ReplayRun> runs = RunReplay(ReplayMode::kCorruptLog, lost, k, t, steps, true);
  ExpectSameStates(clean, runs, steps);
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].recovery.code(), StatusCode::kFailedPrecondition) << runs[r].recovery;
    EXPECT_TRUE(runs[r].fell_back);
  }
  EXPECT_NE(runs[lost].recovery.message().find("checksum"), std::string::npos)
      << runs[lost].recovery;
  EXPECT_NE(runs[lost].recovery.message().find(".step3"), std::string::npos) << runs[lost].recovery;
}

// A spool's files are in shared memory, not in its process: a process that
// submits three steps, flushes and is SIGKILLed leaves them whole, each entry
// checked on reading; Truncate removes older steps (also those of a dead
// process of the same rank); a flipped byte is DataLoss naming the file.
TEST(PipelineLogTest, SpoolOutlivesItsKilledProcessAndIsChecked) {
  const std::string dir = "/dev/shm/memento-test-spool-kill-" + std::to_string(getpid()) + "-" +
                          std::to_string(std::random_device{}());
  struct Cleanup {
    std::string path;
    ~Cleanup() { memento::testing::RemoveTree(path); }
  } cleanup{dir};
  auto payload = [](int64_t step) {
    std::vector<float> v(256);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(step) + 0.25f * i;
    return v;
  };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto spool = PipelineLogSpool::Create(dir, 3);
    if (!spool.ok()) _exit(2);
    for (int64_t step = 1; step <= 3; ++step) {
      PipelineLog log;
      const std::vector<float> v = payload(step);
      log.AppendSent(MessageKey{step, 0, 1, 2, MessageKind::kActivation}, v.data(), v.size() * 4);
      log.RecordReceived(MessageKey{step, 0, 0, 1, MessageKind::kActivation}, v.data(), 16);
      (*spool)->Submit(step, log.TakeStep(step));
    }
    if (!(*spool)->Flush().ok()) _exit(3);
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const std::string base = PipelineLogSpool::BasePath(dir, 3);
  auto read = PipelineLog::ReadAny(base);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->num_sent(), 3u);
  EXPECT_EQ(read->num_received(), 3u);
  for (int64_t step = 1; step <= 3; ++step) {
    auto got = read->Sent(MessageKey{step, 0, 1, 2, MessageKind::kActivation});
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<float> v = payload(step);
    ASSERT_EQ((*got)->size(), v.size() * 4);
    EXPECT_EQ(0, std::memcmp((*got)->data(), v.data(), v.size() * 4)) << "step " << step;
  }
  {
    auto spool = PipelineLogSpool::Create(dir, 3);  // a new process of rank 3
    ASSERT_TRUE(spool.ok()) << spool.status();
    (*spool)->Truncate(2);
    ASSERT_TRUE((*spool)->Flush().ok());
  }
  read = PipelineLog::ReadAny(base);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->num_sent(), 1u);  // step 3
  EXPECT_EQ(access(PipelineLogSpool::StepPath(dir, 3, 2).c_str(), F_OK), -1);
  const std::string file = PipelineLogSpool::StepPath(dir, 3, 3);
  FILE* f = std::fopen(file.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 32 + 40 + 100, SEEK_SET);  // inside the sent payload
  const int c = std::fgetc(f);
  std::fseek(f, 32 + 40 + 100, SEEK_SET);
  std::fputc(c ^ 0x10, f);
  std::fclose(f);
  auto bad = PipelineLog::ReadAny(base);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find(file), std::string::npos) << bad.status();
  EXPECT_EQ(PipelineLog::ReadAny(dir + "/pipeline_log.rank9").status().code(),
            StatusCode::kNotFound);
}

// Selective logging (SWIFT 2.2): PP 4 in log groups of 1, 2 and 4 stages.
// Larger groups log less (only the traffic across a group's edges; one
// group: nothing but the gradient norm) and recover with more: the lost
// stage's whole group rolls back to its snapshot and replays, its messages
// live inside the group. Every grouping ends bit-identical to a failure-free
// run. Prints the trade-off per grouping.
TEST(LogReplayTest, SelectiveLoggingTradesLogBytesForReplayedStages) {
  const int steps = 7, lost = 2;
  const int64_t k = 2, t = 4;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps);
  for (const ReplayRun& c : clean) ASSERT_TRUE(c.status.ok()) << c.status;
  uint64_t previous_bytes = UINT64_MAX;
  for (int group : {1, 2, 4}) {
    SCOPED_TRACE("log groups of " + std::to_string(group) + " stage(s)");
    std::vector<ReplayRun> runs = RunReplay(ReplayMode::kReplay, lost, k, t, steps, false, group);
    ExpectSameStates(clean, runs, steps);
    uint64_t bytes = 0;
    double recover_s = 0;
    int replaying = 0;
    int64_t replayed_steps = 0;
    for (size_t r = 0; r < runs.size(); ++r) {
      EXPECT_TRUE(runs[r].recovery.ok()) << "rank " << r << ": " << runs[r].recovery;
      EXPECT_FALSE(runs[r].fell_back);
      EXPECT_EQ(runs[r].agreed, t + 1) << "rank " << r;
      bytes += runs[r].log_bytes;
      recover_s = std::max(recover_s, runs[r].recover_s);
      replaying += runs[r].replayed > 0 ? 1 : 0;
      replayed_steps += runs[r].replayed;
      // Exactly the lost stage's group replays, from the snapshot at k.
      const bool in_group = static_cast<int>(r) / group == lost / group;
      EXPECT_EQ(runs[r].replayed, in_group ? t + 1 - k : 0) << "rank " << r;
    }
    EXPECT_EQ(replaying, group);
    EXPECT_LT(bytes, previous_bytes);  // fewer boundaries logged
    previous_bytes = bytes;
    std::printf(
        "selective logging, groups of %d stage(s): log held after %lld steps %llu bytes (all "
        "stages); on a loss of stage %d: %d stage(s) replayed %lld step(s) in all, recovery %.3f "
        "s\n",
        group, static_cast<long long>(t + 1 - k), static_cast<unsigned long long>(bytes), lost,
        replaying, static_cast<long long>(replayed_steps), recover_s);
  }
}

TEST(LogReplayTest, ReplayThatDivergesIsAnError) {
  const int steps = 6, lost = 3;  // the last stage: its gradients go to stage 2
  const int64_t k = 2, t = 3;
  std::vector<ReplayRun> clean = RunReplay(ReplayMode::kClean, lost, k, t, steps);
  std::vector<ReplayRun> runs = RunReplay(ReplayMode::kPerturbedSnapshot, lost, k, t, steps);
  ExpectSameStates(clean, runs, steps);
  for (size_t r = 0; r < runs.size(); ++r) EXPECT_TRUE(runs[r].fell_back) << "rank " << r;
  EXPECT_NE(runs[lost].recovery.message().find("replay diverged"), std::string::npos)
      << runs[lost].recovery;
}

}  // namespace
}  // namespace memento::trainer
