// `memento bench has --loop trainer` end to end with the tiny trainer preset:
// a real PP 2 trainer job with several micro-batches under each of the five
// modes, real agents and slots. Checks the JSON shape and that every mode
// really ran (snapshots taken, bytes per HAS layer add up, HAS copied bytes),
// never the timings' values (no timed pass/fail on a shared machine).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;
using memento::bench_testing::StderrFile;
using memento::bench_testing::WorkDir;

TEST(BenchHasSmoke, TrainerLoopRunsEveryMode) {
  const std::string err = StderrFile("memento-bench-has");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) +
                          " bench has --json --loop trainer --device cpu --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --pp 2 --micro-batches 4 --trainer-steps 4 --rounds 1"
                          " --chunk-kib 64 --run-timeout 60 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  const std::string dir = WorkDir(err);
  EXPECT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir)) << "agents, slots and logs are removed: " << dir;
  std::filesystem::remove(err);

  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["bench"], "has");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["loop"]["kind"], "trainer");
  EXPECT_EQ(j["loop"]["pp"], 2);
  EXPECT_EQ(j["loop"]["micro_batches"], 4);
  EXPECT_GT(j["loop"]["params"].get<int64_t>(), 10000);
  // Three timed steps per run (the trainer does not time step 1).
  for (const char* m : {"off", "sync", "host", "host_device", "has"}) {
    SCOPED_TRACE(m);
    ASSERT_TRUE(j["modes"].contains(m)) << out;
    const auto& jm = j["modes"][m];
    EXPECT_GT(jm["step_s"].get<double>(), 0);
    EXPECT_TRUE(std::isfinite(jm["overhead_pct"].get<double>()));
    EXPECT_EQ(jm["steps"], 3);
    if (std::string(m) == "off") {
      EXPECT_FALSE(jm.contains("layers"));
      EXPECT_EQ(jm["overhead_pct"].get<double>(), 0.0);
      continue;
    }
    // Every snapshot of both ranks (steps 1..4) was taken and is complete.
    const auto& l = jm["layers"];
    EXPECT_EQ(l["snapshots"].get<double>(), 8.0);
    EXPECT_EQ(l["snapshots_ok"], true);
    const double bytes = l["bytes_per_step"].get<double>();
    EXPECT_GT(bytes, 0);
    EXPECT_NEAR(l["bytes_idle_per_step"].get<double>() + l["bytes_compute_per_step"].get<double>() +
                    l["bytes_communicate_per_step"].get<double>(),
                bytes, 1e-6 * bytes);
    if (std::string(m) != "has") {
      EXPECT_EQ(l["bytes_idle_per_step"].get<double>(), 0.0) << "eager copies know no phases";
    }
  }
  // Every mode snapshots the same state.
  EXPECT_EQ(j["modes"]["has"]["layers"]["bytes_per_step"],
            j["modes"]["host_device"]["layers"]["bytes_per_step"]);
  ASSERT_TRUE(j.contains("has"));
  EXPECT_GT(j["has"]["bytes_per_step"].get<double>(), 0);
  EXPECT_TRUE(j.contains("has_vs_host_device_pct"));
}

TEST(BenchHasSmoke, UnknownModeIsAnError) {
  auto [rc, out] =
      RunShell(std::string(MEMENTO_CLI_BINARY) + " bench has --json --loop trainer --trainer " +
               MEMENTO_TRAINER_BINARY + " --modes off,lazy 2>/dev/null");
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(out.empty()) << out;
}

}  // namespace
