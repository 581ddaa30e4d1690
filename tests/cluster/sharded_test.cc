// `memento launch --sharded` end to end (issue 15, docs/reft.md sections
// 1-3): every rank snapshots only its plan pieces of the replicated state,
// and every recovery still ends bit-identical. A real store, one real agent
// per node, real trainers (memento-test-workload), real SIGKILLs and deleted
// node roots. A surviving rank's slot holds pieces, so its restore goes
// through the agent's `assemble` (its log says "from its assembled pieces");
// a lost node's ranks get whole slots rebuilt by the recovery executor.
//
// Each case is one job of ~20 steps (< 60 s on the loaded 2-core VM).

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "launch_job.h"

namespace memento {
namespace {

using nlohmann::json;

using memento::testing::ReadAll;

using cluster_testing::ExpectBitIdentical;
using cluster_testing::Job;
using cluster_testing::Logs;
using cluster_testing::Outcome;
using cluster_testing::Restored;
using cluster_testing::RunJob;

// A job of the sharded save path: `memento launch --sharded`, 24 steps.
struct ShardedJob : Job {
  ShardedJob() {
    steps = 24;
    extra = {"--sharded"};
    // 24 steps of 15 ms: under load the whole job could end while step 4
    // waited for its commit (steps 5-24 skipped, the kill at 10 never fired).
    pace_commits = true;
  }
};

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
    EXPECT_TRUE(Restored(o, r, attempt, step))
        << "rank " << r << " did not restore step " << step << " in attempt " << attempt << "\n"
        << Logs(o);
  }
}

// Rank r's restore went through the agent's assembly of its pieces.
bool RestoredFromPieces(const Outcome& o, int r) {
  return ReadAll(o.dir + "/run/logs/rank" + std::to_string(r) + ".log")
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
  ShardedJob job;
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

// An agent killed and restarted on its root (its node's memory intact) right
// before the restore: the survivors' assemblies ask the restarted agent for
// its pieces, and its own rank's assembly runs on it, while it may still be
// reading the topology and the inventories again; both wait (bounded) for
// its plan (agent::WaitForPlan) instead of failing the restore with "no plan
// yet". Every rank restores through the assembly, bit-identical.
TEST_F(ShardedTest, AgentRestartedRightBeforeTheRestoreUnderXorDp4) {
  ShardedJob job;
  job.inject = "kill-agent:2@step=10";
  Outcome o = RunJob(job, dir_.path(), "shagent");
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  EXPECT_NE(o.output.find("restarting the agent of node 2 on its root"), std::string::npos)
      << Logs(o);
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
  ShardedJob job;
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
  ShardedJob job;
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
  ShardedJob job;
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
