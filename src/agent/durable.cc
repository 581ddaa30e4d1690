#include "agent/durable.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "common/log.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tier/format.h"

namespace memento::agent {

Status MarkerGuardEnv::RenameFile(const std::string& from, const std::string& to) {
  // WriteFileAtomic publishes ROOT/version-<step>/node-<N>.done by renaming
  // node-<N>.done.tmp over it: the last step of a node's part.
  const size_t slash = to.rfind('/');
  const std::string name = slash == std::string::npos ? to : to.substr(slash + 1);
  if (name.rfind("node-", 0) == 0 && name.size() > 5 &&
      name.compare(name.size() - 5, 5, ".done") == 0 && slash != std::string::npos) {
    const std::string vdir = to.substr(0, slash);
    const size_t vslash = vdir.rfind('/');
    auto step =
        tier::ParseVersionDirName(vslash == std::string::npos ? vdir : vdir.substr(vslash + 1));
    if (step) {
      Status st = check_(*step, vdir);
      if (!st.ok()) {
        Status rm = base_->RemoveFile(from);  // the refused marker's temporary file
        (void)rm;
        return st;
      }
    }
  }
  return base_->RenameFile(from, to);
}

DurableStreamer::DurableStreamer(const DurableOptions& options, const std::string& job_id, int node,
                                 const std::string& slot_root, shm::NodeStore* store)
    : options_(options),
      job_id_(job_id),
      node_(node),
      slot_root_(slot_root),
      store_(store),
      env_(tier::Env::Default(), [this](int64_t step, const std::string& vdir) {
        return CheckBeforeMarker(step, vdir);
      }) {}

Result<std::unique_ptr<DurableStreamer>> DurableStreamer::Start(const DurableOptions& options,
                                                                const std::string& job_id, int node,
                                                                const std::string& slot_root,
                                                                shm::NodeStore* store) {
  if (options.dir.empty()) return InvalidArgumentError("durable: empty --durable-dir");
  std::unique_ptr<DurableStreamer> d(new DurableStreamer(options, job_id, node, slot_root, store));
  tier::PersisterOptions po;
  po.root = options.dir;
  po.env = &d->env_;
  po.every_k_steps = options.every_k_steps;
  po.every_seconds = options.every_seconds;
  po.bandwidth_bytes_per_sec = options.bandwidth_bytes_per_sec;
  po.write.direct_io = options.direct_io;
  po.retention.keep_last = options.keep_last;
  po.retention.keep_every = options.keep_every;
  // A refused marker (slot overwritten) is final for that version: the retry
  // finds the slot recycled and skips it, so keep the retry short.
  po.retry_initial_s = 0.05;
  // Cluster mode: node 0 waits this long for the other nodes' markers of a
  // version (a node may have abandoned it: its slot was overwritten).
  po.commit_timeout_s = options.commit_timeout_s;
  MEMENTO_ASSIGN_OR_RETURN(d->persister_, tier::Persister::Start(std::move(po)));
  MEMENTO_LOG_INFO(
      "durable: streaming every {} step(s){} to {} (bandwidth cap {} bytes/s, keep last {}, "
      "keep every {})",
      options.every_k_steps,
      options.every_seconds > 0 ? fmt::format(" or every {} s", options.every_seconds) : "",
      options.dir, options.bandwidth_bytes_per_sec, options.keep_last, options.keep_every);
  return d;
}

DurableStreamer::~DurableStreamer() {
  // A version that just committed may still be in its retention pass: give
  // it a moment so that the counters below include it.
  persister_->WaitIdle(Deadline::AfterSeconds(0.5));
  DurableStats s = stats();
  persister_.reset();  // cancels and joins the worker before anything it uses goes
  {
    MutexLock l(&mu_);  // the last write may have ended meanwhile
    s.gone = stats_.gone;
    s.abandoned_overwritten = stats_.abandoned_overwritten;
    s.abandoned_mismatch = stats_.abandoned_mismatch;
  }
  MEMENTO_LOG_INFO(
      "durable stats: committed={} offered={} persisted={} last_persisted={} gone={} "
      "abandoned_overwritten={} abandoned_mismatch={} dropped={} failures={}",
      s.committed, s.offered, s.persister.persisted, s.persister.last_persisted_step, s.gone,
      s.abandoned_overwritten, s.abandoned_mismatch, s.persister.dropped, s.persister.failures);
}

namespace {
constexpr size_t kMaxPendingSteps = 1024;
}  // namespace

void DurableStreamer::OnComplete(int rank, int64_t step) {
  const size_t num_ranks = store_->Ranks().size();
  {
    MutexLock l(&mu_);
    if (step <= last_committed_) return;
    auto& ranks = reported_[step];
    ranks.insert(rank);
    if (ranks.size() < num_ranks) {
      // A rank that stopped reporting (dead, or stuck) must not make this
      // grow without bound: only the newest steps can still commit.
      while (reported_.size() > kMaxPendingSteps) reported_.erase(reported_.begin());
      return;
    }
    last_committed_ = step;
    ++stats_.committed;
    // Older steps that never completed everywhere can no longer commit first.
    reported_.erase(reported_.begin(), reported_.upper_bound(step));
  }
  tier::OfferResult r = persister_->Offer(
      step, [this, step]() -> Result<tier::VersionView> { return BuildView(step); });
  if (r == tier::OfferResult::kQueued || r == tier::OfferResult::kReplacedPending) {
    MutexLock l(&mu_);
    ++stats_.offered;
  }
}

DurableStats DurableStreamer::stats() {
  tier::PersisterStats ps;
  if (persister_) ps = persister_->stats();
  MutexLock l(&mu_);
  DurableStats s = stats_;
  s.persister = ps;
  return s;
}

namespace {

// Durable names are global keys: state that is not the same on every rank of
// the node gets the rank in its name.
std::string DurableName(const TensorMeta& m, int rank) {
  if (m.state_class == StateClass::kReplicated) return m.name;
  if (m.state_class == StateClass::kDpSharded && m.global_numel > 0) return m.name;
  return fmt::format("rank{}/{}", rank, m.name);
}

}  // namespace

Result<std::shared_ptr<shm::Segment>> DurableStreamer::MapSlot(int rank, int slot) {
  const std::string path = shm::SlotPath(slot_root_, rank, slot);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError("stat " + path, errno);
  {
    MutexLock l(&mu_);
    auto it = mapped_.find({rank, slot});
    // A slot file only grows (EnsureSlots); a new size needs a new mapping.
    if (it != mapped_.end() && it->second->size() == static_cast<size_t>(st.st_size)) {
      return it->second;
    }
  }
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> seg,
                           shm::Segment::Open(path, /*writable=*/false));
  std::shared_ptr<shm::Segment> shared(std::move(seg));
  MutexLock l(&mu_);
  mapped_[{rank, slot}] = shared;
  return shared;
}

Result<tier::VersionView> DurableStreamer::BuildView(int64_t step) {
  {
    std::shared_ptr<const ClusterPlan> plan;
    uint64_t epoch = 0;
    {
      MutexLock l(&mu_);
      plan = cluster_plan_;
      epoch = epoch_;
    }
    if (plan != nullptr) return BuildClusterView(step, std::move(plan), epoch);
  }
  auto hold = std::make_shared<Hold>();
  hold->step = step;
  std::vector<int> ranks = store_->Ranks();
  std::sort(ranks.begin(), ranks.end());
  for (int rank : ranks) {
    bool found = false;
    for (int s = 0; s < shm::kSlotsPerRank && !found; ++s) {
      auto seg = MapSlot(rank, s);
      if (!seg.ok()) continue;
      auto info = shm::ReadSlot(**seg);
      if (!info.ok() || info->state != shm::SlotState::kComplete || info->step != step) continue;
      // Seqlock start: complete with this generation now, so the header just
      // copied belongs to it; any write that begins later changes the
      // generation, which CheckBeforeMarker sees.
      if (!shm::SlotUnchanged(**seg, *info)) continue;
      {
        MutexLock l(&mu_);
        if (corrupt_.count({rank, s, info->generation})) {
          ++stats_.gone;
          return DataLossError(fmt::format(
              "rank {} slot {} (version {}) failed its checksums; not persisted", rank, s, step));
        }
      }
      hold->slots.push_back(HeldSlot{rank, *seg, std::move(*info)});
      found = true;
    }
    if (!found) {
      MutexLock l(&mu_);
      ++stats_.gone;
      return NotFoundError(
          fmt::format("rank {} no longer holds version {} (its slot was recycled)", rank, step));
    }
  }
  tier::VersionView view;
  view.job = job_id_;
  view.node = node_;
  view.num_nodes = 1;  // node-local slice: the cluster layer sets the real count
  view.step = step;
  nlohmann::json topo = {{"node", node_}, {"ranks", ranks}, {"source", "memento agent"}};
  view.topology_json = topo.dump();
  std::set<std::string> replicated_done;
  for (const HeldSlot& hs : hold->slots) {
    const uint8_t* base = hs.segment->data() + hs.info.data_offset;
    std::set<std::string> replicated_here;
    for (const shm::ChunkEntry& c : hs.info.chunks) {
      if (c.tensor_index >= hs.info.tensors.size()) {
        return DataLossError(fmt::format("rank {}: chunk names tensor {} of {}", hs.rank,
                                         c.tensor_index, hs.info.tensors.size()));
      }
      const shm::SavedTensor& t = hs.info.tensors[c.tensor_index];
      tier::ViewEntry e;
      e.meta = t.meta;
      e.meta.name = DurableName(t.meta, hs.rank);
      // Replicated state is the same on every rank: the lowest rank's copy.
      if (t.meta.state_class == StateClass::kReplicated) {
        if (replicated_done.count(e.meta.name)) continue;
        replicated_here.insert(e.meta.name);
      }
      e.offset = c.offset - t.offset;
      e.length = c.length;
      e.data = base + c.offset;
      view.entries.push_back(e);
      // The writer's key for this piece (writer.cc): the tensor's name when
      // the piece is the whole logical tensor, else name#<logical offset>.
      const bool global = e.meta.state_class == StateClass::kDpSharded && e.meta.global_numel > 0;
      const uint64_t es = DTypeSize(e.meta.dtype);
      const uint64_t logical_bytes =
          global ? static_cast<uint64_t>(e.meta.global_numel) * es : e.meta.nbytes();
      const uint64_t off =
          (global ? static_cast<uint64_t>(e.meta.shard_offset) * es : 0) + e.offset;
      const std::string key = (off == 0 && e.length == logical_bytes)
                                  ? e.meta.name
                                  : fmt::format("{}#{}", e.meta.name, off);
      hold->expected[key] = c.checksum;
    }
    replicated_done.insert(replicated_here.begin(), replicated_here.end());
  }
  {
    MutexLock l(&mu_);
    for (auto it = holds_.begin(); it != holds_.end();) {
      it = it->second.use_count() <= 1 ? holds_.erase(it) : std::next(it);
    }
    holds_[step] = hold;
  }
  view.pin = hold;
  return view;
}

Status DurableStreamer::CheckBeforeMarker(int64_t step, const std::string& version_dir) {
  std::shared_ptr<Hold> hold;
  {
    MutexLock l(&mu_);
    auto it = holds_.find(step);
    if (it != holds_.end()) hold = it->second;
  }
  if (!hold) return FailedPreconditionError(fmt::format("durable: no slots held for {}", step));
  // 1. Seqlock re-check: no trainer began a write into any slot read.
  for (const HeldSlot& hs : hold->slots) {
    if (!shm::SlotUnchanged(*hs.segment, hs.info)) {
      MutexLock l(&mu_);
      ++stats_.abandoned_overwritten;
      MEMENTO_LOG_WARN(
          "durable: version {} abandoned: rank {} slot {} was overwritten while it was written "
          "(the trainer is faster than the durable tier); a later version will be persisted",
          step, hs.rank, hs.info.slot_index);
      return AbortedError(fmt::format("version {}: rank {} slot {} overwritten during the write",
                                      step, hs.rank, hs.info.slot_index));
    }
  }
  // 2. What was written is what the trainer wrote: each piece's xxh3 (taken
  // by the writer from the bytes it wrote) equals the slot's chunk checksum.
  const std::string manifest_path = version_dir + "/" + tier::NodeManifestName(node_);
  MEMENTO_ASSIGN_OR_RETURN(std::string text, env_.ReadFileToString(manifest_path));
  MEMENTO_ASSIGN_OR_RETURN(tier::VersionIndex manifest, tier::ParseIndex(text, manifest_path));
  size_t seen = 0;
  std::string problem;
  for (const auto& [name, t] : manifest.tensors) {
    for (const tier::PieceRecord& p : t.pieces) {
      ++seen;
      auto it = hold->expected.find(p.key);
      if (it == hold->expected.end()) {
        problem = fmt::format("piece '{}' is not a chunk of any slot", p.key);
      } else if (it->second != p.xxh3) {
        problem = fmt::format("piece '{}' has xxh3 {} but the slot's chunk has {}", p.key,
                              tier::HexU64(p.xxh3), tier::HexU64(it->second));
      }
      if (!problem.empty()) break;
    }
    if (!problem.empty()) break;
  }
  if (problem.empty() && seen != hold->expected.size()) {
    problem = fmt::format("{} pieces written, {} chunks expected", seen, hold->expected.size());
  }
  if (!problem.empty()) {
    {
      MutexLock l(&mu_);
      ++stats_.abandoned_mismatch;
      for (const HeldSlot& hs : hold->slots) {
        corrupt_.insert({hs.rank, hs.info.slot_index, hs.info.generation});
      }
    }
    MEMENTO_LOG_ERROR("durable: version {} abandoned: {}", step, problem);
    // Let the node store re-check the slots, so that its inventory (and a
    // restore's `list`) knows which one is damaged.
    for (const HeldSlot& hs : hold->slots) {
      Status st = store_->Verify(hs.rank, hs.info.slot_index);
      if (!st.ok())
        MEMENTO_LOG_ERROR("rank {} slot {}: {}", hs.rank, hs.info.slot_index, st.ToString());
    }
    return DataLossError(fmt::format("version {}: {}", step, problem));
  }
  return Status::Ok();
}

}  // namespace memento::agent
