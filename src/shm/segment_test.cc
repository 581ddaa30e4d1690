#include "shm/segment.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "shm/shm_test_util.h"

namespace memento::shm {
namespace {

using testing::ShmScratchDir;

TEST(SegmentTest, MappingsStartAtHugePageBoundaries) {
  ShmScratchDir dir;
  const std::string path = dir.path() + "/seg";
  auto seg = Segment::CreateOrGrow(path, (size_t{5} << 20) + 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*seg)->data()) % kHugePageBytes, 0u);
  for (bool writable : {false, true}) {
    auto again = Segment::Open(path, writable, /*prefault=*/writable);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*again)->data()) % kHugePageBytes, 0u);
    EXPECT_EQ((*again)->size(), (size_t{5} << 20) + 4096);
  }
  // A small segment (the commit word) is mapped as before.
  auto small = Segment::CreateOrGrow(dir.path() + "/small", 64);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->size(), 64u);
}

TEST(SegmentTest, GrowingKeepsTheBytesAndZeroesTheRest) {
  ShmScratchDir dir;
  const std::string path = dir.path() + "/seg";
  const size_t small = (size_t{3} << 20) + 8192, big = size_t{9} << 20;
  std::mt19937_64 rng(42);
  std::vector<uint8_t> pattern(small);
  for (auto& b : pattern) b = rng() & 0xff;
  {
    auto seg = Segment::CreateOrGrow(path, small);
    ASSERT_TRUE(seg.ok()) << seg.status();
    std::memcpy((*seg)->data(), pattern.data(), small);
  }
  // Grown (collapsed into huge pages where the kernel does it), by the agent.
  auto grown = Segment::CreateOrGrow(path, big);
  ASSERT_TRUE(grown.ok()) << grown.status();
  ASSERT_EQ((*grown)->size(), big);
  // Seen through another mapping, as a trainer sees it.
  auto seg = Segment::Open(path, /*writable=*/true, /*prefault=*/true);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(std::memcmp((*seg)->data(), pattern.data(), small), 0);
  for (size_t i = small; i < big; ++i) ASSERT_EQ((*seg)->data()[i], 0) << i;
  // A grow to a smaller size changes nothing.
  auto same = Segment::CreateOrGrow(path, small);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->size(), big);
  EXPECT_EQ(std::memcmp((*same)->data(), pattern.data(), small), 0);
}

TEST(SegmentTest, HugePagesWhereTheKernelGivesThem) {
  ShmScratchDir dir;
  const size_t n = size_t{16} << 20;
  auto seg = Segment::CreateOrGrow(dir.path() + "/seg", n);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto mine = Segment::Open((*seg)->path(), /*writable=*/true, /*prefault=*/true);
  ASSERT_TRUE(mine.ok()) << mine.status();
  MappedPages pages = MappedPagesOf(dir.path() + "/");
  // Both mappings are resident in full (populated and touched).
  EXPECT_EQ(pages.rss_bytes, 2 * n);
  EXPECT_LE(pages.huge_bytes, pages.rss_bytes);
  std::printf("tmpfs huge=%s, shmem_enabled=%s: %llu of %llu mapped bytes in 2 MiB pages\n",
              TmpfsHugeOption(dir.path()).c_str(), ShmemThpSetting().c_str(),
              static_cast<unsigned long long>(pages.huge_bytes),
              static_cast<unsigned long long>(pages.rss_bytes));
  // Turned off, and with a tmpfs and a kernel that do not make huge pages on
  // their own: none.
  if (TmpfsHugeOption(dir.path()) == "never" && ShmemThpSetting() != "force") {
    SetHugePagesWanted(false);
    auto off = Segment::CreateOrGrow(dir.path() + "/off", n);
    SetHugePagesWanted(true);
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_EQ(MappedPagesOf(dir.path() + "/off").huge_bytes, 0u);
    EXPECT_EQ(MappedPagesOf(dir.path() + "/off").rss_bytes, n);
  }
}

TEST(SegmentTest, TouchPagesChangesNoByteUnderConcurrentStores) {
  ShmScratchDir dir;
  const size_t n = size_t{4} << 20;
  auto seg = Segment::CreateOrGrow(dir.path() + "/seg", n);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto other = Segment::Open((*seg)->path(), /*writable=*/true);
  ASSERT_TRUE(other.ok()) << other.status();
  uint8_t* p = (*seg)->data();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // A writer stores a counter into the first byte of every page (through its
  // own mapping) while another thread touches the pages over and over; every
  // store must survive (a plain read-then-write touch would lose some).
  std::atomic<bool> stop{false};
  std::thread toucher([&] {
    while (!stop.load()) TouchPages((*other)->data() + 1, n - 1);  // unaligned start too
  });
  for (int round = 1; round <= 200; ++round) {
    for (size_t off = 0; off < n; off += page) {
      __atomic_store_n(p + off, static_cast<uint8_t>(round), __ATOMIC_RELAXED);
      __atomic_store_n(p + off + 1, static_cast<uint8_t>(round + 1), __ATOMIC_RELAXED);
    }
  }
  stop.store(true);
  toucher.join();
  for (size_t off = 0; off < n; off += page) {
    ASSERT_EQ(p[off], 200) << off;
    ASSERT_EQ(p[off + 1], 201) << off;
  }
}

}  // namespace
}  // namespace memento::shm
