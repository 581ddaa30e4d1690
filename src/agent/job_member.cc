#include "agent/job_member.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>

#include "agent/assemble.h"
#include "agent/thread_cpu.h"
#include "codec/erasure_code.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/human.h"
#include "common/log.h"
#include "common/tensor_json.h"
#include "coord/keys.h"
#include "fmt/format.h"
#include "model/auto_plan.h"
#include "net/peer_protocol.h"
#include "recover/recipe.h"
#include "recover/recover.h"
#include "shm/slot.h"
#include "topo/plan_json.h"
#include "topo/topology_json.h"

namespace memento::agent {

using nlohmann::json;

namespace {

constexpr double kStoreCallS = 10.0;

}  // namespace

// ---------------------------------------------------------------------------

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
      c->store_.get(), coord::JobKeys(job).SkippedPrefix(), 0, [self](const coord::WatchEvent& ev) {
        if (ev.type != coord::WatchEvent::Type::kPut) return;
        // .../skipped/<20-digit step>/<node>
        std::string tail = ev.kv.key.substr(coord::JobKeys(self->job_).prefix().size() + 8);
        auto step = coord::ParseStep(tail.substr(0, tail.find('/')));
        if (!step.ok() || *step <= self->committed_.load()) return;
        {
          MutexLock l(&self->mu_);
          // A record of the failed attempt whose event comes after the
          // rollback (SetRestoreTarget) must not count again.
          if (*step > self->rollback_ && ev.kv.mod_revision <= self->rollback_revision_) return;
          self->dead_.insert(*step);
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
  c->thread_ = std::thread([self] { self->Run(); });
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
        "refused; {} captures queued, {} replica steps computed in the aor thread, {} stage "
        "slots not used",
        stats_.produced, stats_.pushed_bytes, aor_stats_.entries_from_replica,
        aor_stats_.skipped_pushes, aor_stats_.skipped_push_bytes, aor_stats_.confirmed,
        aor_stats_.refused, holder.submitted, holder.advanced, holder.stage_refused);
  }
  follower_.reset();
  skip_watcher_.reset();
  epoch_watcher_.reset();
  membership_.reset();  // the lease expires on its own, like a crash
  StopPeerService();
  producer_.reset();
}

void JobMember::OnSeal(int rank, const std::string& manifest) {
  auto tensors = shm::ParseManifest(manifest);
  if (!tensors.ok()) {
    MEMENTO_LOG_ERROR("rank {} sealed with an unreadable manifest: {}", rank,
                      tensors.status().ToString());
    return;
  }
  std::vector<TensorMeta> metas;
  for (const auto& t : *tensors) metas.push_back(t.meta);
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

std::string JobMember::SkippedKey(int64_t step, const std::string& node) const {
  return coord::JobKeys(job_).Skipped(step, node);
}

void JobMember::OnSkipped(int rank, int64_t step) {
  PublishDead(step, fmt::format("rank {} skipped its snapshot", rank));
}

void JobMember::PublishDead(int64_t step, const std::string& why) {
  if (step <= committed_.load()) return;
  {
    MutexLock l(&mu_);
    if (!dead_.insert(step).second) return;  // told already
  }
  cv_.SignalAll();
  auto r = store_->Set(SkippedKey(step, node_name_), why, Deadline::AfterSeconds(2));
  if (!r.ok())
    MEMENTO_LOG_WARN("could not publish the skip of step {}: {}", step, r.status().ToString());
}

bool JobMember::Dead(int64_t step) {
  MutexLock l(&mu_);
  return dead_.count(step) != 0;
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

int64_t JobMember::RestoreTarget() {
  MutexLock l(&mu_);
  if (restore_target_ >= 0) return restore_target_;
  auto latest = log_->latest();
  return latest ? latest->step : -1;
}

void JobMember::SetRestoreTarget(int64_t step, uint64_t epoch) {
  // The job goes back to `step` and computes the later steps again. Skips
  // and completions of those steps from the failed attempt must not count:
  // a skip of step s keeps s from committing in the new attempt too (seed
  // 0x5f3f57eb of the chaos campaign lost 5 steps that way: every step
  // between the restored one and the next failure had a stale skip).
  // The listing comes first: its revision separates the failed attempt's
  // skip records (erased below, and ignored by the skip watcher however late
  // their events arrive) from the new attempt's.
  coord::JobKeys keys(job_);
  auto listing = store_->List(keys.SkippedPrefix(), Deadline::AfterSeconds(kStoreCallS));
  size_t forgotten = 0;
  {
    MutexLock l(&mu_);
    restore_target_ = step;
    rollback_ = step;
    rollback_pending_ = true;
    if (listing.ok()) rollback_revision_ = std::max(rollback_revision_, listing->revision);
    forgotten = static_cast<size_t>(std::distance(dead_.upper_bound(step), dead_.end()));
    dead_.erase(dead_.upper_bound(step), dead_.end());
    completes_.erase(completes_.upper_bound(step), completes_.end());
  }
  // A hold of a later step would make the trainers skip every snapshot that
  // targets its slot until the hold times out.
  const int64_t hold = hold_->held();
  if (hold > step) hold_->Release(hold);
  // So would a trainer's claim of a later step (it claimed that step's slot
  // to overwrite it in the failed attempt): the new attempt's step of that
  // number would be abandoned as being overwritten, and never commit.
  hold_->ForgetClaimsAbove(step);
  // T1 entries of later steps (made here or pushed by peers) would refuse
  // the new attempt's entries of the same step ("already finished").
  red_->DropAbove(step);
  // The replicas this node keeps are seeded again after the restore: the
  // owners' nodes push their copies until then.
  if (ready_.load()) ForgetAorHeld();
  // This node's skip records of later steps (the other nodes delete theirs).
  if (listing.ok()) {
    for (const auto& kv : listing->kvs) {
      std::string tail = kv.key.substr(keys.SkippedPrefix().size());
      size_t slash = tail.find('/');
      if (slash == std::string::npos || tail.substr(slash + 1) != node_name_) continue;
      auto s = coord::ParseStep(tail.substr(0, slash));
      if (s.ok() && *s > step) {
        store_->Delete(kv.key, Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
      }
    }
  } else {
    MEMENTO_LOG_WARN("restore target {}: cannot list the skip records: {}", step,
                     listing.status().ToString());
  }
  if (epoch > 0) StartEpoch(step, epoch);
  cv_.SignalAll();
  MEMENTO_LOG_INFO("restore target: step {}{}{}", step,
                   epoch > 0 ? fmt::format(" (commit epoch {})", epoch) : std::string(),
                   forgotten > 0 ? fmt::format(" ({} skip(s) of later steps forgotten)", forgotten)
                                 : std::string());
}

bool JobMember::StartEpoch(int64_t step, uint64_t epoch) {
  uint64_t cur = epoch_.load();
  do {
    if (cur >= epoch) return false;
  } while (!epoch_.compare_exchange_weak(cur, epoch));
  // `step` is the newest commit of the new history (it is published as the
  // epoch's first commit): the steps after it are accepted again (the
  // trainers' completions, the copies peers push) though the abandoned
  // history may have committed them.
  const int64_t was = committed_.exchange(step);
  hold_->Commit(step);
  if (durable_ != nullptr) durable_->RestartAt(step);
  MEMENTO_LOG_INFO("commit epoch {} starts at step {} (the newest commit was {})", epoch, step,
                   was);
  return true;
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

// ---- store loss ----------------------------------------------------------------

Status JobMember::OnReregister() {
  const Deadline deadline = Deadline::AfterSeconds(kStoreCallS);
  coord::JobKeys keys(job_);
  // 1. The newest commit this node saw: commit/latest comes back.
  MEMENTO_RETURN_IF_ERROR(coord::RepublishCommits(*store_, job_, *log_, deadline));
  // 2. Inventories: every rank's once this node has the plan (a replacement
  //    node computes its plan from them), else those of its own ranks.
  {
    MutexLock l(&mu_);
    published_.clear();      // the member thread publishes the local ones again
    rollback_revision_ = 0;  // a new store numbers its revisions afresh
  }
  int republished = 0;
  if (ready_.load()) {
    for (size_t r = 0; r < inventory_.size(); ++r) {
      MEMENTO_RETURN_IF_ERROR(store_
                                  ->Set(keys.Inventory(static_cast<int>(r)),
                                        TensorListToJson(inventory_[r]).dump(), deadline)
                                  .status());
      ++republished;
    }
  }
  // 3. Steps this node will never report: nobody keeps holding them.
  std::vector<int64_t> dead;
  {
    MutexLock l(&mu_);
    dead.assign(dead_.begin(), dead_.end());
  }
  for (int64_t step : dead) {
    if (step <= committed_.load()) continue;
    MEMENTO_RETURN_IF_ERROR(store_->Set(SkippedKey(step, node_name_), "", deadline).status());
  }
  // 4. A step this node reported and still holds, uncommitted: its report may
  //    have died with the store. Reporting it again is idempotent.
  const int64_t reported = last_reported_.load();
  if (reported > committed_.load() && hold_->held() == reported) {
    MEMENTO_RETURN_IF_ERROR(
        coord::ReportCompleted(*store_, job_, node_name_, reported, deadline, epoch_.load()));
  }
  cv_.SignalAll();
  MEMENTO_LOG_INFO(
      "store lost node {}'s lease: registered again, republished commit {}, {} inventories{}",
      node_, committed_.load(), republished,
      reported > committed_.load() ? fmt::format(", the report of step {}", reported) : "");
  return Status::Ok();
}

// ---- commits -------------------------------------------------------------------

void JobMember::OnCommit(const coord::CommitId& id) {
  // The log already has the record (CommitFollower appends first).
  const int64_t step = id.step;
  // The first commit of a new epoch: the history restarted at `step`
  // (docs/coordination.md, "Epochs"). A node the recovery did not reach
  // (an agent started after it) rewinds here as SetRestoreTarget would.
  const bool new_epoch = id.epoch != commit_epoch_;
  commit_epoch_ = id.epoch;
  if (new_epoch && epoch_.load() < id.epoch) SetRestoreTarget(step, id.epoch);
  if (new_epoch) {
    committed_.store(step);
  } else {
    int64_t prev = committed_.load();
    while (prev < step && !committed_.compare_exchange_weak(prev, step)) {
    }
  }
  hold_->Commit(step);
  red_->DropBelow(step);
  const int64_t reported_ns = last_reported_ns_.load();
  const bool reported_here = last_reported_.load() == step;
  {
    MutexLock l(&mu_);
    if (reported_here && step > lag_counted_) {
      lag_counted_ = step;
      const double lag = std::max(0.0, static_cast<double>(SteadyNowNs() - reported_ns) / 1e9);
      ++stats_.commit_lags;
      stats_.commit_lag_s += lag;
      stats_.last_commit_lag_s = lag;
    }
    if (restore_target_ >= 0 && step > restore_target_) restore_target_ = -1;
    completes_.erase(completes_.begin(), completes_.upper_bound(step));
    dead_.erase(dead_.begin(), dead_.upper_bound(step));
  }
  // This node's skip records of steps that can no longer matter.
  coord::JobKeys keys(job_);
  auto listing = store_->List(keys.SkippedPrefix(), Deadline::AfterSeconds(kStoreCallS));
  if (listing.ok()) {
    for (const auto& kv : listing->kvs) {
      std::string tail = kv.key.substr(keys.prefix().size() + 8);
      size_t slash = tail.find('/');
      auto s = coord::ParseStep(tail.substr(0, slash));
      if (s.ok() && *s <= step && slash != std::string::npos &&
          tail.substr(slash + 1) == node_name_) {
        store_->Delete(kv.key, Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
      }
    }
  }
  cv_.SignalAll();
  MEMENTO_LOG_DEBUG("committed step {}", step);
  // The durable stream writes globally committed versions only. A new
  // epoch's first commit is the restored version, not written again.
  if (durable_ != nullptr && !new_epoch) durable_->OnCommitted(step);
}

void JobMember::Abandon(int64_t step, const std::string& why) {
  hold_->Release(step);
  {
    MutexLock l(&mu_);
    ++stats_.abandoned;
  }
  MEMENTO_LOG_INFO("step {} abandoned: {}", step, why);
  // This node will never report `step`: the others must not keep it either
  // (the same record as a trainer's skip, with the reason).
  PublishDead(step, why);
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
      {
        MutexLock l(&mu_);
        stats_.produce_s += std::chrono::duration<double>(Now() - produce_start).count();
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

// ---- the save path of one version -------------------------------------------------------------

Result<std::string> JobMember::NodeEndpoint(int node) {
  coord::JobKeys keys(job_);
  MEMENTO_ASSIGN_OR_RETURN(coord::KeyValue kv, store_->Get(keys.Node(coord::NodeName(node)),
                                                           Deadline::AfterSeconds(kStoreCallS)));
  return kv.value;
}

bool JobMember::Produce(int64_t step) {
  // 1. Hold first, then look at the claims (shm/commit_word.h): a trainer
  //    that already decided to overwrite a slot of `step` wins.
  hold_->Set(step);
  for (int r : local_ranks_) {
    if (hold_->Claimed(r, step)) {
      Abandon(step, fmt::format("rank {} is overwriting its slot of it", r));
      return false;
    }
  }
  // 2. The local ranks' slots of `step`.
  std::map<int, RankSlotView> views;
  for (int r : local_ranks_) {
    RankSlotView v;
    v.rank = r;
    for (int slot = 0; slot < shm::kSlotsPerRank && v.slot < 0; ++slot) {
      auto seg = node_store_->SlotSegment(r, slot);
      if (seg == nullptr) continue;
      auto info = shm::ReadSlot(*seg);
      if (info.ok() && info->state == shm::SlotState::kComplete && info->step == step) {
        v.slot = slot;
        v.segment = std::move(seg);
        v.info = std::move(*info);
      }
    }
    if (v.slot < 0) {
      Abandon(step, fmt::format("rank {} no longer holds it", r));
      return false;
    }
    // The T0 bytes the redundancy is made of must be right.
    Status st = shm::VerifySlotData(*v.segment, v.info);
    if (!st.ok()) {
      Abandon(step, fmt::format("rank {} slot {}: {}", r, v.slot, st.ToString()));
      return false;
    }
    views.emplace(r, std::move(v));
  }
  auto unchanged = [&]() -> std::string {
    for (const auto& [r, v] : views) {
      if (!shm::SlotUnchanged(*v.segment, v.info)) {
        return fmt::format("rank {} rewrote slot {} while it was read", r, v.slot);
      }
    }
    return "";
  };
  // 3. Own entries, then the copies peers hold of this node's pieces.
  Status st = red_->Ensure(step);
  if (st.ok()) st = producer_->ProduceEntries(step, views);
  if (st.ok()) {
    st = producer_->PushCopies(
        step, views, options_.hold_timeout_s,
        [this, step] { return !Dead(step) && committed_.load() < step; },
        [this](uint64_t bytes) {
          MutexLock l(&mu_);
          stats_.pushed_bytes += static_cast<int64_t>(bytes);
        },
        [this](uint32_t copy, int64_t s) { return AorHeld(copy, s); });
  }
  if (!st.ok()) {
    Abandon(step, st.ToString());
    return false;
  }
  std::string changed = unchanged();
  if (!changed.empty()) {
    Abandon(step, changed);
    return false;
  }
  // 4. Every entry of `step`, the ones peers push included.
  Deadline deadline = Deadline::AfterSeconds(options_.hold_timeout_s);
  while (!red_->Complete(step)) {
    if (deadline.expired() || committed_.load() >= step || Dead(step)) {
      Abandon(step, Dead(step) ? "another node skipped it"
                               : "the copies peers push of it did not all arrive");
      return false;
    }
    MutexLock l(&mu_);
    if (stop_) return false;
    // Woken by the peer service when a pushed copy is finished.
    cv_.WaitUntil(&l, Now() + std::chrono::milliseconds(20));
  }
  changed = unchanged();
  if (!changed.empty()) {
    Abandon(step, changed);
    return false;
  }
  // 4b. AOR: the replicas this node computed of `step` against their
  //     owners' checksums; an entry made from one that differs is not kept.
  st = CheckAorCopies(step);
  if (!st.ok()) {
    Abandon(step, st.ToString());
    return false;
  }
  // 5. COMPLETED. The hold stays until `step` (or a newer one) commits or
  //    the hold timeout passes.
  st = membership_->SetSignal(coord::NodeSignal::kCompleted, step, "",
                              Deadline::AfterSeconds(kStoreCallS));
  if (st.ok()) {
    st = coord::ReportCompleted(*store_, job_, node_name_, step,
                                Deadline::AfterSeconds(kStoreCallS), epoch_.load());
  }
  if (!st.ok()) {
    Abandon(step, "reporting it: " + st.ToString());
    return false;
  }
  last_reported_ns_.store(SteadyNowNs());
  last_reported_.store(step);
  {
    MutexLock l(&mu_);
    ++stats_.produced;
  }
  MEMENTO_LOG_DEBUG("step {}: redundancy done, reported COMPLETED", step);
  return true;
}

// ---- peer service ------------------------------------------------------------

void JobMember::PreallocateSlots() {
  Stopwatch sw;
  const double cpu0 = ThreadCpuSeconds();
  coord::JobKeys keys(job_);
  auto topo_kv = store_->Get(keys.Topology(), Deadline::AfterSeconds(kStoreCallS));
  if (!topo_kv.ok()) return;  // a job that has not started: the seals allocate
  auto ct = topo::ParseJobTopology(topo_kv->value);
  if (!ct.ok()) return;  // TrySetup reports it
  const int ranks = ct->topology.num_ranks();
  int made = 0;
  uint64_t bytes = 0;
  for (int r = 0; r < ranks && r < static_cast<int>(ct->topology.rank_node.size()); ++r) {
    if (ct->topology.rank_node[r] != node_) continue;
    // A rank with a slot here (adopted from the root) needs none.
    if (node_store_->SlotSegment(r, 0) != nullptr || node_store_->SlotSegment(r, 1) != nullptr) {
      continue;
    }
    auto kv = store_->Get(keys.Inventory(r), Deadline::AfterSeconds(kStoreCallS));
    if (!kv.ok()) continue;  // the rank never registered: nothing to rebuild
    auto metas = ParseTensorList(kv->value);
    if (!metas.ok()) continue;
    // The layout a rebuild writes (recover::ExecuteAssemblies: whole
    // tensors, the executor's chunk size).
    auto layout = shm::ComputeSlotLayout(job_, r, *metas, recover::ExecuteOptions{}.chunk_bytes);
    if (!layout.ok()) continue;
    auto seg = node_store_->EnsureSlot(r, 0, layout->total_bytes);
    if (!seg.ok()) {
      MEMENTO_LOG_WARN(
          "preallocate: slot 0 of rank {} ({}) not made: {}; a recovery allocates it when it "
          "rebuilds the rank",
          r, HumanBytes(layout->total_bytes), seg.status().ToString());
      continue;
    }
    ++made;
    bytes += (*seg)->size();
  }
  if (made == 0) return;
  const double s = sw.Seconds();
  MEMENTO_LOG_INFO(
      "preallocate: {} slot(s) of this node's ranks made before joining, {} in {:.3f} s", made,
      HumanBytes(bytes), s);
  MutexLock l(&mu_);
  stats_.preallocated_slots = made;
  stats_.preallocated_bytes = bytes;
  stats_.preallocate_s = s;
  stats_.preallocate_cpu_s = ThreadCpuSeconds() - cpu0;
}

Status JobMember::StartPeerService() {
  Result<net::HostPort> hp = net::ParseHostPort(options_.listen, net::PortUse::kListen);
  if (!hp.ok()) return hp.status().WithContext("--listen");
  PeerServiceOptions po;
  po.job = job_;
  po.node = node_;
  po.host = hp->host;
  po.port = hp->port;
  po.store = node_store_;
  po.redundancy = red_.get();
  po.max_request_bytes = options_.peer_max_request_bytes;
  po.max_buffered_bytes = options_.peer_max_buffered_bytes;
  po.plan_wait_s = options_.plan_wait_s;
  po.legacy_reads = options_.recover_legacy_reads;
  po.staged_receive = options_.recover_staged_receive;
  po.plan = [this]() -> Result<std::shared_ptr<const ClusterPlan>> {
    MutexLock l(&plan_mu_);
    if (cluster_plan_ == nullptr) {
      return FailedPreconditionError(
          fmt::format("node {} has no plan yet (waiting for the topology and every rank's "
                      "inventory)",
                      node_));
    }
    return cluster_plan_;
  };
  po.endpoint_of = [this](int node) { return NodeEndpoint(node); };
  po.committed = [this] { return committed_.load(); };
  po.on_push_finished = [this](int64_t, recover::ByteSource) { cv_.SignalAll(); };
  po.aor_copies = [this](int64_t step) {
    std::vector<uint32_t> out;
    MutexLock l(&aor_mu_);
    for (const auto& [copy, steps] : aor_entries_) {
      if (steps.count(step) > 0) out.push_back(copy);
    }
    return out;
  };
  po.set_restore_target = [this](int64_t step, uint64_t epoch) {
    SetRestoreTarget(step, epoch);
    return Status::Ok();
  };
  MEMENTO_ASSIGN_OR_RETURN(peer_, PeerService::Start(std::move(po), *token_));
  endpoint_ = peer_->endpoint();
  return Status::Ok();
}

Result<std::vector<AorRange>> JobMember::AorRanges(int rank, int num_state) {
  std::shared_ptr<const ClusterPlan> cp;
  {
    MutexLock l(&plan_mu_);
    cp = cluster_plan_;
  }
  if (cp == nullptr) {
    return UnavailableError(fmt::format("not ready: node {} has no plan yet", node_));
  }
  std::vector<AorRange> out;
  for (const topo::Copy& c : cp->plan.copies) {
    if (c.kind != topo::CopyKind::kAor || c.producer_rank != rank) continue;
    const topo::Piece& piece = cp->plan.pieces[c.piece];
    const std::vector<TensorMeta>& tensors = cp->inventory[static_cast<size_t>(piece.rank)];
    std::string why;
    int64_t offset = -1, count = -1;
    if (static_cast<int>(piece.segments.size()) != num_state) {
      why = fmt::format("{} tensors, the optimizer has {} state buffers", piece.segments.size(),
                        num_state);
    }
    for (const topo::Segment& seg : piece.segments) {
      if (!why.empty()) break;
      auto it = std::find_if(tensors.begin(), tensors.end(),
                             [&](const TensorMeta& t) { return t.name == seg.tensor; });
      if (it == tensors.end()) {
        why = "tensor '" + seg.tensor + "' is not in the inventory";
      } else if (it->dtype != DType::kFloat32 || seg.offset != 0 || seg.length != it->nbytes() ||
                 it->global_numel <= 0) {
        why = "tensor '" + seg.tensor + "' is not a whole fp32 ZeRO-1 shard";
      } else if (offset >= 0 && (it->shard_offset != offset || it->numel() != count)) {
        why = "its tensors shard different ranges";
      } else {
        offset = it->shard_offset;
        count = it->numel();
      }
    }
    if (why.empty() && count <= 0) why = "an empty shard";
    if (!why.empty()) {
      MEMENTO_LOG_WARN(
          "aor: piece {} cannot be recomputed on the host ({}); its copy on node {} "
          "stays a network copy",
          piece.key, why, c.node);
      continue;
    }
    out.push_back(AorRange{piece.rank, rank, c.id, static_cast<uint64_t>(offset),
                           static_cast<uint64_t>(count)});
  }
  return out;
}

// ---- AOR ------------------------------------------------------------------------------------

namespace {
constexpr size_t kAorSumsKept = 8;
}  // namespace

Status JobMember::CheckNodeRoom(uint64_t more, const std::string& why) {
  if (node_store_ == nullptr || node_store_->options().budget_bytes == 0) return Status::Ok();
  const uint64_t slots = node_store_->allocated_bytes();
  const uint64_t held = red_->bytes_in_use();
  AorHolder* aor = aor_budget_.load();
  const uint64_t aor_bytes = aor != nullptr ? aor->bytes_in_use() : 0;
  const uint64_t budget = node_store_->options().budget_bytes;
  const uint64_t used = slots + held + aor_bytes;
  if (used + more <= budget) return Status::Ok();
  return ResourceExhaustedError(fmt::format(
      "node memory budget exhausted: {} needs {} more but the budget is {} with {} in use "
      "({} slots, {} redundancy, {} aor replicas); raise the agent's --budget to at least {} "
      "bytes",
      why, HumanBytes(more), HumanBytes(budget), HumanBytes(used), HumanBytes(slots),
      HumanBytes(held), HumanBytes(aor_bytes), used + more));
}

Status JobMember::OnShardChecksum(int rank, int64_t step, uint64_t checksum) {
  // One publication at a time: two overlapping ones (the staging file's
  // watcher and an `aor_checksum` request) could otherwise store an older
  // set after a newer one.
  MutexLock p(&aor_sum_mu_);
  nlohmann::json j = nlohmann::json::object();
  {
    MutexLock l(&aor_mu_);
    auto& sums = own_sums_[rank];
    sums.erase(sums.upper_bound(step), sums.end());  // a rollback recomputes later steps
    sums[step] = checksum;
    while (sums.size() > kAorSumsKept) sums.erase(sums.begin());
    for (const auto& [s, c] : sums) j[std::to_string(s)] = fmt::format("{:016x}", c);
  }
  coord::JobKeys keys(job_);
  return store_->Set(keys.AorSum(rank), j.dump(), Deadline::AfterSeconds(kStoreCallS)).status();
}

Result<uint64_t> JobMember::OwnerSum(int owner, int64_t step) {
  coord::JobKeys keys(job_);
  auto kv = store_->Get(keys.AorSum(owner), Deadline::AfterSeconds(kStoreCallS));
  if (!kv.ok()) {
    if (kv.status().code() == StatusCode::kNotFound) {
      return UnavailableError(fmt::format("rank {} has reported no shard checksum", owner));
    }
    return kv.status();
  }
  auto j = nlohmann::json::parse(kv->value, nullptr, /*allow_exceptions=*/false);
  const std::string key = std::to_string(step);
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) {
    return UnavailableError(
        fmt::format("rank {}'s checksum of step {} is not (or no longer) published", owner, step));
  }
  const std::string hex = j[key].get<std::string>();
  char* end = nullptr;
  const uint64_t v = std::strtoull(hex.c_str(), &end, 16);
  if (hex.size() != 16 || end != hex.c_str() + hex.size()) {
    return InvalidArgumentError(
        fmt::format("aor/sum/{}: step {} has checksum '{}', not 16 hex digits", owner, step, hex));
  }
  return v;
}

bool JobMember::AorHeld(uint32_t copy, int64_t step) {
  coord::JobKeys keys(job_);
  auto kv = store_->Get(keys.AorHeld(copy), Deadline::AfterSeconds(kStoreCallS));
  if (!kv.ok()) return false;
  auto from = coord::ParseStep(kv->value);
  const bool held = from.ok() && *from <= step;
  if (held) {
    const uint64_t bytes = plan_.pieces[plan_.copies[copy].piece].bytes;
    MutexLock l(&aor_mu_);
    ++aor_stats_.skipped_pushes;
    aor_stats_.skipped_push_bytes += bytes;
  }
  return held;
}

Result<AorHolder::SeedBytes> JobMember::AorSeed(const AorRange& range, int64_t step) {
  if (!ready_.load()) return UnavailableError("not ready: no plan yet");
  bool was_current = false;
  {
    MutexLock l(&aor_mu_);
    was_current = aor_confirmed_.erase(range.copy) > 0;
  }
  coord::JobKeys keys(job_);
  if (was_current) {
    // The replica needs a seed: it is not current, so the owner's node
    // pushes the copy again.
    MEMENTO_LOG_WARN(
        "aor: the replica of rank {} (copy {}) is no longer current; its owner's "
        "node pushes it again",
        range.owner, range.copy);
  }
  store_->Delete(keys.AorHeld(range.copy), Deadline::AfterSeconds(kStoreCallS))
      .status()
      .IgnoreError();
  const recover::VersionHolding holding = red_->Holding(step, /*verify=*/false);
  if (std::find(holding.copies.begin(), holding.copies.end(), range.copy) == holding.copies.end()) {
    return UnavailableError(
        fmt::format("no network copy of rank {}'s shard of step {} here yet", range.owner, step));
  }
  MEMENTO_ASSIGN_OR_RETURN(uint64_t owner_sum, OwnerSum(range.owner, step));
  const uint64_t bytes = plan_.pieces[plan_.copies[range.copy].piece].bytes;
  AorHolder::SeedBytes sb;
  sb.state.resize(bytes / sizeof(float));
  if (bytes % sizeof(float) != 0) return InternalError("a dp_shard piece of fp32 tensors");
  recover::ReadRequest req;
  req.step = step;
  req.source = {recover::SourceKind::kCopy, range.copy};
  req.offset = 0;
  req.length = bytes;
  MEMENTO_RETURN_IF_ERROR(red_->Read(req, sb.state.data()));
  sb.owner_checksum = owner_sum;
  return sb;
}

void JobMember::OnAorAdvanced(const AorRange& range, int64_t step, const opt::AorReplica& replica) {
  {
    MutexLock l(&aor_mu_);
    auto it = aor_confirmed_.find(range.copy);
    if (it == aor_confirmed_.end() || step <= it->second) return;  // pushes still make it
  }
  if (!ready_.load() || step <= committed_.load()) return;
  const recover::ByteSource entry{recover::SourceKind::kCopy, range.copy};
  const recover::VersionHolding holding = red_->Holding(step, /*verify=*/false);
  if (std::find(holding.copies.begin(), holding.copies.end(), range.copy) != holding.copies.end()) {
    return;  // a push of it arrived first
  }
  Status st = red_->Ensure(step);
  auto buf = st.ok() ? red_->EntryBuffer(step, entry) : Result<uint8_t*>(st);
  if (buf.ok()) {
    const size_t n = replica.count() * sizeof(float);
    for (int k = 0; k < replica.num_state(); ++k) std::memcpy(*buf + k * n, replica.state(k), n);
    st = red_->FinishEntry(step, entry);
  } else {
    st = buf.status();
  }
  if (!st.ok()) {
    MEMENTO_LOG_WARN("aor: copy {} of step {} from the replica of rank {}: {}", range.copy, step,
                     range.owner, st.ToString());
    return;
  }
  {
    MutexLock l(&aor_mu_);
    auto& made = aor_entries_[range.copy];
    made.insert(step);
    while (made.size() > 2 * kAorSumsKept) made.erase(made.begin());
    ++aor_stats_.entries_from_replica;
  }
  cv_.SignalAll();  // Produce waits for the entries of its step
}

Status JobMember::CheckAorCopies(int64_t step) {
  if (aor_ == nullptr) return Status::Ok();
  coord::JobKeys keys(job_);
  // This node's ranks' own checksums up to `step` are in their staging
  // files' rings before their snapshots of `step`: published now if a
  // watcher has not yet, so the holders of their replicas find them.
  aor_->PublishChecksums();
  // The captures are advanced in the AOR thread: the ones of `step` and
  // before first (a replica that has not computed `step` by the deadline is
  // not confirmed at it; a copy it did not make was pushed).
  if (!aor_->WaitCaptured(step, Deadline::AfterSeconds(options_.hold_timeout_s))) {
    MEMENTO_LOG_WARN("aor: the captures of step {} were not all processed within {} s", step,
                     options_.hold_timeout_s);
  }
  for (uint32_t cid : plan_.nodes[node_].copies) {
    const topo::Copy& c = plan_.copies[cid];
    if (c.kind != topo::CopyKind::kAor) continue;
    const int owner = plan_.pieces[c.piece].rank;
    auto mine = aor_->ChecksumOf(owner, step);
    if (!mine.ok()) continue;  // no replica computed this step: the entry was pushed
    Result<uint64_t> theirs = UnavailableError("");
    Deadline deadline = Deadline::AfterSeconds(options_.hold_timeout_s);
    while (true) {
      theirs = OwnerSum(owner, step);
      if (theirs.ok() || theirs.status().code() != StatusCode::kUnavailable || deadline.expired() ||
          Dead(step) || committed_.load() >= step) {
        break;
      }
      usleep(20000);
    }
    bool made_here = false;
    {
      MutexLock l(&aor_mu_);
      made_here = aor_entries_[cid].count(step) > 0;
    }
    if (!theirs.ok()) {
      if (!made_here) continue;  // the pushed entry stands on its own
      return Status(theirs.status().code(),
                    fmt::format("copy {} of rank {}'s shard was recomputed on the host, and its "
                                "owner's checksum of step {} is missing: {}",
                                cid, owner, step, theirs.status().message()));
    }
    if (*theirs == *mine) {
      int64_t first = -1;
      {
        MutexLock l(&aor_mu_);
        ++aor_stats_.confirmed;
        auto [it, fresh] = aor_confirmed_.emplace(cid, step);
        if (fresh) first = step;
      }
      if (first >= 0) {
        // From here on this node makes the copy; the owner's node stops
        // pushing it two steps on (the next step's push may be in flight).
        MEMENTO_LOG_INFO(
            "aor: the replica of rank {} is current at step {}; copy {} is "
            "recomputed here from now on (no network)",
            owner, step, cid);
        Status st = store_
                        ->Set(keys.AorHeld(cid), coord::StepKey(step + 2),
                              Deadline::AfterSeconds(kStoreCallS))
                        .status();
        if (!st.ok()) MEMENTO_LOG_WARN("aor: publishing copy {} held: {}", cid, st.ToString());
      }
      continue;
    }
    // Divergence: logged, the replica dropped and seeded again from the
    // owner (the network copy resumes); never kept.
    const std::string why =
        fmt::format("step {} recomputed on the host hashes to {:016x}, rank {} reported {:016x}",
                    step, *mine, owner, *theirs);
    {
      MutexLock l(&aor_mu_);
      ++aor_stats_.refused;
      aor_confirmed_.erase(cid);
    }
    store_->Delete(keys.AorHeld(cid), Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
    aor_->Refuse(owner, why);
    if (made_here) {
      return DataLossError(
          fmt::format("copy {} (AOR replica of rank {}): {}; not kept", cid, owner, why));
    }
  }
  return Status::Ok();
}

void JobMember::ForgetAorHeld() {
  coord::JobKeys keys(job_);
  {
    MutexLock l(&aor_mu_);
    aor_confirmed_.clear();
  }
  for (uint32_t cid : plan_.nodes[node_].copies) {
    if (plan_.copies[cid].kind != topo::CopyKind::kAor) continue;
    store_->Delete(keys.AorHeld(cid), Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
  }
}

JobMember::AorStats JobMember::aor_stats() {
  MutexLock l(&aor_mu_);
  return aor_stats_;
}

Result<shm::PlanReply> JobMember::SaveRanges(int rank, bool client_parity, int64_t step) {
  std::shared_ptr<const ClusterPlan> cp;
  bool sharded = false;
  {
    MutexLock l(&plan_mu_);
    cp = cluster_plan_;
    sharded = sharded_;
  }
  // Until this answer says otherwise, the rank's slots hold no parity entry.
  red_->SetClientParity(rank, -1, 0);
  if (cp == nullptr) {
    return UnavailableError(
        fmt::format("not ready: node {} has no plan yet (waiting for the topology and every rank's "
                    "inventory)",
                    node_));
  }
  Result<shm::PlanReply> reply = PlanReplyFor(*cp, rank, sharded, client_parity);
  if (reply.ok() && !reply->parities.empty() && step >= 0) {
    // From `step` on its slots hold the parities the rank produces: the
    // versions reference them (docs/reft.md section 4).
    red_->SetClientParity(rank, step, cp->hash);
  }
  return reply;
}

void JobMember::SetPeerPlan() {
  auto cp = MakeClusterPlan(plan_, inventory_);
  if (durable_ != nullptr) durable_->SetClusterPlan(cp);
  MutexLock l(&plan_mu_);
  cluster_plan_ = std::move(cp);
}

Result<shm::AssembleReply> JobMember::Assemble(int rank, int64_t step) {
  const Deadline deadline = Deadline::AfterSeconds(300);
  // Right after this agent restarted, its plan comes back once it has read
  // the topology and the ranks' inventories again: waited for (bounded), as
  // the peers' piece requests wait for it (WaitForPlan).
  MEMENTO_ASSIGN_OR_RETURN(
      std::shared_ptr<const ClusterPlan> cp,
      WaitForPlan(
          [this]() -> Result<std::shared_ptr<const ClusterPlan>> {
            MutexLock l(&plan_mu_);
            if (cluster_plan_ == nullptr || peer_ == nullptr) {
              return FailedPreconditionError(fmt::format(
                  "node {} has no plan yet (waiting for the topology and every rank's inventory)",
                  node_));
            }
            return cluster_plan_;
          },
          options_.plan_wait_s, deadline));
  return AssembleRank(*cp, job_, rank, step, peer_->reader(), *node_store_, deadline);
}

void JobMember::StopPeerService() {
  if (peer_) peer_->Stop();
}

}  // namespace memento::agent
