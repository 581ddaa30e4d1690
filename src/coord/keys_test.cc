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

// Skip records name their commit epoch (a suffix from epoch 1 on), so that
// a skip of the abandoned history's step s is not read as one of the new
// history's step s.
TEST(SkippedKeyTest, RoundTripsWithItsEpoch) {
  JobKeys keys("job-1");
  EXPECT_EQ(keys.Skipped(12, "node1"), "/memento/job-1/skipped/00000000000000000012/node1");
  EXPECT_EQ(keys.Skipped(12, "node1", 3), "/memento/job-1/skipped/00000000000000000012/node1@3");
  for (uint64_t epoch : {uint64_t{0}, uint64_t{1}, uint64_t{3}, UINT64_MAX}) {
    Result<SkippedKey> k = ParseSkippedKey(keys, keys.Skipped(7, "node12", epoch));
    ASSERT_TRUE(k.ok()) << epoch << ": " << k.status().ToString();
    EXPECT_EQ(k->step, 7);
    EXPECT_EQ(k->node, "node12");
    EXPECT_EQ(k->epoch, epoch);
  }
}

TEST(SkippedKeyTest, MalformedKeySaysWhy) {
  JobKeys keys("job");
  const std::string p = keys.SkippedPrefix();
  const std::pair<std::string, const char*> cases[] = {
      {"/memento/other/skipped/00000000000000000001/node0", "another prefix"},
      {p + "00000000000000000001", "no node"},
      {p + "1/node0", "20 digits"},
      {p + "00000000000000000001/node0@", "canonical"},
      {p + "00000000000000000001/node0@01", "canonical"},
      {p + "00000000000000000001/node0@x", "decimal"},
      {p + "00000000000000000001/node0@0", "epoch 0"},
      {p + "00000000000000000001/node0@18446744073709551616", "overflows"},
      {p + "00000000000000000001/", "node name"},
      {p + "00000000000000000001/a/b", "node name"},
      {p + "00000000000000000001/@2", "node name"}};
  for (const auto& [key, why] : cases) {
    Result<SkippedKey> k = ParseSkippedKey(keys, key);
    ASSERT_FALSE(k.ok()) << key;
    EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_NE(k.status().message().find(why), std::string::npos) << k.status().message();
    EXPECT_NE(k.status().message().find(key), std::string::npos) << k.status().message();
  }
}

}  // namespace
}  // namespace memento::coord
