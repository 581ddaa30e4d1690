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

// The chunk table of a whole-tensor version must cover every byte of every
// tensor exactly once, in order: then a version that copies without a
// checksum failure has overwritten every registered byte (what makes the
// fallback to an older version after a failed fused copy exact), and no
// chunk can write outside its tensor. DataLoss naming the first gap,
// overlap or overrun otherwise (nothing written).
Status CheckChunkCoverage(const shm::SlotInfo& info) {
  std::vector<uint64_t> cursor(info.tensors.size());
  for (size_t t = 0; t < info.tensors.size(); ++t) cursor[t] = info.tensors[t].offset;
  for (size_t i = 0; i < info.chunks.size(); ++i) {
    const shm::ChunkEntry& e = info.chunks[i];
    const shm::SavedTensor& t = info.tensors[e.tensor_index];
    if (e.offset != cursor[e.tensor_index] || e.length > t.offset + t.nbytes - e.offset) {
      return DataLossError(fmt::format(
          "chunk {} (data bytes {}..{}) does not continue tensor '{}' (data bytes {}..{}, next "
          "expected at {}); nothing was written",
          i, e.offset, e.offset + e.length, t.meta.name, t.offset, t.offset + t.nbytes,
          cursor[e.tensor_index]));
    }
    cursor[e.tensor_index] += e.length;
  }
  for (size_t t = 0; t < info.tensors.size(); ++t) {
    const shm::SavedTensor& st = info.tensors[t];
    if (cursor[t] != st.offset + st.nbytes) {
      return DataLossError(fmt::format(
          "the chunk table covers {} of the {} bytes of tensor '{}'; nothing was written",
          cursor[t] - st.offset, st.nbytes, st.meta.name));
    }
  }
  return Status::Ok();
}

// Copies a version into the registered tensors and checks every chunk's
// checksum in the same pass (one read of the slot: each chunk is hashed as
// it streams through the cores on its way into the tensor;
// snap::CopyAndChecksumStreaming). The version is not verified before the
// first byte is written, so a failure here leaves the registered tensors
// partly overwritten: any chunk of this version up to the bad one (on
// copy_threads threads, in no fixed order) and the bad chunk itself may have
// been copied; the message says so. The caller then loads an older version,
// which overwrites every registered byte (CheckChunkCoverage), or returns
// the failure (docs/node_store.md, "Restore").
Status VerifyAndCopyVersion(const RestoreContext& ctx, const shm::Segment& seg,
                            const shm::SlotInfo& info,
                            const std::map<std::string, const RegisteredTensor*>& by_name,
                            uint64_t* bytes) {
  const uint8_t* data = seg.data() + info.data_offset;
  std::vector<snap::CopyChunk> chunks, device_chunks;
  chunks.reserve(info.chunks.size());
  // Each host chunk's checksum as found (the expected one until copied),
  // and its index in the table: the message names the first bad chunk.
  std::vector<uint64_t> found;
  std::vector<size_t> table_index;
  found.reserve(info.chunks.size());
  table_index.reserve(info.chunks.size());
  for (size_t i = 0; i < info.chunks.size(); ++i) {
    const shm::ChunkEntry& e = info.chunks[i];
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
    found.push_back(e.checksum);
    table_index.push_back(i);
    chunks.push_back(cc);
  }
  for (size_t k = 0; k < chunks.size(); ++k) chunks[k].checksum_out = &found[k];
  auto job = ctx.engine->Submit(std::move(chunks), nullptr, [](const Status& s) { return s; });
  Status st = ctx.help_engine ? ctx.engine->HelpAndWait(*job, Deadline::Infinite()) : job->Wait();
  if (st.code() == StatusCode::kDataLoss) {
    for (size_t k = 0; k < found.size(); ++k) {
      const shm::ChunkEntry& e = info.chunks[table_index[k]];
      if (found[k] == e.checksum) continue;
      const shm::SavedTensor& t = info.tensors[e.tensor_index];
      st = DataLossError(fmt::format(
          "chunk {} (bytes {}..{} of tensor '{}', {} bytes) fails its checksum: {:#018x} "
          "expected, {:#018x} found",
          table_index[k], e.offset - t.offset, e.offset - t.offset + e.length, t.meta.name,
          e.length, e.checksum, found[k]));
      break;
    }
  }
  uint64_t device_bytes = 0;
  if (st.ok() && !device_chunks.empty()) {
    st = ctx.device != nullptr ? ctx.device->CopyFromSlot(device_chunks, &device_bytes)
                               : InternalError("device chunk without CUDA");
  }
  if (st.ok() && !shm::SlotUnchanged(seg, info)) {
    st = AbortedError(fmt::format("slot {} was rewritten while it was copied", seg.path()));
  }
  if (!st.ok()) {
    return Status(st.code(), st.message() +
                                 " (checked while copying: the registered tensors are partly "
                                 "overwritten with this version's chunks)");
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
  Status st = CheckChunkCoverage(info);
  if (st.ok()) {
    Stopwatch copy_sw;
    st = VerifyAndCopyVersion(ctx, *seg, info, by_name, &stats->bytes);
    stats->copy_s += copy_sw.Seconds();
    if (!st.ok()) stats->overwritten = true;
  }
  if (!st.ok()) return st.WithContext("the assembled slot " + staged.path);
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
          stats.overwritten = false;  // every registered byte is this version's
          stats.step = c.info.step;
          stats.restore_s = sw.Seconds();
          for (const auto& s : stats.skipped) MEMENTO_LOG_WARN("restore skipped {}", s);
          MEMENTO_LOG_INFO(
              "restored step {} ({} bytes) from its assembled pieces in {:.3f} s (verified while "
              "copied: {:.3f} s)",
              stats.step, stats.bytes, stats.restore_s, stats.copy_s);
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
    // Verified while copied (docs/node_store.md, "Restore"): a version that
    // fails its checksums leaves the tensors partly overwritten, and the
    // next older version, if intact, then overwrites every byte.
    const shm::Segment& seg = *ctx.slots[c.slot];
    Status st = CheckChunkCoverage(c.info);
    if (st.ok()) {
      // The slot this restore reads is touched now (the background thread
      // may be on the other one, which the next snapshot writes).
      ctx.prefaults->slot(c.slot).HelpAndWait();
      Stopwatch copy_sw;
      st = VerifyAndCopyVersion(ctx, seg, c.info, by_name, &stats.bytes);
      stats.copy_s += copy_sw.Seconds();
      if (!st.ok()) stats.overwritten = true;
    }
    if (st.ok()) {
      stats.overwritten = false;  // every registered byte is this version's
      stats.step = c.info.step;
      stats.restore_s = sw.Seconds();
      for (const auto& s : stats.skipped) MEMENTO_LOG_WARN("restore skipped {}", s);
      MEMENTO_LOG_INFO("restored step {} ({} bytes) in {:.3f} s (verified while copied: {:.3f} s)",
                       stats.step, stats.bytes, stats.restore_s, stats.copy_s);
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
    std::string msg = fmt::format(
        "no intact version of rank {} of job {} is left ({}):", options.rank, options.job_id,
        stats.overwritten ? "the registered tensors are partly overwritten: load them from "
                            "elsewhere or re-initialise them"
                          : "nothing was written");
    for (const auto& s : stats.skipped) msg += "\n  - " + s;
    return DataLossError(msg);
  }
  return NotFoundError(fmt::format("no saved version of rank {} of job {} in {}", options.rank,
                                   options.job_id, ctx.agent->dir()));
}

}  // namespace memento::client
