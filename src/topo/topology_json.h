// The one JSON codec of a topology (plan.h's Topology) and of a job's
// topology record (Topology + Policy), shared by the agents, the launcher,
// the durable tier's index and the plan JSON (plan_json.h):
//
//   Topology:     {"dp", "tp", "pp", "zero_stage", "rank_node": [...], "node_rack": [...]}
//   job record:   /memento/<job>/topology (docs/cluster.md), and the "cluster"
//                 field of a durable version's index:
//                 {"dp", "tp", "pp", "zero", "rank_node": [...], "policy": "xor" | "rs:2" | ...,
//                  "local_copy": "full" | "sharded", "node_rack": [...] (only when labelled)}
//
// Readers accept either spelling of the ZeRO stage ("zero" or "zero_stage");
// "tp", "pp" and the stage default to 1, 1 and 0, "node_rack" to none, and in
// the job record "policy" to "xor" and "local_copy" to "sharded". Tested in
// src/topo/topology_json_test.cc.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "memento/status.h"
#include "topo/plan.h"

namespace memento::topo {

nlohmann::json TopologyToJson(const Topology& t);
// InvalidArgument naming the missing or mistyped field, or what
// Topology::Validate() rejects.
[[nodiscard]] Result<Topology> TopologyFromJson(const nlohmann::json& j);

// What `memento launch` publishes at /memento/<job>/topology and every agent
// plans from.
struct JobTopology {
  Topology topology;
  Policy policy;
  // Sharded snapshots (docs/reft.md): each rank's T0 slot holds only the
  // byte ranges the plan gives it ("sharded": true; absent = false).
  bool sharded = false;
};
nlohmann::json JobTopologyToJson(const JobTopology& t);
// InvalidArgument as TopologyFromJson, and for an unknown policy or local_copy.
[[nodiscard]] Result<JobTopology> JobTopologyFromJson(const nlohmann::json& j);
// The same from text; InvalidArgument (quoting the text) when it is not JSON.
[[nodiscard]] Result<JobTopology> ParseJobTopology(std::string_view text);

}  // namespace memento::topo
