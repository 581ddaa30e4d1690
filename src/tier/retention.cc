#include "tier/retention.h"

#include <algorithm>

#include "tier/format.h"
#include "tier/reader.h"

namespace memento::tier {

Status DeleteVersion(Env* env, const std::string& root, int64_t step) {
  const std::string vdir = root + "/" + VersionDirName(step);
  const std::string commit = vdir + "/" + kCommitFileName;
  if (env->FileExists(commit)) {
    MEMENTO_RETURN_IF_ERROR(env->RemoveFile(commit));
    MEMENTO_RETURN_IF_ERROR(env->SyncDir(vdir));
  }
  MEMENTO_RETURN_IF_ERROR(RemoveDirRecursive(env, vdir));
  return env->SyncDir(root);
}

Result<RetentionReport> ApplyRetention(Env* env, const std::string& root,
                                       const RetentionPolicy& policy) {
  RetentionReport report;
  MEMENTO_ASSIGN_OR_RETURN(auto versions, ListVersions(env, root));
  std::vector<int64_t> complete;
  for (const auto& v : versions) {
    if (v.complete) complete.push_back(v.step);
  }
  if (complete.empty()) return report;  // nothing to anchor on: touch nothing
  const int64_t newest = complete.back();
  const size_t keep_last = static_cast<size_t>(std::max(1, policy.keep_last));
  for (size_t i = 0; i < complete.size(); ++i) {
    const int64_t s = complete[i];
    const bool keep = i + keep_last >= complete.size() || s == newest ||
                      (policy.keep_every > 0 && s % policy.keep_every == 0);
    if (keep) {
      report.kept.push_back(s);
      continue;
    }
    MEMENTO_RETURN_IF_ERROR(DeleteVersion(env, root, s));
    report.deleted.push_back(s);
  }
  for (const auto& v : versions) {
    if (!v.complete && v.step < newest) {
      MEMENTO_RETURN_IF_ERROR(DeleteVersion(env, root, v.step));
      report.cleaned_incomplete.push_back(v.step);
    }
  }
  return report;
}

}  // namespace memento::tier
