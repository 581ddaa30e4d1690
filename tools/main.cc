// `memento`: the command line. Sub-commands register themselves (command.h).
#include <cstdio>
#include <map>
#include <string>

#include "common/log.h"
#include "memento/config.h"
#include "tools/command.h"

namespace memento::tools {
namespace {

std::map<std::string, CommandSetup>& Commands() {
  static auto* m = new std::map<std::string, CommandSetup>();
  return *m;
}
std::map<std::string, CommandSetup>& Benches() {
  static auto* m = new std::map<std::string, CommandSetup>();
  return *m;
}

}  // namespace

bool RegisterCommand(const char* name, CommandSetup setup) {
  Commands()[name] = std::move(setup);
  return true;
}

bool RegisterBench(const char* name, CommandSetup setup) {
  Benches()[name] = std::move(setup);
  return true;
}

int ReportStatus(const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "memento: %s\n", status.ToString().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace memento::tools

int main(int argc, char** argv) {
  using namespace memento::tools;
  CLI::App app{"memento: in-memory checkpointing for large-model training", "memento"};
  app.set_version_flag("--version", MEMENTO_VERSION_STRING);
  app.require_subcommand(1);
  CommandContext ctx;
  for (auto& [name, setup] : Commands()) setup(app, ctx);
  if (!Benches().empty()) {
    CLI::App* bench = app.add_subcommand("bench", "Run a benchmark and print its result as JSON");
    bench->require_subcommand(1);
    for (auto& [name, setup] : Benches()) setup(*bench, ctx);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ctx.exit_code;
}
