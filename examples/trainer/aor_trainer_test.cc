// AOR (REFT 4.2, Eq. 4) with the reference trainer: under ZeRO-1 each DP
// rank keeps a host replica (opt::AorReplica) of its ring neighbour's
// optimizer shard and brings it forward every step from the gradient and
// parameters it already holds (after the all-reduce, before the update), with
// no bytes exchanged at save time. A rank's optimizer shard is then lost and
// rebuilt from its neighbour's replica, and training continues bit-identical
// to a run without the loss. A host optimizer given another learning rate
// than the trainer's is refused at once and at recovery.
//
// The ranks run as threads of this process (Gloo over TCP, as in
// trainer_unit_test); the replicas are seeded once from the owners' initial
// state (zeros) with the owners' checksums. In the cluster the replicas live
// in the agents and the gradient slice comes through the client
// (docs/reft.md, "AOR": planned); this test pins the arithmetic and the checks.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "opt/adamw.h"
#include "opt/aor.h"
#include "trainer.h"

namespace memento::trainer {
namespace {

TrainerOptions Zero1Options() {
  TrainerOptions o;
  o.model = ModelConfig{61, 16, 32, 4, 2, 4};  // odd vocab: a padded flat buffer
  o.global_batch = 4;
  o.micro_batches = 2;
  o.adam.warmup_steps = 2;
  o.adam.decay_steps = 8;
  o.zero1 = true;
  o.comm.topology.dp = 2;
  o.comm.topology.pp = 2;
  o.comm.timeout_s = 60;
  return o;
}

// The owners' reports: ShardChecksum(params, m, v) of each rank's shard after
// each step (in the cluster: carried by the rank's COMPLETED report).
struct OwnerReports {
  std::mutex mu;
  std::map<std::pair<int, int64_t>, uint64_t> sums;  // (rank, step) -> checksum
  void Put(int rank, int64_t step, uint64_t sum) {
    std::lock_guard<std::mutex> l(mu);
    sums[{rank, step}] = sum;
  }
  uint64_t Get(int rank, int64_t step) {
    std::lock_guard<std::mutex> l(mu);
    return sums.at({rank, step});
  }
};

uint64_t OwnShardChecksum(Trainer* t) {
  const size_t lo = t->optimizer_offset(), n = t->optimizer_numel();
  return opt::ShardChecksum(lo, n, t->params() + lo, {t->adam_m(), t->adam_v()});
}

// Rank `rank` holding the AOR replica of `peer`'s shard. The host optimizer
// is decoded from bytes (as an agent would get it); `holder_adam` is the
// configuration the holder believes the trainer uses.
class AorHooks : public TrainerHooks {
 public:
  AorHooks(Trainer** self, int rank, OwnerReports* reports)
      : self_(self), rank_(rank), reports_(reports) {}

  Status Init(const opt::AdamWConfig& holder_adam, int peer, uint64_t peer_offset, uint64_t count,
              const float* peer_params, const float* peer_m, const float* peer_v) {
    Trainer* t = *self_;
    // The trainer's parameter groups, with the holder's hyperparameters.
    MEMENTO_ASSIGN_OR_RETURN(auto o, opt::AdamW::Create(holder_adam, t->optimizer().groups()));
    MEMENTO_ASSIGN_OR_RETURN(auto decoded, opt::DecodeOptimizer(o->Encode()));
    optimizer_ = std::shared_ptr<const opt::Optimizer>(std::move(decoded));
    peer_ = peer;
    MEMENTO_ASSIGN_OR_RETURN(replica_, opt::AorReplica::Create(optimizer_, peer_offset, count));
    const uint64_t owner = opt::ShardChecksum(peer_offset, count, peer_params, {peer_m, peer_v});
    return replica_->Seed(0, peer_params, {peer_m, peer_v}, owner);
  }

  Status BeforeOptimizerStep(int64_t step) override {
    Trainer* t = *self_;
    if (replica_->diverged()) return Status::Ok();  // caught earlier; kept for the test
    const uint64_t off = replica_->offset();
    return replica_->Advance(step, optimizer_->LearningRate(step), t->grads() + off,
                             t->params() + off);
  }

  Status AfterOptimizerStep(int64_t step) override {
    Trainer* t = *self_;
    reports_->Put(rank_, step, OwnShardChecksum(t));
    if (replica_->diverged()) return Status::Ok();
    // The all-gather brought the peer's updated parameters: the local check.
    Status st = replica_->ConfirmParams(step, t->params() + replica_->offset());
    if (!st.ok() && first_error_.ok()) first_error_ = st;
    return Status::Ok();  // training goes on; the replica is marked diverged
  }

  opt::AorReplica& replica() { return *replica_; }
  int peer() const { return peer_; }
  const Status& first_error() const { return first_error_; }

 private:
  Trainer** self_;
  int rank_;
  OwnerReports* reports_;
  std::shared_ptr<const opt::Optimizer> optimizer_;
  std::unique_ptr<opt::AorReplica> replica_;
  int peer_ = -1;
  Status first_error_;
};

class Job {
 public:
  explicit Job(TrainerOptions o) : o_(std::move(o)), dir_("aor-trainer") {
    o_.comm.rendezvous_dir = dir_.path();
    ranks_ = o_.comm.topology.dp * o_.comm.topology.tp * o_.comm.topology.pp;
    raw_.assign(ranks_, nullptr);
    trainers_.resize(ranks_);
  }

  // Creates every rank (threads: the process groups connect together).
  void Create(std::vector<TrainerHooks*> hooks) {
    RunAll([&](int r) -> Status {
      TrainerOptions ro = o_;
      ro.comm.rank = r;
      MEMENTO_ASSIGN_OR_RETURN(trainers_[r], Trainer::Create(ro, hooks[r]));
      raw_[r] = trainers_[r].get();
      return Status::Ok();
    });
  }

  void Steps(int n) {
    RunAll([&](int r) -> Status {
      for (int i = 0; i < n; ++i) MEMENTO_RETURN_IF_ERROR(trainers_[r]->Step().status());
      return Status::Ok();
    });
  }

  std::vector<uint64_t> Checksums() {
    std::vector<uint64_t> s;
    for (auto& t : trainers_) s.push_back(t->StateChecksum());
    return s;
  }

  int ranks() const { return ranks_; }
  Trainer* trainer(int r) { return trainers_[r].get(); }
  Trainer** slot(int r) { return &raw_[r]; }
  const TrainerOptions& options() const { return o_; }

  // The DP ring neighbour of `rank` in its sharding group (tp = 1).
  int Peer(int rank) const {
    const int dp = o_.comm.topology.dp;
    return rank / dp * dp + (rank % dp + 1) % dp;
  }

 private:
  void RunAll(const std::function<Status(int)>& fn) {
    std::vector<Status> st(ranks_);
    std::vector<std::thread> th;
    for (int r = 0; r < ranks_; ++r) th.emplace_back([&, r] { st[r] = fn(r); });
    for (auto& t : th) t.join();
    for (int r = 0; r < ranks_; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  }

  TrainerOptions o_;
  memento::testing::ScratchDir dir_;
  int ranks_;
  std::vector<Trainer*> raw_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

// Creates the job with AorHooks on every rank, the holders' optimizer built
// from `holder_adam`, each replica seeded from its peer's initial shard.
std::vector<std::unique_ptr<AorHooks>> StartWithAor(Job* job, OwnerReports* reports,
                                                    const opt::AdamWConfig& holder_adam) {
  std::vector<std::unique_ptr<AorHooks>> hooks;
  std::vector<TrainerHooks*> raw;
  for (int r = 0; r < job->ranks(); ++r) {
    hooks.push_back(std::make_unique<AorHooks>(job->slot(r), r, reports));
    raw.push_back(hooks.back().get());
  }
  job->Create(raw);
  for (int r = 0; r < job->ranks(); ++r) {
    Trainer* p = job->trainer(job->Peer(r));
    const uint64_t off = p->optimizer_offset();
    Status st = hooks[r]->Init(holder_adam, job->Peer(r), off, p->optimizer_numel(),
                               p->params() + off, p->adam_m(), p->adam_v());
    EXPECT_TRUE(st.ok()) << "rank " << r << ": " << st;
  }
  return hooks;
}

constexpr int kBefore = 5, kAfter = 4;

TEST(AorTrainerTest, LostShardRebuiltFromTheReplicaTrainsOnBitIdentically) {
  // The reference: no loss.
  Job clean(Zero1Options());
  clean.Create(std::vector<TrainerHooks*>(clean.ranks(), nullptr));
  clean.Steps(kBefore + kAfter);
  const std::vector<uint64_t> want = clean.Checksums();

  Job job(Zero1Options());
  OwnerReports reports;
  auto hooks = StartWithAor(&job, &reports, job.options().adam);
  job.Steps(kBefore);
  for (int r = 0; r < job.ranks(); ++r) {
    ASSERT_TRUE(hooks[r]->first_error().ok()) << "rank " << r << ": " << hooks[r]->first_error();
    ASSERT_EQ(hooks[r]->replica().step(), kBefore);
  }
  // Rank 2 (pp 1, dp 0) loses its optimizer shard; rank 3 (its DP peer on
  // another node) holds the replica of it.
  const int lost = 2, holder = 3;
  ASSERT_EQ(job.Peer(holder), lost);
  Trainer* t = job.trainer(lost);
  const size_t n = t->optimizer_numel();
  std::vector<float> lost_m(t->adam_m(), t->adam_m() + n), lost_v(t->adam_v(), t->adam_v() + n);
  std::memset(t->adam_m(), 0xff, n * sizeof(float));
  std::memset(t->adam_v(), 0xff, n * sizeof(float));
  opt::AorReplica& rep = hooks[holder]->replica();
  Status st = rep.CheckForRestore(kBefore, reports.Get(lost, kBefore));
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(rep.count(), n);
  std::memcpy(t->adam_m(), rep.state(0), n * sizeof(float));
  std::memcpy(t->adam_v(), rep.state(1), n * sizeof(float));
  EXPECT_EQ(0, std::memcmp(t->adam_m(), lost_m.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(t->adam_v(), lost_v.data(), n * sizeof(float)));
  // Training continues; the replicas keep up.
  job.Steps(kAfter);
  EXPECT_EQ(job.Checksums(), want);
  for (int r = 0; r < job.ranks(); ++r) {
    EXPECT_TRUE(hooks[r]->first_error().ok()) << "rank " << r << ": " << hooks[r]->first_error();
    EXPECT_TRUE(hooks[r]
                    ->replica()
                    .CheckForRestore(kBefore + kAfter, reports.Get(job.Peer(r), kBefore + kAfter))
                    .ok());
  }
}

// The trainer's schedule (peak learning rate) differs from the one the host
// optimizer was given: every replica is caught at step 1 by the local check,
// and the recovery check refuses it (no different bytes are restored).
TEST(AorTrainerTest, AScheduleTheHostWasNotGivenIsCaught) {
  Job job(Zero1Options());
  OwnerReports reports;
  opt::AdamWConfig holder_adam = job.options().adam;
  holder_adam.lr *= 2.0f;
  auto hooks = StartWithAor(&job, &reports, holder_adam);
  job.Steps(2);
  for (int r = 0; r < job.ranks(); ++r) {
    const Status& st = hooks[r]->first_error();
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << "rank " << r << ": " << st;
    EXPECT_NE(st.message().find("step 1"), std::string::npos) << st;
    EXPECT_TRUE(hooks[r]->replica().diverged());
    EXPECT_EQ(hooks[r]->replica().CheckForRestore(1, reports.Get(job.Peer(r), 1)).code(),
              StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace memento::trainer
