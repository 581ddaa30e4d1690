// AOR replicas (opt/aor.h): a replica of a peer's ZeRO-1 shard advanced on
// the host equals the owner's state byte for byte over many steps (groups,
// padding, clipping, warmup and decay, a seed taken mid-training); an owner
// that used something the replica was not given (a changed learning rate) is
// caught by Confirm and by CheckForRestore; corrupt seeds and corrupt bytes
// in memory are refused.
#include "opt/aor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/check.h"
#include "common/test_util.h"
#include "opt/adamw.h"

namespace memento::opt {
namespace {

using Rng = std::mt19937_64;
using testing::TestSeed;

// A ZeRO-1 data-parallel group of `dp` owners in one process, laid out as the
// reference trainer lays it out (examples/trainer/trainer.cc): one flat
// parameter buffer padded to a multiple of dp, replicated; each owner keeps
// the AdamW moments of its shard only and updates that range; the all-gather
// then gives every member the whole updated buffer.
struct Zero1Group {
  int dp;
  uint64_t n, padded, shard;
  AdamWConfig config;
  std::shared_ptr<const Optimizer> optimizer;
  std::vector<float> params, grads;
  std::vector<std::vector<float>> m, v;  // per owner, `shard` elements
  int64_t step = 0;

  Zero1Group(int dp_size, uint64_t numel, Rng* rng) : dp(dp_size), n(numel) {
    padded = (n + dp - 1) / dp * dp;
    shard = padded / dp;
    config.lr = 3e-3f;
    config.min_lr = 3e-4f;
    config.warmup_steps = 4;
    config.decay_steps = 30;
    // Three groups with different weight decay; the tail [n, padded) is
    // padding (no group), as in the trainer.
    const uint64_t a = n / 3, b = 2 * n / 3;
    auto o = AdamW::Create(config, {{0, a, 0.1f}, {a, b - a, 0.0f}, {b, n - b, 0.05f}});
    MEMENTO_CHECK(o.ok());
    optimizer = std::shared_ptr<const Optimizer>(std::move(*o));
    params.resize(padded, 0.0f);
    for (uint64_t i = 0; i < n; ++i) {
      params[i] = static_cast<float>(std::normal_distribution<double>(0, 0.02)(*rng));
    }
    grads.resize(padded, 0.0f);
    m.assign(dp, std::vector<float>(shard, 0.0f));
    v.assign(dp, std::vector<float>(shard, 0.0f));
  }

  // The gradient of the next step, already all-reduced, clipped to norm 1
  // as the trainer clips it.
  void NextGradient(Rng* rng) {
    double sumsq = 0;
    for (uint64_t i = 0; i < n; ++i) {
      grads[i] = static_cast<float>(std::normal_distribution<double>(0, 0.5)(*rng));
      sumsq += static_cast<double>(grads[i]) * grads[i];
    }
    const double norm = std::sqrt(sumsq);
    if (norm > 1.0) {
      const float s = static_cast<float>(1.0 / (norm + 1e-6));
      for (uint64_t i = 0; i < n; ++i) grads[i] *= s;
    }
  }

  // Every owner's optimizer step on its shard, then the all-gather (a no-op
  // here: the owners update disjoint ranges of the one buffer). `lr_scale`
  // lets a test change the owners' learning rate behind the replica's back.
  void OwnersStep(float lr_scale = 1.0f) {
    ++step;
    const float lr = optimizer->LearningRate(step) * lr_scale;
    for (int r = 0; r < dp; ++r) {
      Shard s{r * shard,
              shard,
              params.data() + r * shard,
              grads.data() + r * shard,
              {m[r].data(), v[r].data()}};
      ASSERT_TRUE(optimizer->Step(step, lr, s).ok());
    }
  }

  // What the owner reports with its snapshot: its params and moments.
  uint64_t OwnerChecksum(int r) const {
    return ShardChecksum(r * shard, shard, params.data() + r * shard, {m[r].data(), v[r].data()});
  }
  const float* OwnerParams(int r) const { return params.data() + r * shard; }
};

void ExpectSameBytes(const AorReplica& rep, const Zero1Group& g, int owner) {
  ASSERT_EQ(std::memcmp(rep.state(0), g.m[owner].data(), g.shard * sizeof(float)), 0)
      << "exp_avg of owner " << owner << " at step " << g.step;
  ASSERT_EQ(std::memcmp(rep.state(1), g.v[owner].data(), g.shard * sizeof(float)), 0)
      << "exp_avg_sq of owner " << owner << " at step " << g.step;
}

// Each member r holds a replica of ring neighbour (r + 1) % dp's shard (the
// plan's AOR placement), seeded from the initial state, advanced every step
// with the gradient and pre-update parameters the member has; every step it
// is confirmed, and at the end it equals the owner's moments byte for byte.
TEST(AorReplicaTest, BitExactWithTheOwnersOverManySteps) {
  const uint64_t seed = TestSeed("AorReplicaTest");
  Rng rng(seed);
  Zero1Group g(4, 10007, &rng);  // padded: 3 elements of padding in the last shard
  std::vector<std::unique_ptr<AorReplica>> reps;
  for (int r = 0; r < g.dp; ++r) {
    const int owner = (r + 1) % g.dp;
    auto rep = AorReplica::Create(g.optimizer, owner * g.shard, g.shard);
    ASSERT_TRUE(rep.ok()) << rep.status();
    ASSERT_TRUE((*rep)
                    ->Seed(0, g.OwnerParams(owner), {g.m[owner].data(), g.v[owner].data()},
                           g.OwnerChecksum(owner))
                    .ok());
    reps.push_back(std::move(*rep));
  }
  for (int t = 1; t <= 40; ++t) {  // through warmup, the cosine and the floor
    g.NextGradient(&rng);
    // The members' replicas run before the owners' step: they read the
    // pre-update parameters (as a holder does from its own replicated copy).
    for (int r = 0; r < g.dp; ++r) {
      AorReplica& rep = *reps[r];
      const float lr = g.optimizer->LearningRate(t);
      ASSERT_TRUE(
          rep.Advance(t, lr, g.grads.data() + rep.offset(), g.params.data() + rep.offset()).ok());
    }
    g.OwnersStep();
    for (int r = 0; r < g.dp; ++r) {
      const int owner = (r + 1) % g.dp;
      // Locally, against the all-gathered parameters, and against the
      // owner's report.
      Status st = reps[r]->ConfirmParams(t, g.OwnerParams(owner));
      ASSERT_TRUE(st.ok()) << "step " << t << ": " << st;
      st = reps[r]->Confirm(t, g.OwnerChecksum(owner));
      ASSERT_TRUE(st.ok()) << "step " << t << ": " << st;
    }
  }
  for (int r = 0; r < g.dp; ++r) {
    const int owner = (r + 1) % g.dp;
    ExpectSameBytes(*reps[r], g, owner);
    EXPECT_TRUE(reps[r]->CheckForRestore(40, g.OwnerChecksum(owner)).ok());
    EXPECT_EQ(reps[r]->seed_step(), 0);
  }
}

// Seeded from a snapshot mid-training (a replica made after a restart or a
// membership change), unconfirmed for several steps, and checked only at
// recovery: still byte-identical.
// The host step runs in chunks of kChunk elements (one pass: inputs hashed,
// optimizer, outputs hashed): a shard of several chunks plus a tail equals
// the owner's byte for byte; Prepare returns the inputs' hashes and changes
// nothing until Commit (a step dropped because its inputs did not check
// leaves the replica at its step, with its bytes); external areas are used
// in place.
TEST(AorReplicaTest, ChunkedStepIsBitExactAndNothingChangesBeforeCommit) {
  Rng rng(TestSeed("AorReplicaTest"));
  Zero1Group g(2, 2 * (2 * AorReplica::kChunk + 37), &rng);
  ASSERT_GT(g.shard, 2 * AorReplica::kChunk);
  std::vector<float> mem(4 * g.shard + 8, -1.0f);  // two areas of m || v, external
  AorReplica::Areas areas;
  areas.area[0] = mem.data();
  areas.area[1] = mem.data() + 2 * g.shard;
  auto rep = AorReplica::Create(g.optimizer, g.shard, g.shard, areas);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_TRUE(
      (*rep)->Seed(0, g.OwnerParams(1), {g.m[1].data(), g.v[1].data()}, g.OwnerChecksum(1)).ok());
  EXPECT_EQ((*rep)->current_area(), 1);  // seeded into the spare
  for (int s = 1; s <= 5; ++s) {
    g.NextGradient(&rng);
    const float lr = g.optimizer->LearningRate(s);
    const uint64_t before = (*rep)->checksum();
    const int area = (*rep)->current_area();
    std::vector<float> held((*rep)->state(0), (*rep)->state(0) + 2 * g.shard);
    auto in = (*rep)->Prepare(s, lr, g.grads.data() + g.shard, g.OwnerParams(1));
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->grads_hash, Checksum(g.grads.data() + g.shard, g.shard * sizeof(float)));
    EXPECT_EQ(in->params_hash, Checksum(g.OwnerParams(1), g.shard * sizeof(float)));
    // Not committed yet: the replica is where it was, bytes included.
    EXPECT_EQ((*rep)->step(), s - 1);
    EXPECT_EQ((*rep)->checksum(), before);
    EXPECT_EQ((*rep)->current_area(), area);
    EXPECT_EQ(std::memcmp((*rep)->state(0), held.data(), held.size() * sizeof(float)), 0);
    if (s == 3) {
      // Dropped (as when the staged inputs do not hash right), then again.
      in = (*rep)->Prepare(s, lr, g.grads.data() + g.shard, g.OwnerParams(1));
      ASSERT_TRUE(in.ok());
    }
    ASSERT_TRUE((*rep)->Commit().ok());
    EXPECT_EQ((*rep)->Commit().code(), StatusCode::kFailedPrecondition);
    g.OwnersStep();
    EXPECT_EQ((*rep)->step(), s);
    EXPECT_EQ((*rep)->checksum(), g.OwnerChecksum(1)) << "step " << s;
    ASSERT_EQ(std::memcmp((*rep)->state(0), g.m[1].data(), g.shard * sizeof(float)), 0);
    ASSERT_EQ(std::memcmp((*rep)->state(1), g.v[1].data(), g.shard * sizeof(float)), 0);
    EXPECT_TRUE((*rep)->ConfirmParams(s, g.OwnerParams(1)).ok());
    EXPECT_TRUE((*rep)->CheckForRestore(s, g.OwnerChecksum(1)).ok());
  }
  // The state lives in the areas given, nowhere else.
  EXPECT_TRUE((*rep)->state(0) == areas.area[0] || (*rep)->state(0) == areas.area[1]);
  EXPECT_EQ(mem[4 * g.shard], -1.0f);  // nothing written past the areas
  // Adopted from the same memory: the same replica, no copy.
  auto again = AorReplica::Adopt(g.optimizer, g.shard, g.shard, (*rep)->saved(),
                                 {{areas.area[0], areas.area[1]}, (*rep)->current_area(), nullptr});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->state(0), (*rep)->state(0));
  EXPECT_TRUE((*again)->CheckForRestore(5, g.OwnerChecksum(1)).ok());
}

TEST(AorReplicaTest, SeededMidTrainingAndCheckedOnlyAtRecovery) {
  Rng rng(TestSeed("AorReplicaTest"));
  Zero1Group g(2, 4096, &rng);
  for (int t = 1; t <= 7; ++t) {
    g.NextGradient(&rng);
    g.OwnersStep();
  }
  auto rep = AorReplica::Create(g.optimizer, 0, g.shard);
  ASSERT_TRUE(rep.ok());
  ASSERT_TRUE(
      (*rep)->Seed(7, g.OwnerParams(0), {g.m[0].data(), g.v[0].data()}, g.OwnerChecksum(0)).ok());
  EXPECT_EQ((*rep)->seed_checksum(), g.OwnerChecksum(0));
  for (int t = 8; t <= 20; ++t) {
    g.NextGradient(&rng);
    ASSERT_TRUE(
        (*rep)->Advance(t, g.optimizer->LearningRate(t), g.grads.data(), g.params.data()).ok());
    g.OwnersStep();
  }
  Status st = (*rep)->CheckForRestore(20, g.OwnerChecksum(0));
  ASSERT_TRUE(st.ok()) << st;
  ExpectSameBytes(**rep, g, 0);
}

// The trainer changed its learning rate (a new schedule) and the host
// optimizer was not told. AdamW's moments do not depend on the learning rate,
// so the recomputed moments still equal the owner's: only the parameters
// differ, and the checksums cover them. Three holders: one confirms every
// step locally against the all-gathered parameters, one against the owner's
// reported checksum, one is checked only at recovery; all three refuse.
TEST(AorReplicaTest, ALearningRateNotPassedToTheReplicaIsCaught) {
  Rng rng(TestSeed("AorReplicaTest"));
  Zero1Group g(2, 2048, &rng);
  std::unique_ptr<AorReplica> local, reported, at_recovery;
  for (auto* rep : {&local, &reported, &at_recovery}) {
    auto r = AorReplica::Create(g.optimizer, g.shard, g.shard);
    ASSERT_TRUE(r.ok());
    *rep = std::move(*r);
    ASSERT_TRUE(
        (*rep)->Seed(0, g.OwnerParams(1), {g.m[1].data(), g.v[1].data()}, g.OwnerChecksum(1)).ok());
  }
  for (int t = 1; t <= 6; ++t) {
    g.NextGradient(&rng);
    for (auto* rep : {&local, &reported, &at_recovery}) {
      if ((*rep)->diverged()) continue;
      ASSERT_TRUE((*rep)
                      ->Advance(t, g.optimizer->LearningRate(t), g.grads.data() + g.shard,
                                g.params.data() + g.shard)
                      .ok());
    }
    g.OwnersStep(t >= 5 ? 0.5f : 1.0f);  // the schedule changed at step 5
    if (t > 5) continue;
    Status a = local->ConfirmParams(t, g.OwnerParams(1));
    Status b = reported->Confirm(t, g.OwnerChecksum(1));
    if (t < 5) {
      ASSERT_TRUE(a.ok()) << a;
      ASSERT_TRUE(b.ok()) << b;
      continue;
    }
    for (const Status& st : {a, b}) {
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
      EXPECT_NE(st.message().find("step 5"), std::string::npos) << st;
    }
    EXPECT_TRUE(local->diverged());
    EXPECT_TRUE(reported->diverged());
  }
  // The moments alone would not have shown it.
  EXPECT_EQ(std::memcmp(at_recovery->state(0), g.m[1].data(), g.shard * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(at_recovery->state(1), g.v[1].data(), g.shard * sizeof(float)), 0);
  // Diverged replicas refuse to go on and to be restored.
  EXPECT_EQ(local->Advance(6, 1e-3f, g.grads.data(), g.params.data()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(reported->CheckForRestore(5, g.OwnerChecksum(1)).code(), StatusCode::kDataLoss);
  // The one checked only at recovery is refused there.
  Status st = at_recovery->CheckForRestore(6, g.OwnerChecksum(1));
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("step 6"), std::string::npos) << st;
}

TEST(AorReplicaTest, RefusesBadSeedsAndCorruptBytes) {
  Rng rng(TestSeed("AorReplicaTest"));
  Zero1Group g(2, 1024, &rng);
  EXPECT_EQ(AorReplica::Create(nullptr, 0, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AorReplica::Create(g.optimizer, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AorReplica::Create(g.optimizer, ~uint64_t{0}, 2).status().code(),
            StatusCode::kInvalidArgument);
  auto rep = AorReplica::Create(g.optimizer, 0, g.shard);
  ASSERT_TRUE(rep.ok());
  // Not seeded yet.
  EXPECT_EQ((*rep)->Advance(1, 1e-3f, g.grads.data(), g.params.data()).code(),
            StatusCode::kFailedPrecondition);
  // Wrong number of slices, a null slice.
  EXPECT_EQ((*rep)->Seed(0, g.OwnerParams(0), {g.m[0].data()}, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*rep)->Seed(0, g.OwnerParams(0), {g.m[0].data(), nullptr}, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*rep)->Seed(0, nullptr, {g.m[0].data(), g.v[0].data()}, 0).code(),
            StatusCode::kInvalidArgument);
  // Bytes that do not hash to the owner's checksum: DataLoss, nothing kept.
  g.m[0][3] = 1.0f;
  const uint64_t good = g.OwnerChecksum(0);
  g.m[0][3] = 2.0f;
  Status st = (*rep)->Seed(0, g.OwnerParams(0), {g.m[0].data(), g.v[0].data()}, good);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_EQ((*rep)->step(), -1);
  g.m[0][3] = 1.0f;
  ASSERT_TRUE((*rep)->Seed(0, g.OwnerParams(0), {g.m[0].data(), g.v[0].data()}, good).ok());
  // Steps apply one by one.
  EXPECT_EQ((*rep)->Advance(2, 1e-3f, g.grads.data(), g.params.data()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ((*rep)->Advance(1, 1e-3f, nullptr, g.params.data()).code(),
            StatusCode::kInvalidArgument);
  g.NextGradient(&rng);
  ASSERT_TRUE(
      (*rep)->Advance(1, g.optimizer->LearningRate(1), g.grads.data(), g.params.data()).ok());
  g.OwnersStep();
  ASSERT_TRUE((*rep)->CheckForRestore(1, g.OwnerChecksum(0)).ok());
  EXPECT_EQ((*rep)->CheckForRestore(0, g.OwnerChecksum(0)).code(), StatusCode::kFailedPrecondition);
  // A bit flipped in the replica's memory after it was written.
  float* v = const_cast<float*>((*rep)->state(1));
  uint32_t bits;
  std::memcpy(&bits, &v[17], 4);
  bits ^= 1u << 9;
  std::memcpy(&v[17], &bits, 4);
  st = (*rep)->CheckForRestore(1, g.OwnerChecksum(0));
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("changed in memory"), std::string::npos) << st;
}

// The agent makes the kAor copy's T1 entry from the replica with
// CopyStateTo: the bytes copied are checked against the state hash of the
// step, so a byte of the replica changed in memory between its step and the
// copy is refused, not protected by the entry's own (later) checksums.
TEST(AorReplicaTest, CopyStateToChecksTheCopiedBytesAgainstTheStep) {
  Rng rng(TestSeed("AorReplicaTest"));
  Zero1Group g(2, 1000, &rng);
  // External areas, as the agent's mapped replica file gives them.
  std::vector<float> mem(4 * g.shard, 0.0f);
  AorReplica::Areas areas;
  areas.area[0] = mem.data();
  areas.area[1] = mem.data() + 2 * g.shard;
  auto rep = AorReplica::Create(g.optimizer, 1 * g.shard, g.shard, areas);
  ASSERT_TRUE(rep.ok()) << rep.status();
  std::vector<uint8_t> entry(2 * g.shard * sizeof(float) + 1, 0xab);
  EXPECT_EQ((*rep)->CopyStateTo(entry.data()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      (*rep)->Seed(0, g.OwnerParams(1), {g.m[1].data(), g.v[1].data()}, g.OwnerChecksum(1)).ok());
  for (int s = 1; s <= 3; ++s) {
    g.NextGradient(&rng);
    ASSERT_TRUE((*rep)
                    ->Advance(s, g.optimizer->LearningRate(s), g.grads.data() + g.shard,
                              g.params.data() + g.shard)
                    .ok());
    g.OwnersStep();
    ASSERT_TRUE((*rep)->Confirm(s, g.OwnerChecksum(1)).ok());
    // The entry's layout: the state slices back to back, the owner's bytes.
    ASSERT_TRUE((*rep)->CopyStateTo(entry.data()).ok()) << "step " << s;
    const size_t n = g.shard * sizeof(float);
    EXPECT_EQ(std::memcmp(entry.data(), g.m[1].data(), n), 0) << "step " << s;
    EXPECT_EQ(std::memcmp(entry.data() + n, g.v[1].data(), n), 0) << "step " << s;
    EXPECT_EQ(entry.back(), 0xab) << "wrote past the entry";
  }
  // One bit of the current area flipped after the step: refused, every
  // slice, first and last element.
  for (int k = 0; k < 2; ++k) {
    for (uint64_t i : {uint64_t{0}, g.shard - 1}) {
      float* x = mem.data() + (*rep)->current_area() * 2 * g.shard + k * g.shard + i;
      uint32_t bits;
      std::memcpy(&bits, x, 4);
      std::memcpy(x, &(bits ^= 1u << 3), 4);
      Status st = (*rep)->CopyStateTo(entry.data());
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << "slice " << k << " element " << i;
      EXPECT_NE(st.message().find("changed in memory since the step was written"),
                std::string::npos)
          << st;
      std::memcpy(x, &(bits ^= 1u << 3), 4);
      EXPECT_TRUE((*rep)->CopyStateTo(entry.data()).ok()) << "slice " << k << " element " << i;
    }
  }
  // The spare area (the previous step, or a step being computed) is not
  // what is copied: changing it changes nothing.
  mem[(*rep)->spare_area() * 2 * g.shard + 5] += 1.0f;
  EXPECT_TRUE((*rep)->CopyStateTo(entry.data()).ok());
  // A diverged replica is not copied.
  EXPECT_EQ((*rep)->Confirm(3, g.OwnerChecksum(1) ^ 1).code(), StatusCode::kDataLoss);
  EXPECT_EQ((*rep)->CopyStateTo(entry.data()).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace memento::opt
