// The fixed layout of one snapshot slot in shared memory (docs/node_store.md).
//
// A slot is one file under the node's root (rank<R>.slot<S>), mapped by the
// agent and by the rank's trainer:
//
//   [0, 4096)                 SlotHeader (this struct, zero padded)
//   [manifest_offset, +bytes) manifest: JSON list of the saved tensors
//   [table_offset, ...)       ChunkEntry[num_chunks]: offset, length, xxHash3
//   [data_offset, +data_bytes) the tensors' bytes, each at a 64-byte boundary
//
// The header's `state` word is written last, with release ordering: a slot
// whose state reads kComplete (acquire) has a header, manifest, table and data
// that were all written before it. The writer sets kWriting before it touches
// anything else. Every field but `state` is covered by header_checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace memento::shm {

inline constexpr uint64_t kSlotMagic = 0x31544f4c534d454dULL;  // "MEMSLOT1" (little endian)
inline constexpr uint32_t kSlotFormatVersion = 1;
inline constexpr size_t kSlotHeaderBytes = 4096;
inline constexpr size_t kSlotDataAlignment = 4096;
inline constexpr size_t kTensorAlignment = 64;
inline constexpr size_t kJobIdBytes = 64;
inline constexpr int kSlotsPerRank = 2;

// Numeric values are part of the format.
enum class SlotState : uint32_t {
  kEmpty = 0,     // never written (fresh file: all zero)
  kWriting = 1,   // a snapshot is being written (or was torn by a crash)
  kComplete = 2,  // node-local complete: every byte and checksum written
};

const char* SlotStateName(SlotState state);

struct SlotHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t header_bytes;     // kSlotHeaderBytes
  char job_id[kJobIdBytes];  // NUL padded
  int32_t rank;
  uint32_t slot_index;
  int64_t step;
  uint64_t generation;  // incremented by every write into this slot
  uint64_t manifest_offset;
  uint64_t manifest_bytes;
  uint64_t manifest_checksum;
  uint64_t table_offset;
  uint64_t num_chunks;
  uint64_t table_checksum;  // over ChunkEntry[num_chunks], checksums included
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t chunk_bytes;      // the largest chunk the writer produced
  int64_t begin_wall_ns;     // wall clock when the write began
  int64_t complete_wall_ns;  // wall clock when the write completed
  uint64_t reserved[8];      // zero; room for later fields (format version 1)
  uint64_t header_checksum;  // xxHash3 of bytes [0, offsetof(header_checksum))
  uint32_t state;            // SlotState; atomically accessed (acquire/release)
  uint32_t pad;
};
static_assert(std::is_trivially_copyable_v<SlotHeader>);
static_assert(std::is_standard_layout_v<SlotHeader>);
static_assert(sizeof(SlotHeader) == 272, "SlotHeader layout is part of the format");
static_assert(offsetof(SlotHeader, header_checksum) == 256);
static_assert(offsetof(SlotHeader, state) == 264);
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes);

// One chunk of the data region: a contiguous byte range of one tensor.
struct ChunkEntry {
  uint64_t offset;  // from data_offset
  uint64_t length;
  uint64_t checksum;  // xxHash3 of the chunk's bytes
  uint32_t tensor_index;
  uint32_t flags;  // 0
};
static_assert(std::is_trivially_copyable_v<ChunkEntry>);
static_assert(sizeof(ChunkEntry) == 32, "ChunkEntry layout is part of the format");

inline SlotState LoadState(const SlotHeader* h) {
  return static_cast<SlotState>(__atomic_load_n(&h->state, __ATOMIC_ACQUIRE));
}
inline void StoreState(SlotHeader* h, SlotState s) {
  __atomic_store_n(&h->state, static_cast<uint32_t>(s), __ATOMIC_RELEASE);
}

}  // namespace memento::shm
