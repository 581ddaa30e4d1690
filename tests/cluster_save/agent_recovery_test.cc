// Recovery run by the agents (docs/recovery.md, "Recovery run by the agents";
// issue 18): three real `memento agent --recovery-leader auto` processes (one
// node each, own shared-memory root, replicate policy) and three trainer
// processes (cluster_trainer.cc) train and commit; no launcher runs. A node
// is lost (its agent SIGKILLed, its shared memory deleted) and a replacement
// agent joins on an empty root: the elected leader notices the loss, waits
// for the replacement, rebuilds the lost rank from its peer's copy and sets
// the restore target on every agent. The rebuilt slot must hold the committed
// version's bytes exactly, and restarted trainers (which ask their own agent
// for the step) must restore the committed state bit-identically. The second
// test SIGKILLs the leader in the middle of the recovery: another agent wins
// the lease and finishes it. The durable tests lose two nodes (more than the
// plan protects): the leader restores the newest durable version that
// verifies (an older one when the newest has a flipped byte).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "../shm/proc_util.h"
#include "common/check.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "common/test_util.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "job_store.h"
#include "launch/job_recovery.h"
#include "launch/recovery_leader.h"
#include "shm/node_store.h"
#include "shm/root_gc.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "tier/env.h"
#include "tier/format.h"
#include "tier/reader.h"
#include "topo/plan.h"
#include "topo/topology_json.h"

namespace memento {
namespace {

using shm::testing::Progress;
using shm::testing::ReadProgress;
using shm::testing::Spawn;
using shm::testing::WaitExit;

constexpr int kNodes = 3;
constexpr int64_t kSteps = 6;
constexpr const char* kJob = "agentrecjob";
constexpr const char* kSecret = "agent-recovery-test-token-0123456789abcdef";

using memento::testing::ReadAll;

class AgentRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        job_store_.Start(tmp_.path(), "127.0.0.1", kJob, kSecret, kNodes, store_coordinates_));
    ASSERT_NO_FATAL_FAILURE(job_store_.SetUniformTopology(kNodes, "replicate"));
    agents_.assign(kNodes, -1);
    agent_logs_.assign(kNodes, "");
  }
  void TearDown() override {
    cluster_save_testing::StopTrainersAndAgents(trainers_, agents_);
    job_store_.Stop();
  }

  std::string Root(int node) { return shm_.path() + "/node" + std::to_string(node); }
  std::string Log(const std::string& name) { return tmp_.path() + "/" + name + ".log"; }
  std::string ProgressPath(int rank) { return tmp_.path() + "/progress" + std::to_string(rank); }

  void StartAgent(int n) {
    static int incarnation = 0;
    const std::string log = Log("agent" + std::to_string(n) + "." + std::to_string(++incarnation));
    agent_logs_[n] = log;
    std::vector<std::string> args = {MEMENTO_BIN,
                                     "agent",
                                     "--job",
                                     kJob,
                                     "--node",
                                     std::to_string(n),
                                     "--root",
                                     Root(n),
                                     "--store",
                                     job_store_.url(),
                                     "--token-file",
                                     job_store_.token_file(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--hold-timeout",
                                     "5",
                                     "--lease-ttl",
                                     lease_ttl_,
                                     "--recovery-leader",
                                     "auto",
                                     "--recovery-timeout",
                                     "60"};
    args.insert(args.end(), agent_extra_.begin(), agent_extra_.end());
    agents_[n] = Spawn(args, log);
    ASSERT_NO_FATAL_FAILURE(cluster_save_testing::WaitAgentReady(&agents_[n], log, n));
  }

  pid_t StartTrainer(int rank, int64_t steps) {
    const std::string barrier = tmp_.path() + "/barrier";
    mkdir(barrier.c_str(), 0700);
    return Spawn({CLUSTER_TRAINER_BIN,
                  "--job",
                  kJob,
                  "--dir",
                  Root(rank),
                  "--rank",
                  std::to_string(rank),
                  "--world",
                  std::to_string(kNodes),
                  "--bytes",
                  std::to_string(256 << 10),
                  "--steps",
                  std::to_string(steps),
                  "--step-sleep",
                  "0.05",
                  "--progress",
                  ProgressPath(rank),
                  "--barrier",
                  barrier,
                  "--pace-commits"},
                 Log("trainer" + std::to_string(rank)));
  }

  int64_t Committed() { return job_store_.Committed(); }

  // Runs the job to kSteps, every step committed; returns each rank's digests.
  void TrainAndCommit() {
    for (int n = 0; n < kNodes; ++n) ASSERT_NO_FATAL_FAILURE(StartAgent(n));
    for (int r = 0; r < kNodes; ++r) trainers_.push_back(StartTrainer(r, kSteps));
    for (int r = 0; r < kNodes; ++r) {
      int st = WaitExit(trainers_[r], 60);
      trainers_[r] = -1;
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
          << "trainer " << r << ": " << ReadProgress(ProgressPath(r)).error;
    }
    for (int r = 0; r < kNodes; ++r) before_[r] = ReadProgress(ProgressPath(r));
    // The newest step every rank completed commits. It is kSteps unless a
    // rank legitimately skipped its last snapshot (the previous step was
    // still pending commit on a loaded machine: a skip, reported in its
    // progress file), then the newest step all of them hold.
    committed_ = -1;
    for (int64_t s = kSteps; s >= 0 && committed_ < 0; --s) {
      bool everywhere = true;
      for (int r = 0; r < kNodes; ++r) {
        const auto& c = before_[r].completed;
        everywhere = everywhere && std::find(c.begin(), c.end(), s) != c.end();
      }
      if (everywhere) committed_ = s;
    }
    ASSERT_GE(committed_, kSteps - 2) << "more than the last two steps were skipped";
    for (Deadline d = Deadline::AfterSeconds(20); Committed() < committed_ && !d.expired();) {
      usleep(20000);
    }
    ASSERT_EQ(Committed(), committed_);
  }

  // xxh3 of the data region of `rank`'s complete slot of `step` on its node
  // (checksums verified); 0 when none.
  uint64_t SlotDigest(int rank, int64_t step) {
    for (int s = 0; s < 2; ++s) {
      auto seg = shm::Segment::Open(shm::SlotPath(Root(rank), rank, s), false);
      if (!seg.ok()) continue;
      auto info = shm::ReadSlot(**seg);
      if (!info.ok() || info->state != shm::SlotState::kComplete || info->step != step) continue;
      if (!shm::VerifySlotData(**seg, *info).ok()) return 0;
      return Checksum((*seg)->data() + info->data_offset, info->data_bytes);
    }
    return 0;
  }

  // The node is lost: its agent killed, its shared memory gone.
  void LoseNode(int n) {
    shm::testing::KillAndReap(agents_[n]);
    agents_[n] = -1;
    auto freed = shm::RemoveNodeRootTree(Root(n));
    ASSERT_TRUE(freed.ok()) << freed.status();
  }

  std::string Leader() {
    auto kv = job_store_.store()->Get(launch::RecoveryLeaderKey(kJob), Deadline::AfterSeconds(5));
    return kv.ok() ? kv->value : "";
  }
  launch::RecoveryView View() {
    auto v = launch::ReadRecoveryView(*job_store_.store(), kJob, Deadline::AfterSeconds(5));
    MEMENTO_CHECK_OK(v.status());
    return *v;
  }

  // Every trainer restarts, asks its agent for the step and must load the
  // committed state bit-identically.
  void ExpectTrainersRestoreCommitted() { ExpectTrainersRestore(committed_); }
  // The same for `step`: each rank's digest of it from the first run.
  // The trainers run up to `steps`.
  void ExpectTrainersRestore(int64_t step, int64_t steps = kSteps) {
    for (int r = 0; r < kNodes; ++r) {
      unlink(ProgressPath(r).c_str());
      trainers_[r] = StartTrainer(r, steps);
    }
    for (int r = 0; r < kNodes; ++r) {
      int st = WaitExit(trainers_[r], 60);
      trainers_[r] = -1;
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
          << "rank " << r << ": " << ReadProgress(ProgressPath(r)).error;
      Progress after = ReadProgress(ProgressPath(r));
      ASSERT_EQ(after.restored.size(), 1u) << "rank " << r;
      EXPECT_EQ(after.restored[0].first, step) << "rank " << r;
      ASSERT_EQ(before_[r].digests.count(step), 1u) << "rank " << r << " never computed " << step;
      EXPECT_EQ(after.restored[0].second, before_[r].digests.at(step))
          << "rank " << r << " restored other bytes than it had at step " << step;
    }
  }

  // `memento recover --wait --json`: the CLI operators use.
  nlohmann::json RecoverWait() {
    const std::string out_path = tmp_.path() + "/recover.out";
    pid_t p =
        Spawn({MEMENTO_BIN, "recover", "--store", job_store_.url(), "--job", kJob, "--token-file",
               job_store_.token_file(), "--wait", "--timeout", "90", "--json"},
              out_path);
    int st = WaitExit(p, 120);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadAll(out_path);
    const std::string out = ReadAll(out_path);
    auto j = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j;
  }

  void DurableFallback(bool corrupt);
  // Two nodes lost whose agents' leases outlive them (--lease-ttl 30), the
  // first one's replacement started, a recovery requested; `extra`: more
  // agent flags.
  struct LateReplacement {
    int late = -1;           // the node without an agent
    std::string leader_log;  // the leader's agent's log
    int64_t newest = -1;     // the newest complete durable version
    int64_t id = 0;          // the recovery request
  };
  void LoseTwoNodesOneReplacementLate(const std::vector<std::string>& extra, LateReplacement* out);
  // Waits until `durable` holds at least two complete versions and they stop
  // changing; their steps, oldest first.
  void WaitCompleteDurableVersions(const std::string& durable, std::vector<int64_t>* complete);

  // The agents' and trainers' lines about durable versions, commits and
  // skips (what to read when the durable tier holds fewer versions than
  // expected).
  std::string DurableLines() {
    std::string out;
    for (int n = 0; n < kNodes; ++n) {
      for (int i = 1; i <= 16; ++i) {
        const std::string text =
            ReadAll(Log("agent" + std::to_string(n) + "." + std::to_string(i)));
        std::istringstream lines(text);
        for (std::string line; std::getline(lines, line);) {
          if (line.find("durable") != std::string::npos ||
              line.find("abandon") != std::string::npos || line.find("skip") != std::string::npos) {
            out += line + "\n";
          }
        }
      }
    }
    for (int r = 0; r < kNodes; ++r) {
      out += "progress" + std::to_string(r) + ":\n" + ReadAll(ProgressPath(r));
    }
    return out;
  }

  memento::testing::ScratchDir tmp_{"agent-recovery"};
  shm::testing::ShmScratchDir shm_{"agent-recovery"};
  cluster_save_testing::JobStore job_store_;
  std::vector<pid_t> agents_;
  std::vector<std::string> agent_logs_;   // each node's newest agent's log
  std::vector<std::string> agent_extra_;  // more `memento agent` arguments
  std::string lease_ttl_ = "1";           // the agents' --lease-ttl (s)
  bool store_coordinates_ = true;         // a commit coordinator runs beside the store
  std::vector<pid_t> trainers_;
  Progress before_[kNodes];
  int64_t committed_ = -1;  // the step the job committed last (TrainAndCommit)
};

TEST_F(AgentRecoveryTest, NodeLossIsRecoveredByTheAgentsBitIdentical) {
  ASSERT_NO_FATAL_FAILURE(TrainAndCommit());
  const std::string leader = Leader();
  ASSERT_FALSE(leader.empty()) << "no recovery leader was elected";
  // Lose a node that is not the leader's; the leader files the request.
  const int lost = leader == coord::NodeName(1) ? 2 : 1;
  const uint64_t want = SlotDigest(lost, committed_);
  ASSERT_NE(want, 0u);
  ASSERT_NO_FATAL_FAILURE(LoseNode(lost));
  for (Deadline d = Deadline::AfterSeconds(20); View().requested < 1; usleep(50000)) {
    ASSERT_FALSE(d.expired()) << "the leader did not request a recovery for the lost node";
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(lost));  // the replacement, on an empty root
  nlohmann::json j = RecoverWait();
  ASSERT_TRUE(j.contains("status")) << j.dump();
  const nlohmann::json& st = j["status"];
  EXPECT_EQ(st["state"], "done") << j.dump();
  EXPECT_EQ(st["id"], 1) << j.dump();
  EXPECT_EQ(st["restore_step"], committed_) << j.dump();
  EXPECT_EQ(st["source"], "memory") << j.dump();
  EXPECT_EQ(st["leader"], leader) << j.dump();
  EXPECT_EQ(st["trigger"], coord::NodeName(lost) + " lost") << j.dump();
  EXPECT_GT(st["recovery"]["rebuilt_bytes"].get<uint64_t>(), 0u) << j.dump();
  EXPECT_EQ(SlotDigest(lost, committed_), want) << "the rebuilt slot differs from the lost one";
  ASSERT_NO_FATAL_FAILURE(ExpectTrainersRestoreCommitted());
}

TEST_F(AgentRecoveryTest, LeaderKilledMidRecoveryAnotherAgentFinishesIt) {
  ASSERT_NO_FATAL_FAILURE(TrainAndCommit());
  const std::string leader = Leader();
  ASSERT_FALSE(leader.empty()) << "no recovery leader was elected";
  auto leader_node = coord::ParseNodeName(leader);
  ASSERT_TRUE(leader_node.ok());
  const int lost = (*leader_node + 1) % kNodes;
  const uint64_t want = SlotDigest(lost, committed_);
  ASSERT_NE(want, 0u);
  ASSERT_NO_FATAL_FAILURE(LoseNode(lost));
  // Mid-recovery: the leader requested it and waits for the replacement.
  for (Deadline d = Deadline::AfterSeconds(20);; usleep(50000)) {
    launch::RecoveryView v = View();
    if (v.has_status && v.status.id == 1 && v.status.state == "waiting") break;
    ASSERT_FALSE(d.expired()) << "the leader did not start recovery 1";
  }
  shm::testing::KillAndReap(agents_[*leader_node]);  // its memory stays
  agents_[*leader_node] = -1;
  std::string successor;
  for (Deadline d = Deadline::AfterSeconds(20);; usleep(50000)) {
    successor = Leader();
    if (!successor.empty() && successor != leader) break;
    ASSERT_FALSE(d.expired()) << "no agent took over the leadership from " << leader;
  }
  // The killed leader's agent comes back on its root, the replacement on an
  // empty one.
  ASSERT_NO_FATAL_FAILURE(StartAgent(*leader_node));
  ASSERT_NO_FATAL_FAILURE(StartAgent(lost));
  nlohmann::json j = RecoverWait();
  const nlohmann::json& st = j["status"];
  EXPECT_EQ(st["state"], "done") << j.dump();
  EXPECT_EQ(st["id"], 1) << j.dump();
  EXPECT_EQ(st["leader"], successor) << j.dump();
  EXPECT_EQ(st["takeover"], true) << j.dump();
  EXPECT_EQ(st["restore_step"], committed_) << j.dump();
  EXPECT_EQ(SlotDigest(lost, committed_), want) << "the rebuilt slot differs from the lost one";
  ASSERT_NO_FATAL_FAILURE(ExpectTrainersRestoreCommitted());
}

// Memory cannot rebuild the job (two of three nodes lost, replicate protects
// one): the leader falls back to the durable tier. It loads the newest
// complete durable version on every node, publishes that restore step, and
// the trainers restore it bit-identically. With `corrupt`, the newest
// version has a flipped byte: the leader skips it (naming it) and loads the
// next older complete one.
void AgentRecoveryTest::WaitCompleteDurableVersions(const std::string& durable,
                                                    std::vector<int64_t>* complete_out) {
  // The committed even steps are persisted (the trainers skip snapshots
  // rather than overwrite a slot being persisted; a step that some rank
  // skipped never commits and is not persisted): every commit is in, so
  // wait until the complete versions stop changing.
  std::vector<int64_t> complete;
  Stopwatch stable;
  for (Deadline d = Deadline::AfterSeconds(60);; usleep(100000)) {
    std::vector<int64_t> now;
    auto versions = tier::ListVersions(tier::Env::Default(), durable);
    if (versions.ok()) {
      for (const auto& v : *versions) {
        if (v.complete) now.push_back(v.step);
      }
    }
    if (now != complete) {
      complete = now;
      stable.Reset();
    }
    if (complete.size() >= 2 && stable.Seconds() > 3) break;
    ASSERT_FALSE(d.expired()) << "fewer than two complete durable versions: "
                              << ::testing::PrintToString(complete) << "\n"
                              << DurableLines();
  }
  *complete_out = complete;
}

void AgentRecoveryTest::DurableFallback(bool corrupt) {
  const std::string durable = tmp_.path() + "/durable";
  agent_extra_ = {"--durable-dir", durable, "--persist-every", "2", "--keep-last", "5"};
  ASSERT_NO_FATAL_FAILURE(TrainAndCommit());
  std::vector<int64_t> complete;
  ASSERT_NO_FATAL_FAILURE(WaitCompleteDurableVersions(durable, &complete));
  const int64_t newest = complete.back();
  const int64_t older = complete[complete.size() - 2];
  const int64_t want = corrupt ? older : newest;
  // One flipped byte in the middle of the newest version's first piece.
  if (corrupt) {
    auto index = tier::LoadIndex(tier::Env::Default(), durable, newest);
    ASSERT_TRUE(index.ok()) << index.status();
    bool flipped = false;
    for (const auto& [name, t] : index->tensors) {
      for (const tier::PieceRecord& p : t.pieces) {
        if (flipped || p.length == 0) continue;
        const std::string path = durable + "/" + tier::VersionDirName(newest) + "/" + p.file;
        int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
        ASSERT_GE(fd, 0) << path;
        const off_t at = static_cast<off_t>(p.file_offset + p.length / 2);
        uint8_t b = 0;
        ASSERT_EQ(pread(fd, &b, 1, at), 1);
        b ^= 0x5a;
        ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
        close(fd);
        flipped = true;
      }
    }
    ASSERT_TRUE(flipped) << "durable version " << newest << " has no data";
  }
  const std::string leader = Leader();
  ASSERT_FALSE(leader.empty()) << "no recovery leader was elected";
  auto leader_node = coord::ParseNodeName(leader);
  ASSERT_TRUE(leader_node.ok());
  std::vector<int> lost;
  for (int n = 0; n < kNodes; ++n) {
    if (n != *leader_node) lost.push_back(n);
  }
  for (int n : lost) ASSERT_NO_FATAL_FAILURE(LoseNode(n));
  for (Deadline d = Deadline::AfterSeconds(20); View().requested < 1; usleep(50000)) {
    ASSERT_FALSE(d.expired()) << "the leader did not request a recovery for the lost nodes";
  }
  // Both losses are seen before the replacements start: every lost node's
  // killed agent is gone from the store (its lease expired). Otherwise, on a
  // loaded machine, the leader can find the first replacement and the second
  // lost node's stale entry, start, and then meet that node without an agent
  // while it loads the durable version (failed at load 25: "node 2 has no
  // live agent in the store", the newest version skipped, restore_step 2 of
  // 4).
  for (Deadline d = Deadline::AfterSeconds(20);; usleep(50000)) {
    auto eps = launch::ReadEndpoints(*job_store_.store(), kJob, kNodes, Deadline::AfterSeconds(5));
    bool gone = eps.ok();
    for (int n : lost) gone = gone && (*eps)[static_cast<size_t>(n)].empty();
    if (gone) break;
    ASSERT_FALSE(d.expired()) << "a lost node's killed agent is still live in the store";
  }
  for (int n : lost) ASSERT_NO_FATAL_FAILURE(StartAgent(n));  // empty roots
  nlohmann::json j = RecoverWait();
  ASSERT_TRUE(j.contains("status")) << j.dump();
  const nlohmann::json& st = j["status"];
  EXPECT_EQ(st["state"], "done") << j.dump();
  EXPECT_EQ(st["source"], "durable") << j.dump();
  EXPECT_EQ(st["restore_step"], want) << j.dump();
  EXPECT_EQ(st["leader"], leader) << j.dump();
  const std::string message = st.value("message", "");
  EXPECT_NE(message.find("memory cannot rebuild"), std::string::npos) << message;
  // The skipped version is named (as by `memento launch --recovery-by
  // launcher`): "step N fails verification: <file and what>".
  const std::string skipped = "step " + std::to_string(newest) + " fails verification: ";
  EXPECT_EQ(message.find("newer durable version(s) skipped: " + skipped) != std::string::npos,
            corrupt)
      << message;
  ASSERT_EQ(st.contains("durable_skipped"), corrupt) << j.dump();
  if (corrupt) {
    ASSERT_EQ(st["durable_skipped"].size(), 1u) << j.dump();
    EXPECT_EQ(st["durable_skipped"][0].get<std::string>().rfind(skipped, 0), 0u) << j.dump();
  }
  EXPECT_GT(st["recovery"].value("read_bytes", uint64_t{0}), 0u) << j.dump();
  // Every agent serves the durable step as its restore target; the trainers
  // restore it bit-identically (the lost nodes' ranks from the durable tier).
  ASSERT_NO_FATAL_FAILURE(ExpectTrainersRestore(want));
  // The restored step is the first commit of the recovery's commit epoch,
  // and the steps the trainers computed again after it commit in it (with
  // the corrupt newest version they are steps the abandoned history had
  // committed: docs/coordination.md, "Epochs").
  coord::CommitId latest;
  for (Deadline d = Deadline::AfterSeconds(20);; usleep(50000)) {
    auto id = coord::ReadLatestCommitId(*job_store_.store(), kJob, Deadline::AfterSeconds(5));
    if (id.ok()) latest = *id;
    if (latest.epoch > 0 && (latest.step > want || want >= kSteps)) break;
    ASSERT_FALSE(d.expired()) << "no commit after step " << want
                              << " in a new epoch; commit/latest " << coord::FormatCommitId(latest);
  }
  EXPECT_GE(latest.step, want);
}

TEST_F(AgentRecoveryTest, TwoNodesLostTheLeaderRestoresTheNewestDurableVersion) {
  DurableFallback(/*corrupt=*/false);
}

TEST_F(AgentRecoveryTest, TwoNodesLostACorruptNewestDurableVersionFallsBackToAnOlderOne) {
  DurableFallback(/*corrupt=*/true);
}

// A node's agent is missing while the durable version loads (docs/recovery.md,
// "Recovery run by the agents"): two nodes are lost, but the agents' leases
// outlive them (--lease-ttl 30), so the second lost node's stale entry still
// looks live when the recovery begins; only one replacement has started.
// The inventory finds that node unreachable, memory cannot rebuild, and the
// durable load meets no agent there. The leader waits for it (it logs which
// node it waits for) instead of skipping the version; the late replacement
// starts once that line is logged, and the NEWEST durable version is
// restored, bit-identical. Before the wait the leader skipped every version
// ("node 2 has no live agent") and restored an older one or none.
void AgentRecoveryTest::LoseTwoNodesOneReplacementLate(const std::vector<std::string>& extra,
                                                       LateReplacement* out) {
  const std::string durable = tmp_.path() + "/durable";
  agent_extra_ = {"--durable-dir", durable, "--persist-every", "2", "--keep-last", "5"};
  agent_extra_.insert(agent_extra_.end(), extra.begin(), extra.end());
  lease_ttl_ = "30";
  ASSERT_NO_FATAL_FAILURE(TrainAndCommit());
  std::vector<int64_t> complete;
  ASSERT_NO_FATAL_FAILURE(WaitCompleteDurableVersions(durable, &complete));
  out->newest = complete.back();
  const std::string leader = Leader();
  ASSERT_FALSE(leader.empty()) << "no recovery leader was elected";
  auto leader_node = coord::ParseNodeName(leader);
  ASSERT_TRUE(leader_node.ok());
  const int early = (*leader_node + 1) % kNodes;
  out->late = (*leader_node + 2) % kNodes;
  out->leader_log = agent_logs_[*leader_node];
  ASSERT_NO_FATAL_FAILURE(LoseNode(early));
  ASSERT_NO_FATAL_FAILURE(LoseNode(out->late));
  ASSERT_NO_FATAL_FAILURE(StartAgent(early));  // on an empty root
  // The killed agent's entry is still there (its lease outlives it): what
  // the recovery meets when it begins before that lease expires.
  {
    auto eps = launch::ReadEndpoints(*job_store_.store(), kJob, kNodes, Deadline::AfterSeconds(5));
    ASSERT_TRUE(eps.ok()) << eps.status();
    ASSERT_FALSE((*eps)[static_cast<size_t>(out->late)].empty())
        << "node " << out->late << "'s killed agent left the store before the recovery began";
  }
  // An operator's trigger (`memento recover --trigger`): no key vanished.
  auto id = launch::RequestRecovery(*job_store_.store(), kJob, Deadline::AfterSeconds(5));
  ASSERT_TRUE(id.ok()) << id.status();
  out->id = *id;
}

TEST_F(AgentRecoveryTest, DurableLoadWaitsForALateReplacementAgent) {
  LateReplacement lr;
  ASSERT_NO_FATAL_FAILURE(LoseTwoNodesOneReplacementLate({}, &lr));
  const int late = lr.late;
  const std::string& leader_log = lr.leader_log;
  const std::string waits = "waiting up to 60 s for node " + std::to_string(late) + "'s agent";
  for (Deadline d = Deadline::AfterSeconds(60);
       ReadAll(leader_log).find(waits) == std::string::npos; usleep(50000)) {
    ASSERT_FALSE(d.expired()) << "the leader did not wait for node " << late << "'s agent; "
                              << (View().has_status ? View().status.ToJson().dump() : "no status")
                              << "\n"
                              << ReadAll(leader_log);
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(late));  // the late replacement, on an empty root
  nlohmann::json j = RecoverWait();
  ASSERT_TRUE(j.contains("status")) << j.dump();
  const nlohmann::json& st = j["status"];
  EXPECT_EQ(st["state"], "done") << j.dump() << "\n" << ReadAll(leader_log);
  EXPECT_EQ(st["id"], lr.id) << j.dump();
  EXPECT_EQ(st["source"], "durable") << j.dump();
  EXPECT_EQ(st["restore_step"], lr.newest) << j.dump();
  EXPECT_FALSE(st.contains("durable_skipped")) << j.dump();
  EXPECT_NE(ReadAll(leader_log).find("node " + std::to_string(late) + "'s agent registered at"),
            std::string::npos)
      << ReadAll(leader_log);
  ASSERT_NO_FATAL_FAILURE(ExpectTrainersRestore(lr.newest));
}

// The same, but the replacement never comes: past `--agent-wait` the
// recovery fails, naming the node whose agent it waited for, and tries no
// older version (each needs that node's agent too).
TEST_F(AgentRecoveryTest, DurableLoadGivesUpNamingTheAgentItWaitedFor) {
  LateReplacement lr;
  ASSERT_NO_FATAL_FAILURE(LoseTwoNodesOneReplacementLate({"--agent-wait", "1.5"}, &lr));
  launch::RecoveryView v;
  for (Deadline d = Deadline::AfterSeconds(60);; usleep(50000)) {
    v = View();
    if (v.has_status && v.status.id == lr.id && v.status.final()) break;
    ASSERT_FALSE(d.expired()) << "recovery " << lr.id << " did not end: "
                              << (v.has_status ? v.status.ToJson().dump() : "no status") << "\n"
                              << ReadAll(lr.leader_log);
  }
  const std::string node = coord::NodeName(lr.late);
  EXPECT_EQ(v.status.state, "failed") << v.status.ToJson().dump();
  EXPECT_NE(v.status.message.find("loading durable version " + std::to_string(lr.newest) +
                                  " waited 1.5 s for the agent of " + node + " in vain"),
            std::string::npos)
      << v.status.message;
  EXPECT_NE(v.status.message.find("no older version tried"), std::string::npos) << v.status.message;
  EXPECT_NE(v.status.message.find("node " + std::to_string(lr.late) +
                                  "'s agent did not come back within 1.5 s"),
            std::string::npos)
      << v.status.message;
  EXPECT_TRUE(v.status.durable_skipped.empty()) << v.status.ToJson().dump();
  EXPECT_NE(ReadAll(lr.leader_log)
                .find("waiting up to 1.5 s for node " + std::to_string(lr.late) + "'s agent"),
            std::string::npos)
      << ReadAll(lr.leader_log);
}

// Whoever files a request may have seen a newer epoch than the store holds
// (`memento launch --recovery-by agents` keeps its newest one across a store
// restarted empty, which loses /memento/<job>/epoch): the request raises
// recovery_epoch_floor and the leader's epoch is above it.
TEST_F(AgentRecoveryTest, TheLeadersEpochIsAboveTheRequestersFloor) {
  ASSERT_NO_FATAL_FAILURE(TrainAndCommit());
  coord::Store& store = *job_store_.store();
  auto before = coord::ReadLatestCommitId(store, kJob, Deadline::AfterSeconds(5));
  ASSERT_TRUE(before.ok()) << before.status();
  const uint64_t floor = before->epoch + 7;
  auto wait_done = [&](int64_t id) {
    launch::RecoveryView v;
    for (Deadline d = Deadline::AfterSeconds(60);; usleep(50000)) {
      v = View();
      if (v.has_status && v.status.id == id && v.status.final()) break;
      if (d.expired()) {
        ADD_FAILURE() << "recovery " << id << " did not finish: "
                      << (v.has_status ? v.status.ToJson().dump() : "no status");
        break;
      }
    }
    return v.status;
  };
  auto id = launch::RequestRecovery(store, kJob, Deadline::AfterSeconds(5), floor);
  ASSERT_TRUE(id.ok()) << id.status();
  launch::RecoveryStatus st = wait_done(*id);
  ASSERT_EQ(st.state, "done") << st.ToJson().dump();
  EXPECT_EQ(st.restore_step, committed_) << st.ToJson().dump();
  EXPECT_EQ(st.epoch, floor + 1) << st.ToJson().dump();
  auto latest = coord::ReadLatestCommitId(store, kJob, Deadline::AfterSeconds(5));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(coord::FormatCommitId(*latest),
            coord::FormatCommitId(coord::CommitId{floor + 1, committed_}));

  // A lower floor never lowers the key; the next epoch is above the store's.
  auto id2 = launch::RequestRecovery(store, kJob, Deadline::AfterSeconds(5), 2);
  ASSERT_TRUE(id2.ok()) << id2.status();
  EXPECT_EQ(*launch::ReadRecoveryEpochFloor(store, kJob, Deadline::AfterSeconds(5)), floor);
  st = wait_done(*id2);
  ASSERT_EQ(st.state, "done") << st.ToJson().dump();
  EXPECT_EQ(st.epoch, floor + 2) << st.ToJson().dump();

  // A floor that is not a number is refused, naming the key.
  ASSERT_TRUE(store.Set(launch::RecoveryEpochFloorKey(kJob), "x1", Deadline::AfterSeconds(5)).ok());
  auto bad = launch::RequestRecovery(store, kJob, Deadline::AfterSeconds(5), 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("recovery_epoch_floor holds 'x1', not an epoch"),
            std::string::npos)
      << bad.status();
}

// `memento agent --coordinate-commits` (docs/coordination.md, "Who
// coordinates the commits"): no coordinator runs beside the store; the
// recovery leader runs the commit rule while it leads. Its node is lost: a
// successor wins the lease, rebuilds the node and coordinates the commits of
// the steps trained after the restore.
class AgentCommitCoordinatorTest : public AgentRecoveryTest {
 protected:
  void SetUp() override {
    store_coordinates_ = false;
    agent_extra_ = {"--coordinate-commits"};
    AgentRecoveryTest::SetUp();
  }
};

TEST_F(AgentCommitCoordinatorTest, TheLeaderCoordinatesTheCommitsASuccessorTakesThemOver) {
  // Every step commits (TrainAndCommit waits for commit/latest): only the
  // leader's coordinator can have published them.
  ASSERT_NO_FATAL_FAILURE(TrainAndCommit());
  const std::string leader = Leader();
  ASSERT_FALSE(leader.empty()) << "no recovery leader was elected";
  auto leader_node = coord::ParseNodeName(leader);
  ASSERT_TRUE(leader_node.ok());
  const int lost = *leader_node;
  const uint64_t want = SlotDigest(lost, committed_);
  ASSERT_NE(want, 0u);
  ASSERT_NO_FATAL_FAILURE(LoseNode(lost));
  std::string successor;
  for (Deadline d = Deadline::AfterSeconds(20);; usleep(50000)) {
    successor = Leader();
    if (!successor.empty() && successor != leader) break;
    ASSERT_FALSE(d.expired()) << "no agent took over the leadership from " << leader;
  }
  for (Deadline d = Deadline::AfterSeconds(20); View().requested < 1; usleep(50000)) {
    ASSERT_FALSE(d.expired()) << "the successor did not request a recovery for " << leader;
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(lost));  // the replacement, on an empty root
  nlohmann::json j = RecoverWait();
  ASSERT_TRUE(j.contains("status")) << j.dump();
  const nlohmann::json& st = j["status"];
  EXPECT_EQ(st["state"], "done") << j.dump();
  EXPECT_EQ(st["leader"], successor) << j.dump();
  EXPECT_EQ(st["restore_step"], committed_) << j.dump();
  const uint64_t epoch = st.value("epoch", uint64_t{0});
  EXPECT_GT(epoch, 0u) << j.dump();
  EXPECT_EQ(SlotDigest(lost, committed_), want) << "the rebuilt slot differs from the lost one";
  // The trainers restore the committed state and train kSteps more; the
  // successor's coordinator commits those steps in the recovery's epoch.
  ASSERT_NO_FATAL_FAILURE(ExpectTrainersRestore(committed_, committed_ + kSteps));
  coord::CommitId latest;
  for (Deadline d = Deadline::AfterSeconds(30);; usleep(50000)) {
    auto id = coord::ReadLatestCommitId(*job_store_.store(), kJob, Deadline::AfterSeconds(5));
    if (id.ok()) latest = *id;
    if (latest.epoch == epoch && latest.step > committed_) break;
    ASSERT_FALSE(d.expired()) << "no step after " << committed_ << " committed in epoch " << epoch
                              << "; commit/latest " << coord::FormatCommitId(latest);
  }
}

TEST_F(AgentRecoveryTest, RecoverWithoutALeaderSaysSo) {
  // No agent runs: `memento recover` shows that, and --wait times out naming it.
  const std::string out_path = tmp_.path() + "/recover.out";
  pid_t p =
      Spawn({MEMENTO_BIN, "recover", "--store", job_store_.url(), "--job", kJob, "--token-file",
             job_store_.token_file(), "--trigger", "--wait", "--timeout", "1"},
            out_path);
  int st = WaitExit(p, 30);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  const std::string out = ReadAll(out_path);
  EXPECT_NE(out.find("requested recovery 1"), std::string::npos) << out;
  EXPECT_NE(out.find("no recovery leader is elected"), std::string::npos) << out;
}

}  // namespace
}  // namespace memento
