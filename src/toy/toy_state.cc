#include "toy/toy_state.h"

#include <cstring>

#include "common/checksum.h"

namespace memento::toy {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void DigestChain::Add(const void* data, size_t bytes) {
  digest_ = started_ ? ChecksumWithSeed(data, bytes, digest_) : Checksum(data, bytes);
  started_ = true;
}

uint64_t ToyState::Digest() const {
  DigestChain chain;
  for (const ToyBuffer& b : buffers_) chain.Add(b.data, b.bytes);
  return chain.digest();
}

bool ToyState::SameBytes(const ToyState& other) const {
  if (buffers_.size() != other.buffers_.size()) return false;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const ToyBuffer& a = buffers_[i];
    const ToyBuffer& b = other.buffers_[i];
    if (a.bytes != b.bytes || std::memcmp(a.data, b.data, a.bytes) != 0) return false;
  }
  return true;
}

void ToyState::AddTensor(const char* name, DType dtype, void* data, size_t numel, size_t elem_bytes,
                         StateClass cls, int64_t global_numel, int64_t shard_offset) {
  ToyBuffer b;
  b.meta.name = name;
  b.meta.dtype = dtype;
  b.meta.shape = {static_cast<int64_t>(numel)};
  b.meta.state_class = cls;
  b.meta.global_numel = global_numel;
  b.meta.shard_offset = shard_offset;
  b.data = data;
  b.bytes = numel * elem_bytes;
  buffers_.push_back(std::move(b));
}

void ToyState::AddBlob(const char* name, void* data, size_t bytes) {
  ToyBuffer b;
  b.meta.name = name;
  b.data = data;
  b.bytes = bytes;
  b.is_blob = true;
  buffers_.push_back(std::move(b));
}

// ---- AdamState ------------------------------------------------------------------

AdamState::AdamState(uint64_t bytes, uint64_t param_seed) {
  const size_t words = bytes / 8;
  params_.resize(words / 2);
  m_.resize(words * 3 / 10);
  v_.resize(words - params_.size() - m_.size());
  for (size_t i = 0; i < params_.size(); ++i) params_[i] = SplitMix(i + (param_seed << 48));
  for (size_t i = 0; i < m_.size(); ++i) m_[i] = SplitMix(i + (1ULL << 40));
  for (size_t i = 0; i < v_.size(); ++i) v_[i] = SplitMix(i + (2ULL << 40));
  AddTensor("params", DType::kInt64, params_.data(), params_.size(), 8, StateClass::kReplicated);
  AddTensor("adam.m", DType::kInt64, m_.data(), m_.size(), 8, StateClass::kDpSharded);
  AddTensor("adam.v", DType::kInt64, v_.data(), v_.size(), 8, StateClass::kDpSharded);
  AddBlob("cursor", &cursor_, sizeof(cursor_));
}

// Every word changes, depending on the previous state.
void AdamState::Step() {
  cursor_.step += 1;
  cursor_.rng = SplitMix(cursor_.rng);
  const uint64_t k = cursor_.rng | 1;
  for (size_t i = 0; i < m_.size(); ++i) m_[i] = m_[i] * 6364136223846793005ULL + params_[i];
  for (size_t i = 0; i < v_.size(); ++i) v_[i] = (v_[i] ^ (v_[i] >> 29)) + k;
  for (size_t i = 0; i < params_.size(); ++i) params_[i] += m_[i % m_.size()] ^ (k + i);
}

// ---- DpState --------------------------------------------------------------------

DpState::DpState(uint64_t bytes, int rank, int world) {
  params_.resize(bytes / 8 * 2 / 3);
  opt_.resize(bytes / 8 - params_.size());
  for (size_t i = 0; i < params_.size(); ++i) params_[i] = SplitMix(i);
  for (size_t i = 0; i < opt_.size(); ++i) {
    opt_[i] = SplitMix(i + (static_cast<uint64_t>(rank) << 40));
  }
  cursor_.rng = SplitMix(1000 + rank);
  const auto shard = static_cast<int64_t>(opt_.size());
  AddTensor("params", DType::kInt64, params_.data(), params_.size(), 8, StateClass::kReplicated);
  AddTensor("opt", DType::kInt64, opt_.data(), opt_.size(), 8, StateClass::kDpSharded,
            shard * world, shard * rank);
  AddBlob("cursor", &cursor_, sizeof(cursor_));
}

// `params` moves by a key that is the same on every rank, so the replicas
// stay identical; `opt` and the cursor depend on the rank too.
void DpState::Step() {
  cursor_.step += 1;
  cursor_.rng = SplitMix(cursor_.rng);
  const uint64_t k = SplitMix(cursor_.step);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i] = params_[i] * 6364136223846793005ULL + k;
  }
  for (size_t i = 0; i < opt_.size(); ++i) {
    opt_[i] = (opt_[i] ^ (opt_[i] >> 29)) + k + cursor_.rng;
  }
}

// ---- ParallelState --------------------------------------------------------------

ParallelState::ParallelState(const ParallelLayout& layout, size_t n) : l_(layout) {
  const uint64_t pos = static_cast<uint64_t>(l_.pp_i() * l_.tp + l_.tp_i()) + 1;  // SG seed
  w_.resize(n);
  b_.resize(n / 3 + 5);
  if (l_.zero >= 1) opt_.resize(n / 2);
  for (size_t i = 0; i < w_.size(); ++i) {
    w_[i] = static_cast<int32_t>(SplitMix(pos * 1000003 + i));
  }
  for (size_t i = 0; i < b_.size(); ++i) b_[i] = static_cast<uint8_t>(SplitMix(pos * 7919 + i));
  const uint64_t shard_base = static_cast<uint64_t>(l_.dp_i()) * opt_.size();
  for (size_t i = 0; i < opt_.size(); ++i) {
    opt_[i] = static_cast<int64_t>(SplitMix((pos << 40) + shard_base + i));
  }
  rng_.state = SplitMix(0x5eed0000ULL + static_cast<uint64_t>(l_.rank));
  AddTensor("w", DType::kInt32, w_.data(), w_.size(), 4, StateClass::kReplicated);
  AddTensor("b", DType::kUInt8, b_.data(), b_.size(), 1, StateClass::kReplicated);
  if (!opt_.empty()) {
    const auto shard = static_cast<int64_t>(opt_.size());
    AddTensor("opt", DType::kInt64, opt_.data(), opt_.size(), 8, StateClass::kDpSharded,
              shard * l_.dp, shard * l_.dp_i());
  }
  AddBlob("rng", &rng_, sizeof(rng_));
}

// Replicated tensors depend only on the (pp, tp) position and the step, so DP
// replicas stay identical; the ZeRO shard and the rng depend on this rank too.
void ParallelState::Step() {
  const int64_t step = rng_.step + 1;
  const uint64_t pos = static_cast<uint64_t>(l_.pp_i() * l_.tp + l_.tp_i()) + 1;
  const auto k = static_cast<uint32_t>(SplitMix(pos * 31 + static_cast<uint64_t>(step)));
  uint32_t carry = k;
  for (size_t i = 0; i < w_.size(); ++i) {
    uint32_t x = static_cast<uint32_t>(w_[i]);
    x = x * 1664525u + 1013904223u + carry;
    carry = x >> 7;
    w_[i] = static_cast<int32_t>(x);
  }
  for (size_t i = 0; i < b_.size(); ++i) {
    b_[i] = static_cast<uint8_t>(b_[i] * 5 + 1 + static_cast<uint8_t>(w_[i % w_.size()]));
  }
  for (size_t i = 0; i < opt_.size(); ++i) {
    // Unsigned arithmetic: the same bits as the wrapping the state wants,
    // without signed overflow (UBSan found it).
    opt_[i] = static_cast<int64_t>(static_cast<uint64_t>(opt_[i]) * 6364136223846793005ULL +
                                   static_cast<uint64_t>(int64_t{w_[(i * 2) % w_.size()]}) +
                                   static_cast<uint64_t>(step));
  }
  rng_.step = step;
  rng_.state = SplitMix(rng_.state ^ static_cast<uint64_t>(step));
}

}  // namespace memento::toy
