// Multi-process tests of memento-trainer: real processes (one per rank,
// started by the binary's --launch), real Gloo TCP sockets.
//   - TP, PP, DP (+ZeRO-1) and their product follow the single-process loss
//     trajectory within float tolerance;
//   - the same topology is bit-identical run to run;
//   - save, then load in a new process and continue == uninterrupted run,
//     bit for bit (parameters, AdamW moments, data cursor and losses).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"

namespace {

struct LossLine {
  int step = 0;
  double loss = 0;
  std::string bits;
  double grad_norm = 0;
};

class TrainerProcessTest : public ::testing::Test {
 protected:
  // Runs memento-trainer with `args` (plus a fresh rendezvous directory and
  // a loss log); returns the exit status; *losses gets the loss log.
  int Run(const std::vector<std::string>& args, std::vector<LossLine>* losses) {
    const std::string run = dir_.path() + "/run" + std::to_string(runs_++);
    EXPECT_EQ(mkdir(run.c_str(), 0700), 0);
    const std::string rdv = run + "/rdv";
    EXPECT_EQ(mkdir(rdv.c_str(), 0700), 0);
    const std::string log = run + "/loss.txt";
    std::vector<std::string> all = {MEMENTO_TRAINER_BINARY, "--quiet", "--rendezvous",   rdv,
                                    "--loss-log",           log,       "--comm-timeout", "60"};
    all.insert(all.end(), args.begin(), args.end());
    pid_t pid = fork();
    if (pid == 0) {
      for (const auto& [name, value] : env_) setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    if (losses != nullptr) {
      losses->clear();
      std::ifstream in(log);
      LossLine l;
      while (in >> l.step >> l.loss >> l.bits >> l.grad_norm) losses->push_back(l);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  std::string Path(const std::string& name) { return dir_.path() + "/" + name; }

  memento::testing::ScratchDir dir_{"trainer-test"};
  int runs_ = 0;
  std::vector<std::pair<std::string, std::string>> env_;  // set in the child before exec
};

const std::vector<std::string> kModel = {"--preset", "tiny", "--layers", "4",
                                         "--batch",  "8",    "--warmup", "2"};

std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(TrainerProcessTest, LossFalls) {
  std::vector<LossLine> losses;
  ASSERT_EQ(Run(With(kModel, {"--steps", "80", "--lr", "3e-3"}), &losses), 0);
  ASSERT_EQ(losses.size(), 80u);
  EXPECT_NEAR(losses.front().loss, std::log(64.0), 0.2);  // uniform at init
  EXPECT_LT(losses.back().loss, losses.front().loss - 0.5);
}

TEST_F(TrainerProcessTest, ParallelTopologiesMatchSingleProcess) {
  const std::vector<std::string> base = With(kModel, {"--steps", "12", "--micro-batches", "2"});
  std::vector<LossLine> ref;
  ASSERT_EQ(Run(base, &ref), 0);
  ASSERT_EQ(ref.size(), 12u);
  const std::vector<std::vector<std::string>> topologies = {
      {"--dp", "2"}, {"--dp", "2", "--zero"},
      {"--tp", "2"}, {"--pp", "2"},
      {"--pp", "4"}, {"--dp", "2", "--tp", "2", "--pp", "2", "--zero", "--launch"},
  };
  for (const auto& topo : topologies) {
    std::vector<std::string> args = With(base, topo);
    if (args.back() != "--launch") args.push_back("--launch");
    std::string name;
    for (const auto& a : topo) name += a + " ";
    std::vector<LossLine> got;
    ASSERT_EQ(Run(args, &got), 0) << name;
    ASSERT_EQ(got.size(), ref.size()) << name;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i].step, ref[i].step);
      EXPECT_NEAR(got[i].loss, ref[i].loss, 1e-4 * ref[i].loss) << name << " step " << i + 1;
      // Adam hides a wrongly scaled gradient; the global norm does not.
      EXPECT_NEAR(got[i].grad_norm, ref[i].grad_norm, 1e-3 * ref[i].grad_norm)
          << name << " step " << i + 1;
    }
  }
}

// ZeRO-1 over 3 ranks of a model whose 30080 parameters do not divide by 3:
// the flat buffer is padded and the shards still cover every parameter.
TEST_F(TrainerProcessTest, ZeroWithUnevenShards) {
  const std::vector<std::string> base = {"--preset", "tiny", "--batch", "6",
                                         "--warmup", "2",    "--steps", "8"};
  std::vector<LossLine> ref, got;
  ASSERT_EQ(Run(base, &ref), 0);
  ASSERT_EQ(Run(With(base, {"--dp", "3", "--zero", "--launch"}), &got), 0);
  ASSERT_EQ(ref.size(), 8u);
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(got[i].loss, ref[i].loss, 1e-4 * ref[i].loss) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, ref[i].grad_norm, 1e-3 * ref[i].grad_norm) << "step " << i + 1;
  }
}

TEST_F(TrainerProcessTest, SameTopologyIsBitIdentical) {
  const std::vector<std::string> args = With(
      kModel,
      {"--steps", "6", "--dp", "2", "--tp", "2", "--micro-batches", "2", "--zero", "--launch"});
  std::vector<LossLine> a, b;
  ASSERT_EQ(Run(With(args, {"--save", Path("a.{rank}")}), &a), 0);
  ASSERT_EQ(Run(With(args, {"--save", Path("b.{rank}")}), &b), 0);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].bits, b[i].bits) << "step " << i + 1;
  for (int r = 0; r < 4; ++r) {
    std::string fa = ReadFile(Path("a." + std::to_string(r)));
    EXPECT_GT(fa.size(), 1000u);
    EXPECT_TRUE(fa == ReadFile(Path("b." + std::to_string(r)))) << "rank " << r;
  }
  // DP replicas hold the same parameters: ranks 0 and 2 are (dp 0, tp 0)
  // and (dp 1, tp 0). File: 80-byte header, params fp32[P], m and v
  // fp32[P / 2] each (ZeRO-1 over 2), 32-byte state; so P * 4 bytes of
  // parameters = (size - 112) / 2.
  std::string r0 = ReadFile(Path("a.0")), r2 = ReadFile(Path("a.2"));
  ASSERT_EQ(r0.size(), r2.size());
  const size_t param_bytes = (r0.size() - 112) / 2;
  EXPECT_EQ(r0.compare(80, param_bytes, r2, 80, param_bytes), 0);
  EXPECT_NE(r0.compare(80 + param_bytes, param_bytes, r2, 80 + param_bytes, param_bytes), 0)
      << "moment shards of different DP ranks should differ";
}

TEST_F(TrainerProcessTest, RestoreContinuesBitwise) {
  const std::vector<std::string> topo =
      With(kModel, {"--dp", "2", "--pp", "2", "--micro-batches", "2", "--zero", "--launch"});
  std::vector<LossLine> full, first, second;
  ASSERT_EQ(Run(With(topo, {"--steps", "8", "--save", Path("full.{rank}")}), &full), 0);
  ASSERT_EQ(Run(With(topo, {"--steps", "4", "--save", Path("half.{rank}")}), &first), 0);
  ASSERT_EQ(Run(With(topo, {"--steps", "8", "--load", Path("half.{rank}"), "--save",
                            Path("resumed.{rank}")}),
                &second),
            0);
  ASSERT_EQ(full.size(), 8u);
  ASSERT_EQ(first.size(), 4u);
  ASSERT_EQ(second.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(first[i].bits, full[i].bits) << "step " << i + 1;
    EXPECT_EQ(second[i].step, full[i + 4].step);
    EXPECT_EQ(second[i].bits, full[i + 4].bits) << "step " << i + 5;
  }
  for (int r = 0; r < 4; ++r) {
    std::string a = ReadFile(Path("full." + std::to_string(r)));
    EXPECT_GT(a.size(), 1000u);
    EXPECT_TRUE(a == ReadFile(Path("resumed." + std::to_string(r)))) << "rank " << r;
    EXPECT_FALSE(a == ReadFile(Path("half." + std::to_string(r)))) << "rank " << r;
  }
}

// A rank killed with SIGKILL mid-run: the job fails fast (its peers see the
// closed connection), and a new job resumes from the last periodic save to
// exactly the state of an uninterrupted run.
TEST_F(TrainerProcessTest, KilledRankResumesFromPeriodicSave) {
  const std::vector<std::string> topo =
      With(kModel, {"--dp", "2", "--pp", "2", "--micro-batches", "2", "--zero", "--launch"});
  std::vector<LossLine> full, crashed, resumed;
  ASSERT_EQ(Run(With(topo, {"--steps", "9", "--save", Path("full.{rank}")}), &full), 0);
  EXPECT_NE(Run(With(topo, {"--steps", "9", "--save", Path("ckpt.{rank}"), "--save-every", "3",
                            "--fail-at-step", "5", "--fail-rank", "2"}),
                &crashed),
            0);
  ASSERT_GE(crashed.size(), 5u);
  ASSERT_LT(crashed.size(), 9u);
  ASSERT_EQ(Run(With(topo, {"--steps", "9", "--load", Path("ckpt.{rank}"), "--save",
                            Path("resumed.{rank}")}),
                &resumed),
            0);
  ASSERT_EQ(resumed.size(), 6u);  // steps 4..9 from the step-3 save
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].step, full[i + 3].step);
    EXPECT_EQ(resumed[i].bits, full[i + 3].bits) << "step " << resumed[i].step;
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(ReadFile(Path("full." + std::to_string(r))) ==
                ReadFile(Path("resumed." + std::to_string(r))))
        << "rank " << r;
  }
}

TEST_F(TrainerProcessTest, LoadRejectsAnotherTopology) {
  ASSERT_EQ(
      Run(With(kModel, {"--steps", "2", "--dp", "2", "--launch", "--save", Path("dp2.{rank}")}),
          nullptr),
      0);
  // A single-process run reads rank 0's file, saved with dp 2.
  EXPECT_NE(Run(With(kModel, {"--steps", "3", "--load", Path("dp2.{rank}")}), nullptr), 0);
  EXPECT_NE(Run(With(kModel, {"--steps", "3", "--load", Path("missing.{rank}")}), nullptr), 0);
}

// Ranks that resume from different steps are refused (by every rank, at
// once), instead of training on with mismatched collectives.
TEST_F(TrainerProcessTest, MixedStepsAreRefused) {
  const std::vector<std::string> topo = With(kModel, {"--dp", "2", "--launch"});
  ASSERT_EQ(Run(With(topo, {"--steps", "2", "--save", Path("s2.{rank}")}), nullptr), 0);
  ASSERT_EQ(Run(With(topo, {"--steps", "4", "--save", Path("s4.{rank}")}), nullptr), 0);
  {
    std::ofstream out(Path("mix.1"), std::ios::binary);
    out << ReadFile(Path("s4.1"));
  }
  {
    std::ofstream out(Path("mix.0"), std::ios::binary);
    out << ReadFile(Path("s2.0"));
  }
  std::vector<LossLine> losses;
  EXPECT_NE(Run(With(topo, {"--steps", "6", "--load", Path("mix.{rank}")}), &losses), 0);
  EXPECT_TRUE(losses.empty());
  // The consistent set resumes.
  EXPECT_EQ(Run(With(topo, {"--steps", "6", "--load", Path("s4.{rank}")}), &losses), 0);
  EXPECT_EQ(losses.size(), 2u);
}

// Under `memento launch` the topology comes from MEMENTO_DP/TP/PP and
// MEMENTO_WORLD_SIZE (docs/cluster.md): the same job as with flags, bit for
// bit; --digest-file writes each rank's final digest.
TEST_F(TrainerProcessTest, LauncherEnvironmentGivesTheSameJobAsFlags) {
  const std::vector<std::string> base =
      With(kModel, {"--steps", "5", "--micro-batches", "2", "--zero", "--launch"});
  std::vector<LossLine> with_flags, with_env;
  ASSERT_EQ(Run(With(base, {"--dp", "2", "--pp", "2", "--digest-file", Path("flags.{rank}")}),
                &with_flags),
            0);
  env_ = {{"MEMENTO_DP", "2"}, {"MEMENTO_PP", "2"}, {"MEMENTO_WORLD_SIZE", "4"}};
  ASSERT_EQ(Run(With(base, {"--digest-file", Path("env.{rank}")}), &with_env), 0);
  ASSERT_EQ(with_env.size(), 5u);
  ASSERT_EQ(with_flags.size(), 5u);
  for (size_t i = 0; i < with_env.size(); ++i) EXPECT_EQ(with_env[i].bits, with_flags[i].bits);
  for (int r = 0; r < 4; ++r) {
    const std::string a = ReadFile(Path("flags." + std::to_string(r)));
    EXPECT_NE(a.find("\"step\": 5"), std::string::npos) << a;
    EXPECT_NE(a.find("\"params_xxh3\""), std::string::npos) << a;
    EXPECT_EQ(a, ReadFile(Path("env." + std::to_string(r)))) << "rank " << r;
  }
  // A world size that does not match the topology is refused.
  env_ = {{"MEMENTO_DP", "2"}, {"MEMENTO_WORLD_SIZE", "3"}};
  EXPECT_EQ(Run(With(kModel, {"--steps", "1"}), nullptr), 2);
  env_ = {{"MEMENTO_RANK", "one"}};
  EXPECT_EQ(Run(With(kModel, {"--steps", "1"}), nullptr), 2);
}

TEST_F(TrainerProcessTest, RejectsBadTopology) {
  EXPECT_NE(Run(With(kModel, {"--tp", "3", "--launch"}), nullptr), 0);  // 4 heads
  EXPECT_NE(Run(With(kModel, {"--dp", "3", "--launch"}), nullptr), 0);  // batch 8
}

}  // namespace
