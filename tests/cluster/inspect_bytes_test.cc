// `memento inspect --tier memory ROOT... [--store URL --job J]`: the bytes
// per node of one version (T0, T1, copied per snapshot) next to the plan's
// (REFT's) bytes (issue 15, docs/inspect.md "Bytes per node"). A real
// `memento launch --sharded` job (real store, agents and workload trainers)
// leaves its node roots (--keep-run-dir) and an external store the test
// runs in this process; the CLI then runs as a real process on those roots.
// Its figures must be the launcher's own (the same measurement of the same
// committed version), the slots must hold pieces (less than the registered
// state) and the plan's bytes must be met within 5%.

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "coord/embedded_store.h"
#include "coord/token_store_test_util.h"
#include "gtest/gtest.h"
#include "launch_job.h"
#include "net/job_token.h"

namespace memento {
namespace {

using nlohmann::json;

using cluster_testing::CollectOutcome;
using cluster_testing::Job;
using cluster_testing::LaunchArgv;
using cluster_testing::Logs;
using cluster_testing::Outcome;
using cluster_testing::RunLaunch;
using memento::testing::ReadAll;

// `memento inspect` with `args`: its exit code and its stdout + stderr.
std::pair<int, std::string> Inspect(const std::vector<std::string>& args, const std::string& log) {
  SpawnOptions so;
  so.argv = {MEMENTO_BIN, "inspect"};
  for (const std::string& a : args) so.argv.push_back(a);
  so.log_path = log;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return {-1, p.status().ToString()};
  auto st = p->Wait(Deadline::AfterSeconds(60));
  if (!st.ok()) {
    p->Terminate(5);
    return {-1, "memento inspect did not finish in 60 s"};
  }
  return {st->code, ReadAll(log)};
}

class InspectBytesTest : public coord::testing::TokenStoreTest {
 protected:
  InspectBytesTest() : TokenStoreTest("inspect-bytes") {}
};

TEST_F(InspectBytesTest, ReportsEachNodesBytesNextToThePlanAsTheLauncherMeasuredThem) {
  const std::string dir = dir_.path();
  Job job;  // 4 nodes, DP 4, xor
  job.steps = 12;
  // 1 MiB per rank: the T1 files' headers and page rounding (a few KiB a
  // node) stay well inside the 5% the ratio check allows.
  job.elements = 1 << 18;
  job.extra = {"--sharded", "--keep-run-dir", "--store", url_, "--token-file", token_file_};
  const std::string name = "inspectbytes-" + std::to_string(getpid());
  const std::string out_dir = dir + "/out";
  ASSERT_EQ(mkdir(out_dir.c_str(), 0700), 0);
  Outcome o = RunLaunch(LaunchArgv(job, dir, name, out_dir), dir, out_dir, 150);
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  const int64_t committed = o.summary["committed"].get<int64_t>();
  ASSERT_GE(committed, 1) << Logs(o);
  const json& launched = o.summary["memory"];
  ASSERT_EQ(launched.size(), 4u) << Logs(o);

  std::vector<std::string> roots;
  for (int n = 0; n < job.nodes; ++n) roots.push_back(dir + "/run/node" + std::to_string(n));

  // With the store: the committed step, the plan's bytes and REFT's formula.
  std::vector<std::string> args = {"--tier", "memory"};
  args.insert(args.end(), roots.begin(), roots.end());
  for (const std::string& a : {std::string("--store"), url_, std::string("--job"), name,
                               std::string("--token-file"), token_file_, std::string("--json")}) {
    args.push_back(a);
  }
  auto [rc, text] = Inspect(args, dir + "/inspect.json");
  ASSERT_EQ(rc, 0) << text;
  json view = json::parse(text, nullptr, false);
  ASSERT_TRUE(view.is_object() && view.contains("memory")) << text;
  const json& mem = view["memory"];
  EXPECT_EQ(mem["step"].get<int64_t>(), committed) << mem.dump(2);
  EXPECT_EQ(mem["step_source"], "committed") << mem.dump(2);
  EXPECT_TRUE(mem["plan"].get<bool>()) << mem.dump(2);
  EXPECT_EQ(mem["formula"].get<std::string>().rfind("xor: W/m + W/(m(m-1))", 0), 0u) << mem.dump(2);
  EXPECT_TRUE(mem["unmeasured"].empty()) << mem.dump(2);
  ASSERT_EQ(mem["nodes"].size(), 4u) << mem.dump(2);
  for (const json& n : mem["nodes"]) {
    const int node = n["node"].get<int>();
    ASSERT_TRUE(node >= 0 && node < 4) << n.dump(2);
    EXPECT_EQ(n["root"], roots[static_cast<size_t>(node)]) << n.dump(2);
    const json* l = nullptr;
    for (const json& x : launched) {
      if (x["node"] == node) l = &x;
    }
    ASSERT_NE(l, nullptr) << "node " << node << " not in the launcher's summary\n" << Logs(o);
    for (const char* k : {"step", "t0_bytes", "t1_bytes", "t1_resident_bytes", "host_bytes",
                          "copy_bytes_per_step", "full_copy_bytes_per_step", "plan_piece_bytes",
                          "plan_copy_bytes", "plan_parity_bytes", "reft_bytes"}) {
      EXPECT_EQ(n[k], (*l)[k]) << "node " << node << " " << k << ": inspect " << n.dump(2)
                               << "\nlauncher " << l->dump(2);
    }
    // Sharded slots: a node's ranks copy their pieces, not the whole state;
    // the node holds what the plan says it should.
    EXPECT_GT(n["t0_bytes"].get<uint64_t>(), 0u) << n.dump(2);
    EXPECT_LT(n["t0_bytes"].get<uint64_t>(), n["full_copy_bytes_per_step"].get<uint64_t>())
        << n.dump(2);
    EXPECT_GT(n["reft_bytes"].get<uint64_t>(), 0u) << n.dump(2);
    EXPECT_LE(n["ratio"].get<double>(), 1.05) << n.dump(2);
  }

  // The text form names the step, the formula and every node.
  args.pop_back();  // --json
  auto [trc, table] = Inspect(args, dir + "/inspect.txt");
  ASSERT_EQ(trc, 0) << table;
  for (const std::string& want :
       {"bytes per node, step " + std::to_string(committed) + " (committed",
        std::string("xor: W/m + W/(m(m-1))"), std::string("node0: T0 "), std::string("node3: T0 "),
        std::string("plan (REFT)")}) {
    EXPECT_NE(table.find(want), std::string::npos) << "missing '" << want << "' in\n" << table;
  }

  // Without a store: the newest version every rank holds intact, no plan.
  std::vector<std::string> local = {"--tier", "memory"};
  local.insert(local.end(), roots.begin(), roots.end());
  local.push_back("--json");
  auto [lrc, ltext] = Inspect(local, dir + "/inspect-local.json");
  ASSERT_EQ(lrc, 0) << ltext;
  json lview = json::parse(ltext, nullptr, false);
  ASSERT_TRUE(lview.is_object()) << ltext;
  EXPECT_EQ(lview["memory"]["step_source"], "newest intact") << ltext;
  EXPECT_EQ(lview["memory"]["step"], lview["latest_complete"]) << ltext;
  EXPECT_FALSE(lview["memory"]["plan"].get<bool>()) << ltext;
  ASSERT_EQ(lview["memory"]["nodes"].size(), 4u) << ltext;
  for (const json& n : lview["memory"]["nodes"]) {
    EXPECT_GT(n["t0_bytes"].get<uint64_t>(), 0u) << n.dump(2);
    EXPECT_EQ(n["reft_bytes"].get<uint64_t>(), 0u) << n.dump(2);
  }

  // A store with a durable-tier target is refused, naming what is wrong.
  auto [brc, btext] = Inspect(
      {"--store", url_, "--job", name, "--token-file", token_file_, "--tier", "durable", roots[0]},
      dir + "/inspect-bad.txt");
  EXPECT_NE(brc, 0) << btext;
  EXPECT_NE(btext.find("only with --tier memory"), std::string::npos) << btext;
}

}  // namespace
}  // namespace memento
