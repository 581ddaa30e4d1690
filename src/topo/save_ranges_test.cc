#include "topo/save_ranges.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "topo/test_tensors.h"

namespace memento::topo {
namespace {

using test_tensors::Tensor;

Inventory MakeInventory(const Topology& t, bool zero1) {
  Inventory inv(t.num_ranks());
  for (auto& r : inv) {
    r.push_back(Tensor("emb", DType::kFloat32, 1000, StateClass::kReplicated));
    r.push_back(Tensor("empty", DType::kFloat32, 0, StateClass::kReplicated));
    r.push_back(Tensor("w", DType::kFloat32, 3333, StateClass::kReplicated));
    if (zero1) {
      TensorMeta o = Tensor("opt", DType::kFloat32, 700, StateClass::kDpSharded);
      r.push_back(o);
    }
    r.push_back(Tensor("rng", DType::kUInt8, 77, StateClass::kPrivate));
  }
  return inv;
}

// Byte maps per tensor: the bytes a rank needs (an oracle written from the
// plan's definitions, independent of RankSaveRanges' merging).
using Bytes = std::map<std::string, std::vector<bool>>;

void Mark(Bytes& b, const Piece& p, uint64_t off, uint64_t len) {
  uint64_t pos = 0;
  for (const Segment& s : p.segments) {
    for (uint64_t i = 0; i < s.length; ++i) {
      if (pos + i >= off && pos + i < off + len) b[s.tensor][s.offset + i] = true;
    }
    pos += s.length;
  }
}

TEST(SaveRangesTest, EveryRankHoldsExactlyWhatItsPiecesCopiesAndParitiesRead) {
  int cases = 0;
  for (int dp : {1, 2, 3, 4}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (int zero : {0, 1}) {
          for (const char* pol : {"none", "replicate", "xor", "rs:2", "peer:2"}) {
            auto t = Topology::Uniform(dp, tp, pp, zero, tp);  // one (pp, dp) per node
            ASSERT_TRUE(t.ok()) << t.status();
            const Inventory inv = MakeInventory(*t, zero == 1);
            auto policy = ParsePolicy(pol);
            ASSERT_TRUE(policy.ok());
            auto plan = MakePlan(*t, inv, *policy);
            if (!plan.ok()) continue;  // a policy this topology cannot carry
            ++cases;
            for (int r = 0; r < t->num_ranks(); ++r) {
              SCOPED_TRACE(testing::Message() << "dp" << dp << " tp" << tp << " pp" << pp << " zero"
                                              << zero << " " << pol << " rank " << r);
              Bytes want;
              for (const TensorMeta& m : inv[r]) want[m.name].assign(m.nbytes(), false);
              for (const Piece& p : plan->pieces) {
                if (p.rank == r) Mark(want, p, 0, p.bytes);
              }
              for (const Copy& c : plan->copies) {
                if (c.producer_rank == r &&
                    (c.kind == CopyKind::kArc || c.kind == CopyKind::kLocalFull)) {
                  Mark(want, plan->pieces[c.piece], 0, plan->pieces[c.piece].bytes);
                }
              }
              for (const Parity& par : plan->parities) {
                if (par.producer_rank != r) continue;
                for (const StripeBlock& b : plan->stripes[par.stripe].data) {
                  Mark(want, plan->pieces[b.piece], b.offset, b.length);
                }
              }
              auto ranges = RankSaveRanges(*plan, r, inv[r]);
              ASSERT_TRUE(ranges.ok()) << ranges.status();
              Bytes got;
              for (const TensorMeta& m : inv[r]) got[m.name].assign(m.nbytes(), false);
              std::map<std::string, uint64_t> last_end;
              size_t order = 0;
              for (const Segment& s : *ranges) {
                // Registration order, ranges by offset, never touching.
                while (order < inv[r].size() && inv[r][order].name != s.tensor) ++order;
                ASSERT_LT(order, inv[r].size()) << "out of registration order: " << s.tensor;
                if (last_end.count(s.tensor)) EXPECT_GT(s.offset, last_end[s.tensor]);
                last_end[s.tensor] = s.offset + s.length;
                ASSERT_LE(s.offset + s.length, got[s.tensor].size());
                for (uint64_t i = 0; i < s.length; ++i) got[s.tensor][s.offset + i] = true;
              }
              EXPECT_EQ(got, want);
              EXPECT_TRUE(last_end.count("empty")) << "a zero-byte tensor is listed";
              // One rank per sharding group (DP 1): every tensor whole.
              if (dp == 1) EXPECT_TRUE(CoversEveryTensor(*ranges, inv[r]));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 40);
}

// ARC over DP 4: a member copies its own quarter of the replicated state and
// its ring neighbour's (2W/m), plus its whole private state.
TEST(SaveRangesTest, ArcOverFourMembersCopiesHalfTheReplicatedState) {
  auto t = Topology::Uniform(4, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  const Inventory inv = MakeInventory(*t, false);
  auto plan = MakePlan(*t, inv, *ParsePolicy("replicate"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint64_t w = (1000 + 3333) * 4;
  for (int r = 0; r < 4; ++r) {
    auto ranges = RankSaveRanges(*plan, r, inv[r]);
    ASSERT_TRUE(ranges.ok());
    uint64_t replicated = 0, priv = 0;
    for (const Segment& s : *ranges) (s.tensor == "rng" ? priv : replicated) += s.length;
    EXPECT_NEAR(static_cast<double>(replicated), 2.0 * w / 4, 2 * kPieceAlignment) << r;
    EXPECT_EQ(priv, 77u);
    EXPECT_FALSE(CoversEveryTensor(*ranges, inv[r]));
  }
}

TEST(SaveRangesTest, BadInputIsNamed) {
  auto t = Topology::Uniform(2, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  const Inventory inv = MakeInventory(*t, false);
  auto plan = MakePlan(*t, inv, *ParsePolicy("xor"));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(RankSaveRanges(*plan, 2, inv[0]).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RankSaveRanges(*plan, -1, inv[0]).status().code(), StatusCode::kInvalidArgument);
  std::vector<TensorMeta> fewer = inv[0];
  fewer.erase(fewer.begin());  // "emb"
  Status st = RankSaveRanges(*plan, 0, fewer).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'emb', which the rank does not register"), std::string::npos)
      << st;
  std::vector<TensorMeta> shorter = inv[0];
  shorter[2].shape = {10};
  st = RankSaveRanges(*plan, 0, shorter).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("of tensor 'w', which has 40 bytes"), std::string::npos) << st;
}

}  // namespace
}  // namespace memento::topo
