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

Result<uint8_t*> MapFd(int fd, size_t size, bool writable, const std::string& path) {
  if (size == 0) return static_cast<uint8_t*>(nullptr);
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* p = mmap(nullptr, size, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap " + path, errno);
  // Transparent huge pages for shmem where the kernel allows them (fewer TLB
  // misses on the copy path); harmless where it does not.
  madvise(p, size, MADV_HUGEPAGE);
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
  auto mapped = MapFd(fd, size, /*writable=*/true, path);
  if (!mapped.ok()) {
    close(fd);
    return mapped.status();
  }
  return std::unique_ptr<Segment>(new Segment(path, fd, *mapped, size));
}

Result<std::unique_ptr<Segment>> Segment::Open(const std::string& path, bool writable) {
  int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError("open segment " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("fstat " + path, err);
  }
  auto mapped = MapFd(fd, static_cast<size_t>(st.st_size), writable, path);
  if (!mapped.ok()) {
    close(fd);
    return mapped.status();
  }
  return std::unique_ptr<Segment>(new Segment(path, fd, *mapped, static_cast<size_t>(st.st_size)));
}

}  // namespace memento::shm
