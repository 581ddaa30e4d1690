#include "opt/aor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/checksum.h"

namespace memento::opt {
namespace {

std::string Hex(uint64_t x) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

}  // namespace

Result<std::unique_ptr<AorReplica>> AorReplica::Create(std::shared_ptr<const Optimizer> optimizer,
                                                       uint64_t offset, uint64_t count) {
  if (optimizer == nullptr) return InvalidArgumentError("aor replica: optimizer is null");
  if (count == 0) return InvalidArgumentError("aor replica: empty shard (count 0)");
  if (offset + count < offset) {
    return InvalidArgumentError("aor replica: shard [" + std::to_string(offset) + ", +" +
                                std::to_string(count) + ") overflows");
  }
  return std::unique_ptr<AorReplica>(new AorReplica(std::move(optimizer), offset, count));
}

AorReplica::AorReplica(std::shared_ptr<const Optimizer> optimizer, uint64_t offset, uint64_t count)
    : optimizer_(std::move(optimizer)),
      offset_(offset),
      count_(count),
      state_(optimizer_->num_state(), std::vector<float>(count, 0.0f)),
      scratch_params_(count, 0.0f) {}

std::string AorReplica::Name() const {
  return "aor replica of shard [" + std::to_string(offset_) + ", +" + std::to_string(count_) + ")";
}

uint64_t AorReplica::StateHash() const {
  std::vector<const float*> s;
  for (const auto& b : state_) s.push_back(b.data());
  return ShardChecksum(offset_, count_, nullptr, s);
}

uint64_t AorReplica::ParamsHash(const float* params) const {
  return Checksum(params, count_ * sizeof(float));
}

AorReplica::Saved AorReplica::saved() const {
  Saved s;
  s.step = step_;
  s.seed_step = seed_step_;
  s.seed_checksum = seed_checksum_;
  s.checksum = checksum_;
  s.state_hash = state_hash_;
  s.params_hash = params_hash_;
  s.diverged = diverged_;
  return s;
}

Result<std::unique_ptr<AorReplica>> AorReplica::Adopt(std::shared_ptr<const Optimizer> optimizer,
                                                      uint64_t offset, uint64_t count,
                                                      const Saved& saved,
                                                      const std::vector<const float*>& state) {
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<AorReplica> r,
                           Create(std::move(optimizer), offset, count));
  if (state.size() != r->state_.size()) {
    return InvalidArgumentError(r->Name() + ": " + std::to_string(state.size()) +
                                " saved state slices, the optimizer has " +
                                std::to_string(r->state_.size()));
  }
  for (size_t k = 0; k < state.size(); ++k) {
    if (state[k] == nullptr) {
      return InvalidArgumentError(r->Name() + ": saved state slice " + std::to_string(k) +
                                  " is null");
    }
  }
  if (saved.step < 0) {
    return InvalidArgumentError(r->Name() + ": saved step " + std::to_string(saved.step) +
                                " < 0 (an unseeded replica is not saved)");
  }
  const uint64_t got = ShardChecksum(offset, count, nullptr, state);
  if (got != saved.state_hash) {
    return DataLossError(r->Name() + ": saved state of step " + std::to_string(saved.step) +
                         " hashes to " + Hex(got) + ", it was written as " + Hex(saved.state_hash));
  }
  for (size_t k = 0; k < state.size(); ++k) {
    std::memcpy(r->state_[k].data(), state[k], count * sizeof(float));
  }
  r->step_ = saved.step;
  r->seed_step_ = saved.seed_step;
  r->seed_checksum_ = saved.seed_checksum;
  r->checksum_ = saved.checksum;
  r->state_hash_ = saved.state_hash;
  r->params_hash_ = saved.params_hash;
  r->diverged_ = saved.diverged;
  return r;
}

Status AorReplica::Seed(int64_t step, const float* params, const std::vector<const float*>& state,
                        uint64_t owner_checksum) {
  if (state.size() != state_.size()) {
    return InvalidArgumentError(Name() + ": seed has " + std::to_string(state.size()) +
                                " state slices, the optimizer has " +
                                std::to_string(state_.size()));
  }
  if (params == nullptr) return InvalidArgumentError(Name() + ": seed params slice is null");
  for (size_t k = 0; k < state.size(); ++k) {
    if (state[k] == nullptr) {
      return InvalidArgumentError(Name() + ": seed state slice " + std::to_string(k) + " is null");
    }
  }
  if (step < 0)
    return InvalidArgumentError(Name() + ": seed step " + std::to_string(step) + " < 0");
  const uint64_t got = ShardChecksum(offset_, count_, params, state);
  if (got != owner_checksum) {
    return DataLossError(Name() + ": seed bytes of step " + std::to_string(step) + " hash to " +
                         Hex(got) + ", the owner's shard has " + Hex(owner_checksum));
  }
  for (size_t k = 0; k < state.size(); ++k) {
    std::memcpy(state_[k].data(), state[k], count_ * sizeof(float));
  }
  step_ = seed_step_ = step;
  seed_checksum_ = checksum_ = owner_checksum;
  state_hash_ = StateHash();
  params_hash_ = ParamsHash(params);
  diverged_ = false;
  return Status::Ok();
}

Status AorReplica::Advance(int64_t step, float lr, const float* grads, const float* params) {
  if (step_ < 0) return FailedPreconditionError(Name() + ": not seeded");
  if (diverged_) {
    return FailedPreconditionError(Name() + ": diverged from its owner at step " +
                                   std::to_string(step_) + "; seed it again");
  }
  if (step != step_ + 1) {
    return FailedPreconditionError(Name() + ": holds step " + std::to_string(step_) +
                                   ", cannot apply step " + std::to_string(step) +
                                   " (steps are applied one by one)");
  }
  if (grads == nullptr || params == nullptr) {
    return InvalidArgumentError(Name() + ": null gradient or parameter slice");
  }
  std::memcpy(scratch_params_.data(), params, count_ * sizeof(float));
  Shard shard{offset_, count_, scratch_params_.data(), grads, {}};
  for (auto& b : state_) shard.state.push_back(b.data());
  MEMENTO_RETURN_IF_ERROR(optimizer_->Step(step, lr, shard));
  step_ = step;
  std::vector<const float*> state;
  for (const auto& b : state_) state.push_back(b.data());
  checksum_ = ShardChecksum(offset_, count_, scratch_params_.data(), state);
  state_hash_ = StateHash();
  params_hash_ = ParamsHash(scratch_params_.data());
  return Status::Ok();
}

Status AorReplica::Confirm(int64_t step, uint64_t owner_checksum) {
  if (step != step_) {
    return FailedPreconditionError(Name() + ": holds step " + std::to_string(step_) +
                                   ", cannot confirm step " + std::to_string(step));
  }
  if (owner_checksum != checksum_) {
    diverged_ = true;
    return DataLossError(Name() + ": step " + std::to_string(step) +
                         " recomputed on the host hashes to " + Hex(checksum_) +
                         ", the owner's shard has " + Hex(owner_checksum) +
                         " (the host optimizer was not given what the trainer used: learning "
                         "rate, hyperparameters, gradient)");
  }
  return Status::Ok();
}

Status AorReplica::ConfirmParams(int64_t step, const float* params) {
  if (step != step_) {
    return FailedPreconditionError(Name() + ": holds step " + std::to_string(step_) +
                                   ", cannot confirm step " + std::to_string(step));
  }
  if (params == nullptr) return InvalidArgumentError(Name() + ": null parameter slice");
  const uint64_t got = ParamsHash(params);
  if (got != params_hash_) {
    diverged_ = true;
    return DataLossError(Name() + ": step " + std::to_string(step) +
                         " parameters recomputed on the host hash to " + Hex(params_hash_) +
                         ", the all-gathered ones (the owner's) to " + Hex(got) +
                         " (the host optimizer was not given what the trainer used: learning "
                         "rate, hyperparameters, gradient)");
  }
  return Status::Ok();
}

Status AorReplica::CheckForRestore(int64_t step, uint64_t owner_checksum) const {
  if (step_ < 0) return FailedPreconditionError(Name() + ": not seeded");
  if (step != step_) {
    return FailedPreconditionError(Name() + ": holds step " + std::to_string(step_) +
                                   ", recovery needs step " + std::to_string(step));
  }
  if (diverged_) {
    return DataLossError(Name() + ": diverged from its owner (a failed confirmation)");
  }
  const uint64_t now = StateHash();
  if (now != state_hash_) {
    return DataLossError(Name() + ": step " + std::to_string(step) + " bytes changed in memory (" +
                         Hex(now) + ", written as " + Hex(state_hash_) + ")");
  }
  if (owner_checksum != checksum_) {
    return DataLossError(Name() + ": step " + std::to_string(step) +
                         " recomputed on the host hashes to " + Hex(checksum_) +
                         ", the owner's shard had " + Hex(owner_checksum) +
                         " (the host optimizer was not given what the trainer used)");
  }
  return Status::Ok();
}

}  // namespace memento::opt
