// SWIFT recovery with real processes (docs/swift.md): `memento-trainer
// --launch --recovery restart|undo|log`, one rank SIGKILLed after a step,
// inside its optimizer update or in the middle of the pipeline schedule
// (rank, step, point and chunk drawn from the test's seed). Every rank's final state (digest:
// xxHash3 of params, moments and TrainState) must equal a failure-free run's, and the recovery must
// be the one asked for: undo and log restart only the lost process, the survivors recover in
// process; a recovery that cannot proceed (ZeRO-1: no replica of the lost moment shard) falls back
// to the whole-job restart.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace {

struct Outcome {
  int exit = -1;
  std::string output;                // stdout and stderr of the launcher and its ranks
  std::vector<std::string> digests;  // per rank
  int Count(const std::string& needle) const {
    int n = 0;
    for (size_t at = output.find(needle); at != std::string::npos; at = output.find(needle, at + 1))
      ++n;
    return n;
  }
};

class SwiftProcessTest : public ::testing::Test {
 protected:
  Outcome Run(std::vector<std::string> args, int world) {
    const std::string run = dir_.path() + "/run" + std::to_string(runs_++);
    EXPECT_EQ(mkdir(run.c_str(), 0700), 0);
    const std::string out = run + "/out.txt";
    std::vector<std::string> all = {MEMENTO_TRAINER_BINARY,
                                    "--launch",
                                    "--quiet",
                                    "--rendezvous",
                                    run,
                                    "--comm-timeout",
                                    "30",
                                    "--digest-file",
                                    run + "/digest.{rank}",
                                    "--preset",
                                    "tiny",
                                    "--layers",
                                    "4",
                                    "--batch",
                                    "8",
                                    "--micro-batches",
                                    "4",
                                    "--steps",
                                    "10",
                                    "--save",
                                    run + "/state.{rank}",
                                    "--save-every",
                                    "3"};
    all.insert(all.end(), args.begin(), args.end());
    pid_t pid = fork();
    if (pid == 0) {
      FILE* f = std::freopen(out.c_str(), "w", stdout);
      if (f == nullptr || dup2(fileno(stdout), 2) < 0) _exit(126);
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    Outcome o;
    o.exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    o.output = ReadFile(out);
    for (int r = 0; r < world; ++r)
      o.digests.push_back(ReadFile(run + "/digest." + std::to_string(r)));
    return o;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // A kill drawn from the seed: rank, step (after the save at 3, before the
  // end), after the step or inside its update.
  std::vector<std::string> Kill(int world, std::string* what) {
    const uint64_t seed = memento::testing::TestSeed("swift_process");
    std::mt19937_64 rng(seed);
    const int rank = static_cast<int>(rng() % world);
    const int step = 4 + static_cast<int>(rng() % 4);
    const char* points[] = {"step", "update", "pipeline"};
    const std::string point = points[rng() % 3];
    const int chunk = static_cast<int>(rng() % 2);
    *what = "seed " + std::to_string(seed) + ": rank " + std::to_string(rank) + " killed " +
            (point == "step"     ? "after step " + std::to_string(step)
             : point == "update" ? "inside the update of step " + std::to_string(step) +
                                       " before chunk " + std::to_string(chunk)
                                 : "at pipeline receive " + std::to_string(chunk) + " of step " +
                                       std::to_string(step));
    std::printf("%s\n", what->c_str());
    std::fflush(stdout);
    return {"--fail-rank",        std::to_string(rank), "--fail-at-step",
            std::to_string(step), "--fail-point",       point,
            "--fail-chunk",       std::to_string(chunk)};
  }

  void ExpectSameFinalStates(const Outcome& clean, const Outcome& o) {
    ASSERT_EQ(clean.exit, 0) << clean.output;
    ASSERT_EQ(o.exit, 0) << o.output;
    for (size_t r = 0; r < o.digests.size(); ++r) {
      EXPECT_NE(o.digests[r].find("\"step\": 10"), std::string::npos) << o.digests[r];
      EXPECT_EQ(o.digests[r], clean.digests[r]) << "rank " << r << "\n" << o.output;
    }
  }

  memento::testing::ScratchDir dir_{"swift-process"};
  int runs_ = 0;
};

TEST_F(SwiftProcessTest, UndoRebuildsTheLostRankFromAReplica) {
  const std::vector<std::string> topo = {"--dp", "2", "--pp", "2"};
  std::string what;
  std::vector<std::string> kill = Kill(4, &what);
  SCOPED_TRACE(what);
  Outcome clean = Run(topo, 4);
  std::vector<std::string> args = topo;
  args.insert(args.end(), {"--recovery", "undo"});
  args.insert(args.end(), kill.begin(), kill.end());
  Outcome o = Run(args, 4);
  ExpectSameFinalStates(clean, o);
  EXPECT_EQ(o.Count("\"swift_failure\""), 1) << o.output;
  EXPECT_EQ(o.Count("\"replacement\": true"), 1) << o.output;   // only the lost process
  EXPECT_EQ(o.Count("\"replacement\": false"), 3) << o.output;  // survivors, in process
  EXPECT_EQ(o.Count("\"swift_fallback\""), 0) << o.output;
}

TEST_F(SwiftProcessTest, LogReplaysTheLostStage) {
  const std::vector<std::string> topo = {"--pp", "4"};
  std::string what;
  std::vector<std::string> kill = Kill(4, &what);
  SCOPED_TRACE(what);
  Outcome clean = Run(topo, 4);
  std::vector<std::string> args = topo;
  args.insert(args.end(), {"--recovery", "log"});
  args.insert(args.end(), kill.begin(), kill.end());
  Outcome o = Run(args, 4);
  ExpectSameFinalStates(clean, o);
  EXPECT_EQ(o.Count("\"replacement\": true"), 1) << o.output;
  EXPECT_EQ(o.Count("\"replacement\": false"), 3) << o.output;
  EXPECT_EQ(o.Count("\"swift_fallback\""), 0) << o.output;
}

// The same with the logs in shared memory (--pipeline-log-dir on /dev/shm):
// each rank's completed steps are in files there, written by a background
// thread; the killed stage's files outlive it, the survivors write nothing
// into the rendezvous dir at the failure.
TEST_F(SwiftProcessTest, LogReplaysTheLostStageFromSharedMemory) {
  const std::string spool = "/dev/shm/memento-test-swift-spool-" + std::to_string(getpid());
  struct Cleanup {
    std::string path;
    ~Cleanup() { memento::testing::RemoveTree(path); }
  } cleanup{spool};
  const std::vector<std::string> topo = {"--pp", "4"};
  std::string what;
  std::vector<std::string> kill = Kill(4, &what);
  SCOPED_TRACE(what);
  Outcome clean = Run(topo, 4);
  std::vector<std::string> args = topo;
  args.insert(args.end(), {"--recovery", "log", "--pipeline-log-dir", spool});
  args.insert(args.end(), kill.begin(), kill.end());
  const std::string rendezvous = dir_.path() + "/run" + std::to_string(runs_);
  Outcome o = Run(args, 4);
  ExpectSameFinalStates(clean, o);
  EXPECT_EQ(o.Count("\"replacement\": true"), 1) << o.output;
  EXPECT_EQ(o.Count("\"replacement\": false"), 3) << o.output;
  EXPECT_EQ(o.Count("\"swift_fallback\""), 0) << o.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(access((rendezvous + "/pipeline_log.rank" + std::to_string(r)).c_str(), F_OK), 0)
        << "rank " << r << " wrote its log into the rendezvous dir";
    // Steps after the last truncation are still there, per rank.
    EXPECT_EQ(access((spool + "/pipeline_log.rank" + std::to_string(r) + ".step10").c_str(), F_OK),
              0)
        << "rank " << r;
  }
}

// A kill while the log's copy worker is behind (issue 19): every rank's
// worker is paused (--log-copy-worker-paused), so each logged message is
// copied only at the trainer's fences and its step's end, and the killed
// rank dies with its step's copies not made. The survivors' failed steps
// make theirs on the way out (Step drains on every return), the killed
// stage's spool holds only whole steps, and the replacement replays from
// the neighbours' logs bit-identical to the failure-free run, no fallback.
TEST_F(SwiftProcessTest, LogReplaysAKillWhileTheCopyWorkerIsBehind) {
  const std::string spool = "/dev/shm/memento-test-swift-behind-" + std::to_string(getpid());
  struct Cleanup {
    std::string path;
    ~Cleanup() { memento::testing::RemoveTree(path); }
  } cleanup{spool};
  const std::vector<std::string> topo = {"--pp", "4"};
  std::string what;
  std::vector<std::string> kill = Kill(4, &what);
  SCOPED_TRACE(what);
  Outcome clean = Run(topo, 4);
  for (bool in_memory : {true, false}) {
    SCOPED_TRACE(in_memory ? "log in memory" : "log in shared memory");
    std::vector<std::string> args = topo;
    args.insert(args.end(),
                {"--recovery", "log", "--log-copy", "thread", "--log-copy-worker-paused"});
    if (!in_memory) args.insert(args.end(), {"--pipeline-log-dir", spool});
    args.insert(args.end(), kill.begin(), kill.end());
    Outcome o = Run(args, 4);
    ExpectSameFinalStates(clean, o);
    EXPECT_EQ(o.Count("\"replacement\": true"), 1) << o.output;
    EXPECT_EQ(o.Count("\"replacement\": false"), 3) << o.output;
    EXPECT_EQ(o.Count("\"swift_fallback\""), 0) << o.output;
  }
}

// Selective logging (--log-group-size 2 on PP 4: groups {0,1} and {2,3},
// only the 1|2 boundary logged). Stage 2 is killed inside its update of step
// 5 (the others complete step 5); its replacement loads the step-3 save,
// stage 3 (its group-mate, alive) rolls back to its own step-3 save, and the
// two replay steps 4 and 5 together, live between them and from stage 1's
// log across the group's edge; stages 0 and 1 keep their state.
TEST_F(SwiftProcessTest, LogGroupRollsBackAndReplaysTogether) {
  const std::vector<std::string> topo = {"--pp", "4"};
  Outcome clean = Run(topo, 4);
  std::vector<std::string> args = topo;
  args.insert(args.end(), {"--recovery", "log", "--log-group-size", "2", "--fail-rank", "2",
                           "--fail-at-step", "5", "--fail-point", "update"});
  Outcome o = Run(args, 4);
  ExpectSameFinalStates(clean, o);
  EXPECT_EQ(o.Count("\"replacement\": true"), 1) << o.output;  // one process restarted
  EXPECT_EQ(o.Count("\"replayed_steps\": 2"), 2) << o.output;  // stages 2 and 3
  EXPECT_EQ(o.Count("\"replayed_steps\": 0"), 2) << o.output;  // stages 0 and 1
  EXPECT_EQ(o.Count("\"swift_fallback\""), 0) << o.output;
  Outcome bad = Run({"--pp", "4", "--recovery", "log", "--log-group-size", "5"}, 0);
  EXPECT_EQ(bad.exit, 2);
  EXPECT_NE(bad.output.find("--log-group-size 5 must be in 1..pp (4)"), std::string::npos)
      << bad.output;
}

TEST_F(SwiftProcessTest, RestartReloadsEveryRank) {
  const std::vector<std::string> topo = {"--pp", "2"};
  std::string what;
  std::vector<std::string> kill = Kill(2, &what);
  SCOPED_TRACE(what);
  Outcome clean = Run(topo, 2);
  std::vector<std::string> args = topo;
  args.insert(args.end(), {"--recovery", "restart"});
  args.insert(args.end(), kill.begin(), kill.end());
  Outcome o = Run(args, 2);
  ExpectSameFinalStates(clean, o);
  EXPECT_EQ(o.Count("\"mode\": \"restart\""), 2) << o.output;
  EXPECT_EQ(o.Count("\"replacement\": true"), 0) << o.output;
}

// A rank killed before its first save (step 3) while the other saved it
// (the launcher's stop can also catch a rank still saving): the restarted
// job has no step every rank saved and starts over from the initial state,
// every rank taking part in the same collectives (it once hung in the world
// all-reduce: a rank without a save skipped one). Then the same with a
// later save: the job agrees on the step before (the other rank's PATH.prev).
TEST_F(SwiftProcessTest, RestartAgreesOnTheNewestStepEveryRankSaved) {
  const std::vector<std::string> topo = {"--pp", "2"};
  Outcome clean = Run(topo, 2);
  for (const char* step : {"3", "6"}) {
    SCOPED_TRACE(std::string("rank 1 killed before its save of step ") + step);
    std::vector<std::string> args = topo;
    args.insert(args.end(), {"--recovery", "restart", "--fail-rank", "1", "--fail-at-step", step,
                             "--fail-point", "save"});
    Outcome o = Run(args, 2);
    ExpectSameFinalStates(clean, o);
    EXPECT_EQ(o.Count("\"swift_failure\""), 1) << o.output;
    EXPECT_EQ(o.Count("\"mode\": \"restart\""), 2) << o.output;
    const std::string resumed = std::string("resuming from step ") + (step[0] == '3' ? "0" : "3") +
                                " (the newest step every rank saved; this rank's newest: " + step;
    EXPECT_EQ(o.Count(resumed), 1) << o.output;  // rank 0, which had saved `step`
  }
}

// ZeRO-1: the lost rank's moment shard has no DP replica, so undo cannot
// rebuild it; every rank says so and the launcher restarts the job from the
// saved state instead.
TEST_F(SwiftProcessTest, UndoWithoutAReplicaFallsBackToRestart) {
  const std::vector<std::string> topo = {"--dp", "2", "--pp", "2", "--zero"};
  Outcome clean = Run(topo, 4);
  std::vector<std::string> args = topo;
  args.insert(args.end(), {"--recovery", "undo", "--fail-rank", "3", "--fail-at-step", "5",
                           "--fail-point", "update"});
  Outcome o = Run(args, 4);
  ExpectSameFinalStates(clean, o);
  EXPECT_EQ(o.Count("\"swift_fallback\""), 1) << o.output;
  EXPECT_GE(o.Count("no DP replica"), 1) << o.output;
  EXPECT_EQ(o.Count("\"mode\": \"restart\""), 4) << o.output;
}

TEST_F(SwiftProcessTest, RefusesBadRecoveryFlags) {
  Outcome a = Run({"--recovery", "sometimes"}, 0);
  EXPECT_EQ(a.exit, 2);
  EXPECT_NE(a.output.find("--recovery 'sometimes'"), std::string::npos) << a.output;
  Outcome b = Run({"--recovery", "undo", "--fail-point", "inside"}, 0);
  EXPECT_EQ(b.exit, 2);
  EXPECT_NE(b.output.find("--fail-point 'inside'"), std::string::npos) << b.output;
}

}  // namespace
