// Reads plan pieces out of the node's T0 slots (the rank's registered state,
// whole tensors or the ranges of them a sharded slot holds, written by the
// trainer's client), for the peer service and for the node's own recovery
// reads. Every byte is located with shm::FindRange. docs/cluster.md,
// "Recovery".
//
// A piece is the concatenation of its segments (tensor, offset, length) of
// the piece's rank. The reader finds that rank's slot whose header says
// complete at the asked step, copies the bytes, verifies the checksums of the
// chunks the bytes lie in (once per chunk per slot generation, then cached),
// and re-checks the slot's generation afterwards (shm::SlotUnchanged): a
// trainer that started overwriting the slot meanwhile gives Aborted, never
// torn bytes.
//
// Thread safety: thread-safe. The slot files are mapped read-only, once per
// (rank, slot) and again when the file grows; one mutex guards the cache and
// checksums run outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "memento/status.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "topo/plan.h"

namespace memento::agent {

class PieceReader {
 public:
  // `root`: the node store's root (slot files rank<R>.slot<S>). `job_id`:
  // slots of another job are never served ("" accepts any).
  // `store` (optional, outliving the reader): the agent's node store, whose
  // mappings of the slots are used when they map the slot file as it is now
  // (same size), instead of a second mapping of every page (MAP_POPULATE of a
  // 1 GiB slot is about 0.05 CPU-s on this project's VMs, docs/benchmarks.md
  // "Fifth pass").
  PieceReader(std::string root, std::string job_id, shm::NodeStore* store = nullptr)
      : root_(std::move(root)), job_id_(std::move(job_id)), store_(store) {}

  // Copies bytes [offset, offset + length) of plan piece `piece` of version
  // `step` into dst. NotFound when the piece's rank has no complete slot of
  // `step` here (or the slot lacks a segment's tensor), InvalidArgument for a
  // range past the piece or an unknown piece id, DataLoss naming the chunk
  // and tensor when a checksum fails, Aborted when the slot was overwritten
  // while it was read.
  [[nodiscard]] Status ReadPiece(const topo::Plan& plan, uint32_t piece, int64_t step,
                                 uint64_t offset, uint64_t length, void* dst) EXCLUDES(mu_);

  // Serves bytes [offset, offset + length) of piece `piece` of version `step`
  // straight from the slot mapping (no copy), for a zero-copy send: calls
  // emit(data, len, digest) for consecutive sub-ranges that never cross a
  // chunk of the slot, each with the xxHash3 of its bytes. A sub-range that
  // is a whole chunk carries the chunk table's checksum (the one the
  // trainer's copy computed; the bytes are not read here, the receiver
  // checks them against it); a partial chunk is verified against the table
  // first and its digest computed. After the last emit the slot's generation
  // is re-checked: Aborted when a writer started meanwhile (the bytes emitted
  // may be torn and must be discarded). The same errors as ReadPiece
  // otherwise; an error from emit is returned as is.
  using EmitFn = std::function<Status(const uint8_t* data, uint64_t len, uint64_t digest)>;
  [[nodiscard]] Status ServePiece(const topo::Plan& plan, uint32_t piece, int64_t step,
                                  uint64_t offset, uint64_t length, const EmitFn& emit)
      EXCLUDES(mu_);

  // Bytes [offset, offset + length) of tensor `tensor` of `rank`'s slot of
  // `step` (the same checks as ReadPiece; NotFound naming the range when the
  // slot does not hold all of those bytes).
  [[nodiscard]] Status ReadTensorRange(int rank, int64_t step, const std::string& tensor,
                                       uint64_t offset, uint64_t length, void* dst) EXCLUDES(mu_);

  // Bytes of a T1 entry resident in T0 (agent/resident.h): the concatenation
  // of `segments` of `rank`'s slot of `step`, or (`parity` set) the slot's
  // parity entry of that plan parity (shm::FindParityEntry), which must hold
  // `parity_bytes` bytes (else NotFound) or, when the slot has no such entry
  // and `segments` is not empty (a parity equal to its one data block), the
  // segments followed by zeros up to `parity_bytes`; `what` names it in
  // errors.
  // `generation` (non-zero) must be the slot's generation: the slot was not
  // rewritten since the entry was made (else NotFound: the bytes are gone,
  // never another version's). The same checks as ReadPiece otherwise.
  struct SegmentsRef {
    int rank = -1;
    int64_t step = -1;
    uint64_t generation = 0;  // 0: any
    const std::vector<topo::Segment>* segments = nullptr;
    uint32_t parity = shm::kNoParity;
    uint64_t parity_bytes = 0;
    std::string what;  // "copy 3 (piece sg0/r1)"
  };
  [[nodiscard]] Status ReadSegments(const SegmentsRef& ref, uint64_t offset, uint64_t length,
                                    void* dst) EXCLUDES(mu_);
  // ServePiece for such bytes.
  [[nodiscard]] Status ServeSegments(const SegmentsRef& ref, uint64_t offset, uint64_t length,
                                     const EmitFn& emit) EXCLUDES(mu_);
  // OK while `rank`'s slot of `step` still holds the bytes (complete, the
  // generation, every segment present); with `verify`, every chunk the bytes
  // lie in is hashed now. NotFound / DataLoss / Aborted as ReadSegments.
  [[nodiscard]] Status CheckSegments(const SegmentsRef& ref, bool verify) EXCLUDES(mu_);

  // Called by ServePiece / ServeSegments after each whole chunk they emitted
  // with the table's checksum as its digest (the receiver checks those bytes
  // against it, so the sender need not): the slot's rank, step, generation
  // and the chunk's index in its table. The recovery's deferred verification
  // (PeerService, kPeerVerifyKept) counts such chunks as checked. Runs on
  // the serving thread; null (the default) for none.
  using WholeChunkFn =
      std::function<void(int rank, int64_t step, uint64_t generation, size_t chunk)>;
  void SetWholeChunkObserver(WholeChunkFn fn) EXCLUDES(mu_);

 private:
  struct SlotCache {
    std::shared_ptr<shm::Segment> segment;
    uint64_t generation = 0;
    bool have_info = false;
    shm::SlotInfo info;
    std::vector<size_t> chunk_order;  // chunk indices sorted by data offset
    std::vector<uint8_t> verified;    // per chunk, this generation: 0 no, 1 good
  };
  // The cache entry of `rank`'s slot holding `step` complete; NotFound if none.
  Result<std::shared_ptr<SlotCache>> FindSlot(int rank, int64_t step) EXCLUDES(mu_);
  Result<std::shared_ptr<SlotCache>> Load(int rank, int slot) EXCLUDES(mu_);
  // Verifies the chunks covering data-region bytes [begin, end) of tensor ti
  // (chunks verified before in this generation are skipped unless `force`).
  Status VerifyRange(SlotCache& c, size_t ti, uint64_t begin, uint64_t end, bool force = false)
      EXCLUDES(mu_);
  // Piece bytes [offset, offset + length) as data-region ranges of `c`.
  struct RangeCopy {
    size_t tensor = 0;
    uint64_t begin = 0;  // in the data region
    uint64_t length = 0;
    bool zeros = false;  // `length` zero bytes, not in the slot (a parity's padding)
  };
  Result<std::vector<RangeCopy>> MapPiece(const topo::Plan& plan, uint32_t piece, int64_t step,
                                          const SlotCache& c, uint64_t offset, uint64_t length);
  // The same for any segments of `c`'s rank (`label` names them in errors).
  static Result<std::vector<RangeCopy>> MapSegments(const std::vector<topo::Segment>& segments,
                                                    const std::string& label, const SlotCache& c,
                                                    uint64_t offset, uint64_t length);
  // The slot of a SegmentsRef (generation checked) and its ranges.
  Result<std::shared_ptr<SlotCache>> FindRefSlot(const SegmentsRef& ref) EXCLUDES(mu_);
  // Bytes [offset, offset + length) of a SegmentsRef as data-region ranges
  // of `c` (its segments, or its parity entry).
  static Result<std::vector<RangeCopy>> MapRef(const SegmentsRef& ref, const SlotCache& c,
                                               uint64_t offset, uint64_t length);
  static uint64_t RefBytes(const SegmentsRef& ref);
  // Copies ranges of `c` to dst, verifying their chunks, then re-checks the generation.
  Status CopyRanges(SlotCache& c, const std::vector<RangeCopy>& copies, void* dst,
                    const std::string& what) EXCLUDES(mu_);
  // Emits ranges of `c` chunk by chunk with digests (ServePiece's loop).
  Status EmitRanges(SlotCache& c, const std::vector<RangeCopy>& copies, const EmitFn& emit,
                    const std::string& what) EXCLUDES(mu_);

  const std::string root_;
  const std::string job_id_;
  shm::NodeStore* const store_;
  Mutex mu_;
  std::map<std::pair<int, int>, std::shared_ptr<SlotCache>> slots_ GUARDED_BY(mu_);
  std::shared_ptr<const WholeChunkFn> on_whole_chunk_ GUARDED_BY(mu_);
};

// Which of `ranks` hold version `step` in T0 on this node: slot complete at
// `step`; with `verify`, also every chunk checksum verified now
// (NodeStore::Verify on every candidate slot, whatever an earlier verification
// of the same generation found: bytes can be corrupted at rest after it).
// Without `verify`, a slot is excluded only when a verification found it
// corrupt. Sorted.
std::vector<int> RanksHolding(shm::NodeStore& store, const std::vector<int>& ranks, int64_t step,
                              bool verify);

// Every step held complete by at least one rank of the store, with the ranks
// (verified as above when `verify`), newest first.
std::vector<std::pair<int64_t, std::vector<int>>> T0Holdings(shm::NodeStore& store, bool verify);

}  // namespace memento::agent
