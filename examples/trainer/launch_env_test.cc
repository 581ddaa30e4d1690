// ApplyLauncherEnv: the trainer's reading of `memento launch`'s environment
// (docs/cluster.md) and its precedence over older variables and under flags.
#include "launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace memento::trainer {
namespace {

class FakeEnv {
 public:
  explicit FakeEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

const std::map<std::string, std::string> kLaunched = {{"MEMENTO_JOB", "job7"},
                                                      {"MEMENTO_RANK", "3"},
                                                      {"MEMENTO_WORLD_SIZE", "4"},
                                                      {"MEMENTO_NODE", "node1"},
                                                      {"MEMENTO_RUN_DIR", "/r/node1"},
                                                      {"MEMENTO_RENDEZVOUS", "/r/rdv/attempt2"},
                                                      {"MEMENTO_ATTEMPT", "2"},
                                                      {"MEMENTO_DP", "2"},
                                                      {"MEMENTO_TP", "1"},
                                                      {"MEMENTO_PP", "2"}};

TEST(LauncherEnvTest, ReadsEverySettingOfTheLauncher) {
  FakeEnv env(kLaunched);
  TrainerOptions o;
  int world = 0;
  MementoTarget m;
  ASSERT_TRUE(ApplyLauncherEnv(env.lookup(), GivenFlags{}, &o, &world, &m).ok());
  EXPECT_EQ(o.comm.rank, 3);
  EXPECT_EQ(world, 4);
  EXPECT_EQ(o.comm.topology.dp, 2);
  EXPECT_EQ(o.comm.topology.tp, 1);
  EXPECT_EQ(o.comm.topology.pp, 2);
  EXPECT_EQ(o.comm.rendezvous_dir, "/r/rdv/attempt2");
  EXPECT_EQ(o.comm.run_id, "a2");
  EXPECT_TRUE(m.enabled);
  EXPECT_EQ(m.job_id, "job7");
  EXPECT_EQ(m.agent_dir, "/r/node1");
  EXPECT_EQ(m.node, 1);
}

TEST(LauncherEnvTest, FlagsWinOverTheEnvironment) {
  FakeEnv env(kLaunched);
  TrainerOptions o;
  o.comm.rank = 1;
  o.comm.topology.dp = 4;
  o.comm.topology.pp = 1;
  o.comm.rendezvous_dir = "/flag/rdv";
  o.comm.run_id = "mine";
  int world = 0;
  MementoTarget m;
  m.job_id = "flagjob";
  m.agent_dir = "/flag/agent";
  m.node = 0;
  GivenFlags g;
  g.rank = g.dp = g.pp = g.rendezvous = g.run_id = g.job_id = g.agent_dir = g.node = true;
  g.world = true;
  g.no_memento = true;
  ASSERT_TRUE(ApplyLauncherEnv(env.lookup(), g, &o, &world, &m).ok());
  EXPECT_EQ(o.comm.rank, 1);
  EXPECT_EQ(world, 0);
  EXPECT_EQ(o.comm.topology.dp, 4);
  EXPECT_EQ(o.comm.topology.tp, 1);  // not given: from MEMENTO_TP
  EXPECT_EQ(o.comm.topology.pp, 1);
  EXPECT_EQ(o.comm.rendezvous_dir, "/flag/rdv");
  EXPECT_EQ(o.comm.run_id, "mine");
  EXPECT_EQ(m.job_id, "flagjob");
  EXPECT_EQ(m.agent_dir, "/flag/agent");
  EXPECT_EQ(m.node, 0);
  EXPECT_FALSE(m.enabled);  // --no-memento
}

TEST(LauncherEnvTest, MementoVariablesWinOverGenericOnes) {
  FakeEnv env(std::map<std::string, std::string>{{"MEMENTO_RANK", "2"},
                                                 {"RANK", "5"},
                                                 {"WORLD_SIZE", "8"},
                                                 {"MEMENTO_TRAINER_RENDEZVOUS", "/old/rdv"},
                                                 {"MEMENTO_TRAINER_RUN_ID", "r9"},
                                                 {"MEMENTO_ATTEMPT", "4"}});
  TrainerOptions o;
  int world = 0;
  MementoTarget m;
  ASSERT_TRUE(ApplyLauncherEnv(env.lookup(), GivenFlags{}, &o, &world, &m).ok());
  EXPECT_EQ(o.comm.rank, 2);
  EXPECT_EQ(world, 8);
  EXPECT_EQ(o.comm.rendezvous_dir, "/old/rdv");
  EXPECT_EQ(o.comm.run_id, "r9");  // an explicit run id beats the attempt
  EXPECT_FALSE(m.enabled);         // not under the launcher: no MEMENTO_JOB/RUN_DIR
}

TEST(LauncherEnvTest, NothingSetChangesNothing) {
  FakeEnv env(std::map<std::string, std::string>{});
  TrainerOptions o;
  o.comm.rank = 6;
  o.comm.topology.dp = 3;
  int world = 0;
  MementoTarget m;
  GivenFlags g;
  g.memento = true;
  ASSERT_TRUE(ApplyLauncherEnv(env.lookup(), g, &o, &world, &m).ok());
  EXPECT_EQ(o.comm.rank, 6);
  EXPECT_EQ(o.comm.topology.dp, 3);
  EXPECT_EQ(world, 0);
  EXPECT_EQ(o.comm.run_id, "0");
  EXPECT_TRUE(m.enabled);  // --memento
  EXPECT_TRUE(m.job_id.empty());
}

TEST(LauncherEnvTest, NodeNamesEndInTheirNumber) {
  for (const auto& [name, number] :
       std::map<std::string, int>{{"0", 0}, {"n3", 3}, {"node12", 12}, {"host-a7", 7}}) {
    FakeEnv env(std::map<std::string, std::string>{{"MEMENTO_NODE", name}});
    TrainerOptions o;
    int world = 0;
    MementoTarget m;
    ASSERT_TRUE(ApplyLauncherEnv(env.lookup(), GivenFlags{}, &o, &world, &m).ok()) << name;
    EXPECT_EQ(m.node, number) << name;
  }
}

TEST(LauncherEnvTest, BadValuesNameTheVariable) {
  const std::map<std::string, std::string> bad[] = {
      {{"MEMENTO_RANK", "x"}},       {{"MEMENTO_RANK", "-1"}},   {{"MEMENTO_RANK", "3junk"}},
      {{"MEMENTO_WORLD_SIZE", "0"}}, {{"MEMENTO_DP", ""}},       {{"MEMENTO_PP", "0"}},
      {{"MEMENTO_NODE", "nodeX"}},   {{"MEMENTO_ATTEMPT", "a"}}, {{"RANK", "99999999999"}}};
  for (const auto& vars : bad) {
    FakeEnv env(vars);
    TrainerOptions o;
    int world = 0;
    MementoTarget m;
    Status st = ApplyLauncherEnv(env.lookup(), GivenFlags{}, &o, &world, &m);
    ASSERT_FALSE(st.ok()) << vars.begin()->first << "=" << vars.begin()->second;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(vars.begin()->first), std::string::npos) << st.ToString();
  }
}

TEST(LauncherEnvTest, BadValueUnderAGivenFlagIsIgnored) {
  FakeEnv env(std::map<std::string, std::string>{{"MEMENTO_RANK", "garbage"}});
  TrainerOptions o;
  int world = 0;
  MementoTarget m;
  GivenFlags g;
  g.rank = true;
  EXPECT_TRUE(ApplyLauncherEnv(env.lookup(), g, &o, &world, &m).ok());
}

}  // namespace
}  // namespace memento::trainer
