// What a client may ask the node store for: the ranks and slot sizes the
// agent accepts from a trainer (shm/agent_messages.h) and that
// NodeStore::EnsureSlots / EnsureSlot check again before they allocate.
//
// Thread safety: free functions.
#pragma once

#include <cstdint>

#include "memento/status.h"

namespace memento::shm {

// The largest rank a slot may belong to (more than any job has; the slot
// header holds an int32) and the largest slot: a request beyond them is
// refused before any arithmetic on it (no overflow in the budget checks).
inline constexpr int kMaxRank = (1 << 30) - 1;
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 48;  // 256 TiB

// InvalidArgument, naming the value and the range, unless `rank` is in
// [0, kMaxRank], `slot` in [0, kSlotsPerRank) and `bytes` in
// [kSlotHeaderBytes, kMaxSlotBytes].
[[nodiscard]] Status CheckSlotRequest(int rank, int slot, uint64_t bytes);

}  // namespace memento::shm
