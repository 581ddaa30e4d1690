// The agent's durable stream refuses to commit a version whose slot changed
// under the write (issue 7), deterministically, in one process: real shared
// memory slots written with the slot API as a trainer does, a real
// DurableStreamer (tier::Persister) writing to a real directory.
//  - a slot rewritten while its version is being written: no marker, no
//    COMMIT, counted as abandoned_overwritten; the next version lands and
//    restores byte for byte;
//  - a slot whose bytes no longer match its chunk checksums (corrupted after
//    completion, same generation): abandoned_mismatch, nothing committed.
#include <gtest/gtest.h>

#include <cstring>

#include "agent/durable.h"
#include "common/checksum.h"
#include "common/test_util.h"
#include "proc_util.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/shm_test_util.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::agent {
namespace {

using shm::testing::WaitFor;

constexpr int64_t kBytes = 24 << 20;  // 3x the rate limiter's 8 MiB burst

class DurableGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/node0";
    durable_ = disk_.path() + "/durable";
    auto store = shm::NodeStore::Open({root_, "g", 0, 0});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    TensorMeta w{"w", DType::kUInt8, {kBytes}, StateClass::kReplicated};
    TensorMeta rng{"rng", DType::kUInt8, {16}, StateClass::kPrivate};
    auto layout = shm::ComputeSlotLayout("g", 0, {w, rng}, 4 << 20);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *layout;
    auto paths = store_->EnsureSlots(0, layout_.total_bytes);
    ASSERT_TRUE(paths.ok()) << paths.status();
    for (const auto& p : *paths) {
      auto seg = shm::Segment::Open(p, true);
      ASSERT_TRUE(seg.ok()) << seg.status();
      segs_.push_back(std::move(*seg));
    }
  }

  void Start(uint64_t bandwidth) {
    DurableOptions o;
    o.dir = durable_;
    o.every_k_steps = 1;
    o.bandwidth_bytes_per_sec = bandwidth;
    o.keep_last = 10;
    auto d = DurableStreamer::Start(o, "g", 0, root_, store_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    streamer_ = std::move(*d);
  }

  // Writes step's deterministic bytes into `slot` as the client does.
  void WriteSlot(int slot, int64_t step, bool complete = true) {
    const shm::Segment& seg = *segs_[slot];
    shm::BeginSlotWrite(seg, layout_, slot, step);
    uint8_t* data = shm::SlotData(seg);
    shm::ChunkEntry* table = shm::SlotTable(seg);
    for (size_t i = 0; i < layout_.chunks.size(); ++i) {
      uint64_t* words = reinterpret_cast<uint64_t*>(data + table[i].offset);
      for (uint64_t k = 0; k < table[i].length / 8; ++k) {
        words[k] = (table[i].offset / 8 + k) * 0x9e3779b97f4a7c15ULL + step;
      }
      for (uint64_t k = table[i].length / 8 * 8; k < table[i].length; ++k) {
        data[table[i].offset + k] = static_cast<uint8_t>(step + k);
      }
      table[i].checksum = Checksum(data + table[i].offset, table[i].length);
    }
    if (complete) shm::CompleteSlotWrite(seg);
  }

  std::string VersionDir(int64_t step) {
    char name[64];
    std::snprintf(name, sizeof(name), "/version-%020lld", static_cast<long long>(step));
    return durable_ + name;
  }

  // Restores version `step` and compares it with slot `slot`'s bytes.
  void ExpectRestoresSlot(int64_t step, int slot) {
    std::vector<uint8_t> w(kBytes), rng(16);
    std::vector<tier::RestoreTarget> targets = {
        {TensorMeta{"w", DType::kUInt8, {kBytes}, StateClass::kReplicated}, w.data()},
        {TensorMeta{"rank0/rng", DType::kUInt8, {16}, StateClass::kPrivate}, rng.data()}};
    auto r = tier::Restore(tier::Env::Default(), durable_, step, targets);
    ASSERT_TRUE(r.ok()) << r.status();
    const uint8_t* data = shm::SlotData(*segs_[slot]);
    EXPECT_EQ(std::memcmp(w.data(), data + layout_.tensors[0].offset, kBytes), 0);
    EXPECT_EQ(std::memcmp(rng.data(), data + layout_.tensors[1].offset, 16), 0);
  }

  shm::testing::ShmScratchDir dir_;
  memento::testing::ScratchDir disk_{"memento-durable-guard"};
  std::string root_, durable_;
  std::unique_ptr<shm::NodeStore> store_;
  shm::SlotLayout layout_;
  std::vector<std::unique_ptr<shm::Segment>> segs_;
  std::unique_ptr<DurableStreamer> streamer_;
};

TEST_F(DurableGuardTest, SlotRewrittenDuringTheWriteIsNeverCommitted) {
  // 24 MiB at 4 MiB/s after an 8 MiB burst: the write lasts about 4 s.
  Start(4 << 20);
  WriteSlot(0, 2);
  streamer_->OnComplete(0, 2);
  const std::string data_file = VersionDir(2) + "/node-00000.safetensors";
  ASSERT_TRUE(WaitFor([&] { return access(data_file.c_str(), F_OK) == 0; }, 30))
      << "the write of version 2 never started";
  // The trainer starts step 4 in the slot that holds 2, while 2 is written.
  WriteSlot(0, 4, /*complete=*/false);
  streamer_->SetBandwidth(0);
  ASSERT_TRUE(streamer_->WaitIdle(Deadline::AfterSeconds(60)));
  DurableStats s = streamer_->stats();
  EXPECT_EQ(s.abandoned_overwritten, 1);
  EXPECT_EQ(s.persister.persisted, 0);
  EXPECT_FALSE(tier::LatestCompleteVersion(tier::Env::Default(), durable_).ok());
  EXPECT_NE(access((VersionDir(2) + "/node-00000.done").c_str(), F_OK), 0)
      << "the marker of a torn version was published";
  EXPECT_NE(access((VersionDir(2) + "/COMMIT").c_str(), F_OK), 0);

  // Step 4 completes and lands whole.
  WriteSlot(0, 4);
  streamer_->OnComplete(0, 4);
  ASSERT_TRUE(streamer_->WaitIdle(Deadline::AfterSeconds(60)));
  auto latest = tier::LatestCompleteVersion(tier::Env::Default(), durable_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 4);
  auto report = tier::Verify(tier::Env::Default(), durable_, std::nullopt);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());
  ExpectRestoresSlot(4, 0);
  EXPECT_EQ(streamer_->stats().persister.persisted, 1);
}

TEST_F(DurableGuardTest, BytesThatNoLongerMatchTheirChecksumsAreNeverCommitted) {
  Start(0);
  WriteSlot(1, 7);
  // A stray write after completion: same generation, wrong bytes.
  shm::SlotData(*segs_[1])[layout_.tensors[0].offset + 12345] ^= 0x40;
  streamer_->OnComplete(0, 7);
  ASSERT_TRUE(streamer_->WaitIdle(Deadline::AfterSeconds(60)));
  DurableStats s = streamer_->stats();
  EXPECT_EQ(s.abandoned_mismatch, 1);  // and not retried: the slot is known bad
  for (const auto& slot : store_->Inventory(0)) {
    if (slot.slot == 1) {
      EXPECT_TRUE(slot.verified && !slot.intact) << "the node store was not told";
    }
  }
  EXPECT_EQ(s.persister.persisted, 0);
  EXPECT_FALSE(tier::LatestCompleteVersion(tier::Env::Default(), durable_).ok());
}

TEST_F(DurableGuardTest, OnlyVersionsEveryRankCompletedAreOffered) {
  Start(0);
  // A second rank is sealed: version 3 is committed only once both report it.
  ASSERT_TRUE(store_->EnsureSlots(1, layout_.total_bytes).ok());
  WriteSlot(0, 3);
  streamer_->OnComplete(0, 3);
  EXPECT_EQ(streamer_->stats().committed, 0);
  EXPECT_EQ(streamer_->stats().offered, 0);
  // Rank 1 reports 3 but its slot does not hold it: the version is gone.
  streamer_->OnComplete(1, 3);
  EXPECT_EQ(streamer_->stats().committed, 1);
  ASSERT_TRUE(streamer_->WaitIdle(Deadline::AfterSeconds(60)));
  EXPECT_EQ(streamer_->stats().gone, 1);
  EXPECT_FALSE(tier::LatestCompleteVersion(tier::Env::Default(), durable_).ok());
}

// The durable hold's agent side (shm/commit_word.h): while a version is
// written its step is held in <root>/durable.word, and released after; a rank
// that had claimed the slot before the hold was published (it is overwriting
// it) makes the agent abandon the version before reading a byte.
TEST_F(DurableGuardTest, HoldIsPublishedWhileWritingAndAClaimAbandons) {
  Start(4 << 20);  // 24 MiB at 4 MiB/s after the burst: seconds per version
  auto word_seg = shm::Segment::Open(shm::DurableWordPath(root_), /*writable=*/true);
  ASSERT_TRUE(word_seg.ok()) << word_seg.status();
  auto* word = reinterpret_cast<shm::CommitWord*>((*word_seg)->data());
  ASSERT_TRUE(shm::CommitWordValid(word));
  EXPECT_EQ(shm::LoadDurableHold(word, shm::MonotonicNanos()), -1);

  WriteSlot(0, 2);
  streamer_->OnComplete(0, 2);
  ASSERT_TRUE(WaitFor([&] { return streamer_->stats().holds == 1; }, 30));
  EXPECT_EQ(shm::LoadDurableHold(word, shm::MonotonicNanos()), 2) << "held while written";
  streamer_->SetBandwidth(0);
  ASSERT_TRUE(streamer_->WaitIdle(Deadline::AfterSeconds(60)));
  EXPECT_EQ(shm::LoadDurableHold(word, shm::MonotonicNanos()), -1) << "released after";
  EXPECT_EQ(streamer_->stats().persister.persisted, 1);
  ExpectRestoresSlot(2, 0);

  // Rank 0 claims step 3 (it is about to overwrite it) before the agent
  // holds it: the agent must not persist it.
  WriteSlot(1, 3);
  shm::StoreWord(&word->claim[0], 3);
  streamer_->OnComplete(0, 3);
  ASSERT_TRUE(streamer_->WaitIdle(Deadline::AfterSeconds(60)));
  DurableStats s = streamer_->stats();
  EXPECT_EQ(s.abandoned_claimed, 1);
  EXPECT_EQ(s.persister.persisted, 1);
  EXPECT_FALSE(tier::LoadIndex(tier::Env::Default(), durable_, 3).ok());
  EXPECT_EQ(shm::LoadDurableHold(word, shm::MonotonicNanos()), -1);
}

}  // namespace
}  // namespace memento::agent
