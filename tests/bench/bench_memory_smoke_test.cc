// `memento bench memory` end to end with the tiny trainer preset (4 nodes,
// DP 4, ZeRO 0 and 1, replicate and xor): the JSON shape, and what must hold
// on any save path: the T1 bytes every node holds are the plan's copies and
// parities (plus the redundancy files' headers), the T0 bytes copied per step
// lie between the plan's pieces (REFT) and the ranks' whole state, and the
// plan's pieces are about 1/m of the replicated state (run with whole slots,
// --no-sharded); sharded (the default) the T0 bytes are the plan's ranges.
// No timing is checked.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "bench_smoke_util.h"

namespace {

using memento::bench_testing::RunShell;
using memento::bench_testing::StderrFile;

TEST(BenchMemorySmoke, ReportsHostBytesAgainstThePlan) {
  const std::string err = StderrFile("bench-memory");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench memory --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --steps 6 --cases dp4 --zero 0,1"
                          " --policies replicate,xor --no-sharded 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out << "\n(stderr in " << err << ")";
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["bench"], "memory");
  ASSERT_EQ(j["cases"].size(), 4u) << out;
  for (const auto& c : j["cases"]) {
    SCOPED_TRACE(c["case"].get<std::string>());
    for (const char* k :
         {"host_bytes_per_node", "reft_bytes_per_node", "copy_bytes_per_step",
          "full_copy_bytes_per_step", "plan_copy_bytes_per_step", "resident_bytes_per_node"}) {
      ASSERT_TRUE(c.contains(k)) << k;
      EXPECT_GT(c[k].get<uint64_t>(), 0u) << k;
    }
    EXPECT_GE(c["committed_step"].get<int64_t>(), 1);
    const double ratio = c["ratio"].get<double>();
    EXPECT_NEAR(ratio,
                static_cast<double>(c["host_bytes_per_node"].get<uint64_t>()) /
                    c["reft_bytes_per_node"].get<uint64_t>(),
                1e-9);
    ASSERT_EQ(c["nodes"].size(), 4u);
    for (const auto& n : c["nodes"]) {
      SCOPED_TRACE("node " + std::to_string(n["node"].get<int>()));
      const uint64_t t1 = n["t1_bytes"], t0 = n["t0_bytes"];
      const uint64_t plan_t1 =
          n["plan_copy_bytes"].get<uint64_t>() + n["plan_parity_bytes"].get<uint64_t>();
      // T1 is the plan's redundancy; each red.<step> entry adds a header and
      // rounds to 4 KiB. ARC copies are resident in the producer's T0 slot
      // (docs/reft.md section 4): counted once, in T0, and reported apart.
      const uint64_t resident = n["t1_resident_bytes"];
      EXPECT_GE(t1 + resident, plan_t1);
      EXPECT_LE(t1 + resident, plan_t1 + 64 * 1024);
      if (c["policy"] == "replicate") {
        EXPECT_GT(resident, 0u) << "ARC copies should reference T0";
      } else {
        EXPECT_EQ(resident, 0u);
      }
      EXPECT_GE(t0, n["plan_piece_bytes"].get<uint64_t>());
      EXPECT_LE(t0, n["full_copy_bytes_per_step"].get<uint64_t>());
      EXPECT_GE(n["resident_bytes"].get<uint64_t>(), t0 + t1);
    }
    // Under ZeRO 0 everything but the RNG blob and cursor is replicated: the
    // node's own piece is about a quarter of its rank's state (REFT's 1/m).
    if (c["zero"] == 0) {
      const double piece = c["plan_copy_bytes_per_step"].get<uint64_t>();
      const double full = c["full_copy_bytes_per_step"].get<uint64_t>();
      EXPECT_NEAR(piece / full, 0.25, 0.02);
    }
  }
}

// Sharded snapshots (docs/reft.md sections 1 and 6): under ARC over DP 4
// without ZeRO a rank copies its own quarter of the replicated state and its
// ring neighbour's, so T0 per step is about half of the whole state (the
// private blobs are whole), still at least the plan's pieces, and the whole
// state reported is the same as without sharding (from the plan, not from
// the sharded slot's manifest).
TEST(BenchMemorySmoke, ShardedSlotsCopyThePlanRangesOnly) {
  const std::string err = StderrFile("bench-memory-sharded");
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) + " bench memory --json --trainer " +
                          MEMENTO_TRAINER_BINARY +
                          " --preset tiny --steps 6 --cases dp4 --zero 0 --policies replicate"
                          " --sharded 2>" +
                          err;
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out << "\n(stderr in " << err << ")";
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["cases"].size(), 1u) << out;
  const auto& c = j["cases"][0];
  EXPECT_TRUE(c["sharded"].get<bool>());
  for (const auto& n : c["nodes"]) {
    SCOPED_TRACE("node " + std::to_string(n["node"].get<int>()));
    const double t0 = n["t0_bytes"].get<uint64_t>();
    const double full = n["full_copy_bytes_per_step"].get<uint64_t>();
    const double piece = n["plan_piece_bytes"].get<uint64_t>();
    EXPECT_NEAR(piece / full, 0.25, 0.02);  // the whole state, not the slot's
    EXPECT_GE(t0, piece);
    EXPECT_NEAR(t0 / full, 0.5, 0.03);
  }
}

TEST(BenchMemorySmoke, RefusesAnUnknownCase) {
  auto [rc, out] = RunShell(std::string(MEMENTO_CLI_BINARY) + " bench memory --cases dp3 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("dp3"), std::string::npos) << out;
}

}  // namespace
