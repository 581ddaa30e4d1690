// The durable tier in cluster mode (docs/durable_tier.md, "Cluster mode"):
//
//   - ClusterDurableName: the global tensor names of a cluster version;
//   - DurableStreamer::BuildClusterView (durable_cluster.cc): what one node
//     writes of a committed version: the plan pieces it is primary for (each
//     replicated byte once in the whole cluster, REFT's sharded save);
//   - LoadDurableVersion: the agent side of kPeerLoadDurable: every rank of
//     this node is read from a complete durable version (tier::Restore) into a
//     complete, checksummed T0 slot at that step, exactly as the recovery
//     executor writes a rebuilt rank.
//
// Thread safety: free functions; LoadDurableVersion must not run while a
// trainer of the node writes its slots (the launcher has stopped them).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/peer_service.h"
#include "memento/status.h"
#include "memento/types.h"
#include "shm/node_store.h"
#include "tier/env.h"
#include "topo/plan.h"

namespace memento::agent {

// The name of rank `rank`'s tensor `meta` in a cluster version:
//   - replicated state, and dp_sharded (ZeRO-1) state with global geometry,
//     is the same logical tensor for every DP rank of a (pp, tp) position: it
//     keeps its name when tp * pp == 1 (so a job of another DP size restores
//     it), else "pp<p>.tp<t>/<name>" (the positions hold different bytes
//     under one name);
//   - everything else (private state, shards without geometry) is
//     "rank<r>/<name>", as in node-local mode.
std::string ClusterDurableName(const TensorMeta& meta, int rank, const topo::Topology& topology);

struct DurableLoadStats {
  int64_t step = -1;
  std::vector<int> ranks;   // ranks whose T0 slot was written
  uint64_t bytes = 0;       // data bytes written into slots
  uint64_t read_bytes = 0;  // bytes read from the durable tier
  double read_s = 0;        // tier::Restore (read, checksum, scatter)
  double write_s = 0;       // slot allocation, chunk checksums, completion, verification
  double total_s = 0;
};
nlohmann::json DurableLoadStatsToJson(const DurableLoadStats& s);

// Writes, for every rank the plan places on `node`, a complete T0 slot of
// `step` read from the complete durable version `step` under `dir`: layout
// from the plan's inventory (shm::ComputeSlotLayout, as the client and the
// recovery executor compute it), the slot holding `step` (any state), else
// an empty / torn / corrupt one, else the older version, marked kWriting
// first; tensors read with tier::Restore (each stored piece once, checksums
// verified, ZeRO-1 shards re-cut); chunk checksums, CompleteSlotWrite, then
// NodeStore::Verify. Works on an empty (replaced) node.
// Errors: NotFound when the version is not complete, InvalidArgument /
// NotFound naming every tensor the version lacks (nothing written then),
// DataLoss for a piece that fails its checksum (the slots stay kWriting,
// never taken for complete).
[[nodiscard]] Result<DurableLoadStats> LoadDurableVersion(const ClusterPlan& plan,
                                                          const std::string& job, int node,
                                                          const std::string& dir, int64_t step,
                                                          shm::NodeStore& store,
                                                          tier::Env* env = nullptr);

}  // namespace memento::agent
