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

TEST(ClusterRollback, RestoreTargetForgetsTheFailedAttemptsLaterSteps) {
  ASSERT_EQ(setenv("MEMENTO_JOB_TOKEN", kSecret, 1), 0);
  auto token = net::JobToken::FromSecret(kSecret);
  ASSERT_TRUE(token.ok());
  auto server = coord::EmbeddedStoreServer::Start("127.0.0.1", 0, *token);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = "tcp://127.0.0.1:" + std::to_string((*server)->port());
  auto store = coord::OpenStore(url, "", Soon());
  ASSERT_TRUE(store.ok()) << store.status();

  shm::testing::ShmScratchDir dir("memento-rollback");
  const std::string root = dir.path() + "/node0";
  auto node_store = shm::NodeStore::Open({root, kJob, 0, 0});
  ASSERT_TRUE(node_store.ok()) << node_store.status();
  JobMemberOptions options;
  options.store_url = url;
  auto cluster = JobMember::Start(options, kJob, 0, root, node_store->get());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  JobMember& c = **cluster;

  // The failed attempt: node0 skipped steps 9 and 12, node1 skipped 12 too;
  // node0 held step 14 (reported, not committed) when the failure came.
  coord::JobKeys keys(kJob);
  for (const auto& [step, node] :
       {std::pair<int64_t, std::string>{9, "node0"}, {12, "node0"}, {12, "node1"}}) {
    ASSERT_TRUE((*store)->Set(keys.Skipped(step, node), "rank skipped its snapshot", Soon()).ok());
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
  auto listing = (*store)->List(keys.SkippedPrefix(), Soon());
  ASSERT_TRUE(listing.ok()) << listing.status();
  std::set<std::string> left;
  for (const auto& kv : listing->kvs) left.insert(kv.key);
  EXPECT_EQ(left, (std::set<std::string>{keys.Skipped(9, "node0"), keys.Skipped(12, "node1")}));

  // A skip of the new attempt counts again.
  c.OnSkipped(0, 12);
  EXPECT_TRUE(c.Dead(12));
  EXPECT_TRUE((*store)->Get(keys.Skipped(12, "node0"), Soon()).ok());
  cluster->reset();
}

}  // namespace
}  // namespace memento::agent
