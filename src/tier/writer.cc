#include "tier/writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread_cpu.h"
#include "tier/safetensors.h"

namespace memento::tier {

RateLimiter::RateLimiter(uint64_t bytes_per_sec, uint64_t burst_bytes)
    : rate_(bytes_per_sec),
      burst_(static_cast<double>(burst_bytes)),
      tokens_(static_cast<double>(burst_bytes)),
      last_(Now()) {}

void RateLimiter::SetRate(uint64_t bytes_per_sec) {
  MutexLock l(&mu_);
  rate_ = bytes_per_sec;
}

void RateLimiter::Acquire(uint64_t bytes) {
  // Token bucket: tokens accrue at rate_ up to burst_; a request larger than
  // the burst drives the bucket negative and the caller sleeps off the debt.
  double wait_s = 0;
  {
    MutexLock l(&mu_);
    if (rate_ == 0) return;
    TimePoint now = Now();
    tokens_ = std::min(burst_, tokens_ + SecondsBetween(last_, now) * static_cast<double>(rate_));
    last_ = now;
    tokens_ -= static_cast<double>(bytes);
    if (tokens_ < 0) wait_s = -tokens_ / static_cast<double>(rate_);
  }
  if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
}

namespace {

// Streams bytes into a file through a ring of aligned staging chunks: the
// caller copies into one chunk while an I/O thread writes the previous ones,
// so the copy and checksum overlap the device write.
//
// Thread model: Append/Finish from one caller thread; one internal I/O thread.
class StagedWriter {
 public:
  StagedWriter(WritableFile* file, const WriteOptions& options)
      : file_(file),
        chunk_bytes_(AlignUp(options.chunk_bytes, kDirectIoAlignment)),
        limiter_(options.limiter),
        cancel_(options.cancel) {
    int n = std::max(2, options.num_chunks);
    for (int i = 0; i < n; ++i) {
      buffers_.emplace_back(chunk_bytes_);
      free_.push_back(i);
    }
    io_thread_ = std::thread([this] {
      NameThisThread("durable-io");
      IoLoop();
    });
  }

  ~StagedWriter() {
    {
      MutexLock l(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    io_thread_.join();
  }

  // Adds `len` bytes to the stream; updates `checksum` over them if given.
  // Where the stream position, `src` and the length allow direct I/O, the
  // bytes are written straight from `src` (no copy); `src` must then stay
  // valid until Finish() returns.
  Status Append(const void* src, size_t len, StreamingChecksum* checksum) {
    const auto* p = static_cast<const uint8_t*>(src);
    while (len > 0) {
      const uint64_t pos = offset_ + fill_;
      if (file_->direct() && pos % kDirectIoAlignment == 0 &&
          reinterpret_cast<uintptr_t>(p) % kDirectIoAlignment == 0 && len >= kDirectIoAlignment) {
        MEMENTO_RETURN_IF_ERROR(CheckError());
        if (cur_ >= 0 && fill_ > 0) Submit(fill_);
        if (cur_ >= 0) ReleaseCurrent();
        size_t n = std::min<size_t>(AlignDown(len, kDirectIoAlignment), chunk_bytes_);
        SubmitExternal(p, n);  // the device reads while we checksum the same bytes
        if (checksum) checksum->Update(p, n);
        p += n;
        len -= n;
        continue;
      }
      if (cur_ < 0) {
        MEMENTO_RETURN_IF_ERROR(TakeFreeBuffer());
      }
      size_t n = std::min(len, chunk_bytes_ - fill_);
      uint8_t* dst = buffers_[cur_].data() + fill_;
      std::memcpy(dst, p, n);
      if (checksum) checksum->Update(dst, n);
      fill_ += n;
      p += n;
      len -= n;
      if (fill_ == chunk_bytes_) Submit(fill_);
    }
    return Status::Ok();
  }

  // Writes the tail and waits for every chunk; returns the stream length.
  Result<uint64_t> Finish() {
    uint64_t total = offset_ + fill_;
    if (cur_ >= 0 && fill_ > 0) {
      size_t len = fill_;
      if (file_->direct()) {
        len = AlignUp(fill_, kDirectIoAlignment);
        std::memset(buffers_[cur_].data() + fill_, 0, len - fill_);
      }
      Submit(len);
    }
    {
      MutexLock l(&mu_);
      while (inflight_ > 0 || !queue_.empty()) cv_.Wait(&l);
      if (!error_.ok()) return error_;
    }
    if (file_->direct() && total % kDirectIoAlignment != 0) {
      MEMENTO_RETURN_IF_ERROR(file_->Truncate(total));
    }
    return total;
  }

 private:
  struct Job {
    int buffer;  // staging buffer, or -1 for an external one
    const uint8_t* external;
    uint64_t offset;
    size_t len;
  };

  Status CheckError() {
    MutexLock l(&mu_);
    if (cancel_ && cancel_->load()) return AbortedError("durable write cancelled");
    return error_;
  }

  // Returns the empty current buffer to the free list.
  void ReleaseCurrent() {
    MutexLock l(&mu_);
    free_.push_back(cur_);
    cur_ = -1;
    fill_ = 0;
  }

  void SubmitExternal(const uint8_t* p, size_t len) {
    MutexLock l(&mu_);
    queue_.push_back(Job{-1, p, offset_, len});
    offset_ += len;
    cv_.SignalAll();
  }

  Status TakeFreeBuffer() {
    MutexLock l(&mu_);
    while (free_.empty() && error_.ok()) cv_.Wait(&l);
    if (!error_.ok()) return error_;
    if (cancel_ && cancel_->load()) return AbortedError("durable write cancelled");
    cur_ = free_.front();
    free_.pop_front();
    fill_ = 0;
    return Status::Ok();
  }

  void Submit(size_t len) {
    MutexLock l(&mu_);
    queue_.push_back(Job{cur_, nullptr, offset_, len});
    offset_ += fill_;
    cur_ = -1;
    fill_ = 0;
    cv_.SignalAll();
  }

  // Keeps up to file_->queue_depth() writes in flight (io_uring; 1 for
  // pwrite, where SubmitWrite writes synchronously). A job's buffer goes back
  // to the free list when its write is reaped.
  void IoLoop() {
    const size_t depth = static_cast<size_t>(std::max(1, file_->queue_depth()));
    std::map<uint64_t, Job> submitted;  // tag -> job; I/O thread only
    uint64_t next_tag = 0;
    MutexLock l(&mu_);
    while (true) {
      while (queue_.empty() && submitted.empty() && !stop_) cv_.Wait(&l);
      if (queue_.empty() && submitted.empty() && stop_) return;
      while (!queue_.empty() && submitted.size() < depth) {
        Job job = queue_.front();
        queue_.pop_front();
        ++inflight_;
        Status s;
        if (error_.ok()) {
          l.native().unlock();
          if (limiter_) limiter_->Acquire(job.len);
          s = file_->SubmitWrite(job.offset,
                                 job.buffer >= 0 ? buffers_[job.buffer].data() : job.external,
                                 job.len, next_tag);
          l.native().lock();
          if (s.ok()) {
            submitted.emplace(next_tag++, job);
            continue;
          }
        }
        // Not written (an earlier error) or refused at submission.
        if (!s.ok() && error_.ok()) error_ = s;
        --inflight_;
        if (job.buffer >= 0) free_.push_back(job.buffer);
        cv_.SignalAll();
      }
      if (submitted.empty()) continue;
      l.native().unlock();
      WriteCompletion c = file_->ReapWrite();
      l.native().lock();
      auto it = submitted.find(c.tag);
      MEMENTO_CHECK(it != submitted.end());
      const Job job = it->second;
      submitted.erase(it);
      if (!c.status.ok() && error_.ok()) error_ = c.status;
      --inflight_;
      if (job.buffer >= 0) free_.push_back(job.buffer);
      cv_.SignalAll();
    }
  }

  WritableFile* file_;
  const size_t chunk_bytes_;
  RateLimiter* limiter_;
  const std::atomic<bool>* cancel_;
  std::vector<AlignedBuffer> buffers_;
  // Caller-thread state.
  int cur_ = -1;
  size_t fill_ = 0;
  uint64_t offset_ = 0;

  Mutex mu_;
  CondVar cv_;
  std::deque<int> free_ GUARDED_BY(mu_);
  std::deque<Job> queue_ GUARDED_BY(mu_);
  int inflight_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);
  std::thread io_thread_;
};

struct PlannedPiece {
  const ViewEntry* entry;
  SafetensorsEntry st;
  PieceRecord record;
};

}  // namespace

Result<WriteStats> WriteNodePart(Env* env, const std::string& root, const VersionView& view,
                                 const WriteOptions& options) {
  Stopwatch watch;
  if (view.node < 0 || view.node >= view.num_nodes) {
    return InvalidArgumentError(fmt::format("node {} is outside 0..{} (num_nodes={})", view.node,
                                            view.num_nodes - 1, view.num_nodes));
  }
  const std::string vdir = root + "/" + VersionDirName(view.step);
  if (env->FileExists(vdir + "/" + kCommitFileName)) {
    return AlreadyExistsError(
        fmt::format("version {} is already committed in {}", view.step, root));
  }

  // Plan: where each entry goes in the file and in its logical tensor.
  VersionIndex manifest;
  manifest.job = view.job;
  manifest.step = view.step;
  manifest.num_nodes = view.num_nodes;
  manifest.topology_json = view.topology_json;
  manifest.created_unix_ns = WallNanos();
  const std::string data_file = NodeDataFileName(view.node);
  std::vector<PlannedPiece> plan;
  std::set<std::string> keys;
  uint64_t data_off = 0;
  nlohmann::json pieces_meta = nlohmann::json::array();
  bool has_tp = false;
  for (const ViewEntry& e : view.entries) {
    const TensorMeta& m = e.meta;
    if (e.length == 0) continue;
    const uint64_t es = DTypeSize(m.dtype);
    const uint64_t nbytes = m.nbytes();
    if (e.offset + e.length > nbytes || e.data == nullptr) {
      return InvalidArgumentError(fmt::format(
          "entry of tensor '{}': bytes [{}, {}) outside its {} bytes ({} {}) or no data", m.name,
          e.offset, e.offset + e.length, nbytes, DTypeName(m.dtype), ShapeToString(m.shape)));
    }
    const bool global = m.state_class == StateClass::kDpSharded && m.global_numel > 0;
    const bool tp = e.tp.split();
    if (tp) {
      if (global) {
        return InvalidArgumentError(
            fmt::format("tensor '{}': a TP slice cannot also be a ZeRO shard (global_numel {})",
                        m.name, m.global_numel));
      }
      MEMENTO_RETURN_IF_ERROR(CheckTpSlice(e.tp, m.shape, m.name));
      has_tp = true;
    }
    TensorRecord t;
    t.name = m.name;
    t.dtype = m.dtype;
    t.state_class = m.state_class;
    t.global = global;
    t.split_dim = tp ? e.tp.dim : -1;
    t.ranks = e.ranks;
    std::sort(t.ranks.begin(), t.ranks.end());
    t.shape = global ? std::vector<int64_t>{m.global_numel} : tp ? e.tp.global_shape : m.shape;
    t.nbytes = global ? static_cast<uint64_t>(m.global_numel) * es : nbytes;
    if (tp) {
      t.nbytes = es;
      for (int64_t d : e.tp.global_shape) t.nbytes *= static_cast<uint64_t>(d);
    }
    const uint64_t base = global ? static_cast<uint64_t>(m.shard_offset) * es : 0;
    if (global && (m.shard_offset < 0 || base + nbytes > t.nbytes)) {
      return InvalidArgumentError(fmt::format(
          "tensor '{}': shard at element {} of {} elements does not fit global_numel {}", m.name,
          m.shard_offset, m.numel(), m.global_numel));
    }
    PlannedPiece pp;
    pp.entry = &e;
    PieceRecord& r = pp.record;
    r.node = view.node;
    r.file = data_file;
    r.tensor_offset = base + e.offset;
    r.length = e.length;
    // A TP piece's offsets are relative to its slice (the rank's tensor).
    const bool whole = r.tensor_offset == 0 && r.length == (tp ? nbytes : t.nbytes);
    std::string stem = m.name;
    if (tp) {
      r.slice_begin = e.tp.begin;
      r.slice_end = e.tp.end;
      stem = fmt::format("{}@{}:{}-{}", m.name, e.tp.dim, e.tp.begin, e.tp.end);
    }
    r.key = whole ? stem : fmt::format("{}#{}", stem, r.tensor_offset);
    if (!keys.insert(r.key).second) {
      return InvalidArgumentError(fmt::format("tensor '{}': two entries for bytes starting at {}",
                                              m.name, r.tensor_offset));
    }
    pp.st.key = r.key;
    if (whole) {
      pp.st.dtype = std::string(DTypeName(m.dtype));
      pp.st.shape = tp ? m.shape : t.shape;
    } else if (r.tensor_offset % es == 0 && r.length % es == 0) {
      pp.st.dtype = std::string(DTypeName(m.dtype));
      pp.st.shape = {static_cast<int64_t>(r.length / es)};
    } else {
      pp.st.dtype = "U8";
      pp.st.shape = {static_cast<int64_t>(r.length)};
    }
    pp.st.begin = data_off;
    pp.st.end = data_off + r.length;
    data_off += r.length;
    pieces_meta.push_back({{"key", r.key},
                           {"name", m.name},
                           {"tensor_offset", r.tensor_offset},
                           {"length", r.length},
                           {"tensor_dtype", std::string(DTypeName(m.dtype))},
                           {"tensor_shape", t.shape},
                           {"state_class", std::string(StateClassName(m.state_class))}});
    if (tp) {
      pieces_meta.back()["split_dim"] = e.tp.dim;
      pieces_meta.back()["slice"] = {e.tp.begin, e.tp.end};
    }
    auto it = manifest.tensors.find(m.name);
    if (it == manifest.tensors.end()) {
      manifest.tensors.emplace(m.name, std::move(t));
    } else if (it->second.dtype != t.dtype || it->second.shape != t.shape ||
               it->second.state_class != t.state_class || it->second.split_dim != t.split_dim ||
               it->second.ranks != t.ranks) {
      return InvalidArgumentError(fmt::format(
          "tensor '{}' appears twice with different dtype/shape/state class/ranks", m.name));
    }
    plan.push_back(std::move(pp));
  }
  if (has_tp) manifest.format_version = kFormatVersionTpSlices;
  std::vector<SafetensorsEntry> st_entries;
  for (const auto& pp : plan) st_entries.push_back(pp.st);
  std::map<std::string, std::string> metadata{
      {"format", "memento"},
      {"memento_format_version", std::to_string(kFormatVersion)},
      {"job", view.job},
      {"step", std::to_string(view.step)},
      {"node", std::to_string(view.node)},
      {"pieces", pieces_meta.dump()}};
  const std::string header = EncodeSafetensorsHeader(st_entries, metadata, kDirectIoAlignment);

  // Forget any earlier attempt of this node first, durably, so that a stale
  // marker can never vouch for a half-rewritten file.
  MEMENTO_RETURN_IF_ERROR(env->CreateDir(root));
  MEMENTO_RETURN_IF_ERROR(env->CreateDir(vdir));
  MEMENTO_RETURN_IF_ERROR(env->SyncDir(root));
  const std::string marker_path = vdir + "/" + NodeMarkerName(view.node);
  if (env->FileExists(marker_path)) {
    MEMENTO_RETURN_IF_ERROR(env->RemoveFile(marker_path));
    MEMENTO_RETURN_IF_ERROR(env->SyncDir(vdir));
  }

  // Data file.
  const std::string data_path = vdir + "/" + data_file;
  MEMENTO_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(data_path, options.direct_io));
  uint64_t file_size = 0;
  {
    StagedWriter w(file.get(), options);
    MEMENTO_RETURN_IF_ERROR(w.Append(header.data(), header.size(), nullptr));
    for (auto& pp : plan) {
      StreamingChecksum cs;
      MEMENTO_RETURN_IF_ERROR(w.Append(pp.entry->data, pp.entry->length, &cs));
      pp.record.xxh3 = cs.Digest();
      pp.record.file_offset = header.size() + pp.st.begin;
    }
    MEMENTO_ASSIGN_OR_RETURN(file_size, w.Finish());
  }
  const bool direct = file->direct();
  const std::string engine = file->engine();
  MEMENTO_RETURN_IF_ERROR(file->Sync());
  MEMENTO_RETURN_IF_ERROR(file->Close());
  const double data_seconds = watch.Seconds();

  // Manifest, then the node's marker.
  for (auto& pp : plan) {
    manifest.tensors[pp.entry->meta.name].pieces.push_back(pp.record);
  }
  manifest.nodes.push_back(
      NodeRecord{view.node, data_file, file_size, NodeManifestName(view.node)});
  const std::string manifest_text = SerializeIndex(manifest);
  MEMENTO_RETURN_IF_ERROR(
      env->WriteStringToFileSync(vdir + "/" + NodeManifestName(view.node), manifest_text));
  NodeMarker marker{view.node,
                    view.step,
                    view.epoch,
                    data_file,
                    file_size,
                    NodeManifestName(view.node),
                    manifest_text.size(),
                    Checksum(manifest_text.data(), manifest_text.size())};
  MEMENTO_RETURN_IF_ERROR(
      WriteFileAtomic(env, vdir, NodeMarkerName(view.node), SerializeNodeMarker(marker)));

  WriteStats stats;
  stats.data_bytes = data_off;
  stats.file_bytes = file_size;
  stats.seconds = watch.Seconds();
  stats.data_seconds = data_seconds;
  stats.direct = direct;
  stats.engine = engine;
  return stats;
}

Status CommitVersion(Env* env, const std::string& root, int64_t step, int num_nodes,
                     uint64_t epoch) {
  const std::string vdir = root + "/" + VersionDirName(step);
  const std::string commit_path = vdir + "/" + kCommitFileName;
  if (env->FileExists(commit_path)) return Status::Ok();
  std::vector<int> missing;
  for (int i = 0; i < num_nodes; ++i) {
    if (!env->FileExists(vdir + "/" + NodeMarkerName(i))) missing.push_back(i);
  }
  if (!missing.empty()) {
    return UnavailableError(fmt::format("version {}: waiting for node(s) {} to finish their part",
                                        step, fmt::join(missing, ",")));
  }
  VersionIndex index;
  CommitRecord commit;
  commit.step = step;
  for (int i = 0; i < num_nodes; ++i) {
    const std::string marker_path = vdir + "/" + NodeMarkerName(i);
    MEMENTO_ASSIGN_OR_RETURN(std::string marker_text, env->ReadFileToString(marker_path));
    MEMENTO_ASSIGN_OR_RETURN(NodeMarker marker, ParseNodeMarker(marker_text, marker_path));
    if (marker.step != step || marker.node != i) {
      return DataLossError(fmt::format("{}: says node {} step {}, expected node {} step {}",
                                       marker_path, marker.node, marker.step, i, step));
    }
    if (marker.epoch != epoch) {
      // A part left by an earlier history of the job (it trained this step
      // before restarting from an older checkpoint): never mix it in; wait
      // for the node to write this epoch's part.
      return UnavailableError(
          fmt::format("version {}: node {}'s part is from epoch {}, waiting for epoch {}", step, i,
                      marker.epoch, epoch));
    }
    const std::string manifest_path = vdir + "/" + marker.manifest;
    MEMENTO_ASSIGN_OR_RETURN(std::string manifest_text, env->ReadFileToString(manifest_path));
    uint64_t sum = Checksum(manifest_text.data(), manifest_text.size());
    if (manifest_text.size() != marker.manifest_size || sum != marker.manifest_xxh3) {
      return DataLossError(fmt::format("{}: {} bytes xxh3 {} but the marker says {} bytes xxh3 {}",
                                       manifest_path, manifest_text.size(), HexU64(sum),
                                       marker.manifest_size, HexU64(marker.manifest_xxh3)));
    }
    MEMENTO_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(vdir + "/" + marker.file));
    if (size != marker.file_size) {
      return DataLossError(fmt::format("{}/{}: {} bytes but node {} wrote {}", vdir, marker.file,
                                       size, i, marker.file_size));
    }
    MEMENTO_ASSIGN_OR_RETURN(VersionIndex part, ParseIndex(manifest_text, manifest_path));
    if (i == 0) {
      index.job = part.job;
      index.topology_json = part.topology_json;
    }
    MEMENTO_RETURN_IF_ERROR(MergeIndex(part, &index));
    commit.files.push_back(marker.file);
  }
  index.step = step;
  index.num_nodes = num_nodes;
  index.created_unix_ns = WallNanos();
  for (auto& [name, t] : index.tensors) {
    std::sort(t.pieces.begin(), t.pieces.end(), [](const PieceRecord& a, const PieceRecord& b) {
      return a.tensor_offset < b.tensor_offset;
    });
  }
  const std::string index_text = SerializeIndex(index);
  MEMENTO_RETURN_IF_ERROR(env->WriteStringToFileSync(vdir + "/" + kIndexFileName, index_text));
  commit.index_size = index_text.size();
  commit.index_xxh3 = Checksum(index_text.data(), index_text.size());
  return WriteFileAtomic(env, vdir, kCommitFileName, SerializeCommit(commit));
}

Result<WriteStats> WriteVersion(Env* env, const std::string& root, const VersionView& view,
                                const WriteOptions& options, Deadline commit_deadline) {
  MEMENTO_ASSIGN_OR_RETURN(WriteStats stats, WriteNodePart(env, root, view, options));
  if (view.node != 0) return stats;
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    Status s = CommitVersion(env, root, view.step, view.num_nodes, view.epoch);
    if (s.ok()) break;
    if (s.code() != StatusCode::kUnavailable || commit_deadline.expired()) return s;
    std::this_thread::sleep_for(std::min<Duration>(backoff, commit_deadline.remaining()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  return stats;
}

}  // namespace memento::tier
