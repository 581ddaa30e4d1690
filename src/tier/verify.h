// Full checks of durable versions: markers, index, file sizes, safetensors
// headers and every piece's checksum. Used by `memento verify` and by tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memento/status.h"
#include "tier/env.h"

namespace memento::tier {

struct VersionCheck {
  int64_t step = 0;
  bool complete = false;  // has a COMMIT marker
  bool ok = false;        // complete and every check passed
  uint64_t bytes_checked = 0;
  std::vector<std::string> problems;  // each names the file and what is wrong
};

struct VerifyReport {
  std::vector<VersionCheck> versions;  // oldest first
  // True when every complete version checked is sound (incomplete versions do
  // not exist and are not errors, unless one was named explicitly).
  bool ok() const;
};

// Checks version `step`, or every version under `root` when nullopt. Fails
// (rather than reporting) only when `root` cannot be listed. A named version
// without COMMIT is reported as a problem.
[[nodiscard]] Result<VerifyReport> Verify(Env* env, const std::string& root,
                                          std::optional<int64_t> step);

// Checks one complete version (step must have a COMMIT marker).
VersionCheck VerifyVersion(Env* env, const std::string& root, int64_t step);

// The cheap part of VerifyVersion, reading no tensor data: COMMIT, the index
// (LoadIndex: size and checksum against COMMIT), every node's manifest
// (node-N.json: present, parses, names this step and node, matches the size
// and checksum its node-N.done marker recorded) and every data file's size.
// `memento inspect` uses it so that it never calls a broken version complete.
VersionCheck QuickCheckVersion(Env* env, const std::string& root, int64_t step);

}  // namespace memento::tier
