#include "tier/fault_injection_env.h"

#include <cerrno>
#include <utility>

namespace memento::tier {

class FaultInjectionWritableFile final : public WritableFile {
 public:
  FaultInjectionWritableFile(FaultInjectionEnv* env, std::string path,
                             std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}

  Status Write(uint64_t offset, const void* data, size_t len) override {
    MEMENTO_RETURN_IF_ERROR(env_->MaybeFailWrite(path_, len));
    return base_->Write(offset, data, len);
  }
  Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  Status Sync() override {
    MEMENTO_RETURN_IF_ERROR(env_->MaybeFailSync(path_));
    return base_->Sync();
  }
  Status Close() override { return base_->Close(); }
  bool direct() const override { return base_->direct(); }

 private:
  FaultInjectionEnv* env_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

Status FaultInjectionEnv::MaybeFailWrite(const std::string& path, size_t len) {
  if (fail_writes_) {
    ++injected_;
    return ErrnoError("pwrite " + path + " (injected)", EIO);
  }
  int64_t left = space_left_.load();
  while (left >= 0) {
    if (static_cast<int64_t>(len) > left) {
      ++injected_;
      return ErrnoError("pwrite " + path + " (injected)", ENOSPC);
    }
    if (space_left_.compare_exchange_weak(left, left - static_cast<int64_t>(len))) break;
  }
  return Status::Ok();
}

Status FaultInjectionEnv::MaybeFailSync(const std::string& path) {
  if (fail_syncs_) {
    ++injected_;
    return ErrnoError("fsync " + path + " (injected)", EIO);
  }
  return Status::Ok();
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path,
                                                                         bool direct) {
  MEMENTO_ASSIGN_OR_RETURN(auto file, base_->NewWritableFile(path, direct));
  return std::unique_ptr<WritableFile>(new FaultInjectionWritableFile(this, path, std::move(file)));
}

namespace {
class FailingRandomAccessFile final : public RandomAccessFile {
 public:
  FailingRandomAccessFile(std::string path, std::unique_ptr<RandomAccessFile> base)
      : path_(std::move(path)), base_(std::move(base)) {}
  Result<size_t> Read(uint64_t, void*, size_t) override {
    return ErrnoError("pread " + path_ + " (injected)", EIO);
  }
  Result<uint64_t> Size() override { return base_->Size(); }
  bool direct() const override { return base_->direct(); }

 private:
  std::string path_;
  std::unique_ptr<RandomAccessFile> base_;
};
}  // namespace

Result<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(
    const std::string& path, bool direct) {
  MEMENTO_ASSIGN_OR_RETURN(auto file, base_->NewRandomAccessFile(path, direct));
  if (!fail_reads_) return file;
  ++injected_;
  return std::unique_ptr<RandomAccessFile>(new FailingRandomAccessFile(path, std::move(file)));
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  if (fail_renames_) {
    ++injected_;
    return ErrnoError("rename " + from + " (injected)", EIO);
  }
  return base_->RenameFile(from, to);
}

Status FaultInjectionEnv::SyncDir(const std::string& path) {
  MEMENTO_RETURN_IF_ERROR(MaybeFailSync(path));
  return base_->SyncDir(path);
}

}  // namespace memento::tier
