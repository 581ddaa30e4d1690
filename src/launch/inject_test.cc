#include "launch/inject.h"

#include "gtest/gtest.h"

namespace memento::launch {
namespace {

TEST(ParseInjections, Empty) {
  auto r = ParseInjections("", 8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
  r = ParseInjections("  ", 8, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(ParseInjections, Several) {
  auto r = ParseInjections("kill-rank:3@step=40, kill-node:1@step=80,kill-agent:0@step=0", 8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].kind, InjectKind::kKillRank);
  EXPECT_EQ((*r)[0].target, 3);
  EXPECT_EQ((*r)[0].step, 40);
  EXPECT_EQ((*r)[1].kind, InjectKind::kKillNode);
  EXPECT_EQ((*r)[1].target, 1);
  EXPECT_EQ((*r)[1].step, 80);
  EXPECT_EQ((*r)[2].kind, InjectKind::kKillAgent);
  EXPECT_EQ((*r)[2].step, 0);
  EXPECT_EQ((*r)[0].ToString(), "kill-rank:3@step=40");
  EXPECT_EQ((*r)[1].ToString(), "kill-node:1@step=80");
  EXPECT_EQ((*r)[2].ToString(), "kill-agent:0@step=0");
}

TEST(ParseInjections, RoundTrip) {
  for (const char* text : {"kill-rank:7@step=12345678901", "kill-node:3@step=1",
                           "corrupt-rank:5@step=9", "corrupt-durable@step=4"}) {
    auto r = ParseInjections(text, 8, 4);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0].ToString(), text);
  }
}

TEST(ParseInjections, KillStore) {
  auto r = ParseInjections("kill-store@step=12,kill-store@recovery=0,kill-node:1@step=20", 8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].kind, InjectKind::kKillStore);
  EXPECT_EQ((*r)[0].step, 12);
  EXPECT_EQ((*r)[0].recovery, -1);
  EXPECT_EQ((*r)[0].ToString(), "kill-store@step=12");
  EXPECT_EQ((*r)[1].kind, InjectKind::kKillStore);
  EXPECT_EQ((*r)[1].recovery, 0);
  EXPECT_EQ((*r)[1].ToString(), "kill-store@recovery=0");
  EXPECT_EQ((*r)[2].recovery, -1);
  EXPECT_EQ((*r)[2].ToString(), "kill-node:1@step=20");
}

TEST(ParseInjections, AgentAndNodeKillsDuringARecovery) {
  auto r = ParseInjections("kill-agent:2@recovery=1,kill-node:3@recovery=0", 8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].kind, InjectKind::kKillAgent);
  EXPECT_EQ((*r)[0].target, 2);
  EXPECT_EQ((*r)[0].recovery, 1);
  EXPECT_EQ((*r)[0].ToString(), "kill-agent:2@recovery=1");
  EXPECT_EQ((*r)[1].kind, InjectKind::kKillNode);
  EXPECT_EQ((*r)[1].target, 3);
  EXPECT_EQ((*r)[1].recovery, 0);
  EXPECT_EQ((*r)[1].ToString(), "kill-node:3@recovery=0");
}

// @transfer=K: the same kills while recovery K's rebuild moves bytes.
TEST(ParseInjections, AgentAndNodeKillsWhileARecoveryMovesBytes) {
  auto r = ParseInjections("kill-agent:2@transfer=0,kill-node:1@transfer=3,kill-node:1@recovery=3",
                           8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].kind, InjectKind::kKillAgent);
  EXPECT_EQ((*r)[0].target, 2);
  EXPECT_EQ((*r)[0].recovery, 0);
  EXPECT_TRUE((*r)[0].in_transfer);
  EXPECT_EQ((*r)[0].ToString(), "kill-agent:2@transfer=0");
  EXPECT_EQ((*r)[1].kind, InjectKind::kKillNode);
  EXPECT_EQ((*r)[1].recovery, 3);
  EXPECT_TRUE((*r)[1].in_transfer);
  EXPECT_EQ((*r)[1].ToString(), "kill-node:1@transfer=3");
  EXPECT_FALSE((*r)[2].in_transfer);
  EXPECT_EQ((*r)[2].ToString(), "kill-node:1@recovery=3");
}

// @durable=K: the same kills during recovery K's durable-tier load; the same
// entry given again fires on the next load try.
TEST(ParseInjections, AgentAndNodeKillsWhileADurableVersionLoads) {
  auto r =
      ParseInjections("kill-agent:3@durable=0,kill-agent:3@durable=0,kill-node:1@durable=2", 8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].kind, InjectKind::kKillAgent);
  EXPECT_EQ((*r)[0].target, 3);
  EXPECT_EQ((*r)[0].recovery, 0);
  EXPECT_TRUE((*r)[0].in_durable_load);
  EXPECT_FALSE((*r)[0].in_transfer);
  EXPECT_EQ((*r)[0].ToString(), "kill-agent:3@durable=0");
  EXPECT_EQ((*r)[1].ToString(), "kill-agent:3@durable=0");
  EXPECT_EQ((*r)[2].kind, InjectKind::kKillNode);
  EXPECT_EQ((*r)[2].recovery, 2);
  EXPECT_TRUE((*r)[2].in_durable_load);
  EXPECT_EQ((*r)[2].ToString(), "kill-node:1@durable=2");
}

TEST(ParseInjections, TheRecoveryLeadersNode) {
  auto r = ParseInjections("kill-agent:leader@recovery=0,kill-node:leader@recovery=2", 8, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].kind, InjectKind::kKillAgent);
  EXPECT_EQ((*r)[0].target, Injection::kLeader);
  EXPECT_EQ((*r)[0].recovery, 0);
  EXPECT_EQ((*r)[0].ToString(), "kill-agent:leader@recovery=0");
  EXPECT_EQ((*r)[1].kind, InjectKind::kKillNode);
  EXPECT_EQ((*r)[1].ToString(), "kill-node:leader@recovery=2");
}

TEST(ParseInjections, BadInputNamesTheEntry) {
  struct Case {
    const char* text;
    const char* needle;
  } cases[] = {
      {"kill-rank:8@step=1", "rank 8 does not exist (the job has 8 ranks)"},
      {"kill-node:4@step=1", "node 4 does not exist (the job has 4 nodes)"},
      {"kill-agent:4@step=1", "node 4 does not exist"},
      {"corrupt-rank:9@step=1", "rank 9 does not exist"},
      {"kill-rack:1@step=1", "unknown kind 'kill-rack'"},
      {"kill-rank:x@step=1", "target 'x'"},
      {"kill-rank:-1@step=1", "target '-1'"},
      {"kill-rank:1@step=", "step ''"},
      {"kill-rank:1@step=4x", "step '4x'"},
      {"kill-rank:1@step=-3", "step '-3'"},
      {"kill-rank:1@at=3", "expected '@step=N'"},
      {"kill-rank 1", "'kill-rank 1'"},
      {"kill-rank:1@step=3,", "empty entry"},
      {",kill-rank:1@step=3", "empty entry"},
      {"kill-rank@step=3:1", "'kill-rank@step=3:1'"},
      {"kill-store:1@step=3", "kill-store takes no target"},
      {"corrupt-durable:1@step=3", "corrupt-durable takes no target"},
      {"corrupt-durable@recovery=0", "expected '@step=N' after corrupt-durable"},
      {"corrupt-durable@step=-1", "step '-1'"},
      {"kill-store@step=x", "step 'x'"},
      {"kill-store@recovery=-1", "recovery '-1'"},
      {"kill-store@at=1", "expected '@step=N' or '@recovery=K'"},
      {"kill-store", "'kill-store'"},
      {"kill-rank:1@recovery=0", "kill-rank takes only '@step=N'"},
      {"corrupt-rank:1@recovery=0", "corrupt-rank takes only '@step=N'"},
      {"kill-node:1@recovery=x", "recovery 'x'"},
      {"kill-agent:1@recovery=-2", "recovery '-2'"},
      {"kill-node:4@recovery=0", "node 4 does not exist"},
      {"kill-node:leader@step=3", "target 'leader' is only for kill-agent and kill-node during"},
      {"kill-rank:leader@recovery=0", "target 'leader' is only for kill-agent and kill-node"},
      {"kill-agent:Leader@recovery=0", "target 'Leader'"},
      {"kill-rank:1@transfer=0", "kill-rank takes only '@step=N'"},
      {"corrupt-rank:1@transfer=0", "corrupt-rank takes only '@step=N'"},
      {"kill-agent:1@transfer=x", "transfer 'x'"},
      {"kill-node:1@transfer=-1", "transfer '-1'"},
      {"kill-node:5@transfer=0", "node 5 does not exist"},
      {"kill-agent:leader@transfer=0", "target 'leader' is only for kill-agent and kill-node"},
      {"kill-store@transfer=0", "expected '@step=N' or '@recovery=K' after kill-store"},
      {"kill-rank:1@durable=0", "kill-rank takes only '@step=N'"},
      {"kill-agent:1@durable=x", "durable 'x'"},
      {"kill-node:1@durable=", "durable ''"},
      {"kill-node:4@durable=0", "node 4 does not exist"},
      {"kill-agent:leader@durable=0", "target 'leader' is only for kill-agent and kill-node"},
      {"kill-store@durable=0", "expected '@step=N' or '@recovery=K' after kill-store"},
  };
  for (const Case& c : cases) {
    auto r = ParseInjections(c.text, 8, 4);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.text << " -> " << r.status().message();
  }
}

}  // namespace
}  // namespace memento::launch
