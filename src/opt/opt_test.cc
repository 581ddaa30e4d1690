// src/opt: the AdamW kernel's bits (golden values from the trainer's kernel
// before it moved here), the LR schedule, shard/chunk independence, groups,
// the undo sink, the encoding round trip and its refusals, shard checksums.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "opt/adamw.h"
#include "opt/optimizer.h"

namespace memento::opt {
namespace {

using Rng = std::mt19937_64;

double Normal(Rng* rng) { return std::normal_distribution<double>(0.0, 1.0)(*rng); }

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

std::vector<float> RandomFloats(Rng* rng, size_t n, double scale) {
  std::vector<float> out(n);
  for (float& x : out) x = static_cast<float>(Normal(rng) * scale);
  return out;
}

// Output bits of examples/trainer/optim.cc's AdamWUpdate (commit 90ac622,
// before the move), computed by that code built with -O0, -O2 and -O3
// (all equal). Pins the operation order: any reordering changes them.
TEST(AdamWTest, GoldenBits) {
  AdamWConfig c;  // defaults
  float p[8], g[8], m[8], v[8];
  for (int i = 0; i < 8; i++) {
    p[i] = 0.02f * (i - 3.5f);
    g[i] = (i % 3 - 1) * 0.37f + 0.001f * i;
    m[i] = 0.01f * i;
    v[i] = 0.0001f * (i + 1);
  }
  for (int step = 1; step <= 3; ++step) {
    AdamWUpdate(c, step, LearningRate(c, step * 7), p, g, m, v, 8);
  }
  const uint32_t want[8][3] = {
      {0xbd89d064, 0xbdcd5a5e, 0x3ca0a778}, {0xbd586be0, 0x3bf7c242, 0x3933f441},
      {0xbd08a822, 0x3dec52a8, 0x3ca3caf4}, {0xbc09a71c, 0xbd9ee5f2, 0x3ca02d90},
      {0x3b37354a, 0x3cf7c242, 0x39e1f3be}, {0x3cd1f9a1, 0x3e0d6389, 0x3ca884aa},
      {0x3d4edb20, 0xbd60e30b, 0x3c9fb908}, {0x3d75e4be, 0x3d58c9fb, 0x3a35a2f8},
  };
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Bits(p[i]), want[i][0]) << "param " << i;
    EXPECT_EQ(Bits(m[i]), want[i][1]) << "m " << i;
    EXPECT_EQ(Bits(v[i]), want[i][2]) << "v " << i;
  }
  EXPECT_EQ(Bits(LearningRate(c, 3)), 0x399d4952u);
  EXPECT_EQ(Bits(LearningRate(c, 500)), 0x3a120d03u);
  EXPECT_EQ(Bits(LearningRate(c, 2000)), 0x38d1b717u);
}

// The kernel is vectorised (adamw.cc): a call over many elements (vector
// body and scalar tail) gives the bits of one call per element (the scalar
// path), over values that exercise rounding (random, tiny, large).
TEST(AdamWTest, VectorLoopEqualsElementByElement) {
  AdamWConfig c;
  const size_t n = 1003;  // not a multiple of any vector width
  std::vector<float> p(n), g(n), m(n), v(n);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<float>(static_cast<int64_t>(x >> 11) % 2000001 - 1000000) * 1e-6f;
  };
  for (size_t i = 0; i < n; ++i) {
    p[i] = next() * (i % 7 == 0 ? 1e3f : 0.05f);
    g[i] = next() * (i % 5 == 0 ? 1e-6f : 1.0f);
    m[i] = next() * 0.01f;
    v[i] = std::fabs(next()) * 1e-4f;
  }
  std::vector<float> p1 = p, m1 = m, v1 = v;
  for (int step = 1; step <= 4; ++step) {
    const float lr = LearningRate(c, step);
    AdamWUpdate(c, step, lr, p.data(), g.data(), m.data(), v.data(), n);
    for (size_t i = 0; i < n; ++i) AdamWUpdate(c, step, lr, &p1[i], &g[i], &m1[i], &v1[i], 1);
  }
  EXPECT_EQ(std::memcmp(p.data(), p1.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(m.data(), m1.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v.data(), v1.data(), n * sizeof(float)), 0);
}

TEST(AdamWTest, Schedule) {
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
  auto o = AdamW::Create(c, {{0, 1, 0.0f}});
  ASSERT_TRUE(o.ok()) << o.status();
  for (int s = 1; s < 20; ++s) EXPECT_EQ(Bits((*o)->LearningRate(s)), Bits(LearningRate(c, s)));
}

TEST(AdamWTest, ShardedUpdateEqualsWholeUpdate) {
  Rng rng(memento::testing::TestSeed("optim_shard"));
  const size_t n = 1000;
  std::vector<float> p = RandomFloats(&rng, n, 1.0), g = RandomFloats(&rng, n, 1.0);
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

// A flat buffer with three groups and a padding tail, the way the trainer
// lays out a stage (matrices with weight decay, norms and biases without).
struct Flat {
  std::vector<ParamGroup> groups = {{0, 300, 0.1f}, {300, 50, 0.0f}, {350, 600, 0.1f}};
  size_t n = 1000;  // [950, 1000) is padding: in no group
  std::vector<float> p, g, m, v;

  explicit Flat(Rng* rng) {
    p = RandomFloats(rng, n, 0.5);
    g = RandomFloats(rng, n, 0.1);
    m = RandomFloats(rng, n, 0.01);
    v.resize(n);
    for (float& x : v) x = static_cast<float>(std::fabs(Normal(rng)) * 1e-3);
  }
  Shard Range(uint64_t offset, uint64_t count) {
    return Shard{offset,
                 count,
                 p.data() + offset,
                 g.data() + offset,
                 {m.data() + offset, v.data() + offset}};
  }
  // The kernel applied group by group: what the trainer did before.
  void Reference(const AdamWConfig& c, int64_t step, float lr, uint64_t lo, uint64_t hi) {
    for (const ParamGroup& gr : groups) {
      uint64_t a = std::max<uint64_t>(lo, gr.offset), b = std::min(hi, gr.offset + gr.count);
      if (a >= b) continue;
      AdamWConfig gc = c;
      gc.weight_decay = gr.weight_decay;
      AdamWUpdate(gc, step, lr, p.data() + a, g.data() + a, m.data() + a, v.data() + a, b - a);
    }
  }
};

TEST(AdamWTest, OptimizerStepEqualsKernelPerGroup) {
  Rng rng(memento::testing::TestSeed("optim_groups"));
  Flat a(&rng);
  Flat b = a;
  const std::vector<float> p0 = a.p;
  AdamWConfig c;
  auto o = AdamW::Create(c, {a.groups[2], a.groups[0], a.groups[1]});  // any order
  ASSERT_TRUE(o.ok()) << o.status();
  for (int step = 1; step <= 4; ++step) {
    const float lr = LearningRate(c, step);
    // Shards as ZeRO-1 over 4 ranks would cut them, in reverse order.
    for (int r = 3; r >= 0; --r) ASSERT_TRUE((*o)->Step(step, lr, a.Range(r * 250, 250)).ok());
    b.Reference(c, step, lr, 0, b.n);
  }
  EXPECT_EQ(0, std::memcmp(a.p.data(), b.p.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.m.data(), b.m.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.n * 4));
  // Padding is never touched.
  for (size_t i = 950; i < a.n; ++i) EXPECT_EQ(Bits(a.p[i]), Bits(p0[i])) << i;
  EXPECT_NE(a.p[0], p0[0]);
}

// Records every chunk's pre-update values, the way an undo log would.
class RecordingSink : public UndoSink {
 public:
  struct Chunk {
    uint64_t offset, count;
    std::vector<float> values[3];
  };
  Status BeforeWrite(uint64_t offset, uint64_t count, const float* const* buffers,
                     int num_buffers) override {
    if (fail_after >= 0 && static_cast<int>(chunks.size()) == fail_after) {
      return AbortedError("sink full");
    }
    EXPECT_EQ(num_buffers, 3);
    Chunk c{offset, count, {}};
    for (int k = 0; k < 3; ++k) c.values[k].assign(buffers[k], buffers[k] + count);
    chunks.push_back(std::move(c));
    return Status::Ok();
  }
  std::vector<Chunk> chunks;
  int fail_after = -1;
};

TEST(AdamWTest, UndoSinkSeesEveryChunkBeforeItIsWritten) {
  Rng rng(memento::testing::TestSeed("optim_undo"));
  Flat a(&rng);
  Flat b = a;
  const Flat before = a;
  AdamWConfig c;
  auto o = AdamW::Create(c, a.groups);
  ASSERT_TRUE(o.ok());
  RecordingSink sink;
  ASSERT_TRUE((*o)->Step(5, 0.01f, a.Range(100, 800), &sink, 64).ok());
  ASSERT_TRUE((*o)->Step(5, 0.01f, b.Range(100, 800)).ok());
  // Chunking changes no bit.
  EXPECT_EQ(0, std::memcmp(a.p.data(), b.p.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.n * 4));
  // The chunks tile the group intersections [100, 900) exactly, in order.
  uint64_t next = 100, covered = 0;
  for (const auto& ch : sink.chunks) {
    EXPECT_GE(ch.offset, next);
    EXPECT_LE(ch.count, 64u);
    next = ch.offset + ch.count;
    covered += ch.count;
    for (uint64_t i = 0; i < ch.count; ++i) {
      EXPECT_EQ(Bits(ch.values[0][i]), Bits(before.p[ch.offset + i]));
      EXPECT_EQ(Bits(ch.values[1][i]), Bits(before.m[ch.offset + i]));
      EXPECT_EQ(Bits(ch.values[2][i]), Bits(before.v[ch.offset + i]));
    }
  }
  EXPECT_EQ(covered, 800u);
  // Putting the recorded values back restores every byte.
  for (const auto& ch : sink.chunks) {
    std::memcpy(a.p.data() + ch.offset, ch.values[0].data(), ch.count * 4);
    std::memcpy(a.m.data() + ch.offset, ch.values[1].data(), ch.count * 4);
    std::memcpy(a.v.data() + ch.offset, ch.values[2].data(), ch.count * 4);
  }
  EXPECT_EQ(0, std::memcmp(a.p.data(), before.p.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.m.data(), before.m.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.v.data(), before.v.data(), a.n * 4));
  // A failing sink stops the step before the refused chunk is written.
  Flat d = before;
  RecordingSink failing;
  failing.fail_after = 2;
  Status st = (*o)->Step(5, 0.01f, d.Range(0, d.n), &failing, 100);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st;
  ASSERT_EQ(failing.chunks.size(), 2u);
  const uint64_t stop = failing.chunks[1].offset + failing.chunks[1].count;
  for (size_t i = stop; i < d.n; ++i) ASSERT_EQ(Bits(d.p[i]), Bits(before.p[i])) << i;
  EXPECT_NE(Bits(d.p[0]), Bits(before.p[0]));
}

TEST(AdamWTest, RefusesMalformedShardsAndConfigs) {
  auto o = AdamW::Create(AdamWConfig{}, {{0, 10, 0.1f}});
  ASSERT_TRUE(o.ok());
  std::vector<float> p(10), g(10), m(10), v(10);
  Shard ok{0, 10, p.data(), g.data(), {m.data(), v.data()}};
  Shard one_state = ok;
  one_state.state.pop_back();
  EXPECT_EQ((*o)->Step(1, 0.1f, one_state).code(), StatusCode::kInvalidArgument);
  Shard no_grads = ok;
  no_grads.grads = nullptr;
  EXPECT_EQ((*o)->Step(1, 0.1f, no_grads).code(), StatusCode::kInvalidArgument);
  Shard null_m = ok;
  null_m.state[0] = nullptr;
  EXPECT_EQ((*o)->Step(1, 0.1f, null_m).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*o)->Step(0, 0.1f, ok).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*o)->Step(1, 0.1f, ok).ok());

  AdamWConfig bad;
  bad.beta1 = 1.0f;
  EXPECT_EQ(AdamW::Create(bad, {}).status().code(), StatusCode::kInvalidArgument);
  bad = AdamWConfig{};
  bad.eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(AdamW::Create(bad, {}).status().code(), StatusCode::kInvalidArgument);
  bad = AdamWConfig{};
  bad.decay_steps = bad.warmup_steps;
  EXPECT_EQ(AdamW::Create(bad, {}).status().code(), StatusCode::kInvalidArgument);
  Status st = AdamW::Create(AdamWConfig{}, {{0, 10, 0.1f}, {9, 5, 0.0f}}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("overlaps"), std::string::npos) << st;
  EXPECT_EQ(AdamW::Create(AdamWConfig{}, {{3, 0, 0.1f}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(OptimizerEncodingTest, RoundTripComputesTheSameBits) {
  Rng rng(memento::testing::TestSeed("optim_enc"));
  Flat a(&rng);
  Flat b = a;
  AdamWConfig c;
  c.lr = 3e-4f;
  c.beta2 = 0.999f;
  c.warmup_steps = 3;
  c.decay_steps = 50;
  auto o = AdamW::Create(c, a.groups);
  ASSERT_TRUE(o.ok());
  const std::string bytes = (*o)->Encode();
  auto d = DecodeOptimizer(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "adamw");
  EXPECT_EQ((*d)->num_state(), 2);
  EXPECT_EQ((*d)->state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  ASSERT_EQ((*d)->groups().size(), 3u);
  EXPECT_EQ((*d)->Encode(), bytes);
  for (int step = 1; step <= 6; ++step) {
    ASSERT_EQ(Bits((*d)->LearningRate(step)), Bits((*o)->LearningRate(step)));
    ASSERT_TRUE((*o)->Step(step, (*o)->LearningRate(step), a.Range(0, a.n)).ok());
    ASSERT_TRUE((*d)->Step(step, (*d)->LearningRate(step), b.Range(0, b.n)).ok());
  }
  EXPECT_EQ(0, std::memcmp(a.p.data(), b.p.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.m.data(), b.m.data(), a.n * 4));
  EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.n * 4));
}

TEST(OptimizerEncodingTest, RefusesMalformedBytes) {
  auto o = AdamW::Create(AdamWConfig{}, {{0, 10, 0.1f}, {10, 4, 0.0f}});
  ASSERT_TRUE(o.ok());
  const std::string good = (*o)->Encode();
  auto code = [](std::string_view b) { return DecodeOptimizer(b).status().code(); };
  // Every truncation and an extra byte.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(code(good.substr(0, n)), StatusCode::kInvalidArgument) << n;
  }
  EXPECT_EQ(code(good + "x"), StatusCode::kInvalidArgument);
  std::string bad = good;
  bad[0] = 'X';  // magic
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = good;
  bad[8] = 2;  // version
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = good;
  bad[12] = 7;  // kind
  Status st = DecodeOptimizer(bad).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kind 7"), std::string::npos) << st;
  bad = good;
  bad[16] = 100;  // number of groups
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&bad[24 + 16], &nan, 4);  // beta1
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = good;
  const uint64_t overlap = 5;
  std::memcpy(&bad[24 + 32 + 24], &overlap, 8);  // second group's offset
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  EXPECT_TRUE(DecodeOptimizer(good).ok());
}

TEST(ShardChecksumTest, CoversEveryByteAndTheRange) {
  Rng rng(memento::testing::TestSeed("optim_sum"));
  Flat a(&rng);
  Shard s = a.Range(100, 200);
  const uint64_t h = ShardChecksum(s);
  EXPECT_EQ(h, ShardChecksum(100, 200, a.p.data() + 100, {a.m.data() + 100, a.v.data() + 100}));
  Flat b = a;
  EXPECT_EQ(h, ShardChecksum(b.Range(100, 200)));
  // One flipped bit anywhere in the shard's params, m or v changes it.
  for (std::vector<float>* buf : {&b.p, &b.m, &b.v}) {
    for (size_t i : {size_t{100}, size_t{250}, size_t{299}}) {
      float saved = (*buf)[i];
      uint32_t u = Bits(saved) ^ 1u;
      std::memcpy(&(*buf)[i], &u, 4);
      EXPECT_NE(ShardChecksum(b.Range(100, 200)), h) << i;
      (*buf)[i] = saved;
    }
  }
  // Bytes outside the shard and the gradients do not count.
  b.p[99] += 1.0f;
  b.v[300] += 1.0f;
  b.g[150] += 1.0f;
  EXPECT_EQ(ShardChecksum(b.Range(100, 200)), h);
  // Same bytes, other range: differs. Without params: differs.
  Shard moved = s;
  moved.offset = 0;
  EXPECT_NE(ShardChecksum(moved), h);
  Shard state_only = s;
  state_only.params = nullptr;
  EXPECT_NE(ShardChecksum(state_only), h);
}

}  // namespace
}  // namespace memento::opt
