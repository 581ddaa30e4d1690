// The durable tier in cluster mode: two real DurableStreamers (one per node,
// T0 slots in shared memory) persist one committed version as a cluster
// version (each replicated byte once, the real node count, the epoch);
// kPeerLoadDurable on a fresh (replaced) node writes a T0 slot equal to the
// durable bytes, which survives a restart of the agent (a new node store
// adopting the root).
#include "agent/durable_cluster.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "agent/cluster_test_util.h"
#include "agent/durable.h"
#include "agent/redundancy_shm.h"
#include "common/test_util.h"
#include "net/peer_protocol.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::agent {
namespace {

using namespace memento::agent::testing;

Deadline Soon() { return Deadline::AfterSeconds(30); }

net::JobToken Token() {
  auto t = net::JobToken::FromSecret("durable-cluster-test-secret-0123456789");
  MEMENTO_CHECK(t.ok());
  return *t;
}

using memento::testing::ReadAll;

TEST(ClusterDurableName, ByStateClassAndPosition) {
  auto t1 = topo::Topology::Uniform(4, 1, 1, 1, 1);
  ASSERT_TRUE(t1.ok());
  auto t2 = topo::Topology::Uniform(2, 2, 1, 1, 2);  // dp 2 x tp 2
  ASSERT_TRUE(t2.ok());
  TensorMeta w = Tensor("w", DType::kFloat32, 8, StateClass::kReplicated);
  TensorMeta opt = Tensor("opt", DType::kInt64, 4, StateClass::kDpSharded);
  TensorMeta local = opt;
  opt.global_numel = 16;
  opt.shard_offset = 4;
  TensorMeta rng = Tensor("rng", DType::kUInt8, 16, StateClass::kPrivate);
  EXPECT_EQ(ClusterDurableName(w, 3, *t1), "w");
  EXPECT_EQ(ClusterDurableName(opt, 3, *t1), "opt");
  EXPECT_EQ(ClusterDurableName(local, 3, *t1), "rank3/opt");
  EXPECT_EQ(ClusterDurableName(rng, 3, *t1), "rank3/rng");
  // rank 3 of dp 2 x tp 2: tp index 1, pp 0; rank 2: tp 0.
  EXPECT_EQ(ClusterDurableName(w, 3, *t2), "pp0.tp1/w");
  EXPECT_EQ(ClusterDurableName(w, 2, *t2), "pp0.tp0/w");
  EXPECT_EQ(ClusterDurableName(opt, 3, *t2), "pp0.tp1/opt");
  EXPECT_EQ(ClusterDurableName(rng, 3, *t2), "rank3/rng");
}

// Node-local mode: a replicated tensor is shared only by ranks whose copies
// are provably equal (meta and chunk checksums); other copies are per rank.
TEST(DurableNames, SharedOnlyByEqualCopies) {
  auto copy = [](int rank, uint64_t sum, int64_t numel = 8) {
    ReplicatedCopy c;
    c.rank = rank;
    c.meta = Tensor("params", DType::kFloat32, numel, StateClass::kReplicated);
    c.chunks = {{0, 16, 1}, {16, static_cast<uint64_t>(numel) * 4 - 16, sum}};
    return c;
  };
  // Pure DP on the node: one class, the plain name, written by rank 0.
  auto n = DurableNames({copy(1, 7), copy(0, 7)});
  EXPECT_EQ(n.at({0, "params"}).name, "params");
  EXPECT_TRUE(n.at({0, "params"}).writer);
  EXPECT_FALSE(n.at({1, "params"}).writer);
  EXPECT_EQ(n.at({1, "params"}).ranks, (std::vector<int>{0, 1}));
  // Two stages, two ranks each (0, 2: stage 0; 1, 3: stage 1).
  n = DurableNames({copy(0, 7), copy(1, 9), copy(2, 7), copy(3, 9)});
  EXPECT_EQ(n.at({2, "params"}).name, "rank0/params");
  EXPECT_EQ(n.at({2, "params"}).ranks, (std::vector<int>{0, 2}));
  EXPECT_FALSE(n.at({2, "params"}).writer);
  EXPECT_EQ(n.at({3, "params"}).name, "rank1/params");
  EXPECT_TRUE(n.at({1, "params"}).writer);
  // Equal checksums but another shape: not the same state.
  n = DurableNames({copy(0, 7), copy(1, 7, 12)});
  EXPECT_EQ(n.at({0, "params"}).name, "rank0/params");
  EXPECT_EQ(n.at({1, "params"}).name, "rank1/params");
  EXPECT_TRUE(n.at({1, "params"}).writer);
}

class DurableClusterTest : public ::testing::Test {
 protected:
  static constexpr int kNodes = 2;
  static constexpr int64_t kStep = 7;

  void SetUp() override {
    inv_ = MakeInventory(kNodes);
    plan_ = MakeClusterPlan(MakeTestPlan(kNodes, inv_, "xor"), inv_);
    durable_dir_ = dir_.path() + "/durable";
    for (int n = 0; n < kNodes; ++n) {
      roots_.push_back(shm_.path() + "/node" + std::to_string(n));
      auto store = shm::NodeStore::Open({roots_[n], kJob, n, 0});
      ASSERT_TRUE(store.ok()) << store.status();
      stores_.push_back(std::move(store).value());
    }
  }

  // Every rank's T0 slot 0 at `step`, then both nodes persist `step` as one
  // cluster version of epoch `epoch`.
  void PersistClusterVersion(int64_t step, uint64_t epoch) {
    for (int r = 0; r < kNodes; ++r) WriteRankSlot(*stores_[r], inv_, r, 0, step);
    std::vector<std::unique_ptr<DurableStreamer>> streamers;
    for (int n = 0; n < kNodes; ++n) {
      DurableOptions o;
      o.dir = durable_dir_;
      o.commit_timeout_s = 20;
      auto d = DurableStreamer::Start(o, kJob, n, roots_[n], stores_[n].get());
      ASSERT_TRUE(d.ok()) << d.status();
      (*d)->SetClusterPlan(plan_);
      (*d)->SetEpoch(epoch);
      streamers.push_back(std::move(d).value());
    }
    // Node 1 first: node 0 commits once every marker of its epoch is there.
    for (int n = kNodes - 1; n >= 0; --n) streamers[n]->OnCommitted(step);
    for (auto& d : streamers) ASSERT_TRUE(d->WaitIdle(Soon()));
    for (auto& d : streamers) {
      DurableStats s = d->stats();
      EXPECT_EQ(s.persister.persisted, 1) << s.persister.last_error;
      EXPECT_EQ(s.abandoned_mismatch, 0);
    }
  }

  // A replaced node `node`: empty root, a node store and a peer service.
  struct Fresh {
    std::string root;
    std::unique_ptr<shm::NodeStore> store;
    std::unique_ptr<ShmRedundancyStore> red;
    std::unique_ptr<PeerService> service;
    std::atomic<int64_t> target{-1};
  };
  void StartFresh(Fresh* f, int node, const std::string& root) {
    f->root = root;
    auto store = shm::NodeStore::Open({root, kJob, node, 0});
    ASSERT_TRUE(store.ok()) << store.status();
    f->store = std::move(store).value();
    auto red = ShmRedundancyStore::OpenShm(root, node);
    ASSERT_TRUE(red.ok()) << red.status();
    f->red = std::move(red).value();
    ASSERT_TRUE(f->red->SetPlan(plan_->plan).ok());
    PeerServiceOptions o;
    o.job = kJob;
    o.node = node;
    o.store = f->store.get();
    o.redundancy = f->red.get();
    o.plan = [this]() -> Result<std::shared_ptr<const ClusterPlan>> { return plan_; };
    o.set_restore_target = [f](int64_t step, uint64_t) {
      f->target = step;
      return Status::Ok();
    };
    auto svc = PeerService::Start(std::move(o), Token());
    ASSERT_TRUE(svc.ok()) << svc.status();
    f->service = std::move(svc).value();
  }
  Result<std::string> CallLoad(Fresh& f, const std::string& body) {
    auto hp = net::ParseHostPort(f.service->endpoint(), net::PortUse::kConnect);
    MEMENTO_RETURN_IF_ERROR(hp.status());
    MEMENTO_ASSIGN_OR_RETURN(auto client,
                             net::RpcClient::Connect(hp->host, hp->port, Token(), Soon()));
    return client->Call(net::kPeerLoadDurable, body, Soon());
  }

  // The complete slot of `rank` at `step` in `store`, verified, and each of
  // its tensors equal to the bytes the rank had at `step`.
  void ExpectSlotHolds(shm::NodeStore& store, int rank, int64_t step) {
    bool found = false;
    for (const shm::SlotStatus& s : store.Inventory(rank)) {
      if (s.state != shm::SlotState::kComplete || s.step != step) continue;
      found = true;
      ASSERT_TRUE(store.Verify(rank, s.slot).ok());
      auto seg = store.SlotSegment(rank, s.slot);
      ASSERT_NE(seg, nullptr);
      auto info = shm::ReadSlot(*seg);
      ASSERT_TRUE(info.ok()) << info.status();
      ASSERT_TRUE(shm::VerifySlotData(*seg, *info).ok());
      ASSERT_EQ(info->tensors.size(), inv_[rank].size());
      const uint8_t* data = seg->data() + info->data_offset;
      for (const shm::SavedTensor& t : info->tensors) {
        auto want = TensorBytes(t.meta, rank, step);
        ASSERT_EQ(t.nbytes, want.size()) << t.meta.name;
        EXPECT_EQ(std::memcmp(data + t.offset, want.data(), want.size()), 0)
            << "rank " << rank << " tensor " << t.meta.name;
      }
    }
    EXPECT_TRUE(found) << "rank " << rank << " holds no complete slot of step " << step;
  }

  memento::testing::ScratchDir dir_{"durable-cluster"};
  shm::testing::ShmScratchDir shm_{"memento-durable-cluster"};
  topo::Inventory inv_;
  std::shared_ptr<const ClusterPlan> plan_;
  std::string durable_dir_;
  std::vector<std::string> roots_;
  std::vector<std::unique_ptr<shm::NodeStore>> stores_;
};

TEST_F(DurableClusterTest, ClusterVersionWritesReplicatedStateOnceAndVerifies) {
  PersistClusterVersion(kStep, 3);
  auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, kStep);
  auto report = tier::Verify(tier::Env::Default(), durable_dir_, kStep);
  ASSERT_TRUE(report.ok()) << report.status();
  auto index = tier::LoadIndex(tier::Env::Default(), durable_dir_, kStep);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->num_nodes, kNodes);
  // Each replicated tensor: pieces from both nodes that tile it exactly once.
  std::set<int> writers;
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(index->tensors.count(name)) << name;
    const tier::TensorRecord& t = index->tensors.at(name);
    uint64_t sum = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const tier::PieceRecord& p : t.pieces) {
      sum += p.length;
      ranges.emplace_back(p.tensor_offset, p.length);
      writers.insert(p.node);
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;
    for (auto [off, len] : ranges) {
      EXPECT_EQ(off, at) << name << ": a gap or an overlap";
      at = off + len;
    }
    EXPECT_EQ(sum, t.nbytes) << name << " is not written exactly once";
  }
  EXPECT_EQ(writers, (std::set<int>{0, 1})) << "global parameter sharding: both nodes write";
  EXPECT_TRUE(index->tensors.count("rank0/rng"));
  EXPECT_TRUE(index->tensors.count("rank1/rng"));
  // Each node's marker carries the cluster's epoch.
  for (int n = 0; n < kNodes; ++n) {
    const std::string marker =
        ReadAll(durable_dir_ + "/version-" + std::string(20 - 1, '0') + std::to_string(kStep) +
                "/node-0000" + std::to_string(n) + ".done");
    auto j = nlohmann::json::parse(marker, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << marker;
    EXPECT_EQ(j["epoch"].get<uint64_t>(), 3u);
  }
}

TEST_F(DurableClusterTest, LoadRpcWritesTheDurableBytesIntoAFreshNodeAndSurvivesRestart) {
  PersistClusterVersion(kStep, 1);
  // Node 1 is lost: a fresh agent on an empty root loads the version.
  const std::string root = shm_.path() + "/node1-replaced";
  {
    Fresh f;
    StartFresh(&f, 1, root);
    auto reply = CallLoad(f, nlohmann::json{{"dir", durable_dir_}, {"step", kStep}}.dump());
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto j = nlohmann::json::parse(*reply);
    EXPECT_EQ(j["step"].get<int64_t>(), kStep);
    EXPECT_EQ(j["ranks"], nlohmann::json::array({1}));
    EXPECT_GT(j["read_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(f.target.load(), kStep);
    ExpectSlotHolds(*f.store, 1, kStep);
    // The slot's bytes are the durable version's bytes, read independently.
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<tier::RestoreTarget> targets;
    for (const TensorMeta& m : inv_[1]) {
      bufs.emplace_back(m.nbytes());
      tier::RestoreTarget t;
      t.meta = m;
      t.meta.name = ClusterDurableName(m, 1, plan_->plan.topology);
      t.data = bufs.back().data();
      targets.push_back(t);
    }
    auto rep = tier::Restore(tier::Env::Default(), durable_dir_, kStep, targets);
    ASSERT_TRUE(rep.ok()) << rep.status();
    for (size_t i = 0; i < inv_[1].size(); ++i) {
      EXPECT_EQ(bufs[i], TensorBytes(inv_[1][i], 1, kStep)) << inv_[1][i].name;
    }
    f.service.reset();
  }
  // The agent restarts on the same root: the slot is adopted, intact.
  auto again = shm::NodeStore::Open({root, kJob, 1, 0});
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSlotHolds(**again, 1, kStep);
}

TEST_F(DurableClusterTest, LoadDropsTheAbandonedHistoryAndRefusesAMissingVersion) {
  PersistClusterVersion(kStep, 1);
  // Node 0 survived with step 9 in slot 1 (newer than the durable version).
  WriteRankSlot(*stores_[0], inv_, 0, 1, 9);
  stores_[0].reset();
  Fresh f;
  StartFresh(&f, 0, roots_[0]);
  ExpectSlotHolds(*f.store, 0, 9);
  // and redundancy of steps 5 and 9 (made before the failure).
  ASSERT_TRUE(f.red->Ensure(5).ok());
  ASSERT_TRUE(f.red->Ensure(9).ok());
  auto missing = CallLoad(f, nlohmann::json{{"dir", durable_dir_}, {"step", 8}}.dump());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  EXPECT_EQ(f.target.load(), -1);
  auto bad = CallLoad(f, R"({"step": 7})");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  ExpectSlotHolds(*f.store, 0, 9);  // refused requests touch nothing

  auto reply = CallLoad(f, nlohmann::json{{"dir", durable_dir_}, {"step", kStep}}.dump());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ExpectSlotHolds(*f.store, 0, kStep);
  // Step 9 belongs to the history the job abandons: no longer complete, and
  // its redundancy is gone; older redundancy stays.
  for (const shm::SlotStatus& s : f.store->Inventory(0)) {
    EXPECT_FALSE(s.state == shm::SlotState::kComplete && s.step == 9) << "slot " << s.slot;
  }
  EXPECT_EQ(f.red->Versions(), std::vector<int64_t>({5}));
}

}  // namespace
}  // namespace memento::agent
