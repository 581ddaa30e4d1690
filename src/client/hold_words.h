// The words through which the agent holds versions in this rank's slots
// (shm/commit_word.h): the commit word in cluster mode (docs/cluster.md,
// save path 5) and the durable hold word in single-node mode with a durable
// tier (docs/durable_tier.md, "The durable hold"). They decide which slot a
// snapshot overwrites, and whether it must be skipped.
//
// Thread safety: the trainer thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shm/commit_word.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::client {

class HoldWords {
 public:
  HoldWords(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {}

  // Cluster mode: maps <dir>/commit.word once it exists (the agent creates
  // it when it runs with --store). Returns whether the client is in cluster
  // mode.
  bool MapCommitWord();

  // Single-node mode with a durable tier: maps <dir>/durable.word once it
  // exists (the agent creates it when it runs with --durable-dir and no
  // --store). Returns whether the durable hold applies.
  bool MapDurableWord();

  // The slot Snapshot(step) writes. *target comes in as the single-node
  // choice (the slot that does not hold the newest complete version). In
  // cluster mode it becomes the slot that does not hold the newest committed
  // version. Returns false when the snapshot must be skipped: the target slot
  // holds a version the agent protects, for T1 (a newer version than the
  // committed one) or for the durable tier (until its deadline); *why then
  // says which. The claim handshake with the agent (shm/commit_word.h) makes
  // "the agent keeps that version" and "this client overwrites it" exclusive.
  // Only this rank writes its slots (the agent writes them only while the
  // trainers are stopped, in recovery), so their headers are read directly.
  bool ChooseTarget(const shm::RankSlots& slots, int* target, std::string* why);

  // Called after the snapshot of `step` marked its target slot kWriting
  // (shm::BeginSlotWrite). A claim of a step not older than `step` (a slot
  // left by an attempt the job rolled back from, e.g. its step `step`) is
  // withdrawn: it would otherwise read as a claim of the step now written,
  // and the agent would abandon the new attempt's step of that number
  // (tests/cluster_save/commit_word_test.cc,
  // ASnapshotOverTheRolledBackAttemptsSameStepLeavesNoClaimOfIt). Claims of
  // older steps stay in place as before.
  void Writing(int64_t step);

  // The agent directory the words are in.
  const std::string& dir() const { return dir_; }
  // Whether the commit word is mapped (cluster mode).
  bool cluster() const { return commit_word_ != nullptr; }
  // Where `step` stands in the commit word (Client::WaitForCommit):
  // kCommitted once the word's committed step is `step` or newer;
  // kReleased once the agent, seen holding `step` by an earlier call
  // (*held, false before the first call; the caller keeps it between calls),
  // no longer holds it and has not committed it; kPending otherwise (also
  // outside cluster mode).
  enum class CommitState { kPending, kCommitted, kReleased };
  CommitState PollCommit(int64_t step, bool* held) const;
  // The newest committed step (the commit word); -1 when none or not in
  // cluster mode.
  int64_t Committed() const;

 private:
  bool HeldTarget(shm::CommitWord* w, bool cluster, const shm::RankSlots& slots, int* target,
                  std::string* why);

  const std::string dir_;
  const int rank_;
  // Cluster mode (null otherwise): the agent's commit word, mapped writable
  // for this rank's claim entry.
  std::unique_ptr<shm::Segment> commit_word_seg_;
  shm::CommitWord* commit_word_ = nullptr;
  // Single-node mode with a durable tier (null otherwise): the agent's
  // durable hold word, mapped writable for this rank's claim entry.
  std::unique_ptr<shm::Segment> durable_word_seg_;
  shm::CommitWord* durable_word_ = nullptr;
  // The word and step of this rank's standing claim made by the last
  // ChooseTarget that let the snapshot proceed (null / -1: none).
  shm::CommitWord* claimed_word_ = nullptr;
  int64_t claimed_victim_ = -1;
};

}  // namespace memento::client
