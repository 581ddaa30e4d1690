// kill -9 of a process persisting versions at random instants: no torn version
// is ever seen as complete (reader, restore and `memento verify` agree), and
// the next persist succeeds, even over the torn directory.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <thread>

#include "common/test_util.h"
#include "tests/tier/pattern.h"
#include "tests/tier/test_env.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::tier {
namespace {

using namespace memento::tier::testing;

TEST(KillTest, SigkillDuringPersistNeverExposesATornVersion) {
  memento::testing::ScratchDir dir("tier-kill");
  const std::string log = dir.path() + ".log";
  const std::string helper = EnvOr("MEMENTO_TIER_HELPER", "");
  const std::string memento_bin = EnvOr("MEMENTO_BIN", "");
  ASSERT_FALSE(helper.empty() || memento_bin.empty()) << "run through ctest";
  std::mt19937_64 rng(memento::testing::TestSeed("SigkillDuringPersistNeverExposesATornVersion"));
  Env* env = Env::Default();
  const int kIterations = 20;
  int torn_seen = 0;
  int64_t newest = 0;
  for (int it = 0; it < kIterations; ++it) {
    pid_t pid = Spawn({helper, "loop", dir.path(), std::to_string(newest + 1)}, log);
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 500));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "helper exited early, see " << log;

    auto versions = ListVersions(env, dir.path());
    ASSERT_TRUE(versions.ok()) << versions.status();
    for (const auto& v : *versions) {
      if (!v.complete) {
        ++torn_seen;
        // The reader refuses it, and so does `memento verify --step`.
        EXPECT_EQ(LoadIndex(env, dir.path(), v.step).status().code(), StatusCode::kNotFound);
        EXPECT_EQ(
            RunToEnd({memento_bin, "verify", dir.path(), "--step", std::to_string(v.step)}, log),
            1);
        continue;
      }
      newest = std::max(newest, v.step);
      VersionCheck check = VerifyVersion(env, dir.path(), v.step);
      EXPECT_TRUE(check.ok) << "iteration " << it << " version " << v.step << ": "
                            << ::testing::PrintToString(check.problems);
      EXPECT_EQ(CheckPatternVersion(env, dir.path(), v.step, 2 + it % 3), "")
          << "iteration " << it << " version " << v.step;
    }
    EXPECT_EQ(RunToEnd({memento_bin, "verify", dir.path()}, log), 0)
        << "memento verify disagrees after iteration " << it << ", see " << log;

    // The next persist succeeds (over a torn directory of the same step, if any).
    const int64_t next = newest + 1;
    ASSERT_EQ(RunToEnd({helper, "write", dir.path(), std::to_string(next)}, log), 0)
        << "see " << log;
    auto latest = LatestCompleteVersion(env, dir.path());
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(*latest, next);
    EXPECT_EQ(CheckPatternVersion(env, dir.path(), next, 3), "");
    newest = next;
    if (::testing::Test::HasFailure()) break;
  }
  std::fprintf(stderr, "%d kills, %d torn (incomplete) version directories seen and refused\n",
               kIterations, torn_seen);
  // The kills must actually land inside persists for the test to mean anything.
  EXPECT_GT(torn_seen, 0);
  std::remove(log.c_str());
}

}  // namespace
}  // namespace memento::tier
