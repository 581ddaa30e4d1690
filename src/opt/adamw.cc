#include "opt/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "opt/encoding.h"

namespace memento::opt {

Status CheckAdamWConfig(const AdamWConfig& c) {
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(c.lr) || !finite(c.min_lr)) {
    return InvalidArgumentError("adamw: lr " + std::to_string(c.lr) + " / min_lr " +
                                std::to_string(c.min_lr) + " must be finite");
  }
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f) || !(c.beta2 >= 0.0f && c.beta2 < 1.0f)) {
    return InvalidArgumentError("adamw: betas (" + std::to_string(c.beta1) + ", " +
                                std::to_string(c.beta2) + ") must lie in [0, 1)");
  }
  if (!(c.eps >= 0.0f) || !finite(c.eps)) {
    return InvalidArgumentError("adamw: eps " + std::to_string(c.eps) + " must be finite and >= 0");
  }
  if (!finite(c.weight_decay)) {
    return InvalidArgumentError("adamw: weight_decay " + std::to_string(c.weight_decay) +
                                " must be finite");
  }
  if (c.warmup_steps < 0 || c.decay_steps <= c.warmup_steps) {
    return InvalidArgumentError("adamw: warmup_steps " + std::to_string(c.warmup_steps) +
                                " must be >= 0 and below decay_steps " +
                                std::to_string(c.decay_steps));
  }
  return Status::Ok();
}

float LearningRate(const AdamWConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps) {
    return c.lr * static_cast<float>(step) / static_cast<float>(c.warmup_steps);
  }
  if (step >= c.decay_steps) return c.min_lr;
  double progress = static_cast<double>(step - c.warmup_steps) /
                    static_cast<double>(c.decay_steps - c.warmup_steps);
  double coeff = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return static_cast<float>(c.min_lr + coeff * (c.lr - c.min_lr));
}

// The trainer's original kernel (examples/trainer/optim.cc before the move),
// operation for operation: changing anything here changes the trainer's bits
// (trainer_unit_test LegacyKernel* and opt_test GoldenBits check it).
// Vectorised (the buffers never overlap: __restrict; -fno-math-errno and the
// dynamic cost model for this file, src/opt/CMakeLists.txt; an AVX2 clone
// picked at load time): each element still goes through the same IEEE
// operations in the same order (no contraction, no reassociation: sqrt,
// division, multiplication and addition are correctly rounded in every
// width), so the bits equal the scalar loop's (opt_test GoldenBits).
//
// Not under ThreadSanitizer: it instruments the ifunc resolver that
// target_clones generates, and the dynamic loader runs that resolver before
// the sanitizer's runtime exists, so every binary that links this kernel died
// with SIGSEGV before main (client_has_test, ninth session). The default
// clone alone computes the same bits.
#if defined(__SANITIZE_THREAD__)
#define MEMENTO_ADAMW_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MEMENTO_ADAMW_CLONES
#endif
#endif
#ifndef MEMENTO_ADAMW_CLONES
#define MEMENTO_ADAMW_CLONES __attribute__((target_clones("avx2", "default")))
#endif
MEMENTO_ADAMW_CLONES void AdamWUpdate(const AdamWConfig& c, int64_t step, float lr,
                                      float* __restrict params, const float* __restrict grads,
                                      float* __restrict m, float* __restrict v, size_t count) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(c.beta1, static_cast<double>(step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(c.beta2, static_cast<double>(step)));
  const float beta1 = c.beta1, beta2 = c.beta2, eps = c.eps, wd = c.weight_decay;
  for (size_t i = 0; i < count; ++i) {
    float g = grads[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * params[i]);
  }
}

// p' = p - lr (u + wd p), u = mhat / (sqrt(vhat) + eps) from the new m, v:
// p = (p' + lr u) / (1 - lr wd); m = (m' - (1 - b1) g) / b1; likewise v.
void AdamWInvert(const AdamWConfig& c, int64_t step, float lr, float* params, const float* grads,
                 float* m, float* v, size_t count) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(c.beta1, static_cast<double>(step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(c.beta2, static_cast<double>(step)));
  for (size_t i = 0; i < count; ++i) {
    float g = grads[i];
    float mhat = m[i] / bc1;
    float vhat = v[i] / bc2;
    float u = mhat / (std::sqrt(vhat) + c.eps);
    params[i] = (params[i] + lr * u) / (1.0f - lr * c.weight_decay);
    m[i] = (m[i] - (1.0f - c.beta1) * g) / c.beta1;
    v[i] = (v[i] - (1.0f - c.beta2) * g * g) / c.beta2;
  }
}

Result<std::unique_ptr<AdamW>> AdamW::Create(const AdamWConfig& config,
                                             std::vector<ParamGroup> groups) {
  MEMENTO_RETURN_IF_ERROR(CheckAdamWConfig(config));
  MEMENTO_RETURN_IF_ERROR(SortAndCheckGroups(&groups));
  return std::unique_ptr<AdamW>(new AdamW(config, std::move(groups)));
}

float AdamW::LearningRate(int64_t step) const { return opt::LearningRate(config_, step); }

namespace {

// Calls fn(group config, a, b) for every group's intersection [a, b) with
// [lo, hi), in offset order.
template <typename Fn>
void ForEachGroupRange(const AdamWConfig& config, const std::vector<ParamGroup>& groups,
                       uint64_t lo, uint64_t hi, Fn&& fn) {
  for (const ParamGroup& g : groups) {
    const uint64_t a = std::max(lo, g.offset), b = std::min(hi, g.offset + g.count);
    if (a >= b) continue;
    AdamWConfig gc = config;
    gc.weight_decay = g.weight_decay;
    fn(gc, a, b);
  }
}

}  // namespace

Status AdamW::Step(int64_t step, float lr, const Shard& shard, UndoSink* undo,
                   uint64_t undo_chunk) const {
  MEMENTO_RETURN_IF_ERROR(CheckShard(shard, num_state(), /*need_grads=*/true));
  if (step < 1)
    return InvalidArgumentError("adamw: step " + std::to_string(step) + " must be >= 1");
  if (undo != nullptr && undo_chunk == 0) return InvalidArgumentError("adamw: undo_chunk is 0");
  const uint64_t lo = shard.offset, hi = shard.offset + shard.count;
  Status st;
  ForEachGroupRange(config_, groups_, lo, hi, [&](const AdamWConfig& gc, uint64_t a, uint64_t b) {
    if (!st.ok()) return;
    const uint64_t i = a - lo;
    if (undo == nullptr) {
      AdamWUpdate(gc, step, lr, shard.params + i, shard.grads + i, shard.state[0] + i,
                  shard.state[1] + i, b - a);
      return;
    }
    for (uint64_t c = a; c < b; c += undo_chunk) {
      const uint64_t n = std::min(undo_chunk, b - c), j = c - lo;
      const float* buffers[3] = {shard.params + j, shard.state[0] + j, shard.state[1] + j};
      st = undo->BeforeWrite(c, n, buffers, 3);
      if (!st.ok()) return;
      AdamWUpdate(gc, step, lr, shard.params + j, shard.grads + j, shard.state[0] + j,
                  shard.state[1] + j, n);
    }
  });
  return st;
}

Status AdamW::InvertAlgebraically(int64_t step, float lr, const Shard& shard) const {
  MEMENTO_RETURN_IF_ERROR(CheckShard(shard, num_state(), /*need_grads=*/true));
  if (step < 1)
    return InvalidArgumentError("adamw: step " + std::to_string(step) + " must be >= 1");
  const uint64_t lo = shard.offset;
  ForEachGroupRange(config_, groups_, lo, shard.offset + shard.count,
                    [&](const AdamWConfig& gc, uint64_t a, uint64_t b) {
                      const uint64_t i = a - lo;
                      AdamWInvert(gc, step, lr, shard.params + i, shard.grads + i,
                                  shard.state[0] + i, shard.state[1] + i, b - a);
                    });
  return Status::Ok();
}

std::string AdamW::Encode() const {
  EncodedAdamW e;
  std::memset(&e, 0, sizeof(e));
  e.lr = config_.lr;
  e.min_lr = config_.min_lr;
  e.warmup_steps = config_.warmup_steps;
  e.decay_steps = config_.decay_steps;
  e.beta1 = config_.beta1;
  e.beta2 = config_.beta2;
  e.eps = config_.eps;
  e.weight_decay = config_.weight_decay;
  std::string out = EncodeHeader(OptimizerKind::kAdamW, groups_.size());
  out.append(reinterpret_cast<const char*>(&e), sizeof(e));
  AppendGroups(groups_, &out);
  return out;
}

Result<std::unique_ptr<Optimizer>> DecodeAdamW(std::string_view body, size_t num_groups) {
  if (body.size() < sizeof(EncodedAdamW)) {
    return InvalidArgumentError("optimizer encoding: adamw parameters truncated (" +
                                std::to_string(body.size()) + " bytes, expected " +
                                std::to_string(sizeof(EncodedAdamW)) + ")");
  }
  EncodedAdamW e;
  std::memcpy(&e, body.data(), sizeof(e));
  AdamWConfig c;
  c.lr = e.lr;
  c.min_lr = e.min_lr;
  c.warmup_steps = e.warmup_steps;
  c.decay_steps = e.decay_steps;
  c.beta1 = e.beta1;
  c.beta2 = e.beta2;
  c.eps = e.eps;
  c.weight_decay = e.weight_decay;
  MEMENTO_ASSIGN_OR_RETURN(std::vector<ParamGroup> groups,
                           ParseGroups(body.substr(sizeof(e)), num_groups));
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<AdamW> o, AdamW::Create(c, std::move(groups)));
  return std::unique_ptr<Optimizer>(std::move(o));
}

}  // namespace memento::opt
