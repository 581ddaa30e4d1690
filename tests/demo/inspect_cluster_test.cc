// `memento inspect --store tcp://H:P --job J` against a real embedded store
// (in this process, ephemeral port, real token authentication) whose keys the
// test writes the way agents and the launcher do: a live node with a lease,
// a node whose lease is gone, a commit, the restore target, the topology and
// two recovery records. The CLI runs as a real process.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/shell_test_util.h"
#include "common/test_util.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "coord/membership.h"
#include "coord/token_store_test_util.h"
#include "net/job_token.h"

namespace memento {
namespace {

// Runs a command with its stderr folded into the output.
std::pair<int, std::string> RunShell(const std::string& cmd) {
  return memento::testing::RunShell(cmd + " 2>&1");
}

class InspectClusterTest : public coord::testing::TokenStoreTest {
 protected:
  InspectClusterTest() : TokenStoreTest("inspect-cluster") {}

  void Set(const std::string& key, const std::string& value) {
    ASSERT_TRUE(server_->store().Set(key, value, Deadline::AfterSeconds(5)).ok()) << key;
  }

  // Writes the keys of a job that went through two recoveries.
  void FillJob() {
    coord::MembershipOptions mo;
    mo.job = kJob;
    mo.node = "n0";
    mo.endpoint = "127.0.0.1:4711";
    mo.ttl_s = 30;
    auto m = coord::Membership::Join(&server_->store(), mo, Deadline::AfterSeconds(5));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    member_ = std::move(*m);
    ASSERT_TRUE(
        member_->SetSignal(coord::NodeSignal::kCompleted, 12, "", Deadline::AfterSeconds(5)).ok());
    // n1 reported once and then lost its lease (no nodes/ key): OFFLINE.
    coord::SignalRecord r1;
    r1.signal = coord::NodeSignal::kSnap;
    r1.step = 9;
    r1.wall_ns = 1;
    Set(keys_.Signal("n1"), r1.Encode());
    auto published = coord::PublishCommit(server_->store(), kJob, 12, 1, Deadline::AfterSeconds(5));
    ASSERT_TRUE(published.ok());
    Set(keys_.Restore(), R"({"step": 10, "attempt": 2})");
    Set(keys_.Topology(),
        R"({"dp":2,"tp":1,"pp":2,"zero":true,"rank_node":[0,1,2,3],"policy":"xor"})");
    // The record as `memento launch` writes it (launch::RecoveryReport).
    Set(keys_.Recovery(1), R"({"n":1,"attempt":1,"cause":"kill-rank:3","committed":6,"step":5,
        "lost_nodes":[],"detect_s":0.1,"restart_s":0.05,"inventory_plan_s":0.02,
        "transfer_s":0,"decode_s":0,"write_s":0,"load_s":0.3,"total_s":0.421,
        "rebuilt_bytes":0,"reason":""})");
    Set(keys_.Recovery(2), R"({"failure":"kill-node:1","failed_step":11,"restored_step":10,
        "lost_nodes":[1],"breakdown":{"detect_s":0.5,"transfer_s":0.25,"decode_s":0.125},
        "total_s":0.875,"reason":"node 1 rebuilt from xor parity"})");
  }

  std::string Cli(const std::string& args) {
    return std::string(MEMENTO_CLI_BINARY) + " inspect --store " + url_ + " --token-file " +
           token_file_ + " " + args;
  }

  static constexpr const char* kJob = "inspectjob";
  std::unique_ptr<coord::Membership> member_;
  coord::JobKeys keys_{kJob};
};

TEST_F(InspectClusterTest, JsonHasMembershipCommitRestoreAndRecoveries) {
  FillJob();
  auto [rc, out] = RunShell(Cli("--job inspectjob --json"));
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["job"], kJob);
  EXPECT_EQ(j["committed"], 12);
  ASSERT_EQ(j["nodes"].size(), 2u) << out;
  EXPECT_EQ(j["nodes"][0]["node"], "n0");
  EXPECT_EQ(j["nodes"][0]["alive"], true);
  EXPECT_EQ(j["nodes"][0]["signal"], "COMPLETED");
  EXPECT_EQ(j["nodes"][0]["step"], 12);
  EXPECT_EQ(j["nodes"][0]["endpoint"], "127.0.0.1:4711");
  EXPECT_EQ(j["nodes"][1]["node"], "n1");
  EXPECT_EQ(j["nodes"][1]["alive"], false);
  EXPECT_EQ(j["nodes"][1]["signal"], "OFFLINE");
  EXPECT_EQ(j["restore"]["step"], 10);
  EXPECT_EQ(j["restore"]["attempt"], 2);
  EXPECT_EQ(j["topology"]["policy"], "xor");
  EXPECT_TRUE(j["plan_hash"].is_null());
  ASSERT_EQ(j["recoveries"].size(), 2u);
  EXPECT_EQ(j["recoveries"][0]["n"], 1);
  EXPECT_EQ(j["recoveries"][0]["cause"], "kill-rank:3");
  EXPECT_EQ(j["recoveries"][1]["n"], 2);
  EXPECT_EQ(j["recoveries"][1]["breakdown"]["transfer_s"], 0.25);
}

TEST_F(InspectClusterTest, TableShowsEveryPartWithTheBreakdown) {
  FillJob();
  auto [rc, out] = RunShell(Cli("--job inspectjob"));
  ASSERT_EQ(rc, 0) << out;
  for (const char* want :
       {"committed step: 12", "n0", "COMPLETED", "127.0.0.1:4711", "n1", "OFFLINE",
        "restore target: step 10 (attempt 2)", "topology: dp 2 tp 1 pp 2 zero true policy xor",
        "recoveries: 2", "#1  failure kill-rank:3  at step -  committed 6  restored step 5",
        "detect 0.100 s  restart 0.050 s  inventory_plan 0.020 s  transfer 0.000 s", "load 0.300 s",
        "rebuilt 0.0 MiB",
        "#2  failure kill-node:1  at step 11  committed -  restored step 10  lost nodes [1]  "
        "total 0.875 s",
        "detect 0.500 s  transfer 0.250 s  decode 0.125 s", "node 1 rebuilt from xor parity"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in\n" << out;
  }
  // The phases come in the order of docs/cluster.md, not alphabetically.
  EXPECT_LT(out.find("detect 0.100"), out.find("inventory_plan 0.020"));
  EXPECT_LT(out.find("write 0.000"), out.find("load 0.300"));
}

TEST_F(InspectClusterTest, EmptyJobSaysSo) {
  auto [rc, out] = RunShell(Cli("--job nothing"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("committed step: none"), std::string::npos) << out;
  EXPECT_NE(out.find("(no nodes registered)"), std::string::npos) << out;
  EXPECT_NE(out.find("restore target: none"), std::string::npos) << out;
  EXPECT_NE(out.find("recoveries: 0"), std::string::npos) << out;
}

TEST_F(InspectClusterTest, RefusesBadArgumentsAndWrongToken) {
  auto [rc1, out1] = RunShell(Cli("--job 'bad/name'"));
  EXPECT_EQ(rc1, 2) << out1;
  EXPECT_NE(out1.find("job"), std::string::npos) << out1;
  auto [rc2, out2] = RunShell(Cli("--job inspectjob /some/dir"));
  EXPECT_EQ(rc2, 2) << out2;
  // Another job's token: the store refuses the connection.
  const std::string other = dir_.path() + "/other.token";
  {
    std::ofstream f(other);
    f << "0123456789abcdef0123456789abcdef\n";
  }
  ASSERT_EQ(chmod(other.c_str(), 0600), 0);
  auto [rc3, out3] = RunShell(std::string(MEMENTO_CLI_BINARY) + " inspect --store " + url_ +
                              " --token-file " + other + " --job inspectjob --timeout 2");
  EXPECT_NE(rc3, 0) << out3;
}

}  // namespace
}  // namespace memento
