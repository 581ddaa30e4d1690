// `memento inspect --tier TIER TARGET [--json]`: lists what a tier holds.
//
//   --tier durable DIR   versions in a durable-tier directory (step, state,
//                        nodes, size, tensors, creation time)
//
// Each tier is one entry of Inspectors(); live-agent (memory tier) inspection
// plugs in there as another entry.
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tier/env.h"
#include "tier/format.h"
#include "tier/reader.h"
#include "tools/command.h"

namespace {

struct InspectArgs {
  std::string tier = "durable";
  std::string target;
  bool json = false;
};

std::string FormatTime(int64_t unix_ns) {
  if (unix_ns <= 0) return "-";
  time_t t = static_cast<time_t>(unix_ns / 1000000000);
  char buf[32];
  std::tm tm;
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int InspectDurable(const InspectArgs& args) {
  using namespace memento::tier;
  Env* env = Env::Default();
  if (!env->IsDirectory(args.target)) {
    return memento::tools::ReportStatus(
        memento::NotFoundError("durable tier directory '" + args.target + "' does not exist"));
  }
  auto versions = ListVersions(env, args.target);
  if (!versions.ok()) return memento::tools::ReportStatus(versions.status());
  nlohmann::json out = nlohmann::json::array();
  int64_t latest = -1;
  for (const auto& v : *versions) {
    nlohmann::json j{{"step", v.step},
                     {"complete", v.complete},
                     {"state", v.state},
                     {"nodes_done", v.nodes_done}};
    if (v.complete) {
      latest = v.step;
      auto index = LoadIndex(env, args.target, v.step);
      if (index.ok()) {
        uint64_t file_bytes = 0;
        for (const auto& n : index->nodes) file_bytes += n.file_size;
        j["job"] = index->job;
        j["num_nodes"] = index->num_nodes;
        j["tensors"] = index->tensors.size();
        j["stored_bytes"] = index->stored_bytes();
        j["file_bytes"] = file_bytes;
        j["created"] = FormatTime(index->created_unix_ns);
        j["topology"] = nlohmann::json::parse(index->topology_json, nullptr, false);
      } else {
        j["complete"] = false;
        j["state"] = index.status().ToString();
      }
    }
    out.push_back(std::move(j));
  }
  if (args.json) {
    nlohmann::json top{{"tier", "durable"}, {"dir", args.target}, {"versions", out}};
    top["latest_complete"] = latest >= 0 ? nlohmann::json(latest) : nlohmann::json(nullptr);
    std::printf("%s\n", top.dump(1).c_str());
    return 0;
  }
  std::printf("durable tier %s: %zu version director%s, latest complete: %s\n", args.target.c_str(),
              out.size(), out.size() == 1 ? "y" : "ies",
              latest >= 0 ? std::to_string(latest).c_str() : "none");
  std::printf("%-12s %-10s %-6s %-8s %-12s %-21s %s\n", "step", "state", "nodes", "tensors", "MiB",
              "created", "job");
  for (const auto& j : out) {
    if (j["complete"].get<bool>()) {
      std::printf("%-12lld %-10s %-6d %-8zu %-12.1f %-21s %s\n",
                  static_cast<long long>(j["step"].get<int64_t>()), "complete",
                  j["num_nodes"].get<int>(), j["tensors"].get<size_t>(),
                  j["stored_bytes"].get<uint64_t>() / 1048576.0,
                  j["created"].get<std::string>().c_str(), j["job"].get<std::string>().c_str());
    } else {
      std::printf("%-12lld %-10s %-6zu %s\n", static_cast<long long>(j["step"].get<int64_t>()),
                  "INCOMPLETE", j["nodes_done"].size(), j["state"].get<std::string>().c_str());
    }
  }
  return 0;
}

// One inspector per tier name.
const std::map<std::string, std::function<int(const InspectArgs&)>>& Inspectors() {
  static const auto* m = new std::map<std::string, std::function<int(const InspectArgs&)>>{
      {"durable", InspectDurable},
  };
  return *m;
}

int RunInspect(const InspectArgs& args) {
  auto it = Inspectors().find(args.tier);
  if (it == Inspectors().end()) {
    return memento::tools::ReportStatus(memento::InvalidArgumentError(
        "inspect --tier " + args.tier + " is not available (tiers: durable)"));
  }
  return it->second(args);
}

void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "List what a tier holds");
  cmd->add_option("--tier", args->tier, "Tier to inspect: durable");
  cmd->add_option("target", args->target, "What to inspect (durable: the directory)")->required();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([&ctx, args] { ctx.exit_code = RunInspect(*args); });
}

}  // namespace
MEMENTO_REGISTER_COMMAND(inspect, Setup);
