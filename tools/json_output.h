// The one JSON style of the `memento` command line: every `--json` output
// (and every benchmark, whose only format is JSON) is one JSON object on one
// line of stdout, with a "schema" field naming what it is and its version:
// "memento.<command>[.<sub-command>]/<N>", e.g. "memento.bench.recover/1".
// N grows when a field changes meaning or goes away (new fields keep N).
// Human text goes to stderr when it is printed together with the JSON.
// Tested by tests/cli/cli_test.cc (JsonHasSchema...).
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace memento::tools {

inline void PrintJson(const std::string& schema, nlohmann::json j) {
  j["schema"] = schema;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace memento::tools
