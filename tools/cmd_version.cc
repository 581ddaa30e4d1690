// `memento version`: build facts (version, CUDA support).
#include <cstdio>

#include "memento/config.h"
#include "tools/command.h"

namespace {
void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
  auto* cmd = app.add_subcommand("version", "Print the version and build features");
  cmd->callback([] {
    std::printf("memento %s (cuda: %s)\n", MEMENTO_VERSION_STRING,
                MEMENTO_HAVE_CUDA ? "built" : "not built");
  });
}
}  // namespace
MEMENTO_REGISTER_COMMAND(version, Setup);
