#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/log.h"

namespace memento::shm {

Segment::~Segment() {
  if (data_ != nullptr && size_ > 0) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// MAP_POPULATE maps the pages of a shared mapping read-only, and tmpfs
// fallocate reserves pages without clearing them: MADV_POPULATE_WRITE
// allocates, clears and maps them writable in the guest kernel. A writable
// mapping is therefore not mapped with MAP_POPULATE first (that read-only
// pass would only be redone: measured 0.4-0.7 s more per 256 MB on the
// shadow-paging VM). False when the kernel lacks MADV_POPULATE_WRITE
// (before 5.14).
bool PopulateWritable(uint8_t* p, size_t size) {
  return madvise(p, size, MADV_POPULATE_WRITE) == 0;
}

// On virtual machines with shadow paging the first access to every page of a
// *mapping* still exits to the hypervisor (measured: ~9 us per 4 KiB page,
// ~0.4 GB/s, against ~10 GB/s for a warm copy), whatever the guest kernel
// did, and only a write makes later writes fast. So a writer touches every
// page of its own mapping once, with a write of the value already there.
void TouchPages(uint8_t* p, size_t size) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t off = 0; off < size; off += page) {
    auto* v = reinterpret_cast<volatile uint8_t*>(p + off);
    *v = *v;
  }
}

Result<uint8_t*> MapFd(int fd, size_t size, bool writable, bool touch, const std::string& path) {
  if (size == 0) return static_cast<uint8_t*>(nullptr);
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* p = mmap(nullptr, size, prot, MAP_SHARED | (writable ? 0 : MAP_POPULATE), fd, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap " + path, errno);
  // Transparent huge pages for shmem where the kernel allows them (fewer TLB
  // misses on the copy path); harmless where it does not.
  madvise(p, size, MADV_HUGEPAGE);
  // Without MADV_POPULATE_WRITE, a writer touches every page instead (the
  // same effect: nothing on the save path faults).
  if (writable && (!PopulateWritable(static_cast<uint8_t*>(p), size) || touch)) {
    TouchPages(static_cast<uint8_t*>(p), size);
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

Result<std::unique_ptr<Segment>> Segment::CreateOrGrow(const std::string& path, size_t min_bytes) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoError("open segment " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("fstat " + path, err);
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return PermissionDeniedError("segment " + path + " belongs to uid " +
                                 std::to_string(st.st_uid) + ", not to this process's uid " +
                                 std::to_string(geteuid()));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < min_bytes) {
    // posix_fallocate allocates the pages now (zeroed), so nobody faults them
    // later on the save path; ENOSPC here is the honest "shm is full".
    int err = posix_fallocate(fd, 0, static_cast<off_t>(min_bytes));
    if (err != 0) {
      if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        MEMENTO_LOG_WARN("could not shrink {} back after a failed allocation", path);
      }
      close(fd);
      if (err == ENOSPC) {
        return ResourceExhaustedError("allocating " + std::to_string(min_bytes) +
                                      " bytes for segment " + path +
                                      ": the shared-memory filesystem is full");
      }
      return ErrnoError("posix_fallocate " + path, err);
    }
    size = min_bytes;
  }
  fchmod(fd, 0600);
  auto mapped = MapFd(fd, size, /*writable=*/true, /*touch=*/false, path);
  if (!mapped.ok()) {
    close(fd);
    return mapped.status();
  }
  uint8_t* p = *mapped;
  return std::unique_ptr<Segment>(new Segment(path, fd, p, size, /*writable=*/true));
}

Result<std::unique_ptr<Segment>> Segment::Open(const std::string& path, bool writable,
                                               bool prefault) {
  int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError("open segment " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("fstat " + path, err);
  }
  auto mapped = MapFd(fd, static_cast<size_t>(st.st_size), writable, prefault, path);
  if (!mapped.ok()) {
    close(fd);
    return mapped.status();
  }
  return std::unique_ptr<Segment>(
      new Segment(path, fd, *mapped, static_cast<size_t>(st.st_size), writable));
}

}  // namespace memento::shm
