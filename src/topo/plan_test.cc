#include "topo/plan.h"

#include <gtest/gtest.h>

#include <set>

#include "recover/recover.h"
#include "topo/plan_json.h"
#include "topo/test_tensors.h"

namespace memento::topo {
namespace {

using test_tensors::Tensor;

// Every rank: `w` replicated bytes (F32), `o` dp_sharded bytes, `p` private bytes.
Inventory Uniform(const Topology& t, uint64_t w, uint64_t o, uint64_t p) {
  Inventory inv(t.num_ranks());
  for (auto& r : inv) {
    if (w) r.push_back(Tensor("params", DType::kFloat32, w / 4, StateClass::kReplicated));
    if (o) r.push_back(Tensor("opt", DType::kFloat32, o / 4, StateClass::kDpSharded));
    if (p) r.push_back(Tensor("rng", DType::kUInt8, p, StateClass::kPrivate));
  }
  return inv;
}

Plan MustPlan(const Topology& t, const Inventory& inv, const std::string& policy,
              LocalCopy local = LocalCopy::kSharded) {
  auto p = ParsePolicy(policy);
  EXPECT_TRUE(p.ok()) << p.status();
  p->local_copy = local;
  auto plan = MakePlan(t, inv, *p);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return std::move(plan).value();
}

// REFT 4.2: with W replicated bytes per sharding group and D nodes, ARC holds
// 2W/D per node and AEC W/D + W/(D(D-1)); rs:f holds W/D + f W/(D(D-f)).
TEST(PlanTest, BytesPerNodeMatchTheFormulas) {
  for (int d : {2, 3, 4, 5, 8}) {
    auto t = Topology::Uniform(d, 1, 1, 0, 1);
    ASSERT_TRUE(t.ok());
    const uint64_t w = 64ull * d * (d - 1) * (d > 2 ? d - 2 : 1) * 1000;  // divides evenly
    const Inventory inv = Uniform(*t, w, 0, 0);
    const Plan arc = MustPlan(*t, inv, "replicate");
    const Plan aec = MustPlan(*t, inv, "xor");
    const Plan none = MustPlan(*t, inv, "none");
    for (int n = 0; n < d; ++n) {
      EXPECT_EQ(none.nodes[n].total_bytes(), w / d);
      EXPECT_EQ(arc.nodes[n].total_bytes(), 2 * w / d) << "d=" << d;
      EXPECT_EQ(aec.nodes[n].total_bytes(), w / d + w / (d * (d - 1))) << "d=" << d;
      EXPECT_EQ(aec.nodes[n].network_bytes, 0u);
    }
    if (d >= 3) {
      const Plan rs2 = MustPlan(*t, inv, "rs:2");
      for (int n = 0; n < d; ++n) {
        EXPECT_EQ(rs2.nodes[n].total_bytes(), w / d + 2 * w / (d * (d - 2))) << "d=" << d;
      }
      EXPECT_EQ(rs2.protection, 2);
    }
    const Plan full = MustPlan(*t, inv, "xor", LocalCopy::kFull);
    for (int n = 0; n < d; ++n) EXPECT_EQ(full.nodes[n].total_bytes(), w);
    EXPECT_EQ(full.protection, d - 1);
    EXPECT_EQ(arc.protection, 1);
    EXPECT_EQ(aec.protection, 1);
    EXPECT_EQ(none.protection, 0);
  }
}

// REFT AOR: each node keeps one peer's ZeRO-1 optimizer shard current.
TEST(PlanTest, AorKeepsOnePeerShardPerNode) {
  auto t = Topology::Uniform(4, 2, 2, 1, 2);  // tp=2 per node
  ASSERT_TRUE(t.ok());
  const Plan plan = MustPlan(*t, Uniform(*t, 4096, 1024, 16), "xor");
  int aor = 0;
  for (const Copy& c : plan.copies) {
    if (c.kind != CopyKind::kAor) continue;
    ++aor;
    const Piece& p = plan.pieces[c.piece];
    EXPECT_EQ(p.kind, PieceKind::kDpShard);
    EXPECT_NE(c.node, p.node);
    // The recomputing rank is the same (pp, tp) position on its node.
    EXPECT_EQ(plan.ranks[c.producer_rank].group, plan.ranks[p.rank].group);
    EXPECT_EQ(t->rank_node[c.producer_rank], c.node);
  }
  EXPECT_EQ(aor, t->num_ranks());
  EXPECT_EQ(plan.protection, 1);
  for (const Group& g : plan.groups) {
    if (g.kind == GroupKind::kShardingGroup) {
      EXPECT_EQ(g.scheme, "xor+aor");
    }
  }
}

TEST(PlanTest, AllReplicasOnOneNodeFallBackToPeerCopiesAndSaySo) {
  auto t = Topology::Uniform(4, 1, 2, 1, 4);  // every SG on one node
  ASSERT_TRUE(t.ok());
  const Plan plan = MustPlan(*t, Uniform(*t, 4096, 512, 8), "xor");
  EXPECT_EQ(plan.protection, 1);
  EXPECT_TRUE(plan.stripes.empty());
  bool said = false;
  for (const std::string& n : plan.notes) said |= n.find("are on node") != std::string::npos;
  EXPECT_TRUE(said);
  const Plan none = MustPlan(*t, Uniform(*t, 4096, 512, 8), "none");
  EXPECT_EQ(none.protection, 0);
  auto one = Topology::Uniform(1, 1, 1, 0, 1);
  const Plan single = MustPlan(*one, Uniform(*one, 4096, 0, 8), "xor");
  EXPECT_EQ(single.protection, 0);
  auto rec = recover::PlanFailure(single, {0});
  ASSERT_TRUE(rec.ok());
  EXPECT_FALSE(rec->recoverable);
  EXPECT_NE(rec->recipes[0].reason.find("not recoverable from memory"), std::string::npos);
}

TEST(PlanTest, RedundancyPrefersOtherRacks) {
  auto t = Topology::Uniform(4, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  t->node_rack = {"a", "a", "b", "b"};
  const Plan plan = MustPlan(*t, Uniform(*t, 64 * 12 * 10, 0, 8), "replicate");
  for (const Copy& c : plan.copies) {
    EXPECT_NE(t->node_rack[c.node], t->node_rack[plan.pieces[c.piece].node])
        << "copy of " << plan.pieces[c.piece].key << " on node " << c.node;
  }
}

TEST(PlanTest, NotDivisibleAndTinySizesStayAligned) {
  auto t = Topology::Uniform(3, 1, 1, 0, 1);
  Inventory inv(3);
  for (auto& r : inv) {
    r.push_back(Tensor("a", DType::kFloat64, 3, StateClass::kReplicated));    // 24 B
    r.push_back(Tensor("b", DType::kFloat16, 101, StateClass::kReplicated));  // 202 B
    r.push_back(Tensor("c", DType::kUInt8, 1, StateClass::kReplicated));
  }
  const Plan plan = MustPlan(*t, inv, "xor");
  uint64_t sum = 0;
  std::set<std::pair<std::string, uint64_t>> seen;
  for (const Piece& p : plan.pieces) {
    sum += p.bytes;
    for (const Segment& s : p.segments) {
      EXPECT_EQ(s.offset % 64, 0u);
      EXPECT_TRUE(seen.insert({s.tensor, s.offset}).second);
    }
  }
  EXPECT_EQ(sum, 24u + 202u + 1u);
  for (const Stripe& s : plan.stripes) EXPECT_EQ(s.block_bytes % 64, 0u);
}

TEST(PlanTest, BadInputIsAClearError) {
  auto t = Topology::Uniform(2, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  Inventory inv = Uniform(*t, 256, 0, 0);
  inv[1][0].shape = {63};
  auto p = MakePlan(*t, inv, *ParsePolicy("xor"));
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("differs"), std::string::npos) << p.status();
  EXPECT_FALSE(MakePlan(*t, Inventory(3), *ParsePolicy("xor")).ok());
  EXPECT_FALSE(MakePlan(*t, Uniform(*t, 256, 64, 0), *ParsePolicy("xor")).ok());  // zero 0
  Inventory dup = Uniform(*t, 256, 0, 0);
  dup[0].push_back(dup[0][0]);
  auto d = MakePlan(*t, dup, *ParsePolicy("xor"));
  EXPECT_NE(d.status().message().find("twice"), std::string::npos) << d.status();
  Inventory neg = Uniform(*t, 256, 0, 0);
  neg[1][0].shape = {-4};
  EXPECT_EQ(MakePlan(*t, neg, *ParsePolicy("xor")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParsePolicy("rs:0").ok());
  EXPECT_FALSE(ParsePolicy("peer:1").ok());
  EXPECT_FALSE(ParsePolicy("raid").ok());
  EXPECT_FALSE(Topology::Uniform(0, 1, 1, 0, 1).ok());
  EXPECT_FALSE(Topology::Uniform(2, 1, 1, 2, 1).ok());
  EXPECT_EQ(recover::PlanFailure(MustPlan(*t, Uniform(*t, 256, 0, 0), "xor"), {5}).status().code(),
            StatusCode::kInvalidArgument);
}

// auto needs the reliability model (src/model/auto_plan.h, tested in
// model_recommend_test): topo alone refuses it and names the function.
TEST(PlanTest, AutoIsLeftToTheReliabilityModel) {
  auto t = Topology::Uniform(8, 1, 1, 0, 1);
  auto a = MakePlan(*t, Uniform(*t, 64ull * 8 * 7 * 100, 0, 0), *ParsePolicy("auto"));
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("model::MakeJobPlan"), std::string::npos) << a.status();
}

TEST(PlanTest, JsonRoundTripIsExact) {
  auto t = Topology::Uniform(4, 2, 2, 1, 2);
  t->node_rack = {"r0", "r1", "r0", "r1", "r0", "r1", "r0", "r1"};
  const Plan plan = MustPlan(*t, Uniform(*t, 10000, 999, 7), "rs:2");
  const nlohmann::json j = PlanToJson(plan);
  auto back = PlanFromJson(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(PlanToJson(*back), j);
  // Recovery from the parsed plan is identical.
  auto r1 = recover::PlanFailure(plan, {0, 3});
  auto r2 = recover::PlanFailure(*back, {0, 3});
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(RecoveryToJson(plan, *r1), RecoveryToJson(*back, *r2));
  EXPECT_FALSE(PlanFromJson(nlohmann::json::parse("{\"topology\": 3}")).ok());
  nlohmann::json broken = j;
  broken["copies"][0]["piece"] = 1u << 30;
  EXPECT_FALSE(PlanFromJson(broken).ok());
  // Malformed plans are InvalidArgument naming the field, without throwing.
  nlohmann::json wrong = j;
  wrong["pieces"][1]["node"] = "zero";
  auto w = PlanFromJson(wrong);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("pieces[1]: 'node' is \"zero\""), std::string::npos)
      << w.status();
  nlohmann::json kind = j;
  kind["pieces"][0]["kind"] = "bogus";
  auto k = PlanFromJson(kind);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("unknown piece kind 'bogus'"), std::string::npos)
      << k.status();
  nlohmann::json missing = j;
  missing.erase("stripes");
  auto m = PlanFromJson(missing);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("'stripes' is missing"), std::string::npos) << m.status();
  nlohmann::json topo_wrong = j;
  topo_wrong["topology"]["dp"] = "four";
  auto t2 = PlanFromJson(topo_wrong);
  ASSERT_FALSE(t2.ok());
  EXPECT_EQ(t2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t2.status().message().find("'dp'"), std::string::npos) << t2.status();
}

TEST(PlanTest, PlanIsDeterministic) {
  auto t = Topology::Uniform(8, 2, 2, 1, 2);
  const Inventory inv = Uniform(*t, 12345 * 4, 777 * 4, 9);
  EXPECT_EQ(PlanToJson(MustPlan(*t, inv, "xor")), PlanToJson(MustPlan(*t, inv, "xor")));
}

}  // namespace
}  // namespace memento::topo
