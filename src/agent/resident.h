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

#include <cstdint>
#include <optional>
#include <vector>

#include "recover/source.h"
#include "topo/plan.h"

namespace memento::agent {

// Where a resident entry's bytes lie in `rank`'s T0 slot of the version's
// step, on the node that holds the entry: the concatenation of `segments`
// (tensor name, offset and length in bytes of the whole tensor, located with
// shm::FindRange), or, for a parity (`parity` set), the slot's parity entry
// of that plan parity (shm::FindParityEntry), which must hold `bytes` bytes.
// A parity equal to its stripe's only data block (k = 1: the XOR of one
// block, or an RS parity row of coefficient 1) also has `segments`: that
// block, followed by zeros up to `bytes`; a slot without the parity entry
// (every whole-tensor slot, and a sharded slot that keeps the stripe input)
// serves it from there.
struct ResidentSource {
  static constexpr uint32_t kNotParity = 0xffffffffu;  // == shm::kNoParity
  int rank = -1;
  std::vector<topo::Segment> segments;
  uint32_t parity = kNotParity;
  uint64_t bytes = 0;  // the entry's size (the segments' sum, or the parity's)
  bool is_parity() const { return parity != kNotParity; }
  // A parity resident only where the client wrote its entry (no segments).
  bool needs_client_entry() const { return is_parity() && segments.empty(); }
};

// The one place that decides which T1 entries of `plan` are resident in T0
// (RedundancyStore::SetPlan asks it for every entry of the node, so a
// version's file is laid out without their bytes):
//   kCopy of kind kArc or kLocalFull: the producer rank's slot holds the
//     piece's bytes (a whole-tensor slot holds every byte of the rank's
//     replicated tensors; a sharded slot holds the pieces its rank produces
//     copies of, topo::RankSaveRanges), so {producer_rank, piece segments};
//   kParity: the producer rank's client computes the parity into a parity
//     entry of its own slot (docs/reft.md section 4), so {producer_rank,
//     parity id}. Whether a version's parity is resident also depends on
//     the client: only when its rank's client said it writes parity entries
//     from that step on (RedundancyStore::SetClientParity, told by the plan
//     op); otherwise the agent keeps the parity in the version file. A
//     parity equal to its stripe's single data block (k = 1, e.g. XOR with
//     DP 2) is resident in every version: the producer's slot holds the
//     block whenever it holds no parity entry (segments set);
//   kPeer / kAor copies (pushed from another node): not resident.
std::optional<ResidentSource> T0ResidentSource(const topo::Plan& plan, recover::ByteSource entry);

}  // namespace memento::agent
