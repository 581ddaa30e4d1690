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

uint64_t Parse(const char* text) {
  Result<uint64_t> r = ParseBytes(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : ~uint64_t{0};
}

TEST(ParseBytesTest, AcceptsWhatUsersType) {
  EXPECT_EQ(Parse("0"), 0u);
  EXPECT_EQ(Parse("1073741824"), uint64_t{1} << 30);
  EXPECT_EQ(Parse("18446744073709551615"), ~uint64_t{0});  // exact, not through a double
  EXPECT_EQ(Parse("4K"), 4096u);
  EXPECT_EQ(Parse("4k"), 4096u);
  EXPECT_EQ(Parse("256M"), uint64_t{256} << 20);
  EXPECT_EQ(Parse("1G"), uint64_t{1} << 30);
  EXPECT_EQ(Parse("1GiB"), uint64_t{1} << 30);
  EXPECT_EQ(Parse("1gib"), uint64_t{1} << 30);
  EXPECT_EQ(Parse("1GB"), uint64_t{1} << 30);  // binary as well
  EXPECT_EQ(Parse("2T"), uint64_t{2} << 40);
  EXPECT_EQ(Parse("1P"), uint64_t{1} << 50);
  EXPECT_EQ(Parse("512B"), 512u);
  EXPECT_EQ(Parse("512b"), 512u);
  EXPECT_EQ(Parse("1.5G"), uint64_t{3} << 29);
  EXPECT_EQ(Parse("0.5K"), 512u);
  EXPECT_EQ(Parse(".5K"), 512u);
  EXPECT_EQ(Parse("256e6"), 256000000u);
  EXPECT_EQ(Parse("1e9"), 1000000000u);
  EXPECT_EQ(Parse("2.5E3"), 2500u);
  EXPECT_EQ(Parse("1e1K"), 10240u);
  EXPECT_EQ(Parse("1.2"), 1u);     // rounded to the nearest byte
  EXPECT_EQ(Parse("0.3K"), 307u);  // 307.2
  EXPECT_EQ(Parse("+7"), 7u);
  EXPECT_EQ(Parse("  64M  "), uint64_t{64} << 20);
  EXPECT_EQ(Parse("16E3"), 16000u);  // 'E' after digits is an exponent, not a unit
}

TEST(ParseBytesTest, ParsesHumanBytesBack) {
  for (uint64_t v : {uint64_t{0}, uint64_t{512}, uint64_t{1536}, uint64_t{64} << 20,
                     uint64_t{3} << 30, uint64_t{1} << 40}) {
    EXPECT_EQ(Parse(HumanBytes(v).c_str()), v) << HumanBytes(v);
  }
}

TEST(ParseBytesTest, RejectsBadInputQuotingIt) {
  struct Case {
    const char* text;
    const char* why;
  };
  const Case cases[] = {
      {"", "empty"},
      {"   ", "empty"},
      {"-1", "negative"},
      {"-1G", "negative"},
      {"18446744073709551616", "2^64"},  // one past the largest
      {"16384P", "2^64"},                // 2^64 exactly
      {"99999999999999999999999G", "2^64"},
      {"1e30", "2^64"},
      {"1e999999", "2^64"},
      {"1X", "unknown unit 'X'"},
      {"1Gx", "unknown unit 'Gx'"},
      {"1GiBs", "unknown unit"},
      {"1 G B", "unknown unit"},
      {"12abc", "unknown unit 'abc'"},
      {"1.5.5", "unknown unit '.5'"},
      {"1e", "unknown unit 'e'"},
      {"G", "no number"},
      {".", "no number"},
      {"0x10", "unknown unit 'x10'"},
      {"inf", "no number"},
      {"nan", "no number"},
      {"1,000", "unknown unit ',000'"},
  };
  for (const Case& c : cases) {
    Result<uint64_t> r = ParseBytes(c.text);
    ASSERT_FALSE(r.ok()) << "'" << c.text << "' parsed as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find(std::string("'") + c.text + "'"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(c.why), std::string::npos)
        << "'" << c.text << "': " << r.status().message();
  }
}

}  // namespace
}  // namespace memento
