// Which bytes a rank copies into its T0 slot under a plan: a sharded slot
// (docs/reft.md sections 1-2). Pure function of the plan; no I/O.
//
// Thread safety: pure and reentrant.
#pragma once

#include <vector>

#include "memento/status.h"
#include "memento/types.h"
#include "topo/plan.h"

namespace memento::topo {

// The byte ranges of `rank`'s tensors that its T0 slot must hold:
//   - the segments of its own pieces (Piece::rank == rank: its replicated
//     shard, its dp_shard and private state);
//   - the segments of every piece its memory produces a copy of (Copy kinds
//     kArc and kLocalFull with producer_rank == rank: an ARC neighbour's
//     piece, read from the rank's own replicated tensors);
//   - the stripe data blocks of every parity it produces (Parity with
//     producer_rank == rank: XOR / Reed-Solomon inputs, from its own
//     replicated tensors).
// kPeer and kAor copies are pushed from the piece owner's slot, so they add
// nothing here. Ranges of one tensor that overlap or touch are merged into
// one; the result lists tensors in the order of `tensors` (the rank's
// registration order), each tensor's ranges by offset. A tensor of zero
// bytes is listed whole ({name, 0, 0}) so the slot still names it.
// InvalidArgument for a rank outside the plan, or a segment that names a
// tensor not in `tensors` or bytes past its end.
// `parity_inputs` false: the rank's client computes its parities itself from
// registered memory (docs/reft.md section 4), so their stripe data blocks
// are left out (the slot holds parity entries instead).
[[nodiscard]] Result<std::vector<Segment>> RankSaveRanges(const Plan& plan, int rank,
                                                          const std::vector<TensorMeta>& tensors,
                                                          bool parity_inputs = true);

// The data blocks of `stripe` as segments of the stripe producer's tensors:
// element i is block i's bytes (StripeBlock: a range of a piece), in order,
// without the zero padding up to block_bytes (empty for an all-zero block).
std::vector<std::vector<Segment>> StripeBlockSegments(const Plan& plan, const Stripe& stripe);

// True when `ranges` cover every byte of every tensor of `tensors` (the slot
// is a whole-tensor slot: DP = 1, a single node, no replicated state).
bool CoversEveryTensor(const std::vector<Segment>& ranges, const std::vector<TensorMeta>& tensors);

}  // namespace memento::topo
