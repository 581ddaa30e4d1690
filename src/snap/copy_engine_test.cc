#include "snap/copy_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "common/test_util.h"
#include "snap/copy_kernel.h"

namespace memento::snap {
namespace {

struct Buffers {
  std::vector<uint8_t> src, dst;
  std::vector<uint64_t> sums;
  std::vector<CopyChunk> chunks;
};

Buffers Make(std::mt19937_64& rng, size_t bytes, size_t chunk) {
  Buffers b;
  b.src.resize(bytes);
  b.dst.assign(bytes, 0);
  for (auto& x : b.src) x = rng() & 0xff;
  size_t n = (bytes + chunk - 1) / chunk;
  b.sums.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    CopyChunk c;
    c.src = b.src.data() + i * chunk;
    c.dst = b.dst.data() + i * chunk;
    c.length = std::min(chunk, bytes - i * chunk);
    c.checksum_out = &b.sums[i];
    b.chunks.push_back(c);
  }
  return b;
}

TEST(CopyEngineTest, CopiesAndChecksumsOnEveryThreadCount) {
  std::mt19937_64 rng(memento::testing::TestSeed("CopyEngineTest.Copies"));
  for (int threads : {1, 2, 4}) {
    CopyEngine engine({threads, "t", 0});
    Buffers b = Make(rng, 3 * 1000 * 1000 + 17, 65536 + 3);
    std::atomic<int> chunk_calls{0}, done_calls{0};
    auto job = engine.Submit(
        b.chunks, [&](size_t, uint64_t) { ++chunk_calls; },
        [&](const Status& st) {
          ++done_calls;
          EXPECT_EQ(chunk_calls.load(), static_cast<int>(b.chunks.size()));
          return st;
        });
    ASSERT_TRUE(job->Wait().ok());
    EXPECT_EQ(done_calls.load(), 1);
    EXPECT_TRUE(job->done());
    EXPECT_EQ(job->chunks_done(), b.chunks.size());
    EXPECT_EQ(b.src, b.dst);
    for (size_t i = 0; i < b.chunks.size(); ++i) {
      EXPECT_EQ(b.sums[i], Checksum(b.chunks[i].src, b.chunks[i].length));
    }
  }
}

TEST(CopyEngineTest, VerifyDetectsCorruptionAndDoneSeesIt) {
  std::mt19937_64 rng(memento::testing::TestSeed("CopyEngineTest.Verify"));
  CopyEngine engine({2, "t", 0});
  Buffers b = Make(rng, 1 << 20, 1 << 16);
  for (size_t i = 0; i < b.chunks.size(); ++i) {
    b.chunks[i].verify = true;
    b.chunks[i].expected_checksum = Checksum(b.chunks[i].src, b.chunks[i].length);
    b.chunks[i].label = "tensor 'w'";
  }
  auto ok = engine.Submit(b.chunks, nullptr, [](const Status& st) { return st; });
  EXPECT_TRUE(ok->Wait().ok());
  b.src[5 * 65536 + 99] ^= 1;
  Status seen;
  auto bad = engine.Submit(b.chunks, nullptr, [&](const Status& st) {
    seen = st;
    return st;
  });
  Status st = bad->Wait();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("chunk 5 (tensor 'w'"), std::string::npos) << st;
  EXPECT_EQ(seen, st);
}

TEST(CopyEngineTest, DoneMayOverrideAndEmptyJobsFinish) {
  CopyEngine engine({1, "t", 0});
  auto job = engine.Submit({}, nullptr, [](const Status&) { return AbortedError("x"); });
  EXPECT_EQ(job->Wait(Deadline::AfterSeconds(1)).code(), StatusCode::kAborted);
}

TEST(CopyEngineTest, DeadlineWhileRunningAndFifoJobs) {
  std::mt19937_64 rng(memento::testing::TestSeed("CopyEngineTest.Deadline"));
  CopyEngine engine({1, "t", 20000});  // 20 ms per chunk
  Buffers a = Make(rng, 10 * 4096, 4096), b = Make(rng, 4096, 4096);
  std::vector<int> order;
  Mutex mu;
  auto ja = engine.Submit(a.chunks, nullptr, [&](const Status& st) {
    MutexLock l(&mu);
    order.push_back(1);
    return st;
  });
  auto jb = engine.Submit(b.chunks, nullptr, [&](const Status& st) {
    MutexLock l(&mu);
    order.push_back(2);
    return st;
  });
  EXPECT_EQ(ja->Wait(Deadline::AfterSeconds(0.001)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(jb->Wait().ok());
  EXPECT_TRUE(ja->Wait().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(a.src, a.dst);
}

}  // namespace
}  // namespace memento::snap

namespace memento::snap {
namespace {
TEST(CopyKernelTest, MatchesReferenceChecksumAtEveryAlignment) {
  std::mt19937_64 rng(memento::testing::TestSeed("CopyKernelTest"));
  std::vector<uint8_t> src(300000), dst(300100);
  for (auto& x : src) x = rng() & 0xff;
  for (size_t len : {0ul, 1ul, 31ul, 65535ul, 65536ul, 65537ul, 200001ul}) {
    for (size_t so : {0ul, 1ul, 17ul}) {
      for (size_t dof : {0ul, 3ul, 32ul}) {
        if (so + len > src.size()) continue;
        std::fill(dst.begin(), dst.end(), 0);
        uint64_t h = CopyAndChecksumStreaming(dst.data() + dof, src.data() + so, len);
        ASSERT_EQ(h, Checksum(src.data() + so, len)) << len << " " << so << " " << dof;
        ASSERT_EQ(FastChecksum(src.data() + so, len), h);
        ASSERT_EQ(0, std::memcmp(dst.data() + dof, src.data() + so, len));
        ASSERT_EQ(dst[dof + len], 0);
      }
    }
  }
}
}  // namespace
}  // namespace memento::snap
