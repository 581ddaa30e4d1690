// The fixed layout of one version file of the redundancy store (T1) in shared
// memory: <root>/red.<step, 20 digits>, mode 0600, owned by the agent.
//
//   [0, 4096)                     RedundancyHeader (zero padded)
//   [4096, 4096 + 48 * n)         RedundancyEntry[n]: kind, id, offset, bytes, xxh3, done
//   [data_offset, total_bytes)    the entries' bytes, each at a 64-byte boundary
//
// Protocol (the same idea as the T0 slots, shm/slot_format.h): the creator
// sets state kWriting before anything else, then writes the header fields and
// the table (every entry not done). Finishing an entry writes its xxh3, then
// its done word (release). When every entry is done the table checksum and the
// header checksum are sealed and the state word is set to kComplete LAST, with
// release ordering. A file whose state does not read kComplete (acquire) after
// a crash is torn and is removed when the store is opened again.
//
// Format 2 (written only when the file has one): an entry may be resident in
// T0 (flags bit kEntryResident; agent/resident.h). Its bytes are not in the
// file: `offset` holds the producer rank, `generation` the generation of that
// rank's T0 slot of the step when the entry was finished, `bytes` their size
// (`xxh3` is 0: the slot's chunk checksums cover them). Format-1 files are read as before; an older
// build refuses a format-2 file (version check) instead of misreading it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace memento::shm {

inline constexpr uint64_t kRedundancyMagic = 0x31304445524d454dULL;  // "MEMRED01" (little endian)
inline constexpr uint32_t kRedundancyFormatVersion = 1;
inline constexpr uint32_t kRedundancyFormatVersionResident = 2;  // has resident entries
inline constexpr uint32_t kEntryResident = 1;                    // RedundancyEntry::flags
inline constexpr size_t kRedundancyHeaderBytes = 4096;
inline constexpr size_t kRedundancyDataAlignment = 4096;  // start of the data region
inline constexpr size_t kRedundancyEntryAlignment = 64;   // each entry's bytes

// Numeric values are part of the format.
enum class RedundancyState : uint32_t { kEmpty = 0, kWriting = 1, kComplete = 2 };

struct RedundancyHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t header_bytes;  // kRedundancyHeaderBytes
  int64_t step;
  uint64_t plan_hash;  // recover::PlanHash of the plan the entries come from
  int32_t node;
  uint32_t num_entries;
  uint64_t table_offset;
  uint64_t table_checksum;  // xxHash3 over RedundancyEntry[num_entries], sealed at completion
  uint64_t data_offset;
  uint64_t total_bytes;  // file size the layout needs
  int64_t create_wall_ns;
  int64_t complete_wall_ns;
  uint64_t reserved[3];      // zero
  uint64_t header_checksum;  // xxHash3 of bytes [0, offsetof(header_checksum)), sealed last
  uint32_t state;            // RedundancyState; atomically accessed (acquire/release)
  uint32_t pad;
};
static_assert(std::is_trivially_copyable_v<RedundancyHeader>);
static_assert(std::is_standard_layout_v<RedundancyHeader>);
static_assert(sizeof(RedundancyHeader) == 128, "RedundancyHeader layout is part of the format");
static_assert(offsetof(RedundancyHeader, header_checksum) == 112);
static_assert(offsetof(RedundancyHeader, state) == 120);

struct RedundancyEntry {
  uint32_t kind;    // recover::SourceKind: 1 copy, 2 parity
  uint32_t id;      // plan Copy or Parity id
  uint64_t offset;  // from the file's start (not the data region), 64-byte aligned;
                    // resident: the producer rank
  uint64_t bytes;
  uint64_t xxh3;        // of the entry's bytes, written before `done`
  uint32_t done;        // 1 when finished; atomically accessed (release/acquire)
  uint32_t flags;       // kEntryResident (format 2), else 0
  uint64_t generation;  // resident: the producer's T0 slot generation; else 0
};
static_assert(std::is_trivially_copyable_v<RedundancyEntry>);
static_assert(sizeof(RedundancyEntry) == 48, "RedundancyEntry layout is part of the format");

inline RedundancyState LoadState(const RedundancyHeader* h) {
  return static_cast<RedundancyState>(__atomic_load_n(&h->state, __ATOMIC_ACQUIRE));
}
inline void StoreState(RedundancyHeader* h, RedundancyState s) {
  __atomic_store_n(&h->state, static_cast<uint32_t>(s), __ATOMIC_RELEASE);
}

}  // namespace memento::shm
