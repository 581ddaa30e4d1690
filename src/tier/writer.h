// Writing one version to the durable tier.
//
// Every node writes its own part (WriteNodePart): its data file in the
// safetensors layout, its manifest, and last its marker node-N.done. Node 0
// then commits the version (CommitVersion) once every node's marker is there:
// it merges the manifests into index.json and writes COMMIT atomically. A
// version without COMMIT does not exist for any reader.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "tier/env.h"
#include "tier/format.h"
#include "tier/version_view.h"

namespace memento::tier {

// Token bucket limiting write bandwidth. Thread-safe.
class RateLimiter {
 public:
  // 0 bytes per second = unlimited. Bursts up to `burst_bytes`.
  explicit RateLimiter(uint64_t bytes_per_sec, uint64_t burst_bytes = 8 << 20);
  void SetRate(uint64_t bytes_per_sec);
  // Blocks until `bytes` may be written (never longer than needed).
  void Acquire(uint64_t bytes);

 private:
  Mutex mu_;
  uint64_t rate_ GUARDED_BY(mu_);
  double burst_ GUARDED_BY(mu_);
  double tokens_ GUARDED_BY(mu_);
  TimePoint last_ GUARDED_BY(mu_);
};

struct WriteOptions {
  // O_DIRECT for the data file (buffered + fadvise(DONTNEED) where refused).
  bool direct_io = true;
  // Staging chunk size; the copy into chunk i+1 overlaps the write of chunk i.
  size_t chunk_bytes = 4 << 20;
  int num_chunks = 4;
  // Optional shared bandwidth cap (not owned; may be null).
  RateLimiter* limiter = nullptr;
  // Set to true from another thread to abandon the write (returns Aborted).
  const std::atomic<bool>* cancel = nullptr;
};

struct WriteStats {
  uint64_t data_bytes = 0;  // tensor bytes written
  uint64_t file_bytes = 0;  // data file size
  double seconds = 0;       // whole call
  double data_seconds = 0;  // data file streamed and fsynced
  bool direct = false;      // O_DIRECT was used
  std::string engine;       // how the data file was written: "uring" or "pwrite"
};

// Writes `view`'s part of version view.step under `root` (created if needed)
// and makes it durable: data file and manifest fsynced, then node-N.done
// written atomically. A previous partial attempt of the same node is replaced.
// Fails with AlreadyExists when the version is already committed, with
// InvalidArgument when the view is inconsistent (range outside a tensor, two
// entries of one name with different metadata), and with the I/O error
// otherwise; the version then stays incomplete.
[[nodiscard]] Result<WriteStats> WriteNodePart(Env* env, const std::string& root,
                                               const VersionView& view,
                                               const WriteOptions& options);

// Node 0's half: when all `num_nodes` markers of `step` and `epoch` are present
// and sound, writes index.json and COMMIT. Unavailable (naming the missing
// nodes) when some node has not finished yet or its marker is from another
// epoch; OK when the version is already committed.
[[nodiscard]] Status CommitVersion(Env* env, const std::string& root, int64_t step, int num_nodes,
                                   uint64_t epoch = 0);

// WriteNodePart, and on node 0 CommitVersion retried until `commit_deadline`.
[[nodiscard]] Result<WriteStats> WriteVersion(Env* env, const std::string& root,
                                              const VersionView& view, const WriteOptions& options,
                                              Deadline commit_deadline);

}  // namespace memento::tier
