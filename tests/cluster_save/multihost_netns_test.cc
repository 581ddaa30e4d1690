// Several "hosts" on one machine (issue 18, "Running on real engines"): each
// host is a Linux network namespace (launch::NodeNetwork: a bridge in the
// root namespace, a veth into each host) with its own shared-memory root and
// its own `memento run` (which starts the host's agent, `--recovery-leader
// auto`, listening on the host's address, and runs the host's rank of
// cluster_trainer.cc). The coordination store listens on the bridge; no
// launcher runs. One host is lost: every process in its namespace SIGKILLed,
// its root removed. A replacement host (same namespace, empty root) runs
// `memento run` again; the agents' leader notices the loss, waits for the
// replacement, rebuilds its state from its peers and publishes the restore
// step; every rank (the hosts' commands go on once the recovery is done)
// restores the same step, bit-identical to the failure-free run's state at
// that step. Needs root and `ip` (skipped otherwise).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include "../shm/proc_util.h"
#include "common/check.h"
#include "common/test_util.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "job_store.h"
#include "launch/netns.h"
#include "launch/recovery_leader.h"
#include "shm/root_gc.h"
#include "shm/shm_test_util.h"
#include "topo/plan.h"
#include "topo/topology_json.h"

namespace memento {
namespace {

using shm::testing::Progress;
using shm::testing::ReadProgress;
using shm::testing::Spawn;
using shm::testing::WaitExit;

constexpr int kHosts = 3;
constexpr int64_t kSteps = 6;
constexpr const char* kJob = "multihostjob";
constexpr const char* kSecret = "multihost-netns-test-token-0123456789abcdef";

using memento::testing::ReadAll;

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = launch::NodeNetwork::Unsupported(); !why.empty()) {
      GTEST_SKIP() << "network namespaces cannot be made here: " << why;
    }
    auto net = launch::NodeNetwork::Create(kHosts);
    if (!net.ok() && net.status().code() == StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << "network namespaces cannot be made here: " << net.status();
    }
    ASSERT_TRUE(net.ok()) << net.status();
    net_ = std::move(*net);
    ASSERT_NO_FATAL_FAILURE(
        job_store_.Start(tmp_.path(), net_->BridgeAddress(), kJob, kSecret, kHosts));
    ASSERT_NO_FATAL_FAILURE(job_store_.SetUniformTopology(kHosts, "replicate"));
    runs_.assign(kHosts, -1);
  }

  void TearDown() override {
    if (net_ == nullptr) return;
    for (int h = 0; h < kHosts; ++h) KillHost(h);
    job_store_.Stop();
    net_.reset();  // deletes the namespaces and the bridge
  }

  std::string Root(int h) { return shm_.path() + "/host" + std::to_string(h); }
  std::string Log(const std::string& name) { return tmp_.path() + "/" + name + ".log"; }
  std::string ProgressPath(int run, int rank) {
    return tmp_.path() + "/progress" + std::to_string(run) + "." + std::to_string(rank);
  }
  std::string Go() { return tmp_.path() + "/go"; }

  // The trainer's command line for rank `h` in run `run` (1: the first
  // training, 2: after the recovery).
  std::string TrainerLine(int h, int run) {
    const std::string barrier = tmp_.path() + "/barrier" + std::to_string(run);
    mkdir(barrier.c_str(), 0700);
    return std::string(CLUSTER_TRAINER_BIN) + " --job " + kJob + " --dir \"$MEMENTO_RUN_DIR\"" +
           " --rank " + std::to_string(h) + " --world " + std::to_string(kHosts) + " --bytes " +
           std::to_string(256 << 10) + " --steps " + std::to_string(kSteps) +
           " --step-sleep 0.05 --progress " + ProgressPath(run, h) + " --barrier " + barrier;
  }

  // Host `h`: `memento run` in its namespace starts its agent and runs the
  // host's command: the first training (unless `replacement`), then, once
  // the recovery is done (the go file), the rank again (it restores).
  void StartHost(int h, bool replacement) {
    static int incarnation = 0;
    const std::string tag = std::to_string(h) + "." + std::to_string(++incarnation);
    std::string script;
    if (!replacement) script = TrainerLine(h, 1) + " || exit 1; ";
    script += "while [ ! -e " + Go() + " ]; do sleep 0.05; done; exec " + TrainerLine(h, 2);
    std::vector<std::string> argv = net_->ExecPrefix(h);
    for (const std::string& a :
         std::vector<std::string>{MEMENTO_BIN,
                                  "run",
                                  "--job",
                                  kJob,
                                  "--node",
                                  std::to_string(h),
                                  "--root",
                                  Root(h),
                                  "--agent-log",
                                  Log("agent" + tag),
                                  "--durable-drain-s",
                                  "0",
                                  "--agent-arg=--store=" + job_store_.url(),
                                  "--agent-arg=--token-file=" + job_store_.token_file(),
                                  "--agent-arg=--listen=" + net_->NodeAddress(h) + ":0",
                                  "--agent-arg=--lease-ttl=1",
                                  "--agent-arg=--hold-timeout=5",
                                  "--agent-arg=--recovery-leader=auto",
                                  "--agent-arg=--recovery-timeout=60",
                                  "--",
                                  "sh",
                                  "-c",
                                  script}) {
      argv.push_back(a);
    }
    runs_[h] = Spawn(argv, Log("run" + tag));
    ASSERT_GT(runs_[h], 0);
  }

  // Every process in host `h`'s namespace (memento run, the agent, the
  // command, the trainer) SIGKILLed.
  void KillHost(int h) {
    const std::string cmd = "ip netns pids " + net_->Namespace(h) + " 2>/dev/null";
    for (int round = 0; round < 20; ++round) {
      std::set<pid_t> pids;
      if (FILE* f = popen(cmd.c_str(), "r")) {
        int pid = 0;
        while (fscanf(f, "%d", &pid) == 1) pids.insert(pid);
        pclose(f);
      }
      if (pids.empty()) break;
      for (pid_t pid : pids) kill(pid, SIGKILL);
      usleep(50000);
    }
    if (runs_[h] > 0) {
      WaitExit(runs_[h], 10);
      runs_[h] = -1;
    }
  }

  int64_t Committed() { return job_store_.Committed(); }
  std::string Leader() {
    auto kv = job_store_.store()->Get(launch::RecoveryLeaderKey(kJob), Deadline::AfterSeconds(5));
    return kv.ok() ? kv->value : "";
  }
  launch::RecoveryView View() {
    auto v = launch::ReadRecoveryView(*job_store_.store(), kJob, Deadline::AfterSeconds(5));
    MEMENTO_CHECK_OK(v.status());
    return *v;
  }
  std::string HostLogs() {
    std::string out;
    for (const std::string& name : ListDir(tmp_.path())) {
      if (name.size() > 4 && name.substr(name.size() - 4) == ".log") {
        out += "---- " + name + "\n" + ReadAll(tmp_.path() + "/" + name);
      }
    }
    return out;
  }
  static std::vector<std::string> ListDir(const std::string& dir) {
    std::vector<std::string> out;
    std::string cmd = "ls " + dir;
    if (FILE* f = popen(cmd.c_str(), "r")) {
      char line[512];
      while (fgets(line, sizeof(line), f) != nullptr) {
        std::string s(line);
        while (!s.empty() && s.back() == '\n') s.pop_back();
        out.push_back(s);
      }
      pclose(f);
    }
    return out;
  }

  memento::testing::ScratchDir tmp_{"multihost"};
  shm::testing::ShmScratchDir shm_{"multihost"};
  cluster_save_testing::JobStore job_store_;
  std::unique_ptr<launch::NodeNetwork> net_;
  std::vector<pid_t> runs_;
};

TEST_F(MultiHostTest, HostLostAndReplacedIsRebuiltByThePeersBitIdentical) {
  for (int h = 0; h < kHosts; ++h) ASSERT_NO_FATAL_FAILURE(StartHost(h, /*replacement=*/false));
  // The first training ends on every host (each host's command then waits).
  Progress first[kHosts];
  for (Deadline d = Deadline::AfterSeconds(90);; usleep(50000)) {
    bool done = true;
    for (int h = 0; h < kHosts; ++h) {
      first[h] = ReadProgress(ProgressPath(1, h));
      ASSERT_TRUE(first[h].error.empty()) << "rank " << h << ": " << first[h].error;
      done = done && first[h].done;
    }
    if (done) break;
    ASSERT_FALSE(d.expired()) << "the first training did not end\n" << HostLogs();
  }
  // The newest step every rank completed commits (a rank may legitimately
  // skip its last snapshot on a loaded machine).
  int64_t committed = -1;
  for (int64_t s = kSteps; s >= 0 && committed < 0; --s) {
    bool everywhere = true;
    for (int h = 0; h < kHosts; ++h) {
      const auto& c = first[h].completed;
      everywhere = everywhere && std::find(c.begin(), c.end(), s) != c.end();
    }
    if (everywhere) committed = s;
  }
  ASSERT_GE(committed, kSteps - 2) << HostLogs();
  for (Deadline d = Deadline::AfterSeconds(30); Committed() < committed && !d.expired();) {
    usleep(20000);
  }
  ASSERT_EQ(Committed(), committed) << HostLogs();
  const std::string leader = Leader();
  ASSERT_FALSE(leader.empty()) << "no recovery leader was elected\n" << HostLogs();
  const int lost = leader == coord::NodeName(1) ? 2 : 1;

  // The host is lost: all its processes, its memory.
  KillHost(lost);
  auto freed = shm::RemoveNodeRootTree(Root(lost));
  ASSERT_TRUE(freed.ok()) << freed.status();
  for (Deadline d = Deadline::AfterSeconds(30); View().requested < 1; usleep(50000)) {
    ASSERT_FALSE(d.expired()) << "the leader did not request a recovery for the lost host\n"
                              << HostLogs();
  }
  // Its replacement joins with an empty root.
  ASSERT_NO_FATAL_FAILURE(StartHost(lost, /*replacement=*/true));
  launch::RecoveryView v;
  for (Deadline d = Deadline::AfterSeconds(90);; usleep(100000)) {
    v = View();
    if (v.has_status && v.status.id >= 1 && v.status.final()) break;
    ASSERT_FALSE(d.expired()) << "recovery 1 did not finish\n" << HostLogs();
  }
  EXPECT_EQ(v.status.state, "done") << v.status.ToJson().dump() << "\n" << HostLogs();
  EXPECT_EQ(v.status.source, "memory") << v.status.ToJson().dump();
  EXPECT_EQ(v.status.restore_step, committed) << v.status.ToJson().dump();
  EXPECT_EQ(v.status.trigger, coord::NodeName(lost) + " lost") << v.status.ToJson().dump();
  EXPECT_GT(v.status.recovery.value("rebuilt_bytes", uint64_t{0}), 0u) << v.status.ToJson().dump();

  // Every host's command goes on: each rank restores the same step, with
  // the bytes it had at that step in the failure-free run.
  { std::ofstream go(Go()); }
  for (int h = 0; h < kHosts; ++h) {
    int st = WaitExit(runs_[h], 90);
    runs_[h] = -1;
    Progress second = ReadProgress(ProgressPath(2, h));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "host " << h << ": " << second.error << "\n"
        << HostLogs();
    ASSERT_EQ(second.restored.size(), 1u) << "rank " << h << "\n" << HostLogs();
    EXPECT_EQ(second.restored[0].first, committed) << "rank " << h;
    ASSERT_EQ(first[h].digests.count(committed), 1u) << "rank " << h;
    EXPECT_EQ(second.restored[0].second, first[h].digests.at(committed))
        << "rank " << h << " restored other bytes than it had at step " << committed;
  }
}

}  // namespace
}  // namespace memento
