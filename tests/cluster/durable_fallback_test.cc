// The durable tier in cluster mode, end to end (issues 4 and 7): `memento
// launch --durable-dir` with four real agents that persist globally committed
// versions as one cluster version each, and a loss beyond the memory's
// protection (two nodes of one sharding group under xor). The launcher must
// fall back to the newest complete durable version: every node (the two
// empty replacements included) loads it into its T0, the trainers restart
// from it, and the job ends bit-identical to an uninterrupted run. Every
// persisted version passes `memento verify`, replicated state is stored once
// in the whole cluster, and versions written after the recovery carry the
// bumped epoch. The recovery is a new commit epoch: the steps after the
// restored one that the abandoned history had committed (S+1 .. C) commit
// again (docs/coordination.md, "Epochs").
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "launch_job.h"

namespace memento {
namespace {

using nlohmann::json;

using memento::testing::ReadAll;

using cluster_testing::ExpectRankBitIdentical;
using cluster_testing::Job;
using cluster_testing::Logs;
using cluster_testing::Outcome;
using cluster_testing::Restored;

// A job of 4 nodes under ZeRO-1 whose agents persist every `persist_every`
// committed versions to the durable directory (when `durable`).
struct FallbackJob : Job {
  FallbackJob() {
    zero = 1;
    steps = 30;
    // Slow enough steps that a committed version's slot outlives its write to
    // the durable directory (two snapshot intervals) on a loaded machine.
    step_ms = 120;
    // Every step commits before the next: under load the steps after the
    // restored one were otherwise all skipped and none committed again.
    pace_commits = true;
  }
  int persist_every = 4;
  bool durable = true;
};

Outcome RunJob(const FallbackJob& job, const std::string& dir, const std::string& durable_dir) {
  Job launched = job;
  if (job.durable) {
    for (const std::string& a :
         {std::string("--durable-dir"), durable_dir,
          "--agent-arg=--persist-every=" + std::to_string(job.persist_every)}) {
      launched.extra.push_back(a);
    }
  }
  return cluster_testing::RunJob(launched, dir, "durablefb", 200);
}

// `memento verify DIR` (every version): exit 0 and its output.
std::pair<int, std::string> Verify(const std::string& durable_dir, const std::string& dir) {
  SpawnOptions so;
  so.argv = {MEMENTO_BIN, "verify", durable_dir};
  so.log_path = dir + "/verify.log";
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return {-1, p.status().ToString()};
  auto st = p->Wait(Deadline::AfterSeconds(60));
  return {st.ok() ? st->code : -1, ReadAll(so.log_path)};
}

// The complete versions under `durable_dir` (directories with COMMIT).
std::vector<std::string> CompleteVersions(const std::string& durable_dir) {
  std::vector<std::string> out;
  DIR* d = opendir(durable_dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("version-", 0) != 0) continue;
    struct stat st;
    if (stat((durable_dir + "/" + name + "/COMMIT").c_str(), &st) == 0) out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// The steps committed in attempt `attempt` (the summary's commit history).
std::vector<int64_t> CommittedIn(const Outcome& o, int attempt) {
  std::vector<int64_t> out;
  for (const json& a : o.summary["commits"]["by_attempt"]) {
    if (a["attempt"].get<int>() == attempt) out = a["steps"].get<std::vector<int64_t>>();
  }
  return out;
}

// Steps some node skipped (a skip record: the step can never commit) in
// commit epoch `epoch` or later: a skip of the abandoned history's step s
// says nothing about the new history's step s.
std::set<int64_t> SkippedSince(const Outcome& o, uint64_t epoch) {
  std::set<int64_t> out;
  for (const json& s : o.summary["commits"]["skipped"]) {
    if (s.value("epoch", uint64_t{0}) >= epoch) out.insert(s["step"].get<int64_t>());
  }
  return out;
}

// After a fallback to S < C (recovery `rec`), every step of S+1 .. C the
// trainers computed again committed again in the new attempt (a new commit
// epoch; before epochs, commit/latest stayed at C and none of them could),
// unless a node skipped it (a skip record, as in a failure-free run).
void ExpectStepsAfterTheRestoredOneCommitAgain(const Outcome& o, const json& rec) {
  const int64_t step = rec["step"].get<int64_t>();
  const int64_t committed = rec["committed"].get<int64_t>();
  const std::vector<int64_t> again = CommittedIn(o, rec["attempt"].get<int>());
  ASSERT_FALSE(again.empty()) << "no commit after the recovery\n" << Logs(o);
  EXPECT_GT(again.front(), step) << Logs(o);
  std::printf("restored step %lld, committed before the loss %lld; committed after it: %s\n",
              static_cast<long long>(step), static_cast<long long>(committed),
              json(again).dump().c_str());
  // The recovery's epoch: the new history's (docs/coordination.md "Epochs").
  const std::set<int64_t> skipped = SkippedSince(o, rec.value("epoch", uint64_t{0}));
  int64_t recommitted = 0;
  for (int64_t s = step + 1; s <= committed; ++s) {
    const bool in = std::find(again.begin(), again.end(), s) != again.end();
    recommitted += in ? 1 : 0;
    EXPECT_TRUE(in || skipped.count(s) > 0)
        << "step " << s << " (after the restored " << step << ", committed before: " << committed
        << ") did not commit again and no node skipped it; committed after the recovery: "
        << json(again).dump() << "\n"
        << Logs(o);
  }
  if (committed > step) {
    EXPECT_GT(recommitted, 0) << "none of the steps " << step + 1 << ".." << committed
                              << " committed again: " << json(again).dump() << "\n"
                              << Logs(o);
  }
}

class DurableFallbackTest : public ::testing::Test {
 protected:
  testing::ScratchDir dir_{"durable-fallback"};
  std::string durable_dir() const { return dir_.path() + "/durable"; }

  // Every rank restored `step` in recovery attempt `attempt`, saw no mismatch,
  // and ended bit-identical to the failure-free reference run.
  void ExpectEveryRankRestoredBitIdentical(const FallbackJob& job, const Outcome& o, int attempt,
                                           int64_t step) {
    for (int r = 0; r < job.nodes; ++r) {
      EXPECT_TRUE(Restored(o, r, attempt, step))
          << "rank " << r << " did not restore step " << step << "\n"
          << Logs(o);
      ExpectRankBitIdentical(job, o, r, dir_.path());
    }
  }

  // Recovery `rec` of nodes 1 and 2 came from the durable tier: a persisted
  // step S <= the committed C, S - C steps lost, bytes read, a new epoch;
  // every rank restored S and ends bit-identical, and S+1 .. C commit again.
  void ExpectRestoredFromTheDurableTier(const FallbackJob& job, const Outcome& o, const json& rec) {
    EXPECT_EQ(rec["source"], "durable") << Logs(o);
    EXPECT_EQ(rec["lost_nodes"], json::array({1, 2})) << Logs(o);
    const int64_t step = rec["step"].get<int64_t>();
    const int64_t committed = rec["committed"].get<int64_t>();
    EXPECT_GE(step, job.persist_every) << Logs(o);
    EXPECT_EQ(step % job.persist_every, 0) << Logs(o);
    EXPECT_LE(step, committed) << Logs(o);
    EXPECT_EQ(rec["steps_lost"].get<int64_t>(), committed - step) << Logs(o);
    EXPECT_GT(rec["read_bytes"].get<uint64_t>(), 0u) << Logs(o);
    EXPECT_GE(rec["epoch"].get<uint64_t>(), 1u) << Logs(o);
    ExpectEveryRankRestoredBitIdentical(job, o, rec["attempt"].get<int>(), step);
    ExpectStepsAfterTheRestoredOneCommitAgain(o, rec);
  }
};

TEST_F(DurableFallbackTest, LossBeyondProtectionRecoversFromTheDurableTier) {
  FallbackJob job;
  // Nodes 1 and 2 hold two of the four blocks of the sharding group's xor
  // stripes: memory cannot rebuild any committed version.
  job.inject = "kill-node:1@step=18,kill-node:2@step=18";
  Outcome o = RunJob(job, dir_.path(), durable_dir());
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  EXPECT_NE(o.output.find("memory cannot rebuild any committed version"), std::string::npos)
      << Logs(o);
  EXPECT_NE(o.output.find("restored from the durable tier at step"), std::string::npos) << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  const json& rec = o.summary["recoveries"][0];
  ExpectRestoredFromTheDurableTier(job, o, rec);
  const int64_t committed = rec["committed"].get<int64_t>();

  // Every persisted cluster version verifies; each stores the replicated
  // tensors once (pieces from several nodes tiling them), and has 4 nodes.
  auto [code, text] = Verify(durable_dir(), dir_.path());
  EXPECT_EQ(code, 0) << text;
  const std::vector<std::string> versions = CompleteVersions(durable_dir());
  ASSERT_FALSE(versions.empty());
  for (const std::string& v : versions) {
    json index = json::parse(ReadAll(durable_dir() + "/" + v + "/index.json"), nullptr, false);
    ASSERT_TRUE(index.is_object()) << v;
    EXPECT_EQ(index["num_nodes"].get<int>(), job.nodes) << v;
    for (const char* name : {"w", "b", "opt"}) {
      ASSERT_TRUE(index["tensors"].contains(name)) << v << " " << name;
      const json& t = index["tensors"][name];
      uint64_t sum = 0;
      std::set<int> nodes;
      for (const json& p : t["pieces"]) {
        sum += p["length"].get<uint64_t>();
        nodes.insert(p["node"].get<int>());
      }
      EXPECT_EQ(sum, t["nbytes"].get<uint64_t>()) << v << " " << name << " is not stored once";
      // "b" is small and may lie inside one node's piece; "w" and "opt" not.
      if (std::string(name) != "b") {
        EXPECT_GT(nodes.size(), 1u) << v << " " << name;
      }
    }
    for (int r = 0; r < job.nodes; ++r) {
      EXPECT_TRUE(index["tensors"].contains("rank" + std::to_string(r) + "/rng")) << v;
    }
  }
  // Versions committed after the recovery were written in the new epoch.
  const std::string newest = versions.back();
  const int64_t newest_step = std::stoll(newest.substr(8));
  if (newest_step > committed) {
    for (int n = 0; n < job.nodes; ++n) {
      json marker = json::parse(
          ReadAll(durable_dir() + "/" + newest + "/node-0000" + std::to_string(n) + ".done"),
          nullptr, false);
      ASSERT_TRUE(marker.is_object()) << newest << " node " << n;
      EXPECT_EQ(marker["epoch"].get<uint64_t>(), rec["epoch"].get<uint64_t>()) << newest;
    }
  }
}

// --recovery-by agents: the agents' recovery leader falls back to the
// durable tier itself (LoadDurableOnEveryNode, the new epoch), the launcher
// only waits for its outcome; the same end as the launcher's own fallback.
TEST_F(DurableFallbackTest, TheAgentsLeaderFallsBackToTheDurableTier) {
  FallbackJob job;
  job.extra = {"--recovery-by", "agents"};
  job.inject = "kill-node:1@step=18,kill-node:2@step=18";
  Outcome o = RunJob(job, dir_.path(), durable_dir());
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  EXPECT_NE(o.output.find("asked of the agents' recovery leader"), std::string::npos) << Logs(o);
  EXPECT_NE(o.output.find("memory cannot rebuild any committed version"), std::string::npos)
      << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  const json& rec = o.summary["recoveries"][0];
  EXPECT_EQ(rec["recovered_by"], "agents") << Logs(o);
  ExpectRestoredFromTheDurableTier(job, o, rec);
}

// The step the launcher's durable fallback first set out to load ("falling
// back to the durable tier DIR: loading step S on N node(s)"), -1 if none.
int64_t FirstDurableStepTried(const Outcome& o) {
  const std::string mark = ": loading step ";
  const size_t at = o.output.find("falling back to the durable tier");
  if (at == std::string::npos) return -1;
  const size_t step = o.output.find(mark, at);
  if (step == std::string::npos) return -1;
  return std::stoll(o.output.substr(step + mark.size()));
}

// --recovery-by launcher (docs/recovery.md, "An agent lost while a durable
// version loads"): node 3's agent is SIGKILLed as the durable load request
// of recovery 0 goes out to it. The launcher restarts that agent on its root
// and loads the same version S again on every node: nothing skipped, S
// restored on every rank, bit-identical to an uninterrupted run.
TEST_F(DurableFallbackTest, AnAgentKilledDuringTheDurableLoadIsRestartedAndLoadsTheSameVersion) {
  FallbackJob job;
  job.extra = {"--recovery-by", "launcher"};
  job.inject = "kill-node:1@step=18,kill-node:2@step=18,kill-agent:3@durable=0";
  Outcome o = RunJob(job, dir_.path(), durable_dir());
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  EXPECT_NE(o.output.find("injecting kill-agent:3@durable=0"), std::string::npos) << Logs(o);
  const int64_t tried = FirstDurableStepTried(o);
  ASSERT_GE(tried, 0) << Logs(o);
  const std::string retry = "loading durable version " + std::to_string(tried) +
                            " (try 1 of 3): the agent of node 3 is gone";
  EXPECT_NE(o.output.find(retry), std::string::npos) << retry << "\n" << Logs(o);
  EXPECT_NE(o.output.find("restarting it on its root and loading step " + std::to_string(tried) +
                          " again on every node"),
            std::string::npos)
      << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  const json& rec = o.summary["recoveries"][0];
  EXPECT_EQ(rec["step"].get<int64_t>(), tried) << "not the version the first try loaded\n"
                                               << Logs(o);
  EXPECT_TRUE(!rec.contains("durable_skipped") || rec["durable_skipped"].empty()) << rec.dump();
  EXPECT_EQ(o.output.find("skipped: loading it failed"), std::string::npos) << Logs(o);
  ExpectRestoredFromTheDurableTier(job, o, rec);
}

// Node 3's agent dies in every load try (three injections, one per try):
// the job ends (exit 1) naming the node and the version, which is complete;
// no older version is loaded in its place.
TEST_F(DurableFallbackTest, AnAgentLostInEveryDurableLoadTryEndsTheJobNamingItsNode) {
  FallbackJob job;
  job.extra = {"--recovery-by", "launcher"};
  job.inject =
      "kill-node:1@step=14,kill-node:2@step=14,kill-agent:3@durable=0,kill-agent:3@durable=0,"
      "kill-agent:3@durable=0";
  Outcome o = RunJob(job, dir_.path(), durable_dir());
  EXPECT_EQ(o.exit.code, 1) << o.exit.ToString() << "\n" << Logs(o);
  const int64_t tried = FirstDurableStepTried(o);
  ASSERT_GE(tried, 0) << Logs(o);
  for (int t = 1; t <= 2; ++t) {
    const std::string retry = "loading durable version " + std::to_string(tried) + " (try " +
                              std::to_string(t) + " of 3): the agent of node 3 is gone";
    EXPECT_NE(o.output.find(retry), std::string::npos) << retry << "\n" << Logs(o);
  }
  const std::string end = "loading durable version " + std::to_string(tried) +
                          " on every node failed 3 time(s): the agent of node(s) 3 was gone";
  EXPECT_NE(o.output.find(end), std::string::npos) << end << "\n" << Logs(o);
  EXPECT_NE(o.output.find("so no older one is loaded instead"), std::string::npos) << Logs(o);
  EXPECT_EQ(o.output.find("skipped: loading it failed"), std::string::npos) << Logs(o);
  EXPECT_EQ(o.output.find("restored from the durable tier"), std::string::npos) << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  EXPECT_EQ(o.summary["recoveries"][0]["source"], "none") << Logs(o);
  EXPECT_NE(o.summary["recoveries"][0]["reason"].get<std::string>().find("node(s) 3"),
            std::string::npos)
      << Logs(o);
}

TEST_F(DurableFallbackTest, WithoutADurableVersionTheLauncherStillRefuses) {
  FallbackJob job;
  job.durable = true;
  job.persist_every = 1000;  // nothing is ever persisted
  job.steps = 20;
  job.step_ms = 15;
  job.inject = "kill-node:1@step=8,kill-node:2@step=8";
  Outcome o = RunJob(job, dir_.path(), durable_dir());
  EXPECT_EQ(o.exit.code, 3) << o.exit.ToString() << "\n" << Logs(o);
  EXPECT_NE(o.output.find("holds no complete version"), std::string::npos) << Logs(o);
  // The summary says the job ended unrestored, never "restarted from scratch".
  EXPECT_EQ(o.output.find("restarted from scratch"), std::string::npos) << Logs(o);
  EXPECT_NE(o.output.find("FAILED, nothing restored"), std::string::npos) << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  EXPECT_EQ(o.summary["recoveries"][0]["source"], "none") << Logs(o);
}

// The newest durable version is corrupted at rest (one flipped byte in a
// piece, applied when the recovery falls back): the fallback must verify,
// pass over it saying which and why, and restore the newest older version
// that verifies (issue 21: the job ended with DataLoss although intact
// older versions were on disk). The summary of a refused job (exit 3) must
// not say "restarted from scratch".
TEST_F(DurableFallbackTest, ACorruptNewestDurableVersionFallsBackToAnOlderOneThatVerifies) {
  FallbackJob job;
  job.steps = 34;
  job.inject = "corrupt-durable@step=10,kill-node:1@step=22,kill-node:2@step=22";
  Outcome o = RunJob(job, dir_.path(), durable_dir());
  ASSERT_EQ(o.exit.code, 0) << o.exit.ToString() << "\n" << Logs(o);
  const size_t flipped = o.output.find("corrupt-durable: flipped a byte");
  ASSERT_NE(flipped, std::string::npos) << Logs(o);
  ASSERT_TRUE(o.summary.is_object()) << Logs(o);
  ASSERT_EQ(o.summary["recoveries"].size(), 1u) << Logs(o);
  const json& rec = o.summary["recoveries"][0];
  EXPECT_EQ(rec["source"], "durable") << Logs(o);
  ASSERT_GE(rec["durable_skipped"].size(), 1u) << Logs(o);
  const std::string skipped = rec["durable_skipped"][0].get<std::string>();
  EXPECT_NE(skipped.find("fails verification"), std::string::npos) << skipped;
  EXPECT_NE(skipped.find("checksum"), std::string::npos) << skipped;
  const int64_t bad = std::stoll(skipped.substr(5));  // "step N fails ..."
  const int64_t step = rec["step"].get<int64_t>();
  EXPECT_LT(step, bad) << Logs(o);
  EXPECT_EQ(step % job.persist_every, 0) << Logs(o);
  EXPECT_NE(
      o.output.find("durable version " + std::to_string(bad) + " skipped: fails verification"),
      std::string::npos)
      << Logs(o);
  EXPECT_NE(rec["reason"].get<std::string>().find("skipped"), std::string::npos) << rec.dump();
  EXPECT_GT(rec["steps_lost"].get<int64_t>(), 0) << Logs(o);
  ExpectStepsAfterTheRestoredOneCommitAgain(o, rec);
  // The corrupted version is really bad: verify says so.
  SpawnOptions so;
  so.argv = {MEMENTO_BIN, "verify", durable_dir(), "--step", std::to_string(bad)};
  so.log_path = dir_.path() + "/verify-bad.log";
  auto p = Subprocess::Spawn(so);
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(Deadline::AfterSeconds(60));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->code, 1) << ReadAll(so.log_path);

  ExpectEveryRankRestoredBitIdentical(job, o, rec["attempt"].get<int>(), step);
}

}  // namespace
}  // namespace memento
