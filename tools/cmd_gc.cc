// `memento gc [--root-base DIR] [--dry-run] [--json]`: removes the node roots
// of finished or dead jobs from shared memory (docs/node_store.md, "Garbage
// collection"). A root is removed only when no agent holds its lock, nobody
// answers on its socket and no process maps its files; a live job's root is
// never touched. Prints what it keeps, what it removes and the bytes freed.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "fmt/format.h"
#include "shm/root_gc.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace {

struct GcArgs {
  std::string base = memento::shm::DefaultRootBase();
  bool dry_run = false;
  bool json = false;
};

std::string Mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

int RunGc(const GcArgs& args) {
  using namespace memento;
  auto roots = shm::FindNodeRoots(args.base);
  if (!roots.ok()) {
    if (roots.status().code() == StatusCode::kNotFound && !args.json) {
      std::printf("nothing to collect: %s does not exist\n", args.base.c_str());
      return 0;
    }
    if (roots.status().code() != StatusCode::kNotFound) return tools::ReportStatus(roots.status());
    roots = std::vector<std::string>{};
  }
  nlohmann::json out = nlohmann::json::array();
  uint64_t freed_total = 0;
  int removed = 0, kept = 0, failed = 0;
  for (const std::string& root : *roots) {
    auto probe = shm::ProbeNodeRoot(root);
    nlohmann::json j = {{"root", root}};
    if (!probe.ok()) {
      j["action"] = "error";
      j["error"] = probe.status().ToString();
      ++failed;
      if (!args.json)
        std::printf("error   %s: %s\n", root.c_str(), probe.status().ToString().c_str());
      out.push_back(j);
      continue;
    }
    j["bytes"] = probe->bytes;
    j["agent_pid"] = probe->agent_pid;
    j["mapped_by"] = probe->mapped_by;
    j["why"] = probe->why;
    if (probe->live) {
      j["action"] = "kept";
      ++kept;
      if (!args.json) {
        std::printf("kept    %s (%s): live: %s\n", root.c_str(), Mib(probe->bytes).c_str(),
                    probe->why.c_str());
      }
    } else if (args.dry_run) {
      j["action"] = "would_remove";
      freed_total += probe->bytes;
      ++removed;
      if (!args.json) {
        std::printf("would remove %s (%s): %s\n", root.c_str(), Mib(probe->bytes).c_str(),
                    probe->why.c_str());
      }
    } else {
      auto freed = shm::RemoveDeadNodeRoot(root);  // re-checks under the root's lock
      if (freed.ok()) {
        j["action"] = "removed";
        j["bytes"] = *freed;
        freed_total += *freed;
        ++removed;
        // The job's directory, once its last node root is gone.
        std::string job_dir = root.substr(0, root.rfind('/'));
        if (job_dir != args.base) rmdir(job_dir.c_str());
        if (!args.json) {
          std::printf("removed %s (%s freed): %s\n", root.c_str(), Mib(*freed).c_str(),
                      probe->why.c_str());
        }
      } else {
        j["action"] = freed.status().code() == StatusCode::kFailedPrecondition ? "kept" : "error";
        j["error"] = freed.status().ToString();
        (freed.status().code() == StatusCode::kFailedPrecondition ? kept : failed) += 1;
        if (!args.json) {
          std::printf("kept    %s: %s\n", root.c_str(), freed.status().message().c_str());
        }
      }
    }
    out.push_back(j);
  }
  if (args.json) {
    nlohmann::json top = {{"base", args.base},
                          {"dry_run", args.dry_run},
                          {"roots", out},
                          {"removed", removed},
                          {"kept", kept},
                          {"errors", failed},
                          {"freed_bytes", freed_total}};
    memento::tools::PrintJson("memento.gc/1", std::move(top));
  } else {
    std::printf("%s %d root%s (%s), kept %d live, %d error%s\n",
                args.dry_run ? "would remove" : "removed", removed, removed == 1 ? "" : "s",
                Mib(freed_total).c_str(), kept, failed, failed == 1 ? "" : "s");
  }
  return failed == 0 ? 0 : 1;
}

void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
  auto args = std::make_shared<GcArgs>();
  auto* cmd = app.add_subcommand(
      "gc", "Remove the shared-memory roots of finished or dead jobs (never a live one)");
  cmd->add_option("--root-base", args->base,
                  "Directory holding the job roots (<base>/<job>/node<N>)")
      ->capture_default_str();
  cmd->add_flag("--dry-run", args->dry_run, "Only print what would be removed");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([&ctx, args] { ctx.exit_code = RunGc(*args); });
}

}  // namespace
MEMENTO_REGISTER_COMMAND(gc, Setup);
