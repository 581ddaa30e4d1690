// `memento launch --sharded` end to end (issue 15, docs/reft.md sections
// 1-3): every rank snapshots only its plan pieces of the replicated state,
// and every recovery still ends bit-identical. A real store, one real agent
// per node, real trainers (memento-test-workload), real SIGKILLs and deleted
// node roots. A surviving rank's slot holds pieces, so its restore goes
// through the agent's `assemble` (its log says "from its assembled pieces");
// a lost node's ranks get whole slots rebuilt by the recovery executor.
//
// Each case is one job of ~20 steps (< 60 s on the loaded 2-core VM).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace memento {
namespace {

using nlohmann::json;

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
  int steps = 24;
  int elements = 16384;
  int step_ms = 15;
  int warmup_ms = 500;  // the plan is known ~50-100 ms after the last seal
  int world() const { return nodes * ranks_per_node; }
  int dp_size() const { return dp > 0 ? dp : world() / (tp * pp); }
};

struct Outcome {
  ExitStatus exit;
  std::string output;  // the launcher's stdout + stderr
  json summary;
  std::string out_dir;
  std::string run_dir;
};

std::string Logs(const Outcome& o) { return "launcher output:\n" + o.output; }

Outcome RunJob(const Job& job, const std::string& dir, const std::string& name) {
  Outcome o;
  o.out_dir = dir + "/out";
  o.run_dir = dir + "/run";
  EXPECT_EQ(mkdir(o.out_dir.c_str(), 0700), 0);
  std::vector<std::string> argv = {MEMENTO_BIN,
                                   "launch",
                                   "--sharded",
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
                                   "3",
                                   "--run-dir",
                                   o.run_dir,
                                   "--summary-json",
                                   dir + "/summary.json"};
  if (job.dp > 0) {
    argv.push_back("--dp");
    argv.push_back(std::to_string(job.dp));
  }
  if (!job.inject.empty()) {
    argv.push_back("--inject");
    argv.push_back(job.inject);
  }
  for (const std::string& a :
       {std::string("--"), std::string(WORKLOAD_BIN), std::string("--steps"),
        std::to_string(job.steps), std::string("--elements"), std::to_string(job.elements),
        std::string("--step-ms"), std::to_string(job.step_ms), std::string("--warmup-ms"),
        std::to_string(job.warmup_ms), std::string("--out"), o.out_dir}) {
    argv.push_back(a);
  }
  SpawnOptions so;
  so.argv = argv;
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
  const std::string text = ReadAll(dir + "/summary.json");
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

// Every rank ended with the uninterrupted computation's state and never
// loaded a state that differs from its recomputation.
void ExpectBitIdentical(const Job& job, const Outcome& o, const std::string& dir) {
  for (int r = 0; r < job.world(); ++r) {
    const std::string prefix = o.out_dir + "/rank" + std::to_string(r);
    EXPECT_EQ(ReadAll(prefix + ".mismatch"), "") << "rank " << r;
    EXPECT_EQ(ReadAll(prefix + ".digest"),
              std::to_string(job.steps) + " " + ReferenceDigest(job, r, dir) + "\n")
        << "rank " << r << "\n"
        << Logs(o);
  }
}

// The job recovered once, from memory: every rank restarted at the
// committed step it restored.
void ExpectOneRecoveryFromMemory(const Job& job, const Outcome& o) {
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  const json& rec = o.summary["recoveries"][0];
  const int64_t step = rec["step"].get<int64_t>();
  EXPECT_GE(step, 1) << "the recovery did not restore from memory\n" << Logs(o);
  const int attempt = rec["attempt"].get<int>();
  for (int r = 0; r < job.world(); ++r) {
    std::istringstream in(ReadAll(o.out_dir + "/rank" + std::to_string(r) + ".restores"));
    bool found = false;
    int a;
    long long s;
    while (in >> a >> s) found |= (a == attempt && s == step);
    EXPECT_TRUE(found) << "rank " << r << " did not restore step " << step << " in attempt "
                       << attempt << "\n"
                       << Logs(o);
  }
}

// Rank r's restore went through the agent's assembly of its pieces.
bool RestoredFromPieces(const Outcome& o, int r) {
  return ReadAll(o.run_dir + "/logs/rank" + std::to_string(r) + ".log")
             .find("from its assembled pieces") != std::string::npos;
}

class ShardedTest : public ::testing::Test {
 protected:
  testing::ScratchDir dir_{"sharded"};
};

// A trainer killed, its node's memory intact: every rank's slot holds pieces
// and every rank restores through the assembly (its own pieces locally, the
// others' from their nodes).
TEST_F(ShardedTest, KillRankUnderXorDp4) {
  Job job;
  job.inject = "kill-rank:2@step=10";
  Outcome o = RunJob(job, dir_.path(), "shkill");
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  ExpectOneRecoveryFromMemory(job, o);
  EXPECT_TRUE(o.summary["recoveries"][0]["lost_nodes"].empty()) << Logs(o);
  for (int r = 0; r < job.world(); ++r) {
    EXPECT_TRUE(RestoredFromPieces(o, r)) << "rank " << r << "\n" << Logs(o);
  }
  ExpectBitIdentical(job, o, dir_.path());
}

// A node lost: its rank's slot is rebuilt (whole) from the survivors' pieces
// and the ARC copies; the survivors restore through the assembly, reading
// the lost rank's piece from the rebuilt slot.
TEST_F(ShardedTest, NodeLossUnderReplicateDp4) {
  Job job;
  job.policy = "replicate";
  job.inject = "kill-node:1@step=10";
  Outcome o = RunJob(job, dir_.path(), "shlossrepl");
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  ExpectOneRecoveryFromMemory(job, o);
  EXPECT_EQ(o.summary["recoveries"][0]["lost_nodes"], json::array({1})) << Logs(o);
  EXPECT_GT(o.summary["recoveries"][0]["rebuilt_bytes"].get<uint64_t>(), 0u) << Logs(o);
  for (int r : {0, 2, 3}) EXPECT_TRUE(RestoredFromPieces(o, r)) << "rank " << r << "\n" << Logs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

// ZeRO-1 under XOR, DP 4 (the optimizer shards stay whole per rank, the
// parameters are pieces): node 2 lost. (With DP 2 a rank's slot holds every
// byte anyway, its own piece plus what its ARC copy / parity needs.)
TEST_F(ShardedTest, NodeLossUnderXorWithZero1Dp4) {
  Job job;
  job.zero = 1;
  job.inject = "kill-node:2@step=10";
  Outcome o = RunJob(job, dir_.path(), "shlossxor");
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  ExpectOneRecoveryFromMemory(job, o);
  EXPECT_EQ(o.summary["recoveries"][0]["lost_nodes"], json::array({2})) << Logs(o);
  for (int r : {0, 1, 3}) EXPECT_TRUE(RestoredFromPieces(o, r)) << "rank " << r << "\n" << Logs(o);
  ExpectBitIdentical(job, o, dir_.path());
}

// ZeRO-1 under replicate, DP 4: a trainer killed.
TEST_F(ShardedTest, KillRankUnderReplicateWithZero1Dp4) {
  Job job;
  job.policy = "replicate";
  job.zero = 1;
  job.inject = "kill-rank:0@step=10";
  Outcome o = RunJob(job, dir_.path(), "shkillz1");
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  ExpectOneRecoveryFromMemory(job, o);
  for (int r = 0; r < job.world(); ++r) {
    EXPECT_TRUE(RestoredFromPieces(o, r)) << "rank " << r << "\n" << Logs(o);
  }
  ExpectBitIdentical(job, o, dir_.path());
}

}  // namespace
}  // namespace memento
