// The rebuilt slots in the executor (executor_steps.h): where a piece lies in
// its rank's slot, which slot to rebuild into, opening the slots for writing
// (OpenSlots), their chunk checksums (FillChecksums) and completing and
// verifying them (PublishSlots). docs/recovery.md, "Executor" and
// "Verification of a rebuilt slot".
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/checksum.h"
#include "common/log.h"
#include "fmt/format.h"
#include "recover/executor_steps.h"

namespace memento::recover::internal {

bool RankJob::SlotOf(uint32_t piece, uint64_t off, uint64_t* slot, uint64_t* extent_end) const {
  for (const Extent& e : extents.at(piece)) {
    if (off >= e.piece_offset && off < e.piece_offset + e.length) {
      *slot = e.slot_offset + (off - e.piece_offset);
      *extent_end = e.piece_offset + e.length;
      return true;
    }
  }
  return false;
}

uint64_t RankJob::NextChunkBoundary(uint64_t at) const {
  auto it = chunk_at.upper_bound(at);
  if (it != chunk_at.begin()) {
    const shm::ChunkEntry& c = layout.chunks[std::prev(it)->second];
    if (at < c.offset + c.length) return c.offset + c.length;
  }
  return it == chunk_at.end() ? UINT64_MAX : it->first;
}

uint8_t* RankJob::InSlot(uint32_t piece, uint64_t off, uint64_t n) const {
  for (const Extent& e : extents.at(piece)) {
    if (off >= e.piece_offset && off + n <= e.piece_offset + e.length) {
      return data + e.slot_offset + (off - e.piece_offset);
    }
  }
  return nullptr;
}

void RankJob::CopyOut(uint32_t piece, uint64_t off, uint64_t n, uint8_t* dst) const {
  for (const Extent& e : extents.at(piece)) {
    const uint64_t lo = std::max(off, e.piece_offset);
    const uint64_t hi = std::min(off + n, e.piece_offset + e.length);
    if (lo >= hi) continue;
    std::memcpy(dst + (lo - off), data + e.slot_offset + (lo - e.piece_offset), hi - lo);
  }
}

namespace {

// The slot to rebuild into: -1 when one already holds `step` intact (nothing
// to do). Prefers an existing empty, torn or corrupt slot, then a slot the
// rank does not have yet (EnsureSlot creates only that one), then the older
// version; the newer of two intact versions is never overwritten.
Result<int> ChooseSlot(shm::NodeStore& store, int rank, int64_t step) {
  std::vector<shm::SlotStatus> slots = store.Inventory(rank);
  int best = -1;
  int64_t best_score = 0;
  auto consider = [&](int slot, int64_t score) {
    if (best < 0 || score < best_score) {
      best = slot;
      best_score = score;
    }
  };
  std::set<int> have;
  for (const shm::SlotStatus& s : slots) {
    have.insert(s.slot);
    const bool complete = s.state == shm::SlotState::kComplete;
    bool corrupt = complete && !s.error.empty();
    if (complete && !corrupt && s.step == step) {
      // Checked now: a slot of `step` that fails its checksums is the one
      // to rebuild into, before any intact older version.
      if (store.Verify(rank, s.slot).ok()) return -1;
      corrupt = true;
    }
    consider(s.slot, complete && !corrupt ? s.step : INT64_MIN);
  }
  for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
    if (!have.count(slot)) consider(slot, INT64_MIN + 1);
  }
  if (best_score > step) {
    MEMENTO_LOG_WARN(
        "recover: rank {}: overwriting slot {} (step {}) to rebuild older step {}; "
        "the newer slot is kept",
        rank, best, best_score, step);
  }
  return best;
}

// A restore-time assembly's slot: a fresh file at `path` (an old one
// removed), the store's slots untouched.
Status OpenStagedSlot(const std::string& path, RankJob* job) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("removing the old staged slot " + path, errno);
  }
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> seg,
                           shm::Segment::CreateOrGrow(path, job->layout.total_bytes));
  job->segment = std::move(seg);
  job->slot = 0;
  return Status::Ok();
}

// The store slot `job` is rebuilt into (job->slot, already chosen), mapped
// writable.
Status OpenStoreSlot(shm::NodeStore& store, RankJob* job) {
  const int rank = job->recipe.rank;
  // Only the slot rebuilt into is allocated (the trainer's Seal makes the
  // other). Written through the store's own mapping when it is writable,
  // so PublishSlots' verification reads pages this mapping already touched.
  MEMENTO_ASSIGN_OR_RETURN(job->segment,
                           store.EnsureSlot(rank, job->slot, job->layout.total_bytes));
  if (!job->segment->writable()) {
    MEMENTO_ASSIGN_OR_RETURN(job->segment, shm::Segment::Open(job->segment->path(),
                                                              /*writable=*/true));
  }
  if (job->segment->size() < job->layout.total_bytes) {
    return InternalError(fmt::format("slot {} of rank {} is {} bytes, needs {}", job->slot, rank,
                                     job->segment->size(), job->layout.total_bytes));
  }
  return Status::Ok();
}

// Marks the slot kWriting and sets up the job's data pointer and chunk tables.
void BeginWrite(int64_t step, RankJob* job) {
  shm::BeginSlotWrite(*job->segment, job->layout, job->slot, step);
  job->data = shm::SlotData(*job->segment);
  for (size_t c = 0; c < job->layout.chunks.size(); ++c) {
    job->chunk_at.emplace(job->layout.chunks[c].offset, c);
  }
  job->known_checksum.assign(job->layout.chunks.size(), 0);
  job->known.assign(job->layout.chunks.size(), 0);
  job->decoded_checksum.assign(job->layout.chunks.size(), 0);
  job->decoded.assign(job->layout.chunks.size(), 0);
}

}  // namespace

Result<std::vector<RankJob*>> OpenSlots(std::vector<RankJob>& jobs, shm::NodeStore& store,
                                        int64_t step, const ExecuteOptions& options) {
  std::vector<RankJob*> todo;
  for (RankJob& job : jobs) {
    const int rank = job.recipe.rank;
    if (options.stage_path) {
      MEMENTO_RETURN_IF_ERROR(OpenStagedSlot(options.stage_path(rank), &job));
      todo.push_back(&job);
      continue;
    }
    MEMENTO_ASSIGN_OR_RETURN(job.slot, ChooseSlot(store, rank, step));
    if (job.slot < 0) {
      MEMENTO_LOG_INFO("recover: rank {} already holds step {} intact", rank, step);
      continue;
    }
    MEMENTO_RETURN_IF_ERROR(OpenStoreSlot(store, &job));
    todo.push_back(&job);
  }
  for (RankJob* job : todo) BeginWrite(step, job);
  return todo;
}

Result<ChecksumCounts> FillChecksums(const std::vector<RankJob*>& todo, int threads) {
  ChecksumCounts counts;
  std::vector<std::pair<RankJob*, size_t>> chunks;  // chunks no digest or decode unit hashed
  for (RankJob* job : todo) {
    shm::ChunkEntry* table = shm::SlotTable(*job->segment);
    for (size_t c = 0; c < job->layout.chunks.size(); ++c) {
      if (job->known[c]) {
        table[c].checksum = job->known_checksum[c];
        ++counts.from_digests;
        continue;
      }
      if (job->decoded[c]) {
        table[c].checksum = job->decoded_checksum[c];
        ++counts.at_decode;
        continue;
      }
      chunks.emplace_back(job, c);
    }
  }
  MEMENTO_RETURN_IF_ERROR(ParallelFor(chunks.size(), threads, [&](size_t i, int) -> Status {
    RankJob* job = chunks[i].first;
    shm::ChunkEntry* table = shm::SlotTable(*job->segment);
    shm::ChunkEntry& e = table[chunks[i].second];
    e.checksum = Checksum(job->data + e.offset, e.length);
    return Status::Ok();
  }));
  counts.hashed = chunks.size();
  return counts;
}

Status PublishSlots(const std::vector<RankJob*>& todo, shm::NodeStore& store, int64_t step,
                    const ExecuteOptions& options, AssemblyStats* stats) {
  const int threads = std::max(1, options.threads);
  for (RankJob* job : todo) {
    if (options.before_complete) options.before_complete(job->recipe.rank, *job->segment);
    shm::CompleteSlotWrite(*job->segment);
    if (options.stage_path) {
      // Its reader (the client's restore) verifies every chunk.
      stats->bytes += job->layout.data_bytes;
      stats->ranks.push_back(job->recipe.rank);
      MEMENTO_LOG_INFO("assemble: staged rank {} step {} in {} ({} bytes)", job->recipe.rank, step,
                       job->segment->path(), job->layout.data_bytes);
      continue;
    }
    // Chunks checked on arrival (their bytes hashed in place in this slot
    // against the source's checksum, written once) are not read again;
    // decoded and locally copied chunks are (docs/recovery.md,
    // "Verification of a rebuilt slot").
    Status v = store.VerifyWritten(
        job->recipe.rank, job->slot,
        options.trust_arrival_digests ? job->known : std::vector<uint8_t>{}, threads);
    if (!v.ok()) {
      return Status(v.code(), fmt::format("rank {}: rebuilt slot {} of step {} does not verify: {}",
                                          job->recipe.rank, job->slot, step, v.message()));
    }
    stats->bytes += job->layout.data_bytes;
    stats->ranks.push_back(job->recipe.rank);
    MEMENTO_LOG_INFO("recover: rebuilt rank {} step {} in slot {} ({} bytes)", job->recipe.rank,
                     step, job->slot, job->layout.data_bytes);
  }
  return Status::Ok();
}

}  // namespace memento::recover::internal
