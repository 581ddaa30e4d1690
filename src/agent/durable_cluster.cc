#include "agent/durable_cluster.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "agent/durable.h"
#include "agent/job_member.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "fmt/format.h"
#include "shm/slot.h"
#include "tier/reader.h"
#include "topo/topology_json.h"

namespace memento::agent {

std::string ClusterDurableName(const TensorMeta& meta, int rank, const topo::Topology& topology) {
  const bool shared = meta.state_class == StateClass::kReplicated ||
                      (meta.state_class == StateClass::kDpSharded && meta.global_numel > 0);
  if (!shared) return fmt::format("rank{}/{}", rank, meta.name);
  if (topology.tp * topology.pp == 1) return meta.name;
  return fmt::format("pp{}.tp{}/{}", topology.PpIndex(rank), topology.TpIndex(rank), meta.name);
}

nlohmann::json DurableLoadStatsToJson(const DurableLoadStats& s) {
  return {{"step", s.step},      {"ranks", s.ranks},
          {"bytes", s.bytes},    {"read_bytes", s.read_bytes},
          {"read_s", s.read_s},  {"write_s", s.write_s},
          {"total_s", s.total_s}};
}

// ---- writing: this node's share of a cluster version ---------------------------

namespace {

// The data file's key of bytes [offset, offset + length) of `meta` (writer.cc):
// the tensor's name when they are the whole logical tensor, else
// name#<byte offset in the logical tensor>.
std::string PieceKey(const TensorMeta& meta, const std::string& name, uint64_t offset,
                     uint64_t length) {
  const bool global = meta.state_class == StateClass::kDpSharded && meta.global_numel > 0;
  const uint64_t es = DTypeSize(meta.dtype);
  const uint64_t logical_bytes =
      global ? static_cast<uint64_t>(meta.global_numel) * es : meta.nbytes();
  const uint64_t off = (global ? static_cast<uint64_t>(meta.shard_offset) * es : 0) + offset;
  return (off == 0 && length == logical_bytes) ? name : fmt::format("{}#{}", name, off);
}

}  // namespace

Result<tier::VersionView> DurableStreamer::BuildClusterView(int64_t step,
                                                            std::shared_ptr<const ClusterPlan> cp,
                                                            uint64_t epoch,
                                                            const std::shared_ptr<Hold>& hold) {
  const topo::Plan& plan = cp->plan;
  if (node_ < 0 || node_ >= static_cast<int>(plan.nodes.size())) {
    return FailedPreconditionError(
        fmt::format("durable: node {} is not in the plan ({} nodes)", node_, plan.nodes.size()));
  }
  // The pieces this node is primary for, by the rank whose slot holds them.
  std::map<int, std::vector<uint32_t>> by_rank;
  for (uint32_t id : plan.nodes[static_cast<size_t>(node_)].pieces) {
    by_rank[plan.pieces[id].rank].push_back(id);
  }
  tier::VersionView view;
  view.job = job_id_;
  view.node = node_;
  view.num_nodes = static_cast<int>(plan.nodes.size());
  view.step = step;
  view.epoch = epoch;
  // The same text on every node: the index of the version records it.
  nlohmann::json topo = {{"cluster", topo::JobTopologyToJson({plan.topology, plan.policy})},
                         {"plan_hash", fmt::format("{:016x}", cp->hash)},
                         {"names", plan.topology.tp * plan.topology.pp == 1
                                       ? "replicated and ZeRO-1 tensors by name, rank<r>/ "
                                         "for the rest"
                                       : "pp<p>.tp<t>/ for replicated and ZeRO-1 tensors, "
                                         "rank<r>/ for the rest"},
                         {"source", "memento agent (cluster mode)"}};
  view.topology_json = topo.dump();

  for (const auto& [rank, pieces] : by_rank) {
    // The rank's slot that holds `step` complete (see BuildView).
    MEMENTO_ASSIGN_OR_RETURN(HeldSlot hs, HoldCompleteSlot(rank, step));
    const uint8_t* base = hs.segment->data() + hs.info.data_offset;
    std::set<size_t> chunk_checked;  // chunks whose whole bytes matched the table
    for (uint32_t id : pieces) {
      for (const topo::Segment& seg : plan.pieces[id].segments) {
        auto runs = shm::FindRange(hs.info, seg.tensor, seg.offset, seg.length);
        if (!runs.ok()) {
          return FailedPreconditionError(fmt::format(
              "durable: piece {} names bytes [{}, {}) of tensor '{}', which rank {}'s slot of "
              "version {} does not hold (made under another plan?): {}",
              plan.pieces[id].key, seg.offset, seg.offset + seg.length, seg.tensor, rank, step,
              runs.status().message()));
        }
        for (const shm::SlotRun& run : *runs) {
          const shm::SavedTensor& t = hs.info.tensors[run.entry];
          const std::string name = ClusterDurableName(t.meta, rank, plan.topology);
          const uint64_t run_end = run.data_offset + run.length;
          // Cut at the slot's chunk boundaries: a piece that is a whole chunk
          // is checked against the chunk's checksum before the marker; a part
          // of a chunk against the checksum of those bytes taken now, after
          // the whole chunk was checked against the table.
          for (size_t ci = 0; ci < hs.info.chunks.size(); ++ci) {
            const shm::ChunkEntry& c = hs.info.chunks[ci];
            if (c.tensor_index != run.entry) continue;
            const uint64_t lo = std::max(c.offset, run.data_offset);  // in the data region
            const uint64_t hi = std::min(c.offset + c.length, run_end);
            if (lo >= hi) continue;
            tier::ViewEntry e;
            e.meta = t.meta;
            e.meta.name = name;
            e.offset = t.range_offset + (lo - t.offset);  // in the tensor
            e.length = hi - lo;
            e.data = base + lo;
            uint64_t expected = c.checksum;
            if (lo != c.offset || hi != c.offset + c.length) {
              if (!chunk_checked.count(ci)) {
                if (Checksum(base + c.offset, c.length) != c.checksum) {
                  MutexLock l(&mu_);
                  corrupt_.insert({rank, hs.info.slot_index, hs.info.generation});
                  ++stats_.gone;
                  return DataLossError(fmt::format(
                      "rank {} slot {} (version {}): chunk {} of {} fails its checksum; not "
                      "persisted",
                      rank, hs.info.slot_index, step, ci, shm::EntryName(t)));
                }
                chunk_checked.insert(ci);
              }
              expected = Checksum(e.data, e.length);
            }
            hold->expected[PieceKey(e.meta, name, e.offset, e.length)] = expected;
            view.entries.push_back(std::move(e));
          }
        }
      }
    }
    hold->slots.push_back(std::move(hs));
  }
  return view;  // BuildView pins it (PinView)
}

void DurableStreamer::SetClusterPlan(std::shared_ptr<const ClusterPlan> plan) {
  MutexLock l(&mu_);
  cluster_plan_ = std::move(plan);
}

void DurableStreamer::SetEpoch(uint64_t epoch) {
  MutexLock l(&mu_);
  if (epoch != epoch_) MEMENTO_LOG_INFO("durable: epoch {}", epoch);
  epoch_ = epoch;
}

void DurableStreamer::OnCommitted(int64_t step) {
  {
    MutexLock l(&mu_);
    if (step <= last_committed_) return;
    last_committed_ = step;
    // A node that has no plan yet (an agent just started, a replaced node)
    // holds nothing of this version.
    if (cluster_plan_ == nullptr) return;
    ++stats_.committed;
  }
  OfferAndHold(step);  // durable.cc: the durable hold as in node-local mode
}

void DurableStreamer::RestartAt(int64_t step) {
  MutexLock l(&mu_);
  last_committed_ = step;
}

// ---- loading: a durable version into T0 ---------------------------------------------

namespace {

constexpr uint64_t kSlotChunkBytes = uint64_t{4} << 20;  // the client's default chunk size

// The slot to load `step` into: one that holds `step` in any state, else an
// empty / torn / corrupt one, else the one with the older version.
int ChooseLoadSlot(shm::NodeStore& store, int rank, int64_t step) {
  int best = 0;
  int64_t best_score = INT64_MAX;
  for (const shm::SlotStatus& s : store.Inventory(rank)) {
    int64_t score;
    if (s.step == step) {
      score = INT64_MIN;
    } else if (s.state != shm::SlotState::kComplete || (s.verified && !s.intact)) {
      score = INT64_MIN + 1;
    } else {
      score = s.step;
    }
    if (score < best_score) {
      best = s.slot;
      best_score = score;
    }
  }
  return best;
}

}  // namespace

Result<DurableLoadStats> LoadDurableVersion(const ClusterPlan& cp, const std::string& job, int node,
                                            const std::string& dir, int64_t step,
                                            shm::NodeStore& store, tier::Env* env) {
  Stopwatch total;
  if (env == nullptr) env = tier::Env::Default();
  const topo::Plan& plan = cp.plan;
  DurableLoadStats stats;
  stats.step = step;
  if (cp.inventory.size() != plan.ranks.size()) {
    return FailedPreconditionError(fmt::format("durable load: inventory of {} ranks, plan of {}",
                                               cp.inventory.size(), plan.ranks.size()));
  }
  // The version must exist before any slot is touched.
  MEMENTO_ASSIGN_OR_RETURN(tier::VersionIndex index, tier::LoadIndex(env, dir, step));

  struct RankLoad {
    int rank = 0;
    int slot = 0;
    shm::SlotLayout layout;
    std::unique_ptr<shm::Segment> segment;
  };
  std::vector<RankLoad> loads;
  for (int rank = 0; rank < plan.topology.num_ranks(); ++rank) {
    if (plan.topology.rank_node[static_cast<size_t>(rank)] != node) continue;
    RankLoad l;
    l.rank = rank;
    MEMENTO_ASSIGN_OR_RETURN(
        l.layout, shm::ComputeSlotLayout(job, rank, cp.inventory[rank], kSlotChunkBytes));
    loads.push_back(std::move(l));
  }
  // Every target, checked by Restore against the index before anything is read.
  Stopwatch write_sw;
  for (RankLoad& l : loads) {
    MEMENTO_ASSIGN_OR_RETURN(std::vector<std::string> paths,
                             store.EnsureSlots(l.rank, l.layout.total_bytes));
    l.slot = ChooseLoadSlot(store, l.rank, step);
    MEMENTO_ASSIGN_OR_RETURN(l.segment, shm::Segment::Open(paths[static_cast<size_t>(l.slot)],
                                                           /*writable=*/true));
    if (l.segment->size() < l.layout.total_bytes) {
      return InternalError(fmt::format("slot {} of rank {} is {} bytes, needs {}", l.slot, l.rank,
                                       l.segment->size(), l.layout.total_bytes));
    }
  }
  // Restore checks every target against the index before it reads; the
  // names are checked here already, so that no slot is marked kWriting (and
  // its older version lost) for a version that lacks a tensor.
  std::vector<tier::RestoreTarget> targets;
  std::string missing;
  for (RankLoad& l : loads) {
    // Not yet kWriting: the data pointers are only used after BeginSlotWrite.
    uint8_t* data = l.segment->data() + l.layout.data_offset;
    for (const shm::SavedTensor& t : l.layout.tensors) {
      tier::RestoreTarget target;
      target.meta = t.meta;
      target.meta.name = ClusterDurableName(t.meta, l.rank, plan.topology);
      target.data = data + t.offset;
      if (!index.tensors.count(target.meta.name)) {
        missing += (missing.empty() ? "" : ", ") + target.meta.name;
      }
      targets.push_back(std::move(target));
    }
  }
  if (!missing.empty()) {
    return NotFoundError(fmt::format(
        "durable version {} under {} has no tensor(s) {} (written by another job or topology?)",
        step, dir, missing));
  }
  for (RankLoad& l : loads) {
    shm::BeginSlotWrite(*l.segment, l.layout, l.slot, step);
    if (shm::SlotData(*l.segment) != l.segment->data() + l.layout.data_offset) {
      return InternalError(fmt::format("rank {}: slot data region moved", l.rank));
    }
  }
  stats.write_s += write_sw.Seconds();

  Stopwatch read_sw;
  tier::RestoreOptions ro;
  ro.direct_io = true;
  MEMENTO_ASSIGN_OR_RETURN(tier::RestoreReport rep, tier::Restore(env, dir, step, targets, ro));
  stats.read_s = read_sw.Seconds();
  stats.read_bytes = rep.bytes_read;

  write_sw.Reset();
  for (RankLoad& l : loads) {
    const uint8_t* data = shm::SlotData(*l.segment);
    shm::ChunkEntry* table = shm::SlotTable(*l.segment);
    for (size_t c = 0; c < l.layout.chunks.size(); ++c) {
      table[c].checksum = Checksum(data + table[c].offset, table[c].length);
    }
    shm::CompleteSlotWrite(*l.segment);
    Status v = store.Verify(l.rank, l.slot);
    if (!v.ok()) {
      return Status(v.code(), fmt::format("rank {}: loaded slot {} of step {} does not verify: {}",
                                          l.rank, l.slot, step, v.message()));
    }
    // A newer version in the rank's other slot belongs to the history the
    // job abandons by restarting from `step`: marked not complete (kWriting),
    // so that the trainer's next snapshots keep `step` and no later recovery
    // mixes the two histories.
    for (int other = 0; other < shm::kSlotsPerRank; ++other) {
      if (other == l.slot) continue;
      std::shared_ptr<shm::Segment> seg = store.SlotSegment(l.rank, other);
      if (seg == nullptr) continue;
      auto info = shm::ReadSlot(*seg);
      if (!info.ok() || info->state != shm::SlotState::kComplete || info->step <= step) continue;
      const std::string path = shm::SlotPath(store.options().root, l.rank, other);
      auto w = shm::Segment::Open(path, /*writable=*/true);
      if (!w.ok() || (*w)->size() < l.layout.total_bytes) continue;
      shm::BeginSlotWrite(**w, l.layout, other, info->step);
      MEMENTO_LOG_INFO(
          "durable load: rank {} slot {} held step {} of the abandoned history: "
          "marked not complete",
          l.rank, other, info->step);
    }
    stats.bytes += l.layout.data_bytes;
    stats.ranks.push_back(l.rank);
    MEMENTO_LOG_INFO("durable load: rank {} step {} into slot {} ({} bytes) from {}", l.rank, step,
                     l.slot, l.layout.data_bytes, dir);
  }
  stats.write_s += write_sw.Seconds();
  stats.total_s = total.Seconds();
  return stats;
}

}  // namespace memento::agent
