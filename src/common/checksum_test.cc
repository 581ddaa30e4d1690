#include "common/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>  // the library's plain (SSE2) entry points: the reference

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

// Checksum may use the library's run-time dispatcher (AVX2/AVX-512): every
// length class of XXH3 (0-16, 17-128, 129-240, long with a partial last
// stripe and block), at unaligned addresses, must give the plain entry
// points' values, or every stored checksum would stop matching.
TEST(ChecksumTest, EqualsThePlainXxh3AtEveryLengthClass) {
  std::mt19937_64 rng(testing::TestSeed("EqualsThePlainXxh3AtEveryLengthClass"));
  std::vector<unsigned char> buf((4u << 20) + 4096);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t len : {0ul, 1ul, 3ul, 16ul, 17ul, 128ul, 129ul, 240ul, 241ul, 1023ul, 1024ul, 1025ul,
                     65536ul, 65599ul, 1000003ul, 4ul << 20}) {
    for (size_t off : {0ul, 1ul, 7ul, 64ul}) {
      const unsigned char* p = buf.data() + off;
      EXPECT_EQ(Checksum(p, len), XXH3_64bits(p, len)) << len << " at +" << off;
      EXPECT_EQ(ChecksumWithSeed(p, len, 0x5eedull), XXH3_64bits_withSeed(p, len, 0x5eedull))
          << len << " at +" << off;
      StreamingChecksum s;
      const size_t cut = len / 3;
      s.Update(p, cut);
      s.Update(p + cut, len - cut);
      EXPECT_EQ(s.Digest(), XXH3_64bits(p, len)) << len << " at +" << off;
    }
  }
}

}  // namespace
}  // namespace memento
