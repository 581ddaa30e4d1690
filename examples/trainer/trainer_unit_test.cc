// In-process tests of the trainer's pieces: corpus and data cursor, the
// learning-rate schedule, AdamW sharding, the hook contract that memento
// relies on (no registered byte changes between AfterOptimizerStep and the
// next BeforeOptimizerStep), idle windows of the pipeline, save/load.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/test_util.h"
#include "data.h"
#include "optim.h"
#include "trainer.h"

namespace memento::trainer {
namespace {

TEST(CorpusTest, DeterministicAndTopologyIndependent) {
  MarkovCorpus corpus(50, 9);
  const int seq = 12, batch = 8;
  DataCursor a = InitialCursor(9);
  std::vector<int32_t> whole(batch * (seq + 1)), half(batch / 2 * (seq + 1));
  corpus.NextBatch(&a, batch, 0, batch, seq, whole.data());
  // The second half of the global batch, taken as DP rank 1 of 2, is the
  // same as the second half of the whole batch.
  DataCursor b = InitialCursor(9);
  corpus.NextBatch(&b, batch, batch / 2, batch / 2, seq, half.data());
  EXPECT_TRUE(std::equal(half.begin(), half.end(), whole.begin() + half.size()));
  EXPECT_EQ(a.sequences, 8u);
  EXPECT_EQ(a.rng_state, b.rng_state);
  for (int32_t t : whole) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 50);
  }
  // The next batch differs.
  std::vector<int32_t> next(whole.size());
  corpus.NextBatch(&a, batch, 0, batch, seq, next.data());
  EXPECT_NE(next, whole);
}

TEST(CorpusTest, LanguageIsLearnable) {
  // Empirical bigram entropy is far below ln(vocab), near the entropy rate.
  const int vocab = 64;
  MarkovCorpus corpus(vocab, 3);
  std::vector<int32_t> s(200000);
  corpus.Sequence(77, static_cast<int>(s.size()), s.data());
  std::vector<double> counts(vocab * vocab, 0.0), rows(vocab, 0.0);
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    counts[s[i] * vocab + s[i + 1]] += 1;
    rows[s[i]] += 1;
  }
  double h = 0.0;
  for (int a = 0; a < vocab; ++a) {
    for (int b = 0; b < vocab; ++b) {
      double c = counts[a * vocab + b];
      if (c > 0) h -= c / (s.size() - 1) * std::log(c / rows[a]);
    }
  }
  EXPECT_LT(h, corpus.EntropyRate() + 0.05);
  EXPECT_LT(corpus.EntropyRate(), 0.5 * std::log(vocab));
}

TEST(OptimTest, Schedule) {
  AdamWConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
  c.warmup_steps = 4;
  c.decay_steps = 14;
  EXPECT_FLOAT_EQ(LearningRate(c, 1), 0.25f);
  EXPECT_FLOAT_EQ(LearningRate(c, 4), 1.0f);
  EXPECT_NEAR(LearningRate(c, 9), 0.55f, 1e-6);  // half-way down the cosine
  EXPECT_FLOAT_EQ(LearningRate(c, 14), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(c, 100), 0.1f);
  for (int s = 5; s < 14; ++s) EXPECT_LT(LearningRate(c, s + 1), LearningRate(c, s));
}

TEST(OptimTest, ShardedUpdateEqualsWholeUpdate) {
  Rng rng{Mix64(memento::testing::TestSeed("optim_shard"))};
  const size_t n = 1000;
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(rng.Normal());
    g[i] = static_cast<float>(rng.Normal());
  }
  AdamWConfig c;
  c.weight_decay = 0.1f;
  std::vector<float> p1 = p, m1(n, 0.f), v1(n, 0.f), p2 = p, m2(n, 0.f), v2(n, 0.f);
  for (int step = 1; step <= 3; ++step) {
    AdamWUpdate(c, step, 0.01f, p1.data(), g.data(), m1.data(), v1.data(), n);
    AdamWUpdate(c, step, 0.01f, p2.data(), g.data(), m2.data(), v2.data(), 300);
    AdamWUpdate(c, step, 0.01f, p2.data() + 300, g.data() + 300, m2.data() + 300, v2.data() + 300,
                n - 300);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_NE(p1, p);
  // The first step moves every parameter by about lr (Adam normalises).
  std::vector<float> p3 = p, m3(n, 0.f), v3(n, 0.f);
  AdamWConfig plain;
  plain.weight_decay = 0.0f;
  AdamWUpdate(plain, 1, 0.01f, p3.data(), g.data(), m3.data(), v3.data(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(std::fabs(p3[i] - p[i]), 0.01f, 1e-4f) << i;
}

TrainerOptions TinyOptions() {
  TrainerOptions o;
  o.model = ModelConfig{64, 16, 32, 4, 2, 4};
  o.global_batch = 4;
  o.micro_batches = 2;
  o.adam.warmup_steps = 2;
  return o;
}

// Checks memento's contract: registered state is not written between
// AfterOptimizerStep(s) (Snapshot) and BeforeOptimizerStep(s + 1) (Fence).
class ContractHooks : public TrainerHooks {
 public:
  explicit ContractHooks(Trainer** trainer) : trainer_(trainer) {}
  void OnPhase(TrainPhase phase) override {
    ++phases[static_cast<int>(phase)];
    if (phase == TrainPhase::kIdle) ++idle_this_step;
  }
  Status BeforeOptimizerStep(int64_t step) override {
    EXPECT_EQ(step, last_after + 1);
    EXPECT_EQ((*trainer_)->state().step, step - 1);
    if (last_after > 0) {
      EXPECT_EQ(Hash(), hash_at_snapshot) << "step " << step;
    }
    ++before;
    return Status::Ok();
  }
  Status AfterOptimizerStep(int64_t step) override {
    EXPECT_EQ((*trainer_)->state().step, step);
    last_after = step;
    hash_at_snapshot = Hash();
    idle_per_step.push_back(idle_this_step);
    idle_this_step = 0;
    ++after;
    return Status::Ok();
  }
  uint64_t Hash() {
    Trainer* t = *trainer_;
    uint64_t h = Checksum(t->params(), t->padded_params() * sizeof(float));
    h = ChecksumWithSeed(t->adam_m(), t->optimizer_numel() * sizeof(float), h);
    h = ChecksumWithSeed(t->adam_v(), t->optimizer_numel() * sizeof(float), h);
    return ChecksumWithSeed(t->mutable_state(), sizeof(TrainState), h);
  }

  Trainer** trainer_;
  int64_t last_after = 0;
  uint64_t hash_at_snapshot = 0;
  int before = 0, after = 0;
  int phases[3] = {0, 0, 0};
  int idle_this_step = 0;
  std::vector<int> idle_per_step;
};

TEST(TrainerTest, HookContractSingleProcess) {
  Trainer* raw = nullptr;
  ContractHooks hooks(&raw);
  auto t = Trainer::Create(TinyOptions(), &hooks);
  ASSERT_TRUE(t.ok()) << t.status();
  raw = t->get();
  uint64_t initial = hooks.Hash();
  for (int i = 0; i < 4; ++i) {
    auto r = (*t)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->has_loss);
    EXPECT_TRUE(std::isfinite(r->loss));
  }
  EXPECT_EQ(hooks.before, 4);
  EXPECT_EQ(hooks.after, 4);
  EXPECT_NE(hooks.Hash(), initial);
  EXPECT_GT(hooks.phases[static_cast<int>(TrainPhase::kCompute)], 0);
  EXPECT_EQ(hooks.phases[static_cast<int>(TrainPhase::kIdle)], 0);  // no pipeline
}

TEST(TrainerTest, SaveLoadRoundTrip) {
  memento::testing::ScratchDir dir("trainer-unit");
  auto a = Trainer::Create(TinyOptions(), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*a)->Save(dir.path() + "/state").ok());
  auto b = Trainer::Create(TinyOptions(), nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*a)->StateChecksum(), (*b)->StateChecksum());
  float* params_before = (*b)->params();
  ASSERT_TRUE((*b)->Load(dir.path() + "/state").ok());
  EXPECT_EQ((*b)->params(), params_before);  // registered addresses stay valid
  EXPECT_EQ((*a)->StateChecksum(), (*b)->StateChecksum());
  EXPECT_EQ((*b)->state().step, 3);
  auto ra = (*a)->Step();
  auto rb = (*b)->Step();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->loss, rb->loss);
  EXPECT_EQ((*a)->StateChecksum(), (*b)->StateChecksum());
  // A truncated file is refused and leaves the state alone.
  ASSERT_EQ(truncate((dir.path() + "/state").c_str(), 200), 0);
  uint64_t before = (*b)->StateChecksum();
  Status st = (*b)->Load(dir.path() + "/state");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_EQ((*b)->StateChecksum(), before);
}

// Two pipeline stages as two threads of this process (Gloo over TCP between
// them): every receive is reported as an idle window, M per stage and step.
TEST(TrainerTest, PipelineReportsIdleWindows) {
  memento::testing::ScratchDir dir("trainer-pp");
  const int steps = 3;
  TrainerOptions o = TinyOptions();
  o.micro_batches = 4;
  o.comm.topology.pp = 2;
  o.comm.rendezvous_dir = dir.path();
  o.comm.timeout_s = 60;
  Trainer* raw[2] = {nullptr, nullptr};
  ContractHooks hooks0(&raw[0]), hooks1(&raw[1]);
  ContractHooks* hooks[2] = {&hooks0, &hooks1};
  std::vector<double> losses[2];
  std::unique_ptr<Trainer> trainers[2];
  Status status[2];
  auto body = [&](int rank) {
    TrainerOptions ro = o;
    ro.comm.rank = rank;
    auto t = Trainer::Create(ro, hooks[rank]);
    if (!t.ok()) {
      status[rank] = t.status();
      return;
    }
    trainers[rank] = std::move(*t);
    raw[rank] = trainers[rank].get();
    for (int i = 0; i < steps; ++i) {
      auto r = trainers[rank]->Step();
      if (!r.ok()) {
        status[rank] = r.status();
        return;
      }
      if (r->has_loss) losses[rank].push_back(r->loss);
    }
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  EXPECT_TRUE(losses[0].empty());  // only the last stage reports
  ASSERT_EQ(losses[1].size(), static_cast<size_t>(steps));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(hooks[r]->after, steps);
    EXPECT_EQ(hooks[r]->idle_per_step, std::vector<int>(steps, o.micro_batches)) << "rank " << r;
  }
  // Same trajectory as one process with the same micro-batches.
  TrainerOptions single = TinyOptions();
  single.micro_batches = 4;
  auto s = Trainer::Create(single, nullptr);
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < steps; ++i) {
    auto r = (*s)->Step();
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r->loss, losses[1][i], 1e-5 * r->loss) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace memento::trainer
