// `memento bench swift` end to end with the tiny trainer preset (DP 2 x PP 4
// and DP 1 x PP 4 under `memento launch` on 4 nodes, memento snapshots every
// 4 steps, one rank SIGKILLed inside its optimizer update): checks
// the JSON shape and what each recovery mode did (processes restarted, steps
// lost, steps replayed), never the timings' values (no timed pass/fail on a
// shared machine).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;

TEST(BenchSwiftSmoke, EveryModeRecoversAndReports) {
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench swift --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --layers 4 --steps 12 --save-every 4 --kill-step 10"
                          " --overhead-steps 12 --overhead-save-every 4 --rounds 1 2>&1";
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["bench"], "swift");
  EXPECT_EQ(j["config"]["nodes"], 4);
  for (const char* m : {"restart", "undo", "log", "restart_dp1"}) {
    SCOPED_TRACE(m);
    ASSERT_TRUE(j["modes"].contains(m)) << out;
    EXPECT_GT(j["modes"][m]["resume_s"].get<double>(), 0);
    EXPECT_EQ(j["modes"][m]["resume_s_spread"]["rounds"].size(), 1u);
  }
  // Killed inside the update of step 10, memento snapshots at 4 and 8: a
  // restart resumes from the committed 8 and loses step 9 (the failure runs
  // pace every snapshot on its commit, so 8 has committed when the kill
  // comes, however loaded the machine: a check that follows from the run,
  // not from its speed); undo and log
  // restart one process and lose nothing; the log replacement loads its
  // snapshot of 8 from its node's T0 and replays 9 and 10 (the survivors
  // completed 10): a middle stage's inputs, 4 activations and 4 gradients of
  // 2 KiB and the gradient-norm sum (8 bytes) per step.
  EXPECT_EQ(j["modes"]["restart"]["processes_restarted"], 8.0);
  for (const char* m : {"restart", "restart_dp1"}) {
    EXPECT_EQ(j["modes"][m]["committed_at_failure"], 8.0) << m << ": " << out;
  }
  EXPECT_EQ(j["modes"]["restart"]["steps_lost"], 1.0) << out;
  EXPECT_EQ(j["modes"]["restart_dp1"]["processes_restarted"], 4.0);
  EXPECT_EQ(j["modes"]["undo"]["processes_restarted"], 1.0);
  EXPECT_EQ(j["modes"]["undo"]["steps_lost"], 0.0);
  EXPECT_EQ(j["modes"]["log"]["processes_restarted"], 1.0);
  EXPECT_EQ(j["modes"]["log"]["steps_lost"], 0.0);
  EXPECT_EQ(j["modes"]["log"]["replayed_steps"], 2.0);
  EXPECT_EQ(j["modes"]["log"]["bytes_replayed"], 2.0 * (8 * 2048 + 8));
  // tiny, PP 4, 4 micro-batches: 4 x 2 KiB per stage boundary and direction,
  // 3 boundaries, 2 directions, plus one 8-byte gradient norm per rank.
  EXPECT_EQ(j["log_bytes_per_step"], 4.0 * 2048 * 3 * 2 + 4 * 8);
  EXPECT_TRUE(std::isfinite(j["logging_overhead_pct"].get<double>()));
  // The run that logs one step in 4: one per round. (Snapshots every 4
  // steps leave no logged step whose window is clear of a snapshot or its
  // fence.)
  EXPECT_EQ(j["logging_overhead_pct_adjacent"]["round_medians"].size(), 1u) << out;
  EXPECT_EQ(j["logging_overhead_pct_adjacent"]["samples"], 0) << out;
  EXPECT_EQ(j["logging_overhead_pct_adjacent"]["goal_below_2pct"], "no samples") << out;
  // Selective logging (log groups of 1, 2, 4 stages): the lost stage 2's
  // whole group replays steps 9 and 10 (G stages, 2 G steps in all), no step
  // lost; the log holds what crosses the group edges (3, 1, 0 boundaries;
  // the gradient-norm sums always).
  const std::map<std::string, double> log_bytes = {
      {"1", 4.0 * 2048 * 3 * 2 + 4 * 8}, {"2", 4.0 * 2048 * 1 * 2 + 4 * 8}, {"4", 4.0 * 8}};
  for (const auto& [g, bytes] : log_bytes) {
    SCOPED_TRACE("log group size " + g);
    ASSERT_TRUE(j["log_groups"].contains(g)) << out;
    const auto& m = j["log_groups"][g];
    const double stages = std::stod(g);
    EXPECT_EQ(m["steps_lost"], 0.0);
    EXPECT_EQ(m["replayed_stages"], stages);
    EXPECT_EQ(m["replayed_steps"], 2 * stages);
    EXPECT_EQ(m["log_bytes_per_step"], bytes);
    EXPECT_GT(m["resume_s"].get<double>(), 0);
  }
}

// Killed mid-step (at its first pipeline receive of step 10): no rank had
// completed step 10, so a restart from the committed 8 loses step 9, undo and
// log lose nothing, and the log replacement replays step 9 only.
// --compare-group-rebuild: one more undo run whose trainers rebuild every
// Gloo group, reported as undo_all_groups, the same recovery otherwise.
TEST(BenchSwiftSmoke, MidStepKill) {
  const std::string cmd =
      std::string(MEMENTO_CLI_BINARY) + " bench swift --json --trainer " + MEMENTO_TRAINER_BINARY +
      " --preset tiny --layers 4 --steps 12 --save-every 4 --kill-step 10"
      " --fail-point pipeline --log-groups none --rounds 1"
      " --overhead-steps 12 --overhead-save-every 4 --compare-group-rebuild 2>&1";
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["config"]["fail_point"], "pipeline");
  EXPECT_EQ(j["modes"]["restart"]["committed_at_failure"], 8.0) << out;
  EXPECT_EQ(j["modes"]["restart"]["steps_lost"], 1.0) << out;
  EXPECT_EQ(j["modes"]["undo"]["steps_lost"], 0.0);
  EXPECT_EQ(j["modes"]["undo"]["processes_restarted"], 1.0);
  EXPECT_EQ(j["modes"]["log"]["steps_lost"], 0.0);
  EXPECT_EQ(j["modes"]["log"]["processes_restarted"], 1.0);
  EXPECT_EQ(j["modes"]["log"]["replayed_steps"], 1.0);
  EXPECT_EQ(j["modes"]["undo_all_groups"]["steps_lost"], 0.0) << out;
  EXPECT_EQ(j["modes"]["undo_all_groups"]["processes_restarted"], 1.0) << out;
  EXPECT_GT(j["undo_vs_undo_all_groups"].get<double>(), 0.0) << out;
  EXPECT_EQ(j["config"]["compare_group_rebuild"], true) << out;
  // --log-groups none: no selective-logging runs.
  EXPECT_TRUE(j["config"]["log_groups"].empty()) << out;
}

// --overhead-only: only the runs that log one step in 4 (2 rounds of 16
// steps, a snapshot at 16): logged steps 5 and 9 each with the step after
// it against the clean steps around them (13's window touches the snapshot
// at 16), pooled; an interval around the median, a verdict on the 2 % goal;
// a control run per round that logs none of those steps.
TEST(BenchSwiftSmoke, OverheadOnly) {
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench swift --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --layers 4 --overhead-only --overhead-steps 16"
                          " --overhead-save-every 16 --rounds 2 2>&1";
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_FALSE(j.contains("modes")) << out;
  const auto& m = j["logging_overhead_pct_adjacent"];
  EXPECT_EQ(m["round_medians"].size(), 2u) << out;
  EXPECT_EQ(m["samples"], 4) << out;
  EXPECT_EQ(m["log_one_step_in"], 4) << out;
  EXPECT_TRUE(m.contains("in_step_median") && m.contains("after_median")) << out;
  // The control runs (one per round, nothing logged in the windows): the
  // same windows, the same count.
  EXPECT_EQ(m["control"]["samples"], 4) << out;
  EXPECT_EQ(m["control"]["round_medians"].size(), 2u) << out;
  EXPECT_TRUE(m.contains("median_minus_control")) << out;
  EXPECT_LE(m["ci95_low"].get<double>(), m["median"].get<double>()) << out;
  EXPECT_GE(m["ci95_high"].get<double>(), m["median"].get<double>()) << out;
  const std::string goal = m["goal_below_2pct"];
  EXPECT_TRUE(goal.rfind("met", 0) == 0 || goal.rfind("missed", 0) == 0 ||
              goal.rfind("not shown", 0) == 0)
      << out;
  EXPECT_EQ(j["config"]["overhead_steps"], 16) << out;
}

TEST(BenchSwiftSmoke, RefusesAKillBeforeTheFirstSave) {
  auto [rc, out] =
      RunShell(std::string(MEMENTO_CLI_BINARY) + " bench swift --kill-step 3 --save-every 4 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--kill-step 3"), std::string::npos) << out;
}

TEST(BenchSwiftSmoke, RefusesAMalformedLogGroupList) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) + " bench swift --log-groups 1,x 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("'x' is not a group size"), std::string::npos) << out;
}

}  // namespace
