// Exhaustive check of the sharded save path (issue 15 "Tests"; docs/reft.md
// section 7): for every small topology (DP 1-4 x TP 1-2 x PP 1-2, ZeRO 0/1,
// one or two ranks per node) and every policy (replicate, xor, rs:2, peer:2;
// under ZeRO-1 the optimizer shards get the plan's AOR copies), the whole
// path with the functions the agent and the client run:
//
//   1. each rank asks the `plan` op's answer (agent::PlanReplyFor, what
//      JobMember::SaveRanges replies) and lays out its T0 slot from it as the
//      client does (shm::PlanEntrySpecs, shm::ComputeRangeSlotLayout); the
//      slot is written through the shm slot API with real chunk checksums;
//   2. every node produces its T1 with the agent's T1Producer (parities and
//      ARC copies from its own slots, peer / AOR copies pushed over the
//      authenticated transport to the holders' real PeerServices);
//   3. every single node (and under rs:2 every pair of nodes) is lost: its
//      memory is deleted and an empty node takes its place; the survivors'
//      inventories (kPeerInventory over the transport) go to recover::Decide,
//      and each node with ranks to rebuild gets kPeerRecover (the executor
//      reads pieces, copies and parities from the peers and decodes);
//   4. every rank restores as the client does: from its own slot when it
//      holds whole tensors, else through the agent's `assemble` (AssembleRank)
//      of its sharding group's pieces; every tensor must equal the state the
//      failure-free run had, byte for byte.
//
// Two versions are saved (steps 4 and 5, different bytes), so a rebuild that
// mixed versions is caught. A failure set within the plan's protection level
// must be rebuilt from memory; beyond it, whatever Decide says it can rebuild
// must come back exact. Real NodeStores and redundancy stores on /dev/shm,
// real sockets; no trainer processes (cluster_sharded_test runs those).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "agent/assemble.h"
#include "agent/cluster_test_util.h"
#include "agent/peer_service.h"
#include "agent/redundancy_shm.h"
#include "agent/t1_producer.h"
#include "common/checksum.h"
#include "fmt/format.h"
#include "model/auto_plan.h"
#include "net/peer_protocol.h"
#include "recover/recover.h"
#include "shm/agent_messages.h"
#include "shm/shm_test_util.h"
#include "topo/save_ranges.h"

namespace memento::agent {
namespace {

using testing::kChunkBytes;
using testing::kJob;
using testing::Tensor;
using Bytes = std::vector<uint8_t>;

Deadline Soon() { return Deadline::AfterSeconds(30); }

net::JobToken Token() {
  auto t = net::JobToken::FromSecret("sharded-exhaustive-test-secret-0123456789");
  MEMENTO_CHECK(t.ok());
  return *t;
}

struct Case {
  int dp, tp, pp, zero, ranks_per_node;
  std::string policy;
  std::string Name() const {
    return fmt::format("dp{}tp{}pp{}z{}rpn{}-{}", dp, tp, pp, zero, ranks_per_node, policy);
  }
};

// A job's registered tensors and its state at each step: the replicated
// tensors are identical across the DP ranks of a sharding group (as after an
// all-reduce) and differ between groups and steps; the optimizer shards
// (ZeRO-1) and the private state differ per rank. Sizes are odd and differ
// per group, so pieces cut tensors at odd places and span tensors.
struct World {
  topo::Topology topology;
  topo::Inventory inv;
  uint64_t seed = 0;
  std::map<int64_t, std::vector<std::map<std::string, Bytes>>> mem;  // step -> rank -> tensor

  const Bytes& Of(int64_t step, int rank, const std::string& tensor) const {
    return mem.at(step).at(rank).at(tensor);
  }
  // The state at `step` (a pure function of the seed and the step); steps
  // below `keep_from` are forgotten.
  void Generate(int64_t step, int64_t keep_from) {
    mem.erase(mem.begin(), mem.lower_bound(keep_from));
    const topo::Topology& t = topology;
    std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ULL));
    auto& at = mem[step];
    at.assign(t.num_ranks(), {});
    std::map<std::pair<int, std::string>, Bytes> group_bytes;  // (sg, tensor) -> bytes
    for (int r = 0; r < t.num_ranks(); ++r) {
      const int sg = t.PpIndex(r) * t.tp + t.TpIndex(r);
      for (const TensorMeta& m : inv[r]) {
        Bytes fresh(m.nbytes());
        for (auto& x : fresh) x = static_cast<uint8_t>(rng());
        if (m.state_class == StateClass::kReplicated) {
          auto [it, added] = group_bytes.emplace(std::make_pair(sg, m.name), fresh);
          at[r][m.name] = it->second;
        } else {
          at[r][m.name] = std::move(fresh);
        }
      }
    }
  }
};

World MakeWorld(const topo::Topology& t, uint64_t seed) {
  World w;
  w.topology = t;
  w.seed = seed;
  w.inv.resize(t.num_ranks());
  std::mt19937_64 rng(seed);
  auto rnd = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  for (int pp = 0; pp < t.pp; ++pp) {
    for (int tp = 0; tp < t.tp; ++tp) {
      const std::vector<TensorMeta> repl = {
          Tensor("w", DType::kFloat32, rnd(300, 1500), StateClass::kReplicated),
          Tensor("b", DType::kBFloat16, rnd(1, 40), StateClass::kReplicated),
          Tensor("emb", DType::kUInt8, rnd(1, 3000), StateClass::kReplicated),
      };
      for (int dp = 0; dp < t.dp; ++dp) {
        const int r = t.Rank(dp, tp, pp);
        w.inv[r] = repl;
        if (t.zero_stage != 0) {
          w.inv[r].push_back(Tensor("opt", DType::kFloat32, rnd(1, 900), StateClass::kDpSharded));
        }
        w.inv[r].push_back(Tensor("rng", DType::kUInt8, rnd(1, 64), StateClass::kPrivate));
      }
    }
  }
  return w;
}

// Every node of a job: a NodeStore and a redundancy store on /dev/shm, a
// PeerService on an ephemeral port, and the agent's T1Producer.
class Cluster {
 public:
  Cluster(const World& w, std::shared_ptr<const ClusterPlan> cp) : w_(w), cp_(std::move(cp)) {
    const int n = w.topology.num_nodes();
    for (int node = 0; node < n; ++node) {
      nodes_.emplace_back(std::make_unique<Node>());
      Start(node, dir_.path() + "/node" + std::to_string(node));
    }
  }
  ~Cluster() {
    for (auto& n : nodes_) {
      if (n->service) n->service->Stop();
    }
  }

  const topo::Plan& plan() const { return cp_->plan; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }

  // Every rank writes its slot `slot` at `step` from the plan op's ranges.
  // Returns the T0 data bytes written and the ranks' whole state bytes.
  void Save(int64_t step, int slot, uint64_t* t0_bytes, uint64_t* whole_bytes) {
    for (int r = 0; r < w_.topology.num_ranks(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      auto reply = PlanReplyFor(*cp_, r, /*sharded=*/true);
      ASSERT_TRUE(reply.ok()) << reply.status();
      std::vector<shm::SlotEntrySpec> specs;
      if (reply->sharded) {
        std::vector<size_t> entry_tensor;
        auto s = shm::PlanEntrySpecs(*reply, w_.inv[r], &entry_tensor);
        ASSERT_TRUE(s.ok()) << s.status();
        specs = std::move(*s);
      } else {
        for (const TensorMeta& t : w_.inv[r]) specs.push_back(shm::SlotEntrySpec{t});
      }
      auto layout = shm::ComputeRangeSlotLayout(kJob, r, specs, kChunkBytes);
      ASSERT_TRUE(layout.ok()) << layout.status();
      Node& nd = node(w_.topology.rank_node[r]);
      auto paths = nd.store->EnsureSlots(r, layout->total_bytes);
      ASSERT_TRUE(paths.ok()) << paths.status();
      auto seg = shm::Segment::Open((*paths)[slot], /*writable=*/true);
      ASSERT_TRUE(seg.ok()) << seg.status();
      shm::BeginSlotWrite(**seg, *layout, slot, step);
      uint8_t* data = shm::SlotData(**seg);
      uint64_t whole = 0;
      for (const TensorMeta& t : w_.inv[r]) whole += t.nbytes();
      for (const shm::SavedTensor& t : layout->tensors) {
        const Bytes& src = w_.Of(step, r, t.meta.name);
        ASSERT_LE(t.range_offset + t.nbytes, src.size());
        std::memcpy(data + t.offset, src.data() + t.range_offset, t.nbytes);
      }
      shm::ChunkEntry* table = shm::SlotTable(**seg);
      for (size_t i = 0; i < layout->chunks.size(); ++i) {
        table[i].checksum = Checksum(data + table[i].offset, table[i].length);
      }
      shm::CompleteSlotWrite(**seg);
      // A sharded slot holds exactly the ranges, fewer bytes than the state.
      uint64_t ranges = 0, held = 0;
      for (const shm::SaveRange& sr : reply->ranges) ranges += sr.length;
      for (const shm::SavedTensor& t : layout->tensors) held += t.nbytes;
      if (reply->sharded) {
        EXPECT_EQ(held, ranges);
        EXPECT_LT(held, whole);
      } else {
        EXPECT_EQ(held, whole);
      }
      *t0_bytes += held;
      *whole_bytes += whole;
    }
  }

  // Every node's T1 of `step`, as JobMember::Produce makes it.
  void ProduceT1(int64_t step) {
    for (int n = 0; n < num_nodes(); ++n) {
      SCOPED_TRACE("node " + std::to_string(n));
      Node& nd = node(n);
      std::map<int, RankSlotView> views;
      for (int r = 0; r < w_.topology.num_ranks(); ++r) {
        if (w_.topology.rank_node[r] != n) continue;
        RankSlotView v;
        v.rank = r;
        for (int slot = 0; slot < shm::kSlotsPerRank && v.slot < 0; ++slot) {
          auto seg = nd.store->SlotSegment(r, slot);
          if (seg == nullptr) continue;
          auto info = shm::ReadSlot(*seg);
          if (info.ok() && info->state == shm::SlotState::kComplete && info->step == step) {
            v.slot = slot;
            v.segment = std::move(seg);
            v.info = std::move(*info);
          }
        }
        ASSERT_GE(v.slot, 0) << "rank " << r << " has no slot of step " << step;
        ASSERT_TRUE(shm::VerifySlotData(*v.segment, v.info).ok());
        views.emplace(r, std::move(v));
      }
      nd.red->DropBelow(step - 1);  // the versions of earlier rounds
      ASSERT_TRUE(nd.red->Ensure(step).ok());
      Status st = nd.producer->ProduceEntries(step, views);
      ASSERT_TRUE(st.ok()) << st;
      st = nd.producer->PushCopies(
          step, views, 20, [] { return true; }, [](uint64_t) {});
      ASSERT_TRUE(st.ok()) << st;
    }
    for (int n = 0; n < num_nodes(); ++n) {
      Deadline d = Soon();
      while (!node(n).red->Complete(step) && !d.expired()) usleep(1000);
      ASSERT_TRUE(node(n).red->Complete(step)) << "node " << n << " T1 of step " << step;
    }
  }

  // The node is lost and replaced: its memory is gone, an empty node with a
  // new peer service takes its place.
  void Lose(int n) {
    Node& nd = *nodes_[n];
    nd.launcher.reset();
    nd.service->Stop();
    nd.service.reset();
    nd.producer.reset();
    nd.red.reset();
    nd.store.reset();
    memento::testing::RemoveTree(nd.root);
    Start(n, nd.root + "-replaced");
  }

  recover::NodeInventory InventoryOf(int n) {
    auto client = Connect(n);
    auto reply = client->Call(net::kPeerInventory, R"({"verify": true})", Soon());
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {};
    auto inv = recover::NodeInventoryFromJson(nlohmann::json::parse(*reply));
    EXPECT_TRUE(inv.ok()) << inv.status();
    return inv.ok() ? *inv : recover::NodeInventory{};
  }

  // kPeerRecover on each node of `d`'s assemblies, as the launcher sends it.
  void Rebuild(const recover::Decision& d) {
    std::map<int, nlohmann::json> by_node;
    for (const recover::RankAssembly& a : d.assemblies) {
      by_node[a.node].push_back({{"rank", a.rank}, {"node", a.node}, {"recipe", a.recipe}});
    }
    for (const auto& [n, assemblies] : by_node) {
      auto reply = Connect(n)->Call(
          net::kPeerRecover,
          nlohmann::json{{"step", d.step}, {"plan_hash", cp_->hash}, {"assemblies", assemblies}}
              .dump(),
          Soon());
      ASSERT_TRUE(reply.ok()) << "node " << n << ": " << reply.status();
    }
  }

  // What `rank` restores at `step`, as the client reads it
  // (client::RestoreVersion): its own slot when it holds whole tensors, the
  // agent's assembly of its pieces otherwise. Every chunk verified.
  void ExpectRestores(int rank, int64_t step, bool* via_assembly) {
    SCOPED_TRACE(fmt::format("rank {} at step {}", rank, step));
    const int n = w_.topology.rank_node[rank];
    Node& nd = node(n);
    shm::RankSlots slots{};
    std::shared_ptr<shm::Segment> held[shm::kSlotsPerRank];
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      held[s] = nd.store->SlotSegment(rank, s);
      slots[s] = held[s].get();
    }
    auto found = shm::FindCompleteSlot(slots, step);
    ASSERT_TRUE(found.ok()) << found.status();
    ASSERT_TRUE(shm::VerifySlotData(*held[found->slot], found->info).ok());
    std::unique_ptr<shm::Segment> staged;
    const shm::Segment* seg = held[found->slot].get();
    shm::SlotInfo info = found->info;
    *via_assembly = shm::HasRangeEntries(info.tensors);
    if (*via_assembly) {
      auto reply = AssembleRank(*cp_, kJob, rank, step, nd.service->reader(), *nd.store, Soon());
      ASSERT_TRUE(reply.ok()) << reply.status();
      auto opened = shm::Segment::Open(reply->path, /*writable=*/false);
      ASSERT_TRUE(opened.ok()) << opened.status();
      staged = std::move(*opened);
      ASSERT_EQ(unlink(reply->path.c_str()), 0);
      auto sinfo = shm::ReadSlot(*staged);
      ASSERT_TRUE(sinfo.ok()) << sinfo.status();
      ASSERT_EQ(sinfo->state, shm::SlotState::kComplete);
      ASSERT_EQ(sinfo->step, step);
      ASSERT_EQ(sinfo->rank, rank);
      ASSERT_TRUE(shm::VerifySlotData(*staged, *sinfo).ok());
      seg = staged.get();
      info = std::move(*sinfo);
    }
    ASSERT_EQ(info.tensors.size(), w_.inv[rank].size());
    const uint8_t* data = seg->data() + info.data_offset;
    for (size_t i = 0; i < info.tensors.size(); ++i) {
      const shm::SavedTensor& t = info.tensors[i];
      ASSERT_EQ(t.meta.name, w_.inv[rank][i].name);
      ASSERT_TRUE(t.whole()) << shm::EntryName(t);
      const Bytes& want = w_.Of(step, rank, t.meta.name);
      ASSERT_EQ(t.nbytes, want.size()) << t.meta.name;
      EXPECT_EQ(0, std::memcmp(data + t.offset, want.data(), want.size()))
          << "tensor '" << t.meta.name << "' differs from the failure-free state";
    }
  }

 private:
  struct Node {
    std::string root;
    std::unique_ptr<shm::NodeStore> store;
    std::unique_ptr<ShmRedundancyStore> red;
    std::unique_ptr<PeerService> service;
    std::unique_ptr<T1Producer> producer;
    std::unique_ptr<net::RpcClient> launcher;
  };
  Node& node(int i) { return *nodes_[i]; }

  // The launcher's connection to node n's peer service (kept until the node
  // is lost).
  net::RpcClient* Connect(int n) {
    std::unique_ptr<net::RpcClient>& c = node(n).launcher;
    if (c == nullptr || c->broken()) {
      auto hp = net::ParseHostPort(node(n).service->endpoint(), net::PortUse::kConnect);
      MEMENTO_CHECK(hp.ok());
      auto made = net::RpcClient::Connect(hp->host, hp->port, token_, Soon());
      MEMENTO_CHECK(made.ok());
      c = std::move(made).value();
    }
    return c.get();
  }

  void Start(int n, const std::string& root) {
    Node* nd = nodes_[n].get();
    nd->root = root;
    auto store = shm::NodeStore::Open({root, kJob, n, 0});
    ASSERT_TRUE(store.ok()) << store.status();
    nd->store = std::move(store).value();
    auto red = ShmRedundancyStore::OpenShm(root, n);
    ASSERT_TRUE(red.ok()) << red.status();
    nd->red = std::move(red).value();
    ASSERT_TRUE(nd->red->SetPlan(cp_->plan).ok());
    PeerServiceOptions o;
    o.job = kJob;
    o.node = n;
    o.store = nd->store.get();
    o.redundancy = nd->red.get();
    o.plan = [this]() -> Result<std::shared_ptr<const ClusterPlan>> { return cp_; };
    o.endpoint_of = [this](int peer) { return EndpointOf(peer); };
    o.set_restore_target = [](int64_t, uint64_t) { return Status::Ok(); };
    auto svc = PeerService::Start(std::move(o), token_);
    ASSERT_TRUE(svc.ok()) << svc.status();
    nd->service = std::move(svc).value();
    nd->producer = std::make_unique<T1Producer>(&cp_->plan, n, nd->red.get(), &token_,
                                                [this](int peer) { return EndpointOf(peer); });
  }

  Result<std::string> EndpointOf(int peer) {
    if (peer < 0 || peer >= num_nodes() || !nodes_[peer]->service) {
      return NotFoundError("no node " + std::to_string(peer));
    }
    return nodes_[peer]->service->endpoint();
  }

  const World& w_;
  const std::shared_ptr<const ClusterPlan> cp_;
  const net::JobToken token_ = Token();
  shm::testing::ShmScratchDir dir_{"memento-sharded"};
  std::vector<std::unique_ptr<Node>> nodes_;
};

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (int dp = 1; dp <= 4; ++dp) {
    for (int tp = 1; tp <= 2; ++tp) {
      for (int pp = 1; pp <= 2; ++pp) {
        for (int zero : {0, 1}) {
          const int world = dp * tp * pp;
          for (int rpn : {1, 2}) {
            // Two ranks per node: TP pairs (or DP pairs at TP 1) share a node;
            // a job on one node has no cluster plan.
            if (rpn == 2 && (world % 2 != 0 || world < 4)) continue;
            if (world / rpn < 2) continue;
            for (const char* policy : {"replicate", "xor", "rs:2", "peer:2"}) {
              out.push_back(Case{dp, tp, pp, zero, rpn, policy});
            }
          }
        }
      }
    }
  }
  return out;
}

// The failure sets of a case: every node; under rs:2 also every pair of
// nodes, except that with more than 8 nodes the default run takes only the
// pairs that share a sharding group (the pairs rs:2 is for) and 6 others
// drawn from the seed; MEMENTO_SHARDED_FULL=1 (the chaos-labelled run)
// takes every pair.
std::vector<std::vector<int>> FailureSets(const Case& c, const topo::Topology& t, uint64_t seed) {
  const int n = t.num_nodes();
  std::vector<std::vector<int>> sets;
  for (int a = 0; a < n; ++a) sets.push_back({a});
  if (c.policy != "rs:2") return sets;
  const bool full = std::getenv("MEMENTO_SHARDED_FULL") != nullptr;
  std::set<std::pair<int, int>> group_pairs;
  for (int r1 = 0; r1 < t.num_ranks(); ++r1) {
    for (int r2 = 0; r2 < t.num_ranks(); ++r2) {
      if (t.PpIndex(r1) == t.PpIndex(r2) && t.TpIndex(r1) == t.TpIndex(r2) &&
          t.rank_node[r1] < t.rank_node[r2]) {
        group_pairs.emplace(t.rank_node[r1], t.rank_node[r2]);
      }
    }
  }
  std::vector<std::vector<int>> others;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      if (full || n <= 8 || group_pairs.count({a, b}) > 0) {
        sets.push_back({a, b});
      } else {
        others.push_back({a, b});
      }
    }
  }
  std::shuffle(others.begin(), others.end(), std::mt19937_64(seed));
  for (size_t i = 0; i < others.size() && i < 6; ++i) sets.push_back(others[i]);
  return sets;
}

struct Tally {
  int cases = 0, failure_sets = 0, rebuilt = 0, beyond_protection = 0, assembled = 0;
  uint64_t t0 = 0, whole = 0;
  double phase_s[6] = {};  // start, save + T1, lose, decide, rebuild, restore
};

double Since(std::chrono::steady_clock::time_point* t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - *t).count();
  *t = now;
  return s;
}

// One case: one cluster; each failure set is a round on fresh steps (every
// rank saves two versions, every node produces their T1, then the loss, the
// rebuild and the restores).
void RunCase(const Case& c, uint64_t seed, Tally* tally) {
  SCOPED_TRACE(c.Name());
  auto t = topo::Topology::Uniform(c.dp, c.tp, c.pp, c.zero, c.ranks_per_node);
  ASSERT_TRUE(t.ok()) << t.status();
  World w = MakeWorld(*t, seed);
  auto pol = topo::ParsePolicy(c.policy);
  ASSERT_TRUE(pol.ok());
  auto plan = model::MakeJobPlan(*t, w.inv, *pol);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto cp = MakeClusterPlan(std::move(*plan), w.inv);
  const int protection = cp->plan.protection;
  const std::vector<std::vector<int>> sets = FailureSets(c, *t, seed);
  ++tally->cases;
  auto mark = std::chrono::steady_clock::now();
  Cluster cl(w, cp);
  if (::testing::Test::HasFatalFailure()) return;
  tally->phase_s[0] += Since(&mark);
  int64_t step = 0;
  for (const std::vector<int>& lost : sets) {
    SCOPED_TRACE(fmt::format("lost nodes [{}]", fmt::join(lost, ", ")));
    const int64_t old_step = step + 4, new_step = step + 5;
    step += 10;
    w.Generate(old_step, old_step);
    w.Generate(new_step, old_step);
    uint64_t t0 = 0, whole = 0;
    cl.Save(old_step, 0, &t0, &whole);
    cl.ProduceT1(old_step);
    t0 = whole = 0;
    cl.Save(new_step, 1, &t0, &whole);
    cl.ProduceT1(new_step);
    if (::testing::Test::HasFatalFailure()) return;
    tally->phase_s[1] += Since(&mark);
    if (&lost == &sets.front()) {
      tally->t0 += t0;
      tally->whole += whole;
    }
    for (int node : lost) cl.Lose(node);
    tally->phase_s[2] += Since(&mark);
    std::vector<recover::NodeInventory> live;
    for (int node = 0; node < cl.num_nodes(); ++node) live.push_back(cl.InventoryOf(node));
    auto d = recover::Decide(cl.plan(), live, new_step);
    ASSERT_TRUE(d.ok()) << d.status();
    tally->phase_s[3] += Since(&mark);
    ++tally->failure_sets;
    if (static_cast<int>(lost.size()) <= protection) {
      ASSERT_TRUE(d->from_memory) << "protection " << protection << ": " << d->reason;
    } else {
      ++tally->beyond_protection;
      if (!d->from_memory) continue;
    }
    ASSERT_EQ(d->step, new_step) << d->reason;
    // Exactly the ranks of the lost nodes are rebuilt, on their nodes.
    std::set<int> want, got;
    std::set<int> touched_groups;  // sharding groups with a member on a lost node
    for (int r = 0; r < t->num_ranks(); ++r) {
      for (int node : lost) {
        if (t->rank_node[r] == node) {
          want.insert(r);
          touched_groups.insert(t->PpIndex(r) * t->tp + t->TpIndex(r));
        }
      }
    }
    for (const recover::RankAssembly& a : d->assemblies) {
      got.insert(a.rank);
      EXPECT_EQ(a.node, t->rank_node[a.rank]);
    }
    EXPECT_EQ(got, want);
    cl.Rebuild(*d);
    if (::testing::Test::HasFatalFailure()) return;
    tally->phase_s[4] += Since(&mark);
    ++tally->rebuilt;
    // The restores: every rank after the first loss of the case; then the
    // ranks whose sharding group had a member on a lost node (the others
    // read nothing the loss touched).
    for (int r = 0; r < t->num_ranks(); ++r) {
      if (&lost != &sets.front() &&
          touched_groups.count(t->PpIndex(r) * t->tp + t->TpIndex(r)) == 0) {
        continue;
      }
      bool via_assembly = false;
      cl.ExpectRestores(r, new_step, &via_assembly);
      if (::testing::Test::HasFatalFailure()) return;
      tally->assembled += via_assembly;
    }
    tally->phase_s[5] += Since(&mark);
  }
}

TEST(ShardedExhaustiveTest, EveryTopologyPolicyAndFailureRestoresBitIdentical) {
  const std::vector<Case> cases = Cases();
  Tally tally;
  const auto start = std::chrono::steady_clock::now();
  // MEMENTO_SHARDED_ZERO=0|1: only that ZeRO stage (the two CTest entries);
  // MEMENTO_SHARDED_CASES: only the cases whose name starts with it.
  const char* zero = std::getenv("MEMENTO_SHARDED_ZERO");
  const char* only = std::getenv("MEMENTO_SHARDED_CASES");
  for (size_t i = 0; i < cases.size(); ++i) {
    if (zero != nullptr && *zero != '\0' && cases[i].zero != std::atoi(zero)) continue;
    if (only != nullptr && cases[i].Name().rfind(only, 0) != 0) continue;
    RunCase(cases[i], 0x5a4d ^ (i * 0x9e3779b97f4a7c15ULL), &tally);
    if (HasFatalFailure()) return;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%d cases, %d failure sets (%d beyond the plan's protection), %d rebuilt from memory, %d "
      "restores through the assembly; T0 %llu of %llu state bytes (%.2f); %.1f s\n",
      tally.cases, tally.failure_sets, tally.beyond_protection, tally.rebuilt, tally.assembled,
      static_cast<unsigned long long>(tally.t0), static_cast<unsigned long long>(tally.whole),
      tally.whole ? static_cast<double>(tally.t0) / static_cast<double>(tally.whole) : 0.0, s);
  std::printf(
      "s in: start %.1f, save + T1 %.1f, loss %.1f, decide %.1f, rebuild %.1f, restore %.1f\n",
      tally.phase_s[0], tally.phase_s[1], tally.phase_s[2], tally.phase_s[3], tally.phase_s[4],
      tally.phase_s[5]);
  // The sharded path was taken: some slots held pieces and restored through
  // the assembly.
  EXPECT_GT(tally.assembled, 0);
  EXPECT_LT(tally.t0, tally.whole);
}

}  // namespace
}  // namespace memento::agent
