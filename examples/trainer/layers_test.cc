// Gradient checks: every layer's backward against central finite differences
// of a scalar objective L = sum(out * R) (R random), evaluated in double.
#include "layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "common/test_util.h"
#include "data.h"
#include "model.h"

namespace memento::trainer {
namespace {

std::vector<float> Random(Rng* rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(scale * rng->Normal());
  return v;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Compares analytic[i] with (L(x + eps e_i) - L(x - eps e_i)) / 2 eps for
// every element of x (or `max_checks` of them, spread evenly).
void CheckGradient(const char* what, std::vector<float>* x, const std::vector<float>& analytic,
                   const std::function<double()>& objective, size_t max_checks = 400,
                   float eps = 1e-2f, double rtol = 2e-2, double atol = 2e-3) {
  ASSERT_EQ(x->size(), analytic.size()) << what;
  size_t stride = x->size() <= max_checks ? 1 : x->size() / max_checks;
  int bad = 0;
  for (size_t i = 0; i < x->size(); i += stride) {
    float orig = (*x)[i];
    (*x)[i] = orig + eps;
    double plus = objective();
    (*x)[i] = orig - eps;
    double minus = objective();
    (*x)[i] = orig;
    double numeric = (plus - minus) / (2.0 * eps);
    double tol =
        atol + rtol * std::max(std::fabs(numeric), std::fabs(static_cast<double>(analytic[i])));
    if (std::fabs(numeric - analytic[i]) > tol && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

class LayersTest : public ::testing::Test {
 protected:
  void SetUp() override { rng_.state = Mix64(memento::testing::TestSeed("layers_test")); }
  Rng rng_;
};

TEST_F(LayersTest, Linear) {
  const int n = 6, c = 5, oc = 7;
  auto x = Random(&rng_, n * c), w = Random(&rng_, oc * c), b = Random(&rng_, oc);
  auto r = Random(&rng_, n * oc);
  std::vector<float> out(n * oc);
  auto objective = [&] {
    LinearForward(out.data(), x.data(), w.data(), b.data(), n, c, oc);
    return Dot(out, r);
  };
  std::vector<float> dx(n * c, 0.0f), dw(oc * c, 0.0f), db(oc, 0.0f);
  LinearBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), n, c, oc);
  CheckGradient("linear.dx", &x, dx, objective);
  CheckGradient("linear.dw", &w, dw, objective);
  CheckGradient("linear.db", &b, db, objective);
}

TEST_F(LayersTest, LinearAccumulates) {
  const int n = 3, c = 4, oc = 2;
  auto x = Random(&rng_, n * c), w = Random(&rng_, oc * c), r = Random(&rng_, n * oc);
  std::vector<float> dw1(oc * c, 0.0f), dw2(oc * c, 0.0f);
  LinearBackward(nullptr, dw1.data(), nullptr, r.data(), x.data(), w.data(), n, c, oc);
  LinearBackward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), n, c, oc);
  LinearBackward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), n, c, oc);
  for (int i = 0; i < oc * c; ++i) EXPECT_NEAR(dw2[i], 2 * dw1[i], 1e-5) << i;
}

TEST_F(LayersTest, LayerNorm) {
  const int n = 5, c = 8;
  auto x = Random(&rng_, n * c), w = Random(&rng_, c), b = Random(&rng_, c);
  auto r = Random(&rng_, n * c);
  std::vector<float> out(n * c), mean(n), rstd(n);
  auto objective = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    return Dot(out, r);
  };
  objective();
  std::vector<float> dx(n * c, 0.0f), dw(c, 0.0f), db(c, 0.0f);
  LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), n, c);
  CheckGradient("layernorm.dx", &x, dx, objective);
  CheckGradient("layernorm.dw", &w, dw, objective);
  CheckGradient("layernorm.db", &b, db, objective);
}

TEST_F(LayersTest, Gelu) {
  const int n = 64;
  auto x = Random(&rng_, n, 2.0), r = Random(&rng_, n);
  std::vector<float> out(n);
  auto objective = [&] {
    GeluForward(out.data(), x.data(), n);
    return Dot(out, r);
  };
  std::vector<float> dx(n, 0.0f);
  GeluBackward(dx.data(), x.data(), r.data(), n);
  CheckGradient("gelu.dx", &x, dx, objective, 400, 1e-3f);
}

TEST_F(LayersTest, Attention) {
  const int b = 2, t = 5, c = 8, heads = 2;
  auto qkv = Random(&rng_, b * t * 3 * c), r = Random(&rng_, b * t * c);
  std::vector<float> out(b * t * c), att(b * heads * t * t);
  auto objective = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), b, t, c, heads);
    return Dot(out, r);
  };
  objective();
  // Causality: the output at position 0 only depends on position 0.
  for (int h = 0; h < heads; ++h) EXPECT_FLOAT_EQ(att[h * t * t + 0], 1.0f);
  std::vector<float> dqkv(qkv.size(), 0.0f);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), b, t, c, heads);
  CheckGradient("attention.dqkv", &qkv, dqkv, objective);
}

TEST_F(LayersTest, Embedding) {
  const int b = 2, t = 3, c = 4, v = 5;
  std::vector<int32_t> tokens = {0, 3, 3, 4, 1, 0};
  auto wte = Random(&rng_, v * c), wpe = Random(&rng_, t * c), r = Random(&rng_, b * t * c);
  std::vector<float> out(b * t * c);
  auto objective = [&] {
    EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
    return Dot(out, r);
  };
  std::vector<float> dwte(v * c, 0.0f), dwpe(t * c, 0.0f);
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), tokens.data(), b, t, c);
  CheckGradient("embedding.dwte", &wte, dwte, objective);
  CheckGradient("embedding.dwpe", &wpe, dwpe, objective);
}

TEST_F(LayersTest, CrossEntropy) {
  const int n = 4, v = 6;
  auto logits = Random(&rng_, n * v, 2.0);
  std::vector<int32_t> targets = {1, 5, 0, 2};
  std::vector<float> losses(n), probs(n * v);
  const float scale = 0.25f;
  auto objective = [&] {
    CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), n, v);
    double s = 0;
    for (float l : losses) s += l;
    return s * scale;
  };
  objective();
  std::vector<float> dlogits(n * v);
  CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), scale, n, v);
  CheckGradient("cross_entropy.dlogits", &logits, dlogits, objective, 400, 1e-3f);
}

// The whole model, through Stage: every parameter tensor (sampled) against
// finite differences of the mean token loss.
TEST_F(LayersTest, WholeModel) {
  ModelConfig config;
  config.vocab = 11;
  config.seq = 6;
  config.d_model = 8;
  config.heads = 2;
  config.layers = 2;
  Stage stage(config, StageGeometry{});
  const int b = 2;
  stage.Reserve(1, b);
  std::vector<float> params(stage.num_params());
  stage.InitParameters(params.data(), 7);
  // Larger weights than GPT-2's 0.02 so every path carries visible gradient.
  for (float& p : params) p *= 3.0f;
  MarkovCorpus corpus(config.vocab, 3);
  DataCursor cursor = InitialCursor(3);
  std::vector<int32_t> tokens(b * (config.seq + 1));
  corpus.NextBatch(&cursor, b, 0, b, config.seq, tokens.data());
  // Sum of token losses (not the mean): larger gradients, same code path.
  const float scale = 1.0f;
  auto objective = [&] { return stage.Forward(0, params.data(), tokens.data()) * scale; };
  objective();
  std::vector<float> grads(params.size(), 0.0f);
  stage.Backward(0, params.data(), grads.data(), nullptr, nullptr, tokens.data(), scale);
  for (const ParamTensor& t : stage.tensors()) {
    std::vector<float> x(params.begin() + t.offset, params.begin() + t.offset + t.numel);
    std::vector<float> g(grads.begin() + t.offset, grads.begin() + t.offset + t.numel);
    auto sub_objective = [&] {
      std::copy(x.begin(), x.end(), params.begin() + t.offset);
      return objective();
    };
    // The tolerance must be small against the gradients, or the check is empty.
    float max_abs = 0.0f;
    for (float v : g) max_abs = std::max(max_abs, std::fabs(v));
    EXPECT_GT(max_abs, 2e-2f) << t.name;
    CheckGradient(t.name.c_str(), &x, g, sub_objective, 24, 1e-3f, 3e-2, 1e-3);
    std::copy(x.begin(), x.end(), params.begin() + t.offset);
  }
}

}  // namespace
}  // namespace memento::trainer
