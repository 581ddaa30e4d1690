// A shared-memory segment: one file under the node's root, mapped MAP_SHARED.
//
// Pages are allocated once (fallocate) when the segment is created or grown,
// and mapped with MAP_POPULATE, so the save path never takes a page fault
// that allocates memory (first touch of tmpfs pages runs ~50x slower than a
// warm copy).
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

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates `path` (mode 0600) or opens an existing one, makes it at least
  // `min_bytes` long (never shrinks it), allocates its pages and maps it
  // read-write. ResourceExhausted when the filesystem is full.
  static Result<std::unique_ptr<Segment>> CreateOrGrow(const std::string& path, size_t min_bytes);
  // Maps an existing segment. NotFound when it does not exist. `prefault`
  // (writers: the trainer's client at Seal) touches every page of the new
  // mapping once so that no access on the save path faults, in the guest or
  // in a hypervisor's shadow page tables (~9 us per page on the VMs we
  // measured).
  static Result<std::unique_ptr<Segment>> Open(const std::string& path, bool writable,
                                               bool prefault = false);

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

// Bytes `size` rounded up to a multiple of `align` (a power of two).
inline constexpr uint64_t AlignUp(uint64_t size, uint64_t align) {
  return (size + align - 1) & ~(align - 1);
}

}  // namespace memento::shm
