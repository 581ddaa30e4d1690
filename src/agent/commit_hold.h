// The commit word (shm/commit_word.h) as the agent writes it, in
// <root>/commit.word: the newest committed step the trainers may not
// overwrite, and the hold on a step this node reported and that has not
// committed yet (docs/cluster.md, "Save path of version s"). The trainers
// read it; they claim a slot (claim[rank]) before they overwrite a step, and
// the agent looks at the claims after setting the hold.
//
// Thread safety: every method is safe from any thread (atomic words in
// shared memory; a trainer may read them at any time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "memento/status.h"
#include "shm/commit_word.h"
#include "shm/segment.h"

namespace memento::agent {

class CommitHold {
 public:
  // Creates (or reopens) <root>/commit.word with `committed` as the newest
  // committed step and no hold. The trainers switch to the cluster rule when
  // the word exists.
  [[nodiscard]] static Result<std::unique_ptr<CommitHold>> Create(const std::string& root,
                                                                  int64_t committed);

  // Holds `step`: the trainers keep its slots until it commits or the hold
  // is released.
  void Set(int64_t step);
  // Releases the hold if it is still on `step`.
  void Release(int64_t step);
  // The step held; -1: none.
  int64_t held() const;
  // Rank `rank` claimed its slot of `step` to overwrite it.
  bool Claimed(int rank, int64_t step) const;
  // A recovery took the job back to `step` (its trainers are stopped): the
  // claims of later steps are the failed attempt's. A client leaves its
  // claim in place after it overwrote the slot, so without this the new
  // attempt's step of the same number would be abandoned as "being
  // overwritten" and never commit.
  void ForgetClaimsAbove(int64_t step);
  // `step` committed: the trainers keep it from now on; a hold on it or an
  // older step is released.
  void Commit(int64_t step);

 private:
  CommitHold() = default;
  std::unique_ptr<shm::Segment> segment_;
  shm::CommitWord* word_ = nullptr;  // in segment_
};

}  // namespace memento::agent
