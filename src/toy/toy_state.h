// The deterministic states of the toy trainers: the test trainers
// (tests/shm/test_trainer.cc, tests/cluster_save/cluster_trainer.cc,
// tests/cluster/workload.cc) and `memento demo --trainer`
// (tools/demo_trainer.cc). Each state is a few tensors and a blob, every
// byte rewritten every step from the previous state, so state(s) is a pure
// function of its parameters and s: a test or the demo recomputes it without
// memento and compares a restored state with it bit for bit.
//
// Thread safety: a state is used from one thread (the trainer's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memento/types.h"

namespace memento::toy {

// SplitMix64's output function: a strong 64-bit mix of `x`.
uint64_t SplitMix(uint64_t x);

// One buffer a state registers with the Client: a tensor or (is_blob) the
// private blob named meta.name.
struct ToyBuffer {
  TensorMeta meta;
  void* data = nullptr;
  size_t bytes = 0;
  bool is_blob = false;
};

// The digest the toy trainers report on their D and R lines: the Checksum
// of the first buffer, each next one's seeded with the digest so far.
// durable_test recomputes it from a durable version's tensors.
class DigestChain {
 public:
  void Add(const void* data, size_t bytes);
  // 0 before the first Add.
  uint64_t digest() const { return digest_; }

 private:
  bool started_ = false;
  uint64_t digest_ = 0;
};

class ToyState {
 public:
  virtual ~ToyState() = default;
  ToyState(const ToyState&) = delete;
  ToyState& operator=(const ToyState&) = delete;

  // The buffers in registration order, the blob last. Their pointers stay
  // valid as long as the state (its vectors are sized once, at construction).
  const std::vector<ToyBuffer>& buffers() const { return buffers_; }
  // The step the state is at (0: the initial state).
  virtual int64_t step() const = 0;
  // One optimizer step: step() + 1.
  virtual void Step() = 0;
  // The DigestChain of every buffer in order.
  uint64_t Digest() const;
  // Whether every buffer holds the same bytes as `other`'s (same kind of state).
  bool SameBytes(const ToyState& other) const;

 protected:
  ToyState() = default;
  void AddTensor(const char* name, DType dtype, void* data, size_t numel, size_t elem_bytes,
                 StateClass cls, int64_t global_numel = 0, int64_t shard_offset = 0);
  void AddBlob(const char* name, void* data, size_t bytes);

 private:
  std::vector<ToyBuffer> buffers_;
};

// `params` (replicated), `adam.m` and `adam.v` (dp_sharded, whole on this
// rank) as int64 words and the `cursor` blob {step, rng}: the state of the
// single-node test trainer and of the demo's trainer. `bytes` in all.
// param_seed != 0: other parameters (another pipeline stage on the node).
class AdamState : public ToyState {
 public:
  struct Cursor {
    int64_t step = 0;
    uint64_t rng = 12345;
  };
  explicit AdamState(uint64_t bytes, uint64_t param_seed = 0);
  int64_t step() const override { return cursor_.step; }
  void Step() override;

 private:
  std::vector<uint64_t> params_, m_, v_;
  Cursor cursor_;
};

// One rank of a data-parallel job in lock step: `params` (replicated,
// identical on every rank), `opt` (dp_sharded: this rank's ZeRO-1 shard of
// world shards) and the `cursor` blob: the cluster save tests' trainer.
class DpState : public ToyState {
 public:
  struct Cursor {
    int64_t step = 0;
    uint64_t rng = 0;
  };
  DpState(uint64_t bytes, int rank, int world);
  int64_t step() const override { return cursor_.step; }
  void Step() override;

 private:
  std::vector<uint64_t> params_, opt_;
  Cursor cursor_;
};

// Where a rank sits in a DP x TP x PP job (Megatron's rank order,
// docs/architecture.md).
struct ParallelLayout {
  int rank = 0, world = 1, dp = 1, tp = 1, pp = 1, zero = 0;
  int dp_i() const { return (rank / tp) % dp; }
  int tp_i() const { return rank % tp; }
  int pp_i() const { return rank / (tp * dp); }
};

// One rank of a DP x TP x PP job (the cluster tests' workload):
//   "w"    replicated, I32 [n]: identical on every DP rank of a (pp, tp) position
//   "b"    replicated, U8 [n/3 + 5] (odd length: pieces end mid-tensor)
//   "opt"  dp_sharded, I64 [n/2], only with zero >= 1: this DP rank's 1/dp of
//          a ZeRO-1 optimizer state, global_numel and shard_offset set
//   "rng"  the blob {step, state} of this rank
class ParallelState : public ToyState {
 public:
  struct Rng {
    int64_t step = 0;
    uint64_t state = 0;
  };
  ParallelState(const ParallelLayout& layout, size_t n);
  int64_t step() const override { return rng_.step; }
  void Step() override;

 private:
  ParallelLayout l_;
  std::vector<int32_t> w_;
  std::vector<uint8_t> b_;
  std::vector<int64_t> opt_;
  Rng rng_;
};

}  // namespace memento::toy
