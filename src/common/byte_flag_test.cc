#include "common/byte_flag.h"

#include <gtest/gtest.h>

#include <vector>

namespace memento {
namespace {

// Parses `args` (after the program name) into an App with a bytes flag and
// a MiB flag; returns CLI11's error text, empty on success.
struct Flags {
  uint64_t size = 7;
  double rate = 0;
  int64_t mib = -1;
  std::string Parse(std::vector<std::string> args) {
    CLI::App app("test");
    app.add_option("--size", size, "bytes")->transform(ByteSize());
    app.add_option("--rate", rate, "bytes per second")->transform(ByteSize());
    app.add_option("--state-mib", mib, "MiB")->transform(ByteSize(uint64_t{1} << 20));
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 wants them reversed
    try {
      app.parse(reversed);
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  }
};

TEST(ByteFlagTest, ConvertsUnitsBeforeCli11Does) {
  Flags f;
  EXPECT_EQ(f.Parse({"--size", "1G", "--rate", "64M", "--state-mib", "2G"}), "");
  EXPECT_EQ(f.size, uint64_t{1} << 30);
  EXPECT_EQ(f.rate, 64.0 * (1 << 20));
  EXPECT_EQ(f.mib, 2048);
  EXPECT_EQ(f.Parse({"--size", "1.5GiB", "--state-mib", "300"}), "");  // a plain number: MiB
  EXPECT_EQ(f.size, uint64_t{3} << 29);
  EXPECT_EQ(f.mib, 300);
  EXPECT_EQ(f.Parse({"--size=256e6", "--state-mib=512K"}).find("--state-mib"), 0u);
  EXPECT_EQ(f.Parse({"--size=256e6"}), "");
  EXPECT_EQ(f.size, 256000000u);
}

TEST(ByteFlagTest, ErrorsNameTheFlagAndTheText) {
  Flags f;
  std::string e = f.Parse({"--size", "1X"});
  EXPECT_NE(e.find("--size"), std::string::npos) << e;
  EXPECT_NE(e.find("'1X'"), std::string::npos) << e;
  e = f.Parse({"--rate", "-5M"});
  EXPECT_NE(e.find("--rate"), std::string::npos) << e;
  EXPECT_NE(e.find("negative"), std::string::npos) << e;
  e = f.Parse({"--state-mib", "1536K"});  // 1.5 MiB
  EXPECT_NE(e.find("--state-mib"), std::string::npos) << e;
  EXPECT_NE(e.find("whole number of MiB"), std::string::npos) << e;
  e = f.Parse({"--size", "20000P"});
  EXPECT_NE(e.find("2^64"), std::string::npos) << e;
}

}  // namespace
}  // namespace memento
