// The steps of the recovery executor (ExecuteAssembliesWithOptions in
// recipe.h), each with its inputs and outputs, in the order executor.cc runs
// them (docs/recovery.md, "Executor"):
//
//   ParseAssemblies    recipes checked against the plan, slot layouts and the
//                      extents of every piece in its rank's slot; no slot
//                      touched yet (executor_recipe.cc)
//   OpenSlots          the slot of each rank to rebuild chosen, allocated and
//                      marked kWriting (executor_slots.cc)
//   PlanTransfers      the units of parallel work (read windows first, then
//                      decode windows) and the pieces copied slot to slot
//                      (executor_transfer.cc)
//   Transfers          decoders, then every unit run on worker threads:
//                      reads straight into the slots, decodes from fetched
//                      or local inputs (executor_transfer.cc)
//   CopySharedPieces   pieces fetched once for several ranks, slot to slot
//   FillChecksums      every chunk checksum: from arrival digests, from the
//                      decode units, or hashed now (executor_slots.cc)
//   PublishSlots       each slot completed, then verified (or left staged)
//
// Internal to src/recover. Thread safety: ParallelFor and Transfers::Run use
// worker threads as documented; the rest runs on the caller's thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "memento/status.h"
#include "recover/recipe.h"
#include "recover/recover.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::recover::internal {

// A contiguous range of a piece and where it lives in the slot's data region.
struct Extent {
  uint64_t piece_offset;
  uint64_t slot_offset;
  uint64_t length;
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
  bool SlotOf(uint32_t piece, uint64_t off, uint64_t* slot, uint64_t* extent_end) const;
  // The first chunk boundary (a chunk's start or end) after slot offset `at`;
  // UINT64_MAX when none.
  uint64_t NextChunkBoundary(uint64_t at) const;
  // Where piece bytes [off, off + n) lie in the slot when they are
  // contiguous there (inside one extent); null otherwise.
  uint8_t* InSlot(uint32_t piece, uint64_t off, uint64_t n) const;
  // Copies piece bytes [off, off + n) out of the slot.
  void CopyOut(uint32_t piece, uint64_t off, uint64_t n, uint8_t* dst) const;
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

// A piece fetched once into the slot of todo[from] and copied to todo[to].
struct LocalCopy {
  size_t from, to;
  uint32_t piece;
};

// What PlanTransfers decides.
struct TransferPlan {
  std::vector<Unit> units;  // read units first, decode units after
  std::vector<LocalCopy> local_copies;
  std::map<uint32_t, size_t> read_by;  // piece -> todo index whose slot a kRead fills
};

// What the worker threads of Transfers::Run did, summed.
struct TransferTotals {
  double transfer_s = 0, decode_s = 0, write_s = 0;
  uint64_t read_bytes = 0;
  uint64_t local_bytes = 0;  // decode inputs taken from this node's slots
};

// How FillChecksums obtained the chunk checksums.
struct ChecksumCounts {
  uint64_t from_digests = 0;  // arrival digests
  uint64_t at_decode = 0;     // hashed by the decode units
  uint64_t hashed = 0;        // hashed by FillChecksums
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

// "piece 3 bytes [a, b) on node n at step s", for error messages.
std::string Describe(const SourceRange& r, int64_t step);

// Step 1. Parses and checks every assembly (all for `node` at `step`) before
// any slot is touched: each recipe against the plan, each rank's slot layout
// from `inventory`, and the extents of every piece of it in the slot. With
// options.stage_path, also that the rank's pieces tile its tensors.
// InvalidArgument (or FailedPrecondition from the tiling) naming the rank.
[[nodiscard]] Result<std::vector<RankJob>> ParseAssemblies(
    const topo::Plan& plan, const topo::Inventory& inventory, const std::string& job_id,
    int64_t step, int node, const std::vector<RankAssembly>& assemblies,
    const ExecuteOptions& options);

// Step 2. Chooses and allocates the slot of every job first (an allocation
// failure leaves every slot as it was), then marks them kWriting (a crash or
// an error from here on leaves them not complete) and sets up each job's
// data pointer and chunk tables. Returns the jobs to rebuild (pointers into
// `jobs`): a rank whose slot already holds `step` intact is left out. With
// options.stage_path, a fresh file per rank instead of a store slot.
[[nodiscard]] Result<std::vector<RankJob*>> OpenSlots(std::vector<RankJob>& jobs,
                                                      shm::NodeStore& store, int64_t step,
                                                      const ExecuteOptions& options);

// Step 3. Units of work over every rank: reads and decodes in windows (a
// decode window ends at a chunk boundary when one falls inside it). A piece
// that several ranks here need is fetched once, into the first rank's slot,
// and copied to the others afterwards (local_copies).
TransferPlan PlanTransfers(const std::vector<RankJob*>& todo, const ExecuteOptions& options);

// Step 4. Runs the units of a TransferPlan on options.threads workers: reads
// through `reader` straight into the slots (taking arrival digests as chunk
// checksums), decodes into the slots (hashing the whole chunks it wrote).
// A decode input that is a piece this node reads whole waits for that read
// and is taken from the slot. Not thread-safe itself; one Run per instance.
class Transfers {
 public:
  Transfers(const topo::Plan& plan, const std::vector<RankJob*>& todo, const TransferPlan& units,
            ByteReader& reader, Deadline deadline, const ExecuteOptions& options);
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // One decoder per decoded block, made up front (immutable, shared by the
  // workers); the codec's error for a stripe it cannot decode.
  [[nodiscard]] Status MakeDecoders();
  // Every unit; the first error stops the rest (the slots stay kWriting).
  [[nodiscard]] Status Run();
  // What the workers did (also after a failed Run).
  TransferTotals Totals() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Step 5. Copies each of `copies` slot to slot, on `threads` workers.
[[nodiscard]] Status CopySharedPieces(const std::vector<RankJob*>& todo,
                                      const std::vector<LocalCopy>& copies, int threads);

// Step 6. Writes every chunk checksum into each slot's table: from an arrival
// digest, from a decode unit, or hashed now (in parallel).
[[nodiscard]] Result<ChecksumCounts> FillChecksums(const std::vector<RankJob*>& todo, int threads);

// Step 7. Marks each slot complete (options.before_complete runs just
// before), then verifies it in the store (chunks checked on arrival skipped
// when options.trust_arrival_digests); a staged slot is not verified (its
// reader does). Adds each rank's bytes and number to `stats`. The error of
// the first slot that does not verify, naming the rank and slot.
[[nodiscard]] Status PublishSlots(const std::vector<RankJob*>& todo, shm::NodeStore& store,
                                  int64_t step, const ExecuteOptions& options,
                                  AssemblyStats* stats);

}  // namespace memento::recover::internal
