#include "tier/discovery.h"

#include <fmt/format.h>

#include "tier/reader.h"

namespace memento::tier {

Result<std::optional<int64_t>> DurableVersionSource::LatestComplete(Deadline deadline) {
  auto step = LatestCompleteVersion(env_, root_);
  if (step.ok()) return std::optional<int64_t>(*step);
  if (step.status().code() == StatusCode::kNotFound) return std::optional<int64_t>();
  return step.status();
}

Result<LatestVersion> FindLatestComplete(const std::vector<VersionSource*>& sources,
                                         Deadline deadline) {
  LatestVersion best;
  bool found = false;
  std::vector<std::string> said;
  for (VersionSource* src : sources) {
    auto r = src->LatestComplete(deadline);
    if (!r.ok()) {
      best.skipped.push_back(src->name() + ": " + r.status().ToString());
      said.push_back(best.skipped.back());
      continue;
    }
    if (!r->has_value()) {
      said.push_back(src->name() + ": none");
      continue;
    }
    if (!found || **r > best.step) {
      best.step = **r;
      best.source = src->name();
      found = true;
    }
  }
  if (!found) {
    return NotFoundError(
        fmt::format("no complete version in any tier ({})", fmt::join(said, "; ")));
  }
  return best;
}

}  // namespace memento::tier
