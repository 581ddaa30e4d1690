// memento export DIR [--step S] --out PATH [--rank R] [--prefix P]: one
// durable version as one safetensors file that torch (safetensors, or
// memento.load_durable) loads (docs/python.md, "Durable versions").
#include <cstdio>
#include <optional>
#include <string>

#include "tier/env.h"
#include "tier/export.h"
#include "tools/command.h"

namespace memento::tools {
namespace {

void Setup(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "export",
      "Write one durable version as a single safetensors file: whole tensors (DP shards and TP "
      "slices assembled) under the names the trainer registered, every piece checked");
  static std::string dir, out, prefix;
  static int64_t step = -1;
  static int rank = 0;
  cmd->add_option("dir", dir, "The durable tier's directory (the agent's --durable-dir)")
      ->required();
  cmd->add_option("--step", step, "The version to export (default: the newest complete one)");
  cmd->add_option("--out", out, "The safetensors file to write")->required();
  cmd->add_option("--rank", rank,
                  "Export this rank's state: its own tensors and the replicated ones it shares")
      ->default_val(0);
  cmd->add_option("--prefix", prefix,
                  "Only tensors whose name starts with this (e.g. model/), written without it");
  cmd->callback([&ctx] {
    tier::ExportOptions o;
    o.rank = rank;
    o.prefix = prefix;
    auto r = tier::ExportSafetensors(
        tier::Env::Default(), dir, step >= 0 ? std::optional<int64_t>(step) : std::nullopt, out, o);
    if (!r.ok()) {
      ctx.exit_code = ReportStatus(r.status());
      return;
    }
    std::printf("exported step %lld of rank %d: %llu tensors, %llu bytes -> %s\n",
                static_cast<long long>(r->step), rank, static_cast<unsigned long long>(r->tensors),
                static_cast<unsigned long long>(r->bytes), r->path.c_str());
  });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(export, memento::tools::Setup);
