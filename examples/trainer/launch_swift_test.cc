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
//
// `--recovery log` (DP 1 x PP 4, memento snapshots every 3rd step, the
// pipeline log in shared memory): a middle stage is SIGKILLed inside its
// optimizer update or in the middle of its pipeline schedule; only it starts
// again, loads its stage's newest snapshot from its node's T0 and replays
// the steps since from its neighbours' logs; the other stages keep their
// state. A neighbour's log entry corrupted before the replay fails its
// checksum: the job falls back to the whole-job restart, reported.
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
    bool micro = false;  // the case names its own micro-batches (DP 4)
    for (const std::string& a : trainer_args) micro = micro || a == "--micro-batches";
    for (const char* a : {"--", MEMENTO_TRAINER_BINARY, "--quiet", "--preset", "tiny", "--layers",
                          "4", "--batch", "8", "--steps", "10", "--comm-timeout", "30"}) {
      all.push_back(a);
    }
    if (!micro) all.insert(all.end(), {"--micro-batches", "4"});
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
  // `middle_of_4`: a middle stage of PP 4 (rank 1 or 2), at a step whose
  // recovery point (the step under a kill inside the update, the one before
  // under a pipeline kill) is not a multiple of 3 (--memento-every 3), so
  // that the replacement has steps to replay.
  std::vector<std::string> Kill(const std::string& point, std::string* what,
                                bool middle_of_4 = false) {
    const uint64_t seed = memento::testing::TestSeed(
        ((middle_of_4 ? "launch_swift_log_" : "launch_swift_") + point).c_str());
    std::mt19937_64 rng(seed);
    int rank = static_cast<int>(rng() % 4);
    int step = 4 + static_cast<int>(rng() % 4);
    const int chunk = static_cast<int>(rng() % 2);
    if (middle_of_4) {
      rank = 1 + rank % 2;
      const int targets[] = {4, 5, 7, 8};
      step = targets[step % 4] + (point == "pipeline" ? 1 : 0);
    }
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

  // The one recovery of `o`'s summary; null (and a failure) when there is
  // not exactly one.
  static const json* OneRecovery(const Outcome& o) {
    if (!o.summary.is_object() || !o.summary.contains("recoveries") ||
        o.summary["recoveries"].size() != 1u) {
      ADD_FAILURE() << "not exactly one recovery in the summary\n" << o.Report();
      return nullptr;
    }
    return &o.summary["recoveries"][0];
  }

  // The per-report checks: the recovery's mode, how many processes it
  // started, and its fallback (empty: none; else a part of its reason).
  static void ExpectReport(const json& rep, const std::string& mode, int restarted,
                           const std::string& fallback = "") {
    EXPECT_EQ(rep["mode"], mode) << rep.dump();
    EXPECT_EQ(rep["processes_restarted"], restarted) << rep.dump();
    if (fallback.empty()) {
      EXPECT_EQ(rep["fallback"], "") << rep.dump();
    } else {
      EXPECT_NE(rep["fallback"].get<std::string>().find(fallback), std::string::npos) << rep.dump();
    }
  }

  // The one recovery of `o`, in process: mode undo (or log), one process
  // restarted. At most one step lost (the survivors' undone step), plus
  // `back` when the job went back to an older snapshot in process.
  static void ExpectInProcess(const Outcome& o, const std::string& mode = "undo",
                              int64_t back = 0) {
    const json* rep = OneRecovery(o);
    ASSERT_NE(rep, nullptr);
    ExpectReport(*rep, mode, 1);
    EXPECT_GE((*rep)["step"].get<int64_t>(), 3 - back) << rep->dump();
    EXPECT_LE((*rep)["steps_lost"].get<int64_t>(), 1 + back) << rep->dump();
    EXPECT_GT((*rep)["resume_s"].get<double>(), 0.0) << rep->dump();
    EXPECT_EQ(o.summary["attempts"], 1) << o.Report();  // no whole-job restart
    EXPECT_NE(o.output.find("(" + mode + ", in process)"), std::string::npos) << o.Report();
  }

  // DP 2 x PP 2 without ZeRO-1, rank `killed` lost: the other pipeline's two
  // ranks both completed their pipeline schedule of the step and failed in
  // the DP allreduce (the lost rank is in one DP group; the other DP group
  // is closed by the survivor whose pipeline traffic with the lost rank
  // failed), so their PP group is kept, not rebuilt; that survivor, the lost
  // rank's pipeline neighbour, keeps none (its PP group holds the lost rank,
  // its DP group was closed by itself).
  void ExpectOnlyTheLostRanksGroupsRebuilt(const Outcome& o, int killed) {
    const int other = 1 - killed % 2;  // the other pipeline's DP index
    const std::string kept = "kept Gloo group(s): pp.dp" + std::to_string(other) + ".tp0";
    for (int r : {other, 2 + other}) {
      const std::string log = ReadFile(o.logs + "/rank" + std::to_string(r) + ".log");
      EXPECT_NE(log.find(kept), std::string::npos) << "rank " << r << "\n" << log;
    }
    const std::string peer = ReadFile(o.logs + "/rank" + std::to_string(killed ^ 2) + ".log");
    EXPECT_NE(peer.find("kept Gloo group(s): none"), std::string::npos) << peer;
  }

  // A kill just before collective `point` (--fail-point grad-allreduce,
  // grad-norm or all-gather), rank 0..3 and step 4..7 drawn from the seed.
  std::vector<std::string> KillBefore(const std::string& point, const std::string& topo,
                                      std::string* what) {
    const uint64_t seed =
        memento::testing::TestSeed(("launch_swift_collective_" + topo + "_" + point).c_str());
    std::mt19937_64 rng(seed);
    const int rank = static_cast<int>(rng() % 4);
    const int step = 4 + static_cast<int>(rng() % 4);
    *what = "seed " + std::to_string(seed) + " (" + topo + "): rank " + std::to_string(rank) +
            " killed before the " + point + " of step " + std::to_string(step);
    std::printf("%s\n", what->c_str());
    std::fflush(stdout);
    return {"--fail-rank",        std::to_string(rank), "--fail-at-step",
            std::to_string(step), "--fail-point",       point};
  }

  // Every survivor of a 4-rank job (dp x tp x pp) says it kept exactly the
  // groups of size > 1 that the lost rank `killed` is not in, in the
  // order dp, tp, pp (Comm::Reconnect's names); with `none_kept`, none.
  void ExpectKeptGroups(const Outcome& o, int dp, int tp, int pp, int killed, bool none_kept) {
    auto coords = [&](int r, int* p, int* d, int* t) {
      *t = r % tp;
      *d = (r / tp) % dp;
      *p = r / (tp * dp);
    };
    int kp, kd, kt;
    coords(killed, &kp, &kd, &kt);
    for (int r = 0; r < dp * tp * pp; ++r) {
      if (r == killed) continue;
      int p, d, t;
      coords(r, &p, &d, &t);
      std::string want;
      if (!none_kept) {
        if (dp > 1 && !(p == kp && t == kt)) {
          want += " dp.pp" + std::to_string(p) + ".tp" + std::to_string(t);
        }
        if (tp > 1 && !(p == kp && d == kd)) {
          want += " tp.pp" + std::to_string(p) + ".dp" + std::to_string(d);
        }
        if (pp > 1 && !(d == kd && t == kt)) {
          want += " pp.dp" + std::to_string(d) + ".tp" + std::to_string(t);
        }
      }
      if (want.empty()) want = " none";
      const std::string log = ReadFile(o.logs + "/rank" + std::to_string(r) + ".log");
      EXPECT_NE(log.find("kept Gloo group(s):" + want + "\n"), std::string::npos)
          << "rank " << r << " should keep:" << want << "\n"
          << log;
    }
  }

  // How many steps a ZeRO-1 undo went back past the survivors' step (the
  // replacement's log says so when its moment shard of that step was not in
  // the tiers; 0 when it was).
  static int64_t StepsBack(const Outcome& o, const std::string& rank) {
    const std::string log = ReadFile(o.logs + "/rank" + rank + ".log");
    const std::string what = "the tiers have no version of step ";
    const size_t at = log.find(what);
    if (at == std::string::npos) return 0;
    const int64_t target = std::atoll(log.c_str() + at + what.size());
    const std::string to = "the job goes back to step ";
    const size_t back = log.find(to, at);
    if (back == std::string::npos) return 0;
    const int64_t agreed = std::atoll(log.c_str() + back + to.size());
    std::printf("rank %s's moment shard of step %lld was not in the tiers: back to step %lld\n",
                rank.c_str(), static_cast<long long>(target), static_cast<long long>(agreed));
    return target - agreed;
  }

  // DP 1 x PP 4 under --recovery log: memento snapshots every 3rd step, the
  // pipeline log in shared memory (a tmpfs directory when there is one).
  // `mode`: the launcher's --recovery (log, or auto: log for DP 1 x PP 4).
  Outcome RunLog(const std::string& name, std::vector<std::string> trainer_args,
                 bool recovery = true, const std::string& mode = "log") {
    std::vector<std::string> launch = {"--dp", "1", "--pp", "4"};
    if (recovery) launch.insert(launch.end(), {"--recovery", mode});
    std::vector<std::string> args = {"--memento-every", "3"};
    if (recovery) {
      args.insert(args.end(), {"--pipeline-log-dir", LogDir(name)});
    }
    args.insert(args.end(), trainer_args.begin(), trainer_args.end());
    return Run(name, launch, args);
  }
  std::string LogDir(const std::string& name) {
    struct stat st {};
    const std::string base = stat("/dev/shm", &st) == 0 ? "/dev/shm" : dir_.path();
    const std::string d = base + "/memento-launch-swift-" + std::to_string(getpid()) + "-" + name;
    log_dirs_.push_back(d);
    return d;
  }
  void TearDown() override {
    for (const std::string& d : log_dirs_) {
      const std::string cmd = "rm -rf '" + d + "'";
      if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", d.c_str());
    }
  }
  std::vector<std::string> log_dirs_;

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
    ExpectOnlyTheLostRanksGroupsRebuilt(o, std::stoi(kill[1]));
  }
  const Outcome node = Run("node", {"--recovery", "undo", "--inject", "kill-node:2@step=5"}, {});
  ExpectSameFinalStates(clean, node);
  const json* rep = OneRecovery(node);
  ASSERT_NE(rep, nullptr);
  ExpectReport(*rep, "restart", 4, "a node or agent is lost");
  EXPECT_NE(node.output.find("in-process recovery not possible"), std::string::npos)
      << node.Report();
}

// A rank lost just before a collective after the pipeline schedule: in the
// DP gradient allreduce (its DP peers fail there, every other rank in the
// gradient-norm allreduce) or in the gradient-norm allreduce (every
// survivor fails there). No survivor had begun its update: nothing is
// undone, no step lost. Every group the lost rank is not in is kept (DP
// groups too: a rank that failed in the gradient-norm allreduce offers its
// DP group), and only the lost rank's groups are rebuilt; bit-identical.
TEST_F(LaunchSwiftTest, UndoKeepsEveryGroupTheLostRankIsNotIn) {
  const Outcome clean = Run("cclean", {}, {});
  for (const std::string point : {"grad-allreduce", "grad-norm"}) {
    std::string what;
    const std::vector<std::string> kill = KillBefore(point, "dp2pp2", &what);
    SCOPED_TRACE(what);
    const Outcome o = Run("c-" + point, {"--recovery", "undo"}, kill);
    ExpectSameFinalStates(clean, o);
    ExpectInProcess(o);
    const json* rep = OneRecovery(o);
    if (rep != nullptr) {
      EXPECT_EQ((*rep)["steps_lost"], 0) << rep->dump();
    }
    ExpectKeptGroups(o, 2, 1, 2, std::stoi(kill[1]), /*none_kept=*/false);
  }
}

// Tensor parallelism: DP 2 x TP 2 (pp 1) under --recovery undo, a rank lost
// before its DP gradient allreduce or its gradient-norm allreduce (drawn
// from the seed). The lost rank's TP peer and DP peer get their state
// unchanged, the replacement its state from its DP replica (each TP slice
// from its own); the surviving TP group and DP group are kept;
// bit-identical, no step lost. Then a rank lost inside its update (below).
TEST_F(LaunchSwiftTest, UndoWithTensorParallelism) {
  const std::vector<std::string> topo = {"--dp", "2", "--tp", "2", "--pp", "1"};
  const Outcome clean = Run("tclean", topo, {});
  const uint64_t seed = memento::testing::TestSeed("launch_swift_tp_point");
  const std::string point = seed % 2 == 0 ? "grad-allreduce" : "grad-norm";
  std::string what;
  const std::vector<std::string> kill = KillBefore(point, "dp2tp2", &what);
  SCOPED_TRACE(what);
  std::vector<std::string> launch = topo;
  launch.insert(launch.end(), {"--recovery", "undo"});
  const Outcome o = Run("tundo", launch, kill);
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o);
  const json* rep = OneRecovery(o);
  if (rep != nullptr) {
    EXPECT_EQ((*rep)["steps_lost"], 0) << rep->dump();
  }
  ExpectKeptGroups(o, 2, 2, 1, std::stoi(kill[1]), /*none_kept=*/false);

  // A rank lost inside its update: its TP peer fails in a TP allreduce in
  // the middle of the next step's layers. That failure fails the step (it
  // once ended the process, exit 3, and the job restarted): in process too.
  std::string inside;
  const std::vector<std::string> update = Kill("update", &inside);
  SCOPED_TRACE(inside);
  const Outcome u = Run("tundo-update", launch, update);
  ExpectSameFinalStates(clean, u);
  ExpectInProcess(u);
}

// ZeRO-1, a rank lost just before its parameter all-gather: its DP peer
// fails in the all-gather; the other stage's ranks completed theirs and
// fail in the next step's schedule. A group can be offered by neither (after
// the gradient norm a peer may already wait on this rank in the next
// step's pipeline or TP traffic), so every group is rebuilt; the recovery
// stays in process and bit-identical (the survivors undo the step).
TEST_F(LaunchSwiftTest, ZeroOneKillInTheAllGatherRebuildsEveryGroup) {
  const Outcome clean = Run("gclean", {"--zero", "1"}, {"--zero"});
  std::string what;
  std::vector<std::string> args = {"--zero"};
  const std::vector<std::string> kill = KillBefore("all-gather", "dp2pp2", &what);
  SCOPED_TRACE(what);
  args.insert(args.end(), kill.begin(), kill.end());
  const Outcome o = Run("gundo", {"--zero", "1", "--recovery", "undo"}, args);
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o, "undo", StepsBack(o, kill[1]));
  ExpectKeptGroups(o, 2, 1, 2, std::stoi(kill[1]), /*none_kept=*/true);
}

// A rank lost INSIDE the gradient-norm sum, after its part went out
// (--fail-point grad-norm-commit: the sum done, its commit token sent to
// only the first K other ranks; rank, step 4..7 and K 1..2 drawn from the
// seed). The ranks that got its token pass the gradient norm, complete the
// step and go on into the next one, where one may wait on a survivor that
// did not pass (its pipeline neighbour, its DP peer). Such a survivor failed
// inside the commit round and cannot know whether anybody passed, so it
// offers no group ("kept Gloo group(s): none"): every group it is in is
// closed at once and a peer waiting on it fails now. Before that rule it
// offered its groups, a peer waited on it until --comm-timeout (30 s), and
// the launcher, whose --in-process-timeout (20 s here) comes first,
// restarted the whole job, which ExpectInProcess rejects. The survivors
// agree on the step before (those that passed undo theirs): at most one
// step lost, bit-identical.
TEST_F(LaunchSwiftTest, UndoAfterARankLostInsideTheGradientNorm) {
  const Outcome clean = Run("iclean", {}, {});
  const uint64_t seed = memento::testing::TestSeed("launch_swift_inside_grad_norm");
  std::mt19937_64 rng(seed);
  const int killed = static_cast<int>(rng() % 4);
  const int step = 4 + static_cast<int>(rng() % 4);
  const int reached = 1 + static_cast<int>(rng() % 2);
  const std::string what = "seed " + std::to_string(seed) + ": rank " + std::to_string(killed) +
                           " killed inside the gradient norm of step " + std::to_string(step) +
                           ", its commit token sent to " + std::to_string(reached) + " rank(s)";
  std::printf("%s\n", what.c_str());
  std::fflush(stdout);
  SCOPED_TRACE(what);
  const Outcome o =
      Run("inside", {"--recovery", "undo", "--in-process-timeout", "20"},
          {"--fail-rank", std::to_string(killed), "--fail-at-step", std::to_string(step),
           "--fail-point", "grad-norm-commit", "--fail-chunk", std::to_string(reached)});
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o);
  // The survivors the token did not reach (rank order, the killed rank
  // skipped) failed inside the commit round: they keep no group.
  int seen = 0;
  for (int r = 0; r < 4; ++r) {
    if (r == killed || seen++ < reached) continue;
    const std::string log = ReadFile(o.logs + "/rank" + std::to_string(r) + ".log");
    EXPECT_NE(log.find("kept Gloo group(s): none\n"), std::string::npos) << "rank " << r << "\n"
                                                                         << log;
  }
}

// The same kill inside the gradient norm under --recovery log (DP 1 x PP
// 4, a middle stage lost, step 4..7 and K 1..2 drawn from the seed): the
// survivors that passed undo their step, the others keep their state and
// keep no group; the lost stage replays from its T0 snapshot; bit-identical.
TEST_F(LaunchSwiftTest, LogAfterARankLostInsideTheGradientNorm) {
  const Outcome clean = RunLog("ilclean", {}, /*recovery=*/false);
  const uint64_t seed = memento::testing::TestSeed("launch_swift_log_inside_grad_norm");
  std::mt19937_64 rng(seed);
  const int killed = 1 + static_cast<int>(rng() % 2);
  const int step = 4 + static_cast<int>(rng() % 4);
  const int reached = 1 + static_cast<int>(rng() % 2);
  const std::string what = "seed " + std::to_string(seed) + ": rank " + std::to_string(killed) +
                           " killed inside the gradient norm of step " + std::to_string(step) +
                           ", its commit token sent to " + std::to_string(reached) + " rank(s)";
  std::printf("%s\n", what.c_str());
  std::fflush(stdout);
  SCOPED_TRACE(what);
  const Outcome o =
      RunLog("ilog", {"--fail-rank", std::to_string(killed), "--fail-at-step", std::to_string(step),
                      "--fail-point", "grad-norm-commit", "--fail-chunk", std::to_string(reached)});
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o, "log");
  int seen = 0;
  for (int r = 0; r < 4; ++r) {
    if (r == killed || seen++ < reached) continue;
    const std::string log = ReadFile(o.logs + "/rank" + std::to_string(r) + ".log");
    EXPECT_NE(log.find("kept Gloo group(s): none\n"), std::string::npos) << "rank " << r << "\n"
                                                                         << log;
  }
}

// The same kill (ZeRO-1, just before the all-gather) under --recovery log:
// the lost rank restarts from its T0 snapshot, its DP peer (failed in the
// all-gather, half into its update) rolls back to its own and both replay
// from the other stage's log; the other stage keeps the step it completed.
// No step lost, every group rebuilt, bit-identical.
TEST_F(LaunchSwiftTest, LogRecoversAZeroOneKillInTheAllGatherWithNoStepLost) {
  std::vector<std::string> launch = {"--dp", "2", "--pp", "2", "--zero", "1"};
  std::vector<std::string> args = {"--memento-every", "3", "--zero"};
  const Outcome clean = Run("lgclean", launch, args);
  std::string what;
  const std::vector<std::string> kill = KillBefore("all-gather", "dp2pp2log", &what);
  SCOPED_TRACE(what);
  launch.insert(launch.end(), {"--recovery", "log"});
  args.insert(args.end(), {"--pipeline-log-dir", LogDir("lglog")});
  args.insert(args.end(), kill.begin(), kill.end());
  const Outcome o = Run("lglog", launch, args);
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o, "log");
  const json* rep = OneRecovery(o);
  if (rep != nullptr) {
    std::printf("log replay after an all-gather kill: %s\n", rep->dump().c_str());
    EXPECT_EQ((*rep)["steps_lost"], 0) << rep->dump();
    EXPECT_EQ((*rep)["source"], "snapshot+log") << rep->dump();
  }
  ExpectKeptGroups(o, 2, 1, 2, std::stoi(kill[1]), /*none_kept=*/true);
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
  // (Under load the client may have skipped the replacement's snapshot of
  // the survivors' step by the commit word rule: the job then goes back to
  // an older one, still in process; ZeroOneMissingShardGoesBackInProcess.)
  ExpectInProcess(o, "undo", StepsBack(o, kill[1]));
  EXPECT_NE(o.output.find("moment shard from node"), std::string::npos) << o.Report();

  args = {"--zero", "--no-memento", "--fail-rank", "3", "--fail-at-step",
          "5",      "--fail-point", "update"};
  const Outcome f = Run("zfallback", {"--zero", "1", "--recovery", "undo"}, args);
  ExpectSameFinalStates(clean, f);
  const json* rep = OneRecovery(f);
  ASSERT_NE(rep, nullptr);
  ExpectReport(*rep, "restart", 5, "in-process recovery (undo");  // the replacement, then all 4
  EXPECT_NE(ReadFile(f.logs + "/rank3.log").find("no DP replica"), std::string::npos)
      << ReadFile(f.logs + "/rank3.log");
}

// ZeRO-1 with the replacement's snapshot of the survivors' step missing
// (--skip-snapshot-step: rank 3 takes none of step 7, as when the client
// skips one by the commit word rule; it then dies at a pipeline receive of
// step 8, so every survivor is at 7): the tiers hold no moment shard of
// step 7 for it, so the job goes back in process to the newest older step
// every rank holds (6 on a quiet machine; under load the client may also
// have skipped 6 and 5 by the commit word rule, and it once went back to 4
// in CI): the replacement restores its shard of that step, each survivor its
// own state of it. One process restarted, 7 - step steps lost,
// bit-identical.
TEST_F(LaunchSwiftTest, ZeroOneMissingShardGoesBackInProcess) {
  const Outcome clean = Run("mclean", {"--zero", "1"}, {"--zero"});
  const Outcome o = Run("missing", {"--zero", "1", "--recovery", "undo"},
                        {"--zero", "--fail-rank", "3", "--fail-at-step", "8", "--fail-point",
                         "pipeline", "--skip-snapshot-step", "7"});
  ExpectSameFinalStates(clean, o);
  const int64_t back = StepsBack(o, "3");
  EXPECT_GE(back, 1) << ReadFile(o.logs + "/rank3.log");
  ExpectInProcess(o, "undo", back);
  if (::testing::Test::HasFatalFailure()) return;
  const json& rep = o.summary["recoveries"][0];
  const int64_t step = rep["step"].get<int64_t>();
  EXPECT_EQ(step, 7 - back) << rep.dump();
  EXPECT_GE(step, rep["committed"].get<int64_t>()) << rep.dump();  // never below the commit
  EXPECT_EQ(rep["steps_lost"], back) << rep.dump();
  const std::string loaded = "loaded its own snapshot of step " + std::to_string(step);
  for (const char* r : {"0", "1", "2"}) {
    EXPECT_NE(ReadFile(o.logs + "/rank" + r + ".log").find(loaded), std::string::npos)
        << "rank " << r << "\n"
        << ReadFile(o.logs + "/rank" + r + ".log");
  }
}

// Sharded snapshots (--sharded, docs/reft.md) with DP 4 x PP 1, ZeRO-1,
// xor: each rank's T0 slot holds only its plan pieces, so the replacement's
// Restore(step) of its moment shard goes through its agent's assembly of the
// pieces (its own from its node, the others from their nodes). The job ends
// bit-identical to a failure-free run, in process. (It once fell back to the
// whole-job restart in CI, seed 41803551750117: under load the clients had
// skipped snapshots by the commit word rule, the replacement's shard of the
// agreed step among them, and of the three steps before it no one that
// every rank held; now the job goes back in process to the newest step all
// hold, at worst the committed one.)
TEST_F(LaunchSwiftTest, ShardedSlotsZeroOneShardComesFromTheAssembly) {
  const std::vector<std::string> topo = {"--dp", "4", "--pp", "1", "--zero", "1"};
  const Outcome clean = Run("sclean", topo, {"--zero", "--micro-batches", "2"});
  std::string what;
  std::vector<std::string> kill = Kill("update", &what);
  SCOPED_TRACE(what);
  std::vector<std::string> args = {"--zero", "--micro-batches", "2"};
  args.insert(args.end(), kill.begin(), kill.end());
  std::vector<std::string> launch = topo;
  launch.insert(launch.end(), {"--sharded", "--policy", "xor", "--recovery", "undo"});
  const Outcome o = Run("sundo", launch, args);
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o, "undo", StepsBack(o, kill[1]));
  EXPECT_NE(o.output.find("moment shard from node"), std::string::npos) << o.Report();
  // The killed rank's replacement restored its shard from the assembled pieces.
  const std::string killed = kill[1];
  const std::string log = ReadFile(o.logs + "/rank" + killed + ".log");
  EXPECT_NE(log.find("from its assembled pieces"), std::string::npos) << log;
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
  const json* rep = OneRecovery(o);
  ASSERT_NE(rep, nullptr);
  ExpectReport(*rep, "restart", 5, "no in-process recovery report from rank(s) 0");
}

// Log replay (SWIFT 2.2) under `memento launch`: a middle stage of DP 1 x
// PP 4 killed inside its optimizer update (--recovery log), then (another
// run, --recovery auto, which picks log for DP 1) at a pipeline receive;
// only it restarts, loads its stage's newest memento snapshot (at
// most 3 steps old) from its node's T0 and replays the logged inputs since;
// no step is lost and every rank ends bit-identical to the failure-free run.
TEST_F(LaunchSwiftTest, LogReplaysTheLostStage) {
  const Outcome clean = RunLog("lclean", {}, /*recovery=*/false);
  // A middle stage receives 4 activations and 4 gradients per step, each
  // micro-batch (2 sequences) x seq 16 x d_model 32 floats, and the step's
  // logged gradient-norm sum (one double).
  constexpr int64_t kBytesPerStep = 8 * 2 * 16 * 32 * 4 + 8;
  for (const std::string point : {"update", "pipeline"}) {
    std::string what;
    const std::vector<std::string> kill = Kill(point, &what, /*middle_of_4=*/true);
    SCOPED_TRACE(what);
    const Outcome o =
        RunLog("log-" + point, kill, /*recovery=*/true, point == "update" ? "log" : "auto");
    ExpectSameFinalStates(clean, o);
    ExpectInProcess(o, "log");
    if (::testing::Test::HasFatalFailure()) return;
    const json& rep = o.summary["recoveries"][0];
    std::printf("log replay (%s): %s\n", point.c_str(), rep.dump().c_str());
    EXPECT_EQ(rep["source"], "snapshot+log") << rep.dump();
    const int64_t lost = rep["steps_lost"].get<int64_t>();
    if (point == "pipeline") {
      EXPECT_EQ(lost, 0) << rep.dump();  // none had completed the step
    }
    const int64_t replayed = rep["replayed_steps"].get<int64_t>();
    // The agreed step is not a multiple of 3 (unless a survivor undid its
    // step): there are steps since the newest snapshot, at most 2 (3 when
    // the newest snapshot was cut short by the kill).
    if (lost == 0) {
      EXPECT_GE(replayed, 1) << rep.dump();
      EXPECT_LE(replayed, 5) << rep.dump();
    }
    EXPECT_EQ(rep["bytes_replayed"].get<int64_t>(), replayed * kBytesPerStep) << rep.dump();
  }
}

// A neighbour's log entry corrupted (one flipped byte in its newest step
// file, --corrupt-log-rank) after the failure: the replacement's read fails
// the entry's checksum, every rank gives up the in-process recovery, and the
// launcher restarts the whole job from memento's committed step, reported as
// the fallback of the log recovery; the run still ends bit-identical.
TEST_F(LaunchSwiftTest, CorruptedLogEntryFallsBackToTheSnapshot) {
  const Outcome clean = RunLog("cclean", {}, /*recovery=*/false);
  const Outcome o = RunLog("corrupt", {"--fail-rank", "2", "--fail-at-step", "5", "--fail-point",
                                       "pipeline", "--corrupt-log-rank", "1"});
  ExpectSameFinalStates(clean, o);
  const json* rep = OneRecovery(o);
  ASSERT_NE(rep, nullptr);
  ExpectReport(*rep, "restart", 5, "in-process recovery (log");  // the replacement, then all 4
  EXPECT_EQ(o.summary["attempts"], 2) << o.Report();
  const std::string replacement_log = ReadFile(o.logs + "/rank2.log");
  EXPECT_NE(replacement_log.find("fails its checksum"), std::string::npos) << replacement_log;
  // The restarted rank 1 (restored step 3) dropped the earlier attempt's
  // step files after 3, the corrupt one of step 4 among them.
  const std::string rank1_log = ReadFile(o.logs + "/rank1.log");
  EXPECT_NE(rank1_log.find("stale pipeline log step file(s) after step 3"), std::string::npos)
      << rank1_log;
}

// A replay that diverges (the replacement's loaded snapshot perturbed in
// one bit, --perturb-replay): its first recomputed output differs from what
// the neighbour received, the recovery fails with "replay diverged" and the
// job falls back to the whole-job restart, reported; it still ends
// bit-identical (the restart restores the committed, unperturbed step).
TEST_F(LaunchSwiftTest, ReplayThatDivergesFallsBackToTheSnapshot) {
  const Outcome clean = RunLog("dclean", {}, /*recovery=*/false);
  const Outcome o = RunLog("diverge", {"--fail-rank", "1", "--fail-at-step", "5", "--fail-point",
                                       "update", "--perturb-replay"});
  ExpectSameFinalStates(clean, o);
  const json* rep = OneRecovery(o);
  ASSERT_NE(rep, nullptr);
  ExpectReport(*rep, "restart", 5, "in-process recovery (log");  // the replacement, then all 4
  const std::string replacement_log = ReadFile(o.logs + "/rank1.log");
  EXPECT_NE(replacement_log.find("replay diverged"), std::string::npos) << replacement_log;
}

// Selective logging (--log-group-size 2): only messages between the stage
// pairs {0,1} and {2,3} are logged; stage 2 killed inside its update, its
// group-mate stage 3 (a survivor) rolls back to its own memento snapshot of
// the same step and both replay together, live between them, the inputs
// from stage 1 from its log. Still one process restarted, no step lost,
// bit-identical.
TEST_F(LaunchSwiftTest, LogGroupReplaysTogetherFromTheTiers) {
  const Outcome clean = RunLog("gclean", {"--log-group-size", "2"}, /*recovery=*/false);
  const Outcome o = RunLog("group", {"--log-group-size", "2", "--fail-rank", "2", "--fail-at-step",
                                     "5", "--fail-point", "update"});
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o, "log");
  if (::testing::Test::HasFatalFailure()) return;
  const json& rep = o.summary["recoveries"][0];
  std::printf("log group replay: %s\n", rep.dump().c_str());
  EXPECT_EQ(rep["steps_lost"], 0) << rep.dump();
  // Both stages replay 4 and 5 from the snapshot of 3.
  EXPECT_EQ(rep["replayed_stages"], 2) << rep.dump();
  EXPECT_EQ(rep["replayed_steps"], 4) << rep.dump();
  // Across the group's edge only stage 2's activations from stage 1 (4 x
  // 4 KiB per step) and the gradient-norm sums are replayed.
  EXPECT_EQ(rep["bytes_replayed"].get<int64_t>(), 2 * (4 * 4096 + 8) + 2 * 8) << rep.dump();
  EXPECT_NE(ReadFile(o.logs + "/rank3.log").find("loaded this stage's snapshot of step 3"),
            std::string::npos)
      << ReadFile(o.logs + "/rank3.log");
}

// Log replay with DP > 1 (DP 2 x PP 2 on 4 nodes, --recovery log, memento
// snapshots every 3rd step, the log in shared memory): a rank killed inside
// its optimizer update, then (another run, ZeRO-1) at a pipeline receive,
// drawn from the seed. Only it restarts; its DP peer (the other rank of its
// stage) rolls back to its own T0 snapshot of the same step and both replay
// together, each with the inputs its own pipeline neighbour logged, the
// gradient allreduce (and ZeRO-1's all-gather) live between them; the other
// stage keeps its state. No step lost when there were steps to replay,
// bytes replayed = steps replayed x the stage's inputs, bit-identical to the
// failure-free run.
TEST_F(LaunchSwiftTest, LogReplaysTheLostRankWithItsDataParallelPeer) {
  for (const std::string point : {"update", "pipeline"}) {
    const bool zero = point == "pipeline";
    std::vector<std::string> launch = {"--dp", "2", "--pp", "2"};
    std::vector<std::string> args = {"--memento-every", "3"};
    if (zero) {
      launch.insert(launch.end(), {"--zero", "1"});
      args.push_back("--zero");
    }
    const Outcome clean = Run("dpclean-" + point, launch, args);
    std::string what;
    const std::vector<std::string> kill = Kill(point, &what, /*middle_of_4=*/true);
    SCOPED_TRACE(what + (zero ? " (ZeRO-1)" : ""));
    launch.insert(launch.end(), {"--recovery", "log"});
    args.insert(args.end(), {"--pipeline-log-dir", LogDir("dplog-" + point)});
    args.insert(args.end(), kill.begin(), kill.end());
    const Outcome o = Run("dplog-" + point, launch, args);
    ExpectSameFinalStates(clean, o);
    ExpectInProcess(o, "log");
    if (::testing::Test::HasFatalFailure()) return;
    const json& rep = o.summary["recoveries"][0];
    std::printf("log replay with dp 2 (%s): %s\n", point.c_str(), rep.dump().c_str());
    std::fflush(stdout);  // (not again from the next Run's fork)
    EXPECT_EQ(rep["source"], "snapshot+log") << rep.dump();
    const int64_t replayed = rep["replayed_steps"].get<int64_t>();
    if (rep["steps_lost"] == 0) {
      // Both ranks of the lost stage replayed the same steps (at least one:
      // the agreed step is not a multiple of 3 unless a survivor undid its
      // step).
      EXPECT_EQ(rep["replayed_stages"], 2) << rep.dump();
      EXPECT_GE(replayed, 2) << rep.dump();
      EXPECT_EQ(replayed % 2, 0) << rep.dump();
    }
    // Per replayed step a rank receives 4 micro-batches (1 sequence of 16 x
    // 32 floats each; stage 0 gradients, stage 1 activations) and the
    // step's gradient-norm sum.
    EXPECT_EQ(rep["bytes_replayed"].get<int64_t>(), replayed * (4 * 16 * 32 * 4 + 8)) << rep.dump();
    // The killed rank's DP peer: rank 1 <-> 0, rank 2 <-> 3.
    const std::string peer = kill[1] == "1" ? "0" : "3";
    if (replayed > 0) {
      EXPECT_NE(ReadFile(o.logs + "/rank" + peer + ".log").find("loaded this stage's snapshot"),
                std::string::npos)
          << ReadFile(o.logs + "/rank" + peer + ".log");
    }
  }
}

// Log replay with tensor parallelism: DP 1 x TP 2 x PP 2 on 4 nodes, a rank
// killed inside its update or at a pipeline receive (rank 1 or 2, the step
// drawn from the seed). Its TP peer rolls back to its own snapshot and the
// two replay together: their layers' TP allreduces run live between them,
// each reads the log of its own pipeline neighbour (same TP index: the log
// is the sender's, one per rank, keyed by step, micro-batch, sender and
// receiver stage). The other stage keeps its state; bit-identical.
TEST_F(LaunchSwiftTest, LogReplaysTheLostRankWithItsTensorParallelPeer) {
  std::vector<std::string> launch = {"--dp", "1", "--tp", "2", "--pp", "2"};
  std::vector<std::string> args = {"--memento-every", "3"};
  const Outcome clean = Run("tpclean", launch, args);
  const uint64_t seed = memento::testing::TestSeed("launch_swift_log_tp_point");
  const std::string point = seed % 2 == 0 ? "update" : "pipeline";
  std::string what;
  const std::vector<std::string> kill = Kill(point, &what, /*middle_of_4=*/true);
  SCOPED_TRACE(what);
  launch.insert(launch.end(), {"--recovery", "log"});
  args.insert(args.end(), {"--pipeline-log-dir", LogDir("tplog")});
  args.insert(args.end(), kill.begin(), kill.end());
  const Outcome o = Run("tplog", launch, args);
  ExpectSameFinalStates(clean, o);
  ExpectInProcess(o, "log");
  if (::testing::Test::HasFatalFailure()) return;
  const json& rep = o.summary["recoveries"][0];
  std::printf("log replay with tp 2 (%s): %s\n", point.c_str(), rep.dump().c_str());
  std::fflush(stdout);
  EXPECT_EQ(rep["source"], "snapshot+log") << rep.dump();
  const int64_t replayed = rep["replayed_steps"].get<int64_t>();
  if (rep["steps_lost"] == 0) {
    // Both ranks of the lost stage replayed the same steps.
    EXPECT_EQ(rep["replayed_stages"], 2) << rep.dump();
    EXPECT_GE(replayed, 2) << rep.dump();
    EXPECT_EQ(replayed % 2, 0) << rep.dump();
  }
  // Per replayed step a rank receives 4 micro-batches (2 sequences of 16 x
  // 32 floats each) and the step's gradient-norm sum.
  EXPECT_EQ(rep["bytes_replayed"].get<int64_t>(), replayed * (4 * 2 * 16 * 32 * 4 + 8))
      << rep.dump();
  // The killed rank's TP peer (rank = 2 * stage + tp): rank 1 <-> 0, 2 <-> 3.
  const std::string peer = kill[1] == "1" ? "0" : "3";
  if (replayed > 0) {
    EXPECT_NE(ReadFile(o.logs + "/rank" + peer + ".log").find("loaded this stage's snapshot"),
              std::string::npos)
        << ReadFile(o.logs + "/rank" + peer + ".log");
  }
}

// `--recovery auto` on DP 1 x PP 4 picks log, but a trainer without memento
// snapshots and without --save has nothing to replay from: it says so,
// trains without the log and the job still runs (a failure would restart
// it).
TEST_F(LaunchSwiftTest, AutoWithoutSnapshotsTrainsWithoutTheLog) {
  const Outcome o = Run("autonolog", {"--dp", "1", "--pp", "4", "--recovery", "auto"},
                        {"--no-memento", "--pipeline-log-dir", LogDir("autonolog")});
  ASSERT_EQ(o.exit, 0) << o.Report();
  EXPECT_NE(ReadFile(o.logs + "/rank0.log").find("in-process log recovery off"), std::string::npos)
      << ReadFile(o.logs + "/rank0.log");
}

TEST_F(LaunchSwiftTest, RefusesBadRecoveryOptions) {
  Outcome a = Run("bad1", {"--recovery", "sometimes"}, {});
  EXPECT_EQ(a.exit, 2) << a.output;
  EXPECT_NE(a.output.find("--recovery 'sometimes'"), std::string::npos) << a.output;
  Outcome b = Run("bad2", {"--recovery", "undo", "--pp", "4"}, {});  // dp 1
  EXPECT_EQ(b.exit, 2) << b.output;
  EXPECT_NE(b.output.find("--recovery undo needs --dp >= 2"), std::string::npos) << b.output;
  Outcome c = Run("bad3", {"--recovery", "log", "--dp", "4", "--pp", "1"}, {});  // no pipeline
  EXPECT_EQ(c.exit, 2) << c.output;
  EXPECT_NE(c.output.find("--recovery log needs --pp >= 2"), std::string::npos) << c.output;
}

}  // namespace
