// memento-trainer checkpointing through memento (built only with the
// memento_client library and the `memento` CLI): a real `memento agent`
// process, trainer ranks as real processes registering their state, a
// snapshot every step, and a new job restoring from the agent's shared
// memory. The resumed run must equal an uninterrupted one bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"

namespace {

pid_t Spawn(std::vector<std::string> args, const std::string& out) {
  pid_t pid = fork();
  if (pid == 0) {
    if (!out.empty()) {
      FILE* f = std::freopen(out.c_str(), "w", stdout);
      (void)f;
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

class TrainerMementoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    job_ = "trainer-test-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    root_ = "/dev/shm/" + job_;
    agent_ = Spawn({MEMENTO_CLI_BINARY, "agent", "--job", job_, "--root", root_},
                   dir_.path() + "/agent.out");
    struct stat st;
    for (int i = 0; i < 200 && stat((root_ + "/agent.sock").c_str(), &st) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(stat((root_ + "/agent.sock").c_str(), &st), 0) << "agent did not start";
  }
  void TearDown() override {
    if (agent_ > 0) {
      kill(agent_, SIGTERM);
      Wait(agent_);
    }
    memento::testing::RemoveTree(root_);
  }

  // Runs memento-trainer (all ranks, --launch) and returns its exit status.
  int Train(std::vector<std::string> args, const std::string& loss_log, bool memento) {
    const std::string rdv = dir_.path() + "/rdv" + std::to_string(runs_++);
    EXPECT_EQ(mkdir(rdv.c_str(), 0700), 0);
    std::vector<std::string> all = {
        MEMENTO_TRAINER_BINARY, "--launch", "--quiet", "--rendezvous", rdv, "--loss-log", loss_log};
    if (memento) {
      all.insert(all.end(), {"--memento", "--job-id", job_, "--agent-dir", root_});
    }
    all.insert(all.end(), args.begin(), args.end());
    return Wait(Spawn(all, ""));
  }

  void RestoreIsBitwise(const std::string& schedule);

  memento::testing::ScratchDir dir_{"trainer-memento"};
  std::string job_, root_;
  pid_t agent_ = -1;
  int runs_ = 0;
};

void TrainerMementoTest::RestoreIsBitwise(const std::string& schedule) {
  const std::vector<std::string> topo = {"--preset", "tiny", "--layers",        "4", "--dp",  "2",
                                         "--pp",     "2",    "--micro-batches", "2", "--zero"};
  std::vector<std::string> memento_topo = topo;
  memento_topo.insert(memento_topo.end(), {"--memento-schedule", schedule});
  auto with = [](std::vector<std::string> a, std::vector<std::string> extra) {
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::string resumed = dir_.path() + "/resumed.txt", full = dir_.path() + "/full.txt";
  ASSERT_EQ(Train(with(memento_topo, {"--steps", "5"}), resumed, true), 0);
  ASSERT_EQ(Train(with(memento_topo, {"--steps", "9"}), resumed, true), 0);  // restores step 5
  ASSERT_EQ(Train(with(topo, {"--steps", "9"}), full, false), 0);
  std::vector<std::string> a = ReadLines(resumed), b = ReadLines(full);
  ASSERT_EQ(b.size(), 9u);
  EXPECT_EQ(a, b);  // steps 1..5, then 6..9 after the restore, same bits
}

TEST_F(TrainerMementoTest, RestoreFromAgentIsBitwise) { RestoreIsBitwise("eager"); }

// The same with snapshots scheduled by HAS (--memento-schedule has): the
// trainer's phase hooks (pipeline bubbles reported as idle) drive the copy.
TEST_F(TrainerMementoTest, RestoreFromAgentIsBitwiseWithHas) { RestoreIsBitwise("has"); }

}  // namespace
