#include "tier/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
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
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv();
  return env;
}

}  // namespace memento::tier
