// Membership: leases, heartbeats, signals, OFFLINE on expiry, re-registration.
#include "coord/membership.h"

#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/clock.h"
#include "coord/cluster_view.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"

namespace memento::coord {
namespace {

Deadline Soon() { return Deadline::AfterSeconds(10); }

NodeState Find(Store& store, const std::string& node) {
  auto states = ReadClusterState(store, "job", Soon());
  EXPECT_TRUE(states.ok()) << states.status();
  for (const auto& s : *states) {
    if (s.node == node) return s;
  }
  ADD_FAILURE() << "node " << node << " not found";
  return {};
}

// Polls until the node's signal is `want` (bounded; not a timing assertion).
bool WaitForSignal(Store& store, const std::string& node, NodeSignal want) {
  Deadline d = Soon();
  while (!d.expired()) {
    if (Find(store, node).record.signal == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

MembershipOptions Options(const std::string& node, double ttl) {
  MembershipOptions o;
  o.job = "job";
  o.node = node;
  o.endpoint = "127.0.0.1:9" + node.substr(1);
  o.ttl_s = ttl;
  return o;
}

TEST(SignalRecordTest, RoundTrip) {
  SignalRecord r{NodeSignal::kCompleted, 42, 123, "all pieces verified"};
  auto back = SignalRecord::Decode(r.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->signal, NodeSignal::kCompleted);
  EXPECT_EQ(back->step, 42);
  EXPECT_EQ(back->detail, "all pieces verified");
  EXPECT_FALSE(SignalRecord::Decode("BOGUS 1 2").ok());
  EXPECT_FALSE(SignalRecord::Decode("").ok());
}

TEST(MembershipTest, SignalsHeartbeatsAndOffline) {
  MemoryStore store;
  auto a = Membership::Join(&store, Options("n0", 0.3), Soon());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Membership::Join(&store, Options("n1", 0.3), Soon());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Find(store, "n0").record.signal, NodeSignal::kHealthy);
  EXPECT_TRUE(Find(store, "n0").alive);
  EXPECT_EQ(Find(store, "n0").endpoint, "127.0.0.1:90");

  ASSERT_TRUE((*a)->SetSignal(NodeSignal::kSnap, 7, "", Soon()).ok());
  ASSERT_TRUE(
      (*b)->SetSignal(NodeSignal::kUnhealthy, 6, "trainer rank 3 exited (signal 9)", Soon()).ok());
  EXPECT_EQ((*a)->SetSignal(NodeSignal::kOffline, 7, "", Soon()).code(),
            StatusCode::kInvalidArgument);
  // Alive well past the TTL thanks to the heartbeat.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  NodeState sa = Find(store, "n0");
  EXPECT_TRUE(sa.alive);
  EXPECT_EQ(sa.record.signal, NodeSignal::kSnap);
  EXPECT_EQ(sa.record.step, 7);
  NodeState sb = Find(store, "n1");
  EXPECT_EQ(sb.record.signal, NodeSignal::kUnhealthy);
  EXPECT_EQ(sb.record.detail, "trainer rank 3 exited (signal 9)");

  // n0 crashes (heartbeat stops without a goodbye): OFFLINE once the lease expires.
  a->reset();
  EXPECT_TRUE(WaitForSignal(store, "n0", NodeSignal::kOffline));
  EXPECT_FALSE(Find(store, "n0").alive);
  EXPECT_EQ(Find(store, "n0").record.step, 7);  // last report still visible
  // n1 leaves gracefully: OFFLINE at once.
  ASSERT_TRUE((*b)->Leave(Soon()).ok());
  EXPECT_EQ(Find(store, "n1").record.signal, NodeSignal::kOffline);
}

TEST(MembershipTest, ReRegistersWhenTheStoreForgetsTheLease) {
  MemoryStore store;
  std::atomic<int> hook{0};
  MembershipOptions o = Options("n0", 0.3);
  o.on_reregister = [&] {
    hook.fetch_add(1);
    return Status::Ok();
  };
  auto m = Membership::Join(&store, o, Soon());
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->SetSignal(NodeSignal::kCompleted, 9, "", Soon()).ok());
  LeaseId first = (*m)->lease();
  // The store loses the lease (as a restarted store would).
  ASSERT_TRUE(store.RevokeLease(first, Soon()).ok());
  ASSERT_TRUE(store.Delete(JobKeys("job").Signal("n0"), Soon()).ok());
  Deadline d = Soon();
  while (hook.load() == 0 && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(hook.load(), 1);
  while ((*m)->reregistrations() == 0 && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*m)->reregistrations(), 1u);
  EXPECT_NE((*m)->lease(), first);
  NodeState s = Find(store, "n0");
  EXPECT_TRUE(s.alive);
  EXPECT_EQ(s.record.signal, NodeSignal::kCompleted);  // restored
  EXPECT_EQ(s.record.step, 9);
}

TEST(MembershipTest, OverTcpAndBadNames) {
  auto token = net::JobToken::FromSecret("membership-token-0123456").value();
  auto server = EmbeddedStoreServer::Start("127.0.0.1", 0, token).value();
  StoreClient client("127.0.0.1", server->port(), token);
  auto m = Membership::Join(&client, Options("n5", 1.0), Soon());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(Find(server->store(), "n5").alive);
  MembershipOptions bad = Options("n5", 1.0);
  bad.node = "has/slash";
  EXPECT_EQ(Membership::Join(&client, bad, Soon()).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*m)->Leave(Soon()).ok());
}

}  // namespace
}  // namespace memento::coord

namespace memento::coord {
namespace {

TEST(ClusterViewTest, TableAndJson) {
  MemoryStore store;
  auto m = Membership::Join(&store, Options("n0", 5), Soon()).value();
  ASSERT_TRUE(m->SetSignal(NodeSignal::kSnap, 12, "copying", Soon()).ok());
  ASSERT_TRUE(store.Set(JobKeys("job").Signal("n9"), "COMPLETED 11 1 gone", Soon()).ok());
  ASSERT_TRUE(PublishCommit(store, "job", 11, 1, Soon()).ok());
  auto snap = ReadClusterSnapshot(store, "job", Soon());
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->committed, 11);
  std::string table = FormatClusterTable(*snap, WallNanos());
  EXPECT_NE(table.find("committed step: 11"), std::string::npos) << table;
  EXPECT_NE(table.find("SNAP"), std::string::npos) << table;
  EXPECT_NE(table.find("OFFLINE"), std::string::npos) << table;  // n9 has no lease
  auto j = nlohmann::json::parse(FormatClusterJson(*snap, WallNanos()));
  EXPECT_EQ(j["committed"], 11);
  ASSERT_EQ(j["nodes"].size(), 2u);
  EXPECT_EQ(j["nodes"][0]["node"], "n0");
  EXPECT_EQ(j["nodes"][0]["signal"], "SNAP");
  EXPECT_EQ(j["nodes"][0]["alive"], true);
  EXPECT_EQ(j["nodes"][1]["signal"], "OFFLINE");
  EXPECT_EQ(j["nodes"][1]["step"], 11);
}

}  // namespace
}  // namespace memento::coord
