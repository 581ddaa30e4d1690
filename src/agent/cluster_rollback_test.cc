// JobMember::SetRestoreTarget (kPeerSetRestoreTarget) against a real agent
// cluster mode in this process: a real embedded store over authenticated TCP,
// a real node store and commit word in shared memory. The job goes back to
// the restored step, so the skips, the hold, the trainers' claims and the
// skip records of later steps belong to the failed attempt and must not keep the new attempt's
// steps from committing (chaos campaign seed 0x5f3f57eb lost 5 steps because
// every step between the restored one and the next failure had a stale skip).
#include <stdlib.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "agent/job_member.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "coord/store.h"
#include "gtest/gtest.h"
#include "net/job_token.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"

namespace memento::agent {
namespace {

constexpr char kJob[] = "rollbackjob";
constexpr char kSecret[] = "cluster-rollback-test-0123456789";

Deadline Soon() { return Deadline::AfterSeconds(10); }

// Waits (bounded) until `pred` holds; the watcher delivers on its own thread.
template <typename Pred>
bool WaitFor(Pred pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Node 0's agent in cluster mode against a real embedded store over
// authenticated TCP; members are destroyed in reverse order (the agent first).
struct OneNodeJob {
  std::unique_ptr<coord::EmbeddedStoreServer> server;
  std::unique_ptr<coord::Store> store;
  std::unique_ptr<shm::testing::ShmScratchDir> dir;
  std::string root;
  std::unique_ptr<shm::NodeStore> node_store;
  std::unique_ptr<JobMember> member;
};

void StartOneNodeJob(const std::string& scratch_prefix, OneNodeJob* job) {
  ASSERT_EQ(setenv("MEMENTO_JOB_TOKEN", kSecret, 1), 0);
  auto token = net::JobToken::FromSecret(kSecret);
  ASSERT_TRUE(token.ok());
  auto server = coord::EmbeddedStoreServer::Start("127.0.0.1", 0, *token);
  ASSERT_TRUE(server.ok()) << server.status();
  job->server = std::move(*server);
  const std::string url = "tcp://127.0.0.1:" + std::to_string(job->server->port());
  auto store = coord::OpenStore(url, "", Soon());
  ASSERT_TRUE(store.ok()) << store.status();
  job->store = std::move(*store);

  job->dir = std::make_unique<shm::testing::ShmScratchDir>(scratch_prefix);
  job->root = job->dir->path() + "/node0";
  auto node_store = shm::NodeStore::Open({job->root, kJob, 0, 0});
  ASSERT_TRUE(node_store.ok()) << node_store.status();
  job->node_store = std::move(*node_store);
  JobMemberOptions options;
  options.store_url = url;
  auto member = JobMember::Start(options, kJob, 0, job->root, job->node_store.get());
  ASSERT_TRUE(member.ok()) << member.status();
  job->member = std::move(*member);
}

TEST(ClusterRollback, RestoreTargetForgetsTheFailedAttemptsLaterSteps) {
  OneNodeJob job;
  ASSERT_NO_FATAL_FAILURE(StartOneNodeJob("memento-rollback", &job));
  coord::Store* store = job.store.get();
  const std::string& root = job.root;
  JobMember& c = *job.member;

  // The failed attempt: node0 skipped steps 9 and 12, node1 skipped 12 too;
  // node0 held step 14 (reported, not committed) when the failure came.
  coord::JobKeys keys(kJob);
  for (const auto& [step, node] :
       {std::pair<int64_t, std::string>{9, "node0"}, {12, "node0"}, {12, "node1"}}) {
    ASSERT_TRUE(store->Set(keys.Skipped(step, node), "rank skipped its snapshot", Soon()).ok());
  }
  ASSERT_TRUE(WaitFor([&] { return c.Dead(9) && c.Dead(12); }))
      << "the skip watcher never delivered the skip records";
  auto word_seg = shm::Segment::Open(shm::CommitWordPath(root), /*writable=*/true);
  ASSERT_TRUE(word_seg.ok()) << word_seg.status();
  auto* word = reinterpret_cast<shm::CommitWord*>((*word_seg)->data());
  shm::StoreWord(&word->hold, 14);
  // Rank 0 overwrote its slot of step 13 to write 15 (a claim stays after the
  // write); rank 1 last overwrote step 8's slot.
  shm::StoreWord(&word->claim[0], 13);
  shm::StoreWord(&word->claim[1], 8);

  // The recovery restores step 10.
  c.SetRestoreTarget(10);
  EXPECT_EQ(c.RestoreTarget(), 10);
  // Step 12 is computed again: no skip of the failed attempt keeps it from
  // committing; step 9 is older than the restored step and stays as it was.
  EXPECT_FALSE(c.Dead(12));
  EXPECT_TRUE(c.Dead(9));
  // The hold of step 14 would make the trainers skip snapshots into its slot.
  EXPECT_EQ(shm::LoadWord(&word->hold), -1);
  // So would the claim of step 13: the new attempt's step 13 would be
  // abandoned as "rank 0 is overwriting its slot of it" (agent_recovery_test
  // saw no step after the restored one commit). The older claim stays.
  EXPECT_EQ(shm::LoadWord(&word->claim[0]), -1);
  EXPECT_EQ(shm::LoadWord(&word->claim[1]), 8);
  // This node's skip record of the later step is gone from the store (an
  // agent restarted later would read it again); the older one and the other
  // node's (deleted by that node's own agent) are left.
  auto listing = store->List(keys.SkippedPrefix(), Soon());
  ASSERT_TRUE(listing.ok()) << listing.status();
  std::set<std::string> left;
  for (const auto& kv : listing->kvs) left.insert(kv.key);
  EXPECT_EQ(left, (std::set<std::string>{keys.Skipped(9, "node0"), keys.Skipped(12, "node1")}));

  // A skip of the new attempt counts again.
  c.OnSkipped(0, 12);
  EXPECT_TRUE(c.Dead(12));
  EXPECT_TRUE(store->Get(keys.Skipped(12, "node0"), Soon()).ok());
  job.member.reset();
}

// Skip records name their commit epoch (coord::JobKeys::Skipped). A record
// of the abandoned history that reaches the store again after the rollback
// (an agent republishes its skips to a store restarted empty, which also
// resets the revision that separated the histories) must not keep the new
// history's step of that number from committing; a record of the new epoch
// written before this node's SetRestoreTarget (another node got there
// first) still counts.
TEST(ClusterRollback, AnOlderEpochsSkipRecordNeverCounts) {
  OneNodeJob job;
  ASSERT_NO_FATAL_FAILURE(StartOneNodeJob("memento-rollback-epoch", &job));
  coord::Store* store = job.store.get();
  JobMember& c = *job.member;
  coord::JobKeys keys(kJob);

  // Epoch 0: node1 skipped step 12, this node step 13.
  ASSERT_TRUE(store->Set(keys.Skipped(12, "node1"), "rank 1 skipped", Soon()).ok());
  c.OnSkipped(0, 13);
  ASSERT_TRUE(WaitFor([&] { return c.Dead(12) && c.Dead(13); }));
  // The recovery restores step 10 in epoch 1.
  c.SetRestoreTarget(10, 1);
  EXPECT_FALSE(c.Dead(12));
  EXPECT_FALSE(c.Dead(13));
  // Its own epoch-0 record of 13 is gone; node1's is node1's to delete.
  EXPECT_FALSE(store->Get(keys.Skipped(13, "node0"), Soon()).ok());
  // node1's epoch-0 record of 12 is put again after the rollback (a newer
  // revision than the rollback's listing). Then, in epoch 1, node1 skips
  // 14: once that event is in, the one before it was seen too.
  ASSERT_TRUE(store->Set(keys.Skipped(12, "node1"), "", Soon()).ok());
  ASSERT_TRUE(store->Set(keys.Skipped(14, "node1", 1), "rank 1 skipped", Soon()).ok());
  ASSERT_TRUE(WaitFor([&] { return c.Dead(14); })) << "the epoch-1 skip never counted";
  EXPECT_FALSE(c.Dead(12)) << "a skip of the abandoned history counted in the new one";
  // This node's skips are published in its epoch.
  c.OnSkipped(0, 15);
  EXPECT_TRUE(store->Get(keys.Skipped(15, "node0", 1), Soon()).ok());
  EXPECT_FALSE(store->Get(keys.Skipped(15, "node0"), Soon()).ok());

  // node2 is already in epoch 2 and skipped 16 before this node is told
  // that the job goes back to 11 in epoch 2: that skip belongs to the new
  // history and still counts; epoch 1's skips (14, 15) do not.
  ASSERT_TRUE(store->Set(keys.Skipped(16, "node2", 2), "rank 2 skipped", Soon()).ok());
  ASSERT_TRUE(WaitFor([&] { return c.Dead(16); }));
  c.SetRestoreTarget(11, 2);
  EXPECT_TRUE(c.Dead(16));
  EXPECT_FALSE(c.Dead(14));
  EXPECT_FALSE(c.Dead(15));
  EXPECT_FALSE(store->Get(keys.Skipped(15, "node0", 1), Soon()).ok());
  EXPECT_TRUE(store->Get(keys.Skipped(16, "node2", 2), Soon()).ok());
  job.member.reset();
}

}  // namespace
}  // namespace memento::agent
