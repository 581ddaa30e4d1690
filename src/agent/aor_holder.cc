#include "agent/aor_holder.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/checksum.h"
#include "common/log.h"
#include "common/thread_cpu.h"
#include "fmt/format.h"

namespace memento::agent {
namespace {

using shm::AorStageHeader;
using shm::AorStageSlot;
using shm::kAorStageMagic;
using shm::kStageDone;
using shm::kStageReading;
using shm::kStageReady;

constexpr uint32_t kAorFileVersion = 2;
constexpr size_t kKeptChecksums = 16;

std::string Hex(uint64_t x) { return fmt::format("{:016x}", x); }

}  // namespace

namespace {

AorFileHeader* FileHeader(uint8_t* base, int area) {
  return reinterpret_cast<AorFileHeader*>(base + area * sizeof(AorFileHeader));
}

}  // namespace

Result<std::shared_ptr<shm::Segment>> CreateAorFile(const std::string& path, const AorRange& range,
                                                    int num_state) {
  unlink(path.c_str());  // an old one of another size or content
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> seg,
                           shm::Segment::CreateOrGrow(path, AorFileBytes(range.count, num_state)));
  std::memset(seg->data(), 0, kAorFileHeaders);  // no step yet
  return std::shared_ptr<shm::Segment>(std::move(seg));
}

opt::AorReplica::Areas AorFileAreas(const std::shared_ptr<shm::Segment>& file, uint64_t count,
                                    int num_state, int current) {
  opt::AorReplica::Areas a;
  auto* state = reinterpret_cast<float*>(file->data() + kAorFileHeaders);
  a.area[0] = state;
  a.area[1] = state + uint64_t(num_state) * count;
  a.current = current;
  a.keep = file;
  return a;
}

void MarkAorAreaWriting(shm::Segment& file, int area) {
  AorFileHeader h{};
  std::memcpy(h.magic, kAorFileMagic, sizeof(h.magic));
  h.version = kAorFileVersion;
  h.writing = 1;
  h.area = static_cast<uint32_t>(area);
  h.step = -1;
  h.header_checksum = Checksum(&h, offsetof(AorFileHeader, header_checksum));
  std::memcpy(FileHeader(file.data(), area), &h, sizeof(h));
  // The mark is in the mapping before the first byte of the area changes.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void PublishAorArea(shm::Segment& file, const AorRange& range, uint64_t optimizer_hash,
                    const opt::AorReplica& replica) {
  AorFileHeader h{};
  std::memcpy(h.magic, kAorFileMagic, sizeof(h.magic));
  h.version = kAorFileVersion;
  h.num_state = static_cast<uint32_t>(replica.num_state());
  h.owner = range.owner;
  h.holder = range.holder;
  h.offset = replica.offset();
  h.count = replica.count();
  h.optimizer_hash = optimizer_hash;
  const opt::AorReplica::Saved s = replica.saved();
  h.step = s.step;
  h.seed_step = s.seed_step;
  h.seed_checksum = s.seed_checksum;
  h.checksum = s.checksum;
  h.state_hash = s.state_hash;
  h.params_hash = s.params_hash;
  h.diverged = s.diverged ? 1 : 0;
  h.writing = 0;
  h.area = static_cast<uint32_t>(replica.current_area());
  h.header_checksum = Checksum(&h, offsetof(AorFileHeader, header_checksum));
  // The area is complete before its header says so.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::memcpy(FileHeader(file.data(), replica.current_area()), &h, sizeof(h));
}

Result<AdoptedAor> ReadAorFile(const std::string& path, const AorRange& range,
                               std::shared_ptr<const opt::Optimizer> optimizer,
                               uint64_t optimizer_hash) {
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> opened,
                           shm::Segment::Open(path, /*writable=*/true));
  std::shared_ptr<shm::Segment> seg(std::move(opened));
  const std::string what = fmt::format("aor replica file {}", path);
  const int ns = optimizer->num_state();
  if (seg->size() < AorFileBytes(range.count, ns)) {
    return DataLossError(fmt::format("{}: {} bytes, {} expected for rank {}'s shard of {} elements",
                                     what, seg->size(), AorFileBytes(range.count, ns), range.owner,
                                     range.count));
  }
  // Each header's verdict; the newest intact step wins.
  Status why[2];
  AorFileHeader hs[2];
  for (int k = 0; k < 2; ++k) {
    AorFileHeader& h = hs[k];
    std::memcpy(&h, FileHeader(seg->data(), k), sizeof(h));
    const std::string which = fmt::format("{} header {}", what, k);
    if (std::memcmp(h.magic, kAorFileMagic, sizeof(h.magic)) != 0) {
      why[k] = DataLossError(which + ": not a replica file header (bad magic or never written)");
      continue;
    }
    const uint64_t hc = Checksum(&h, offsetof(AorFileHeader, header_checksum));
    if (hc != h.header_checksum) {
      why[k] = DataLossError(fmt::format("{}: torn header (it hashes to {}, written as {})", which,
                                         Hex(hc), Hex(h.header_checksum)));
      continue;
    }
    if (h.version != kAorFileVersion) {
      why[k] = InvalidArgumentError(
          fmt::format("{}: version {} (this agent reads {})", which, h.version, kAorFileVersion));
      continue;
    }
    if (h.writing != 0 || h.area != static_cast<uint32_t>(k)) {
      why[k] =
          DataLossError(which + ": its area was being written (a step its writer did not finish)");
      continue;
    }
    if (h.owner != range.owner || h.offset != range.offset || h.count != range.count) {
      why[k] = InvalidArgumentError(
          fmt::format("{}: holds rank {}'s shard [{}, +{}), the plan wants rank {}'s [{}, +{})",
                      which, h.owner, h.offset, h.count, range.owner, range.offset, range.count));
      continue;
    }
    if (h.optimizer_hash != optimizer_hash || h.num_state != static_cast<uint32_t>(ns)) {
      why[k] = InvalidArgumentError(which + ": computed by another optimizer configuration");
      continue;
    }
  }
  int order[2] = {0, 1};
  if (why[0].ok() && why[1].ok() && hs[1].step > hs[0].step) std::swap(order[0], order[1]);
  for (int k : order) {
    if (!why[k].ok()) continue;
    const AorFileHeader& h = hs[k];
    opt::AorReplica::Saved s;
    s.step = h.step;
    s.seed_step = h.seed_step;
    s.seed_checksum = h.seed_checksum;
    s.checksum = h.checksum;
    s.state_hash = h.state_hash;
    s.params_hash = h.params_hash;
    s.diverged = h.diverged != 0;
    auto r =
        opt::AorReplica::Adopt(optimizer, h.offset, h.count, s, AorFileAreas(seg, h.count, ns, k));
    if (r.ok()) return AdoptedAor{seg, std::move(*r)};
    why[k] = r.status().WithContext(fmt::format("{} area {}", what, k));
  }
  // Neither: say why for both.
  const Status& first = !why[0].ok() ? why[0] : why[1];
  return Status(first.code(), why[0].message() + "; " + why[1].message());
}

AorHolder::AorHolder(std::string root, SeedSource seed, OnAdvanced on_advanced,
                     OnChecksum on_checksum)
    : root_(std::move(root)),
      seed_(std::move(seed)),
      on_advanced_(std::move(on_advanced)),
      on_checksum_(std::move(on_checksum)) {}

AorHolder::~AorHolder() { StopThread(); }

void AorHolder::StopWatcher(std::unique_ptr<Watcher> w) {
  if (w == nullptr) return;
  w->stop.store(true);
  // Woken without a ring (the client's doorbell count is left as it is).
  syscall(SYS_futex, &shm::StageHeader(w->stage->data())->doorbell, FUTEX_WAKE, 1, nullptr, nullptr,
          0);
  if (w->thread.joinable()) w->thread.join();
}

void AorHolder::StopThread() {
  std::map<int, std::unique_ptr<Watcher>> watchers;
  {
    MutexLock l(&q_mu_);
    stop_ = true;
    watchers.swap(watchers_);
  }
  q_cv_.SignalAll();
  for (auto& [rank, w] : watchers) StopWatcher(std::move(w));
  if (worker_.joinable()) worker_.join();
}

std::string AorHolder::StagePath(int rank) const {
  return fmt::format("{}/aor_stage.{}", root_, rank);
}
std::string AorHolder::ReplicaPath(int owner) const {
  return fmt::format("{}/aor.{}", root_, owner);
}

void AorHolder::SetRoomCheck(RoomCheck check) {
  MutexLock l(&mu_);
  room_ = std::move(check);
}

uint64_t AorHolder::RegistrationBytes(const std::vector<AorRange>& ranges, int num_state) {
  if (ranges.empty()) return 0;
  uint64_t total = 0, replicas = 0;
  for (const AorRange& r : ranges) {
    total += r.count;
    replicas += AorFileBytes(r.count, num_state);
  }
  return shm::StageFileBytes(total) + replicas;
}

uint64_t AorHolder::bytes_in_use() {
  MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [rank, bytes] : charged_) n += bytes;
  return n;
}

Result<shm::AorRegisterReply> AorHolder::Register(int rank, std::string_view encoding,
                                                  uint64_t numel, std::vector<AorRange> ranges) {
  auto decoded = opt::DecodeOptimizer(encoding);
  if (!decoded.ok()) {
    return InvalidArgumentError(fmt::format("'aor_register' of rank {}: field 'optimizer': {}",
                                            rank, decoded.status().message()));
  }
  Feeder f;
  f.optimizer = std::shared_ptr<const opt::Optimizer>(std::move(*decoded));
  f.optimizer_hash = Checksum(encoding.data(), encoding.size());
  f.numel = numel;
  uint64_t total = 0;
  for (const AorRange& r : ranges) {
    if (r.offset > numel || r.count > numel - r.offset) {
      return InvalidArgumentError(fmt::format(
          "'aor_register' of rank {}: the plan's AOR range of rank {} [{}, +{}) lies outside the "
          "registered gradient buffer of {} elements",
          rank, r.owner, r.offset, r.count, numel));
    }
    total += r.count;
  }
  // The budget: this registration replaces the rank's earlier one.
  const uint64_t need = RegistrationBytes(ranges, f.optimizer->num_state());
  RoomCheck room;
  uint64_t had = 0;
  {
    MutexLock l(&mu_);
    room = room_;
    if (auto it = charged_.find(rank); it != charged_.end()) had = it->second;
  }
  // Asked without mu_: the check reads bytes_in_use().
  if (room && need > had) {
    Status st = room(need - had, fmt::format("the AOR replicas rank {} feeds ({} of them: "
                                             "staging file, replica files and state)",
                                             rank, ranges.size()));
    if (!st.ok()) {
      MEMENTO_LOG_WARN("aor: {}; rank {} feeds no replica, their copies stay network copies",
                       st.ToString(), rank);
      ranges.clear();
      total = 0;
      MutexLock l(&mu_);
      ++stats_.budget_refused;
    }
  }
  {
    MutexLock l(&mu_);
    charged_[rank] = RegistrationBytes(ranges, f.optimizer->num_state());
  }
  shm::AorRegisterReply reply;
  for (const AorRange& r : ranges) reply.ranges.push_back({r.owner, r.offset, r.count});
  if (!ranges.empty()) {
    reply.path = StagePath(rank);
    const size_t bytes = shm::StageFileBytes(total);
    unlink(reply.path.c_str());  // a stale one of another size or content
    MEMENTO_ASSIGN_OR_RETURN(f.stage, shm::Segment::CreateOrGrow(reply.path, bytes));
    auto* h = shm::StageHeader(f.stage->data());
    std::memset(h, 0, sizeof(*h));
    std::memcpy(h->magic, kAorStageMagic, sizeof(h->magic));
    h->num_ranges = static_cast<uint32_t>(ranges.size());
    h->slots = shm::kAorStageSlots;
    h->total_count = total;
    for (int k = 0; k < shm::kAorStageSlots; ++k) {
      AorStageSlot* slot = shm::StageSlot(f.stage->data(), k);
      std::memset(slot, 0, sizeof(*slot));
      slot->step = -1;
    }
  }
  f.ranges = std::move(ranges);
  std::unique_ptr<Watcher> old;
  {
    MutexLock q(&q_mu_);
    stages_[rank] = f.stage;
    queued_seq_.erase(rank);
    auto w = watchers_.find(rank);
    if (w != watchers_.end()) {
      old = std::move(w->second);
      watchers_.erase(w);
    }
  }
  StopWatcher(std::move(old));  // it watched the file this one replaced
  {
    MutexLock p(&sum_mu_);
    published_.erase(rank);
  }
  if (f.stage != nullptr) {
    MutexLock q(&q_mu_);
    if (!stop_) {
      auto w = std::make_unique<Watcher>();
      w->stage = f.stage;
      Watcher* raw = w.get();
      w->thread = std::thread([this, rank, raw] {
        NameThisThread("aor-watch");
        Watch(rank, raw);
      });
      watchers_[rank] = std::move(w);
    }
  }
  MutexLock l(&mu_);
  for (const AorRange& r : f.ranges) {
    auto it = replicas_.find(r.owner);
    if (it != replicas_.end() && it->second.range.offset == r.offset &&
        it->second.range.count == r.count && it->second.r != nullptr) {
      continue;  // a re-registration (trainer restarted): keep the replica
    }
    Held rep;
    rep.range = r;
    // A replica file left by an earlier agent or trainer is adopted when it
    // checks; otherwise the replica is seeded at the first capture.
    if (access(ReplicaPath(r.owner).c_str(), F_OK) == 0) {
      auto adopted = ReadAorFile(ReplicaPath(r.owner), r, f.optimizer, f.optimizer_hash);
      if (adopted.ok()) {
        MEMENTO_LOG_INFO("aor: adopted the replica of rank {} at step {} from {}", r.owner,
                         adopted->replica->step(), ReplicaPath(r.owner));
        rep.file = std::move(adopted->file);
        rep.r = std::move(adopted->replica);
        rep.checksums[rep.r->step()] = rep.r->checksum();
      } else {
        MEMENTO_LOG_WARN("aor: {}; the replica is seeded again", adopted.status().ToString());
      }
    }
    replicas_[r.owner] = std::move(rep);
  }
  MEMENTO_LOG_INFO("aor: rank {} feeds {} replica(s) ({} elements per step)", rank,
                   reply.ranges.size(),
                   f.stage ? shm::StageHeader(f.stage->data())->total_count : 0);
  feeders_[rank] = std::move(f);
  return reply;
}

Status AorHolder::SeedLocked(Held& rep, const Feeder& f, int64_t step, const float* params) {
  if (!seed_) return FailedPreconditionError("no seed source");
  MEMENTO_ASSIGN_OR_RETURN(SeedBytes sb, seed_(rep.range, step));
  const int ns = f.optimizer->num_state();
  if (sb.state.size() != static_cast<size_t>(ns) * rep.range.count) {
    return InvalidArgumentError(
        fmt::format("seed of rank {}'s shard at step {}: {} floats, {} "
                    "expected",
                    rep.range.owner, step, sb.state.size(), uint64_t(ns) * rep.range.count));
  }
  if (rep.r == nullptr || rep.file == nullptr) {
    // A new file: its state areas are the replica's memory from now on.
    rep.r.reset();
    rep.file.reset();
    MEMENTO_ASSIGN_OR_RETURN(rep.file, CreateAorFile(ReplicaPath(rep.range.owner), rep.range, ns));
    MEMENTO_ASSIGN_OR_RETURN(
        rep.r, opt::AorReplica::Create(f.optimizer, rep.range.offset, rep.range.count,
                                       AorFileAreas(rep.file, rep.range.count, ns, 0)));
  }
  std::vector<const float*> slices;
  for (int k = 0; k < ns; ++k) slices.push_back(sb.state.data() + k * rep.range.count);
  MarkAorAreaWriting(*rep.file, rep.r->spare_area());
  MEMENTO_RETURN_IF_ERROR(rep.r->Seed(step, params, slices, sb.owner_checksum));
  PublishAorArea(*rep.file, rep.range, f.optimizer_hash, *rep.r);
  ++rep.seeds;
  ++stats_.seeded;
  // Not recorded in `checksums`: a seed is the owner's bytes, checking it
  // against the owner's checksum would prove nothing about the host step.
  rep.checksums.clear();
  MEMENTO_LOG_INFO("aor: the replica of rank {} seeded from its shard of step {} (seed {})",
                   rep.range.owner, step, rep.seeds);
  return Status::Ok();
}

Status AorHolder::AdvanceLocked(Held& rep, const Feeder& f, int64_t step, float lr,
                                const float* grads, const float* params) {
  MarkAorAreaWriting(*rep.file, rep.r->spare_area());
  MEMENTO_RETURN_IF_ERROR(rep.r->Advance(step, lr, grads, params));
  PublishAorArea(*rep.file, rep.range, f.optimizer_hash, *rep.r);
  return Status::Ok();
}

namespace {

// What a slot that cannot be used for `step` holds, for the refusal.
std::string SlotProblem(const AorStageSlot* slot, uint32_t state, int64_t step) {
  if (state == kStageReady && slot->step > step) {
    return fmt::format("holds step {}: overwritten before the agent read step {}", slot->step,
                       step);
  }
  if (state == kStageReady && slot->step != step) {
    return fmt::format("holds step {}, not step {}", slot->step, step);
  }
  return fmt::format("is {} (step {})", shm::StageStateName(state), slot->step);
}

}  // namespace

bool AorHolder::EnqueueLocked(int rank, const AorStageSlot* slot, int64_t step, float lr) {
  uint32_t& last = queued_seq_[rank][shm::StageSlotOf(step)];
  if (slot->seq == last) return false;  // this write of the slot is queued already
  last = slot->seq;
  ++submitted_;
  queue_.push_back(Queued{rank, step, lr});
  pending_.insert(step);
  if (!worker_.joinable())
    worker_ = std::thread([this] {
      NameThisThread("aor-worker");
      Worker();
    });
  q_cv_.SignalAll();
  return true;
}

void AorHolder::ScanLocked(int rank, const shm::Segment& stage) {
  if (stop_) return;
  // The older step first: the replica advances in step order.
  const AorStageSlot* ready[shm::kAorStageSlots];
  int n = 0;
  for (int k = 0; k < shm::kAorStageSlots; ++k) {
    const AorStageSlot* slot = shm::StageSlot(stage.data(), k);
    if (shm::StageState(slot) == kStageReady && slot->step >= 1) ready[n++] = slot;
  }
  if (n == 2 && ready[1]->step < ready[0]->step) std::swap(ready[0], ready[1]);
  for (int i = 0; i < n; ++i) {
    // lr from the slot (NaN: the optimizer's schedule); Capture checks the
    // state and the step again when it takes it.
    if (EnqueueLocked(rank, ready[i], ready[i]->step, ready[i]->lr)) ++rang_;
  }
}

void AorHolder::PublishRing(int rank, const shm::Segment& stage) {
  if (!on_checksum_) return;
  MutexLock p(&sum_mu_);
  std::vector<std::pair<int64_t, uint64_t>> fresh;
  auto& done = published_[rank];
  for (int k = 0; k < shm::kAorSumRing; ++k) {
    int64_t step = 0;
    uint64_t sum = 0;
    if (!shm::ReadStageSum(stage.data(), k, &step, &sum) || step < 1) continue;
    auto it = done.find(k);
    if (it != done.end() && it->second == std::make_pair(step, sum)) continue;
    done[k] = {step, sum};
    fresh.emplace_back(step, sum);
  }
  std::sort(fresh.begin(), fresh.end());
  for (const auto& [step, sum] : fresh) {
    Status st = on_checksum_(rank, step, sum);
    ++sums_published_;
    if (!st.ok()) {
      MEMENTO_LOG_WARN("aor: publishing rank {}'s shard checksum of step {}: {}", rank, step,
                       st.ToString());
    }
  }
}

void AorHolder::Watch(int rank, Watcher* w) {
  // Below the trainers, as the AOR thread: a ring must not preempt the
  // trainer that rang (the node's step path publishes the checksums itself
  // when this thread lags: PublishChecksums).
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  uint8_t* base = w->stage->data();
  // Only a ring makes it look: a slot nobody rang for is the business of
  // whoever wrote it (Submit, Capture, WaitCaptured's scan). From the
  // doorbell's value at Register (0), not at this thread's start: rings
  // before it ran are not missed.
  uint32_t seen = 0;
  while (!w->stop.load()) {
    // Returns at once when the doorbell moved since `seen` (no wake is
    // missed); the timeout only bounds how long a stop waits.
    shm::WaitStageDoorbell(base, seen, 200);
    if (w->stop.load()) break;
    const uint32_t now = shm::StageDoorbell(base);
    if (now == seen) continue;
    seen = now;
    {
      MutexLock q(&q_mu_);
      ScanLocked(rank, *w->stage);
    }
    PublishRing(rank, *w->stage);
  }
}

void AorHolder::PublishChecksums() {
  std::vector<std::pair<int, std::shared_ptr<shm::Segment>>> stages;
  {
    MutexLock q(&q_mu_);
    for (const auto& [rank, seg] : stages_) {
      if (seg != nullptr) stages.emplace_back(rank, seg);
    }
  }
  for (const auto& [rank, seg] : stages) PublishRing(rank, *seg);
}

Status AorHolder::Submit(int rank, int64_t step, float lr) {
  MutexLock q(&q_mu_);
  auto it = stages_.find(rank);
  if (it == stages_.end()) {
    return FailedPreconditionError(fmt::format(
        "'aor_capture' of rank {}: the rank registered no gradients (aor_register)", rank));
  }
  if (it->second == nullptr) return Status::Ok();  // it feeds no replica
  const shm::Segment& stage = *it->second;
  const AorStageSlot* slot = shm::StageSlot(stage.data(), shm::StageSlotOf(step));
  const uint32_t state = shm::StageState(slot);
  if (state != kStageReady || slot->step != step) {
    ++submit_refused_;
    return FailedPreconditionError(
        fmt::format("'aor_capture' of rank {} step {}: the staging file {} slot {} {}", rank, step,
                    stage.path(), shm::StageSlotOf(step), SlotProblem(slot, state, step)));
  }
  if (stop_) return UnavailableError("the agent's AOR thread is stopping");
  EnqueueLocked(rank, slot, step, lr);  // false: its watcher queued it first
  return Status::Ok();
}

bool AorHolder::WaitCaptured(int64_t step, Deadline deadline) {
  MutexLock q(&q_mu_);
  for (const auto& [rank, seg] : stages_) {
    if (seg != nullptr) ScanLocked(rank, *seg);
  }
  while (!pending_.empty() && *pending_.begin() <= step) {
    if (stop_ || deadline.expired()) return false;
    q_cv_.WaitUntil(&q, std::min(deadline.when(), Now() + std::chrono::milliseconds(50)));
  }
  return true;
}

void AorHolder::Worker() {
  // Below the trainers: the host step must not take their CPU (a nice-10
  // thread still runs; SCHED_IDLE could starve it and delay the step's
  // COMPLETED report, which waits for it).
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  while (true) {
    Queued job{};
    {
      MutexLock q(&q_mu_);
      while (queue_.empty() && !stop_) q_cv_.Wait(&q);
      if (stop_) {
        pending_.clear();
        q_cv_.SignalAll();
        return;
      }
      job = queue_.front();
      queue_.pop_front();
    }
    Status st = Capture(job.rank, job.step, job.lr);
    if (!st.ok()) {
      MEMENTO_LOG_WARN("aor: rank {}: {}", job.rank, st.ToString());
      MutexLock l(&mu_);
      ++stats_.capture_errors;
    }
    {
      MutexLock q(&q_mu_);
      pending_.erase(pending_.find(job.step));
    }
    q_cv_.SignalAll();
  }
}

Status AorHolder::Capture(int rank, int64_t step, float lr) {
  MutexLock l(&mu_);
  auto fit = feeders_.find(rank);
  if (fit == feeders_.end()) {
    return FailedPreconditionError(fmt::format(
        "'aor_capture' of rank {}: the rank registered no gradients (aor_register)", rank));
  }
  Feeder& f = fit->second;
  if (f.ranges.empty()) return Status::Ok();
  // Take the slot: Ready -> Reading, copy the slices out, -> Done.
  const int k = shm::StageSlotOf(step);
  AorStageSlot* slot = shm::StageSlot(f.stage->data(), k);
  uint32_t state = kStageReady;
  if (!__atomic_compare_exchange_n(&slot->state, &state, kStageReading, /*weak=*/false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    ++stats_.stage_refused;
    return FailedPreconditionError(
        fmt::format("'aor_capture' of rank {} step {}: the staging file {} slot {} {}; not used",
                    rank, step, f.stage->path(), k, SlotProblem(slot, state, step)));
  }
  if (slot->step != step) {
    const std::string why = SlotProblem(slot, kStageReady, step);
    __atomic_store_n(&slot->state, kStageReady, __ATOMIC_RELEASE);  // its own capture reads it
    ++stats_.stage_refused;
    return FailedPreconditionError(
        fmt::format("'aor_capture' of rank {} step {}: the staging file {} slot {} {}; not used",
                    rank, step, f.stage->path(), k, why));
  }
  const uint64_t written = slot->data_checksum;
  const float* data = shm::StageData(f.stage->data(), k);
  if (std::isnan(lr)) lr = f.optimizer->LearningRate(step);
  // One pass per range straight from the slot (Reading: the client leaves
  // it alone until Done): the slices' hashes and, for a replica at t-1, the
  // host step into its spare area with the result's checksums. Nothing
  // becomes the replica's before the slices are known to be the client's.
  const size_t nr = f.ranges.size();
  slice_hashes_.assign(2 * nr, 0);
  prepared_.assign(nr, 0);
  uint64_t pos = 0;
  for (size_t i = 0; i < nr; ++i) {
    const AorRange& range = f.ranges[i];
    const float* grads = data + pos;
    const float* params = data + pos + range.count;
    pos += 2 * range.count;
    Held& rep = replicas_[range.owner];
    rep.range = range;
    if (rep.r != nullptr && rep.file != nullptr && !rep.r->diverged() &&
        rep.r->step() == step - 1) {
      MarkAorAreaWriting(*rep.file, rep.r->spare_area());
      auto in = rep.r->Prepare(step, lr, grads, params);
      if (in.ok()) {
        slice_hashes_[2 * i] = in->grads_hash;
        slice_hashes_[2 * i + 1] = in->params_hash;
        prepared_[i] = 1;
        continue;
      }
      MEMENTO_LOG_ERROR("aor: replica of rank {}: {}", range.owner, in.status().ToString());
    }
    slice_hashes_[2 * i] = Checksum(grads, range.count * sizeof(float));
    slice_hashes_[2 * i + 1] = Checksum(params, range.count * sizeof(float));
  }
  const uint64_t sum = shm::StageDataChecksum(slice_hashes_.data(), slice_hashes_.size());
  if (sum != written) {
    __atomic_store_n(&slot->state, kStageDone, __ATOMIC_RELEASE);
    ++stats_.stage_refused;
    return DataLossError(fmt::format(
        "'aor_capture' of rank {} step {}: the staged slices hash to {}, the client wrote {}; not "
        "used (the replicas stay at their step)",
        rank, step, Hex(sum), Hex(written)));
  }
  // The prepared steps: the local check, then commit. A replica that is
  // new, at another step or refused is seeded after the slot is released
  // (the seed may wait on the owner's copy): its slices are copied out.
  pos = 0;
  seed_slices_.clear();
  for (size_t i = 0; i < nr; ++i) {
    const AorRange& range = f.ranges[i];
    const float* staged = data + pos;
    pos += 2 * range.count;
    Held& rep = replicas_[range.owner];
    if (prepared_[i]) {
      // The staged parameters are the owner's of t-1.
      Status st = rep.r->ConfirmParamsHash(step - 1, slice_hashes_[2 * i + 1]);
      if (st.ok()) st = rep.r->Commit();
      if (st.ok()) {
        PublishAorArea(*rep.file, rep.range, f.optimizer_hash, *rep.r);
        ++stats_.advanced;
        rep.checksums[step] = rep.r->checksum();
        while (rep.checksums.size() > kKeptChecksums) rep.checksums.erase(rep.checksums.begin());
        prepared_[i] = 2;  // advanced to `step` by this capture
        continue;
      }
      ++stats_.refused;
      MEMENTO_LOG_ERROR("aor: {}; the replica is refused and seeded again", st.ToString());
      prepared_[i] = 0;
    }
    seed_slices_.insert(seed_slices_.end(), staged, staged + 2 * range.count);
  }
  __atomic_store_n(&slot->state, kStageDone, __ATOMIC_RELEASE);
  pos = 0;
  for (size_t i = 0; i < nr; ++i) {
    if (prepared_[i] == 2) continue;
    const AorRange& range = f.ranges[i];
    const float* grads = seed_slices_.data() + pos;
    const float* params = grads + range.count;
    pos += 2 * range.count;
    Held& rep = replicas_[range.owner];
    Status st = SeedLocked(rep, f, step - 1, params);
    if (!st.ok()) {
      if (st.code() == StatusCode::kNotFound || st.code() == StatusCode::kUnavailable) {
        MEMENTO_LOG_DEBUG("aor: replica of rank {} not seeded at step {}: {}", range.owner,
                          step - 1, st.ToString());
      } else {
        MEMENTO_LOG_WARN("aor: replica of rank {} not seeded at step {}: {}", range.owner, step - 1,
                         st.ToString());
      }
      continue;
    }
    st = AdvanceLocked(rep, f, step, lr, grads, params);
    if (!st.ok()) {
      MEMENTO_LOG_ERROR("aor: replica of rank {}: {}", range.owner, st.ToString());
      continue;
    }
    ++stats_.advanced;
    rep.checksums[step] = rep.r->checksum();
    while (rep.checksums.size() > kKeptChecksums) rep.checksums.erase(rep.checksums.begin());
    prepared_[i] = 2;
  }
  if (on_advanced_) {
    for (size_t i = 0; i < nr; ++i) {
      if (prepared_[i] == 2) on_advanced_(f.ranges[i], step, *replicas_[f.ranges[i].owner].r);
    }
  }
  return Status::Ok();
}

std::unique_ptr<AorHolder::View> AorHolder::Replica(int owner) {
  MutexLock l(&mu_);
  auto it = replicas_.find(owner);
  if (it == replicas_.end() || it->second.r == nullptr) return nullptr;
  auto v = std::make_unique<View>();
  const opt::AorReplica& r = *it->second.r;
  v->range = it->second.range;
  v->saved = r.saved();
  v->reseeds = std::max<int64_t>(0, it->second.seeds - 1);
  for (int k = 0; k < r.num_state(); ++k) {
    v->state.insert(v->state.end(), r.state(k), r.state(k) + r.count());
  }
  return v;
}

Result<uint64_t> AorHolder::ChecksumOf(int owner, int64_t step) {
  MutexLock l(&mu_);
  auto it = replicas_.find(owner);
  if (it == replicas_.end()) {
    return NotFoundError(fmt::format("no aor replica of rank {} on this node", owner));
  }
  auto c = it->second.checksums.find(step);
  if (c == it->second.checksums.end()) {
    return NotFoundError(
        fmt::format("the aor replica of rank {} did not compute step {}", owner, step));
  }
  return c->second;
}

void AorHolder::Refuse(int owner, const std::string& why) {
  MutexLock l(&mu_);
  auto it = replicas_.find(owner);
  if (it == replicas_.end() || it->second.r == nullptr) return;
  ++stats_.refused;
  MEMENTO_LOG_ERROR("aor: the replica of rank {} is refused ({}); it is seeded again", owner, why);
  it->second.r.reset();
  it->second.file.reset();
  it->second.checksums.clear();
  unlink(ReplicaPath(owner).c_str());
}

AorHolder::Stats AorHolder::stats() {
  Stats s;
  {
    MutexLock l(&mu_);
    s = stats_;
  }
  {
    MutexLock q(&q_mu_);
    s.submitted = submitted_;
    s.rang = rang_;
    s.stage_refused += submit_refused_;
  }
  MutexLock p(&sum_mu_);
  s.sums_published = sums_published_;
  return s;
}

}  // namespace memento::agent
