// HasRunner with real threads and real copies; asserts outcomes, not timings.
#include "snap/has/has_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/checksum.h"

namespace memento::has {
namespace {

TEST(HasRunnerTest, CopiesEverythingAndAccountsLayers) {
  const size_t kChunk = 64 << 10;
  const size_t kBytes = 40 * kChunk + 123;
  std::vector<uint8_t> src(kBytes), dst(kBytes);
  auto chunks = SplitIntoChunks(kBytes, kChunk);
  std::vector<uint64_t> sums(chunks.size());
  HasRunnerOptions o;
  o.threads = 2;
  auto runner = HasRunner::Create(o, [&](size_t i) {
    const size_t off = i * kChunk;
    sums[i] = CopyAndChecksum(dst.data() + off, src.data() + off, chunks[i]);
    return Status::Ok();
  });
  ASSERT_TRUE(runner.ok()) << runner.status();
  for (int step = 1; step <= 4; ++step) {
    for (size_t i = 0; i < kBytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + step);
    ASSERT_TRUE((*runner)->Begin(step, chunks).ok());
    // The trainer alternates phases while the copy runs.
    for (int k = 0; k < 6; ++k) {
      (*runner)->OnPhase(k % 2 ? Phase::kCompute : Phase::kIdle);
      std::this_thread::yield();
    }
    EXPECT_EQ((*runner)->Begin(step + 100, chunks).code(), StatusCode::kFailedPrecondition);
    auto st = (*runner)->Fence(Deadline::AfterSeconds(60));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->step, step);
    EXPECT_EQ(st->bytes, kBytes);
    EXPECT_EQ(st->bytes_idle + st->bytes_compute + st->bytes_communicate + st->bytes_fence, kBytes);
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), kBytes), 0);
    for (size_t i = 0; i < chunks.size(); ++i) {
      EXPECT_EQ(sums[i], Checksum(src.data() + i * kChunk, chunks[i]));
    }
  }
  EXPECT_GT((*runner)->bandwidth_estimate(), 0);
}

TEST(HasRunnerTest, CommunicationPausesUntilFence) {
  std::atomic<int> copied{0};
  auto runner = HasRunner::Create(HasRunnerOptions{}, [&](size_t) {
    copied.fetch_add(1);
    return Status::Ok();
  });
  ASSERT_TRUE(runner.ok());
  (*runner)->OnPhase(Phase::kCommunicate);  // layer 3 is off: nothing may go
  ASSERT_TRUE((*runner)->Begin(1, {100, 100, 100}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(copied.load(), 0);
  auto st = (*runner)->Fence();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(copied.load(), 3);
  EXPECT_EQ(st->bytes_fence, 300u);
}

TEST(HasRunnerTest, CopyErrorReachesFence) {
  auto runner = HasRunner::Create(HasRunnerOptions{}, [](size_t i) {
    return i == 1 ? Status(StatusCode::kDataLoss, "chunk 1 torn") : Status::Ok();
  });
  ASSERT_TRUE(runner.ok());
  ASSERT_TRUE((*runner)->Begin(1, {10, 10, 10}).ok());
  auto st = (*runner)->Fence();
  EXPECT_EQ(st.status().code(), StatusCode::kDataLoss);
  // The next snapshot starts clean.
  ASSERT_TRUE((*runner)->Begin(2, {10}).ok());
  EXPECT_TRUE((*runner)->Fence().ok());
}

TEST(HasRunnerTest, BadOptions) {
  HasRunnerOptions o;
  o.threads = 0;
  EXPECT_EQ(HasRunner::Create(o, [](size_t) { return Status::Ok(); }).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HasRunner::Create(HasRunnerOptions{}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  auto runner = HasRunner::Create(HasRunnerOptions{}, [](size_t) { return Status::Ok(); });
  ASSERT_TRUE(runner.ok());
  EXPECT_EQ((*runner)->Fence().status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace memento::has
