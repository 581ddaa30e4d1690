// Policy auto (auto_plan.h): the reliability model's choice under budgets and
// failure rates, on real plans.
#include "model/auto_plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "topo/plan_json.h"

namespace memento::model {
namespace {

using topo::Scheme;

TensorMeta Tensor(const char* name, DType dtype, int64_t n, StateClass c) {
  TensorMeta t;
  t.name = name;
  t.dtype = dtype;
  t.shape = {n};
  t.state_class = c;
  return t;
}

// `w` replicated bytes per rank (sharded over the DP replicas by the plan),
// `o` dp_sharded bytes per rank, `p` private bytes per rank.
topo::Inventory Uniform(const topo::Topology& t, uint64_t w, uint64_t o, uint64_t p) {
  topo::Inventory inv(t.num_ranks());
  for (auto& r : inv) {
    if (w) r.push_back(Tensor("params", DType::kFloat32, w / 4, StateClass::kReplicated));
    if (o) r.push_back(Tensor("opt", DType::kFloat32, o / 4, StateClass::kDpSharded));
    if (p) r.push_back(Tensor("rng", DType::kUInt8, p, StateClass::kPrivate));
  }
  return inv;
}

struct Choice {
  std::string policy;
  std::string reason;
  Recommendation rec;
};

Choice Choose(const topo::Topology& t, const topo::Inventory& inv, topo::Policy p,
              const AutoInputs& in = AutoInputs()) {
  Choice c;
  auto plan = MakeJobPlan(t, inv, p, in, &c.rec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return c;
  EXPECT_NE(plan->policy.scheme, Scheme::kAuto);
  c.policy = topo::PolicyName(plan->policy);
  c.reason = plan->reason;
  for (const auto& e : c.rec.ranked) {
    std::printf("  %-10s goodput %.8f fits %d host %.3g copy %.3g net %.3g %s\n", e.policy.c_str(),
                e.best_goodput, e.cost.fits, e.cost.host_bytes, e.cost.copy_bytes,
                e.cost.network_bytes, e.cost.why_not.c_str());
  }
  std::printf("  -> %s: %s\n", c.policy.c_str(), c.reason.c_str());
  return c;
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// 8 nodes, one rank each, one sharding group: W = 8 GB replicated per rank,
// S = 1 GB unique state per node. Host bytes per node: none S, replicate 2S,
// xor S + S/7, rs:2 S + 2S/6.
TEST(AutoPlanTest, BudgetsDecideAndTheReasonSaysWhy) {
  auto t = topo::Topology::Uniform(8, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  const uint64_t S = 1ull << 30;
  const topo::Inventory inv = Uniform(*t, 8 * S, 0, 0);
  topo::Policy p = *topo::ParsePolicy("auto");

  // Unlimited: the ranking is by goodput, every candidate ranked and fitting.
  Choice all = Choose(*t, inv, p);
  ASSERT_EQ(all.rec.ranked.size(), 4u);
  for (const auto& e : all.rec.ranked) EXPECT_TRUE(e.cost.fits) << e.policy;
  EXPECT_EQ(all.policy, all.rec.ranked[0].policy);
  EXPECT_GE(all.rec.ranked[0].best_goodput, all.rec.ranked[1].best_goodput);
  EXPECT_TRUE(Has(all.reason, "auto chose " + all.policy + ": goodput")) << all.reason;
  EXPECT_TRUE(Has(all.reason, "durable version every")) << all.reason;
  EXPECT_TRUE(Has(all.reason, "reliability model")) << all.reason;

  // replicate (2S) and rs:2 (S + S/3) over budget, xor (S + S/7) fits.
  p.host_bytes_per_node = S + S / 5;
  Choice xor_only = Choose(*t, inv, p);
  EXPECT_EQ(xor_only.policy, "xor");
  EXPECT_TRUE(Has(xor_only.reason, "replicate excluded: needs")) << xor_only.reason;
  EXPECT_TRUE(Has(xor_only.reason, "rs:2 excluded: needs")) << xor_only.reason;

  // Only the unique state fits: none.
  p.host_bytes_per_node = S + S / 10;
  EXPECT_EQ(Choose(*t, inv, p).policy, "none");

  // Not even that: none, and the reason says nothing fits.
  p.host_bytes_per_node = S / 2;
  Choice nothing = Choose(*t, inv, p);
  EXPECT_EQ(nothing.policy, "none");
  EXPECT_TRUE(Has(nothing.reason, "nothing fits")) << nothing.reason;
  EXPECT_FALSE(Has(nothing.reason, "auto chose")) << nothing.reason;

  // The device -> host budget: xor's parity crosses PCIe too (S + S/7).
  p.host_bytes_per_node = 0;
  p.copy_bytes_per_node = S + S / 10;
  Choice copy = Choose(*t, inv, p);
  EXPECT_TRUE(Has(copy.reason, "xor excluded: copies")) << copy.reason;
  EXPECT_NE(copy.policy, "xor");
  EXPECT_NE(copy.policy, "rs:2");
}

// Failure rates change the choice. Software failures only (host memory always
// survives): every policy recovers from memory alike, so the one holding the
// least host memory, none. REFT's rates: a protected policy. Frequent node
// losses: the fastest rebuild, or with free rebuilds the fewest fall backs.
TEST(AutoPlanTest, FailureRatesDecide) {
  auto t = topo::Topology::Uniform(8, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  const topo::Inventory inv = Uniform(*t, 8ull << 30, 0, 0);
  const topo::Policy p = *topo::ParsePolicy("auto");
  AutoInputs in;
  in.rates.hardware = {0.0, 1.0};
  in.rates.software = {1e-2, 1.0};
  Choice sw_only = Choose(*t, inv, p, in);
  EXPECT_EQ(sw_only.policy, "none") << sw_only.reason;
  for (const auto& e : sw_only.rec.ranked) {
    EXPECT_DOUBLE_EQ(e.best_goodput, sw_only.rec.ranked[0].best_goodput) << e.policy;
  }
  Choice reft = Choose(*t, inv, p);
  EXPECT_NE(reft.policy, "none") << reft.reason;
  EXPECT_EQ(reft.rec.ranked.back().policy, "none") << reft.reason;
  // Frequent node losses: each costs a rebuild, and replicate's is a copy (S)
  // where rs:2 decodes from 6 nodes (6S through one link).
  in.rates.hardware = {2.0, 1.0};
  Choice frequent = Choose(*t, inv, p, in);
  EXPECT_EQ(frequent.policy, "replicate") << frequent.reason;
  // The same with rebuilds that cost nothing: what remains is the chance of a
  // fall back (another loss during the restart), lowest for rs:2.
  in.figures.rebuild_bps = 1e15;
  Choice fast = Choose(*t, inv, p, in);
  EXPECT_EQ(fast.policy, "rs:2") << fast.reason;
  std::map<std::string, double> fatal;
  for (const auto& e : fast.rec.ranked) fatal[e.policy] = e.p_fatal_node;
  EXPECT_GT(fatal["xor"], 10 * fatal["rs:2"]);
  EXPECT_GT(fatal["replicate"], 10 * fatal["rs:2"]);
}

// The model reads the real plan's rack placement: with racks of two
// consecutive nodes the planner puts replicate's ring neighbours in different
// racks, so a rack loss (two nodes) is fatal only to xor's single parity.
TEST(AutoPlanTest, RackLossesFollowThePlacement) {
  auto t = topo::Topology::Uniform(8, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  t->node_rack.resize(8);
  for (int n = 0; n < 8; ++n) t->node_rack[n] = "rack" + std::to_string(n / 2);
  const topo::Inventory inv = Uniform(*t, 8ull << 30, 0, 0);
  topo::Policy p = *topo::ParsePolicy("auto");
  AutoInputs in;
  in.rates.rack = {1e-2, 1.0};  // per rack-day
  Choice racks = Choose(*t, inv, p, in);
  ASSERT_EQ(racks.rec.ranked.size(), 4u);
  for (const auto& e : racks.rec.ranked) {
    if (e.policy == "xor" || e.policy == "none") {
      EXPECT_GT(e.p_fatal_rack, 0.99) << e.policy;
    } else {
      EXPECT_LT(e.p_fatal_rack, 0.01) << e.policy;
    }
  }
  EXPECT_NE(racks.policy, "xor");
  // Within a budget that leaves xor and none, xor still beats none.
  p.host_bytes_per_node = (1ull << 30) + (1ull << 30) / 5;
  EXPECT_EQ(Choose(*t, inv, p, in).policy, "xor");
}

// The network budget counts the bytes a node receives from peers per
// snapshot (peer copies of dp_sharded and private state under ZeRO-1).
TEST(AutoPlanTest, NetworkBudgetExcludesPeerCopies) {
  auto t = topo::Topology::Uniform(4, 1, 1, 1, 1);
  ASSERT_TRUE(t.ok());
  const topo::Inventory inv = Uniform(*t, 4ull << 30, 1ull << 30, 4096);
  topo::Policy p = *topo::ParsePolicy("auto");
  Choice free = Choose(*t, inv, p);
  double most = 0;
  std::string heaviest;
  for (const auto& e : free.rec.ranked) {
    if (e.cost.network_bytes > most) most = e.cost.network_bytes, heaviest = e.policy;
  }
  ASSERT_GT(most, 0) << "no candidate sends peer copies";
  p.network_bytes_per_node = static_cast<uint64_t>(most) - 1;
  Choice tight = Choose(*t, inv, p);
  EXPECT_TRUE(Has(tight.reason, heaviest + " excluded: sends")) << tight.reason;
  EXPECT_NE(tight.policy, heaviest);
}

// The same inputs give the same plan, byte for byte: the launcher and every
// agent compare plan hashes.
TEST(AutoPlanTest, DeterministicAndConcretePoliciesPassThrough) {
  auto t = topo::Topology::Uniform(4, 1, 2, 1, 2);
  ASSERT_TRUE(t.ok());
  const topo::Inventory inv = Uniform(*t, 1 << 20, 1 << 18, 64);
  topo::Policy p = *topo::ParsePolicy("auto");
  p.host_bytes_per_node = 1 << 20;
  auto a = MakeJobPlan(*t, inv, p);
  auto b = MakeJobPlan(*t, inv, p);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  EXPECT_EQ(topo::PlanToJson(*a).dump(), topo::PlanToJson(*b).dump());
  EXPECT_EQ(a->policy.host_bytes_per_node, 1u << 20);  // the budget stays in the plan
  auto x = MakeJobPlan(*t, inv, *topo::ParsePolicy("xor"));
  auto y = topo::MakePlan(*t, inv, *topo::ParsePolicy("xor"));
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(topo::PlanToJson(*x).dump(), topo::PlanToJson(*y).dump());
  // A malformed inventory is refused as topo::MakePlan refuses it.
  topo::Inventory bad = inv;
  bad.pop_back();
  EXPECT_EQ(MakeJobPlan(*t, bad, p).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memento::model
