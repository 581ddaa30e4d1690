// AdamW (Loshchilov & Hutter) and its learning-rate schedule (linear warmup,
// cosine decay): the one implementation used by the reference trainer
// (examples/trainer) and by memento on the host (AOR, update-undo). fp32,
// the operation order of the trainer's original kernel (docs/optimizer.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memento/status.h"
#include "opt/optimizer.h"

namespace memento::opt {

struct AdamWConfig {
  float lr = 1e-3f;        // peak learning rate
  float min_lr = 1e-4f;    // floor of the cosine decay
  int warmup_steps = 10;   // linear warmup from lr / warmup_steps
  int decay_steps = 1000;  // step at which the cosine reaches min_lr
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // the default group's; ParamGroup overrides
};

// InvalidArgument naming the field when a value is out of range (non-finite,
// betas outside [0, 1), eps < 0, warmup < 0, decay <= warmup).
Status CheckAdamWConfig(const AdamWConfig& config);

// Learning rate for optimizer step `step` (1-based).
float LearningRate(const AdamWConfig& config, int64_t step);

// The kernel: one AdamW update of `count` elements at step `step` (1-based,
// for bias correction) with learning rate `lr` and the config's
// weight_decay; m, v and params are updated in place. Each element is
// updated independently, so updating a shard of a flat buffer gives the same
// bits as updating the whole buffer (ZeRO-1 relies on this).
void AdamWUpdate(const AdamWConfig& config, int64_t step, float lr, float* params,
                 const float* grads, float* m, float* v, size_t count);

// The algebraic inverse of AdamWUpdate: from the post-update params, m, v
// and the same grads and scalars, computes the pre-update values in place.
// Not bit-exact in fp32 in general (measured in opt_test, docs/optimizer.md).
void AdamWInvert(const AdamWConfig& config, int64_t step, float lr, float* params,
                 const float* grads, float* m, float* v, size_t count);

// AdamW as an Optimizer: state buffers m ("exp_avg") and v ("exp_avg_sq").
class AdamW final : public Optimizer {
 public:
  // `groups` are disjoint ranges of the flat buffer (any order; kept sorted
  // by offset), each with its weight decay (config.weight_decay is not used
  // for them). InvalidArgument on a bad config, an empty or overlapping
  // group.
  static Result<std::unique_ptr<AdamW>> Create(const AdamWConfig& config,
                                               std::vector<ParamGroup> groups);

  std::string_view name() const override { return "adamw"; }
  int num_state() const override { return 2; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  const std::vector<ParamGroup>& groups() const override { return groups_; }
  float LearningRate(int64_t step) const override;
  Status Step(int64_t step, float lr, const Shard& shard, UndoSink* undo = nullptr,
              uint64_t undo_chunk = kDefaultUndoChunk) const override;
  Status InvertAlgebraically(int64_t step, float lr, const Shard& shard) const override;
  std::string Encode() const override;

  const AdamWConfig& config() const { return config_; }

 private:
  AdamW(const AdamWConfig& config, std::vector<ParamGroup> groups)
      : config_(config), groups_(std::move(groups)) {}

  AdamWConfig config_;
  std::vector<ParamGroup> groups_;  // sorted by offset, disjoint
};

}  // namespace memento::opt
