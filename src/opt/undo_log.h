// The undo log of one optimizer step (SWIFT 2.1, update-undo; issue 19).
//
// An optimizer step that a failure interrupts leaves a rank half updated
// (some chunks of its params and state new, the rest old), and data-parallel
// replicas that finished the step one step ahead of those that did not.
// update-undo puts the survivors back to the last step every rank completed,
// without reloading a snapshot. SWIFT inverts the update algebraically; in
// fp32 AdamW's algebraic inverse does not return the pre-update bytes
// (opt_test UndoLogTest.AlgebraicInverseIsNotBitExact measures how often),
// so the undo here is a log of the pre-update values: the optimizer hands
// every chunk to the log before it writes it (UndoSink), and Undo() writes
// the logged values back. That is the minimum that makes the undo exact for
// AdamW: every element of params, m and v changes in a step, and the old
// value of none of them can be recomputed bit for bit from the new ones.
//
// An entry holds the pre-write values of a range [offset, offset + count)
// of the flat buffer for a subset of the buffers (params = buffer 0, the
// optimizer's state buffers 1..num_state), with an xxHash3 checksum over the
// entry's header and values. Undo() verifies every checksum before it writes
// anything: a corrupted log is DataLoss (the caller falls back to the
// snapshot path) and leaves the buffers as they were.
//
// Encode()/Decode() turn the log into versioned bytes (magic MMUNDOL1,
// fixed-layout little-endian records) so it can live outside the trainer
// (for example in the agent's shared memory) and be checked there.
//
// Thread safety: none; one thread writes a log (the optimizer's Step calls
// BeforeWrite on the caller's thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"
#include "opt/optimizer.h"

namespace memento::opt {

// A buffer Undo() writes into: elements [first, first + count) of the flat
// buffer, `data` pointing at element `first` (ZeRO-1 state buffers hold only
// the rank's shard; params the whole buffer).
struct UndoTarget {
  float* data = nullptr;
  uint64_t first = 0;
  uint64_t count = 0;
};

class UndoLog final : public UndoSink {
 public:
  // `num_buffers` = 1 + the optimizer's num_state() (AdamW: 3).
  // REQUIRES: 1 <= num_buffers <= 32.
  explicit UndoLog(int num_buffers);

  // Starts the log of optimizer step `step` with learning rate `lr`: drops
  // the entries of the previous step (the memory is kept for the next).
  void Begin(int64_t step, float lr);

  // UndoSink: logs the pre-update values of all buffers of the range.
  // InvalidArgument when num_buffers differs from the log's.
  [[nodiscard]] Status BeforeWrite(uint64_t offset, uint64_t count, const float* const* buffers,
                                   int num_buffers) override;

  // Logs the values of one buffer's range that something other than the
  // optimizer is about to overwrite (the ZeRO-1 all-gather writes the other
  // shards' params). `values` points at element `offset`.
  [[nodiscard]] Status RecordBuffer(int buffer, uint64_t offset, uint64_t count,
                                    const float* values);

  // Writes every logged value back, newest entry first, so the buffers hold
  // exactly the bytes they held at Begin(). `targets` has num_buffers()
  // entries (params, then each state buffer). Verifies all entries first:
  // DataLoss naming the entry when a checksum does not match, InvalidArgument
  // when an entry lies outside its target; nothing is written then. The log
  // is kept (a second Undo writes the same bytes again).
  [[nodiscard]] Status Undo(const std::vector<UndoTarget>& targets) const;

  // The same for a Shard: params and state buffers are targets covering
  // [shard.offset, shard.offset + shard.count).
  [[nodiscard]] Status Undo(const Shard& shard) const;

  // Verifies every entry's checksum (DataLoss naming the first bad one).
  [[nodiscard]] Status Verify() const;

  std::string Encode() const;
  // Rebuilds a log from Encode() bytes. InvalidArgument / DataLoss naming
  // the field when the bytes are truncated, of another format or version, or
  // hold an inconsistent entry. Checksums are verified by Undo()/Verify(),
  // not here (a corrupted entry must still be reported as such).
  static Result<UndoLog> Decode(std::string_view bytes);

  int num_buffers() const { return num_buffers_; }
  int64_t step() const { return step_; }
  float lr() const { return lr_; }
  size_t num_entries() const { return entries_.size(); }
  // Logged values, in bytes (what the log costs per step).
  uint64_t value_bytes() const { return values_.size() * sizeof(float); }
  // Elements of the flat buffer covered by entries that include `buffer`.
  uint64_t covered(int buffer) const;

  // Flips one bit of entry `entry`'s logged values (tests of the checksum
  // path; the log is otherwise immutable once written).
  void CorruptForTest(size_t entry);

 private:
  struct Entry {
    uint64_t offset = 0;
    uint64_t count = 0;
    uint32_t mask = 0;      // bit b: buffer b is logged
    uint64_t position = 0;  // first value in values_
    uint64_t checksum = 0;
  };
  uint64_t EntryChecksum(const Entry& e) const;
  Status VerifyEntry(size_t i) const;

  int num_buffers_;
  int64_t step_ = 0;
  float lr_ = 0.0f;
  std::vector<Entry> entries_;
  std::vector<float> values_;  // per entry, per logged buffer: count values
};

}  // namespace memento::opt
