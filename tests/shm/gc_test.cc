// `memento gc` and `memento agent --remove-on-exit` with real agent processes
// killed with real signals, and a real client (this process) mapping slots:
//  - a live agent's root is kept, a kill -9'ed agent's root is removed (with
//    the bytes it frees), a dead agent's root whose slots a trainer still
//    maps is kept until the trainer lets go; --dry-run changes nothing;
//  - an agent stopped with SIGTERM keeps its root (adoption) unless it runs
//    with --remove-on-exit.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/shell_test_util.h"
#include "memento/client.h"
#include "proc_util.h"
#include "shm/root_gc.h"
#include "shm/shm_test_util.h"

namespace memento::shm::testing {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

class GcTest : public ::testing::Test {
 protected:
  GcTest() : base_(dir_.path() + "/base"), log_(dir_.path() + "/log") {}
  ~GcTest() override {
    for (pid_t p : agents_) KillAndReap(p);
  }

  std::string Root(const std::string& job) const { return base_ + "/" + job + "/node0"; }

  pid_t StartAgent(const std::string& job, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {MEMENTO_BIN, "agent", "--job", job, "--root", Root(job)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_t pid = Spawn(argv, log_ + "." + job);
    EXPECT_TRUE(WaitFor([&] { return AgentAnswers(Root(job)); }, 30)) << ReadFile(log_ + "." + job);
    agents_.push_back(pid);
    return pid;
  }
  void Forget(pid_t pid) {
    agents_.erase(std::remove(agents_.begin(), agents_.end(), pid), agents_.end());
  }

  // A trainer of `job` that saved one step; it keeps its slots mapped.
  std::unique_ptr<Client> Trainer(const std::string& job) {
    ClientOptions o;
    o.job_id = job;
    o.agent_dir = Root(job);
    o.chunk_bytes = 64 << 10;
    o.connect_timeout_s = 10;
    auto c = Client::Connect(o);
    MEMENTO_CHECK_OK(c.status());
    state_.assign(1 << 20, 7);
    MEMENTO_CHECK_OK((*c)->RegisterBlob("state", state_.data(), state_.size()));
    MEMENTO_CHECK_OK((*c)->Seal());
    MEMENTO_CHECK_OK((*c)->Snapshot(1));
    MEMENTO_CHECK_OK((*c)->Fence());
    return std::move(*c);
  }

  nlohmann::json Gc(bool dry_run) {
    std::string cmd = std::string(MEMENTO_BIN) + " gc --json --root-base " + base_ +
                      (dry_run ? " --dry-run" : "") + " 2>>" + log_ + ".gc";
    auto [rc, out] = memento::testing::RunShell(cmd);
    EXPECT_EQ(rc, 0) << out << ReadFile(log_ + ".gc");
    auto j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j;
  }
  static const nlohmann::json* Entry(const nlohmann::json& report, const std::string& root) {
    for (const auto& r : report["roots"]) {
      if (r["root"] == root) return &r;
    }
    return nullptr;
  }

  ShmScratchDir dir_;
  std::string base_;
  std::string log_;
  std::vector<pid_t> agents_;
  std::vector<uint8_t> state_;
};

TEST_F(GcTest, RemovesDeadRootsOnlyAndNeverALiveOne) {
  StartAgent("live");
  auto live_trainer = Trainer("live");
  pid_t dead = StartAgent("dead");
  Trainer("dead").reset();  // saved a step, then exited
  pid_t orphan = StartAgent("orphan");
  auto orphan_trainer = Trainer("orphan");  // outlives its agent
  KillAndReap(dead);
  Forget(dead);
  KillAndReap(orphan);
  Forget(orphan);
  ASSERT_TRUE(Exists(SlotPath(Root("dead"), 0, 0)));

  // The library's view first.
  auto roots = FindNodeRoots(base_);
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(*roots, (std::vector<std::string>{Root("dead"), Root("live"), Root("orphan")}));
  auto p = ProbeNodeRoot(Root("orphan"));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->live) << p->why;
  EXPECT_EQ(p->mapped_by, std::vector<pid_t>{getpid()}) << p->why;
  EXPECT_EQ(RemoveDeadNodeRoot(Root("live")).status().code(), StatusCode::kFailedPrecondition);

  // --dry-run: reports, removes nothing.
  nlohmann::json dry = Gc(/*dry_run=*/true);
  ASSERT_NE(Entry(dry, Root("dead")), nullptr) << dry.dump(1);
  EXPECT_EQ((*Entry(dry, Root("dead")))["action"], "would_remove") << dry.dump(1);
  EXPECT_EQ((*Entry(dry, Root("live")))["action"], "kept") << dry.dump(1);
  EXPECT_EQ((*Entry(dry, Root("orphan")))["action"], "kept") << dry.dump(1);
  EXPECT_TRUE(Exists(SlotPath(Root("dead"), 0, 0)));

  nlohmann::json done = Gc(/*dry_run=*/false);
  EXPECT_EQ((*Entry(done, Root("dead")))["action"], "removed") << done.dump(1);
  EXPECT_GE((*Entry(done, Root("dead")))["bytes"].get<uint64_t>(), 2 * state_.size());
  EXPECT_EQ(done["removed"], 1);
  EXPECT_EQ(done["kept"], 2);
  EXPECT_FALSE(Exists(Root("dead")));
  EXPECT_FALSE(Exists(base_ + "/dead"));  // the empty job directory too
  EXPECT_NE((*Entry(done, Root("live")))["why"].get<std::string>().find("agent.lock"),
            std::string::npos);
  EXPECT_NE((*Entry(done, Root("orphan")))["why"].get<std::string>().find("mapped"),
            std::string::npos);
  // The live job is untouched: its agent answers, its trainer keeps saving.
  EXPECT_TRUE(AgentAnswers(Root("live")));
  ASSERT_TRUE(live_trainer->Snapshot(2).ok());
  ASSERT_TRUE(live_trainer->Fence().ok());
  auto versions = live_trainer->ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(versions->size(), 2u);
  EXPECT_TRUE(Exists(SlotPath(Root("orphan"), 0, 0)));

  // The orphan's trainer exits: its root goes on the next run.
  orphan_trainer.reset();
  done = Gc(/*dry_run=*/false);
  EXPECT_EQ((*Entry(done, Root("orphan")))["action"], "removed") << done.dump(1);
  EXPECT_FALSE(Exists(Root("orphan")));
  EXPECT_TRUE(Exists(SlotPath(Root("live"), 0, 0)));
}

TEST_F(GcTest, AgentRemovesItsRootOnlyWhenAsked) {
  pid_t keep = StartAgent("keep");
  Trainer("keep").reset();
  pid_t gone = StartAgent("gone", {"--remove-on-exit"});
  Trainer("gone").reset();
  for (pid_t pid : {keep, gone}) {
    kill(pid, SIGTERM);
    int st = WaitExit(pid, 60);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    Forget(pid);
  }
  // Default: the state survives the agent for the next one to adopt.
  EXPECT_TRUE(Exists(SlotPath(Root("keep"), 0, 0)));
  EXPECT_TRUE(Exists(SlotPath(Root("keep"), 0, 1)));
  StartAgent("keep");
  EXPECT_NE(ReadFile(log_ + ".keep").find("adopt: kept slot"), std::string::npos)
      << ReadFile(log_ + ".keep");
  // --remove-on-exit: nothing left.
  EXPECT_FALSE(Exists(Root("gone"))) << ReadFile(log_ + ".gone");
}

}  // namespace
}  // namespace memento::shm::testing
