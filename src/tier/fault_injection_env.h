// An Env wrapper that injects file-system faults, for tests (modelled on
// LevelDB's FaultInjectionTestEnv): failing writes, failing fsyncs, a full disk
// (ENOSPC after a byte budget) and failing renames. Everything else is passed
// to the wrapped Env.
//
// Thread safety: the fault switches may be flipped from any thread while
// another thread does I/O through the Env.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tier/env.h"

namespace memento::tier {

class FaultInjectionEnv final : public Env {
 public:
  // `base` must outlive this object.
  explicit FaultInjectionEnv(Env* base) : base_(base) {}

  // Every data write fails with EIO.
  void SetFailWrites(bool on) { fail_writes_ = on; }
  // Every file and directory fsync fails with EIO.
  void SetFailSyncs(bool on) { fail_syncs_ = on; }
  // Writes fail with ENOSPC once `bytes` more bytes have been written; -1 lifts
  // the limit.
  void SetSpaceLeft(int64_t bytes) { space_left_ = bytes; }
  void SetFailRenames(bool on) { fail_renames_ = on; }
  // Every read of a file opened from now on fails with EIO.
  void SetFailReads(bool on) { fail_reads_ = on; }
  // Lifts every fault.
  void Heal() {
    fail_writes_ = false;
    fail_syncs_ = false;
    fail_renames_ = false;
    fail_reads_ = false;
    space_left_ = -1;
  }
  // How many operations failed because of an injected fault.
  int64_t injected_faults() const { return injected_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        bool direct) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                bool direct) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  Status CreateDir(const std::string& path) override { return base_->CreateDir(path); }
  Status RemoveDir(const std::string& path) override { return base_->RemoveDir(path); }
  Status SyncDir(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  Result<uint64_t> FileSize(const std::string& path) override { return base_->FileSize(path); }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }

 private:
  friend class FaultInjectionWritableFile;
  // Returns an injected error for a write of `len` bytes to `path`, or OK.
  Status MaybeFailWrite(const std::string& path, size_t len);
  Status MaybeFailSync(const std::string& path);

  Env* const base_;
  std::atomic<bool> fail_writes_{false};
  std::atomic<bool> fail_syncs_{false};
  std::atomic<bool> fail_renames_{false};
  std::atomic<bool> fail_reads_{false};
  std::atomic<int64_t> space_left_{-1};
  std::atomic<int64_t> injected_{0};
};

}  // namespace memento::tier
