// The trainer-side library behind include/memento/client.h (design:
// docs/node_store.md, threads: docs/thread_model.md).
//
// The client maps its rank's two slots (allocated and pre-faulted by the
// agent) and copies registered memory straight into them: no byte of state
// crosses the socket. The socket carries only small control messages.
#include "memento/client.h"

#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "fmt/format.h"
#include "memento/config.h"
#include "shm/commit_word.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "snap/copy_engine.h"
#include "snap/copy_kernel.h"
#include "snap/has/has_runner.h"
#if MEMENTO_HAVE_CUDA
#include "snap/cuda/cuda_copy_engine.h"
#include "snap/cuda/device_copy.h"
#endif

namespace memento {
namespace {

using nlohmann::json;

// CPU time of the calling thread in nanoseconds (CLOCK_THREAD_CPUTIME_ID).
uint64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// CPU time of the calling thread since its previous call (since the thread
// started on the first call). On a copy-engine worker, called after each
// chunk and after the job's completion, it is the CPU that chunk took: a
// worker only blocks between jobs.
uint64_t ThreadCpuSinceLastCallNs() {
  thread_local uint64_t last = 0;
  const uint64_t now = ThreadCpuNs();
  const uint64_t delta = now - last;
  last = now;
  return delta;
}

struct Registered {
  TensorMeta meta;
  void* data = nullptr;
  Device device;
};

// The first access to each page of a new mapping of a slot is slow (on VMs
// with shadow paging, ~2.6 us per 4 KiB page: 0.7 s per GiB; docs/
// node_store.md, "Restart"). A restarted trainer therefore maps its slots
// without touching them in Seal(), and a SlotPrefault touches the data
// region of one slot in 8 MiB pieces, claimed by whichever thread gets there
// first: the client's background thread, Restore() for the slot it reads,
// the copy workers (or a helping Fence) of the first snapshot into it. Only
// speed depends on it: an untouched page is still correct to read or write
// (TouchPages is atomic), just slower on first access.
class SlotPrefault {
 public:
  SlotPrefault(uint8_t* base, size_t begin, size_t end) : base_(base), begin_(begin) {
    pieces_ = end > begin ? (end - begin + kPiece - 1) / kPiece : 0;
    end_ = end;
  }
  bool done() const { return finished_.load(std::memory_order_acquire) >= pieces_; }
  // Touches unclaimed pieces until none is left to claim (or `stop` is set).
  void Help(const std::atomic<bool>* stop = nullptr) {
    for (;;) {
      if (stop != nullptr && stop->load(std::memory_order_relaxed)) return;
      const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= pieces_) return;
      const size_t b = begin_ + i * kPiece, e = std::min(end_, b + kPiece);
      shm::PopulateWritable(base_ + b, e - b);
      shm::TouchPages(base_ + b, e - b);
      if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == pieces_) {
        MutexLock l(&mu_);
        cv_.SignalAll();
      }
    }
  }
  // Returns once every piece is touched, touching unclaimed ones itself.
  void HelpAndWait() {
    if (done()) return;
    Help();
    MutexLock l(&mu_);
    while (!done()) cv_.Wait(&l);
  }

 private:
  static constexpr size_t kPiece = size_t{8} << 20;
  uint8_t* const base_;
  const size_t begin_;
  size_t end_ = 0;
  size_t pieces_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> finished_{0};
  Mutex mu_;
  CondVar cv_;
};

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(ClientOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}
  ~ClientImpl() override {
    prefault_stop_.store(true, std::memory_order_relaxed);
    if (prefault_thread_.joinable()) prefault_thread_.join();
    if (job_ != nullptr) engine_->HelpAndWait(*job_, Deadline::Infinite()).IgnoreError();
    if (has_active_) {
      SetHasWorkersIdle(false);  // a fence is never starved
      runner_->Fence().status().IgnoreError();
    }
    StopDevicePath();
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
    if (!device.is_host()) MEMENTO_RETURN_IF_ERROR(CheckDeviceTensor(meta, device));
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
    // Map both slots, but touch only their headers, manifests and tables
    // here (what Snapshot() writes on the training thread); their data
    // regions are touched by SlotPrefault (above), in the background.
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
      prefault_[s] =
          std::make_unique<SlotPrefault>(segments_[s]->data(), head, segments_[s]->size());
    }
    // The newest version held decides which slot the next snapshot overwrites.
    shm::RankSlots slots{};
    for (int s = 0; s < shm::kSlotsPerRank; ++s) slots[s] = segments_[s].get();
    auto newest = shm::FindNewestCompleteSlot(slots);
    if (newest.ok() && newest->info.step > last_step_) {
      last_step_ = newest->info.step;
      SetNewestSlot(newest->slot);
    }
    StartPrefault();
    MEMENTO_RETURN_IF_ERROR(StartDevicePath());
    snap::CopyEngine::Options eo;
    eo.threads = std::max(1, options_.copy_threads);
    eo.name = "mem-copy";
    eo.idle_priority = options_.copy_priority == "idle";
    if (const char* d = std::getenv("MEMENTO_TEST_COPY_DELAY_US")) eo.chunk_delay_us = std::atoi(d);
    engine_ = std::make_unique<snap::CopyEngine>(eo);
    has_chunk_delay_us_ = eo.chunk_delay_us;
    if (options_.schedule == "has") MEMENTO_RETURN_IF_ERROR(StartHasRunner());
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
    copy_cpu_ns_.store(0, std::memory_order_relaxed);
    snapshot_thread_ = std::this_thread::get_id();
    // "auto": HAS from the first snapshot after the trainer reported an
    // idle window (its phase hooks are wired); eager until then.
    if (runner_ == nullptr && options_.schedule == "auto" &&
        idle_reported_.load(std::memory_order_relaxed)) {
      MEMENTO_RETURN_IF_ERROR(StartHasRunner());
      MEMENTO_LOG_INFO(
          "rank {}: the trainer reports idle phases; snapshots from step {} on use HAS",
          options_.rank, step);
    }
    if (runner_ != nullptr && !chunks.empty())
      return BeginHasSnapshot(std::move(chunks), target, step);
    if (!chunk_on_device_.empty()) return BeginDeviceSnapshot(std::move(chunks), target, step);
    job_ = engine_->Submit(
        std::move(chunks), [this](size_t, uint64_t) { CountWorkerCpu(); },
        [this, target, step, &seg](const Status& copied) -> Status {
          if (!copied.ok()) return copied;
          shm::CompleteSlotWrite(seg);  // node-local complete, last
          SetNewestSlot(target);
          NotifyComplete(target, step);
          CountWorkerCpu();
          return Status::Ok();
        },
        // The first snapshot after a restart: its copiers (never the
        // Snapshot() call) finish touching the target slot first.
        [p = prefault_[target].get()] { p->HelpAndWait(); });
    job_step_ = step;
    job_helped_bytes_ = 0;
    return Status::Ok();
  }

  Status Fence(Deadline deadline) override {
    if (has_active_) return FenceHas(deadline);
    if (device_active_) return FenceDevice(deadline);
    if (job_ == nullptr) return Status::Ok();
    Stopwatch sw;
    bool was_done = job_->done();
    // Idle-priority workers may be starved by the trainers of this node: the
    // waiting trainer thread copies what is left itself.
    Status st = options_.copy_priority == "idle"
                    ? engine_->HelpAndWait(*job_, deadline, &job_helped_bytes_)
                    : job_->Wait(deadline);
    if (st.code() == StatusCode::kDeadlineExceeded && !job_->done()) return st;
    SnapshotStats stats;
    stats.step = job_step_;
    stats.bytes = job_->bytes();
    stats.copy_s = job_->copy_seconds();
    stats.fence_wait_s = was_done ? 0 : sw.Seconds();
    stats.bytes_fence = job_helped_bytes_;
    stats.bytes_compute = stats.bytes;  // eager: all beside computation; bytes_fence is a part
    stats.copy_cpu_s = static_cast<double>(copy_cpu_ns_.load(std::memory_order_relaxed)) * 1e-9;
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
      // Verify the whole version before the first byte of registered memory
      // is written: a version that fails its checksums leaves the tensors
      // untouched (docs/node_store.md, "Restore").
      const shm::Segment& seg = *segments_[c.slot];
      // The slot this restore reads is touched now (the background thread
      // may be on the other one, which the next snapshot writes).
      prefault_[c.slot]->HelpAndWait();
      Stopwatch verify_sw;
      Status st = VerifyVersion(seg, c.info);
      stats.verify_s += verify_sw.Seconds();
      if (st.ok()) {
        Stopwatch copy_sw;
        st = CopyVersion(seg, c.info, by_name, &stats.bytes);
        stats.copy_s += copy_sw.Seconds();
      }
      if (st.ok()) {
        last_step_ = c.info.step;
        SetNewestSlot(c.slot);
        stats.step = c.info.step;
        stats.restore_s = sw.Seconds();
        for (const auto& s : stats.skipped) MEMENTO_LOG_WARN("restore skipped {}", s);
        MEMENTO_LOG_INFO("restored step {} ({} bytes) in {:.3f} s (verify {:.3f} s, copy {:.3f} s)",
                         stats.step, stats.bytes, stats.restore_s, stats.verify_s, stats.copy_s);
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

  // Checks every chunk of the version `info` describes against its checksum,
  // on the copy engine's number of threads, reading the slot only. DataLoss
  // naming the first bad chunk; Aborted when the slot was rewritten meanwhile.
  Status VerifyVersion(const shm::Segment& seg, const shm::SlotInfo& info) {
    const uint8_t* data = seg.data() + info.data_offset;
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    Mutex mu;
    Status first;
    auto work = [&] {
      for (;;) {
        size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= info.chunks.size() || failed.load(std::memory_order_relaxed)) return;
        const shm::ChunkEntry& e = info.chunks[i];
        uint64_t sum = snap::FastChecksum(data + e.offset, e.length);
        if (sum == e.checksum) continue;
        failed.store(true, std::memory_order_relaxed);
        MutexLock l(&mu);
        if (first.ok()) {
          first = DataLossError(fmt::format(
              "chunk {} (bytes {}..{} of tensor '{}', {} bytes) fails its checksum: {:#018x} "
              "expected, {:#018x} found",
              i, e.offset - info.tensors[e.tensor_index].offset,
              e.offset - info.tensors[e.tensor_index].offset + e.length,
              info.tensors[e.tensor_index].meta.name, e.length, e.checksum, sum));
        }
      }
    };
    const size_t n = std::min<size_t>(std::max(1, options_.copy_threads), info.chunks.size());
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < n; ++t) helpers.emplace_back(work);
    work();
    for (auto& t : helpers) t.join();
    MutexLock l(&mu);
    if (first.ok() && !shm::SlotUnchanged(seg, info)) {
      return AbortedError(fmt::format("slot {} was rewritten while it was verified", seg.path()));
    }
    return first;
  }

  // Copies a verified version into the registered tensors, checking every
  // chunk's checksum again in the same pass (free: the copy is memory bound).
  // A failure here means the slot changed after VerifyVersion (nothing but a
  // concurrent writer can do that): the tensors are then partly overwritten,
  // and the message says so.
  Status CopyVersion(const shm::Segment& seg, const shm::SlotInfo& info,
                     const std::map<std::string, const Registered*>& by_name, uint64_t* bytes) {
    const uint8_t* data = seg.data() + info.data_offset;
    std::vector<snap::CopyChunk> chunks, device_chunks;
    chunks.reserve(info.chunks.size());
    for (const shm::ChunkEntry& e : info.chunks) {
      const shm::SavedTensor& t = info.tensors[e.tensor_index];
      const Registered* r = by_name.at(t.meta.name);
      snap::CopyChunk cc;
      cc.src = data + e.offset;
      cc.dst = static_cast<uint8_t*>(r->data) + (e.offset - t.offset);
      cc.length = e.length;
      cc.verify = true;
      cc.expected_checksum = e.checksum;
      cc.label = t.meta.name.c_str();
      if (!r->device.is_host()) {
        device_chunks.push_back(cc);  // host slot -> device memory below
        continue;
      }
      chunks.push_back(cc);
    }
    auto job = engine_->Submit(std::move(chunks), nullptr, [](const Status& s) { return s; });
    Status st = options_.copy_priority == "idle" ? engine_->HelpAndWait(*job, Deadline::Infinite())
                                                 : job->Wait();
    uint64_t device_bytes = 0;
    if (st.ok() && !device_chunks.empty()) st = RestoreDeviceChunks(device_chunks, &device_bytes);
    if (st.ok() && !shm::SlotUnchanged(seg, info)) {
      st = AbortedError(fmt::format("slot {} was rewritten while it was copied", seg.path()));
    }
    if (!st.ok()) {
      return Status(st.code(),
                    st.message() +
                        " (after the version had verified: the slot changed under the restore; "
                        "the registered tensors are partly overwritten)");
    }
    *bytes = job->bytes() + device_bytes;
    return Status::Ok();
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
    if (phase == Phase::kIdle) idle_reported_.store(true, std::memory_order_relaxed);
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
  // ---- Device tensors (docs/has.md, "CUDA path") ----------------------------
  // Registration check of a tensor on a device. Without CUDA in the build or
  // without a visible device, a FailedPrecondition that names the tensor.
  Status CheckDeviceTensor(const TensorMeta& meta, Device device) const {
#if MEMENTO_HAVE_CUDA
    const int count = cuda::DeviceCount();
    if (count == 0) {
      return FailedPreconditionError(
          fmt::format("tensor '{}' lives on {}, but no CUDA device is visible to this process "
                      "(cudaGetDeviceCount found none); register it from host memory instead",
                      meta.name, DeviceName(device)));
    }
    if (device.index < 0 || device.index >= count) {
      return InvalidArgumentError(
          fmt::format("tensor '{}' lives on {}, but only {} CUDA device{} "
                      "{} visible (cuda:0..cuda:{})",
                      meta.name, DeviceName(device), count, count == 1 ? "" : "s",
                      count == 1 ? "is" : "are", count - 1));
    }
    for (const Registered& r : tensors_) {
      if (!r.device.is_host() && r.device != device) {
        return FailedPreconditionError(fmt::format(
            "tensor '{}' lives on {} but '{}' on {}: one client (one rank) copies from one CUDA "
            "device",
            meta.name, DeviceName(device), r.meta.name, DeviceName(r.device)));
      }
    }
    return Status::Ok();
#else
    return FailedPreconditionError(fmt::format(
        "tensor '{}' lives on {}: this memento was built without CUDA (nvcc was not found at "
        "build time), so it cannot copy device memory; register a host copy of the tensor or "
        "rebuild with -DMEMENTO_WITH_CUDA=ON",
        meta.name, DeviceName(device)));
#endif
  }

  // At Seal(), when device tensors are registered: both slots page-locked
  // once (cudaHostRegister), one CudaCopyEngine (low-priority streams on the
  // tensors' device), and which chunks of the layout come from the device.
  Status StartDevicePath() {
#if MEMENTO_HAVE_CUDA
    int device = -1;
    for (const Registered& r : tensors_) {
      if (!r.device.is_host()) device = r.device.index;
    }
    if (device < 0) return Status::Ok();
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      MEMENTO_ASSIGN_OR_RETURN(
          auto pin, cuda::PinnedRegion::Register(segments_[s]->data(), segments_[s]->size()));
      device_pins_.push_back(std::move(pin));
    }
    cuda::CudaCopyOptions co;
    co.device = device;
    co.chunk_bytes = options_.chunk_bytes;
    co.low_priority = true;
    MEMENTO_ASSIGN_OR_RETURN(device_engine_, cuda::CudaCopyEngine::Create(co));
    chunk_on_device_.assign(layout_.chunks.size(), false);
    for (size_t i = 0; i < layout_.chunks.size(); ++i) {
      chunk_on_device_[i] = !tensors_[layout_.chunks[i].tensor_index].device.is_host();
    }
    MEMENTO_LOG_INFO(
        "rank {}: device tensors on cuda:{}: slots page-locked, copy streams at "
        "priority {}",
        options_.rank, device, device_engine_->stream_priority());
#endif
    return Status::Ok();
  }

  void StopDevicePath() {
    if (device_thread_.joinable()) device_thread_.join();
#if MEMENTO_HAVE_CUDA
    device_engine_.reset();  // waits for queued copies
    device_pins_.clear();    // unregistered before the slots are unmapped
#endif
  }

  // D2H of device chunks (src on the device, dst in the slot) with their
  // checksums computed on the host once they land (device_copy.h says why).
  Status CopyDeviceChunks(const std::vector<snap::CopyChunk>& chunks) {
#if MEMENTO_HAVE_CUDA
    std::vector<cuda::DeviceChunk> dc;
    dc.reserve(chunks.size());
    for (const snap::CopyChunk& c : chunks) {
      cuda::DeviceChunk d;
      d.host = c.dst;
      d.device = const_cast<void*>(c.src);
      d.bytes = c.length;
      d.checksum_out = c.checksum_out;
      d.label = c.label;
      dc.push_back(d);
    }
    return cuda::SnapshotDeviceChunks(device_engine_.get(), dc);
#else
    (void)chunks;
    return InternalError("device chunk without CUDA");
#endif
  }

  // Restore of device tensors: slot bytes verified on the host, then H2D.
  Status RestoreDeviceChunks(const std::vector<snap::CopyChunk>& chunks, uint64_t* bytes) {
#if MEMENTO_HAVE_CUDA
    std::vector<cuda::DeviceChunk> dc;
    for (const snap::CopyChunk& c : chunks) {
      cuda::DeviceChunk d;
      d.host = const_cast<void*>(c.src);
      d.device = c.dst;
      d.bytes = c.length;
      d.expected_checksum = c.expected_checksum;
      d.label = c.label;
      dc.push_back(d);
      *bytes += c.length;
    }
    return cuda::RestoreDeviceChunks(device_engine_.get(), dc);
#else
    (void)chunks;
    (void)bytes;
    return InternalError("device chunk without CUDA");
#endif
  }

  // Eager schedule with device tensors: one thread per snapshot copies the
  // device chunks through the CUDA engine (D2H pipelined on its low-priority
  // streams) and the host chunks (blobs) on the CPU, then completes the slot
  // exactly as the CPU engine's on_done does. The training stream is never
  // synchronised; Fence() waits for this thread.
  Status BeginDeviceSnapshot(std::vector<snap::CopyChunk> chunks, int target, int64_t step) {
    {
      MutexLock l(&device_mu_);
      device_done_ = false;
      device_status_ = Status::Ok();
    }
    device_bytes_ = 0;
    for (const snap::CopyChunk& c : chunks) device_bytes_ += c.length;
    job_step_ = step;
    device_active_ = true;
    device_thread_ = std::thread([this, chunks = std::move(chunks), target, step] {
      Stopwatch sw;
      std::vector<snap::CopyChunk> on_device;
      Status st;
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (chunk_on_device_[i]) {
          on_device.push_back(chunks[i]);
        } else {
          *chunks[i].checksum_out =
              snap::CopyAndChecksumStreaming(chunks[i].dst, chunks[i].src, chunks[i].length);
        }
      }
      st = CopyDeviceChunks(on_device);
      if (st.ok()) {
        shm::CompleteSlotWrite(*segments_[target]);  // node-local complete, last
        SetNewestSlot(target);
        NotifyComplete(target, step);
      }
      MutexLock l(&device_mu_);
      device_status_ = st;
      device_copy_s_ = sw.Seconds();
      device_done_ = true;
      device_cv_.SignalAll();
    });
    return Status::Ok();
  }

  Status FenceDevice(Deadline deadline) {
    Stopwatch sw;
    bool was_done;
    Status st;
    double copy_s;
    {
      MutexLock l(&device_mu_);
      was_done = device_done_;
      while (!device_done_) {
        if (!device_cv_.WaitUntil(&l, deadline.when()) && !device_done_) {
          return DeadlineExceededError(
              fmt::format("snapshot {} of device tensors still copying", job_step_));
        }
      }
      st = device_status_;
      copy_s = device_copy_s_;
    }
    device_thread_.join();
    device_active_ = false;
    SnapshotStats stats;
    stats.step = job_step_;
    stats.bytes = device_bytes_;
    stats.copy_s = copy_s;
    stats.fence_wait_s = was_done ? 0 : sw.Seconds();
    stats.bytes_compute = device_bytes_;
    stats.skipped_total = skipped_total_;
    {
      MutexLock l(&stats_mu_);
      snapshot_stats_ = stats;
    }
    return st;
  }

  // At Seal(): one thread touches the data regions of both slots, first the
  // one holding the newest version (the one a Restore() reads, and helps
  // with: with 4 KiB pages, touching the other slot at the same time only
  // slows both down on a shadow-paging VM), then the one the next snapshot
  // overwrites (its copiers help). At idle priority with copy_priority
  // "idle", like the copy workers.
  void StartPrefault() {
    const int newest = NewestSlot();
    const int first = newest >= 0 ? newest : 0;
    const bool idle = options_.copy_priority == "idle";
    prefault_thread_ = std::thread([this, first, idle] {
      if (idle) {
        sched_param param{};
        sched_setscheduler(0, SCHED_IDLE, &param);
      }
      prefault_[first]->Help(&prefault_stop_);
      prefault_[first == 0 ? 1 : 0]->Help(&prefault_stop_);
    });
    pthread_setname_np(prefault_thread_.native_handle(), "mem-prefault");
  }

  // Creates the HasRunner (schedule "has" at Seal(); "auto" at the first
  // snapshot after an idle phase was reported). Trainer thread only.
  Status StartHasRunner() {
    has::HasRunnerOptions ro;
    ro.threads = std::max(1, options_.copy_threads);
    ro.has.separate_comm_link = options_.has_separate_comm_link;
    ro.has.compute_max_rate = options_.has_compute_max_rate;
    ro.has.schedule.num_stages = options_.pipeline_stages;
    ro.has.schedule.stage = options_.pipeline_stage;
    ro.has.schedule.num_microbatches = options_.pipeline_microbatches;
    ro.has.schedule.fwd_s = options_.pipeline_fwd_s;
    ro.has.schedule.bwd_s = options_.pipeline_bwd_s;
    MEMENTO_ASSIGN_OR_RETURN(
        runner_, has::HasRunner::Create(ro, [this](size_t i) { return HasCopyChunk(i); }));
    // The phase the trainer is in carries over.
    runner_->OnPhase(phase_.load(std::memory_order_relaxed));
    runner_ptr_.store(runner_.get(), std::memory_order_release);
    return Status::Ok();
  }

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
    // Idle priority: the copy runs on CPU time no trainer wants (this node's
    // other ranks included) until the fence.
    SetHasWorkersIdle(true);
    // Begin() takes the runner's lock: the workers see the chunk list above.
    MEMENTO_RETURN_IF_ERROR(runner_->Begin(step, std::move(sizes)));
    has_active_ = true;
    return Status::Ok();
  }

  // Runs on a HAS worker at its first chunk: records its thread id and gives
  // it the priority the others have. With copy_priority "idle" it first
  // checks that the OS lets a SCHED_IDLE thread be raised back; if not, the
  // HAS workers keep the normal priority.
  void RegisterHasWorker() {
    thread_local const void* registered = nullptr;
    if (registered == this) return;
    registered = this;
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    MutexLock l(&has_prio_mu_);
    has_worker_tids_.push_back(tid);
    if (options_.copy_priority != "idle" || !has_idle_ok_) return;
    sched_param param{};
    if (sched_setscheduler(tid, SCHED_IDLE, &param) != 0 ||
        sched_setscheduler(tid, SCHED_OTHER, &param) != 0) {
      const int err = errno;
      has_idle_ok_ = false;
      MEMENTO_LOG_INFO(
          "rank {}: HAS copy workers keep the normal priority: a SCHED_IDLE thread cannot be "
          "raised back here ({})",
          options_.rank, std::strerror(err));
      SetHasWorkersIdleLocked(false);
      return;
    }
    if (has_workers_idle_) sched_setscheduler(tid, SCHED_IDLE, &param);
  }

  void SetHasWorkersIdle(bool idle) {
    if (options_.copy_priority != "idle") return;
    MutexLock l(&has_prio_mu_);
    SetHasWorkersIdleLocked(idle && has_idle_ok_);
  }

  // Best effort, as the eager engine's workers (snap/copy_engine.cc).
  void SetHasWorkersIdleLocked(bool idle) REQUIRES(has_prio_mu_) {
    if (has_workers_idle_ == idle) return;
    has_workers_idle_ = idle;
    sched_param param{};
    for (pid_t tid : has_worker_tids_) {
      (void)sched_setscheduler(tid, idle ? SCHED_IDLE : SCHED_OTHER, &param);
    }
  }

  // Runs on a HAS worker, without the runner's lock.
  Status HasCopyChunk(size_t index) {
    RegisterHasWorker();
    const uint64_t cpu0 = ThreadCpuNs();
    const snap::CopyChunk& c = has_chunks_[index];
    prefault_[has_target_]->HelpAndWait();
    if (!chunk_on_device_.empty() && chunk_on_device_[index]) {
      MEMENTO_RETURN_IF_ERROR(CopyDeviceChunks({c}));
    } else {
      *c.checksum_out = snap::CopyAndChecksumStreaming(c.dst, c.src, c.length);
    }
    if (has_chunk_delay_us_ > 0) usleep(static_cast<useconds_t>(has_chunk_delay_us_));
    // acq_rel: the last worker sees every other chunk's writes before it
    // publishes the slot.
    if (has_remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      shm::CompleteSlotWrite(*segments_[has_target_]);  // node-local complete, last
      SetNewestSlot(has_target_);
      NotifyComplete(has_target_, has_step_);
    }
    // Before returning: the runner's Fence() sees it (its lock orders them).
    copy_cpu_ns_.fetch_add(ThreadCpuNs() - cpu0, std::memory_order_relaxed);
    return Status::Ok();
  }

  Status FenceHas(Deadline deadline) {
    // A waiting fence is never starved: the workers run at normal priority
    // until the next snapshot begins.
    SetHasWorkersIdle(false);
    Result<has::HasStepStats> r = runner_->Fence(deadline);
    if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded) return r.status();
    has_active_ = false;
    SnapshotStats stats;
    stats.step = has_step_;
    stats.skipped_total = skipped_total_;
    if (r.ok()) {
      has::FillSnapshotStats(*r, &stats);
      stats.copy_cpu_s = static_cast<double>(copy_cpu_ns_.load(std::memory_order_relaxed)) * 1e-9;
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
    const shm::SlotPeek peek = shm::PeekSlot(*segments_[s]);
    return peek.state == shm::SlotState::kComplete ? peek.step : -1;
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

  // Eager engine callback: adds the calling worker's CPU since its previous
  // call (the chunk it just copied, or the job's completion). Chunks the
  // trainer thread copies itself in Fence() are left out: that time is the
  // fence's.
  void CountWorkerCpu() {
    if (std::this_thread::get_id() == snapshot_thread_) return;
    copy_cpu_ns_.fetch_add(ThreadCpuSinceLastCallNs(), std::memory_order_relaxed);
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
  std::unique_ptr<SlotPrefault> prefault_[shm::kSlotsPerRank];
  std::thread prefault_thread_;
  std::atomic<bool> prefault_stop_{false};
  std::unique_ptr<snap::CopyEngine> engine_;
  std::shared_ptr<snap::CopyJob> job_;
  int64_t job_step_ = -1;
  uint64_t job_helped_bytes_ = 0;  // copied by the trainer thread in Fence()
  // CPU time of the copy workers for the snapshot in flight (SnapshotStats::
  // copy_cpu_s): reset by Snapshot() on the trainer thread while no copy
  // runs, added to by the workers, read after the fence.
  std::atomic<uint64_t> copy_cpu_ns_{0};
  std::thread::id snapshot_thread_;  // the thread that calls Snapshot()
  int64_t last_step_ = -1;
  bool fence_waited_ = false;
  std::atomic<Phase> phase_{Phase::kCompute};
  std::atomic<bool> idle_reported_{false};  // an OnPhase(kIdle) was seen ("auto")
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
  // HAS workers' priority (copy_priority "idle"): SCHED_IDLE from Begin
  // until the fence, SCHED_OTHER while a fence waits. Workers register at
  // their first chunk; has_idle_ok_ turns false for good when the OS refuses
  // to raise a worker back (no CAP_SYS_NICE, RLIMIT_NICE < 20): a fence must
  // never wait on a starved worker, so they then stay at normal priority.
  Mutex has_prio_mu_;
  std::vector<pid_t> has_worker_tids_ GUARDED_BY(has_prio_mu_);
  bool has_workers_idle_ GUARDED_BY(has_prio_mu_) = false;
  bool has_idle_ok_ GUARDED_BY(has_prio_mu_) = true;

  // Device tensors (CUDA): chunk_on_device_[i] for chunk i of the layout
  // (empty when every tensor is on the host). The eager device snapshot runs
  // on device_thread_; the trainer thread starts and joins it.
  std::vector<bool> chunk_on_device_;
  std::thread device_thread_;
  bool device_active_ = false;
  uint64_t device_bytes_ = 0;
  Mutex device_mu_;
  CondVar device_cv_;
  bool device_done_ GUARDED_BY(device_mu_) = false;
  Status device_status_ GUARDED_BY(device_mu_);
  double device_copy_s_ GUARDED_BY(device_mu_) = 0;
#if MEMENTO_HAVE_CUDA
  std::vector<std::unique_ptr<cuda::PinnedRegion>> device_pins_;
  std::unique_ptr<cuda::CudaCopyEngine> device_engine_;
#endif

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
  if (options.copy_priority != "idle" && options.copy_priority != "normal") {
    return InvalidArgumentError(
        fmt::format("copy_priority '{}' is not one of: idle, normal", options.copy_priority));
  }
  if (options.schedule != "eager" && options.schedule != "has" && options.schedule != "auto") {
    return InvalidArgumentError(
        fmt::format("schedule '{}' is not one of: auto, eager, has", options.schedule));
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
