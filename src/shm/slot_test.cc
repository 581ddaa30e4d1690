#include "shm/slot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/checksum.h"
#include "fmt/format.h"
#include "shm/shm_test_util.h"

namespace memento::shm {
namespace {

std::vector<TensorMeta> SampleTensors() {
  TensorMeta a{"w", DType::kFloat32, {300, 7}, StateClass::kReplicated};
  TensorMeta b{"adam.m", DType::kBFloat16, {5}, StateClass::kDpSharded, 10, 5};
  TensorMeta c{"rng", DType::kUInt8, {13}, StateClass::kPrivate};
  return {a, b, c};
}

// Writes a full slot as the client does, with data from `rng`.
void WriteSlot(const Segment& seg, const SlotLayout& layout, int slot, int64_t step,
               std::mt19937_64& rng) {
  BeginSlotWrite(seg, layout, slot, step);
  uint8_t* data = SlotData(seg);
  ChunkEntry* table = SlotTable(seg);
  for (size_t i = 0; i < layout.chunks.size(); ++i) {
    for (uint64_t b = 0; b < table[i].length; ++b) data[table[i].offset + b] = rng() & 0xff;
    table[i].checksum = Checksum(data + table[i].offset, table[i].length);
  }
  CompleteSlotWrite(seg);
}

TEST(SlotLayoutTest, AlignsTensorsAndSplitsChunks) {
  auto layout = ComputeSlotLayout("job", 3, SampleTensors(), 1000);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors.size(), 3u);
  EXPECT_EQ(layout->tensors[0].offset, 0u);
  EXPECT_EQ(layout->tensors[0].nbytes, 8400u);
  EXPECT_EQ(layout->tensors[1].offset % kTensorAlignment, 0u);
  EXPECT_GE(layout->tensors[1].offset, 8400u);
  // 8400 bytes in 1000-byte chunks: 9 chunks; then 1 each.
  EXPECT_EQ(layout->chunks.size(), 11u);
  EXPECT_EQ(layout->chunks[8].length, 400u);
  EXPECT_EQ(layout->chunks[9].tensor_index, 1u);
  EXPECT_EQ(layout->data_offset % kSlotDataAlignment, 0u);
  EXPECT_GE(layout->total_bytes, layout->data_offset + layout->data_bytes);
}

TEST(SlotLayoutTest, RejectsBadInput) {
  auto t = SampleTensors();
  t.push_back(t[0]);
  EXPECT_EQ(ComputeSlotLayout("job", 0, t, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeSlotLayout("bad/job", 0, SampleTensors(), 4096).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeSlotLayout("", 0, SampleTensors(), 4096).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SlotLayoutTest, ManifestRoundTrips) {
  auto layout = ComputeSlotLayout("job", 0, SampleTensors(), 4096);
  ASSERT_TRUE(layout.ok());
  auto parsed = ParseManifest(layout->manifest);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*parsed)[i].meta, layout->tensors[i].meta);
    EXPECT_EQ((*parsed)[i].offset, layout->tensors[i].offset);
  }
  EXPECT_EQ(ParseManifest("{not json").status().code(), StatusCode::kDataLoss);
}

TEST(SlotLayoutTest, DiffListsEveryDifference) {
  auto layout = ComputeSlotLayout("job", 0, SampleTensors(), 4096);
  ASSERT_TRUE(layout.ok());
  EXPECT_TRUE(DiffTensors(layout->tensors, SampleTensors()).empty());
  auto reg = SampleTensors();
  reg[0].shape = {300, 8};
  reg[1].dtype = DType::kFloat16;
  reg[2].name = "rng2";
  auto diffs = DiffTensors(layout->tensors, reg);
  ASSERT_EQ(diffs.size(), 4u);
  std::string all;
  for (auto& d : diffs) all += d + "\n";
  EXPECT_NE(all.find("shape [300, 7] saved, [300, 8] registered"), std::string::npos) << all;
  EXPECT_NE(all.find("dtype BF16 saved, F16 registered"), std::string::npos) << all;
  EXPECT_NE(all.find("'rng' (U8 [13]) is saved but not registered"), std::string::npos) << all;
  EXPECT_NE(all.find("'rng2' (U8 [13]) is registered but not saved"), std::string::npos) << all;
}

class SlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto layout = ComputeSlotLayout("job", 2, SampleTensors(), 1024);
    ASSERT_TRUE(layout.ok());
    layout_ = *layout;
    auto seg = Segment::CreateOrGrow(dir_.path() + "/rank2.slot0", layout_.total_bytes);
    ASSERT_TRUE(seg.ok()) << seg.status();
    seg_ = std::move(*seg);
  }
  testing::ShmScratchDir dir_;
  SlotLayout layout_;
  std::unique_ptr<Segment> seg_;
};

TEST_F(SlotTest, FreshSlotIsEmpty) {
  auto info = ReadSlot(*seg_);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, SlotState::kEmpty);
}

TEST_F(SlotTest, WriteReadVerify) {
  std::mt19937_64 rng(memento::testing::TestSeed("SlotTest.WriteReadVerify"));
  WriteSlot(*seg_, layout_, 0, 42, rng);
  auto info = ReadSlot(*seg_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, SlotState::kComplete);
  EXPECT_EQ(info->step, 42);
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->job_id, "job");
  EXPECT_EQ(info->tensors.size(), 3u);
  EXPECT_TRUE(VerifySlotData(*seg_, *info).ok());
  EXPECT_TRUE(SlotUnchanged(*seg_, *info));
  // A new write changes the generation and the state at once.
  BeginSlotWrite(*seg_, layout_, 0, 43);
  EXPECT_FALSE(SlotUnchanged(*seg_, *info));
  auto torn = ReadSlot(*seg_);
  ASSERT_TRUE(torn.ok());
  EXPECT_EQ(torn->state, SlotState::kWriting);
  EXPECT_EQ(torn->step, 43);
}

TEST_F(SlotTest, FlippedDataByteIsDataLoss) {
  std::mt19937_64 rng(memento::testing::TestSeed("SlotTest.FlippedDataByteIsDataLoss"));
  WriteSlot(*seg_, layout_, 0, 7, rng);
  auto info = ReadSlot(*seg_);
  ASSERT_TRUE(info.ok());
  size_t pos = rng() % layout_.data_bytes;
  while (pos >= layout_.tensors[0].nbytes && pos < layout_.tensors[1].offset) pos = 0;
  seg_->data()[layout_.data_offset + pos] ^= 0x01;
  Status st = VerifySlotData(*seg_, *info);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("fails its checksum"), std::string::npos) << st;
}

// The scrub's paced check: the same verdict as VerifySlotData, every data
// byte announced to the pacer in pieces of at most piece_bytes, and a pacer
// that says stop stops it (Aborted, not DataLoss).
TEST_F(SlotTest, PacedVerificationAgreesAndStops) {
  std::mt19937_64 rng(memento::testing::TestSeed("SlotTest.Paced"));
  WriteSlot(*seg_, layout_, 0, 9, rng);
  auto info = ReadSlot(*seg_);
  ASSERT_TRUE(info.ok());
  uint64_t announced = 0, largest = 0;
  auto pace = [&](uint64_t n) {
    announced += n;
    largest = std::max(largest, n);
    return true;
  };
  ASSERT_TRUE(VerifySlotDataPaced(*seg_, *info, 100, pace).ok());
  uint64_t chunk_bytes = 0;
  for (const ChunkEntry& c : info->chunks) chunk_bytes += c.length;
  EXPECT_EQ(announced, chunk_bytes);
  EXPECT_LE(largest, 100u);
  int calls = 0;
  Status st = VerifySlotDataPaced(*seg_, *info, 100, [&](uint64_t) { return ++calls < 5; });
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st;
  EXPECT_EQ(calls, 5);
  size_t pos = rng() % layout_.tensors[0].nbytes;
  seg_->data()[layout_.data_offset + pos] ^= 0x10;
  st = VerifySlotDataPaced(*seg_, *info, 100, pace);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_EQ(VerifySlotData(*seg_, *info).code(), StatusCode::kDataLoss);
}

TEST_F(SlotTest, CorruptHeaderManifestOrTableIsDataLoss) {
  std::mt19937_64 rng(memento::testing::TestSeed("SlotTest.CorruptHeader"));
  for (uint64_t where : {uint64_t{90}, layout_.manifest_offset + 3, layout_.table_offset + 17}) {
    WriteSlot(*seg_, layout_, 0, 9, rng);
    seg_->data()[where] ^= 0x40;
    auto info = ReadSlot(*seg_);
    EXPECT_EQ(info.status().code(), StatusCode::kDataLoss) << where;
    seg_->data()[where] ^= 0x40;
    EXPECT_TRUE(ReadSlot(*seg_).ok());
  }
}

// FindCompleteSlot / FindNewestCompleteSlot / PeekSlot: the one way every
// component asks which of a rank's two slots holds a step.
class FindSlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto layout = ComputeSlotLayout("job", 1, SampleTensors(), 1024);
    ASSERT_TRUE(layout.ok());
    layout_ = *layout;
    for (int s = 0; s < kSlotsPerRank; ++s) {
      path_[s] = dir_.path() + "/rank1.slot" + std::to_string(s);
      auto seg = Segment::CreateOrGrow(path_[s], layout_.total_bytes);
      ASSERT_TRUE(seg.ok()) << seg.status();
      seg_[s] = std::move(*seg);
      slots_[s] = seg_[s].get();
    }
  }
  void Write(int s, int64_t step) { WriteSlot(*seg_[s], layout_, s, step, rng_); }

  testing::ShmScratchDir dir_;
  SlotLayout layout_;
  std::string path_[kSlotsPerRank];
  std::unique_ptr<Segment> seg_[kSlotsPerRank];
  RankSlots slots_{};
  std::mt19937_64 rng_{memento::testing::TestSeed("FindSlotTest")};
};

TEST_F(FindSlotTest, BothSlotsEachStepFindsItsOwn) {
  Write(0, 10);
  Write(1, 11);
  auto a = FindCompleteSlot(slots_, 10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->slot, 0);
  EXPECT_EQ(a->info.step, 10);
  EXPECT_EQ(a->info.state, SlotState::kComplete);
  auto b = FindCompleteSlot(slots_, 11);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->slot, 1);
  auto newest = FindNewestCompleteSlot(slots_);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->slot, 1);
  EXPECT_EQ(newest->info.step, 11);
  // The newest in slot 0 this time.
  Write(0, 12);
  newest = FindNewestCompleteSlot(slots_);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->slot, 0);
  EXPECT_EQ(newest->info.step, 12);
}

TEST_F(FindSlotTest, WrongOrOlderStepIsNotFound) {
  Write(0, 10);
  Write(1, 11);
  for (int64_t step : {int64_t{9}, int64_t{12}, int64_t{-1}}) {
    auto r = FindCompleteSlot(slots_, step);
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << step;
    EXPECT_NE(r.status().message().find("step " + std::to_string(step)), std::string::npos)
        << r.status();
  }
  // Step 10 overwritten by 12: the older step is gone.
  Write(0, 12);
  auto gone = FindCompleteSlot(slots_, 10);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("complete step 12"), std::string::npos) << gone.status();
}

TEST_F(FindSlotTest, TornSlotNeverCounts) {
  Write(0, 10);
  // A write of step 11 into slot 1 that never completed (a crash).
  BeginSlotWrite(*seg_[1], layout_, 1, 11);
  auto r = FindCompleteSlot(slots_, 11);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("writing step 11"), std::string::npos) << r.status();
  auto newest = FindNewestCompleteSlot(slots_);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->info.step, 10);
  EXPECT_EQ(PeekSlot(*seg_[1]).state, SlotState::kWriting);
  EXPECT_EQ(PeekSlot(*seg_[1]).step, 11);
  // Both torn: no complete step at all.
  BeginSlotWrite(*seg_[0], layout_, 0, 12);
  EXPECT_EQ(FindNewestCompleteSlot(slots_).status().code(), StatusCode::kNotFound);
}

TEST_F(FindSlotTest, CorruptHeaderOrAbsentSlotNeverCounts) {
  Write(0, 10);
  Write(1, 11);
  seg_[1]->data()[layout_.manifest_offset + 3] ^= 0x40;  // manifest checksum fails
  auto r = FindCompleteSlot(slots_, 11);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status();
  auto newest = FindNewestCompleteSlot(slots_);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->info.step, 10);
  RankSlots only_one{nullptr, slots_[1]};
  EXPECT_EQ(FindCompleteSlot(only_one, 10).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(FindNewestCompleteSlot(RankSlots{}).status().code(), StatusCode::kNotFound);
}

TEST_F(FindSlotTest, PeekFileAgreesWithTheMapping) {
  Write(0, 10);
  BeginSlotWrite(*seg_[1], layout_, 1, 11);
  for (int s = 0; s < kSlotsPerRank; ++s) {
    const SlotPeek mapped = PeekSlot(*seg_[s]);
    const SlotPeek file = PeekSlotFile(path_[s]);
    EXPECT_EQ(file.state, mapped.state) << s;
    EXPECT_EQ(file.step, mapped.step) << s;
    EXPECT_EQ(file.generation, mapped.generation) << s;
  }
  EXPECT_EQ(PeekSlotFile(path_[0]).state, SlotState::kComplete);
  EXPECT_EQ(PeekSlotFile(path_[0]).step, 10);
  const SlotPeek missing = PeekSlotFile(dir_.path() + "/rank9.slot0");
  EXPECT_EQ(missing.state, SlotState::kEmpty);
  EXPECT_EQ(missing.step, -1);
}

// ---- Range entries (sharded slots, docs/reft.md section 2) and FindRange ----

// "w" (8400 bytes) as two adjacent ranges and a disjoint third, "adam.m" whole.
std::vector<SlotEntrySpec> RangeEntries() {
  auto t = SampleTensors();
  return {SlotEntrySpec{t[0], 1000, 3000}, SlotEntrySpec{t[1]}, SlotEntrySpec{t[0], 4000, 640},
          SlotEntrySpec{t[0], 8000, 400}};
}

TEST(SlotRangeTest, LayoutChunksEveryRangeAndRoundTrips) {
  auto layout = ComputeRangeSlotLayout("job", 1, RangeEntries(), 1024);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors.size(), 4u);
  EXPECT_FALSE(layout->tensors[0].whole());
  EXPECT_EQ(layout->tensors[0].range_offset, 1000u);
  EXPECT_EQ(layout->tensors[0].nbytes, 3000u);
  EXPECT_TRUE(layout->tensors[1].whole());
  EXPECT_TRUE(HasRangeEntries(layout->tensors));
  uint64_t chunked = 0;
  for (const ChunkEntry& c : layout->chunks) chunked += c.length;
  EXPECT_EQ(chunked, 3000u + 10u + 640u + 400u);  // every byte in some chunk
  for (const SavedTensor& t : layout->tensors) EXPECT_EQ(t.offset % kTensorAlignment, 0u);
  EXPECT_NE(layout->manifest.find("\"format\":2"), std::string::npos) << layout->manifest;
  EXPECT_NE(layout->manifest.find("\"range\""), std::string::npos);
  auto parsed = ParseManifest(layout->manifest);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (size_t i = 0; i < parsed->size(); ++i) {
    EXPECT_EQ((*parsed)[i].meta, layout->tensors[i].meta);
    EXPECT_EQ((*parsed)[i].offset, layout->tensors[i].offset);
    EXPECT_EQ((*parsed)[i].nbytes, layout->tensors[i].nbytes);
    EXPECT_EQ((*parsed)[i].range_offset, layout->tensors[i].range_offset);
  }
  // Whole-only manifests stay format 1 without "range" (what older builds
  // wrote and read).
  auto t = SampleTensors();
  auto whole = ComputeRangeSlotLayout("job", 1, {SlotEntrySpec{t[0]}, SlotEntrySpec{t[2]}}, 1024);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->tensors[0].whole());
  EXPECT_FALSE(HasRangeEntries(whole->tensors));
  EXPECT_NE(whole->manifest.find("\"format\":1"), std::string::npos);
  EXPECT_EQ(whole->manifest.find("range"), std::string::npos);
  EXPECT_EQ(whole->manifest, ComputeSlotLayout("job", 1, {t[0], t[2]}, 1024)->manifest);
  // A plan range that happens to be a whole tensor holds the whole tensor
  // and stays a range: a slot of such pieces (a rank whose pieces are whole
  // tensors but not all of its state) must read as a slot of pieces, or a
  // restore would take it for the rank's whole state
  // (agent_sharded_exhaustive_test, two DP ranks on one node).
  auto piece =
      ComputeRangeSlotLayout("job", 1, {SlotEntrySpec{t[0], 0, 8400}, SlotEntrySpec{t[2]}}, 1024);
  ASSERT_TRUE(piece.ok()) << piece.status();
  EXPECT_TRUE(piece->tensors[0].whole());
  EXPECT_TRUE(piece->tensors[0].ranged);
  EXPECT_FALSE(piece->tensors[1].ranged);
  EXPECT_TRUE(HasRangeEntries(piece->tensors));
  EXPECT_NE(piece->manifest.find("\"format\":2"), std::string::npos) << piece->manifest;
  auto reparsed = ParseManifest(piece->manifest);
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_TRUE((*reparsed)[0].ranged);
  EXPECT_FALSE((*reparsed)[1].ranged);
  EXPECT_TRUE(HasRangeEntries(*reparsed));
}

TEST(SlotRangeTest, BadRangesAreRefusedNamingThem) {
  auto t = SampleTensors();
  auto code = [](std::vector<SlotEntrySpec> e) {
    return ComputeRangeSlotLayout("job", 0, e, 1024).status();
  };
  Status st = code({SlotEntrySpec{t[0], 0, 4000}, SlotEntrySpec{t[0], 3936, 64}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w' bytes [0, 4000) and 'w' bytes [3936, 4000) overlap"),
            std::string::npos)
      << st;
  EXPECT_EQ(code({SlotEntrySpec{t[0]}, SlotEntrySpec{t[0], 64, 64}}).code(),
            StatusCode::kInvalidArgument);
  st = code({SlotEntrySpec{t[0], 8000, 401}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w' (8400 bytes): range [8000, +401)"), std::string::npos) << st;
  EXPECT_EQ(code({SlotEntrySpec{t[0], 64, 0}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({SlotEntrySpec{t[0], 64, kWholeTensor}}).code(), StatusCode::kInvalidArgument);
  TensorMeta other = t[0];
  other.shape = {300, 8};
  st = code({SlotEntrySpec{t[0], 0, 64}, SlotEntrySpec{other, 64, 64}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("entries of tensor 'w' disagree"), std::string::npos) << st;
  // A manifest whose range length contradicts its byte count is not read.
  std::string m = ComputeRangeSlotLayout("job", 0, RangeEntries(), 1024)->manifest;
  const size_t at = m.find("\"length\":3000");
  ASSERT_NE(at, std::string::npos);
  m.replace(at, 13, "\"length\":2999");
  EXPECT_EQ(ParseManifest(m).status().code(), StatusCode::kDataLoss);
}

TEST(SlotRangeTest, FindRangeMapsTensorBytesToRuns) {
  auto layout = ComputeRangeSlotLayout("job", 1, RangeEntries(), 1024);
  ASSERT_TRUE(layout.ok());
  const auto& e = layout->tensors;
  // Inside one entry.
  auto r = FindRange(e, "w", 1500, 100);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].entry, 0u);
  EXPECT_EQ((*r)[0].data_offset, e[0].offset + 500);
  EXPECT_EQ((*r)[0].length, 100u);
  // Across the two adjacent entries [1000, 4000) and [4000, 4640): two runs.
  r = FindRange(e, "w", 3990, 20);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].entry, 0u);
  EXPECT_EQ((*r)[0].data_offset, e[0].offset + 2990);
  EXPECT_EQ((*r)[0].length, 10u);
  EXPECT_EQ((*r)[1].entry, 2u);
  EXPECT_EQ((*r)[1].data_offset, e[2].offset);
  EXPECT_EQ((*r)[1].length, 10u);
  // A whole tensor.
  r = FindRange(e, "adam.m", 0, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].entry, 1u);
  EXPECT_EQ((*r)[0].data_offset, e[1].offset);
  EXPECT_TRUE(FindRange(e, "w", 5000, 0)->empty());
  // The gap [4640, 8000), bytes before the first entry, past the tensor, an
  // unknown tensor: NotFound naming the tensor, the range and what is held.
  for (auto [off, len] : {std::pair<uint64_t, uint64_t>{4600, 100}, {900, 200}, {8300, 200}}) {
    r = FindRange(e, "w", off, len);
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << off;
    EXPECT_NE(r.status().message().find(fmt::format("bytes [{}, +{}) of tensor 'w'", off, len)),
              std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find("[1000, 4000), [4000, 4640), [8000, 8400)"),
              std::string::npos)
        << r.status();
  }
  r = FindRange(e, "nope", 0, 1);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("'nope'"), std::string::npos) << r.status();
  EXPECT_EQ(FindRange(e, "w", ~uint64_t{0} - 4, 100).status().code(), StatusCode::kNotFound);
  // A v1 (whole) slot answers the same question.
  auto v1 = ComputeSlotLayout("job", 1, SampleTensors(), 1024);
  r = FindRange(v1->tensors, "w", 3990, 20);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].data_offset, v1->tensors[0].offset + 3990);
}

TEST(SlotRangeTest, RangeSlotWritesReadsVerifiesAndNamesTheRange) {
  testing::ShmScratchDir dir;
  auto layout = ComputeRangeSlotLayout("job", 1, RangeEntries(), 1024);
  ASSERT_TRUE(layout.ok());
  auto seg = Segment::CreateOrGrow(dir.path() + "/rank1.slot0", layout->total_bytes);
  ASSERT_TRUE(seg.ok()) << seg.status();
  std::mt19937_64 rng(memento::testing::TestSeed("SlotRangeTest.Write"));
  WriteSlot(**seg, *layout, 0, 4, rng);
  auto info = ReadSlot(**seg);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->tensors.size(), 4u);
  EXPECT_EQ(info->tensors[3].range_offset, 8000u);
  EXPECT_TRUE(VerifySlotData(**seg, *info).ok());
  auto r = FindRange(*info, "w", 8100, 8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].data_offset, layout->tensors[3].offset + 100);
  (*seg)->data()[info->data_offset + (*r)[0].data_offset] ^= 0x20;
  Status st = VerifySlotData(**seg, *info);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("of tensor 'w' bytes [8000, 8400)"), std::string::npos) << st;
  // A manifest with overlapping entries (a writer bug) is not accepted.
  SlotLayout bad = *layout;
  bad.tensors[2].range_offset = 3990;
  bad.manifest = EncodeManifest(bad.tensors);
  ASSERT_LE(bad.manifest.size(), layout->table_offset - layout->manifest_offset);
  WriteSlot(**seg, bad, 0, 5, rng);
  auto refused = ReadSlot(**seg);
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("overlap"), std::string::npos) << refused.status();
}

// Parity entries (docs/reft.md section 4): a slot of ranges plus the parity
// its client computed. Format 3 only when present; never a tensor's bytes.
TEST(SlotRangeTest, ParityEntriesAreChecksummedAndNeverTensors) {
  std::vector<SlotEntrySpec> specs = RangeEntries();
  SlotEntrySpec parity;
  parity.meta = ParityEntryMeta(5, 2500);
  parity.parity = 5;
  specs.push_back(parity);
  auto layout = ComputeRangeSlotLayout("job", 1, specs, 1024);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors.size(), 5u);
  const SavedTensor& pe = layout->tensors[4];
  EXPECT_TRUE(pe.is_parity());
  EXPECT_EQ(pe.nbytes, 2500u);
  EXPECT_EQ(FindParityEntry(layout->tensors, 5), 4);
  EXPECT_EQ(FindParityEntry(layout->tensors, 6), -1);
  uint64_t parity_chunked = 0;
  for (const ChunkEntry& c : layout->chunks) {
    if (c.tensor_index == 4) parity_chunked += c.length;
  }
  EXPECT_EQ(parity_chunked, 2500u);  // every parity byte in a checksummed chunk
  EXPECT_NE(layout->manifest.find("\"format\":3"), std::string::npos) << layout->manifest;
  EXPECT_NE(layout->manifest.find("\"parity\":{\"id\":5}"), std::string::npos);
  // Range-only manifests keep format 2 and no "parity".
  auto ranges_only = ComputeRangeSlotLayout("job", 1, RangeEntries(), 1024);
  EXPECT_EQ(ranges_only->manifest.find("parity"), std::string::npos);
  // Written, read back, verified; a flipped parity byte is named.
  testing::ShmScratchDir dir;
  auto seg = Segment::CreateOrGrow(dir.path() + "/rank1.slot0", layout->total_bytes);
  ASSERT_TRUE(seg.ok()) << seg.status();
  std::mt19937_64 rng(memento::testing::TestSeed("SlotRangeTest.Parity"));
  WriteSlot(**seg, *layout, 0, 4, rng);
  auto info = ReadSlot(**seg);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->tensors.size(), 5u);
  EXPECT_EQ(info->tensors[4].parity, 5u);
  EXPECT_EQ(FindParityEntry(info->tensors, 5), 4);
  EXPECT_TRUE(HasRangeEntries(info->tensors));
  EXPECT_TRUE(VerifySlotData(**seg, *info).ok());
  // Not a tensor: FindRange does not see it, nor DiffTensors.
  EXPECT_EQ(FindRange(*info, ParityEntryName(5), 0, 1).status().code(), StatusCode::kNotFound);
  auto t = SampleTensors();
  EXPECT_TRUE(DiffTensors(info->tensors, {t[0], t[1]}).empty());
  (*seg)->data()[info->data_offset + info->tensors[4].offset + 2000] ^= 1;
  Status st = VerifySlotData(**seg, *info);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("parity 5"), std::string::npos) << st;
  // A parity entry must be whole and given once.
  SlotEntrySpec twice = parity;
  specs.push_back(twice);
  Status dup = ComputeRangeSlotLayout("job", 1, specs, 1024).status();
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("parity 5 has two entries"), std::string::npos) << dup;
  SlotEntrySpec part = parity;
  part.offset = 64;
  part.length = 64;
  Status partial = ComputeRangeSlotLayout("job", 1, {part}, 1024).status();
  EXPECT_EQ(partial.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(partial.message().find("parity 5"), std::string::npos) << partial;
}

}  // namespace
}  // namespace memento::shm
