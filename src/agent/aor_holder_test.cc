// AOR in the agent (agent/aor_holder.h): a holder rank stages each step's
// gradient and pre-update parameter slices in the staging file
// (shm/aor_stage.h) as the client does, the agent brings the replica of the
// owner's shard forward, and the replica equals the owner's state byte for
// byte; its file survives the holder (a new AorHolder adopts it) and a torn
// header or changed state is refused; a learning rate the owner did not use
// is caught by the local check and the replica is seeded again; malformed
// registrations and captures get errors that say what is wrong.
#include "agent/aor_holder.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "common/check.h"
#include "common/mutex.h"
#include "common/test_util.h"
#include "opt/adamw.h"

namespace memento::agent {
namespace {

using testing::ScratchDir;
using testing::TestSeed;

// A ZeRO-1 pair in one process: rank 0 (the holder) and rank 1 (the owner
// of shard [shard, 2 * shard)); the parameters are replicated.
struct Pair {
  uint64_t n = 1000, shard = 500;
  std::shared_ptr<const opt::Optimizer> optimizer;
  std::string encoding;
  std::vector<float> params, grads, m, v;         // m, v: the owner's shard
  std::map<int64_t, std::vector<float>> history;  // step -> owner's m || v
  std::map<int64_t, uint64_t> sums;               // step -> owner's checksum
  // Record (the test's thread) inserts into history and sums while the
  // holder's worker looks them up through Seeds(): ThreadSanitizer reported
  // that race (ninth session). Only Record writes them, so reads on the
  // test's own thread need no lock (hence no GUARDED_BY).
  Mutex history_mu;
  int64_t step = 0;
  std::mt19937_64 rng;

  explicit Pair(uint64_t seed) : rng(seed) {
    opt::AdamWConfig c;
    c.lr = 3e-3f;
    c.warmup_steps = 3;
    c.decay_steps = 20;
    auto o = opt::AdamW::Create(c, {{0, 990, 0.1f}});  // the tail is padding
    MEMENTO_CHECK(o.ok());
    encoding = (*o)->Encode();
    optimizer = std::shared_ptr<const opt::Optimizer>(std::move(*o));
    params.resize(n);
    for (auto& p : params) p = static_cast<float>(std::normal_distribution<double>(0, 0.02)(rng));
    grads.assign(n, 0.0f);
    m.assign(shard, 0.0f);
    v.assign(shard, 0.0f);
    Record();
  }
  void Record() {
    std::vector<float> s(m);
    s.insert(s.end(), v.begin(), v.end());
    MutexLock l(&history_mu);
    history[step] = s;
    sums[step] = opt::ShardChecksum(shard, shard, params.data() + shard, {m.data(), v.data()});
  }
  void NextGradient() {
    for (auto& g : grads) g = static_cast<float>(std::normal_distribution<double>(0, 0.5)(rng));
  }
  // The owner's step (lr_scale: a learning rate the holder is not given).
  void OwnerStep(float lr_scale = 1.0f) {
    ++step;
    const float lr = optimizer->LearningRate(step) * lr_scale;
    opt::Shard s{shard, shard, params.data() + shard, grads.data() + shard, {m.data(), v.data()}};
    ASSERT_TRUE(optimizer->Step(step, lr, s).ok());
    Record();
  }
  AorHolder::SeedSource Seeds() {
    return [this](const AorRange&, int64_t s) -> Result<AorHolder::SeedBytes> {
      MutexLock l(&history_mu);
      auto it = history.find(s);
      if (it == history.end()) return NotFoundError("no shard of step " + std::to_string(s));
      return AorHolder::SeedBytes{it->second, sums.at(s)};
    };
  }
};

AorRange OwnerRange(const Pair& p) { return AorRange{1, 0, 7, p.shard, p.shard}; }

// What the client does in CaptureGradients: waits (with a deadline) until
// the agent has read the slot's previous step, then writes the slot of
// `step`. wait=false: writes it regardless (a writer that ignores the
// protocol).
Status Stage(const std::string& path, const Pair& p, int64_t step, float lr, bool wait = true) {
  MEMENTO_ASSIGN_OR_RETURN(auto seg, shm::Segment::Open(path, /*writable=*/true));
  const shm::AorStageSlot* slot = shm::StageSlot(seg->data(), shm::StageSlotOf(step));
  Deadline deadline = Deadline::AfterSeconds(60);
  while (wait && shm::StageBusy(shm::StageState(slot))) {
    if (deadline.expired()) return DeadlineExceededError("the agent did not read the slot");
    usleep(100);
  }
  float* d = shm::BeginStage(seg->data(), step);
  std::memcpy(d, p.grads.data() + p.shard, p.shard * sizeof(float));
  std::memcpy(d + p.shard, p.params.data() + p.shard, p.shard * sizeof(float));
  const uint64_t counts[1] = {p.shard};
  shm::FinishStage(seg->data(), step, lr, counts, 1);
  return Status::Ok();
}

// One training step of the pair with the holder capturing first.
void TrainStep(AorHolder& h, Pair& p, float holder_lr_scale = 1.0f) {
  p.NextGradient();
  const int64_t t = p.step + 1;
  const float lr = p.optimizer->LearningRate(t) * holder_lr_scale;
  ASSERT_TRUE(Stage(h.StagePath(0), p, t, lr).ok());
  ASSERT_TRUE(h.Capture(0, t, lr).ok());
  p.OwnerStep();
}

void ExpectEqualsOwner(AorHolder& h, const Pair& p) {
  auto view = h.Replica(1);
  ASSERT_NE(view, nullptr);
  ASSERT_EQ(view->saved.step, p.step);
  ASSERT_EQ(view->state.size(), 2 * p.shard);
  EXPECT_EQ(
      std::memcmp(view->state.data(), p.history.at(p.step).data(), 2 * p.shard * sizeof(float)), 0)
      << "replica differs from the owner at step " << p.step;
  auto sum = h.ChecksumOf(1, p.step);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, p.sums.at(p.step));
}

// A new holder in `dir` (seeds refused: no network) adopts the replica file
// of `p`'s shard left there, equals the owner, and follows it bit-exact for
// three more steps.
void ExpectAdoptedWithoutASeed(const std::string& dir, Pair& p) {
  AorHolder again(dir, [](const AorRange&, int64_t) -> Result<AorHolder::SeedBytes> {
    return UnavailableError("no seed: the adopted file must do");
  });
  ASSERT_TRUE(again.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  ExpectEqualsOwner(again, p);
  for (int i = 0; i < 3; ++i) {
    TrainStep(again, p);
    ExpectEqualsOwner(again, p);
  }
  EXPECT_EQ(again.stats().seeded, 0);
}

TEST(AorHolderTest, BringsTheOwnersShardForwardBitExactAndItsFileSurvives) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  {
    AorHolder h(dir.path(), p.Seeds());
    auto reg = h.Register(0, p.encoding, p.n, {OwnerRange(p)});
    ASSERT_TRUE(reg.ok()) << reg.status();
    ASSERT_EQ(reg->ranges.size(), 1u);
    EXPECT_EQ(reg->path, h.StagePath(0));
    for (int i = 0; i < 12; ++i) {
      TrainStep(h, p);
      ExpectEqualsOwner(h, p);
    }
    EXPECT_EQ(h.stats().seeded, 1);  // once, from step 0; never again
    EXPECT_EQ(h.stats().advanced, 12);
    EXPECT_EQ(h.stats().refused, 0);
  }
  // The holder (agent or trainer) is gone; the replica file is not. A new
  // holder adopts it and goes on without a seed (no network).
  ASSERT_NO_FATAL_FAILURE(ExpectAdoptedWithoutASeed(dir.path(), p));
}

// The replica file holds two steps (the current one and the one before, in
// two areas with a header each): a torn header of the newest step makes the
// previous one adopted, never the torn one; with both headers torn, or both
// areas changed, the file is refused; a holder that finds a bad file seeds
// the replica again.
TEST(AorHolderTest, ATornHeaderOrChangedStateIsRefused) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  AorHolder h(dir.path(), p.Seeds());
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  for (int i = 0; i < 3; ++i) TrainStep(h, p);
  const std::string path = h.ReplicaPath(1);
  const uint64_t ohash = Checksum(p.encoding.data(), p.encoding.size());
  int cur = -1;
  {
    auto ok = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->replica->step(), 3);
    cur = ok->replica->current_area();
  }
  auto flip = [&](off_t at) {
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
    close(fd);
  };
  const off_t step_at[2] = {offsetof(AorFileHeader, step),
                            sizeof(AorFileHeader) + offsetof(AorFileHeader, step)};
  flip(step_at[cur]);  // torn header of step 3: the step half-written
  {
    auto prev = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
    ASSERT_TRUE(prev.ok()) << prev.status();
    EXPECT_EQ(prev->replica->step(), 2);
    EXPECT_EQ(
        std::memcmp(prev->replica->state(0), p.history.at(2).data(), 2 * p.shard * sizeof(float)),
        0);
  }
  flip(step_at[1 - cur]);  // both torn
  auto torn = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
  ASSERT_FALSE(torn.ok());
  EXPECT_EQ(torn.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(torn.status().message().find("torn header"), std::string::npos) << torn.status();
  flip(step_at[0]);
  flip(step_at[1]);
  const off_t area_bytes = 2 * p.shard * sizeof(float);
  flip(kAorFileHeaders + 40);               // a state byte of area 0
  flip(kAorFileHeaders + area_bytes + 40);  // and of area 1
  auto changed = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), StatusCode::kDataLoss) << changed.status();
  EXPECT_NE(changed.status().message().find("hashes to"), std::string::npos) << changed.status();
  // Another owner's range or another optimizer: not this replica.
  AorRange other = OwnerRange(p);
  other.owner = 2;
  EXPECT_EQ(ReadAorFile(path, other, p.optimizer, ohash).status().code(),
            StatusCode::kInvalidArgument);
  // A short file.
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  EXPECT_EQ(ReadAorFile(path, OwnerRange(p), p.optimizer, ohash).status().code(),
            StatusCode::kDataLoss);
  // A holder that finds the bad file seeds the replica again instead.
  AorHolder again(dir.path(), p.Seeds());
  ASSERT_TRUE(again.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  EXPECT_EQ(again.Replica(1), nullptr);
  TrainStep(again, p);
  ExpectEqualsOwner(again, p);
  EXPECT_EQ(again.stats().seeded, 1);
}

// The replica file is updated in place: an agent killed in the middle of a
// step (a real process: it marks the spare area's header, overwrites half
// of that area as the host step does, and is killed) leaves a file whose
// half-written step is never adopted: the previous step is, byte for byte,
// and a new holder goes on from it without a seed. A file whose areas are
// both unusable is refused, never trusted.
TEST(AorHolderTest, AHalfWrittenStepIsNeverAdoptedThePreviousOneIs) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  int spare = -1;
  {
    AorHolder h(dir.path(), p.Seeds());
    ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
    for (int i = 0; i < 4; ++i) TrainStep(h, p);
    auto view = h.Replica(1);
    ASSERT_NE(view, nullptr);
    ASSERT_EQ(view->saved.step, 4);
  }
  const std::string path = dir.path() + "/aor.1";
  const uint64_t ohash = Checksum(p.encoding.data(), p.encoding.size());
  {
    auto ok = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
    ASSERT_TRUE(ok.ok()) << ok.status();
    spare = ok->replica->spare_area();
  }
  // The agent of step 5, killed mid-step.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto seg = shm::Segment::Open(path, /*writable=*/true);
    if (!seg.ok()) _exit(3);
    MarkAorAreaWriting(**seg, spare);
    float* area = reinterpret_cast<float*>((*seg)->data() + kAorFileHeaders) + spare * 2 * p.shard;
    for (uint64_t i = 0; i < p.shard; ++i) area[i] = 12345.0f;  // half of the area
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  auto adopted = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->replica->step(), 4) << "the half-written step was adopted";
  EXPECT_EQ(
      std::memcmp(adopted->replica->state(0), p.history.at(4).data(), 2 * p.shard * sizeof(float)),
      0);
  adopted = AdoptedAor{};
  // A new agent goes on from step 4 without a seed, bit-exact.
  ASSERT_NO_FATAL_FAILURE(ExpectAdoptedWithoutASeed(dir.path(), p));
  // The step being written was the newest and the other area is changed
  // too: nothing is adopted.
  {
    auto ok = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
    ASSERT_TRUE(ok.ok()) << ok.status();
    auto seg = shm::Segment::Open(path, /*writable=*/true);
    ASSERT_TRUE(seg.ok());
    MarkAorAreaWriting(**seg, ok->replica->spare_area());
    float* cur = reinterpret_cast<float*>((*seg)->data() + kAorFileHeaders) +
                 ok->replica->current_area() * 2 * p.shard;
    cur[7] += 1.0f;
  }
  auto none = ReadAorFile(path, OwnerRange(p), p.optimizer, ohash);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kDataLoss) << none.status();
  EXPECT_NE(none.status().message().find("being written"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("hashes to"), std::string::npos) << none.status();
}

TEST(AorHolderTest, ALearningRateTheOwnerDidNotUseIsCaughtAndTheReplicaSeededAgain) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  AorHolder h(dir.path(), p.Seeds());
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  for (int i = 0; i < 3; ++i) TrainStep(h, p);
  // The holder is told another learning rate than the owner uses.
  TrainStep(h, p, 2.0f);
  auto wrong = h.ChecksumOf(1, p.step);
  ASSERT_TRUE(wrong.ok());
  EXPECT_NE(*wrong, p.sums.at(p.step)) << "the moments alone would not show it; the params do";
  // The next capture's parameters (the owner's output) refuse it; it is
  // seeded again from the owner's shard and is right from then on.
  TrainStep(h, p);
  EXPECT_EQ(h.stats().refused, 1);
  EXPECT_EQ(h.stats().seeded, 2);
  ExpectEqualsOwner(h, p);
  // Refuse (a failed check against the owner's reported checksum) drops it.
  h.Refuse(1, "test");
  EXPECT_EQ(h.Replica(1), nullptr);
  EXPECT_NE(access(h.ReplicaPath(1).c_str(), F_OK), 0);
  TrainStep(h, p);
  ExpectEqualsOwner(h, p);
}

TEST(AorHolderTest, MalformedRegistrationsAndCapturesAreRefusedClearly) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  AorHolder h(dir.path(), p.Seeds());
  // Capture before registering.
  Status st = h.Capture(0, 1, 1e-3f);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("registered no gradients"), std::string::npos) << st;
  // A bad optimizer encoding.
  auto bad = h.Register(0, "not an optimizer", p.n, {OwnerRange(p)});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("field 'optimizer'"), std::string::npos) << bad.status();
  // A range outside the buffer.
  auto outside = h.Register(0, p.encoding, 600, {OwnerRange(p)});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("outside the registered gradient buffer"),
            std::string::npos)
      << outside.status();
  // No ranges: capture is a no-op.
  auto none = h.Register(3, p.encoding, p.n, {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->path.empty());
  EXPECT_TRUE(h.Capture(3, 1, 1e-3f).ok());
  // The stage not ready, of another step, or with changed bytes.
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  st = h.Capture(0, 1, 1e-3f);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  ASSERT_TRUE(Stage(h.StagePath(0), p, 1, 1e-3f).ok());
  st = h.Capture(0, 3, 1e-3f);  // the same slot as step 1
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("holds step 1, not step 3"), std::string::npos) << st;
  {
    auto seg = shm::Segment::Open(h.StagePath(0), true);
    ASSERT_TRUE(seg.ok());
    shm::StageData((*seg)->data(), shm::StageSlotOf(1))[5] += 1.0f;  // after FinishStage
  }
  st = h.Capture(0, 1, 1e-3f);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_EQ(h.stats().advanced, 0);
  // The slot was read (and refused): it is no longer ready for step 1.
  st = h.Submit(0, 1, 1e-3f);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("already read"), std::string::npos) << st;
  EXPECT_EQ(h.stats().stage_refused, 4);
  EXPECT_EQ(h.stats().submitted, 0);
}

// The capture is asynchronous: Submit (the agent's answer to aor_capture)
// returns while the AOR thread is still busy with the step before (here held
// inside its seed); the trainer stages the next step in the other slot, and
// the slot of step t+2 stays busy until the thread has read step t, so
// a capture never overwrites slices the agent has not read. Every step is
// then brought forward bit-exactly.
TEST(AorHolderTest, CapturesAreAdvancedInTheAgentsThreadWhileTheTrainerGoesOn) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  Mutex mu;
  CondVar cv;
  bool release = false, entered = false;
  AorHolder::SeedSource seeds = p.Seeds();
  AorHolder h(dir.path(), [&](const AorRange& r, int64_t s) {
    MutexLock l(&mu);
    entered = true;
    cv.SignalAll();
    while (!release) cv.Wait(&l);
    return seeds(r, s);
  });
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  // Step 1: queued; the thread stops in the seed (step 0).
  p.NextGradient();
  ASSERT_TRUE(Stage(h.StagePath(0), p, 1, p.optimizer->LearningRate(1)).ok());
  ASSERT_TRUE(h.Submit(0, 1, p.optimizer->LearningRate(1)).ok());
  {
    MutexLock l(&mu);
    while (!entered) cv.Wait(&l);
  }
  p.OwnerStep();
  // Step 2 goes on in the other slot while step 1 is still being computed.
  p.NextGradient();
  ASSERT_TRUE(Stage(h.StagePath(0), p, 2, p.optimizer->LearningRate(2)).ok());
  ASSERT_TRUE(h.Submit(0, 2, p.optimizer->LearningRate(2)).ok());
  p.OwnerStep();
  // (The thread holds the replicas' lock in the seed: no stats() here.)
  EXPECT_FALSE(h.WaitCaptured(2, Deadline::AfterSeconds(0.05)));
  {
    // Step 3's slot is step 1's, which the thread copied out before the
    // seed its replica needed: free. Step 4's is step 2's, not read yet: busy, not to be
    // written.
    auto seg = shm::Segment::Open(h.StagePath(0), false);
    ASSERT_TRUE(seg.ok());
    const uint32_t s3 = shm::StageState(shm::StageSlot((*seg)->data(), shm::StageSlotOf(3)));
    EXPECT_EQ(s3, shm::kStageDone) << shm::StageStateName(s3);
    const uint32_t s4 = shm::StageState(shm::StageSlot((*seg)->data(), shm::StageSlotOf(4)));
    EXPECT_TRUE(shm::StageBusy(s4)) << shm::StageStateName(s4);
  }
  {
    MutexLock l(&mu);
    release = true;
    cv.SignalAll();
  }
  // From here on as a trainer runs: each capture waits only for its slot.
  for (int i = 0; i < 18; ++i) {
    p.NextGradient();
    const int64_t t = p.step + 1;
    const float lr = p.optimizer->LearningRate(t);
    ASSERT_TRUE(Stage(h.StagePath(0), p, t, lr).ok());
    ASSERT_TRUE(h.Submit(0, t, lr).ok());
    p.OwnerStep();
  }
  ASSERT_TRUE(h.WaitCaptured(p.step, Deadline::AfterSeconds(60)));
  ExpectEqualsOwner(h, p);
  for (int64_t s = p.step - 15; s <= p.step; ++s) {
    auto sum = h.ChecksumOf(1, s);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, p.sums.at(s)) << "step " << s;
  }
  const AorHolder::Stats stats = h.stats();
  EXPECT_EQ(stats.submitted, 20);
  EXPECT_EQ(stats.advanced, 20);
  EXPECT_EQ(stats.seeded, 1);
  EXPECT_EQ(stats.stage_refused, 0);
  EXPECT_EQ(stats.capture_errors, 0);
}

// A stage slot overwritten before the agent read it (a writer that does not
// wait for the slot to be read: step 3 written over step 1) is refused and
// counted; the replica is not advanced from it, stays at its last step, and
// at the next capture is seeded again from the owner's shard: never a
// silent hole, never wrong bytes.
TEST(AorHolderTest, AStageOverwrittenEarlyIsRefusedAndReported) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  AorHolder h(dir.path(), p.Seeds());
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  TrainStep(h, p);  // step 1
  TrainStep(h, p);  // step 2
  ExpectEqualsOwner(h, p);
  p.NextGradient();
  ASSERT_TRUE(Stage(h.StagePath(0), p, 3, p.optimizer->LearningRate(3)).ok());
  p.OwnerStep();  // step 3
  p.NextGradient();
  ASSERT_TRUE(Stage(h.StagePath(0), p, 4, p.optimizer->LearningRate(4)).ok());
  p.OwnerStep();  // step 4
  p.NextGradient();
  ASSERT_TRUE(
      Stage(h.StagePath(0), p, 5, p.optimizer->LearningRate(5), /*wait=*/false).ok());  // over 3
  p.OwnerStep();                                                                        // step 5
  Status st = h.Capture(0, 3, p.optimizer->LearningRate(3));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("holds step 5: overwritten before the agent read step 3"),
            std::string::npos)
      << st;
  EXPECT_EQ(h.stats().stage_refused, 1);
  auto view = h.Replica(1);
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->saved.step, 2) << "advanced from a slot it refused";
  {
    auto file = ReadAorFile(h.ReplicaPath(1), OwnerRange(p), p.optimizer,
                            Checksum(p.encoding.data(), p.encoding.size()));
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->replica->step(), 2);
  }
  // Step 4 cannot follow step 2: seeded at step 3 from the owner, then right.
  ASSERT_TRUE(h.Capture(0, 4, p.optimizer->LearningRate(4)).ok());
  EXPECT_EQ(h.stats().seeded, 2);
  // Step 5 (left ready in the slot) too.
  ASSERT_TRUE(h.Capture(0, 5, p.optimizer->LearningRate(5)).ok());
  ExpectEqualsOwner(h, p);
  EXPECT_EQ(h.stats().stage_refused, 1);
}

// A trainer killed (SIGKILL) in the middle of its capture leaves the slot
// being written: the agent refuses it (torn), whether told of it or not,
// and the replica and its file stay at the last step; the trainer that
// takes over stages the step again and the replica goes on.
TEST(AorHolderTest, ATrainerKilledMidCaptureLeavesATornStageTheAgentRefuses) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  AorHolder h(dir.path(), p.Seeds());
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  for (int i = 0; i < 3; ++i) TrainStep(h, p);
  p.NextGradient();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const std::string stage = h.StagePath(0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The trainer: half of its capture of step 4, then it is killed.
    auto seg = shm::Segment::Open(stage, /*writable=*/true);
    if (!seg.ok()) _exit(2);
    float* d = shm::BeginStage((*seg)->data(), 4);
    std::memcpy(d, p.grads.data() + p.shard, p.shard / 2 * sizeof(float));
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(3);
    while (true) pause();
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus));

  Status st = h.Submit(0, 4, p.optimizer->LearningRate(4));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("torn"), std::string::npos) << st;
  st = h.Capture(0, 4, p.optimizer->LearningRate(4));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("torn"), std::string::npos) << st;
  EXPECT_EQ(h.stats().stage_refused, 2);
  EXPECT_EQ(h.stats().advanced, 3);
  ExpectEqualsOwner(h, p);  // still step 3
  auto file = ReadAorFile(h.ReplicaPath(1), OwnerRange(p), p.optimizer,
                          Checksum(p.encoding.data(), p.encoding.size()));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->replica->step(), 3);
  // The replacement trainer stages step 4 whole; the replica goes on.
  ASSERT_TRUE(Stage(stage, p, 4, p.optimizer->LearningRate(4)).ok());
  ASSERT_TRUE(h.Submit(0, 4, p.optimizer->LearningRate(4)).ok());
  p.OwnerStep();
  ASSERT_TRUE(h.WaitCaptured(4, Deadline::AfterSeconds(60)));
  ExpectEqualsOwner(h, p);
  EXPECT_EQ(h.stats().seeded, 1);
}

// The node's --budget counts the AOR registrations (staging file, replica
// files, state): one that fits is charged RegistrationBytes, once however
// often the rank registers again; one that does not fit is registered
// without ranges (no staging file, no replica: the copies stay network
// copies), counted and logged, and holds nothing. Real room checks with
// the numbers, no stand-in for the holder.
TEST(AorHolderTest, ReplicasCountInTheNodeBudgetAndOnesThatDoNotFitAreNotKept) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  const uint64_t need = AorHolder::RegistrationBytes({OwnerRange(p)}, 2);
  // The staging file and the replica file (two headers, two state areas;
  // the state lives there, nowhere else).
  EXPECT_EQ(need, shm::StageFileBytes(p.shard) + 2 * sizeof(AorFileHeader) + 2 * 2 * p.shard * 4);
  uint64_t budget = need, asked = 0;
  std::string why;
  AorHolder h(dir.path(), p.Seeds());
  h.SetRoomCheck([&](uint64_t more, const std::string& w) -> Status {
    asked += more;
    why = w;
    const uint64_t used = h.bytes_in_use();
    if (used + more <= budget) return Status::Ok();
    return ResourceExhaustedError("node memory budget exhausted: " + w);
  });
  auto reply = h.Register(0, p.encoding, p.n, {OwnerRange(p)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->ranges.size(), 1u);
  EXPECT_EQ(h.bytes_in_use(), need);
  EXPECT_EQ(asked, need);
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  TrainStep(h, p);
  ExpectEqualsOwner(h, p);
  // Registering again (a restarted trainer) is not charged twice.
  reply = h.Register(0, p.encoding, p.n, {OwnerRange(p)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->ranges.size(), 1u);
  EXPECT_EQ(h.bytes_in_use(), need);
  EXPECT_EQ(h.stats().budget_refused, 0);

  // One byte short: no replica, no staging file, nothing held.
  ScratchDir dir2("aor-holder");
  budget = need - 1;
  AorHolder h2(dir2.path(), p.Seeds());
  h2.SetRoomCheck([&](uint64_t more, const std::string& w) -> Status {
    if (h2.bytes_in_use() + more <= budget) return Status::Ok();
    return ResourceExhaustedError("node memory budget exhausted: " + w);
  });
  reply = h2.Register(0, p.encoding, p.n, {OwnerRange(p)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->ranges.empty());
  EXPECT_TRUE(reply->path.empty());
  EXPECT_NE(access(h2.StagePath(0).c_str(), F_OK), 0) << "a staging file outside the budget";
  EXPECT_EQ(h2.bytes_in_use(), 0u);
  EXPECT_EQ(h2.stats().budget_refused, 1);
  EXPECT_EQ(h2.Replica(1), nullptr);
  EXPECT_TRUE(h2.Capture(0, 1, 1e-3f).ok());  // a rank that feeds nothing: nothing to do
  EXPECT_EQ(h2.stats().advanced, 0);
}

// What the client does since the capture and the checksum need no request
// (shm/aor_stage.h): it stages each step and rings the doorbell, and leaves
// its own shard checksum in the file's ring. The file's watcher finds every
// step without a Submit (the replica equals the owner byte for byte) and
// publishes the checksums in step order, each once; WaitCaptured and
// PublishChecksums (the node's step path) do it themselves when the watcher
// has not run yet. A torn ring entry is never published; a rollback's
// recomputed step is published again.
TEST(AorHolderTest, CapturesAndChecksumsNeedNoRequestTheDoorbellWakesTheAgent) {
  ScratchDir dir("aor-holder");
  Pair p(TestSeed("AorHolderTest"));
  Mutex mu;
  std::vector<std::pair<int64_t, uint64_t>> published;
  AorHolder h(dir.path(), p.Seeds(), nullptr, [&](int rank, int64_t step, uint64_t sum) {
    EXPECT_EQ(rank, 0);
    MutexLock l(&mu);
    published.emplace_back(step, sum);
    return Status::Ok();
  });
  ASSERT_TRUE(h.Register(0, p.encoding, p.n, {OwnerRange(p)}).ok());
  auto seg = shm::Segment::Open(h.StagePath(0), /*writable=*/true);
  ASSERT_TRUE(seg.ok()) << seg.status();
  uint8_t* base = (*seg)->data();
  // Rank 0's own checksum of step t (any value: the holder only relays it).
  auto own = [](int64_t t) { return 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(t); };
  for (int i = 0; i < 12; ++i) {
    p.NextGradient();
    const int64_t t = p.step + 1;
    ASSERT_TRUE(Stage(h.StagePath(0), p, t, p.optimizer->LearningRate(t)).ok());
    shm::RingStageDoorbell(base);
    p.OwnerStep();
    shm::WriteStageSum(base, t, own(t));
    shm::RingStageDoorbell(base);
  }
  ASSERT_TRUE(h.WaitCaptured(p.step, Deadline::AfterSeconds(60)));
  ExpectEqualsOwner(h, p);
  for (int64_t s = p.step - 11; s <= p.step; ++s) {
    auto sum = h.ChecksumOf(1, s);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, p.sums.at(s)) << "step " << s;
  }
  h.PublishChecksums();
  {
    MutexLock l(&mu);
    // The ring keeps the last kAorSumRing steps: a watcher that ran late
    // published from there on; in step order, each once.
    ASSERT_FALSE(published.empty());
    for (size_t k = 1; k < published.size(); ++k) {
      EXPECT_GT(published[k].first, published[k - 1].first);
    }
    std::map<int64_t, uint64_t> got(published.begin(), published.end());
    for (int64_t s = p.step - shm::kAorSumRing + 1; s <= p.step; ++s) {
      ASSERT_EQ(got.count(s), 1u) << "step " << s << " not published";
      EXPECT_EQ(got[s], own(s)) << "step " << s;
    }
    published.clear();
  }
  AorHolder::Stats stats = h.stats();
  EXPECT_EQ(stats.submitted, 12);
  EXPECT_EQ(stats.rang, 12);  // every capture found without a request
  EXPECT_EQ(stats.advanced, 12);
  EXPECT_EQ(stats.stage_refused, 0);
  EXPECT_EQ(stats.capture_errors, 0);
  EXPECT_GE(stats.sums_published, shm::kAorSumRing);

  // A writer killed mid-entry: step 13's checksum without its check.
  shm::AorSumEntry* e = &shm::StageHeader(base)->sums[13 % shm::kAorSumRing];
  e->check = 0;
  e->step = 13;
  e->checksum = own(13);
  h.PublishChecksums();
  e->check = shm::SumCheck(13, own(13)) ^ 2;  // or torn between its fields
  h.PublishChecksums();
  {
    MutexLock l(&mu);
    EXPECT_TRUE(published.empty())
        << "a torn ring entry was published (step " << published.front().first << ")";
  }
  // A rollback: step 10 recomputed to other bytes is published again.
  shm::WriteStageSum(base, 10, own(10) + 1);
  h.PublishChecksums();
  {
    MutexLock l(&mu);
    ASSERT_EQ(published.size(), 1u);
    EXPECT_EQ(published[0].first, 10);
    EXPECT_EQ(published[0].second, own(10) + 1);
  }
}

}  // namespace
}  // namespace memento::agent
