// HasScheduler on a simulated clock: a discrete-event model of one trainer
// (a timeline of phases per step) and one copy engine of fixed bandwidth. No
// test depends on real time.
#include "snap/has/has_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "common/test_util.h"

namespace memento::has {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(HasFormulas, SnapshotTime) {
  EXPECT_DOUBLE_EQ(EstimateSnapshotTime(1000, 100), 10.0);
  EXPECT_DOUBLE_EQ(EstimateSnapshotTime(0, 100), 0.0);
  EXPECT_EQ(EstimateSnapshotTime(1, 0), kNever);
}

TEST(HasFormulas, BubbleTime1F1B) {
  PipelineSchedule s;
  s.num_stages = 4;
  s.num_microbatches = 8;
  s.fwd_s = 1.0;
  s.bwd_s = 2.0;
  // (0.8p + 2|P| - p - 2) * (fwd + bwd) / 2.
  s.stage = 0;
  EXPECT_DOUBLE_EQ(EstimateBubbleTime(s), 6 * 1.5);
  EXPECT_DOUBLE_EQ(EstimateBubbleTime(s), PipelineIdleTime(s));
  s.stage = 3;
  EXPECT_NEAR(EstimateBubbleTime(s), (2.4 + 8 - 3 - 2) * 1.5, 1e-12);
  EXPECT_LT(EstimateBubbleTime(s), PipelineIdleTime(s));
  s.num_stages = 1;
  s.stage = 0;
  EXPECT_DOUBLE_EQ(EstimateBubbleTime(s), 0.0);
  EXPECT_FALSE(PipelineSchedule{}.known());
}

TEST(HasFormulas, SplitParameter) {
  std::vector<uint64_t> chunks(10, 100);
  EXPECT_EQ(SplitParameter(chunks, 10, 3.5), 3u);  // floor(1000 * 0.35) = 350 bytes
  EXPECT_EQ(SplitParameter(chunks, 10, 10), 10u);
  EXPECT_EQ(SplitParameter(chunks, 10, 20), 10u);
  EXPECT_EQ(SplitParameter(chunks, 10, 0), 0u);
  EXPECT_EQ(SplitParameter({300, 100, 100}, 5, 4), 2u);  // 400 of 500 bytes
}

TEST(HasFormulas, SplitIntoChunks) {
  EXPECT_EQ(SplitIntoChunks(10, 4), (std::vector<uint64_t>{4, 4, 2}));
  EXPECT_EQ(SplitIntoChunks(8, 4), (std::vector<uint64_t>{4, 4}));
  EXPECT_TRUE(SplitIntoChunks(0, 4).empty());
}

TEST(TokenBucketTest, RateAndCapacity) {
  TokenBucket b(100, 50, 0);
  EXPECT_TRUE(b.TryTake(50, 0));
  EXPECT_FALSE(b.TryTake(10, 0));
  EXPECT_DOUBLE_EQ(b.TimeUntil(10, 0), 0.1);
  EXPECT_TRUE(b.TryTake(10, 0.1));
  EXPECT_DOUBLE_EQ(b.tokens(100), 50);  // capped
  b.SetRate(0, 100);
  EXPECT_TRUE(b.TryTake(50, 100));
  EXPECT_EQ(b.TimeUntil(1, 100), kNever);
}

// ---- simulation -----------------------------------------------------------------

struct Segment {
  Phase phase;
  double seconds;
};

struct SimResult {
  std::vector<HasStepStats> steps;
  // Bytes released in compute phases per 10 ms bin (for the rate check).
  std::vector<std::pair<double, uint64_t>> compute_releases;  // (time, bytes)
  std::vector<std::pair<double, uint64_t>> comm_releases;
};

// One copy engine (one chunk at a time, `bandwidth` bytes/s) against a
// trainer that runs `timeline` once per step between Snapshot and Fence.
// `bandwidth_of_step` lets a test change the engine's speed per step.
SimResult Simulate(HasScheduler* sched, const std::vector<uint64_t>& chunks,
                   const std::vector<Segment>& timeline, int steps,
                   const std::function<double(int)>& bandwidth_of_step) {
  SimResult res;
  double t = 0;
  for (int step = 0; step < steps; ++step) {
    const double bw = bandwidth_of_step(step);
    EXPECT_TRUE(sched->BeginSnapshot(step, chunks, t).ok());
    // Phase change times.
    std::vector<std::pair<double, Phase>> changes;
    double pt = t;
    for (const Segment& s : timeline) {
      changes.emplace_back(pt, s.phase);
      pt += s.seconds;
    }
    const double fence_at = pt;
    size_t next_change = 0;
    bool busy = false;
    size_t busy_chunk = 0;
    double busy_until = 0, busy_start = 0;
    bool fenced = false;
    double retry = kNever;
    while (true) {
      // Next event: phase change, copy done, retry, fence.
      double next = kNever;
      if (next_change < changes.size()) next = changes[next_change].first;
      if (busy) next = std::min(next, busy_until);
      if (!busy) next = std::min(next, retry);
      if (!fenced) next = std::min(next, fence_at);
      if (next == kNever) break;
      t = std::max(t, next);
      if (next_change < changes.size() && changes[next_change].first <= t) {
        sched->OnPhase(changes[next_change].second, t);
        ++next_change;
        retry = t;
      }
      if (busy && busy_until <= t) {
        sched->OnChunkDone(busy_chunk, t);
        sched->ReportCopy(chunks[busy_chunk], t - busy_start);
        busy = false;
        retry = t;
      }
      if (!fenced && fence_at <= t && next_change >= changes.size()) {
        sched->OnFenceBegin(t);
        fenced = true;
        retry = t;
      }
      if (!busy && retry <= t) {
        Release r = sched->NextChunks(t, 1);
        if (r.chunks.empty()) {
          retry = r.retry_at;
        } else {
          EXPECT_EQ(r.chunks.size(), 1u);
          busy = true;
          busy_chunk = r.chunks[0];
          busy_start = t;
          busy_until = t + static_cast<double>(chunks[busy_chunk]) / bw;
          if (r.layer == Layer::kCompute) res.compute_releases.emplace_back(t, r.bytes);
          if (r.layer == Layer::kCommunicate) res.comm_releases.emplace_back(t, r.bytes);
          retry = kNever;
        }
      }
      if (fenced && sched->AllDone()) break;
    }
    EXPECT_TRUE(sched->AllDone());
    res.steps.push_back(sched->OnFenceEnd(t));
    // The optimizer step: a short compute segment outside the window.
    sched->OnPhase(Phase::kCompute, t);
    t += 0.001;
  }
  return res;
}

void ExpectLayersAddUp(const HasStepStats& s) {
  EXPECT_EQ(s.bytes_idle + s.bytes_compute + s.bytes_communicate + s.bytes_fence, s.bytes)
      << "step " << s.step;
}

// 1F1B-like step: idle warm-up, compute, idle gap, compute, idle cool-down.
std::vector<Segment> PipelineTimeline(double idle_total, double compute_total) {
  return {{Phase::kIdle, idle_total * 0.25},
          {Phase::kCompute, compute_total / 2},
          {Phase::kIdle, idle_total * 0.25},
          {Phase::kCompute, compute_total / 2},
          {Phase::kIdle, idle_total * 0.5}};
}

TEST(HasSchedulerTest, LargeBubblesTakeEverything) {
  HasOptions o;
  o.initial_bandwidth = 1e9;
  HasScheduler sched(o);
  auto chunks = SplitIntoChunks(100 * kMiB, 4 * kMiB);  // ~0.1 s at 1 GB/s
  // 0.4 s idle per step, 0.6 s compute.
  SimResult r = Simulate(&sched, chunks, PipelineTimeline(0.4, 0.6), 6, [](int) { return 1e9; });
  for (const auto& s : r.steps) ExpectLayersAddUp(s);
  // From the second step on the measured bubbles (0.4 s) exceed t_ss: the
  // whole state is planned into them and copied there.
  for (size_t i = 1; i < r.steps.size(); ++i) {
    const auto& s = r.steps[i];
    EXPECT_EQ(s.planned_bubble_bytes, s.bytes) << i;
    EXPECT_EQ(s.bytes_compute, 0u) << i;
    EXPECT_EQ(s.bytes_fence, 0u) << i;
    EXPECT_EQ(s.fence_wait_s, 0.0) << i;
    EXPECT_EQ(s.bytes_idle, s.bytes) << i;
  }
  // The plan is made twice (first step: no measurement; then bubbles appear)
  // and then kept.
  EXPECT_TRUE(r.steps[0].replanned);
  EXPECT_EQ(r.steps[0].plan_reason, "first");
  EXPECT_EQ(r.steps[1].plan_reason, "bubble");
  for (size_t i = 2; i < r.steps.size(); ++i) EXPECT_FALSE(r.steps[i].replanned) << i;
  EXPECT_EQ(sched.replans(), 2);
}

TEST(HasSchedulerTest, NoBubblesPacedBesideCompute) {
  HasOptions o;
  o.initial_bandwidth = 1e9;
  o.compute_max_fraction = 0.5;
  HasScheduler sched(o);
  auto chunks = SplitIntoChunks(64 * kMiB, 1 * kMiB);
  std::vector<Segment> timeline = {{Phase::kCompute, 1.0}};
  SimResult r = Simulate(&sched, chunks, timeline, 4, [](int) { return 1e9; });
  for (const auto& s : r.steps) {
    ExpectLayersAddUp(s);
    EXPECT_EQ(s.bytes_idle, 0u);
    EXPECT_EQ(s.planned_bubble_bytes, 0u);
    EXPECT_EQ(s.bytes_fence, 0u);  // 64 MiB at <= 0.5 GB/s fits in 1 s
    EXPECT_EQ(s.bytes_compute, s.bytes);
  }
  // Rate limit: in any interval [a, b] of compute releases the bytes are at
  // most rate * (b - a) + one bucket (a chunk).
  const double cap = 0.5 * 1e9;
  const auto& rel = r.compute_releases;
  for (size_t i = 0; i < rel.size(); ++i) {
    uint64_t sum = 0;
    for (size_t j = i; j < rel.size() && rel[j].first - rel[i].first < 0.5; ++j) {
      sum += rel[j].second;
      EXPECT_LE(static_cast<double>(sum), cap * (rel[j].first - rel[i].first) + kMiB + 1)
          << i << ".." << j;
    }
  }
  // Once the window is known the copy is spread over it: the last step ends
  // its copy well after the unpaced 0.13 s (64 MiB at 0.5 GB/s) and before
  // finish_fraction of the window plus one chunk.
  EXPECT_GT(r.steps.back().copy_s, 0.4);
  EXPECT_LT(r.steps.back().copy_s, 0.8 * 1.0 + 0.01);
}

TEST(HasSchedulerTest, SplitBetweenBubbleAndCompute) {
  HasOptions o;
  o.initial_bandwidth = 1e9;
  o.idle_safety = 1.0;
  PipelineSchedule ps;
  ps.num_stages = 4;
  ps.stage = 0;
  ps.num_microbatches = 8;
  ps.fwd_s = 0.01;
  ps.bwd_s = 0.02;
  o.schedule = ps;  // bubble 3 * 0.03 = 0.09 s, window 11 * 0.03 = 0.33 s
  HasScheduler sched(o);
  auto chunks = SplitIntoChunks(200 * kMiB, 2 * kMiB);  // t_ss ~0.21 s at 1 GB/s
  SimResult r = Simulate(&sched, chunks, PipelineTimeline(0.09, 0.24), 3, [](int) { return 1e9; });
  const auto& s0 = r.steps[0];
  ExpectLayersAddUp(s0);
  // Algorithm 1 on the first step uses the schedule's bubble estimate.
  EXPECT_DOUBLE_EQ(s0.t_bubble_s, 0.09);
  const double t_ss = static_cast<double>(s0.bytes) / 1e9;
  const auto expect_split = SplitParameter(chunks, t_ss, 0.09);
  EXPECT_EQ(s0.planned_bubble_bytes, expect_split * 2 * kMiB);
  EXPECT_EQ(s0.planned_bubble_bytes + s0.planned_compute_bytes, s0.bytes);
  EXPECT_GT(s0.bytes_idle, 0u);
  EXPECT_GT(s0.bytes_compute, 0u);
  // The measured idle time matches the schedule: step 1 re-plans once with
  // measurements (same split), then the plan is kept.
  EXPECT_EQ(r.steps[1].plan_reason, "measured");
  EXPECT_EQ(r.steps[1].planned_bubble_bytes, s0.planned_bubble_bytes);
  EXPECT_FALSE(r.steps[2].replanned);
  for (const auto& s : r.steps) ExpectLayersAddUp(s);
  EXPECT_FALSE(sched.using_measured_bubble());
}

TEST(HasSchedulerTest, ScheduleDriftFallsBackToMeasuredBubbles) {
  HasOptions o;
  o.initial_bandwidth = 1e9;
  PipelineSchedule ps;
  ps.num_stages = 8;
  ps.num_microbatches = 8;
  ps.fwd_s = 0.02;
  ps.bwd_s = 0.04;  // claims 0.42 s of bubbles
  o.schedule = ps;
  HasScheduler sched(o);
  auto chunks = SplitIntoChunks(100 * kMiB, 4 * kMiB);
  // The trainer reports no idle time at all.
  SimResult r = Simulate(&sched, chunks, {{Phase::kCompute, 0.5}}, 3, [](int) { return 1e9; });
  // Step 0 planned everything into bubbles that never came: the window
  // (0.9 s by the schedule) still promised them when the fence came, so the
  // state was copied while the trainer waited.
  EXPECT_EQ(r.steps[0].planned_bubble_bytes, r.steps[0].bytes);
  EXPECT_EQ(r.steps[0].bytes_idle, 0u);
  EXPECT_EQ(r.steps[0].bytes_fence + r.steps[0].bytes_compute, r.steps[0].bytes);
  EXPECT_GT(r.steps[0].fence_wait_s, 0.0);
  // Then the drift detector replaces the schedule by the measurement.
  EXPECT_TRUE(sched.using_measured_bubble());
  EXPECT_TRUE(r.steps[1].replanned);
  EXPECT_EQ(r.steps[1].plan_reason, "bubble");
  EXPECT_EQ(r.steps[1].planned_bubble_bytes, 0u);
  EXPECT_FALSE(r.steps[2].replanned);
  EXPECT_EQ(r.steps[2].bytes_compute, r.steps[2].bytes);
  EXPECT_EQ(r.steps[2].fence_wait_s, 0.0);
  for (const auto& s : r.steps) ExpectLayersAddUp(s);
}

TEST(HasSchedulerTest, BandwidthDriftReplans) {
  HasOptions o;
  o.initial_bandwidth = 1e9;
  o.ewma_alpha = 1.0;  // follow the last sample
  HasScheduler sched(o);
  auto chunks = SplitIntoChunks(50 * kMiB, 1 * kMiB);
  auto bw = [](int step) { return step < 3 ? 1e9 : 0.3e9; };
  SimResult r = Simulate(&sched, chunks, PipelineTimeline(0.02, 0.5), 6, bw);
  int bandwidth_replans = 0;
  for (const auto& s : r.steps) {
    ExpectLayersAddUp(s);
    if (s.plan_reason == "bandwidth") ++bandwidth_replans;
  }
  // The slow-down shows in step 3's samples; step 4 re-plans with it.
  EXPECT_EQ(bandwidth_replans, 1);
  EXPECT_EQ(r.steps[4].plan_reason, "bandwidth");
  EXPECT_NEAR(r.steps[4].bandwidth, 0.3e9, 1e3);
  EXPECT_FALSE(r.steps[5].replanned);
}

TEST(HasSchedulerTest, CommunicationLayerOnlyWithSeparateLink) {
  auto chunks = SplitIntoChunks(200 * kMiB, 4 * kMiB);
  // Little compute, long communication, no idle.
  std::vector<Segment> timeline = {
      {Phase::kCompute, 0.1}, {Phase::kCommunicate, 0.4}, {Phase::kCompute, 0.1}};
  for (bool separate : {false, true}) {
    HasOptions o;
    o.initial_bandwidth = 1e9;
    o.separate_comm_link = separate;
    HasScheduler sched(o);
    SimResult r = Simulate(&sched, chunks, timeline, 4, [](int) { return 1e9; });
    for (const auto& s : r.steps) ExpectLayersAddUp(s);
    if (!separate) {
      EXPECT_TRUE(r.comm_releases.empty());
      for (const auto& s : r.steps) EXPECT_EQ(s.bytes_communicate, 0u);
      // Layer 2 alone (0.2 s at <= 0.5 GB/s) cannot hold 200 MiB: the rest
      // waits for the fence.
      EXPECT_GT(r.steps.back().bytes_fence, 0u);
    } else {
      EXPECT_FALSE(r.comm_releases.empty());
      EXPECT_GT(r.steps.back().planned_communicate_bytes, 0u);
      EXPECT_GT(r.steps.back().bytes_communicate, 0u);
      EXPECT_EQ(r.steps.back().bytes_fence, 0u);
    }
  }
}

TEST(HasSchedulerTest, CommunicationLayerUnusedWhenComputeSuffices) {
  // Layer 3 is the last resort: with a separate link but enough computation
  // to hold the copy, nothing is planned beside communication.
  HasOptions o;
  o.initial_bandwidth = 1e9;
  o.separate_comm_link = true;
  HasScheduler sched(o);
  auto chunks = SplitIntoChunks(20 * kMiB, 1 * kMiB);
  std::vector<Segment> timeline = {{Phase::kCompute, 0.5}, {Phase::kCommunicate, 0.2}};
  SimResult r = Simulate(&sched, chunks, timeline, 4, [](int) { return 1e9; });
  for (const auto& s : r.steps) {
    ExpectLayersAddUp(s);
    EXPECT_EQ(s.planned_communicate_bytes, 0u);
    EXPECT_EQ(s.bytes_fence, 0u);
  }
  EXPECT_EQ(r.steps.back().bytes_compute, r.steps.back().bytes);
}

TEST(HasSchedulerTest, Deterministic) {
  const uint64_t seed = memento::testing::TestSeed("HasSchedulerTest.Deterministic");
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> chunks;
  for (int i = 0; i < 50; ++i) chunks.push_back(1 + rng() % (3 * kMiB));
  std::vector<Segment> timeline;
  for (int i = 0; i < 12; ++i) {
    timeline.push_back({static_cast<Phase>(rng() % 3), 0.001 + (rng() % 1000) * 1e-4});
  }
  HasOptions o;
  o.separate_comm_link = (seed & 1) != 0;
  auto run = [&] {
    HasScheduler sched(o);
    return Simulate(&sched, chunks, timeline, 5, [](int s) { return 1e9 + s * 1e8; });
  };
  SimResult a = run(), b = run();
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    ExpectLayersAddUp(a.steps[i]);
    EXPECT_EQ(a.steps[i].bytes_idle, b.steps[i].bytes_idle);
    EXPECT_EQ(a.steps[i].bytes_compute, b.steps[i].bytes_compute);
    EXPECT_EQ(a.steps[i].bytes_communicate, b.steps[i].bytes_communicate);
    EXPECT_EQ(a.steps[i].bytes_fence, b.steps[i].bytes_fence);
    EXPECT_EQ(a.steps[i].fence_wait_s, b.steps[i].fence_wait_s);
    EXPECT_EQ(a.steps[i].plan_reason, b.steps[i].plan_reason);
  }
}

TEST(HasSchedulerTest, Preconditions) {
  HasScheduler sched(HasOptions{});
  EXPECT_EQ(sched.BeginSnapshot(1, {10, 0}, 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(sched.BeginSnapshot(1, {10, 20}, 0).ok());
  EXPECT_EQ(sched.BeginSnapshot(2, {10}, 0).code(), StatusCode::kFailedPrecondition);
  // Nothing is released while the trainer communicates without a separate link.
  sched.OnPhase(Phase::kCommunicate, 0.1);
  Release r = sched.NextChunks(0.1, 1 << 30);
  EXPECT_TRUE(r.chunks.empty());
  EXPECT_EQ(r.retry_at, kNever);
  sched.OnFenceBegin(0.2);
  r = sched.NextChunks(0.2, 1 << 30);
  EXPECT_EQ(r.layer, Layer::kFence);
  EXPECT_EQ(r.chunks, (std::vector<size_t>{0, 1}));
  sched.OnChunkDone(0, 0.3);
  sched.OnChunkDone(1, 0.4);
  HasStepStats s = sched.OnFenceEnd(0.4);
  EXPECT_DOUBLE_EQ(s.fence_wait_s, 0.2);
  EXPECT_EQ(s.bytes_fence, 30u);
  SnapshotStats pub;
  FillSnapshotStats(s, &pub);
  EXPECT_EQ(pub.bytes, 30u);
  EXPECT_EQ(pub.bytes_compute, 30u);
  EXPECT_EQ(pub.step, 1);
  EXPECT_TRUE(sched.BeginSnapshot(2, {10}, 0.5).ok());
}

}  // namespace
}  // namespace memento::has
