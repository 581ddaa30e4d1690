// `memento bench overhead` end to end with the tiny trainer preset: real
// agents, a real 4-rank trainer job (DP 2 x PP 2, ZeRO-1) with and without
// per-step snapshots. Checks the JSON report, never the timings' values
// beyond sanity (no timed pass/fail on a shared machine).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;
using memento::bench_testing::StderrFile;
using memento::bench_testing::WorkDir;

TEST(BenchOverheadSmoke, TinyPresetReportsBothSides) {
  const std::string err = StderrFile("memento-bench-smoke");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench overhead --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --steps 3 --rounds 2 --dp 2 --pp 2 --batch 4"
                          " --micro-batches 2 --run-timeout 60 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  // Agents, slots and logs are gone.
  const std::string dir = WorkDir(err);
  EXPECT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  std::filesystem::remove(err);
  // One JSON object on one line.
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["bench"], "overhead");
  EXPECT_EQ(j["preset"], "tiny");
  EXPECT_GT(j["params"].get<int64_t>(), 10000);
  EXPECT_LT(j["params"].get<int64_t>(), 100000);
  EXPECT_EQ(j["topology"]["dp"], 2);
  EXPECT_EQ(j["topology"]["pp"], 2);
  EXPECT_EQ(j["topology"]["tp"], 1);
  EXPECT_EQ(j["topology"]["nodes"], 4);
  EXPECT_EQ(j["topology"]["zero1"], true);
  EXPECT_EQ(j["rounds"], 2);
  const double off = j["step_s_off"].get<double>();
  const double on = j["step_s_on"].get<double>();
  const double pct = j["overhead_pct"].get<double>();
  EXPECT_GT(off, 0);
  EXPECT_GT(on, 0);
  EXPECT_LT(off, 10);  // a tiny step takes milliseconds
  EXPECT_LT(on, 10);
  EXPECT_TRUE(std::isfinite(pct));
  EXPECT_NEAR(pct, (on - off) / off * 100, 1e-6 * std::max(1.0, std::abs(pct)));
  // The "on" runs really snapshotted: the trainer timed its hooks.
  EXPECT_GT(j["snapshot_s_on"].get<double>() + j["fence_s_on"].get<double>(), 0);
  ASSERT_EQ(j["per_round"].size(), 2u);
  EXPECT_EQ(j["per_round"][0]["order"], "off,on");
  EXPECT_EQ(j["per_round"][1]["order"], "on,off");
  double sum_off = 0, sum_pct = 0;
  for (const auto& r : j["per_round"]) {
    EXPECT_GT(r["step_s_off"].get<double>(), 0);
    EXPECT_GT(r["step_s_on"].get<double>(), 0);
    sum_off += r["step_s_off"].get<double>();
    sum_pct += r["overhead_pct"].get<double>();
  }
  EXPECT_NEAR(sum_off / 2, off, 1e-9);
  // The median of two rounds is their mean.
  EXPECT_NEAR(j["step_s_off_median"].get<double>(), off, 1e-9);
  EXPECT_NEAR(j["overhead_pct_median"].get<double>(), sum_pct / 2,
              1e-9 * std::max(1.0, std::abs(sum_pct)));
  EXPECT_EQ(j["copy_priority"], "default");
  EXPECT_TRUE(j.contains("loadavg_1m_start")) << out;
  // CPU accounting: every rank's process CPU per step in both runs, the copy
  // workers' part (nonzero: every step was copied and hashed) and the bytes.
  EXPECT_GT(j["cpu_s_per_step_off"].get<double>(), 0);
  EXPECT_GT(j["cpu_s_per_step_on"].get<double>(), 0);
  EXPECT_GT(j["copy_cpu_s_on"].get<double>(), 0);
  EXPECT_LT(j["copy_cpu_s_on"].get<double>(), j["cpu_s_per_step_on"].get<double>());
  EXPECT_GE(j["agent_cpu_s_on"].get<double>(), 0);
  EXPECT_GT(j["snap_bytes_per_step"].get<double>(), 0);
  EXPECT_EQ(j["schedule"], "default");
  for (const auto& r : j["per_round"]) EXPECT_GT(r["copy_cpu_s_on"].get<double>(), 0);
}

// --cluster: the on runs are a cluster job (embedded store, commit
// coordinator, agents with --store): every snapshot becomes a committed
// version, so the ranks report a commit lag. Shape only, no timing.
TEST(BenchOverheadSmoke, ClusterModeReportsTheCommitLag) {
  const std::string err = StderrFile("memento-bench-smoke");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench overhead --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --steps 30 --rounds 1 --dp 2 --pp 2 --batch 4"
                          " --micro-batches 2 --run-timeout 60 --cluster 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  const std::string dir = WorkDir(err);
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  std::filesystem::remove(err);
  // stdout is the JSON object alone (the coordinator logs to stderr).
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["cluster"], true);
  EXPECT_EQ(j["policy"], "xor");
  const nlohmann::json& lag = j["commit_lag"];
  ASSERT_TRUE(lag.is_object()) << out;
  // Some version committed while the ranks still ran: each rank waits in
  // its first (untimed) step until its snapshot of step 1 committed
  // (memento-trainer --memento-pace-commits 1), and sees that commit at its
  // next snapshot, however loaded the machine (this was a bet on 29 tiny
  // steps outlasting a commit before).
  EXPECT_GE(lag["versions"].get<double>(), 1) << out;
  EXPECT_GE(lag["steps_p50"].get<double>(), 0) << out;
  EXPECT_LE(lag["steps_p50"].get<double>(), lag["steps_p90"].get<double>()) << out;
  EXPECT_LE(lag["steps_p90"].get<double>(), lag["steps_max"].get<double>()) << out;
  EXPECT_LE(lag["s_p50"].get<double>(), lag["s_max"].get<double>()) << out;
  ASSERT_EQ(j["per_round"].size(), 1u);
  EXPECT_TRUE(j["per_round"][0]["commit_lag_on"].is_object()) << out;
  EXPECT_GE(j["agent_cpu_s_per_step_on"].get<double>(), 0);
  // The agents' own accounting (each logs "agent cpu by activity" at stop):
  // they produced T1 versions, and the parts fit inside the process's CPU.
  const nlohmann::json& act = j["agent_cpu_s_per_step_by_activity"];
  ASSERT_TRUE(act.is_object()) << out;
  EXPECT_GT(act.value("produced", 0.0), 0) << out;
  const double process = act.value("process_cpu_s", 0.0);
  EXPECT_GT(process, 0) << out;
  EXPECT_GE(act.value("t1_produce_cpu_s", -1.0), 0) << out;
  EXPECT_GE(act.value("commit_cpu_s", -1.0), 0) << out;
  EXPECT_LE(act.value("t1_produce_cpu_s", 0.0) + act.value("commit_cpu_s", 0.0) +
                act.value("seal_slots_cpu_s", 0.0) + act.value("scrub_cpu_s", 0.0),
            process * 1.05 + 1e-3)
      << out;
  // Every CPU-second by thread (common/thread_cpu.h): the threads add up to
  // the agents' process CPU (one line per thread name, summed over agents,
  // read at stop a moment after process_cpu_s), and the member thread, which
  // produces T1, is one of them.
  const nlohmann::json& threads = j["agent_cpu_s_per_step_by_thread"];
  ASSERT_TRUE(threads.is_object()) << out;
  double sum = 0;
  for (auto it = threads.begin(); it != threads.end(); ++it) sum += it->get<double>();
  EXPECT_NEAR(sum, process, process * 0.05 + 1e-3) << out;
  EXPECT_GE(threads.value("member", 0.0), act.value("t1_produce_cpu_s", 0.0) * 0.95) << out;
  // The steady part per version, by thread and in all; the ranks' overhead
  // with it added.
  const nlohmann::json& steady = j["agent_steady_cpu_s_per_version_by_thread"];
  ASSERT_TRUE(steady.is_object()) << out;
  EXPECT_GT(steady.value("member", 0.0), 0) << out;
  EXPECT_GT(j["agent_steady_cpu_s_per_version"].get<double>(), 0) << out;
  ASSERT_TRUE(j["cpu_overhead_with_agents_pct"].is_number()) << out;
  EXPECT_GT(j["cpu_overhead_with_agents_pct"].get<double>(), j["cpu_overhead_pct"].get<double>())
      << out;
}

TEST(BenchOverheadSmoke, MissingTrainerIsAnError) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) +
                            " bench overhead --json --trainer /nonexistent/memento-trainer"
                            " --preset tiny 2>/dev/null");
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(out.empty()) << out;
}

TEST(BenchOverheadSmoke, FailingTrainerIsReportedAndCleanedUp) {
  const std::string err = StderrFile("memento-bench-smoke");
  // An unknown preset makes every trainer run fail.
  auto [rc, out] =
      RunShell(std::string(MEMENTO_CLI_BINARY) + " bench overhead --json --trainer " +
               MEMENTO_TRAINER_BINARY + " --preset nosuchpreset --steps 2 --rounds 1 2>" + err);
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(out.empty()) << out;
  const std::string dir = WorkDir(err);
  EXPECT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  std::filesystem::remove(err);
}

// A long run's job summary (its step_s list, about 10 bytes a step) is
// longer than the 4 KiB stdio buffer; the ranks share one stdout, and
// another rank's summary landed inside it ("no JSON summary in the
// trainer's output" at --steps 300). 500 steps: a summary of over 5 KB.
TEST(BenchOverheadSmoke, ALongRunsSummaryIsReadWhole) {
  const std::string err = StderrFile("memento-bench-smoke");
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) + " bench overhead --json --trainer " +
                            MEMENTO_TRAINER_BINARY +
                            " --preset tiny --steps 500 --rounds 1 --run-timeout 300 2>" + err);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j.value("timed_steps_per_run", 0), 499) << out;
  std::filesystem::remove(err);
}

// --compare aor: both sides are memento cluster runs, the off side with
// the trainer's --no-aor. The on side's ranks report what AOR cost their
// training thread per call; the off side reports none. Shape only, no
// timing. Without --cluster the comparison is refused, saying why.
TEST(BenchOverheadSmoke, CompareAorRunsBothSidesWithMementoAndReportsAorPerCall) {
  const std::string err = StderrFile("memento-bench-smoke");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench overhead --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --steps 6 --rounds 1 --dp 2 --pp 2 --batch 4"
                          " --micro-batches 2 --run-timeout 60 --cluster --compare aor 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(err);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(err);
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["compare"], "aor");
  ASSERT_EQ(j["per_round"].size(), 1u);
  const nlohmann::json& r = j["per_round"][0];
  // Both sides snapshotted (memento on): their hooks ran.
  EXPECT_GT(r["fence_s_off"].get<double>() + r["snapshot_s_off"].get<double>(), 0) << out;
  EXPECT_GT(r["fence_s_on"].get<double>() + r["snapshot_s_on"].get<double>(), 0) << out;
  const nlohmann::json& aor = r["aor_per_call_on"];
  ASSERT_TRUE(aor.is_object()) << out;
  EXPECT_EQ(aor["ranks"], 4) << out;  // DP 2 x PP 2: every rank feeds its DP peer's replica
  // Steps 2 to 6 on every rank (the first call is not timed).
  EXPECT_EQ(aor["captures"].get<double>(), 5) << out;
  EXPECT_EQ(aor["reports"].get<double>(), 5) << out;
  EXPECT_GE(aor["capture_s"].get<double>(), 0) << out;
  EXPECT_GE(aor["checksum_s"].get<double>(), 0) << out;
  EXPECT_GE(aor["report_s"].get<double>(), 0) << out;
  // The round's lines: one per side, the on side with AOR's times.
  EXPECT_NE(log.find("round 0 aor off"), std::string::npos) << log;
  EXPECT_NE(log.find("round 0 aor on"), std::string::npos) << log;
  EXPECT_NE(log.find("aor per call: capture"), std::string::npos) << log;

  auto [rc2, out2] = RunShell(std::string(MEMENTO_CLI_BINARY) +
                              " bench overhead --json --preset tiny --compare aor 2>&1");
  EXPECT_NE(rc2, 0) << out2;
  EXPECT_NE(out2.find("--compare aor needs --cluster"), std::string::npos) << out2;
}

// --compare sharded: both sides are the same memento cluster job, off with
// whole-tensor slots, on with sharded slots. DP 4 under xor: a rank copies
// its quarter of the replicated state plus its parity (W/4 + W/12 = W/3),
// so the on side's newest snapshots hold well under half the bytes of the
// off side's (bytes are exact, not timed). The per-step means are not
// compared: a sharded client writes whole tensors until the cluster's plan
// exists, and how many of a 4-step run's snapshots that is depends on the
// load. Without --cluster, or with --sharded too, the comparison is
// refused, saying why.
TEST(BenchOverheadSmoke, CompareShardedRunsWholeAndShardedSlotsAndReportsBothSidesBytes) {
  const std::string err = StderrFile("memento-bench-smoke");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench overhead --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --steps 4 --rounds 1 --dp 4 --pp 1 --no-zero --batch 4"
                          " --run-timeout 60 --cluster --policy xor --compare sharded 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  std::ifstream in(err);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << out << log;
  std::filesystem::remove(err);
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["compare"], "sharded");
  ASSERT_EQ(j["per_round"].size(), 1u);
  const nlohmann::json& r = j["per_round"][0];
  // Both sides snapshotted every step.
  const double whole = r["snap_bytes_last_off"].get<double>();
  const double sharded = r["snap_bytes_last_on"].get<double>();
  EXPECT_GT(sharded, 0) << out;
  EXPECT_LT(sharded * 2, whole) << out;
  EXPECT_EQ(j["snap_bytes_last_off"].get<double>(), whole) << out;
  EXPECT_EQ(j["snap_bytes_last"].get<double>(), sharded) << out;
  // The means lie between: every snapshot is at most whole, and the on
  // side's mean is at least its newest (sharded) snapshot's size.
  EXPECT_EQ(r["snap_bytes_per_step_off"].get<double>(), whole) << out;
  EXPECT_GE(r["snap_bytes_per_step_on"].get<double>(), sharded) << out;
  EXPECT_LE(r["snap_bytes_per_step_on"].get<double>(), whole) << out;
  EXPECT_GT(r["copy_cpu_s_off"].get<double>(), 0) << out;
  EXPECT_GT(r["copy_cpu_s_on"].get<double>(), 0) << out;
  EXPECT_GT(r["fence_s_off"].get<double>() + r["snapshot_s_off"].get<double>(), 0) << out;
  EXPECT_GT(r["fence_s_on"].get<double>() + r["snapshot_s_on"].get<double>(), 0) << out;
  // One line per side, with the bytes.
  EXPECT_NE(log.find("round 0 sharded off"), std::string::npos) << log;
  EXPECT_NE(log.find("round 0 sharded on"), std::string::npos) << log;
  EXPECT_NE(log.find("snapshot bytes/step (all ranks)"), std::string::npos) << log;

  auto [rc2, out2] = RunShell(std::string(MEMENTO_CLI_BINARY) +
                              " bench overhead --json --preset tiny --compare sharded 2>&1");
  EXPECT_NE(rc2, 0) << out2;
  EXPECT_NE(out2.find("--compare sharded needs --cluster"), std::string::npos) << out2;
  auto [rc3, out3] =
      RunShell(std::string(MEMENTO_CLI_BINARY) +
               " bench overhead --json --preset tiny --cluster --sharded --compare sharded 2>&1");
  EXPECT_NE(rc3, 0) << out3;
  EXPECT_NE(out3.find("leave out --sharded"), std::string::npos) << out3;
}

}  // namespace
