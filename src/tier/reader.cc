#include "tier/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "common/checksum.h"
#include "common/clock.h"

namespace memento::tier {

Result<std::vector<VersionSummary>> ListVersions(Env* env, const std::string& root) {
  std::vector<VersionSummary> out;
  if (!env->IsDirectory(root)) return out;
  MEMENTO_ASSIGN_OR_RETURN(auto names, env->ListDir(root));
  for (const auto& name : names) {
    auto step = ParseVersionDirName(name);
    if (!step) continue;
    VersionSummary v;
    v.step = *step;
    v.dir = root + "/" + name;
    if (!env->IsDirectory(v.dir)) continue;
    auto files = env->ListDir(v.dir);
    if (files.ok()) {
      for (const auto& f : *files) {
        int node = 0;
        if (std::sscanf(f.c_str(), "node-%d.done", &node) == 1 && f == NodeMarkerName(node)) {
          v.nodes_done.push_back(node);
        }
      }
    }
    const std::string commit_path = v.dir + "/" + kCommitFileName;
    if (!env->FileExists(commit_path)) {
      v.state = "no COMMIT marker (incomplete write)";
    } else {
      auto text = env->ReadFileToString(commit_path);
      if (!text.ok()) {
        v.state = "unreadable COMMIT: " + text.status().ToString();
      } else {
        auto commit = ParseCommit(*text, commit_path);
        if (!commit.ok()) {
          v.state = commit.status().ToString();
        } else if (commit->step != v.step) {
          v.state = fmt::format("COMMIT names step {}, not {}", commit->step, v.step);
        } else {
          v.complete = true;
          v.state = "complete";
        }
      }
    }
    out.push_back(std::move(v));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

Result<int64_t> LatestCompleteVersion(Env* env, const std::string& root) {
  MEMENTO_ASSIGN_OR_RETURN(auto versions, ListVersions(env, root));
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (it->complete) return it->step;
  }
  return NotFoundError("no complete version in durable tier " + root);
}

Result<VersionIndex> LoadIndex(Env* env, const std::string& root, int64_t step) {
  const std::string vdir = root + "/" + VersionDirName(step);
  const std::string commit_path = vdir + "/" + kCommitFileName;
  if (!env->FileExists(commit_path)) {
    return NotFoundError(fmt::format(
        "version {} does not exist in {} (no COMMIT marker: never written or incomplete)", step,
        root));
  }
  MEMENTO_ASSIGN_OR_RETURN(std::string commit_text, env->ReadFileToString(commit_path));
  MEMENTO_ASSIGN_OR_RETURN(CommitRecord commit, ParseCommit(commit_text, commit_path));
  if (commit.step != step) {
    return DataLossError(
        fmt::format("{}: names step {}, expected {}", commit_path, commit.step, step));
  }
  const std::string index_path = vdir + "/" + commit.index;
  MEMENTO_ASSIGN_OR_RETURN(std::string index_text, env->ReadFileToString(index_path));
  uint64_t sum = Checksum(index_text.data(), index_text.size());
  if (index_text.size() != commit.index_size || sum != commit.index_xxh3) {
    return DataLossError(fmt::format("{}: {} bytes xxh3 {}, COMMIT says {} bytes xxh3 {}",
                                     index_path, index_text.size(), HexU64(sum), commit.index_size,
                                     HexU64(commit.index_xxh3)));
  }
  MEMENTO_ASSIGN_OR_RETURN(VersionIndex index, ParseIndex(index_text, index_path));
  if (index.step != step) {
    return DataLossError(
        fmt::format("{}: names step {}, expected {}", index_path, index.step, step));
  }
  return index;
}

namespace {

struct Slice {  // one target's share of one piece
  size_t target;
  uint64_t lo;  // logical tensor range the target wants
  uint64_t hi;
};

// A TP re-cut: rows [lo, hi) along the split dimension go from one stored
// slice [src_begin, src_end) to a target slice [dst_begin, dst_end). Both
// are laid out as their own local tensors: `outer` runs (the product of the
// dimensions before the split one), each (end - begin) * `inner` bytes.
struct Cut {
  size_t target;
  int64_t src_begin, src_end;
  int64_t dst_begin, dst_end;
  int64_t lo, hi;
  uint64_t outer;
  uint64_t inner;  // bytes of one row of the split dimension
};

struct PieceWork {
  const PieceRecord* piece;
  std::vector<Slice> slices;
  std::vector<Cut> cuts;
};

// Copies the part of cut `c` that lies in the stored slice's bytes
// [off, off + len) (`bytes`) into `dst` (the target's local tensor).
// Returns the bytes copied.
uint64_t ScatterCut(const Cut& c, uint64_t off, const uint8_t* bytes, size_t len, uint8_t* dst) {
  const uint64_t src_row = static_cast<uint64_t>(c.src_end - c.src_begin) * c.inner;
  const uint64_t dst_row = static_cast<uint64_t>(c.dst_end - c.dst_begin) * c.inner;
  if (src_row == 0 || len == 0) return 0;
  // Within each outer run of the source, the cut takes bytes [wa, wb).
  const uint64_t wa = static_cast<uint64_t>(c.lo - c.src_begin) * c.inner;
  const uint64_t wb = static_cast<uint64_t>(c.hi - c.src_begin) * c.inner;
  const uint64_t dst_shift = static_cast<uint64_t>(c.lo - c.dst_begin) * c.inner;
  uint64_t copied = 0;
  const uint64_t end = off + len;
  for (uint64_t o = off / src_row; o < c.outer && o * src_row < end; ++o) {
    const uint64_t a = std::max(off, o * src_row + wa);
    const uint64_t b = std::min(end, o * src_row + wb);
    if (a >= b) continue;
    std::memcpy(dst + o * dst_row + dst_shift + (a - o * src_row - wa), bytes + (a - off), b - a);
    copied += b - a;
  }
  return copied;
}

// Plans the TP re-cut of target `i` (its rows [tb, te) of dimension `dim`)
// from the stored slices of `rec`. Appends problems; adds work.
void PlanCut(size_t i, const RestoreTarget& t, const TensorRecord& rec, int dim, int64_t tb,
             int64_t te, std::vector<std::string>* problems,
             std::map<std::pair<std::string, uint64_t>, PieceWork>* work) {
  const TensorMeta& m = t.meta;
  const uint64_t es = DTypeSize(m.dtype);
  uint64_t outer = 1, inner = es;
  for (int d = 0; d < static_cast<int>(rec.shape.size()); ++d) {
    if (d < dim) outer *= static_cast<uint64_t>(rec.shape[d]);
    if (d > dim) inner *= static_cast<uint64_t>(rec.shape[d]);
  }
  // The stored slices, each with the pieces that cover it whole.
  struct Stored {
    int64_t begin, end;
    std::vector<const PieceRecord*> pieces;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<const PieceRecord*>> by_slice;
  for (const auto& p : rec.pieces) {
    if (rec.split_dim >= 0) {
      by_slice[{p.slice_begin, p.slice_end}].push_back(&p);
    } else {
      by_slice[{0, rec.shape[dim]}].push_back(&p);
    }
  }
  std::vector<Stored> complete;
  for (auto& [range, pieces] : by_slice) {
    const uint64_t bytes = outer * static_cast<uint64_t>(range.second - range.first) * inner;
    std::sort(pieces.begin(), pieces.end(), [](const PieceRecord* a, const PieceRecord* b) {
      return a->tensor_offset < b->tensor_offset;
    });
    Stored s{range.first, range.second, {}};
    uint64_t cur = 0;
    while (cur < bytes) {
      const PieceRecord* best = nullptr;
      for (const PieceRecord* p : pieces) {
        if (p->tensor_offset <= cur && p->tensor_offset + p->length > cur &&
            (!best || p->tensor_offset + p->length > best->tensor_offset + best->length)) {
          best = p;
        }
      }
      if (!best) break;
      s.pieces.push_back(best);
      cur = best->tensor_offset + best->length;
    }
    if (cur >= bytes) complete.push_back(std::move(s));
  }
  // Cover [tb, te) with complete slices, greedily.
  int64_t cur = tb;
  while (cur < te) {
    const Stored* best = nullptr;
    for (const Stored& s : complete) {
      if (s.begin <= cur && s.end > cur && (!best || s.end > best->end)) best = &s;
    }
    if (!best) {
      problems->push_back(fmt::format(
          "tensor '{}': rows [{}, {}) of dimension {} are in no completely stored slice", m.name,
          cur, te, dim));
      return;
    }
    const int64_t hi = std::min(te, best->end);
    for (const PieceRecord* p : best->pieces) {
      auto& w = (*work)[{p->file, p->file_offset}];
      w.piece = p;
      w.cuts.push_back(Cut{i, best->begin, best->end, tb, te, cur, hi, outer, inner});
    }
    cur = hi;
  }
}

}  // namespace

Result<RestoreReport> Restore(Env* env, const std::string& root, std::optional<int64_t> step,
                              const std::vector<RestoreTarget>& targets,
                              const RestoreOptions& options) {
  Stopwatch watch;
  RestoreReport report;
  if (!step) {
    MEMENTO_ASSIGN_OR_RETURN(report.step, LatestCompleteVersion(env, root));
  } else {
    report.step = *step;
  }
  MEMENTO_ASSIGN_OR_RETURN(VersionIndex index, LoadIndex(env, root, report.step));

  // 1. Check every target against the index; collect every problem.
  std::vector<std::string> problems;
  bool only_missing = true;
  bool untrusted = false;  // RankTensorName: a legacy node-local copy
  std::map<std::pair<std::string, uint64_t>, PieceWork> work;  // (file, file_offset)
  for (size_t i = 0; i < targets.size(); ++i) {
    const RestoreTarget& t = targets[i];
    const TensorMeta& m = t.meta;
    std::string stored = m.name;
    if (t.rank >= 0) {
      Result<std::string> name = RankTensorName(index, t.rank, m.name);
      if (!name.ok()) {
        if (name.status().code() != StatusCode::kNotFound) only_missing = false;
        if (name.status().code() == StatusCode::kFailedPrecondition) untrusted = true;
        problems.push_back(name.status().message());
        continue;
      }
      stored = *name;
    }
    auto it = index.tensors.find(stored);
    if (it == index.tensors.end()) {
      problems.push_back(fmt::format("tensor '{}' is not in version {}", m.name, report.step));
      continue;
    }
    only_missing = false;
    const TensorRecord& rec = it->second;
    const uint64_t es = DTypeSize(m.dtype);
    const uint64_t nbytes = m.nbytes();
    if (rec.dtype != m.dtype) {
      problems.push_back(fmt::format("tensor '{}': dtype {} requested, version {} has {}", m.name,
                                     DTypeName(m.dtype), report.step, DTypeName(rec.dtype)));
      continue;
    }
    uint64_t base = 0;
    const bool global = m.state_class == StateClass::kDpSharded && m.global_numel > 0;
    if (rec.split_dim >= 0 || t.tp.split()) {
      // TP re-cut (or a TP slice restored as saved).
      const int dim = rec.split_dim >= 0 ? rec.split_dim : t.tp.dim;
      const std::vector<int64_t>& local = m.shape;
      if (global || rec.global) {
        problems.push_back(fmt::format(
            "tensor '{}': a TP slice cannot be restored into a ZeRO shard or from one", m.name));
        continue;
      }
      if (t.tp.split() && (t.tp.dim != dim || t.tp.global_shape != rec.shape)) {
        problems.push_back(fmt::format(
            "tensor '{}': TP slice of dimension {} of {} requested, version {} has {} split on "
            "dimension {}",
            m.name, t.tp.dim, ShapeToString(t.tp.global_shape), report.step,
            ShapeToString(rec.shape), rec.split_dim));
        continue;
      }
      if (t.tp.split()) {
        Status st = CheckTpSlice(t.tp, local, m.name);
        if (!st.ok()) {
          problems.push_back(st.message());
          continue;
        }
      } else if (local != rec.shape) {
        problems.push_back(
            fmt::format("tensor '{}': shape {} requested, version {} has TP-split global shape {}",
                        m.name, ShapeToString(local), report.step, ShapeToString(rec.shape)));
        continue;
      }
      if (t.offset != 0 || (t.length != UINT64_MAX && t.length != nbytes) ||
          (nbytes > 0 && t.data == nullptr)) {
        problems.push_back(fmt::format(
            "tensor '{}': a TP re-cut restores whole tensors only (offset {}, length {})", m.name,
            t.offset, t.length));
        continue;
      }
      const int64_t tb = t.tp.split() ? t.tp.begin : 0;
      const int64_t te = t.tp.split() ? t.tp.end : rec.shape[dim];
      PlanCut(i, t, rec, dim, tb, te, &problems, &work);
      continue;
    }
    if (global) {
      if (static_cast<uint64_t>(m.global_numel) * es != rec.nbytes) {
        problems.push_back(
            fmt::format("tensor '{}': global_numel {} requested, version {} holds {} elements",
                        m.name, m.global_numel, report.step, rec.nbytes / es));
        continue;
      }
      base = static_cast<uint64_t>(m.shard_offset) * es;
      if (m.shard_offset < 0 || base + nbytes > rec.nbytes) {
        problems.push_back(fmt::format("tensor '{}': shard [{}, {}) lies outside its {} elements",
                                       m.name, m.shard_offset, m.shard_offset + m.numel(),
                                       rec.nbytes / es));
        continue;
      }
    } else if (nbytes != rec.nbytes || (!rec.global && m.shape != rec.shape)) {
      problems.push_back(fmt::format("tensor '{}': shape {} requested, version {} has {}", m.name,
                                     ShapeToString(m.shape), report.step,
                                     ShapeToString(rec.shape)));
      continue;
    }
    const uint64_t len = t.length == UINT64_MAX ? nbytes - std::min(nbytes, t.offset) : t.length;
    if (t.offset + len > nbytes || (len > 0 && t.data == nullptr)) {
      problems.push_back(fmt::format("tensor '{}': range [{}, {}) outside its {} bytes", m.name,
                                     t.offset, t.offset + len, nbytes));
      continue;
    }
    const uint64_t lo = base + t.offset;
    const uint64_t hi = lo + len;
    // Cover [lo, hi) greedily with the stored pieces (sorted by tensor_offset);
    // pieces stored twice (replicated state written by two nodes) are read once.
    uint64_t cur = lo;
    while (cur < hi) {
      const PieceRecord* best = nullptr;
      for (const auto& p : rec.pieces) {
        if (p.tensor_offset <= cur && p.tensor_offset + p.length > cur &&
            (!best || p.tensor_offset + p.length > best->tensor_offset + best->length)) {
          best = &p;
        }
      }
      if (!best) {
        uint64_t next = hi;
        for (const auto& p : rec.pieces) {
          if (p.tensor_offset > cur) next = std::min(next, p.tensor_offset);
        }
        problems.push_back(
            fmt::format("tensor '{}': bytes [{}, {}) are in no stored piece", m.name, cur, next));
        cur = next;
        continue;
      }
      uint64_t end = std::min(hi, best->tensor_offset + best->length);
      auto& w = work[{best->file, best->file_offset}];
      w.piece = best;
      w.slices.push_back(Slice{i, lo, hi});
      cur = end;
    }
  }
  if (!problems.empty()) {
    std::string msg = fmt::format(
        "version {} in {} cannot fill the {} target(s), nothing was "
        "written: {}",
        report.step, root, targets.size(), fmt::join(problems, "; "));
    if (untrusted) return FailedPreconditionError(msg);
    return only_missing ? NotFoundError(msg) : InvalidArgumentError(msg);
  }

  // 2. Read each needed piece once, in file order, and scatter it.
  AlignedBuffer buffer(options.chunk_bytes);
  std::map<std::string, std::unique_ptr<RandomAccessFile>> files;
  const std::string vdir = root + "/" + VersionDirName(report.step);
  auto open = [&](const std::string& name) -> Result<RandomAccessFile*> {
    auto& f = files[name];
    if (!f) {
      MEMENTO_ASSIGN_OR_RETURN(f, env->NewRandomAccessFile(vdir + "/" + name, options.direct_io));
    }
    return f.get();
  };
  if (options.verify_before_write) {
    for (auto& [key, w] : work) {
      MEMENTO_ASSIGN_OR_RETURN(RandomAccessFile * f, open(w.piece->file));
      MEMENTO_RETURN_IF_ERROR(internal::ReadPiece(
          f, *w.piece, &buffer, vdir + "/" + w.piece->file, [](uint64_t, const uint8_t*, size_t) {},
          &report.bytes_read));
    }
  }
  for (auto& entry : work) {
    PieceWork& w = entry.second;  // not a structured binding: the lambda captures it
    MEMENTO_ASSIGN_OR_RETURN(RandomAccessFile * f, open(w.piece->file));
    auto sink = [&](uint64_t off, const uint8_t* bytes, size_t len) {
      for (const Cut& c : w.cuts) {
        report.bytes_restored +=
            ScatterCut(c, off, bytes, len, static_cast<uint8_t*>(targets[c.target].data));
      }
      for (const Slice& s : w.slices) {
        uint64_t a = std::max(off, s.lo);
        uint64_t b = std::min(off + len, s.hi);
        if (a >= b) continue;
        auto* dst = static_cast<uint8_t*>(targets[s.target].data) + (a - s.lo);
        std::memcpy(dst, bytes + (a - off), b - a);
        report.bytes_restored += b - a;
      }
    };
    MEMENTO_RETURN_IF_ERROR(internal::ReadPiece(f, *w.piece, &buffer, vdir + "/" + w.piece->file,
                                                sink, &report.bytes_read));
  }
  report.seconds = watch.Seconds();
  return report;
}

}  // namespace memento::tier
