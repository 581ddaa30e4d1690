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

TEST(NodeStoreTest, EnsureSlotCreatesOnlyThatSlot) {
  testing::ShmScratchDir dir;
  std::string root = dir.path() + "/n";
  SlotLayout l = Layout(3, 100000);
  auto store = NodeStore::Open({root, "job", 0, 0});
  ASSERT_TRUE(store.ok());
  auto seg = (*store)->EnsureSlot(3, 1, l.total_bytes);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_TRUE((*seg)->writable());
  EXPECT_EQ((*seg)->size(), l.total_bytes);
  struct stat st;
  EXPECT_NE(stat(SlotPath(root, 3, 0).c_str(), &st), 0) << "slot 0 was created too";
  ASSERT_EQ(stat(SlotPath(root, 3, 1).c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, l.total_bytes);
  EXPECT_EQ((*store)->allocated_bytes(), l.total_bytes);
  ASSERT_EQ((*store)->Inventory(3).size(), 1u);
  // The same mapping again when it is large enough; the trainer's Seal adds
  // the other slot later.
  auto again = (*store)->EnsureSlot(3, 1, l.total_bytes);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), seg->get());
  ASSERT_TRUE((*store)->EnsureSlots(3, l.total_bytes).ok());
  EXPECT_EQ((*store)->Inventory(3).size(), 2u);
  EXPECT_EQ((*store)->EnsureSlot(3, 2, 1).status().code(), StatusCode::kInvalidArgument);
  // Budget: one slot's worth is refused beyond it.
  auto tight = NodeStore::Open({dir.path() + "/t", "job", 0, l.total_bytes + 1});
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_TRUE((*tight)->EnsureSlot(0, 0, l.total_bytes).ok());
  EXPECT_EQ((*tight)->EnsureSlot(0, 1, l.total_bytes).status().code(),
            StatusCode::kResourceExhausted);
}

// VerifyWritten checks what the caller does not vouch for, and records the
// outcome; a byte flipped in a trusted chunk is not read by it, but every
// full check (Verify: scrub, inventories with verify, adoption; the
// trainer's Restore) still finds it.
TEST(NodeStoreTest, VerifyWrittenSkipsOnlyTrustedChunks) {
  testing::ShmScratchDir dir;
  std::string root = dir.path() + "/n";
  SlotLayout l = Layout(0, 200000);  // 800 KB of "w": 13 chunks of 64 KiB, + "rng"
  ASSERT_GE(l.chunks.size(), 4u);
  auto store = NodeStore::Open({root, "job", 0, 0});
  ASSERT_TRUE(store.ok());
  auto seg = (*store)->EnsureSlot(0, 0, l.total_bytes);
  ASSERT_TRUE(seg.ok());
  Write(SlotPath(root, 0, 0), l, 0, 7, 0x5a);
  std::vector<uint8_t> trusted(l.chunks.size(), 0);
  trusted[1] = 1;
  EXPECT_TRUE((*store)->VerifyWritten(0, 0, trusted, 2).ok());
  EXPECT_TRUE((*store)->Inventory(0)[0].intact);
  EXPECT_TRUE((*store)->Inventory(0)[0].verified);
  EXPECT_EQ((*store)->VerifyWritten(0, 0, std::vector<uint8_t>(1, 0), 2).code(),
            StatusCode::kInvalidArgument);
  uint8_t* data = SlotData(**seg);
  // A flipped byte in an untrusted chunk: DataLoss naming it, recorded.
  data[l.chunks[2].offset + 5] ^= 0x01;
  Status st = (*store)->VerifyWritten(0, 0, trusted, 2);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("chunk 2 "), std::string::npos) << st;
  EXPECT_FALSE((*store)->Inventory(0)[0].intact);
  data[l.chunks[2].offset + 5] ^= 0x01;
  EXPECT_TRUE((*store)->VerifyWritten(0, 0, {}, 1).ok());
  // In a trusted chunk: VerifyWritten does not look, the full check does.
  data[l.chunks[1].offset + 9] ^= 0x80;
  EXPECT_TRUE((*store)->VerifyWritten(0, 0, trusted, 2).ok());
  EXPECT_EQ((*store)->VerifyWritten(0, 0, {}, 2).code(), StatusCode::kDataLoss);
  st = (*store)->Verify(0, 0);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("chunk 1 "), std::string::npos) << st;
  // A slot that is not complete is never recorded intact.
  Write(SlotPath(root, 0, 0), l, 0, 8, 0x11, /*complete=*/false);
  EXPECT_EQ((*store)->VerifyWritten(0, 0, {}, 2).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE((*store)->Inventory(0)[0].intact);
}

}  // namespace
}  // namespace memento::shm
