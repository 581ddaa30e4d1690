// `memento bench peer --aor-rs N` (issue 15, AOR under a reduce-scatter):
// two real peer services on loopback, the 8N-byte shard pushed against the
// 4N-byte gradient slice pushed plus the host AdamW step of N elements.
// Checks the JSON report's shape and bytes, never the timings' values (no
// timed pass/fail on a shared machine).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;

TEST(BenchPeerSmoke, AorRsReportsTheCopyAndTheGradientPushPlusHostStep) {
  auto [rc, out] =
      RunShell(std::string(MEMENTO_CLI_BINARY) + " bench peer --aor-rs 64K --repeat 2 2>/dev/null");
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["bench"], "peer");
  EXPECT_EQ(j["mode"], "aor-rs");
  EXPECT_EQ(j["shard_elems"].get<uint64_t>(), 65536u);
  // AdamW: two fp32 moments per element in the shard, one fp32 gradient.
  EXPECT_EQ(j["copy_bytes"].get<uint64_t>(), 8u * 65536);
  EXPECT_EQ(j["aor_rs_network_bytes"].get<uint64_t>(), 4u * 65536);
  EXPECT_GT(j["copy_s"].get<double>(), 0) << out;
  EXPECT_GT(j["aor_rs_grad_push_s"].get<double>(), 0) << out;
  EXPECT_GT(j["aor_rs_host_step_s"].get<double>(), 0) << out;
  // The best repetition's push + step is at least the two bests.
  EXPECT_GE(j["aor_rs_s"].get<double>() * (1 + 1e-9),
            j["aor_rs_grad_push_s"].get<double>() + j["aor_rs_host_step_s"].get<double>())
      << out;
  EXPECT_NEAR(j["aor_rs_vs_copy"].get<double>(),
              j["aor_rs_s"].get<double>() / j["copy_s"].get<double>(), 1e-9);
}

TEST(BenchPeerSmoke, AorRsOutOfRangeIsRefusedNamingTheFlag) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) + " bench peer --aor-rs 4G 2>&1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--aor-rs"), std::string::npos) << out;
}

}  // namespace
