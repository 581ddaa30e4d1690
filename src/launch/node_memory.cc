#include "launch/node_memory.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "shm/node_store.h"
#include "shm/redundancy_format.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::launch {

namespace {

// The sizes of the entries of `root`'s red.<step> that are resident in T0
// (shm/redundancy_format.h; 0 when the file is gone or not complete).
uint64_t ResidentEntryBytes(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "/red.%020lld", static_cast<long long>(step));
  auto seg = shm::Segment::Open(root + name, /*writable=*/false);
  if (!seg.ok() || (*seg)->size() < shm::kRedundancyHeaderBytes) return 0;
  const auto* h = reinterpret_cast<const shm::RedundancyHeader*>((*seg)->data());
  if (h->magic != shm::kRedundancyMagic || shm::LoadState(h) != shm::RedundancyState::kComplete ||
      h->format_version != shm::kRedundancyFormatVersionResident ||
      h->table_offset + uint64_t{h->num_entries} * sizeof(shm::RedundancyEntry) > (*seg)->size()) {
    return 0;
  }
  const auto* table =
      reinterpret_cast<const shm::RedundancyEntry*>((*seg)->data() + h->table_offset);
  uint64_t n = 0;
  for (uint32_t i = 0; i < h->num_entries; ++i) {
    if ((table[i].flags & shm::kEntryResident) != 0) n += table[i].bytes;
  }
  return n;
}

}  // namespace

Result<NodeMemory> MeasureNodeMemory(int node, const std::string& root,
                                     const std::vector<int>& ranks, int64_t step,
                                     topo::Inventory* inventory) {
  NodeMemory m;
  m.node = node;
  m.step = step;
  for (int rank : ranks) {
    std::vector<std::unique_ptr<shm::Segment>> segs;
    shm::RankSlots slots{};
    for (int s = 0; s < shm::kSlotsPerRank; ++s) {
      auto seg = shm::Segment::Open(shm::SlotPath(root, rank, s), /*writable=*/false);
      if (!seg.ok()) continue;
      slots[s] = seg->get();
      segs.push_back(std::move(*seg));
    }
    auto found =
        step >= 0 ? shm::FindCompleteSlot(slots, step) : shm::FindNewestCompleteSlot(slots);
    if (!found.ok()) {
      return found.status().WithContext("rank " + std::to_string(rank) + " under " + root);
    }
    m.t0_bytes += found->info.data_bytes;
    // A sharded slot names a tensor in several range entries: count it once.
    std::vector<TensorMeta> metas;
    std::set<std::string> seen;
    for (const shm::SavedTensor& t : found->info.tensors) {
      if (!seen.insert(t.meta.name).second) continue;
      m.full_bytes += t.meta.nbytes();
      metas.push_back(t.meta);
    }
    if (inventory != nullptr) (*inventory)[rank] = std::move(metas);
  }
  std::error_code ec;
  std::map<int64_t, uint64_t> red;  // step -> bytes
  const std::filesystem::path top(root);
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code fe;
    if (!it->is_regular_file(fe)) continue;
    struct stat st;
    if (stat(it->path().c_str(), &st) == 0) {
      m.resident_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    const std::string name = it->path().filename().string();
    if (name.rfind("red.", 0) == 0 && it->path().parent_path() == top) {
      red[std::atoll(name.c_str() + 4)] += static_cast<uint64_t>(st.st_size);
    }
  }
  int64_t red_step = -1;
  if (step >= 0) {
    auto it = red.find(step);
    if (it != red.end()) {
      m.t1_bytes = it->second;
      red_step = step;
    }
  } else if (!red.empty()) {
    m.t1_bytes = red.rbegin()->second;
    red_step = red.rbegin()->first;
  }
  if (red_step >= 0) m.t1_resident_bytes = ResidentEntryBytes(root, red_step);
  return m;
}

void AddPlanBytes(const topo::Plan& plan, NodeMemory* m) {
  if (m->node < 0 || static_cast<size_t>(m->node) >= plan.nodes.size()) return;
  const topo::NodePlan& np = plan.nodes[m->node];
  m->plan_piece_bytes = np.piece_bytes;
  m->plan_copy_bytes = np.copy_bytes;
  m->plan_parity_bytes = np.parity_bytes;
  // The ranks' whole registered state, from the plan: a sharded slot does
  // not name every tensor (docs/reft.md). A rank registers all of its
  // sharding group's replicated bytes plus its own dp_shard and private
  // pieces.
  uint64_t full = 0;
  for (int r : np.ranks) {
    const int group = plan.ranks[static_cast<size_t>(r)].group;
    for (const topo::Piece& p : plan.pieces) {
      if (p.kind == topo::PieceKind::kReplicatedShard ? p.group == group : p.rank == r) {
        full += p.bytes;
      }
    }
  }
  if (!np.ranks.empty()) m->full_bytes = full;
}

std::string ReftFormula(const topo::Policy& policy) {
  const std::string name = topo::PolicyName(policy);
  if (policy.local_copy == topo::LocalCopy::kFull) {
    return name + " (local_copy full): W + O_r + P_r and their peer copies";
  }
  switch (policy.scheme) {
    case topo::Scheme::kReplicate:
      return name + ": 2W/m + O_r + a peer's shard + P_r + a peer copy";
    case topo::Scheme::kXor:
      return name + ": W/m + W/(m(m-1)) + O_r + a peer's shard + P_r + a peer copy";
    case topo::Scheme::kRs:
      return name + ": W/m + f W/(m k) (k = m - f) + O_r + f peer shards + P_r + f peer copies";
    case topo::Scheme::kPeer:
      return name + ": W/m per copy, each piece, shard and private state on " +
             std::to_string(policy.m) + " nodes (Gemini: copies over the network)";
    case topo::Scheme::kNone:
      return name + ": W/m + O_r + P_r (no redundancy)";
    case topo::Scheme::kAuto:
      break;
  }
  return name + ": the formula of the scheme the plan chose";
}

nlohmann::json NodeMemory::ToJson() const {
  const uint64_t plan = plan_total_bytes();
  return {{"node", node},
          {"t0_bytes", t0_bytes},
          {"t1_bytes", t1_bytes},
          {"t1_resident_bytes", t1_resident_bytes},
          {"step", step},
          {"host_bytes", t0_bytes + t1_bytes},
          {"copy_bytes_per_step", t0_bytes},
          {"full_copy_bytes_per_step", full_bytes},
          {"resident_bytes", resident_bytes},
          {"plan_piece_bytes", plan_piece_bytes},
          {"plan_copy_bytes", plan_copy_bytes},
          {"plan_parity_bytes", plan_parity_bytes},
          {"reft_bytes", plan},
          {"ratio", plan ? static_cast<double>(t0_bytes + t1_bytes) / plan : 0.0}};
}

std::string NodeMemory::ToString() const {
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  char buf[320];
  const uint64_t plan = plan_total_bytes();
  std::snprintf(buf, sizeof(buf),
                "node%d: T0 %.2f MiB + T1 %.2f MiB per version (copied per snapshot %.2f MiB of "
                "%.2f MiB registered); plan (REFT) %.2f MiB = pieces %.2f + copies %.2f + parity "
                "%.2f; ratio %.2f; resident %.2f MiB",
                node, mib(t0_bytes), mib(t1_bytes), mib(t0_bytes), mib(full_bytes), mib(plan),
                mib(plan_piece_bytes), mib(plan_copy_bytes), mib(plan_parity_bytes),
                plan ? static_cast<double>(t0_bytes + t1_bytes) / plan : 0.0, mib(resident_bytes));
  return buf;
}

}  // namespace memento::launch
