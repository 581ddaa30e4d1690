// RecoverJob (the launcher's recovery orchestration) against real agent
// peer services in this process: real node stores and redundancy stores in
// shared memory, the peer protocol over authenticated TCP, endpoints in a
// coordination store, recover::Decide and kPeerRecover / kPeerSetRestoreTarget.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "agent/cluster_test_util.h"
#include "agent/peer_service.h"
#include "agent/redundancy_shm.h"
#include "codec/erasure_code.h"
#include "coord/keys.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"
#include "launch/job_recovery.h"
#include "net/peer_protocol.h"
#include "recover/recover.h"
#include "shm/node_store.h"
#include "shm/redundancy_format.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "shm/slot_format.h"

namespace memento::launch {
namespace {

using namespace memento::agent::testing;  // NOLINT: the agent's cluster test helpers
using recover::SourceKind;

Deadline Soon() { return Deadline::AfterSeconds(30); }

net::JobToken Token() {
  auto t = net::JobToken::FromSecret("launch-recover-cluster-test-0123456789");
  MEMENTO_CHECK(t.ok());
  return *t;
}

// `n` one-rank nodes with peer services on ephemeral ports; each node's
// endpoint is registered in the store under nodes/node<i> like the membership
// does.
class TestCluster {
 public:
  // `zero` 1: every rank also holds a ZeRO-1 optimizer shard ("opt",
  // dp_sharded), which the plan protects with kAor copies (REFT AOR).
  TestCluster(int n, const std::string& policy, int zero = 0)
      : inv_(Inventory(n, zero)), plan_(agent::MakeClusterPlan(Plan(n, inv_, policy, zero), inv_)) {
    for (int i = 0; i < n; ++i) {
      nodes_.emplace_back(std::make_unique<Node>());
      StartNode(i, dir_.path() + "/node" + std::to_string(i));
    }
  }
  ~TestCluster() {
    for (auto& n : nodes_) {
      if (n->service) n->service->Stop();
    }
  }

  struct Node {
    std::string root;
    std::unique_ptr<shm::NodeStore> store;
    std::unique_ptr<agent::ShmRedundancyStore> red;
    std::unique_ptr<agent::PeerService> service;
    std::atomic<int64_t> restore_target{-1};
  };
  Node& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  const topo::Plan& plan() const { return plan_->plan; }
  coord::MemoryStore& store() { return store_; }

  void WriteT0(int64_t step, int slot) {
    for (int r = 0; r < plan().topology.num_ranks(); ++r) {
      WriteRankSlot(*node(plan().topology.rank_node[static_cast<size_t>(r)]).store, inv_, r, slot,
                    step);
    }
  }

  // T1 of `step` as the save path makes it (parities encoded, copies copied).
  void ProduceRedundancy(int64_t step) {
    for (auto& n : nodes_) ASSERT_TRUE(n->red->Ensure(step).ok());
    for (const topo::Copy& cp : plan().copies) {
      const auto bytes = PieceBytes(plan(), inv_, cp.piece, step);
      auto buf = node(cp.node).red->EntryBuffer(step, {SourceKind::kCopy, cp.id});
      ASSERT_TRUE(buf.ok()) << buf.status();
      std::memcpy(*buf, bytes.data(), bytes.size());
      ASSERT_TRUE(node(cp.node).red->FinishEntry(step, {SourceKind::kCopy, cp.id}).ok());
    }
    for (const topo::Stripe& st : plan().stripes) {
      auto code = codec::ErasureCode::Create(
          st.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, st.k, st.f);
      ASSERT_TRUE(code.ok()) << code.status();
      std::vector<std::vector<uint8_t>> blocks(static_cast<size_t>(st.k),
                                               std::vector<uint8_t>(st.block_bytes, 0));
      std::vector<const uint8_t*> data;
      for (int i = 0; i < st.k; ++i) {
        const topo::StripeBlock& b = st.data[static_cast<size_t>(i)];
        const auto piece = PieceBytes(plan(), inv_, b.piece, step);
        std::memcpy(blocks[static_cast<size_t>(i)].data(), piece.data() + b.offset, b.length);
        data.push_back(blocks[static_cast<size_t>(i)].data());
      }
      std::vector<uint8_t*> out;
      for (uint32_t pid : st.parities) {
        auto buf =
            node(plan().parities[pid].node).red->EntryBuffer(step, {SourceKind::kParity, pid});
        ASSERT_TRUE(buf.ok()) << buf.status();
        out.push_back(*buf);
      }
      code->Encode(st.block_bytes, data.data(), out.data());
      for (uint32_t pid : st.parities) {
        ASSERT_TRUE(node(plan().parities[pid].node)
                        .red->FinishEntry(step, {SourceKind::kParity, pid})
                        .ok());
      }
    }
  }

  // The node's host is lost: agent gone, memory gone; a fresh agent on an
  // empty root takes its place (new port, new endpoint in the store).
  void ReplaceNode(int i) {
    Node& nd = node(i);
    nd.service.reset();
    nd.red.reset();
    nd.store.reset();
    memento::testing::RemoveTree(nd.root);
    StartNode(i, nd.root + "-replaced");
  }

  // Flips one byte of the data of `rank`'s slot `slot` (silent corruption).
  void CorruptSlot(int rank, int slot) {
    const int n = plan().topology.rank_node[static_cast<size_t>(rank)];
    const std::string path = shm::SlotPath(node(n).root, rank, slot);
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << path;
    shm::SlotHeader h{};
    ASSERT_EQ(pread(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    uint8_t b = 0;
    const off_t at = static_cast<off_t>(h.data_offset + h.data_bytes / 2);
    ASSERT_EQ(pread(fd, &b, 1, at), 1);
    b ^= 0xff;
    ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
    close(fd);
  }

  // Flips one byte of a chunk of `rank`'s slot `slot`: with `served`, a
  // chunk wholly inside the piece of the rank that its node serves (a
  // recovery streams it whole, with its table checksum, to the node that
  // rebuilds); else a chunk of the rank's private tensor (kept: only its own
  // node reads it). Returns the chunk's index.
  size_t FlipChunk(int rank, int slot, bool served) {
    const int n = plan().topology.rank_node[static_cast<size_t>(rank)];
    const std::string path = shm::SlotPath(node(n).root, rank, slot);
    auto seg = shm::Segment::Open(path, /*writable=*/true);
    MEMENTO_CHECK(seg.ok());
    auto info = shm::ReadSlot(**seg);
    MEMENTO_CHECK(info.ok());
    std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> want;  // tensor, range
    if (served) {
      for (const topo::Piece& p : plan().pieces) {
        if (p.rank != rank || p.node != n || p.bytes == 0) continue;
        for (const topo::Segment& sg : p.segments) {
          want.push_back({sg.tensor, {sg.offset, sg.length}});
        }
        break;
      }
    } else {
      for (const shm::SavedTensor& t : info->tensors) {
        if (t.meta.name == "rng") want.push_back({"rng", {0, t.nbytes}});
      }
    }
    for (const auto& [tensor, range] : want) {
      auto runs = shm::FindRange(*info, tensor, range.first, range.second);
      MEMENTO_CHECK(runs.ok());
      for (const shm::SlotRun& r : *runs) {
        for (size_t i = 0; i < info->chunks.size(); ++i) {
          const shm::ChunkEntry& c = info->chunks[i];
          if (c.tensor_index != r.entry || c.offset < r.data_offset ||
              c.offset + c.length > r.data_offset + r.length) {
            continue;
          }
          uint8_t* b = (*seg)->data() + info->data_offset + c.offset + c.length / 2;
          *b ^= 0x5a;
          return i;
        }
      }
    }
    ADD_FAILURE() << "no chunk of rank " << rank << " found to corrupt (served " << served << ")";
    return SIZE_MAX;
  }

  // Flips a byte of the kAor copy of `owner`'s optimizer shard that node
  // `i` stores for `step`, after a verifying read cached it as good (as
  // FlipParities). Returns how many were flipped (0 or 1).
  int FlipAorCopy(int i, int64_t step, int owner) {
    return FlipEntries(i, step, 3, 0x21, [&](const shm::RedundancyEntry& entry) {
      if (entry.kind != static_cast<uint32_t>(SourceKind::kCopy)) return false;
      const topo::Copy& cp = plan().copies[entry.id];
      return cp.kind == topo::CopyKind::kAor && plan().pieces[cp.piece].rank == owner;
    });
  }

  // Flips a byte in every parity entry of `step` that node `i` stores, after
  // a verifying read cached them as good (silent corruption at rest, after
  // the node's last check). Returns how many were flipped.
  int FlipParities(int i, int64_t step) {
    return FlipEntries(i, step, 2, 0x40, [](const shm::RedundancyEntry& entry) {
      return entry.kind == static_cast<uint32_t>(SourceKind::kParity);
    });
  }

  // XORs `mask` into the byte at 1/`at_fraction` of every non-empty entry of
  // node `i`'s redundancy version `step` that `chosen` picks, after a
  // verifying read cached the entries as good. Returns how many it changed.
  template <typename Pred>
  int FlipEntries(int i, int64_t step, uint64_t at_fraction, uint8_t mask, Pred chosen) {
    (void)node(i).red->Holding(step, /*verify=*/true);
    auto seg = shm::Segment::Open(agent::RedundancyVersionPath(node(i).root, step), true);
    MEMENTO_CHECK(seg.ok());
    const auto* h = reinterpret_cast<const shm::RedundancyHeader*>((*seg)->data());
    const auto* table =
        reinterpret_cast<const shm::RedundancyEntry*>((*seg)->data() + h->table_offset);
    int flipped = 0;
    for (uint32_t e = 0; e < h->num_entries; ++e) {
      if (table[e].bytes == 0 || !chosen(table[e])) continue;
      (*seg)->data()[table[e].offset + table[e].bytes / at_fraction] ^= mask;
      ++flipped;
    }
    return flipped;
  }

  // The rank's slot holding `step` verifies and has the exact bytes.
  void ExpectRankRestored(int rank, int64_t step) {
    const int n = plan().topology.rank_node[static_cast<size_t>(rank)];
    agent::PieceReader reader(node(n).root, kJob);
    for (const TensorMeta& t : inv_[static_cast<size_t>(rank)]) {
      const auto want = TensorBytes(t, rank, step);
      std::vector<uint8_t> got(want.size());
      ASSERT_TRUE(reader.ReadTensorRange(rank, step, t.name, 0, got.size(), got.data()).ok())
          << "rank " << rank << " " << t.name;
      EXPECT_EQ(got, want) << "rank " << rank << " " << t.name;
    }
  }

 private:
  void StartNode(int i, const std::string& root) {
    Node* nd = nodes_[static_cast<size_t>(i)].get();
    nd->root = root;
    auto store = shm::NodeStore::Open({root, kJob, i, 0});
    ASSERT_TRUE(store.ok()) << store.status();
    nd->store = std::move(store).value();
    auto red = agent::ShmRedundancyStore::OpenShm(root, i);
    ASSERT_TRUE(red.ok()) << red.status();
    nd->red = std::move(red).value();
    ASSERT_TRUE(nd->red->SetPlan(plan_->plan).ok());
    agent::PeerServiceOptions o;
    o.job = kJob;
    o.node = i;
    o.store = nd->store.get();
    o.redundancy = nd->red.get();
    o.plan = [this]() -> Result<std::shared_ptr<const agent::ClusterPlan>> { return plan_; };
    o.endpoint_of = [this](int peer) -> Result<std::string> {
      auto eps = ReadEndpoints(store_, kJob, static_cast<int>(nodes_.size()), Soon());
      if (!eps.ok()) return eps.status();
      if (peer < 0 || peer >= static_cast<int>(eps->size()) ||
          (*eps)[static_cast<size_t>(peer)].empty()) {
        return NotFoundError("no node " + std::to_string(peer));
      }
      return (*eps)[static_cast<size_t>(peer)];
    };
    o.committed = [] { return int64_t{5}; };
    o.set_restore_target = [nd](int64_t step, uint64_t) {
      nd->restore_target = step;
      return Status::Ok();
    };
    auto svc = agent::PeerService::Start(std::move(o), Token());
    ASSERT_TRUE(svc.ok()) << svc.status();
    nd->service = std::move(svc).value();
    coord::JobKeys keys(kJob);
    ASSERT_TRUE(store_.Set(keys.Node(coord::NodeName(i)), nd->service->endpoint(), Soon()).ok());
  }

  static topo::Inventory Inventory(int n, int zero) {
    topo::Inventory inv = MakeInventory(n);
    if (zero == 1) {
      for (auto& r : inv) r.push_back(Tensor("opt", DType::kFloat32, 1500, StateClass::kDpSharded));
    }
    return inv;
  }
  static topo::Plan Plan(int n, const topo::Inventory& inv, const std::string& policy, int zero) {
    if (zero == 0) return MakeTestPlan(n, inv, policy);
    auto t = topo::Topology::Uniform(n, 1, 1, zero, 1);
    MEMENTO_CHECK(t.ok());
    auto pol = topo::ParsePolicy(policy);
    MEMENTO_CHECK(pol.ok());
    auto plan = topo::MakePlan(*t, inv, *pol);
    MEMENTO_CHECK(plan.ok());
    return std::move(plan).value();
  }

  shm::testing::ShmScratchDir dir_{"memento-launch"};
  coord::MemoryStore store_;
  topo::Inventory inv_;
  std::shared_ptr<const agent::ClusterPlan> plan_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

RecoverOptions Options(int n) {
  RecoverOptions o;
  o.job = kJob;
  o.num_nodes = n;
  o.committed = 5;
  return o;
}

// The ranks a recovery rebuilt, over all its nodes, sorted.
std::vector<int> RebuiltRanks(const JobRecovery& r) {
  std::vector<int> rebuilt;
  for (const NodeRecoveryStats& n : r.nodes) {
    rebuilt.insert(rebuilt.end(), n.ranks.begin(), n.ranks.end());
  }
  std::sort(rebuilt.begin(), rebuilt.end());
  return rebuilt;
}

// Every one of the `n` nodes has `step` as its restore target and every
// rank's slot of `step` holds its original bytes (one rank a node).
void ExpectEveryRankRestored(TestCluster& c, int n, int64_t step) {
  for (int i = 0; i < n; ++i) EXPECT_EQ(c.node(i).restore_target.load(), step) << i;
  for (int rank = 0; rank < n; ++rank) c.ExpectRankRestored(rank, step);
}

TEST(RecoverJob, ALostNodeIsRebuiltAndEveryAgentGetsTheTarget) {
  for (const char* policy : {"xor", "replicate", "rs:2"}) {
    SCOPED_TRACE(policy);
    TestCluster c(4, policy);
    c.WriteT0(4, 0);
    c.WriteT0(5, 1);
    c.ProduceRedundancy(5);
    c.ReplaceNode(1);
    auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
    EXPECT_EQ(r->decision.step, 5);
    EXPECT_EQ(r->inventories.size(), 4u);
    EXPECT_TRUE(r->unreachable.empty());
    ASSERT_EQ(r->nodes.size(), 1u);
    EXPECT_EQ(r->nodes[0].node, 1);
    EXPECT_EQ(r->nodes[0].ranks, std::vector<int>{1});
    EXPECT_GT(r->rebuilt_bytes, 0u);
    EXPECT_GE(r->total_s, r->inventory_plan_s);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(c.node(i).restore_target.load(), 5) << i;
    c.ExpectRankRestored(1, 5);
    // Decided without hashing, verified alongside the rebuild, nothing failed.
    EXPECT_TRUE(r->deferred_verify);
    EXPECT_FALSE(r->redecided) << r->first_attempt;
    EXPECT_GT(r->verify_hashed_bytes, 0u);
    if (std::string(policy) == "xor") {
      // The survivors' pieces went to node 1 whole chunk by whole chunk:
      // checked there, not hashed again by their senders.
      EXPECT_GT(r->verify_checked_by_receivers_bytes, 0u);
    }
    // The JSON record of the recovery carries the breakdown and the decision.
    nlohmann::json j = r->ToJson();
    EXPECT_EQ(j["decision"]["step"], 5);
    EXPECT_TRUE(j.contains("transfer_s"));
  }
}

TEST(RecoverJob, TwoLostNodesOfOneGroupUnderRs2) {
  TestCluster c(4, "rs:2");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  c.ReplaceNode(2);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  c.ExpectRankRestored(1, 5);
  c.ExpectRankRestored(2, 5);
}

TEST(RecoverJob, LossBeyondProtectionChangesNothingAndNamesThePieces) {
  TestCluster c(4, "xor");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  c.ReplaceNode(2);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->decision.from_memory);
  EXPECT_NE(r->decision.reason.find("sg0/r1"), std::string::npos) << r->decision.reason;
  EXPECT_TRUE(r->nodes.empty());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.node(i).restore_target.load(), -1) << i;
}

TEST(RecoverJob, ACorruptedSlotOnASurvivorIsRebuilt) {
  TestCluster c(4, "xor");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.CorruptSlot(2, 1);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  EXPECT_EQ(r->decision.step, 5);
  ASSERT_EQ(r->nodes.size(), 1u);
  EXPECT_EQ(r->nodes[0].node, 2);
  c.ExpectRankRestored(2, 5);
}

// The survivors' deferred verification (docs/recovery.md, "The survivors'
// verification"): a chunk that a survivor streams whole to the rebuilding
// node is checked only there. Corrupted at rest, the rebuild fails its
// arrival check, and the same RecoverJob decides again on verified
// inventories: rank 2's slot is left out and rebuilt too, every rank ends
// bit-identical, one call, no restore target before the end.
TEST(RecoverJob, ACorruptedChunkASurvivorSendsMakesTheLeaderDecideAgain) {
  TestCluster c(4, "rs:2");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  ASSERT_NE(c.FlipChunk(2, 1, /*served=*/true), SIZE_MAX);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  EXPECT_EQ(r->decision.step, 5);
  EXPECT_TRUE(r->redecided);
  EXPECT_FALSE(r->deferred_verify);  // the second attempt's
  EXPECT_NE(r->first_attempt.find("recovery on node 1"), std::string::npos) << r->first_attempt;
  EXPECT_NE(r->first_attempt.find("DataLoss"), std::string::npos) << r->first_attempt;
  EXPECT_EQ(RebuiltRanks(*r), (std::vector<int>{1, 2}));
  ExpectEveryRankRestored(c, 4, 5);
}

// The same for a byte no other node reads (rank 2's private state): its
// own node's check alongside the rebuild finds it, before the target is set.
TEST(RecoverJob, ACorruptedKeptChunkOfASurvivorMakesTheLeaderDecideAgain) {
  TestCluster c(4, "rs:2");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  ASSERT_NE(c.FlipChunk(2, 1, /*served=*/false), SIZE_MAX);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  EXPECT_EQ(r->decision.step, 5);
  EXPECT_TRUE(r->redecided);
  EXPECT_NE(r->first_attempt.find("deferred verification on node 2"), std::string::npos)
      << r->first_attempt;
  // Rank 1 was rebuilt by the first attempt too (its inputs were intact),
  // but that attempt's slots are torn before the second decision: rebuilt
  // again with rank 2, never counted on unchecked.
  EXPECT_EQ(RebuiltRanks(*r), (std::vector<int>{1, 2}));
  ExpectEveryRankRestored(c, 4, 5);
}

// A parity corrupted at rest after its node last checked it (the node's
// cached verdict says good): served before the node's deferred check reaches
// it, the rebuild would decode rank 1 from it with checksums computed from
// the decoded bytes; served after, the read fails. Either way the node's
// check finds the parity bad, the leader tears what was rebuilt and decides
// again on verified inventories (the parity left out; rs:2 decodes from the
// others): rank 1 ends bit-identical. (Which of the two happens depends on
// timing; the kept-chunk test above shows the tearing deterministically.)
TEST(RecoverJob, ACorruptedParityServedBeforeItsCheckIsNotTrustedAfterwards) {
  TestCluster c(4, "rs:2");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  ASSERT_GT(c.FlipParities(2, 5), 0);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  EXPECT_EQ(r->decision.step, 5);
  EXPECT_TRUE(r->redecided);
  EXPECT_NE(r->first_attempt.find("parity"), std::string::npos) << r->first_attempt;
  ASSERT_EQ(r->nodes.size(), 1u);
  EXPECT_EQ(r->nodes[0].ranks, std::vector<int>{1});
  ExpectEveryRankRestored(c, 4, 5);
}

// REFT AOR under rs:2 keeps two kAor copies of each ZeRO-1 optimizer shard
// (plan "rs:2+aor:2"). Rank 1's node is lost and the copy of its shard on
// node 2 is corrupt (after node 2's last check): the recovery does not
// restore it but takes the shard from node 3's copy, from memory, at the
// same step, and rank 1 ends bit-identical (its shard included).
TEST(RecoverJob, ACorruptedAorCopyOfALostShardIsReplacedByItsOtherHolderUnderRs2) {
  TestCluster c(4, "rs:2", /*zero=*/1);
  int aor_copies = 0;
  for (const topo::Copy& cp : c.plan().copies) {
    if (cp.kind == topo::CopyKind::kAor && c.plan().pieces[cp.piece].rank == 1) {
      EXPECT_TRUE(cp.node == 2 || cp.node == 3) << cp.node;
      ++aor_copies;
    }
  }
  ASSERT_EQ(aor_copies, 2);
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  ASSERT_EQ(c.FlipAorCopy(2, 5, /*owner=*/1), 1);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  EXPECT_EQ(r->decision.step, 5);
  // The bad copy was found (by the read that streamed it, or by node 2's
  // own check alongside the rebuild) and the leader decided again without
  // it.
  EXPECT_TRUE(r->redecided) << r->decision.reason;
  EXPECT_NE(r->decision.reason.find("rank1/dp on node 3"), std::string::npos) << r->decision.reason;
  EXPECT_EQ(r->decision.reason.find("rank1/dp on node 2"), std::string::npos) << r->decision.reason;
  ExpectEveryRankRestored(c, 4, 5);
}

// Under replicate ("arc+aor") the kAor copy is the optimizer shard's only
// copy in memory: corrupt, it is not restored; the recovery says the shard
// cannot be rebuilt from memory (rank1/dp), sets no restore target, and the
// launcher goes on to the durable tier (docs/recovery.md; not run here).
TEST(RecoverJob, ACorruptedAorCopyWithNoOtherHolderIsNotRestored) {
  TestCluster c(4, "replicate", /*zero=*/1);
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  ASSERT_EQ(c.FlipAorCopy(2, 5, /*owner=*/1), 1);
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->decision.from_memory) << r->decision.reason;
  EXPECT_NE(r->decision.reason.find("rank1/dp"), std::string::npos) << r->decision.reason;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.node(i).restore_target.load(), -1) << i;
}

// Without deferred verification the inventories hash everything first: the
// corrupted slot is left out by the first decision.
TEST(RecoverJob, VerifyFirstLeavesACorruptedSlotOutOfTheFirstDecision) {
  TestCluster c(4, "rs:2");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  c.ReplaceNode(1);
  ASSERT_NE(c.FlipChunk(2, 1, /*served=*/true), SIZE_MAX);
  RecoverOptions o = Options(4);
  o.deferred_verify = false;
  auto r = RecoverJob(c.store(), c.plan(), Token(), o, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->decision.from_memory) << r->decision.reason;
  EXPECT_FALSE(r->redecided);
  EXPECT_FALSE(r->deferred_verify);
  for (int rank = 0; rank < 4; ++rank) c.ExpectRankRestored(rank, 5);
}

TEST(RecoverJob, ANodeWithoutAnAgentIsUnreachableAndItsRanksCannotBeRebuilt) {
  TestCluster c(4, "xor");
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  coord::JobKeys keys(kJob);
  ASSERT_TRUE(c.store().Delete(keys.Node(coord::NodeName(3)), Soon()).ok());
  auto r = RecoverJob(c.store(), c.plan(), Token(), Options(4), Soon());
  // Decide rebuilds rank 3 on node 3, which has no agent to do it.
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("recovery on node 3"), std::string::npos) << r.status();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.node(i).restore_target.load(), -1) << i;
}

}  // namespace
}  // namespace memento::launch
