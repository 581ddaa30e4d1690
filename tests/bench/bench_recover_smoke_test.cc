// `memento bench recover` end to end at small size with each coordination
// store: the embedded one and a real etcd it starts on loopback (--store
// etcd, docs/etcd.md). Real agents, a node lost and rebuilt from its peers,
// every byte checked by the bench. Checks the JSON shape and that the
// rebuilt state verified, never the timings' values (no timed pass/fail on
// a shared machine).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;
using memento::bench_testing::StderrFile;
using memento::bench_testing::WorkDir;

nlohmann::json RunBench(const std::string& store, std::string* err_text) {
  const std::string err = StderrFile("memento-bench-recover");
  auto [rc, out] =
      RunShell(std::string(MEMENTO_CLI_BINARY) + " bench recover --json --store " + store +
               " --nodes 3 --state 2M --tcp-bytes 8M --tcp-repeat 1 "
               "--policy replicate 2>" +
               err);
  auto [rc2, text] = RunShell("cat " + err);
  *err_text = "exit " + std::to_string(rc) + "\nstdout: " + out + "\nstderr:\n" + text;
  // Agents, slots, etcd's data and logs are removed.
  const std::string dir = WorkDir(err);
  EXPECT_FALSE(dir.empty()) << *err_text;
  if (!dir.empty()) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  std::filesystem::remove(err);
  if (rc != 0) return nullptr;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nullptr : j;
}

TEST(BenchRecoverSmoke, EmbeddedAndEtcdStoresBothRebuildTheLostNode) {
  for (const char* store : {"embedded", "etcd"}) {
    SCOPED_TRACE(store);
    std::string err;
    nlohmann::json j = RunBench(store, &err);
    if (j.is_null() && std::string(store) == "etcd" &&
        err.find("no etcd server binary") != std::string::npos) {
      GTEST_SKIP() << "no etcd binary: " << err;
    }
    ASSERT_TRUE(j.is_object()) << err;
    EXPECT_EQ(j["bench"], "recover");
    EXPECT_EQ(j["store"], store) << j.dump();
    const std::string url = j["store_url"].get<std::string>();
    EXPECT_EQ(url.rfind(std::string(store) == "etcd" ? "etcd://" : "tcp://", 0), 0u) << url;
    EXPECT_EQ(j["verified"], true);
    EXPECT_EQ(j["nodes"], 3);
    EXPECT_GT(j["lost_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["step"], 1);
    EXPECT_GT(j["recover_s"].get<double>(), 0);
    EXPECT_TRUE(std::isfinite(j["ratio"].get<double>()));
  }
}

TEST(BenchRecoverSmoke, RefusesAnUnknownStore) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) +
                            " bench recover --store zookeeper://x:1 --nodes 2 2>&1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--store 'zookeeper://x:1'"), std::string::npos) << out;
}

}  // namespace
