#include "common/human.h"

#include <gtest/gtest.h>

namespace memento {
namespace {

TEST(HumanBytesTest, PicksTheLargestUnitBelow1024) {
  EXPECT_EQ(HumanBytes(uint64_t{0}), "0 B");
  EXPECT_EQ(HumanBytes(uint64_t{1023}), "1023 B");
  EXPECT_EQ(HumanBytes(uint64_t{1024}), "1.00 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{1536}), "1.50 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{64} << 20), "64.00 MiB");
  EXPECT_EQ(HumanBytes(uint64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{1} << 40), "1.00 TiB");
  EXPECT_EQ(HumanBytes(2048.0 * (uint64_t{1} << 50)), "2048.00 PiB");  // no unit past PiB
}

}  // namespace
}  // namespace memento
