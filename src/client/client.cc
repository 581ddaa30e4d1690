// The trainer-side library behind include/memento/client.h (design:
// docs/node_store.md, threads: docs/thread_model.md).
//
// The client maps its rank's two slots (allocated and pre-faulted by the
// agent) and copies registered memory straight into them: no byte of state
// crosses the socket. The socket carries only small control messages.
#include "memento/client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>

#include "common/clock.h"
#include "common/log.h"
#include "fmt/format.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/slot.h"
#include "snap/copy_engine.h"
#include "snap/copy_kernel.h"
#include "snap/has/has_runner.h"

namespace memento {
namespace {

using nlohmann::json;

struct Registered {
  TensorMeta meta;
  void* data = nullptr;
  Device device;
};

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(ClientOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}
  ~ClientImpl() override {
    if (job_ != nullptr) job_->Wait().IgnoreError();
    if (has_active_) runner_->Fence().status().IgnoreError();
    runner_ptr_.store(nullptr, std::memory_order_release);
    runner_.reset();
    engine_.reset();
    MutexLock l(&conn_mu_);
    if (fd_ >= 0) close(fd_);
  }

  Status ConnectNow(Deadline deadline) {
    MutexLock l(&conn_mu_);
    return ConnectLocked(deadline);
  }

  Status RegisterTensor(const TensorMeta& meta, void* data, Device device) override {
    if (sealed_) return FailedPreconditionError("RegisterTensor('" + meta.name + "') after Seal()");
    if (!device.is_host()) {
      return FailedPreconditionError(fmt::format(
          "tensor '{}' lives on {}: device tensors need the CUDA copy engine, not built in this "
          "slice",
          meta.name, DeviceName(device)));
    }
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
    for (const Registered& r : tensors_) {
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

  Status Seal() override {
    if (sealed_) return FailedPreconditionError("Seal() called twice");
    std::vector<TensorMeta> metas;
    for (const Registered& r : tensors_) metas.push_back(r.meta);
    MEMENTO_ASSIGN_OR_RETURN(layout_, shm::ComputeSlotLayout(options_.job_id, options_.rank, metas,
                                                             options_.chunk_bytes));
    // The manifest lets an agent in cluster mode publish this rank's
    // inventory (docs/cluster.md); a single-node agent ignores it.
    json req = {{"op", "seal"},
                {"rank", options_.rank},
                {"bytes", layout_.total_bytes},
                {"manifest", layout_.manifest}};
    MEMENTO_ASSIGN_OR_RETURN(json reply, Call(req, Deadline::AfterSeconds(600)));
    std::vector<std::string> paths;
    try {
      paths = reply.at("paths").get<std::vector<std::string>>();
    } catch (const std::exception& e) {
      return DataLossError(std::string("malformed seal reply: ") + e.what());
    }
    if (paths.size() != shm::kSlotsPerRank) {
      return DataLossError(fmt::format("seal reply has {} slots", paths.size()));
    }
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      MEMENTO_ASSIGN_OR_RETURN(segments_[s],
                               shm::Segment::Open(paths[s], /*writable=*/true, /*prefault=*/true));
      if (segments_[s]->size() < layout_.total_bytes) {
        return InternalError(fmt::format("slot {} is {} bytes, {} needed", paths[s],
                                         segments_[s]->size(), layout_.total_bytes));
      }
    }
    // The newest version held decides which slot the next snapshot overwrites.
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      auto info = shm::ReadSlot(*segments_[s]);
      if (info.ok() && info->state == shm::SlotState::kComplete && info->step > last_step_) {
        last_step_ = info->step;
        SetNewestSlot(s);
      }
    }
    snap::CopyEngine::Options eo;
    eo.threads = std::max(1, options_.copy_threads);
    eo.name = "mem-copy";
    if (const char* d = std::getenv("MEMENTO_TEST_COPY_DELAY_US")) eo.chunk_delay_us = std::atoi(d);
    engine_ = std::make_unique<snap::CopyEngine>(eo);
    has_chunk_delay_us_ = eo.chunk_delay_us;
    if (options_.schedule == "has") {
      has::HasRunnerOptions ro;
      ro.threads = eo.threads;
      ro.has.separate_comm_link = options_.has_separate_comm_link;
      ro.has.compute_max_rate = options_.has_compute_max_rate;
      ro.has.schedule.num_stages = options_.pipeline_stages;
      ro.has.schedule.stage = options_.pipeline_stage;
      ro.has.schedule.num_microbatches = options_.pipeline_microbatches;
      ro.has.schedule.fwd_s = options_.pipeline_fwd_s;
      ro.has.schedule.bwd_s = options_.pipeline_bwd_s;
      MEMENTO_ASSIGN_OR_RETURN(
          runner_, has::HasRunner::Create(ro, [this](size_t i) { return HasCopyChunk(i); }));
      // Phases reported before Seal() carry over.
      runner_->OnPhase(phase_.load(std::memory_order_relaxed));
      runner_ptr_.store(runner_.get(), std::memory_order_release);
    }
    MapCommitWord();
    sealed_ = true;
    return Status::Ok();
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
    // Either way, never the slot the agent's durable stream holds.
    if (MapCommitWord()) {
      if (!HeldTarget(commit_word_, /*cluster=*/true, step, &target)) return Status::Ok();
    } else if (MapDurableWord()) {
      if (!HeldTarget(durable_word_, /*cluster=*/false, step, &target)) return Status::Ok();
    }
    const shm::Segment& seg = *segments_[target];
    shm::BeginSlotWrite(seg, layout_, target, step);
    uint8_t* data = shm::SlotData(seg);
    shm::ChunkEntry* table = shm::SlotTable(seg);
    std::vector<snap::CopyChunk> chunks;
    chunks.reserve(layout_.chunks.size());
    for (size_t i = 0; i < layout_.chunks.size(); ++i) {
      const shm::ChunkEntry& c = layout_.chunks[i];
      const shm::SavedTensor& t = layout_.tensors[c.tensor_index];
      snap::CopyChunk cc;
      cc.src = static_cast<const uint8_t*>(tensors_[c.tensor_index].data) + (c.offset - t.offset);
      cc.dst = data + c.offset;
      cc.length = c.length;
      cc.checksum_out = &table[i].checksum;
      chunks.push_back(cc);
    }
    fence_waited_ = false;
    if (runner_ != nullptr && !chunks.empty())
      return BeginHasSnapshot(std::move(chunks), target, step);
    job_ = engine_->Submit(std::move(chunks), nullptr,
                           [this, target, step, &seg](const Status& copied) -> Status {
                             if (!copied.ok()) return copied;
                             shm::CompleteSlotWrite(seg);  // node-local complete, last
                             SetNewestSlot(target);
                             NotifyComplete(target, step);
                             return Status::Ok();
                           });
    job_step_ = step;
    return Status::Ok();
  }

  Status Fence(Deadline deadline) override {
    if (has_active_) return FenceHas(deadline);
    if (job_ == nullptr) return Status::Ok();
    Stopwatch sw;
    bool was_done = job_->done();
    Status st = job_->Wait(deadline);
    if (st.code() == StatusCode::kDeadlineExceeded && !job_->done()) return st;
    SnapshotStats stats;
    stats.step = job_step_;
    stats.bytes = job_->bytes();
    stats.copy_s = job_->copy_seconds();
    stats.fence_wait_s = was_done ? 0 : sw.Seconds();
    stats.bytes_compute = stats.bytes;
    stats.skipped_total = skipped_total_;
    {
      MutexLock l(&stats_mu_);
      snapshot_stats_ = stats;
    }
    job_.reset();
    return st;
  }

  Result<int64_t> Restore() override {
    if (!sealed_) return FailedPreconditionError("Restore() before Seal()");
    if (!MapCommitWord()) return RestoreVersion(std::nullopt);
    // Cluster mode: every rank must load the same step; the agent knows it.
    json req = {{"op", "target"}, {"rank", options_.rank}};
    MEMENTO_ASSIGN_OR_RETURN(json reply, Call(req, Deadline::AfterSeconds(60)));
    int64_t step = -1;
    try {
      step = reply.at("step").get<int64_t>();
    } catch (const std::exception& e) {
      return DataLossError(std::string("malformed target reply: ") + e.what());
    }
    if (step < 0) {
      return NotFoundError(fmt::format(
          "no committed version of job {} yet (rank {}; the agent at {} has none in its commit "
          "log and no restore target)",
          options_.job_id, options_.rank, dir_));
    }
    MEMENTO_LOG_INFO("restore: the agent's target is step {}", step);
    return RestoreVersion(step);
  }

  Result<int64_t> Restore(int64_t step) override {
    if (step < 0) return InvalidArgumentError(fmt::format("Restore({}): step < 0", step));
    return RestoreVersion(step);
  }

  // The newest intact version, or exactly `only` (no fallback) when given.
  Result<int64_t> RestoreVersion(std::optional<int64_t> only) {
    if (!sealed_) return FailedPreconditionError("Restore() before Seal()");
    MEMENTO_RETURN_IF_ERROR(Fence(Deadline::Infinite()));
    Stopwatch sw;
    RestoreStats stats;
    struct Candidate {
      int slot;
      shm::SlotInfo info;
    };
    std::vector<Candidate> candidates;
    std::vector<int64_t> held;  // complete versions other than `only`
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      auto info = shm::ReadSlot(*segments_[s]);
      if (!info.ok()) {
        stats.skipped.push_back(info.status().ToString());
        continue;
      }
      if (info->state == shm::SlotState::kComplete) {
        if (only.has_value() && info->step != *only) {
          held.push_back(info->step);
          continue;
        }
        candidates.push_back({s, std::move(*info)});
      } else if (info->state == shm::SlotState::kWriting) {
        MEMENTO_LOG_INFO("restore: slot {} holds a torn write of step {}; ignored", s, info->step);
      }
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.info.step > b.info.step; });
    std::vector<TensorMeta> metas;
    std::map<std::string, const Registered*> by_name;
    for (const Registered& r : tensors_) {
      metas.push_back(r.meta);
      by_name[r.meta.name] = &r;
    }
    for (const Candidate& c : candidates) {
      std::vector<std::string> diffs = shm::DiffTensors(c.info.tensors, metas);
      if (!diffs.empty()) {
        std::string msg = fmt::format(
            "cannot restore step {} of rank {}: the saved tensors differ from the registered "
            "ones ({} difference{}); nothing was written:",
            c.info.step, options_.rank, diffs.size(), diffs.size() == 1 ? "" : "s");
        for (const auto& d : diffs) msg += "\n  - " + d;
        return InvalidArgumentError(msg);
      }
      const shm::Segment& seg = *segments_[c.slot];
      const uint8_t* data = seg.data() + c.info.data_offset;
      std::vector<snap::CopyChunk> chunks;
      for (const shm::ChunkEntry& e : c.info.chunks) {
        const shm::SavedTensor& t = c.info.tensors[e.tensor_index];
        snap::CopyChunk cc;
        cc.src = data + e.offset;
        cc.dst = static_cast<uint8_t*>(by_name[t.meta.name]->data) + (e.offset - t.offset);
        cc.length = e.length;
        cc.verify = true;
        cc.expected_checksum = e.checksum;
        cc.label = t.meta.name.c_str();
        chunks.push_back(cc);
      }
      auto job = engine_->Submit(std::move(chunks), nullptr, [](const Status& s) { return s; });
      Status st = job->Wait();
      if (st.ok()) {
        last_step_ = c.info.step;
        SetNewestSlot(c.slot);
        stats.step = c.info.step;
        stats.bytes = job->bytes();
        stats.restore_s = sw.Seconds();
        for (const auto& s : stats.skipped) MEMENTO_LOG_WARN("restore skipped {}", s);
        MEMENTO_LOG_INFO("restored step {} ({} bytes) in {:.3f} s", stats.step, stats.bytes,
                         stats.restore_s);
        MutexLock l(&stats_mu_);
        restore_stats_ = stats;
        return c.info.step;
      }
      std::string line = fmt::format("step {} (slot {}): {}", c.info.step, c.slot, st.ToString());
      MEMENTO_LOG_ERROR("restore: {}{}", line, only.has_value() ? "" : "; trying an older version");
      stats.skipped.push_back(line);
      // Corruption at rest: have the agent re-check, so its inventory agrees.
      json req = {{"op", "verify"}, {"rank", options_.rank}, {"slot", c.slot}};
      Call(req, Deadline::AfterSeconds(60), /*reconnect_s=*/0).status().IgnoreError();
    }
    stats.restore_s = sw.Seconds();
    {
      MutexLock l(&stats_mu_);
      restore_stats_ = stats;
    }
    if (only.has_value() && candidates.empty()) {
      std::string list;
      for (int64_t h : held) list += (list.empty() ? "" : ", ") + std::to_string(h);
      std::string msg = fmt::format(
          "rank {} of job {} holds no complete version of step {} (complete versions: [{}])",
          options_.rank, options_.job_id, *only, list);
      for (const auto& s : stats.skipped) msg += "\n  - unreadable: " + s;
      return NotFoundError(msg);
    }
    if (!stats.skipped.empty()) {
      std::string msg = fmt::format(
          "no intact version of rank {} of job {} is left:", options_.rank, options_.job_id);
      for (const auto& s : stats.skipped) msg += "\n  - " + s;
      return DataLossError(msg);
    }
    return NotFoundError(fmt::format("no saved version of rank {} of job {} in {}", options_.rank,
                                     options_.job_id, dir_));
  }

  Result<std::vector<VersionInfo>> ListVersions() override {
    json req = {{"op", "list"}, {"rank", options_.rank}};
    MEMENTO_ASSIGN_OR_RETURN(json reply, Call(req, Deadline::AfterSeconds(600)));
    std::vector<VersionInfo> out;
    try {
      for (const auto& v : reply.at("versions")) {
        VersionInfo vi;
        vi.step = v.at("step").get<int64_t>();
        vi.committed = v.at("intact").get<bool>();
        vi.bytes = v.at("bytes").get<uint64_t>();
        out.push_back(vi);
      }
    } catch (const std::exception& e) {
      return DataLossError(std::string("malformed list reply: ") + e.what());
    }
    return out;
  }

  void OnPhase(Phase phase) override {
    phase_.store(phase, std::memory_order_relaxed);
    if (has::HasRunner* r = runner_ptr_.load(std::memory_order_acquire)) r->OnPhase(phase);
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
  // HAS (schedule "has"): the chunk list goes to the HasRunner, whose workers
  // call HasCopyChunk(i) when the scheduler releases chunk i. The worker that
  // finishes the last chunk marks the slot complete, exactly as the eager
  // engine's on_done does: every chunk's bytes and checksum are written
  // before the header's kComplete (release), whenever the copy ends.
  Status BeginHasSnapshot(std::vector<snap::CopyChunk> chunks, int target, int64_t step) {
    std::vector<uint64_t> sizes;
    sizes.reserve(chunks.size());
    for (const snap::CopyChunk& c : chunks) sizes.push_back(c.length);
    has_chunks_ = std::move(chunks);
    has_remaining_.store(has_chunks_.size(), std::memory_order_relaxed);
    has_target_ = target;
    has_step_ = step;
    job_step_ = step;
    // Begin() takes the runner's lock: the workers see the chunk list above.
    MEMENTO_RETURN_IF_ERROR(runner_->Begin(step, std::move(sizes)));
    has_active_ = true;
    return Status::Ok();
  }

  // Runs on a HAS worker, without the runner's lock.
  Status HasCopyChunk(size_t index) {
    const snap::CopyChunk& c = has_chunks_[index];
    uint64_t sum = snap::CopyAndChecksumStreaming(c.dst, c.src, c.length);
    *c.checksum_out = sum;
    if (has_chunk_delay_us_ > 0) usleep(static_cast<useconds_t>(has_chunk_delay_us_));
    // acq_rel: the last worker sees every other chunk's writes before it
    // publishes the slot.
    if (has_remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      shm::CompleteSlotWrite(*segments_[has_target_]);  // node-local complete, last
      SetNewestSlot(has_target_);
      NotifyComplete(has_target_, has_step_);
    }
    return Status::Ok();
  }

  Status FenceHas(Deadline deadline) {
    Result<has::HasStepStats> r = runner_->Fence(deadline);
    if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded) return r.status();
    has_active_ = false;
    SnapshotStats stats;
    stats.step = has_step_;
    stats.skipped_total = skipped_total_;
    if (r.ok()) {
      has::FillSnapshotStats(*r, &stats);
      MEMENTO_LOG_DEBUG(
          "snapshot {} (HAS): {} bytes, idle {} compute {} communicate {} fence {}, fence wait "
          "{:.4f} s{}",
          stats.step, r->bytes, r->bytes_idle, r->bytes_compute, r->bytes_communicate,
          r->bytes_fence, r->fence_wait_s, r->replanned ? ", replanned: " + r->plan_reason : "");
    }
    {
      MutexLock l(&stats_mu_);
      snapshot_stats_ = stats;
    }
    return r.status();
  }

  // Cluster mode: maps <dir>/commit.word once it exists (the agent creates
  // it when it runs with --store). Returns whether the client is in cluster
  // mode.
  bool MapCommitWord() {
    if (commit_word_ != nullptr) return true;
    std::string path = shm::CommitWordPath(dir_);
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(shm::CommitWord))
      return false;
    auto seg = shm::Segment::Open(path, /*writable=*/true);
    if (!seg.ok()) {
      MEMENTO_LOG_WARN("cannot map the commit word {}: {}", path, seg.status().ToString());
      return false;
    }
    auto* w = reinterpret_cast<shm::CommitWord*>((*seg)->data());
    if (!shm::CommitWordValid(w)) return false;
    commit_word_seg_ = std::move(*seg);
    commit_word_ = w;
    MEMENTO_LOG_INFO("cluster mode: following the agent's commit word {} (committed step {})", path,
                     shm::LoadWord(&w->committed));
    return true;
  }

  // Single-node mode with a durable tier: maps <dir>/durable.word once it
  // exists (the agent creates it when it runs with --durable-dir and no
  // --store). Returns whether the durable hold applies.
  bool MapDurableWord() {
    if (durable_word_ != nullptr) return true;
    std::string path = shm::DurableWordPath(dir_);
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(shm::CommitWord))
      return false;
    auto seg = shm::Segment::Open(path, /*writable=*/true);
    if (!seg.ok()) {
      MEMENTO_LOG_WARN("cannot map the durable hold word {}: {}", path, seg.status().ToString());
      return false;
    }
    auto* w = reinterpret_cast<shm::CommitWord*>((*seg)->data());
    if (!shm::CommitWordValid(w)) return false;
    durable_word_seg_ = std::move(*seg);
    durable_word_ = w;
    MEMENTO_LOG_INFO("following the agent's durable hold word {}", path);
    return true;
  }

  // The complete step a slot holds, -1 when it holds none. Only this rank
  // writes its slots (the agent writes them only while the trainers are
  // stopped, in recovery), so reading the header directly is safe here.
  int64_t SlotStep(int s) const {
    const auto* h = reinterpret_cast<const shm::SlotHeader*>(segments_[s]->data());
    if (shm::LoadState(h) != shm::SlotState::kComplete) return -1;
    return h->step;
  }

  // Target choice for Snapshot(step) when the agent publishes a hold word
  // (`w`: the commit word in cluster mode, docs/cluster.md save path 5; the
  // durable word in single-node mode, docs/durable_tier.md "The durable
  // hold"). In cluster mode *target becomes the slot that does not hold the
  // newest committed version; otherwise *target (the single-node choice) is
  // kept. Returns false when the snapshot must be skipped: the target slot
  // holds a version the agent protects, for T1 (`hold`, a newer version than
  // the committed one) or for the durable tier (`durable_hold`, until its
  // deadline). The claim handshake with the agent (shm/commit_word.h) makes
  // "the agent keeps that version" and "this client overwrites it" exclusive.
  bool HeldTarget(shm::CommitWord* w, bool cluster, int64_t step, int* target) {
    const int64_t committed = cluster ? shm::LoadWord(&w->committed) : -1;
    for (int s = 0; cluster && s < shm::kSlotsPerRank; ++s) {
      if (committed >= 0 && SlotStep(s) == committed) *target = s == 0 ? 1 : 0;
    }
    const int64_t victim = SlotStep(*target);
    if (victim < 0) return true;
    const bool can_claim = options_.rank < shm::kCommitWordMaxRanks;
    if (can_claim) {
      shm::StoreWord(&w->claim[options_.rank], victim);
      shm::FullFence();
    }
    const bool t1_held = cluster && victim > committed && shm::LoadWord(&w->hold) == victim;
    const bool durable_held = !t1_held && shm::LoadDurableHold(w, shm::MonotonicNanos()) == victim;
    if (!t1_held && !durable_held) return true;  // the agent will see the claim if it comes to it
    if (can_claim) shm::StoreWord(&w->claim[options_.rank], -1);
    ++skipped_total_;
    MEMENTO_LOG_DEBUG("snapshot {} skipped: slot {} holds step {}, which the agent protects ({})",
                      step, *target, victim,
                      t1_held ? fmt::format("T1, committed {}", committed) : "durable tier");
    SnapshotStats stats;
    stats.step = step;
    stats.skipped = true;
    stats.skipped_total = skipped_total_;
    {
      MutexLock l(&stats_mu_);
      snapshot_stats_ = stats;
    }
    if (!cluster) return false;
    // Tell the agent at once: the other nodes stop protecting `step`, which
    // cannot commit without this node (docs/cluster_save.md, "Skips").
    json req = {{"op", "skipped"}, {"rank", options_.rank}, {"step", step}};
    auto reply = Call(req, Deadline::AfterSeconds(2), /*reconnect_s=*/0);
    if (!reply.ok()) {
      MEMENTO_LOG_WARN("snapshot {} skipped; the agent was not told: {}", step,
                       reply.status().ToString());
    }
    return false;
  }

  int NewestSlot() EXCLUDES(slot_mu_) {
    MutexLock l(&slot_mu_);
    return newest_slot_;
  }
  void SetNewestSlot(int s) EXCLUDES(slot_mu_) {
    MutexLock l(&slot_mu_);
    newest_slot_ = s;
  }

  // Connects and says hello. A rank still held by a trainer process that just
  // died is released by the agent within moments, so AlreadyExists is
  // retried until the deadline too.
  Status ConnectLocked(Deadline deadline) REQUIRES(conn_mu_) {
    for (;;) {
      Status st = ConnectOnce(deadline);
      if (st.code() != StatusCode::kAlreadyExists || deadline.expired()) return st;
      usleep(20000);
    }
  }

  Status ConnectOnce(Deadline deadline) REQUIRES(conn_mu_) {
    std::string path = shm::AgentSocketPath(dir_);
    Status last;
    for (;;) {
      struct stat st;
      if (stat(dir_.c_str(), &st) != 0) {
        last = NotFoundError(fmt::format(
            "unknown job '{}': no agent directory {} (is `memento agent --job {} --node {}` "
            "running?)",
            options_.job_id, dir_, options_.job_id, options_.node));
      } else {
        auto fd = shm::ConnectUnix(path);
        if (fd.ok()) {
          fd_ = *fd;
          break;
        }
        last = fd.status();
        if (last.code() == StatusCode::kNotFound) {
          last = UnavailableError("no agent is running for job '" + options_.job_id + "' in " +
                                  dir_ + " (no socket)");
        }
        if (last.code() == StatusCode::kPermissionDenied) return last;
      }
      if (deadline.expired()) return last;
      usleep(20000);
    }
    auto cred = shm::GetPeerCred(fd_);
    if (!cred.ok() || cred->uid != geteuid()) {
      close(fd_);
      fd_ = -1;
      return PermissionDeniedError(
          fmt::format("the agent at {} runs as uid {}, this trainer as uid {}", path,
                      cred.ok() ? static_cast<int64_t>(cred->uid) : -1, geteuid()));
    }
    json hello = {{"op", "hello"},
                  {"protocol", shm::kProtocolVersion},
                  {"job", options_.job_id},
                  {"rank", options_.rank},
                  {"world_size", options_.world_size}};
    // The agent answers at once; give it a second even when the connect
    // deadline is (nearly) spent.
    Deadline hello_deadline =
        deadline.remaining() < std::chrono::seconds(1) ? Deadline::AfterSeconds(1) : deadline;
    Status st = shm::SendJson(fd_, hello, hello_deadline);
    Result<json> reply = st.ok() ? shm::RecvJson(fd_, hello_deadline) : Result<json>(st);
    if (reply.ok())
      st = shm::StatusFromJson(*reply);
    else
      st = reply.status();
    if (!st.ok()) {
      close(fd_);
      fd_ = -1;
      return st;
    }
    return Status::Ok();
  }

  // One request/response; reconnects once when the agent went away (it may
  // have been restarted: slots live on in shared memory).
  Result<json> Call(const json& req, Deadline deadline, double reconnect_s = 2.0)
      EXCLUDES(conn_mu_) {
    MutexLock l(&conn_mu_);
    Status st;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (fd_ < 0) {
        st = ConnectLocked(
            Deadline::AfterSeconds(std::min(options_.connect_timeout_s, reconnect_s)));
        if (!st.ok()) return st;
      }
      st = shm::SendJson(fd_, req, deadline);
      if (st.ok()) {
        auto reply = shm::RecvJson(fd_, deadline);
        if (reply.ok()) {
          MEMENTO_RETURN_IF_ERROR(shm::StatusFromJson(*reply));
          return *reply;
        }
        st = reply.status();
      }
      if (st.code() != StatusCode::kUnavailable) return st;
      close(fd_);
      fd_ = -1;
    }
    return st;
  }

  // Runs on a copy worker once the slot is complete in shared memory. The
  // version is safe whether or not the agent hears of it (a restarted agent
  // adopts it from the header), so failures here only log.
  void NotifyComplete(int slot, int64_t step) {
    json req = {{"op", "complete"}, {"rank", options_.rank}, {"slot", slot}, {"step", step}};
    // One reconnect attempt at most: the trainer must not wait on a dead agent.
    auto reply = Call(req, Deadline::AfterSeconds(10), /*reconnect_s=*/0);
    if (!reply.ok()) {
      MEMENTO_LOG_WARN("step {} is complete in shared memory but the agent was not told: {}", step,
                       reply.status().ToString());
    }
  }

  const ClientOptions options_;
  const std::string dir_;
  std::vector<Registered> tensors_;
  bool sealed_ = false;
  shm::SlotLayout layout_;
  std::unique_ptr<shm::Segment> segments_[shm::kSlotsPerRank];
  std::unique_ptr<snap::CopyEngine> engine_;
  std::shared_ptr<snap::CopyJob> job_;
  int64_t job_step_ = -1;
  int64_t last_step_ = -1;
  bool fence_waited_ = false;
  std::atomic<Phase> phase_{Phase::kCompute};
  // HAS (schedule "has"); the chunk list and target of the snapshot in
  // flight are written by the trainer thread only while no HAS snapshot runs.
  std::unique_ptr<has::HasRunner> runner_;
  std::atomic<has::HasRunner*> runner_ptr_{nullptr};  // for OnPhase from any thread
  bool has_active_ = false;
  std::vector<snap::CopyChunk> has_chunks_;
  std::atomic<size_t> has_remaining_{0};
  int has_target_ = -1;
  int64_t has_step_ = -1;
  int has_chunk_delay_us_ = 0;

  // Cluster mode (null otherwise): the agent's commit word, mapped writable
  // for this rank's claim entry.
  std::unique_ptr<shm::Segment> commit_word_seg_;
  shm::CommitWord* commit_word_ = nullptr;
  // Single-node mode with a durable tier (null otherwise): the agent's
  // durable hold word, mapped writable for this rank's claim entry.
  std::unique_ptr<shm::Segment> durable_word_seg_;
  shm::CommitWord* durable_word_ = nullptr;
  uint64_t skipped_total_ = 0;

  Mutex slot_mu_;
  int newest_slot_ GUARDED_BY(slot_mu_) = -1;
  Mutex conn_mu_;
  int fd_ GUARDED_BY(conn_mu_) = -1;
  mutable Mutex stats_mu_;
  SnapshotStats snapshot_stats_ GUARDED_BY(stats_mu_);
  RestoreStats restore_stats_ GUARDED_BY(stats_mu_);
};

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.rank < 0 || options.world_size < 1 || options.rank >= options.world_size) {
    return InvalidArgumentError(
        fmt::format("rank {} must be in [0, world_size {})", options.rank, options.world_size));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % (64 << 10) != 0) {
    return InvalidArgumentError(
        fmt::format("chunk_bytes {} must be a positive multiple of 64 KiB", options.chunk_bytes));
  }
  if (options.copy_threads < 1 || options.copy_threads > 64) {
    return InvalidArgumentError(
        fmt::format("copy_threads {} must be in [1, 64]", options.copy_threads));
  }
  if (options.schedule != "eager" && options.schedule != "has") {
    return InvalidArgumentError(
        fmt::format("schedule '{}' is not one of: eager, has", options.schedule));
  }
  if (options.pipeline_stages < 0 ||
      (options.pipeline_stages > 0 &&
       (options.pipeline_stage < 0 || options.pipeline_stage >= options.pipeline_stages ||
        options.pipeline_microbatches < 1 || !(options.pipeline_fwd_s >= 0) ||
        !(options.pipeline_bwd_s >= 0)))) {
    return InvalidArgumentError(fmt::format(
        "pipeline schedule (stages {}, stage {}, microbatches {}, fwd {} s, bwd {} s) needs "
        "0 <= stage < stages, microbatches >= 1 and non-negative times",
        options.pipeline_stages, options.pipeline_stage, options.pipeline_microbatches,
        options.pipeline_fwd_s, options.pipeline_bwd_s));
  }
  if (!(options.has_compute_max_rate >= 0)) {
    return InvalidArgumentError("has_compute_max_rate must be >= 0");
  }
  // Validates the job id the same way slots do.
  MEMENTO_RETURN_IF_ERROR(shm::ComputeSlotLayout(options.job_id, 0, {}, 1).status());
  std::string dir = options.agent_dir;
  if (dir.empty()) {
    const char* env = std::getenv("MEMENTO_RUN_DIR");
    dir = env && *env ? env : shm::DefaultNodeRoot(options.job_id, options.node);
  }
  auto client = std::make_unique<ClientImpl>(options, dir);
  MEMENTO_RETURN_IF_ERROR(client->ConnectNow(Deadline::AfterSeconds(options.connect_timeout_s)));
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace memento
