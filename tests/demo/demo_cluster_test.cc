// `memento demo` at small size (the multi-node demo of docs/demo.md): 4 real
// agents in cluster mode, a real DP 2 x PP 2 ZeRO-1 memento-trainer job, a
// trainer SIGKILLed and a whole node lost (agent killed, shared memory
// deleted), recovery from the peers' memory, and a failure-free run of the
// same job, on the sharded save path (memento launch --sharded) with AOR on
// (each node recomputes its ZeRO-1 peer's optimizer shard on the host,
// docs/reft.md section 5). The final
// parameters must be bit-identical; the report must name both failures with
// their steps and breakdown, and each node's bytes next to REFT's formula.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/shell_test_util.h"
#include "common/test_util.h"
#include "coord/etcd_process.h"
#include "coord/store.h"

namespace {

// Runs a command with its stderr folded into the output.
std::pair<int, std::string> RunShell(const std::string& cmd) {
  return memento::testing::RunShell(cmd + " 2>&1");
}

TEST(DemoClusterTest, CrashAndNodeLossEndBitIdentical) {
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) +
                          " demo --trainer-bin " MEMENTO_TRAINER_BINARY
                          " --preset tiny --steps 40 --kill-rank 3 --kill-rank-at 12"
                          " --kill-node 1 --kill-node-at 25 --progress-every 10";
  auto [rc, out] = RunShell(cmd);
  EXPECT_EQ(rc, 0) << out;
  for (const char* want :
       {"== run 1: with failures ==", "== run 2: the same job without failures ==",
        "progress step 10 loss", "AOR (each node recomputes", "1. rank 3 (node 3) failed",
        "2. node 1 lost", "node(s) lost: 1", "snapshot overhead per step",
        "bytes protected per node", "sharded snapshots", "the formula xor: W/m + W/(m(m-1))",
        "node3: T0", "copied per snapshot", "RESULT: the final parameters ARE bit-identical"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in\n" << out;
  }
}

// The same story with the job coordinated through a real etcd on loopback
// (`memento demo --store etcd://...`, docs/etcd.md): the launcher, the agents
// and the trainers all use the etcd store; the result line must be the same.
// One failure (the node loss) keeps it short.
TEST(DemoClusterTest, NodeLossThroughARealEtcdEndsBitIdentical) {
  memento::testing::ScratchDir dir("demo-etcd");
  auto etcd = memento::coord::EtcdProcess::Start(dir.path(), memento::Deadline::AfterSeconds(30));
  if (etcd.status().code() == memento::StatusCode::kNotFound) GTEST_SKIP() << etcd.status();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) +
                          " demo --trainer-bin " MEMENTO_TRAINER_BINARY
                          " --preset tiny --steps 30 --kill-rank-at 0"
                          " --kill-node 1 --kill-node-at 15 --progress-every 10 --store " +
                          (*etcd)->url();
  auto [rc, out] = RunShell(cmd);
  EXPECT_EQ(rc, 0) << out;
  for (const std::string& want : {"store " + (*etcd)->url() + " (external)",
                                  std::string("1. node 1 lost"), std::string("node(s) lost: 1"),
                                  std::string("RESULT: the final parameters ARE bit-identical")}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in\n" << out;
  }
  // The job's keys are in etcd: the launcher and the agents wrote there.
  auto store = memento::coord::OpenStore((*etcd)->url(), "", memento::Deadline::AfterSeconds(10));
  ASSERT_TRUE(store.ok()) << store.status();
  auto keys = (*store)->List("/memento/demo-failures-", memento::Deadline::AfterSeconds(10));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_FALSE(keys->kvs.empty());
}

}  // namespace
