#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>

namespace memento {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskAndWaitsIdle) {
  ThreadPool pool(3, "test");
  std::atomic<int> sum{0};
  for (int i = 1; i <= 1000; ++i) pool.Submit([&sum, i] { sum += i; });
  pool.WaitIdle();
  EXPECT_EQ(sum.load(), 500500);
}

TEST(ThreadPoolTest, DestructorDrainsQueue) {
  std::atomic<int> n{0};
  {
    ThreadPool pool(1, "test");
    for (int i = 0; i < 100; ++i) pool.Submit([&n] { ++n; });
  }
  EXPECT_EQ(n.load(), 100);
}

}  // namespace
}  // namespace memento
