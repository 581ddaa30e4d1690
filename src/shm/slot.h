// Writing and reading one snapshot slot (format in slot_format.h, protocol and
// crash-consistency argument in docs/node_store.md).
//
// Writer (the trainer's client library):
//   SlotLayout layout = ComputeSlotLayout(...);       // once, at Seal()
//   BeginSlotWrite(segment, layout, step);            // state := kWriting, first
//   ... copy each chunk, table()[i].checksum = xxh3 ...
//   CompleteSlotWrite(segment);                       // state := kComplete, last
// Reader (restore, the agent's verifier, adoption after a restart):
//   ReadSlot(segment) -> SlotInfo (header, manifest, table checked)
//   VerifySlotData(segment, info) -> DataLoss naming the first bad chunk
//
// Thread safety: free functions over shared memory. One writer per slot at a
// time (the owning rank); any number of readers, which detect a concurrent
// write through the header's generation (see ReadSlot / SlotUnchanged).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"
#include "shm/segment.h"
#include "shm/slot_format.h"

namespace memento::shm {

// One manifest entry of a slot: a whole tensor, or a byte range (a piece) of
// one. `meta` is always the whole tensor's (name, dtype, shape, state class);
// the entry holds its bytes [range_offset, range_offset + nbytes). A whole
// tensor has range_offset 0 and nbytes == meta.nbytes() (the manifest then
// carries no "range", as format-1 slots did). Several entries may name one
// tensor with disjoint ranges (a sharded slot: docs/reft.md section 2).
//
// A parity entry (docs/reft.md section 4) holds no tensor's bytes: it is plan
// parity `parity` (topo::Parity::id), computed by the client's copy workers
// from the stripe's data blocks in registered memory. Its `meta` is a uint8
// tensor of the parity's byte count named ParityEntryName(id), whole; it is
// never found by FindRange nor compared with registered tensors, and its
// chunks carry checksums like every entry's.
inline constexpr uint32_t kNoParity = 0xffffffffu;
struct SavedTensor {
  TensorMeta meta;
  uint64_t offset = 0;          // from the data region's start
  uint64_t nbytes = 0;          // bytes this entry holds
  uint64_t range_offset = 0;    // where they start in the whole tensor
  uint32_t parity = kNoParity;  // a parity entry: the plan's parity id
  // Saved as a range of a sharded slot even where it covers the whole
  // tensor (a plan range that happens to be a whole tensor): the manifest
  // carries its "range", so the slot reads as a slot of pieces (a rank's
  // pieces may be whole tensors and still not be all of its state).
  bool ranged = false;

  bool is_parity() const { return parity != kNoParity; }
  bool whole() const { return range_offset == 0 && nbytes == meta.nbytes(); }
};

// "parity/<id>": the name a parity entry's meta carries (messages, inspect).
std::string ParityEntryName(uint32_t parity);
// The meta of a parity entry of `bytes` bytes (uint8, shape [bytes], private).
TensorMeta ParityEntryMeta(uint32_t parity, uint64_t bytes);
// The index of the parity entry of plan parity `parity`, or -1.
int FindParityEntry(const std::vector<SavedTensor>& entries, uint32_t parity);

// "'w'" for a whole tensor, "'w' bytes [O, O+L)" for a range entry (messages).
std::string EntryName(const SavedTensor& t);

// What a slot writer asks to save: a tensor, whole (length kWholeTensor) or
// its bytes [offset, offset + length).
inline constexpr uint64_t kWholeTensor = ~uint64_t{0};
// A parity entry: `parity` set, `meta` = ParityEntryMeta(parity, bytes),
// whole.
struct SlotEntrySpec {
  TensorMeta meta;
  uint64_t offset = 0;
  uint64_t length = kWholeTensor;
  uint32_t parity = kNoParity;
};

// Where everything of one rank's state goes in a slot. A pure function of the
// registered tensors and the chunk size.
struct SlotLayout {
  std::string job_id;
  int rank = 0;
  std::vector<SavedTensor> tensors;
  std::string manifest;            // JSON text
  std::vector<ChunkEntry> chunks;  // checksums zero
  uint64_t chunk_bytes = 0;
  uint64_t manifest_offset = 0;
  uint64_t table_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
  uint64_t total_bytes = 0;  // the segment size this layout needs
};

// REQUIRES: chunk_bytes > 0. InvalidArgument for a bad job id or duplicate names.
Result<SlotLayout> ComputeSlotLayout(const std::string& job_id, int rank,
                                     const std::vector<TensorMeta>& tensors, uint64_t chunk_bytes);

// Entries may be ranges of a tensor (SlotEntrySpec): each gets its own
// 64-byte aligned place and its own chunks, so every byte is checksummed as
// for whole tensors. A range equal to the whole tensor holds the whole
// tensor and stays a range entry (SavedTensor::ranged).
// InvalidArgument for a bad job id, a range outside its tensor or of zero
// bytes, entries of one name that disagree in dtype, shape or state class,
// or overlapping ranges of one tensor (a whole entry overlaps everything).
Result<SlotLayout> ComputeRangeSlotLayout(const std::string& job_id, int rank,
                                          const std::vector<SlotEntrySpec>& entries,
                                          uint64_t chunk_bytes);

// Manifest "format" 1 when every entry is a whole tensor (byte-identical to
// older builds), 2 when some entry is a range ("range": {"offset", "length"};
// also a plan range that covers its whole tensor, SavedTensor::ranged),
// 3 when some entry is a parity ("parity": {"id": P}).
std::string EncodeManifest(const std::vector<SavedTensor>& tensors);
// DataLoss when the text is not a manifest.
Result<std::vector<SavedTensor>> ParseManifest(std::string_view text);

// Every difference between the saved tensors and the registered ones, one line
// each ("tensor 'w': shape [4, 4] saved, [4, 8] registered"). Empty when they
// match in names, dtypes and shapes.
std::vector<std::string> DiffTensors(const std::vector<SavedTensor>& saved,
                                     const std::vector<TensorMeta>& registered);

// ---- Finding a tensor's bytes in a slot ------------------------------------
//
// The one lookup every reader of a slot's bytes uses (the T1 producer, the
// piece reader serving peers and recovery, the durable tier), for whole and
// range entries alike. Tested in slot_test (FindRangeTest).

// A run of consecutive bytes of one tensor held by one entry.
struct SlotRun {
  size_t entry = 0;          // index into the entry list (SlotInfo::tensors)
  uint64_t data_offset = 0;  // from the data region's start
  uint64_t length = 0;
};
// Where bytes [offset, offset + length) of tensor `tensor` lie in the data
// region: one run per entry they fall in, in tensor order (a request that
// spans two entries holding adjacent ranges gets two runs). NotFound naming
// the tensor, the range, and what the slot holds of that tensor when some
// byte is in no entry (or the tensor is not in the slot at all). A
// zero-length request gives no runs.
[[nodiscard]] Result<std::vector<SlotRun>> FindRange(const std::vector<SavedTensor>& entries,
                                                     std::string_view tensor, uint64_t offset,
                                                     uint64_t length);

// Marks the slot kWriting (before anything else), then writes the header's
// layout fields, the manifest and an empty chunk table. REQUIRES:
// segment.size() >= layout.total_bytes; no other writer.
void BeginSlotWrite(const Segment& segment, const SlotLayout& layout, int slot_index, int64_t step);
// The chunk table and data region of a slot being written.
ChunkEntry* SlotTable(const Segment& segment);
uint8_t* SlotData(const Segment& segment);
// Seals the table and header checksums and sets kComplete with release
// ordering. REQUIRES: every chunk's bytes and checksum written.
void CompleteSlotWrite(const Segment& segment);

// What a reader learned from a slot's header.
struct SlotInfo {
  SlotState state = SlotState::kEmpty;
  int64_t step = -1;
  uint64_t generation = 0;
  int rank = -1;
  int slot_index = -1;
  std::string job_id;
  uint64_t data_bytes = 0;
  int64_t complete_wall_ns = 0;
  std::vector<SavedTensor> tensors;
  std::vector<ChunkEntry> chunks;  // a copy of the table
  uint64_t data_offset = 0;
};

// FindRange over a slot read with ReadSlot.
[[nodiscard]] inline Result<std::vector<SlotRun>> FindRange(const SlotInfo& info,
                                                            std::string_view tensor,
                                                            uint64_t offset, uint64_t length) {
  return FindRange(info.tensors, tensor, offset, length);
}
// True when some entry of the slot is a range or a parity (a sharded slot);
// a whole tensor saved as a plan range (SavedTensor::ranged) counts as a range.
bool HasRangeEntries(const std::vector<SavedTensor>& entries);

// Reads and checks a slot's header, manifest and chunk table. Returns the
// state for kEmpty/kWriting slots without further checks. For kComplete:
// DataLoss when a magic, version, bound or checksum is wrong (a torn or
// corrupted header).
Result<SlotInfo> ReadSlot(const Segment& segment);
// Checks every chunk's checksum. DataLoss naming the chunk and tensor.
Status VerifySlotData(const Segment& segment, const SlotInfo& info);
// Checks every chunk's checksum like VerifySlotData, for a background reader
// that must not compete with training (the agent's scrub): the data is hashed
// in pieces of at most `piece_bytes`, and `pace(n)` is called before each
// piece of n bytes (it may sleep to hold a rate). A `pace` that returns false
// stops the check: Aborted. REQUIRES: piece_bytes > 0.
Status VerifySlotDataPaced(const Segment& segment, const SlotInfo& info, uint64_t piece_bytes,
                           const std::function<bool(uint64_t)>& pace);
// True when the slot still holds the version `info` was read from (no writer
// started since): a seqlock-style re-check after reading data.
bool SlotUnchanged(const Segment& segment, const SlotInfo& info);
// The live state and generation of a slot (a seqlock reader's first load).
void LoadSlotVersion(const Segment& segment, SlotState* state, uint64_t* generation);

// ---- Finding a rank's slot --------------------------------------------------
//
// A rank owns kSlotsPerRank slots. These are the one way to ask which of them
// holds a step (tested in src/shm/slot_test.cc, FindSlotTest).

// A rank's slots by slot index; nullptr where a slot is not mapped or absent.
using RankSlots = std::array<const Segment*, kSlotsPerRank>;

struct CompleteSlot {
  int slot = -1;  // index into RankSlots
  SlotInfo info;  // ReadSlot's answer, state kComplete
};

// The slot that holds `step` complete. A slot counts only when ReadSlot
// accepts its header, manifest and table with state kComplete and this step,
// and the slot is unchanged after that read (SlotUnchanged: no writer started
// meanwhile). So a torn write (kWriting), a corrupt header, an older or newer
// step, or a slot being rewritten never counts. Slots are tried in index
// order; the first that counts wins. NotFound naming the step and what each
// slot held otherwise. Does not check the data's checksums (VerifySlotData).
[[nodiscard]] Result<CompleteSlot> FindCompleteSlot(const RankSlots& slots, int64_t step);
// The slot holding the newest complete step, by the same rules (on a tie, the
// lower index). NotFound when no slot holds a complete step.
[[nodiscard]] Result<CompleteSlot> FindNewestCompleteSlot(const RankSlots& slots);

// A slot header's state, step and generation as they are now, without any
// checksum: a hint for polling and display, or for the slot's only writer.
// Anything else confirms with FindCompleteSlot / ReadSlot.
struct SlotPeek {
  SlotState state = SlotState::kEmpty;
  int64_t step = -1;
  uint64_t generation = 0;
};
// kEmpty / -1 for a segment shorter than a header.
SlotPeek PeekSlot(const Segment& segment);
// From a slot file by pread, without mapping it: kEmpty / -1 when the file is
// missing or shorter than a header.
SlotPeek PeekSlotFile(const std::string& path);

}  // namespace memento::shm
