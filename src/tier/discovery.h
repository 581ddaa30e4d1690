// "Latest complete version" across tiers. Recovery asks every tier that may
// hold versions (memory of live agents first, then the durable tier) and takes
// the newest complete one; on a tie the earlier (faster) tier wins.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"
#include "tier/env.h"

namespace memento::tier {

// One tier that can say which complete versions it holds. The agent layer
// implements one for the in-memory tiers (T0/T1); DurableVersionSource is T2.
class VersionSource {
 public:
  virtual ~VersionSource() = default;
  virtual std::string name() const = 0;  // "memory", "durable:/mnt/ckpt"
  // The newest complete version, nullopt when the tier holds none. An error
  // means the tier could not be asked (it is then skipped, and reported).
  [[nodiscard]] virtual Result<std::optional<int64_t>> LatestComplete(Deadline deadline) = 0;
};

class DurableVersionSource final : public VersionSource {
 public:
  // `env` must outlive this object.
  DurableVersionSource(Env* env, std::string root) : env_(env), root_(std::move(root)) {}
  std::string name() const override { return "durable:" + root_; }
  Result<std::optional<int64_t>> LatestComplete(Deadline deadline) override;

 private:
  Env* env_;
  std::string root_;
};

struct LatestVersion {
  int64_t step = 0;
  std::string source;                // name() of the tier that holds it
  std::vector<std::string> skipped;  // tiers that failed to answer, with why
};

// The newest complete version over `sources` (in order of preference).
// NotFound when no tier holds one (the message lists what each tier said).
[[nodiscard]] Result<LatestVersion> FindLatestComplete(const std::vector<VersionSource*>& sources,
                                                       Deadline deadline);

}  // namespace memento::tier
