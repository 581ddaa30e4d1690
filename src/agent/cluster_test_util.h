// Test helpers for the agent's cluster parts: a small plan (dp ranks on dp
// nodes, one rank each, replicated tensors "a" and "b" plus a private "rng"),
// real NodeStores in shared-memory scratch dirs, and T0 slots written with
// the shm slot API exactly as the client writes them, with contents that are
// a pure function of (tensor, step[, rank for private state]) so a test can
// compute the bytes of any piece.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/checksum.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "topo/plan.h"

namespace memento::agent::testing {

inline constexpr char kJob[] = "peerjob";
inline constexpr uint64_t kChunkBytes = 1024;

inline TensorMeta Tensor(std::string name, DType dtype, int64_t numel, StateClass cls) {
  TensorMeta t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = {numel};
  t.state_class = cls;
  return t;
}

// Sizes chosen so a replicated piece spans the end of "a" and the start of "b".
inline topo::Inventory MakeInventory(int dp, uint64_t a_bytes = 3000 * 4,
                                     uint64_t b_bytes = 5000 * 4, uint64_t rng_bytes = 777) {
  topo::Inventory inv(dp);
  for (auto& r : inv) {
    r.push_back(Tensor("a", DType::kFloat32, a_bytes / 4, StateClass::kReplicated));
    r.push_back(Tensor("b", DType::kFloat32, b_bytes / 4, StateClass::kReplicated));
    r.push_back(Tensor("rng", DType::kUInt8, rng_bytes, StateClass::kPrivate));
  }
  return inv;
}

inline topo::Plan MakeTestPlan(int dp, const topo::Inventory& inv, const std::string& policy) {
  auto t = topo::Topology::Uniform(dp, 1, 1, 0, 1);
  MEMENTO_CHECK(t.ok());
  auto pol = topo::ParsePolicy(policy);
  MEMENTO_CHECK(pol.ok());
  auto plan = topo::MakePlan(*t, inv, *pol);
  EXPECT_TRUE(plan.ok()) << plan.status();
  MEMENTO_CHECK(plan.ok());
  return std::move(plan).value();
}

// Byte `i` of tensor `t` of `rank` at `step` (`salt` varies a rewrite).
inline std::vector<uint8_t> TensorBytes(const TensorMeta& t, int rank, int64_t step,
                                        uint64_t salt = 0) {
  std::vector<uint8_t> v(t.nbytes());
  uint64_t seed = std::hash<std::string>()(t.name) ^
                  (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ULL) ^ salt;
  if (t.state_class == StateClass::kPrivate) seed ^= static_cast<uint64_t>(rank + 1) << 40;
  // Each rank's optimizer shard is its own (a restore that read another
  // rank's would be caught).
  if (t.state_class == StateClass::kDpSharded) seed ^= static_cast<uint64_t>(rank + 1) << 48;
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Writes one rank's T0 slot again and again, as the client does (the segment
// mapped once).
class SlotWriter {
 public:
  SlotWriter(shm::NodeStore& store, const topo::Inventory& inv, int rank, int slot)
      : SlotWriter(store, WholeEntries(inv[rank]), rank, slot) {}
  // A slot of these entries (ranges of tensors: a sharded slot).
  SlotWriter(shm::NodeStore& store, const std::vector<shm::SlotEntrySpec>& entries, int rank,
             int slot)
      : rank_(rank), slot_(slot) {
    auto layout = shm::ComputeRangeSlotLayout(kJob, rank, entries, kChunkBytes);
    EXPECT_TRUE(layout.ok()) << layout.status();
    MEMENTO_CHECK(layout.ok());
    layout_ = std::move(layout).value();
    auto paths = store.EnsureSlots(rank, layout_.total_bytes);
    EXPECT_TRUE(paths.ok()) << paths.status();
    MEMENTO_CHECK(paths.ok());
    auto seg = shm::Segment::Open((*paths)[slot], /*writable=*/true);
    MEMENTO_CHECK(seg.ok());
    segment_ = std::move(seg).value();
  }
  // `parities`: the bytes of the slot's parity entries, by plan parity id
  // (as the client's copy workers compute them); required when it has any.
  void Write(int64_t step, uint64_t salt = 0,
             const std::map<uint32_t, std::vector<uint8_t>>* parities = nullptr) {
    shm::BeginSlotWrite(*segment_, layout_, slot_, step);
    uint8_t* data = shm::SlotData(*segment_);
    for (const shm::SavedTensor& t : layout_.tensors) {
      if (t.is_parity()) {
        MEMENTO_CHECK(parities != nullptr && parities->count(t.parity) == 1);
        const std::vector<uint8_t>& p = parities->at(t.parity);
        MEMENTO_CHECK(p.size() == t.nbytes);
        std::memcpy(data + t.offset, p.data(), t.nbytes);
        continue;
      }
      auto bytes = TensorBytes(t.meta, rank_, step, salt);
      std::memcpy(data + t.offset, bytes.data() + t.range_offset, t.nbytes);
    }
    shm::ChunkEntry* table = shm::SlotTable(*segment_);
    for (size_t i = 0; i < layout_.chunks.size(); ++i) {
      table[i].checksum = Checksum(data + table[i].offset, table[i].length);
    }
    shm::CompleteSlotWrite(*segment_);
  }
  const shm::Segment& segment() const { return *segment_; }
  const shm::SlotLayout& layout() const { return layout_; }

  static std::vector<shm::SlotEntrySpec> WholeEntries(const std::vector<TensorMeta>& tensors) {
    std::vector<shm::SlotEntrySpec> out;
    for (const TensorMeta& t : tensors) out.push_back(shm::SlotEntrySpec{t});
    return out;
  }

 private:
  int rank_, slot_;
  shm::SlotLayout layout_;
  std::unique_ptr<shm::Segment> segment_;
};

// Writes `rank`'s T0 slot `slot` at `step` once.
inline void WriteRankSlot(shm::NodeStore& store, const topo::Inventory& inv, int rank, int slot,
                          int64_t step, uint64_t salt = 0) {
  SlotWriter(store, inv, rank, slot).Write(step, salt);
}

// The entries of a sharded slot of `rank` holding exactly the segments of
// `pieces` (plan piece ids), in the order given, one entry per segment.
inline std::vector<shm::SlotEntrySpec> PieceEntries(const topo::Plan& plan,
                                                    const topo::Inventory& inv, int rank,
                                                    const std::vector<uint32_t>& pieces) {
  std::vector<shm::SlotEntrySpec> out;
  for (uint32_t id : pieces) {
    for (const topo::Segment& s : plan.pieces[id].segments) {
      for (const TensorMeta& t : inv[rank]) {
        if (t.name == s.tensor) out.push_back(shm::SlotEntrySpec{t, s.offset, s.length});
      }
    }
  }
  return out;
}

// The bytes of plan piece `piece` at `step`.
inline std::vector<uint8_t> PieceBytes(const topo::Plan& plan, const topo::Inventory& inv,
                                       uint32_t piece, int64_t step, uint64_t salt = 0) {
  const topo::Piece& p = plan.pieces[piece];
  std::vector<uint8_t> out;
  for (const topo::Segment& s : p.segments) {
    for (const TensorMeta& t : inv[p.rank]) {
      if (t.name != s.tensor) continue;
      auto bytes = TensorBytes(t, p.rank, step, salt);
      out.insert(out.end(), bytes.begin() + s.offset, bytes.begin() + s.offset + s.length);
    }
  }
  EXPECT_EQ(out.size(), p.bytes);
  return out;
}

// A piece of `rank` whose segments span more than one tensor; kNoId if none.
inline uint32_t SpanningPiece(const topo::Plan& plan, int rank) {
  for (const topo::Piece& p : plan.pieces) {
    if (p.rank == rank && p.segments.size() > 1) return p.id;
  }
  return topo::kNoId;
}

}  // namespace memento::agent::testing
