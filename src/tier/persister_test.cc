// Persister: policy, coalescing, bandwidth cap, and behaviour under injected
// file-system faults (failing writes, fsync errors, ENOSPC).
#include "tier/persister.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <random>

#include "common/clock.h"
#include "common/test_util.h"
#include "tier/fault_injection_env.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::tier {
namespace {

using memento::testing::ScratchDir;

// The "memory tier": one buffer per step, as an agent's slot would hold it.
struct Memory {
  std::map<int64_t, std::vector<uint8_t>> versions;

  std::vector<uint8_t>& Make(int64_t step, size_t n = 1 << 20) {
    std::mt19937_64 rng(step);
    auto& v = versions[step];
    v.resize(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

  VersionViewProvider Provider(int64_t step) {
    return [this, step]() -> Result<VersionView> {
      auto it = versions.find(step);
      if (it == versions.end()) return NotFoundError("slot recycled");
      VersionView v;
      v.job = "persist-test";
      v.step = step;
      TensorMeta m;
      m.name = "state";
      m.dtype = DType::kUInt8;
      m.shape = {static_cast<int64_t>(it->second.size())};
      v.entries.push_back(ViewEntry{m, 0, it->second.size(), it->second.data()});
      return v;
    };
  }
};

// Restores "state" of `step` and compares it with memory.
void ExpectPersisted(Env* env, const std::string& root, Memory& mem, int64_t step) {
  std::vector<uint8_t> out(mem.versions.at(step).size());
  TensorMeta m;
  m.name = "state";
  m.dtype = DType::kUInt8;
  m.shape = {static_cast<int64_t>(out.size())};
  auto rep = Restore(env, root, step, {RestoreTarget{m, out.data()}});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(out, mem.versions.at(step));
}

TEST(PersisterTest, EveryKthStepAndRetention) {
  ScratchDir dir("persist-k");
  Memory mem;
  PersisterOptions o;
  o.root = dir.path();
  o.every_k_steps = 3;
  o.retention.keep_last = 2;
  auto p = Persister::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  int queued = 0;
  for (int step = 1; step <= 9; ++step) {
    mem.Make(step, 64 << 10);
    OfferResult r = (*p)->Offer(step, mem.Provider(step));
    if (step % 3 != 0) {
      EXPECT_EQ(r, OfferResult::kSkippedByPolicy) << step;
    } else {
      EXPECT_NE(r, OfferResult::kSkippedByPolicy) << step;
      ++queued;
      ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(30)));
    }
  }
  PersisterStats st = (*p)->stats();
  EXPECT_EQ(st.persisted, 3);
  EXPECT_EQ(st.last_persisted_step, 9);
  EXPECT_EQ(st.failures, 0);
  auto versions = ListVersions(Env::Default(), dir.path());
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 2u);  // keep_last = 2: version 3 was deleted
  EXPECT_EQ((*versions)[0].step, 6);
  ExpectPersisted(Env::Default(), dir.path(), mem, 9);
}

TEST(PersisterTest, OfferNeverBlocksAndCoalesces) {
  ScratchDir dir("persist-coalesce");
  Memory mem;
  for (int s = 1; s <= 4; ++s) mem.Make(s);
  PersisterOptions o;
  o.root = dir.path();
  auto p = Persister::Start(o);
  ASSERT_TRUE(p.ok());
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  // Version 1's provider blocks (a slow pin), so the worker is busy with it.
  ASSERT_EQ((*p)->Offer(1,
                        [&, gate]() -> Result<VersionView> {
                          gate.wait();
                          return mem.Provider(1)();
                        }),
            OfferResult::kQueued);
  // Give the worker time to take version 1 (a lower bound; the checks below
  // hold whether or not it has).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Stopwatch w;
  EXPECT_EQ((*p)->Offer(2, mem.Provider(2)), OfferResult::kQueued);
  EXPECT_EQ((*p)->Offer(3, mem.Provider(3)), OfferResult::kReplacedPending);
  EXPECT_EQ((*p)->Offer(2, mem.Provider(2)), OfferResult::kSkippedByPolicy);  // older than queued
  release.set_value();
  ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(30)));
  PersisterStats st = (*p)->stats();
  EXPECT_EQ(st.persisted, 2);
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.last_persisted_step, 3);
  ExpectPersisted(Env::Default(), dir.path(), mem, 1);
  ExpectPersisted(Env::Default(), dir.path(), mem, 3);
  EXPECT_FALSE(Env::Default()->FileExists(dir.path() + "/" + VersionDirName(2)));
  // A version whose slot is gone is skipped, not an error.
  (*p)->Offer(10, mem.Provider(10));
  ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(30)));
  EXPECT_EQ((*p)->stats().skipped, 1);
}

TEST(PersisterTest, BandwidthCapIsALowerBoundOnTime) {
  ScratchDir dir("persist-bw");
  Memory mem;
  mem.Make(1, 3 << 20);
  PersisterOptions o;
  o.root = dir.path();
  o.bandwidth_bytes_per_sec = 8 << 20;  // 3 MiB (+ header) at 8 MiB/s with an 8 MiB burst...
  auto p = Persister::Start(o);
  ASSERT_TRUE(p.ok());
  (*p)->SetBandwidth(4 << 20);
  RateLimiter probe(1 << 20, 1 << 16);  // ...and a direct check of the bucket: 1 MiB/s
  Stopwatch w;
  for (int i = 0; i < 4; ++i) probe.Acquire(1 << 16);  // 256 KiB, 64 KiB burst
  EXPECT_GE(w.Seconds(), 0.18);  // >= (256-64)/1024 s; never faster, whatever the load
  (*p)->Offer(1, mem.Provider(1));
  ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(60)));
  EXPECT_EQ((*p)->stats().persisted, 1);
  ExpectPersisted(Env::Default(), dir.path(), mem, 1);
}

enum class Fault { kWrite, kSync, kNoSpace, kRename };

class PersisterFaultTest : public ::testing::TestWithParam<Fault> {};

TEST_P(PersisterFaultTest, ReportsKeepsMemoryAndRetries) {
  ScratchDir dir("persist-fault");
  FaultInjectionEnv env(Env::Default());
  Memory mem;
  mem.Make(1);
  mem.Make(2);
  const std::vector<uint8_t> before = mem.versions.at(2);
  PersisterOptions o;
  o.root = dir.path();
  o.env = &env;
  o.retry_initial_s = 0.05;
  o.retry_max_s = 0.2;
  auto p = Persister::Start(o);
  ASSERT_TRUE(p.ok());
  (*p)->Offer(1, mem.Provider(1));
  ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(30)));
  ASSERT_EQ((*p)->stats().persisted, 1);

  switch (GetParam()) {
    case Fault::kWrite:
      env.SetFailWrites(true);
      break;
    case Fault::kSync:
      env.SetFailSyncs(true);
      break;
    case Fault::kNoSpace:
      env.SetSpaceLeft(300 << 10);
      break;
    case Fault::kRename:
      env.SetFailRenames(true);
      break;
  }
  (*p)->Offer(2, mem.Provider(2));
  // Wait until at least two attempts failed (first try + one retry).
  Deadline d = Deadline::AfterSeconds(30);
  while ((*p)->stats().failures < 2 && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  PersisterStats st = (*p)->stats();
  ASSERT_GE(st.failures, 2);
  EXPECT_NE(st.last_error.find("injected"), std::string::npos) << st.last_error;
  if (GetParam() == Fault::kNoSpace) {
    EXPECT_NE(st.last_error.find("ResourceExhausted"), std::string::npos) << st.last_error;
  }
  EXPECT_TRUE(st.busy);  // the retry is pending
  EXPECT_GT(env.injected_faults(), 0);
  // Nothing torn is visible; the memory tier is untouched.
  EXPECT_EQ(*LatestCompleteVersion(&env, dir.path()), 1);
  EXPECT_EQ(mem.versions.at(2), before);
  auto report = Verify(Env::Default(), dir.path(), std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());

  env.Heal();
  ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(30)));
  st = (*p)->stats();
  EXPECT_EQ(st.last_persisted_step, 2);
  EXPECT_TRUE(st.last_error.empty());
  EXPECT_EQ(*LatestCompleteVersion(&env, dir.path()), 2);
  ExpectPersisted(Env::Default(), dir.path(), mem, 2);
}

INSTANTIATE_TEST_SUITE_P(Faults, PersisterFaultTest,
                         ::testing::Values(Fault::kWrite, Fault::kSync, Fault::kNoSpace,
                                           Fault::kRename));

}  // namespace
}  // namespace memento::tier

namespace memento::tier {
namespace {

TEST(RestoreFaultTest, ReadErrorsAreReportedAndDiscoveryStillWorks) {
  ScratchDir dir("restore-fault");
  FaultInjectionEnv env(Env::Default());
  Memory mem;
  mem.Make(1, 1 << 16);
  auto view = mem.Provider(1)();
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(WriteVersion(&env, dir.path(), *view, {}, Deadline::AfterSeconds(5)).ok());
  env.SetFailReads(true);
  std::vector<uint8_t> out(1 << 16);
  TensorMeta m = view->entries[0].meta;
  auto rep = Restore(&env, dir.path(), 1, {RestoreTarget{m, out.data()}});
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().message().find("(injected)"), std::string::npos) << rep.status();
  env.Heal();
  rep = Restore(&env, dir.path(), 1, {RestoreTarget{m, out.data()}});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(out, mem.versions.at(1));
}

}  // namespace
}  // namespace memento::tier
