#include "agent/commit_hold.h"

namespace memento::agent {

Result<std::unique_ptr<CommitHold>> CommitHold::Create(const std::string& root, int64_t committed) {
  std::unique_ptr<CommitHold> h(new CommitHold());
  MEMENTO_ASSIGN_OR_RETURN(
      h->segment_, shm::Segment::CreateOrGrow(shm::CommitWordPath(root), sizeof(shm::CommitWord)));
  h->word_ = reinterpret_cast<shm::CommitWord*>(h->segment_->data());
  shm::InitCommitWord(h->word_, committed);
  return h;
}

void CommitHold::Set(int64_t step) {
  shm::StoreWord(&word_->hold, step);
  __atomic_add_fetch(&word_->generation, 1, __ATOMIC_SEQ_CST);
  shm::FullFence();
}

void CommitHold::Release(int64_t step) {
  int64_t expected = step;
  __atomic_compare_exchange_n(&word_->hold, &expected, int64_t{-1}, false, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&word_->generation, 1, __ATOMIC_SEQ_CST);
}

int64_t CommitHold::held() const { return shm::LoadWord(&word_->hold); }

bool CommitHold::Claimed(int rank, int64_t step) const {
  return rank < shm::kCommitWordMaxRanks && shm::LoadWord(&word_->claim[rank]) == step;
}

void CommitHold::ForgetClaimsAbove(int64_t step) {
  for (int r = 0; r < shm::kCommitWordMaxRanks; ++r) {
    int64_t claim = shm::LoadWord(&word_->claim[r]);
    // A claim that changes meanwhile is a live client's: left as it is.
    if (claim > step) {
      __atomic_compare_exchange_n(&word_->claim[r], &claim, int64_t{-1}, false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST);
    }
  }
}

void CommitHold::Commit(int64_t step) {
  shm::StoreWord(&word_->committed, step);
  int64_t hold = shm::LoadWord(&word_->hold);
  if (hold >= 0 && hold <= step) Release(hold);
  __atomic_add_fetch(&word_->generation, 1, __ATOMIC_SEQ_CST);
}

}  // namespace memento::agent
