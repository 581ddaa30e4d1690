// Decide + ExecuteAssemblies on real bytes: every node's T0 (the ranks' whole
// state) and T1 (copies; parities computed with the real codec) are built here
// from random rank states; an in-memory ByteReader serves them and refuses
// (and records) any read of a lost node or of bytes a node did not list; the
// executor writes real slots of a shm::NodeStore, which are read back with
// ReadSlot + VerifySlotData and compared byte for byte with the original.
#include "recover/recover.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>

#include "codec/erasure_code.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/test_util.h"
#include "recover/recipe.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "topo/plan.h"

namespace memento::recover {
namespace {

using Bytes = std::vector<uint8_t>;
using RankState = std::map<std::string, Bytes>;  // tensor -> bytes

constexpr char kJob[] = "recjob";

TensorMeta Tensor(std::string name, DType dtype, int64_t numel, StateClass cls) {
  TensorMeta t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = {numel};
  t.state_class = cls;
  return t;
}

Bytes Gather(const RankState& s, const std::vector<topo::Segment>& segs) {
  Bytes out;
  for (const topo::Segment& g : segs) {
    const Bytes& t = s.at(g.tensor);
    out.insert(out.end(), t.begin() + g.offset, t.begin() + g.offset + g.length);
  }
  return out;
}

const codec::ErasureCode& CodeFor(bool xor_code, int k, int f) {
  static auto* cache = new std::map<std::tuple<bool, int, int>, codec::ErasureCode>();
  auto key = std::make_tuple(xor_code, k, f);
  auto it = cache->find(key);
  if (it == cache->end()) {
    auto code =
        codec::ErasureCode::Create(xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, k, f);
    EXPECT_TRUE(code.ok());
    it = cache->emplace(key, std::move(*code)).first;
  }
  return it->second;
}

// One version everywhere in the cluster.
struct Version {
  std::vector<RankState> ranks;                               // T0, by rank
  std::vector<std::unordered_map<uint32_t, Bytes>> copies;    // node -> Copy id -> bytes
  std::vector<std::unordered_map<uint32_t, Bytes>> parities;  // node -> Parity id -> bytes
};

class Cluster {
 public:
  Cluster(const topo::Topology& t, std::mt19937_64& rng) : topo_(t) {
    inv_.resize(t.num_ranks());
    auto rnd = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
    for (int pp = 0; pp < t.pp; ++pp) {
      for (int tp = 0; tp < t.tp; ++tp) {
        const std::vector<TensorMeta> repl = {
            Tensor("w", DType::kFloat32, rnd(50, 700), StateClass::kReplicated),
            Tensor("b", DType::kBFloat16, rnd(1, 40), StateClass::kReplicated),
            Tensor("emb", DType::kUInt8, rnd(1, 1500), StateClass::kReplicated),
        };
        for (int dp = 0; dp < t.dp; ++dp) {
          const int r = t.Rank(dp, tp, pp);
          inv_[r] = repl;
          if (t.zero_stage != 0) {
            inv_[r].push_back(Tensor("opt", DType::kFloat32, rnd(1, 300), StateClass::kDpSharded));
          }
          inv_[r].push_back(Tensor("rng", DType::kUInt8, rnd(1, 40), StateClass::kPrivate));
        }
      }
    }
  }

  const topo::Inventory& inventory() const { return inv_; }

  // Random rank states for `step` (replicated tensors equal across a sharding
  // group) and the redundancy of `plan` computed from them.
  void AddVersion(const topo::Plan& plan, int64_t step, std::mt19937_64& rng) {
    Version v;
    v.ranks.resize(topo_.num_ranks());
    for (int pp = 0; pp < topo_.pp; ++pp) {
      for (int tp = 0; tp < topo_.tp; ++tp) {
        RankState shared;
        for (int dp = 0; dp < topo_.dp; ++dp) {
          const int r = topo_.Rank(dp, tp, pp);
          for (const TensorMeta& m : inv_[r]) {
            const bool repl = m.state_class == StateClass::kReplicated;
            if (repl && shared.count(m.name)) {
              v.ranks[r][m.name] = shared[m.name];
              continue;
            }
            Bytes b(m.nbytes());
            for (auto& x : b) x = static_cast<uint8_t>(rng());
            if (repl) shared[m.name] = b;
            v.ranks[r][m.name] = std::move(b);
          }
        }
      }
    }
    const size_t nodes = plan.nodes.size();
    v.copies.resize(nodes);
    v.parities.resize(nodes);
    for (const topo::Copy& c : plan.copies) {
      const topo::Piece& p = plan.pieces[c.piece];
      // ARC / local copies come from the holder's own replica; AOR and peer
      // copies carry the piece's bytes.
      const bool own_replica =
          c.kind == topo::CopyKind::kArc || c.kind == topo::CopyKind::kLocalFull;
      const int from = own_replica ? c.producer_rank : p.rank;
      v.copies[c.node][c.id] = Gather(v.ranks[from], p.segments);
    }
    for (const topo::Stripe& s : plan.stripes) {
      const codec::ErasureCode& code = CodeFor(s.xor_code, s.k, s.f);
      for (int j = 0; j < s.f; ++j) {
        const topo::Parity& par = plan.parities[s.parities[j]];
        std::vector<Bytes> blocks(s.k, Bytes(s.block_bytes, 0));
        std::vector<const uint8_t*> dp;
        for (int i = 0; i < s.k; ++i) {
          const topo::StripeBlock& b = s.data[i];
          const Bytes local = Gather(v.ranks[par.producer_rank], plan.pieces[b.piece].segments);
          std::memcpy(blocks[i].data(), local.data() + b.offset, b.length);
          dp.push_back(blocks[i].data());
        }
        std::vector<Bytes> out(s.f, Bytes(s.block_bytes));
        std::vector<uint8_t*> op;
        for (auto& o : out) op.push_back(o.data());
        code.Encode(s.block_bytes, dp.data(), op.data());
        v.parities[par.node][par.id] = out[j];
      }
    }
    versions_[step] = std::move(v);
  }

  const Version& version(int64_t step) const { return versions_.at(step); }

  // Every node's full inventory (all versions, newest first).
  std::vector<NodeInventory> Inventories(const topo::Plan& plan, int64_t committed) const {
    const uint64_t hash = PlanHash(plan);
    std::vector<NodeInventory> out;
    for (const topo::NodePlan& np : plan.nodes) {
      NodeInventory inv;
      inv.node = np.node;
      inv.endpoint = "127.0.0.1:" + std::to_string(9000 + np.node);
      inv.plan_hash = hash;
      inv.committed = committed;
      for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
        VersionHolding h;
        h.step = it->first;
        h.ranks = np.ranks;
        h.copies = np.copies;
        h.parities = np.parities;
        inv.versions.push_back(h);
      }
      out.push_back(std::move(inv));
    }
    return out;
  }

 private:
  topo::Topology topo_;
  topo::Inventory inv_;
  std::map<int64_t, Version> versions_;
};

std::vector<NodeInventory> Without(std::vector<NodeInventory> invs, const std::vector<int>& lost) {
  invs.erase(std::remove_if(invs.begin(), invs.end(),
                            [&](const NodeInventory& i) {
                              return std::count(lost.begin(), lost.end(), i.node) > 0;
                            }),
             invs.end());
  return invs;
}

// Serves the bytes of live nodes exactly as listed in their inventories.
class MemoryReader : public ByteReader {
 public:
  MemoryReader(const topo::Plan& plan, const Cluster& cluster, std::vector<NodeInventory> listed)
      : plan_(plan), cluster_(cluster), listed_(std::move(listed)) {}

  void FailNode(int node) { fail_node_ = node; }

  Status Read(int node, const ReadRequest& req, void* dst, Deadline) override {
    MutexLock l(&mu_);
    ++reads_;
    if (node == fail_node_) return UnavailableError("injected: node unreachable");
    const NodeInventory* inv = nullptr;
    for (const NodeInventory& i : listed_) {
      if (i.node == node) inv = &i;
    }
    auto refuse = [&](const std::string& why) {
      violations_.push_back("node " + std::to_string(node) + " " + ToJson(req).dump() + ": " + why);
      return NotFoundError(why);
    };
    if (inv == nullptr) return refuse("lost node");
    const VersionHolding* h = nullptr;
    for (const VersionHolding& v : inv->versions) {
      if (v.step == req.step) h = &v;
    }
    if (h == nullptr) return refuse("step not listed");
    const Version& v = cluster_.version(req.step);
    auto has = [](const auto& vec, auto x) { return std::count(vec.begin(), vec.end(), x) > 0; };
    Bytes bytes;
    switch (req.source.kind) {
      case SourceKind::kPiece: {
        const topo::Piece& p = plan_.pieces.at(req.source.id);
        if (p.node != node || !has(h->ranks, p.rank)) return refuse("piece's rank not listed");
        bytes = Gather(v.ranks[p.rank], p.segments);
        piece_reads_.insert(req.source.id);
        break;
      }
      case SourceKind::kCopy:
        if (plan_.copies.at(req.source.id).node != node || !has(h->copies, req.source.id)) {
          return refuse("copy not listed");
        }
        bytes = v.copies[node].at(req.source.id);
        break;
      case SourceKind::kParity:
        if (plan_.parities.at(req.source.id).node != node || !has(h->parities, req.source.id)) {
          return refuse("parity not listed");
        }
        bytes = v.parities[node].at(req.source.id);
        break;
    }
    if (req.offset > bytes.size() || req.length > bytes.size() - req.offset) {
      return refuse("out of bounds");
    }
    std::memcpy(dst, bytes.data() + req.offset, req.length);
    read_bytes_ += req.length;
    return Status::Ok();
  }

  std::vector<std::string> violations() {
    MutexLock l(&mu_);
    return violations_;
  }
  int reads() {
    MutexLock l(&mu_);
    return reads_;
  }
  std::set<uint32_t> piece_reads() {
    MutexLock l(&mu_);
    return piece_reads_;
  }
  uint64_t read_bytes() {
    MutexLock l(&mu_);
    return read_bytes_;
  }

 private:
  const topo::Plan& plan_;
  const Cluster& cluster_;
  const std::vector<NodeInventory> listed_;
  int fail_node_ = -1;
  Mutex mu_;
  std::vector<std::string> violations_ GUARDED_BY(mu_);
  std::set<uint32_t> piece_reads_ GUARDED_BY(mu_);
  int reads_ GUARDED_BY(mu_) = 0;
  uint64_t read_bytes_ GUARDED_BY(mu_) = 0;
};

std::unique_ptr<shm::NodeStore> OpenStore(const std::string& dir, int node) {
  shm::NodeStoreOptions o;
  o.root = dir + "/node" + std::to_string(node);
  o.job_id = kJob;
  o.node = node;
  auto store = shm::NodeStore::Open(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

// The rank's slot holding `step`, read back, verified and compared with the
// original state byte for byte.
void ExpectSlotHolds(shm::NodeStore& store, int rank, int64_t step, const RankState& want,
                     const std::string& where) {
  int found = 0;
  for (const shm::SlotStatus& s : store.Inventory(rank)) {
    if (s.state != shm::SlotState::kComplete || s.step != step) continue;
    ++found;
    EXPECT_TRUE(s.intact) << where << ": " << s.error;
    auto seg = shm::Segment::Open(shm::SlotPath(store.options().root, rank, s.slot), false);
    ASSERT_TRUE(seg.ok()) << seg.status();
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_TRUE(shm::VerifySlotData(**seg, *info).ok()) << where;
    EXPECT_EQ(info->rank, rank);
    EXPECT_EQ(info->job_id, kJob);
    ASSERT_EQ(info->tensors.size(), want.size()) << where;
    for (const shm::SavedTensor& t : info->tensors) {
      const Bytes& w = want.at(t.meta.name);
      ASSERT_EQ(t.nbytes, w.size()) << where << " " << t.meta.name;
      const uint8_t* got = (*seg)->data() + info->data_offset + t.offset;
      EXPECT_EQ(std::memcmp(got, w.data(), w.size()), 0)
          << where << ": rank " << rank << " tensor " << t.meta.name << " differs";
    }
  }
  EXPECT_EQ(found, 1) << where << ": rank " << rank << " has no complete slot of step " << step;
}

ExecuteOptions SmallWindows() {
  ExecuteOptions o;
  o.window_bytes = 192;  // many units per piece: splitting and parallel reads
  o.read_window_bytes = 192;
  o.chunk_bytes = 1024;
  o.threads = 3;
  return o;
}

// Runs every node's assemblies on fresh stores and checks the rebuilt slots.
void ExecuteAndCheck(const topo::Plan& plan, const Cluster& cluster, const Decision& d,
                     MemoryReader& reader, const std::string& where) {
  testing::ScratchDir dir("recover-test");
  std::map<int, std::vector<RankAssembly>> by_node;
  for (const RankAssembly& a : d.assemblies) by_node[a.node].push_back(a);
  for (const auto& [node, list] : by_node) {
    auto store = OpenStore(dir.path(), node);
    ASSERT_NE(store, nullptr);
    auto stats = ExecuteAssembliesWithOptions(plan, cluster.inventory(), kJob, d.step, list, reader,
                                              *store, Deadline::AfterSeconds(60), SmallWindows());
    ASSERT_TRUE(stats.ok()) << where << ": " << stats.status();
    EXPECT_EQ(stats->ranks.size(), list.size());
    EXPECT_GT(stats->read_bytes, 0u);
    for (const RankAssembly& a : list) {
      ExpectSlotHolds(*store, a.rank, d.step, cluster.version(d.step).ranks[a.rank], where);
    }
  }
  EXPECT_TRUE(reader.violations().empty())
      << where << ": " << (reader.violations().empty() ? "" : reader.violations()[0]);
}

std::vector<int> RanksOn(const topo::Plan& plan, const std::vector<int>& nodes) {
  std::vector<int> out;
  for (int n : nodes) {
    for (int r : plan.nodes[n].ranks) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> AssembledRanks(const Decision& d) {
  std::vector<int> out;
  for (const RankAssembly& a : d.assemblies) out.push_back(a.rank);
  std::sort(out.begin(), out.end());
  return out;
}

// ---- whole-node losses on every topology and policy -------------------------

struct Shape {
  const char* name;
  int dp, tp, pp, zero, ranks_per_node;
};

class NodeLossTest : public ::testing::TestWithParam<std::tuple<Shape, const char*>> {};

TEST_P(NodeLossTest, EveryOneAndTwoNodeLoss) {
  const Shape shape = std::get<0>(GetParam());
  const std::string policy_name = std::get<1>(GetParam());
  const uint64_t seed = testing::TestSeed("NodeLossTest");
  std::mt19937_64 rng(seed);
  auto topo =
      topo::Topology::Uniform(shape.dp, shape.tp, shape.pp, shape.zero, shape.ranks_per_node);
  ASSERT_TRUE(topo.ok()) << topo.status();
  Cluster cluster(*topo, rng);
  auto policy = topo::ParsePolicy(policy_name);
  ASSERT_TRUE(policy.ok());
  auto plan = topo::MakePlan(*topo, cluster.inventory(), *policy);
  ASSERT_TRUE(plan.ok()) << plan.status();
  cluster.AddVersion(*plan, 10, rng);
  const auto all = cluster.Inventories(*plan, 10);
  const int num_nodes = topo->num_nodes();

  // No loss: nothing to rebuild.
  auto none = Decide(*plan, all, 10);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->from_memory);
  EXPECT_EQ(none->step, 10);
  EXPECT_TRUE(none->assemblies.empty());
  EXPECT_NE(none->reason.find("nothing to rebuild"), std::string::npos) << none->reason;

  std::vector<std::vector<int>> sets;
  for (int a = 0; a < num_nodes; ++a) {
    sets.push_back({a});
    for (int b = a + 1; b < num_nodes; ++b) sets.push_back({a, b});
  }
  int recovered = 0;
  for (const std::vector<int>& lost : sets) {
    std::string where =
        std::string(shape.name) + " " + policy_name + " seed=" + std::to_string(seed) + " lost=";
    for (int n : lost) where += std::to_string(n) + ",";
    const auto live = Without(all, lost);
    auto d = Decide(*plan, live, 10);
    ASSERT_TRUE(d.ok()) << where << d.status();
    // The verdict agrees with the plan's own recovery for whole-node losses.
    auto rec = PlanFailure(*plan, lost);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(d->from_memory, rec->recoverable) << where << ": " << d->reason;
    EXPECT_EQ(d->lost_nodes, lost) << where;
    if (lost.size() <= static_cast<size_t>(plan->protection)) {
      EXPECT_TRUE(d->from_memory) << where << ": " << d->reason;
    }
    if (!d->from_memory) {
      EXPECT_EQ(d->reason.rfind("not recoverable from memory", 0), 0u) << d->reason;
      // Names at least one lost piece with its node.
      bool named = false;
      for (int n : lost) {
        for (uint32_t p : plan->nodes[n].pieces) {
          named |= d->reason.find(plan->pieces[p].key + " (node " + std::to_string(n) + ")") !=
                   std::string::npos;
        }
      }
      EXPECT_TRUE(named) << where << ": " << d->reason;
      EXPECT_TRUE(d->assemblies.empty());
      continue;
    }
    ++recovered;
    EXPECT_EQ(d->step, 10);
    EXPECT_EQ(AssembledRanks(*d), RanksOn(*plan, lost)) << where;
    // A fresh agent on an empty root in place of a lost node answers with
    // no versions: the same decision.
    std::vector<NodeInventory> fresh = live;
    for (int n : lost) {
      NodeInventory empty;
      empty.node = n;
      fresh.push_back(empty);
    }
    auto df = Decide(*plan, fresh, 10);
    ASSERT_TRUE(df.ok());
    EXPECT_EQ(DecisionToJson(*df), DecisionToJson(*d)) << where;
    // Through JSON, as the launcher sends it.
    auto back = DecisionFromJson(DecisionToJson(*d));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(DecisionToJson(*back), DecisionToJson(*d));
    MemoryReader reader(*plan, cluster, live);
    ExecuteAndCheck(*plan, cluster, *back, reader, where);
    if (HasFatalFailure()) return;
  }
  if (policy_name != "none") {
    EXPECT_GT(recovered, 0);
  } else {
    EXPECT_EQ(recovered, 0);
  }
}

const Shape kShapes[] = {
    {"dp4", 4, 1, 1, 1, 1},           {"dp2xpp2", 2, 1, 2, 1, 1}, {"dp4xtp2_2pn", 4, 2, 1, 1, 2},
    {"dp4_2pn", 4, 1, 1, 1, 2},        // two DP ranks of one sharding group per node
    {"dp2xpp2_zero0", 2, 1, 2, 0, 1},  // no dp_shard pieces
    {"dp4_zero3", 4, 1, 1, 3, 1},      // no replicated pieces: peer copies only
};

INSTANTIATE_TEST_SUITE_P(Topologies, NodeLossTest,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values("replicate", "xor", "rs:2", "peer:2",
                                                              "none")),
                         [](const ::testing::TestParamInfo<NodeLossTest::ParamType>& info) {
                           std::string p = std::get<1>(info.param);
                           std::replace(p.begin(), p.end(), ':', '_');
                           return std::string(std::get<0>(info.param).name) + "_" + p;
                         });

// ---- the plan tool (memento plan --fail) and recovery agree ------------------

// PlanFailure is what `memento plan --fail` prints; Decide is what recovery
// runs. For whole-node losses with every survivor holding all the plan gives
// it, they must give the same verdict, and for every lost piece the plan
// tool's recipe must name the sources recovery's recipe reads.
TEST(PlanToolTest, PlanToolAgreesWithRecovery) {
  std::mt19937_64 rng(testing::TestSeed("PlanToolTest"));
  struct Case {
    Shape shape;
    const char* policy;
    std::vector<std::vector<int>> failures;
  };
  const Case cases[] = {
      {{"dp4_zero1", 4, 1, 1, 1, 1}, "xor", {{0}, {2}, {0, 1}, {1, 3}}},
      {{"dp6_rs2", 6, 1, 1, 1, 1}, "rs:2", {{0, 1}, {2, 5}, {0, 1, 2}}},
      {{"dp4_tp2_pp2", 4, 2, 2, 1, 2}, "replicate", {{1}, {0, 4}, {3, 7}}},
      {{"dp3_peer", 3, 1, 2, 1, 1}, "peer:2", {{0}, {1, 4}, {0, 3}}},
      {{"dp2_none", 2, 1, 1, 0, 1}, "none", {{1}}},
  };
  for (const Case& c : cases) {
    auto topo = topo::Topology::Uniform(c.shape.dp, c.shape.tp, c.shape.pp, c.shape.zero,
                                        c.shape.ranks_per_node);
    ASSERT_TRUE(topo.ok()) << c.shape.name << ": " << topo.status();
    Cluster cluster(*topo, rng);
    auto plan = topo::MakePlan(*topo, cluster.inventory(), *topo::ParsePolicy(c.policy));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const uint64_t hash = PlanHash(*plan);
    std::vector<NodeInventory> all;
    for (const topo::NodePlan& np : plan->nodes) {
      NodeInventory n;
      n.node = np.node;
      n.plan_hash = hash;
      n.versions.push_back(VersionHolding{10, np.ranks, np.copies, np.parities, {}});
      all.push_back(std::move(n));
    }
    for (const std::vector<int>& lost : c.failures) {
      std::string where = std::string(c.shape.name) + " " + c.policy + " lost=";
      for (int n : lost) where += std::to_string(n) + ",";
      auto tool = PlanFailure(*plan, lost);
      ASSERT_TRUE(tool.ok()) << where << tool.status();
      auto d = Decide(*plan, hash, Without(all, lost), 10);
      ASSERT_TRUE(d.ok()) << where << d.status();
      ASSERT_EQ(tool->recoverable, d->from_memory) << where << ": " << d->reason;
      EXPECT_EQ(tool->failed_nodes, lost) << where;
      if (!d->from_memory) {
        // Every piece the tool cannot rebuild is one recovery names.
        int named = 0;
        for (const topo::PieceRecipe& r : tool->recipes) {
          if (r.recoverable) continue;
          const topo::Piece& p = plan->pieces[r.piece];
          EXPECT_NE(d->reason.find(p.key + " (node " + std::to_string(p.node) + ")"),
                    std::string::npos)
              << where << ": " << p.key << " not in " << d->reason;
          ++named;
        }
        EXPECT_GT(named, 0) << where;
        continue;
      }
      // Recovery's part for each piece, from the recipe of the piece's rank.
      std::map<uint32_t, PiecePart> parts;
      for (const RankAssembly& a : d->assemblies) {
        auto recipe = RecipeFromJson(a.recipe);
        ASSERT_TRUE(recipe.ok()) << recipe.status();
        for (const PiecePart& part : recipe->parts) {
          if (plan->pieces[part.piece].rank == a.rank) parts[part.piece] = part;
        }
      }
      int compared = 0;
      for (const topo::PieceRecipe& r : tool->recipes) {
        ASSERT_TRUE(r.recoverable) << where << ": " << r.reason;
        if (plan->pieces[r.piece].bytes == 0) continue;
        const std::string what = where + " piece " + plan->pieces[r.piece].key;
        ASSERT_EQ(parts.count(r.piece), 1u) << what << ": recovery does not rebuild it";
        const PiecePart& part = parts[r.piece];
        ASSERT_FALSE(r.steps.empty()) << what;
        if (r.steps[0].kind == topo::RecoveryStep::Kind::kCopy) {
          ASSERT_EQ(part.op, PiecePart::Op::kRead) << what;
          ASSERT_EQ(r.steps.size(), 1u) << what;
          EXPECT_EQ(r.steps[0].node, part.read.node) << what;
          EXPECT_EQ(part.read.source.kind, SourceKind::kCopy) << what;
          EXPECT_EQ(r.steps[0].copy, part.read.source.id) << what;
        } else {
          ASSERT_EQ(part.op, PiecePart::Op::kDecode) << what;
          ASSERT_EQ(r.steps.size(), part.blocks.size()) << what;
          for (size_t i = 0; i < r.steps.size(); ++i) {
            const topo::RecoveryStep& st = r.steps[i];
            const DecodeBlock& b = part.blocks[i];
            EXPECT_EQ(st.stripe, b.stripe) << what;
            EXPECT_EQ(st.target, b.target) << what;
            EXPECT_EQ(st.offset, b.offset) << what;
            EXPECT_EQ(st.length, b.length) << what;
            ASSERT_EQ(st.inputs.size(), b.inputs.size()) << what;
            for (size_t k = 0; k < b.inputs.size(); ++k) {
              EXPECT_EQ(st.inputs[k].index, b.inputs[k].index) << what;
              EXPECT_EQ(st.inputs[k].zero, b.inputs[k].zero) << what;
              if (!b.inputs[k].zero) {
                EXPECT_EQ(st.inputs[k].node, b.inputs[k].range.node) << what;
              }
            }
          }
        }
        ++compared;
      }
      EXPECT_GT(compared, 0) << where;
    }
  }
}

// ---- specific cases -----------------------------------------------------------

struct Fixture {
  topo::Topology topo;
  std::unique_ptr<Cluster> cluster;
  topo::Plan plan;
};

Fixture Make(int dp, int tp, int pp, int rpn, const char* policy, std::mt19937_64& rng,
             std::vector<int64_t> steps = {10}) {
  Fixture f;
  f.topo = *topo::Topology::Uniform(dp, tp, pp, 1, rpn);
  f.cluster = std::make_unique<Cluster>(f.topo, rng);
  auto plan = topo::MakePlan(f.topo, f.cluster->inventory(), *topo::ParsePolicy(policy));
  EXPECT_TRUE(plan.ok()) << plan.status();
  f.plan = std::move(*plan);
  for (int64_t s : steps) f.cluster->AddVersion(f.plan, s, rng);
  return f;
}

bool UsesDecode(const Decision& d) {
  for (const RankAssembly& a : d.assemblies) {
    for (const auto& part : a.recipe.at("parts")) {
      if (part.at("op") == "decode") return true;
    }
  }
  return false;
}

TEST(DecideTest, TwoLostNodesInOneShardingGroupUnderRs2) {
  const uint64_t seed = testing::TestSeed("DecideTest.Rs2");
  std::mt19937_64 rng(seed);
  Fixture f = Make(4, 1, 1, 1, "rs:2", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {0, 1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->from_memory) << d->reason;
  EXPECT_TRUE(UsesDecode(*d)) << "rs:2 without two nodes must decode sg0";
  EXPECT_NE(d->reason.find("decode"), std::string::npos) << d->reason;
  std::fprintf(stderr, "reason: %s\n", d->reason.c_str());
  EXPECT_EQ(AssembledRanks(*d), (std::vector<int>{0, 1}));
  MemoryReader reader(f.plan, *f.cluster, live);
  ExecuteAndCheck(f.plan, *f.cluster, *d, reader, "rs2 seed=" + std::to_string(seed));

  // The same loss under xor is beyond protection: the reason names the pieces.
  Fixture x = Make(4, 1, 1, 1, "xor", rng);
  auto dx = Decide(x.plan, Without(x.cluster->Inventories(x.plan, 10), {0, 1}), 10);
  ASSERT_TRUE(dx.ok());
  EXPECT_FALSE(dx->from_memory);
  EXPECT_EQ(dx->step, -1);
  EXPECT_EQ(dx->reason.rfind("not recoverable from memory", 0), 0u) << dx->reason;
  EXPECT_NE(dx->reason.find("sg0/r0 (node 0)"), std::string::npos) << dx->reason;
  EXPECT_NE(dx->reason.find("(node 1)"), std::string::npos) << dx->reason;
  EXPECT_EQ(dx->lost_nodes, (std::vector<int>{0, 1}));
  std::fprintf(stderr, "reason: %s\n", dx->reason.c_str());
}

TEST(DecideTest, CorruptRankOnLiveNodeIsRebuiltFromRedundancy) {
  const uint64_t seed = testing::TestSeed("DecideTest.Corrupt");
  std::mt19937_64 rng(seed);
  Fixture f = Make(4, 2, 1, 2, "xor", rng);  // node n runs ranks 2n (tp 0) and 2n+1 (tp 1)
  auto live = f.cluster->Inventories(f.plan, 10);
  // Node 1's verification found rank 3's slot corrupt: it is not listed.
  auto& ranks = live[1].versions[0].ranks;
  ranks.erase(std::remove(ranks.begin(), ranks.end(), 3), ranks.end());
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->from_memory) << d->reason;
  EXPECT_TRUE(d->lost_nodes.empty());
  ASSERT_EQ(AssembledRanks(*d), std::vector<int>{3});
  EXPECT_EQ(d->assemblies[0].node, 1);
  EXPECT_TRUE(UsesDecode(*d));
  MemoryReader reader(f.plan, *f.cluster, live);
  ExecuteAndCheck(f.plan, *f.cluster, *d, reader, "corrupt seed=" + std::to_string(seed));
  // Rank 3's own pieces were never read from its slot.
  for (uint32_t p : reader.piece_reads()) EXPECT_NE(f.plan.pieces[p].rank, 3) << p;

  // The corrupt rank plus the loss of node 2 (ranks 4 in sg0 and 5 in sg1):
  // sg0 lost one block and is rebuildable, sg1 lost two (rank 3's and rank
  // 5's pieces) under xor, and only sg1's pieces are named.
  auto live2 = Without(live, {2});
  auto d2 = Decide(f.plan, live2, 10);
  ASSERT_TRUE(d2.ok());
  EXPECT_FALSE(d2->from_memory) << d2->reason;
  EXPECT_NE(d2->reason.find("sg1/"), std::string::npos) << d2->reason;
  EXPECT_EQ(d2->reason.find("sg0/"), std::string::npos) << d2->reason;
}

TEST(DecideTest, ChoosesCommittedNotNewer) {
  const uint64_t seed = testing::TestSeed("DecideTest.Committed");
  std::mt19937_64 rng(seed);
  Fixture f = Make(4, 1, 1, 1, "xor", rng, {10, 12});
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {2});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->from_memory) << d->reason;
  EXPECT_EQ(d->step, 10);
  MemoryReader reader(f.plan, *f.cluster, live);
  ExecuteAndCheck(f.plan, *f.cluster, *d, reader, "committed seed=" + std::to_string(seed));
  for (const RankAssembly& a : d->assemblies) EXPECT_EQ(a.recipe.at("step"), 10);

  auto d12 = Decide(f.plan, live, 12);
  ASSERT_TRUE(d12.ok());
  EXPECT_EQ(d12->step, 12);
  // Nothing committed: nothing to restore.
  auto dn = Decide(f.plan, live, -1);
  ASSERT_TRUE(dn.ok());
  EXPECT_FALSE(dn->from_memory);
  EXPECT_NE(dn->reason.find("no live node holds a version"), std::string::npos) << dn->reason;
}

TEST(DecideTest, FallsBackToAnOlderVersionWhenTheNewestIsNotRebuildable) {
  const uint64_t seed = testing::TestSeed("DecideTest.Older");
  std::mt19937_64 rng(seed);
  Fixture f = Make(4, 1, 1, 1, "xor", rng, {10, 12});
  auto live = Without(f.cluster->Inventories(f.plan, 12), {1});
  // Node 2 never finished step 12 (neither T0 nor T1).
  for (NodeInventory& inv : live) {
    if (inv.node == 2) inv.versions.erase(inv.versions.begin());
  }
  auto d = Decide(f.plan, live, 12);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->from_memory) << d->reason;
  EXPECT_EQ(d->step, 10);
  EXPECT_EQ(d->lost_nodes, std::vector<int>{1});
  EXPECT_NE(d->reason.find("newer step 12"), std::string::npos) << d->reason;
  std::fprintf(stderr, "reason: %s\n", d->reason.c_str());
  MemoryReader reader(f.plan, *f.cluster, live);
  ExecuteAndCheck(f.plan, *f.cluster, *d, reader, "older seed=" + std::to_string(seed));
}

TEST(DecideTest, RedundancyOfAnotherPlanIsNotUsed) {
  std::mt19937_64 rng(7);
  Fixture f = Make(4, 1, 1, 1, "xor", rng);
  auto live = Without(f.cluster->Inventories(f.plan, 10), {3});
  auto fresh = Decide(f.plan, live, 10);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(fresh->from_memory) << fresh->reason;
  // Under xor, rebuilding node 3's piece needs the parity node 0 holds (stripe
  // 0). Made under another plan, node 0's redundancy addresses other bytes.
  live[0].plan_hash ^= 1;
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->from_memory) << d->reason;
  EXPECT_NE(d->reason.find("another plan"), std::string::npos) << d->reason;
  EXPECT_NE(d->reason.find("sg0/r3 (node 3)"), std::string::npos) << d->reason;
  EXPECT_EQ(PlanHash(f.plan), PlanHash(f.plan));
  Fixture g = Make(4, 1, 1, 1, "replicate", rng);
  EXPECT_NE(PlanHash(f.plan), PlanHash(g.plan));
}

TEST(DecideTest, RejectsBadInventories) {
  std::mt19937_64 rng(3);
  Fixture f = Make(2, 1, 1, 1, "xor", rng);
  auto live = f.cluster->Inventories(f.plan, 10);
  live[0].node = 7;
  auto d = Decide(f.plan, live, 10);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  live[0].node = 1;
  d = Decide(f.plan, live, 10);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("two inventories"), std::string::npos);
  EXPECT_EQ(DecisionFromJson(nlohmann::json{{"step", 1}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RecipeFromJson(
                nlohmann::json{
                    {"step", 1},
                    {"rank", 0},
                    {"node", 0},
                    {"parts", {{{"piece", 0}, {"key", "x"}, {"bytes", 1}, {"op", "teleport"}}}}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// ---- executor specifics --------------------------------------------------------

// Writes `state` as a complete version of `rank` into slot `slot`, as a
// trainer would.
void WriteSlot(shm::NodeStore& store, const std::vector<TensorMeta>& tensors, int rank, int slot,
               int64_t step, const RankState& state) {
  auto layout = shm::ComputeSlotLayout(kJob, rank, tensors, 1024);
  ASSERT_TRUE(layout.ok());
  auto paths = store.EnsureSlots(rank, layout->total_bytes);
  ASSERT_TRUE(paths.ok());
  auto seg = shm::Segment::Open((*paths)[slot], true);
  ASSERT_TRUE(seg.ok());
  shm::BeginSlotWrite(**seg, *layout, slot, step);
  uint8_t* data = shm::SlotData(**seg);
  for (const shm::SavedTensor& t : layout->tensors) {
    const Bytes& b = state.at(t.meta.name);
    std::memcpy(data + t.offset, b.data(), b.size());
  }
  shm::ChunkEntry* table = shm::SlotTable(**seg);
  for (size_t i = 0; i < layout->chunks.size(); ++i) {
    table[i].checksum = Checksum(data + table[i].offset, table[i].length);
  }
  shm::CompleteSlotWrite(**seg);
  ASSERT_TRUE(store.Verify(rank, slot).ok());
}

TEST(ExecuteTest, AFailingSourceNamesNodeSourceAndStep) {
  std::mt19937_64 rng(11);
  Fixture f = Make(4, 1, 1, 1, "replicate", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory);
  MemoryReader reader(f.plan, *f.cluster, live);
  reader.FailNode(2);
  testing::ScratchDir dir("recover-test");
  auto store = OpenStore(dir.path(), 1);
  auto stats =
      ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                                   *store, Deadline::AfterSeconds(60), SmallWindows());
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status();
  const std::string msg = stats.status().message();
  EXPECT_NE(msg.find("on node 2 at step 10"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("piece ") != std::string::npos || msg.find("copy ") != std::string::npos)
      << msg;
  // The half-written slot is not complete.
  for (const shm::SlotStatus& s : store->Inventory(1)) {
    EXPECT_NE(s.state, shm::SlotState::kComplete) << "slot " << s.slot;
  }
}

TEST(ExecuteTest, KeepsANewerSlotAndSkipsAnIntactOne) {
  std::mt19937_64 rng(13);
  Fixture f = Make(2, 1, 1, 1, "replicate", rng, {10, 20});
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {0});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  testing::ScratchDir dir("recover-test");
  auto store = OpenStore(dir.path(), 0);
  // Slot 0 of rank 0 holds a newer version (20), slot 1 is empty.
  WriteSlot(*store, f.cluster->inventory()[0], 0, 0, 20, f.cluster->version(20).ranks[0]);
  MemoryReader reader(f.plan, *f.cluster, live);
  auto stats =
      ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                                   *store, Deadline::AfterSeconds(60), SmallWindows());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->ranks, std::vector<int>{0});
  EXPECT_GT(stats->bytes, 0u);
  ExpectSlotHolds(*store, 0, 10, f.cluster->version(10).ranks[0], "rebuilt");
  ExpectSlotHolds(*store, 0, 20, f.cluster->version(20).ranks[0], "kept");
  // Again: step 10 is already there, nothing is read or written.
  const int reads = reader.reads();
  auto again =
      ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                                   *store, Deadline::AfterSeconds(60), SmallWindows());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->ranks.empty());
  EXPECT_EQ(reader.reads(), reads);
  ExpectSlotHolds(*store, 0, 20, f.cluster->version(20).ranks[0], "kept again");
  const nlohmann::json j = AssemblyStatsToJson(*stats);
  EXPECT_TRUE(j.contains("transfer_s") && j.contains("decode_s") && j.contains("write_s"));
}

TEST(ExecuteTest, RejectsAssembliesForAnotherNodeOrTamperedRecipes) {
  std::mt19937_64 rng(17);
  Fixture f = Make(4, 1, 1, 1, "xor", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory);
  MemoryReader reader(f.plan, *f.cluster, live);
  testing::ScratchDir dir("recover-test");
  auto other = OpenStore(dir.path(), 2);
  auto st = ExecuteAssemblies(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                              *other, Deadline::AfterSeconds(60));
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status();
  auto store = OpenStore(dir.path(), 1);
  st = ExecuteAssemblies(f.plan, f.cluster->inventory(), kJob, 11, d->assemblies, reader, *store,
                         Deadline::AfterSeconds(60));
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status();
  // A recipe that drops a piece would leave bytes unwritten: refused.
  auto tampered = d->assemblies;
  tampered[0].recipe["parts"].erase(0);
  st = ExecuteAssemblies(f.plan, f.cluster->inventory(), kJob, 10, tampered, reader, *store,
                         Deadline::AfterSeconds(60));
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status();
  EXPECT_EQ(reader.reads(), 0);
  // A deadline already past: nothing is read.
  st = ExecuteAssemblies(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader, *store,
                         Deadline(Now()));
  EXPECT_EQ(st.status().code(), StatusCode::kDeadlineExceeded) << st.status();
  EXPECT_EQ(reader.reads(), 0);
  // The default options (4 MiB windows and chunks) rebuild the same bytes.
  auto ok = ExecuteAssemblies(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                              *store, Deadline::AfterSeconds(60));
  ASSERT_TRUE(ok.ok()) << ok.status();
  ExpectSlotHolds(*store, 1, 10, f.cluster->version(10).ranks[1], "default options");
}

TEST(ExecuteTest, APieceTwoRanksNeedIsFetchedOnce) {
  std::mt19937_64 rng(23);
  Fixture f = Make(4, 1, 1, 2, "replicate", rng);  // node 0 runs ranks 0 and 1 (both sg0)
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {0});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  ASSERT_EQ(AssembledRanks(*d), (std::vector<int>{0, 1}));
  uint64_t want = 0;  // every piece of sg0 once, plus both ranks' own pieces
  for (const topo::Piece& p : f.plan.pieces) {
    const bool replicated = p.kind == topo::PieceKind::kReplicatedShard;
    if ((replicated && p.group == 0) || (!replicated && (p.rank == 0 || p.rank == 1))) {
      want += p.bytes;
    }
  }
  testing::ScratchDir dir("recover-test");
  auto store = OpenStore(dir.path(), 0);
  MemoryReader reader(f.plan, *f.cluster, live);
  auto stats =
      ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                                   *store, Deadline::AfterSeconds(60), SmallWindows());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->read_bytes, want);
  for (int r : {0, 1}) {
    ExpectSlotHolds(*store, r, 10, f.cluster->version(10).ranks[r], "rank " + std::to_string(r));
  }
}

// Under xor, the decode of a lost piece needs the other data blocks of its
// stripes: pieces the rebuilt rank fetches whole anyway. They are taken from
// the slot once fetched, not read a second time.
TEST(ExecuteTest, XorDecodeTakesFetchedPiecesFromTheSlot) {
  std::mt19937_64 rng(29);
  Fixture f = Make(4, 1, 1, 1, "xor", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  ASSERT_TRUE(UsesDecode(*d));
  uint64_t read[2] = {0, 0};
  for (bool reuse : {false, true}) {
    testing::ScratchDir dir("recover-test");
    auto store = OpenStore(dir.path(), 1);
    MemoryReader reader(f.plan, *f.cluster, live);
    ExecuteOptions o = SmallWindows();
    o.reuse_fetched_inputs = reuse;
    auto stats =
        ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies,
                                     reader, *store, Deadline::AfterSeconds(60), o);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(reader.violations().empty());
    EXPECT_EQ(stats->read_bytes, reader.read_bytes());
    read[reuse] = stats->read_bytes;
    ExpectSlotHolds(*store, 1, 10, f.cluster->version(10).ranks[1], reuse ? "reuse" : "no reuse");
  }
  EXPECT_LT(read[1], read[0]) << "decode inputs fetched twice";
  std::fprintf(stderr, "xor rebuild read %llu bytes, %llu without reusing fetched pieces\n",
               static_cast<unsigned long long>(read[1]), static_cast<unsigned long long>(read[0]));
}

// A reader that reports the digest of every read (as the agent's reader
// reports the chunk checksums a peer sent), optionally wrong.
class DigestReader : public ByteReader {
 public:
  DigestReader(MemoryReader& inner, bool lie) : inner_(inner), lie_(lie) {}
  Status Read(int node, const ReadRequest& req, void* dst, Deadline d) override {
    return inner_.Read(node, req, dst, d);
  }
  Status ReadWithDigests(int node, const ReadRequest& req, void* dst, Deadline d,
                         const DigestFn& on_digest) override {
    MEMENTO_RETURN_IF_ERROR(inner_.Read(node, req, dst, d));
    if (on_digest) on_digest(0, req.length, Checksum(dst, req.length) ^ (lie_ ? 1 : 0));
    return Status::Ok();
  }

 private:
  MemoryReader& inner_;
  const bool lie_;
};

// Chunk checksums taken from arrival digests end up in the slot. The final
// verification trusts them (ByteReader::DigestFn: checked against the bytes
// as they arrived) unless trust_arrival_digests is off; a reader that broke
// that contract (a digest that does not match) gives a slot that the full
// check (NodeStore::Verify: scrub, inventories with verify, the trainer's
// Restore) refuses, and with trust off the executor refuses it itself.
TEST(ExecuteTest, ChunkChecksumsFromArrivalDigestsAreVerified) {
  std::mt19937_64 rng(31);
  Fixture f = Make(4, 1, 1, 1, "replicate", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  ExecuteOptions o;
  o.chunk_bytes = uint64_t{1} << 30;        // one chunk per tensor
  o.read_window_bytes = uint64_t{1} << 30;  // one read per (piece, tensor) extent
  o.threads = 2;
  bool any_lie_landed = false;
  for (bool lie : {false, true}) {
    for (bool trust : {false, true}) {  // false first: it tells whether a lie landed
      testing::ScratchDir dir("recover-test");
      auto store = OpenStore(dir.path(), 1);
      MemoryReader inner(f.plan, *f.cluster, live);
      DigestReader reader(inner, lie);
      o.trust_arrival_digests = trust;
      auto stats =
          ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies,
                                       reader, *store, Deadline::AfterSeconds(60), o);
      if (!lie) {
        ASSERT_TRUE(stats.ok()) << stats.status();
        ExpectSlotHolds(*store, 1, 10, f.cluster->version(10).ranks[1], "honest digests");
        continue;
      }
      // Whether a wrong digest lands on a whole chunk depends on the random
      // tensor sizes.
      if (!trust) {
        if (!stats.ok()) {
          any_lie_landed = true;
          EXPECT_EQ(stats.status().code(), StatusCode::kDataLoss) << stats.status();
        }
        for (const shm::SlotStatus& s : store->Inventory(1)) {
          EXPECT_FALSE(s.state == shm::SlotState::kComplete && s.intact && !stats.ok())
              << "slot " << s.slot;
        }
        continue;
      }
      ASSERT_TRUE(stats.ok()) << stats.status();
      for (const shm::SlotStatus& s : store->Inventory(1)) {
        if (s.state != shm::SlotState::kComplete) continue;
        Status full = store->Verify(1, s.slot);
        if (any_lie_landed) {
          EXPECT_EQ(full.code(), StatusCode::kDataLoss) << full;
        }
      }
    }
  }
  std::fprintf(stderr, "a wrong arrival digest was %s\n",
               any_lie_landed ? "caught by the full verification" : "not on a whole chunk");
}

// Under xor the lost piece is decoded: its chunks' checksums are computed
// here, not checked on arrival, and the final verification hashes them
// again. A byte that changes after the checksums were written (here: a test
// hook just before COMPLETE) is caught; the slot is never intact.
TEST(ExecuteTest, ADecodedChunkCorruptedBeforeCompleteIsCaught) {
  std::mt19937_64 rng(37);
  Fixture f = Make(4, 1, 1, 1, "xor", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  ASSERT_TRUE(UsesDecode(*d));
  // Decoded chunks hashed after the fetch phase (chunks larger than a decode
  // window), and hashed by the decode units right after decoding (64-byte
  // chunks: windows end at chunk boundaries and cover whole chunks).
  const std::vector<std::pair<uint64_t, bool>> cases = {
      {1024, false}, {1024, true}, {64, false}, {64, true}};
  for (const auto& [chunk, corrupt] : cases) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk << (corrupt ? ", corrupted" : ""));
    testing::ScratchDir dir("recover-test");
    auto store = OpenStore(dir.path(), 1);
    MemoryReader inner(f.plan, *f.cluster, live);
    DigestReader reader(inner, /*lie=*/false);
    ExecuteOptions o = SmallWindows();
    o.chunk_bytes = chunk;
    int hooked = 0;
    o.before_complete = [&](int rank, const shm::Segment& seg) {
      ++hooked;
      EXPECT_EQ(rank, 1);
      if (!corrupt) return;
      // One byte in every chunk: the decoded ones are among them.
      uint8_t* data = shm::SlotData(seg);
      const shm::ChunkEntry* table = shm::SlotTable(seg);
      const uint64_t n = reinterpret_cast<const shm::SlotHeader*>(seg.data())->num_chunks;
      for (uint64_t c = 0; c < n; ++c) {
        if (table[c].length > 0) data[table[c].offset + table[c].length / 2] ^= 0x04;
      }
    };
    auto stats =
        ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies,
                                     reader, *store, Deadline::AfterSeconds(60), o);
    EXPECT_EQ(hooked, 1);
    if (!corrupt) {
      ASSERT_TRUE(stats.ok()) << stats.status();
      ExpectSlotHolds(*store, 1, 10, f.cluster->version(10).ranks[1], "not corrupted");
      continue;
    }
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kDataLoss) << stats.status();
    for (const shm::SlotStatus& s : store->Inventory(1)) {
      EXPECT_FALSE(s.intact) << "slot " << s.slot;
    }
  }
}

// A reader that reports when the first read starts and then never returns
// (until the process is killed).
class StallingReader : public ByteReader {
 public:
  StallingReader(MemoryReader& inner, int fd) : inner_(inner), fd_(fd) {}
  Status Read(int node, const ReadRequest& req, void* dst, Deadline d) override {
    MEMENTO_RETURN_IF_ERROR(inner_.Read(node, req, dst, d));
    if (reads_.fetch_add(1) == 3) {
      char c = 'x';
      if (write(fd_, &c, 1) != 1) _exit(3);
      for (;;) pause();
    }
    return Status::Ok();
  }

 private:
  MemoryReader& inner_;
  const int fd_;
  std::atomic<int> reads_{0};
};

// A rebuild killed mid-way (SIGKILL of the process running the executor,
// after some bytes landed in the slot) leaves nothing that looks complete:
// a store opened on the node afterwards adopts no complete slot of the rank
// and Decide would rebuild it again.
TEST(ExecuteTest, ARebuildKilledMidWayLeavesNoCompleteSlot) {
  std::mt19937_64 rng(41);
  Fixture f = Make(4, 1, 1, 1, "xor", rng);
  const auto live = Without(f.cluster->Inventories(f.plan, 10), {1});
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  testing::ScratchDir dir("recover-test");
  {
    auto store = OpenStore(dir.path(), 1);  // creates the root
    ASSERT_NE(store, nullptr);
  }
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    auto store = OpenStore(dir.path(), 1);
    MemoryReader inner(f.plan, *f.cluster, live);
    StallingReader reader(inner, pipefd[1]);
    auto stats =
        ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies,
                                     reader, *store, Deadline::AfterSeconds(60), SmallWindows());
    _exit(stats.ok() ? 4 : 5);  // never reached: the reader stalls
  }
  close(pipefd[1]);
  char c = 0;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1) << "the child never started reading";
  close(pipefd[0]);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  auto store = OpenStore(dir.path(), 1);  // adoption after the crash
  ASSERT_NE(store, nullptr);
  auto inv = store->Inventory(1);
  ASSERT_FALSE(inv.empty()) << "the slot being rebuilt should exist";
  for (const shm::SlotStatus& s : inv) {
    EXPECT_NE(s.state, shm::SlotState::kComplete) << "slot " << s.slot;
    EXPECT_FALSE(s.intact) << "slot " << s.slot;
  }
  // Rebuilding again works over the torn slot.
  MemoryReader reader(f.plan, *f.cluster, live);
  auto stats =
      ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                                   *store, Deadline::AfterSeconds(60), SmallWindows());
  ASSERT_TRUE(stats.ok()) << stats.status();
  ExpectSlotHolds(*store, 1, 10, f.cluster->version(10).ranks[1], "rebuilt after the kill");
  EXPECT_EQ(store->Inventory(1).size(), 1u) << "only the rebuilt slot is allocated";
}

TEST(ExecuteTest, RebuildsIntoTheCorruptSlotAndKeepsAnOlderIntactOne) {
  std::mt19937_64 rng(19);
  Fixture f = Make(2, 1, 1, 1, "replicate", rng, {8, 10});
  testing::ScratchDir dir("recover-test");
  auto store = OpenStore(dir.path(), 1);
  WriteSlot(*store, f.cluster->inventory()[1], 1, 0, 8, f.cluster->version(8).ranks[1]);
  WriteSlot(*store, f.cluster->inventory()[1], 1, 1, 10, f.cluster->version(10).ranks[1]);
  {  // A bit flips in step 10's data.
    auto seg = shm::Segment::Open(shm::SlotPath(store->options().root, 1, 1), true);
    ASSERT_TRUE(seg.ok());
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok());
    (*seg)->data()[info->data_offset + info->tensors[0].offset] ^= 0x10;
  }
  auto live = f.cluster->Inventories(f.plan, 10);
  // Node 1's verification dropped rank 1 at step 10.
  ASSERT_EQ(live[1].versions[0].step, 10);
  live[1].versions[0].ranks.clear();
  auto d = Decide(f.plan, live, 10);
  ASSERT_TRUE(d.ok() && d->from_memory) << d->reason;
  ASSERT_EQ(AssembledRanks(*d), std::vector<int>{1});
  MemoryReader reader(f.plan, *f.cluster, live);
  auto stats =
      ExecuteAssembliesWithOptions(f.plan, f.cluster->inventory(), kJob, 10, d->assemblies, reader,
                                   *store, Deadline::AfterSeconds(60), SmallWindows());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->ranks, std::vector<int>{1});
  ExpectSlotHolds(*store, 1, 10, f.cluster->version(10).ranks[1], "rebuilt over the corrupt slot");
  ExpectSlotHolds(*store, 1, 8, f.cluster->version(8).ranks[1], "older version kept");
}

}  // namespace
}  // namespace memento::recover

namespace memento::recover {
namespace {

// A plan of 1024 ranks on 128 nodes: decisions stay exact (and quick) at a
// size where every node loss touches 8 sharding groups of 32 nodes each.
TEST(DecideTest, LargePlan) {
  auto topo = topo::Topology::Uniform(32, 8, 4, 1, 8);
  ASSERT_TRUE(topo.ok());
  topo::Inventory inv(topo->num_ranks());
  for (int r = 0; r < topo->num_ranks(); ++r) {
    inv[r] = {Tensor("w", DType::kBFloat16, 4096, StateClass::kReplicated),
              Tensor("opt", DType::kFloat32, 777, StateClass::kDpSharded),
              Tensor("rng", DType::kUInt8, 16, StateClass::kPrivate)};
  }
  auto plan = topo::MakePlan(*topo, inv, *topo::ParsePolicy("xor"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  Stopwatch hash_sw;
  const uint64_t hash = PlanHash(*plan);
  std::fprintf(stderr, "PlanHash of 1024 ranks: %.3f s (not asserted)\n", hash_sw.Seconds());
  std::vector<NodeInventory> all;
  for (const topo::NodePlan& np : plan->nodes) {
    NodeInventory n;
    n.node = np.node;
    n.plan_hash = hash;
    for (int64_t step : {30, 20}) {
      n.versions.push_back(VersionHolding{step, np.ranks, np.copies, np.parities, {}});
    }
    all.push_back(std::move(n));
  }
  for (const std::vector<int>& lost : std::vector<std::vector<int>>{{5}, {5, 40}, {5, 6}}) {
    Stopwatch sw;
    auto d = Decide(*plan, hash, Without(all, lost), 30);
    const double s = sw.Seconds();
    ASSERT_TRUE(d.ok()) << d.status();
    auto rec = PlanFailure(*plan, lost);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(d->from_memory, rec->recoverable) << d->reason.substr(0, 300);
    if (d->from_memory) {
      EXPECT_EQ(d->step, 30);
      EXPECT_EQ(AssembledRanks(*d), RanksOn(*plan, lost));
      for (const RankAssembly& a : d->assemblies) {
        auto r = RecipeFromJson(a.recipe);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_FALSE(r->parts.empty());
      }
    }
    std::fprintf(stderr, "1024 ranks, lost %zu node(s): from_memory=%d in %.3f s (not asserted)\n",
                 lost.size(), d->from_memory, s);
  }
}

}  // namespace
}  // namespace memento::recover

namespace memento::recover {
namespace {

// Random partial holdings: nodes lose ranks' T0 slots and T1 entries
// independently, some nodes are gone. Whatever Decide plans must read only
// listed bytes (the reader refuses anything else) and rebuild every rank that
// is not listed, byte for byte.
class PartialHoldingsTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PartialHoldingsTest, RecipesReadOnlyListedBytes) {
  const Shape shape = GetParam();
  const uint64_t seed = testing::TestSeed("PartialHoldingsTest");
  std::mt19937_64 rng(seed);
  auto topo =
      topo::Topology::Uniform(shape.dp, shape.tp, shape.pp, shape.zero, shape.ranks_per_node);
  ASSERT_TRUE(topo.ok());
  Cluster cluster(*topo, rng);
  int recovered = 0, refused = 0;
  for (const char* policy_name : {"replicate", "xor", "rs:2", "peer:2"}) {
    auto plan = topo::MakePlan(*topo, cluster.inventory(), *topo::ParsePolicy(policy_name));
    ASSERT_TRUE(plan.ok()) << plan.status();
    cluster.AddVersion(*plan, 10, rng);
    for (int trial = 0; trial < 12; ++trial) {
      const std::string where = std::string(shape.name) + " " + policy_name +
                                " seed=" + std::to_string(seed) + " trial=" + std::to_string(trial);
      auto coin = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
      std::vector<NodeInventory> live;
      std::set<int> listed_ranks;
      for (NodeInventory& inv : cluster.Inventories(*plan, 10)) {
        if (coin(15)) continue;  // node gone
        VersionHolding& h = inv.versions[0];
        auto thin = [&](auto& v, int percent) {
          v.erase(std::remove_if(v.begin(), v.end(), [&](auto) { return coin(percent); }), v.end());
        };
        thin(h.ranks, 12);
        thin(h.copies, 20);
        thin(h.parities, 20);
        listed_ranks.insert(h.ranks.begin(), h.ranks.end());
        live.push_back(std::move(inv));
      }
      auto d = Decide(*plan, live, 10);
      ASSERT_TRUE(d.ok()) << where << d.status();
      if (!d->from_memory) {
        ++refused;
        EXPECT_EQ(d->reason.rfind("not recoverable from memory", 0), 0u) << where;
        continue;
      }
      ++recovered;
      std::vector<int> missing;
      for (int r = 0; r < topo->num_ranks(); ++r) {
        if (!listed_ranks.count(r)) missing.push_back(r);
      }
      EXPECT_EQ(AssembledRanks(*d), missing) << where;
      MemoryReader reader(*plan, cluster, live);
      ExecuteAndCheck(*plan, cluster, *d, reader, where);
      if (HasFatalFailure()) return;
    }
  }
  std::fprintf(stderr, "%s: %d recovered, %d not recoverable\n", shape.name, recovered, refused);
  EXPECT_GT(recovered, 0);
}

INSTANTIATE_TEST_SUITE_P(Topologies, PartialHoldingsTest, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace memento::recover
