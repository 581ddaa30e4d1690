// The AOR staging file, <root>/aor_stage.<rank> (docs/reft.md section 5):
// where a client leaves each step's gradient and pre-update parameter
// slices of the ranges its node's AOR replicas need, for the agent
// (agent/aor_holder.h) to bring them forward off the training path. Created
// by the agent at aor_register, mapped read-write by the client.
//
// Layout (fixed, little-endian): AorStageHeader (64 bytes), then
// kAorStageSlots slots, each an AorStageSlot (64 bytes) followed by, for
// each range of the aor_register reply in its order, `count` fp32 gradients
// and `count` fp32 parameters. Step s uses slot s % kAorStageSlots (double
// buffering: the client stages s+1 while the agent still reads s).
//
// A slot's state word is the hand-off:
//   client:  Empty/Done -> Writing, writes the slices, step, lr and the
//            xxHash3 of the data, -> Ready (release), then sends aor_capture
//            (the agent answers at once and advances in its own thread);
//   agent:   Ready -> Reading (compare-and-swap), copies the slices out,
//            checks the step and the hash, -> Done.
// A client never writes a slot that is Ready or Reading (the agent has not
// read it yet): it waits for Done, and past its deadline skips that step's
// capture and says so (AorStageBusy). A trainer killed mid-capture leaves
// the slot Writing: the agent refuses it (torn). A slot the agent finds
// holding another step than the one it was told (overwritten early) or whose
// bytes do not hash right is refused too; the replica then stays at its last
// step and is seeded again from the owner's copy, never advanced from it.
//
// Thread safety: one writer (the rank's trainer thread), one reader (the
// agent's AOR thread); the state word is the only shared synchronisation.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/checksum.h"

namespace memento::shm {

inline constexpr char kAorStageMagic[8] = {'M', 'E', 'M', 'A', 'O', 'R', 'S', '2'};
inline constexpr int kAorStageSlots = 2;

struct AorStageHeader {
  char magic[8];
  uint32_t num_ranges;
  uint32_t slots;        // kAorStageSlots
  uint64_t total_count;  // sum of the ranges' counts
  uint64_t pad[5];
};
static_assert(sizeof(AorStageHeader) == 64);

struct AorStageSlot {
  uint32_t state;  // kStage* below
  uint32_t reserved;
  int64_t step;  // the optimizer step the slices feed
  float lr;      // NaN: the optimizer's schedule
  uint32_t reserved2;
  uint64_t data_checksum;  // xxHash3 of the data (2 * total_count floats)
  uint64_t pad[4];
};
static_assert(sizeof(AorStageSlot) == 64);

inline constexpr uint32_t kStageEmpty = 0;
inline constexpr uint32_t kStageWriting = 1;
inline constexpr uint32_t kStageReady = 2;
inline constexpr uint32_t kStageReading = 3;
inline constexpr uint32_t kStageDone = 4;

inline const char* StageStateName(uint32_t s) {
  switch (s) {
    case kStageEmpty:
      return "empty";
    case kStageWriting:
      return "being written (torn: its writer did not finish)";
    case kStageReady:
      return "ready";
    case kStageReading:
      return "being read";
    case kStageDone:
      return "already read";
  }
  return "in an unknown state";
}

inline uint64_t StageSlotBytes(uint64_t total_count) {
  return sizeof(AorStageSlot) + 2 * total_count * sizeof(float);
}
inline uint64_t StageFileBytes(uint64_t total_count) {
  return sizeof(AorStageHeader) + kAorStageSlots * StageSlotBytes(total_count);
}
inline int StageSlotOf(int64_t step) { return static_cast<int>(step % kAorStageSlots); }

inline AorStageHeader* StageHeader(uint8_t* base) {
  return reinterpret_cast<AorStageHeader*>(base);
}
inline AorStageSlot* StageSlot(uint8_t* base, int slot) {
  return reinterpret_cast<AorStageSlot*>(base + sizeof(AorStageHeader) +
                                         slot * StageSlotBytes(StageHeader(base)->total_count));
}
inline float* StageData(uint8_t* base, int slot) {
  return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(StageSlot(base, slot)) +
                                  sizeof(AorStageSlot));
}
inline uint32_t StageState(const AorStageSlot* s) {
  return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
}
// Whether the agent still has to read (or is reading) the slot.
inline bool StageBusy(uint32_t state) { return state == kStageReady || state == kStageReading; }

// Marks the slot of `step` being written (the agent refuses it until
// FinishStage) and returns its data.
inline float* BeginStage(uint8_t* base, int64_t step) {
  AorStageSlot* s = StageSlot(base, StageSlotOf(step));
  __atomic_store_n(&s->state, kStageWriting, __ATOMIC_RELEASE);
  return StageData(base, StageSlotOf(step));
}
// After the data is written: step, lr, checksum, then ready.
inline void FinishStage(uint8_t* base, int64_t step, float lr) {
  const int k = StageSlotOf(step);
  AorStageSlot* s = StageSlot(base, k);
  s->step = step;
  s->lr = lr;
  s->data_checksum =
      Checksum(StageData(base, k), 2 * StageHeader(base)->total_count * sizeof(float));
  __atomic_store_n(&s->state, kStageReady, __ATOMIC_RELEASE);
}

}  // namespace memento::shm
