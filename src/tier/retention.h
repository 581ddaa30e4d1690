// Retention of durable versions: keep the last N complete versions and every
// M-th one, delete the rest. The newest complete version is never deleted.
// Incomplete directories older than the newest complete version (abandoned
// writes) are removed; newer ones may still be in progress and are kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memento/status.h"
#include "tier/env.h"

namespace memento::tier {

struct RetentionPolicy {
  int keep_last = 3;       // newest N complete versions (at least 1 is always kept)
  int64_t keep_every = 0;  // also keep versions whose step % M == 0 (0: none)
};

struct RetentionReport {
  std::vector<int64_t> deleted;             // complete versions removed
  std::vector<int64_t> cleaned_incomplete;  // incomplete directories removed
  std::vector<int64_t> kept;
};

// Deletes a version safely: COMMIT first (fsync of the directory), so that a
// crash halfway leaves an incomplete directory, never a complete-looking torn
// one; then the other files and the directory.
[[nodiscard]] Status DeleteVersion(Env* env, const std::string& root, int64_t step);

[[nodiscard]] Result<RetentionReport> ApplyRetention(Env* env, const std::string& root,
                                                     const RetentionPolicy& policy);

}  // namespace memento::tier
