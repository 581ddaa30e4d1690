// `memento launch` end to end: a real coordination store, one real agent per
// node, real trainers (memento-test-workload), failures injected with real
// SIGKILLs and deleted node roots, recovery from the memory of the survivors.
// Every recovered run must end bit-identical to the uninterrupted computation
// (the workload's --reference digest), and the workload itself checks every
// restored state against its recomputation.
//
// MEMENTO_CHAOS=1 (the cluster_chaos_test binary, label chaos) runs only the
// seeded random test; otherwise it is skipped.
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace memento {
namespace {

using nlohmann::json;

bool Chaos() { return std::getenv("MEMENTO_CHAOS") != nullptr; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Job {
  int nodes = 4;
  int ranks_per_node = 1;
  int dp = 0, tp = 1, pp = 1, zero = 0;
  std::string policy = "xor";
  std::string inject;
  int steps = 40;
  int elements = 16384;
  int step_ms = 15;
  // The agents compute the plan ~50-100 ms after the last seal; steps taken
  // before that are never protected (and an early abandoned step was seen to
  // keep a short job from committing at all).
  int warmup_ms = 500;
  int max_restarts = 3;
  std::vector<std::string> extra;  // more launch flags
  int world() const { return nodes * ranks_per_node; }
  int dp_size() const { return dp > 0 ? dp : world() / (tp * pp); }
};

struct Outcome {
  ExitStatus exit;
  std::string output;  // the launcher's stdout + stderr
  json summary;
  std::string out_dir;
  bool unsupported = false;
};

#define SKIP_IF_UNSUPPORTED(o)                                                                    \
  if ((o).unsupported) {                                                                          \
    GTEST_SKIP() << "the agents do not serve kPeerInventory / kPeerRecover yet:\n" << (o).output; \
  }

std::string LaunchLogs(const Outcome& o) { return "launcher output:\n" + o.output; }

Outcome RunJob(const Job& job, const std::string& dir, const std::string& name) {
  Outcome o;
  o.out_dir = dir + "/out";
  EXPECT_EQ(mkdir(o.out_dir.c_str(), 0700), 0);
  const std::string summary = dir + "/summary.json";
  SpawnOptions so;
  so.argv = {MEMENTO_BIN,
             "launch",
             "--job",
             name + "-" + std::to_string(getpid()),
             "--nodes",
             std::to_string(job.nodes),
             "--ranks-per-node",
             std::to_string(job.ranks_per_node),
             "--tp",
             std::to_string(job.tp),
             "--pp",
             std::to_string(job.pp),
             "--zero",
             std::to_string(job.zero),
             "--policy",
             job.policy,
             "--max-restarts",
             std::to_string(job.max_restarts),
             "--run-dir",
             dir + "/run",
             "--summary-json",
             summary};
  if (job.dp > 0) {
    so.argv.push_back("--dp");
    so.argv.push_back(std::to_string(job.dp));
  }
  if (!job.inject.empty()) {
    so.argv.push_back("--inject");
    so.argv.push_back(job.inject);
  }
  for (const auto& e : job.extra) so.argv.push_back(e);
  for (const char* a : {"--", WORKLOAD_BIN}) so.argv.push_back(a);
  for (const std::string& a :
       {std::string("--steps"), std::to_string(job.steps), std::string("--elements"),
        std::to_string(job.elements), std::string("--step-ms"), std::to_string(job.step_ms),
        std::string("--warmup-ms"), std::to_string(job.warmup_ms), std::string("--out"),
        o.out_dir}) {
    so.argv.push_back(a);
  }
  so.log_path = dir + "/launch.log";
  auto p = Subprocess::Spawn(so);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return o;
  auto st = p->Wait(Deadline::AfterSeconds(150));
  if (!st.ok()) {
    p->Terminate(5);
    ADD_FAILURE() << "memento launch did not finish in 150 s";
    o.exit.code = -1;
  } else {
    o.exit = *st;
  }
  o.output = ReadAll(so.log_path);
  // Agents built without the peer service's inventory and recovery methods
  // (agent cluster mode before it serves kPeerInventory / kPeerRecover)
  // cannot take part in a recovery: nothing to test then.
  if (o.output.find("does not serve the peer inventory") != std::string::npos) {
    o.unsupported = true;
  }
  const std::string text = ReadAll(summary);
  if (!text.empty()) o.summary = json::parse(text, nullptr, false);
  return o;
}

std::string ReferenceDigest(const Job& job, int rank, const std::string& dir) {
  SpawnOptions so;
  so.argv = {WORKLOAD_BIN, "--reference",
             "--steps",    std::to_string(job.steps),
             "--elements", std::to_string(job.elements),
             "--rank",     std::to_string(rank),
             "--dp",       std::to_string(job.dp_size()),
             "--tp",       std::to_string(job.tp),
             "--pp",       std::to_string(job.pp),
             "--zero",     std::to_string(job.zero)};
  so.log_path = dir + "/reference" + std::to_string(rank);
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return "spawn failed: " + p.status().ToString();
  auto st = p->Wait(Deadline::AfterSeconds(60));
  if (!st.ok() || !st->ok()) return "reference failed";
  std::string d = ReadAll(so.log_path);
  while (!d.empty() && d.back() == '\n') d.pop_back();
  return d;
}

// Every rank finished with the state of the uninterrupted computation and
// never loaded a state that differs from its recomputation.
void ExpectBitIdentical(const Job& job, const Outcome& o, const std::string& dir) {
  for (int r = 0; r < job.world(); ++r) {
    const std::string prefix = o.out_dir + "/rank" + std::to_string(r);
    EXPECT_EQ(ReadAll(prefix + ".mismatch"), "") << "rank " << r;
    std::string got = ReadAll(prefix + ".digest");
    std::string want = std::to_string(job.steps) + " " + ReferenceDigest(job, r, dir) + "\n";
    EXPECT_EQ(got, want) << "rank " << r << "\n" << LaunchLogs(o);
  }
}

// "<attempt> <step>" lines of a rank's restores.
std::vector<std::pair<int, int64_t>> Restores(const Outcome& o, int rank) {
  std::vector<std::pair<int, int64_t>> out;
  std::istringstream in(ReadAll(o.out_dir + "/rank" + std::to_string(rank) + ".restores"));
  int a;
  long long s;
  while (in >> a >> s) out.emplace_back(a, s);
  return out;
}

// After recovery n the ranks restarted at the restored step (from memory).
void ExpectRestoredFromMemory(const Job& job, const Outcome& o, size_t recoveries) {
  ASSERT_TRUE(o.summary.is_object()) << LaunchLogs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), recoveries) << LaunchLogs(o);
  for (size_t n = 0; n < recoveries; ++n) {
    const json& rec = o.summary["recoveries"][n];
    const int64_t step = rec["step"].get<int64_t>();
    EXPECT_GE(step, 1) << "recovery " << n << " did not restore from memory\n" << LaunchLogs(o);
    EXPECT_EQ(step, rec["committed"].get<int64_t>()) << LaunchLogs(o);
    const int attempt = rec["attempt"].get<int>();
    for (int r = 0; r < job.world(); ++r) {
      bool found = false;
      for (auto [a, s] : Restores(o, r)) found |= (a == attempt && s == step);
      EXPECT_TRUE(found) << "rank " << r << " did not restore step " << step << " in attempt "
                         << attempt << "\n"
                         << LaunchLogs(o);
    }
  }
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Chaos()) GTEST_SKIP() << "MEMENTO_CHAOS: only the chaos test runs";
  }
  testing::ScratchDir dir_{"cluster"};
};

TEST_F(ClusterTest, NoFailure) {
  Job job;
  job.steps = 20;
  Outcome o = RunJob(job, dir_.path(), "nofail");
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  EXPECT_EQ(o.summary["recoveries"].size(), 0u);
  EXPECT_GE(o.summary["committed"].get<int64_t>(), 1) << LaunchLogs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

TEST_F(ClusterTest, SoftwareFailureKillRank) {
  Job job;
  job.inject = "kill-rank:2@step=10";
  Outcome o = RunJob(job, dir_.path(), "killrank");
  SKIP_IF_UNSUPPORTED(o);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  ExpectRestoredFromMemory(job, o, 1);
  EXPECT_TRUE(o.summary["recoveries"][0]["lost_nodes"].empty()) << LaunchLogs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

TEST_F(ClusterTest, AgentCrashRestartsOnItsRootAndAdoptsItsSlots) {
  Job job;
  job.inject = "kill-agent:2@step=10";
  Outcome o = RunJob(job, dir_.path(), "killagent");
  SKIP_IF_UNSUPPORTED(o);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  EXPECT_NE(o.output.find("restarting the agent of node 2 on its root"), std::string::npos)
      << LaunchLogs(o);
  ExpectRestoredFromMemory(job, o, 1);
  // The node's memory survived the agent: nothing had to be rebuilt.
  EXPECT_TRUE(o.summary["recoveries"][0]["lost_nodes"].empty()) << LaunchLogs(o);
  EXPECT_EQ(o.summary["recoveries"][0]["rebuilt_bytes"].get<uint64_t>(), 0u) << LaunchLogs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

TEST_F(ClusterTest, NodeLossUnderReplicate) {
  Job job;
  job.policy = "replicate";
  job.inject = "kill-node:1@step=10";
  Outcome o = RunJob(job, dir_.path(), "lossrepl");
  SKIP_IF_UNSUPPORTED(o);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  ExpectRestoredFromMemory(job, o, 1);
  EXPECT_EQ(o.summary["recoveries"][0]["lost_nodes"], json::array({1})) << LaunchLogs(o);
  EXPECT_GT(o.summary["recoveries"][0]["rebuilt_bytes"].get<uint64_t>(), 0u) << LaunchLogs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

TEST_F(ClusterTest, NodeLossUnderXorWithZero1) {
  Job job;
  job.policy = "xor";
  job.nodes = 2;
  job.ranks_per_node = 2;
  job.dp = 2;
  job.pp = 2;
  job.zero = 1;
  job.inject = "kill-node:0@step=10";
  Outcome o = RunJob(job, dir_.path(), "lossxor");
  SKIP_IF_UNSUPPORTED(o);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  ExpectRestoredFromMemory(job, o, 1);
  ExpectBitIdentical(job, o, dir_.path());
}

TEST_F(ClusterTest, TwoNodesOfOneGroupUnderRs2) {
  Job job;
  job.policy = "rs:2";
  job.inject = "kill-node:1@step=10,kill-node:2@step=10";
  Outcome o = RunJob(job, dir_.path(), "rs2");
  SKIP_IF_UNSUPPORTED(o);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  ExpectRestoredFromMemory(job, o, 1);
  EXPECT_EQ(o.summary["recoveries"][0]["lost_nodes"], json::array({1, 2})) << LaunchLogs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

TEST_F(ClusterTest, LossBeyondProtectionIsRefusedNamingThePieces) {
  Job job;
  job.policy = "xor";
  job.inject = "kill-node:1@step=8,kill-node:2@step=8";
  Outcome o = RunJob(job, dir_.path(), "beyond");
  SKIP_IF_UNSUPPORTED(o);
  EXPECT_EQ(o.exit.code, 3) << o.exit.ToString() << "\n" << LaunchLogs(o);
  EXPECT_NE(o.output.find("memory cannot rebuild any committed version"), std::string::npos)
      << LaunchLogs(o);
  // The reason names pieces of the lost nodes (e.g. "sg0/r1").
  EXPECT_NE(o.output.find("sg0/r"), std::string::npos) << LaunchLogs(o);
  EXPECT_NE(o.output.find("no --durable-dir"), std::string::npos) << LaunchLogs(o);
  ASSERT_TRUE(o.summary.is_object()) << LaunchLogs(o);
  EXPECT_FALSE(o.summary["success"].get<bool>());
}

TEST_F(ClusterTest, CorruptedSlotOnASurvivorIsDetectedAndRebuilt) {
  Job job;
  job.policy = "xor";
  // Rank 0's committed T0 slot is corrupted at rest when rank 3 dies: the
  // recovery's verified inventory must leave it out and rebuild rank 0.
  job.inject = "corrupt-rank:0@step=10,kill-rank:3@step=10";
  Outcome o = RunJob(job, dir_.path(), "corrupt");
  SKIP_IF_UNSUPPORTED(o);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
  EXPECT_NE(o.output.find("flipped a byte in slot"), std::string::npos) << LaunchLogs(o);
  ExpectRestoredFromMemory(job, o, 1);
  EXPECT_GT(o.summary["recoveries"][0]["rebuilt_bytes"].get<uint64_t>(), 0u) << LaunchLogs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

// Seeded random failures: kills of ranks, agents and nodes at random steps,
// never more node losses at once than the policy protects (rs:2: two).
TEST(ClusterChaos, RandomFailures) {
  if (!Chaos()) GTEST_SKIP() << "set MEMENTO_CHAOS=1 (cluster_chaos_test)";
  const uint64_t seed = testing::TestSeed("ClusterChaos.RandomFailures");
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 3; ++round) {
    testing::ScratchDir dir("cluster-chaos");
    Job job;
    job.policy = "rs:2";
    job.steps = 60;
    job.max_restarts = 6;
    std::string inject;
    const int failures = 1 + static_cast<int>(rng() % 3);
    int64_t step = 5;
    for (int k = 0; k < failures; ++k) {
      step += 5 + static_cast<int64_t>(rng() % 10);
      const int kind = static_cast<int>(rng() % 3);
      const int target = static_cast<int>(rng() % 4);
      const char* names[] = {"kill-rank", "kill-agent", "kill-node"};
      if (!inject.empty()) inject += ",";
      inject +=
          std::string(names[kind]) + ":" + std::to_string(target) + "@step=" + std::to_string(step);
    }
    job.inject = inject;
    SCOPED_TRACE("seed " + std::to_string(seed) + " round " + std::to_string(round) + ": " +
                 inject);
    Outcome o = RunJob(job, dir.path(), "chaos" + std::to_string(round));
    SKIP_IF_UNSUPPORTED(o);
    ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << LaunchLogs(o);
    ExpectBitIdentical(job, o, dir.path());
  }
}

}  // namespace
}  // namespace memento
