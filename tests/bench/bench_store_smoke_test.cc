// `memento bench store` end to end at small size: the embedded store and a
// real etcd it starts on loopback (docs/etcd.md). Checks the JSON shape and
// that both stores completed every commit round, never the timings' values
// (no timed pass/fail on a shared machine).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;

TEST(BenchStoreSmoke, BothStoresReport) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) +
                            " bench store --json --ops 10 --nodes 50 --rounds 2 2>/dev/null");
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["bench"], "store");
  for (const char* store : {"embedded", "etcd"}) {
    SCOPED_TRACE(store);
    ASSERT_TRUE(j["stores"].contains(store)) << out;
    const auto& s = j["stores"][store];
    if (std::string(store) == "etcd" && s.contains("error") &&
        s["error"].get<std::string>().find("no etcd server binary") != std::string::npos) {
      GTEST_SKIP() << "no etcd binary: " << s["error"];
    }
    ASSERT_FALSE(s.contains("error")) << out;
    for (const char* k : {"put_ms", "get_ms", "watch_ms", "commit_round_1000_s"}) {
      EXPECT_GT(s[k].get<double>(), 0) << k;
    }
    EXPECT_EQ(s["commit_rounds_s"].size(), 2u);
    EXPECT_EQ(s["nodes"], 50);
  }
}

TEST(BenchStoreSmoke, RefusesBadCounts) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) + " bench store --nodes 0 2>&1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--nodes"), std::string::npos) << out;
}

}  // namespace
