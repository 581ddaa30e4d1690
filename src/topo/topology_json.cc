#include "topo/topology_json.h"

#include <string>
#include <utility>
#include <vector>

#include "common/json_reader.h"

namespace memento::topo {

using nlohmann::json;

json TopologyToJson(const Topology& t) {
  return {{"dp", t.dp},
          {"tp", t.tp},
          {"pp", t.pp},
          {"zero_stage", t.zero_stage},
          {"rank_node", t.rank_node},
          {"node_rack", t.node_rack}};
}

Result<Topology> TopologyFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgumentError("topology is not a JSON object: " + j.dump());
  Topology t;
  JsonReader r("malformed topology");
  r.Get(j, "dp", &t.dp);
  r.GetOptional(j, "tp", &t.tp);
  r.GetOptional(j, "pp", &t.pp);
  if (j.contains("zero")) {
    r.Get(j, "zero", &t.zero_stage);
  } else {
    r.GetOptional(j, "zero_stage", &t.zero_stage);
  }
  r.Get(j, "rank_node", &t.rank_node);
  r.GetOptional(j, "node_rack", &t.node_rack);
  if (!r.ok()) {
    return InvalidArgumentError(r.status().message() + ": " + j.dump().substr(0, 200));
  }
  MEMENTO_RETURN_IF_ERROR(t.Validate());
  return t;
}

json JobTopologyToJson(const JobTopology& t) {
  json j = {{"dp", t.topology.dp},
            {"tp", t.topology.tp},
            {"pp", t.topology.pp},
            {"zero", t.topology.zero_stage},
            {"rank_node", t.topology.rank_node},
            {"policy", PolicyName(t.policy)},
            {"local_copy", t.policy.local_copy == LocalCopy::kFull ? "full" : "sharded"}};
  if (!t.topology.node_rack.empty()) j["node_rack"] = t.topology.node_rack;
  // `auto`'s budgets (0 = unlimited is the absent field).
  if (t.policy.host_bytes_per_node != 0) j["host_budget"] = t.policy.host_bytes_per_node;
  if (t.policy.copy_bytes_per_node != 0) j["copy_budget"] = t.policy.copy_bytes_per_node;
  if (t.policy.network_bytes_per_node != 0) j["network_budget"] = t.policy.network_bytes_per_node;
  if (t.sharded) j["sharded"] = true;
  return j;
}

Result<JobTopology> JobTopologyFromJson(const json& j) {
  JobTopology out;
  MEMENTO_ASSIGN_OR_RETURN(out.topology, TopologyFromJson(j));
  JsonReader r("malformed topology");
  std::string policy = "xor";
  std::string local = "sharded";
  r.GetOptional(j, "policy", &policy);
  r.GetOptional(j, "local_copy", &local);
  MEMENTO_RETURN_IF_ERROR(r.status());
  MEMENTO_ASSIGN_OR_RETURN(out.policy, ParsePolicy(policy));
  if (local == "full") {
    out.policy.local_copy = LocalCopy::kFull;
  } else if (local != "sharded") {
    return InvalidArgumentError("topology: local_copy '" + local + "' is not full or sharded");
  }
  for (auto [key, field] : {std::pair{"host_budget", &out.policy.host_bytes_per_node},
                            std::pair{"copy_budget", &out.policy.copy_bytes_per_node},
                            std::pair{"network_budget", &out.policy.network_bytes_per_node}}) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_number_unsigned()) {
      return InvalidArgumentError(std::string("topology: ") + key + " " + it->dump() +
                                  " is not a byte count (an integer >= 0)");
    }
    *field = it->get<uint64_t>();
  }
  if (auto it = j.find("sharded"); it != j.end()) {
    if (!it->is_boolean()) {
      return InvalidArgumentError("topology: sharded " + it->dump() + " is not true or false");
    }
    out.sharded = it->get<bool>();
  }
  return out;
}

Result<JobTopology> ParseJobTopology(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgumentError("topology is not JSON: " + std::string(text.substr(0, 200)));
  }
  return JobTopologyFromJson(j);
}

}  // namespace memento::topo
