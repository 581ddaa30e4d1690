// update-undo (SWIFT 2.1, issue 19): AdamW's algebraic inverse is not
// bit-exact in fp32 (measured), the undo log is: a step interrupted at a
// random chunk, undone, leaves exactly the pre-step bytes, and the step run
// again equals a failure-free step. A corrupted entry is DataLoss and
// nothing is written.
#include "opt/undo_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "opt/adamw.h"

namespace memento::opt {
namespace {

using Rng = std::mt19937_64;

// A flat buffer with two groups and a padding tail, moments taken a few
// steps into training (so m and v are not zero).
struct Flat {
  size_t n;
  std::vector<ParamGroup> groups;
  std::vector<float> p, g, m, v;

  Flat(Rng* rng, size_t size) : n(size) {
    groups = {{0, n / 3, 0.1f}, {n / 3, n - n / 3 - 7, 0.0f}};  // 7 padding elements
    std::normal_distribution<double> normal(0.0, 1.0);
    p.resize(n);
    g.resize(n);
    m.assign(n, 0.0f);
    v.assign(n, 0.0f);
    for (float& x : p) x = static_cast<float>(normal(*rng) * 0.05);
    AdamWConfig c;
    for (int step = 1; step <= 3; ++step) {
      for (float& x : g) x = static_cast<float>(normal(*rng) * 0.01);
      AdamWUpdate(c, step, 1e-3f, p.data(), g.data(), m.data(), v.data(), n);
    }
    for (float& x : g) x = static_cast<float>(normal(*rng) * 0.01);
  }
  Shard All() { return Shard{0, n, p.data(), g.data(), {m.data(), v.data()}}; }
  bool SameBytes(const Flat& o) const {
    return std::memcmp(p.data(), o.p.data(), n * 4) == 0 &&
           std::memcmp(m.data(), o.m.data(), n * 4) == 0 &&
           std::memcmp(v.data(), o.v.data(), n * 4) == 0;
  }
};

size_t DifferentElements(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], 4) != 0;
  return d;
}

// Forwards to an UndoLog and fails after `limit` chunks: the step stops
// there with the earlier chunks written (a failure inside the update).
class InterruptingSink : public UndoSink {
 public:
  InterruptingSink(UndoLog* log, int limit) : log_(log), limit_(limit) {}
  Status BeforeWrite(uint64_t offset, uint64_t count, const float* const* buffers,
                     int num_buffers) override {
    if (seen_++ == limit_) return AbortedError("injected failure inside the optimizer step");
    return log_->BeforeWrite(offset, count, buffers, num_buffers);
  }

 private:
  UndoLog* log_;
  int limit_, seen_ = 0;
};

TEST(UndoLogTest, AlgebraicInverseIsNotBitExact) {
  Rng rng(memento::testing::TestSeed("undo_inverse"));
  Flat before(&rng, 100000);
  auto o = AdamW::Create(AdamWConfig{}, before.groups);
  ASSERT_TRUE(o.ok()) << o.status();
  Flat f = before;
  ASSERT_TRUE((*o)->Step(4, 1e-3f, f.All()).ok());
  ASSERT_TRUE((*o)->InvertAlgebraically(4, 1e-3f, f.All()).ok());
  const size_t dp = DifferentElements(f.p, before.p), dm = DifferentElements(f.m, before.m),
               dv = DifferentElements(f.v, before.v);
  std::printf(
      "algebraic inverse of one AdamW step, %zu elements: params %.2f%%, m %.2f%%, "
      "v %.2f%% differ from the pre-step bits\n",
      f.n, 100.0 * dp / f.n, 100.0 * dm / f.n, 100.0 * dv / f.n);
  // If this ever became exact, the log could shrink to the scalars; today
  // it is not, which is why update-undo logs the pre-update values.
  EXPECT_GT(dp + dm + dv, 0u);
}

TEST(UndoLogTest, InterruptedStepUndoneBitForBitThenRedoneEqualsFailureFree) {
  const uint64_t seed = memento::testing::TestSeed("undo_interrupt");
  Rng rng(seed);
  Flat before(&rng, 5000);
  auto o = AdamW::Create(AdamWConfig{}, before.groups);
  ASSERT_TRUE(o.ok()) << o.status();
  Flat clean = before;
  ASSERT_TRUE((*o)->Step(4, 1e-3f, clean.All()).ok());
  const uint64_t chunk = 300;
  int chunks = 0;  // chunks of a whole step (they end at group boundaries)
  {
    Flat f = before;
    UndoLog log(3);
    ASSERT_TRUE((*o)->Step(4, 1e-3f, f.All(), &log, chunk).ok());
    chunks = static_cast<int>(log.num_entries());
  }
  ASSERT_GT(chunks, 10);
  // Interrupt before every chunk (0: before anything is written) and after
  // the whole step (1000: a replica that completed while another failed).
  std::vector<int> limits;
  for (int k = 0; k < chunks; ++k) limits.push_back(k);
  limits.push_back(1000);
  for (int k : limits) {
    SCOPED_TRACE("interrupted before chunk " + std::to_string(k));
    Flat f = before;
    UndoLog log(3);
    log.Begin(4, 1e-3f);
    InterruptingSink sink(&log, k);
    Status st = (*o)->Step(4, 1e-3f, f.All(), &sink, chunk);
    if (k < 1000) {
      EXPECT_EQ(st.code(), StatusCode::kAborted) << st;
    }
    if (k == 1000) {
      EXPECT_TRUE(st.ok()) << st;
      EXPECT_TRUE(f.SameBytes(clean));
      EXPECT_EQ(log.covered(0), before.n - 7);  // the padding is never written
    }
    if (k > 0 && k < 1000) {
      EXPECT_FALSE(f.SameBytes(before));  // half updated
    }
    ASSERT_TRUE(log.Undo(f.All()).ok());
    EXPECT_TRUE(f.SameBytes(before));
    ASSERT_TRUE((*o)->Step(4, 1e-3f, f.All()).ok());
    EXPECT_TRUE(f.SameBytes(clean));
  }
  // A random interruption through the encoded log (what a log kept outside
  // the trainer carries), replayable with the printed seed.
  std::uniform_int_distribution<int> pick(0, chunks - 1);
  const int k = pick(rng);
  std::printf("seed %llu: interrupted before chunk %d of %d\n",
              static_cast<unsigned long long>(seed), k, chunks);
  Flat f = before;
  UndoLog log(3);
  log.Begin(4, 1e-3f);
  InterruptingSink sink(&log, k);
  (void)(*o)->Step(4, 1e-3f, f.All(), &sink, chunk);
  auto decoded = UndoLog::Decode(log.Encode());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->step(), 4);
  EXPECT_EQ(decoded->num_entries(), log.num_entries());
  ASSERT_TRUE(decoded->Undo(f.All()).ok());
  EXPECT_TRUE(f.SameBytes(before));
}

TEST(UndoLogTest, OtherShardsParamsAndZeroOneTargets) {
  // ZeRO-1 with DP 2: this rank updates [n/2, n), and the all-gather then
  // overwrites the params of [0, n/2); the state buffers hold the shard only.
  Rng rng(memento::testing::TestSeed("undo_zero1"));
  Flat before(&rng, 2000);
  auto o = AdamW::Create(AdamWConfig{}, before.groups);
  ASSERT_TRUE(o.ok());
  Flat f = before;
  const uint64_t half = f.n / 2;
  std::vector<float> m(f.m.begin() + half, f.m.end()), v(f.v.begin() + half, f.v.end());
  const std::vector<float> m0 = m, v0 = v;
  Shard shard{half, f.n - half, f.p.data() + half, f.g.data() + half, {m.data(), v.data()}};
  UndoLog log(3);
  log.Begin(2, 1e-3f);
  ASSERT_TRUE((*o)->Step(2, 1e-3f, shard, &log, 128).ok());
  ASSERT_TRUE(log.RecordBuffer(0, 0, half, f.p.data()).ok());
  for (uint64_t i = 0; i < half; ++i) f.p[i] += 1.0f;  // the all-gather's write
  std::vector<UndoTarget> targets = {
      {f.p.data(), 0, f.n}, {m.data(), half, f.n - half}, {v.data(), half, f.n - half}};
  ASSERT_TRUE(log.Undo(targets).ok());
  EXPECT_EQ(0, std::memcmp(f.p.data(), before.p.data(), f.n * 4));
  EXPECT_EQ(m, m0);
  EXPECT_EQ(v, v0);
  // A target that does not cover an entry is refused before anything moves.
  for (uint64_t i = 0; i < half; ++i) f.p[i] += 1.0f;
  const std::vector<float> p_dirty = f.p;
  targets[0] = {f.p.data() + half, half, f.n - half};
  Status st = log.Undo(targets);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("outside buffer 0"), std::string::npos) << st;
  EXPECT_EQ(f.p, p_dirty);
  EXPECT_EQ(log.RecordBuffer(3, 0, 1, f.p.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Undo(std::vector<UndoTarget>(2)).code(), StatusCode::kInvalidArgument);
}

TEST(UndoLogTest, CorruptedEntryIsDataLossAndNothingIsWritten) {
  Rng rng(memento::testing::TestSeed("undo_corrupt"));
  Flat before(&rng, 3000);
  auto o = AdamW::Create(AdamWConfig{}, before.groups);
  ASSERT_TRUE(o.ok());
  Flat f = before;
  UndoLog log(3);
  log.Begin(4, 1e-3f);
  ASSERT_TRUE((*o)->Step(4, 1e-3f, f.All(), &log, 500).ok());
  ASSERT_GT(log.num_entries(), 3u);
  const Flat after = f;
  // In memory.
  UndoLog bad = log;
  bad.CorruptForTest(2);
  Status st = bad.Undo(f.All());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("entry 2"), std::string::npos) << st;
  EXPECT_TRUE(f.SameBytes(after));  // not half undone
  // In its encoding: flip a byte of the values, of an entry record, cut it.
  const std::string bytes = log.Encode();
  for (size_t at : {bytes.size() - 5, size_t{48 + 40 + 8}, size_t{48 + 3 * 40 + 36}}) {
    std::string b = bytes;
    b[at] ^= 0x10;
    auto d = UndoLog::Decode(b);
    if (d.ok()) {
      Status u = d->Undo(f.All());
      EXPECT_FALSE(u.ok()) << "flipped byte " << at;
    }
    EXPECT_TRUE(f.SameBytes(after)) << "flipped byte " << at;
  }
  EXPECT_EQ(UndoLog::Decode(bytes.substr(0, bytes.size() - 4)).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(UndoLog::Decode(bytes.substr(0, 20)).status().code(), StatusCode::kInvalidArgument);
  std::string magic = bytes;
  magic[0] = 'X';
  EXPECT_EQ(UndoLog::Decode(magic).status().code(), StatusCode::kInvalidArgument);
  // The intact log still undoes.
  ASSERT_TRUE(log.Undo(f.All()).ok());
  EXPECT_TRUE(f.SameBytes(before));
  std::printf(
      "undo log of a %zu-element step: %zu entries, %llu value bytes (3 x 4 bytes per "
      "updated element), %zu encoded bytes\n",
      f.n, log.num_entries(), static_cast<unsigned long long>(log.value_bytes()), bytes.size());
}

}  // namespace
}  // namespace memento::opt
