#include "topo/topology_json.h"

#include <gtest/gtest.h>

#include "topo/plan.h"

namespace memento::topo {
namespace {

using nlohmann::json;

Topology Labelled() {
  Result<Topology> t = Topology::Uniform(/*dp=*/2, /*tp=*/2, /*pp=*/2, /*zero_stage=*/1,
                                         /*ranks_per_node=*/2);
  EXPECT_TRUE(t.ok());
  t->node_rack = {"r0", "r0", "r1", "r1"};
  return *t;
}

void ExpectSame(const Topology& a, const Topology& b) {
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(a.pp, b.pp);
  EXPECT_EQ(a.zero_stage, b.zero_stage);
  EXPECT_EQ(a.rank_node, b.rank_node);
  EXPECT_EQ(a.node_rack, b.node_rack);
}

TEST(TopologyJsonTest, TopologyRoundTrips) {
  const Topology t = Labelled();
  Result<Topology> back = TopologyFromJson(TopologyToJson(t));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSame(*back, t);
}

TEST(TopologyJsonTest, JobRecordRoundTripsWithRacksAndPolicy) {
  for (const char* policy : {"xor", "rs:2", "replicate", "peer:3", "none"}) {
    for (LocalCopy local : {LocalCopy::kSharded, LocalCopy::kFull}) {
      JobTopology jt{Labelled(), *ParsePolicy(policy)};
      jt.policy.local_copy = local;
      Result<JobTopology> back = ParseJobTopology(JobTopologyToJson(jt).dump());
      ASSERT_TRUE(back.ok()) << policy << ": " << back.status().ToString();
      ExpectSame(back->topology, jt.topology);  // node_rack included (the launcher dropped it)
      EXPECT_EQ(PolicyName(back->policy), policy);
      EXPECT_EQ(back->policy.local_copy, local) << policy;
    }
  }
}

TEST(TopologyJsonTest, JobRecordKeepsItsDocumentedShape) {
  JobTopology jt{*Topology::Uniform(2, 1, 1, 1, 1), *ParsePolicy("xor")};
  json j = JobTopologyToJson(jt);
  EXPECT_EQ(j.at("zero"), 1);  // `memento inspect` and docs/cluster.md read "zero"
  EXPECT_EQ(j.at("policy"), "xor");
  EXPECT_EQ(j.at("local_copy"), "sharded");
  EXPECT_FALSE(j.contains("node_rack"));  // only when labelled
  // The short form of docs/cluster_save.md: defaults for tp, pp, stage, policy.
  Result<JobTopology> minimal = ParseJobTopology(R"({"dp":2,"rank_node":[0,1],"zero_stage":1})");
  ASSERT_TRUE(minimal.ok()) << minimal.status().ToString();
  EXPECT_EQ(minimal->topology.tp, 1);
  EXPECT_EQ(minimal->topology.pp, 1);
  EXPECT_EQ(minimal->topology.zero_stage, 1);
  EXPECT_EQ(PolicyName(minimal->policy), "xor");
}

// `auto`'s budgets travel with the record, so the launcher and every agent
// resolve `auto` (model::MakeJobPlan) to the same scheme and plan hash; the
// choice itself: launch_cluster_test
// LaunchCluster.AutoPolicyBudgetsTravelAndThePlanIsTheModelsChoice.
TEST(TopologyJsonTest, AutoBudgetsTravelWithTheRecord) {
  JobTopology jt{*Topology::Uniform(8, 1, 1, 0, 1), *ParsePolicy("auto")};
  const uint64_t w = 64ull * 8 * 7 * 100;
  jt.policy.host_bytes_per_node = w / 8 + w / 8 / 2;
  jt.policy.copy_bytes_per_node = 1ull << 40;
  jt.policy.network_bytes_per_node = 12345;
  json j = JobTopologyToJson(jt);
  EXPECT_EQ(j.at("policy"), "auto");
  EXPECT_EQ(j.at("host_budget"), jt.policy.host_bytes_per_node);
  EXPECT_EQ(j.at("copy_budget"), jt.policy.copy_bytes_per_node);
  EXPECT_EQ(j.at("network_budget"), jt.policy.network_bytes_per_node);
  Result<JobTopology> back = ParseJobTopology(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->policy.host_bytes_per_node, jt.policy.host_bytes_per_node);
  EXPECT_EQ(back->policy.copy_bytes_per_node, jt.policy.copy_bytes_per_node);
  EXPECT_EQ(back->policy.network_bytes_per_node, jt.policy.network_bytes_per_node);
  // Without budgets (the fields absent): unlimited.
  j.erase("host_budget");
  j.erase("copy_budget");
  j.erase("network_budget");
  Result<JobTopology> unlimited = ParseJobTopology(j.dump());
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->policy.host_bytes_per_node, 0u);
  EXPECT_EQ(unlimited->policy.network_bytes_per_node, 0u);
}

// `memento launch --sharded` reaches every agent in the record (docs/reft.md).
TEST(TopologyJsonTest, ShardedTravelsWithTheRecord) {
  JobTopology jt{*Topology::Uniform(4, 1, 1, 0, 1), *ParsePolicy("xor")};
  json j = JobTopologyToJson(jt);
  EXPECT_FALSE(j.contains("sharded"));  // off: the record is what it was
  jt.sharded = true;
  j = JobTopologyToJson(jt);
  EXPECT_EQ(j.at("sharded"), true);
  Result<JobTopology> back = ParseJobTopology(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->sharded);
  j.erase("sharded");
  EXPECT_FALSE(ParseJobTopology(j.dump()).value().sharded);
  j["sharded"] = "yes";
  Result<JobTopology> bad = ParseJobTopology(j.dump());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("sharded \"yes\" is not true or false"), std::string::npos)
      << bad.status();
}

void ExpectBad(std::string_view text, const std::string& names) {
  Result<JobTopology> r = ParseJobTopology(text);
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
  EXPECT_NE(r.status().message().find(names), std::string::npos)
      << "'" << r.status().message() << "' does not name '" << names << "'";
}

TEST(TopologyJsonTest, MalformedInputNamesTheProblem) {
  ExpectBad("{\"dp\":", "not JSON");
  ExpectBad("[1,2]", "not a JSON object");
  ExpectBad(R"({"rank_node":[0,1]})", "dp");
  ExpectBad(R"({"dp":2})", "rank_node");
  ExpectBad(R"({"dp":"two","rank_node":[0,1]})", "malformed topology");
  ExpectBad(R"({"dp":2,"rank_node":[0,1],"policy":"raid9"})", "raid9");
  ExpectBad(R"({"dp":2,"rank_node":[0,1],"local_copy":"half"})", "half");
  ExpectBad(R"({"dp":2,"rank_node":[0,1],"policy":"auto","host_budget":-5})", "host_budget -5");
  ExpectBad(R"({"dp":2,"rank_node":[0,1],"policy":"auto","copy_budget":"1G"})", "copy_budget");
  ExpectBad(R"({"dp":2,"rank_node":[0,1],"policy":"auto","network_budget":-1})",
            "network_budget -1");
  // Topology::Validate: 2 ranks but a map of 3.
  Result<JobTopology> r = ParseJobTopology(R"({"dp":2,"rank_node":[0,1,2]})");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memento::topo
