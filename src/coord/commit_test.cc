// CommitTracker (pure rule, including a randomised check against a reference
// model), CommitLog (durability, torn tails) and the coordinator/follower
// pair on a MemoryStore.
#include "coord/commit.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "common/test_util.h"
#include "coord/memory_store.h"

namespace memento::coord {
namespace {

Deadline Soon() { return Deadline::AfterSeconds(10); }

TEST(CommitTrackerTest, CommitsOnlyWhenEveryMemberReported) {
  CommitTracker t({"a", "b", "c"});
  EXPECT_EQ(t.committed(), -1);
  EXPECT_FALSE(t.OnCompleted(1, "a"));
  EXPECT_FALSE(t.OnCompleted(1, "b"));
  EXPECT_FALSE(t.OnCompleted(1, "b"));  // duplicates do not count twice
  EXPECT_EQ(t.Missing(1), std::set<std::string>{"c"});
  EXPECT_EQ(t.OnCompleted(1, "c"), 1);
  EXPECT_EQ(t.committed(), 1);
  // Late or repeated reports of committed steps change nothing.
  EXPECT_FALSE(t.OnCompleted(1, "a"));
  EXPECT_FALSE(t.OnCompleted(0, "a"));
  EXPECT_EQ(t.committed(), 1);
}

TEST(CommitTrackerTest, NewerStepSupersedesOlderPendingOne) {
  CommitTracker t({"a", "b"});
  EXPECT_FALSE(t.OnCompleted(1, "a"));
  EXPECT_FALSE(t.OnCompleted(2, "a"));
  EXPECT_EQ(t.OnCompleted(2, "b"), 2);
  EXPECT_TRUE(t.PendingSteps().empty());                   // step 1 dropped with the commit of 2
  EXPECT_EQ(t.TakeSuperseded(), std::vector<int64_t>{1});  // and said so, once
  EXPECT_TRUE(t.TakeSuperseded().empty());
  EXPECT_FALSE(t.OnCompleted(1, "b"));  // and can never commit now
  EXPECT_EQ(t.committed(), 2);
  // Steps committed in order pass nothing over.
  EXPECT_EQ(t.OnCompleted(3, "a"), std::nullopt);
  EXPECT_EQ(t.OnCompleted(3, "b"), 3);
  EXPECT_TRUE(t.TakeSuperseded().empty());
}

TEST(CommitTrackerTest, MembershipChanges) {
  CommitTracker t({"a", "b", "c"});
  EXPECT_FALSE(t.OnCompleted(5, "a"));
  EXPECT_FALSE(t.OnCompleted(5, "x"));  // not a member (yet)
  EXPECT_FALSE(t.OnCompleted(5, "b"));
  // c is lost; the recovery path replaces it by x, which already reported.
  EXPECT_EQ(t.SetMembers({"a", "b", "x"}), 5);
  EXPECT_FALSE(t.SetMembers({}));
  EXPECT_FALSE(t.OnCompleted(6, "a"));  // empty member set never commits
  t.ObserveCommitted(10);
  EXPECT_EQ(t.committed(), 10);
  t.ObserveCommitted(7);  // monotonic
  EXPECT_EQ(t.committed(), 10);
}

TEST(CommitTrackerTest, RandomReportsMatchReferenceModel) {
  uint64_t seed = testing::TestSeed("RandomReportsMatchReferenceModel");
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 200; ++round) {
    int n = 1 + static_cast<int>(rng() % 5);
    std::set<std::string> members;
    for (int i = 0; i < n; ++i) members.insert("n" + std::to_string(i));
    CommitTracker t(members);
    std::map<int64_t, std::set<std::string>> all;  // every report ever made
    int64_t last = -1;
    for (int i = 0; i < 60; ++i) {
      int64_t step = static_cast<int64_t>(rng() % 12);
      std::string node = "n" + std::to_string(rng() % (n + 1));  // sometimes a non-member
      all[step].insert(node);
      auto c = t.OnCompleted(step, node);
      // Reference: the highest step every member has reported, ever.
      int64_t want = -1;
      for (const auto& [s, got] : all) {
        if (std::includes(got.begin(), got.end(), members.begin(), members.end())) want = s;
      }
      ASSERT_EQ(t.committed(), want) << "round " << round << " report " << i;
      ASSERT_GE(t.committed(), last);
      if (c) {
        ASSERT_EQ(*c, want);
        ASSERT_GT(*c, last);
      } else {
        ASSERT_EQ(t.committed(), last);
      }
      last = t.committed();
    }
  }
}

TEST(CommitLogTest, AppendReopenAndMonotonic) {
  testing::ScratchDir dir("commit-log");
  std::string path = dir.path() + "/commits";
  {
    auto log = CommitLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_FALSE((*log)->latest());
    EXPECT_TRUE(*(*log)->Append(3, 100));
    EXPECT_TRUE(*(*log)->Append(7, 200));
    EXPECT_FALSE(*(*log)->Append(7, 300));
    EXPECT_FALSE(*(*log)->Append(5, 300));
  }
  auto log = CommitLog::Open(path);
  ASSERT_TRUE(log.ok());
  auto recs = (*log)->records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].step, 3);
  EXPECT_EQ(recs[1].step, 7);
  EXPECT_EQ(recs[1].wall_ns, 200);
}

TEST(CommitLogTest, TornAndCorruptTailsAreDropped) {
  testing::ScratchDir dir("commit-log");
  std::string path = dir.path() + "/commits";
  {
    auto log = CommitLog::Open(path).value();
    ASSERT_TRUE(log->Append(1, 1).ok());
    ASSERT_TRUE(log->Append(2, 2).ok());
    ASSERT_TRUE(log->Append(3, 3).ok());
  }
  // Flip a byte in the third record (40-byte records) and add half a record
  // after it.
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b;
  ASSERT_EQ(pread(fd, &b, 1, 80 + 10), 1);
  b ^= 0x40;
  ASSERT_EQ(pwrite(fd, &b, 1, 80 + 10), 1);
  ASSERT_EQ(pwrite(fd, "garbage-garbage", 15, 120), 15);
  close(fd);
  auto log = CommitLog::Open(path).value();
  ASSERT_EQ(log->records().size(), 2u);
  EXPECT_EQ(log->latest()->step, 2);
  // Appending continues after the good prefix.
  EXPECT_TRUE(*log->Append(4, 4));
  EXPECT_EQ(CommitLog::Open(path).value()->records().size(), 3u);
}

TEST(CommitLogTest, CompactsLongLogs) {
  testing::ScratchDir dir("commit-log");
  auto log = CommitLog::Open(dir.path() + "/commits", 100).value();
  for (int i = 0; i < 130; ++i) ASSERT_TRUE(log->Append(i, i).ok());
  // Compacted at 101 records to the newest 50, then 29 more.
  EXPECT_EQ(log->records().size(), 79u);
  EXPECT_EQ(log->records().front().step, 51);
  EXPECT_EQ(log->latest()->step, 129);
  auto again = CommitLog::Open(dir.path() + "/commits").value();
  EXPECT_EQ(again->latest()->step, 129);
  EXPECT_EQ(again->records().size(), log->records().size());
}

TEST(CommitStoreTest, PublishIsMonotonic) {
  MemoryStore store;
  EXPECT_EQ(ReadLatestCommit(store, "job", Soon()).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(*PublishCommit(store, "job", 5, 1, Soon()));
  EXPECT_FALSE(*PublishCommit(store, "job", 3, 1, Soon()));
  EXPECT_FALSE(*PublishCommit(store, "job", 5, 1, Soon()));
  EXPECT_EQ(*ReadLatestCommit(store, "job", Soon()), 5);
  EXPECT_TRUE(store.Get(JobKeys("job").Commit(3), Soon()).ok());
}

TEST(CommitStoreTest, CoordinatorAndFollowers) {
  testing::ScratchDir dir("commit");
  MemoryStore store;
  std::atomic<int64_t> coordinator_saw{-1};
  auto coord = CommitCoordinator::Start(
      &store, "job", {"n0", "n1", "n2"}, Soon(),
      [&](const CommitId& id, const std::vector<int64_t>&) { coordinator_saw.store(id.step); });
  ASSERT_TRUE(coord.ok()) << coord.status();
  auto log = CommitLog::Open(dir.path() + "/log").value();
  std::vector<int64_t> seen;
  Mutex mu;
  auto follower = CommitFollower::Start(
      &store, "job", log.get(),
      [&](const CommitId& id) {
        MutexLock l(&mu);
        seen.push_back(id.step);
      },
      Soon());
  ASSERT_TRUE(follower.ok()) << follower.status();

  for (const char* n : {"n0", "n1", "n2"})
    ASSERT_TRUE(ReportCompleted(store, "job", n, 1, Soon()).ok());
  Deadline d = Soon();
  while ((*follower)->last_seen() < 1 && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ((*follower)->last_seen(), 1);
  EXPECT_EQ(log->latest()->step, 1);
  EXPECT_EQ(*ReadLatestCommit(store, "job", Soon()), 1);

  // Step 2: n2 never reports (it died) -> not committed.
  ASSERT_TRUE(ReportCompleted(store, "job", "n0", 2, Soon()).ok());
  ASSERT_TRUE(ReportCompleted(store, "job", "n1", 2, Soon()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ((*coord)->committed(), 1);
  EXPECT_EQ(*ReadLatestCommit(store, "job", Soon()), 1);
  // Reports of step 1 are cleaned up (by the coordinator's cleaner thread);
  // step 2's stay.
  auto reports = store.List(JobKeys("job").CompletedPrefix(), Soon()).value();
  for (d = Soon(); reports.kvs.size() > 2 && !d.expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    reports = store.List(JobKeys("job").CompletedPrefix(), Soon()).value();
  }
  ASSERT_EQ(reports.kvs.size(), 2u);
  // The recovery path replaces n2 by n3, which reports.
  (*coord)->SetMembers({"n0", "n1", "n3"});
  ASSERT_TRUE(ReportCompleted(store, "job", "n3", 2, Soon()).ok());
  d = Soon();
  while ((*follower)->last_seen() < 2 && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ((*follower)->last_seen(), 2);
  // The coordinator calls its callback after publishing, so the follower can
  // see step 2 before the callback has run: wait for it too.
  while (coordinator_saw.load() < 2 && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(coordinator_saw.load(), 2);
  follower->reset();
  MutexLock l(&mu);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
}

TEST(CommitStoreTest, RepublishRefillsAnEmptyStore) {
  testing::ScratchDir dir("commit");
  auto log = CommitLog::Open(dir.path() + "/log").value();
  ASSERT_TRUE(log->Append(41, 1).ok());
  ASSERT_TRUE(log->Append(42, 2).ok());
  MemoryStore fresh;
  ASSERT_TRUE(RepublishCommits(fresh, "job", *log, Soon()).ok());
  EXPECT_EQ(*ReadLatestCommit(fresh, "job", Soon()), 42);
  // A follower that starts on it does not report 42 again to its agent.
  std::atomic<int> calls{0};
  auto f = CommitFollower::Start(
      &fresh, "job", log.get(), [&](const CommitId&) { calls++; }, Soon());
  ASSERT_TRUE(f.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 0);
}

// ---- epochs (docs/coordination.md, "Epochs") ---------------------------------

TEST(CommitEpochTest, CommitIdTextRoundTripsAndOldTextIsEpochZero) {
  EXPECT_EQ(FormatCommitId({0, 7}), "7");
  EXPECT_EQ(FormatCommitId({3, 7}), "7@3");
  EXPECT_EQ(*ParseCommitId("7"), (CommitId{0, 7}));
  EXPECT_EQ(*ParseCommitId("7@3"), (CommitId{3, 7}));
  for (const char* bad : {"", "x", "7@", "@3", "-1", "7@-3", "7@3@4", "7 "}) {
    auto r = ParseCommitId(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << bad;
    EXPECT_NE(r.status().message().find("not <step> or <step>@<epoch>"), std::string::npos) << bad;
  }
  EXPECT_TRUE((CommitId{1, 3}) < (CommitId{2, 0}));
  EXPECT_TRUE((CommitId{2, 0}) < (CommitId{2, 1}));
  EXPECT_EQ(*ParseReportEpoch("123"), 0u);
  EXPECT_EQ(*ParseReportEpoch("123@4"), 4u);
  EXPECT_EQ(ParseReportEpoch("12x").status().code(), StatusCode::kDataLoss);
}

TEST(CommitEpochTest, TrackerCountsReportsOnlyInTheirEpoch) {
  CommitTracker t({"a", "b"}, /*committed=*/10, /*epoch=*/1);
  // The abandoned history's reports (epoch 0) never count.
  EXPECT_EQ(t.OnCompleted(11, "a", 0), std::nullopt);
  EXPECT_EQ(t.OnCompleted(11, "b", 0), std::nullopt);
  // The next epoch restarts at step 4: reports of it that arrive before its
  // first commit wait, then commit.
  EXPECT_EQ(t.OnCompleted(5, "a", 2), std::nullopt);
  EXPECT_EQ(t.OnCompleted(5, "b", 2), std::nullopt);
  EXPECT_EQ(t.ObserveCommitted(CommitId{2, 4}), 5);
  EXPECT_EQ(t.epoch(), 2u);
  EXPECT_EQ(t.committed(), 5);
  // Steps at or below the newest commit of the old epoch commit again.
  EXPECT_EQ(t.OnCompleted(6, "a", 2), std::nullopt);
  EXPECT_EQ(t.OnCompleted(6, "b", 2), 6);
  // An older epoch's commit does not move it back.
  EXPECT_EQ(t.ObserveCommitted(CommitId{1, 12}), std::nullopt);
  EXPECT_EQ(t.committed(), 6);
  EXPECT_EQ(t.epoch(), 2u);
}

TEST(CommitEpochTest, LogKeepsEpochsAndReadsVersion1Records) {
  testing::ScratchDir dir("commit");
  const std::string path = dir.path() + "/log";
  {
    // A version-1 record (older builds): magic, version 1, step 9, time 5,
    // xxHash3 of the 24 bytes before it.
    struct V1 {
      uint32_t magic;
      uint16_t version;
      uint16_t reserved;
      int64_t step;
      int64_t wall_ns;
      uint64_t checksum;
    } r{0x474C434D, 1, 0, 9, 5, 0};
    r.checksum = Checksum(&r, offsetof(V1, checksum));
    FILE* f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fwrite(&r, sizeof(r), 1, f), 1u);
    fclose(f);
  }
  {
    auto log = CommitLog::Open(path).value();
    ASSERT_TRUE(log->latest().has_value());
    EXPECT_EQ(log->latest()->step, 9);
    EXPECT_EQ(log->latest()->epoch, 0u);
    // Epoch 2 restarts at step 4: a lower step, appended.
    EXPECT_TRUE(*log->Append(4, 6, 2));
    EXPECT_FALSE(*log->Append(3, 7, 2));   // lower in the same epoch
    EXPECT_FALSE(*log->Append(20, 7, 1));  // an older epoch
    EXPECT_TRUE(*log->Append(5, 8, 2));
  }
  auto again = CommitLog::Open(path).value();
  auto records = again->records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].step, 9);
  EXPECT_EQ(records[1].step, 4);
  EXPECT_EQ(records[1].epoch, 2u);
  EXPECT_EQ(again->latest()->step, 5);
  EXPECT_EQ(again->latest()->epoch, 2u);
}

TEST(CommitEpochTest, ANewEpochCommitsStepsTheOldHistoryCommitted) {
  testing::ScratchDir dir("commit");
  MemoryStore store;
  auto coord = CommitCoordinator::Start(&store, "job", {"n0", "n1"}, Soon());
  ASSERT_TRUE(coord.ok()) << coord.status();
  auto log = CommitLog::Open(dir.path() + "/log").value();
  Mutex mu;
  std::vector<CommitId> seen;
  auto follower = CommitFollower::Start(
      &store, "job", log.get(),
      [&](const CommitId& id) {
        MutexLock l(&mu);
        seen.push_back(id);
      },
      Soon());
  ASSERT_TRUE(follower.ok()) << follower.status();
  auto wait_latest = [&](CommitId want) {
    for (Deadline d = Soon(); !d.expired();
         std::this_thread::sleep_for(std::chrono::milliseconds(5))) {
      auto id = ReadLatestCommitId(store, "job", Soon());
      if (id.ok() && *id == want) return true;
    }
    return false;
  };
  for (int64_t s = 1; s <= 8; ++s) {
    for (const char* n : {"n0", "n1"})
      ASSERT_TRUE(ReportCompleted(store, "job", n, s, Soon()).ok());
  }
  ASSERT_TRUE(wait_latest({0, 8}));
  // A late report of the old history (epoch 0) of step 9 from one node.
  ASSERT_TRUE(ReportCompleted(store, "job", "n0", 9, Soon()).ok());
  // The recovery restores step 4 (an older durable version): epoch 1 starts.
  EXPECT_TRUE(*PublishCommit(store, "job", 4, 1, Soon(), /*epoch=*/1));
  for (Deadline d = Soon(); (*coord)->epoch() != 1 && !d.expired();)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ((*coord)->epoch(), 1u);
  EXPECT_EQ((*coord)->committed(), 4);
  // Steps 5..9 commit again; n1's report of 9 in epoch 1 does not complete
  // with n0's epoch-0 one.
  for (int64_t s = 5; s <= 8; ++s) {
    for (const char* n : {"n0", "n1"}) {
      ASSERT_TRUE(ReportCompleted(store, "job", n, s, Soon(), 1).ok());
    }
    ASSERT_TRUE(wait_latest({1, s})) << s;
  }
  ASSERT_TRUE(ReportCompleted(store, "job", "n1", 9, Soon(), 1).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(*ReadLatestCommitId(store, "job", Soon()), (CommitId{1, 8}));
  ASSERT_TRUE(ReportCompleted(store, "job", "n0", 9, Soon(), 1).ok());
  ASSERT_TRUE(wait_latest({1, 9}));
  // An agent republishing the old history's commit from its log changes nothing.
  EXPECT_FALSE(*PublishCommit(store, "job", 8, 1, Soon(), 0));
  for (Deadline d = Soon(); (*follower)->last_seen() != 9 && !d.expired();)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  follower->reset();
  MutexLock l(&mu);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), (CommitId{1, 9}));
  // The follower saw the restart at 4 (epoch 1) after step 8 of epoch 0.
  auto at = std::find(seen.begin(), seen.end(), CommitId{1, 4});
  ASSERT_NE(at, seen.end());
  EXPECT_EQ(log->latest()->step, 9);
  EXPECT_EQ(log->latest()->epoch, 1u);
}

}  // namespace
}  // namespace memento::coord
