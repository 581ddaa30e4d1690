#include "coord/keys.h"

#include <gtest/gtest.h>

namespace memento::coord {
namespace {

TEST(NodeNameTest, RoundTrips) {
  for (int n : {0, 1, 7, 10, 123, 2147483647}) {
    EXPECT_EQ(NodeName(n), "node" + std::to_string(n));
    Result<int> back = ParseNodeName(NodeName(n));
    ASSERT_TRUE(back.ok()) << n << ": " << back.status().ToString();
    EXPECT_EQ(*back, n);
  }
}

TEST(NodeNameTest, MalformedNameSaysWhy) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "prefix"},        {"rack1", "prefix"},        {"Node1", "prefix"},
      {"node", "no number"}, {"node01", "leading zero"}, {"node-1", "decimal"},
      {"node1x", "decimal"}, {"node 1", "decimal"},      {"node2147483648", "too large"}};
  for (const auto& [name, why] : cases) {
    Result<int> r = ParseNodeName(name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("'") + name + "'"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace memento::coord
