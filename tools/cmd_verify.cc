// `memento verify DIR [--step S] [--json]`: checks durable versions
// (markers, index, sizes, safetensors headers, every piece's checksum) and
// says exactly what is wrong. Exit status 0 when every complete version
// checked is sound, 1 otherwise.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tier/env.h"
#include "tier/verify.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace {

struct VerifyArgs {
  std::string dir;
  int64_t version = -1;
  bool json = false;
};

int RunVerify(const VerifyArgs& args) {
  using namespace memento::tier;
  std::optional<int64_t> step;
  if (args.version >= 0) step = args.version;
  auto report = Verify(Env::Default(), args.dir, step);
  if (!report.ok()) return memento::tools::ReportStatus(report.status());
  if (args.json) {
    nlohmann::json j;
    j["dir"] = args.dir;
    j["ok"] = report->ok();
    j["versions"] = nlohmann::json::array();
    for (const auto& v : report->versions) {
      j["versions"].push_back({{"step", v.step},
                               {"complete", v.complete},
                               {"ok", v.ok},
                               {"bytes_checked", v.bytes_checked},
                               {"problems", v.problems}});
    }
    memento::tools::PrintJson("memento.verify/1", std::move(j));
    return report->ok() ? 0 : 1;
  }
  if (report->versions.empty()) std::printf("%s: no versions\n", args.dir.c_str());
  int bad = 0;
  for (const auto& v : report->versions) {
    if (!v.complete && v.problems.empty()) {
      std::printf("version %lld: incomplete (no COMMIT marker), does not exist, ignored\n",
                  static_cast<long long>(v.step));
    } else if (v.problems.empty()) {
      std::printf("version %lld: OK (%.1f MiB checked)\n", static_cast<long long>(v.step),
                  v.bytes_checked / 1048576.0);
    } else {
      ++bad;
      std::printf("version %lld: BAD\n", static_cast<long long>(v.step));
      for (const auto& p : v.problems) std::printf("  - %s\n", p.c_str());
    }
  }
  if (bad > 0) std::fprintf(stderr, "memento: %d version(s) failed verification\n", bad);
  return bad > 0 ? 1 : 0;
}

void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
  auto args = std::make_shared<VerifyArgs>();
  auto* cmd =
      app.add_subcommand("verify", "Check durable-tier versions (markers, sizes, checksums)");
  cmd->add_option("dir", args->dir, "Durable-tier directory")->required();
  cmd->add_option("--step", args->version, "Check only this version (step)");
  // The old spelling, hidden from --help (group ""); it still works and says
  // it is deprecated.
  cmd->add_option_function<int64_t>(
         "--version",
         [args](const int64_t& step) {
           std::fprintf(stderr, "memento verify: --version is deprecated; use --step %lld\n",
                        static_cast<long long>(step));
           args->version = step;
         },
         "Deprecated spelling of --step")
      ->group("");
  cmd->add_flag("--json", args->json, "Print the report as JSON");
  cmd->footer(std::string(memento::tools::kExitCodesFooter) +
              " A version that fails verification makes it exit 1.");
  cmd->callback([&ctx, args] { ctx.exit_code = RunVerify(*args); });
}

}  // namespace
MEMENTO_REGISTER_COMMAND(verify, Setup);
