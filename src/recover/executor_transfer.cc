// Transfers in the executor (executor_steps.h): the units of parallel work
// (PlanTransfers), running them (Transfers: reads straight into the slots,
// decodes from fetched or local inputs) and the slot-to-slot copies of
// pieces fetched once for several ranks (CopySharedPieces). REFT 4.3
// distributed in-memory loading; docs/recovery.md, "Executor" and "Threads".
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "codec/erasure_code.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "fmt/format.h"
#include "recover/executor_steps.h"

namespace memento::recover::internal {
namespace {

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

// Piece range [a, a + n) <-> the slot of `job`, extent by extent:
// fn(offset in the range, slot pointer, length) for each overlap.
template <typename Fn>
Status ForEachExtent(const RankJob& job, uint32_t piece, uint64_t a, uint64_t n, Fn&& fn) {
  for (const Extent& e : job.extents.at(piece)) {
    const uint64_t lo = std::max(a, e.piece_offset);
    const uint64_t hi = std::min(a + n, e.piece_offset + e.length);
    if (lo >= hi) continue;
    MEMENTO_RETURN_IF_ERROR(fn(lo - a, job.data + e.slot_offset + (lo - e.piece_offset), hi - lo));
  }
  return Status::Ok();
}

// The piece whose bytes a source range holds (a piece or a copy of it); -1
// for parity.
int64_t PieceOf(const topo::Plan& plan, const SourceRange& r) {
  if (r.source.kind == SourceKind::kPiece) return r.source.id;
  if (r.source.kind == SourceKind::kCopy) return plan.copies[r.source.id].piece;
  return -1;
}

// " (tensor 'a' bytes [x, y), ...)": the tensor bytes a piece range holds,
// for error messages.
std::string TensorRanges(const topo::Plan& plan, const SourceRange& what) {
  const int64_t piece = PieceOf(plan, what);
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
}

// Adds the decode windows of block `b` of part `p` of todo[j] to `units`.
void AddDecodeWindows(const RankJob& job, size_t j, size_t p, size_t b, uint64_t window_bytes,
                      std::vector<Unit>* units) {
  const PiecePart& part = job.recipe.parts[p];
  const uint64_t len = part.blocks[b].length;
  const uint64_t base = part.blocks[b].offset;
  for (uint64_t w = 0; w < len;) {
    uint64_t end = w + std::min(window_bytes, len - w);
    uint64_t slot = 0, extent_end = 0;
    if (job.SlotOf(part.piece, base + w, &slot, &extent_end)) {
      // End the window at the next chunk boundary when it falls
      // inside: then the following windows each cover whole chunks.
      const uint64_t boundary = job.NextChunkBoundary(slot);
      if (boundary != UINT64_MAX && base + w + (boundary - slot) <= extent_end) {
        end = std::min(end, w + (boundary - slot));
      }
    }
    units->push_back(Unit{j, p, b, w, end - w});
    w = end;
  }
}

}  // namespace

TransferPlan PlanTransfers(const std::vector<RankJob*>& todo, const ExecuteOptions& options) {
  TransferPlan out;
  std::map<uint32_t, size_t> fetched_by;  // piece -> index in todo of the rank that fetches it
  const uint64_t read_window =
      options.read_window_bytes > 0 ? options.read_window_bytes : options.window_bytes;
  for (size_t j = 0; j < todo.size(); ++j) {
    const Recipe& r = todo[j]->recipe;
    for (size_t p = 0; p < r.parts.size(); ++p) {
      const PiecePart& part = r.parts[p];
      auto [it, first] = fetched_by.emplace(part.piece, j);
      if (!first) {
        out.local_copies.push_back(LocalCopy{it->second, j, part.piece});
        continue;
      }
      if (part.op == PiecePart::Op::kRead) {
        for (uint64_t w = 0; w < part.bytes; w += read_window) {
          out.units.push_back(Unit{j, p, 0, w, std::min(read_window, part.bytes - w)});
        }
        continue;
      }
      for (size_t b = 0; b < part.blocks.size(); ++b) {
        AddDecodeWindows(*todo[j], j, p, b, options.window_bytes, &out.units);
      }
    }
  }
  // Reads first, decodes after: a decode input that is a piece this node
  // fetches whole (a data block of the stripe, named as that piece or as a
  // copy of it) is taken from the slot once its reads are done instead of
  // being read over the network a second time. Workers take units in order,
  // so a decode unit waits only for reads already running on other workers
  // (reads never wait): no deadlock.
  std::stable_partition(out.units.begin(), out.units.end(), [&](const Unit& u) {
    return todo[u.job]->recipe.parts[u.part].op == PiecePart::Op::kRead;
  });
  for (const auto& [piece, j] : fetched_by) {
    for (const PiecePart& part : todo[j]->recipe.parts) {
      if (part.piece == piece && part.op == PiecePart::Op::kRead) out.read_by[piece] = j;
    }
  }
  return out;
}

class Transfers::Impl {
 public:
  Impl(const topo::Plan& plan, const std::vector<RankJob*>& todo, const TransferPlan& units,
       ByteReader& reader, Deadline deadline, const ExecuteOptions& options)
      : plan_(plan),
        todo_(todo),
        units_(units.units),
        read_by_(units.read_by),
        reader_(reader),
        deadline_(deadline),
        options_(options),
        workers_(std::max(1, options.threads)) {
    MutexLock l(&fetch_mu_);
    for (const Unit& u : units_) {
      const PiecePart& part = PartOf(u);
      if (part.op == PiecePart::Op::kRead) ++pending_[part.piece];
    }
  }

  Status MakeDecoders() {
    for (const Unit& u : units_) {
      const PiecePart& part = PartOf(u);
      if (part.op != PiecePart::Op::kDecode) continue;
      const DecoderKey key = KeyOf(u);
      if (decoders_.count(key)) continue;
      const DecodeBlock& b = part.blocks[u.block];
      Status st;
      const codec::ErasureCode* code = CodeFor(&codes_, plan_.stripes[b.stripe], &st);
      if (code == nullptr) return st;
      std::vector<int> avail;
      for (const DecodeInput& in : b.inputs) avail.push_back(in.index);
      MEMENTO_ASSIGN_OR_RETURN(codec::Decoder dec, code->MakeDecoder(avail, {b.target}));
      decoders_.emplace(key, std::move(dec));
    }
    return Status::Ok();
  }

  Status Run() {
    return ParallelFor(units_.size(), static_cast<int>(workers_.size()),
                       [&](size_t i, int wi) -> Status {
                         const Unit& u = units_[i];
                         if (PartOf(u).op == PiecePart::Op::kRead) return RunRead(workers_[wi], u);
                         return RunDecode(workers_[wi], u);
                       });
  }

  TransferTotals Totals() const {
    TransferTotals t;
    for (const Worker& w : workers_) {
      t.transfer_s += w.transfer_s;
      t.decode_s += w.decode_s;
      t.write_s += w.write_s;
      t.read_bytes += w.read_bytes;
      t.local_bytes += w.local_bytes;
    }
    return t;
  }

 private:
  // (job, part, block) of a decode unit.
  using DecoderKey = std::pair<size_t, std::pair<size_t, size_t>>;
  struct Worker {
    double transfer_s = 0, decode_s = 0, write_s = 0;
    uint64_t read_bytes = 0;
    uint64_t local_bytes = 0;      // decode inputs taken from this node's slots
    std::vector<Scratch> buffers;  // decode scratch: k inputs + 1 output
  };

  const PiecePart& PartOf(const Unit& u) const { return todo_[u.job]->recipe.parts[u.part]; }
  static DecoderKey KeyOf(const Unit& u) {
    return std::make_pair(u.job, std::make_pair(u.part, u.block));
  }

  // A whole-piece read window, straight into the slot: no staging copy.
  Status RunRead(Worker& w, const Unit& u) {
    RankJob& job = *todo_[u.job];
    const PiecePart& part = PartOf(u);
    Status rs = ForEachExtent(job, part.piece, u.begin, u.length,
                              [&](uint64_t rel, uint8_t* dst, uint64_t n) {
                                return Read(w, job.recipe, part.read, u.begin + rel, n, dst, &job);
                              });
    PieceReadDone(part.piece, rs);
    return rs;
  }

  // A decode window: its k inputs, decoded into the slot (or through the
  // worker's buffer where the window is not contiguous there).
  Status RunDecode(Worker& w, const Unit& u) {
    RankJob& job = *todo_[u.job];
    const PiecePart& part = PartOf(u);
    const DecodeBlock& b = part.blocks[u.block];
    const codec::Decoder& dec = decoders_.at(KeyOf(u));
    const size_t k = b.inputs.size();
    if (w.buffers.size() < k + 1) w.buffers.resize(k + 1);
    std::vector<const uint8_t*> in(k);
    MEMENTO_RETURN_IF_ERROR(GatherInputs(w, u, b, &in));
    // Decoded straight into the slot when the window is contiguous there.
    uint8_t* outp = job.InSlot(part.piece, b.offset + u.begin, u.length);
    const bool direct = outp != nullptr;
    if (!direct) {
      MEMENTO_ASSIGN_OR_RETURN(outp, ScratchFor(w, k, u));
    }
    Stopwatch sw;
    dec.Decode(u.length, in.data(), &outp);
    w.decode_s += sw.Seconds();
    sw.Reset();
    Status s = Status::Ok();
    if (!direct) {
      s = ForEachExtent(job, part.piece, b.offset + u.begin, u.length,
                        [&](uint64_t rel, uint8_t* dst, uint64_t n) {
                          std::memcpy(dst, outp + rel, n);
                          return Status::Ok();
                        });
    }
    if (s.ok()) s = HashWrittenChunks(job, part.piece, b.offset + u.begin, u.length);
    w.write_s += sw.Seconds();
    return s;
  }

  // The k inputs of a decode window into `in`: read over the network into
  // the worker's buffers, then (after their reads) the ones this node
  // fetches whole, taken from the slot.
  Status GatherInputs(Worker& w, const Unit& u, const DecodeBlock& b,
                      std::vector<const uint8_t*>* in) {
    const Recipe& recipe = todo_[u.job]->recipe;
    std::vector<size_t> local;  // inputs taken from a slot of this node, after the network ones
    for (size_t x = 0; x < b.inputs.size(); ++x) {
      const DecodeInput& src = b.inputs[x];
      // Data blocks are zero-padded to block_bytes; parity is block_bytes long.
      const uint64_t have = src.zero || u.begin >= src.range.length
                                ? 0
                                : std::min(u.length, src.range.length - u.begin);
      const int64_t piece = have == 0 ? -1 : PieceOf(plan_, src.range);
      if (have > 0 && options_.reuse_fetched_inputs && piece >= 0 &&
          read_by_.count(static_cast<uint32_t>(piece))) {
        local.push_back(x);
        continue;
      }
      MEMENTO_ASSIGN_OR_RETURN(uint8_t * buf, ScratchFor(w, x, u));
      (*in)[x] = buf;
      std::memset(buf + have, 0, u.length - have);
      if (have == 0) continue;
      MEMENTO_RETURN_IF_ERROR(Read(w, recipe, src.range, u.begin, have, buf));
    }
    for (size_t x : local) MEMENTO_RETURN_IF_ERROR(TakeLocalInput(w, u, b.inputs[x], x, in));
    return Status::Ok();
  }

  // Input x of a decode window from the slot its piece is read into: in
  // place when the window is contiguous in the slot and needs no zero
  // padding; else copied into the worker's buffer.
  Status TakeLocalInput(Worker& w, const Unit& u, const DecodeInput& src, size_t x,
                        std::vector<const uint8_t*>* in) {
    const auto piece = static_cast<uint32_t>(PieceOf(plan_, src.range));
    const uint64_t have = std::min(u.length, src.range.length - u.begin);
    MEMENTO_RETURN_IF_ERROR(WaitPiece(piece, todo_[u.job]->recipe.step));
    Stopwatch lsw;
    const RankJob& from = *todo_[read_by_.at(piece)];
    const uint64_t off = src.range.offset + u.begin;
    if (const uint8_t* p = have == u.length ? from.InSlot(piece, off, have) : nullptr) {
      (*in)[x] = p;
    } else {
      MEMENTO_ASSIGN_OR_RETURN(uint8_t * buf, ScratchFor(w, x, u));
      from.CopyOut(piece, off, have, buf);
      std::memset(buf + have, 0, u.length - have);
      (*in)[x] = buf;
    }
    w.decode_s += lsw.Seconds();
    w.local_bytes += have;
    return Status::Ok();
  }

  // The whole chunks a decode unit wrote (piece bytes [a, a + n) of the
  // slot), hashed while they are in cache.
  static Status HashWrittenChunks(RankJob& job, uint32_t piece, uint64_t a, uint64_t n) {
    return ForEachExtent(job, piece, a, n, [&](uint64_t, uint8_t* dst, uint64_t len) {
      const uint64_t lo = dst - job.data, hi = lo + len;
      for (auto c = job.chunk_at.lower_bound(lo); c != job.chunk_at.end() && c->first < hi; ++c) {
        const shm::ChunkEntry& ch = job.layout.chunks[c->second];
        if (ch.offset + ch.length > hi) break;
        job.decoded_checksum[c->second] = Checksum(job.data + ch.offset, ch.length);
        job.decoded[c->second] = 1;
      }
      return Status::Ok();
    });
  }

  // Worker buffer x, at least u.length bytes; only the inputs that are not
  // read in place from a slot get one.
  Result<uint8_t*> ScratchFor(Worker& w, size_t x, const Unit& u) {
    uint8_t* p = w.buffers[x].Get(u.length);
    if (p == nullptr) {
      return ResourceExhaustedError(
          fmt::format("recovery of rank {}: no memory for a {}-byte decode buffer",
                      todo_[u.job]->recipe.rank, u.length));
    }
    return p;
  }

  // Bytes [offset, offset + length) of `src` into dst. With `into_slot` (a
  // read into that job's slot) and options.reuse_digests, a digest that
  // covers exactly one chunk of the slot is that chunk's checksum: the bytes
  // were hashed and compared on arrival.
  Status Read(Worker& w, const Recipe& r, const SourceRange& src, uint64_t offset, uint64_t length,
              void* dst, RankJob* into_slot = nullptr) {
    if (deadline_.expired()) {
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
    if (into_slot != nullptr && options_.reuse_digests) {
      RankJob& job = *into_slot;
      const uint64_t base = static_cast<uint8_t*>(dst) - job.data;
      st = reader_.ReadWithDigests(
          src.node, req, dst, deadline_, [&](uint64_t off, uint64_t len, uint64_t xxh3) {
            auto c = job.chunk_at.find(base + off);
            if (c == job.chunk_at.end() || job.layout.chunks[c->second].length != len) {
              return;
            }
            job.known_checksum[c->second] = xxh3;
            job.known[c->second] = 1;
          });
    } else {
      st = reader_.Read(src.node, req, dst, deadline_);
    }
    w.transfer_s += sw.Seconds();
    if (!st.ok()) {
      SourceRange what = src;
      what.offset = req.offset;
      what.length = length;
      return Status(st.code(),
                    fmt::format("recovery of rank {}: reading {}{} failed: {}", r.rank,
                                Describe(what, r.step), TensorRanges(plan_, what), st.message()));
    }
    w.read_bytes += length;
    return Status::Ok();
  }

  // A read unit of `piece` finished (with `st`).
  void PieceReadDone(uint32_t piece, const Status& st) {
    MutexLock l(&fetch_mu_);
    if (!st.ok() && fetch_error_.ok()) fetch_error_ = st;
    --pending_[piece];
    fetch_cv_.SignalAll();
  }

  // Until every read unit of `piece` is done: the first failed read's error,
  // or DeadlineExceeded (naming `step`).
  Status WaitPiece(uint32_t piece, int64_t step) {
    MutexLock l(&fetch_mu_);
    while (pending_[piece] > 0 && fetch_error_.ok()) {
      if (deadline_.infinite()) {
        fetch_cv_.Wait(&l);
      } else if (!fetch_cv_.WaitUntil(&l, deadline_.when())) {
        return DeadlineExceededError(
            fmt::format("recovery of step {}: waiting for piece {} ran past the deadline", step,
                        plan_.pieces[piece].key));
      }
    }
    return fetch_error_;
  }

  const topo::Plan& plan_;
  const std::vector<RankJob*>& todo_;
  const std::vector<Unit>& units_;
  const std::map<uint32_t, size_t>& read_by_;  // read by the workers, never written
  ByteReader& reader_;
  const Deadline deadline_;
  const ExecuteOptions& options_;
  std::map<std::tuple<bool, int, int>, codec::ErasureCode> codes_;
  std::map<DecoderKey, codec::Decoder> decoders_;  // immutable once Run starts
  std::vector<Worker> workers_;                    // workers_[i]: used by worker i only

  Mutex fetch_mu_;
  CondVar fetch_cv_;
  std::map<uint32_t, size_t> pending_ GUARDED_BY(fetch_mu_);  // piece -> read units not yet done
  Status fetch_error_ GUARDED_BY(fetch_mu_);                  // first failed read
};

Transfers::Transfers(const topo::Plan& plan, const std::vector<RankJob*>& todo,
                     const TransferPlan& units, ByteReader& reader, Deadline deadline,
                     const ExecuteOptions& options)
    : impl_(std::make_unique<Impl>(plan, todo, units, reader, deadline, options)) {}
Transfers::~Transfers() = default;
Status Transfers::MakeDecoders() { return impl_->MakeDecoders(); }
Status Transfers::Run() { return impl_->Run(); }
TransferTotals Transfers::Totals() const { return impl_->Totals(); }

Status CopySharedPieces(const std::vector<RankJob*>& todo, const std::vector<LocalCopy>& copies,
                        int threads) {
  return ParallelFor(copies.size(), threads, [&](size_t i, int) -> Status {
    const LocalCopy& c = copies[i];
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
  });
}

}  // namespace memento::recover::internal
