// "A T1 source resident in T0" (docs/reft.md, section 4): a redundancy entry
// (plan Copy or Parity) whose bytes already lie in a T0 slot of the same node
// is not copied into the redundancy store's version file. The file records a
// reference instead (the producer rank and the generation of its slot of the
// version's step, and the xxHash3 of the bytes), and every reader of the
// entry reads the bytes from that slot (PieceReader::ReadSegments /
// ServeSegments, shm::FindRange), checked against the slot's chunk checksums.
//
// Thread safety: plain values and a pure function.
#pragma once

#include <optional>
#include <vector>

#include "recover/source.h"
#include "topo/plan.h"

namespace memento::agent {

// Where a resident entry's bytes lie: the concatenation of `segments`
// (tensor name, offset and length in bytes of the whole tensor, located with
// shm::FindRange) of `rank`'s T0 slot of the version's step, on the node that
// holds the entry.
struct ResidentSource {
  int rank = -1;
  std::vector<topo::Segment> segments;
};

// The one place that decides which T1 entries of `plan` are resident in T0
// (RedundancyStore::SetPlan asks it for every entry of the node, so a
// version's file is laid out without their bytes):
//   kCopy of kind kArc or kLocalFull: the producer rank's slot holds the
//     piece's bytes (a whole-tensor slot holds every byte of the rank's
//     replicated tensors; a sharded slot holds the pieces its rank produces
//     copies of, topo::RankSaveRanges), so {producer_rank, piece segments};
//   kPeer / kAor copies (pushed from another node) and parities: not resident.
std::optional<ResidentSource> T0ResidentSource(const topo::Plan& plan, recover::ByteSource entry);

}  // namespace memento::agent
