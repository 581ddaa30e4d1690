#include "agent/durable.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "common/check.h"
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
      env_(tier::Env::Posix(options.io_engine), [this](int64_t step, const std::string& vdir) {
        return CheckBeforeMarker(step, vdir);
      }) {}

Result<std::unique_ptr<DurableStreamer>> DurableStreamer::Start(const DurableOptions& options,
                                                                const std::string& job_id, int node,
                                                                const std::string& slot_root,
                                                                shm::NodeStore* store) {
  if (options.dir.empty()) return InvalidArgumentError("durable: empty --durable-dir");
  if (options.hold_max_s < 0) {
    return InvalidArgumentError(
        fmt::format("durable: --durable-hold-max-s {} must be >= 0", options.hold_max_s));
  }
  std::unique_ptr<DurableStreamer> d(new DurableStreamer(options, job_id, node, slot_root, store));
  // The single-node hold word (a cluster agent's trainers follow commit.word
  // instead). Reset on every start: a hold left by a dead agent is void.
  MEMENTO_ASSIGN_OR_RETURN(
      d->durable_word_seg_,
      shm::Segment::CreateOrGrow(shm::DurableWordPath(slot_root), sizeof(shm::CommitWord)));
  shm::InitCommitWord(reinterpret_cast<shm::CommitWord*>(d->durable_word_seg_->data()), -1);
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
      "keep every {}, hold at most {} s, writes: {})",
      options.every_k_steps,
      options.every_seconds > 0 ? fmt::format(" or every {} s", options.every_seconds) : "",
      options.dir, options.bandwidth_bytes_per_sec, options.keep_last, options.keep_every,
      options.hold_max_s, tier::IoEngineName(tier::ResolveIoEngine(options.io_engine)));
  return d;
}

DurableStreamer::~DurableStreamer() {
  // Drain: the version being written and the one queued were given to the
  // durable tier; an agent stopped by SIGTERM (a Kubernetes sidecar, a
  // systemd unit, the end of a job) finishes them unless that takes longer
  // than --durable-drain-s. At least half a second either way, so that a
  // version in its retention pass is in the counters below.
  if (!persister_->WaitIdle(Deadline::AfterSeconds(0.5)) && options_.drain_s > 0.5) {
    MEMENTO_LOG_INFO(
        "durable: stopping; finishing the versions already offered (last written: "
        "step {}), at most {} s (--durable-drain-s)",
        persister_->stats().last_persisted_step, options_.drain_s);
    persister_->WaitIdle(Deadline::AfterSeconds(options_.drain_s - 0.5));
  }
  if (!persister_->WaitIdle(Deadline::AfterSeconds(0))) {
    MEMENTO_LOG_WARN(
        "durable: stopping with a version not written (--durable-drain-s {} s "
        "passed); it is left incomplete and the previous complete version stays",
        options_.drain_s);
  }
  DurableStats s = stats();
  persister_.reset();  // cancels and joins the worker before anything it uses goes
  {
    MutexLock l(&mu_);  // the last write may have ended meanwhile
    s.gone = stats_.gone;
    s.abandoned_overwritten = stats_.abandoned_overwritten;
    s.abandoned_mismatch = stats_.abandoned_mismatch;
    s.abandoned_claimed = stats_.abandoned_claimed;
    s.holds = stats_.holds;
    s.hold_expired = stats_.hold_expired;
    SetHoldLocked(-1);
  }
  MEMENTO_LOG_INFO(
      "durable stats: committed={} offered={} persisted={} last_persisted={} gone={} "
      "abandoned_overwritten={} abandoned_mismatch={} abandoned_claimed={} dropped={} "
      "failures={} holds={} hold_expired={}",
      s.committed, s.offered, s.persister.persisted, s.persister.last_persisted_step, s.gone,
      s.abandoned_overwritten, s.abandoned_mismatch, s.abandoned_claimed, s.persister.dropped,
      s.persister.failures, s.holds, s.hold_expired);
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
  OfferAndHold(step);
}

void DurableStreamer::OfferAndHold(int64_t step) {
  tier::OfferResult r = persister_->Offer(
      step, [this, step]() -> Result<tier::VersionView> { return BuildView(step); });
  if (r == tier::OfferResult::kQueued || r == tier::OfferResult::kReplacedPending) {
    HoldWord();  // maps the cluster's commit word once it exists
    MutexLock l(&mu_);
    ++stats_.offered;
    // The persister may already have taken (or even finished) this version
    // between Offer and here: then BuildView has done the hold's work.
    if (last_built_step_ >= step) return;
    pending_step_ = std::max(pending_step_, step);
    // Hold it from now on unless another version is held (being written, or
    // offered and not yet started): the trainers are then held off that
    // one's slot and skip, so this newest version stays in the other slot
    // until the hold passes to it (BuildView, or ReleaseHold). Moving the
    // hold here could uncover a version the persister has just taken.
    if (held_step_ < 0) SetHoldLocked(pending_step_);
  }
}

shm::CommitWord* DurableStreamer::HoldWord() {
  MutexLock l(&mu_);
  if (commit_word_ == nullptr) {
    const std::string path = shm::CommitWordPath(slot_root_);
    struct stat st;
    if (stat(path.c_str(), &st) == 0 &&
        static_cast<size_t>(st.st_size) >= sizeof(shm::CommitWord)) {
      auto seg = shm::Segment::Open(path, /*writable=*/true);
      if (seg.ok() &&
          shm::CommitWordValid(reinterpret_cast<const shm::CommitWord*>((*seg)->data()))) {
        commit_word_seg_ = std::move(*seg);
        commit_word_ = reinterpret_cast<shm::CommitWord*>(commit_word_seg_->data());
        // The single-node word must not hold anything while the cluster one rules.
        shm::StoreDurableHold(reinterpret_cast<shm::CommitWord*>(durable_word_seg_->data()), -1, 0);
      }
    }
  }
  if (commit_word_ != nullptr) return commit_word_;
  return reinterpret_cast<shm::CommitWord*>(durable_word_seg_->data());
}

void DurableStreamer::SetHoldLocked(int64_t step) {
  if (options_.hold_max_s <= 0 || durable_word_seg_ == nullptr) return;
  shm::CommitWord* w = commit_word_ != nullptr
                           ? commit_word_
                           : reinterpret_cast<shm::CommitWord*>(durable_word_seg_->data());
  const int64_t now = shm::MonotonicNanos();
  if (step != held_step_ || step < 0) held_since_ns_ = now;
  held_step_ = step;
  // Bounded from when this version was first held (offered), not renewed.
  shm::StoreDurableHold(w, step, held_since_ns_ + static_cast<int64_t>(options_.hold_max_s * 1e9));
}

void DurableStreamer::ReleaseHold(int64_t step, uint64_t seq) {
  MutexLock l(&mu_);
  if (inflight_step_ != step || inflight_seq_ != seq) return;  // already released
  inflight_step_ = -1;
  if (held_step_ == step &&
      shm::MonotonicNanos() - held_since_ns_ >= static_cast<int64_t>(options_.hold_max_s * 1e9)) {
    ++stats_.hold_expired;
    MEMENTO_LOG_WARN(
        "durable: version {} was held longer than --durable-hold-max-s {} s; the trainers were "
        "free to overwrite it (raise the cap, the bandwidth, or --persist-every)",
        step, options_.hold_max_s);
  }
  if (pending_step_ > step) {
    SetHoldLocked(pending_step_);
  } else {
    SetHoldLocked(-1);
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
// the node gets the rank in its name. (Replicated tensors: DurableNames.)
std::string DurableName(const TensorMeta& m, int rank) {
  if (m.state_class == StateClass::kDpSharded && m.global_numel > 0) return m.name;
  return tier::RankScopedName(rank, m.name);
}

}  // namespace

std::map<std::pair<int, std::string>, ReplicatedName> DurableNames(
    const std::vector<ReplicatedCopy>& copies) {
  // name -> classes of equal copies (indexes into `copies`), in rank order.
  std::map<std::string, std::vector<std::vector<size_t>>> classes;
  std::vector<size_t> order(copies.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return copies[a].rank < copies[b].rank; });
  for (size_t i : order) {
    const ReplicatedCopy& c = copies[i];
    auto& cls = classes[c.meta.name];
    bool placed = false;
    for (auto& k : cls) {
      const ReplicatedCopy& first = copies[k.front()];
      if (first.meta == c.meta && first.chunks == c.chunks) {
        k.push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) cls.push_back({i});
  }
  std::map<std::pair<int, std::string>, ReplicatedName> out;
  for (const auto& [name, cls] : classes) {
    for (const auto& k : cls) {
      ReplicatedName n;
      for (size_t i : k) n.ranks.push_back(copies[i].rank);
      const int lowest = n.ranks.front();
      n.name = cls.size() == 1 ? name : tier::RankScopedName(lowest, name);
      for (size_t i : k) {
        ReplicatedName r = n;
        r.writer = copies[i].rank == lowest;
        out[{copies[i].rank, name}] = std::move(r);
      }
    }
  }
  return out;
}

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

Result<DurableStreamer::HeldSlot> DurableStreamer::HoldCompleteSlot(int rank, int64_t step) {
  std::shared_ptr<shm::Segment> segments[shm::kSlotsPerRank];
  shm::RankSlots slots{};
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    auto seg = MapSlot(rank, s);
    if (!seg.ok()) continue;
    segments[s] = std::move(*seg);
    slots[s] = segments[s].get();
  }
  // Complete with this generation when found (the seqlock start), so the
  // header just copied belongs to it; any write that begins later changes the
  // generation, which CheckBeforeMarker sees.
  Result<shm::CompleteSlot> found = shm::FindCompleteSlot(slots, step);
  MutexLock l(&mu_);
  if (!found.ok()) {
    ++stats_.gone;
    return NotFoundError(
        fmt::format("rank {} no longer holds version {} (its slot was recycled)", rank, step));
  }
  if (corrupt_.count({rank, found->slot, found->info.generation})) {
    ++stats_.gone;
    return DataLossError(
        fmt::format("rank {} slot {} (version {}) failed its checksums; not persisted", rank,
                    found->slot, step));
  }
  return HeldSlot{rank, segments[found->slot], std::move(found->info)};
}

Result<tier::VersionView> DurableStreamer::BuildView(int64_t step) {
  std::shared_ptr<const ClusterPlan> plan;
  uint64_t epoch = 0;
  {
    MutexLock l(&mu_);
    plan = cluster_plan_;
    epoch = epoch_;
  }
  auto hold = std::make_shared<Hold>();
  hold->step = step;
  std::vector<int> ranks = store_->Ranks();
  std::sort(ranks.begin(), ranks.end());
  shm::CommitWord* word = HoldWord();
  uint64_t seq = 0;
  {
    MutexLock l(&mu_);
    seq = ++inflight_seq_;
    inflight_step_ = step;
    last_built_step_ = std::max(last_built_step_, step);
    if (pending_step_ <= step) pending_step_ = -1;
    SetHoldLocked(step);
  }
  // Dekker's handshake with the clients (shm/commit_word.h): the hold is
  // stored; a rank that claimed this step before it could see the hold is
  // overwriting the slot, and the version is abandoned before it starts.
  // Any rank that claims it later sees the hold and skips.
  shm::FullFence();
  if (options_.hold_max_s > 0) {
    for (int rank : ranks) {
      if (rank < shm::kCommitWordMaxRanks && shm::LoadWord(&word->claim[rank]) == step) {
        ReleaseHold(step, seq);
        MutexLock l(&mu_);
        ++stats_.abandoned_claimed;
        return NotFoundError(fmt::format(
            "rank {} was already overwriting its slot of version {} when the hold was set", rank,
            step));
      }
    }
  }
  // From here on, every failure gives the hold back; success hands it to the
  // pin, which gives it back when the persister drops the view.
  struct HoldRelease {
    DurableStreamer* self;
    int64_t step;
    uint64_t seq;
    bool armed = true;
    ~HoldRelease() {
      if (armed) self->ReleaseHold(step, seq);
    }
  } release{this, step, seq};
  if (plan != nullptr) {  // cluster mode: this node's plan pieces (durable_cluster.cc)
    MEMENTO_ASSIGN_OR_RETURN(tier::VersionView view,
                             BuildClusterView(step, std::move(plan), epoch, hold));
    return PinView(std::move(view), hold, step, seq, &release.armed);
  }
  for (int rank : ranks) {
    MEMENTO_ASSIGN_OR_RETURN(HeldSlot held, HoldCompleteSlot(rank, step));
    hold->slots.push_back(std::move(held));
  }
  tier::VersionView view;
  view.job = job_id_;
  view.node = node_;
  view.num_nodes = 1;  // node-local slice: the cluster layer sets the real count
  view.step = step;
  // "replicated": replicated tensors are shared by equal copies only (the
  // index's per-tensor "ranks"); versions without it predate that rule.
  nlohmann::json topo = {{"node", node_},
                         {"ranks", ranks},
                         {"source", "memento agent"},
                         {"replicated", "shared by equal copies"}};
  view.topology_json = topo.dump();
  // Replicated state is identical on the DP ranks of one (pp, tp) position,
  // not on every rank of a node: two ranks of different pipeline stages or
  // TP positions register different bytes under one name. A replicated
  // tensor is written once for a set of ranks only when it is provably the
  // same state there: same meta and the same chunk checksum list in the
  // slots being persisted (no re-hash). See DurableNames.
  // A tensor held in several entries (ranges of a sharded slot) is one copy
  // whose chunks carry their offsets in the whole tensor.
  std::vector<ReplicatedCopy> copies;
  for (const HeldSlot& hs : hold->slots) {
    std::map<std::string, size_t> copy_of;  // name -> index into copies
    for (size_t ti = 0; ti < hs.info.tensors.size(); ++ti) {
      const shm::SavedTensor& t = hs.info.tensors[ti];
      if (t.meta.state_class != StateClass::kReplicated) continue;
      auto [at, fresh] = copy_of.emplace(t.meta.name, copies.size());
      if (fresh) {
        ReplicatedCopy c;
        c.rank = hs.rank;
        c.meta = t.meta;
        copies.push_back(std::move(c));
      }
      ReplicatedCopy& c = copies[at->second];
      for (const shm::ChunkEntry& ch : hs.info.chunks) {
        if (ch.tensor_index != ti) continue;
        c.chunks.push_back({ch.offset - t.offset + t.range_offset, ch.length, ch.checksum});
      }
    }
    for (const auto& [name, i] : copy_of) {
      std::sort(copies[i].chunks.begin(), copies[i].chunks.end(),
                [](const ReplicatedCopy::Chunk& a, const ReplicatedCopy::Chunk& b) {
                  return a.offset < b.offset;
                });
    }
  }
  const std::map<std::pair<int, std::string>, ReplicatedName> names = DurableNames(copies);
  for (const HeldSlot& hs : hold->slots) {
    const uint8_t* base = hs.segment->data() + hs.info.data_offset;
    for (const shm::ChunkEntry& c : hs.info.chunks) {
      if (c.tensor_index >= hs.info.tensors.size()) {
        return DataLossError(fmt::format("rank {}: chunk names tensor {} of {}", hs.rank,
                                         c.tensor_index, hs.info.tensors.size()));
      }
      const shm::SavedTensor& t = hs.info.tensors[c.tensor_index];
      // A parity entry is redundancy, not state (docs/reft.md section 4).
      if (t.is_parity()) continue;
      tier::ViewEntry e;
      e.meta = t.meta;
      if (t.meta.state_class == StateClass::kReplicated) {
        auto it = names.find({hs.rank, t.meta.name});
        MEMENTO_CHECK(it != names.end());
        // Another rank writes the copy this rank shares.
        if (!it->second.writer) continue;
        e.meta.name = it->second.name;
        e.ranks = it->second.ranks;
      } else {
        e.meta.name = DurableName(t.meta, hs.rank);
        e.ranks = {hs.rank};
      }
      e.offset = c.offset - t.offset + t.range_offset;  // in the whole tensor
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
  }
  return PinView(std::move(view), hold, step, seq, &release.armed);
}

tier::VersionView DurableStreamer::PinView(tier::VersionView view, std::shared_ptr<Hold> hold,
                                           int64_t step, uint64_t seq, bool* release_armed) {
  {
    MutexLock l(&mu_);
    for (auto it = holds_.begin(); it != holds_.end();) {
      it = it->second.use_count() <= 1 ? holds_.erase(it) : std::next(it);
    }
    holds_[step] = hold;
    if (options_.hold_max_s > 0) ++stats_.holds;
  }
  // The view's pin keeps the slots mapped and releases the hold when the
  // persister is done with the version (if CheckBeforeMarker has not already).
  *release_armed = false;
  view.pin = std::shared_ptr<const void>(
      hold.get(), [this, hold, step, seq](const void*) { ReleaseHold(step, seq); });
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
  uint64_t seq = 0;
  {
    MutexLock l(&mu_);
    seq = inflight_seq_;
  }
  // Whatever the checks say, the slots are no longer needed after them: the
  // data file is durable, and a refused version is abandoned.
  struct HoldRelease {
    DurableStreamer* self;
    int64_t step;
    uint64_t seq;
    ~HoldRelease() { self->ReleaseHold(step, seq); }
  } release{this, step, seq};
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
