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
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace {

// `out`: stdout and stderr go to this file.
pid_t Spawn(std::vector<std::string> args, const std::string& out) {
  pid_t pid = fork();
  if (pid == 0) {
    if (!out.empty()) {
      FILE* f = std::freopen(out.c_str(), "w", stdout);
      (void)f;
      dup2(fileno(stdout), fileno(stderr));
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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The newest loss-log line of each step: a resumed run appends the steps
// after its restore, so a step it trained again has two lines.
std::map<long, std::string> LastLinePerStep(const std::string& path) {
  std::map<long, std::string> out;
  for (const std::string& l : ReadLines(path)) out[std::stol(l)] = l;
  return out;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class TrainerMementoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    job_ = "trainer-test-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    root_ = "/dev/shm/" + job_;
  }
  // `memento agent` on root_, with `extra` arguments.
  void StartAgent(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {MEMENTO_CLI_BINARY, "agent", "--job", job_, "--root", root_};
    args.insert(args.end(), extra.begin(), extra.end());
    agent_ = Spawn(args, dir_.path() + "/agent.out");
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

  // Runs memento-trainer (all ranks, --launch) and returns its exit status;
  // its output goes to `out` when given.
  int Train(std::vector<std::string> args, const std::string& loss_log, bool memento,
            const std::string& out = "") {
    const std::string rdv = dir_.path() + "/rdv" + std::to_string(runs_++);
    EXPECT_EQ(mkdir(rdv.c_str(), 0700), 0);
    std::vector<std::string> all = {
        MEMENTO_TRAINER_BINARY, "--launch", "--quiet", "--rendezvous", rdv, "--loss-log", loss_log};
    if (memento) {
      all.insert(all.end(), {"--memento", "--job-id", job_, "--agent-dir", root_});
    }
    all.insert(all.end(), args.begin(), args.end());
    return Wait(Spawn(all, out));
  }

  void RestoreIsBitwise(const std::string& schedule);
  void ShardedSingleNodeJob(int dp, bool corrupt);

  memento::testing::ScratchDir dir_{"trainer-memento"};
  std::string job_, root_;
  pid_t agent_ = -1;
  int runs_ = 0;
};

void TrainerMementoTest::RestoreIsBitwise(const std::string& schedule) {
  StartAgent();
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

// A single-node job of `dp` DP ranks (no ZeRO: everything but the small
// private train_state is replicated) whose agent has the job's topology
// (`memento agent --topology` without --store; docs/reft.md section 1,
// "Single-node jobs"). Each rank's slot holds about 1/dp of its state
// (`memento inspect --tier memory`), and a restore reassembles every rank
// from the other ranks' slots in the node's shared memory, bit-identical to
// an uninterrupted run. Without `corrupt`: rank 1 is killed after step 6
// and the job restarted. With `corrupt`: the job stops after step 5, one
// byte of rank 1's piece in its slot of step 5 is flipped, and every rank
// restores step 4 (the assembly of step 5 fails its checksum).
void TrainerMementoTest::ShardedSingleNodeJob(int dp, bool corrupt) {
  std::string rank_node;
  for (int r = 0; r < dp; ++r) rank_node += (r > 0 ? ",0" : "0");
  StartAgent({"--topology", "{\"dp\":" + std::to_string(dp) + ",\"rank_node\":[" + rank_node +
                                "],\"sharded\":true}"});
  const std::vector<std::string> topo = {"--preset", "tiny", "--layers",
                                         "2",        "--dp", std::to_string(dp)};
  auto with = [](std::vector<std::string> a, std::vector<std::string> extra) {
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::string resumed = dir_.path() + "/resumed.txt", full = dir_.path() + "/full.txt";
  const std::string out1 = dir_.path() + "/run1.out", out2 = dir_.path() + "/run2.out";
  if (corrupt) {
    ASSERT_EQ(Train(with(topo, {"--steps", "5"}), resumed, true, out1), 0) << ReadAll(out1);
  } else {
    EXPECT_NE(Train(with(topo, {"--steps", "9", "--fail-at-step", "6", "--fail-rank", "1"}),
                    resumed, true, out1),
              0)
        << ReadAll(out1);
  }
  // The whole state of each rank and what its sharded slot holds, as its
  // client logged them ("... sharded snapshots under plan P: A of B bytes").
  const std::string log1 = ReadAll(out1);
  const std::regex plan_line(
      "rank (\\d+): sharded snapshots under plan \\w+: (\\d+) of (\\d+) bytes");
  std::map<int, std::pair<uint64_t, uint64_t>> claimed;
  for (std::sregex_iterator it(log1.begin(), log1.end(), plan_line), end; it != end; ++it) {
    claimed[std::stoi((*it)[1])] = {std::stoull((*it)[2]), std::stoull((*it)[3])};
  }
  ASSERT_EQ(static_cast<int>(claimed.size()), dp) << log1;
  // What the slots hold, read by `memento inspect` from the node's root.
  const std::string inspect = dir_.path() + "/inspect.json";
  ASSERT_EQ(
      Wait(Spawn({MEMENTO_CLI_BINARY, "inspect", "--tier", "memory", root_, "--json"}, inspect)), 0)
      << ReadAll(inspect);
  const nlohmann::json j = nlohmann::json::parse(ReadLines(inspect).back());
  std::map<int, std::pair<int64_t, uint64_t>> newest;  // rank -> (step, data_bytes)
  for (const auto& slot : j.at("slots")) {
    if (slot.at("state") != "complete" || !slot.at("intact").get<bool>()) continue;
    auto& n = newest[slot.at("rank").get<int>()];
    if (slot.at("step").get<int64_t>() > n.first) {
      n = {slot.at("step").get<int64_t>(), slot.at("data_bytes").get<uint64_t>()};
    }
  }
  ASSERT_EQ(static_cast<int>(newest.size()), dp) << j.dump();
  for (int r = 0; r < dp; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const uint64_t whole = claimed[r].second, held = newest[r].second;
    std::printf("rank %d: slot of step %lld holds %llu of its %llu bytes\n", r,
                static_cast<long long>(newest[r].first), static_cast<unsigned long long>(held),
                static_cast<unsigned long long>(whole));
    std::fflush(stdout);  // not again in the children Spawn forks
    EXPECT_EQ(held, claimed[r].first);
    // 1/dp of the replicated state, cut at 64 bytes, plus train_state.
    EXPECT_LE(held, whole / dp + 4096);
    EXPECT_GE(held + 4096, whole / dp);
  }
  int64_t want_step = -1;
  if (corrupt) {
    // One byte of rank 1's piece of step 5, in its slot.
    ASSERT_EQ(newest[1].first, 5);
    bool flipped = false;
    for (int slot = 0; slot < 2; ++slot) {
      auto seg = memento::shm::Segment::Open(memento::shm::SlotPath(root_, 1, slot), true);
      ASSERT_TRUE(seg.ok()) << seg.status();
      auto info = memento::shm::ReadSlot(**seg);
      ASSERT_TRUE(info.ok()) << info.status();
      if (info->step != 5) continue;
      for (const memento::shm::SavedTensor& t : info->tensors) {
        if (t.meta.name != "params") continue;
        (*seg)->data()[info->data_offset + t.offset + t.nbytes / 2] ^= 0x20;
        flipped = true;
      }
    }
    ASSERT_TRUE(flipped);
    want_step = 4;
  }
  ASSERT_EQ(Train(with(topo, {"--steps", "9"}), resumed, true, out2), 0) << ReadAll(out2);
  const std::string log2 = ReadAll(out2);
  // Every rank restored the same step through the agent's assembly.
  const std::regex restored_line("rank (\\d+) restored step (\\d+)");
  std::map<int, int64_t> restored;
  for (std::sregex_iterator it(log2.begin(), log2.end(), restored_line), end; it != end; ++it) {
    restored[std::stoi((*it)[1])] = std::stoll((*it)[2]);
  }
  ASSERT_EQ(static_cast<int>(restored.size()), dp) << log2;
  for (const auto& [r, step] : restored) {
    EXPECT_EQ(step, restored.begin()->second) << "rank " << r << "\n" << log2;
  }
  std::printf("every rank restored step %lld\n", static_cast<long long>(restored.begin()->second));
  std::fflush(stdout);
  if (want_step >= 0) {
    EXPECT_EQ(restored.begin()->second, want_step) << log2;
    EXPECT_GE(Count(log2, "fails its checksum"), 1u) << log2;
  } else {
    EXPECT_GE(restored.begin()->second, 5) << log2;
  }
  EXPECT_EQ(Count(log2, "from its assembled pieces"), static_cast<size_t>(dp)) << log2;
  ASSERT_EQ(Train(with(topo, {"--steps", "9"}), full, false), 0);
  const auto a = LastLinePerStep(resumed), b = LastLinePerStep(full);
  ASSERT_EQ(b.size(), 9u);
  EXPECT_EQ(a, b);  // every step, the resumed ones too, bit for bit
}

TEST_F(TrainerMementoTest, ShardedSingleNodeDp2RestoresAfterARankIsKilled) {
  ShardedSingleNodeJob(2, /*corrupt=*/false);
}

TEST_F(TrainerMementoTest, ShardedSingleNodeDp4SkipsAPieceThatFailsItsChecksum) {
  ShardedSingleNodeJob(4, /*corrupt=*/true);
}

TEST_F(TrainerMementoTest, RestoreFromAgentIsBitwise) { RestoreIsBitwise("eager"); }

// The same with snapshots scheduled by HAS (--memento-schedule has): the
// trainer's phase hooks (pipeline bubbles reported as idle) drive the copy.
TEST_F(TrainerMementoTest, RestoreFromAgentIsBitwiseWithHas) { RestoreIsBitwise("has"); }

}  // namespace
