#include "common/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/test_util.h"

namespace memento {
namespace {

TEST(ChecksumTest, CopyAndChecksumMatchesOneShot) {
  std::mt19937_64 rng(testing::TestSeed("CopyAndChecksumMatchesOneShot"));
  for (size_t len : {0ul, 1ul, 63ul, 65536ul, 65537ul, 1000003ul}) {
    std::vector<unsigned char> src(len), dst(len, 0);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    uint64_t h = CopyAndChecksum(dst.data(), src.data(), len);
    EXPECT_EQ(h, Checksum(src.data(), len)) << len;
    EXPECT_EQ(src, dst) << len;  // (memcmp of two empty vectors passes null: UB)
  }
}

TEST(ChecksumTest, DetectsAFlippedBit) {
  std::vector<unsigned char> a(4096, 7);
  uint64_t h = Checksum(a.data(), a.size());
  a[1234] ^= 0x10;
  EXPECT_NE(h, Checksum(a.data(), a.size()));
}

TEST(ChecksumTest, StreamingEqualsOneShot) {
  std::vector<unsigned char> a(100000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 31);
  StreamingChecksum s;
  s.Update(a.data(), 333);
  s.Update(a.data() + 333, a.size() - 333);
  EXPECT_EQ(s.Digest(), Checksum(a.data(), a.size()));
}

}  // namespace
}  // namespace memento
