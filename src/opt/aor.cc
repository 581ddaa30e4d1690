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
  return Create(std::move(optimizer), offset, count, Areas{});
}

Result<std::unique_ptr<AorReplica>> AorReplica::Create(std::shared_ptr<const Optimizer> optimizer,
                                                       uint64_t offset, uint64_t count,
                                                       Areas areas) {
  if (optimizer == nullptr) return InvalidArgumentError("aor replica: optimizer is null");
  if (count == 0) return InvalidArgumentError("aor replica: empty shard (count 0)");
  if (offset + count < offset) {
    return InvalidArgumentError("aor replica: shard [" + std::to_string(offset) + ", +" +
                                std::to_string(count) + ") overflows");
  }
  if ((areas.area[0] == nullptr) != (areas.area[1] == nullptr) ||
      (areas.area[0] != nullptr && areas.area[0] == areas.area[1])) {
    return InvalidArgumentError("aor replica: two distinct state areas are needed");
  }
  if (areas.current != 0 && areas.current != 1) {
    return InvalidArgumentError("aor replica: current area " + std::to_string(areas.current));
  }
  return std::unique_ptr<AorReplica>(
      new AorReplica(std::move(optimizer), offset, count, std::move(areas)));
}

AorReplica::AorReplica(std::shared_ptr<const Optimizer> optimizer, uint64_t offset, uint64_t count,
                       Areas areas)
    : optimizer_(std::move(optimizer)),
      offset_(offset),
      count_(count),
      num_state_(optimizer_->num_state()),
      keep_(std::move(areas.keep)),
      current_(areas.current),
      scratch_params_(std::min<uint64_t>(count, kChunk), 0.0f) {
  if (areas.area[0] == nullptr) {
    owned_.assign(2 * static_cast<size_t>(num_state_) * count, 0.0f);
    area_[0] = owned_.data();
    area_[1] = owned_.data() + static_cast<size_t>(num_state_) * count;
  } else {
    area_[0] = areas.area[0];
    area_[1] = areas.area[1];
  }
  chunk_.state.resize(num_state_);
  state_hashes_.resize(num_state_);
  copy_hashes_.resize(num_state_);
  for (int k = 0; k < 3 + num_state_; ++k) {
    streams_.push_back(std::make_unique<StreamingChecksum>());
  }
}

std::string AorReplica::Name() const {
  return "aor replica of shard [" + std::to_string(offset_) + ", +" + std::to_string(count_) + ")";
}

uint64_t AorReplica::StateHash() const {
  // Off the per-step path (adoption, CheckForRestore): a plain vector.
  std::vector<uint64_t> hashes(num_state_);
  for (int k = 0; k < num_state_; ++k) hashes[k] = Checksum(state(k), count_ * sizeof(float));
  return ShardChecksumOfHashes(offset_, count_, nullptr, hashes.data(), num_state_);
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
                                                      const Saved& saved, Areas areas) {
  if (areas.area[0] == nullptr) {
    return InvalidArgumentError("aor replica: Adopt needs the areas holding the saved state");
  }
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<AorReplica> r,
                           Create(std::move(optimizer), offset, count, std::move(areas)));
  if (saved.step < 0) {
    return InvalidArgumentError(r->Name() + ": saved step " + std::to_string(saved.step) +
                                " < 0 (an unseeded replica is not saved)");
  }
  const uint64_t got = r->StateHash();
  if (got != saved.state_hash) {
    return DataLossError(r->Name() + ": saved state of step " + std::to_string(saved.step) +
                         " hashes to " + Hex(got) + ", it was written as " + Hex(saved.state_hash));
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
  if (state.size() != static_cast<size_t>(num_state_)) {
    return InvalidArgumentError(Name() + ": seed has " + std::to_string(state.size()) +
                                " state slices, the optimizer has " + std::to_string(num_state_));
  }
  if (params == nullptr) return InvalidArgumentError(Name() + ": seed params slice is null");
  for (size_t k = 0; k < state.size(); ++k) {
    if (state[k] == nullptr) {
      return InvalidArgumentError(Name() + ": seed state slice " + std::to_string(k) + " is null");
    }
  }
  if (step < 0)
    return InvalidArgumentError(Name() + ": seed step " + std::to_string(step) + " < 0");
  prepared_ = false;  // the spare area is rewritten
  const size_t bytes = count_ * sizeof(float);
  float* spare = area_[1 - current_];
  std::vector<uint64_t> hashes(num_state_);
  for (int k = 0; k < num_state_; ++k) {
    hashes[k] = CopyAndChecksum(spare + k * count_, state[k], bytes);
  }
  const uint64_t ph = Checksum(params, bytes);
  const uint64_t got = ShardChecksumOfHashes(offset_, count_, &ph, hashes.data(), num_state_);
  if (got != owner_checksum) {
    return DataLossError(Name() + ": seed bytes of step " + std::to_string(step) + " hash to " +
                         Hex(got) + ", the owner's shard has " + Hex(owner_checksum));
  }
  current_ = 1 - current_;
  step_ = seed_step_ = step;
  seed_checksum_ = checksum_ = owner_checksum;
  state_hash_ = ShardChecksumOfHashes(offset_, count_, nullptr, hashes.data(), num_state_);
  params_hash_ = ph;
  diverged_ = false;
  return Status::Ok();
}

Result<AorReplica::Inputs> AorReplica::Prepare(int64_t step, float lr, const float* grads,
                                               const float* params) {
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
  prepared_ = false;
  const float* cur = area_[current_];
  float* spare = area_[1 - current_];
  // streams_: 0 grads, 1 params in, 2 params out, 3 + k state slice k.
  for (auto& s : streams_) s->Reset();
  for (uint64_t c = 0; c < count_; c += kChunk) {
    const uint64_t n = std::min(kChunk, count_ - c);
    const size_t bytes = n * sizeof(float);
    streams_[0]->Update(grads + c, bytes);
    streams_[1]->Update(params + c, bytes);
    std::memcpy(scratch_params_.data(), params + c, bytes);
    for (int k = 0; k < num_state_; ++k) {
      std::memcpy(spare + k * count_ + c, cur + k * count_ + c, bytes);
      chunk_.state[k] = spare + k * count_ + c;
    }
    chunk_.offset = offset_ + c;
    chunk_.count = n;
    chunk_.params = scratch_params_.data();
    chunk_.grads = grads + c;
    // Element by element, so the chunks give the bits of one call over the
    // whole shard (optimizer.h's contract, which ZeRO-1 relies on too).
    MEMENTO_RETURN_IF_ERROR(optimizer_->Step(step, lr, chunk_));
    streams_[2]->Update(scratch_params_.data(), bytes);
    for (int k = 0; k < num_state_; ++k) streams_[3 + k]->Update(chunk_.state[k], bytes);
  }
  uint64_t* hs = state_hashes_.data();
  for (int k = 0; k < num_state_; ++k) hs[k] = streams_[3 + k]->Digest();
  prepared_params_hash_ = streams_[2]->Digest();
  prepared_checksum_ =
      ShardChecksumOfHashes(offset_, count_, &prepared_params_hash_, hs, num_state_);
  prepared_state_hash_ = ShardChecksumOfHashes(offset_, count_, nullptr, hs, num_state_);
  prepared_step_ = step;
  prepared_ = true;
  return Inputs{streams_[0]->Digest(), streams_[1]->Digest()};
}

Status AorReplica::Commit() {
  if (!prepared_ || prepared_step_ != step_ + 1) {
    return FailedPreconditionError(Name() + ": no prepared step to commit");
  }
  prepared_ = false;
  current_ = 1 - current_;
  step_ = prepared_step_;
  checksum_ = prepared_checksum_;
  state_hash_ = prepared_state_hash_;
  params_hash_ = prepared_params_hash_;
  return Status::Ok();
}

Status AorReplica::Advance(int64_t step, float lr, const float* grads, const float* params) {
  MEMENTO_ASSIGN_OR_RETURN(Inputs in, Prepare(step, lr, grads, params));
  (void)in;
  return Commit();
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
  if (params == nullptr) return InvalidArgumentError(Name() + ": null parameter slice");
  return ConfirmParamsHash(step, Checksum(params, count_ * sizeof(float)));
}

Status AorReplica::ConfirmParamsHash(int64_t step, uint64_t got) {
  if (step != step_) {
    return FailedPreconditionError(Name() + ": holds step " + std::to_string(step_) +
                                   ", cannot confirm step " + std::to_string(step));
  }
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

Status AorReplica::CopyStateTo(void* dst) const {
  if (step_ < 0) return FailedPreconditionError(Name() + ": not seeded");
  if (diverged_) {
    return FailedPreconditionError(Name() + ": diverged from its owner at step " +
                                   std::to_string(step_) + "; not copied");
  }
  const size_t bytes = count_ * sizeof(float);
  auto* out = static_cast<uint8_t*>(dst);
  for (int k = 0; k < num_state_; ++k) {
    copy_hashes_[k] = CopyAndChecksum(out + k * bytes, state(k), bytes);
  }
  const uint64_t got =
      ShardChecksumOfHashes(offset_, count_, nullptr, copy_hashes_.data(), num_state_);
  if (got != state_hash_) {
    return DataLossError(Name() + ": step " + std::to_string(step_) +
                         " bytes changed in memory since the step was written (copied bytes hash "
                         "to " +
                         Hex(got) + ", written as " + Hex(state_hash_) + ")");
  }
  return Status::Ok();
}

}  // namespace memento::opt
