#include "tier/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "common/check.h"

namespace memento::tier {

AlignedBuffer::AlignedBuffer(size_t size) {
  size_ = AlignUp(std::max<size_t>(size, 1), kDirectIoAlignment);
  void* p = nullptr;
  MEMENTO_CHECK(posix_memalign(&p, kDirectIoAlignment, size_) == 0);
  data_ = static_cast<uint8_t*>(p);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

const char* IoEngineName(IoEngine engine) {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kUring:
      return "uring";
    case IoEngine::kPwrite:
      return "pwrite";
  }
  return "?";
}

Result<IoEngine> ParseIoEngine(const std::string& name) {
  if (name == "auto") return IoEngine::kAuto;
  if (name == "uring" || name == "io_uring") return IoEngine::kUring;
  if (name == "pwrite") return IoEngine::kPwrite;
  return InvalidArgumentError("durable I/O engine '" + name + "': expected auto, uring or pwrite");
}

bool UringSupported() {
  // Probed once: the syscall may be missing (old kernel), disabled
  // (kernel.io_uring_disabled) or filtered (seccomp in containers).
  static const bool supported = [] {
    io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
  }();
  return supported;
}

IoEngine ResolveIoEngine(IoEngine engine) {
  if (engine != IoEngine::kAuto) return engine;
  return UringSupported() ? IoEngine::kUring : IoEngine::kPwrite;
}

Status WritableFile::SubmitWrite(uint64_t offset, const void* data, size_t len, uint64_t tag) {
  done_.push_back(WriteCompletion{tag, Write(offset, data, len)});
  return Status::Ok();
}

WriteCompletion WritableFile::ReapWrite() {
  MEMENTO_CHECK(!done_.empty());
  WriteCompletion c = std::move(done_.front());
  done_.erase(done_.begin());
  return c;
}

Result<std::string> Env::ReadFileToString(const std::string& path) {
  MEMENTO_ASSIGN_OR_RETURN(auto file, NewRandomAccessFile(path, /*direct=*/false));
  MEMENTO_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    MEMENTO_ASSIGN_OR_RETURN(size_t n, file->Read(done, out.data() + done, size - done));
    if (n == 0) break;
    done += n;
  }
  out.resize(done);
  return out;
}

Status Env::WriteStringToFileSync(const std::string& path, const std::string& data) {
  MEMENTO_ASSIGN_OR_RETURN(auto file, NewWritableFile(path, /*direct=*/false));
  MEMENTO_RETURN_IF_ERROR(file->Write(0, data.data(), data.size()));
  MEMENTO_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

Status WriteFileAtomic(Env* env, const std::string& dir, const std::string& name,
                       const std::string& data) {
  const std::string tmp = dir + "/" + name + ".tmp";
  MEMENTO_RETURN_IF_ERROR(env->WriteStringToFileSync(tmp, data));
  MEMENTO_RETURN_IF_ERROR(env->RenameFile(tmp, dir + "/" + name));
  return env->SyncDir(dir);
}

Status RemoveDirRecursive(Env* env, const std::string& dir) {
  MEMENTO_ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
  for (const auto& n : names) MEMENTO_RETURN_IF_ERROR(env->RemoveFile(dir + "/" + n));
  return env->RemoveDir(dir);
}

namespace {

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, bool direct)
      : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status Write(uint64_t offset, const void* data, size_t len) override {
    if (direct_ && (offset % kDirectIoAlignment || len % kDirectIoAlignment ||
                    reinterpret_cast<uintptr_t>(data) % kDirectIoAlignment)) {
      return InvalidArgumentError("unaligned direct write to " + path_);
    }
    const auto* p = static_cast<const uint8_t*>(data);
    while (len > 0) {
      ssize_t n = ::pwrite(fd_, p, len, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("pwrite " + path_, errno);
      }
      p += n;
      offset += static_cast<uint64_t>(n);
      len -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoError("ftruncate " + path_, errno);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoError("fsync " + path_, errno);
    if (!direct_) {
      // Written data is durable now; drop it from the page cache so a large
      // persist does not evict the trainer's working set.
      (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    }
    return Status::Ok();
  }

  Status Close() override {
    int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) return ErrnoError("close " + path_, errno);
    return Status::Ok();
  }

  bool direct() const override { return direct_; }

 private:
  std::string path_;
  int fd_;
  bool direct_;
};

// A direct data file written through an io_uring: up to kDepth writes in
// flight, so the device always has the next chunk queued while the previous
// one completes (a synchronous pwrite leaves it idle between two calls).
// fsync, truncate and close are plain syscalls, issued when nothing is in
// flight (the writer drains first).
class UringWritableFile final : public WritableFile {
 public:
  static constexpr unsigned kDepth = 8;

  static Result<std::unique_ptr<WritableFile>> Open(const std::string& path, int fd) {
    std::unique_ptr<UringWritableFile> f(new UringWritableFile(path, fd));
    int rc = io_uring_queue_init(kDepth, &f->ring_, 0);
    if (rc < 0) {
      f->fd_ = -1;  // the caller still owns fd on failure
      return ErrnoError("io_uring_queue_init for " + path, -rc);
    }
    f->ring_ok_ = true;
    return std::unique_ptr<WritableFile>(std::move(f));
  }

  ~UringWritableFile() override {
    // Never leave the kernel writing from memory that may be freed.
    while (!inflight_.empty()) ReapWrite();
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (fd_ >= 0) ::close(fd_);
  }

  int queue_depth() const override { return static_cast<int>(kDepth); }

  Status SubmitWrite(uint64_t offset, const void* data, size_t len, uint64_t tag) override {
    if (offset % kDirectIoAlignment || len % kDirectIoAlignment ||
        reinterpret_cast<uintptr_t>(data) % kDirectIoAlignment) {
      return InvalidArgumentError("unaligned direct write to " + path_);
    }
    if (inflight_.size() >= kDepth) {
      return FailedPreconditionError("io_uring queue of " + path_ + " is full");
    }
    Op& op = inflight_[next_id_];
    op = Op{tag, static_cast<const uint8_t*>(data), offset, len, 0};
    Status st = Queue(next_id_);
    if (!st.ok()) {
      inflight_.erase(next_id_);
      return st;
    }
    ++next_id_;
    return Status::Ok();
  }

  WriteCompletion ReapWrite() override {
    if (!early_.empty()) {
      WriteCompletion c = std::move(early_.front());
      early_.erase(early_.begin());
      return c;
    }
    MEMENTO_CHECK(!inflight_.empty());
    while (true) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // The ring itself failed: report the oldest write as failed.
        auto it = inflight_.begin();
        WriteCompletion c{it->second.tag, ErrnoError("io_uring_wait_cqe " + path_, -rc)};
        inflight_.erase(it);
        return c;
      }
      const uint64_t id = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      auto it = inflight_.find(id);
      MEMENTO_CHECK(it != inflight_.end());
      Op& op = it->second;
      Status st;
      if (res == -EINTR || res == -EAGAIN) {
        st = Queue(id);  // retry the rest
        if (st.ok()) continue;
      } else if (res < 0) {
        st = ErrnoError("io_uring write " + path_, -res);
      } else if (res == 0) {
        st = ErrnoError("io_uring write " + path_ + " wrote nothing", EIO);
      } else {
        op.done += static_cast<size_t>(res);
        if (op.done < op.len) {
          st = Queue(id);  // a short write: queue the remainder
          if (st.ok()) continue;
        }
      }
      WriteCompletion c{op.tag, st};
      inflight_.erase(it);
      return c;
    }
  }

  Status Write(uint64_t offset, const void* data, size_t len) override {
    MEMENTO_RETURN_IF_ERROR(SubmitWrite(offset, data, len, /*tag=*/~0ull));
    // Reap until this write's completion; others (none in practice) are kept.
    while (true) {
      WriteCompletion c = ReapWrite();
      if (c.tag == ~0ull) return c.status;
      early_.push_back(std::move(c));
    }
  }

  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoError("ftruncate " + path_, errno);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoError("fsync " + path_, errno);
    return Status::Ok();
  }

  Status Close() override {
    while (!inflight_.empty()) ReapWrite();
    int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) return ErrnoError("close " + path_, errno);
    return Status::Ok();
  }

  bool direct() const override { return true; }
  const char* engine() const override { return "uring"; }

 private:
  struct Op {
    uint64_t tag;
    const uint8_t* data;
    uint64_t offset;
    size_t len;
    size_t done;
  };

  UringWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  Status Queue(uint64_t id) {
    Op& op = inflight_.at(id);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return ResourceExhaustedError("io_uring of " + path_ + " has no entry");
    }
    io_uring_prep_write(sqe, fd_, op.data + op.done, static_cast<unsigned>(op.len - op.done),
                        op.offset + op.done);
    io_uring_sqe_set_data64(sqe, id);
    int rc = io_uring_submit(&ring_);
    if (rc < 0) return ErrnoError("io_uring_submit " + path_, -rc);
    return Status::Ok();
  }

  std::string path_;
  int fd_;
  io_uring ring_{};
  bool ring_ok_ = false;
  uint64_t next_id_ = 0;
  std::map<uint64_t, Op> inflight_;
  std::vector<WriteCompletion> early_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, bool direct)
      : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Result<size_t> Read(uint64_t offset, void* buf, size_t len) override {
    auto* p = static_cast<uint8_t*>(buf);
    size_t done = 0;
    while (done < len) {
      ssize_t n = ::pread(fd_, p + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("pread " + path_, errno);
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
      // A short direct read means end of file (the tail is not block-aligned).
      if (direct_ && done % kDirectIoAlignment != 0) break;
    }
    return done;
  }

  Result<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoError("fstat " + path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  bool direct() const override { return direct_; }

 private:
  std::string path_;
  int fd_;
  bool direct_;
};

class PosixEnv final : public Env {
 public:
  explicit PosixEnv(IoEngine engine) : engine_(engine) {}

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        bool direct) override {
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = -1;
    bool used_direct = false;
    if (direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      used_direct = fd >= 0;
      if (fd < 0 && errno != EINVAL) return ErrnoError("open " + path, errno);
    }
    if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return ErrnoError("open " + path, errno);
    const IoEngine engine = ResolveIoEngine(engine_);
    if (used_direct && engine == IoEngine::kUring) {
      auto f = UringWritableFile::Open(path, fd);
      if (f.ok()) return f;
      if (engine_ == IoEngine::kUring) {
        ::close(fd);
        return f.status();
      }
      // kAuto: the probe passed but this ring failed (memlock limit): pwrite.
    } else if (engine_ == IoEngine::kUring && direct && !UringSupported()) {
      ::close(fd);
      return UnavailableError("durable I/O engine uring: this kernel refuses io_uring");
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, used_direct));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                bool direct) override {
    int flags = O_RDONLY | O_CLOEXEC;
    int fd = -1;
    bool used_direct = false;
    if (direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT);
      used_direct = fd >= 0;
      if (fd < 0 && errno != EINVAL) return ErrnoError("open " + path, errno);
    }
    if (fd < 0) fd = ::open(path.c_str(), flags);
    if (fd < 0) return ErrnoError("open " + path, errno);
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd, used_direct));
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError("rename " + from + " -> " + to, errno);
    }
    return Status::Ok();
  }
  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoError("unlink " + path, errno);
    return Status::Ok();
  }
  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir " + path, errno);
    }
    return Status::Ok();
  }
  Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return ErrnoError("rmdir " + path, errno);
    return Status::Ok();
  }
  Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open dir " + path, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError("fsync dir " + path, err);
    return Status::Ok();
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return ErrnoError("opendir " + path, errno);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(std::move(n));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat " + path, errno);
    return static_cast<uint64_t>(st.st_size);
  }
  bool FileExists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

 private:
  const IoEngine engine_;
};

}  // namespace

Env* Env::Posix(IoEngine engine) {
  static Env* const envs[] = {new PosixEnv(IoEngine::kAuto), new PosixEnv(IoEngine::kUring),
                              new PosixEnv(IoEngine::kPwrite)};
  return envs[static_cast<int>(engine)];
}

namespace {
std::atomic<IoEngine> default_engine{IoEngine::kAuto};
}  // namespace

Env* Env::Default() { return Posix(default_engine.load(std::memory_order_relaxed)); }

void Env::SetDefaultIoEngine(IoEngine engine) {
  default_engine.store(engine, std::memory_order_relaxed);
}

}  // namespace memento::tier
