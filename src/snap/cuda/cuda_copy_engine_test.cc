// The CUDA copy path on a real device; every test skips without one.
#include "snap/cuda/cuda_copy_engine.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "common/test_util.h"

namespace memento::cuda {
namespace {

#define SKIP_WITHOUT_GPU()                                    \
  do {                                                        \
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Page-aligned host memory that a test registers with PinnedRegion (like a
// shared-memory slot would be).
struct HostBuffer {
  explicit HostBuffer(size_t n) : bytes(n) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
  }
  ~HostBuffer() { std::free(data); }
  uint8_t* data;
  size_t bytes;
};

std::vector<uint8_t> RandomBytes(std::mt19937_64* rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>((*rng)());
  return v;
}

TEST(CudaCopyTest, ChunkedD2HAndRestoreH2D) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(memento::testing::TestSeed("CudaCopyTest.ChunkedD2HAndRestoreH2D"));
  const size_t n = (size_t{37} << 20) + 12345;  // not a multiple of the chunk
  auto want = RandomBytes(&rng, n);
  auto dev = DeviceBuffer::Allocate(n);
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_EQ(cudaMemcpy((*dev)->data(), want.data(), n, cudaMemcpyHostToDevice), cudaSuccess);

  HostBuffer slot(n);
  auto pin = PinnedRegion::Register(slot.data, n);
  ASSERT_TRUE(pin.ok()) << pin.status();
  // Registering the same range twice is refused with CUDA's reason.
  EXPECT_EQ(PinnedRegion::Register(slot.data, n).status().code(), StatusCode::kInternal);

  CudaCopyOptions o;
  o.chunk_bytes = size_t{1} << 20;
  o.max_inflight = 3;
  auto engine = CudaCopyEngine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ((*engine)->stream_priority(), least);

  ASSERT_TRUE((*engine)->CopyD2H(slot.data, (*dev)->data(), n).ok());
  EXPECT_EQ(Checksum(slot.data, n), Checksum(want.data(), n));

  // Restore: wipe the device, copy the slot back.
  ASSERT_EQ(cudaMemset((*dev)->data(), 0, n), cudaSuccess);
  ASSERT_TRUE((*engine)->CopyH2D((*dev)->data(), slot.data, n).ok());
  std::vector<uint8_t> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), (*dev)->data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), want.data(), n), 0);
}

TEST(CudaCopyTest, TicketsAndBoundedInFlight) {
  SKIP_WITHOUT_GPU();
  const size_t chunk = 1 << 20, chunks = 16;
  auto dev = DeviceBuffer::Allocate(chunk * chunks);
  ASSERT_TRUE(dev.ok());
  ASSERT_EQ(cudaMemset((*dev)->data(), 0x5a, chunk * chunks), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostBuffer slot(chunk * chunks);
  std::memset(slot.data, 0, chunk * chunks);
  auto pin = PinnedRegion::Register(slot.data, chunk * chunks);
  ASSERT_TRUE(pin.ok());
  CudaCopyOptions o;
  o.max_inflight = 2;
  auto engine = CudaCopyEngine::Create(o);
  ASSERT_TRUE(engine.ok());
  std::vector<uint64_t> tickets;
  for (size_t i = 0; i < chunks; ++i) {
    auto t = (*engine)->SubmitD2H(slot.data + i * chunk,
                                  static_cast<uint8_t*>((*dev)->data()) + i * chunk, chunk);
    ASSERT_TRUE(t.ok()) << t.status();
    tickets.push_back(*t);
    // With two in flight, everything older than the last two is complete.
    if (i >= 2) {
      EXPECT_TRUE((*engine)->Done(tickets[i - 2]));
    }
  }
  for (uint64_t t : tickets) EXPECT_TRUE((*engine)->Wait(t, Deadline::AfterSeconds(30)).ok());
  EXPECT_TRUE((*engine)->WaitAll().ok());
  for (size_t i = 0; i < chunk * chunks; ++i) ASSERT_EQ(slot.data[i], 0x5a) << i;
  EXPECT_EQ((*engine)->Wait(999999).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->SubmitD2H(nullptr, (*dev)->data(), 1).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CudaCopyTest, XorParityMatchesHost) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = memento::testing::TestSeed("CudaCopyTest.XorParityMatchesHost");
  std::mt19937_64 rng(seed);
  CudaCopyOptions o;
  o.parity_staging_bytes = size_t{1} << 20;  // small: many pipeline rounds
  o.parity_sub_buffers = 3;
  auto engine = CudaCopyEngine::Create(o);
  ASSERT_TRUE(engine.ok());
  for (int round = 0; round < 8; ++round) {
    const int k = 1 + static_cast<int>(rng() % 6);
    const size_t n = 1 + rng() % (size_t{5} << 20);
    const size_t misalign = round % 2 ? 0 : rng() % 16;  // half the rounds unaligned
    std::vector<std::vector<uint8_t>> data;
    std::vector<std::unique_ptr<DeviceBuffer>> bufs;
    std::vector<const void*> ptrs;
    for (int j = 0; j < k; ++j) {
      data.push_back(RandomBytes(&rng, n));
      auto b = DeviceBuffer::Allocate(n + 16);
      ASSERT_TRUE(b.ok());
      uint8_t* p = static_cast<uint8_t*>((*b)->data()) + misalign;
      ASSERT_EQ(cudaMemcpy(p, data[j].data(), n, cudaMemcpyHostToDevice), cudaSuccess);
      ptrs.push_back(p);
      bufs.push_back(std::move(*b));
    }
    std::vector<uint8_t> want(n, 0);
    for (int j = 0; j < k; ++j) {
      for (size_t i = 0; i < n; ++i) want[i] ^= data[j][i];
    }
    HostBuffer parity(n);
    auto pin = PinnedRegion::Register(parity.data, n);
    ASSERT_TRUE(pin.ok());
    Status st = (*engine)->XorParityD2H(ptrs.data(), k, n, parity.data);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(std::memcmp(parity.data, want.data(), n), 0)
        << "k=" << k << " n=" << n << " misalign=" << misalign << " seed=" << seed;
  }
  const void* none[1] = {nullptr};
  uint8_t out[4];
  EXPECT_EQ((*engine)->XorParityD2H(none, 0, 4, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->XorParityD2H(none, 1, 4, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->XorParityD2H(none, 33, 4, out).code(), StatusCode::kInvalidArgument);
}

TEST(CudaCopyTest, BadOptions) {
  SKIP_WITHOUT_GPU();
  CudaCopyOptions o;
  o.device = DeviceCount();
  EXPECT_EQ(CudaCopyEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = CudaCopyOptions{};
  o.max_inflight = 0;
  EXPECT_EQ(CudaCopyEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PinnedRegion::Register(nullptr, 10).status().code(), StatusCode::kInvalidArgument);
}

TEST(CudaCopyTest, NoDeviceIsUnavailable) {
  if (DeviceCount() != 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(CudaCopyEngine::Create(CudaCopyOptions{}).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace memento::cuda
