#include "client/commit_lag.h"

#include <gtest/gtest.h>

#include <chrono>

namespace memento::client {
namespace {

TimePoint At(double s) {
  return TimePoint() +
         std::chrono::duration_cast<TimePoint::duration>(std::chrono::duration<double>(s));
}

// A commit seen at a later snapshot: the lag counts the snapshots and the
// seconds from the committed step's own Snapshot() to the one that saw it.
TEST(CommitLagTrackerTest, MeasuresFromTheVersionsOwnSnapshot) {
  CommitLagTracker t;
  auto o = t.Observe(1, -1, At(1));
  EXPECT_EQ(o.behind_steps, -1);
  EXPECT_EQ(o.lag_steps, -1);
  t.Taken(1, At(1));
  o = t.Observe(2, -1, At(2));
  t.Taken(2, At(2));
  o = t.Observe(3, 1, At(3.5));  // step 1 committed during step 2
  EXPECT_EQ(o.behind_steps, 2);
  EXPECT_EQ(o.lag_steps, 2);
  EXPECT_DOUBLE_EQ(o.lag_s, 2.5);
  t.Taken(3, At(3.5));
  o = t.Observe(4, 1, At(4));  // nothing new
  EXPECT_EQ(o.behind_steps, 3);
  EXPECT_EQ(o.lag_steps, -1);
  EXPECT_EQ(o.lag_s, -1);
  t.Taken(4, At(4));
  o = t.Observe(5, 4, At(5));  // 2 and 3 passed over, 4 committed within one step
  EXPECT_EQ(o.behind_steps, 1);
  EXPECT_EQ(o.lag_steps, 1);
  EXPECT_DOUBLE_EQ(o.lag_s, 1.0);
}

// A skipped step is never taken: its commit cannot be seen, and a commit of
// a version this tracker did not see taken (an earlier process's) has no lag.
TEST(CommitLagTrackerTest, UnknownVersionsHaveNoLag) {
  CommitLagTracker t;
  auto o = t.Observe(10, 7, At(1));  // restored at 7, say
  EXPECT_EQ(o.behind_steps, 3);
  EXPECT_EQ(o.lag_steps, -1);
  o = t.Observe(11, 9, At(2));  // 9 was never Taken (skipped)
  EXPECT_EQ(o.lag_steps, -1);
  t.Taken(11, At(2));
  t.Taken(8, At(2));  // not newer than the newest commit seen: ignored
  o = t.Observe(12, 11, At(2.25));
  EXPECT_EQ(o.lag_steps, 1);
  EXPECT_DOUBLE_EQ(o.lag_s, 0.25);
}

}  // namespace
}  // namespace memento::client
