// The toy trainers' core without an agent: the states' determinism and
// shapes, the digest chain, the progress file round trip, the file barrier
// and the reference loop. The runs through a real agent are the tests of the
// trainers built on it (shm_crash_test, cluster_save_test, cluster_*_test).
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "common/checksum.h"
#include "common/test_util.h"
#include "toy/toy_run.h"

namespace memento::toy {
namespace {

TEST(SplitMixTest, IsSplitMix64) {
  // The first output of SplitMix64 seeded with 0 (Vigna's reference).
  EXPECT_EQ(SplitMix(0), 0xe220a8397b1dcdafULL);
  EXPECT_NE(SplitMix(1), SplitMix(2));
}

TEST(DigestChainTest, ChainsChecksumsInOrder) {
  const std::string a = "params", b = "cursor";
  DigestChain chain;
  EXPECT_EQ(chain.digest(), 0u);
  chain.Add(a.data(), a.size());
  EXPECT_EQ(chain.digest(), Checksum(a.data(), a.size()));
  chain.Add(b.data(), b.size());
  EXPECT_EQ(chain.digest(), ChecksumWithSeed(b.data(), b.size(), Checksum(a.data(), a.size())));
  DigestChain swapped;
  swapped.Add(b.data(), b.size());
  swapped.Add(a.data(), a.size());
  EXPECT_NE(swapped.digest(), chain.digest());
}

// Every buffer changes every step, and a state recomputed from scratch to
// the same step holds the same bytes.
void ExpectStepsChangeEverythingDeterministically(ToyState& s, ToyState& again) {
  ASSERT_TRUE(s.SameBytes(again));
  for (int i = 0; i < 3; ++i) {
    std::vector<std::vector<uint8_t>> before;
    for (const ToyBuffer& b : s.buffers()) {
      const auto* p = static_cast<const uint8_t*>(b.data);
      before.emplace_back(p, p + b.bytes);
    }
    const uint64_t digest = s.Digest();
    s.Step();
    EXPECT_EQ(s.step(), i + 1);
    EXPECT_NE(s.Digest(), digest);
    for (size_t k = 0; k < before.size(); ++k) {
      EXPECT_NE(std::memcmp(before[k].data(), s.buffers()[k].data, before[k].size()), 0)
          << s.buffers()[k].meta.name << " did not change at step " << s.step();
    }
  }
  EXPECT_FALSE(s.SameBytes(again));
  while (again.step() < s.step()) again.Step();
  EXPECT_TRUE(s.SameBytes(again));
  EXPECT_EQ(s.Digest(), again.Digest());
}

std::vector<std::string> Names(const ToyState& s) {
  std::vector<std::string> out;
  for (const ToyBuffer& b : s.buffers()) out.push_back(b.meta.name);
  return out;
}

TEST(ToyStateTest, AdamStateHasThreeTensorsAndACursor) {
  AdamState s(1 << 20), again(1 << 20);
  EXPECT_EQ(Names(s), (std::vector<std::string>{"params", "adam.m", "adam.v", "cursor"}));
  size_t tensor_bytes = 0;
  for (const ToyBuffer& b : s.buffers()) tensor_bytes += b.is_blob ? 0 : b.bytes;
  EXPECT_EQ(tensor_bytes, size_t{1} << 20);
  EXPECT_TRUE(s.buffers().back().is_blob);
  ExpectStepsChangeEverythingDeterministically(s, again);
  // Another seed: other parameters, the same moments.
  AdamState other(1 << 20, 7);
  EXPECT_NE(std::memcmp(other.buffers()[0].data, AdamState(1 << 20).buffers()[0].data, 64), 0);
}

TEST(ToyStateTest, DpStateShardsOptAcrossRanks) {
  DpState r0(3 << 16, 0, 2), r1(3 << 16, 1, 2), again(3 << 16, 1, 2);
  EXPECT_EQ(Names(r0), (std::vector<std::string>{"params", "opt", "cursor"}));
  const ToyBuffer& opt = r1.buffers()[1];
  EXPECT_EQ(opt.meta.state_class, StateClass::kDpSharded);
  EXPECT_EQ(opt.meta.global_numel, 2 * opt.meta.shape[0]);
  EXPECT_EQ(opt.meta.shard_offset, opt.meta.shape[0]);
  r0.Step();
  r1.Step();
  // The replicated params stay identical on both ranks.
  EXPECT_EQ(std::memcmp(r0.buffers()[0].data, r1.buffers()[0].data, r0.buffers()[0].bytes), 0);
  EXPECT_FALSE(r0.SameBytes(r1));
  DpState fresh(3 << 16, 1, 2);
  ExpectStepsChangeEverythingDeterministically(fresh, again);
}

TEST(ToyStateTest, ParallelStateFollowsTheLayout) {
  ParallelLayout l;
  l.dp = 2;
  l.world = 2;
  EXPECT_EQ(Names(ParallelState(l, 64)), (std::vector<std::string>{"w", "b", "rng"}));
  l.zero = 1;
  l.rank = 1;
  ParallelState s(l, 100), again(l, 100);
  EXPECT_EQ(Names(s), (std::vector<std::string>{"w", "b", "opt", "rng"}));
  EXPECT_EQ(s.buffers()[1].bytes, 100u / 3 + 5);  // odd: pieces end mid-tensor
  EXPECT_EQ(s.buffers()[2].meta.global_numel, 100);
  EXPECT_EQ(s.buffers()[2].meta.shard_offset, 50);
  ExpectStepsChangeEverythingDeterministically(s, again);
}

TEST(ProgressTest, WrittenLinesReadBack) {
  testing::ScratchDir dir("toy-progress");
  const std::string path = dir.path() + "/progress";
  ProgressLog log("toy_test");
  ASSERT_TRUE(log.Open(path).ok());
  EXPECT_TRUE(log.enabled());
  AdamState state(4096);
  StartReport start;
  start.seal_s = 0.5;
  ReportStart(log, start, state, FreshStart::kNLine);
  ReportStart(log, start, state, FreshStart::kStepZero);
  start.restored_step = 4;
  start.restore_s = 0.25;
  ReportStart(log, start, state, FreshStart::kNLine);
  log.Emit("S 5");
  log.Emit("C 5 0.5 0.125");
  log.Emit("K 6");
  log.Emit("D 6 42");
  log.Emit("E something broke");
  log.Emit("X done");
  const Progress p = ReadProgress(path);
  EXPECT_TRUE(p.fresh);
  ASSERT_EQ(p.restored.size(), 2u);
  EXPECT_EQ(p.restored[0], std::make_pair(int64_t{0}, state.Digest()));
  EXPECT_EQ(p.restored[1], std::make_pair(int64_t{4}, state.Digest()));
  EXPECT_EQ(p.restore_s, 0.25);
  EXPECT_EQ(p.seal_s, 0.5);
  EXPECT_EQ(p.max_started, 5);
  EXPECT_EQ(p.completed, std::vector<int64_t>{5});
  EXPECT_EQ(p.max_complete, 5);
  EXPECT_EQ(p.copy_s_sum, 0.5);
  EXPECT_EQ(p.fence_wait_s_sum, 0.125);
  EXPECT_EQ(p.skipped, std::vector<int64_t>{6});
  EXPECT_EQ(p.digests.at(6), 42u);
  EXPECT_EQ(p.error, "something broke");
  EXPECT_TRUE(p.done);
  EXPECT_FALSE(ReadProgress(dir.path() + "/none").done);
}

TEST(ProgressTest, OpenNamesTheFile) {
  ProgressLog log("toy_test");
  const Status st = log.Open("/nonexistent-dir/progress");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("/nonexistent-dir/progress"), std::string::npos) << st.ToString();
  EXPECT_FALSE(log.enabled());
  log.Emit("D 1 1");  // a log without a file writes nothing
}

TEST(FileBarrierTest, RanksMeetAndAMissingRankIsNamed) {
  testing::ScratchDir dir("toy-barrier");
  Status other;
  std::thread rank1([&] { other = FileBarrier(dir.path(), 3, 1, 2, 30); });
  EXPECT_TRUE(FileBarrier(dir.path(), 3, 0, 2, 30).ok());
  rank1.join();
  EXPECT_TRUE(other.ok()) << other.ToString();
  const Status alone = FileBarrier(dir.path(), 4, 0, 2, 0.05);
  EXPECT_EQ(alone.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(alone.ToString().find("rank 1 never arrived"), std::string::npos) << alone.ToString();
  EXPECT_TRUE(FileBarrier("", 4, 0, 2, 0.05).ok());
}

TEST(RunStepsTest, WithoutAClientWritesTheReferenceDigests) {
  testing::ScratchDir dir("toy-run");
  const std::string path = dir.path() + "/progress";
  ProgressLog log("toy_test");
  ASSERT_TRUE(log.Open(path).ok());
  AdamState state(8192), expect(8192);
  StepLoopOptions o;
  o.steps = 5;
  o.barrier_dir = dir.path();  // one rank: the barrier passes at once
  o.barrier_at = BarrierAt::kAfterStep;
  ASSERT_TRUE(RunSteps(nullptr, state, log, o).ok());
  const Progress p = ReadProgress(path);
  EXPECT_TRUE(p.done);
  EXPECT_EQ(p.max_started, -1);  // no snapshots
  ASSERT_EQ(p.digests.size(), 5u);
  for (int64_t s = 1; s <= 5; ++s) {
    expect.Step();
    EXPECT_EQ(p.digests.at(s), expect.Digest()) << "step " << s;
  }
}

}  // namespace
}  // namespace memento::toy
