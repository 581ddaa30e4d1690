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

}  // namespace
}  // namespace memento::launch
