// The CPU copy engine: moves chunks between registered memory and slots on a
// small pool of worker threads, computing each chunk's xxHash3 in the same
// pass, so the trainer thread only enqueues.
//
//   CopyEngine engine({.threads = 2});
//   auto job = engine.Submit(std::move(chunks), on_chunk, on_done);   // returns at once
//   ... training continues ...
//   Status st = job->Wait(deadline);                                  // Fence()
//
// A chunk is (src pointer, dst pointer, length): the planner's byte ranges,
// the HAS scheduler's sub-chunks and the CUDA engine's staged buffers all map
// onto it. Each chunk either records its checksum (save) or checks it against
// an expected value (restore).
//
// Thread safety: Submit() may be called from any thread; jobs run in FIFO
// order, the chunks of one job in parallel on all workers. Callbacks run on a
// worker thread (or on the thread in HelpAndWait), never under the engine's
// lock: on_chunk once per chunk, on_done exactly once after every chunk
// finished (or the job failed), before Wait() returns; it gets the copy's
// status and returns the job's.
//
// Priority (Options::idle_priority): the workers can run as SCHED_IDLE, so
// that a snapshot copy uses only CPU time that training leaves unused and
// never preempts the trainer. A caller that must wait for a job calls
// HelpAndWait: it copies the job's unclaimed chunks itself, at its own
// priority, and lifts the workers to normal priority until the next Submit
// (where the OS allows it: root, CAP_SYS_NICE or RLIMIT_NICE >= 20), so a
// fence is never starved by the low priority.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::snap {

// Computes a chunk's bytes instead of copying them (a parity the client
// encodes from registered memory: docs/reft.md section 4). Produce writes
// bytes [offset, offset + length) of what it computes to dst; it may run on
// several threads at once for different chunks.
class ChunkProducer {
 public:
  virtual ~ChunkProducer() = default;
  [[nodiscard]] virtual Status Produce(uint64_t offset, size_t length, uint8_t* dst) const = 0;
};

struct CopyChunk {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t length = 0;
  // Save: where the chunk's checksum is stored (may be null).
  uint64_t* checksum_out = nullptr;
  // Restore: when set, the copied bytes must hash to `expected_checksum`,
  // else the job fails with DataLoss naming `label`.
  bool verify = false;
  uint64_t expected_checksum = 0;
  const char* label = "";  // for error messages; must outlive the job
  // Save only: when set, the chunk's bytes are producer->Produce(
  // producer_offset, length, dst) instead of a copy of src (null); the
  // checksum is then computed over dst. The producer must outlive the job.
  const ChunkProducer* producer = nullptr;
  uint64_t producer_offset = 0;
};

// Runs one save chunk on the calling thread: copies (or produces) its bytes
// into dst and stores their checksum in *checksum_out (when set). Returns the
// checksum, or the producer's error. The one chunk body of the copy engine and
// the HAS workers.
[[nodiscard]] Result<uint64_t> RunSaveChunk(const CopyChunk& chunk);

class CopyJob {
 public:
  // Blocks until the job is done (on_done has returned). Returns the job's
  // status, or DeadlineExceeded (the job keeps running).
  Status Wait(Deadline deadline = Deadline::Infinite()) EXCLUDES(mu_);
  bool done() EXCLUDES(mu_);
  size_t num_chunks() const { return chunks_.size(); }
  size_t chunks_done() const { return finished_.load(std::memory_order_acquire); }
  uint64_t bytes() const { return bytes_; }
  // Seconds from Submit() to the last chunk's completion (0 while running).
  double copy_seconds() const { return copy_s_.load(std::memory_order_acquire); }

 private:
  friend class CopyEngine;
  CopyJob() = default;
  std::vector<CopyChunk> chunks_;
  std::function<void(size_t, uint64_t)> on_chunk_;
  std::function<Status(const Status&)> on_done_;
  std::function<void()> before_chunk_;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> finished_{0};
  std::atomic<bool> failed_{false};
  std::atomic<double> copy_s_{0};
  uint64_t bytes_ = 0;
  TimePoint start_;
  Mutex mu_;
  CondVar cv_;
  Status first_error_ GUARDED_BY(mu_);
  Status status_ GUARDED_BY(mu_);
  bool done_ GUARDED_BY(mu_) = false;
};

class CopyEngine {
 public:
  struct Options {
    int threads = 1;
    std::string name = "mem-copy";
    // Test hook: sleep this long after every chunk (makes kills land
    // mid-snapshot). 0 in production.
    int chunk_delay_us = 0;
    // Workers run as SCHED_IDLE from Submit() until a HelpAndWait() lifts
    // them (see the class comment).
    bool idle_priority = false;
  };
  explicit CopyEngine(Options options);
  ~CopyEngine();  // waits for queued jobs
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Enqueues a job and returns at once. REQUIRES: chunks' memory stays valid
  // and unwritten by others until the job is done. `before_chunk` (may be
  // null) runs on the copying thread before each chunk of the job, e.g. to
  // wait until the destination's pages are mapped (the client's background
  // prefault of a slot after a restart); it must be cheap once satisfied.
  std::shared_ptr<CopyJob> Submit(std::vector<CopyChunk> chunks,
                                  std::function<void(size_t index, uint64_t checksum)> on_chunk,
                                  std::function<Status(const Status&)> on_done,
                                  std::function<void()> before_chunk = nullptr) EXCLUDES(mu_);
  int threads() const { return static_cast<int>(workers_.size()); }

  // Fence of `job` (from Submit on this engine): runs its unclaimed chunks on
  // the calling thread, lifts idle-priority workers to normal priority for
  // the chunks they hold, then waits as CopyJob::Wait does. Returns the
  // job's status or DeadlineExceeded (the job keeps running). Adds the bytes
  // it copied itself to `*helped_bytes` when not null.
  Status HelpAndWait(CopyJob& job, Deadline deadline, uint64_t* helped_bytes = nullptr)
      EXCLUDES(mu_);

  // Whether the workers currently run at idle priority (false when the
  // engine has no idle priority or the OS refused it; tests).
  bool workers_idle() EXCLUDES(mu_);

 private:
  void WorkerLoop(int index);
  // Sets every worker's policy (SCHED_IDLE or SCHED_OTHER); best effort.
  void SetWorkersIdle(bool idle) REQUIRES(mu_);
  void RunChunk(CopyJob& job, size_t index);
  void Finish(CopyJob& job);

  const Options options_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<CopyJob>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
  std::vector<pid_t> worker_tids_ GUARDED_BY(mu_);  // 0 until the worker started
  bool workers_idle_ GUARDED_BY(mu_) = false;
  bool warned_priority_ GUARDED_BY(mu_) = false;
};

}  // namespace memento::snap
