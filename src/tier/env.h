// File-system access of the durable tier, behind one small interface so that
// tests can inject faults (LevelDB's Env / FaultInjectionTestEnv are the model).
//
// Every byte the durable tier writes or reads goes through an Env. The POSIX
// implementation (Env::Default()) opens bulk-data files with O_DIRECT when asked,
// so persisting tens of GiB does not evict the training job's page cache; files
// on a file system without O_DIRECT (tmpfs) fall back to buffered I/O followed by
// posix_fadvise(DONTNEED).
//
// Thread safety: an Env is safe to use from several threads at once. A
// WritableFile or RandomAccessFile object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::tier {

// Offsets, lengths and buffer addresses of direct I/O are multiples of this.
inline constexpr size_t kDirectIoAlignment = 4096;

// A buffer aligned for direct I/O, owned.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size);  // size is rounded up to kDirectIoAlignment
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

inline uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// How data files opened for direct I/O are written.
enum class IoEngine {
  kAuto,    // io_uring where the kernel supports it, else pwrite
  kUring,   // io_uring, an error where the kernel lacks it
  kPwrite,  // synchronous pwrite(2), one write at a time
};
const char* IoEngineName(IoEngine engine);  // "auto", "uring", "pwrite"
[[nodiscard]] Result<IoEngine> ParseIoEngine(const std::string& name);
// Whether this kernel (and seccomp policy) lets the process set up an io_uring.
bool UringSupported();
// kAuto resolved against UringSupported(); the others unchanged.
IoEngine ResolveIoEngine(IoEngine engine);

// One finished queued write (WritableFile::ReapWrite).
struct WriteCompletion {
  uint64_t tag = 0;
  Status status;
};

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Queued writes: at most queue_depth() may be submitted and not reaped.
  // SubmitWrite starts a write (same rules as Write; `data` must stay valid
  // until it is reaped) under a caller's tag; ReapWrite blocks until one
  // submitted write has finished and returns its tag and result (all of its
  // bytes written, or the error). REQUIRES for ReapWrite: a write is in
  // flight. The default runs Write inside SubmitWrite (depth 1), so a file
  // that only implements Write (a test's fault-injecting one) works as is.
  virtual int queue_depth() const { return 1; }
  [[nodiscard]] virtual Status SubmitWrite(uint64_t offset, const void* data, size_t len,
                                           uint64_t tag);
  virtual WriteCompletion ReapWrite();

  // pwrite(2) of all `len` bytes at `offset`. For a direct() file, offset, len
  // and data must be multiples of kDirectIoAlignment.
  [[nodiscard]] virtual Status Write(uint64_t offset, const void* data, size_t len) = 0;
  // Sets the file size (used after the last, padded direct write).
  [[nodiscard]] virtual Status Truncate(uint64_t size) = 0;
  // fsync(2): data and metadata durable.
  [[nodiscard]] virtual Status Sync() = 0;
  [[nodiscard]] virtual Status Close() = 0;
  virtual bool direct() const = 0;
  // The engine that writes this file ("pwrite", "uring", or a wrapper's name).
  virtual const char* engine() const { return "pwrite"; }

 private:
  std::vector<WriteCompletion> done_;  // the default SubmitWrite's results
};

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // pread(2) of up to `len` bytes at `offset`; returns the bytes read (short
  // only at end of file). Same alignment rule as WritableFile::Write.
  [[nodiscard]] virtual Result<size_t> Read(uint64_t offset, void* buf, size_t len) = 0;
  virtual Result<uint64_t> Size() = 0;
  virtual bool direct() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX Env (never deleted): Posix() of the engine
  // SetDefaultIoEngine chose last, kAuto until then.
  static Env* Default();
  // The engine of Default() from now on: set by the process's edge
  // (`memento` from MEMENTO_DURABLE_IO=auto|uring|pwrite,
  // tools/environment.cc) or by a test.
  static void SetDefaultIoEngine(IoEngine engine);
  // The process-wide POSIX Env whose direct data files are written with
  // `engine` (never deleted). Buffered files always use pwrite.
  static Env* Posix(IoEngine engine);

  // Creates or truncates `path`. With `direct`, tries O_DIRECT and falls back
  // to buffered I/O where the file system refuses it (WritableFile::direct()
  // says which one was used).
  [[nodiscard]] virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, bool direct) = 0;
  [[nodiscard]] virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, bool direct) = 0;

  // Convenience: whole small files (markers, JSON).
  [[nodiscard]] virtual Result<std::string> ReadFileToString(const std::string& path);
  // Writes `data` to `path` (created/truncated) and fsyncs it.
  [[nodiscard]] virtual Status WriteStringToFileSync(const std::string& path,
                                                     const std::string& data);

  [[nodiscard]] virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  [[nodiscard]] virtual Status RemoveFile(const std::string& path) = 0;
  // OK when the directory already exists.
  [[nodiscard]] virtual Status CreateDir(const std::string& path) = 0;
  [[nodiscard]] virtual Status RemoveDir(const std::string& path) = 0;
  // fsync(2) of a directory, so that creations and renames in it are durable.
  [[nodiscard]] virtual Status SyncDir(const std::string& path) = 0;
  // Names in `path` without "." and "..", sorted.
  [[nodiscard]] virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  [[nodiscard]] virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
};

// Writes `data` to `dir/name` atomically: a temporary name is written and
// fsynced, renamed over `name`, and `dir` is fsynced. After a crash either the
// old content (or nothing) or the new one is there, never a mix.
[[nodiscard]] Status WriteFileAtomic(Env* env, const std::string& dir, const std::string& name,
                                     const std::string& data);

// Removes every file in `dir` and then `dir` itself (one level; the durable
// tier never nests deeper).
[[nodiscard]] Status RemoveDirRecursive(Env* env, const std::string& dir);

}  // namespace memento::tier
