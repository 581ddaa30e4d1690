// One durable version as one plain safetensors file (`memento export`,
// memento.load_durable; docs/python.md, "Durable versions").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memento/status.h"
#include "tier/env.h"

namespace memento::tier {

struct ExportOptions {
  // The rank whose state is exported: its own tensors ("rank<R>/<name>")
  // and the replicated ones it shares, under the names it registered.
  int rank = 0;
  // Only names with this prefix (e.g. "model/"), written without it. Empty: all.
  std::string prefix;
  // Names starting with one of these are left out (the Python checkpointer's
  // pickled blob, "__memento__/").
  std::vector<std::string> exclude_prefixes = {"__memento__/"};
};

struct ExportReport {
  int64_t step = 0;
  std::string path;
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // tensor bytes written
};

// Writes version `step` (the newest complete one when nullopt) of the durable
// tier at `root` to `out_path` as one safetensors file: whole tensors (DP
// shards and TP slices assembled), every piece checked against its checksum,
// "__metadata__" {"job", "step", "rank", "format": "pt"}. The file appears
// whole or not at all (written to a temporary name, fsynced, renamed).
// NotFound when the version or the rank's tensors do not exist.
[[nodiscard]] Result<ExportReport> ExportSafetensors(Env* env, const std::string& root,
                                                     std::optional<int64_t> step,
                                                     const std::string& out_path,
                                                     const ExportOptions& options = {});

}  // namespace memento::tier
