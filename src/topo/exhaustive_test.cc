// Exhaustive check of the planner against real bytes and an independent
// oracle: for every topology up to 16 nodes (every DP x TP x PP factorisation,
// 1..4 ranks per node, ZeRO 0/1 and some ZeRO-3) and every policy,
//  - the plan's protection level equals the level computed here from the
//    topology alone (REFT / Gemini formulas),
//  - every failure set of size <= that level is recoverable, and executing
//    the recipes with the real codec on random bytes rebuilds every lost
//    piece exactly, reading only memory of surviving nodes,
//  - every failure set one larger is reported recoverable exactly when an
//    independent rank computation over GF(2^8) says the surviving pieces,
//    copies and parities determine the lost bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <unordered_map>

#include "codec/erasure_code.h"
#include "codec/reference_codec.h"
#include "common/check.h"
#include "common/test_util.h"
#include "recover/recover.h"
#include "topo/plan.h"
#include "topo/test_tensors.h"

namespace memento::topo {
namespace {

using Bytes = std::vector<uint8_t>;

using test_tensors::Tensor;

// Tiny inventories with odd sizes; replicated tensors identical across the DP
// ranks of a sharding group, different between groups.
struct World {
  Inventory inv;
  std::vector<std::map<std::string, Bytes>> mem;  // rank -> tensor -> bytes
};

World MakeWorld(const Topology& t, std::mt19937_64& rng) {
  World w;
  w.inv.resize(t.num_ranks());
  w.mem.resize(t.num_ranks());
  auto rnd = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  for (int pp = 0; pp < t.pp; ++pp) {
    for (int tp = 0; tp < t.tp; ++tp) {
      std::vector<TensorMeta> repl = {
          Tensor("w", DType::kFloat32, rnd(1, 60), StateClass::kReplicated),
          Tensor("b", DType::kBFloat16, rnd(1, 9), StateClass::kReplicated),
          Tensor("emb", DType::kUInt8, rnd(1, 200), StateClass::kReplicated),
      };
      std::map<std::string, Bytes> repl_bytes;
      for (const TensorMeta& m : repl) {
        Bytes b(m.nbytes());
        for (auto& x : b) x = static_cast<uint8_t>(rng());
        repl_bytes[m.name] = b;
      }
      for (int dp = 0; dp < t.dp; ++dp) {
        const int r = t.Rank(dp, tp, pp);
        w.inv[r] = repl;
        w.mem[r] = repl_bytes;
        std::vector<TensorMeta> own;
        if (t.zero_stage != 0) {
          own.push_back(Tensor("opt", DType::kFloat32, rnd(1, 30), StateClass::kDpSharded));
        }
        own.push_back(Tensor("rng", DType::kUInt8, rnd(1, 20), StateClass::kPrivate));
        for (const TensorMeta& m : own) {
          Bytes b(m.nbytes());
          for (auto& x : b) x = static_cast<uint8_t>(rng());
          w.mem[r][m.name] = b;
          w.inv[r].push_back(m);
        }
      }
    }
  }
  return w;
}

Bytes Gather(const World& w, int rank, const std::vector<Segment>& segs) {
  Bytes out;
  for (const Segment& s : segs) {
    const Bytes& t = w.mem[rank].at(s.tensor);
    EXPECT_LE(s.offset + s.length, t.size());
    out.insert(out.end(), t.begin() + s.offset, t.begin() + s.offset + s.length);
  }
  return out;
}

// ---- independent expectations --------------------------------------------

// Protection level from the topology and policy alone (docs/planner.md).
int ExpectedProtection(const Topology& t, const Policy& p) {
  if (p.scheme == Scheme::kNone) return 0;
  const int num_nodes = t.num_nodes();
  const int peer_copies = p.scheme == Scheme::kPeer ? p.m : p.scheme == Scheme::kRs ? p.f + 1 : 2;
  const int peer = std::min(peer_copies, num_nodes) - 1;
  const int level = p.scheme == Scheme::kRs ? p.f : p.scheme == Scheme::kPeer ? p.m - 1 : 1;
  int best = peer;  // private state is protected by peer copies everywhere
  for (int pp = 0; pp < t.pp; ++pp) {
    for (int tp = 0; tp < t.tp; ++tp) {
      std::vector<int> nodes;
      for (int dp = 0; dp < t.dp; ++dp) nodes.push_back(t.rank_node[t.Rank(dp, tp, pp)]);
      std::sort(nodes.begin(), nodes.end());
      const int n = static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
      int repl;
      if (t.zero_stage == 3 || n == 1) {
        repl = peer;
      } else if (p.local_copy == LocalCopy::kFull) {
        repl = n - 1;
      } else {
        repl = std::min(level, n - 1);
      }
      int dp_level = 1 << 20;
      if (t.zero_stage == 1) {
        dp_level = (n >= 2 && p.scheme != Scheme::kPeer) ? std::min(level, n - 1) : peer;
      } else if (t.zero_stage == 3) {
        dp_level = peer;
      }
      best = std::min({best, repl, dp_level});
    }
  }
  return best;
}

// Whether the surviving holdings determine every lost byte: pieces known from
// any surviving holder; otherwise each non-empty stripe block must lie in the
// row space of the surviving parity rows restricted to the unknown blocks
// (rank computation over GF(2^8) with the reference arithmetic).
bool OracleRecoverable(const Plan& plan, const std::vector<bool>& failed) {
  std::vector<bool> known(plan.pieces.size(), false);
  for (const Piece& p : plan.pieces) known[p.id] = p.bytes == 0 || !failed[p.node];
  for (const Copy& c : plan.copies) {
    if (!failed[c.node]) known[c.piece] = true;
  }
  std::vector<bool> decoded(plan.pieces.size(), true);
  std::vector<bool> in_stripe(plan.pieces.size(), false);
  for (const Stripe& s : plan.stripes) {
    static std::map<std::tuple<bool, int, int>, std::vector<uint8_t>>* matrices =
        new std::map<std::tuple<bool, int, int>, std::vector<uint8_t>>();
    auto key = std::make_tuple(s.xor_code, s.k, s.f);
    auto mit = matrices->find(key);
    if (mit == matrices->end()) {
      mit = matrices->emplace(key, codec::reference::GeneratorMatrix(s.xor_code, s.k, s.f)).first;
    }
    const std::vector<uint8_t>& matrix = mit->second;
    std::vector<int> unknown;
    for (int i = 0; i < s.k; ++i) {
      in_stripe[s.data[i].piece] = true;
      if (s.data[i].length > 0 && !known[s.data[i].piece]) unknown.push_back(i);
    }
    if (unknown.empty()) continue;
    std::vector<uint8_t> a;
    int rows = 0;
    for (int j = 0; j < s.f; ++j) {
      if (failed[plan.parities[s.parities[j]].node]) continue;
      for (int u : unknown) a.push_back(matrix[static_cast<size_t>(s.k + j) * s.k + u]);
      ++rows;
    }
    const int cols = static_cast<int>(unknown.size());
    const int base = codec::reference::Rank(a, rows, cols);
    for (int ui = 0; ui < cols; ++ui) {
      std::vector<uint8_t> b = a;
      for (int c = 0; c < cols; ++c) b.push_back(c == ui ? 1 : 0);
      if (codec::reference::Rank(b, rows + 1, cols) != base) {
        decoded[s.data[unknown[ui]].piece] = false;
      }
    }
  }
  for (const Piece& p : plan.pieces) {
    if (known[p.id]) continue;
    if (!in_stripe[p.id] || !decoded[p.id]) return false;
  }
  return true;
}

// ---- executing recipes on real bytes ---------------------------------------

const codec::ErasureCode& CodeFor(bool xor_code, int k, int f) {
  static std::map<std::tuple<bool, int, int>, codec::ErasureCode>* cache =
      new std::map<std::tuple<bool, int, int>, codec::ErasureCode>();
  auto key = std::make_tuple(xor_code, k, f);
  auto it = cache->find(key);
  if (it == cache->end()) {
    auto code =
        codec::ErasureCode::Create(xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, k, f);
    MEMENTO_CHECK(code.ok());
    it = cache->emplace(key, std::move(*code)).first;
  }
  return it->second;
}

struct Memory {
  std::vector<Bytes> truth;                                   // piece -> bytes
  std::vector<std::unordered_map<uint32_t, Bytes>> pieces;    // node -> piece -> bytes
  std::vector<std::unordered_map<uint32_t, Bytes>> parities;  // node -> parity -> bytes
};

Memory Snapshot(const Plan& plan, const World& w) {
  Memory m;
  m.pieces.resize(plan.nodes.size());
  m.parities.resize(plan.nodes.size());
  for (const Piece& p : plan.pieces) {
    m.truth.push_back(Gather(w, p.rank, p.segments));
    EXPECT_EQ(m.truth.back().size(), p.bytes) << p.key;
    EXPECT_EQ(plan.topology.rank_node[p.rank], p.node) << p.key;
    m.pieces[p.node][p.id] = m.truth.back();
  }
  for (const Copy& c : plan.copies) {
    EXPECT_NE(c.node, plan.pieces[c.piece].node) << "copy on the piece's own node";
    if (c.kind == CopyKind::kArc || c.kind == CopyKind::kLocalFull) {
      // Produced from the node's own replica: the producer rank must live there
      // and hold identical bytes.
      EXPECT_EQ(plan.topology.rank_node[c.producer_rank], c.node);
      m.pieces[c.node][c.piece] = Gather(w, c.producer_rank, plan.pieces[c.piece].segments);
      EXPECT_EQ(m.pieces[c.node][c.piece], m.truth[c.piece]);
    } else {
      // AOR recomputation and peer copies yield the peer's bytes.
      m.pieces[c.node][c.piece] = m.truth[c.piece];
    }
  }
  for (const Stripe& s : plan.stripes) {
    const codec::ErasureCode* code = &CodeFor(s.xor_code, s.k, s.f);
    // Each parity is computed by its producer from its own local bytes.
    for (int j = 0; j < s.f; ++j) {
      const Parity& par = plan.parities[s.parities[j]];
      EXPECT_EQ(plan.topology.rank_node[par.producer_rank], par.node);
      std::vector<Bytes> blocks(s.k, Bytes(s.block_bytes, 0));
      std::vector<const uint8_t*> dp;
      for (int i = 0; i < s.k; ++i) {
        const StripeBlock& b = s.data[i];
        const Bytes local = Gather(w, par.producer_rank, plan.pieces[b.piece].segments);
        std::memcpy(blocks[i].data(), local.data() + b.offset, b.length);
        dp.push_back(blocks[i].data());
        EXPECT_NE(plan.pieces[b.piece].node, par.node) << "parity beside its own data";
      }
      std::vector<Bytes> out(s.f, Bytes(s.block_bytes));
      std::vector<uint8_t*> op;
      for (auto& o : out) op.push_back(o.data());
      code->Encode(s.block_bytes, dp.data(), op.data());
      m.parities[par.node][par.id] = out[j];
    }
  }
  return m;
}

// Runs the recipes reading only surviving nodes; every lost piece must come
// back byte for byte.
void Execute(const Plan& plan, const RecoveryPlan& rec, const Memory& m,
             const std::vector<bool>& failed, const std::string& where) {
  auto fetch_piece = [&](int node, uint32_t piece) -> const Bytes& {
    EXPECT_FALSE(failed[node]) << where << " reads failed node " << node;
    auto it = m.pieces[node].find(piece);
    EXPECT_NE(it, m.pieces[node].end()) << where << " piece " << piece << " not on node " << node;
    return it->second;
  };
  size_t lost = 0;
  for (const Piece& p : plan.pieces) lost += failed[p.node];
  ASSERT_EQ(rec.recipes.size(), lost) << where;
  for (const PieceRecipe& r : rec.recipes) {
    ASSERT_TRUE(r.recoverable) << where << ": " << r.reason;
    const Piece& piece = plan.pieces[r.piece];
    ASSERT_TRUE(failed[piece.node]);
    Bytes rebuilt(piece.bytes, 0xEE);
    std::vector<bool> covered(piece.bytes, false);
    for (const RecoveryStep& s : r.steps) {
      if (s.kind == RecoveryStep::Kind::kCopy) {
        if (s.copy != kNoId) {
          ASSERT_EQ(plan.copies[s.copy].node, s.node);
        }
        rebuilt = fetch_piece(s.node, r.piece);
        std::fill(covered.begin(), covered.end(), true);
        continue;
      }
      const Stripe& st = plan.stripes[s.stripe];
      ASSERT_EQ(static_cast<int>(s.inputs.size()), st.k) << where;
      const codec::ErasureCode* code = &CodeFor(st.xor_code, st.k, st.f);
      std::vector<int> avail;
      std::vector<Bytes> in;
      for (const BlockSource& b : s.inputs) {
        avail.push_back(b.index);
        Bytes blk(st.block_bytes, 0);
        if (b.zero) {
          ASSERT_LT(b.index, st.k);
          ASSERT_EQ(st.data[b.index].length, 0u);
        } else if (b.index < st.k) {
          const Bytes& src = fetch_piece(b.node, b.piece);
          ASSERT_LE(b.offset + b.length, src.size());
          std::memcpy(blk.data(), src.data() + b.offset, b.length);
        } else {
          ASSERT_FALSE(failed[b.node]);
          const auto it = m.parities[b.node].find(b.parity);
          ASSERT_NE(it, m.parities[b.node].end());
          blk = it->second;
        }
        in.push_back(std::move(blk));
      }
      auto dec = code->MakeDecoder(avail, {s.target});
      ASSERT_TRUE(dec.ok()) << dec.status();
      std::vector<const uint8_t*> ip;
      for (auto& b : in) ip.push_back(b.data());
      Bytes out(st.block_bytes);
      uint8_t* op = out.data();
      dec->Decode(st.block_bytes, ip.data(), &op);
      std::memcpy(rebuilt.data() + s.offset, out.data(), s.length);
      for (uint64_t i = s.offset; i < s.offset + s.length; ++i) covered[i] = true;
    }
    ASSERT_TRUE(std::all_of(covered.begin(), covered.end(), [](bool c) { return c; }))
        << where << " " << piece.key << " not fully covered";
    ASSERT_EQ(rebuilt, m.truth[r.piece]) << where << " " << piece.key;
  }
}

// Structural checks that every consumer relies on.
void CheckStructure(const Plan& plan, const std::string& where) {
  for (const Piece& p : plan.pieces) {
    uint64_t sum = 0;
    for (const Segment& s : p.segments) sum += s.length;
    ASSERT_EQ(sum, p.bytes) << where;
  }
  // Stripe blocks of each replicated piece tile it exactly.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> tiles(plan.pieces.size());
  for (const Stripe& s : plan.stripes) {
    ASSERT_EQ(s.block_bytes % kPieceAlignment, 0u);
    std::vector<int> nodes;
    for (const StripeBlock& b : s.data) {
      ASSERT_LE(b.length, s.block_bytes);
      if (b.length) tiles[b.piece].push_back({b.offset, b.length});
      nodes.push_back(plan.pieces[b.piece].node);
    }
    for (uint32_t par : s.parities) nodes.push_back(plan.parities[par].node);
    std::sort(nodes.begin(), nodes.end());
    ASSERT_EQ(std::unique(nodes.begin(), nodes.end()), nodes.end())
        << where << ": stripe " << s.id << " has two blocks on one node";
  }
  for (const Piece& p : plan.pieces) {
    if (tiles[p.id].empty()) continue;
    std::sort(tiles[p.id].begin(), tiles[p.id].end());
    uint64_t at = 0;
    for (auto [off, len] : tiles[p.id]) {
      ASSERT_EQ(off, at) << where;
      ASSERT_EQ(off % kPieceAlignment, 0u);
      at += len;
    }
    ASSERT_EQ(at, p.bytes) << where;
  }
  // Piece boundaries inside a tensor fall on multiples of 64 bytes (so on
  // element boundaries).
  for (const Piece& p : plan.pieces) {
    if (p.kind != PieceKind::kReplicatedShard) continue;
    for (const Segment& s : p.segments) ASSERT_EQ(s.offset % kPieceAlignment, 0u) << where;
  }
}

std::vector<Policy> Policies() {
  std::vector<Policy> out;
  for (const char* name : {"none", "replicate", "xor", "rs:2", "rs:3", "peer:2", "peer:3"}) {
    out.push_back(*ParsePolicy(name));
  }
  Policy full = *ParsePolicy("xor");
  full.local_copy = LocalCopy::kFull;
  out.push_back(full);
  return out;
}

// Calls fn(set) for every subset of {0..n-1} of size exactly `size`.
template <typename Fn>
void ForEachSubset(int n, int size, Fn&& fn) {
  std::vector<int> idx(size);
  for (int i = 0; i < size; ++i) idx[i] = i;
  if (size > n) return;
  while (true) {
    fn(idx);
    int i = size - 1;
    while (i >= 0 && idx[i] == n - size + i) --i;
    if (i < 0) return;
    ++idx[i];
    for (int j = i + 1; j < size; ++j) idx[j] = idx[j - 1] + 1;
  }
}

struct Stats {
  int plans = 0;
  long sets = 0;
  long executed = 0;
};

// Every policy on one topology: protection level, recoverability of every
// failure set up to the level (with bytes), and the verdict on every set one
// larger against the oracle.
void CheckTopology(const Topology& topo, std::mt19937_64& rng, const std::string& label,
                   Stats* stats) {
  const int num_nodes = topo.num_nodes();
  const World world = MakeWorld(topo, rng);
  for (const Policy& policy : Policies()) {
    const std::string where = label + " policy=" + PolicyName(policy) +
                              (policy.local_copy == LocalCopy::kFull ? "+full" : "");
    auto plan = MakePlan(topo, world.inv, policy);
    ASSERT_TRUE(plan.ok()) << where << ": " << plan.status();
    ++stats->plans;
    CheckStructure(*plan, where);
    const int level = ExpectedProtection(topo, policy);
    ASSERT_EQ(plan->protection, level) << where;
    const Memory mem = Snapshot(*plan, world);
    for (int size = 0; size <= std::min(level + 1, num_nodes); ++size) {
      ForEachSubset(num_nodes, size, [&](const std::vector<int>& set) {
        std::vector<bool> failed(num_nodes, false);
        for (int n : set) failed[n] = true;
        auto rec = recover::PlanFailure(*plan, set);
        ASSERT_TRUE(rec.ok()) << rec.status();
        ++stats->sets;
        const bool truth = OracleRecoverable(*plan, failed);
        std::string w = where + " fail=";
        for (int n : set) w += std::to_string(n) + ",";
        if (size <= level) {
          ASSERT_TRUE(truth) << w;
          ASSERT_TRUE(rec->recoverable) << w;
        } else {
          ASSERT_EQ(rec->recoverable, truth) << w;
        }
        // Bytes for every set up to the level; a sample of the larger
        // recoverable ones (their verdict is checked above for all).
        if (rec->recoverable && (size <= level || stats->sets % 16 == 0)) {
          ++stats->executed;
          Execute(*plan, *rec, mem, failed, w);
        } else if (!rec->recoverable) {
          bool any_reason = false;
          for (const PieceRecipe& r : rec->recipes) {
            any_reason |= !r.recoverable && r.reason.find("not recoverable") == 0;
          }
          ASSERT_TRUE(any_reason) << w;
        }
      });
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

class ExhaustiveTest : public ::testing::TestWithParam<int> {};

TEST_P(ExhaustiveTest, EveryTopologyPolicyAndFailureSet) {
  const int num_nodes = GetParam();
  const uint64_t seed = testing::TestSeed("ExhaustiveTest") + num_nodes;
  std::mt19937_64 rng(seed);
  Stats stats;
  for (int rpn = 1; rpn <= 4; ++rpn) {
    const int ranks = num_nodes * rpn;
    for (int dp = 1; dp <= ranks; ++dp) {
      if (ranks % dp) continue;
      for (int tp = 1; tp <= ranks / dp; ++tp) {
        if ((ranks / dp) % tp) continue;
        const int pp = ranks / dp / tp;
        for (int zero : {0, 1, 3}) {
          if (zero == 3 && (rng() % 4)) continue;  // a sample of ZeRO-3
          auto topo = Topology::Uniform(dp, tp, pp, zero, rpn);
          ASSERT_TRUE(topo.ok()) << topo.status();
          if (rng() % 3 == 0) {  // rack labels on some topologies
            topo->node_rack.resize(num_nodes);
            const int racks = 1 + static_cast<int>(rng() % 3);
            for (int n = 0; n < num_nodes; ++n) {
              topo->node_rack[n] = "rack" + std::to_string(n % racks);
            }
          }
          const std::string label = "seed=" + std::to_string(seed) +
                                    " nodes=" + std::to_string(num_nodes) +
                                    " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                                    " pp=" + std::to_string(pp) + " rpn=" + std::to_string(rpn) +
                                    " zero=" + std::to_string(zero);
          CheckTopology(*topo, rng, label, &stats);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  std::fprintf(stderr, "nodes=%d: %d plans, %ld failure sets, %ld executed\n", num_nodes,
               stats.plans, stats.sets, stats.executed);
}

INSTANTIATE_TEST_SUITE_P(Nodes, ExhaustiveTest, ::testing::Range(1, 17));

// Irregular placements: ranks shuffled over nodes (DP replicas partly sharing
// nodes, nodes running different numbers of ranks).
TEST(ExhaustiveRandomMapTest, ShuffledRankToNodeMaps) {
  const uint64_t seed = testing::TestSeed("ExhaustiveRandomMapTest");
  std::mt19937_64 rng(seed);
  Stats stats;
  for (int iter = 0; iter < 150; ++iter) {
    const int dp = 1 + static_cast<int>(rng() % 6);
    const int tp = 1 + static_cast<int>(rng() % 3);
    const int pp = 1 + static_cast<int>(rng() % 3);
    const int ranks = dp * tp * pp;
    const int num_nodes = 1 + static_cast<int>(rng() % std::min(ranks, 10));
    Topology t;
    t.dp = dp;
    t.tp = tp;
    t.pp = pp;
    t.zero_stage = rng() % 2;
    // Every node gets at least one rank, the rest land anywhere.
    t.rank_node.resize(ranks);
    std::vector<int> order(ranks);
    for (int r = 0; r < ranks; ++r) order[r] = r;
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < ranks; ++i) {
      t.rank_node[order[i]] = i < num_nodes ? i : static_cast<int>(rng() % num_nodes);
    }
    if (rng() % 2) {
      t.node_rack.resize(num_nodes);
      for (int n = 0; n < num_nodes; ++n) t.node_rack[n] = "r" + std::to_string(rng() % 3);
    }
    ASSERT_TRUE(t.Validate().ok()) << t.Validate();
    const std::string label = "seed=" + std::to_string(seed) + " iter=" + std::to_string(iter) +
                              " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                              " pp=" + std::to_string(pp) + " nodes=" + std::to_string(num_nodes);
    CheckTopology(t, rng, label, &stats);
    if (HasFatalFailure()) return;
  }
  std::fprintf(stderr, "random maps: %d plans, %ld failure sets, %ld executed\n", stats.plans,
               stats.sets, stats.executed);
}

}  // namespace
}  // namespace memento::topo
