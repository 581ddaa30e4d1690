// The in-memory tier (T0) seen from outside the agents: which versions the
// slots under one or more node roots hold, and which of them are intact.
// Used by `memento inspect --tier memory` and, as a tier::VersionSource, by
// "latest complete version across tiers" (memory first, then durable).
//
// Reads slot files read-only and never writes them, so it is safe to run
// while agents and trainers are live: a slot being rewritten while it is read
// is reported as changed, never as intact.
//
// Thread safety: free functions; MemoryVersionSource is immutable after
// construction and may be used from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"
#include "tier/discovery.h"

namespace memento::agent {

// One slot file (rank<R>.slot<S>) under a node root.
struct MemorySlotReport {
  std::string root;
  int rank = -1;
  int slot = -1;
  std::string state;  // "empty", "writing", "complete", or "unreadable"
  int64_t step = -1;
  uint64_t data_bytes = 0;
  bool intact = false;  // complete, and (when checked) every chunk checksum verifies
  std::string error;    // why it is not intact
};

struct MemoryTierReport {
  std::vector<MemorySlotReport> slots;  // by root, rank, slot
  std::vector<int> ranks;               // every rank seen, sorted
  // Newest step that every rank seen holds intact; nullopt when there is none.
  std::optional<int64_t> latest_complete;
};

// Scans `roots` (node roots, e.g. /dev/shm/memento/<job>/node0). With
// `verify_data`, every complete slot's chunks are checksummed (a full read of
// the state); otherwise headers, manifests and chunk tables only. NotFound when
// a root does not exist.
Result<MemoryTierReport> InspectMemoryTier(const std::vector<std::string>& roots, bool verify_data);

// tier::VersionSource over node roots on this host: the newest step that every
// rank holds intact, data checksums verified.
class MemoryVersionSource final : public tier::VersionSource {
 public:
  explicit MemoryVersionSource(std::vector<std::string> roots) : roots_(std::move(roots)) {}
  std::string name() const override { return "memory"; }
  Result<std::optional<int64_t>> LatestComplete(Deadline deadline) override;

 private:
  const std::vector<std::string> roots_;
};

}  // namespace memento::agent
