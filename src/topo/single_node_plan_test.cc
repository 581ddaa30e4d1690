#include "topo/single_node_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "recover/recipe.h"
#include "topo/save_ranges.h"
#include "topo/test_tensors.h"

namespace memento::topo {
namespace {

TensorMeta Tensor(std::string name, int64_t numel, StateClass cls) {
  return test_tensors::Tensor(std::move(name), DType::kFloat32, numel, cls);
}

Inventory MakeInventory(const Topology& t, bool zero1) {
  Inventory inv(t.num_ranks());
  for (auto& r : inv) {
    r.push_back(Tensor("emb", 1000, StateClass::kReplicated));
    r.push_back(Tensor("empty", 0, StateClass::kReplicated));
    r.push_back(Tensor("w", 3333, StateClass::kReplicated));
    if (zero1) r.push_back(Tensor("opt", 700, StateClass::kDpSharded));
    r.push_back(Tensor("rng", 20, StateClass::kPrivate));
  }
  return inv;
}

// Every rank of DP 1-4 x TP 1-2 x PP 1-2, ZeRO 0/1, all on one node: its
// slot holds about 1/D of its group's replicated state (the cut is at
// kPieceAlignment) plus its whole dp_sharded and private state, the D
// ranks' replicated ranges add up to the state exactly once, and the
// pieces tile every rank's tensors (what the restore's assembly checks).
TEST(SingleNodePlanTest, EachDpRankCopiesItsShareOfTheReplicatedState) {
  const uint64_t w = (1000 + 3333) * 4;
  for (int dp : {1, 2, 3, 4}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (int zero : {0, 1}) {
          SCOPED_TRACE(testing::Message()
                       << "dp" << dp << " tp" << tp << " pp" << pp << " zero" << zero);
          auto t = Topology::Uniform(dp, tp, pp, zero, dp * tp * pp);
          ASSERT_TRUE(t.ok()) << t.status();
          const Inventory inv = MakeInventory(*t, zero == 1 && dp > 1);
          auto plan = MakeSingleNodePlan(*t, inv);
          ASSERT_TRUE(plan.ok()) << plan.status();
          EXPECT_TRUE(plan->copies.empty() && plan->parities.empty());
          std::vector<uint64_t> group_repl(plan->groups.size(), 0);
          for (int r = 0; r < t->num_ranks(); ++r) {
            SCOPED_TRACE(testing::Message() << "rank " << r);
            EXPECT_TRUE(recover::CheckPiecesTile(*plan, r, inv[r]).ok());
            auto ranges = RankSaveRanges(*plan, r, inv[r]);
            ASSERT_TRUE(ranges.ok()) << ranges.status();
            uint64_t repl = 0, other = 0;
            for (const Segment& s : *ranges) {
              (s.tensor == "emb" || s.tensor == "w" ? repl : other) += s.length;
            }
            EXPECT_LE(repl, w / dp + kPieceAlignment);
            EXPECT_GE(repl + kPieceAlignment * dp, w / dp);
            EXPECT_EQ(other, 80u + (zero == 1 && dp > 1 ? 2800u : 0u));
            group_repl[plan->ranks[r].group] += repl;
            EXPECT_EQ(CoversEveryTensor(*ranges, inv[r]), dp == 1);
          }
          for (uint64_t g : group_repl) EXPECT_EQ(g, w);
        }
      }
    }
  }
}

TEST(SingleNodePlanTest, RefusesATopologyOfSeveralNodes) {
  auto t = Topology::Uniform(2, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  auto plan = MakeSingleNodePlan(*t, MakeInventory(*t, false));
  ASSERT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("2 nodes"), std::string::npos) << plan.status();
}

}  // namespace
}  // namespace memento::topo
