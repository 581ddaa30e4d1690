#include "client/restore.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "shm/agent_messages.h"
#include "snap/copy_kernel.h"

namespace memento::client {
namespace {

// How long the agent may take to assemble a rank's state from its pieces
// (reads from every member of its sharding group).
constexpr double kAssembleTimeoutS = 300;

// Checks every chunk of the version `info` describes against its checksum,
// on the copy engine's number of threads, reading the slot only. DataLoss
// naming the first bad chunk; Aborted when the slot was rewritten meanwhile.
Status VerifyVersion(const shm::Segment& seg, const shm::SlotInfo& info, int copy_threads) {
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
  const size_t n = std::min<size_t>(std::max(1, copy_threads), info.chunks.size());
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
Status CopyVersion(const RestoreContext& ctx, const shm::Segment& seg, const shm::SlotInfo& info,
                   const std::map<std::string, const RegisteredTensor*>& by_name, uint64_t* bytes) {
  const uint8_t* data = seg.data() + info.data_offset;
  std::vector<snap::CopyChunk> chunks, device_chunks;
  chunks.reserve(info.chunks.size());
  for (const shm::ChunkEntry& e : info.chunks) {
    const shm::SavedTensor& t = info.tensors[e.tensor_index];
    const RegisteredTensor* r = by_name.at(t.meta.name);
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
  auto job = ctx.engine->Submit(std::move(chunks), nullptr, [](const Status& s) { return s; });
  Status st = ctx.help_engine ? ctx.engine->HelpAndWait(*job, Deadline::Infinite()) : job->Wait();
  uint64_t device_bytes = 0;
  if (st.ok() && !device_chunks.empty()) {
    st = ctx.device != nullptr ? ctx.device->CopyFromSlot(device_chunks, &device_bytes)
                               : InternalError("device chunk without CUDA");
  }
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

// Restores step `step` of a sharded slot (`slot`): the agent assembles the
// rank's whole state from the plan pieces into a staged whole-tensor slot,
// which is checked like the rank's own (tensors against the registered
// ones: InvalidArgument, nothing written; every chunk verified before the
// first registered byte is written), copied, and removed.
Result<RestoredVersion> RestoreAssembled(
    const RestoreContext& ctx, int slot, int64_t step, const std::vector<TensorMeta>& metas,
    const std::map<std::string, const RegisteredTensor*>& by_name, RestoreStats* stats) {
  const ClientOptions& options = *ctx.options;
  Stopwatch assemble_sw;
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json reply,
                           ctx.agent->Call(shm::AssembleRequest(options.rank, step),
                                           Deadline::AfterSeconds(kAssembleTimeoutS)));
  MEMENTO_ASSIGN_OR_RETURN(shm::AssembleReply staged, shm::ParseAssembleReply(reply));
  MEMENTO_LOG_INFO("restore: the agent assembled step {} of rank {} ({} bytes) in {:.3f} s", step,
                   options.rank, staged.bytes, assemble_sw.Seconds());
  // Removed whatever happens below (the mapping outlives the name).
  struct Unlink {
    std::string path;
    ~Unlink() { unlink(path.c_str()); }
  } unlink_staged{staged.path};
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> seg,
                           shm::Segment::Open(staged.path, /*writable=*/false));
  MEMENTO_ASSIGN_OR_RETURN(shm::SlotInfo info, shm::ReadSlot(*seg));
  if (info.state != shm::SlotState::kComplete || info.step != step || info.rank != options.rank ||
      info.job_id != options.job_id || shm::HasRangeEntries(info.tensors)) {
    return DataLossError(fmt::format(
        "the agent's assembled slot {} holds {} step {} of rank {} (job '{}'), not the whole "
        "complete step {} of rank {} (job '{}')",
        staged.path, shm::SlotStateName(info.state), info.step, info.rank, info.job_id, step,
        options.rank, options.job_id));
  }
  std::vector<std::string> diffs = shm::DiffTensors(info.tensors, metas);
  if (!diffs.empty()) {
    std::string msg = fmt::format(
        "cannot restore step {} of rank {}: the saved tensors differ from the registered "
        "ones ({} difference{}); nothing was written:",
        step, options.rank, diffs.size(), diffs.size() == 1 ? "" : "s");
    for (const auto& d : diffs) msg += "\n  - " + d;
    return InvalidArgumentError(msg);
  }
  Stopwatch verify_sw;
  Status st = VerifyVersion(*seg, info, options.copy_threads);
  stats->verify_s += verify_sw.Seconds();
  if (!st.ok()) return st.WithContext("the assembled slot " + staged.path);
  Stopwatch copy_sw;
  st = CopyVersion(ctx, *seg, info, by_name, &stats->bytes);
  stats->copy_s += copy_sw.Seconds();
  MEMENTO_RETURN_IF_ERROR(st);
  return RestoredVersion{step, slot};
}

}  // namespace

Result<RestoredVersion> RestoreVersion(const RestoreContext& ctx, std::optional<int64_t> only,
                                       std::optional<RestoreStats>* out) {
  const ClientOptions& options = *ctx.options;
  Stopwatch sw;
  RestoreStats stats;
  struct Candidate {
    int slot;
    shm::SlotInfo info;
  };
  std::vector<Candidate> candidates;
  std::vector<int64_t> held;  // complete versions other than `only`
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    auto info = shm::ReadSlot(*ctx.slots[s]);
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
  std::map<std::string, const RegisteredTensor*> by_name;
  for (const RegisteredTensor& r : *ctx.tensors) {
    metas.push_back(r.meta);
    by_name[r.meta.name] = &r;
  }
  for (const Candidate& c : candidates) {
    if (shm::HasRangeEntries(c.info.tensors)) {
      // A sharded slot (docs/reft.md, section 3): the agent stages the
      // rank's whole state from its plan pieces, then the same checks.
      Result<RestoredVersion> r =
          RestoreAssembled(ctx, c.slot, c.info.step, metas, by_name, &stats);
      if (r.ok() || r.status().code() == StatusCode::kInvalidArgument) {
        if (r.ok()) {
          stats.step = c.info.step;
          stats.restore_s = sw.Seconds();
          for (const auto& s : stats.skipped) MEMENTO_LOG_WARN("restore skipped {}", s);
          MEMENTO_LOG_INFO(
              "restored step {} ({} bytes) from its assembled pieces in {:.3f} s (verify {:.3f} "
              "s, copy {:.3f} s)",
              stats.step, stats.bytes, stats.restore_s, stats.verify_s, stats.copy_s);
        }
        *out = stats;
        return r;
      }
      std::string line =
          fmt::format("step {} (slot {}, sharded): {}", c.info.step, c.slot, r.status().ToString());
      MEMENTO_LOG_ERROR("restore: {}{}", line, only.has_value() ? "" : "; trying an older version");
      stats.skipped.push_back(line);
      if (only.has_value()) {
        // No other version may be loaded: the assembly's own error.
        stats.restore_s = sw.Seconds();
        *out = stats;
        return r.status().WithContext(
            fmt::format("restoring step {} of rank {} from its pieces", *only, options.rank));
      }
      continue;
    }
    std::vector<std::string> diffs = shm::DiffTensors(c.info.tensors, metas);
    if (!diffs.empty()) {
      std::string msg = fmt::format(
          "cannot restore step {} of rank {}: the saved tensors differ from the registered "
          "ones ({} difference{}); nothing was written:",
          c.info.step, options.rank, diffs.size(), diffs.size() == 1 ? "" : "s");
      for (const auto& d : diffs) msg += "\n  - " + d;
      return InvalidArgumentError(msg);
    }
    // Verify the whole version before the first byte of registered memory
    // is written: a version that fails its checksums leaves the tensors
    // untouched (docs/node_store.md, "Restore").
    const shm::Segment& seg = *ctx.slots[c.slot];
    // The slot this restore reads is touched now (the background thread
    // may be on the other one, which the next snapshot writes).
    ctx.prefaults->slot(c.slot).HelpAndWait();
    Stopwatch verify_sw;
    Status st = VerifyVersion(seg, c.info, options.copy_threads);
    stats.verify_s += verify_sw.Seconds();
    if (st.ok()) {
      Stopwatch copy_sw;
      st = CopyVersion(ctx, seg, c.info, by_name, &stats.bytes);
      stats.copy_s += copy_sw.Seconds();
    }
    if (st.ok()) {
      stats.step = c.info.step;
      stats.restore_s = sw.Seconds();
      for (const auto& s : stats.skipped) MEMENTO_LOG_WARN("restore skipped {}", s);
      MEMENTO_LOG_INFO("restored step {} ({} bytes) in {:.3f} s (verify {:.3f} s, copy {:.3f} s)",
                       stats.step, stats.bytes, stats.restore_s, stats.verify_s, stats.copy_s);
      *out = stats;
      return RestoredVersion{c.info.step, c.slot};
    }
    std::string line = fmt::format("step {} (slot {}): {}", c.info.step, c.slot, st.ToString());
    MEMENTO_LOG_ERROR("restore: {}{}", line, only.has_value() ? "" : "; trying an older version");
    stats.skipped.push_back(line);
    // Corruption at rest: have the agent re-check, so its inventory agrees.
    ctx.agent
        ->Call(shm::VerifyRequest(options.rank, c.slot), Deadline::AfterSeconds(60),
               /*reconnect_s=*/0)
        .status()
        .IgnoreError();
  }
  stats.restore_s = sw.Seconds();
  *out = stats;
  if (only.has_value() && candidates.empty()) {
    std::string list;
    for (int64_t h : held) list += (list.empty() ? "" : ", ") + std::to_string(h);
    std::string msg = fmt::format(
        "rank {} of job {} holds no complete version of step {} (complete versions: [{}])",
        options.rank, options.job_id, *only, list);
    for (const auto& s : stats.skipped) msg += "\n  - unreadable: " + s;
    return NotFoundError(msg);
  }
  if (!stats.skipped.empty()) {
    std::string msg = fmt::format("no intact version of rank {} of job {} is left:", options.rank,
                                  options.job_id);
    for (const auto& s : stats.skipped) msg += "\n  - " + s;
    return DataLossError(msg);
  }
  return NotFoundError(fmt::format("no saved version of rank {} of job {} in {}", options.rank,
                                   options.job_id, ctx.agent->dir()));
}

}  // namespace memento::client
