// Sub-commands of the `memento` command line.
//
// Each sub-command lives in its own tools/cmd_<name>.cc and registers itself
// with MEMENTO_REGISTER_COMMAND, so adding a command touches no shared file:
//
//   namespace {
//   void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
//     auto* cmd = app.add_subcommand("plan", "Show placement plans");
//     ...
//     cmd->callback([&ctx] { ctx.exit_code = RunPlan(...); });
//   }
//   }  // namespace
//   MEMENTO_REGISTER_COMMAND(plan, Setup);
//
// `memento bench` is one sub-command with its own sub-commands; benchmarks add
// themselves with MEMENTO_REGISTER_BENCH in the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::tools {

struct CommandContext {
  int exit_code = 0;
};

using CommandSetup = std::function<void(CLI::App& app, CommandContext& ctx)>;

// Registration happens during static initialisation, before main().
bool RegisterCommand(const char* name, CommandSetup setup);
// `bench` is the parent App of `memento bench <name>`.
bool RegisterBench(const char* name, CommandSetup setup);

// `memento run`: the command after the first `--` (main.cc cuts it off
// before CLI11 parses the rest).
std::vector<std::string>& RunCommandArgs();

// The exit codes every command shares; commands with more (launch) extend it.
inline constexpr const char* kExitCodesFooter =
    "Exit codes: 0 success; 1 failure (the message on stderr says why); 2 bad usage or "
    "invalid input (a parse error, an invalid flag value, a malformed file or message).";

// Prints "memento: <status>" to stderr and returns an exit code for it
// (0 for OK, 2 for InvalidArgument, 1 otherwise).
int ReportStatus(const Status& status);

}  // namespace memento::tools

#define MEMENTO_TOOLS_CONCAT_INNER_(a, b) a##b
#define MEMENTO_TOOLS_CONCAT_(a, b) MEMENTO_TOOLS_CONCAT_INNER_(a, b)
#define MEMENTO_REGISTER_COMMAND(name, setup)                              \
  static const bool MEMENTO_TOOLS_CONCAT_(memento_cmd_registered_, name) = \
      ::memento::tools::RegisterCommand(#name, setup)
#define MEMENTO_REGISTER_BENCH(name, setup)                                  \
  static const bool MEMENTO_TOOLS_CONCAT_(memento_bench_registered_, name) = \
      ::memento::tools::RegisterBench(#name, setup)
