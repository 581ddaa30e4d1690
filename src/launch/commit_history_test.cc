// CommitHistory::WatchCommits (`memento launch --coordinate-commits`, docs/launch.md
// "Who recovers"): the launcher's commit history follows commit/latest, written
// here by PublishCommit into a real in-memory store, as the agents' coordinator
// and a recovery's StartCommitEpoch write it.
#include "launch/commit_history.h"

#include <unistd.h>

#include "common/clock.h"
#include "coord/commit.h"
#include "coord/keys.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"

namespace memento::launch {
namespace {

constexpr const char* kJob = "histjob";

Deadline Soon() { return Deadline::AfterSeconds(10); }

void Publish(coord::Store& store, int64_t step, uint64_t epoch) {
  auto moved = coord::PublishCommit(store, kJob, step, WallNanos(), Soon(), epoch);
  ASSERT_TRUE(moved.ok()) << moved.status();
}

// Waits until the history counted `count` commits (the watcher's thread).
CommitHistorySummary WaitCount(CommitHistory& h, int64_t count) {
  CommitHistorySummary s;
  for (Deadline d = Deadline::AfterSeconds(10); !d.expired(); usleep(5000)) {
    s = h.Summary();
    if (s.count >= count) break;
  }
  return s;
}

TEST(CommitHistoryWatchCommits, RecordsTheTrainersCommitsNotAnEpochsFirst) {
  coord::MemoryStore store;
  CommitHistory h;
  h.WatchCommits(&store, kJob);
  for (int64_t s : {1, 2, 4}) ASSERT_NO_FATAL_FAILURE(Publish(store, s, 0));
  CommitHistorySummary s = WaitCount(h, 3);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.first, 1);
  EXPECT_EQ(s.last, 4);
  // The passed-over step 3 is not known from commit/latest.
  EXPECT_TRUE(s.uncommitted.empty());

  // A recovery restores step 2 in epoch 1 (the epoch's first commit), then
  // the trainers of the next attempt commit 3 and 4 again.
  h.SetAttempt(1);
  ASSERT_NO_FATAL_FAILURE(Publish(store, 2, 1));
  // A republished (or older) commit/latest is not counted again.
  ASSERT_TRUE(store.Set(coord::JobKeys(kJob).CommitLatest(), "2@1", Soon()).ok());
  ASSERT_NO_FATAL_FAILURE(Publish(store, 3, 1));
  ASSERT_NO_FATAL_FAILURE(Publish(store, 4, 1));
  s = WaitCount(h, 5);
  EXPECT_EQ(s.count, 5);
  ASSERT_EQ(s.by_attempt.size(), 2u);
  EXPECT_EQ(s.by_attempt[0], (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(s.by_attempt[1], (std::vector<int64_t>{3, 4}));
  h.WatchCommits(nullptr, kJob);
  EXPECT_EQ(h.Summary().coordinator, "launcher");  // the launcher sets it at the end
}

// Skip records are keyed by (epoch, step): after a recovery that rolled back
// to step 10 in epoch 1, the new history's step 12 is another step than the
// abandoned history's step 12. A skip of the old one explains nothing about
// the new one, and the summary names both apart.
TEST(CommitHistorySkips, ASkipExplainsAPassOverOfItsOwnEpochOnly) {
  CommitHistory h;
  // Epoch 0: node1 skipped step 12; the commit of 13 passed it over.
  h.OnSkip(12, "node1", "rank 1 skipped its snapshot", 0);
  h.OnCommit(13, {12}, 0);
  CommitHistorySummary s = h.Summary();
  EXPECT_TRUE(s.uncommitted.empty()) << s.ToString();
  // A recovery restores step 10 in epoch 1; the new history's commit of 13
  // passes over its own step 12, which no node of epoch 1 skipped.
  h.SetAttempt(1);
  h.OnCommit(11, {}, 1);
  h.OnCommit(13, {12}, 1);
  s = h.Summary();
  ASSERT_EQ(s.uncommitted.size(), 1u) << s.ToString();
  EXPECT_EQ(s.uncommitted[0], (coord::CommitId{1, 12}));
  EXPECT_NE(s.ToString().find("NEVER COMMITTED (reported, not skipped): 1 12@1"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.ToString().find("skipped 1 step(s): 12 (node1)"), std::string::npos) << s.ToString();
  // A skip of epoch 1's step 12 explains it; the summary lists both steps.
  h.OnSkip(12, "node2", "rank 2 skipped its snapshot", 1);
  s = h.Summary();
  EXPECT_TRUE(s.uncommitted.empty()) << s.ToString();
  ASSERT_EQ(s.skipped.size(), 2u);
  EXPECT_EQ(s.skipped[0].id, (coord::CommitId{0, 12}));
  EXPECT_EQ(s.skipped[0].node, "node1");
  EXPECT_EQ(s.skipped[1].id, (coord::CommitId{1, 12}));
  EXPECT_EQ(s.skipped[1].node, "node2");
  EXPECT_EQ(s.skipped[1].reason, "rank 2 skipped its snapshot");
  EXPECT_NE(s.ToString().find("skipped 2 step(s): 12 (node1), 12@1 (node2)"), std::string::npos)
      << s.ToString();
  const nlohmann::json j = s.ToJson();
  ASSERT_EQ(j["skipped"].size(), 2u) << j.dump();
  EXPECT_EQ(j["skipped"][1]["epoch"], 1) << j.dump();
  EXPECT_EQ(j["skipped"][1]["step"], 12) << j.dump();
  // A step passed over in epoch 0 and committed in epoch 1 is not listed.
  h.OnSkip(14, "node1", "", 0);
  h.OnCommit(16, {15}, 0);  // a late callback of the abandoned history
  EXPECT_EQ(h.Summary().uncommitted.size(), 1u);
  h.OnCommit(15, {}, 1);
  EXPECT_TRUE(h.Summary().uncommitted.empty()) << h.Summary().ToString();
}

// WatchSkips reads the epoch from the record's key (coord::JobKeys::Skipped:
// no suffix in epoch 0, @<epoch> after), a republished record without its
// reason keeps the reason first seen, and a key that does not parse is
// ignored.
TEST(CommitHistorySkips, WatchSkipsReadsTheEpochFromTheKey) {
  coord::MemoryStore store;
  coord::JobKeys keys(kJob);
  CommitHistory h;
  h.WatchSkips(&store, kJob);
  ASSERT_TRUE(store.Set(keys.Skipped(7, "node0"), "why 0", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.SkippedPrefix() + "7/node0", "malformed", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Skipped(7, "node0", 2), "why 2", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Skipped(7, "node0", 2), "", Soon()).ok());
  ASSERT_TRUE(store.Set(keys.Skipped(8, "node3", 2), "last", Soon()).ok());
  CommitHistorySummary s;
  for (Deadline d = Deadline::AfterSeconds(10); !d.expired(); usleep(5000)) {
    s = h.Summary();
    if (s.skipped.size() >= 3) break;
  }
  h.WatchSkips(nullptr, kJob);
  ASSERT_EQ(s.skipped.size(), 3u) << s.ToString();
  EXPECT_EQ(s.skipped[0].id, (coord::CommitId{0, 7}));
  EXPECT_EQ(s.skipped[0].reason, "why 0");
  EXPECT_EQ(s.skipped[1].id, (coord::CommitId{2, 7}));
  EXPECT_EQ(s.skipped[1].reason, "why 2");
  EXPECT_EQ(s.skipped[2].id, (coord::CommitId{2, 8}));
  EXPECT_EQ(s.skipped[2].node, "node3");
}

}  // namespace
}  // namespace memento::launch
