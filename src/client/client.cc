// The trainer-side library behind include/memento/client.h (design:
// docs/node_store.md, threads: docs/thread_model.md, the units:
// docs/architecture.md, "The client").
//
// The client maps its rank's two slots (allocated and pre-faulted by the
// agent) and copies registered memory straight into them: no byte of state
// crosses the socket. The socket carries only small control messages
// (agent_channel.h). A snapshot goes through one of the snapshot paths
// (snapshot_path.h: eager, HAS, device); the hold words (hold_words.h)
// decide which slot it overwrites; restore.h loads a version back.
#include "memento/client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "client/agent_channel.h"
#include "client/client_options.h"
#include "client/commit_lag.h"
#include "client/device_path.h"
#include "client/eager_path.h"
#include "client/has_path.h"
#include "client/hold_words.h"
#include "client/parity_producer.h"
#include "client/registered_tensor.h"
#include "client/restore.h"
#include "client/slot_prefault.h"
#include "client/testing_hooks.h"
#include "common/checksum.h"
#include "common/log.h"
#include "fmt/format.h"
#include "shm/agent_messages.h"
#include "shm/aor_stage.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "snap/copy_engine.h"

namespace memento {

namespace client::testing_hooks {
namespace {
std::atomic<int> copy_delay_us{0};
}  // namespace
void SetCopyDelayUs(int us) { copy_delay_us.store(us, std::memory_order_relaxed); }
int CopyDelayUs() { return copy_delay_us.load(std::memory_order_relaxed); }
}  // namespace client::testing_hooks

namespace {

using client::RegisteredTensor;
using nlohmann::json;

class ClientImpl final : public Client, private client::SlotSink {
 public:
  ClientImpl(ClientOptions options, std::string dir)
      : options_(std::move(options)),
        agent_(options_, dir),
        holds_(dir, options_.rank),
        idle_priority_(options_.copy_priority == CopyPriority::kIdle),
        client_parity_(options_.client_parity) {}

  // Waits for the snapshot in flight (the copy of registered memory must end
  // before the caller may free it), then stops every thread of the client.
  ~ClientImpl() override {
    prefaults_.Stop();
    if (in_flight_ != nullptr) in_flight_->Drain();
    has_ptr_.store(nullptr, std::memory_order_release);
    has_.reset();
    device_path_.reset();
    device_.reset();  // unregisters the slots' pages before they are unmapped
    eager_.reset();
    engine_.reset();
  }

  Status ConnectNow(Deadline deadline) { return agent_.Connect(deadline); }

  Status RegisterTensor(const TensorMeta& meta, void* data, Device device) override {
    if (sealed_) return FailedPreconditionError("RegisterTensor('" + meta.name + "') after Seal()");
    if (!device.is_host())
      MEMENTO_RETURN_IF_ERROR(client::CheckDeviceTensor(meta, device, tensors_));
    if (meta.name.empty()) return InvalidArgumentError("a tensor needs a name");
    for (int64_t d : meta.shape) {
      if (d < 0) {
        return InvalidArgumentError("tensor '" + meta.name + "' has shape " +
                                    ShapeToString(meta.shape));
      }
    }
    if (data == nullptr && meta.nbytes() > 0) {
      return InvalidArgumentError("tensor '" + meta.name + "' has a null address");
    }
    for (const RegisteredTensor& r : tensors_) {
      if (r.meta.name == meta.name) {
        return AlreadyExistsError("tensor '" + meta.name + "' is already registered");
      }
    }
    tensors_.push_back({meta, data, device});
    return Status::Ok();
  }

  Status RegisterBlob(const std::string& name, void* data, size_t nbytes) override {
    TensorMeta meta;
    meta.name = name;
    meta.dtype = DType::kUInt8;
    meta.shape = {static_cast<int64_t>(nbytes)};
    meta.state_class = StateClass::kPrivate;
    return RegisterTensor(meta, data, Device::Host());
  }

  Status Seal(Deadline deadline) override {
    if (sealed_) return FailedPreconditionError("Seal() called twice");
    std::vector<TensorMeta> metas;
    for (const RegisteredTensor& r : tensors_) metas.push_back(r.meta);
    MEMENTO_ASSIGN_OR_RETURN(layout_, shm::ComputeSlotLayout(options_.job_id, options_.rank, metas,
                                                             options_.chunk_bytes));
    whole_layout_ = layout_;
    UseWholeLayout();
    // The manifest lets an agent in cluster mode publish this rank's
    // inventory (docs/cluster.md); a single-node agent ignores it.
    MEMENTO_ASSIGN_OR_RETURN(
        json reply,
        agent_.Call(shm::SealRequest(options_.rank, layout_.total_bytes, layout_.manifest),
                    deadline));
    MEMENTO_ASSIGN_OR_RETURN(shm::SealReply sealed, shm::ParseSealReply(reply));
    const std::vector<std::string>& paths = sealed.paths;
    // Map both slots, but touch only their headers, manifests and tables
    // here (what Snapshot() writes on the training thread); their data
    // regions are touched by the SlotPrefaults, in the background.
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      MEMENTO_ASSIGN_OR_RETURN(segments_[s],
                               shm::Segment::Open(paths[s], /*writable=*/true, /*prefault=*/false,
                                                  /*populate=*/false));
      if (segments_[s]->size() < layout_.total_bytes) {
        return InternalError(fmt::format("slot {} is {} bytes, {} needed", paths[s],
                                         segments_[s]->size(), layout_.total_bytes));
      }
      const size_t head = std::min<size_t>(layout_.data_offset, segments_[s]->size());
      shm::PopulateWritable(segments_[s]->data(), head);
      shm::TouchPages(segments_[s]->data(), head);
      prefaults_.Set(s, segments_[s]->data(), head, segments_[s]->size());
      slots_[s] = segments_[s].get();
    }
    // The newest version held decides which slot the next snapshot overwrites.
    auto newest = shm::FindNewestCompleteSlot(Slots());
    if (newest.ok() && newest->info.step > last_step_) {
      last_step_ = newest->info.step;
      SetNewestSlot(newest->slot);
    }
    const int newest_slot = NewestSlot();
    prefaults_.Start(newest_slot >= 0 ? newest_slot : 0, idle_priority_);
    MEMENTO_ASSIGN_OR_RETURN(device_,
                             client::MakeDeviceCopier(options_, tensors_, layout_, slots_));
    if (device_ != nullptr && !layout_.chunks.empty()) {
      device_path_ = client::MakeDeviceSnapshotPath(device_.get(), Sink());
    }
    snap::CopyEngine::Options eo;
    eo.threads = std::max(1, options_.copy_threads);
    eo.name = "mem-copy";
    eo.idle_priority = idle_priority_;
    eo.chunk_delay_us = client::testing_hooks::CopyDelayUs();
    engine_ = std::make_unique<snap::CopyEngine>(eo);
    eager_ = std::make_unique<client::EagerPath>(engine_.get(), idle_priority_, Sink());
    has_chunk_delay_us_ = eo.chunk_delay_us;
    if (options_.schedule == Schedule::kHas) MEMENTO_RETURN_IF_ERROR(StartHas());
    holds_.MapCommitWord();
    sealed_ = true;
    if (grads_.grads != nullptr) {
      Status st = RegisterAorWithAgent(deadline);
      // No plan yet (a cluster still collecting inventories): asked again
      // at the next capture.
      if (!st.ok() && st.code() != StatusCode::kUnavailable) return st;
    }
    return Status::Ok();
  }

  Status RegisterGradients(const GradientRegistration& g) override {
    if (sealed_) return FailedPreconditionError("RegisterGradients() after Seal()");
    if (grads_.grads != nullptr) {
      return AlreadyExistsError("RegisterGradients() was already called for rank " +
                                std::to_string(options_.rank));
    }
    if (g.grads == nullptr) return InvalidArgumentError("RegisterGradients: grads is null");
    if (g.numel == 0) return InvalidArgumentError("RegisterGradients: numel is 0");
    if (g.optimizer_encoding.empty() ||
        g.optimizer_encoding.size() > shm::kMaxOptimizerEncodingBytes) {
      return InvalidArgumentError(fmt::format(
          "RegisterGradients: optimizer_encoding has {} bytes (1 to {}: opt::Optimizer::Encode())",
          g.optimizer_encoding.size(), shm::kMaxOptimizerEncodingBytes));
    }
    const RegisteredTensor* p = nullptr;
    for (const RegisteredTensor& r : tensors_) {
      if (r.meta.name == g.params_tensor) p = &r;
    }
    if (p == nullptr) {
      return InvalidArgumentError(fmt::format(
          "RegisterGradients: params_tensor '{}' is not a registered tensor", g.params_tensor));
    }
    if (p->meta.dtype != DType::kFloat32 || !p->device.is_host() ||
        static_cast<uint64_t>(p->meta.numel()) != g.numel) {
      return InvalidArgumentError(fmt::format(
          "RegisterGradients: params_tensor '{}' must be an fp32 host tensor of numel {} elements "
          "(it is {} {} with {} elements)",
          g.params_tensor, g.numel, DTypeName(p->meta.dtype),
          p->device.is_host() ? "on the host" : "on a device", p->meta.numel()));
    }
    grads_ = g;
    params_ = static_cast<const float*>(p->data);
    return Status::Ok();
  }

  Status CaptureGradients(int64_t step, float lr) override {
    if (!sealed_) return FailedPreconditionError("CaptureGradients() before Seal()");
    if (grads_.grads == nullptr) {
      return FailedPreconditionError("CaptureGradients() without RegisterGradients()");
    }
    if (step < 1) return InvalidArgumentError(fmt::format("CaptureGradients: step {} < 1", step));
    if (std::isinf(lr)) return InvalidArgumentError("CaptureGradients: lr is infinite");
    if (!aor_registered_) {
      Status st = RegisterAorWithAgent(Deadline::AfterSeconds(5));
      if (st.code() == StatusCode::kUnavailable) return Status::Ok();  // no plan yet
      MEMENTO_RETURN_IF_ERROR(st);
    }
    if (aor_.ranges.empty()) return Status::Ok();
    uint8_t* base = aor_stage_->data();
    // Double buffered (shm/aor_stage.h): the slot of `step` last held step
    // - 2, which the agent's AOR thread may still be reading; never
    // overwritten before it has.
    shm::AorStageSlot* slot = shm::StageSlot(base, shm::StageSlotOf(step));
    if (shm::StageBusy(shm::StageState(slot))) {
      Deadline wait = Deadline::AfterSeconds(kAorStageWaitS);
      while (shm::StageBusy(shm::StageState(slot))) {
        if (wait.expired()) {
          ++aor_busy_skips_;
          // An agent that no longer watches the file (restarted) gets a new
          // registration at the next capture.
          aor_registered_ = false;
          return UnavailableError(fmt::format(
              "AOR capture of step {} skipped ({} so far): the agent has not read step {} from "
              "the same stage slot after {} s; the replicas are seeded again from their owners' "
              "copies",
              step, aor_busy_skips_, slot->step, kAorStageWaitS));
        }
        usleep(100);
      }
    }
    float* d = shm::BeginStage(base, step);
    // One pass: each block is hashed right after it is copied, from cache;
    // one hash per slice (shm::StageDataChecksum).
    aor_slice_sums_.clear();
    auto copy = [this](float* to, const float* from, uint64_t count) {
      constexpr uint64_t kBlock = 16 * 1024;  // floats: 64 KiB
      aor_sum_.Reset();
      for (uint64_t off = 0; off < count; off += kBlock) {
        const uint64_t n = std::min(kBlock, count - off);
        std::memcpy(to + off, from + off, n * sizeof(float));
        aor_sum_.Update(to + off, n * sizeof(float));
      }
      aor_slice_sums_.push_back(aor_sum_.Digest());
    };
    for (const shm::AorRangeEntry& r : aor_.ranges) {
      copy(d, grads_.grads + r.offset, r.count);
      copy(d + r.count, params_ + r.offset, r.count);
      d += 2 * r.count;
    }
    shm::FinishStage(base, step, lr,
                     shm::StageDataChecksum(aor_slice_sums_.data(), aor_slice_sums_.size()));
    // No request: the file's watcher in the agent wakes up, queues the slot
    // and its AOR thread runs the host step while this trainer goes on.
    shm::RingStageDoorbell(base);
    return Status::Ok();
  }

  Status ReportShardChecksum(int64_t step, uint64_t checksum) override {
    if (!sealed_) return FailedPreconditionError("ReportShardChecksum() before Seal()");
    if (step < 1) {
      return InvalidArgumentError(fmt::format("ReportShardChecksum: step {} < 1", step));
    }
    if (aor_registered_ && aor_stage_ != nullptr) {
      // Into the staging file's ring, no request: the agent publishes it
      // (its watcher, or at the latest before its node reports the step).
      shm::WriteStageSum(aor_stage_->data(), step, checksum);
      shm::RingStageDoorbell(aor_stage_->data());
      return Status::Ok();
    }
    // No staging file (this rank feeds no replica): a request, which the
    // agent answers after publishing.
    return agent_
        .Call(shm::AorChecksumRequest(options_.rank, step, checksum), Deadline::AfterSeconds(10))
        .status();
  }

  Status Snapshot(int64_t step) override {
    if (!sealed_) return FailedPreconditionError("Snapshot() before Seal()");
    MEMENTO_RETURN_IF_ERROR(Fence(Deadline::Infinite()));
    if (step <= last_step_) {
      return InvalidArgumentError(fmt::format(
          "snapshot step {} is not newer than step {}, which rank {} already holds or restored",
          step, last_step_, options_.rank));
    }
    last_step_ = step;
    // Overwrite the slot that does not hold the newest complete version;
    // in cluster mode, the one that does not hold the newest committed one.
    int target = NewestSlot() == 0 ? 1 : 0;
    std::string held_by;
    const bool write = holds_.ChooseTarget(Slots(), &target, &held_by);
    const TimePoint now = Now();
    lag_seen_ = lag_.Observe(step, holds_.Committed(), now);
    if (!write) {
      SkipSnapshot(step, held_by);
      return Status::Ok();
    }
    lag_.Taken(step, now);
    if (!plan_settled_) AskPlan(step);
    const shm::Segment& seg = *segments_[target];
    shm::BeginSlotWrite(seg, layout_, target, step);
    holds_.Writing(step);
    uint8_t* data = shm::SlotData(seg);
    shm::ChunkEntry* table = shm::SlotTable(seg);
    std::vector<snap::CopyChunk> chunks;
    chunks.reserve(layout_.chunks.size());
    for (size_t i = 0; i < layout_.chunks.size(); ++i) {
      const shm::ChunkEntry& c = layout_.chunks[i];
      // Chunk c of entry e: bytes of its tensor from e's range offset on.
      const shm::SavedTensor& t = layout_.tensors[c.tensor_index];
      snap::CopyChunk cc;
      if (t.is_parity()) {
        // A parity entry: encoded from registered memory by the worker.
        cc.producer = parities_[entry_tensor_[c.tensor_index]].get();
        cc.producer_offset = c.offset - t.offset;
      } else {
        cc.src = static_cast<const uint8_t*>(tensors_[entry_tensor_[c.tensor_index]].data) +
                 t.range_offset + (c.offset - t.offset);
      }
      cc.dst = data + c.offset;
      cc.length = c.length;
      cc.checksum_out = &table[i].checksum;
      chunks.push_back(cc);
    }
    // "auto": HAS from the first snapshot after the trainer reported an
    // idle window (its phase hooks are wired); eager until then.
    if (has_ == nullptr && options_.schedule == Schedule::kAuto &&
        idle_reported_.load(std::memory_order_relaxed)) {
      MEMENTO_RETURN_IF_ERROR(StartHas());
      MEMENTO_LOG_INFO(
          "rank {}: the trainer reports idle phases; snapshots from step {} on use HAS",
          options_.rank, step);
    }
    client::SnapshotPath* path = eager_.get();
    if (has_ != nullptr && !chunks.empty()) {
      path = has_.get();
    } else if (device_path_ != nullptr) {
      path = device_path_.get();
    }
    MEMENTO_RETURN_IF_ERROR(path->Begin(std::move(chunks), target, step));
    in_flight_ = path;
    return Status::Ok();
  }

  Status Fence(Deadline deadline) override {
    if (in_flight_ == nullptr) return Status::Ok();
    SnapshotStats stats;
    Status st = in_flight_->Fence(deadline, &stats);
    if (in_flight_->InFlight()) return st;  // the deadline passed first
    in_flight_ = nullptr;
    stats.skipped_total = skipped_total_;
    SetLag(&stats);
    MutexLock l(&stats_mu_);
    snapshot_stats_ = stats;
    return st;
  }

  Result<int64_t> WaitForCommit(int64_t step, Deadline deadline) override {
    if (!sealed_) return FailedPreconditionError("WaitForCommit() before Seal()");
    if (!holds_.MapCommitWord()) {
      return FailedPreconditionError(
          fmt::format("WaitForCommit({}): not in cluster mode (no commit word in {}: the agent "
                      "runs without --store)",
                      step, holds_.dir()));
    }
    // The agent sees the step only once this rank's copy is complete.
    MEMENTO_RETURN_IF_ERROR(Fence(deadline));
    {
      MutexLock l(&stats_mu_);
      if (snapshot_stats_.step == step && snapshot_stats_.skipped) {
        return AbortedError(fmt::format("step {} cannot commit: rank {} skipped its snapshot of it",
                                        step, options_.rank));
      }
    }
    bool held = false;
    for (;;) {
      switch (holds_.PollCommit(step, &held)) {
        case client::HoldWords::CommitState::kCommitted:
          return holds_.Committed();
        case client::HoldWords::CommitState::kReleased:
          return AbortedError(fmt::format(
              "step {} cannot commit: the agent released it uncommitted (committed: {})", step,
              holds_.Committed()));
        case client::HoldWords::CommitState::kPending:
          break;
      }
      if (deadline.expired()) {
        return DeadlineExceededError(fmt::format(
            "step {} not committed by the deadline (committed: {}{})", step, holds_.Committed(),
            held ? "; the agent holds it" : "; the agent has not held it"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  Result<int64_t> Restore(Deadline deadline) override {
    if (!sealed_) return FailedPreconditionError("Restore() before Seal()");
    if (!holds_.MapCommitWord()) return RestoreVersion(std::nullopt, deadline);
    // Cluster mode: every rank must load the same step; the agent knows it.
    MEMENTO_ASSIGN_OR_RETURN(json reply,
                             agent_.Call(shm::TargetRequest(options_.rank),
                                         Earlier(deadline, Deadline::AfterSeconds(60))));
    MEMENTO_ASSIGN_OR_RETURN(shm::TargetReply target, shm::ParseTargetReply(reply));
    const int64_t step = target.step;
    if (step < 0) {
      // Nothing committed: the job starts over, and what these slots hold
      // belongs to an attempt the cluster abandoned. Snapshots from step 1
      // on must not be refused as older than those uncommitted steps (they
      // are overwritten like any version that is not the committed one).
      last_step_ = -1;
      return NotFoundError(fmt::format(
          "no committed version of job {} yet (rank {}; the agent at {} has none in its commit "
          "log and no restore target)",
          options_.job_id, options_.rank, agent_.dir()));
    }
    MEMENTO_LOG_INFO("restore: the agent's target is step {}", step);
    return RestoreVersion(step, deadline);
  }

  Result<int64_t> Restore(int64_t step, Deadline deadline) override {
    if (step < 0) return InvalidArgumentError(fmt::format("Restore({}): step < 0", step));
    return RestoreVersion(step, deadline);
  }

  Result<std::vector<VersionInfo>> ListVersions(Deadline deadline) override {
    MEMENTO_ASSIGN_OR_RETURN(json reply, agent_.Call(shm::ListRequest(options_.rank), deadline));
    MEMENTO_ASSIGN_OR_RETURN(shm::ListReply list, shm::ParseListReply(reply));
    std::vector<VersionInfo> out;
    for (const shm::VersionEntry& v : list.versions) {
      VersionInfo vi;
      vi.step = v.step;
      vi.intact = v.intact;
      vi.bytes = v.bytes;
      out.push_back(vi);
    }
    return out;
  }

  void OnPhase(Phase phase) override {
    phase_.store(phase, std::memory_order_relaxed);
    if (phase == Phase::kIdle) idle_reported_.store(true, std::memory_order_relaxed);
    if (client::HasPath* h = has_ptr_.load(std::memory_order_acquire)) h->OnPhase(phase);
  }

  SnapshotStats LastSnapshotStats() const override {
    MutexLock l(&stats_mu_);
    return snapshot_stats_;
  }
  RestoreStats LastRestoreStats() const override {
    MutexLock l(&stats_mu_);
    return restore_stats_;
  }

 private:
  shm::RankSlots Slots() const {
    shm::RankSlots slots{};
    for (int s = 0; s < shm::kSlotsPerRank; ++s) slots[s] = slots_[s];
    return slots;
  }

  static Deadline Earlier(Deadline a, Deadline b) { return a.when() < b.when() ? a : b; }

  // The newest intact version, or exactly `only` (no fallback) when given.
  Result<int64_t> RestoreVersion(std::optional<int64_t> only, Deadline deadline) {
    if (!sealed_) return FailedPreconditionError("Restore() before Seal()");
    MEMENTO_RETURN_IF_ERROR(Fence(deadline));
    client::RestoreContext ctx;
    ctx.options = &options_;
    ctx.tensors = &tensors_;
    ctx.slots = Slots();
    ctx.prefaults = &prefaults_;
    ctx.engine = engine_.get();
    ctx.help_engine = idle_priority_;
    ctx.device = device_.get();
    ctx.agent = &agent_;
    std::optional<RestoreStats> stats;
    Result<client::RestoredVersion> r = client::RestoreVersion(ctx, only, &stats);
    if (r.ok()) {
      last_step_ = r->step;
      SetNewestSlot(r->slot);
      // The topology may have changed (a recovery, a replaced node): ask
      // for the plan's ranges again at the next snapshot.
      plan_settled_ = false;
      // ... and for the AOR ranges this rank feeds.
      aor_registered_ = false;
    }
    if (stats.has_value()) {
      MutexLock l(&stats_mu_);
      restore_stats_ = std::move(*stats);
    }
    if (!r.ok()) return r.status();
    return r->step;
  }

  void UseWholeLayout() {
    layout_ = whole_layout_;
    parities_.clear();
    entry_tensor_.resize(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) entry_tensor_[i] = i;
  }

  // aor_register: the ranges this rank feeds and the staging file.
  Status RegisterAorWithAgent(Deadline deadline) {
    MEMENTO_ASSIGN_OR_RETURN(
        json reply,
        agent_.Call(shm::AorRegisterRequest(options_.rank, grads_.optimizer_encoding, grads_.numel),
                    deadline));
    MEMENTO_ASSIGN_OR_RETURN(shm::AorRegisterReply r, shm::ParseAorRegisterReply(reply));
    uint64_t total = 0;
    for (const shm::AorRangeEntry& e : r.ranges) {
      if (e.offset > grads_.numel || e.count > grads_.numel - e.offset) {
        return InvalidArgumentError(
            fmt::format("the agent's AOR range of rank {} [{}, +{}) lies outside the {} gradients",
                        e.owner, e.offset, e.count, grads_.numel));
      }
      total += e.count;
    }
    aor_stage_.reset();  // an earlier registration's
    if (!r.ranges.empty()) {
      MEMENTO_ASSIGN_OR_RETURN(aor_stage_, shm::Segment::Open(r.path, /*writable=*/true));
      const uint64_t need = shm::StageFileBytes(total);
      const auto* h = shm::StageHeader(aor_stage_->data());
      if (aor_stage_->size() < need ||
          std::memcmp(h->magic, shm::kAorStageMagic, sizeof(h->magic)) != 0 ||
          h->total_count != total || h->slots != shm::kAorStageSlots) {
        aor_stage_.reset();
        return InternalError(
            fmt::format("AOR staging file {} does not match the agent's ranges", r.path));
      }
      MEMENTO_LOG_INFO("rank {}: feeds {} AOR replica(s), {} gradients per step", options_.rank,
                       r.ranges.size(), total);
    }
    aor_ = std::move(r);
    aor_registered_ = true;
    return Status::Ok();
  }

  // Sharded snapshots (docs/reft.md section 1): asks the agent which byte
  // ranges this rank's slot holds and lays the slot out as those ranges.
  // Training thread, before a snapshot's BeginSlotWrite. Until the agent
  // has a plan ("not ready", Unavailable) the snapshot writes whole tensors
  // and the next one asks again; any other answer settles the layout until
  // the next Restore(). A whole-tensor slot is always valid (it holds every
  // range), so every failure here falls back to it. `step` is the snapshot
  // laid out with the answer: from it on the slots hold the parity entries
  // the answer lists, which the agent then references instead of copying.
  void AskPlan(int64_t step) {
    if (!options_.sharded_snapshots || device_ != nullptr) {
      plan_settled_ = true;  // device tensors: whole slots (device path)
      return;
    }
    auto fall_back = [&](const std::string& why) {
      MEMENTO_LOG_WARN("rank {}: whole-tensor snapshots: {}", options_.rank, why);
      UseWholeLayout();
      plan_settled_ = true;
    };
    auto reply = agent_.Call(shm::PlanRequest(options_.rank, client_parity_, step),
                             Deadline::AfterSeconds(5), /*reconnect_s=*/0);
    if (!reply.ok()) {
      // "not ready" (or the agent is away): whole tensors this time.
      if (reply.status().code() == StatusCode::kUnavailable) return;
      return fall_back("the agent's plan op: " + reply.status().ToString());
    }
    auto plan = shm::ParsePlanReply(*reply);
    if (!plan.ok()) return fall_back(plan.status().ToString());
    plan_settled_ = true;
    if (!plan->sharded) return UseWholeLayout();
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < tensors_.size(); ++i) index.emplace(tensors_[i].meta.name, i);
    std::vector<shm::SlotEntrySpec> specs;
    std::vector<size_t> entry_tensor;
    for (const shm::SaveRange& r : plan->ranges) {
      auto it = index.find(r.tensor);
      if (it == index.end()) {
        return fall_back(fmt::format("plan {} names tensor '{}', which this rank does not register",
                                     plan->plan_hash, r.tensor));
      }
      const TensorMeta& meta = tensors_[it->second].meta;
      specs.push_back(
          shm::SlotEntrySpec{meta, r.offset, r.length == 0 ? shm::kWholeTensor : r.length});
      entry_tensor.push_back(it->second);
    }
    // The parities this rank produces, computed by the copy workers from
    // registered memory (docs/reft.md section 4): one entry each.
    std::vector<std::unique_ptr<client::ParityProducer>> parities;
    auto resolve = [&](const shm::SaveRange& r) -> Result<const uint8_t*> {
      auto it = index.find(r.tensor);
      if (it == index.end()) {
        return InvalidArgumentError(
            fmt::format("tensor '{}' is not registered by this rank", r.tensor));
      }
      const RegisteredTensor& t = tensors_[it->second];
      const uint64_t size = t.meta.nbytes();
      if (r.offset > size || r.length > size - r.offset) {
        return InvalidArgumentError(fmt::format("bytes [{}, +{}) of tensor '{}' ({} bytes)",
                                                r.offset, r.length, r.tensor, size));
      }
      return static_cast<const uint8_t*>(t.data) + r.offset;
    };
    for (const shm::PlanParity& p : plan->parities) {
      auto producer = client::ParityProducer::Create(p, resolve);
      if (!producer.ok()) {
        return fall_back("plan " + plan->plan_hash + ": " + producer.status().ToString());
      }
      shm::SlotEntrySpec spec;
      spec.meta = shm::ParityEntryMeta(p.id, p.block_bytes);
      spec.parity = p.id;
      specs.push_back(std::move(spec));
      entry_tensor.push_back(parities.size());
      parities.push_back(std::move(*producer));
    }
    auto layout =
        shm::ComputeRangeSlotLayout(options_.job_id, options_.rank, specs, options_.chunk_bytes);
    if (!layout.ok())
      return fall_back("plan " + plan->plan_hash + ": " + layout.status().ToString());
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      if (segments_[s]->size() < layout->total_bytes) {
        return fall_back(fmt::format("the sharded layout needs {} bytes, the slot has {}",
                                     layout->total_bytes, segments_[s]->size()));
      }
    }
    MEMENTO_LOG_INFO(
        "rank {}: sharded snapshots under plan {}: {} of {} bytes in {} ranges, {} of them "
        "parities its copy workers compute",
        options_.rank, plan->plan_hash, layout->data_bytes, whole_layout_.data_bytes, specs.size(),
        parities.size());
    layout_ = std::move(*layout);
    entry_tensor_ = std::move(entry_tensor);
    parities_ = std::move(parities);
  }

  // Creates the HAS path (schedule "has" at Seal(); "auto" at the first
  // snapshot after an idle phase was reported). Trainer thread only.
  Status StartHas() {
    MEMENTO_ASSIGN_OR_RETURN(
        has_, client::HasPath::Create(options_, phase_.load(std::memory_order_relaxed),
                                      has_chunk_delay_us_, device_.get(), Sink()));
    has_ptr_.store(has_.get(), std::memory_order_release);
    return Status::Ok();
  }

  // The commit lag Snapshot() observed, into its statistics.
  void SetLag(SnapshotStats* stats) const {
    stats->committed = lag_seen_.behind_steps >= 0 ? stats->step - lag_seen_.behind_steps : -1;
    stats->commit_lag_steps = lag_seen_.lag_steps;
    stats->commit_lag_s = lag_seen_.lag_s;
  }

  // The target slot holds a version the agent protects (hold_words.h).
  void SkipSnapshot(int64_t step, const std::string& held_by) {
    ++skipped_total_;
    MEMENTO_LOG_DEBUG("snapshot {} skipped: {}", step, held_by);
    SnapshotStats stats;
    stats.step = step;
    stats.skipped = true;
    stats.skipped_total = skipped_total_;
    SetLag(&stats);
    {
      MutexLock l(&stats_mu_);
      snapshot_stats_ = stats;
    }
    if (!holds_.cluster()) return;
    // Tell the agent at once: the other nodes stop protecting `step`, which
    // cannot commit without this node (docs/cluster_save.md, "Skips").
    auto reply = agent_.Call(shm::SkippedRequest(options_.rank, step), Deadline::AfterSeconds(2),
                             /*reconnect_s=*/0);
    if (!reply.ok()) {
      MEMENTO_LOG_WARN("snapshot {} skipped; the agent was not told: {}", step,
                       reply.status().ToString());
    }
  }

  // client::SlotSink, on whichever thread finished the copy.
  client::SlotSink* Sink() { return this; }
  void PrefaultSlot(int slot) override { prefaults_.slot(slot).HelpAndWait(); }

  // The version is safe whether or not the agent hears of it (a restarted
  // agent adopts it from the header), so failures here only log.
  void CompleteSlot(int slot, int64_t step) override {
    shm::CompleteSlotWrite(*segments_[slot]);  // node-local complete, last
    SetNewestSlot(slot);
    // One reconnect attempt at most: the trainer must not wait on a dead agent.
    auto reply = agent_.Call(shm::CompleteRequest(options_.rank, slot, step),
                             Deadline::AfterSeconds(10), /*reconnect_s=*/0);
    if (!reply.ok()) {
      MEMENTO_LOG_WARN("step {} is complete in shared memory but the agent was not told: {}", step,
                       reply.status().ToString());
    }
  }

  int NewestSlot() EXCLUDES(slot_mu_) {
    MutexLock l(&slot_mu_);
    return newest_slot_;
  }
  void SetNewestSlot(int s) EXCLUDES(slot_mu_) {
    MutexLock l(&slot_mu_);
    newest_slot_ = s;
  }

  const ClientOptions options_;
  client::AgentChannel agent_;
  client::HoldWords holds_;
  const bool idle_priority_;  // copy_priority "idle"
  std::vector<RegisteredTensor> tensors_;
  bool sealed_ = false;
  shm::SlotLayout layout_;            // what the next snapshot writes (whole or ranges)
  shm::SlotLayout whole_layout_;      // every registered tensor whole (Seal's)
  std::vector<size_t> entry_tensor_;  // layout_ entry -> index into tensors_ (or parities_)
  // The parity entries' producers (sharded layout only); replaced only
  // between snapshots (AskPlan runs after the fence).
  std::vector<std::unique_ptr<client::ParityProducer>> parities_;
  // Ask the agent for the parities this rank produces and compute them in
  // the copy workers (ClientOptions::client_parity; the environment's
  // MEMENTO_PARITY_IN=agent turns it off in Connect, for measurements).
  bool client_parity_ = true;
  bool plan_settled_ = false;  // AskPlan has an answer (until a Restore)
  // AOR (RegisterGradients): the buffer, the params tensor's data, the
  // agent's ranges and the staging file once registered with the agent.
  GradientRegistration grads_;
  const float* params_ = nullptr;
  bool aor_registered_ = false;
  shm::AorRegisterReply aor_;
  std::unique_ptr<shm::Segment> aor_stage_;
  StreamingChecksum aor_sum_;             // of the slice a capture stages
  std::vector<uint64_t> aor_slice_sums_;  // its slices' hashes (capacity kept)
  // How long a capture waits for the agent to have read the slot it reuses
  // (two steps back) before it skips the step.
  static constexpr double kAorStageWaitS = 2.0;
  int64_t aor_busy_skips_ = 0;
  std::unique_ptr<shm::Segment> segments_[shm::kSlotsPerRank];
  const shm::Segment* slots_[shm::kSlotsPerRank] = {};
  client::SlotPrefaults prefaults_;
  int64_t last_step_ = -1;
  uint64_t skipped_total_ = 0;
  client::CommitLagTracker lag_;                    // cluster mode
  client::CommitLagTracker::Observation lag_seen_;  // by the newest Snapshot()
  std::atomic<Phase> phase_{Phase::kCompute};
  std::atomic<bool> idle_reported_{false};  // an OnPhase(kIdle) was seen ("auto")

  // The snapshot paths. The copy engine also serves Restore(); the device
  // copier (null without device tensors) serves the HAS and device paths
  // and Restore().
  std::unique_ptr<snap::CopyEngine> engine_;
  std::unique_ptr<client::DeviceCopier> device_;
  std::unique_ptr<client::EagerPath> eager_;
  std::unique_ptr<client::SnapshotPath> device_path_;
  std::unique_ptr<client::HasPath> has_;
  std::atomic<client::HasPath*> has_ptr_{nullptr};  // for OnPhase from any thread
  int has_chunk_delay_us_ = 0;
  client::SnapshotPath* in_flight_ = nullptr;  // the path of the unfenced snapshot

  Mutex slot_mu_;
  int newest_slot_ GUARDED_BY(slot_mu_) = -1;
  mutable Mutex stats_mu_;
  SnapshotStats snapshot_stats_ GUARDED_BY(stats_mu_);
  RestoreStats restore_stats_ GUARDED_BY(stats_mu_);
};

}  // namespace
Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  MEMENTO_RETURN_IF_ERROR(client::ValidateClientOptions(options));
  MEMENTO_ASSIGN_OR_RETURN(client::ResolvedClientOptions resolved,
                           client::ResolveClientOptions(options));
  auto client = std::make_unique<ClientImpl>(std::move(resolved.options), resolved.agent_dir);
  MEMENTO_RETURN_IF_ERROR(client->ConnectNow(Deadline::AfterSeconds(options.connect_timeout_s)));
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace memento
