// A readable view of a job's coordination state: per-node signals and
// liveness plus the last committed step. Used by `memento store status` and
// meant for `memento inspect` (table by default, --json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coord/membership.h"
#include "coord/store.h"

namespace memento::coord {

struct ClusterSnapshot {
  std::string job;
  int64_t committed = -1;  // -1: nothing committed yet
  std::vector<NodeState> nodes;
};

[[nodiscard]] Result<ClusterSnapshot> ReadClusterSnapshot(Store& store, const std::string& job,
                                                          Deadline deadline);
// A fixed-width table, one node per line, with the committed step on top.
std::string FormatClusterTable(const ClusterSnapshot& snapshot, int64_t now_wall_ns);
// {"job":..., "committed":...,
// "nodes":[{"node","alive","signal","step","age_s","endpoint","detail"}]}
std::string FormatClusterJson(const ClusterSnapshot& snapshot, int64_t now_wall_ns);

}  // namespace memento::coord
