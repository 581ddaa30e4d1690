// Key layout of one job in the coordination store (docs/coordination.md).
//
//   /memento/<job>/nodes/<node>                 endpoint; attached to the node's lease
//   /memento/<job>/signal/<node>                SignalRecord (no lease: outlives the node)
//   /memento/<job>/completed/<step>/<node>      COMPLETED(step, node) report
//   /memento/<job>/commit/<step>                commit record of a step
//   /memento/<job>/commit/latest                highest committed step (only ever grows)
//   /memento/<job>/topology                     topology + policy JSON (launcher; docs/cluster.md)
//   /memento/<job>/plan_hash                    recover::PlanHash of the job's plan (launcher)
//   /memento/<job>/inventory/<rank>             a rank's registered tensors (its agent)
//   /memento/<job>/restore                      the step the cluster restores (launcher)
//   /memento/<job>/recovery/<n>                 recovery n: decision and time breakdown
//   /memento/<job>/skipped/<step>/<node>[@<e>]  the node will never report the step of commit
//                                               epoch e (agents; no suffix: epoch 0)
//   /memento/<job>/epoch                        durable-tier history counter (launcher; decimal)
//
// Steps are zero-padded to 20 digits so that lexical order is numeric order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "memento/status.h"

namespace memento::coord {

// Job and node names: 1..64 of [A-Za-z0-9._-]. InvalidArgument otherwise.
[[nodiscard]] Status ValidateName(const std::string& what, const std::string& name);

// The store name of node `node` ("node0", "node1", ...): its membership key
// (/memento/<job>/nodes/<name>), its signal and its COMPLETED reports; the
// CommitCoordinator's member set is these names. REQUIRES: node >= 0.
std::string NodeName(int node);
// Inverse of NodeName: InvalidArgument unless `name` is exactly "node<N>"
// with N in canonical decimal (no sign, no leading zero) below 2^31.
[[nodiscard]] Result<int> ParseNodeName(std::string_view name);

std::string StepKey(int64_t step);
// Parses a 20-digit step; InvalidArgument otherwise.
[[nodiscard]] Result<int64_t> ParseStep(const std::string& s);

// A skip record's key (JobKeys::Skipped), parsed.
struct SkippedKey {
  int64_t step = -1;
  std::string node;
  uint64_t epoch = 0;
};

class JobKeys;
// Parses `key` as JobKeys(job).Skipped(step, node, epoch); InvalidArgument
// (naming the key and what is wrong) for anything else.
[[nodiscard]] Result<SkippedKey> ParseSkippedKey(const JobKeys& keys, const std::string& key);

class JobKeys {
 public:
  explicit JobKeys(const std::string& job) : prefix_("/memento/" + job + "/") {}
  const std::string& prefix() const { return prefix_; }
  std::string NodesPrefix() const { return prefix_ + "nodes/"; }
  std::string Node(const std::string& node) const { return NodesPrefix() + node; }
  std::string SignalPrefix() const { return prefix_ + "signal/"; }
  std::string Signal(const std::string& node) const { return SignalPrefix() + node; }
  std::string CompletedPrefix() const { return prefix_ + "completed/"; }
  std::string Completed(int64_t step, const std::string& node) const {
    return CompletedPrefix() + StepKey(step) + "/" + node;
  }
  std::string CommitPrefix() const { return prefix_ + "commit/"; }
  std::string Commit(int64_t step) const { return CommitPrefix() + StepKey(step); }
  std::string CommitLatest() const { return CommitPrefix() + "latest"; }
  std::string Topology() const { return prefix_ + "topology"; }
  std::string PlanHash() const { return prefix_ + "plan_hash"; }
  std::string InventoryPrefix() const { return prefix_ + "inventory/"; }
  std::string Inventory(int rank) const { return InventoryPrefix() + std::to_string(rank); }
  std::string Restore() const { return prefix_ + "restore"; }
  std::string RecoveryPrefix() const { return prefix_ + "recovery/"; }
  std::string Recovery(int64_t n) const { return RecoveryPrefix() + StepKey(n); }
  std::string SkippedPrefix() const { return prefix_ + "skipped/"; }
  // A skip record names its commit epoch (CommitId::epoch): after a recovery
  // that rolled back to S, the steps after S are computed again in a new
  // epoch, and a skip of the abandoned history's step s says nothing about
  // the new history's step s. Epoch 0 has no suffix (what older builds
  // wrote, and a job that never recovered).
  std::string Skipped(int64_t step, const std::string& node, uint64_t epoch = 0) const {
    return SkippedPrefix() + StepKey(step) + "/" + node +
           (epoch > 0 ? "@" + std::to_string(epoch) : std::string());
  }
  // The durable tier's epoch (tier::VersionView::epoch): bumped by the
  // launcher at every recovery; agents write their durable parts with it.
  std::string Epoch() const { return prefix_ + "epoch"; }
  // AOR (docs/reft.md section 5): rank's own opt::ShardChecksum of its
  // recent steps (JSON {"<step>": "<16 hex digits>"}), written by its node's
  // agent; what every replica of the rank's shard is checked against.
  std::string AorSum(int rank) const { return prefix_ + "aor/sum/" + std::to_string(rank); }
  // Plan Copy `copy` (kAor) is kept current on its holder's host from the
  // step stored here on: the owner's node stops pushing it over the network.
  std::string AorHeld(uint32_t copy) const { return prefix_ + "aor/held/" + std::to_string(copy); }

 private:
  std::string prefix_;
};

}  // namespace memento::coord
