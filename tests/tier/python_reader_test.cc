// A file memento wrote, read back by an independent safetensors parser
// (tests/tier/read_safetensors.py, Python standard library only) and compared
// with the bytes memento was given. A corrupted byte must make it fail, and
// `memento verify` must agree.
#include <gtest/gtest.h>

#include <fstream>

#include "common/test_util.h"
#include "tests/tier/test_env.h"
#include "tier/format.h"
#include "tier/reader.h"

namespace memento::tier {
namespace {

using namespace memento::tier::testing;

TEST(PythonReaderTest, IndependentParserReadsWhatMementoWrote) {
  memento::testing::ScratchDir dir("tier-py");
  const std::string log = dir.path() + ".log";
  const std::string helper = EnvOr("MEMENTO_TIER_HELPER", "");
  const std::string script = EnvOr("MEMENTO_TIER_PY", "");
  ASSERT_FALSE(helper.empty() || script.empty()) << "run through ctest";
  ASSERT_EQ(RunToEnd({helper, "sample", dir.path()}, log), 0);
  EXPECT_EQ(RunToEnd({"/usr/bin/python3", script, dir.path()}, log), 0) << "see " << log;
  EXPECT_EQ(RunToEnd({EnvOr("MEMENTO_BIN", ""), "verify", dir.path()}, log), 0);

  // Corrupt one byte in the middle of node 1's piece of the weight.
  auto index = LoadIndex(Env::Default(), dir.path(), 1);
  ASSERT_TRUE(index.ok()) << index.status();
  const PieceRecord* victim = nullptr;
  for (const auto& p : index->tensors.at("layers.0.weight").pieces) {
    if (p.node == 1) victim = &p;
  }
  ASSERT_NE(victim, nullptr);
  const std::string file = dir.path() + "/" + VersionDirName(1) + "/" + victim->file;
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(victim->file_offset + victim->length / 2);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    f.seekp(victim->file_offset + victim->length / 2);
    f.write(&c, 1);
  }
  EXPECT_EQ(RunToEnd({"/usr/bin/python3", script, dir.path()}, log), 1)
      << "the independent reader must see the corrupted byte";
  EXPECT_EQ(RunToEnd({EnvOr("MEMENTO_BIN", ""), "verify", dir.path()}, log), 1);
  std::remove(log.c_str());
}

}  // namespace
}  // namespace memento::tier
