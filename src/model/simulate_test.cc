#include "model/simulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "topo/plan.h"

namespace memento::model {
namespace {

// A fixed seed (the tolerances below are 5 standard errors, so a random seed
// would fail about once in 10^6 runs); MEMENTO_TEST_SEED overrides it.
uint64_t Seed() {
  const char* env = std::getenv("MEMENTO_TEST_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : 20261126;
  std::fprintf(stderr, "seed=%llu (rerun with MEMENTO_TEST_SEED=%llu)\n",
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

// The simulator (no repair) and the closed form agree within the
// simulation's confidence interval: |S_sim - S| <= 5 sqrt(S (1 - S) / N).
TEST(SimulateTest, SurvivalAgreesWithClosedForm) {
  const uint64_t seed = Seed();
  struct Case {
    const char* policy;
    int nodes, group, racks;
    double hw, rack, shape;
  } cases[] = {
      {"durable", 24, 6, 0, 0.02, 0, 1.3},   {"none", 24, 6, 0, 0.02, 0, 1.0},
      {"xor", 48, 6, 0, 0.02, 0, 1.3},       {"rs:2", 48, 8, 0, 0.05, 0, 1.5},
      {"replicate", 40, 8, 0, 0.03, 0, 1.0}, {"peer:3", 36, 6, 0, 0.05, 0, 2.0},
      {"xor", 24, 4, 6, 0.01, 0.01, 1.3},    {"replicate", 24, 6, 4, 0.02, 0.01, 1.0},
  };
  constexpr int kTrials = 20000;
  for (const auto& c : cases) {
    auto s = UniformStructure(c.policy, c.nodes, c.group, c.racks);
    ASSERT_TRUE(s.ok()) << s.status();
    FailureRates rates;
    rates.hardware = {c.hw, c.shape};
    rates.software = {c.hw / 2, c.shape};
    rates.rack = {c.rack, c.shape};
    // Times where the closed form spans 0.95 .. 0.2.
    std::vector<double> times;
    for (double target : {0.95, 0.8, 0.5, 0.2}) {
      auto t = TimeToThreshold(*s, rates, target);
      ASSERT_TRUE(t.ok());
      times.push_back(*t);
    }
    auto est = SimulateSurvival(*s, rates, times, kTrials, seed);
    ASSERT_TRUE(est.ok());
    for (size_t i = 0; i < times.size(); ++i) {
      auto exact = Survival(*s, rates, times[i]);
      ASSERT_TRUE(exact.ok());
      const double se = std::sqrt(*exact * (1 - *exact) / kTrials);
      EXPECT_NEAR(est->survival[i], *exact, 5 * se)
          << c.policy << " racks=" << c.racks << " t=" << times[i];
    }
  }
}

// The survival test can fail: a model with the wrong rule is rejected.
TEST(SimulateTest, SurvivalTellsPoliciesApart) {
  auto x = UniformStructure("xor", 48, 6, 0);
  auto r = UniformStructure("rs:2", 48, 6, 0);
  ASSERT_TRUE(x.ok() && r.ok());
  FailureRates rates;
  rates.hardware = {0.02, 1.3};
  auto t = TimeToThreshold(*x, rates, 0.5);
  ASSERT_TRUE(t.ok());
  auto est = SimulateSurvival(*r, rates, {*t}, 20000, Seed());
  ASSERT_TRUE(est.ok());
  EXPECT_GT(est->survival[0] - 0.5, 10 * est->std_error[0]);
}

// Durable-only checkpointing with exponential failures: the simulated goodput
// matches Daly's closed form within 5 batch standard errors.
TEST(SimulateTest, DurableGoodputAgreesWithDaly) {
  auto s = UniformStructure("durable", 16, 4, 0);
  ASSERT_TRUE(s.ok());
  FailureRates rates;  // per day: 16 nodes x (2 + 1) = 48 failures a day, M = 30 min
  rates.hardware = {2.0, 1.0};
  rates.software = {1.0, 1.0};
  Costs c;
  c.step_s = 1;
  c.restart_s = 60;
  c.durable_restore_s = 240;
  c.durable_write_s = 120;
  const double mtbf = 86400.0 / (16 * 3.0);
  for (double tau : {600.0, YoungInterval(c.durable_write_s, mtbf), 3600.0}) {
    auto r = SimulateTraining(*s, rates, 86400, c, tau, 400, Seed());
    ASSERT_TRUE(r.ok());
    const double expect =
        DalyGoodput(tau, c.durable_write_s, c.restart_s + c.durable_restore_s, mtbf);
    EXPECT_NEAR(r->goodput, expect, 5 * r->goodput_std_error + 1e-3) << "tau=" << tau;
    EXPECT_LT(r->goodput_std_error, 0.01);
    EXPECT_EQ(r->memory_recoveries, 0);
    EXPECT_EQ(r->fallback_probability, 1.0);
  }
}

// In-memory protection: software failures and single node losses recover from
// memory; a rack that takes two nodes of an xor group falls back.
TEST(SimulateTest, TraceDrivesRecoveryKinds) {
  auto s = UniformStructure("xor", 8, 4, 2);  // racks {0..3} {4..7}; groups {0,2,4,6} {1,3,5,7}
  ASSERT_TRUE(s.ok());
  auto trace = ParseTrace(
      "# t kind id\n"
      "1000 sw 3\n"
      "5000 hw 2\n"
      "9000.5 rack 1\n"
      "\n",
      *s);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 3u);
  Costs c;
  c.step_s = 10;
  auto r = SimulateTraining(*s, FailureRates{}, 86400, c, 3600, 1, 1, &*trace);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->failures, 3);
  EXPECT_EQ(r->memory_recoveries, 2);
  EXPECT_EQ(r->durable_fallbacks, 1);
  // The rack loss rolls back to the durable version at 7200 s of progress.
  EXPECT_GT(r->lost_work_s_per_day, 9000.5 - 7200 - 2 * (60 + 30) - 100);
  EXPECT_LT(r->goodput, 1.0);

  auto bad = ParseTrace("10 hw 99\n", *s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("line 1"), std::string::npos);
  auto back = ParseTrace("10 hw 1\n5 sw 1\n", *s);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().ToString().find("line 2"), std::string::npos);
  auto junk = ParseTrace("10 disk 1\n", *s);
  ASSERT_FALSE(junk.ok());
}

// Peer groups that cross sharding groups overlap them: the closed form is
// then a lower bound (Harris), and the simulator, exact, lies above it.
TEST(SimulateTest, OverlappingGroupsGiveALowerBound) {
  auto t =
      topo::Topology::Uniform(3, 1, 2, 1, 1);  // groups {0,1,2} {3,4,5}; pairs {0,1} {2,3} {4,5}
  ASSERT_TRUE(t.ok());
  topo::Inventory inv(t->num_ranks());
  for (auto& r : inv) {
    TensorMeta m;
    m.name = "params";
    m.dtype = DType::kFloat32;
    m.shape = {1024};
    m.state_class = StateClass::kReplicated;
    r.push_back(m);
    m.name = "rng";
    m.state_class = StateClass::kPrivate;
    r.push_back(m);
  }
  auto pol = topo::ParsePolicy("xor");
  ASSERT_TRUE(pol.ok());
  auto plan = topo::MakePlan(*t, inv, *pol);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto s = StructureFromPlan(*plan);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_FALSE(s->exact);
  ASSERT_EQ(s->groups.size(), 3u);  // two sharding groups and the pair {2,3}
  FailureRates rates;
  rates.hardware = {0.3, 1.0};
  std::vector<double> times = {0.5, 1.0, 2.0};
  auto est = SimulateSurvival(*s, rates, times, 40000, Seed());
  ASSERT_TRUE(est.ok());
  for (size_t i = 0; i < times.size(); ++i) {
    auto bound = Survival(*s, rates, times[i]);
    ASSERT_TRUE(bound.ok());
    EXPECT_GE(est->survival[i], *bound - 5 * est->std_error[i]) << "t=" << times[i];
  }
}

// Many racks: the closed form stops enumerating rack sets at its limits and
// says how much mass it left out; the simulated survival lies within
// [S, S + gap] (5 standard errors).
TEST(SimulateTest, RackEnumerationLimitGivesABracket) {
  auto s = UniformStructure("xor", 200, 8, 25);  // racks of 8 nodes
  ASSERT_TRUE(s.ok());
  FailureRates rates;
  rates.hardware = {0.001, 1.0};
  rates.rack = {0.01, 1.0};
  const double t = 3.0;
  auto lower = Survival(*s, rates, t);
  ASSERT_TRUE(lower.ok());
  const double gap = RackEnumerationGap(*s, rates, t);
  EXPECT_GT(gap, 1e-7);  // 25 racks: the limits cut the enumeration
  auto est = SimulateSurvival(*s, rates, {t}, 4000, Seed());
  ASSERT_TRUE(est.ok());
  EXPECT_GE(est->survival[0], *lower - 5 * est->std_error[0]);
  EXPECT_LE(est->survival[0], *lower + gap + 5 * est->std_error[0]);
  auto none = UniformStructure("xor", 200, 8, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(RackEnumerationGap(*none, rates, t), 0.0);
}

TEST(SimulateTest, YoungAndDalyIntervals) {
  EXPECT_NEAR(YoungInterval(60, 86400), std::sqrt(2 * 60 * 86400.0), 1e-9);
  const double d = DalyInterval(60, 86400);
  EXPECT_GT(d, YoungInterval(60, 86400) - 60);
  EXPECT_LT(d, YoungInterval(60, 86400) * 1.05);
  // Daly's interval maximises Daly's goodput (to first order).
  const double g = DalyGoodput(d, 60, 300, 86400);
  EXPECT_GE(g, DalyGoodput(d * 0.7, 60, 300, 86400));
  EXPECT_GE(g, DalyGoodput(d * 1.4, 60, 300, 86400));
}

}  // namespace
}  // namespace memento::model
