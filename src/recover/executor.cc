// Recovery executor: rebuilds ranks' T0 slots from the recipes Decide() wrote
// (REFT 4.3 distributed in-memory loading: every piece is fetched from the
// node that holds it, in parallel, and decoded where only parity is left).
// docs/recovery.md, "Executor" and "Threads".
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "codec/erasure_code.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "recover/recipe.h"
#include "recover/recover.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::recover {
namespace {

// A contiguous range of a piece and where it lives in the slot's data region.
struct Extent {
  uint64_t piece_offset;
  uint64_t slot_offset;
  uint64_t length;
};

// A decode scratch buffer of one worker: anonymous memory at a 2 MiB
// boundary, asked for as transparent huge pages (most kernels allow them on
// request), never cleared by us. A std::vector cleared every new buffer and
// faulted it in 4 KiB pages: a fifth of the rebuilding agent's CPU in a
// 256 MB recovery (`perf record`, docs/recovery.md "CPU per rebuilt byte").
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&& o) noexcept : base_(o.base_), len_(o.len_), p_(o.p_), cap_(o.cap_) {
    o.base_ = nullptr;
    o.len_ = o.cap_ = 0;
    o.p_ = nullptr;
  }
  Scratch& operator=(Scratch&& o) noexcept {
    if (this != &o) {
      Release();
      std::swap(base_, o.base_);
      std::swap(len_, o.len_);
      std::swap(p_, o.p_);
      std::swap(cap_, o.cap_);
    }
    return *this;
  }
  ~Scratch() { Release(); }
  // At least `n` bytes (contents unspecified); null when memory is short.
  uint8_t* Get(size_t n) {
    if (n <= cap_) return p_;
    Release();
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t cap = (n + kHuge - 1) & ~(kHuge - 1);
    void* r =
        mmap(nullptr, cap + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return nullptr;
    base_ = r;
    len_ = cap + kHuge;
    p_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(r) + kHuge - 1) & ~(kHuge - 1));
    cap_ = cap;
    madvise(p_, cap_, MADV_HUGEPAGE);
    return p_;
  }

 private:
  void Release() {
    if (base_ != nullptr) munmap(base_, len_);
    base_ = nullptr;
    len_ = cap_ = 0;
    p_ = nullptr;
  }
  void* base_ = nullptr;
  size_t len_ = 0;
  uint8_t* p_ = nullptr;
  size_t cap_ = 0;
};

// One rank being rebuilt.
struct RankJob {
  Recipe recipe;
  shm::SlotLayout layout;
  int slot = -1;
  std::shared_ptr<shm::Segment> segment;            // writable mapping of the target slot
  uint8_t* data = nullptr;                          // its data region
  std::map<uint32_t, std::vector<Extent>> extents;  // piece -> extents, by piece offset
  // Chunk checksums known from digests checked on arrival (one writer per
  // chunk: a digest covers exactly one chunk's bytes, delivered once).
  std::map<uint64_t, size_t> chunk_at;  // data offset -> chunk index
  std::vector<uint64_t> known_checksum;
  std::vector<uint8_t> known;  // 1: known_checksum holds the chunk's checksum
  // Checksums a decode unit computed right after writing the whole chunk
  // (one writer per chunk: the only unit whose output covers it).
  std::vector<uint64_t> decoded_checksum;
  std::vector<uint8_t> decoded;  // 1: decoded_checksum holds the chunk's checksum

  // The slot data offset of piece byte `off` and the end (in piece bytes) of
  // the extent holding it; false when no extent holds it.
  bool SlotOf(uint32_t piece, uint64_t off, uint64_t* slot, uint64_t* extent_end) const {
    for (const Extent& e : extents.at(piece)) {
      if (off >= e.piece_offset && off < e.piece_offset + e.length) {
        *slot = e.slot_offset + (off - e.piece_offset);
        *extent_end = e.piece_offset + e.length;
        return true;
      }
    }
    return false;
  }
  // The first chunk boundary (a chunk's start or end) after slot offset `at`;
  // UINT64_MAX when none.
  uint64_t NextChunkBoundary(uint64_t at) const {
    auto it = chunk_at.upper_bound(at);
    if (it != chunk_at.begin()) {
      const shm::ChunkEntry& c = layout.chunks[std::prev(it)->second];
      if (at < c.offset + c.length) return c.offset + c.length;
    }
    return it == chunk_at.end() ? UINT64_MAX : it->first;
  }
};

// One unit of parallel work: a window of a whole-piece read, or a window of
// one decoded stripe block.
struct Unit {
  size_t job = 0;
  size_t part = 0;
  size_t block = 0;  // decode units
  uint64_t begin = 0;
  uint64_t length = 0;
};

// Runs fn(i, worker) for i in [0, n) on `threads` threads; the first error
// stops the rest and is returned.
template <typename Fn>
Status ParallelFor(size_t n, int threads, Fn&& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Mutex mu;
  Status first;
  auto worker = [&](int w) {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status st = fn(i, w);
      if (!st.ok()) {
        MutexLock l(&mu);
        if (first.ok()) first = st;
        failed.store(true);
      }
    }
  };
  const int count =
      static_cast<int>(std::min<size_t>(std::max(threads, 1), std::max<size_t>(n, 1)));
  std::vector<std::thread> pool;
  for (int w = 1; w < count; ++w) pool.emplace_back(worker, w);
  worker(0);
  for (auto& t : pool) t.join();
  MutexLock l(&mu);
  return first;
}

const codec::ErasureCode* CodeFor(std::map<std::tuple<bool, int, int>, codec::ErasureCode>* cache,
                                  const topo::Stripe& s, Status* st) {
  auto key = std::make_tuple(s.xor_code, s.k, s.f);
  auto it = cache->find(key);
  if (it == cache->end()) {
    auto code = codec::ErasureCode::Create(
        s.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, s.k, s.f);
    if (!code.ok()) {
      *st = code.status();
      return nullptr;
    }
    it = cache->emplace(key, std::move(*code)).first;
  }
  return &it->second;
}

std::string Describe(const SourceRange& r, int64_t step) {
  return fmt::format("{} {} bytes [{}, {}) on node {} at step {}", SourceKindName(r.source.kind),
                     r.source.id, r.offset, r.offset + r.length, r.node, step);
}

// Checks a recipe against the plan: every non-empty piece of the rank exactly
// once, every range inside its source, decode blocks that tile their piece.
Status CheckRecipe(const topo::Plan& plan, const Recipe& r) {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError(
        fmt::format("recipe of rank {} (step {}): {}", r.rank, r.step, what));
  };
  std::set<uint32_t> want;
  const int g = plan.ranks[r.rank].group;
  for (const topo::Piece& p : plan.pieces) {
    if (p.bytes == 0) continue;
    if ((p.kind == topo::PieceKind::kReplicatedShard && p.group == g) ||
        (p.kind != topo::PieceKind::kReplicatedShard && p.rank == r.rank)) {
      want.insert(p.id);
    }
  }
  std::set<uint32_t> have;
  const int num_nodes = static_cast<int>(plan.nodes.size());
  auto check_range = [&](const SourceRange& s, uint64_t limit) -> Status {
    if (s.node < 0 || s.node >= num_nodes) return bad(fmt::format("source node {}", s.node));
    uint64_t size = 0;
    switch (s.source.kind) {
      case SourceKind::kPiece:
        if (s.source.id >= plan.pieces.size()) return bad("piece id out of range");
        size = plan.pieces[s.source.id].bytes;
        break;
      case SourceKind::kCopy:
        if (s.source.id >= plan.copies.size()) return bad("copy id out of range");
        size = plan.pieces[plan.copies[s.source.id].piece].bytes;
        break;
      case SourceKind::kParity:
        if (s.source.id >= plan.parities.size()) return bad("parity id out of range");
        size = plan.parities[s.source.id].bytes;
        break;
    }
    if (s.offset > size || s.length > size - s.offset || s.length > limit) {
      return bad("range out of bounds: " + Describe(s, r.step));
    }
    return Status::Ok();
  };
  for (const PiecePart& part : r.parts) {
    if (part.piece >= plan.pieces.size() || !want.count(part.piece) ||
        !have.insert(part.piece).second) {
      return bad(fmt::format("piece {} is not one of the rank's, or repeated", part.piece));
    }
    const topo::Piece& p = plan.pieces[part.piece];
    if (part.bytes != p.bytes)
      return bad(fmt::format("{} has {} bytes, not {}", p.key, p.bytes, part.bytes));
    if (part.op == PiecePart::Op::kRead) {
      MEMENTO_RETURN_IF_ERROR(check_range(part.read, p.bytes));
      if (part.read.offset != 0 || part.read.length != p.bytes ||
          part.read.source.kind == SourceKind::kParity ||
          (part.read.source.kind == SourceKind::kPiece && part.read.source.id != part.piece) ||
          (part.read.source.kind == SourceKind::kCopy &&
           plan.copies[part.read.source.id].piece != part.piece)) {
        return bad("read of " + p.key + " does not name the whole piece or a copy of it");
      }
      continue;
    }
    uint64_t covered = 0;
    std::set<std::pair<uint32_t, int>> seen;
    for (const DecodeBlock& b : part.blocks) {
      if (b.stripe >= plan.stripes.size()) return bad("stripe id out of range");
      const topo::Stripe& s = plan.stripes[b.stripe];
      if (b.target < 0 || b.target >= s.k || s.data[b.target].piece != part.piece ||
          s.data[b.target].offset != b.offset || s.data[b.target].length != b.length ||
          !seen.insert({b.stripe, b.target}).second) {
        return bad(fmt::format("decode block (stripe {}, target {}) is not a block of {}", b.stripe,
                               b.target, p.key));
      }
      if (static_cast<int>(b.inputs.size()) != s.k) {
        return bad(fmt::format("stripe {} decode has {} inputs, needs k={}", b.stripe,
                               b.inputs.size(), s.k));
      }
      std::set<int> idx;
      for (const DecodeInput& in : b.inputs) {
        if (in.index < 0 || in.index >= s.k + s.f || in.index == b.target ||
            !idx.insert(in.index).second) {
          return bad(fmt::format("stripe {} decode input index {}", b.stripe, in.index));
        }
        if (in.zero) {
          if (in.index >= s.k || s.data[in.index].length != 0) {
            return bad(fmt::format("stripe {} block {} is not empty", b.stripe, in.index));
          }
          continue;
        }
        MEMENTO_RETURN_IF_ERROR(check_range(in.range, s.block_bytes));
      }
      covered += b.length;
    }
    if (covered != p.bytes) {
      return bad(
          fmt::format("decode blocks cover {} of the {} bytes of {}", covered, p.bytes, p.key));
    }
  }
  if (have.size() != want.size()) {
    return bad(fmt::format("names {} of the rank's {} non-empty pieces", have.size(), want.size()));
  }
  return Status::Ok();
}

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

}  // namespace

namespace {

// The pieces whose bytes make up `rank`'s whole state (the recipe's parts).
std::vector<uint32_t> RankPieces(const topo::Plan& plan, int rank) {
  std::vector<uint32_t> out;
  const int g = plan.ranks[rank].group;
  for (const topo::Piece& p : plan.pieces) {
    if ((p.kind == topo::PieceKind::kReplicatedShard && p.group == g) ||
        (p.kind != topo::PieceKind::kReplicatedShard && p.rank == rank)) {
      out.push_back(p.id);
    }
  }
  return out;
}

}  // namespace

Result<Recipe> PrimaryRecipe(const topo::Plan& plan, int rank, int64_t step) {
  if (rank < 0 || rank >= static_cast<int>(plan.ranks.size())) {
    return InvalidArgumentError(
        fmt::format("rank {} is not in the plan ({} ranks)", rank, plan.ranks.size()));
  }
  Recipe r;
  r.step = step;
  r.rank = rank;
  r.node = plan.ranks[rank].node;
  for (uint32_t id : RankPieces(plan, rank)) {
    const topo::Piece& p = plan.pieces[id];
    if (p.bytes == 0) continue;
    PiecePart part;
    part.piece = id;
    part.key = p.key;
    part.bytes = p.bytes;
    part.op = PiecePart::Op::kRead;
    part.read = SourceRange{p.node, ByteSource{SourceKind::kPiece, id}, 0, p.bytes};
    r.parts.push_back(std::move(part));
  }
  return r;
}

Status CheckPiecesTile(const topo::Plan& plan, int rank, const std::vector<TensorMeta>& tensors) {
  struct Cover {
    uint64_t offset, length;
    uint32_t piece;
  };
  std::map<std::string, std::vector<Cover>> by_tensor;
  for (const TensorMeta& t : tensors) by_tensor[t.name];
  auto where = [&](uint32_t id) {
    const topo::Piece& p = plan.pieces[id];
    return fmt::format("piece {} (rank {}, node {})", p.key, p.rank, p.node);
  };
  for (uint32_t id : RankPieces(plan, rank)) {
    for (const topo::Segment& s : plan.pieces[id].segments) {
      if (s.length == 0) continue;
      auto it = by_tensor.find(s.tensor);
      if (it == by_tensor.end()) {
        return FailedPreconditionError(
            fmt::format("rank {}: {} holds bytes [{}, {}) of tensor '{}', which the rank does not "
                        "register",
                        rank, where(id), s.offset, s.offset + s.length, s.tensor));
      }
      it->second.push_back(Cover{s.offset, s.length, id});
    }
  }
  for (const TensorMeta& t : tensors) {
    std::vector<Cover>& c = by_tensor[t.name];
    std::sort(c.begin(), c.end(),
              [](const Cover& a, const Cover& b) { return a.offset < b.offset; });
    uint64_t at = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      if (c[i].offset > at) {
        return FailedPreconditionError(fmt::format(
            "rank {}: bytes [{}, {}) of tensor '{}' are in no piece of the plan (the next, {}, "
            "starts there)",
            rank, at, c[i].offset, t.name, where(c[i].piece)));
      }
      if (c[i].offset < at) {
        return FailedPreconditionError(
            fmt::format("rank {}: bytes [{}, {}) of tensor '{}' are in two pieces: {} and {}", rank,
                        c[i].offset, std::min(at, c[i].offset + c[i].length), t.name,
                        where(c[i - 1].piece), where(c[i].piece)));
      }
      at = c[i].offset + c[i].length;
    }
    if (at != t.nbytes()) {
      return FailedPreconditionError(
          fmt::format("rank {}: bytes [{}, {}) of tensor '{}' ({} bytes) are {}", rank,
                      std::min(at, t.nbytes()), std::max(at, t.nbytes()), t.name, t.nbytes(),
                      at < t.nbytes() ? "in no piece of the plan" : "past its end in a piece"));
    }
  }
  return Status::Ok();
}

Result<AssemblyStats> ExecuteAssemblies(const topo::Plan& plan, const topo::Inventory& inventory,
                                        const std::string& job_id, int64_t step,
                                        const std::vector<RankAssembly>& assemblies,
                                        ByteReader& reader, shm::NodeStore& store,
                                        Deadline deadline) {
  return ExecuteAssembliesWithOptions(plan, inventory, job_id, step, assemblies, reader, store,
                                      deadline, ExecuteOptions{});
}

Result<AssemblyStats> ExecuteAssembliesWithOptions(
    const topo::Plan& plan, const topo::Inventory& inventory, const std::string& job_id,
    int64_t step, const std::vector<RankAssembly>& assemblies, ByteReader& reader,
    shm::NodeStore& store, Deadline deadline, const ExecuteOptions& options) {
  Stopwatch total;
  AssemblyStats stats;
  if (options.window_bytes == 0 || options.chunk_bytes == 0 || options.threads < 1) {
    return InvalidArgumentError("execute options: window, chunk and threads must be > 0");
  }
  if (inventory.size() != plan.ranks.size()) {
    return InvalidArgumentError(
        fmt::format("inventory has {} ranks, the plan {}", inventory.size(), plan.ranks.size()));
  }
  const int node = store.options().node;
  // Parse and check everything before touching a slot.
  std::vector<RankJob> jobs;
  std::set<int> ranks_seen;
  for (const RankAssembly& a : assemblies) {
    MEMENTO_ASSIGN_OR_RETURN(Recipe recipe, RecipeFromJson(a.recipe));
    if (a.rank < 0 || a.rank >= static_cast<int>(plan.ranks.size()) || recipe.rank != a.rank ||
        recipe.step != step || recipe.node != a.node || a.node != node ||
        plan.topology.rank_node[a.rank] != node) {
      return InvalidArgumentError(fmt::format(
          "assembly of rank {} (recipe rank {}, step {}, node {}) does not belong to step {} on "
          "node {}",
          a.rank, recipe.rank, recipe.step, a.node, step, node));
    }
    if (!ranks_seen.insert(a.rank).second) {
      return InvalidArgumentError(fmt::format("rank {} is assembled twice", a.rank));
    }
    MEMENTO_RETURN_IF_ERROR(CheckRecipe(plan, recipe));
    RankJob job;
    job.recipe = std::move(recipe);
    MEMENTO_ASSIGN_OR_RETURN(
        job.layout, shm::ComputeSlotLayout(job_id, a.rank, inventory[a.rank], options.chunk_bytes));
    std::map<std::string, const shm::SavedTensor*> by_name;
    for (const shm::SavedTensor& t : job.layout.tensors) by_name[t.meta.name] = &t;
    for (const PiecePart& part : job.recipe.parts) {
      std::vector<Extent>& ext = job.extents[part.piece];
      uint64_t at = 0;
      for (const topo::Segment& seg : plan.pieces[part.piece].segments) {
        auto it = by_name.find(seg.tensor);
        if (it == by_name.end() || seg.offset + seg.length > it->second->nbytes) {
          return InvalidArgumentError(
              fmt::format("rank {}: piece {} names bytes [{}, {}) of tensor '{}', which the rank's "
                          "inventory does not register with that size",
                          a.rank, plan.pieces[part.piece].key, seg.offset, seg.offset + seg.length,
                          seg.tensor));
        }
        ext.push_back(Extent{at, it->second->offset + seg.offset, seg.length});
        at += seg.length;
      }
    }
    if (options.stage_path) {
      MEMENTO_RETURN_IF_ERROR(CheckPiecesTile(plan, a.rank, inventory[a.rank]));
    }
    jobs.push_back(std::move(job));
  }

  if (deadline.expired()) {
    return DeadlineExceededError(
        fmt::format("recovery of step {} on node {}: deadline passed before it began", step, node));
  }
  Stopwatch phase;  // per-phase wall times, logged at the end
  // Slots: allocate and choose for every rank first (an allocation failure
  // leaves every slot as it was), then mark them kWriting (a crash or an
  // error from here on leaves them not complete).
  std::vector<RankJob*> todo;
  const bool staged = static_cast<bool>(options.stage_path);
  for (RankJob& job : jobs) {
    const int rank = job.recipe.rank;
    if (staged) {
      // A restore-time assembly: a fresh file, the store's slots untouched.
      const std::string path = options.stage_path(rank);
      if (unlink(path.c_str()) != 0 && errno != ENOENT) {
        return ErrnoError("removing the old staged slot " + path, errno);
      }
      MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> seg,
                               shm::Segment::CreateOrGrow(path, job.layout.total_bytes));
      job.segment = std::move(seg);
      job.slot = 0;
      todo.push_back(&job);
      continue;
    }
    MEMENTO_ASSIGN_OR_RETURN(job.slot, ChooseSlot(store, rank, step));
    if (job.slot < 0) {
      MEMENTO_LOG_INFO("recover: rank {} already holds step {} intact", rank, step);
      continue;
    }
    // Only the slot rebuilt into is allocated (the trainer's Seal makes the
    // other). Written through the store's own mapping when it is writable,
    // so the verification below reads pages this mapping already touched.
    MEMENTO_ASSIGN_OR_RETURN(job.segment, store.EnsureSlot(rank, job.slot, job.layout.total_bytes));
    if (!job.segment->writable()) {
      MEMENTO_ASSIGN_OR_RETURN(job.segment, shm::Segment::Open(job.segment->path(),
                                                               /*writable=*/true));
    }
    if (job.segment->size() < job.layout.total_bytes) {
      return InternalError(fmt::format("slot {} of rank {} is {} bytes, needs {}", job.slot, rank,
                                       job.segment->size(), job.layout.total_bytes));
    }
    todo.push_back(&job);
  }
  for (RankJob* job : todo) {
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

  // Units of work over every rank: reads and decodes in windows. A piece
  // that several ranks here need (the replicated state of DP ranks sharing
  // this node) is fetched once, into the first rank's slot, and copied from
  // there to the others afterwards.
  std::vector<Unit> units;
  std::map<uint32_t, size_t> fetched_by;  // piece -> index in todo of the rank that fetches it
  struct LocalCopy {
    size_t from, to;
    uint32_t piece;
  };
  std::vector<LocalCopy> local_copies;
  const uint64_t read_window =
      options.read_window_bytes > 0 ? options.read_window_bytes : options.window_bytes;
  for (size_t j = 0; j < todo.size(); ++j) {
    const Recipe& r = todo[j]->recipe;
    for (size_t p = 0; p < r.parts.size(); ++p) {
      const PiecePart& part = r.parts[p];
      auto [it, first] = fetched_by.emplace(part.piece, j);
      if (!first) {
        local_copies.push_back(LocalCopy{it->second, j, part.piece});
        continue;
      }
      if (part.op == PiecePart::Op::kRead) {
        for (uint64_t w = 0; w < part.bytes; w += read_window) {
          units.push_back(Unit{j, p, 0, w, std::min(read_window, part.bytes - w)});
        }
        continue;
      }
      for (size_t b = 0; b < part.blocks.size(); ++b) {
        const uint64_t len = part.blocks[b].length;
        const uint64_t base = part.blocks[b].offset;
        for (uint64_t w = 0; w < len;) {
          uint64_t end = w + std::min(options.window_bytes, len - w);
          uint64_t slot = 0, extent_end = 0;
          if (todo[j]->SlotOf(part.piece, base + w, &slot, &extent_end)) {
            // End the window at the next chunk boundary when it falls
            // inside: then the following windows each cover whole chunks.
            const uint64_t boundary = todo[j]->NextChunkBoundary(slot);
            if (boundary != UINT64_MAX && base + w + (boundary - slot) <= extent_end) {
              end = std::min(end, w + (boundary - slot));
            }
          }
          units.push_back(Unit{j, p, b, w, end - w});
          w = end;
        }
      }
    }
  }
  // Reads first, decodes after: a decode input that is a piece this node
  // fetches whole (a data block of the stripe, named as that piece or as a
  // copy of it) is taken from the slot once its reads are done instead of
  // being read over the network a second time. Workers take units in order,
  // so a decode unit waits only for reads already running on other workers
  // (reads never wait): no deadlock.
  std::stable_partition(units.begin(), units.end(), [&](const Unit& u) {
    return todo[u.job]->recipe.parts[u.part].op == PiecePart::Op::kRead;
  });
  std::map<uint32_t, size_t> read_by;  // piece -> todo index whose slot a kRead fills
  for (const auto& [piece, j] : fetched_by) {
    for (const PiecePart& part : todo[j]->recipe.parts) {
      if (part.piece == piece && part.op == PiecePart::Op::kRead) read_by[piece] = j;
    }
  }
  Mutex fetch_mu;
  CondVar fetch_cv;
  std::map<uint32_t, size_t> pending;  // piece -> read units not yet done (guarded by fetch_mu)
  Status fetch_error;                  // first failed read (guarded by fetch_mu)
  for (const Unit& u : units) {
    const PiecePart& part = todo[u.job]->recipe.parts[u.part];
    if (part.op == PiecePart::Op::kRead) ++pending[part.piece];
  }
  auto piece_read_done = [&](uint32_t piece, const Status& st) {
    MutexLock l(&fetch_mu);
    if (!st.ok() && fetch_error.ok()) fetch_error = st;
    --pending[piece];
    fetch_cv.SignalAll();
  };
  auto wait_piece = [&](uint32_t piece) -> Status {
    MutexLock l(&fetch_mu);
    while (pending[piece] > 0 && fetch_error.ok()) {
      if (deadline.infinite()) {
        fetch_cv.Wait(&l);
      } else if (!fetch_cv.WaitUntil(&l, deadline.when())) {
        return DeadlineExceededError(
            fmt::format("recovery of step {}: waiting for piece {} ran past the deadline", step,
                        plan.pieces[piece].key));
      }
    }
    return fetch_error;
  };
  // The piece whose bytes a source range holds (a piece or a copy of it).
  auto piece_of = [&](const SourceRange& r) -> int64_t {
    if (r.source.kind == SourceKind::kPiece) return r.source.id;
    if (r.source.kind == SourceKind::kCopy) return plan.copies[r.source.id].piece;
    return -1;
  };
  // Where piece bytes [off, off + n) lie in the slot of todo[j] when they
  // are contiguous there (inside one extent); null otherwise.
  auto in_slot = [&](size_t j, uint32_t piece, uint64_t off, uint64_t n) -> uint8_t* {
    const RankJob& job = *todo[j];
    for (const Extent& e : job.extents.at(piece)) {
      if (off >= e.piece_offset && off + n <= e.piece_offset + e.length) {
        return job.data + e.slot_offset + (off - e.piece_offset);
      }
    }
    return nullptr;
  };
  // Copies piece bytes [off, off + n) out of the slot of todo[j].
  auto copy_from_slot = [&](size_t j, uint32_t piece, uint64_t off, uint64_t n, uint8_t* dst) {
    const RankJob& job = *todo[j];
    for (const Extent& e : job.extents.at(piece)) {
      const uint64_t lo = std::max(off, e.piece_offset);
      const uint64_t hi = std::min(off + n, e.piece_offset + e.length);
      if (lo >= hi) continue;
      std::memcpy(dst + (lo - off), job.data + e.slot_offset + (lo - e.piece_offset), hi - lo);
    }
  };

  // One decoder per decoded block, made up front (immutable, shared by workers).
  std::map<std::tuple<bool, int, int>, codec::ErasureCode> codes;
  std::map<std::pair<size_t, std::pair<size_t, size_t>>, codec::Decoder> decoders;
  for (const Unit& u : units) {
    const PiecePart& part = todo[u.job]->recipe.parts[u.part];
    if (part.op != PiecePart::Op::kDecode) continue;
    auto key = std::make_pair(u.job, std::make_pair(u.part, u.block));
    if (decoders.count(key)) continue;
    const DecodeBlock& b = part.blocks[u.block];
    Status st;
    const codec::ErasureCode* code = CodeFor(&codes, plan.stripes[b.stripe], &st);
    if (code == nullptr) return st;
    std::vector<int> avail;
    for (const DecodeInput& in : b.inputs) avail.push_back(in.index);
    MEMENTO_ASSIGN_OR_RETURN(codec::Decoder dec, code->MakeDecoder(avail, {b.target}));
    decoders.emplace(key, std::move(dec));
  }

  struct WorkerStats {
    double transfer_s = 0, decode_s = 0, write_s = 0;
    uint64_t read_bytes = 0;
    uint64_t local_bytes = 0;      // decode inputs taken from this node's slots
    std::vector<Scratch> buffers;  // decode scratch: k inputs + 1 output
  };
  const int threads = std::max(1, options.threads);
  std::vector<WorkerStats> ws(threads);

  // " (tensor 'a' bytes [x, y), ...)": the tensor bytes a piece range holds,
  // for error messages.
  auto tensor_ranges = [&](const SourceRange& what) -> std::string {
    const int64_t piece = piece_of(what);
    if (piece < 0) return "";
    std::string out;
    uint64_t at = 0;
    for (const topo::Segment& sg : plan.pieces[piece].segments) {
      const uint64_t lo = std::max(at, what.offset);
      const uint64_t hi = std::min(at + sg.length, what.offset + what.length);
      if (lo < hi) {
        out += fmt::format("{}tensor '{}' bytes [{}, {})", out.empty() ? " (" : ", ", sg.tensor,
                           sg.offset + (lo - at), sg.offset + (hi - at));
      }
      at += sg.length;
    }
    return out.empty() ? out : out + ")";
  };

  auto read = [&](WorkerStats& w, const Recipe& r, const SourceRange& src, uint64_t offset,
                  uint64_t length, void* dst, RankJob* into_slot = nullptr) -> Status {
    if (deadline.expired()) {
      return DeadlineExceededError(
          fmt::format("recovery of rank {} ran past its deadline", r.rank));
    }
    ReadRequest req;
    req.step = r.step;
    req.source = src.source;
    req.offset = src.offset + offset;
    req.length = length;
    Stopwatch sw;
    Status st;
    if (into_slot != nullptr && options.reuse_digests) {
      // A digest that covers exactly one chunk of the slot is that chunk's
      // checksum: the bytes were hashed and compared on arrival.
      RankJob& job = *into_slot;
      const uint64_t base = static_cast<uint8_t*>(dst) - job.data;
      st = reader.ReadWithDigests(
          src.node, req, dst, deadline, [&](uint64_t off, uint64_t len, uint64_t xxh3) {
            auto c = job.chunk_at.find(base + off);
            if (c == job.chunk_at.end() || job.layout.chunks[c->second].length != len) {
              return;
            }
            job.known_checksum[c->second] = xxh3;
            job.known[c->second] = 1;
          });
    } else {
      st = reader.Read(src.node, req, dst, deadline);
    }
    w.transfer_s += sw.Seconds();
    if (!st.ok()) {
      SourceRange what = src;
      what.offset = req.offset;
      what.length = length;
      return Status(st.code(),
                    fmt::format("recovery of rank {}: reading {}{} failed: {}", r.rank,
                                Describe(what, r.step), tensor_ranges(what), st.message()));
    }
    w.read_bytes += length;
    return Status::Ok();
  };

  const double slots_s = phase.Seconds();
  phase.Reset();
  Status st = ParallelFor(units.size(), threads, [&](size_t i, int wi) -> Status {
    WorkerStats& w = ws[wi];
    const Unit& u = units[i];
    RankJob& job = *todo[u.job];
    const PiecePart& part = job.recipe.parts[u.part];
    const std::vector<Extent>& ext = job.extents.at(part.piece);
    // Piece range [a, a + n) <-> the slot, extent by extent.
    auto for_each_extent = [&](uint64_t a, uint64_t n, auto&& fn) -> Status {
      for (const Extent& e : ext) {
        const uint64_t lo = std::max(a, e.piece_offset);
        const uint64_t hi = std::min(a + n, e.piece_offset + e.length);
        if (lo >= hi) continue;
        MEMENTO_RETURN_IF_ERROR(
            fn(lo - a, job.data + e.slot_offset + (lo - e.piece_offset), hi - lo));
      }
      return Status::Ok();
    };
    if (part.op == PiecePart::Op::kRead) {
      // Straight into the slot: no staging copy.
      Status rs = for_each_extent(u.begin, u.length, [&](uint64_t rel, uint8_t* dst, uint64_t n) {
        return read(w, job.recipe, part.read, u.begin + rel, n, dst, &job);
      });
      piece_read_done(part.piece, rs);
      return rs;
    }
    const DecodeBlock& b = part.blocks[u.block];
    const codec::Decoder& dec = decoders.at(std::make_pair(u.job, std::make_pair(u.part, u.block)));
    const size_t k = b.inputs.size();
    if (w.buffers.size() < k + 1) w.buffers.resize(k + 1);
    // Worker buffer x, at least u.length bytes; only the inputs that are
    // not read in place from a slot get one.
    auto scratch = [&](size_t x) -> Result<uint8_t*> {
      uint8_t* p = w.buffers[x].Get(u.length);
      if (p == nullptr) {
        return ResourceExhaustedError(
            fmt::format("recovery of rank {}: no memory for a {}-byte decode buffer",
                        job.recipe.rank, u.length));
      }
      return p;
    };
    std::vector<const uint8_t*> in(k);
    std::vector<size_t> local;  // inputs taken from a slot of this node, after the network ones
    for (size_t x = 0; x < k; ++x) {
      const DecodeInput& src = b.inputs[x];
      // Data blocks are zero-padded to block_bytes; parity is block_bytes long.
      const uint64_t have = src.zero || u.begin >= src.range.length
                                ? 0
                                : std::min(u.length, src.range.length - u.begin);
      const int64_t piece = have == 0 ? -1 : piece_of(src.range);
      if (have > 0 && options.reuse_fetched_inputs && piece >= 0 &&
          read_by.count(static_cast<uint32_t>(piece))) {
        local.push_back(x);
        continue;
      }
      MEMENTO_ASSIGN_OR_RETURN(uint8_t * buf, scratch(x));
      in[x] = buf;
      std::memset(buf + have, 0, u.length - have);
      if (have == 0) continue;
      MEMENTO_RETURN_IF_ERROR(read(w, job.recipe, src.range, u.begin, have, buf));
    }
    for (size_t x : local) {
      const DecodeInput& src = b.inputs[x];
      const auto piece = static_cast<uint32_t>(piece_of(src.range));
      const uint64_t have = std::min(u.length, src.range.length - u.begin);
      MEMENTO_RETURN_IF_ERROR(wait_piece(piece));
      Stopwatch lsw;
      const size_t from = read_by.at(piece);
      const uint64_t off = src.range.offset + u.begin;
      // Read in place when the window is contiguous in the slot and needs
      // no zero padding; else copied into the worker's buffer.
      if (const uint8_t* p = have == u.length ? in_slot(from, piece, off, have) : nullptr) {
        in[x] = p;
      } else {
        MEMENTO_ASSIGN_OR_RETURN(uint8_t * buf, scratch(x));
        copy_from_slot(from, piece, off, have, buf);
        std::memset(buf + have, 0, u.length - have);
        in[x] = buf;
      }
      w.decode_s += lsw.Seconds();
      w.local_bytes += have;
    }
    // Decoded straight into the slot when the window is contiguous there.
    uint8_t* outp = in_slot(u.job, part.piece, b.offset + u.begin, u.length);
    const bool direct = outp != nullptr;
    if (!direct) {
      MEMENTO_ASSIGN_OR_RETURN(outp, scratch(k));
    }
    Stopwatch sw;
    dec.Decode(u.length, in.data(), &outp);
    w.decode_s += sw.Seconds();
    sw.Reset();
    Status s = Status::Ok();
    if (!direct) {
      s = for_each_extent(b.offset + u.begin, u.length,
                          [&](uint64_t rel, uint8_t* dst, uint64_t n) {
                            std::memcpy(dst, outp + rel, n);
                            return Status::Ok();
                          });
    }
    if (s.ok()) {
      // The whole chunks this unit wrote, hashed while they are in cache.
      s = for_each_extent(b.offset + u.begin, u.length, [&](uint64_t, uint8_t* dst, uint64_t n) {
        const uint64_t lo = dst - job.data, hi = lo + n;
        for (auto c = job.chunk_at.lower_bound(lo); c != job.chunk_at.end() && c->first < hi; ++c) {
          const shm::ChunkEntry& ch = job.layout.chunks[c->second];
          if (ch.offset + ch.length > hi) break;
          job.decoded_checksum[c->second] = Checksum(job.data + ch.offset, ch.length);
          job.decoded[c->second] = 1;
        }
        return Status::Ok();
      });
    }
    w.write_s += sw.Seconds();
    return s;
  });
  for (const WorkerStats& w : ws) {
    stats.transfer_s += w.transfer_s;
    stats.decode_s += w.decode_s;
    stats.write_s += w.write_s;
    stats.read_bytes += w.read_bytes;
  }
  if (!st.ok()) return st;  // the slots stay kWriting: never taken for complete

  const double fetch_s = phase.Seconds();
  phase.Reset();
  // Pieces fetched once for several ranks: slot to slot.
  Stopwatch copy_sw;
  MEMENTO_RETURN_IF_ERROR(ParallelFor(local_copies.size(), threads, [&](size_t i, int) -> Status {
    const LocalCopy& c = local_copies[i];
    const RankJob& from = *todo[c.from];
    const RankJob& to = *todo[c.to];
    for (const Extent& src : from.extents.at(c.piece)) {
      for (const Extent& dst : to.extents.at(c.piece)) {
        const uint64_t lo = std::max(src.piece_offset, dst.piece_offset);
        const uint64_t hi = std::min(src.piece_offset + src.length, dst.piece_offset + dst.length);
        if (lo >= hi) continue;
        std::memcpy(to.data + dst.slot_offset + (lo - dst.piece_offset),
                    from.data + src.slot_offset + (lo - src.piece_offset), hi - lo);
      }
    }
    return Status::Ok();
  }));
  stats.write_s += copy_sw.Seconds();

  // Chunk checksums (parallel over every chunk whose checksum no digest
  // gave), then complete and verify.
  Stopwatch sw;
  std::vector<std::pair<RankJob*, size_t>> chunks;
  uint64_t reused = 0;
  uint64_t at_decode = 0;
  for (RankJob* job : todo) {
    shm::ChunkEntry* table = shm::SlotTable(*job->segment);
    for (size_t c = 0; c < job->layout.chunks.size(); ++c) {
      if (job->known[c]) {
        table[c].checksum = job->known_checksum[c];
        ++reused;
        continue;
      }
      if (job->decoded[c]) {
        table[c].checksum = job->decoded_checksum[c];
        ++at_decode;
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
  const double checksum_s = phase.Seconds();
  phase.Reset();
  for (RankJob* job : todo) {
    if (options.before_complete) options.before_complete(job->recipe.rank, *job->segment);
    shm::CompleteSlotWrite(*job->segment);
    if (staged) {
      // Its reader (the client's restore) verifies every chunk.
      stats.bytes += job->layout.data_bytes;
      stats.ranks.push_back(job->recipe.rank);
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
    stats.bytes += job->layout.data_bytes;
    stats.ranks.push_back(job->recipe.rank);
    MEMENTO_LOG_INFO("recover: rebuilt rank {} step {} in slot {} ({} bytes)", job->recipe.rank,
                     step, job->slot, job->layout.data_bytes);
  }
  stats.write_s += sw.Seconds();
  stats.total_s = total.Seconds();
  uint64_t local_bytes = 0;
  for (const WorkerStats& w : ws) local_bytes += w.local_bytes;
  MEMENTO_LOG_INFO(
      "recover: step {}: {} bytes read, {} decode input bytes taken from this node's slots, "
      "{} of {} chunk checksums from arrival digests, {} hashed by the decode units, {} after; "
      "wall s: slots {:.3f}, fetch+decode {:.3f}, local copies + checksums {:.3f}, "
      "complete+verify {:.3f}",
      step, stats.read_bytes, local_bytes, reused, reused + at_decode + chunks.size(), at_decode,
      chunks.size(), slots_s, fetch_s, checksum_s, phase.Seconds());
  return stats;
}

}  // namespace memento::recover
