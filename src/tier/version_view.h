// The durable tier's input: one node's share of one committed version.
//
// The tier does not know shared-memory slots, agents or planners. Whoever owns
// the bytes (the agent, a test, the bench) describes them as a VersionView: a
// list of byte ranges of named tensors plus the job and topology facts the
// index records. Keeping this narrow keeps the tier testable on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memento/types.h"
#include "tier/format.h"

namespace memento::tier {

// One contiguous byte range of one tensor held by this node.
struct ViewEntry {
  // (A constructor rather than an aggregate, so that callers that do not
  // know `tp` need not spell it.)
  ViewEntry() = default;
  ViewEntry(TensorMeta meta, uint64_t offset, uint64_t length, const void* data, TpSlice tp = {})
      : meta(std::move(meta)), offset(offset), length(length), data(data), tp(std::move(tp)) {}

  // The tensor as this rank registered it. For kDpSharded state with
  // global_numel > 0 the rank's shard sits at element shard_offset of the
  // flattened global tensor; the durable tier stores it at that place in the
  // global tensor so that it can be re-cut for another DP size on load.
  TensorMeta meta;
  // Byte range [offset, offset + length) within the rank's tensor
  // (meta.nbytes() bytes); a node may hold only a piece of a replicated tensor
  // (global parameter sharding).
  uint64_t offset = 0;
  uint64_t length = 0;
  // The first byte of the range (not of the tensor); valid while the
  // VersionView (its `pin`) is alive.
  const void* data = nullptr;
  // Tensor parallelism: meta is slice tp of a global tensor (tp.split()). The
  // tier stores the slice with its place in the global tensor, so that a job
  // with another TP degree can restore (re-cut) it. offset/length are then
  // relative to the slice, as for any tensor.
  TpSlice tp;
  // Node-local versions: the ranks whose tensor of this name these bytes are
  // (recorded as TensorRecord::ranks; every entry of one tensor names the
  // same ranks). Empty: not recorded (cluster versions).
  std::vector<int> ranks;
};

struct VersionView {
  std::string job;
  int node = 0;       // this node's id, 0 .. num_nodes-1
  int num_nodes = 1;  // nodes that each write a part of this version
  int64_t step = 0;   // the version
  // Incarnation of the job's history: bumped every time the job restarts from
  // an older checkpoint, so that a step trained again is never committed from
  // parts written by two histories (node 0 only accepts markers of its epoch).
  uint64_t epoch = 0;
  // Opaque topology description (JSON text; "{}" when unknown), recorded in the
  // index so that a restore can tell a different topology.
  std::string topology_json = "{}";
  // Tensor names are global keys across the job: state that exists once per
  // rank (kPrivate), and replicated state that differs between the ranks of
  // one node, must carry the rank in its name ("rank3/rng", RankScopedName).
  std::vector<ViewEntry> entries;
  // Keeps the bytes alive (a slot pin of the agent); released when the view is
  // destroyed.
  std::shared_ptr<const void> pin;

  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const auto& e : entries) n += e.length;
    return n;
  }
};

}  // namespace memento::tier
