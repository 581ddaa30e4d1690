// The AOR staging file, <root>/aor_stage.<rank> (docs/reft.md section 5):
// where a client leaves each step's gradient and pre-update parameter
// slices of the ranges its node's AOR replicas need, for the agent
// (agent/aor_holder.h) to bring them forward. Created by the agent at
// aor_register, mapped read-write by the client.
//
// Layout (fixed, little-endian): AorStageHeader (64 bytes), then for each
// range of the aor_register reply, in its order, `count` fp32 gradients and
// `count` fp32 parameters. The client marks the header kStageWriting, writes
// the slices, the step, lr and the xxHash3 of the data, then kStageReady
// (release), then sends aor_capture; the agent reads only a kStageReady
// header of the step it was told, whose data hashes to data_checksum.
//
// Thread safety: one writer (the rank's trainer thread), one reader (the
// agent, between aor_capture and its reply).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/checksum.h"

namespace memento::shm {

inline constexpr char kAorStageMagic[8] = {'M', 'E', 'M', 'A', 'O', 'R', 'S', '1'};

struct AorStageHeader {
  char magic[8];
  uint32_t state;  // kStage* below
  uint32_t num_ranges;
  uint64_t total_count;  // sum of the ranges' counts
  int64_t step;          // the optimizer step the slices feed
  float lr;              // NaN: the optimizer's schedule
  uint32_t reserved;
  uint64_t data_checksum;  // xxHash3 of the data (2 * total_count floats)
  uint64_t pad[2];
};
static_assert(sizeof(AorStageHeader) == 64);
inline constexpr uint32_t kStageEmpty = 0;
inline constexpr uint32_t kStageWriting = 1;
inline constexpr uint32_t kStageReady = 2;

inline AorStageHeader* StageHeader(uint8_t* base) {
  return reinterpret_cast<AorStageHeader*>(base);
}
inline float* StageData(uint8_t* base) {
  return reinterpret_cast<float*>(base + sizeof(AorStageHeader));
}

// Marks the stage being written (the agent refuses it until FinishStage).
inline void BeginStage(uint8_t* base) {
  __atomic_store_n(&StageHeader(base)->state, kStageWriting, __ATOMIC_RELEASE);
}
// After the data is written: step, lr, checksum, then ready.
inline void FinishStage(uint8_t* base, int64_t step, float lr) {
  AorStageHeader* h = StageHeader(base);
  h->step = step;
  h->lr = lr;
  h->data_checksum = Checksum(StageData(base), 2 * h->total_count * sizeof(float));
  __atomic_store_n(&h->state, kStageReady, __ATOMIC_RELEASE);
}

}  // namespace memento::shm
