// Every copy kernel this CPU can run against the reference: XXH3_64bits of
// the shared xxHash library (common/checksum) and memcpy, over random
// lengths (around every boundary of XXH3's stripes, blocks and the short-input
// cut-off) and random source and destination alignments, with guard bytes
// around the destination and buffers that end at an inaccessible page.
#include "snap/copy_kernel.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/test_util.h"

namespace memento::snap {
namespace {

// Lengths at and around every size the kernels treat specially.
std::vector<size_t> InterestingLengths(std::mt19937_64& rng) {
  std::vector<size_t> out = {0, 1, 2, 3, 4, 8, 9, 16, 17, 63, 64, 65, 127, 128, 129, 239, 240};
  for (size_t base : {241ul, 256ul, 1024ul, 2048ul, 16 * 1024ul, 64 * 1024ul, 128 * 1024ul,
                      192 * 1024ul + 5 * 64}) {
    for (long delta : {-65L, -64L, -63L, -1L, 0L, 1L, 63L, 64L, 65L}) {
      if (static_cast<long>(base) + delta > 0) out.push_back(base + delta);
    }
  }
  for (int i = 0; i < 60; ++i) out.push_back(rng() % (300 * 1024) + 1);
  return out;
}

class CopyKernelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (const CopyKernel& k : AvailableCopyKernels()) {
      if (GetParam() == k.name) kernel_ = k;
    }
    if (kernel_.name == nullptr) GTEST_SKIP() << GetParam() << " is not available on this CPU";
  }
  CopyKernel kernel_{};
};

TEST_P(CopyKernelTest, MatchesXxh3AndMemcpyAtRandomLengthsAndAlignments) {
  std::mt19937_64 rng(testing::TestSeed("CopyKernelTest.Random"));
  constexpr size_t kMax = 320 * 1024, kGuard = 128;
  std::vector<uint8_t> src(kMax + 64), dst(kMax + 128 + 2 * kGuard);
  const std::vector<uint8_t> guard(dst.size(), 0xee);  // what untouched dst bytes hold
  // 64-byte aligned base, so that offset 0 is the slots' aligned case.
  uint8_t* base = dst.data() + kGuard;
  base += (64 - (reinterpret_cast<uintptr_t>(base) & 63)) & 63;
  for (auto& x : src) x = rng() & 0xff;
  for (size_t len : InterestingLengths(rng)) {
    for (int rep = 0; rep < 3; ++rep) {
      // Aligned (the slots' case) and random offsets, both sides.
      const size_t so = rep == 0 ? 0 : rng() % 64;
      const size_t dof = rep == 0 ? 0 : (rep == 1 ? 32 * (rng() % 2) : rng() % 64);
      uint8_t* d = base + dof;
      ASSERT_LE(d + len + kGuard, dst.data() + dst.size());
      std::memset(dst.data(), 0xee, dst.size());
      const uint8_t* s = src.data() + so;
      uint64_t got = kernel_.copy_and_checksum(d, s, len);
      uint64_t want = Checksum(s, len);
      ASSERT_EQ(got, want) << kernel_.name << " len " << len << " src+" << so << " dst+" << dof;
      ASSERT_EQ(kernel_.checksum(s, len), want) << kernel_.name << " len " << len;
      ASSERT_EQ(0, std::memcmp(d, s, len)) << kernel_.name << " len " << len;
      // One memcmp per guard instead of an assertion per byte: the per-byte
      // loop made this test take 400 s per kernel under ThreadSanitizer.
      const size_t before = static_cast<size_t>(d - dst.data());
      const size_t after = dst.size() - before - len;
      ASSERT_EQ(0, std::memcmp(dst.data(), guard.data(), before))
          << kernel_.name << " wrote before dst, len " << len << " dst+" << dof;
      ASSERT_EQ(0, std::memcmp(d + len, guard.data(), after))
          << kernel_.name << " wrote after dst, len " << len << " dst+" << dof;
    }
  }
}

// Source and destination each end exactly at a PROT_NONE page: a kernel that
// reads or writes one byte past either end dies here.
TEST_P(CopyKernelTest, StaysInsideBuffersThatEndAtAGuardPage) {
  std::mt19937_64 rng(testing::TestSeed("CopyKernelTest.GuardPage"));
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t data_pages = 80;  // 320 KiB with 4 KiB pages
  const size_t total = (data_pages + 1) * page;
  auto map = [&]() {
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    EXPECT_EQ(0, mprotect(static_cast<uint8_t*>(p) + data_pages * page, page, PROT_NONE));
    return static_cast<uint8_t*>(p);
  };
  uint8_t* sbuf = map();
  uint8_t* dbuf = map();
  ASSERT_NE(sbuf, MAP_FAILED);
  ASSERT_NE(dbuf, MAP_FAILED);
  const uint8_t* send = sbuf + data_pages * page;
  uint8_t* dend = dbuf + data_pages * page;
  for (size_t i = 0; i < data_pages * page; ++i) sbuf[i] = rng() & 0xff;
  for (size_t len : InterestingLengths(rng)) {
    if (len > data_pages * page) continue;
    for (size_t dmis : {0ul, 5ul}) {  // end aligned, and not
      const uint8_t* s = send - len;
      uint8_t* d = dend - len - dmis;
      uint64_t got = kernel_.copy_and_checksum(d, s, len);
      ASSERT_EQ(got, Checksum(s, len)) << kernel_.name << " len " << len;
      ASSERT_EQ(kernel_.checksum(s, len), got);
      ASSERT_EQ(0, std::memcmp(d, s, len));
    }
  }
  munmap(sbuf, total);
  munmap(dbuf, total);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CopyKernelTest,
                         ::testing::Values("avx512", "avx2", "sse2", "avx2-twopass", "portable"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

TEST(CopyKernelSelectTest, DefaultIsFirstAndUnknownNamesAreRefused) {
  std::vector<CopyKernel> all = AvailableCopyKernels();
  ASSERT_FALSE(all.empty());
  std::set<std::string> names;
  for (const CopyKernel& k : all) names.insert(k.name);
  EXPECT_EQ(names.size(), all.size()) << "kernel names are unique";
  EXPECT_TRUE(names.count("portable"));
  const std::string before = ActiveCopyKernel().name;
  Status st = SelectCopyKernel("no-such-kernel");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no-such-kernel"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("portable"), std::string::npos) << st.ToString();
  EXPECT_EQ(before, ActiveCopyKernel().name);
  ASSERT_TRUE(SelectCopyKernel("portable").ok());
  EXPECT_STREQ(ActiveCopyKernel().name, "portable");
  std::vector<uint8_t> a(5000, 3), b(5000, 0);
  EXPECT_EQ(CopyAndChecksumStreaming(b.data(), a.data(), a.size()), Checksum(a.data(), a.size()));
  EXPECT_EQ(FastChecksum(a.data(), a.size()), Checksum(a.data(), a.size()));
  ASSERT_TRUE(SelectCopyKernel(before).ok());
  EXPECT_EQ(before, ActiveCopyKernel().name);
}

// The kernel a process's edge takes from MEMENTO_COPY_KERNEL
// (SelectCopyKernelUnlessChosen) does not override one chosen before (a
// benchmark's --kernel): Client::Connect runs after it.
TEST(CopyKernelTest, TheEdgesChoiceDoesNotOverrideAnEarlierOne) {
  const std::string before = ActiveCopyKernel().name;  // chosen by first use
  ASSERT_TRUE(SelectCopyKernel("portable").ok());
  ASSERT_TRUE(SelectCopyKernelUnlessChosen(AvailableCopyKernels().front().name).ok());
  EXPECT_STREQ(ActiveCopyKernel().name, "portable");
  Status st = SelectCopyKernelUnlessChosen("no-such-kernel");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_STREQ(ActiveCopyKernel().name, "portable");
  ASSERT_TRUE(SelectCopyKernel(before).ok());
}

}  // namespace
}  // namespace memento::snap
