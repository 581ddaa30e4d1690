#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "fmt/format.h"

namespace memento::shm {

Segment::~Segment() {
  if (data_ != nullptr && size_ > 0) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

void TouchPages(uint8_t* p, size_t n) {
  if (n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + n;
  // One byte of every page the range overlaps: its first byte in the range.
  for (uintptr_t a = begin; a < end; a = (a & ~(page - 1)) + page) {
    // A locked add of zero: a write access for the MMU (and a hypervisor),
    // atomic against any concurrent store, so no byte can change.
    __atomic_fetch_add(reinterpret_cast<uint8_t*>(a), uint8_t{0}, __ATOMIC_RELAXED);
  }
}

// MAP_POPULATE maps the pages of a shared mapping read-only, and tmpfs
// fallocate reserves pages without clearing them: MADV_POPULATE_WRITE
// allocates, clears and maps them writable in the guest kernel. A writable
// mapping is therefore not mapped with MAP_POPULATE first (that read-only
// pass would only be redone: measured 0.4-0.7 s more per 256 MB on the
// shadow-paging VM). Where the kernel lacks MADV_POPULATE_WRITE (before
// 5.14), the pages are touched instead (the same effect: nothing on the save
// path faults).
void PopulateWritable(uint8_t* p, size_t n) {
  if (n > 0 && madvise(p, n, MADV_POPULATE_WRITE) != 0) TouchPages(p, n);
}

namespace {

std::atomic<bool> huge_pages_wanted{true};

}  // namespace

bool HugePagesWanted() { return huge_pages_wanted.load(std::memory_order_relaxed); }

void SetHugePagesWanted(bool wanted) { huge_pages_wanted.store(wanted, std::memory_order_relaxed); }

namespace {

// Maps `size` bytes of `fd` at a 2 MiB boundary: a 2 MiB page of the file
// can then be mapped whole (one PMD) in this process. A mapping at a 4 KiB
// boundary maps the same huge pages with 512 small entries each, which on a
// shadow-paging hypervisor is as slow to touch as 4 KiB pages, or slower.
Result<uint8_t*> MapAligned(int fd, size_t size, int prot, int flags, const std::string& path) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = AlignUp(size, page);
  if (len < kHugePageBytes) {
    void* p = mmap(nullptr, size, prot, flags, fd, 0);
    if (p == MAP_FAILED) return ErrnoError("mmap " + path, errno);
    return static_cast<uint8_t*>(p);
  }
  void* r = mmap(nullptr, len + kHugePageBytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return ErrnoError("mmap (address range for " + path + ")", errno);
  const uintptr_t rb = reinterpret_cast<uintptr_t>(r);
  const uintptr_t a = AlignUp(rb, kHugePageBytes);
  void* p = mmap(reinterpret_cast<void*>(a), size, prot, flags | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    munmap(r, len + kHugePageBytes);
    return ErrnoError("mmap " + path, err);
  }
  // Give back the unused address space on both sides.
  if (a > rb) munmap(r, a - rb);
  const uintptr_t tail = a + len, rend = rb + len + kHugePageBytes;
  if (rend > tail) munmap(reinterpret_cast<void*>(tail), rend - tail);
  return static_cast<uint8_t*>(p);
}

Result<uint8_t*> MapFd(int fd, size_t size, bool writable, bool touch, bool populate,
                       const std::string& path) {
  if (size == 0) return static_cast<uint8_t*>(nullptr);
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  const bool map_populate = populate && !writable;  // writers: PopulateWritable below
  MEMENTO_ASSIGN_OR_RETURN(
      uint8_t * p,
      MapAligned(fd, size, prot, MAP_SHARED | (map_populate ? MAP_POPULATE : 0), path));
  // Transparent huge pages for shmem where the kernel allows them (fewer TLB
  // misses on the copy path); harmless where it does not.
  madvise(p, size, MADV_HUGEPAGE);
  if (!populate) return p;
  if (writable) PopulateWritable(p, size);
  if (writable && touch) TouchPages(p, size);
  return p;
}

// Collapses the 2 MiB-aligned part of [begin, end) of a fresh mapping into
// huge pages (see the header). The pages are the file's, so this is done
// once, where they are allocated. Logs (once per process) when the kernel
// refuses; the segment then keeps its 4 KiB pages.
void CollapseToHugePages(uint8_t* p, size_t begin, size_t end, const std::string& path) {
  begin = AlignUp(begin, kHugePageBytes);
  end &= ~(kHugePageBytes - 1);
  if (end <= begin || !HugePagesWanted()) return;
  if (madvise(p + begin, end - begin, MADV_COLLAPSE) == 0) return;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    MEMENTO_LOG_INFO(
        "segment {}: the kernel did not collapse its pages into 2 MiB huge pages ({}); they stay "
        "4 KiB pages, and a restarted trainer maps them more slowly (docs/node_store.md, \"Huge "
        "pages\")",
        path, std::strerror(errno));
  }
}

}  // namespace

Result<std::unique_ptr<Segment>> Segment::CreateOrGrow(const std::string& path, size_t min_bytes) {
  if (min_bytes == 0) {
    return InvalidArgumentError("segment " + path + ": a segment of 0 bytes was asked for");
  }
  // Whether this call created the file: a failure below then removes it, so
  // that no empty or short file is left for the next agent to adopt.
  bool created = true;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) return ErrnoError("open segment " + path, errno);
  auto fail = [&](Status why) {
    close(fd);
    if (created) unlink(path.c_str());
    return why;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(ErrnoError("fstat " + path, errno));
  if (st.st_uid != geteuid()) {
    created = false;  // not ours to remove
    close(fd);
    return PermissionDeniedError("segment " + path + " belongs to uid " +
                                 std::to_string(st.st_uid) + ", not to this process's uid " +
                                 std::to_string(geteuid()));
  }
  const size_t old_size = static_cast<size_t>(st.st_size);
  if (min_bytes > static_cast<size_t>(std::numeric_limits<off_t>::max())) {
    return fail(
        ErrnoError(fmt::format("allocating {} bytes for segment {}", min_bytes, path), EFBIG));
  }
  const size_t size = std::max(old_size, min_bytes);
  // Huge pages straight away where the kernel makes them (docs/node_store.md,
  // "Huge pages"): the file is lengthened with holes, one byte is written at
  // the start of every new 2 MiB block (one 4 KiB page each), and
  // MADV_COLLAPSE turns each block into a 2 MiB page, zero-filling the holes.
  // Allocating every 4 KiB page first (fallocate) and collapsing after would
  // clear the memory twice and copy it once (measured 0.23 to 0.96 s per
  // 256 MB on the 2-vCPU VM, against 0.03 to 0.3 s this way, most of it
  // compaction when the kernel has no free 2 MiB block). The fallocate below
  // then allocates only what did not collapse (the tail, or everything where
  // the kernel refuses) and is the honest "shm is full".
  const bool huge = size > old_size && HugePagesWanted() && size >= kHugePageBytes;
  if (size > old_size && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(ErrnoError(fmt::format("growing segment {} to {} bytes", path, size), errno));
  }
  if (huge) {
    const uint8_t zero = 0;
    for (size_t at = AlignUp(old_size, kHugePageBytes); at + kHugePageBytes <= size;
         at += kHugePageBytes) {
      // A failure (ENOSPC) is left to the fallocate below to report.
      if (pwrite(fd, &zero, 1, static_cast<off_t>(at)) != 1) break;
    }
  }
  // Gives the file back its old length (or removes it when this call
  // created it) after a failure once it was lengthened.
  auto shrink_back = [&] {
    if (size > old_size && old_size > 0 && !created &&
        ftruncate(fd, static_cast<off_t>(old_size)) != 0) {
      MEMENTO_LOG_WARN("could not shrink {} back after a failed allocation", path);
    }
    // An empty file left by the failure is removed (also one an earlier
    // failure left): it holds nothing, and a reader would find no header.
    if (old_size == 0) created = true;
  };
  fchmod(fd, 0600);
  const int prot = PROT_READ | PROT_WRITE;
  auto mapped = MapAligned(fd, size, prot, MAP_SHARED, path);
  if (!mapped.ok()) {
    shrink_back();
    return fail(mapped.status());
  }
  uint8_t* p = *mapped;
  madvise(p, size, MADV_HUGEPAGE);
  if (huge) CollapseToHugePages(p, old_size & ~(kHugePageBytes - 1), size, path);
  if (size > old_size) {
    // Allocates every page not allocated yet (zeroed), so nobody faults
    // them later on the save path; ENOSPC here is the honest "shm is full".
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (err != 0) {
      munmap(p, size);
      shrink_back();
      if (err == ENOSPC) {
        return fail(ResourceExhaustedError("allocating " + std::to_string(min_bytes) +
                                           " bytes for segment " + path +
                                           ": the shared-memory filesystem is full"));
      }
      return fail(
          ErrnoError(fmt::format("allocating {} bytes for segment {}", min_bytes, path), err));
    }
  }
  PopulateWritable(p, size);
  return std::unique_ptr<Segment>(new Segment(path, fd, p, size, /*writable=*/true));
}

Result<std::unique_ptr<Segment>> Segment::Open(const std::string& path, bool writable,
                                               bool prefault, bool populate) {
  int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError("open segment " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("fstat " + path, err);
  }
  auto mapped = MapFd(fd, static_cast<size_t>(st.st_size), writable, prefault, populate, path);
  if (!mapped.ok()) {
    close(fd);
    return mapped.status();
  }
  return std::unique_ptr<Segment>(
      new Segment(path, fd, *mapped, static_cast<size_t>(st.st_size), writable));
}

MappedPages MappedPagesOf(const std::string& path_prefix) {
  MappedPages out;
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return out;
  char line[4096];
  bool in = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kb = 0;
    char key[64];
    if (std::sscanf(line, "%63[A-Za-z_]: %llu kB", key, &kb) == 2) {
      if (!in) continue;
      if (std::strcmp(key, "Rss") == 0) out.rss_bytes += kb << 10;
      if (std::strcmp(key, "ShmemPmdMapped") == 0 || std::strcmp(key, "FilePmdMapped") == 0) {
        out.huge_bytes += kb << 10;
      }
      continue;
    }
    // A mapping header: "start-end perms offset dev inode   path".
    const char* slash = std::strchr(line, '/');
    std::string mapped = slash ? std::string(slash, std::strcspn(slash, "\n")) : "";
    in = !mapped.empty() && mapped.compare(0, path_prefix.size(), path_prefix) == 0;
  }
  std::fclose(f);
  return out;
}

std::string TmpfsHugeOption(const std::string& path) {
  std::FILE* f = std::fopen("/proc/self/mountinfo", "r");
  if (f == nullptr) return "";
  std::string best_point, best_type, best_super;
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    // id parent major:minor root mount-point options ... - fstype source super-options
    char point[1024], fstype[256], super[2048];
    const char* dash = std::strstr(line, " - ");
    if (dash == nullptr || std::sscanf(line, "%*s %*s %*s %*s %1023s", point) != 1 ||
        std::sscanf(dash + 3, "%255s %*s %2047s", fstype, super) != 2) {
      continue;
    }
    std::string mp = point;
    bool under =
        path == mp || mp == "/" ||
        (path.compare(0, mp.size(), mp) == 0 && path.size() > mp.size() && path[mp.size()] == '/');
    if (under && mp.size() >= best_point.size()) {
      best_point = mp;
      best_type = fstype;
      best_super = super;
    }
  }
  std::fclose(f);
  if (best_type != "tmpfs") return "";
  size_t at = best_super.find("huge=");
  if (at == std::string::npos) return "never";
  return best_super.substr(at + 5, best_super.find(',', at) - (at + 5));
}

std::string ShmemThpSetting() {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (f == nullptr) return "";
  char buf[256] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  size_t a = s.find('['), b = s.find(']');
  return a != std::string::npos && b != std::string::npos && b > a ? s.substr(a + 1, b - a - 1)
                                                                   : "";
}

}  // namespace memento::shm
