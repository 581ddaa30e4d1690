// The agent's durable stream with real processes (issue 7): `memento agent
// --durable-dir` and test trainers writing deterministic state every step.
//  - every K-th committed version lands in the directory, `memento verify`
//    and tier::Verify pass, and restoring a durable version gives bytes equal
//    (by digest) to the trainer's state at that step;
//  - trainers much faster than the capped durable writes: the trainers run to
//    the end, and every version that was committed in the directory is exactly
//    the state of its step (no torn version), whatever was abandoned.
// Correctness only; no timing is asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "common/test_util.h"
#include "proc_util.h"
#include "shm/shm_test_util.h"
#include "tier/reader.h"
#include "tier/verify.h"
#include "toy/toy_state.h"

namespace memento::shm::testing {
namespace {

class DurableTest : public ::testing::Test {
 protected:
  DurableTest()
      : root_(dir_.path() + "/node0"),
        durable_(disk_.path() + "/durable"),
        log_(dir_.path() + "/log") {
    std::fprintf(stderr, "slots and logs under %s, durable dir %s\n", dir_.path().c_str(),
                 durable_.c_str());
  }

  pid_t StartAgent(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {MEMENTO_BIN, "agent",  "--job", "dur",           "--node",
                                     "0",         "--root", root_,   "--durable-dir", durable_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_t pid = Spawn(argv, log_ + ".agent");
    EXPECT_TRUE(WaitFor([&] { return AgentAnswers(root_); }, 30)) << ReadFile(log_ + ".agent");
    return pid;
  }

  pid_t StartTrainer(int rank, uint64_t bytes, int64_t steps, double sleep_s,
                     uint64_t param_seed = 0) {
    return Spawn({TEST_TRAINER_BIN, "--job", "dur", "--dir", root_, "--rank", std::to_string(rank),
                  "--bytes", std::to_string(bytes), "--steps", std::to_string(steps), "--threads",
                  "1", "--step-sleep", std::to_string(sleep_s), "--progress", Progress(rank),
                  "--param-seed", std::to_string(param_seed)},
                 log_ + ".trainer" + std::to_string(rank));
  }
  std::string Progress(int rank) const { return dir_.path() + "/progress" + std::to_string(rank); }

  void StopAgent(pid_t agent) {
    kill(agent, SIGTERM);
    int st = WaitExit(agent, 60);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(log_ + ".agent");
  }

  // The trainer's Digest() of rank `rank`'s state restored from durable
  // version `step`: params, adam.m, adam.v, cursor, chained as the trainer
  // does (toy::DigestChain). Each tensor is asked for by the name the rank registered it under
  // (RestoreTarget::rank): the tier finds the rank's copy, shared or its own.
  uint64_t RestoredDigest(int64_t step, int rank) {
    auto index = tier::LoadIndex(tier::Env::Default(), durable_, step);
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    if (!index.ok()) return 0;
    const std::vector<std::string> names = {"params", "adam.m", "adam.v", "cursor"};
    std::vector<std::vector<uint8_t>> bufs(names.size());
    std::vector<tier::RestoreTarget> targets;
    for (size_t i = 0; i < names.size(); ++i) {
      auto stored = tier::RankTensorName(*index, rank, names[i]);
      EXPECT_TRUE(stored.ok()) << "version " << step << ": " << stored.status().ToString();
      if (!stored.ok()) return 0;
      const tier::TensorRecord& t = index->tensors.at(*stored);
      bufs[i].resize(t.nbytes);
      targets.push_back({TensorMeta{names[i], t.dtype, t.shape, t.state_class}, bufs[i].data()});
      targets.back().rank = rank;
    }
    auto r = tier::Restore(tier::Env::Default(), durable_, step, targets);
    EXPECT_TRUE(r.ok()) << "restore of version " << step << ": " << r.status().ToString();
    toy::DigestChain chain;
    for (const auto& b : bufs) chain.Add(b.data(), b.size());
    return chain.digest();
  }

  // Every complete durable version: sound, and bit-identical to each rank's
  // state at that step. Returns the complete steps.
  std::vector<int64_t> CheckAllVersions(int ranks) {
    auto report = tier::Verify(tier::Env::Default(), durable_, std::nullopt);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    std::vector<int64_t> complete;
    if (!report.ok()) return complete;
    for (const auto& v : report->versions) {
      if (!v.complete) continue;
      EXPECT_TRUE(v.ok) << "version " << v.step << ": "
                        << (v.problems.empty() ? "" : v.problems.front());
      complete.push_back(v.step);
    }
    std::vector<testing::Progress> progress;
    for (int r = 0; r < ranks; ++r) progress.push_back(ReadProgress(Progress(r)));
    for (int64_t step : complete) {
      for (int r = 0; r < ranks; ++r) {
        auto it = progress[r].digests.find(step);
        EXPECT_TRUE(it != progress[r].digests.end()) << "rank " << r << " never reached " << step;
        if (it == progress[r].digests.end()) continue;
        EXPECT_EQ(RestoredDigest(step, r), it->second)
            << "durable version " << step << " is not rank " << r << "'s state at that step";
      }
    }
    // The command-line check, as an operator would run it.
    pid_t v = Spawn({MEMENTO_BIN, "verify", durable_}, log_ + ".verify");
    int st = WaitExit(v, 60);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(log_ + ".verify");
    return complete;
  }

  // The agent's final counters line.
  std::string AgentStats() {
    std::string log = ReadFile(log_ + ".agent");
    std::smatch m;
    if (std::regex_search(log, m, std::regex("durable stats: [^\\n]*"))) return m.str();
    return "(no stats line)";
  }

  ShmScratchDir dir_;
  memento::testing::ScratchDir disk_{"memento-durable"};
  std::string root_, durable_, log_;
};

TEST_F(DurableTest, EveryKthVersionIsPersistedAndRestoresExactly) {
  constexpr int64_t kSteps = 30;
  pid_t agent = StartAgent({"--persist-every", "5", "--keep-last", "100"});
  pid_t trainer = StartTrainer(0, 8 << 20, kSteps, 0.03);
  int st = WaitExit(trainer, 120);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(log_ + ".trainer0");
  // The newest completed 5th step (a snapshot may be skipped while the
  // durable hold keeps its slot) is written once the trainer has stopped.
  testing::Progress p = ReadProgress(Progress(0));
  int64_t last = -1;
  for (int64_t c : p.completed) {
    if (c % 5 == 0) last = std::max(last, c);
  }
  ASSERT_GT(last, 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_);
        return latest.ok() && *latest == last;
      },
      60))
      << ReadFile(log_ + ".agent");
  StopAgent(agent);
  std::vector<int64_t> complete = CheckAllVersions(1);
  for (int64_t s : complete) EXPECT_EQ(s % 5, 0) << "version " << s << " is not a 5th step";
  ASSERT_FALSE(complete.empty());
  EXPECT_EQ(complete.back(), last);
  std::fprintf(stderr, "durable versions: %zu; %s\n", complete.size(), AgentStats().c_str());
}

TEST_F(DurableTest, FastTrainersNeverGetATornDurableVersion) {
  constexpr int64_t kSteps = 80;
  // Two ranks of 16 MiB, every version offered, 24 MiB per version at 24 MiB/s:
  // about a second per version while the trainers take milliseconds a step,
  // so slots are recycled under nearly every write. No durable hold: this is
  // the seqlock guard's test.
  pid_t agent = StartAgent(
      {"--persist-every", "1", "--persist-bandwidth", "24M", "--durable-hold-max-s", "0"});
  pid_t t0 = StartTrainer(0, 16 << 20, kSteps, 0);
  pid_t t1 = StartTrainer(1, 16 << 20, kSteps, 0);
  for (pid_t t : {t0, t1}) {
    int st = WaitExit(t, 120);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << ReadFile(log_ + ".trainer0") << ReadFile(log_ + ".trainer1");
  }
  for (int r = 0; r < 2; ++r) {
    testing::Progress p = ReadProgress(Progress(r));
    EXPECT_TRUE(p.done && p.error.empty()) << "rank " << r << ": " << p.error;
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_);
        return latest.ok() && *latest == kSteps;
      },
      60))
      << ReadFile(log_ + ".agent");
  StopAgent(agent);
  std::vector<int64_t> complete = CheckAllVersions(2);
  ASSERT_FALSE(complete.empty());
  EXPECT_EQ(complete.back(), kSteps);
  // Both ranks hold the same parameters: written once, under the plain name.
  auto index = tier::LoadIndex(tier::Env::Default(), durable_, kSteps);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_TRUE(index->tensors.count("params")) << "the equal copies were not shared";
  EXPECT_EQ(index->tensors.at("params").ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(index->tensors.count("rank1/params"), 0u);
  std::fprintf(stderr, "durable versions kept: %zu; %s\n", complete.size(), AgentStats().c_str());
}

// Issue 7's data-loss bug: two ranks of one node register `params` with
// different bytes (two pipeline stages on one node). Each rank's durable
// state must be its own: every complete version restores, per rank, to that
// rank's digest at the step (the old writer stored rank 0's params for both).
TEST_F(DurableTest, RanksWithDifferentReplicatedBytesEachGetTheirOwn) {
  constexpr int64_t kSteps = 12;
  // No durable hold: with it a rank may skip the last step's snapshot, which
  // then never lands; without it the last step is never overwritten.
  pid_t agent = StartAgent({"--persist-every", "3", "--durable-hold-max-s", "0"});
  pid_t t0 = StartTrainer(0, 4 << 20, kSteps, 0.03, /*param_seed=*/0);
  pid_t t1 = StartTrainer(1, 4 << 20, kSteps, 0.03, /*param_seed=*/1);
  for (pid_t t : {t0, t1}) {
    int st = WaitExit(t, 120);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << ReadFile(log_ + ".trainer0") << ReadFile(log_ + ".trainer1");
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_);
        return latest.ok() && *latest == kSteps;
      },
      60))
      << ReadFile(log_ + ".agent");
  StopAgent(agent);
  std::vector<int64_t> complete = CheckAllVersions(2);
  ASSERT_FALSE(complete.empty());
  EXPECT_EQ(complete.back(), kSteps);
  for (int64_t step : complete) {
    auto index = tier::LoadIndex(tier::Env::Default(), durable_, step);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    EXPECT_EQ(index->tensors.count("params"), 0u) << "version " << step << " shares params";
    ASSERT_TRUE(index->tensors.count("rank0/params") && index->tensors.count("rank1/params"));
    EXPECT_EQ(index->tensors.at("rank1/params").ranks, std::vector<int>{1});
  }
  std::fprintf(stderr, "durable versions: %zu; %s\n", complete.size(), AgentStats().c_str());
}

// The durable hold (docs/durable_tier.md, "The durable hold"): one trainer
// with fast steps, a persist capped far below its pace. The trainer never
// waits for the durable tier: it skips the snapshots whose slot is held
// (every step is either completed or skipped, and some are skipped), and
// every version the persister accepted lands, bit-identical to the trainer's
// state at that step, unless a newer one replaced it before its write began
// (coalescing, counted as dropped). Nothing is abandoned as overwritten.
TEST_F(DurableTest, HeldVersionsLandWhileTheTrainerSkipsInsteadOfWaiting) {
  constexpr int64_t kSteps = 120;
  // 8 MiB a version at 16 MiB/s: about half a second a write, while a step
  // takes ~10 ms. The hold cap is far above any write (no expiry on a slow
  // machine); the cap itself has its own test below.
  pid_t agent = StartAgent({"--persist-every", "1", "--persist-bandwidth", "16M", "--keep-last",
                            "100000", "--durable-hold-max-s", "600"});
  pid_t trainer = StartTrainer(0, 8 << 20, kSteps, 0.01);
  int st = WaitExit(trainer, 180);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(log_ + ".trainer0");
  testing::Progress p = ReadProgress(Progress(0));
  ASSERT_TRUE(p.done && p.error.empty()) << p.error;
  // Training never waited on the durable tier: every step was taken, and
  // each snapshot either completed or was skipped.
  EXPECT_EQ(static_cast<int64_t>(p.completed.size() + p.skipped.size()), kSteps);
  EXPECT_GT(p.skipped.size(), 0u) << "the hold never made the trainer skip: nothing was tested";
  ASSERT_FALSE(p.completed.empty());
  const int64_t last = *std::max_element(p.completed.begin(), p.completed.end());
  EXPECT_TRUE(WaitFor(
      [&] {
        auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_);
        return latest.ok() && *latest == last;
      },
      60))
      << ReadFile(log_ + ".agent");
  StopAgent(agent);
  std::vector<int64_t> complete = CheckAllVersions(1);
  const std::string stats = AgentStats();
  std::fprintf(stderr, "durable versions: %zu, skipped snapshots: %zu; %s\n", complete.size(),
               p.skipped.size(), stats.c_str());
  auto counter = [&](const std::string& name) -> int64_t {
    std::smatch m;
    if (!std::regex_search(stats, m, std::regex(" " + name + "=(-?[0-9]+)"))) {
      ADD_FAILURE() << "no counter " << name << " in: " << stats;
      return -1;
    }
    return std::stoll(m[1].str());
  };
  EXPECT_EQ(counter("abandoned_overwritten"), 0) << stats;
  EXPECT_EQ(counter("abandoned_mismatch"), 0) << stats;
  EXPECT_EQ(counter("gone"), 0) << stats;
  EXPECT_EQ(counter("hold_expired"), 0) << stats;
  EXPECT_EQ(counter("failures"), 0) << stats;
  // Every accepted version is accounted for: persisted, or replaced while
  // pending, or (a rare race, never a torn write) abandoned because the
  // trainer had claimed its slot before the hold was published.
  EXPECT_EQ(counter("persisted") + counter("dropped") + counter("abandoned_claimed"),
            counter("offered"))
      << stats;
  EXPECT_EQ(counter("persisted"), static_cast<int64_t>(complete.size())) << stats;
  EXPECT_GE(complete.size(), 2u) << stats;
}

// The hold is bounded: with a cap far below the time one version takes, the
// trainer skips only until the deadline, then overwrites the slot; the
// write is then refused at its marker as without a hold (never torn), and
// the expiry is counted.
TEST_F(DurableTest, TheHoldExpiresAfterItsCap) {
  constexpr int64_t kSteps = 60;
  // 16 MiB a version at 8 MiB/s: two seconds a write, a 0.2 s cap.
  pid_t agent = StartAgent(
      {"--persist-every", "1", "--persist-bandwidth", "8M", "--durable-hold-max-s", "0.2"});
  pid_t trainer = StartTrainer(0, 16 << 20, kSteps, 0.02);
  int st = WaitExit(trainer, 180);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(log_ + ".trainer0");
  testing::Progress p = ReadProgress(Progress(0));
  ASSERT_TRUE(p.done && p.error.empty()) << p.error;
  EXPECT_EQ(static_cast<int64_t>(p.completed.size() + p.skipped.size()), kSteps);
  StopAgent(agent);
  const std::string stats = AgentStats();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stats, m, std::regex(" hold_expired=([0-9]+)"))) << stats;
  EXPECT_GT(std::stoll(m[1].str()), 0) << stats;
  ASSERT_TRUE(std::regex_search(stats, m, std::regex(" abandoned_overwritten=([0-9]+)"))) << stats;
  EXPECT_GT(std::stoll(m[1].str()), 0) << stats;
  CheckAllVersions(1);  // whatever landed is exact
}

// An agent stopped by SIGTERM (a Kubernetes sidecar, a systemd unit, the end
// of a job) finishes the durable versions it was already given
// (--durable-drain-s) instead of dropping them; with --durable-drain-s 0 it
// stops at once and the version being written stays incomplete (the contrast
// shows the test can fail).
TEST_F(DurableTest, AStoppedAgentFinishesTheVersionItIsWriting) {
  for (double drain : {30.0, 0.0}) {
    SCOPED_TRACE("--durable-drain-s " + std::to_string(drain));
    // 16 MiB a version at 8 MiB/s: two seconds a write. Three steps, the
    // agent is stopped as soon as the trainer ends.
    pid_t agent =
        StartAgent({"--persist-every", "1", "--persist-bandwidth", "8M", "--keep-last", "100",
                    "--durable-hold-max-s", "0", "--durable-drain-s", std::to_string(drain)});
    pid_t trainer = StartTrainer(0, 16 << 20, 3, 0.01);
    int st = WaitExit(trainer, 180);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(log_ + ".trainer0");
    testing::Progress p = ReadProgress(Progress(0));
    ASSERT_TRUE(p.done && p.error.empty()) << p.error;
    ASSERT_FALSE(p.completed.empty());
    const int64_t last = *std::max_element(p.completed.begin(), p.completed.end());
    StopAgent(agent);
    auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_);
    if (drain > 0) {
      ASSERT_TRUE(latest.ok()) << latest.status().ToString() << "\n" << ReadFile(log_ + ".agent");
      EXPECT_EQ(*latest, last) << ReadFile(log_ + ".agent");
      CheckAllVersions(1);  // and it is exact
    } else {
      EXPECT_TRUE(!latest.ok() || *latest < last)
          << "without a drain the last version (" << last << ") still landed: nothing was tested";
      EXPECT_NE(ReadFile(log_ + ".agent").find("with a version not written"), std::string::npos)
          << ReadFile(log_ + ".agent");
    }
    // The next round starts from empty directories.
    std::filesystem::remove_all(durable_);
    std::filesystem::remove_all(root_);
    std::filesystem::remove(Progress(0));
  }
}

}  // namespace
}  // namespace memento::shm::testing
