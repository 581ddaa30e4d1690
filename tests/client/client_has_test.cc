// The client with schedule "has" against a real agent (in a thread of this
// process) over its real Unix socket and real shared memory: snapshots are
// scheduled by HAS (docs/has.md) and stay bit-identical and crash consistent.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "agent/agent.h"
#include "agent_fixture.h"
#include "common/check.h"
#include "common/checksum.h"
#include "memento/client.h"
#include "shm/shm_test_util.h"

namespace memento {
namespace {

using testing::AgentThread;
using testing::LocalAgent;
using testing::State;

// Threads of this process running as SCHED_IDLE, except the client's slot
// prefault thread ("mem-prefault", idle by design with copy_priority "idle":
// docs/thread_model.md), so the count is the copy workers'.
int IdleThreads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "mem-prefault") continue;
    if (sched_getscheduler(static_cast<pid_t>(std::atoi(e->d_name))) == SCHED_IDLE) ++n;
  }
  closedir(d);
  return n;
}

// Whether this process may lift a SCHED_IDLE thread back to SCHED_OTHER
// (root, CAP_SYS_NICE or RLIMIT_NICE >= 20); tried on a thread of its own.
bool CanLiftIdleThreads() {
  bool ok = false;
  std::thread([&ok] {
    sched_param p{};
    ok = sched_setscheduler(0, SCHED_IDLE, &p) == 0 && sched_setscheduler(0, SCHED_OTHER, &p) == 0;
  }).join();
  return ok;
}

class ClientHasTest : public ::testing::Test {
 protected:
  ClientHasTest() : root_(dir_.path() + "/job1/node0") {}
  ClientOptions Options(Schedule schedule = Schedule::kHas) {
    ClientOptions o;
    o.job_id = "job1";
    o.rank = 0;
    o.world_size = 1;
    o.agent_dir = root_;
    o.copy_threads = 2;
    o.chunk_bytes = 64 << 10;  // ~20 chunks: several scheduling decisions
    o.connect_timeout_s = 2;
    o.schedule = schedule;
    return o;
  }
  std::unique_ptr<Client> Sealed(State& s, const ClientOptions& o) {
    auto c = Client::Connect(o);
    MEMENTO_CHECK_OK(c.status());
    MEMENTO_CHECK_OK(s.Register(**c));
    MEMENTO_CHECK_OK((*c)->Seal());
    return std::move(*c);
  }
  // Waits (no timing assertion: a generous bound against hangs) until the
  // agent lists `step` as a committed version.
  static bool WaitCommitted(Client& c, int64_t step) {
    for (int i = 0; i < 6000; ++i) {
      auto v = c.ListVersions();
      if (v.ok()) {
        for (const VersionInfo& vi : *v) {
          if (vi.step == step && vi.intact) return true;
        }
      }
      usleep(10000);
    }
    return false;
  }
  static void ExpectStatsAddUp(const SnapshotStats& st, int64_t step, uint64_t bytes) {
    EXPECT_EQ(st.step, step);
    EXPECT_EQ(st.bytes, bytes);
    EXPECT_EQ(st.bytes_idle + st.bytes_compute + st.bytes_communicate, st.bytes);
    EXPECT_GE(st.fence_wait_s, 0.0);
    EXPECT_GE(st.copy_s, 0.0);
    // A worker copied at least one chunk (the rest may have been copied by
    // the fencing thread, whose time is not the workers'): its CPU counts.
    if (st.bytes_fence < st.bytes) {
      EXPECT_GT(st.copy_cpu_s, 0.0);
    }
    EXPECT_GE(st.copy_cpu_s, 0.0);
  }
  shm::testing::ShmScratchDir dir_;
  std::string root_;
};

TEST_F(ClientHasTest, RejectsUnknownSchedule) {
  AgentThread agent(LocalAgent("job1", root_));
  auto lazy = ParseSchedule("lazy");
  EXPECT_EQ(lazy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(lazy.status().message().find("'lazy'"), std::string::npos) << lazy.status();
  ClientOptions o = Options();
  o.schedule = static_cast<Schedule>(7);
  EXPECT_EQ(Client::Connect(o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.has.pipeline_stages = 4;
  o.has.pipeline_stage = 4;
  o.has.pipeline_microbatches = 8;
  EXPECT_EQ(Client::Connect(o).status().code(), StatusCode::kInvalidArgument);
}

// Phases flip on another thread while snapshots run; every version restores
// bit-identically in a fresh client, and the per-layer bytes add up.
TEST_F(ClientHasTest, RoundTripBitIdenticalWithPhasesFromAnotherThread) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientHasTest.RoundTrip");
  State s;
  auto c = Sealed(s, Options());
  std::atomic<bool> stop{false};
  std::thread phases([&] {
    for (int i = 0; !stop.load(); ++i) {
      c->OnPhase(i % 3 == 0 ? Phase::kIdle : i % 3 == 1 ? Phase::kCompute : Phase::kCommunicate);
      usleep(200);
    }
  });
  uint64_t digests[6];
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(c->Fence().ok());
    if (step > 1) ExpectStatsAddUp(c->LastSnapshotStats(), step - 1, s.Bytes());
    s.Fill(seed + step);
    digests[step] = s.Digest();
    ASSERT_TRUE(c->Snapshot(step).ok());
  }
  ASSERT_TRUE(c->Fence().ok());
  stop = true;
  phases.join();
  ExpectStatsAddUp(c->LastSnapshotStats(), 5, s.Bytes());
  c.reset();

  State t;
  auto c2 = Sealed(t, Options());
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 5);
  EXPECT_EQ(t.Digest(), digests[5]);
  // And an eager client reads what HAS wrote (same slot format).
  c2.reset();
  State u;
  auto c3 = Sealed(u, Options(Schedule::kEager));
  r = c3->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 5);
  EXPECT_EQ(u.Digest(), digests[5]);
}

// A long idle window (reported before the snapshot begins and held until the
// version is committed) carries the whole copy: layer 1.
TEST_F(ClientHasTest, IdleWindowCarriesTheCopy) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientHasTest.Idle");
  State s;
  auto c = Sealed(s, Options());
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(c->Fence().ok());
    s.Fill(seed + step);
    c->OnPhase(Phase::kIdle);
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(WaitCommitted(*c, step)) << "step " << step << " never completed while idle";
    c->OnPhase(Phase::kCompute);
    ASSERT_TRUE(c->Fence().ok());
    SnapshotStats st = c->LastSnapshotStats();
    ExpectStatsAddUp(st, step, s.Bytes());
    EXPECT_GT(st.bytes_idle, 0u);
    EXPECT_EQ(st.bytes_idle, st.bytes) << "every chunk was released inside the idle window";
  }
  const uint64_t digest = s.Digest();
  c.reset();
  State t;
  auto c2 = Sealed(t, Options());
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 3);
  EXPECT_EQ(t.Digest(), digest);
}

// Schedule "auto": without phase hooks the snapshot is eager (no byte is
// counted as idle, even inside what would be an idle window); once the
// trainer reports an idle phase, the next snapshot runs under HAS and the
// idle window carries it. Both versions restore bit-identically.
TEST_F(ClientHasTest, AutoSwitchesToHasOnceIdlePhasesAreReported) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientHasTest.Auto");
  State s;
  auto c = Sealed(s, Options(Schedule::kAuto));
  s.Fill(seed + 1);
  ASSERT_TRUE(c->Snapshot(1).ok());
  ASSERT_TRUE(WaitCommitted(*c, 1));
  ASSERT_TRUE(c->Fence().ok());
  SnapshotStats st = c->LastSnapshotStats();
  ExpectStatsAddUp(st, 1, s.Bytes());
  EXPECT_EQ(st.bytes_idle, 0u) << "no phase hook was reported: eager";
  EXPECT_EQ(st.bytes_compute, st.bytes);

  c->OnPhase(Phase::kIdle);  // the trainer's hooks are wired from here on
  s.Fill(seed + 2);
  ASSERT_TRUE(c->Snapshot(2).ok());
  ASSERT_TRUE(WaitCommitted(*c, 2)) << "step 2 never completed while idle";
  c->OnPhase(Phase::kCompute);
  ASSERT_TRUE(c->Fence().ok());
  st = c->LastSnapshotStats();
  ExpectStatsAddUp(st, 2, s.Bytes());
  EXPECT_EQ(st.bytes_idle, st.bytes) << "HAS released every chunk inside the idle window";
  const uint64_t digest = s.Digest();
  c.reset();
  State t;
  auto c2 = Sealed(t, Options(Schedule::kEager));
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 2);
  EXPECT_EQ(t.Digest(), digest);
}

// No idle window and a compute-side cap of 1 byte/s: beside computation only
// the token bucket's initial burst may go, the rest waits for Fence(). No
// byte is counted as idle, and the slot is complete and exact all the same.
TEST_F(ClientHasTest, WithoutIdleWindowsTheFenceCopiesTheRest) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientHasTest.Fence");
  State s;
  ClientOptions o = Options();
  o.has.compute_max_rate = 1;
  auto c = Sealed(s, o);
  s.Fill(seed);
  c->OnPhase(Phase::kCompute);
  ASSERT_TRUE(c->Snapshot(1).ok());
  ASSERT_TRUE(c->Fence().ok());
  SnapshotStats st = c->LastSnapshotStats();
  ExpectStatsAddUp(st, 1, s.Bytes());
  EXPECT_EQ(st.bytes_idle, 0u);
  EXPECT_EQ(st.bytes_compute, st.bytes);
  auto v = c->ListVersions();
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_FALSE(v->empty());
  EXPECT_EQ((*v)[0].step, 1);
  const uint64_t digest = s.Digest();
  c.reset();
  State t;
  auto c2 = Sealed(t, Options());
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);
  EXPECT_EQ(t.Digest(), digest);
}

// A Fence with a deadline that expires while chunks wait for the fence
// layer: DeadlineExceeded or OK, never a torn result; a later Fence finishes.
// copy_priority "idle" (the default) holds for the HAS workers too: they copy
// as SCHED_IDLE while the snapshot runs beside training, and a fence lifts
// them to normal priority so that it cannot be starved. "normal" never lowers
// them. Bit-identical restore either way.
TEST_F(ClientHasTest, HasWorkersRunAtIdlePriorityUntilTheFence) {
  if (!CanLiftIdleThreads()) GTEST_SKIP() << "no CAP_SYS_NICE / RLIMIT_NICE: workers stay normal";
  AgentThread agent(LocalAgent("job1", root_));
  const uint64_t seed = memento::testing::TestSeed("ClientHasTest.Priority");
  State s;
  ASSERT_EQ(IdleThreads(), 0);
  auto c = Sealed(s, Options());
  for (int step = 1; step <= 2; ++step) {
    s.Fill(seed + step);
    c->OnPhase(Phase::kIdle);
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(WaitCommitted(*c, step));
    // Every chunk was copied inside the idle window; the workers that copied
    // them are still at idle priority (until the fence).
    EXPECT_GE(IdleThreads(), 1) << "step " << step;
    c->OnPhase(Phase::kCompute);
    ASSERT_TRUE(c->Fence().ok());
    EXPECT_EQ(IdleThreads(), 0) << "the fence lifts the workers, step " << step;
    ExpectStatsAddUp(c->LastSnapshotStats(), step, s.Bytes());
  }
  const uint64_t digest = s.Digest();
  c.reset();

  ClientOptions normal = Options();
  normal.copy_priority = CopyPriority::kNormal;
  State t;
  auto c2 = Sealed(t, normal);
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 2);
  EXPECT_EQ(t.Digest(), digest);
  t.Fill(seed + 3);
  c2->OnPhase(Phase::kIdle);
  ASSERT_TRUE(c2->Snapshot(3).ok());
  ASSERT_TRUE(WaitCommitted(*c2, 3));
  EXPECT_EQ(IdleThreads(), 0) << "copy_priority normal";
  ASSERT_TRUE(c2->Fence().ok());
}

TEST_F(ClientHasTest, FenceDeadlineCanBeRetried) {
  AgentThread agent(LocalAgent("job1", root_));
  State s;
  ClientOptions o = Options();
  o.has.compute_max_rate = 1;
  auto c = Sealed(s, o);
  s.Fill(memento::testing::TestSeed("ClientHasTest.Deadline"));
  ASSERT_TRUE(c->Snapshot(1).ok());
  Status st = c->Fence(Deadline::AfterSeconds(0));
  EXPECT_TRUE(st.ok() || st.code() == StatusCode::kDeadlineExceeded) << st;
  ASSERT_TRUE(c->Fence().ok());
  ExpectStatsAddUp(c->LastSnapshotStats(), 1, s.Bytes());
  ASSERT_TRUE(c->Snapshot(2).ok());
  ASSERT_TRUE(c->Fence().ok());
  ExpectStatsAddUp(c->LastSnapshotStats(), 2, s.Bytes());
}

}  // namespace
}  // namespace memento
