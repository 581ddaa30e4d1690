#include "agent/memory_tier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "tier/discovery.h"
#include "tier/env.h"

namespace memento::agent {
namespace {

constexpr uint64_t kChunk = 64 * 1024;

// Writes version `step` of rank `rank` into slot `slot` under `root` with the
// real writer protocol; the data is a pattern of (rank, step). With
// `complete` false the slot is left torn (kWriting), as after a crash.
void WriteSlot(const std::string& root, int rank, int slot, int64_t step, bool complete = true) {
  std::vector<TensorMeta> tensors = {
      {"w", DType::kFloat32, {50000}, StateClass::kReplicated},
      {"rank" + std::to_string(rank) + "/state", DType::kUInt8, {100}, StateClass::kPrivate}};
  auto layout = shm::ComputeSlotLayout("job", rank, tensors, kChunk);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto seg = shm::Segment::CreateOrGrow(shm::SlotPath(root, rank, slot), layout->total_bytes);
  ASSERT_TRUE(seg.ok()) << seg.status();
  shm::BeginSlotWrite(**seg, *layout, slot, step);
  uint8_t* data = shm::SlotData(**seg);
  for (uint64_t i = 0; i < layout->data_bytes; ++i) {
    data[i] = static_cast<uint8_t>(i * 7 + rank * 13 + step);
  }
  shm::ChunkEntry* table = shm::SlotTable(**seg);
  for (size_t c = 0; c < layout->chunks.size(); ++c) {
    table[c] = layout->chunks[c];
    table[c].checksum = Checksum(data + table[c].offset, table[c].length);
  }
  if (complete) shm::CompleteSlotWrite(**seg);
}

TEST(MemoryTierTest, NewestStepEveryRankHoldsIntact) {
  shm::testing::ShmScratchDir node0("memtier"), node1("memtier");
  WriteSlot(node0.path(), 0, 0, 4);
  WriteSlot(node0.path(), 0, 1, 5);
  WriteSlot(node1.path(), 1, 0, 4);
  WriteSlot(node1.path(), 1, 1, 5, /*complete=*/false);  // rank 1 died writing 5

  auto report = InspectMemoryTier({node0.path(), node1.path()}, /*verify_data=*/true);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ranks, (std::vector<int>{0, 1}));
  ASSERT_EQ(report->slots.size(), 4u);
  EXPECT_EQ(report->slots[3].state, "writing");
  EXPECT_FALSE(report->slots[3].intact);
  ASSERT_TRUE(report->latest_complete.has_value());
  EXPECT_EQ(*report->latest_complete, 4);  // 5 is not on every rank

  WriteSlot(node1.path(), 1, 1, 5);
  report = InspectMemoryTier({node0.path(), node1.path()}, true);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->latest_complete.value_or(-1), 5);
}

TEST(MemoryTierTest, CorruptSlotIsNotIntactOnlyWhenDataIsVerified) {
  shm::testing::ShmScratchDir node0("memtier");
  WriteSlot(node0.path(), 0, 0, 8);
  WriteSlot(node0.path(), 0, 1, 9);
  {
    auto seg = shm::Segment::Open(shm::SlotPath(node0.path(), 0, 1), /*writable=*/true);
    ASSERT_TRUE(seg.ok());
    shm::SlotData(**seg)[12345] ^= 0x40;  // silent corruption of a committed slot
  }
  auto headers_only = InspectMemoryTier({node0.path()}, /*verify_data=*/false);
  ASSERT_TRUE(headers_only.ok());
  EXPECT_EQ(headers_only->latest_complete.value_or(-1), 9);

  auto verified = InspectMemoryTier({node0.path()}, /*verify_data=*/true);
  ASSERT_TRUE(verified.ok());
  EXPECT_EQ(verified->latest_complete.value_or(-1), 8);
  EXPECT_NE(verified->slots[1].error.find("DataLoss"), std::string::npos)
      << verified->slots[1].error;
}

TEST(MemoryTierTest, MissingRootIsNotFound) {
  auto report = InspectMemoryTier({"/dev/shm/memento-no-such-root-xyz"}, true);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kNotFound);
  EXPECT_NE(report.status().message().find("memento-no-such-root-xyz"), std::string::npos);
}

TEST(MemoryTierTest, LatestAcrossTiersPrefersMemoryAndFallsBackToDurable) {
  shm::testing::ShmScratchDir node0("memtier"), durable("memtier-durable");
  WriteSlot(node0.path(), 0, 0, 3, /*complete=*/false);  // nothing intact in memory
  MemoryVersionSource memory({node0.path()});
  tier::DurableVersionSource disk(tier::Env::Default(), durable.path());
  auto none = tier::FindLatestComplete({&memory, &disk}, Deadline::AfterSeconds(10));
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);

  WriteSlot(node0.path(), 0, 1, 7);
  auto latest = tier::FindLatestComplete({&memory, &disk}, Deadline::AfterSeconds(10));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 7);
  EXPECT_EQ(latest->source, "memory");
}

}  // namespace
}  // namespace memento::agent
