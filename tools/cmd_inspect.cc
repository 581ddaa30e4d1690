// `memento inspect --tier TIER TARGET [--json]`: lists what a tier holds.
//
//   --tier durable DIR      versions in a durable-tier directory (step, state,
//                           nodes, size, tensors, creation time)
//   --tier memory ROOT...   slots under node roots on this host (rank, slot,
//                           state, step, intact) and the newest step every
//                           rank holds intact; --no-verify reads headers only
//
// Each tier is one entry of Inspectors().
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/memory_tier.h"
#include "tier/env.h"
#include "tier/format.h"
#include "tier/reader.h"
#include "tools/command.h"

namespace {

struct InspectArgs {
  std::string tier = "durable";
  std::vector<std::string> targets;
  std::string target;  // targets[0]
  bool json = false;
  bool verify = true;
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

int InspectMemory(const InspectArgs& args) {
  auto report = memento::agent::InspectMemoryTier(args.targets, args.verify);
  if (!report.ok()) return memento::tools::ReportStatus(report.status());
  const auto& latest = report->latest_complete;
  if (args.json) {
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& r : report->slots) {
      slots.push_back({{"root", r.root},
                       {"rank", r.rank},
                       {"slot", r.slot},
                       {"state", r.state},
                       {"step", r.step},
                       {"data_bytes", r.data_bytes},
                       {"intact", r.intact},
                       {"error", r.error}});
    }
    nlohmann::json top{{"tier", "memory"},
                       {"roots", args.targets},
                       {"verified_data", args.verify},
                       {"ranks", report->ranks},
                       {"slots", slots}};
    top["latest_complete"] = latest ? nlohmann::json(*latest) : nlohmann::json(nullptr);
    std::printf("%s\n", top.dump(1).c_str());
    return 0;
  }
  std::printf("memory tier: %zu rank%s in %zu root%s, newest step every rank holds intact: %s%s\n",
              report->ranks.size(), report->ranks.size() == 1 ? "" : "s", args.targets.size(),
              args.targets.size() == 1 ? "" : "s",
              latest ? std::to_string(*latest).c_str() : "none",
              args.verify ? "" : " (headers only, data not verified)");
  std::printf("%-6s %-5s %-10s %-12s %-10s %-7s %s\n", "rank", "slot", "state", "step", "MiB",
              "intact", "root / problem");
  for (const auto& r : report->slots) {
    std::printf("%-6d %-5d %-10s %-12lld %-10.1f %-7s %s\n", r.rank, r.slot, r.state.c_str(),
                static_cast<long long>(r.step), r.data_bytes / 1048576.0, r.intact ? "yes" : "no",
                r.intact ? r.root.c_str() : r.error.c_str());
  }
  return 0;
}

// One inspector per tier name.
const std::map<std::string, std::function<int(const InspectArgs&)>>& Inspectors() {
  static const auto* m = new std::map<std::string, std::function<int(const InspectArgs&)>>{
      {"durable", InspectDurable},
      {"memory", InspectMemory},
  };
  return *m;
}

int RunInspect(InspectArgs& args) {
  auto it = Inspectors().find(args.tier);
  if (it == Inspectors().end()) {
    return memento::tools::ReportStatus(memento::InvalidArgumentError(
        "inspect --tier " + args.tier + " is not available (tiers: durable, memory)"));
  }
  if (args.tier != "memory" && args.targets.size() != 1) {
    return memento::tools::ReportStatus(
        memento::InvalidArgumentError("inspect --tier " + args.tier + " takes one directory, got " +
                                      std::to_string(args.targets.size())));
  }
  args.target = args.targets.front();
  return it->second(args);
}

void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "List what a tier holds");
  cmd->add_option("--tier", args->tier, "Tier to inspect: durable (default) or memory");
  cmd->add_option("target", args->targets,
                  "What to inspect (durable: the directory; memory: node roots such as "
                  "/dev/shm/memento/JOB/node0)")
      ->required();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_flag("!--no-verify", args->verify,
                "memory: read slot headers only, do not checksum the data");
  cmd->callback([&ctx, args] { ctx.exit_code = RunInspect(*args); });
}

}  // namespace
MEMENTO_REGISTER_COMMAND(inspect, Setup);
