// `memento launch --recovery undo` (docs/launch.md, docs/swift.md) with real
// processes: the coordination store, one `memento agent` per node, the
// reference trainer's ranks (DP 2 x PP 2 on 4 nodes, Gloo over TCP, memento
// snapshots every step), a rank SIGKILLed inside its optimizer update or in
// the middle of its pipeline schedule (rank, step and chunk drawn from the
// test's seed). Only the lost rank's process starts again, the survivors
// recover in process; its state comes from a DP replica, under ZeRO-1 its
// moment shard from its node's T0. Every rank's final state (xxHash3 digest
// of params, moments and TrainState) equals a failure-free run's. Cases that
// cannot recover in process (a lost node; a ZeRO-1 shard with no memento to
// restore it from) fall back to the whole-job restart and the report says so.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace {

using nlohmann::json;

struct Outcome {
  int exit = -1;
  std::string output;  // the launcher's stdout and stderr
  json summary;        // --summary-json
  std::string logs;    // the run's logs directory
  std::vector<std::string> digests;
  std::string Report() const { return output; }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class LaunchSwiftTest : public ::testing::Test {
 protected:
  Outcome Run(const std::string& name, std::vector<std::string> launch_args,
              const std::vector<std::string>& trainer_args) {
    const std::string dir = dir_.path() + "/" + name;
    EXPECT_EQ(mkdir(dir.c_str(), 0700), 0);
    std::vector<std::string> all = {MEMENTO_CLI_BINARY,
                                    "launch",
                                    "--quiet",
                                    "--job",
                                    name + "-" + std::to_string(getpid()),
                                    "--nodes",
                                    "4",
                                    "--run-dir",
                                    dir + "/run",
                                    "--summary-json",
                                    dir + "/summary.json"};
    bool topology = false;
    for (const std::string& a : launch_args) topology = topology || a == "--pp";
    if (!topology) all.insert(all.end(), {"--dp", "2", "--pp", "2"});
    all.insert(all.end(), launch_args.begin(), launch_args.end());
    for (const char* a :
         {"--", MEMENTO_TRAINER_BINARY, "--quiet", "--preset", "tiny", "--layers", "4", "--batch",
          "8", "--micro-batches", "4", "--steps", "10", "--comm-timeout", "30"}) {
      all.push_back(a);
    }
    all.push_back("--digest-file");
    all.push_back(dir + "/digest.{rank}");
    all.insert(all.end(), trainer_args.begin(), trainer_args.end());
    const std::string out = dir + "/out.txt";
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
    o.logs = dir + "/run/logs";
    const std::string s = ReadFile(dir + "/summary.json");
    if (!s.empty()) o.summary = json::parse(s, nullptr, false);
    // The launcher substitutes {rank}; the trainer appends .rank<k>.
    for (int r = 0; r < 4; ++r) {
      o.digests.push_back(
          ReadFile(dir + "/digest." + std::to_string(r) + ".rank" + std::to_string(r)));
    }
    return o;
  }

  // A kill drawn from the seed: rank, step 4..7, chunk or receive 0..1.
  std::vector<std::string> Kill(const std::string& point, std::string* what) {
    const uint64_t seed = memento::testing::TestSeed(("launch_swift_" + point).c_str());
    std::mt19937_64 rng(seed);
    const int rank = static_cast<int>(rng() % 4);
    const int step = 4 + static_cast<int>(rng() % 4);
    const int chunk = static_cast<int>(rng() % 2);
    *what = "seed " + std::to_string(seed) + ": rank " + std::to_string(rank) + " killed " +
            (point == "update" ? "inside the update of step " : "at a pipeline receive of step ") +
            std::to_string(step) + " (" + std::to_string(chunk) + ")";
    std::printf("%s\n", what->c_str());
    std::fflush(stdout);
    return {"--fail-rank",        std::to_string(rank), "--fail-at-step",
            std::to_string(step), "--fail-point",       point,
            "--fail-chunk",       std::to_string(chunk)};
  }

  static void ExpectSameFinalStates(const Outcome& clean, const Outcome& o) {
    ASSERT_EQ(clean.exit, 0) << clean.Report();
    ASSERT_EQ(o.exit, 0) << o.Report();
    for (size_t r = 0; r < o.digests.size(); ++r) {
      EXPECT_NE(o.digests[r].find("\"step\": 10"), std::string::npos) << o.digests[r];
      EXPECT_EQ(o.digests[r], clean.digests[r]) << "rank " << r << "\n" << o.Report();
    }
  }

  // The one recovery of `o`, in process: mode undo, one process restarted.
  static void ExpectInProcess(const Outcome& o) {
    ASSERT_TRUE(o.summary.is_object()) << o.Report();
    ASSERT_EQ(o.summary["recoveries"].size(), 1u) << o.Report();
    const json& rep = o.summary["recoveries"][0];
    EXPECT_EQ(rep["mode"], "undo") << rep.dump();
    EXPECT_EQ(rep["processes_restarted"], 1) << rep.dump();
    EXPECT_EQ(rep["fallback"], "") << rep.dump();
    EXPECT_GE(rep["step"].get<int64_t>(), 3) << rep.dump();
    // Only the survivors' undone step, at most one, is lost.
    EXPECT_LE(rep["steps_lost"].get<int64_t>(), 1) << rep.dump();
    EXPECT_GT(rep["resume_s"].get<double>(), 0.0) << rep.dump();
    EXPECT_EQ(o.summary["attempts"], 1) << o.Report();  // no whole-job restart
    EXPECT_NE(o.output.find("(undo, in process)"), std::string::npos) << o.Report();
  }

  memento::testing::ScratchDir dir_{"launch-swift"};
};

// DP 2 x PP 2: the lost rank's state comes from its DP replica. A node loss
// (agent, trainers and memory gone) cannot recover in process and restarts.
TEST_F(LaunchSwiftTest, UndoReplacesOnlyTheLostRank) {
  const Outcome clean = Run("clean", {}, {});
  for (const std::string point : {"update", "pipeline"}) {
    std::string what;
    const std::vector<std::string> kill = Kill(point, &what);
    SCOPED_TRACE(what);
    const Outcome o = Run("undo-" + point, {"--recovery", "undo"}, kill);
    ExpectSameFinalStates(clean, o);
    ExpectInProcess(o);
  }
  const Outcome node = Run("node", {"--recovery", "undo", "--inject", "kill-node:2@step=5"}, {});
  ExpectSameFinalStates(clean, node);
  ASSERT_EQ(node.summary["recoveries"].size(), 1u) << node.Report();
  const json& rep = node.summary["recoveries"][0];
  EXPECT_EQ(rep["mode"], "restart") << rep.dump();
  EXPECT_NE(rep["fallback"].get<std::string>().find("a node or agent is lost"), std::string::npos)
      << rep.dump();
  EXPECT_EQ(rep["processes_restarted"], 4) << rep.dump();
  EXPECT_NE(node.output.find("in-process recovery not possible"), std::string::npos)
      << node.Report();
}

// ZeRO-1: the lost moment shard has no DP replica; the replacement loads it
// from its node's T0 at the agreed step (the client's Restore(step)). Without
// memento (--no-memento) there is nothing to load it from: the replacement
// says so, and the launcher falls back to restarting the whole job.
TEST_F(LaunchSwiftTest, ZeroOneShardComesFromTheTiers) {
  const Outcome clean = Run("zclean", {"--zero", "1"}, {"--zero"});
  std::string what;
  std::vector<std::string> kill = Kill("update", &what);
  SCOPED_TRACE(what);
  std::vector<std::string> args = {"--zero"};
  args.insert(args.end(), kill.begin(), kill.end());
  const Outcome o = Run("zundo", {"--zero", "1", "--recovery", "undo"}, args);
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o);
  EXPECT_NE(o.output.find("moment shard from node"), std::string::npos) << o.Report();

  args = {"--zero", "--no-memento", "--fail-rank", "3", "--fail-at-step",
          "5",      "--fail-point", "update"};
  const Outcome f = Run("zfallback", {"--zero", "1", "--recovery", "undo"}, args);
  ExpectSameFinalStates(clean, f);
  ASSERT_EQ(f.summary["recoveries"].size(), 1u) << f.Report();
  const json& rep = f.summary["recoveries"][0];
  EXPECT_EQ(rep["mode"], "restart") << rep.dump();
  EXPECT_NE(rep["fallback"].get<std::string>().find("in-process recovery (undo"), std::string::npos)
      << rep.dump();
  EXPECT_EQ(rep["processes_restarted"], 5) << rep.dump();  // the replacement, then all 4
  EXPECT_NE(ReadFile(f.logs + "/rank3.log").find("no DP replica"), std::string::npos)
      << ReadFile(f.logs + "/rank3.log");
}

// A survivor that wedges (SIGSTOP, as a hung process would) never reports
// its in-process recovery: after --in-process-timeout the launcher falls
// back to restarting the whole job (SIGKILL reaches the stopped process),
// says so, and the job still ends bit-identical.
TEST_F(LaunchSwiftTest, WedgedSurvivorFallsBackToRestart) {
  const Outcome clean = Run("wclean", {}, {});
  const Outcome o = Run(
      "wedged", {"--recovery", "undo", "--in-process-timeout", "4"},
      {"--fail-rank", "3", "--fail-at-step", "5", "--fail-point", "update", "--wedge-rank", "0"});
  ExpectSameFinalStates(clean, o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << o.Report();
  const json& rep = o.summary["recoveries"][0];
  EXPECT_EQ(rep["mode"], "restart") << rep.dump();
  EXPECT_NE(rep["fallback"].get<std::string>().find("no in-process recovery report from rank(s) 0"),
            std::string::npos)
      << rep.dump();
  EXPECT_EQ(rep["processes_restarted"], 5) << rep.dump();
}

TEST_F(LaunchSwiftTest, RefusesBadRecoveryOptions) {
  Outcome a = Run("bad1", {"--recovery", "sometimes"}, {});
  EXPECT_EQ(a.exit, 2) << a.output;
  EXPECT_NE(a.output.find("--recovery 'sometimes'"), std::string::npos) << a.output;
  Outcome b = Run("bad2", {"--recovery", "undo", "--pp", "4"}, {});  // dp 1
  EXPECT_EQ(b.exit, 2) << b.output;
  EXPECT_NE(b.output.find("--recovery undo needs --dp >= 2"), std::string::npos) << b.output;
}

}  // namespace
