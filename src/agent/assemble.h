// Restore-time assembly (REFT-load step 2; docs/reft.md, section 3): the
// agent's `assemble` op. A rank whose T0 slot holds only its plan pieces
// (a sharded slot) cannot restore from it alone; its agent builds, in a
// staging file under the node root, a whole-tensor (format v1) slot of the
// rank at the step from the pieces of the rank's state, read from their
// holders: the rank's own slot and other ranks' slots on this node (shared
// memory, PieceReader), other nodes' slots over the authenticated transport
// (ClusterReader, kPeerReadStream). Every byte is checked at its source (the
// source slot's chunk checksums) or on arrival (the digest frames); the
// pieces must tile each tensor exactly. The client then restores from the
// staged slot with its usual checks (every chunk verified before a
// registered byte is written) and removes it.
//
// Thread safety: AssembleRank may run on several threads at once for
// different ranks (the reader is thread-safe; each rank has its own file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/peer_service.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "recover/source.h"
#include "shm/agent_messages.h"
#include "shm/node_store.h"

namespace memento::agent {

// The `plan` op's answer for `rank` (docs/reft.md section 1; JobMember::
// SaveRanges once the plan is known): the byte ranges its T0 slot holds
// (topo::RankSaveRanges), or sharded=false (whole tensors) when `sharded` is
// off or the ranges cover every byte of the rank. `client_parity`: the
// client computes the parities the rank produces (the reply lists them with
// their stripe blocks) and the ranges leave out their inputs.
// InvalidArgument for a rank outside the plan.
[[nodiscard]] Result<shm::PlanReply> PlanReplyFor(const ClusterPlan& plan, int rank, bool sharded,
                                                  bool client_parity = false);

struct AssembleOptions {
  int threads = 4;                           // parallel piece reads
  uint64_t chunk_bytes = uint64_t{4} << 20;  // the staged slot's chunk size
};

// Writes shm::AssembledSlotPath(store.options().root, rank): rank's whole
// state at `step`, every piece read from its primary holder (the T0 slot of
// Piece::rank on Piece::node). Errors, nothing staged left behind:
// InvalidArgument for a rank not in the plan or not on this node;
// FailedPrecondition naming the tensor, the byte range and the piece when the
// plan's pieces do not tile the rank's tensors; the reader's error (NotFound
// when a holder has no complete slot of `step`, DataLoss naming the chunk,
// tensor and node when a checksum fails at the source or on arrival,
// Unavailable when a holder cannot be reached), prefixed with the piece and
// node it was read from.
[[nodiscard]] Result<shm::AssembleReply> AssembleRank(const ClusterPlan& plan,
                                                      const std::string& job_id, int rank,
                                                      int64_t step, recover::ByteReader& reader,
                                                      shm::NodeStore& store, Deadline deadline,
                                                      const AssembleOptions& options = {});

// The registered tensors a rank's `seal` named (its shm::ParseManifest text),
// as the planners take them; nullopt, after logging why, when the manifest
// cannot be read (the agent and the job member then keep what they had).
std::optional<std::vector<TensorMeta>> SealedTensors(int rank, const std::string& manifest);

}  // namespace memento::agent
