#include "optim.h"

#include <cmath>

namespace memento::trainer {

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

void AdamWUpdate(const AdamWConfig& c, int64_t step, float lr, float* params, const float* grads,
                 float* m, float* v, size_t count) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(c.beta1, static_cast<double>(step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(c.beta2, static_cast<double>(step)));
  for (size_t i = 0; i < count; ++i) {
    float g = grads[i];
    float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    params[i] -= lr * (mhat / (std::sqrt(vhat) + c.eps) + c.weight_decay * params[i]);
  }
}

}  // namespace memento::trainer
