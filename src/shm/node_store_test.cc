#include "shm/node_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <random>

#include "common/check.h"
#include "common/checksum.h"
#include "shm/shm_test_util.h"

namespace memento::shm {
namespace {

SlotLayout Layout(int rank, int64_t n) {
  TensorMeta a{"w", DType::kFloat32, {n}, StateClass::kReplicated};
  TensorMeta b{"rng", DType::kUInt8, {16}, StateClass::kPrivate};
  auto l = ComputeSlotLayout("job", rank, {a, b}, 64 << 10);
  MEMENTO_CHECK(l.ok());
  return *l;
}

void Write(const std::string& path, const SlotLayout& layout, int slot, int64_t step, uint8_t fill,
           bool complete = true) {
  auto seg = Segment::Open(path, true);
  ASSERT_TRUE(seg.ok()) << seg.status();
  BeginSlotWrite(**seg, layout, slot, step);
  uint8_t* data = SlotData(**seg);
  ChunkEntry* table = SlotTable(**seg);
  for (size_t i = 0; i < layout.chunks.size(); ++i) {
    std::memset(data + table[i].offset, fill, table[i].length);
    table[i].checksum = Checksum(data + table[i].offset, table[i].length);
  }
  if (complete) CompleteSlotWrite(**seg);
}

TEST(NodeStoreTest, CreatesPrivateRootAndSlots) {
  testing::ShmScratchDir dir;
  std::string root = dir.path() + "/job/node0";
  auto store = NodeStore::Open({root, "job", 0, 0});
  ASSERT_TRUE(store.ok()) << store.status();
  struct stat st;
  ASSERT_EQ(stat(root.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  SlotLayout l = Layout(0, 100000);
  auto paths = (*store)->EnsureSlots(0, l.total_bytes);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->size(), 2u);
  for (const auto& p : *paths) {
    ASSERT_EQ(stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), l.total_bytes);
    // Pre-faulted: the blocks are allocated, not a sparse file.
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, l.total_bytes);
  }
  EXPECT_EQ((*store)->allocated_bytes(), 2 * l.total_bytes);
  auto inv = (*store)->Inventory(0);
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_EQ(inv[0].state, SlotState::kEmpty);
  EXPECT_FALSE(inv[0].intact);
}

TEST(NodeStoreTest, BudgetAndCapacityErrorsSayHowMuch) {
  testing::ShmScratchDir dir;
  auto store = NodeStore::Open({dir.path() + "/r", "job", 0, 1 << 20});
  ASSERT_TRUE(store.ok()) << store.status();
  auto paths = (*store)->EnsureSlots(0, 4 << 20);
  EXPECT_EQ(paths.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(paths.status().message().find("--budget"), std::string::npos) << paths.status();
  EXPECT_TRUE((*store)->EnsureSlots(0, 256 << 10).ok());
  // Far more than any filesystem here holds.
  Status st = CheckShmCapacity(dir.path(), uint64_t{1} << 60, "the test");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("--shm-size"), std::string::npos) << st;
  auto big = NodeStore::Open({dir.path() + "/r2", "job", 0, uint64_t{1} << 60});
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted) << big.status();
}

TEST(NodeStoreTest, AdoptionKeepsIntactAndDropsTorn) {
  testing::ShmScratchDir dir;
  std::string root = dir.path() + "/n";
  SlotLayout l0 = Layout(0, 50000), l1 = Layout(1, 70000);
  {
    auto store = NodeStore::Open({root, "job", 0, 0});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->EnsureSlots(0, l0.total_bytes).ok());
    ASSERT_TRUE((*store)->EnsureSlots(1, l1.total_bytes).ok());
  }
  Write(SlotPath(root, 0, 0), l0, 0, 10, 0xaa);                      // intact
  Write(SlotPath(root, 0, 1), l0, 1, 11, 0xbb, /*complete=*/false);  // torn mid-write
  Write(SlotPath(root, 1, 0), l1, 0, 10, 0xcc);                      // corrupted below
  Write(SlotPath(root, 1, 1), l1, 1, 11, 0xdd);                      // intact
  {
    auto seg = Segment::Open(SlotPath(root, 1, 0), true);
    ASSERT_TRUE(seg.ok());
    (*seg)->data()[l1.data_offset + 12345] ^= 0x80;
  }
  auto store = NodeStore::Open({root, "job", 0, 0});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Ranks(), (std::vector<int>{0, 1}));
  auto inv0 = (*store)->Inventory(0);
  ASSERT_EQ(inv0.size(), 2u);
  EXPECT_TRUE(inv0[0].intact);
  EXPECT_EQ(inv0[0].step, 10);
  EXPECT_FALSE(inv0[1].intact);
  EXPECT_EQ(inv0[1].state, SlotState::kWriting);
  auto inv1 = (*store)->Inventory(1);
  ASSERT_EQ(inv1.size(), 2u);
  EXPECT_FALSE(inv1[0].intact);
  EXPECT_NE(inv1[0].error.find("checksum"), std::string::npos) << inv1[0].error;
  EXPECT_TRUE(inv1[1].intact);
  EXPECT_EQ(inv1[1].step, 11);
  // A new write is seen as unverified until verified again.
  Write(SlotPath(root, 0, 1), l0, 1, 12, 0xee);
  inv0 = (*store)->Inventory(0);
  EXPECT_FALSE(inv0[1].verified);
  EXPECT_TRUE((*store)->Verify(0, 1).ok());
  inv0 = (*store)->Inventory(0);
  EXPECT_TRUE(inv0[1].intact);
  EXPECT_EQ(inv0[1].step, 12);
}

TEST(NodeStoreTest, GrowingKeepsTheCommittedVersion) {
  testing::ShmScratchDir dir;
  std::string root = dir.path() + "/n";
  SlotLayout small = Layout(0, 1000), big = Layout(0, 300000);
  auto store = NodeStore::Open({root, "job", 0, 0});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->EnsureSlots(0, small.total_bytes).ok());
  Write(SlotPath(root, 0, 0), small, 0, 5, 0x11);
  ASSERT_TRUE((*store)->EnsureSlots(0, big.total_bytes).ok());
  EXPECT_TRUE((*store)->Verify(0, 0).ok());
  EXPECT_EQ((*store)->Inventory(0)[0].step, 5);
  EXPECT_EQ((*store)->Inventory(0)[0].segment_bytes, big.total_bytes);
}

}  // namespace
}  // namespace memento::shm
