// AOR (REFT 4.2, Eq. 4): a host replica of a peer's ZeRO-1 optimizer shard,
// brought forward every step by running the optimizer update on the host
// from the gradient slice the replica's holder already has (gradients are
// complete on every DP member after the all-reduce), so a lost shard is
// rebuilt without any network at save time. docs/reft.md, "AOR".
//
// The replica holds the optimizer state of the range [offset, offset + count)
// of the flat buffer (AdamW: exp_avg and exp_avg_sq); the parameters are
// replicated state, so Advance() takes the pre-update parameter slice from
// the holder's own copy, and the replica keeps only the hash of the updated
// parameters it computed. The hash matters: AdamW's moments do not depend on
// the learning rate, so a replica given the wrong learning rate has the
// right moments and wrong parameters; the checksums cover both.
//
// Bit-exactness: Advance() runs the same Optimizer::Step (src/opt, built
// once, -ffp-contract=off) on the same inputs as the owner's step, so the
// state equals the owner's byte for byte as long as the holder passes what
// the owner used (step, lr, gradient after clipping, pre-update params). Any
// divergence (for example an LR schedule changed in the trainer but not
// passed to the replica) is caught, not restored: the replica carries the
// owner's checksum of the shard it was seeded from, and each step it is
// confirmed either locally, against the updated parameters the all-gather
// brings the holder (ConfirmParams: no network beyond training's own), or
// against the owner's checksum of that step (Confirm: ShardChecksum of the
// owner's params and state slices after the step, reported with its
// snapshot); recovery calls CheckForRestore(), which refuses a replica that
// does not match the owner's checksum.
//
// The state is double buffered (Areas below): a step is computed into the
// spare area in one fused, chunked pass (Prepare: the optimizer, the
// checksums of its outputs and the hashes of its inputs together) and
// becomes current at Commit, so a holder that dies mid-step leaves the
// previous step intact, and a holder that finds the inputs did not hash
// right drops the step without touching the replica.
//
// Thread safety: none; one holder thread uses a replica.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "memento/status.h"
#include "opt/optimizer.h"

namespace memento::opt {

class AorReplica {
 public:
  // Where the state lives: two areas of num_state() * count floats each,
  // the state slices back to back: the one holding step() (`current`) and
  // the spare a new step is computed into. A step (Seed, Advance) becomes
  // current only once it is complete, so the current area is never
  // half-updated. `keep` keeps external memory alive (the agent's mapped
  // replica file, agent/aor_holder.h); Create without areas allocates them.
  struct Areas {
    float* area[2] = {nullptr, nullptr};
    int current = 0;
    std::shared_ptr<void> keep;
  };

  // A replica of [offset, offset + count) under `optimizer` (immutable,
  // shared with whoever else uses it). InvalidArgument on a null optimizer,
  // count 0, an overflowing range or a null area.
  [[nodiscard]] static Result<std::unique_ptr<AorReplica>> Create(
      std::shared_ptr<const Optimizer> optimizer, uint64_t offset, uint64_t count);
  [[nodiscard]] static Result<std::unique_ptr<AorReplica>> Create(
      std::shared_ptr<const Optimizer> optimizer, uint64_t offset, uint64_t count, Areas areas);

  // Sets the replica to the owner's shard after step `step` (0 = the
  // initial state): `params` (the shard's parameter slice) and `state`
  // (num_state() slices), `count` elements each; `owner_checksum` is
  // ShardChecksum(offset, count, params, state) as the owner computed it.
  // The bytes are copied into the spare area and hashed in the same pass.
  // DataLoss (the current area and step unchanged) when they do not hash to
  // it; InvalidArgument on a wrong number of slices or a null one.
  [[nodiscard]] Status Seed(int64_t step, const float* params,
                            const std::vector<const float*>& state, uint64_t owner_checksum);

  // Applies the owner's optimizer step `step` with learning rate `lr`:
  // `grads` and `params` point at element `offset` of the gradient (as the
  // owner's optimizer reads it: after the all-reduce and any clipping) and
  // of the parameters before the update. Neither is written.
  // FailedPrecondition when the replica is not seeded, is diverged (a failed
  // Confirm), or `step` is not step() + 1; InvalidArgument on null pointers.
  // Prepare() then Commit().
  [[nodiscard]] Status Advance(int64_t step, float lr, const float* grads, const float* params);

  // The host step in one pass, chunk by chunk (kChunk elements, so every
  // buffer's chunk stays in cache): reads each chunk of `grads` and `params`
  // once, hashes them, runs the optimizer on the chunk into the spare area
  // (the state copied from the current area first; the updated parameters
  // into a chunk of scratch) and hashes the results, so the checksum, the
  // state hash and the params hash need no further pass. Returns the
  // hashes of the inputs as read (xxHash3 of the `count` gradients and of
  // the `count` parameters: the caller checks them against what the writer
  // of the inputs hashed, and ConfirmParamsHash(step - 1, params_hash)).
  // The replica is unchanged (step(), state(), checksums) until Commit();
  // errors as Advance's.
  struct Inputs {
    uint64_t grads_hash = 0;
    uint64_t params_hash = 0;
  };
  [[nodiscard]] Result<Inputs> Prepare(int64_t step, float lr, const float* grads,
                                       const float* params);
  // The prepared step becomes the replica's (the spare area becomes
  // current). FailedPrecondition when nothing is prepared (or a Seed came
  // in between).
  [[nodiscard]] Status Commit();
  static constexpr uint64_t kChunk = 8192;  // elements: 32 KiB per buffer

  // The owner's checksum of its shard after `step` (ShardChecksum of its
  // params and state slices). OK when it equals the replica's; otherwise
  // DataLoss naming the step and both values, and the replica is marked
  // diverged: Advance and CheckForRestore refuse it until Seed().
  // FailedPrecondition when the replica is not at `step`.
  [[nodiscard]] Status Confirm(int64_t step, uint64_t owner_checksum);

  // The local check: `params` points at element `offset` of the holder's
  // parameters after step `step`'s all-gather (the owner's updated slice).
  // OK when the replica computed the same parameters; otherwise DataLoss and
  // the replica is diverged, as for Confirm.
  [[nodiscard]] Status ConfirmParams(int64_t step, const float* params);
  // The same from the xxHash3 of those parameters (Prepare's params_hash of
  // the next step).
  [[nodiscard]] Status ConfirmParamsHash(int64_t step, uint64_t params_hash);

  // Recovery: OK when the replica is at `step`, not diverged, its bytes
  // still hash to the checksum computed when they were written (no
  // corruption in memory since), and that checksum equals `owner_checksum`
  // (the owner's checksum of `step`, from its COMPLETED report). Otherwise
  // DataLoss / FailedPrecondition naming what differs; nothing is changed.
  [[nodiscard]] Status CheckForRestore(int64_t step, uint64_t owner_checksum) const;

  // Copies the current state slices back to back into `dst` (num_state() *
  // count floats: the layout of the kAor copy's T1 entry the agent makes
  // from the replica) and checks, in the same pass (each block hashed while
  // it is still in cache), that the copied bytes hash to the state hash
  // computed when step() was written. The entry's own chunk checksums are
  // computed from the entry afterwards, so without this check a byte of the
  // replica changed in memory between its step and the copy would be
  // protected by a valid entry checksum. DataLoss naming the step and both
  // values (`dst` then holds those bytes: the caller must not keep them);
  // FailedPrecondition when not seeded or diverged. `dst` must not overlap
  // the replica's areas.
  [[nodiscard]] Status CopyStateTo(void* dst) const;

  // What a replica is besides its state slices: the fields a holder writes
  // next to the state (the agent's replica file, agent/aor_holder.h) so a
  // replica outlives the process that computed it.
  struct Saved {
    int64_t step = -1;
    int64_t seed_step = -1;
    uint64_t seed_checksum = 0;
    uint64_t checksum = 0;
    uint64_t state_hash = 0;
    uint64_t params_hash = 0;
    bool diverged = false;
  };
  Saved saved() const;
  // A replica rebuilt from saved() and its state in `areas` (the current
  // area's; the memory is used in place, not copied). DataLoss (naming both
  // values) when the current area does not hash to saved.state_hash: bytes
  // torn or changed since they were written. InvalidArgument for Create's
  // reasons, a step < 0.
  [[nodiscard]] static Result<std::unique_ptr<AorReplica>> Adopt(
      std::shared_ptr<const Optimizer> optimizer, uint64_t offset, uint64_t count,
      const Saved& saved, Areas areas);

  uint64_t offset() const { return offset_; }
  uint64_t count() const { return count_; }
  // -1 until seeded.
  int64_t step() const { return step_; }
  // The step and owner checksum the replica was seeded from.
  int64_t seed_step() const { return seed_step_; }
  uint64_t seed_checksum() const { return seed_checksum_; }
  // ShardChecksum of the shard (updated params, state) as computed by the
  // last Seed/Advance: what the owner's checksum of step() must be.
  uint64_t checksum() const { return checksum_; }
  bool diverged() const { return diverged_; }
  // State slice k (num_state() of them), `count` elements, of the current
  // area.
  const float* state(int k) const { return area_[current_] + k * count_; }
  int num_state() const { return num_state_; }
  // The area holding step() (0 or 1) and the one the next step goes to.
  int current_area() const { return current_; }
  int spare_area() const { return 1 - current_; }

 private:
  AorReplica(std::shared_ptr<const Optimizer> optimizer, uint64_t offset, uint64_t count,
             Areas areas);
  uint64_t StateHash() const;
  std::string Name() const;

  std::shared_ptr<const Optimizer> optimizer_;
  uint64_t offset_, count_;
  int num_state_;
  std::vector<float> owned_;  // the areas when not external
  float* area_[2];
  std::shared_ptr<void> keep_;
  int current_ = 0;
  // The fused pass's working set, allocated once: a chunk of updated
  // parameters, the shard handed to the optimizer, one hash stream per
  // buffer (grads, params in, params out, each state slice), and the state
  // slices' digests.
  std::vector<float> scratch_params_;
  Shard chunk_;
  std::vector<std::unique_ptr<StreamingChecksum>> streams_;
  std::vector<uint64_t> state_hashes_;
  // CopyStateTo's digests of the copied slices (const, sized once: no
  // allocation on the per-step path).
  mutable std::vector<uint64_t> copy_hashes_;
  // What Prepare computed, for Commit.
  bool prepared_ = false;
  int64_t prepared_step_ = -1;
  uint64_t prepared_checksum_ = 0, prepared_state_hash_ = 0, prepared_params_hash_ = 0;

  int64_t step_ = -1;
  int64_t seed_step_ = -1;
  uint64_t seed_checksum_ = 0;
  uint64_t checksum_ = 0;     // ShardChecksum(updated params, state)
  uint64_t state_hash_ = 0;   // ShardChecksum(no params, state): in-memory integrity
  uint64_t params_hash_ = 0;  // of the updated params slice: ConfirmParams
  bool diverged_ = false;
};

}  // namespace memento::opt
