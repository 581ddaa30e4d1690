#include "model/recommend.h"

#include <gtest/gtest.h>

#include <cmath>

namespace memento::model {
namespace {

Structure Must(const char* policy, int nodes, int group, int racks = 0) {
  auto s = UniformStructure(policy, nodes, group, racks);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// The first-order goodput the recommendation ranks by agrees with the
// event-by-event simulator (which Daly's closed form checks in
// simulate_test): within 5 batch standard errors plus the first-order model's
// second-order error (the square of the lost fraction).
TEST(RecommendTest, AnalyticGoodputAgreesWithSimulation) {
  FailureRates rates;
  rates.hardware = {0.05, 1.0};
  rates.software = {0.2, 1.0};
  rates.rack = {0.02, 1.0};
  ClusterFigures f;
  f.state_bytes_per_node = 64e9;  // slow rebuilds and restores make the costs visible
  f.restart_s = 120;
  int checked = 0;
  for (const char* policy : {"durable", "none", "xor", "replicate"}) {
    std::vector<Structure> one = {Must(policy, 32, 8, 4)};
    auto rec = Recommend(one, rates, 86400, 0.5, f, 20);
    ASSERT_TRUE(rec.ok()) << rec.status();
    const Evaluation& e = rec->ranked[0];
    for (double interval : {1800.0, 4 * 3600.0}) {
      const double g = Goodput(e, rates, 86400, 32, 4, interval);
      if (g < 0.8) continue;  // beyond first order
      ++checked;
      auto sim = SimulateTraining(one[0], rates, 86400, e.cost.costs, interval, 300, 7);
      ASSERT_TRUE(sim.ok());
      const double second_order = (1 - g) * (1 - g);
      EXPECT_NEAR(sim->goodput, g, 5 * sim->goodput_std_error + second_order + 1e-3)
          << policy << " interval=" << interval << " fallbacks=" << sim->durable_fallbacks
          << " memory=" << sim->memory_recoveries;
    }
  }
  EXPECT_GE(checked, 6);
}

TEST(RecommendTest, BudgetsExcludeAndTheReasonSaysWhy) {
  std::vector<Structure> s = {Must("durable", 64, 8), Must("replicate", 64, 8), Must("xor", 64, 8),
                              Must("rs:2", 64, 8)};
  FailureRates rates;
  rates.hardware = {1e-3, 1.3};
  rates.software = {1e-2, 1.3};
  ClusterFigures f;
  f.state_bytes_per_node = 16e9;
  f.host_budget = 20000000000ull;  // replicate needs 32 GB, xor 18.3 GB, rs:2 21.3 GB
  auto rec = Recommend(s, rates, 86400, 0.99, f);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->ranked[0].policy, "xor");
  EXPECT_TRUE(rec->ranked[0].cost.fits);
  EXPECT_FALSE(rec->ranked.back().cost.fits);
  EXPECT_NE(rec->reason.find("replicate excluded: needs 32 GB"), std::string::npos) << rec->reason;
  EXPECT_NE(rec->reason.find("rs:2 excluded"), std::string::npos) << rec->reason;
  // In-memory policies beat the durable-only baseline, whose own optimum is
  // close to Daly's.
  const Evaluation* durable = nullptr;
  for (const auto& e : rec->ranked) {
    if (e.policy == "durable") durable = &e;
  }
  ASSERT_NE(durable, nullptr);
  EXPECT_GT(rec->ranked[0].best_goodput, durable->best_goodput);
  EXPECT_NEAR(durable->best_interval_s / rec->daly_s, 1.0, 0.1);
  EXPECT_NEAR(durable->best_goodput, rec->daly_goodput, 2e-3);
  // The recommended interval keeps survival above the threshold.
  EXPECT_LE(rec->ranked[0].best_interval_s, rec->ranked[0].safe_interval_s * (1 + 1e-9));
}

TEST(RecommendTest, CostsFollowThePlannerFormulas) {
  ClusterFigures f;
  f.state_bytes_per_node = 8e9;
  auto x = CostOf("xor", 5, f);
  auto r = CostOf("rs:2", 6, f);
  auto p = CostOf("peer:3", 6, f);
  ASSERT_TRUE(x.ok() && r.ok() && p.ok());
  EXPECT_DOUBLE_EQ(x->host_bytes, 8e9 + 8e9 / 4);
  EXPECT_DOUBLE_EQ(x->rebuild_bytes, 4 * 8e9);
  EXPECT_DOUBLE_EQ(r->host_bytes, 8e9 + 2 * 8e9 / 4);
  EXPECT_DOUBLE_EQ(p->host_bytes, 3 * 8e9);
  EXPECT_DOUBLE_EQ(p->network_bytes, 2 * 8e9);
  EXPECT_FALSE(CostOf("raid6", 6, f).ok());
}

}  // namespace
}  // namespace memento::model
