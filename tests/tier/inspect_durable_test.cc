// `memento inspect --tier durable --json` and `memento verify` against broken
// durable versions (issue 21): garbage in index.json, garbage in a node's
// manifest (node-N.json), a truncated data file and a truncated index. The
// inspector must never name a broken version latest complete and must exit
// 1 when it lists one; verify must name the broken file and exit 1. The
// real binary runs on versions written by the real tier writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "tests/tier/test_env.h"
#include "tier/format.h"
#include "tier/writer.h"

namespace memento::tier {
namespace {

using nlohmann::json;

using memento::testing::ReadAll;

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

TensorMeta Meta(const std::string& name, int64_t n) {
  TensorMeta m;
  m.name = name;
  m.dtype = DType::kFloat32;
  m.shape = {n};
  m.state_class = StateClass::kPrivate;
  return m;
}

// Version `step` of a two-node job, every node one private tensor.
void WriteTwoNodeVersion(const std::string& root, int64_t step) {
  std::vector<std::vector<float>> data(2, std::vector<float>(1000));
  for (int node = 1; node >= 0; --node) {
    for (size_t i = 0; i < data[node].size(); ++i) {
      data[node][i] = static_cast<float>(step * 1000 + node * 7 + static_cast<int64_t>(i));
    }
    VersionView v;
    v.job = "inspect-test";
    v.node = node;
    v.num_nodes = 2;
    v.step = step;
    const std::string name = "rank" + std::to_string(node) + "/w";
    v.entries.push_back(ViewEntry{Meta(name, 1000), 0, 4000, data[node].data()});
    if (node > 0) {
      ASSERT_TRUE(WriteNodePart(Env::Default(), root, v, {}).ok());
    } else {
      auto r = WriteVersion(Env::Default(), root, v, {}, Deadline::AfterSeconds(10));
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
}

struct CmdResult {
  int code = -1;
  std::string out, err;
  json j;
};

// `memento ARGS...`: stdout and stderr apart.
CmdResult Memento(const std::vector<std::string>& args, const std::string& dir) {
  CmdResult r;
  SpawnOptions so;
  so.argv = {"sh", "-c", "exec \"$0\" \"$@\" 2>\"$MEMENTO_TEST_ERR\"", MEMENTO_BIN};
  for (const auto& a : args) so.argv.push_back(a);
  so.env = {"MEMENTO_TEST_ERR=" + dir + "/err"};
  so.log_path = dir + "/out";
  unlink(so.log_path.c_str());
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return r;
  }
  auto st = p->Wait(Deadline::AfterSeconds(60));
  if (!st.ok()) {
    ADD_FAILURE() << st.status();
    return r;
  }
  r.code = st->code;
  r.out = ReadAll(so.log_path);
  r.err = ReadAll(dir + "/err");
  r.j = json::parse(r.out, nullptr, false);
  return r;
}

class InspectDurableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/durable";
    WriteTwoNodeVersion(root_, 5);
    WriteTwoNodeVersion(root_, 10);
    vdir_ = root_ + "/" + VersionDirName(10);
  }

  // The inspector lists version 10 as broken, names 5 latest complete, and
  // exits 1; verify of version 10 exits 1 naming `file`.
  void ExpectBroken(const std::string& file) {
    CmdResult in = Memento({"inspect", "--tier", "durable", root_, "--json"}, dir_.path());
    EXPECT_EQ(in.code, 1) << in.out << in.err;
    ASSERT_TRUE(in.j.is_object()) << in.out << in.err;
    EXPECT_EQ(in.j["latest_complete"], 5) << in.out;
    ASSERT_EQ(in.j["versions"].size(), 2u) << in.out;
    const json& row = in.j["versions"][1];
    EXPECT_EQ(row["step"], 10);
    EXPECT_EQ(row["complete"], false) << in.out;
    EXPECT_EQ(row["broken"], true) << in.out;
    EXPECT_NE(row.dump().find(file), std::string::npos) << "names " << file << ": " << in.out;
    EXPECT_NE(in.err.find("BROKEN version 10"), std::string::npos) << in.err;
    EXPECT_EQ(in.j["versions"][0]["complete"], true) << in.out;

    CmdResult text = Memento({"inspect", "--tier", "durable", root_}, dir_.path());
    EXPECT_EQ(text.code, 1);
    EXPECT_NE(text.out.find("latest complete: 5"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("BROKEN"), std::string::npos) << text.out;

    CmdResult v = Memento({"verify", root_, "--step", "10", "--json"}, dir_.path());
    EXPECT_EQ(v.code, 1) << v.out << v.err;
    ASSERT_TRUE(v.j.is_object()) << v.out;
    EXPECT_EQ(v.j["ok"], false);
    EXPECT_NE(v.j["versions"][0]["problems"].dump().find(file), std::string::npos) << v.out;
    // The older version is untouched and sound.
    CmdResult v5 = Memento({"verify", root_, "--step", "5"}, dir_.path());
    EXPECT_EQ(v5.code, 0) << v5.out << v5.err;
  }

  memento::testing::ScratchDir dir_{"inspect-durable"};
  std::string root_, vdir_;
};

TEST_F(InspectDurableTest, IntactVersionsAreCompleteAndExitZero) {
  CmdResult in = Memento({"inspect", "--tier", "durable", root_, "--json"}, dir_.path());
  EXPECT_EQ(in.code, 0) << in.out << in.err;
  ASSERT_TRUE(in.j.is_object()) << in.out;
  EXPECT_EQ(in.j["latest_complete"], 10);
  EXPECT_TRUE(in.j["broken"].empty());
  CmdResult v = Memento({"verify", root_}, dir_.path());
  EXPECT_EQ(v.code, 0) << v.out << v.err;
}

TEST_F(InspectDurableTest, GarbageIndex) {
  WriteAll(vdir_ + "/index.json", "{\"garbage\": [1, 2, 3");
  ExpectBroken("index.json");
}

TEST_F(InspectDurableTest, TruncatedIndex) {
  const std::string text = ReadAll(vdir_ + "/index.json");
  ASSERT_GT(text.size(), 10u);
  ASSERT_EQ(truncate((vdir_ + "/index.json").c_str(), static_cast<off_t>(text.size() / 2)), 0);
  ExpectBroken("index.json");
}

TEST_F(InspectDurableTest, GarbageNodeManifest) {
  const std::string path = vdir_ + "/" + NodeManifestName(1);
  const std::string text = ReadAll(path);
  ASSERT_FALSE(text.empty());
  WriteAll(path, std::string(text.size(), 'x'));  // same size, other bytes
  ExpectBroken(NodeManifestName(1));
}

TEST_F(InspectDurableTest, TruncatedDataFile) {
  const std::string path = vdir_ + "/" + NodeDataFileName(0);
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  ExpectBroken(NodeDataFileName(0));
}

TEST_F(InspectDurableTest, NoIntactVersionLeavesLatestCompleteNull) {
  WriteAll(root_ + "/" + VersionDirName(5) + "/index.json", "not json");
  WriteAll(vdir_ + "/index.json", "not json either");
  CmdResult in = Memento({"inspect", "--tier", "durable", root_, "--json"}, dir_.path());
  EXPECT_EQ(in.code, 1) << in.out << in.err;
  ASSERT_TRUE(in.j.is_object()) << in.out;
  EXPECT_TRUE(in.j["latest_complete"].is_null()) << in.out;
  EXPECT_EQ(in.j["broken"].size(), 2u) << in.out;
}

}  // namespace
}  // namespace memento::tier
