#include "agent/agent_request.h"

#include <gtest/gtest.h>

#include "shm/slot_limits.h"

namespace memento::agent {
namespace {

TEST(AgentRequestTest, ParsesEveryOpTheClientSends) {
  auto hello = ParseAgentRequest(R"({"op":"hello","protocol":1,"job":"j","rank":3,"pid":9})");
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->op, AgentOp::kHello);
  EXPECT_EQ(hello->protocol, 1u);
  EXPECT_EQ(hello->job, "j");
  EXPECT_EQ(hello->rank, 3);
  auto seal = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":8192,"manifest":"[]"})");
  ASSERT_TRUE(seal.ok()) << seal.status();
  EXPECT_EQ(seal->bytes, 8192u);
  EXPECT_TRUE(seal->has_manifest);
  EXPECT_EQ(seal->manifest, "[]");
  auto bare = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":4096})");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_FALSE(bare->has_manifest);
  auto complete = ParseAgentRequest(R"({"op":"complete","rank":2,"slot":1,"step":40})");
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_EQ(complete->slot, 1);
  EXPECT_EQ(complete->step, 40);
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"skipped","rank":2,"step":0})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"target","rank":2})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"verify","rank":2,"slot":0})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"list","rank":2})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"ping"})").ok());
  auto top = ParseAgentRequest(R"({"op":"seal","rank":1073741823,"bytes":281474976710656})");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->rank, shm::kMaxRank);
  EXPECT_EQ(top->bytes, shm::kMaxSlotBytes);
}

TEST(AgentRequestTest, ErrorsNameTheFieldAndTheValue) {
  auto r = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":1e30})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'bytes'"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("1e+30"), std::string::npos) << r.status();
  r = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":281474976710657})");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = ParseAgentRequest(R"({"op":"seal","rank":1073741824,"bytes":8192})");
  EXPECT_NE(r.status().message().find("'rank'"), std::string::npos) << r.status();
  // Strings inside the message may hold brackets without counting as depth.
  std::string deep_string = R"({"op":"ping","x":")" + std::string(1000, '[') + R"("})";
  EXPECT_TRUE(ParseAgentRequest(deep_string).ok());
  std::string deep = R"({"op":"ping","x":)" + std::string(20, '[') + std::string(20, ']') + "}";
  EXPECT_EQ(ParseAgentRequest(deep).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memento::agent
