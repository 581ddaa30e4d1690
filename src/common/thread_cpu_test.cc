#include "common/thread_cpu.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/thread_pool.h"

namespace memento {
namespace {

// Spins until the calling thread has used `seconds` of CPU (its own clock:
// the amount does not depend on how loaded the machine is).
void Burn(double seconds) {
  const double start = CurrentThreadCpuSeconds();
  volatile uint64_t x = 0;
  while (CurrentThreadCpuSeconds() - start < seconds) {
    for (int i = 0; i < 10000; ++i) x = x + static_cast<uint64_t>(i);
  }
}

double Named(const ThreadCpuReport& r, const std::string& name) {
  auto it = r.by_name.find(name);
  return it == r.by_name.end() ? 0.0 : it->second;
}

TEST(ThreadCpuTest, AnExitedNamedThreadIsStillCountedUnderItsName) {
  std::thread t([] {
    NameThisThread("tc-exited");
    Burn(0.05);
  });
  t.join();
  const ThreadCpuReport r = ThreadCpuByName();
  EXPECT_GE(Named(r, "tc-exited"), 0.05);
  EXPECT_LE(Named(r, "tc-exited"), r.process_s);
}

TEST(ThreadCpuTest, ALiveThreadIsCountedOnceBeforeAndAfterItExits) {
  std::atomic<bool> burnt{false}, go{false};
  std::thread t([&] {
    NameThisThread("tc-live");
    Burn(0.04);
    burnt = true;
    while (!go) std::this_thread::yield();
  });
  while (!burnt) std::this_thread::yield();
  const ThreadCpuReport live = ThreadCpuByName();
  EXPECT_GE(Named(live, "tc-live"), 0.04);
  go = true;
  t.join();
  const ThreadCpuReport after = ThreadCpuByName();
  EXPECT_GE(Named(after, "tc-live"), Named(live, "tc-live"));
  // Counted once: every name together stays within the process's CPU.
  double sum = 0;
  for (const auto& [name, s] : after.by_name) sum += s;
  EXPECT_LE(sum, after.process_s + 1e-3);
  EXPECT_NEAR(sum + after.unnamed_exited_s, after.process_s, 1e-3);
}

TEST(ThreadCpuTest, AnUnnamedExitedThreadIsTheRemainder) {
  const double before = ThreadCpuByName().unnamed_exited_s;
  std::thread t([] { Burn(0.05); });
  t.join();
  const ThreadCpuReport r = ThreadCpuByName();
  // Its CPU is in the process's clock but under no name.
  EXPECT_GE(r.unnamed_exited_s - before, 0.045);
}

TEST(ThreadCpuTest, APoolsWorkersAreOneLine) {
  {
    ThreadPool pool(2, "tc-pool");
    std::atomic<int> done{0};
    for (int i = 0; i < 2; ++i) {
      pool.Submit([&done] {
        Burn(0.02);
        ++done;
      });
    }
    pool.WaitIdle();
    EXPECT_EQ(done.load(), 2);
  }
  const ThreadCpuReport r = ThreadCpuByName();
  EXPECT_GE(Named(r, "tc-pool"), 0.04);
  EXPECT_EQ(r.by_name.count("tc-pool0"), 0u);
  EXPECT_EQ(r.by_name.count("tc-pool1"), 0u);
}

}  // namespace
}  // namespace memento
