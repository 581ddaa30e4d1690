#include "agent/job_member.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "agent/assemble.h"
#include "agent/thread_cpu.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/tensor_json.h"
#include "common/thread_cpu.h"
#include "coord/keys.h"
#include "fmt/format.h"
#include "model/auto_plan.h"
#include "recover/recipe.h"
#include "recover/recover.h"
#include "shm/slot.h"
#include "topo/plan_json.h"
#include "topo/topology_json.h"

namespace memento::agent {

// JobMember in five files: this one (start, the trainers' events, the member
// thread and its setup), job_member_save.cc (the save path of one version),
// job_member_commits.cc (commits, skips, rollbacks, a restarted store),
// job_member_peer.cc (the peer service, preallocated slots, assemble) and
// job_member_aor.cc (AOR replicas and the node's memory budget).

Result<std::unique_ptr<JobMember>> JobMember::Start(const JobMemberOptions& options,
                                                    const std::string& job, int node,
                                                    const std::string& root, shm::NodeStore* store,
                                                    DurableStreamer* durable) {
  std::unique_ptr<JobMember> c(new JobMember());
  c->durable_ = durable;
  c->options_ = options;
  c->job_ = job;
  c->node_ = node;
  c->node_name_ = coord::NodeName(node);
  c->root_ = root;
  c->node_store_ = store;
  if (!(options.hold_timeout_s > 0)) return InvalidArgumentError("hold timeout must be > 0");
  MEMENTO_ASSIGN_OR_RETURN(c->log_, coord::CommitLog::Open(root + "/commit.log"));
  int64_t committed = -1;
  if (auto latest = c->log_->latest()) {
    committed = latest->step;
    c->epoch_.store(latest->epoch);
    c->commit_epoch_ = latest->epoch;
  }
  c->committed_.store(committed);

  // The commit word: trainers switch to the cluster rule when it exists.
  MEMENTO_ASSIGN_OR_RETURN(c->hold_, CommitHold::Create(root, committed));

  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Load(options.token_file));
  c->token_ = std::make_unique<net::JobToken>(std::move(token));
  MEMENTO_ASSIGN_OR_RETURN(c->store_,
                           coord::OpenStore(options.store_url, options.token_file,
                                            Deadline::AfterSeconds(options.store_timeout_s)));
  MEMENTO_ASSIGN_OR_RETURN(c->red_, RedundancyStore::Open(root, node));
  c->red_->SetResidentT0(options.t1_resident);
  if (store != nullptr && store->options().budget_bytes > 0) {
    // The node's budget covers its slots, its redundancy and the AOR
    // replicas: a version that does not fit is refused (its step is
    // abandoned, unprotected; the launcher reports it, docs/launch.md
    // "Unprotected steps").
    JobMember* jm = c.get();
    c->red_->SetRoomCheck(
        [jm](uint64_t more, const std::string& why) { return jm->CheckNodeRoom(more, why); });
  }
  // Before the join: a launcher (or the agents' leader) starts a recovery
  // as soon as this node's endpoint is in the membership.
  if (options.preallocate_slots && store != nullptr) c->PreallocateSlots();
  MEMENTO_RETURN_IF_ERROR(c->StartPeerService());

  coord::MembershipOptions mo;
  mo.job = job;
  mo.node = c->node_name_;
  mo.endpoint = c->endpoint_;
  mo.ttl_s = options.lease_ttl_s;
  JobMember* rejoining = c.get();  // the membership stops before *c is destroyed
  mo.on_reregister = [rejoining] { return rejoining->OnReregister(); };
  MEMENTO_ASSIGN_OR_RETURN(
      c->membership_, coord::Membership::Join(c->store_.get(), mo,
                                              Deadline::AfterSeconds(options.store_timeout_s)));
  if (committed >= 0) {
    // A restarted store learns the last commit from any agent that saw it.
    coord::RepublishCommits(*c->store_, job, *c->log_, Deadline::AfterSeconds(kStoreCallS))
        .IgnoreError();
  }
  JobMember* self = c.get();
  MEMENTO_ASSIGN_OR_RETURN(c->follower_, coord::CommitFollower::Start(
                                             c->store_.get(), job, c->log_.get(),
                                             [self](const coord::CommitId& id) {
                                               const double cpu0 = ThreadCpuSeconds();
                                               self->OnCommit(id);
                                               const double cpu = ThreadCpuSeconds() - cpu0;
                                               MutexLock l(&self->mu_);
                                               self->stats_.commit_cpu_s += cpu;
                                             },
                                             Deadline::AfterSeconds(options.store_timeout_s)));

  c->skip_watcher_ = std::make_unique<coord::Watcher>(
      c->store_.get(), coord::JobKeys(job).SkippedPrefix(), 0,
      [self, keys = coord::JobKeys(job)](const coord::WatchEvent& ev) {
        if (ev.type != coord::WatchEvent::Type::kPut) return;
        // .../skipped/<20-digit step>/<node>[@<epoch>]
        auto k = coord::ParseSkippedKey(keys, ev.kv.key);
        if (!k.ok() || k->step <= self->committed_.load()) return;
        // A record of an abandoned history (an older commit epoch than the
        // one this node reports in) never counts: the same step number is
        // computed again in this one.
        if (k->epoch < self->epoch_.load()) return;
        {
          MutexLock l(&self->mu_);
          // A record of the failed attempt whose event comes after the
          // rollback (SetRestoreTarget) must not count again; one of the
          // rollback's epoch or a newer one is the new history's.
          const bool new_history = self->rollback_epoch_ > 0 && k->epoch >= self->rollback_epoch_;
          if (!new_history && k->step > self->rollback_ &&
              ev.kv.mod_revision <= self->rollback_revision_) {
            return;
          }
          self->dead_.insert(k->step);
        }
        self->cv_.SignalAll();
      });

  if (c->durable_ != nullptr) {
    // The durable epoch: watched first, then read, so no bump is missed.
    const std::string epoch_key = coord::JobKeys(job).Epoch();
    auto set_epoch = [self](const std::string& text) {
      char* end = nullptr;
      const unsigned long long e = std::strtoull(text.c_str(), &end, 10);
      if (end == text.c_str() || *end != '\0') {
        MEMENTO_LOG_WARN("durable: ignoring epoch '{}' (not a number)", text.substr(0, 40));
        return;
      }
      self->durable_->SetEpoch(static_cast<uint64_t>(e));
    };
    c->epoch_watcher_ = std::make_unique<coord::Watcher>(
        c->store_.get(), epoch_key, 0, [set_epoch, epoch_key](const coord::WatchEvent& ev) {
          if (ev.type == coord::WatchEvent::Type::kPut && ev.kv.key == epoch_key) {
            set_epoch(ev.kv.value);
          }
        });
    auto kv = c->store_->Get(epoch_key, Deadline::AfterSeconds(kStoreCallS));
    if (kv.ok()) set_epoch(kv->value);
  }

  // Ranks whose slots this node already holds (an agent restarted on its
  // root): their inventories come from the adopted slots' manifests.
  for (int rank : store->Ranks()) {
    for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
      auto seg = store->SlotSegment(rank, slot);
      if (seg == nullptr) continue;
      auto info = shm::ReadSlot(*seg);
      if (!info.ok() || info->state != shm::SlotState::kComplete) continue;
      // A slot of pieces (sharded snapshots) names only the tensors it holds
      // ranges of, not the rank's inventory: published as one, it would keep
      // every agent from planning (replicated state differing across DP
      // ranks) until the rank sealed again, and this node's peers could not
      // read its pieces for a restore meanwhile. The store keeps the
      // inventory the rank's seal published; its next seal republishes it.
      if (shm::HasRangeEntries(info->tensors)) continue;
      std::vector<TensorMeta> metas;
      for (const auto& t : info->tensors) metas.push_back(t.meta);
      MutexLock l(&c->mu_);
      c->manifests_[rank] = TensorListToJson(metas).dump();
    }
  }
  c->thread_ = std::thread([self] {
    NameThisThread("member");  // T1 production, docs/cluster.md
    self->Run();
  });
  MEMENTO_LOG_INFO("cluster mode: node {} ({}) joined job {} at {}, peer service {}, committed {}",
                   node, c->node_name_, job, options.store_url, c->endpoint_, committed);
  return c;
}

JobMember::~JobMember() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  {
    // The save path's network figures, for the log (docs/reft.md section 5).
    const AorHolder::Stats holder = aor_ != nullptr ? aor_->stats() : AorHolder::Stats{};
    MutexLock l(&mu_);
    MutexLock a(&aor_mu_);
    MEMENTO_LOG_INFO(
        "save path totals: {} versions produced, {} bytes of copies pushed; aor: {} copies made "
        "from host replicas, {} pushes ({} bytes) not made, {} replica steps confirmed, {} "
        "refused, {} steps abandoned missing an aor copy, {} copies not made from a replica "
        "changed in memory; {} captures queued, {} replica steps computed in the aor thread, {} "
        "stage slots not used",
        stats_.produced, stats_.pushed_bytes, aor_stats_.entries_from_replica,
        aor_stats_.skipped_pushes, aor_stats_.skipped_push_bytes, aor_stats_.confirmed,
        aor_stats_.refused, aor_stats_.missing, aor_stats_.copy_refused, holder.submitted,
        holder.advanced, holder.stage_refused);
  }
  follower_.reset();
  skip_watcher_.reset();
  epoch_watcher_.reset();
  membership_.reset();  // the lease expires on its own, like a crash
  StopPeerService();
  producer_.reset();
}

void JobMember::OnSeal(int rank, const std::string& manifest) {
  std::optional<std::vector<TensorMeta>> sealed = SealedTensors(rank, manifest);
  if (!sealed) return;
  std::vector<TensorMeta> metas = std::move(*sealed);
  // A new client: its slots hold parity entries only once it asks the plan.
  red_->SetClientParity(rank, -1, 0);
  bool was_unhealthy = false;
  {
    MutexLock l(&mu_);
    std::string text = TensorListToJson(metas).dump();
    auto it = manifests_.find(rank);
    if (it == manifests_.end() || it->second != text) {
      manifests_[rank] = std::move(text);
      published_.erase(rank);
    }
    was_unhealthy = unhealthy_;
    unhealthy_ = false;
  }
  cv_.SignalAll();
  if (was_unhealthy) {
    membership_
        ->SetSignal(coord::NodeSignal::kHealthy, committed_.load(),
                    fmt::format("rank {} sealed", rank), Deadline::AfterSeconds(kStoreCallS))
        .IgnoreError();
  }
}

void JobMember::OnComplete(int rank, int slot, int64_t step) {
  (void)slot;  // the member thread finds the slot by its header
  {
    MutexLock l(&mu_);
    if (step <= committed_.load()) return;
    completes_[step].insert(rank);
  }
  cv_.SignalAll();
}

void JobMember::OnTrainerGone(int rank) {
  // Versions made so far keep their references; later ones keep the rank's
  // parities in T1 until its next client asks the plan.
  red_->SetClientParity(rank, -1, 0);
  {
    MutexLock l(&mu_);
    unhealthy_ = true;
  }
  Status st = membership_->SetSignal(coord::NodeSignal::kUnhealthy, committed_.load(),
                                     fmt::format("rank {} disconnected", rank),
                                     Deadline::AfterSeconds(kStoreCallS));
  if (!st.ok()) MEMENTO_LOG_WARN("could not signal UNHEALTHY: {}", st.ToString());
}

JobMemberStats JobMember::stats() {
  JobMemberStats s;
  {
    MutexLock l(&mu_);
    s = stats_;
  }
  s.committed = committed_.load();
  s.last_reported = last_reported_.load();
  s.restore_target = RestoreTarget();
  s.redundancy_bytes = red_->bytes_in_use();
  if (peer_ != nullptr) s.peer = peer_->stats();
  return s;
}

int64_t JobMember::SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Now().time_since_epoch()).count();
}

// ---- the member thread ----------------------------------------------------------

void JobMember::Run() {
  TimePoint last_progress = Now();
  for (;;) {
    {
      MutexLock l(&mu_);
      if (stop_) return;
      cv_.WaitUntil(&l, Now() + std::chrono::milliseconds(50));
      if (stop_) return;
    }
    {
      // SetRestoreTarget: steps after the restored one are computed again.
      int64_t rollback = -1;
      {
        MutexLock l(&mu_);
        if (rollback_pending_) rollback = rollback_;
        rollback_pending_ = false;
      }
      if (rollback >= 0) {
        last_attempt_ = std::min(last_attempt_, rollback);
        if (reported_ > rollback) reported_ = -1;
      }
    }
    PublishInventories();
    if (!ready_.load()) {
      TrySetup();
      if (!ready_.load() && Now() - last_progress > std::chrono::seconds(5)) {
        last_progress = Now();
        MEMENTO_LOG_INFO("cluster mode: still waiting for the topology and every rank's inventory");
      }
      continue;
    }
    // A reported step that some node skipped can never commit: release it at
    // once, so that every node writes the next step. One that does not commit
    // in time is released too (another node must have abandoned it).
    if (reported_ >= 0 && reported_ > committed_.load() && Dead(reported_)) {
      hold_->Release(reported_);
      MEMENTO_LOG_INFO("step {} was skipped by another node; its hold is released", reported_);
      reported_ = -1;
    }
    if (reported_ >= 0 && reported_ > committed_.load() &&
        Now() - reported_at_ > std::chrono::duration_cast<Duration>(
                                   std::chrono::duration<double>(options_.hold_timeout_s))) {
      if (hold_->held() == reported_) {
        hold_->Release(reported_);
        MEMENTO_LOG_INFO("step {} did not commit within {} s; its hold is released", reported_,
                         options_.hold_timeout_s);
      }
      reported_ = -1;
    }
    // A reported step keeps its hold until it commits, is skipped by some
    // node or times out: producing a newer step now would move the hold, and
    // the trainers could overwrite this node's T0 of a step whose report
    // stands and that may still commit (the commit word lags under load).
    // Chaos seed 0x3bb4a570: step 1 committed without node 2's T0, and two
    // node losses under rs:2 could not rebuild it.
    if (reported_ >= 0 && reported_ > committed_.load()) continue;
    // The newest step every local rank completed (older ones are superseded).
    int64_t step = -1;
    std::vector<int64_t> superseded;
    {
      MutexLock l(&mu_);
      for (auto it = completes_.rbegin(); it != completes_.rend(); ++it) {
        bool all = std::all_of(local_ranks_.begin(), local_ranks_.end(),
                               [&](int r) { return it->second.count(r) > 0; });
        if (all && it->first > last_attempt_) {
          step = it->first;
          break;
        }
      }
      if (step >= 0) {
        for (auto it = completes_.begin(); it != completes_.end() && it->first < step; ++it) {
          if (it->first > last_attempt_) superseded.push_back(it->first);
        }
        completes_.erase(completes_.begin(), completes_.find(step));
      }
    }
    // Older steps this node will now never report: no node waits for them.
    for (int64_t s : superseded) PublishDead(s);
    if (step < 0 || step <= committed_.load()) continue;
    last_attempt_ = step;
    if (Dead(step)) {
      MEMENTO_LOG_DEBUG("step {} was skipped by another node; no redundancy made", step);
      continue;
    }
    const TimePoint produce_start = Now();
    const double cpu0 = ThreadCpuSeconds();
    const bool produced = Produce(step);
    {
      MutexLock l(&mu_);
      stats_.produce_cpu_s += ThreadCpuSeconds() - cpu0;
    }
    if (produced) {
      const double process_cpu = ProcessCpuSeconds();
      bool first = false;
      {
        MutexLock l(&mu_);
        stats_.produce_s += std::chrono::duration<double>(Now() - produce_start).count();
        if (stats_.produced == 1) {
          first_report_process_cpu_s_ = process_cpu;
          first = true;
        } else {
          stats_.steady_process_cpu_s = process_cpu - first_report_process_cpu_s_;
          stats_.steady_versions = stats_.produced - 1;
        }
      }
      if (first) {
        // Once per run (a few dozen /proc reads): the start of the steady
        // window of the agent's "cpu by thread" report.
        ThreadCpuReport report = ThreadCpuByName();
        std::map<std::string, double> at_first = std::move(report.by_name);
        at_first["exited-unnamed"] = report.unnamed_exited_s;
        MutexLock l(&mu_);
        stats_.thread_cpu_at_first_report = std::move(at_first);
      }
      reported_ = step;
      reported_at_ = Now();
    }
  }
}

void JobMember::PublishInventories() {
  std::map<int, std::string> todo;
  {
    MutexLock l(&mu_);
    for (const auto& [rank, text] : manifests_) {
      if (published_.count(rank) == 0) todo[rank] = text;
    }
  }
  coord::JobKeys keys(job_);
  for (const auto& [rank, text] : todo) {
    auto r = store_->Set(keys.Inventory(rank), text, Deadline::AfterSeconds(kStoreCallS));
    if (!r.ok()) {
      MEMENTO_LOG_WARN("could not publish the inventory of rank {}: {}", rank,
                       r.status().ToString());
      continue;
    }
    MEMENTO_LOG_INFO("published the inventory of rank {}", rank);
    MutexLock l(&mu_);
    if (manifests_[rank] == text) published_.insert(rank);
  }
}

void JobMember::TrySetup() {
  coord::JobKeys keys(job_);
  auto topo_kv = store_->Get(keys.Topology(), Deadline::AfterSeconds(kStoreCallS));
  if (!topo_kv.ok()) {
    if (topo_kv.status().code() != StatusCode::kNotFound) {
      MEMENTO_LOG_WARN("reading the topology: {}", topo_kv.status().ToString());
    }
    return;
  }
  auto ct = topo::ParseJobTopology(topo_kv->value);
  if (!ct.ok()) {
    MEMENTO_LOG_ERROR("the job's topology is unusable: {}", ct.status().ToString());
    return;
  }
  const int ranks = ct->topology.num_ranks();
  auto listing = store_->List(keys.InventoryPrefix(), Deadline::AfterSeconds(kStoreCallS));
  if (!listing.ok()) return;
  topo::Inventory inventory(ranks);
  int have = 0;
  for (const auto& kv : listing->kvs) {
    std::string tail = kv.key.substr(keys.InventoryPrefix().size());
    char* end = nullptr;
    long r = std::strtol(tail.c_str(), &end, 10);
    if (*end != '\0' || r < 0 || r >= ranks) continue;
    auto metas = ParseTensorList(kv.value);
    if (!metas.ok()) {
      MEMENTO_LOG_ERROR("inventory of rank {}: {}", r, metas.status().ToString());
      return;
    }
    inventory[r] = std::move(*metas);
    ++have;
  }
  if (have < ranks) return;
  // model::MakeJobPlan: policy auto resolved as the launcher resolves it.
  auto plan = model::MakeJobPlan(ct->topology, inventory, ct->policy);
  if (!plan.ok()) {
    MEMENTO_LOG_ERROR("cannot plan the job: {}", plan.status().ToString());
    membership_
        ->SetSignal(coord::NodeSignal::kUnhealthy, committed_.load(),
                    "no plan: " + plan.status().message(), Deadline::AfterSeconds(kStoreCallS))
        .IgnoreError();
    return;
  }
  const uint64_t hash = recover::PlanHash(*plan);
  auto published = store_->Get(keys.PlanHash(), Deadline::AfterSeconds(kStoreCallS));
  if (published.ok() && published->value != std::to_string(hash)) {
    MEMENTO_LOG_ERROR(
        "the plan computed on node {} (hash {}) differs from the launcher's (plan_hash {}): no "
        "redundancy is produced until they agree",
        node_, hash, published->value);
    return;
  }
  if (node_ >= static_cast<int>(plan->nodes.size())) {
    MEMENTO_LOG_ERROR("node {} is not in the job's topology ({} nodes): it holds nothing", node_,
                      plan->nodes.size());
    return;
  }
  Status st = red_->SetPlan(*plan);
  if (!st.ok()) {
    MEMENTO_LOG_ERROR("redundancy store: {}", st.ToString());
    return;
  }
  plan_ = std::move(*plan);
  inventory_ = std::move(inventory);
  local_ranks_.clear();
  for (int r = 0; r < ranks; ++r) {
    if (ct->topology.rank_node[r] == node_) local_ranks_.push_back(r);
  }
  producer_ = std::make_unique<T1Producer>(&plan_, node_, red_.get(), token_.get(),
                                           [this](int n) { return NodeEndpoint(n); });
  {
    MutexLock l(&plan_mu_);
    sharded_ = ct->sharded;
  }
  SetPeerPlan();
  ready_.store(true);
  ForgetAorHeld();
  const topo::NodePlan& np = plan_.nodes[node_];
  MEMENTO_LOG_INFO(
      "cluster plan {} ({}): node {} runs ranks [{}], holds {} copies and {} parities "
      "({} bytes), protection {}",
      hash, topo::PolicyName(plan_.policy), node_, fmt::join(local_ranks_, ", "), np.copies.size(),
      np.parities.size(), np.copy_bytes + np.parity_bytes, plan_.protection);
}

}  // namespace memento::agent
