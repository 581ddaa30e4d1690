// JobMemberOptions::preallocate_slots: a replacement agent (an empty root in
// a job whose topology and inventories are in the store) makes its local
// ranks' slots before it joins the membership, at the size a recovery
// rebuilds, so that the recovery writes into memory already faulted in
// (docs/recovery.md, "Pre-allocated slots"). Real embedded store over
// authenticated TCP, real node stores in shared memory.
#include <stdlib.h>

#include <memory>
#include <string>

#include "agent/cluster_test_util.h"
#include "agent/job_member.h"
#include "common/tensor_json.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "coord/membership.h"
#include "coord/store.h"
#include "gtest/gtest.h"
#include "net/job_token.h"
#include "recover/recipe.h"
#include "shm/node_store.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "topo/topology_json.h"

namespace memento::agent {
namespace {

constexpr char kJob[] = "preallocjob";
constexpr char kSecret[] = "cluster-prealloc-test-0123456789";

Deadline Soon() { return Deadline::AfterSeconds(10); }

class PreallocateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(setenv("MEMENTO_JOB_TOKEN", kSecret, 1), 0);
    auto token = net::JobToken::FromSecret(kSecret);
    ASSERT_TRUE(token.ok());
    auto server = coord::EmbeddedStoreServer::Start("127.0.0.1", 0, *token);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    url_ = "tcp://127.0.0.1:" + std::to_string(server_->port());
    auto store = coord::OpenStore(url_, "", Soon());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    // Three DP ranks, one per node; rank 1 (node 1) holds ~6 MiB.
    inventory_ = testing::MakeInventory(3, 1 << 20, 5 << 20);
  }

  void PublishTopology() {
    auto t = topo::Topology::Uniform(3, 1, 1, 0, 1);
    ASSERT_TRUE(t.ok());
    topo::JobTopology jt;
    jt.topology = *t;
    auto pol = topo::ParsePolicy("xor");
    ASSERT_TRUE(pol.ok());
    jt.policy = *pol;
    ASSERT_TRUE(store_->Set(keys_.Topology(), topo::JobTopologyToJson(jt).dump(), Soon()).ok());
  }
  void PublishInventory(int rank) {
    ASSERT_TRUE(
        store_->Set(keys_.Inventory(rank), TensorListToJson(inventory_[rank]).dump(), Soon()).ok());
  }
  uint64_t RebuildBytes(int rank) {
    auto l =
        shm::ComputeSlotLayout(kJob, rank, inventory_[rank], recover::ExecuteOptions{}.chunk_bytes);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->total_bytes : 0;
  }
  // Starts node 1's agent member on `root` (node store opened there first).
  std::unique_ptr<JobMember> Start(const std::string& root, bool preallocate,
                                   std::unique_ptr<shm::NodeStore>* ns) {
    auto opened = shm::NodeStore::Open({root, kJob, 1, 0});
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return nullptr;
    *ns = std::move(*opened);
    return StartOn(ns->get(), root, preallocate);
  }
  std::unique_ptr<JobMember> StartOn(shm::NodeStore* ns, const std::string& root,
                                     bool preallocate) {
    JobMemberOptions o;
    o.store_url = url_;
    o.preallocate_slots = preallocate;
    auto m = JobMember::Start(o, kJob, 1, root, ns);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  coord::JobKeys keys_{kJob};
  std::unique_ptr<coord::EmbeddedStoreServer> server_;
  std::string url_;
  std::unique_ptr<coord::Store> store_;
  topo::Inventory inventory_;
  shm::testing::ShmScratchDir dir_{"memento-prealloc"};
};

TEST_F(PreallocateTest, AReplacementMakesItsRanksSlotBeforeItJoins) {
  PublishTopology();
  for (int r = 0; r < 3; ++r) PublishInventory(r);
  std::unique_ptr<shm::NodeStore> ns;
  auto m = Start(dir_.path() + "/node1", true, &ns);
  ASSERT_NE(m, nullptr);
  // Made before Start returned, i.e. before the membership lists the node.
  auto seg = ns->SlotSegment(1, 0);
  ASSERT_NE(seg, nullptr) << "no slot 0 for rank 1";
  const uint64_t want = RebuildBytes(1);
  EXPECT_GE(seg->size(), want);
  EXPECT_TRUE(seg->writable());
  EXPECT_EQ(ns->SlotSegment(1, 1), nullptr) << "only the slot a rebuild writes is made";
  EXPECT_EQ(ns->SlotSegment(0, 0), nullptr) << "rank 0 runs on node 0";
  EXPECT_EQ(ns->SlotSegment(2, 0), nullptr) << "rank 2 runs on node 2";
  JobMemberStats st = m->stats();
  EXPECT_EQ(st.preallocated_slots, 1);
  EXPECT_EQ(st.preallocated_bytes, seg->size());
  // It holds no version: an empty slot, which no inventory counts.
  auto inv = ns->Inventory(1);
  ASSERT_EQ(inv.size(), 1u);
  EXPECT_EQ(inv[0].state, shm::SlotState::kEmpty);
  EXPECT_FALSE(inv[0].intact);
  // The recovery's EnsureSlot gets this very mapping (no new allocation).
  auto again = ns->EnsureSlot(1, 0, want);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), seg.get());
  m.reset();
}

TEST_F(PreallocateTest, OffMakesNothing) {
  PublishTopology();
  for (int r = 0; r < 3; ++r) PublishInventory(r);
  std::unique_ptr<shm::NodeStore> ns;
  auto m = Start(dir_.path() + "/node1", false, &ns);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(ns->Ranks().empty());
  EXPECT_EQ(m->stats().preallocated_slots, 0);
  m.reset();
}

TEST_F(PreallocateTest, NothingBeforeTheJobHasATopologyOrTheRankAnInventory) {
  std::unique_ptr<shm::NodeStore> ns;
  {
    // A job starting: no topology yet, the seals allocate.
    auto m = Start(dir_.path() + "/node1", true, &ns);
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(ns->Ranks().empty());
  }
  // The topology, but rank 1 never registered: nothing to rebuild.
  PublishTopology();
  PublishInventory(0);
  auto m = StartOn(ns.get(), dir_.path() + "/node1", true);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(ns->Ranks().empty());
  m.reset();
}

TEST_F(PreallocateTest, ARankWithASlotOnThisNodeIsLeftAlone) {
  PublishTopology();
  for (int r = 0; r < 3; ++r) PublishInventory(r);
  const std::string root = dir_.path() + "/node1";
  auto opened = shm::NodeStore::Open({root, kJob, 1, 0});
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<shm::NodeStore> ns = std::move(*opened);
  // An agent restarted on its root adopts the rank's slots: slot 1 here.
  ASSERT_TRUE(ns->EnsureSlot(1, 1, 1 << 20).ok());
  auto m = StartOn(ns.get(), root, true);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(ns->SlotSegment(1, 0), nullptr);
  EXPECT_EQ(m->stats().preallocated_slots, 0);
  m.reset();
}

TEST_F(PreallocateTest, ABudgetTooSmallLeavesTheSlotToTheRecoveryAndStartsAnyway) {
  PublishTopology();
  for (int r = 0; r < 3; ++r) PublishInventory(r);
  const std::string root = dir_.path() + "/node1";
  auto opened = shm::NodeStore::Open({root, kJob, 1, /*budget_bytes=*/1 << 20});
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<shm::NodeStore> ns = std::move(*opened);
  auto m = StartOn(ns.get(), root, true);
  ASSERT_NE(m, nullptr) << "a pre-allocation that does not fit must not stop the agent";
  EXPECT_TRUE(ns->Ranks().empty());
  m.reset();
}

}  // namespace
}  // namespace memento::agent
