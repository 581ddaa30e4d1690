// Host optimizers, bit-exact with the trainer's (DESIGN.md: src/opt). The
// interface lets memento run "the trainer's optimizer step" outside the
// trainer: the agent brings a peer's ZeRO-1 shard forward from a gradient
// slice (REFT AOR, Eq. 4), and update-undo (SWIFT 2.1) puts a half-applied
// step back. docs/optimizer.md describes the contract; the one
// implementation today is AdamW (adamw.h), used by the reference trainer.
//
// Vocabulary. The trainer's parameters are one flat fp32 buffer (all of a
// rank's tensors back to back, padded for ZeRO-1). An optimizer has per
// element state buffers of the same length (AdamW: exp_avg m and exp_avg_sq
// v). A `Shard` is a range [offset, offset + count) of the flat buffer and
// the matching slices of the gradient and of every state buffer; under
// ZeRO-1 a DP rank owns one shard of the state and updates that range only.
// A `ParamGroup` (PyTorch's param_groups) is a range of the flat buffer with
// its own hyperparameters (weight decay); elements that are in no group
// (padding) are never touched.
//
// Bit-exactness contract (what AOR and update-undo rely on):
//   - element i's new (param, state) depends only on element i's old values,
//     its gradient and the step's scalars (step, lr, hyperparameters), so
//     updating a shard, or the shard in chunks in any order, gives the same
//     bits as updating the whole buffer at once;
//   - the kernels are compiled once, in this library, with
//     -ffp-contract=off: the trainer and the agent run the same instructions.
//
// Thread safety: an Optimizer is immutable after creation; Step() may be
// called from several threads on disjoint shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"

namespace memento::opt {

// A range of the flat buffer and where its elements live. Every pointer
// points at the element `offset` of its buffer, so element offset + i is
// params[i], grads[i], state[k][i].
struct Shard {
  uint64_t offset = 0;  // first element, in flat-buffer coordinates
  uint64_t count = 0;   // elements
  float* params = nullptr;
  const float* grads = nullptr;
  std::vector<float*> state;  // Optimizer::num_state() buffers
};

// A range of the flat buffer updated with one set of hyperparameters.
struct ParamGroup {
  uint64_t offset = 0;
  uint64_t count = 0;
  float weight_decay = 0.0f;
};

// Receives the values a step is about to overwrite, before it writes them
// (update-undo: the minimum that makes an undo bit-exact, docs/optimizer.md).
class UndoSink {
 public:
  virtual ~UndoSink() = default;
  // Called before the optimizer writes elements [offset, offset + count)
  // (flat coordinates) of the params and of every state buffer. `buffers`
  // holds 1 + num_state() pointers (params, then each state buffer), each at
  // element `offset`; they still hold the pre-update values. A non-OK status
  // stops the step before any element of this range is written (the ranges
  // before it are already written and were reported).
  [[nodiscard]] virtual Status BeforeWrite(uint64_t offset, uint64_t count,
                                           const float* const* buffers, int num_buffers) = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // "adamw".
  virtual std::string_view name() const = 0;
  // Number of per-element state buffers (AdamW: 2).
  virtual int num_state() const = 0;
  // PyTorch's names of the state buffers ("exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;
  virtual const std::vector<ParamGroup>& groups() const = 0;

  // Learning rate of optimizer step `step` (1-based) from the optimizer's
  // own schedule; the trainer passes it to Step(), and so can the agent.
  virtual float LearningRate(int64_t step) const = 0;

  // Applies optimizer step `step` (1-based, for bias correction) with
  // learning rate `lr` to the elements of `shard` that lie in a group:
  // params and state are updated in place, grads only read. With `undo`,
  // the pre-update values are handed to it chunk by chunk (at most
  // `undo_chunk` elements) before each chunk is written.
  // InvalidArgument (nothing written) when the shard is malformed (null
  // pointers, wrong number of state buffers, step < 1); a sink's error is
  // returned as is.
  [[nodiscard]] virtual Status Step(int64_t step, float lr, const Shard& shard,
                                    UndoSink* undo = nullptr,
                                    uint64_t undo_chunk = kDefaultUndoChunk) const = 0;

  // The algebraic inverse of Step (same arguments, the post-update state
  // in, the computed pre-update state out). In floating point it is NOT
  // bit-exact in general (docs/optimizer.md gives the measured fraction);
  // it exists to measure that, never to undo (opt::UndoLog undoes).
  [[nodiscard]] virtual Status InvertAlgebraically(int64_t step, float lr,
                                                   const Shard& shard) const = 0;

  // The configuration (kind, hyperparameters, schedule, groups) as bytes
  // that DecodeOptimizer turns back into an optimizer that computes the
  // same bits: what the trainer hands the agent for AOR.
  virtual std::string Encode() const = 0;

  static constexpr uint64_t kDefaultUndoChunk = 64 * 1024;  // elements (256 KiB per buffer)
};

// Rebuilds an optimizer from Optimizer::Encode() bytes. InvalidArgument
// naming the field when the bytes are truncated, of another kind or version,
// or hold bad values (non-finite hyperparameters, overlapping groups).
Result<std::unique_ptr<Optimizer>> DecodeOptimizer(std::string_view bytes);

// Checks a shard for Step()/InvertAlgebraically(): InvalidArgument naming
// what is wrong.
Status CheckShard(const Shard& shard, int num_state, bool need_grads);

// A shard's checksum: xxHash3 of (offset, count, whether params are
// included, H(params slice), H(state slice 0), ...), where H is the plain
// xxHash3 of a slice's bytes, so equal bytes at another range do not match
// and every slice's hash can be computed in the same pass that writes it
// (AorReplica's fused host step). Gradients are not included. A replica
// computed on the host carries the checksum of the shard it stands for;
// recovery compares them (issue 15, AOR).
uint64_t ShardChecksum(const Shard& shard);

// The same over raw slices (for callers without a Shard, e.g. shared-memory
// replicas): params may be null; `state` holds the state slices.
uint64_t ShardChecksum(uint64_t offset, uint64_t count, const float* params,
                       const std::vector<const float*>& state);

// The same from the slices' hashes (H above): `params_hash` null when the
// params are not included; `num_state` state hashes.
uint64_t ShardChecksumOfHashes(uint64_t offset, uint64_t count, const uint64_t* params_hash,
                               const uint64_t* state_hashes, int num_state);

}  // namespace memento::opt
