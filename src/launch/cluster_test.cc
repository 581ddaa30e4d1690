#include "launch/cluster.h"

#include "coord/keys.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"
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

TEST(LaunchCluster, TopologyRoundTrip) {
  auto topo = topo::Topology::Uniform(2, 1, 2, 1, 2);
  ASSERT_TRUE(topo.ok()) << topo.status();
  JobTopology t{*topo, *topo::ParsePolicy("rs:2")};
  t.policy.local_copy = topo::LocalCopy::kFull;
  auto back = TopologyFromJson(TopologyToJson(t));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->topology.dp, 2);
  EXPECT_EQ(back->topology.pp, 2);
  EXPECT_EQ(back->topology.zero_stage, 1);
  EXPECT_EQ(back->topology.rank_node, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(topo::PolicyName(back->policy), "rs:2");
  EXPECT_EQ(back->policy.local_copy, topo::LocalCopy::kFull);
  auto bad = TopologyFromJson({{"dp", 2}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(LaunchCluster, TensorMetaRoundTrip) {
  for (const TensorMeta& m : RankTensors(1, 4)) {
    auto back = TensorMetaFromJson(TensorMetaToJson(m));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, m);
  }
  EXPECT_EQ(TensorMetaFromJson(
                {{"name", "x"}, {"dtype", "F99"}, {"shape", {1}}, {"state_class", "private"}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(TensorListFromJson(nlohmann::json::object()).ok());
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

TEST(LaunchCluster, EndpointsByNodeName) {
  coord::MemoryStore store;
  coord::JobKeys keys("j");
  ASSERT_TRUE(store.Set(keys.Node(NodeName(2)), "127.0.0.1:5002", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Node(NodeName(0)), "127.0.0.1:5000", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Node("stranger"), "127.0.0.1:1", Soon()).ok());
  auto eps = ReadEndpoints(store, "j", 3, Soon());
  ASSERT_TRUE(eps.ok()) << eps.status();
  EXPECT_EQ(*eps, (std::vector<std::string>{"127.0.0.1:5000", "", "127.0.0.1:5002"}));
  EXPECT_EQ(NodeName(3), "node3");
}

}  // namespace
}  // namespace memento::launch
