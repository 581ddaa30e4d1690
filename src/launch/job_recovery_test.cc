#include "launch/job_recovery.h"

#include <thread>

#include "common/tensor_json.h"
#include "coord/keys.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"
#include "launch/recovery_leader.h"
#include "model/auto_plan.h"
#include "recover/recover.h"
#include "topo/plan_json.h"

namespace memento::launch {
namespace {

Deadline Soon() { return Deadline::AfterSeconds(10); }

std::vector<TensorMeta> RankTensors(int dp_i, int dp) {
  TensorMeta w;
  w.name = "w";
  w.dtype = DType::kFloat32;
  w.shape = {64, 33};
  w.state_class = StateClass::kReplicated;
  TensorMeta opt;
  opt.name = "opt";
  opt.dtype = DType::kInt64;
  opt.shape = {100};
  opt.state_class = StateClass::kDpSharded;
  opt.global_numel = 100 * dp;
  opt.shard_offset = 100 * dp_i;
  TensorMeta rng;
  rng.name = "rng";
  rng.dtype = DType::kUInt8;
  rng.shape = {16};
  rng.state_class = StateClass::kPrivate;
  return {w, opt, rng};
}

TEST(LaunchCluster, PublishedTopologyKeepsRackLabels) {
  // The launcher's own topology codec used to drop node_rack; it now uses
  // topo::JobTopologyToJson like the agents.
  coord::MemoryStore store;
  auto topo = topo::Topology::Uniform(2, 1, 2, 1, 2);
  ASSERT_TRUE(topo.ok()) << topo.status();
  topo->node_rack = {"rackA", "rackB"};
  JobTopology t{*topo, *topo::ParsePolicy("rs:2")};
  t.policy.local_copy = topo::LocalCopy::kFull;
  ASSERT_TRUE(PublishTopology(store, "j", t, Soon()).ok());
  auto back = ReadTopology(store, "j", Soon());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->topology.rank_node, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(back->topology.node_rack, (std::vector<std::string>{"rackA", "rackB"}));
  EXPECT_EQ(topo::PolicyName(back->policy), "rs:2");
  EXPECT_EQ(back->policy.local_copy, topo::LocalCopy::kFull);
}

TEST(LaunchCluster, PublishTopologyIfAbsentKeepsTheJobsRecordAndRefusesAnother) {
  // Every host's agent publishes the same --topology; the first one wins, the
  // others find it; an agent with another topology is refused, naming both.
  coord::MemoryStore store;
  auto three = topo::Topology::Uniform(3, 1, 1, 0, 1);
  ASSERT_TRUE(three.ok()) << three.status();
  JobTopology t{*three, *topo::ParsePolicy("replicate")};
  ASSERT_TRUE(PublishTopologyIfAbsent(store, "j", t, Soon()).ok());
  ASSERT_TRUE(PublishTopologyIfAbsent(store, "j", t, Soon()).ok());
  // The same record written with another field order is the same topology.
  auto parsed = topo::ParseJobTopology(
      R"({"policy":"replicate","rank_node":[0,1,2],"zero":0,"pp":1,"tp":1,"dp":3})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(PublishTopologyIfAbsent(store, "j", *parsed, Soon()).ok());
  auto back = ReadTopology(store, "j", Soon());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->topology.rank_node, (std::vector<int>{0, 1, 2}));

  JobTopology other{*three, *topo::ParsePolicy("xor")};
  Status st = PublishTopologyIfAbsent(store, "j", other, Soon());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("already has another topology"), std::string::npos) << st;
  EXPECT_NE(st.message().find("\"policy\":\"xor\""), std::string::npos) << st;
  // The job's record is unchanged.
  back = ReadTopology(store, "j", Soon());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(topo::PolicyName(back->policy), "replicate");
}

TEST(LaunchCluster, AwaitRecoveryIdleWaitsWhileARecoveryIsRequestedOrRunning) {
  // What an agent's `target` op waits for before it answers a trainer
  // restarted by torchrun: the leader's newest request has a final status.
  coord::MemoryStore store;
  const std::string job = "j";
  auto set_status = [&](int64_t id, const std::string& state) {
    RecoveryStatus s;
    s.id = id;
    s.state = state;
    s.leader = "node0";
    ASSERT_TRUE(store.Set(RecoveryStatusKey(job), s.ToJson().dump(), Soon()).ok());
  };
  auto short_wait = [&] { return AwaitRecoveryIdle(store, job, Deadline::AfterSeconds(0.3)); };
  // No leader, no request: nothing to wait for.
  EXPECT_TRUE(short_wait().ok());
  // A request but no leader elected: nobody would run it, no wait.
  ASSERT_TRUE(RequestRecovery(store, job, Soon()).ok());
  EXPECT_TRUE(short_wait().ok());
  ASSERT_TRUE(store.Set(RecoveryLeaderKey(job), "node0", Soon()).ok());
  Status st = short_wait();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("recovery 1 of job 'j' is still requested"), std::string::npos) << st;
  ASSERT_NO_FATAL_FAILURE(set_status(1, "running"));
  st = short_wait();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("still running"), std::string::npos) << st;
  ASSERT_NO_FATAL_FAILURE(set_status(1, "done"));
  EXPECT_TRUE(short_wait().ok());
  // A newer request: waits until its status is final, and returns then.
  ASSERT_TRUE(RequestRecovery(store, job, Soon()).ok());
  EXPECT_EQ(short_wait().code(), StatusCode::kUnavailable);
  std::thread leader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    set_status(2, "failed");
  });
  EXPECT_TRUE(AwaitRecoveryIdle(store, job, Deadline::AfterSeconds(20)).ok());
  leader.join();
}

TEST(LaunchCluster, PlanFromStoreWaitsForEveryInventoryThenMatchesMakePlan) {
  coord::MemoryStore store;
  const std::string job = "j";
  auto topo = topo::Topology::Uniform(4, 1, 1, 1, 1);
  ASSERT_TRUE(topo.ok());
  JobTopology t{*topo, *topo::ParsePolicy("xor")};
  ASSERT_TRUE(PublishTopology(store, job, t, Soon()).ok());
  coord::JobKeys keys(job);
  topo::Inventory inv;
  for (int r = 0; r < 4; ++r) inv.push_back(RankTensors(r, 4));
  for (int r = 0; r < 3; ++r) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& m : inv[r]) list.push_back(TensorMetaToJson(m));
    ASSERT_TRUE(store.Set(keys.Inventory(r), list.dump(), Soon()).ok());
  }
  auto missing = PlanFromStore(store, job, Soon());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("1 rank(s): 3"), std::string::npos) << missing.status();
  nlohmann::json list = nlohmann::json::array();
  for (const auto& m : inv[3]) list.push_back(TensorMetaToJson(m));
  ASSERT_TRUE(store.Set(keys.Inventory(3), list.dump(), Soon()).ok());
  auto plan = PlanFromStore(store, job, Soon());
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto direct = topo::MakePlan(*topo, inv, t.policy);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(recover::PlanHash(*plan), recover::PlanHash(*direct));
  EXPECT_EQ(topo::PlanToJson(*plan).dump(), topo::PlanToJson(*direct).dump());
}

// Policy auto: the budgets travel in the published topology, and the plan the
// launcher computes from the store is the reliability model's choice
// (model::MakeJobPlan), the one every agent computes from the same keys.
TEST(LaunchCluster, AutoPolicyBudgetsTravelAndThePlanIsTheModelsChoice) {
  coord::MemoryStore store;
  const std::string job = "j";
  auto topo = topo::Topology::Uniform(4, 1, 1, 0, 1);
  ASSERT_TRUE(topo.ok());
  topo::Inventory inv(4);
  for (auto& r : inv) {
    TensorMeta t;
    t.name = "params";
    t.dtype = DType::kFloat32;
    t.shape = {1 << 20};  // 4 MiB replicated: 1 MiB per node unique
    t.state_class = StateClass::kReplicated;
    r.push_back(t);
  }
  JobTopology t{*topo, *topo::ParsePolicy("auto")};
  t.policy.host_bytes_per_node = (1 << 20) + (1 << 19);  // replicate (2 MiB) does not fit
  t.policy.copy_bytes_per_node = 3 << 20;
  t.policy.network_bytes_per_node = 5 << 20;
  ASSERT_TRUE(PublishTopology(store, job, t, Soon()).ok());
  auto back = ReadTopology(store, job, Soon());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->policy.scheme, topo::Scheme::kAuto);
  EXPECT_EQ(back->policy.host_bytes_per_node, t.policy.host_bytes_per_node);
  EXPECT_EQ(back->policy.copy_bytes_per_node, t.policy.copy_bytes_per_node);
  EXPECT_EQ(back->policy.network_bytes_per_node, t.policy.network_bytes_per_node);
  coord::JobKeys keys(job);
  for (int r = 0; r < 4; ++r) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& m : inv[r]) list.push_back(TensorMetaToJson(m));
    ASSERT_TRUE(store.Set(keys.Inventory(r), list.dump(), Soon()).ok());
  }
  auto plan = PlanFromStore(store, job, Soon());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->policy.scheme, topo::Scheme::kAuto);
  EXPECT_NE(plan->policy.scheme, topo::Scheme::kReplicate) << plan->reason;
  EXPECT_NE(plan->reason.find("replicate excluded: needs"), std::string::npos) << plan->reason;
  auto direct = model::MakeJobPlan(*topo, inv, t.policy);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(recover::PlanHash(*plan), recover::PlanHash(*direct));
  // Without the budgets the choice differs: the budget really decided.
  auto unlimited = model::MakeJobPlan(*topo, inv, *topo::ParsePolicy("auto"));
  ASSERT_TRUE(unlimited.ok());
  EXPECT_NE(unlimited->policy.scheme, plan->policy.scheme) << unlimited->reason;
}

TEST(LaunchCluster, EndpointsByNodeName) {
  coord::MemoryStore store;
  coord::JobKeys keys("j");
  ASSERT_TRUE(store.Set(keys.Node(coord::NodeName(2)), "127.0.0.1:5002", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Node(coord::NodeName(0)), "127.0.0.1:5000", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Node("stranger"), "127.0.0.1:1", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Node("node01"), "127.0.0.1:2", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Node(coord::NodeName(3)), "127.0.0.1:3", Soon()).ok());
  auto eps = ReadEndpoints(store, "j", 3, Soon());
  ASSERT_TRUE(eps.ok()) << eps.status();
  EXPECT_EQ(*eps, (std::vector<std::string>{"127.0.0.1:5000", "", "127.0.0.1:5002"}));
}

}  // namespace
}  // namespace memento::launch
