#include "coord/cluster_view.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "coord/commit.h"

namespace memento::coord {
namespace {

double AgeSeconds(const NodeState& n, int64_t now) {
  return n.record.wall_ns > 0 ? static_cast<double>(now - n.record.wall_ns) / 1e9 : -1;
}

}  // namespace

Result<ClusterSnapshot> ReadClusterSnapshot(Store& store, const std::string& job,
                                            Deadline deadline) {
  ClusterSnapshot s;
  s.job = job;
  MEMENTO_ASSIGN_OR_RETURN(s.nodes, ReadClusterState(store, job, deadline));
  auto latest = ReadLatestCommit(store, job, deadline);
  if (latest.ok()) {
    s.committed = *latest;
  } else if (latest.status().code() != StatusCode::kNotFound) {
    return latest.status();
  }
  return s;
}

std::string FormatClusterTable(const ClusterSnapshot& s, int64_t now) {
  std::string out = fmt::format("job {}  committed step: {}\n", s.job,
                                s.committed >= 0 ? std::to_string(s.committed) : "none");
  out += fmt::format("{:<16} {:<10} {:>8} {:>8} {:<22} {}\n", "NODE", "SIGNAL", "STEP", "AGE_S",
                     "ENDPOINT", "DETAIL");
  for (const NodeState& n : s.nodes) {
    double age = AgeSeconds(n, now);
    out += fmt::format("{:<16} {:<10} {:>8} {:>8} {:<22} {}\n", n.node,
                       NodeSignalName(n.record.signal),
                       n.record.step >= 0 ? std::to_string(n.record.step) : "-",
                       age >= 0 ? fmt::format("{:.1f}", age) : "-",
                       n.endpoint.empty() ? "-" : n.endpoint, n.record.detail);
  }
  if (s.nodes.empty()) out += "(no nodes registered)\n";
  return out;
}

std::string FormatClusterJson(const ClusterSnapshot& s, int64_t now) {
  nlohmann::json j;
  j["job"] = s.job;
  j["committed"] = s.committed >= 0 ? nlohmann::json(s.committed) : nlohmann::json(nullptr);
  j["nodes"] = nlohmann::json::array();
  for (const NodeState& n : s.nodes) {
    j["nodes"].push_back({{"node", n.node},
                          {"alive", n.alive},
                          {"signal", std::string(NodeSignalName(n.record.signal))},
                          {"step", n.record.step},
                          {"age_s", AgeSeconds(n, now)},
                          {"endpoint", n.endpoint},
                          {"detail", n.record.detail}});
  }
  return j.dump();
}

}  // namespace memento::coord
