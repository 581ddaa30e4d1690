#include "topo/topology_json.h"

#include <string>
#include <utility>
#include <vector>

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
  try {
    t.dp = j.at("dp").get<int>();
    t.tp = j.value("tp", 1);
    t.pp = j.value("pp", 1);
    t.zero_stage = j.contains("zero") ? j.at("zero").get<int>() : j.value("zero_stage", 0);
    t.rank_node = j.at("rank_node").get<std::vector<int>>();
    if (j.contains("node_rack")) t.node_rack = j.at("node_rack").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("malformed topology: ") + e.what() + ": " +
                                j.dump().substr(0, 200));
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
  try {
    MEMENTO_ASSIGN_OR_RETURN(out.policy, ParsePolicy(j.value("policy", std::string("xor"))));
    const std::string local = j.value("local_copy", std::string("sharded"));
    if (local == "full") {
      out.policy.local_copy = LocalCopy::kFull;
    } else if (local != "sharded") {
      return InvalidArgumentError("topology: local_copy '" + local + "' is not full or sharded");
    }
    for (auto [key, field] : {std::pair{"host_budget", &out.policy.host_bytes_per_node},
                              std::pair{"copy_budget", &out.policy.copy_bytes_per_node},
                              std::pair{"network_budget", &out.policy.network_bytes_per_node}}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number_unsigned()) {
        return InvalidArgumentError(std::string("topology: ") + key + " " + j[key].dump() +
                                    " is not a byte count (an integer >= 0)");
      }
      *field = j[key].get<uint64_t>();
    }
    if (j.contains("sharded")) {
      if (!j["sharded"].is_boolean()) {
        return InvalidArgumentError("topology: sharded " + j["sharded"].dump() +
                                    " is not true or false");
      }
      out.sharded = j["sharded"].get<bool>();
    }
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("malformed topology: ") + e.what() + ": " +
                                j.dump().substr(0, 200));
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
