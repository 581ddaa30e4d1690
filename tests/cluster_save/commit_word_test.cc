// The client's cluster-mode slot rule (docs/cluster.md, save path 5) against
// a real agent in a thread and a real commit word in shared memory. The test
// plays the cluster agent's part on the word (committed / hold), so that the
// rule is checked step by step without a cluster.
#include "shm/commit_word.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "../shm/agent_fixture.h"
#include "client/hold_words.h"
#include "common/check.h"
#include "memento/client.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"

namespace memento {
namespace {

using testing::AgentThread;
using testing::LocalAgent;
using testing::State;

class CommitWordTest : public ::testing::Test {
 protected:
  CommitWordTest() : root_(dir_.path() + "/jobc/node0") {}
  ClientOptions Options(int rank = 0) {
    ClientOptions o;
    o.job_id = "jobc";
    o.rank = rank;
    o.world_size = 2;
    o.agent_dir = root_;
    o.copy_threads = 1;
    o.chunk_bytes = 256 << 10;
    o.connect_timeout_s = 2;
    return o;
  }
  // Creates the commit word as an agent in cluster mode does.
  shm::CommitWord* MakeWord(int64_t committed) {
    auto seg = shm::Segment::CreateOrGrow(shm::CommitWordPath(root_), sizeof(shm::CommitWord));
    MEMENTO_CHECK_OK(seg.status());
    word_seg_ = std::move(*seg);
    auto* w = reinterpret_cast<shm::CommitWord*>(word_seg_->data());
    shm::InitCommitWord(w, committed);
    return w;
  }
  std::vector<int64_t> Held(Client& c) {
    auto v = c.ListVersions();
    MEMENTO_CHECK_OK(v.status());
    std::vector<int64_t> steps;
    for (const auto& x : *v) steps.push_back(x.step);
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  shm::testing::ShmScratchDir dir_;
  std::string root_;
  std::unique_ptr<shm::Segment> word_seg_;
};

TEST_F(CommitWordTest, NeverOverwritesTheCommittedVersionAndSkipsHeldOnes) {
  AgentThread agent(LocalAgent("jobc", root_));
  State s(20000);
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  s.Fill(1);
  ASSERT_TRUE((*c)->Snapshot(1).ok());
  ASSERT_TRUE((*c)->Fence().ok());

  // Cluster mode from here on: step 1 is committed everywhere.
  shm::CommitWord* w = MakeWord(/*committed=*/1);
  s.Fill(2);
  ASSERT_TRUE((*c)->Snapshot(2).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{1, 2}));
  // Single-node rule would overwrite step 1 (not the newest); the commit
  // word says 1 is the committed one, and 2 is not held: 3 replaces 2.
  s.Fill(3);
  ASSERT_TRUE((*c)->Snapshot(3).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_FALSE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), 2) << "the client claims the step it overwrites";

  // The agent protects step 3: step 4 is skipped, nothing is written.
  shm::StoreWord(&w->hold, 3);
  s.Fill(4);
  ASSERT_TRUE((*c)->Snapshot(4).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  SnapshotStats st = (*c)->LastSnapshotStats();
  EXPECT_TRUE(st.skipped);
  EXPECT_EQ(st.step, 4);
  EXPECT_EQ(st.skipped_total, 1u);
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), -1) << "a skipped snapshot withdraws its claim";
  s.Fill(5);
  ASSERT_TRUE((*c)->Snapshot(5).ok());
  EXPECT_TRUE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ((*c)->LastSnapshotStats().skipped_total, 2u);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{1, 3}));

  // Step 3 commits (hold released): the next snapshot replaces step 1.
  shm::StoreWord(&w->committed, 3);
  shm::StoreWord(&w->hold, -1);
  s.Fill(6);
  ASSERT_TRUE((*c)->Snapshot(6).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  st = (*c)->LastSnapshotStats();
  EXPECT_FALSE(st.skipped);
  EXPECT_EQ(st.skipped_total, 2u);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{3, 6}));

  // Exactly the committed version's bytes are still there.
  s.Fill(3);
  uint64_t want = s.Digest();
  s.Fill(99);
  ASSERT_EQ(*(*c)->Restore(3), 3);
  EXPECT_EQ(s.Digest(), want);
}

// A recovery took the job back to step 1 while this rank's other slot held
// step 2 of the abandoned attempt. The new attempt's step 2 overwrites that
// slot; the claim it made (of the old step 2) must not be left behind, or the
// agent reads it as "rank 0 is overwriting its slot of step 2" and abandons
// the new attempt's step 2, with a skip record every node honours (issue 21:
// paced trainers then waited their 30 s limit after a recovery).
TEST_F(CommitWordTest, ASnapshotOverTheRolledBackAttemptsSameStepLeavesNoClaimOfIt) {
  AgentThread agent(LocalAgent("jobc", root_));
  State s(20000);
  shm::CommitWord* w = MakeWord(/*committed=*/-1);
  {
    // The failed attempt: step 1 committed, step 2 written, then the rank died.
    auto c = Client::Connect(Options());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE(s.Register(**c).ok());
    ASSERT_TRUE((*c)->Seal().ok());
    s.Fill(1);
    ASSERT_TRUE((*c)->Snapshot(1).ok());
    ASSERT_TRUE((*c)->Fence().ok());
    shm::StoreWord(&w->committed, 1);
    s.Fill(2);
    ASSERT_TRUE((*c)->Snapshot(2).ok());
    ASSERT_TRUE((*c)->Fence().ok());
    EXPECT_EQ(Held(**c), (std::vector<int64_t>{1, 2}));
  }
  // The recovery (the agent forgets claims of later steps, as
  // CommitHold::ForgetClaimsAbove does), then the new attempt restores step 1.
  shm::StoreWord(&w->claim[0], -1);
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  s.Fill(99);
  ASSERT_EQ(*(*c)->Restore(1), 1);
  // The new attempt's step 2 replaces the old one in the same slot.
  s.Fill(22);
  const uint64_t want = s.Digest();
  ASSERT_TRUE((*c)->Snapshot(2).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_FALSE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{1, 2}));
  EXPECT_NE(shm::LoadWord(&w->claim[0]), 2)
      << "a claim of the abandoned attempt's step 2 reads as a claim of the new step 2";
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), -1);
  // A claim of an older step still stays after the write (the usual rule):
  // step 3 overwrites step 1 once step 2 commits.
  shm::StoreWord(&w->committed, 2);
  s.Fill(3);
  ASSERT_TRUE((*c)->Snapshot(3).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), 1) << "the client claims the step it overwrites";
  // The new step 2's bytes are what the slot holds.
  s.Fill(0);
  ASSERT_EQ(*(*c)->Restore(2), 2);
  EXPECT_EQ(s.Digest(), want);
}

TEST_F(CommitWordTest, WithoutTheWordTheSingleNodeRuleHolds) {
  {
    // A word left by an earlier cluster-mode agent is removed by a
    // single-node agent.
    ASSERT_TRUE(shm::MakePrivateDir(root_).ok());
    MakeWord(5);
    word_seg_.reset();
  }
  AgentThread agent(LocalAgent("jobc", root_));
  State s(20000);
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  for (int step = 1; step <= 3; ++step) {
    s.Fill(step);
    ASSERT_TRUE((*c)->Snapshot(step).ok());
    ASSERT_TRUE((*c)->Fence().ok());
    EXPECT_FALSE((*c)->LastSnapshotStats().skipped);
  }
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{2, 3}));
  // Restore() is today's: the newest intact version.
  EXPECT_EQ(*(*c)->Restore(), 3);
}

// The durable hold (docs/durable_tier.md, "The durable hold"), cluster mode:
// the committed version's slot is the target once a newer step commits, but
// while the durable stream holds it the snapshot is skipped (and the claim
// withdrawn), until the hold is released or its deadline passes.
TEST_F(CommitWordTest, DurableHoldSkipsUntilReleasedOrExpired) {
  AgentThread agent(LocalAgent("jobc", root_));
  State s(20000);
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  shm::CommitWord* w = MakeWord(/*committed=*/-1);
  for (int step = 1; step <= 2; ++step) {
    s.Fill(step);
    ASSERT_TRUE((*c)->Snapshot(step).ok());
    ASSERT_TRUE((*c)->Fence().ok());
  }
  shm::StoreWord(&w->committed, 2);
  // Step 1 is being persisted: 3 would overwrite it (not the committed one).
  shm::StoreDurableHold(w, 1, shm::MonotonicNanos() + 3600 * 1000000000LL);
  s.Fill(3);
  ASSERT_TRUE((*c)->Snapshot(3).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_TRUE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), -1) << "a skipped snapshot withdraws its claim";
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{1, 2}));
  // Released: 4 overwrites step 1 and leaves its claim.
  shm::StoreDurableHold(w, -1, 0);
  s.Fill(4);
  ASSERT_TRUE((*c)->Snapshot(4).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_FALSE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), 1);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{2, 4}));
  // A hold whose deadline has passed binds nobody.
  shm::StoreWord(&w->committed, 4);
  shm::StoreDurableHold(w, 2, shm::MonotonicNanos() - 1);
  s.Fill(5);
  ASSERT_TRUE((*c)->Snapshot(5).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_FALSE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{4, 5}));
}

// Single-node mode (no commit word): the agent's durable.word holds a slot;
// the single-node rule (overwrite the older slot) skips while it is held.
TEST_F(CommitWordTest, DurableWordHoldsInSingleNodeMode) {
  AgentThread agent(LocalAgent("jobc", root_));
  State s(20000);
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  auto seg = shm::Segment::CreateOrGrow(shm::DurableWordPath(root_), sizeof(shm::CommitWord));
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto* w = reinterpret_cast<shm::CommitWord*>((*seg)->data());
  shm::InitCommitWord(w, -1);
  for (int step = 1; step <= 2; ++step) {
    s.Fill(step);
    ASSERT_TRUE((*c)->Snapshot(step).ok());
    ASSERT_TRUE((*c)->Fence().ok());
  }
  shm::StoreDurableHold(w, 1, shm::MonotonicNanos() + 3600 * 1000000000LL);
  s.Fill(3);
  ASSERT_TRUE((*c)->Snapshot(3).ok());
  EXPECT_TRUE((*c)->LastSnapshotStats().skipped);
  // Holding the newest version changes nothing: it is not the target.
  shm::StoreDurableHold(w, 2, shm::MonotonicNanos() + 3600 * 1000000000LL);
  s.Fill(4);
  ASSERT_TRUE((*c)->Snapshot(4).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  EXPECT_FALSE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(Held(**c), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(shm::LoadWord(&w->claim[0]), 1) << "the client claims the step it overwrites";
  EXPECT_EQ((*c)->LastSnapshotStats().skipped_total, 1u);
}

// Client::WaitForCommit (memento-trainer --memento-pace-commits) against the
// word the test plays: every answer follows from what the word says, none
// from how long anything took (the short deadlines end waits for something
// that never happens).
TEST_F(CommitWordTest, WaitForCommitAnswersFromTheWord) {
  AgentThread agent(LocalAgent("jobc", root_));
  State s(20000);
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->WaitForCommit(1).status().code(), StatusCode::kFailedPrecondition)
      << "before Seal()";
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  s.Fill(1);
  ASSERT_TRUE((*c)->Snapshot(1).ok());
  auto r = (*c)->WaitForCommit(1);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << "no commit word: single-node";
  EXPECT_NE(r.status().message().find("not in cluster mode"), std::string::npos) << r.status();

  shm::CommitWord* w = MakeWord(/*committed=*/-1);
  r = (*c)->WaitForCommit(1, Deadline::AfterSeconds(0.05));
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("has not held it"), std::string::npos) << r.status();
  shm::StoreWord(&w->hold, 1);
  r = (*c)->WaitForCommit(1, Deadline::AfterSeconds(0.05));
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("the agent holds it"), std::string::npos) << r.status();

  // The agent's part from another thread, in its order (committed, then the
  // hold released), while the client waits or before it starts: one answer.
  std::thread commit([w] {
    shm::StoreWord(&w->committed, 1);
    shm::StoreWord(&w->hold, -1);
  });
  r = (*c)->WaitForCommit(1, Deadline::AfterSeconds(60));
  commit.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);

  // A newer committed step answers for an older one.
  s.Fill(2);
  ASSERT_TRUE((*c)->Snapshot(2).ok());
  shm::StoreWord(&w->committed, 2);
  r = (*c)->WaitForCommit(1, Deadline::AfterSeconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 2);

  // This rank skipped step 4 (the agent holds 3, in the slot 4 would take):
  // it cannot commit, and the answer comes at once, not at the deadline.
  s.Fill(3);
  ASSERT_TRUE((*c)->Snapshot(3).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  shm::StoreWord(&w->hold, 3);
  s.Fill(4);
  ASSERT_TRUE((*c)->Snapshot(4).ok());
  r = (*c)->WaitForCommit(4, Deadline::AfterSeconds(60));
  EXPECT_TRUE((*c)->LastSnapshotStats().skipped);
  EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("skipped its snapshot"), std::string::npos) << r.status();
}

// HoldWords::PollCommit, the poll under WaitForCommit, one call at a time: a
// hold seen and then released with `committed` below the step is a release
// without a commit (kReleased); the agent stores `committed` before it
// releases a committed step's hold, so that order reads kCommitted.
TEST_F(CommitWordTest, PollCommitTellsAReleaseFromACommit) {
  ASSERT_TRUE(shm::MakePrivateDir(root_).ok());
  shm::CommitWord* w = MakeWord(/*committed=*/1);
  client::HoldWords words(root_, /*rank=*/0);
  ASSERT_TRUE(words.MapCommitWord());
  using CS = client::HoldWords::CommitState;
  bool held = false;
  EXPECT_EQ(words.PollCommit(2, &held), CS::kPending);
  EXPECT_FALSE(held);
  EXPECT_EQ(words.PollCommit(1, &held), CS::kCommitted);
  shm::StoreWord(&w->hold, 2);
  EXPECT_EQ(words.PollCommit(2, &held), CS::kPending);
  EXPECT_TRUE(held);
  shm::StoreWord(&w->hold, -1);  // released, committed still 1
  EXPECT_EQ(words.PollCommit(2, &held), CS::kReleased);
  // The agent moved on to hold 3 without committing 2: also a release.
  held = false;
  shm::StoreWord(&w->hold, 2);
  EXPECT_EQ(words.PollCommit(2, &held), CS::kPending);
  shm::StoreWord(&w->hold, 3);
  EXPECT_EQ(words.PollCommit(2, &held), CS::kReleased);
  // Committed, then released: a commit, for 3 and for the older 2.
  held = false;
  EXPECT_EQ(words.PollCommit(3, &held), CS::kPending);
  EXPECT_TRUE(held);
  shm::StoreWord(&w->committed, 3);
  shm::StoreWord(&w->hold, -1);
  EXPECT_EQ(words.PollCommit(3, &held), CS::kCommitted);
  bool other = false;
  EXPECT_EQ(words.PollCommit(2, &other), CS::kCommitted);
  EXPECT_EQ(words.Committed(), 3);
}

}  // namespace
}  // namespace memento
