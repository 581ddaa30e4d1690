#include "client/hold_words.h"

#include <sys/stat.h>

#include "common/log.h"
#include "fmt/format.h"

namespace memento::client {
namespace {

// Maps the hold word at `path` once it exists and is valid; null otherwise.
shm::CommitWord* MapWord(const std::string& path, const char* what,
                         std::unique_ptr<shm::Segment>* seg_out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(shm::CommitWord))
    return nullptr;
  auto seg = shm::Segment::Open(path, /*writable=*/true);
  if (!seg.ok()) {
    MEMENTO_LOG_WARN("cannot map the {} {}: {}", what, path, seg.status().ToString());
    return nullptr;
  }
  auto* w = reinterpret_cast<shm::CommitWord*>((*seg)->data());
  if (!shm::CommitWordValid(w)) return nullptr;
  *seg_out = std::move(*seg);
  return w;
}

// The complete step a slot holds, -1 when it holds none.
int64_t SlotStep(const shm::Segment& slot) {
  const shm::SlotPeek peek = shm::PeekSlot(slot);
  return peek.state == shm::SlotState::kComplete ? peek.step : -1;
}

}  // namespace

bool HoldWords::MapCommitWord() {
  if (commit_word_ != nullptr) return true;
  const std::string path = shm::CommitWordPath(dir_);
  commit_word_ = MapWord(path, "commit word", &commit_word_seg_);
  if (commit_word_ == nullptr) return false;
  MEMENTO_LOG_INFO("cluster mode: following the agent's commit word {} (committed step {})", path,
                   shm::LoadWord(&commit_word_->committed));
  return true;
}

int64_t HoldWords::Committed() const {
  return commit_word_ != nullptr ? shm::LoadWord(&commit_word_->committed) : -1;
}

HoldWords::CommitState HoldWords::PollCommit(int64_t step, bool* held) const {
  if (commit_word_ == nullptr) return CommitState::kPending;
  // The hold first: the agent stores `committed` before it releases the hold
  // of a step that committed (agent/commit_hold.cc), so a hold seen released
  // here and `committed` still below `step` after it is a release without a
  // commit.
  const int64_t hold = shm::LoadWord(&commit_word_->hold);
  if (shm::LoadWord(&commit_word_->committed) >= step) return CommitState::kCommitted;
  if (hold == step) {
    *held = true;
  } else if (*held) {
    return CommitState::kReleased;
  }
  return CommitState::kPending;
}

bool HoldWords::MapDurableWord() {
  if (durable_word_ != nullptr) return true;
  const std::string path = shm::DurableWordPath(dir_);
  durable_word_ = MapWord(path, "durable hold word", &durable_word_seg_);
  if (durable_word_ == nullptr) return false;
  MEMENTO_LOG_INFO("following the agent's durable hold word {}", path);
  return true;
}

bool HoldWords::ChooseTarget(const shm::RankSlots& slots, int* target, std::string* why) {
  // Either way, never the slot the agent's durable stream holds.
  if (MapCommitWord()) return HeldTarget(commit_word_, /*cluster=*/true, slots, target, why);
  if (MapDurableWord()) return HeldTarget(durable_word_, /*cluster=*/false, slots, target, why);
  return true;
}

bool HoldWords::HeldTarget(shm::CommitWord* w, bool cluster, const shm::RankSlots& slots,
                           int* target, std::string* why) {
  const int64_t committed = cluster ? shm::LoadWord(&w->committed) : -1;
  for (int s = 0; cluster && s < shm::kSlotsPerRank; ++s) {
    if (committed >= 0 && SlotStep(*slots[s]) == committed) *target = s == 0 ? 1 : 0;
  }
  const int64_t victim = SlotStep(*slots[*target]);
  if (victim < 0) return true;
  const bool can_claim = rank_ < shm::kCommitWordMaxRanks;
  if (can_claim) {
    shm::StoreWord(&w->claim[rank_], victim);
    shm::FullFence();
  }
  const bool t1_held = cluster && victim > committed && shm::LoadWord(&w->hold) == victim;
  const bool durable_held = !t1_held && shm::LoadDurableHold(w, shm::MonotonicNanos()) == victim;
  if (!t1_held && !durable_held) {
    // The agent will see the claim if it comes to it.
    if (can_claim) {
      claimed_word_ = w;
      claimed_victim_ = victim;
    }
    return true;
  }
  if (can_claim) shm::StoreWord(&w->claim[rank_], -1);
  *why = fmt::format("slot {} holds step {}, which the agent protects ({})", *target, victim,
                     t1_held ? fmt::format("T1, committed {}", committed) : "durable tier");
  return false;
}

void HoldWords::Writing(int64_t step) {
  shm::CommitWord* w = claimed_word_;
  const int64_t victim = claimed_victim_;
  claimed_word_ = nullptr;
  claimed_victim_ = -1;
  // A victim not older than `step` belongs to an attempt the job rolled back
  // from (this client only writes steps newer than the one it restored). Left
  // in place, its claim would name the step being written now, and the agent
  // would abandon that step as "being overwritten" (and publish a skip every
  // node honours). The slot is marked kWriting with a new generation, so no
  // reader takes it for the victim any more: the claim has done its work.
  if (w == nullptr || victim < step) return;
  int64_t expected = victim;
  __atomic_compare_exchange_n(&w->claim[rank_], &expected, int64_t{-1}, false, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
}

}  // namespace memento::client
