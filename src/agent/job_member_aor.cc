// JobMember: AOR (docs/reft.md section 5): the replicas this node's ranks
// feed, the owners' shard checksums, the copies made from a replica and
// checked against them, and the node's memory budget.

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/job_member.h"
#include "common/human.h"
#include "common/log.h"
#include "coord/keys.h"
#include "fmt/format.h"
#include "recover/recipe.h"

namespace memento::agent {

// ---- AOR ------------------------------------------------------------------------------------

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
    // Recorded whether or not an entry is made: a confirmation after this
    // point tells the owner's node to push every step up to this one
    // (CheckAorCopies), since no entry of them is made here.
    int64_t& newest = aor_advanced_[range.copy];
    newest = std::max(newest, step);
    auto it = aor_confirmed_.find(range.copy);
    if (it == aor_confirmed_.end() || step <= it->second) return;  // pushes still make it
    if (aor_copy_bad_.count(range.copy) > 0) return;               // refused at the next check
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
    // The entry's chunk checksums are computed from the entry: the copy
    // itself is checked against the state hash of the step, so a byte of
    // the replica changed in memory since then is not protected by them.
    st = replica.CopyStateTo(*buf);
    if (st.code() == StatusCode::kDataLoss) {
      MEMENTO_LOG_WARN("aor: copy {} of step {} not made from the replica of rank {}: {}",
                       range.copy, step, range.owner, st.ToString());
      MutexLock l(&aor_mu_);
      ++aor_stats_.copy_refused;
      aor_copy_bad_.emplace(range.copy, std::make_pair(step, std::string(st.message())));
      return;
    }
    if (st.ok()) st = red_->FinishEntry(step, entry);
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

Status JobMember::RefuseChangedAorReplicas(int64_t step) {
  if (aor_ == nullptr) return Status::Ok();
  std::vector<std::pair<uint32_t, std::pair<int64_t, std::string>>> bad;
  {
    MutexLock l(&aor_mu_);
    for (auto it = aor_copy_bad_.begin(); it != aor_copy_bad_.end();) {
      if (it->second.first > step) {
        ++it;
        continue;
      }
      bad.emplace_back(it->first, it->second);
      aor_confirmed_.erase(it->first);
      ++aor_stats_.refused;
      it = aor_copy_bad_.erase(it);
    }
  }
  Status out = Status::Ok();
  coord::JobKeys keys(job_);
  for (const auto& [cid, what] : bad) {
    // The replica's bytes changed in memory after its step (OnAorAdvanced
    // did not copy them): dropped and seeded again from the owner, whose
    // node pushes the copy again. The step whose entry it did not make has
    // no copy unless a push of it came: abandoned now, not at the hold
    // timeout, and never committed with those bytes.
    const int owner = plan_.pieces[plan_.copies[cid].piece].rank;
    const std::string why =
        fmt::format("its bytes of step {} changed in memory: {}", what.first, what.second);
    store_->Delete(keys.AorHeld(cid), Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
    aor_->Refuse(owner, why);
    const recover::VersionHolding holding = red_->Holding(step, /*verify=*/false);
    if (out.ok() &&
        std::find(holding.copies.begin(), holding.copies.end(), cid) == holding.copies.end()) {
      out = DataLossError(fmt::format("copy {} (AOR replica of rank {}) of step {} not made: {}",
                                      cid, owner, step, why));
    }
  }
  return out;
}

bool JobMember::AorReplicaChanged(int64_t step) {
  MutexLock l(&aor_mu_);
  for (const auto& [cid, what] : aor_copy_bad_) {
    if (what.first <= step) return true;
  }
  return false;
}

Status JobMember::CheckAorCopies(int64_t step) {
  if (aor_ == nullptr) return Status::Ok();
  MEMENTO_RETURN_IF_ERROR(RefuseChangedAorReplicas(step));
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
      int64_t from = -1;
      {
        MutexLock l(&aor_mu_);
        ++aor_stats_.confirmed;
        auto [it, fresh] = aor_confirmed_.emplace(cid, step);
        if (fresh) {
          // From here on this node makes the copy of every step its
          // replica advances to (OnAorAdvanced, which checks the
          // confirmation under aor_mu_ as here). The owner's node stops
          // pushing it two steps on (the next step's push may be in
          // flight), and never before the step after the newest one the
          // replica already advanced to: those made no entry here (the
          // AOR thread runs ahead of this check when the node's reports
          // lag its trainers), so their pushes must still come, or those
          // steps would miss the copy on this node until the hold timeout
          // (and the job would stop committing while that repeats).
          from = step + 2;
          auto adv = aor_advanced_.find(cid);
          if (adv != aor_advanced_.end()) from = std::max(from, adv->second + 1);
        }
      }
      if (from >= 0) {
        MEMENTO_LOG_INFO(
            "aor: the replica of rank {} is current at step {}; copy {} is "
            "recomputed here from step {} on (no network)",
            owner, step, cid, from);
        Status st =
            store_
                ->Set(keys.AorHeld(cid), coord::StepKey(from), Deadline::AfterSeconds(kStoreCallS))
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
    aor_advanced_.clear();
  }
  for (uint32_t cid : plan_.nodes[node_].copies) {
    if (plan_.copies[cid].kind != topo::CopyKind::kAor) continue;
    store_->Delete(keys.AorHeld(cid), Deadline::AfterSeconds(kStoreCallS)).status().IgnoreError();
  }
}

std::string JobMember::MissingCopies(int64_t step) {
  const recover::VersionHolding holding = red_->Holding(step, /*verify=*/false);
  std::string out;
  bool aor = false;
  for (uint32_t cid : plan_.nodes[node_].copies) {
    const topo::Copy& c = plan_.copies[cid];
    if (c.kind != topo::CopyKind::kPeer && c.kind != topo::CopyKind::kAor) continue;
    if (std::find(holding.copies.begin(), holding.copies.end(), cid) != holding.copies.end()) {
      continue;
    }
    const topo::Piece& piece = plan_.pieces[c.piece];
    out += fmt::format("{}copy {} of {} ({})", out.empty() ? "" : ", ", cid, piece.key,
                       c.kind == topo::CopyKind::kAor
                           ? "aor: pushed, or made from the replica here"
                           : fmt::format("pushed by rank {}'s node", piece.rank));
    aor = aor || c.kind == topo::CopyKind::kAor;
  }
  if (aor) {
    MutexLock l(&aor_mu_);
    ++aor_stats_.missing;
  }
  return out;
}

JobMember::AorStats JobMember::aor_stats() {
  MutexLock l(&aor_mu_);
  return aor_stats_;
}

}  // namespace memento::agent
