// A shared-memory segment: one file under the node's root, mapped MAP_SHARED.
//
// Pages are allocated once (fallocate) when the segment is created or grown,
// and populated for writing, so the save path never takes a page fault that
// allocates memory (first touch of tmpfs pages runs ~50x slower than a warm
// copy).
//
// Huge pages (docs/node_store.md, "Huge pages"): every mapping starts at a
// 2 MiB boundary, and a segment created or grown to at least 2 MiB has its
// pages collapsed into 2 MiB transparent huge pages (MADV_COLLAPSE, kernel
// 6.1+), whatever the tmpfs' huge= mount option. The pages belong to the
// file, so every later mapping (a restarted trainer, the agent) maps them
// with one entry per 2 MiB instead of 512: on virtual machines with shadow
// paging, where the first access to every page of a new mapping exits to
// the hypervisor, that is what a restart costs. Best effort: where the
// kernel refuses (shmem_enabled=deny, no contiguous memory) the pages stay
// 4 KiB and everything works as before. SetHugePagesWanted(false) (the
// agent's MEMENTO_SHM_HUGE_PAGES=off) turns the collapse off (comparisons).
//
// Thread safety: a Segment is immutable after creation except Grow(), which
// requires exclusive access. The mapped bytes are shared with other processes
// and synchronised by the slot protocol (slot_format.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "memento/status.h"

namespace memento::shm {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates `path` (mode 0600) or opens an existing one, makes it at least
  // `min_bytes` long (never shrinks it), allocates its pages (in huge pages
  // where it can, see above) and maps it read-write. ResourceExhausted when
  // the filesystem is full.
  static Result<std::unique_ptr<Segment>> CreateOrGrow(const std::string& path, size_t min_bytes);
  // Maps an existing segment. NotFound when it does not exist. `prefault`
  // (writers that must not fault later) touches every page of the new
  // mapping once so that no access on the save path faults, in the guest or
  // in a hypervisor's shadow page tables (~2.6 to 9 us per 4 KiB page on the
  // VMs we measured); without it, see TouchPages. `populate` = false maps
  // nothing yet (the caller populates and touches the pages itself, e.g. in
  // the background: the client after a restart).
  static Result<std::unique_ptr<Segment>> Open(const std::string& path, bool writable,
                                               bool prefault = false, bool populate = true);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether this mapping may be written (CreateOrGrow, Open(writable)).
  bool writable() const { return writable_; }

 private:
  Segment(std::string path, int fd, uint8_t* data, size_t size, bool writable)
      : path_(std::move(path)), fd_(fd), data_(data), size_(size), writable_(writable) {}
  std::string path_;
  int fd_;
  uint8_t* data_;
  size_t size_;
  bool writable_;
};

// Touches every page of [p, p + n) of a writable shared mapping once, with
// an atomic add of zero per page: the page is mapped writable in this
// process (and in a hypervisor's shadow tables) without changing a byte,
// and without losing a store another thread or process makes to it at the
// same time. `p` need not be page aligned.
void TouchPages(uint8_t* p, size_t n);

// MADV_POPULATE_WRITE of [p, p + n) (p page aligned): allocates and maps the
// pages writable in the guest kernel. Best effort.
void PopulateWritable(uint8_t* p, size_t n);

// Whether new segments are collapsed into huge pages: true unless
// SetHugePagesWanted(false). A process-wide setting, set once by the
// process's edge (`memento` from MEMENTO_SHM_HUGE_PAGES=off or 0,
// tools/environment.cc) or by a test, before segments are made.
bool HugePagesWanted();
void SetHugePagesWanted(bool wanted);

// The pages this process maps from files whose path starts with
// `path_prefix` (from /proc/self/smaps): resident bytes and the part of them
// mapped as 2 MiB pages (ShmemPmdMapped + FilePmdMapped).
struct MappedPages {
  uint64_t rss_bytes = 0;
  uint64_t huge_bytes = 0;
};
MappedPages MappedPagesOf(const std::string& path_prefix);

// The huge= option of the tmpfs holding `path` ("never" when absent, "" when
// `path` is not on a tmpfs) and the kernel's shmem THP setting
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled, the bracketed word).
std::string TmpfsHugeOption(const std::string& path);
std::string ShmemThpSetting();

// Bytes `size` rounded up to a multiple of `align` (a power of two).
inline constexpr uint64_t AlignUp(uint64_t size, uint64_t align) {
  return (size + align - 1) & ~(align - 1);
}

}  // namespace memento::shm
