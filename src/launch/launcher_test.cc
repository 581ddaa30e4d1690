// The launcher's supervisor with stand-in agents: a shell script that only
// creates its agent.sock (no cluster mode), so these tests exercise process
// supervision, the trainer environment, placeholders, restarts with a new
// attempt and rendezvous directory, agent replacement and giving up. The real
// agents and recovery are exercised by tests/cluster.
#include "launch/launcher.h"

#include <sys/stat.h>

#include <fstream>

#include "common/test_util.h"
#include "coord/membership.h"
#include "gtest/gtest.h"
#include "launch/launcher_state.h"
#include "launch/netns.h"

namespace memento::launch {
namespace {

using memento::testing::ReadAll;

// A `memento` stand-in: `agent ... --root DIR ...` creates DIR/agent.sock and
// waits; node N's exits 7 after its first start when $dir/agent-dies.N exists.
std::string FakeMemento(const std::string& dir) {
  const std::string path = dir + "/fake-memento";
  std::ofstream f(path);
  f << "#!/bin/sh\n"
       "root=''; node=''\n"
       "while [ $# -gt 0 ]; do if [ \"$1\" = --root ]; then root=$2; fi; if [ \"$1\" = --node ]; "
       "then node=$2; fi; shift; done\n"
       "mkdir -p \"$root\" && : > \"$root/agent.sock\"\n"
       "if [ -e "
    << dir << "/agent-dies.$node ]; then rm -f " << dir
    << "/agent-dies.$node; sleep 0.3; exit 7; fi\n"
       "exec sleep 600\n";
  f.close();
  chmod(path.c_str(), 0700);
  return path;
}

LaunchOptions Base(const testing::ScratchDir& dir) {
  LaunchOptions o;
  o.job = "launcher-test";
  o.nodes = 2;
  o.ranks_per_node = 2;
  o.run_dir = dir.path() + "/run";
  o.memento_binary = FakeMemento(dir.path());
  o.quiet = true;
  o.agent_start_timeout_s = 30;
  return o;
}

TEST(Launcher, TrainerEnvironmentAndPlaceholders) {
  testing::ScratchDir dir("launcher");
  LaunchOptions o = Base(dir);
  o.tp = 2;
  o.trainer = {"sh", "-c",
               "echo $MEMENTO_JOB $MEMENTO_RANK $MEMENTO_WORLD_SIZE $MEMENTO_NODE $MEMENTO_DP "
               "$MEMENTO_TP $MEMENTO_PP $MEMENTO_ATTEMPT $MEMENTO_RUN_DIR {node_dir} > " +
                   dir.path() + "/out.{rank}"};
  auto l = Launcher::Create(o);
  ASSERT_TRUE(l.ok()) << l.status();
  auto s = (*l)->Run();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->success) << s->ToString();
  EXPECT_EQ(s->exit_code, 0);
  EXPECT_EQ(s->attempts, 1);
  for (int r = 0; r < 4; ++r) {
    const std::string node_dir = o.run_dir + "/node" + std::to_string(r / 2);
    EXPECT_EQ(ReadAll(dir.path() + "/out." + std::to_string(r)),
              "launcher-test " + std::to_string(r) + " 4 " + std::to_string(r / 2) + " 2 2 1 0 " +
                  node_dir + " " + node_dir + "\n");
  }
  // Node roots are removed; logs stay; the token file is gone.
  struct stat st;
  EXPECT_NE(stat((o.run_dir + "/node0").c_str(), &st), 0);
  EXPECT_EQ(stat((o.run_dir + "/logs/rank3.log").c_str(), &st), 0);
  EXPECT_NE(stat((o.run_dir + "/job.token").c_str(), &st), 0);
}

TEST(Launcher, RestartsEveryTrainerWithANewAttemptAfterAFailure) {
  testing::ScratchDir dir("launcher");
  LaunchOptions o = Base(dir);
  // Rank 1 fails in attempt 0; every rank records the attempts it ran and
  // the rendezvous directory (fresh per attempt).
  o.trainer = {"sh", "-c",
               "echo $MEMENTO_ATTEMPT {rendezvous} >> " + dir.path() +
                   "/runs.{rank}; if [ {rank} = 1 ] && [ {attempt} = 0 ]; then exit 3; fi; "
                   "sleep 0.2"};
  auto l = Launcher::Create(o);
  ASSERT_TRUE(l.ok()) << l.status();
  auto s = (*l)->Run();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->success) << s->ToString();
  EXPECT_EQ(s->attempts, 2);
  ASSERT_EQ(s->failures.size(), 1u);
  EXPECT_NE(s->failures[0].find("rank 1 (node 0) failed: exit code 3"), std::string::npos)
      << s->failures[0];
  ASSERT_EQ(s->recoveries.size(), 1u);
  EXPECT_EQ(s->recoveries[0].step, -1);  // nothing committed: a fresh start
  EXPECT_EQ(s->recoveries[0].attempt, 1);
  for (int r = 0; r < 4; ++r) {
    const std::string runs = ReadAll(dir.path() + "/runs." + std::to_string(r));
    // The others may be stopped before they wrote attempt 0's line.
    if (r == 1) {
      EXPECT_NE(runs.find("0 " + o.run_dir + "/rendezvous.0\n"), std::string::npos) << runs;
    }
    EXPECT_NE(runs.find("1 " + o.run_dir + "/rendezvous.1\n"), std::string::npos) << runs;
  }
}

TEST(Launcher, GivesUpAfterMaxRestarts) {
  testing::ScratchDir dir("launcher");
  LaunchOptions o = Base(dir);
  o.max_restarts = 2;
  o.trainer = {"sh", "-c", "exit 5"};
  auto l = Launcher::Create(o);
  ASSERT_TRUE(l.ok()) << l.status();
  auto s = (*l)->Run();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->success);
  EXPECT_EQ(s->exit_code, 1);
  EXPECT_EQ(s->failures.size(), 3u);
  EXPECT_NE(s->message.find("--max-restarts 2"), std::string::npos) << s->message;
}

TEST(Launcher, ADeadAgentIsRestartedOnItsRoot) {
  testing::ScratchDir dir("launcher");
  LaunchOptions o = Base(dir);
  std::ofstream(dir.path() + "/agent-dies.1") << "x";
  o.trainer = {"sh", "-c", "sleep 1; echo {attempt} >> " + dir.path() + "/runs.{rank}"};
  auto l = Launcher::Create(o);
  ASSERT_TRUE(l.ok()) << l.status();
  auto s = (*l)->Run();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->success) << s->ToString();
  ASSERT_EQ(s->failures.size(), 1u);
  EXPECT_NE(s->failures[0].find("died (exit code 7)"), std::string::npos) << s->failures[0];
  EXPECT_NE(s->failures[0].find("node 1"), std::string::npos) << s->failures[0];
  // Attempt 0's trainers were stopped before they wrote; attempt 1's finished.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ReadAll(dir.path() + "/runs." + std::to_string(r)), "1\n");
}

TEST(Launcher, BadOptions) {
  LaunchOptions o;
  o.trainer = {"true"};
  o.nodes = 3;
  o.tp = 2;
  EXPECT_EQ(Launcher::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.tp = 1;
  o.policy = "raid6";
  EXPECT_EQ(Launcher::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.policy = "xor";
  o.trainer.clear();
  EXPECT_EQ(Launcher::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.trainer = {"true"};
  o.inject = "kill-node:3@step=1";
  auto r = Launcher::Create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("node 3 does not exist"), std::string::npos);
  o.inject = "";
  o.job = "bad/job";
  EXPECT_EQ(Launcher::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.job = "";
  // The agents' leader coordinates the commits only where it recovers.
  o.coordinate_commits = true;
  o.recovery_by = "launcher";
  r = Launcher::Create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--coordinate-commits needs --recovery-by agents"),
            std::string::npos)
      << r.status();
}

TEST(Launcher, StoreOptions) {
  LaunchOptions o;
  o.trainer = {"true"};
  o.nodes = 2;
  // kill-store needs a store the launcher can kill: it implies a store process.
  o.inject = "kill-store@step=3";
  auto l = Launcher::Create(o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE((*l)->options().store_process);
  // ...and is refused for someone else's store.
  o.store_url = "tcp://10.1.2.3:7070";
  auto r = Launcher::Create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is external"), std::string::npos) << r.status();
  o.inject = "";
  o.store_process = true;
  r = Launcher::Create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("exclude each other"), std::string::npos) << r.status();
  o.store_process = false;
  o.store_down_s = -1;
  EXPECT_EQ(Launcher::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.store_down_s = 1;
  EXPECT_TRUE(Launcher::Create(o).ok());
  // In-process recovery with slots of pieces (the replacement's Restore(step)
  // goes through the agent's assembly: trainer_launch_swift_test).
  o.sharded = true;
  o.dp = 2;
  o.recovery = "undo";
  EXPECT_TRUE(Launcher::Create(o).ok()) << Launcher::Create(o).status();
  o.recovery = "restart";
  EXPECT_TRUE(Launcher::Create(o).ok()) << Launcher::Create(o).status();
}

TEST(Launcher, NetnsRefusesClearly) {
  LaunchOptions o;
  o.trainer = {"true"};
  o.nodes = 2;
  o.netns = true;
  const std::string why = NodeNetwork::Unsupported();
  auto r = Launcher::Create(o);
  if (!why.empty()) {
    // Not root, or no `ip`: refused with that reason.
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(r.status().message(), why);
    return;
  }
  EXPECT_TRUE(r.ok()) << r.status();
  // The nodes' namespaces cannot reach the machine's loopback.
  o.store_url = "tcp://127.0.0.1:7070";
  r = Launcher::Create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("loopback"), std::string::npos) << r.status();
}

// The job's step as injections see it: after a rewind (a durable fallback
// to S while nodes had signalled COMPLETED past S), the failed attempt's
// signals must not count, or an injection "@step=K" with S < K fires at once.
TEST(ReachedStepOf, SignalsFromBeforeTheAttemptDoNotCount) {
  auto signal = [](coord::NodeSignal kind, int64_t step, int64_t wall_ns) {
    coord::SignalRecord r;
    r.signal = kind;
    r.step = step;
    r.wall_ns = wall_ns;
    return r.Encode();
  };
  const std::string stale = signal(coord::NodeSignal::kCompleted, 20, 1000);
  const std::string fresh = signal(coord::NodeSignal::kCompleted, 17, 3000);
  const std::string snap = signal(coord::NodeSignal::kSnap, 30, 4000);
  // The first attempt (since 0): every COMPLETED signal counts.
  EXPECT_EQ(ReachedStepOf(16, {stale, fresh, snap}, 0), 20);
  // The attempt started at 2000: only the fresh signal.
  EXPECT_EQ(ReachedStepOf(16, {stale, fresh, snap}, 2000), 17);
  EXPECT_EQ(ReachedStepOf(16, {stale}, 2000), 16);
  // A record that does not decode is skipped; the commit is a floor.
  EXPECT_EQ(ReachedStepOf(16, {"not a record"}, 0), 16);
  EXPECT_EQ(ReachedStepOf(25, {fresh}, 2000), 25);
}

}  // namespace
}  // namespace memento::launch
