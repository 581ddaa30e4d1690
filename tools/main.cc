// `memento`: the command line. Sub-commands register themselves (command.h).
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "memento/config.h"
#include "tools/command.h"
#include "tools/environment.h"

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
  // `memento run [options] -- COMMAND...`: the command after the first `--`
  // is not parsed (its own flags would look like memento's).
  if (argc > 1 && std::string(argv[1]) == "run") {
    for (int i = 2; i < argc; ++i) {
      if (std::string(argv[i]) == "--") {
        RunCommandArgs().assign(argv + i + 1, argv + argc);
        argc = i;
        break;
      }
    }
  }
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
  // Every command's --help ends with its exit codes (`memento --help` and
  // the commands with sub-commands too); a command with codes of its own
  // (launch: 3) sets its footer itself. tests/cli/cli_test.sh checks each.
  std::vector<CLI::App*> all = {&app};
  for (size_t i = 0; i < all.size(); ++i) {
    for (CLI::App* sub : all[i]->get_subcommands({})) all.push_back(sub);
    if (all[i]->get_footer().empty()) all[i]->footer(kExitCodesFooter);
  }
  // The process-wide settings from the environment, before any command runs
  // (tools/environment.h).
  if (memento::Status st = ApplyEnvironment(); !st.ok()) {
    std::fprintf(stderr, "memento: %s\n", st.ToString().c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every parse error exits 2 (CLI11's own
    // codes, 105-116, are not part of memento's interface).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return ctx.exit_code;
}
