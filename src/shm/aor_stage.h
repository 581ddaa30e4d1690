// The AOR staging file, <root>/aor_stage.<rank> (docs/reft.md section 5):
// where a client leaves each step's gradient and pre-update parameter
// slices of the ranges its node's AOR replicas need, for the agent
// (agent/aor_holder.h) to bring them forward off the training path. Created
// by the agent at aor_register, mapped read-write by the client.
//
// Layout (fixed, little-endian): AorStageHeader (256 bytes: the ranges'
// sizes, the doorbell word and the ring of the rank's own shard checksums),
// then
// kAorStageSlots slots, each an AorStageSlot (64 bytes) followed by, for
// each range of the aor_register reply in its order, `count` fp32 gradients
// and `count` fp32 parameters. Step s uses slot s % kAorStageSlots (double
// buffering: the client stages s+1 while the agent still reads s).
//
// A slot's state word is the hand-off:
//   client:  Empty/Done -> Writing, writes the slices, step, lr, a new
//            sequence number and the xxHash3 of the data, -> Ready
//            (release), then rings the doorbell (RingStageDoorbell: no
//            request, no reply: the trainer does not wait for the agent);
//   agent:   Ready -> Reading (compare-and-swap), runs the host step from
//            the slices (hashing them in the same pass), checks the step
//            and the hash, -> Done.
// A client never writes a slot that is Ready or Reading (the agent has not
// read it yet): it waits for Done, and past its deadline skips that step's
// capture and says so (AorStageBusy). A trainer killed mid-capture leaves
// the slot Writing: the agent refuses it (torn). A slot the agent finds
// holding another step than the one it was told (overwritten early) or whose
// bytes do not hash right is refused too; the replica then stays at its last
// step and is seeded again from the owner's copy, never advanced from it.
//
// The doorbell (a futex word in the header) is what the agent's watcher of
// the file waits on: the client increments it and wakes the watcher after
// each capture and each shard checksum. An older client's `aor_capture`
// request still works (the agent queues a slot once, by its sequence
// number, whichever way it learns of it).
//
// The checksum ring (kAorSumRing entries, step s in entry s % kAorSumRing):
// the rank's own ShardChecksum of each step (ReportShardChecksum), which the
// agent publishes to the job's store for the replicas of this rank's shard
// to be checked against. An entry is valid when its `check` is SumCheck of
// its step and checksum: a torn entry (a trainer killed while writing it)
// is never published.
//
// Thread safety: one writer (the rank's trainer thread), readers in the
// agent (the file's watcher, the AOR thread, the node's step path); the
// state words, the doorbell and the entries' checks are the only shared
// synchronisation.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <ctime>

#include "common/checksum.h"

namespace memento::shm {

inline constexpr char kAorStageMagic[8] = {'M', 'E', 'M', 'A', 'O', 'R', 'S', '4'};
inline constexpr int kAorStageSlots = 2;
inline constexpr int kAorSumRing = 8;

// One of the rank's own shard checksums (ReportShardChecksum).
struct AorSumEntry {
  int64_t step;
  uint64_t checksum;
  uint64_t check;  // SumCheck(step, checksum); anything else: not (yet) valid
};
static_assert(sizeof(AorSumEntry) == 24);

struct AorStageHeader {
  char magic[8];
  uint32_t num_ranges;
  uint32_t slots;        // kAorStageSlots
  uint64_t total_count;  // sum of the ranges' counts
  uint32_t doorbell;     // futex word: incremented by the client, waited on by the agent
  uint32_t reserved;
  uint64_t pad[4];
  AorSumEntry sums[kAorSumRing];
};
static_assert(sizeof(AorStageHeader) == 256);

struct AorStageSlot {
  uint32_t state;  // kStage* below
  uint32_t seq;    // the client's capture count when it wrote the slot

  int64_t step;  // the optimizer step the slices feed
  float lr;      // NaN: the optimizer's schedule
  uint32_t reserved2;
  uint64_t data_checksum;  // StageDataChecksum of the data's slices
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
// A slot's `data_checksum`: the xxHash3 of its slices' xxHash3s, in the
// slot's order (per range: the gradients, then the parameters), so the
// agent can hash each slice in the pass that reads it for the host step
// (the two slices of a range side by side, chunk by chunk).
inline uint64_t StageDataChecksum(const uint64_t* slice_hashes, size_t n) {
  return Checksum(slice_hashes, n * sizeof(uint64_t));
}

// After the data is written: step, lr, checksum (`data_checksum`:
// StageDataChecksum of the slices, which the writer computed while copying
// them), then ready.
inline void FinishStage(uint8_t* base, int64_t step, float lr, uint64_t data_checksum) {
  const int k = StageSlotOf(step);
  AorStageSlot* s = StageSlot(base, k);
  s->step = step;
  s->lr = lr;
  s->data_checksum = data_checksum;
  s->seq = s->seq + 2;  // never 0, and new for each write of this slot
  __atomic_store_n(&s->state, kStageReady, __ATOMIC_RELEASE);
}
// The same, hashing the slot's data now: `counts` are the ranges' sizes in
// the aor_register reply's order (tests; the client hashes as it copies).
inline void FinishStage(uint8_t* base, int64_t step, float lr, const uint64_t* counts,
                        size_t num_ranges) {
  const int k = StageSlotOf(step);
  const float* d = StageData(base, k);
  uint64_t hashes[64];
  size_t n = 0;
  for (size_t r = 0; r < num_ranges && n + 2 <= 64; ++r) {
    hashes[n++] = Checksum(d, counts[r] * sizeof(float));
    hashes[n++] = Checksum(d + counts[r], counts[r] * sizeof(float));
    d += 2 * counts[r];
  }
  FinishStage(base, step, lr, StageDataChecksum(hashes, n));
}

// The doorbell: the agent's watcher of the file wakes up (a futex wake on
// the shared mapping; no reply is waited for).
inline uint32_t StageDoorbell(const uint8_t* base) {
  return __atomic_load_n(&reinterpret_cast<const AorStageHeader*>(base)->doorbell,
                         __ATOMIC_ACQUIRE);
}
inline void RingStageDoorbell(uint8_t* base) {
  uint32_t* word = &StageHeader(base)->doorbell;
  __atomic_add_fetch(word, 1, __ATOMIC_ACQ_REL);
  syscall(SYS_futex, word, FUTEX_WAKE, 1, nullptr, nullptr, 0);
}
// Waits until the doorbell differs from `seen` or `timeout_ms` passed
// (the agent's watcher).
inline void WaitStageDoorbell(uint8_t* base, uint32_t seen, int timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, &StageHeader(base)->doorbell, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

inline uint64_t SumCheck(int64_t step, uint64_t checksum) {
  const uint64_t v[2] = {static_cast<uint64_t>(step), checksum};
  return Checksum(v, sizeof(v)) | 1;  // never 0 (a fresh file's entries)
}
// The client: the rank's own checksum of `step` into its ring entry.
inline void WriteStageSum(uint8_t* base, int64_t step, uint64_t checksum) {
  AorSumEntry* e = &StageHeader(base)->sums[step % kAorSumRing];
  __atomic_store_n(&e->check, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&e->step, step, __ATOMIC_RELEASE);
  __atomic_store_n(&e->checksum, checksum, __ATOMIC_RELEASE);
  __atomic_store_n(&e->check, SumCheck(step, checksum), __ATOMIC_RELEASE);
}
// The agent: entry k when it is valid (false: never written, being
// written or torn).
inline bool ReadStageSum(const uint8_t* base, int k, int64_t* step, uint64_t* checksum) {
  const AorSumEntry* e = &reinterpret_cast<const AorStageHeader*>(base)->sums[k];
  const uint64_t check = __atomic_load_n(&e->check, __ATOMIC_ACQUIRE);
  const int64_t s = __atomic_load_n(&e->step, __ATOMIC_ACQUIRE);
  const uint64_t c = __atomic_load_n(&e->checksum, __ATOMIC_ACQUIRE);
  if (check == 0 || check != SumCheck(s, c) ||
      __atomic_load_n(&e->check, __ATOMIC_ACQUIRE) != check)
    return false;
  *step = s;
  *checksum = c;
  return true;
}

}  // namespace memento::shm
