#include "agent/peer_service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "agent/assemble.h"
#include "agent/cluster_test_util.h"
#include "agent/redundancy_shm.h"
#include "agent/t1_producer.h"
#include "codec/erasure_code.h"
#include "common/checksum.h"
#include "net/peer_protocol.h"
#include "recover/recipe.h"
#include "recover/recover.h"
#include "shm/redundancy_format.h"
#include "shm/shm_test_util.h"

namespace memento::agent {
namespace {

using namespace memento::agent::testing;
using recover::ByteSource;
using recover::ReadRequest;
using recover::SourceKind;

Deadline Soon() { return Deadline::AfterSeconds(20); }

net::JobToken Token(const std::string& secret = "peer-service-test-secret-0123456789") {
  auto t = net::JobToken::FromSecret(secret);
  MEMENTO_CHECK(t.ok());
  return *t;
}

// `n` nodes (one rank each) in one process, each with a real node store and
// redundancy store in a shared-memory scratch dir and a peer service on an
// ephemeral port.
class Cluster {
 public:
  Cluster(int n, topo::Inventory inv, const std::string& policy, bool resident = false)
      : inv_(std::move(inv)),
        plan_(MakeClusterPlan(MakeTestPlan(n, inv_, policy), inv_)),
        resident_(resident) {
    for (int node = 0; node < n; ++node) {
      nodes_.emplace_back(std::make_unique<Node>());
      StartNode(node, dir_.path() + "/node" + std::to_string(node));
    }
  }
  ~Cluster() {
    for (auto& n : nodes_) {
      if (n->service) n->service->Stop();
    }
  }

  // A node lost and replaced: its agent stops, its memory is gone, a fresh
  // agent starts on an empty root (and another port).
  void ReplaceNode(int node) {
    Node& nd = *nodes_[node];
    nd.service.reset();
    nd.red.reset();
    nd.store.reset();
    memento::testing::RemoveTree(nd.root);
    StartNode(node, nd.root + "-replaced");
  }

  struct Node {
    std::string root;
    std::unique_ptr<shm::NodeStore> store;
    std::unique_ptr<ShmRedundancyStore> red;
    std::unique_ptr<PeerService> service;
    std::atomic<int64_t> restore_target{-1};
    std::atomic<int64_t> committed{-1};
    std::atomic<int> pushes_finished{0};
    std::atomic<int64_t> last_pushed_step{-1};
    // False: the service answers "no plan yet" (an agent that restarted and
    // has not read the topology and inventories again); counted.
    std::atomic<bool> has_plan{true};
    std::atomic<int> no_plan_answers{0};
    double plan_wait_s = kDefaultPlanWaitS;
  };
  Node& node(int i) { return *nodes_[i]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  const topo::Plan& plan() const { return plan_->plan; }
  const topo::Inventory& inv() const { return inv_; }
  std::string root(int node_id) const { return nodes_[node_id]->root; }
  uint64_t hash() const { return plan_->hash; }
  // The agent process restarts: same memory, a new peer service on a new port.
  void RestartService(int node_id) {
    nodes_[node_id]->service.reset();
    StartService(node_id);
  }
  // Every rank writes its T0 slot `slot` at `step`.
  void WriteT0(int64_t step, int slot) {
    for (int r = 0; r < plan().topology.num_ranks(); ++r) {
      WriteRankSlot(*node(plan().topology.rank_node[r]).store, inv_, r, slot, step);
    }
  }
  // The agent restarts: its redundancy store is opened again from the files
  // (adoption), told the plan, and a new peer service starts.
  void ReopenRedundancy(int node_id) {
    Node* nd = nodes_[node_id].get();
    nd->service.reset();
    nd->red.reset();
    auto red = ShmRedundancyStore::OpenShm(nd->root, node_id);
    ASSERT_TRUE(red.ok()) << red.status();
    nd->red = std::move(red).value();
    nd->red->SetResidentT0(resident_);
    ASSERT_TRUE(nd->red->SetPlan(plan_->plan).ok());
    StartService(node_id);
  }
  // Replaces the plan (before anything is written): every store and service
  // follows `plan` from now on.
  void UsePlan(const topo::Plan& plan) {
    plan_ = MakeClusterPlan(plan, inv_);
    for (auto& nd : nodes_) ASSERT_TRUE(nd->red->SetPlan(plan_->plan).ok());
  }
  // The generation of `rank`'s slot holding `step` complete on `node`; 0: none.
  uint64_t SlotGeneration(int node_id, int rank, int64_t step) {
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      auto seg = shm::Segment::Open(shm::SlotPath(root(node_id), rank, s), false);
      if (!seg.ok()) continue;
      auto info = shm::ReadSlot(**seg);
      if (info.ok() && info->state == shm::SlotState::kComplete && info->step == step) {
        return info->generation;
      }
    }
    return 0;
  }
  // Every node's T1 of `step`, as the save path makes it: parities encoded
  // from the node's own replica, peer copies pushed over the network by the
  // piece's node, other copies from local memory (or, resident in T0, a
  // reference to the producer rank's slot: T1Producer::ProduceEntries).
  void ProduceRedundancy(int64_t step) {
    for (size_t n = 0; n < nodes_.size(); ++n) ASSERT_TRUE(node(n).red->Ensure(step).ok());
    for (const topo::Copy& cp : plan().copies) {
      const auto bytes = PieceBytes(plan(), inv_, cp.piece, step);
      if (cp.kind == topo::CopyKind::kPeer) {
        ASSERT_TRUE(PushCopy(node(cp.node).service->endpoint(), Token(), step, cp.id, bytes.data(),
                             bytes.size(), Soon())
                        .ok());
        continue;
      }
      auto resident = node(cp.node).red->Resident(step, {SourceKind::kCopy, cp.id});
      ASSERT_TRUE(resident.ok()) << resident.status();
      if (resident->has_value()) {
        ASSERT_EQ((*resident)->source.rank, cp.producer_rank);
        const uint64_t gen = SlotGeneration(cp.node, cp.producer_rank, step);
        ASSERT_NE(gen, 0u) << "rank " << cp.producer_rank << " has no slot of step " << step;
        ASSERT_TRUE(
            node(cp.node).red->FinishResidentEntry(step, {SourceKind::kCopy, cp.id}, gen).ok());
        continue;
      }
      auto buf = node(cp.node).red->EntryBuffer(step, {SourceKind::kCopy, cp.id});
      ASSERT_TRUE(buf.ok()) << buf.status();
      std::memcpy(*buf, bytes.data(), bytes.size());
      ASSERT_TRUE(node(cp.node).red->FinishEntry(step, {SourceKind::kCopy, cp.id}).ok());
    }
    for (const topo::Stripe& st : plan().stripes) {
      auto code = codec::ErasureCode::Create(
          st.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, st.k, st.f);
      ASSERT_TRUE(code.ok()) << code.status();
      std::vector<std::vector<uint8_t>> blocks(st.k, std::vector<uint8_t>(st.block_bytes, 0));
      std::vector<const uint8_t*> data;
      for (int i = 0; i < st.k; ++i) {
        const topo::StripeBlock& b = st.data[i];
        const auto piece = PieceBytes(plan(), inv_, b.piece, step);
        std::memcpy(blocks[i].data(), piece.data() + b.offset, b.length);
        data.push_back(blocks[i].data());
      }
      std::vector<uint8_t*> out;
      for (uint32_t pid : st.parities) {
        const topo::Parity& par = plan().parities[pid];
        auto buf = node(par.node).red->EntryBuffer(step, {SourceKind::kParity, pid});
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
    for (size_t n = 0; n < nodes_.size(); ++n) ASSERT_TRUE(node(n).red->Complete(step)) << n;
  }
  // Parity `pid` of `step` by the reference codec over the pieces' bytes.
  std::vector<uint8_t> ParityBytes(uint32_t pid, int64_t step) const {
    const topo::Parity& par = plan().parities[pid];
    const topo::Stripe& st = plan().stripes[par.stripe];
    auto code = codec::ErasureCode::Create(
        st.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, st.k, st.f);
    MEMENTO_CHECK(code.ok());
    std::vector<std::vector<uint8_t>> blocks(st.k, std::vector<uint8_t>(st.block_bytes, 0));
    std::vector<const uint8_t*> data;
    for (int i = 0; i < st.k; ++i) {
      const topo::StripeBlock& b = st.data[i];
      const auto piece = PieceBytes(plan(), inv_, b.piece, step);
      std::memcpy(blocks[i].data(), piece.data() + b.offset, b.length);
      data.push_back(blocks[i].data());
    }
    std::vector<std::vector<uint8_t>> out(st.f, std::vector<uint8_t>(st.block_bytes));
    std::vector<uint8_t*> outp;
    for (auto& o : out) outp.push_back(o.data());
    code->Encode(st.block_bytes, data.data(), outp.data());
    return out[par.index];
  }
  // Every rank writes its slot `slot` at `step` as a client that computes
  // its rank's parities does (docs/reft.md section 4): its tensors plus one
  // parity entry per parity it produces, the parity's bytes.
  void WriteT0WithParities(int64_t step, int slot, uint64_t salt = 0) {
    for (int r = 0; r < plan().topology.num_ranks(); ++r) {
      std::vector<shm::SlotEntrySpec> specs = SlotWriter::WholeEntries(inv_[r]);
      std::map<uint32_t, std::vector<uint8_t>> parities;
      for (uint32_t pid : plan().ranks[r].parities) {
        shm::SlotEntrySpec spec;
        spec.meta = shm::ParityEntryMeta(pid, plan().parities[pid].bytes);
        spec.parity = pid;
        specs.push_back(spec);
        parities[pid] = ParityBytes(pid, step);
        if (salt != 0) parities[pid][0] ^= 0x5a;  // a rewrite with other bytes
      }
      SlotWriter(*node(plan().topology.rank_node[r]).store, specs, r, slot)
          .Write(step, salt, &parities);
    }
  }
  // Every node's T1 of `step` as the agent's save path makes it: its own
  // entries by T1Producer::ProduceEntries from its ranks' slots, peer copies
  // pushed over the network. The producer's error for a node, if any.
  Status ProduceWithT1Producer(int64_t step) {
    for (size_t n = 0; n < nodes_.size(); ++n) MEMENTO_RETURN_IF_ERROR(node(n).red->Ensure(step));
    for (const topo::Copy& cp : plan().copies) {
      if (cp.kind != topo::CopyKind::kPeer) continue;
      const auto bytes = PieceBytes(plan(), inv_, cp.piece, step);
      MEMENTO_RETURN_IF_ERROR(PushCopy(node(cp.node).service->endpoint(), Token(), step, cp.id,
                                       bytes.data(), bytes.size(), Soon()));
    }
    const net::JobToken token = Token();
    for (size_t n = 0; n < nodes_.size(); ++n) {
      std::map<int, RankSlotView> views;
      for (int r = 0; r < plan().topology.num_ranks(); ++r) {
        if (plan().topology.rank_node[r] != static_cast<int>(n)) continue;
        for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
          auto seg = node(n).store->SlotSegment(r, slot);
          if (seg == nullptr) continue;
          auto info = shm::ReadSlot(*seg);
          if (!info.ok() || info->state != shm::SlotState::kComplete || info->step != step) {
            continue;
          }
          RankSlotView v;
          v.rank = r;
          v.slot = slot;
          v.segment = std::move(seg);
          v.info = std::move(*info);
          views.emplace(r, std::move(v));
        }
      }
      T1Producer producer(&plan(), static_cast<int>(n), node(n).red.get(), &token,
                          [](int) -> Result<std::string> { return NotFoundError("no network"); });
      Status st = producer.ProduceEntries(step, views);
      if (!st.ok()) return Status(st.code(), fmt::format("node {}: {}", n, st.message()));
    }
    return Status::Ok();
  }
  recover::NodeInventory InventoryOf(int node_id) {
    auto client = Connect(node_id);
    auto reply = client->Call(net::kPeerInventory, R"({"verify": true})", Soon());
    EXPECT_TRUE(reply.ok()) << reply.status();
    auto inv = recover::NodeInventoryFromJson(nlohmann::json::parse(*reply));
    EXPECT_TRUE(inv.ok()) << inv.status();
    return *inv;
  }
  std::unique_ptr<net::RpcClient> Connect(int node_id) {
    auto hp = net::ParseHostPort(node(node_id).service->endpoint(), net::PortUse::kConnect);
    EXPECT_TRUE(hp.ok());
    auto c = net::RpcClient::Connect(hp->host, hp->port, Token(), Soon());
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(c).value();
  }

 private:
  void StartNode(int node, const std::string& root) {
    Node* nd = nodes_[node].get();
    nd->root = root;
    auto store = shm::NodeStore::Open({root, kJob, node, 0});
    ASSERT_TRUE(store.ok()) << store.status();
    nd->store = std::move(store).value();
    auto red = ShmRedundancyStore::OpenShm(root, node);
    ASSERT_TRUE(red.ok()) << red.status();
    nd->red = std::move(red).value();
    nd->red->SetResidentT0(resident_);
    ASSERT_TRUE(nd->red->SetPlan(plan_->plan).ok());
    StartService(node);
  }
  void StartService(int node) {
    Node* nd = nodes_[node].get();
    PeerServiceOptions o;
    o.job = kJob;
    o.node = node;
    o.store = nd->store.get();
    o.redundancy = nd->red.get();
    o.plan = [this, nd, node]() -> Result<std::shared_ptr<const ClusterPlan>> {
      if (!nd->has_plan.load()) {
        nd->no_plan_answers.fetch_add(1);
        return FailedPreconditionError("node " + std::to_string(node) + " has no plan yet");
      }
      return plan_;
    };
    o.plan_wait_s = nd->plan_wait_s;
    o.endpoint_of = [this](int peer) -> Result<std::string> {
      if (peer < 0 || peer >= static_cast<int>(nodes_.size()) || !nodes_[peer]->service) {
        return NotFoundError("no node " + std::to_string(peer));
      }
      return nodes_[peer]->service->endpoint();
    };
    o.committed = [nd] { return nd->committed.load(); };
    o.on_push_finished = [nd](int64_t step, ByteSource e) {
      EXPECT_EQ(e.kind, SourceKind::kCopy);
      nd->pushes_finished.fetch_add(1);
      nd->last_pushed_step = step;
    };
    o.set_restore_target = [nd](int64_t step, uint64_t) {
      nd->restore_target = step;
      return Status::Ok();
    };
    auto svc = PeerService::Start(std::move(o), Token());
    ASSERT_TRUE(svc.ok()) << svc.status();
    nd->service = std::move(svc).value();
  }

  shm::testing::ShmScratchDir dir_{"memento-peer"};
  topo::Inventory inv_;
  std::shared_ptr<const ClusterPlan> plan_;
  bool resident_ = false;
  std::vector<std::unique_ptr<Node>> nodes_;
};

std::vector<uint8_t> CopyBytes(const Cluster& c, uint32_t copy, int64_t step) {
  return PieceBytes(c.plan(), c.inv(), c.plan().copies[copy].piece, step);
}

// The first peer copy in the plan (held by another node than its piece's).
const topo::Copy* FirstPeerCopy(const topo::Plan& plan) {
  for (const topo::Copy& c : plan.copies) {
    if (c.kind == topo::CopyKind::kPeer && c.node != plan.pieces[c.piece].node) return &c;
  }
  return nullptr;
}

std::string PushBody(const nlohmann::json& head, std::string_view payload) {
  const std::string text = head.dump();
  std::string body(4, '\0');
  const uint32_t n = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) body[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return body + text + std::string(payload);
}

TEST(PeerServiceTest, InventoryListsT0AndRedundancyNewestFirst) {
  Cluster c(3, MakeInventory(3), "xor");
  c.node(1).committed = 4;
  c.WriteT0(4, 0);
  c.WriteT0(5, 1);
  // Node 1 produces its parities of step 5.
  ASSERT_TRUE(c.node(1).red->Ensure(5).ok());
  for (uint32_t id : c.plan().nodes[1].parities) {
    auto buf = c.node(1).red->EntryBuffer(5, {SourceKind::kParity, id});
    ASSERT_TRUE(buf.ok());
    std::memset(*buf, 0x5a, c.plan().parities[id].bytes);
    ASSERT_TRUE(c.node(1).red->FinishEntry(5, {SourceKind::kParity, id}).ok());
  }
  auto client = c.Connect(1);
  for (bool verify : {false, true}) {
    auto reply =
        client->Call(net::kPeerInventory, nlohmann::json{{"verify", verify}}.dump(), Soon());
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto inv = recover::NodeInventoryFromJson(nlohmann::json::parse(*reply));
    ASSERT_TRUE(inv.ok()) << inv.status();
    EXPECT_EQ(inv->node, 1);
    EXPECT_EQ(inv->endpoint, c.node(1).service->endpoint());
    EXPECT_EQ(inv->plan_hash, c.hash());
    EXPECT_EQ(inv->committed, 4);
    ASSERT_EQ(inv->versions.size(), 2u);
    EXPECT_EQ(inv->versions[0].step, 5);
    EXPECT_EQ(inv->versions[0].ranks, std::vector<int>{1});
    EXPECT_EQ(inv->versions[0].parities, c.plan().nodes[1].parities);
    EXPECT_TRUE(inv->versions[0].copies.empty());  // peer copies not pushed yet
    EXPECT_EQ(inv->versions[1].step, 4);
    EXPECT_EQ(inv->versions[1].ranks, std::vector<int>{1});
    EXPECT_TRUE(inv->versions[1].parities.empty());
  }
  // An empty body means verify=false; a bad one is InvalidArgument.
  EXPECT_TRUE(client->Call(net::kPeerInventory, "", Soon()).ok());
  EXPECT_EQ(client->Call(net::kPeerInventory, "{\"verify\": 3}", Soon()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PeerServiceTest, ReadsAPieceThatSpansTensorsLocallyAndFromPeers) {
  Cluster c(3, MakeInventory(3), "xor");
  c.WriteT0(7, 0);
  int spanning = 0;
  for (int rank = 0; rank < 3; ++rank) {
    const uint32_t piece = SpanningPiece(c.plan(), rank);
    if (piece == topo::kNoId) continue;
    ++spanning;
    const int holder = c.plan().pieces[piece].node;
    const auto want = PieceBytes(c.plan(), c.inv(), piece, 7);
    for (int reader_node = 0; reader_node < 3; ++reader_node) {
      std::vector<uint8_t> got(want.size());
      ReadRequest req{7, {SourceKind::kPiece, piece}, 0, want.size()};
      Status s = c.node(reader_node).service->reader().Read(holder, req, got.data(), Soon());
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(got, want) << "piece " << piece << " read by node " << reader_node;
      // A small sub-range (the reply goes through a scratch buffer).
      std::vector<uint8_t> sub(10);
      ReadRequest small{7, {SourceKind::kPiece, piece}, 100, 10};
      ASSERT_TRUE(
          c.node(reader_node).service->reader().Read(holder, small, sub.data(), Soon()).ok());
      EXPECT_TRUE(std::equal(sub.begin(), sub.end(), want.begin() + 100));
    }
  }
  EXPECT_GE(spanning, 1) << "the test plan should cut a piece across tensors";
  // NotFound travels back as NotFound: a step nobody holds.
  std::vector<uint8_t> buf(64);
  const uint32_t p1 = c.plan().ranks[1].pieces[0];
  EXPECT_EQ(c.node(0)
                .service->reader()
                .Read(1, {8, {SourceKind::kPiece, p1}, 0, 64}, buf.data(), Soon())
                .code(),
            StatusCode::kNotFound);
  // Many concurrent reads through the pool.
  const auto want = PieceBytes(c.plan(), c.inv(), p1, 7);
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        std::vector<uint8_t> got(want.size());
        if (c.node(0)
                .service->reader()
                .Read(1, {7, {SourceKind::kPiece, p1}, 0, want.size()}, got.data(), Soon())
                .ok() &&
            got == want) {
          ++good;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 80);
}

TEST(PeerServiceTest, PushCopyInSeveralPartsThenReadIt) {
  Cluster c(3, MakeInventory(3), "xor");
  c.WriteT0(3, 0);
  const topo::Copy* copy = FirstPeerCopy(c.plan());
  ASSERT_NE(copy, nullptr) << "the plan should give private state a peer copy";
  const auto bytes = CopyBytes(c, copy->id, 3);
  ASSERT_GT(bytes.size(), 300u);
  // By hand: three parts through the raw protocol.
  auto client = c.Connect(copy->node);
  const uint64_t total = bytes.size();
  const uint64_t cuts[] = {0, 100, 300, total};
  for (int i = 0; i < 3; ++i) {
    std::string_view part(reinterpret_cast<const char*>(bytes.data()) + cuts[i],
                          cuts[i + 1] - cuts[i]);
    nlohmann::json head = {{"step", 3}, {"copy", copy->id}, {"offset", cuts[i]}, {"total", total}};
    auto r = client->Call(net::kPeerPush, PushBody(head, part), Soon());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, "{}");
    const auto held = c.node(copy->node).red->Holding(3, true).copies;
    EXPECT_EQ(std::count(held.begin(), held.end(), copy->id), i == 2 ? 1 : 0) << "part " << i;
    // The finish callback fires once, after the last part.
    EXPECT_EQ(c.node(copy->node).pushes_finished.load(), i == 2 ? 1 : 0) << "part " << i;
  }
  EXPECT_EQ(c.node(copy->node).last_pushed_step.load(), 3);
  // Read it back from another node through the reader.
  const int other = (copy->node + 1) % 3;
  std::vector<uint8_t> got(total);
  ReadRequest req{3, {SourceKind::kCopy, copy->id}, 0, total};
  ASSERT_TRUE(c.node(other).service->reader().Read(copy->node, req, got.data(), Soon()).ok());
  EXPECT_EQ(got, bytes);
  // A retried push of the same bytes succeeds; other bytes for the finished
  // entry are refused, not silently written over it.
  EXPECT_TRUE(PushCopy(c.node(copy->node).service->endpoint(), Token(), 3, copy->id, bytes.data(),
                       bytes.size(), Soon())
                  .ok());
  auto changed = bytes;
  changed[0] ^= 1;
  EXPECT_EQ(PushCopy(c.node(copy->node).service->endpoint(), Token(), 3, copy->id, changed.data(),
                     changed.size(), Soon())
                .code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.node(other).service->reader().Read(copy->node, req, got.data(), Soon()).ok());
  EXPECT_EQ(got, bytes);
  // A push of a step not newer than the node's committed one is refused.
  c.node(copy->node).committed = 3;
  Status late = PushCopy(c.node(copy->node).service->endpoint(), Token(), 2, copy->id, bytes.data(),
                         bytes.size(), Soon());
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("committed"), std::string::npos) << late;
  // The client helper, on a fresh step.
  const auto bytes4 = CopyBytes(c, copy->id, 4);
  ASSERT_TRUE(PushCopy(c.node(copy->node).service->endpoint(), Token(), 4, copy->id, bytes4.data(),
                       bytes4.size(), Soon())
                  .ok());
  ASSERT_TRUE(
      c.node(other)
          .service->reader()
          .Read(copy->node, {4, {SourceKind::kCopy, copy->id}, 0, total}, got.data(), Soon())
          .ok());
  EXPECT_EQ(got, bytes4);
}

TEST(PeerServiceTest, PushCopyLargerThanOnePart) {
  // 9 MiB + a bit of private state per rank: the helper sends two parts.
  Cluster c(2, MakeInventory(2, 4096, 4096, (9 << 20) + 123), "xor");
  const topo::Copy* copy = FirstPeerCopy(c.plan());
  ASSERT_NE(copy, nullptr);
  std::vector<uint8_t> bytes(c.plan().pieces[copy->piece].bytes);
  ASSERT_GT(bytes.size(), kMaxPushPartBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
  ASSERT_TRUE(PushCopy(c.node(copy->node).service->endpoint(), Token(), 2, copy->id, bytes.data(),
                       bytes.size(), Soon())
                  .ok());
  std::vector<uint8_t> got(bytes.size());
  ASSERT_TRUE(c.node(copy->node)
                  .red->Read({2, {SourceKind::kCopy, copy->id}, 0, bytes.size()}, got.data())
                  .ok());
  EXPECT_EQ(got, bytes);
}

TEST(PeerServiceTest, ReaderReconnectsToARestartedPeer) {
  Cluster c(2, MakeInventory(2), "xor");
  c.WriteT0(3, 0);
  const uint32_t piece = c.plan().ranks[1].pieces[0];
  const auto want = PieceBytes(c.plan(), c.inv(), piece, 3);
  std::vector<uint8_t> got(want.size());
  const ReadRequest req{3, {SourceKind::kPiece, piece}, 0, want.size()};
  ClusterReader& reader = c.node(0).service->reader();
  ASSERT_TRUE(reader.Read(1, req, got.data(), Soon()).ok());  // pools a connection
  const std::string before = c.node(1).service->endpoint();
  c.RestartService(1);
  ASSERT_NE(c.node(1).service->endpoint(), before);
  std::fill(got.begin(), got.end(), 0);
  Status s = reader.Read(1, req, got.data(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, want);
  // A peer that is gone for good is Unavailable (not a hang).
  c.node(1).service->Stop();
  s = reader.Read(1, req, got.data(), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
}

// A live node whose membership key lapsed for a moment (its lease expired on
// a starved host; it registers again within a lease TTL) is waited for, not
// called unreachable: chaos seed 0x5539b994 ended a job with exit 1 that way.
TEST(PeerServiceTest, ReaderWaitsForANodeKeyThatLapsedForAMoment) {
  Cluster c(2, MakeInventory(2), "xor");
  c.WriteT0(3, 0);
  const uint32_t piece = c.plan().ranks[1].pieces[0];
  const auto want = PieceBytes(c.plan(), c.inv(), piece, 3);
  std::atomic<int> asked{0};
  ClusterReaderOptions ro;
  ro.node = 0;
  ro.plan = [&]() -> Result<std::shared_ptr<const ClusterPlan>> {
    return MakeClusterPlan(c.plan(), c.inv());
  };
  // The key is absent for the first three lookups (the node re-registers meanwhile).
  ro.endpoint_of = [&](int n) -> Result<std::string> {
    if (asked.fetch_add(1) < 3) return NotFoundError("key '/memento/job/nodes/node1' not found");
    return c.node(n).service->endpoint();
  };
  ClusterReader reader(ro, Token());
  std::vector<uint8_t> got(want.size());
  Status s = reader.Read(1, {3, {SourceKind::kPiece, piece}, 0, want.size()}, got.data(),
                         Deadline::AfterSeconds(30));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, want);
  EXPECT_GE(asked.load(), 4);
  // A node whose key never comes back is Unavailable once the grace has passed (not a hang).
  ro.endpoint_of = [](int) -> Result<std::string> { return NotFoundError("key not found"); };
  ClusterReader gone(ro, Token());
  s = gone.Read(1, {3, {SourceKind::kPiece, piece}, 0, want.size()}, got.data(),
                Deadline::AfterSeconds(30));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
}

TEST(PeerServiceTest, UnauthenticatedPeerIsRefused) {
  Cluster c(2, MakeInventory(2), "xor");
  auto hp = net::ParseHostPort(c.node(0).service->endpoint(), net::PortUse::kConnect);
  ASSERT_TRUE(hp.ok());
  auto bad = net::RpcClient::Connect(
      hp->host, hp->port, Token("another-jobs-secret-abcdefghijklmnop"), Deadline::AfterSeconds(5));
  if (bad.ok()) {
    // The handshake may only fail on the first call.
    EXPECT_FALSE((*bad)->Call(net::kPeerInventory, "{}", Deadline::AfterSeconds(5)).ok());
  }
  // A reader holding the wrong token cannot read either.
  ClusterReaderOptions ro;
  ro.node = 1;
  ro.plan = [&]() -> Result<std::shared_ptr<const ClusterPlan>> {
    return MakeClusterPlan(c.plan(), c.inv());
  };
  ro.endpoint_of = [&](int n) -> Result<std::string> { return c.node(n).service->endpoint(); };
  ClusterReader stranger(ro, Token("another-jobs-secret-abcdefghijklmnop"));
  std::vector<uint8_t> buf(16);
  Status s =
      stranger.Read(0, {1, {SourceKind::kPiece, 0}, 0, 16}, buf.data(), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  // The server counts a refusal after it has closed the connection, which the client can see first:
  // wait for the count (bounded) instead of reading it once.
  Deadline counted = Deadline::AfterSeconds(10);
  while (c.node(0).service->refused() < 1u && !counted.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(c.node(0).service->refused(), 1u);
}

TEST(PeerServiceTest, MalformedRequestsAreInvalidArgument) {
  Cluster c(3, MakeInventory(3), "xor");
  const topo::Copy* copy = FirstPeerCopy(c.plan());
  ASSERT_NE(copy, nullptr);
  auto client = c.Connect(copy->node);
  auto code = [&](uint32_t method, const std::string& body) {
    return client->Call(method, body, Soon()).status().code();
  };
  EXPECT_EQ(code(net::kPeerRead, "garbage"), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerRead, "[1,2]"), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerRead, R"({"step":1,"kind":"piece","id":0})"),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerRead, R"({"step":1,"kind":"blob","id":0,"offset":0,"length":1})"),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(net::kPeerRead, R"({"step":1,"kind":"piece","id":0,"offset":0,"length":1000000000})"),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerRead, R"({"step":1,"kind":"piece","id":99999,"offset":0,"length":1})"),
            StatusCode::kInvalidArgument);
  // Push: short body, header longer than the body, bad JSON, missing fields,
  // wrong total, a copy not held by this node, an unknown id, bytes past the end.
  EXPECT_EQ(code(net::kPeerPush, "ab"), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerPush, std::string("\xff\x00\x00\x00{}", 6)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerPush, PushBody("not json", "")), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerPush, PushBody({{"step", 1}, {"copy", copy->id}}, "")),
            StatusCode::kInvalidArgument);
  const uint64_t total = c.plan().pieces[copy->piece].bytes;
  EXPECT_EQ(
      code(net::kPeerPush,
           PushBody({{"step", 1}, {"copy", copy->id}, {"offset", 0}, {"total", total + 1}}, "x")),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(net::kPeerPush,
           PushBody({{"step", -1}, {"copy", copy->id}, {"offset", 0}, {"total", total}}, "x")),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerPush,
                 PushBody({{"step", 1}, {"copy", 9999}, {"offset", 0}, {"total", total}}, "x")),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(net::kPeerPush,
           PushBody({{"step", 1}, {"copy", copy->id}, {"offset", total - 1}, {"total", total}},
                    "xy")),
      StatusCode::kInvalidArgument);
  for (const topo::Copy& other : c.plan().copies) {
    if (other.node != copy->node) {
      Status s = client
                     ->Call(net::kPeerPush,
                            PushBody({{"step", 1},
                                      {"copy", other.id},
                                      {"offset", 0},
                                      {"total", c.plan().pieces[other.piece].bytes}},
                                     "x"),
                            Soon())
                     .status();
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("not held by node"), std::string::npos) << s;
      break;
    }
  }
  // A checksum that does not match the bytes (a lost part) is DataLoss.
  std::string payload(total, 'z');
  EXPECT_EQ(code(net::kPeerPush, PushBody({{"step", 1},
                                           {"copy", copy->id},
                                           {"offset", 0},
                                           {"total", total},
                                           {"xxh3", Checksum(payload.data(), payload.size()) + 1}},
                                          payload)),
            StatusCode::kDataLoss);
  // The entry was left unfinished: the right bytes still go in.
  EXPECT_EQ(code(net::kPeerPush, PushBody({{"step", 1},
                                           {"copy", copy->id},
                                           {"offset", 0},
                                           {"total", total},
                                           {"xxh3", Checksum(payload.data(), payload.size())}},
                                          payload)),
            StatusCode::kOk);
  EXPECT_EQ(c.node(copy->node).red->Holding(1, true).copies, std::vector<uint32_t>{copy->id});
  // Recover / restore target.
  EXPECT_EQ(code(net::kPeerRecover, "{}"), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerRecover, nlohmann::json{{"step", 1},
                                                   {"plan_hash", c.hash() + 1},
                                                   {"assemblies", nlohmann::json::array()}}
                                        .dump()),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(net::kPeerSetRestoreTarget, "{\"step\": \"x\"}"), StatusCode::kInvalidArgument);
  // The commit epoch, when given, is a non-negative integer.
  EXPECT_EQ(code(net::kPeerSetRestoreTarget, "{\"step\": 6, \"epoch\": -1}"),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(net::kPeerSetRestoreTarget, "{\"step\": 6, \"epoch\": \"2\"}"),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(client->Call(net::kPeerSetRestoreTarget, "{\"step\": 6}", Soon()).ok());
  EXPECT_EQ(c.node(copy->node).restore_target.load(), 6);
  ASSERT_TRUE(client->Call(net::kPeerSetRestoreTarget, "{\"step\": 5, \"epoch\": 2}", Soon()).ok());
  EXPECT_EQ(c.node(copy->node).restore_target.load(), 5);
  // Unknown method.
  EXPECT_EQ(code(0x4d45ffff, "{}"), StatusCode::kInvalidArgument);
  // The connection still works after all that.
  EXPECT_TRUE(client->Call(net::kPeerInventory, "{}", Soon()).ok());
}

TEST(PeerServiceTest, ReadOfACorruptedEntryIsDataLoss) {
  Cluster c(3, MakeInventory(3), "xor");
  const int holder = 2;
  ASSERT_FALSE(c.plan().nodes[holder].parities.empty());
  const uint32_t parity = c.plan().nodes[holder].parities[0];
  const uint64_t n = c.plan().parities[parity].bytes;
  ASSERT_TRUE(c.node(holder).red->Ensure(9).ok());
  auto buf = c.node(holder).red->EntryBuffer(9, {SourceKind::kParity, parity});
  ASSERT_TRUE(buf.ok());
  for (uint64_t i = 0; i < n; ++i) (*buf)[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(c.node(holder).red->FinishEntry(9, {SourceKind::kParity, parity}).ok());
  (*buf)[n / 2] ^= 0x10;  // rot at rest
  std::vector<uint8_t> got(n);
  Status s = c.node(0).service->reader().Read(holder, {9, {SourceKind::kParity, parity}, 0, n},
                                              got.data(), Soon());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("parity " + std::to_string(parity)), std::string::npos) << s;
  // The verified inventory leaves it out.
  auto inv = c.node(holder).service->Inventory(true);
  for (const auto& v : inv.versions) {
    EXPECT_EQ(std::count(v.parities.begin(), v.parities.end(), parity), 0);
  }
  // A corrupted T0 chunk read by a peer is DataLoss as well.
  c.WriteT0(9, 0);
  const uint32_t piece = c.plan().ranks[1].pieces[0];
  const topo::Segment& seg0 = c.plan().pieces[piece].segments[0];
  {
    auto seg = shm::Segment::Open(shm::SlotPath(c.root(1), 1, 0), true);
    ASSERT_TRUE(seg.ok());
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok());
    for (const auto& t : info->tensors) {
      if (t.meta.name == seg0.tensor) shm::SlotData(**seg)[t.offset + seg0.offset] ^= 1;
    }
  }
  std::vector<uint8_t> piece_bytes(c.plan().pieces[piece].bytes);
  s = c.node(0).service->reader().Read(1, {9, {SourceKind::kPiece, piece}, 0, piece_bytes.size()},
                                       piece_bytes.data(), Soon());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("tensor '" + seg0.tensor + "'"), std::string::npos) << s;
  // A whole chunk goes out unread by the sender, with its table checksum:
  // the receiver finds the rot and discards the bytes.
  c.WriteT0(10, 1);
  const topo::Segment* in_whole = nullptr;  // a segment with a whole chunk in it
  uint64_t whole = 0;
  for (const topo::Segment& sg : c.plan().pieces[piece].segments) {
    whole = (sg.offset + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
    if (whole + kChunkBytes <= sg.offset + sg.length) {
      in_whole = &sg;
      break;
    }
  }
  ASSERT_NE(in_whole, nullptr) << "no whole chunk in the piece";
  {
    auto seg = shm::Segment::Open(shm::SlotPath(c.root(1), 1, 1), true);
    ASSERT_TRUE(seg.ok());
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok());
    for (const auto& t : info->tensors) {
      if (t.meta.name == in_whole->tensor) shm::SlotData(**seg)[t.offset + whole + 5] ^= 1;
    }
  }
  s = c.node(0).service->reader().Read(1, {10, {SourceKind::kPiece, piece}, 0, piece_bytes.size()},
                                       piece_bytes.data(), Soon());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("from node 1"), std::string::npos) << s;
  // The connection stayed usable: an intact read right after succeeds.
  const uint32_t other = c.plan().ranks[2].pieces[0];
  std::vector<uint8_t> other_bytes(c.plan().pieces[other].bytes);
  s = c.node(0).service->reader().Read(2, {10, {SourceKind::kPiece, other}, 0, other_bytes.size()},
                                       other_bytes.data(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(other_bytes, PieceBytes(c.plan(), c.inv(), other, 10));
}

// The whole REFT-load path over real sockets: node 1 is lost and replaced by
// an empty one; the survivors' inventories go to recover::Decide, kPeerRecover
// makes the new node rebuild its rank's T0 slot from the peers' T0 pieces,
// parities (decode) and pushed copies; the slot then holds every byte.
TEST(PeerServiceTest, RecoversALostNodeThroughThePeerProtocol) {
  for (const char* policy : {"xor", "rs:2", "replicate"}) {
    SCOPED_TRACE(policy);
    const int n = 4;
    Cluster c(n, MakeInventory(n), policy);
    c.WriteT0(5, 1);
    c.ProduceRedundancy(5);
    c.ReplaceNode(1);
    std::vector<recover::NodeInventory> live;
    for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
    EXPECT_TRUE(live[1].versions.empty());
    auto d = recover::Decide(c.plan(), live, 5);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->from_memory) << d->reason;
    EXPECT_EQ(d->step, 5);
    ASSERT_FALSE(d->assemblies.empty());
    nlohmann::json assemblies = nlohmann::json::array();
    for (const auto& a : d->assemblies) {
      EXPECT_EQ(a.node, 1);
      assemblies.push_back({{"rank", a.rank}, {"node", a.node}, {"recipe", a.recipe}});
    }
    auto client = c.Connect(1);
    // A caller acting on another plan is refused before anything is written.
    auto stale = client->Call(
        net::kPeerRecover,
        nlohmann::json{{"step", 5}, {"plan_hash", c.hash() ^ 1}, {"assemblies", assemblies}}.dump(),
        Soon());
    EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
    auto reply = client->Call(
        net::kPeerRecover,
        nlohmann::json{{"step", 5}, {"plan_hash", c.hash()}, {"assemblies", assemblies}}.dump(),
        Soon());
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto stats = nlohmann::json::parse(*reply);
    EXPECT_EQ(stats["ranks"], nlohmann::json::array({1}));
    EXPECT_GT(stats["bytes"].get<uint64_t>(), 0u);
    // Rank 1's slot of step 5 is back, verified, with the exact bytes.
    EXPECT_EQ(RanksHolding(*c.node(1).store, {1}, 5, /*verify=*/true), std::vector<int>{1});
    PieceReader reader(c.root(1), kJob);
    for (const TensorMeta& t : c.inv()[1]) {
      const auto want = TensorBytes(t, 1, 5);
      std::vector<uint8_t> got(want.size());
      ASSERT_TRUE(reader.ReadTensorRange(1, 5, t.name, 0, got.size(), got.data()).ok()) << t.name;
      EXPECT_EQ(got, want) << t.name;
    }
    // The restored node now answers inventories with its rank.
    EXPECT_EQ(c.InventoryOf(1).versions.at(0).ranks, std::vector<int>{1});
  }
}

// ---- T1 entries resident in T0 (agent/resident.h, docs/reft.md section 4) ---

namespace resident_test {

// Sends node `node_id` the assemblies of `d` that rebuild ranks on it.
void RecoverOn(Cluster& c, const recover::Decision& d, int node_id, int64_t step) {
  nlohmann::json assemblies = nlohmann::json::array();
  for (const auto& a : d.assemblies) {
    if (a.node != node_id) continue;
    assemblies.push_back({{"rank", a.rank}, {"node", a.node}, {"recipe", a.recipe}});
  }
  if (assemblies.empty()) return;
  auto reply = c.Connect(node_id)->Call(
      net::kPeerRecover,
      nlohmann::json{{"step", step}, {"plan_hash", c.hash()}, {"assemblies", assemblies}}.dump(),
      Soon());
  ASSERT_TRUE(reply.ok()) << "node " << node_id << ": " << reply.status();
}

// `rank`'s whole state at `step` on its node, read back byte for byte.
void ExpectRank(Cluster& c, int rank, int64_t step) {
  const int node_id = c.plan().ranks[rank].node;
  PieceReader reader(c.root(node_id), kJob);
  for (const TensorMeta& t : c.inv()[rank]) {
    const auto want = TensorBytes(t, rank, step);
    std::vector<uint8_t> got(want.size());
    ASSERT_TRUE(reader.ReadTensorRange(rank, step, t.name, 0, got.size(), got.data()).ok())
        << "rank " << rank << " " << t.name;
    EXPECT_EQ(got, want) << "rank " << rank << " " << t.name;
  }
}

// The (node, kind, id) of every whole-piece read of the decision's recipes.
std::vector<std::tuple<int, std::string, uint32_t>> Reads(const recover::Decision& d) {
  std::vector<std::tuple<int, std::string, uint32_t>> out;
  for (const auto& a : d.assemblies) {
    for (const auto& part : a.recipe.at("parts")) {
      if (!part.contains("read")) continue;
      const auto& r = part["read"];
      out.emplace_back(r["node"].get<int>(), r["kind"].get<std::string>(), r["id"].get<uint32_t>());
    }
  }
  return out;
}

// The (node, parity id) of every parity a decode of the decision's recipes takes.
std::vector<std::pair<int, uint32_t>> ParityInputs(const recover::Decision& d) {
  std::vector<std::pair<int, uint32_t>> out;
  for (const auto& a : d.assemblies) {
    for (const auto& part : a.recipe.at("parts")) {
      if (part.at("op") != "decode") continue;
      for (const auto& b : part.at("blocks")) {
        for (const auto& in : b.at("inputs")) {
          if (in.contains("kind") && in["kind"] == "parity") {
            out.emplace_back(in["node"].get<int>(), in["id"].get<uint32_t>());
          }
        }
      }
    }
  }
  return out;
}

// Every way a T1 entry of step 5 resident in T0 is read returns `want`: the
// holder's local read, a streamed and a framed (kPeerRead) read from another
// node, and the part [part_offset, part_offset + part_length); and nothing can
// be written into it. The buffers are filled with a non-zero byte before each
// read, so zero padding the entry serves is checked too.
void ExpectEveryReadServes(Cluster& c, int holder, const ByteSource& entry,
                           const std::vector<uint8_t>& want, uint64_t part_offset,
                           uint64_t part_length, const std::string& what) {
  ReadRequest req{5, entry, 0, want.size()};
  std::vector<uint8_t> got(want.size(), 0xa5);
  ASSERT_TRUE(c.node(holder).red->Read(req, got.data()).ok()) << what;
  EXPECT_EQ(got, want) << "local read of " << what;
  const int other = (holder + 1) % c.size();
  std::fill(got.begin(), got.end(), 0xa5);
  ASSERT_TRUE(c.node(other).service->reader().Read(holder, req, got.data(), Soon()).ok()) << what;
  EXPECT_EQ(got, want) << "streamed read of " << what;
  std::fill(got.begin(), got.end(), 0xa5);
  auto framed = c.Connect(holder)->CallInto(net::kPeerRead, recover::ToJson(req).dump(), got.data(),
                                            got.size(), Soon());
  ASSERT_TRUE(framed.ok()) << framed.status();
  EXPECT_EQ(got, want) << "kPeerRead of " << what;
  std::vector<uint8_t> part(part_length, 0xa5);
  ASSERT_TRUE(c.node(holder).red->Read({5, entry, part_offset, part_length}, part.data()).ok())
      << what;
  EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + part_offset)) << what;
  EXPECT_EQ(c.node(holder).red->EntryBuffer(5, entry).status().code(),
            StatusCode::kFailedPrecondition)
      << what;
}

}  // namespace resident_test

// ARC copies resident in their producer's T0 slot: no bytes in the version
// file, every read (kPeerRead, streamed, local) returns the piece, the
// inventory lists them, and a lost node's rank is rebuilt from them.
TEST(PeerServiceTest, RecoversALostNodeFromT0ResidentCopies) {
  using namespace resident_test;
  const int n = 4;
  Cluster c(n, MakeInventory(n, 3000 * 4 * 16, 5000 * 4 * 16), "replicate", /*resident=*/true);
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  int resident = 0;
  std::vector<uint64_t> arc_bytes(n, 0);
  for (const topo::Copy& cp : c.plan().copies) {
    if (cp.kind != topo::CopyKind::kArc) continue;
    auto r = c.node(cp.node).red->Resident(5, {SourceKind::kCopy, cp.id});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << "copy " << cp.id;
    EXPECT_EQ((*r)->source.rank, cp.producer_rank);
    EXPECT_EQ((*r)->generation, c.SlotGeneration(cp.node, cp.producer_rank, 5));
    arc_bytes[cp.node] += c.plan().pieces[cp.piece].bytes;
    ++resident;
    ExpectEveryReadServes(c, cp.node, {SourceKind::kCopy, cp.id}, CopyBytes(c, cp.id, 5),
                          /*part_offset=*/1000, /*part_length=*/5000,
                          "copy " + std::to_string(cp.id));
  }
  EXPECT_EQ(resident, n) << "one ARC copy per node";
  for (int node = 0; node < n; ++node) {
    // The version file holds headers and the private peer copies only.
    EXPECT_LT(c.node(node).red->bytes_in_use(), arc_bytes[node]) << "node " << node;
    const auto inv = c.InventoryOf(node);
    ASSERT_FALSE(inv.versions.empty());
    std::vector<uint32_t> want = c.plan().nodes[node].copies;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(inv.versions[0].copies, want) << "node " << node;
  }
  c.ReplaceNode(1);
  std::vector<recover::NodeInventory> live;
  for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
  auto d = recover::Decide(c.plan(), live, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->from_memory) << d->reason;
  bool from_resident = false;
  for (const auto& [node, kind, id] : Reads(*d)) {
    from_resident |= kind == "copy" && c.plan().copies[id].kind == topo::CopyKind::kArc;
  }
  EXPECT_TRUE(from_resident) << "rank 1's replicated piece should come from its ARC copy";
  ASSERT_NO_FATAL_FAILURE(RecoverOn(c, *d, 1, 5));
  ExpectRank(c, 1, 5);
}

// A resident copy whose T0 slot was overwritten (a newer step) or rewritten
// (the same step again: another generation) is not listed and not served;
// recovery takes another listed copy.
TEST(PeerServiceTest, AStaleResidentCopyIsNotListedAndAnotherSourceIsChosen) {
  using namespace resident_test;
  const int n = 4;
  const topo::Inventory inv = MakeInventory(n);
  auto t = topo::Topology::Uniform(n, 1, 1, 0, 1);
  ASSERT_TRUE(t.ok());
  auto pol = topo::ParsePolicy("replicate");
  ASSERT_TRUE(pol.ok());
  pol->local_copy = topo::LocalCopy::kFull;  // every node keeps its whole group: several copies
  auto plan = topo::MakePlan(*t, inv, *pol);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (bool rewrite_same_step : {false, true}) {
    SCOPED_TRACE(rewrite_same_step ? "slot rewritten at the same step" : "slot overwritten");
    Cluster c(n, inv, "replicate", /*resident=*/true);
    c.UsePlan(*plan);
    c.WriteT0(5, 1);
    c.ProduceRedundancy(5);
    // Node 2's rank loses its slot of step 5 under the references.
    if (rewrite_same_step) {
      WriteRankSlot(*c.node(2).store, c.inv(), 2, 1, 5, /*salt=*/7);
    } else {
      WriteRankSlot(*c.node(2).store, c.inv(), 2, 1, 6);
    }
    std::vector<uint32_t> stale;
    for (uint32_t id : c.plan().nodes[2].copies) {
      const topo::Copy& cp = c.plan().copies[id];
      if (cp.producer_rank == 2) stale.push_back(id);
    }
    ASSERT_FALSE(stale.empty());
    const auto inv2 = c.InventoryOf(2);
    for (const auto& v : inv2.versions) {
      if (v.step != 5) continue;
      for (uint32_t id : stale) {
        EXPECT_EQ(std::count(v.copies.begin(), v.copies.end(), id), 0)
            << "copy " << id << " listed though its slot no longer holds its bytes";
      }
    }
    for (uint32_t id : stale) {
      const uint64_t bytes = c.plan().pieces[c.plan().copies[id].piece].bytes;
      std::vector<uint8_t> got(bytes);
      Status st = c.node(2).red->Read({5, {SourceKind::kCopy, id}, 0, bytes}, got.data());
      EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
      st = c.node(0).service->reader().Read(2, {5, {SourceKind::kCopy, id}, 0, bytes}, got.data(),
                                            Soon());
      EXPECT_FALSE(st.ok()) << "copy " << id << " served from a stale slot";
    }
    // Node 1 lost: its rank is rebuilt from copies on nodes 0 and 3.
    c.ReplaceNode(1);
    std::vector<recover::NodeInventory> live;
    for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
    if (rewrite_same_step) {
      // Rank 2 holds "step 5" of other bytes: recovery may read its pieces;
      // only the copies it produced are checked here.
      for (const auto& v : live[2].versions) {
        for (uint32_t id : stale) EXPECT_EQ(std::count(v.copies.begin(), v.copies.end(), id), 0);
      }
      continue;
    }
    auto d = recover::Decide(c.plan(), live, 5);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->from_memory) << d->reason;
    for (const auto& [node, kind, id] : Reads(*d)) {
      EXPECT_FALSE(node == 2 && kind == "copy") << "recipe reads stale copy " << id;
    }
    for (int node = 0; node < n; ++node) ASSERT_NO_FATAL_FAILURE(RecoverOn(c, *d, node, 5));
    ExpectRank(c, 1, 5);
    ExpectRank(c, 2, 5);
  }
}

// A version with resident entries is adopted by a restarted agent (format 2)
// and served again once the plan says where they lie; a byte rotted in the
// producer's slot under a resident entry is found: not listed by a verifying
// inventory, DataLoss on read.
TEST(PeerServiceTest, ResidentEntriesAreAdoptedAndRotInTheirSlotIsFound) {
  const int n = 4;
  Cluster c(n, MakeInventory(n, 3000 * 4 * 16, 5000 * 4 * 16), "replicate", /*resident=*/true);
  c.WriteT0(5, 1);
  c.ProduceRedundancy(5);
  const topo::Copy* arc = nullptr;
  for (const topo::Copy& cp : c.plan().copies) {
    if (cp.kind == topo::CopyKind::kArc && cp.node == 2) arc = &cp;
  }
  ASSERT_NE(arc, nullptr);
  const ByteSource entry{SourceKind::kCopy, arc->id};
  const auto want = CopyBytes(c, arc->id, 5);
  const ReadRequest req{5, entry, 0, want.size()};
  // Restarted: adopted, resolved with the plan, the same bytes.
  ASSERT_NO_FATAL_FAILURE(c.ReopenRedundancy(2));
  ASSERT_TRUE(c.node(2).red->Complete(5));
  std::vector<uint8_t> got(want.size());
  ASSERT_TRUE(c.node(2).red->Read(req, got.data()).ok());
  EXPECT_EQ(got, want);
  recover::VersionHolding h = c.node(2).red->Holding(5, /*verify=*/true);
  EXPECT_EQ(std::count(h.copies.begin(), h.copies.end(), arc->id), 1);
  // A byte of the piece rots in rank 2's slot.
  {
    const topo::Segment& seg = c.plan().pieces[arc->piece].segments[0];
    auto slot = shm::Segment::Open(shm::SlotPath(c.root(2), arc->producer_rank, 1), true);
    ASSERT_TRUE(slot.ok());
    auto info = shm::ReadSlot(**slot);
    ASSERT_TRUE(info.ok());
    bool flipped = false;
    for (const auto& t : info->tensors) {
      if (t.meta.name != seg.tensor) continue;
      shm::SlotData(**slot)[t.offset + seg.offset - t.range_offset + 3] ^= 0x20;
      flipped = true;
    }
    ASSERT_TRUE(flipped);
  }
  h = c.node(2).red->Holding(5, /*verify=*/true);
  EXPECT_EQ(std::count(h.copies.begin(), h.copies.end(), arc->id), 0)
      << "a resident copy over rotten bytes is listed";
  ASSERT_NO_FATAL_FAILURE(c.ReopenRedundancy(2));
  Status st = c.node(2).red->Read(req, got.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("fails its checksum"), std::string::npos) << st;
  st = c.node(0).service->reader().Read(2, req, got.data(), Soon());
  EXPECT_FALSE(st.ok()) << "rotten resident bytes served to a peer";
}

// ---- parities resident in T0 (docs/reft.md section 4) ----------------------

class ResidentParityTest : public ::testing::TestWithParam<const char*> {};

// A parity the producer's client computed into its slot is referenced, not
// copied: the version file holds none of its bytes, every read (local,
// streamed, kPeerRead, after the agent restarts) returns the reference
// codec's bytes, the inventory lists it, and lost nodes (one under xor, two
// under rs:2) are rebuilt through it.
TEST_P(ResidentParityTest, RecoversLostNodesFromT0ResidentParities) {
  using namespace resident_test;
  const std::string policy = GetParam();
  const int n = 4;
  Cluster c(n, MakeInventory(n, 3000 * 4 * 16, 5000 * 4 * 16), policy, /*resident=*/true);
  ASSERT_FALSE(c.plan().parities.empty());
  // Every rank's client writes its parities from step 5 on (the plan op).
  for (int r = 0; r < n; ++r) {
    c.node(c.plan().topology.rank_node[r]).red->SetClientParity(r, 5, c.hash());
  }
  c.WriteT0WithParities(5, 1);
  Status st = c.ProduceWithT1Producer(5);
  ASSERT_TRUE(st.ok()) << st;
  std::vector<uint64_t> parity_bytes(n, 0);
  for (const topo::Parity& par : c.plan().parities) {
    const ByteSource entry{SourceKind::kParity, par.id};
    Cluster::Node& holder = c.node(par.node);
    ASSERT_TRUE(holder.red->Complete(5));
    auto r = holder.red->Resident(5, entry);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << "parity " << par.id << " was copied into T1";
    EXPECT_EQ((*r)->source.rank, par.producer_rank);
    EXPECT_EQ((*r)->source.parity, par.id);
    EXPECT_EQ((*r)->generation, c.SlotGeneration(par.node, par.producer_rank, 5));
    parity_bytes[par.node] += par.bytes;
    const auto want = c.ParityBytes(par.id, 5);
    ExpectEveryReadServes(c, par.node, entry, want, /*part_offset=*/100,
                          /*part_length=*/want.size() - 200, "parity " + std::to_string(par.id));
  }
  for (int node = 0; node < n; ++node) {
    if (parity_bytes[node] == 0) continue;
    // Headers and the pushed copies of private state only.
    EXPECT_LT(c.node(node).red->bytes_in_use(), parity_bytes[node]) << "node " << node;
    const auto inv = c.InventoryOf(node);
    ASSERT_FALSE(inv.versions.empty());
    std::vector<uint32_t> want = c.plan().nodes[node].parities;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(inv.versions[0].parities, want) << "node " << node;
  }
  // A restarted agent adopts the version and serves the parities again.
  const topo::Parity& first = c.plan().parities[0];
  ASSERT_NO_FATAL_FAILURE(c.ReopenRedundancy(first.node));
  {
    const auto want = c.ParityBytes(first.id, 5);
    std::vector<uint8_t> got(want.size());
    ASSERT_TRUE(c.node(first.node)
                    .red->Read({5, {SourceKind::kParity, first.id}, 0, want.size()}, got.data())
                    .ok());
    EXPECT_EQ(got, want);
  }
  const std::vector<int> lost = policy == "xor" ? std::vector<int>{1} : std::vector<int>{1, 2};
  for (int node : lost) c.ReplaceNode(node);
  std::vector<recover::NodeInventory> live;
  for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
  auto d = recover::Decide(c.plan(), live, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->from_memory) << d->reason;
  EXPECT_FALSE(ParityInputs(*d).empty()) << "the lost pieces should be decoded through a parity";
  for (int node : lost) ASSERT_NO_FATAL_FAILURE(RecoverOn(c, *d, node, 5));
  for (int node : lost) ExpectRank(c, node, 5);
}

// A resident parity whose producer's slot was overwritten (a newer step) or
// rewritten (the same step again, another generation) is not listed and not
// served; recovery never reads it.
TEST_P(ResidentParityTest, AStaleResidentParityIsNotListedNorServed) {
  using namespace resident_test;
  const std::string policy = GetParam();
  const int n = 4;
  for (bool rewrite_same_step : {false, true}) {
    SCOPED_TRACE(rewrite_same_step ? "slot rewritten at the same step" : "slot overwritten");
    Cluster c(n, MakeInventory(n), policy, /*resident=*/true);
    for (int r = 0; r < n; ++r) {
      c.node(c.plan().topology.rank_node[r]).red->SetClientParity(r, 5, c.hash());
    }
    c.WriteT0WithParities(5, 1);
    Status st = c.ProduceWithT1Producer(5);
    ASSERT_TRUE(st.ok()) << st;
    // Every rank rewrites its slot under the references.
    c.WriteT0WithParities(rewrite_same_step ? 5 : 6, 1, /*salt=*/7);
    std::vector<uint32_t> stale;
    for (uint32_t pid : c.plan().nodes[2].parities) stale.push_back(pid);
    ASSERT_FALSE(stale.empty());
    for (const auto& v : c.InventoryOf(2).versions) {
      for (uint32_t pid : stale) {
        EXPECT_EQ(std::count(v.parities.begin(), v.parities.end(), pid), 0)
            << "parity " << pid << " listed though its slot no longer holds its bytes";
      }
    }
    for (uint32_t pid : stale) {
      const uint64_t bytes = c.plan().parities[pid].bytes;
      std::vector<uint8_t> got(bytes);
      Status read = c.node(2).red->Read({5, {SourceKind::kParity, pid}, 0, bytes}, got.data());
      EXPECT_EQ(read.code(), StatusCode::kNotFound) << read;
      read = c.node(0).service->reader().Read(2, {5, {SourceKind::kParity, pid}, 0, bytes},
                                              got.data(), Soon());
      EXPECT_FALSE(read.ok()) << "parity " << pid << " served from a stale slot";
    }
    if (rewrite_same_step) continue;  // every rank holds "step 5" of other bytes now
    // Every slot moved on to step 6: nothing of step 5 is left in memory but
    // the pushed copies, so recovery of step 5 cannot read the parities.
    c.ReplaceNode(1);
    std::vector<recover::NodeInventory> live;
    for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
    auto d = recover::Decide(c.plan(), live, 5);
    if (d.ok() && d->from_memory) {
      for (const auto& [node, id] : ParityInputs(*d)) {
        ADD_FAILURE() << "recipe decodes from stale parity " << id << " on node " << node;
      }
    }
  }
}

// The versions reference a parity only from the step the client named
// (the plan op's answer) on; a slot without the parity entry then fails
// that version and the later ones keep the parity in T1 again; a version
// before that step keeps it in T1 (the agent encodes it from the slot).
TEST_P(ResidentParityTest, ParitiesAreResidentOnlyFromTheStepTheClientNamed) {
  const std::string policy = GetParam();
  const int n = 4;
  Cluster c(n, MakeInventory(n), policy, /*resident=*/true);
  const topo::Parity& par = c.plan().parities[0];
  const ByteSource entry{SourceKind::kParity, par.id};
  c.node(par.node).red->SetClientParity(par.producer_rank, 7, c.hash());
  // Step 6: before the client's step: whole slots, parity encoded into T1.
  c.WriteT0(6, 0);
  Status st = c.ProduceWithT1Producer(6);
  ASSERT_TRUE(st.ok()) << st;
  auto r6 = c.node(par.node).red->Resident(6, entry);
  ASSERT_TRUE(r6.ok()) << r6.status();
  EXPECT_FALSE(r6->has_value());
  std::vector<uint8_t> got(par.bytes);
  ASSERT_TRUE(c.node(par.node).red->Read({6, entry, 0, par.bytes}, got.data()).ok());
  EXPECT_EQ(got, c.ParityBytes(par.id, 6));
  // A plan hash other than the store's: not resident either.
  c.node(par.node).red->SetClientParity(par.producer_rank, 7, c.hash() ^ 1);
  ASSERT_TRUE(c.node(par.node).red->Ensure(8).ok());
  auto r8 = c.node(par.node).red->Resident(8, entry);
  ASSERT_TRUE(r8.ok());
  EXPECT_FALSE(r8->has_value());
  c.node(par.node).red->SetClientParity(par.producer_rank, 7, c.hash());
  // Step 7 laid out resident, but the client wrote a whole slot.
  c.WriteT0(7, 1);
  st = c.ProduceWithT1Producer(7);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("holds no entry of parity"), std::string::npos) << st;
  EXPECT_FALSE(c.node(par.node).red->Complete(7));
  // Forgotten: step 9 keeps the parity in T1 and completes.
  c.WriteT0(9, 1);
  st = c.ProduceWithT1Producer(9);
  ASSERT_TRUE(st.ok()) << st;
  auto r9 = c.node(par.node).red->Resident(9, entry);
  ASSERT_TRUE(r9.ok());
  EXPECT_FALSE(r9->has_value());
  ASSERT_TRUE(c.node(par.node).red->Read({9, entry, 0, par.bytes}, got.data()).ok());
  EXPECT_EQ(got, c.ParityBytes(par.id, 9));
}

// DP 2 (k = 1): each parity equals its stripe's one data block, which a slot
// without the parity entry holds (whole tensors here): resident in every
// version without the client saying anything, its zero padding read as
// zeros, and a lost node is rebuilt through it.
TEST_P(ResidentParityTest, AParityOfOneBlockIsResidentInThatBlock) {
  using namespace resident_test;
  const std::string policy = GetParam();
  const int n = 2;
  // W / 2 is not 64-byte aligned: one stripe's block is shorter than its parity.
  Cluster c(n, MakeInventory(n, 3001 * 4, 5000 * 4), policy, /*resident=*/true);
  bool padded = false;
  for (const topo::Stripe& s : c.plan().stripes) {
    ASSERT_EQ(s.k, 1);
    padded |= s.data[0].length < s.block_bytes;
  }
  EXPECT_TRUE(padded);
  c.WriteT0(5, 1);
  Status st = c.ProduceWithT1Producer(5);
  ASSERT_TRUE(st.ok()) << st;
  for (const topo::Parity& par : c.plan().parities) {
    const ByteSource entry{SourceKind::kParity, par.id};
    Cluster::Node& holder = c.node(par.node);
    ASSERT_TRUE(holder.red->Complete(5));
    auto r = holder.red->Resident(5, entry);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << "parity " << par.id << " was copied into T1";
    EXPECT_FALSE((*r)->source.segments.empty());
    const auto want = c.ParityBytes(par.id, 5);
    // The tail: zero padding where the data block is shorter than the stripe.
    ExpectEveryReadServes(c, par.node, entry, want, /*part_offset=*/want.size() - 100,
                          /*part_length=*/100, "parity " + std::to_string(par.id));
    EXPECT_LT(holder.red->bytes_in_use(), par.bytes) << "node " << par.node;
  }
  c.ReplaceNode(1);
  std::vector<recover::NodeInventory> live;
  for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
  auto d = recover::Decide(c.plan(), live, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->from_memory) << d->reason;
  EXPECT_FALSE(ParityInputs(*d).empty()) << "rank 1's piece should be decoded through a parity";
  ASSERT_NO_FATAL_FAILURE(RecoverOn(c, *d, 1, 5));
  ExpectRank(c, 1, 5);
}

INSTANTIATE_TEST_SUITE_P(Codes, ResidentParityTest, ::testing::Values("xor", "rs:2"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "xor" ? "xor" : "rs_2";
                         });

// ---- restore-time assembly (agent/assemble.h, docs/reft.md section 3) -------

namespace assemble_test {

// The staged slot of `rank`: complete, every chunk verified, each tensor
// equal to the rank's bytes at `step`.
void ExpectStagedSlot(const Cluster& c, const std::string& path, int rank, int64_t step) {
  auto seg = shm::Segment::Open(path, /*writable=*/false);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto info = shm::ReadSlot(**seg);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, shm::SlotState::kComplete);
  EXPECT_EQ(info->step, step);
  EXPECT_EQ(info->rank, rank);
  EXPECT_EQ(info->job_id, kJob);
  ASSERT_TRUE(shm::VerifySlotData(**seg, *info).ok());
  ASSERT_EQ(info->tensors.size(), c.inv()[rank].size());
  for (size_t i = 0; i < info->tensors.size(); ++i) {
    const shm::SavedTensor& t = info->tensors[i];
    EXPECT_EQ(t.meta.name, c.inv()[rank][i].name);
    const auto want = TensorBytes(c.inv()[rank][i], rank, step);
    ASSERT_EQ(t.nbytes, want.size());
    EXPECT_EQ(0,
              std::memcmp((*seg)->data() + info->data_offset + t.offset, want.data(), want.size()))
        << "tensor " << t.meta.name << " of rank " << rank;
  }
}

// Flips one byte of tensor `tensor` at `offset` in `rank`'s slot `slot`.
void Rot(const Cluster& c, int node, int rank, int slot, const std::string& tensor,
         uint64_t offset) {
  auto seg = shm::Segment::Open(shm::SlotPath(c.root(node), rank, slot), true);
  ASSERT_TRUE(seg.ok());
  auto info = shm::ReadSlot(**seg);
  ASSERT_TRUE(info.ok());
  for (const auto& t : info->tensors) {
    if (t.meta.name == tensor) shm::SlotData(**seg)[t.offset + offset] ^= 0x40;
  }
}

// The longest replicated segment of the pieces `holder` holds.
const topo::Segment& HeldSegment(const topo::Plan& plan, int holder) {
  const topo::Segment* best = &plan.pieces[0].segments[0];
  for (uint32_t id : plan.ranks[holder].pieces) {
    const topo::Piece& p = plan.pieces[id];
    if (p.kind != topo::PieceKind::kReplicatedShard) continue;
    for (const topo::Segment& s : p.segments) {
      if (s.length > best->length || best == &plan.pieces[0].segments[0]) best = &s;
    }
  }
  EXPECT_NE(best, &plan.pieces[0].segments[0]) << "rank " << holder << " holds no replicated piece";
  return *best;
}

}  // namespace assemble_test

// Every rank's whole state comes back from the pieces of its sharding group:
// its own from its node's memory, the others from the peers that hold them.
// Bytes of the rank's own slot outside its pieces are not read: a byte rotted
// there does not reach the staged slot.
TEST(AssembleTest, StagesEveryRankFromLocalAndRemotePieces) {
  using namespace assemble_test;
  for (const char* policy : {"xor", "replicate"}) {
    SCOPED_TRACE(policy);
    const int n = 3;
    Cluster c(n, MakeInventory(n), policy);
    c.WriteT0(7, 0);
    // Rank 0's slot: a byte of rank 1's piece rots (rank 0 does not hold it).
    // (In its middle: a chunk of this whole-tensor slot may straddle two
    // pieces, and the chunk of a piece that is read is verified whole.)
    const topo::Segment& other = HeldSegment(c.plan(), 1);
    ASSERT_GT(other.length, 3 * kChunkBytes);
    Rot(c, 0, 0, 0, other.tensor, other.offset + other.length / 2);
    for (int rank = 0; rank < n; ++rank) {
      const int node = c.plan().ranks[rank].node;
      auto staged = AssembleRank(*MakeClusterPlan(c.plan(), c.inv()), kJob, rank, 7,
                                 c.node(node).service->reader(), *c.node(node).store, Soon());
      ASSERT_TRUE(staged.ok()) << staged.status();
      EXPECT_EQ(staged->path, shm::AssembledSlotPath(c.root(node), rank));
      EXPECT_GT(staged->bytes, 0u);
      ExpectStagedSlot(c, staged->path, rank, 7);
      // The store's own slots are untouched and unlisted by the staging.
      EXPECT_EQ(c.node(node).store->Ranks(), std::vector<int>{rank});
      // A second assembly replaces the file.
      auto again = AssembleRank(*MakeClusterPlan(c.plan(), c.inv()), kJob, rank, 7,
                                c.node(node).service->reader(), *c.node(node).store, Soon());
      ASSERT_TRUE(again.ok()) << again.status();
      ExpectStagedSlot(c, again->path, rank, 7);
      ASSERT_EQ(unlink(again->path.c_str()), 0);
    }
  }
}

// The sharded save path's slots (docs/reft.md section 2): each rank's slot
// holds only its plan pieces (range entries). Every rank's whole state comes
// back from its group's slots, byte for byte; a slot that lacks a piece's
// bytes is refused naming the tensor, the range and the node.
TEST(AssembleTest, StagesEveryRankFromSlotsOfPieces) {
  using namespace assemble_test;
  for (const char* policy : {"xor", "replicate", "rs:2"}) {
    SCOPED_TRACE(policy);
    const int n = 4;
    Cluster c(n, MakeInventory(n), policy);
    for (int r = 0; r < n; ++r) {
      const int node = c.plan().ranks[r].node;
      SlotWriter(*c.node(node).store, PieceEntries(c.plan(), c.inv(), r, c.plan().ranks[r].pieces),
                 r, 0)
          .Write(7);
      auto seg = shm::Segment::Open(shm::SlotPath(c.root(node), r, 0), false);
      ASSERT_TRUE(seg.ok());
      auto info = shm::ReadSlot(**seg);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_TRUE(shm::HasRangeEntries(info->tensors)) << "rank " << r;
    }
    const auto cp = MakeClusterPlan(c.plan(), c.inv());
    for (int r = 0; r < n; ++r) {
      const int node = c.plan().ranks[r].node;
      auto staged = AssembleRank(*cp, kJob, r, 7, c.node(node).service->reader(),
                                 *c.node(node).store, Soon());
      ASSERT_TRUE(staged.ok()) << staged.status();
      ExpectStagedSlot(c, staged->path, r, 7);
      ASSERT_EQ(unlink(staged->path.c_str()), 0);
    }
    // Rank 2's slot of step 8 lacks the last segment of its replicated piece.
    std::vector<uint32_t> pieces;
    uint32_t cut = topo::kNoId;
    for (uint32_t id : c.plan().ranks[2].pieces) {
      if (c.plan().pieces[id].kind == topo::PieceKind::kReplicatedShard && cut == topo::kNoId) {
        cut = id;
        continue;
      }
      pieces.push_back(id);
    }
    ASSERT_NE(cut, topo::kNoId);
    std::vector<shm::SlotEntrySpec> entries = PieceEntries(c.plan(), c.inv(), 2, pieces);
    const std::vector<shm::SlotEntrySpec> cut_entries = PieceEntries(c.plan(), c.inv(), 2, {cut});
    entries.insert(entries.end(), cut_entries.begin(), cut_entries.end() - 1);
    const topo::Segment& lost = c.plan().pieces[cut].segments.back();
    for (int r = 0; r < n; ++r) {
      const int node = c.plan().ranks[r].node;
      if (r == 2) {
        SlotWriter(*c.node(node).store, entries, r, 1).Write(8);
      } else {
        SlotWriter(*c.node(node).store,
                   PieceEntries(c.plan(), c.inv(), r, c.plan().ranks[r].pieces), r, 1)
            .Write(8);
      }
    }
    auto missing =
        AssembleRank(*cp, kJob, 0, 8, c.node(0).service->reader(), *c.node(0).store, Soon());
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
    EXPECT_NE(missing.status().message().find("tensor '" + lost.tensor + "'"), std::string::npos)
        << missing.status();
    EXPECT_NE(missing.status().message().find("on node " + std::to_string(c.plan().ranks[2].node)),
              std::string::npos)
        << missing.status();
    EXPECT_NE(access(shm::AssembledSlotPath(c.root(0), 0).c_str(), F_OK), 0);
  }
}

// Sharded restore right after an agent restarted: its new peer service
// answers before the agent has read its plan again. The survivors' requests
// for its pieces wait (bounded) for that plan instead of failing the
// restore; a plan that does not come in time fails the request saying so.
TEST(AssembleTest, PieceRequestsWaitForARestartedAgentsPlan) {
  using namespace assemble_test;
  const int n = 4;
  Cluster c(n, MakeInventory(n), "xor");
  for (int r = 0; r < n; ++r) {
    SlotWriter(*c.node(c.plan().ranks[r].node).store,
               PieceEntries(c.plan(), c.inv(), r, c.plan().ranks[r].pieces), r, 0)
        .Write(7);
  }
  const int restarted = c.plan().ranks[2].node;
  ASSERT_NE(restarted, c.plan().ranks[0].node);
  // Node 2's agent restarts: its plan comes back only after a survivor asked
  // for one of its pieces (so the request surely came first).
  c.node(restarted).has_plan = false;
  c.RestartService(restarted);
  std::thread replan([&] {
    const Deadline d = Deadline::AfterSeconds(60);
    while (c.node(restarted).no_plan_answers.load() == 0 && !d.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    c.node(restarted).has_plan = true;
  });
  const auto cp = MakeClusterPlan(c.plan(), c.inv());
  const int node0 = c.plan().ranks[0].node;
  auto staged =
      AssembleRank(*cp, kJob, 0, 7, c.node(node0).service->reader(), *c.node(node0).store, Soon());
  replan.join();
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_GE(c.node(restarted).no_plan_answers.load(), 1);
  ExpectStagedSlot(c, staged->path, 0, 7);
  ASSERT_EQ(unlink(staged->path.c_str()), 0);
  // A plan that does not come back within the wait: the request fails,
  // naming the node and the wait, and nothing is staged.
  c.node(restarted).has_plan = false;
  c.node(restarted).plan_wait_s = 0.3;
  c.RestartService(restarted);
  auto late =
      AssembleRank(*cp, kJob, 0, 7, c.node(node0).service->reader(), *c.node(node0).store, Soon());
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("node " + std::to_string(restarted) + " has no plan yet"),
            std::string::npos)
      << late.status();
  EXPECT_NE(late.status().message().find("waited"), std::string::npos) << late.status();
  EXPECT_NE(access(shm::AssembledSlotPath(c.root(node0), 0).c_str(), F_OK), 0);
}

// A node lost while every slot holds only its rank's pieces: recovery
// rebuilds the lost rank's slot whole (its own pieces from copies or parity,
// the others from the survivors' slots of pieces), and every survivor's
// assembly then reads the lost rank's pieces from the rebuilt slot.
TEST(AssembleTest, AfterANodeLossFromSlotsOfPieces) {
  using namespace assemble_test;
  for (const char* policy : {"xor", "replicate"}) {
    SCOPED_TRACE(policy);
    const int n = 4;
    Cluster c(n, MakeInventory(n), policy);
    for (int r = 0; r < n; ++r) {
      SlotWriter(*c.node(c.plan().ranks[r].node).store,
                 PieceEntries(c.plan(), c.inv(), r, c.plan().ranks[r].pieces), r, 1)
          .Write(5);
    }
    c.ProduceRedundancy(5);
    c.ReplaceNode(1);
    std::vector<recover::NodeInventory> live;
    for (int node = 0; node < n; ++node) live.push_back(c.InventoryOf(node));
    auto d = recover::Decide(c.plan(), live, 5);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->from_memory) << d->reason;
    nlohmann::json assemblies = nlohmann::json::array();
    for (const auto& a : d->assemblies) {
      assemblies.push_back({{"rank", a.rank}, {"node", a.node}, {"recipe", a.recipe}});
    }
    auto reply = c.Connect(1)->Call(
        net::kPeerRecover,
        nlohmann::json{{"step", 5}, {"plan_hash", c.hash()}, {"assemblies", assemblies}}.dump(),
        Soon());
    ASSERT_TRUE(reply.ok()) << reply.status();
    const auto cp = MakeClusterPlan(c.plan(), c.inv());
    for (int r = 0; r < n; ++r) {
      const int node = c.plan().ranks[r].node;
      auto staged = AssembleRank(*cp, kJob, r, 5, c.node(node).service->reader(),
                                 *c.node(node).store, Soon());
      ASSERT_TRUE(staged.ok()) << "rank " << r << ": " << staged.status();
      ExpectStagedSlot(c, staged->path, r, 5);
      ASSERT_EQ(unlink(staged->path.c_str()), 0);
    }
  }
}

// A piece whose bytes fail their checksum at the holder is refused, naming
// the tensor and the node; a holder without the step is named too. Nothing
// staged is left behind.
TEST(AssembleTest, RefusesACorruptOrMissingPieceNamingIt) {
  using namespace assemble_test;
  const int n = 3;
  Cluster c(n, MakeInventory(n), "xor");
  c.WriteT0(7, 0);
  const auto cp = MakeClusterPlan(c.plan(), c.inv());
  const topo::Segment& seg1 = HeldSegment(c.plan(), 1);
  Rot(c, 1, 1, 0, seg1.tensor, seg1.offset + 1);
  auto bad = AssembleRank(*cp, kJob, 0, 7, c.node(0).service->reader(), *c.node(0).store, Soon());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find("tensor '" + seg1.tensor + "'"), std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("node 1"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("assembling rank 0 at step 7"), std::string::npos)
      << bad.status();
  EXPECT_NE(access(shm::AssembledSlotPath(c.root(0), 0).c_str(), F_OK), 0);
  // Rank 1 itself, on node 1, finds the rot in its own slot.
  auto own = AssembleRank(*cp, kJob, 1, 7, c.node(1).service->reader(), *c.node(1).store, Soon());
  EXPECT_EQ(own.status().code(), StatusCode::kDataLoss) << own.status();

  // Node 2 lost its memory: its piece of step 7 is nowhere; named.
  c.WriteT0(8, 1);
  c.ReplaceNode(2);
  auto missing =
      AssembleRank(*cp, kJob, 0, 8, c.node(0).service->reader(), *c.node(0).store, Soon());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  const uint32_t p2 = c.plan().ranks[2].pieces[0];
  EXPECT_NE(missing.status().message().find("on node 2"), std::string::npos) << missing.status();
  EXPECT_NE(missing.status().message().find("piece " + std::to_string(p2)), std::string::npos)
      << missing.status();
  EXPECT_NE(access(shm::AssembledSlotPath(c.root(0), 0).c_str(), F_OK), 0);
  // A rank of another node, or none at all, is refused before anything is read.
  EXPECT_EQ(AssembleRank(*cp, kJob, 1, 8, c.node(0).service->reader(), *c.node(0).store, Soon())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AssembleRank(*cp, kJob, 9, 8, c.node(0).service->reader(), *c.node(0).store, Soon())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// The plan's pieces must tile each tensor the rank registered: a gap, an
// overlap or a tensor the rank lacks is named with its byte range.
TEST(AssembleTest, PiecesMustTileEveryTensor) {
  const int n = 3;
  const topo::Inventory inv = MakeInventory(n);
  const topo::Plan plan = MakeTestPlan(n, inv, "xor");
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(recover::CheckPiecesTile(plan, rank, inv[rank]).ok()) << rank;
  }
  // "a" registered longer than the plan cut it: its tail is in no piece.
  std::vector<TensorMeta> longer = inv[0];
  longer[0].shape = {longer[0].shape[0] + 16};
  Status s = recover::CheckPiecesTile(plan, 0, longer);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("bytes [12000, 12064) of tensor 'a'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("in no piece"), std::string::npos) << s;
  // Shorter: a piece runs past its end.
  std::vector<TensorMeta> shorter = inv[0];
  shorter[1].shape = {shorter[1].shape[0] - 4};
  s = recover::CheckPiecesTile(plan, 0, shorter);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("tensor 'b'"), std::string::npos) << s;
  // A tensor the plan cuts that the rank lacks.
  std::vector<TensorMeta> without(inv[0].begin() + 1, inv[0].end());
  s = recover::CheckPiecesTile(plan, 0, without);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("tensor 'a', which the rank does not register"), std::string::npos)
      << s;
  // Overlap: a plan whose two pieces both claim the start of "a".
  topo::Plan overlap = plan;
  for (topo::Piece& p : overlap.pieces) {
    if (p.kind == topo::PieceKind::kReplicatedShard && p.segments[0].offset > 0 &&
        p.segments[0].tensor == "a") {
      p.segments[0].offset -= 64;
      break;
    }
  }
  s = recover::CheckPiecesTile(overlap, 0, inv[0]);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("in two pieces"), std::string::npos) << s;
}

}  // namespace
}  // namespace memento::agent
