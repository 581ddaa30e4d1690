// AdamW and the learning-rate schedule (linear warmup, cosine decay).
#pragma once

#include <cstddef>
#include <cstdint>

namespace memento::trainer {

struct AdamWConfig {
  float lr = 1e-3f;        // peak learning rate
  float min_lr = 1e-4f;    // floor of the cosine decay
  int warmup_steps = 10;   // linear warmup from lr / warmup_steps
  int decay_steps = 1000;  // step at which the cosine reaches min_lr
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// Learning rate for optimizer step `step` (1-based).
float LearningRate(const AdamWConfig& config, int64_t step);

// One AdamW update of `count` parameters at step `step` (1-based, for bias
// correction) with learning rate `lr`: m, v and params are updated in place.
// Each element is updated independently, so updating a shard of a flat buffer
// gives the same bits as updating the whole buffer (ZeRO-1 relies on this).
void AdamWUpdate(const AdamWConfig& config, int64_t step, float lr, float* params,
                 const float* grads, float* m, float* v, size_t count);

}  // namespace memento::trainer
