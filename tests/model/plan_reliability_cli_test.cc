// The reliability commands through the real `memento` binary: REFT Figure 8,
// the pictures, the recommendation from bench files, simulation from a trace,
// bad input (exit 2 naming the flag or file), and `bench plan`.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>

#include "common/shell_test_util.h"
#include "common/test_util.h"

namespace {

struct CliRun {
  int code = -1;
  std::string out, err;
};

CliRun Memento(const std::string& args, const std::string& dir) {
  const std::string err_file = dir + "/stderr";
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " " + args + " 2>" + err_file;
  CliRun r;
  std::tie(r.code, r.out) = memento::testing::RunShell(cmd);
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

using memento::testing::ReadAll;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

const char* kFig8 =
    "plan reliability --nodes 3072 --group-size 6 --hw-rate 1e-4 --sw-rate 1e-5 --shape 1.3 "
    "--threshold 0.9 --policy durable,xor";

TEST(PlanReliabilityCliTest, ReproducesFigure8AndWritesThePicture) {
  memento::testing::ScratchDir dir("plan-reliability");
  const std::string svg = dir.path() + "/fig8.svg";
  CliRun r = Memento(std::string(kFig8) + " --at 1,16.18 --json --svg " + svg, dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["policies"].size(), 2u);
  EXPECT_NEAR(j["policies"][0]["safe_interval"].get<double>(), 0.408, 0.001);
  EXPECT_NEAR(j["policies"][1]["safe_interval"].get<double>(), 16.18, 0.01);
  EXPECT_NEAR(j["policies"][1]["survival"][1]["survival"].get<double>(), 0.9, 0.001);
  EXPECT_TRUE(j["policies"][1]["exact"].get<bool>());
  const std::string text = ReadAll(svg);
  EXPECT_EQ(Count(text, "<polyline class=\"series\""), 2);
  EXPECT_EQ(Count(text, "class=\"threshold\""), 1);
}

TEST(PlanReliabilityCliTest, RecommendsFromBenchFilesWithinBudgets) {
  memento::testing::ScratchDir dir("plan-reliability");
  const std::string persist = dir.path() + "/persist.json";
  std::ofstream(persist) << R"({"bench": "persist", "persist_MiB_s": 500,
      "restore_durable_MiB_s": 800, "restore_memory_MiB_s": 4000})";
  const std::string goodput = dir.path() + "/goodput.svg";
  CliRun r = Memento(
      "plan reliability --policy durable,replicate,xor,rs:2 --recommend --state-bytes 16G "
      "--host-budget 20G --hw-rate 1e-3 --sw-rate 1e-2 --json --bench " +
          persist + " --goodput-svg " + goodput,
      dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& rec = j["recommendation"];
  EXPECT_EQ(rec["recommended"], "xor");  // replicate (32 GB) and rs:2 (~22 GB) exceed 20 GiB
  EXPECT_DOUBLE_EQ(rec["figures"]["durable_write_bps"].get<double>(), 500.0 * 1048576);
  EXPECT_NE(rec["reason"].get<std::string>().find("replicate excluded"), std::string::npos);
  EXPECT_GT(rec["baseline_durable_only"]["daly_interval_s"].get<double>(), 0);
  EXPECT_EQ(Count(ReadAll(goodput), "<polyline class=\"series\""), 4);

  // The topology path (plan layout's flags) with racks: real plan groups.
  CliRun t = Memento(
      "plan reliability --dp 8 --tp 4 --pp 4 --ranks-per-node 4 --racks 4 "
      "--rack-rate 1e-4 --policy xor,rs:2 --json",
      dir.path());
  ASSERT_EQ(t.code, 0) << t.err;
  auto tj = nlohmann::json::parse(t.out);
  EXPECT_EQ(tj["nodes"], 32);
  EXPECT_EQ(tj["racks"], 4);
}

// The measured figures come from the real `bench persist --json` output, and
// `plan layout --policy auto` ranks by the model with them, within budgets.
TEST(PlanReliabilityCliTest, LayoutAutoUsesTheModelWithMeasuredFigures) {
  memento::testing::ScratchDir dir("plan-reliability");
  const std::string persist = dir.path() + "/persist.json";
  CliRun bp =
      Memento("bench persist --size 4M --reps 1 --dir " + dir.path() + " --json", dir.path());
  ASSERT_EQ(bp.code, 0) << bp.err;
  std::ofstream(persist) << bp.out;
  const auto measured = nlohmann::json::parse(bp.out);
  CliRun rel =
      Memento("plan reliability --nodes 16 --group-size 8 --recommend --json --bench " + persist,
              dir.path());
  ASSERT_EQ(rel.code, 0) << rel.err;
  const auto fig = nlohmann::json::parse(rel.out)["recommendation"]["figures"];
  EXPECT_DOUBLE_EQ(fig["durable_write_bps"].get<double>(),
                   measured["persist_MiB_s"].get<double>() * 1048576);
  EXPECT_DOUBLE_EQ(fig["durable_read_bps"].get<double>(),
                   measured["restore_durable_MiB_s"].get<double>() * 1048576);

  const std::string layout =
      "plan layout --dp 8 --tp 1 --pp 1 --zero 0 --ranks-per-node 1 "
      "--param-bytes 8G --policy auto --json --bench " +
      persist;
  CliRun free = Memento(layout, dir.path());
  ASSERT_EQ(free.code, 0) << free.err;
  auto fj = nlohmann::json::parse(free.out);
  EXPECT_NE(fj["policy"], "auto");
  EXPECT_EQ(fj["auto_ranking"].size(), 4u);
  EXPECT_EQ(fj["auto_ranking"][0]["policy"], fj["policy"]);
  EXPECT_EQ(
      fj["reason"].get<std::string>().rfind("auto chose " + fj["policy"].get<std::string>(), 0), 0u)
      << fj["reason"];
  // 1 GiB unique per node: 1.2 GiB fits xor (S + S/7) only.
  CliRun tight = Memento(layout + " --host-budget 1228M", dir.path());
  ASSERT_EQ(tight.code, 0) << tight.err;
  auto tj = nlohmann::json::parse(tight.out);
  EXPECT_EQ(tj["policy"], "xor") << tj["reason"];
  EXPECT_NE(tj["reason"].get<std::string>().find("replicate excluded: needs"), std::string::npos);
  // The failure rates reach the model (the reason states them; how they turn
  // the choice: model_recommend_test AutoPlanTest.FailureRatesDecide).
  CliRun often = Memento(layout + " --hw-rate 2 --sw-rate 0.01", dir.path());
  ASSERT_EQ(often.code, 0) << often.err;
  EXPECT_NE(nlohmann::json::parse(often.out)["reason"].get<std::string>().find("hardware 2,"),
            std::string::npos);
  // Budgets and rates belong to auto: with another policy they are an error.
  CliRun bad = Memento("plan layout --policy xor --host-budget 1G", dir.path());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--policy auto only"), std::string::npos) << bad.err;
  CliRun launch = Memento("launch --nodes 2 --policy xor --host-budget 1G -- true", dir.path());
  EXPECT_EQ(launch.code, 2);
  EXPECT_NE(launch.err.find("--policy auto only"), std::string::npos) << launch.err;
}

TEST(PlanReliabilityCliTest, SimulatesATrace) {
  memento::testing::ScratchDir dir("plan-reliability");
  const std::string trace = dir.path() + "/trace.txt";
  std::ofstream(trace) << "# seconds kind id\n3600 sw 1\n7200 hw 0\n7300 hw 6\n";
  CliRun r = Memento(
      "plan reliability --nodes 12 --group-size 6 --policy xor --simulate --days 1 --trials 200 "
      "--trace " +
          trace + " --json",
      dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& t = j["simulation"][0]["training"];
  EXPECT_EQ(t["failures"], 3);
  EXPECT_EQ(t["memory_recoveries"], 2);  // sw 1; hw 0 and hw 6 (another group) in one outage
  EXPECT_EQ(t["durable_fallbacks"], 0);
}

TEST(PlanReliabilityCliTest, BadInputExitsTwoNamingIt) {
  memento::testing::ScratchDir dir("plan-reliability");
  CliRun a = Memento(std::string(kFig8) + " --threshold 1.5", dir.path());
  EXPECT_EQ(a.code, 2);
  EXPECT_NE(a.err.find("--threshold"), std::string::npos) << a.err;
  CliRun b = Memento("plan reliability --nodes 10 --group-size 4", dir.path());
  EXPECT_EQ(b.code, 2);
  EXPECT_NE(b.err.find("--group-size 4"), std::string::npos) << b.err;
  CliRun c = Memento("plan reliability --nodes 12 --group-size 4 --policy raid5", dir.path());
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.err.find("raid5"), std::string::npos) << c.err;
  const std::string junk = dir.path() + "/junk.json";
  std::ofstream(junk) << R"({"bench": "codec"})";
  CliRun d =
      Memento("plan reliability --nodes 12 --group-size 4 --recommend --bench " + junk, dir.path());
  EXPECT_EQ(d.code, 2);
  EXPECT_NE(d.err.find(junk), std::string::npos) << d.err;
  const std::string trace = dir.path() + "/bad-trace.txt";
  std::ofstream(trace) << "10 hw 1\n5 hw 2\n";
  CliRun e =
      Memento("plan reliability --nodes 12 --group-size 4 --simulate --trace " + trace, dir.path());
  EXPECT_EQ(e.code, 2);
  EXPECT_NE(e.err.find("line 2"), std::string::npos) << e.err;
}

TEST(PlanReliabilityCliTest, LayoutPictureAndBenchPlan) {
  memento::testing::ScratchDir dir("plan-reliability");
  const std::string svg = dir.path() + "/layout.svg";
  CliRun r = Memento(
      "plan layout --dp 4 --tp 1 --pp 2 --ranks-per-node 1 --policy xor --fail 5 "
      "--svg " +
          svg,
      dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = ReadAll(svg);
  EXPECT_EQ(Count(text, "<g class=\"node"), 8);
  EXPECT_EQ(Count(text, "<g class=\"node lost\""), 1);
  EXPECT_GE(Count(text, "class=\"rebuild\""), 3);

  CliRun b = Memento("bench plan --nodes 1200 --group-size 6 --days 200 --json", dir.path());
  ASSERT_EQ(b.code, 0) << b.err;
  auto j = nlohmann::json::parse(b.out);
  ASSERT_EQ(j["policies"].size(), 4u);
  for (const auto& p : j["policies"]) {
    EXPECT_GE(p["closed_form_s"].get<double>(), 0);
    EXPECT_GT(p["simulated_failures"].get<int64_t>(), 0);
  }
}

}  // namespace
