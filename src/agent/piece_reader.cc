#include "agent/piece_reader.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/checksum.h"

namespace memento::agent {

Result<std::shared_ptr<PieceReader::SlotCache>> PieceReader::Load(int rank, int slot) {
  const std::string path = shm::SlotPath(root_, rank, slot);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFoundError("no slot file " + path);
    return ErrnoError("stat " + path, errno);
  }
  // The node store's own mapping of this file, when it has one of the file's
  // current size (the store maps every slot it allocates or adopts, pages
  // populated): serving from it maps no page a second time.
  std::shared_ptr<shm::Segment> stored =
      store_ != nullptr ? store_->SlotSegment(rank, slot) : nullptr;
  if (stored != nullptr && stored->size() != static_cast<size_t>(st.st_size)) stored = nullptr;
  MutexLock l(&mu_);
  std::shared_ptr<SlotCache>& c = slots_[{rank, slot}];
  if (c == nullptr || c->segment->size() != static_cast<size_t>(st.st_size) ||
      (stored != nullptr && c->segment != stored)) {
    // First use, or the client grew the slot (a new mapping is needed).
    std::shared_ptr<shm::Segment> seg = std::move(stored);
    if (seg == nullptr) {
      MEMENTO_ASSIGN_OR_RETURN(seg, shm::Segment::Open(path, /*writable=*/false));
    }
    auto fresh = std::make_shared<SlotCache>();
    fresh->segment = std::move(seg);
    c = std::move(fresh);
  }
  return c;
}

Result<std::shared_ptr<PieceReader::SlotCache>> PieceReader::FindSlot(int rank, int64_t step) {
  std::string why;
  for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
    auto loaded = Load(rank, slot);
    if (!loaded.ok()) {
      if (loaded.status().code() != StatusCode::kNotFound) return loaded.status();
      continue;
    }
    std::shared_ptr<SlotCache> c = *loaded;
    // A cheap header peek first: the cached SlotInfo of this generation
    // stands; a new one is read and checked once (ReadSlot) below.
    const shm::SlotPeek peek = shm::PeekSlot(*c->segment);
    if (peek.state != shm::SlotState::kComplete || peek.step != step) continue;
    const uint64_t gen = peek.generation;
    {
      MutexLock l(&mu_);
      if (c->have_info && c->generation == gen) return c;
    }
    // A new generation: read and check the header, manifest and table once.
    auto info = shm::ReadSlot(*c->segment);
    if (!info.ok()) {
      // A header, manifest or table read while a trainer rewrote the slot
      // fails its checksums: that is an overwrite, not corruption.
      std::atomic_thread_fence(std::memory_order_acquire);
      const shm::SlotPeek now = shm::PeekSlot(*c->segment);
      if (now.state != shm::SlotState::kComplete || now.generation != gen) {
        return AbortedError(fmt::format("slot {} (step {}) was overwritten while it was read",
                                        c->segment->path(), step));
      }
      return info.status();
    }
    if (info->state != shm::SlotState::kComplete || info->step != step) continue;  // overwritten
    if (!job_id_.empty() && info->job_id != job_id_) {
      return FailedPreconditionError(fmt::format("slot {} belongs to job '{}', not '{}'",
                                                 c->segment->path(), info->job_id, job_id_));
    }
    auto fresh = std::make_shared<SlotCache>();
    fresh->segment = c->segment;
    fresh->generation = info->generation;
    fresh->have_info = true;
    fresh->info = std::move(*info);
    fresh->chunk_order.resize(fresh->info.chunks.size());
    for (size_t i = 0; i < fresh->chunk_order.size(); ++i) fresh->chunk_order[i] = i;
    std::sort(fresh->chunk_order.begin(), fresh->chunk_order.end(), [&](size_t a, size_t b) {
      return fresh->info.chunks[a].offset < fresh->info.chunks[b].offset;
    });
    fresh->verified.assign(fresh->info.chunks.size(), 0);
    MutexLock l(&mu_);
    std::shared_ptr<SlotCache>& slot_ref = slots_[{rank, slot}];
    if (slot_ref == nullptr || slot_ref->segment == fresh->segment) slot_ref = fresh;
    return fresh;
  }
  return NotFoundError(
      fmt::format("rank {} has no complete T0 slot of step {} under {}", rank, step, root_));
}

Status PieceReader::VerifyRange(SlotCache& c, size_t ti, uint64_t begin, uint64_t end, bool force) {
  if (begin >= end) return Status::Ok();
  const auto& chunks = c.info.chunks;
  // First chunk (by data offset) that ends after `begin`.
  auto it = std::partition_point(c.chunk_order.begin(), c.chunk_order.end(), [&](size_t i) {
    return chunks[i].offset + chunks[i].length <= begin;
  });
  std::vector<size_t> todo;
  {
    MutexLock l(&mu_);
    for (; it != c.chunk_order.end() && chunks[*it].offset < end; ++it) {
      if (chunks[*it].tensor_index == ti && (force || c.verified[*it] == 0)) todo.push_back(*it);
    }
  }
  const uint8_t* data = c.segment->data() + c.info.data_offset;
  for (size_t i : todo) {
    const shm::ChunkEntry& ch = chunks[i];
    if (Checksum(data + ch.offset, ch.length) != ch.checksum) {
      if (!shm::SlotUnchanged(*c.segment, c.info)) {
        return AbortedError(fmt::format("slot {} (step {}) was overwritten while it was read",
                                        c.segment->path(), c.info.step));
      }
      return DataLossError(fmt::format(
          "slot {} (rank {}, step {}): chunk {} (bytes {}..{} of tensor {}) fails its checksum",
          c.segment->path(), c.info.rank, c.info.step, i, ch.offset, ch.offset + ch.length,
          shm::EntryName(c.info.tensors[ch.tensor_index])));
    }
    MutexLock l(&mu_);
    c.verified[i] = 1;
  }
  return Status::Ok();
}

Status PieceReader::ReadTensorRange(int rank, int64_t step, const std::string& tensor,
                                    uint64_t offset, uint64_t length, void* dst) {
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<SlotCache> c, FindSlot(rank, step));
  auto runs = shm::FindRange(c->info, tensor, offset, length);
  if (!runs.ok()) {
    return Status(runs.status().code(), fmt::format("rank {}'s slot of step {}: {}", rank, step,
                                                    runs.status().message()));
  }
  auto* out = static_cast<uint8_t*>(dst);
  const uint8_t* data = c->segment->data() + c->info.data_offset;
  for (const shm::SlotRun& r : *runs) {
    MEMENTO_RETURN_IF_ERROR(VerifyRange(*c, r.entry, r.data_offset, r.data_offset + r.length));
    std::memcpy(out, data + r.data_offset, r.length);
    out += r.length;
  }
  if (!shm::SlotUnchanged(*c->segment, c->info)) {
    return AbortedError(fmt::format("slot {} (step {}) was overwritten while it was read",
                                    c->segment->path(), step));
  }
  return Status::Ok();
}

Result<std::vector<PieceReader::RangeCopy>> PieceReader::MapSegments(
    const std::vector<topo::Segment>& segments, const std::string& label, const SlotCache& c,
    uint64_t offset, uint64_t length) {
  std::vector<RangeCopy> copies;
  uint64_t pos = 0;
  const uint64_t end = offset + length;
  for (const topo::Segment& s : segments) {
    const uint64_t s_begin = pos, s_end = pos + s.length;
    pos = s_end;
    if (s_end <= offset || s_begin >= end) continue;
    const uint64_t a = std::max(offset, s_begin), b = std::min(end, s_end);
    auto runs = shm::FindRange(c.info, s.tensor, s.offset + (a - s_begin), b - a);
    if (!runs.ok()) {
      return Status(runs.status().code(),
                    fmt::format("{}: rank {}'s slot of step {}: {}", label, c.info.rank,
                                c.info.step, runs.status().message()));
    }
    for (const shm::SlotRun& r : *runs) copies.push_back({r.entry, r.data_offset, r.length});
  }
  if (end > pos) {
    return InvalidArgumentError(
        fmt::format("bytes [{}, +{}) of {}: it has {} bytes", offset, length, label, pos));
  }
  return copies;
}

Result<std::vector<PieceReader::RangeCopy>> PieceReader::MapPiece(const topo::Plan& plan,
                                                                  uint32_t piece, int64_t step,
                                                                  const SlotCache& c,
                                                                  uint64_t offset,
                                                                  uint64_t length) {
  const topo::Piece& p = plan.pieces[piece];
  uint64_t sum = 0;
  for (const topo::Segment& s : p.segments) sum += s.length;
  if (sum != p.bytes) {
    return FailedPreconditionError(fmt::format(
        "piece {} ({}): segments sum to {} bytes, piece says {}", piece, p.key, sum, p.bytes));
  }
  (void)step;
  return MapSegments(p.segments, fmt::format("piece {} ({})", piece, p.key), c, offset, length);
}

Status PieceReader::CopyRanges(SlotCache& c, const std::vector<RangeCopy>& copies, void* dst,
                               const std::string& what) {
  auto* out = static_cast<uint8_t*>(dst);
  const uint8_t* data = c.segment->data() + c.info.data_offset;
  for (const RangeCopy& r : copies) {
    if (r.zeros) {
      std::memset(out, 0, r.length);
      out += r.length;
      continue;
    }
    MEMENTO_RETURN_IF_ERROR(VerifyRange(c, r.tensor, r.begin, r.begin + r.length));
    std::memcpy(out, data + r.begin, r.length);
    out += r.length;
  }
  if (!shm::SlotUnchanged(*c.segment, c.info)) {
    return AbortedError(fmt::format("slot {} (step {}) was overwritten while {} was read",
                                    c.segment->path(), c.info.step, what));
  }
  return Status::Ok();
}

void PieceReader::SetWholeChunkObserver(WholeChunkFn fn) {
  MutexLock l(&mu_);
  on_whole_chunk_ = fn ? std::make_shared<const WholeChunkFn>(std::move(fn)) : nullptr;
}

Status PieceReader::EmitRanges(SlotCache& c, const std::vector<RangeCopy>& copies,
                               const EmitFn& emit, const std::string& what) {
  std::shared_ptr<const WholeChunkFn> on_whole;
  {
    MutexLock l(&mu_);
    on_whole = on_whole_chunk_;
  }
  const uint8_t* data = c.segment->data() + c.info.data_offset;
  const auto& chunks = c.info.chunks;
  for (const RangeCopy& r : copies) {
    if (r.zeros) {
      // Zero padding (a parity's tail): sent from a zero buffer.
      static const std::vector<uint8_t> kZeros(uint64_t{1} << 16, 0);
      for (uint64_t left = r.length; left > 0;) {
        const uint64_t n = std::min<uint64_t>(left, kZeros.size());
        MEMENTO_RETURN_IF_ERROR(emit(kZeros.data(), n, Checksum(kZeros.data(), n)));
        left -= n;
      }
      continue;
    }
    const uint64_t end = r.begin + r.length;
    uint64_t at = r.begin;
    // Chunks of this tensor overlapping [begin, end), in data order.
    auto it = std::partition_point(c.chunk_order.begin(), c.chunk_order.end(), [&](size_t i) {
      return chunks[i].offset + chunks[i].length <= r.begin;
    });
    for (; at < end; ++it) {
      const bool have = it != c.chunk_order.end() && chunks[*it].offset < end;
      if (have && chunks[*it].tensor_index != r.tensor) continue;
      if (!have || chunks[*it].offset > at) {
        // Bytes no chunk covers (ReadSlot rejects such tables): refuse
        // rather than send unchecked bytes.
        return DataLossError(
            fmt::format("slot {} (rank {}, step {}): bytes {}..{} of tensor {} lie in no chunk",
                        c.segment->path(), c.info.rank, c.info.step, at,
                        have ? chunks[*it].offset : end, shm::EntryName(c.info.tensors[r.tensor])));
      }
      const shm::ChunkEntry& ch = chunks[*it];
      const uint64_t hi = std::min(end, ch.offset + ch.length);
      uint64_t digest;
      const bool whole = at == ch.offset && hi == ch.offset + ch.length;
      if (whole) {
        digest = ch.checksum;  // checked by the receiver against the bytes it gets
      } else {
        MEMENTO_RETURN_IF_ERROR(VerifyRange(c, r.tensor, at, hi));
        digest = Checksum(data + at, hi - at);
      }
      MEMENTO_RETURN_IF_ERROR(emit(data + at, hi - at, digest));
      if (whole && on_whole != nullptr) (*on_whole)(c.info.rank, c.info.step, c.generation, *it);
      at = hi;
    }
  }
  if (!shm::SlotUnchanged(*c.segment, c.info)) {
    return AbortedError(fmt::format("slot {} (step {}) was overwritten while {} was sent",
                                    c.segment->path(), c.info.step, what));
  }
  return Status::Ok();
}

uint64_t PieceReader::RefBytes(const SegmentsRef& ref) {
  if (ref.parity != shm::kNoParity) return ref.parity_bytes;
  uint64_t total = 0;
  for (const topo::Segment& s : *ref.segments) total += s.length;
  return total;
}

Result<std::vector<PieceReader::RangeCopy>> PieceReader::MapRef(const SegmentsRef& ref,
                                                                const SlotCache& c, uint64_t offset,
                                                                uint64_t length) {
  if (ref.parity == shm::kNoParity) return MapSegments(*ref.segments, ref.what, c, offset, length);
  // A parity the producer's client computed into its slot (docs/reft.md
  // section 4): one entry, found by the plan's parity id.
  const int entry = shm::FindParityEntry(c.info.tensors, ref.parity);
  if (entry < 0 && ref.segments != nullptr && !ref.segments->empty()) {
    // A parity equal to its stripe's only data block: the block's bytes
    // where the slot holds them, then the zero padding.
    uint64_t block = 0;
    for (const topo::Segment& s : *ref.segments) block += s.length;
    if (block > ref.parity_bytes || offset > ref.parity_bytes ||
        length > ref.parity_bytes - offset) {
      return InvalidArgumentError(fmt::format("bytes [{}, +{}) of {}: it has {} bytes", offset,
                                              length, ref.what, ref.parity_bytes));
    }
    std::vector<RangeCopy> copies;
    if (offset < block) {
      MEMENTO_ASSIGN_OR_RETURN(copies, MapSegments(*ref.segments, ref.what, c, offset,
                                                   std::min(length, block - offset)));
    }
    const uint64_t zero_from = std::max(offset, block);
    if (offset + length > zero_from) {
      RangeCopy z;
      z.length = offset + length - zero_from;
      z.zeros = true;
      copies.push_back(z);
    }
    return copies;
  }
  if (entry < 0) {
    return NotFoundError(fmt::format("{}: rank {}'s slot of step {} holds no entry of parity {}",
                                     ref.what, c.info.rank, c.info.step, ref.parity));
  }
  const shm::SavedTensor& t = c.info.tensors[static_cast<size_t>(entry)];
  if (t.nbytes != ref.parity_bytes) {
    return NotFoundError(
        fmt::format("{}: rank {}'s slot of step {} holds parity {} with {} bytes, the entry has {}",
                    ref.what, c.info.rank, c.info.step, ref.parity, t.nbytes, ref.parity_bytes));
  }
  if (offset > t.nbytes || length > t.nbytes - offset) {
    return InvalidArgumentError(
        fmt::format("bytes [{}, +{}) of {}: it has {} bytes", offset, length, ref.what, t.nbytes));
  }
  std::vector<RangeCopy> copies;
  if (length > 0) copies.push_back({static_cast<size_t>(entry), t.offset + offset, length});
  return copies;
}

Result<std::shared_ptr<PieceReader::SlotCache>> PieceReader::FindRefSlot(const SegmentsRef& ref) {
  if (ref.segments == nullptr && ref.parity == shm::kNoParity) {
    return InvalidArgumentError(ref.what + ": no segments");
  }
  auto found = FindSlot(ref.rank, ref.step);
  if (!found.ok()) {
    return Status(found.status().code(), fmt::format("{}: {}", ref.what, found.status().message()));
  }
  if (ref.generation != 0 && (*found)->generation != ref.generation) {
    // The slot holds the step again, written anew (a recovery, a rollback):
    // not the bytes the entry was made from.
    return NotFoundError(fmt::format(
        "{}: rank {}'s slot of step {} was rewritten (generation {}, the entry was made from {})",
        ref.what, ref.rank, ref.step, (*found)->generation, ref.generation));
  }
  return found;
}

Status PieceReader::ReadSegments(const SegmentsRef& ref, uint64_t offset, uint64_t length,
                                 void* dst) {
  if (length == 0) return Status::Ok();
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<SlotCache> c, FindRefSlot(ref));
  MEMENTO_ASSIGN_OR_RETURN(std::vector<RangeCopy> copies, MapRef(ref, *c, offset, length));
  return CopyRanges(*c, copies, dst, ref.what);
}

Status PieceReader::ServeSegments(const SegmentsRef& ref, uint64_t offset, uint64_t length,
                                  const EmitFn& emit) {
  if (length == 0) return Status::Ok();
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<SlotCache> c, FindRefSlot(ref));
  MEMENTO_ASSIGN_OR_RETURN(std::vector<RangeCopy> copies, MapRef(ref, *c, offset, length));
  return EmitRanges(*c, copies, emit, ref.what);
}

Status PieceReader::CheckSegments(const SegmentsRef& ref, bool verify) {
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<SlotCache> c, FindRefSlot(ref));
  MEMENTO_ASSIGN_OR_RETURN(std::vector<RangeCopy> copies, MapRef(ref, *c, 0, RefBytes(ref)));
  if (verify) {
    for (const RangeCopy& r : copies) {
      if (r.zeros) continue;
      MEMENTO_RETURN_IF_ERROR(VerifyRange(*c, r.tensor, r.begin, r.begin + r.length, true));
    }
  }
  if (!shm::SlotUnchanged(*c->segment, c->info)) {
    return NotFoundError(fmt::format("{}: rank {}'s slot of step {} is being overwritten", ref.what,
                                     ref.rank, ref.step));
  }
  return Status::Ok();
}

namespace {

Status CheckPieceRange(const topo::Plan& plan, uint32_t piece, uint64_t offset, uint64_t length) {
  if (piece >= plan.pieces.size()) {
    return InvalidArgumentError(
        fmt::format("piece {} is not in the plan ({} pieces)", piece, plan.pieces.size()));
  }
  const topo::Piece& p = plan.pieces[piece];
  if (offset > p.bytes || length > p.bytes - offset) {
    return InvalidArgumentError(fmt::format("bytes [{}, +{}) of piece {} ({}): it has {} bytes",
                                            offset, length, piece, p.key, p.bytes));
  }
  return Status::Ok();
}

}  // namespace

Status PieceReader::ReadPiece(const topo::Plan& plan, uint32_t piece, int64_t step, uint64_t offset,
                              uint64_t length, void* dst) {
  MEMENTO_RETURN_IF_ERROR(CheckPieceRange(plan, piece, offset, length));
  if (length == 0) return Status::Ok();
  const topo::Piece& p = plan.pieces[piece];
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<SlotCache> c, FindSlot(p.rank, step));
  MEMENTO_ASSIGN_OR_RETURN(std::vector<RangeCopy> copies,
                           MapPiece(plan, piece, step, *c, offset, length));
  return CopyRanges(*c, copies, dst, fmt::format("piece {}", piece));
}

Status PieceReader::ServePiece(const topo::Plan& plan, uint32_t piece, int64_t step,
                               uint64_t offset, uint64_t length, const EmitFn& emit) {
  MEMENTO_RETURN_IF_ERROR(CheckPieceRange(plan, piece, offset, length));
  if (length == 0) return Status::Ok();
  const topo::Piece& p = plan.pieces[piece];
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<SlotCache> c, FindSlot(p.rank, step));
  MEMENTO_ASSIGN_OR_RETURN(std::vector<RangeCopy> copies,
                           MapPiece(plan, piece, step, *c, offset, length));
  return EmitRanges(*c, copies, emit, fmt::format("piece {}", piece));
}

std::vector<int> RanksHolding(shm::NodeStore& store, const std::vector<int>& ranks, int64_t step,
                              bool verify) {
  std::vector<int> out;
  for (int rank : ranks) {
    for (const shm::SlotStatus& s : store.Inventory(rank)) {
      if (s.state != shm::SlotState::kComplete || s.step != step) continue;
      // `verify` means verify now: a verification the store remembers (from
      // adoption, a scrub or an earlier inventory) says nothing about bytes
      // corrupted since, in the same generation.
      const bool intact = verify ? store.Verify(rank, s.slot).ok() : !(s.verified && !s.intact);
      if (intact) {
        out.push_back(rank);
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::pair<int64_t, std::vector<int>>> T0Holdings(shm::NodeStore& store, bool verify) {
  std::map<int64_t, std::set<int>> steps;
  for (int rank : store.Ranks()) {
    for (const shm::SlotStatus& s : store.Inventory(rank)) {
      if (s.state != shm::SlotState::kComplete || s.step < 0) continue;
      // `verify` means verify now: a verification the store remembers (from
      // adoption, a scrub or an earlier inventory) says nothing about bytes
      // corrupted since, in the same generation.
      const bool intact = verify ? store.Verify(rank, s.slot).ok() : !(s.verified && !s.intact);
      if (intact) steps[s.step].insert(rank);
    }
  }
  std::vector<std::pair<int64_t, std::vector<int>>> out;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    out.emplace_back(it->first, std::vector<int>(it->second.begin(), it->second.end()));
  }
  return out;
}

}  // namespace memento::agent
