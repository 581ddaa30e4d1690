// The pipeline message log for logging-based recovery (SWIFT 2.2, issue 19,
// docs/swift.md). Upstream backup: each stage keeps what it *sends* to a
// neighbouring stage (activations forward, their gradients backward), keyed
// by (step, micro-batch, sender, receiver, kind). It also keeps, for what it
// *receives*, only the checksum (8 bytes a message), so a replayed neighbour's
// recomputed output can be checked against what was really sent, and the
// step's job-wide scalars a lost stage cannot recompute alone (the global
// gradient norm's sum of squares). A committed version makes older entries
// garbage (Truncate).
//
// A lost stage is rebuilt by loading its last snapshot and replaying the
// logged inputs in (step, schedule) order (Trainer::RecoverByReplay). Every
// entry carries an xxHash3 checksum over its key and payload; a corrupted
// entry is DataLoss and the recovery falls back to the snapshot path.
//
// Files: WriteFile/ReadFile, magic MMPPLOG1, fixed-layout little-endian
// records (header, then per entry a record and its payload).
//
// Thread safety: none; one trainer thread owns a log (a PipelineLogWriter's
// worker changes it only under the writer's lock, between the owner's
// Drains).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "memento/status.h"

namespace memento::trainer {

enum class MessageKind : uint8_t {
  kActivation = 0,  // forward: stage s -> s + 1
  kGradient = 1,    // backward: stage s -> s - 1
  kGradNormSq = 2,  // the step's global sum of squared gradients (sender = receiver = own stage)
};

struct MessageKey {
  int64_t step = 0;
  int32_t micro_batch = 0;
  int32_t sender = 0;  // pipeline stage
  int32_t receiver = 0;
  MessageKind kind = MessageKind::kActivation;
  bool operator<(const MessageKey& o) const {
    return std::tie(step, micro_batch, sender, receiver, kind) <
           std::tie(o.step, o.micro_batch, o.sender, o.receiver, o.kind);
  }
  std::string ToString() const;
};

class PipelineLog {
 public:
  // Keeps a copy of a sent message (or a scalar, as bytes).
  void AppendSent(const MessageKey& key, const void* data, size_t bytes);
  // Keeps the checksum of a received message.
  void RecordReceived(const MessageKey& key, const void* data, size_t bytes);
  // The same with the copy and checksum already made (PipelineLogWriter's
  // worker makes them outside its lock): `checksum` is
  // MessageChecksum(key, payload) / of the received payload.
  void InsertSent(const MessageKey& key, std::string payload, uint64_t checksum);
  void InsertReceived(const MessageKey& key, uint64_t checksum);
  // Drops every entry of steps <= `step` (a version at `step` committed).
  void Truncate(int64_t step);
  // Moves every entry of step `step` out into a log of its own (no payload
  // is copied).
  PipelineLog TakeStep(int64_t step);

  // The payload of a sent message: NotFound naming the key when it was not
  // logged, DataLoss when its checksum does not match.
  Result<const std::string*> Sent(const MessageKey& key) const;
  // The checksum of a received message's payload (NotFound when absent).
  Result<uint64_t> ReceivedChecksum(const MessageKey& key) const;

  // Payload bytes held (sent messages only).
  uint64_t bytes() const { return bytes_; }
  size_t num_sent() const { return sent_.size(); }
  size_t num_received() const { return received_.size(); }

  [[nodiscard]] Status WriteFile(const std::string& path) const;
  // InvalidArgument / DataLoss naming the file and field when it is not a
  // log, of another version, truncated, or an entry fails its checksum.
  static Result<PipelineLog> ReadFile(const std::string& path);
  // A stage's log at `path`: the file WriteFile wrote there, or else the
  // step files a PipelineLogSpool keeps (`path.step<s>`), merged. NotFound
  // when there is neither; ReadFile's errors for a bad file, naming it.
  static Result<PipelineLog> ReadAny(const std::string& path);
  // Merges another stage's log (a replacement reads its neighbours' logs).
  void Merge(const PipelineLog& other);

  // Flips one payload bit of the sent message `key` (checksum tests).
  void CorruptForTest(const MessageKey& key);

 private:
  struct SentMessage {
    std::string payload;
    uint64_t checksum = 0;  // over key and payload
  };
  std::map<MessageKey, SentMessage> sent_;
  std::map<MessageKey, uint64_t> received_;  // payload checksum
  uint64_t bytes_ = 0;
};

// The pipeline log kept in shared memory (SWIFT: "logging into the agent's
// shared memory, so it survives a trainer crash"): each completed step's
// entries are moved out of the trainer's log (PipelineLog::TakeStep, no
// copy on the trainer's thread) and written by a background thread to
// `<dir>/pipeline_log.rank<r>.step<s>` (the MMPPLOG1 format, every entry
// with its checksum; write then rename, so a step file is whole or absent).
// `dir` is a tmpfs directory (/dev/shm/..., a node's memory): the files
// outlive the process that wrote them, so a stage killed by SIGKILL leaves
// its log behind; a neighbour's replacement reads it with
// PipelineLog::ReadAny("<dir>/pipeline_log.rank<r>"). Truncate(step)
// unlinks the files of steps <= step, in order with the writes.
//
// Thread safety: Submit, Truncate and Flush from the trainer's thread; one
// writer thread of its own.
class PipelineLogSpool {
 public:
  // mkdir -p `dir`; the writer thread starts.
  static Result<std::unique_ptr<PipelineLogSpool>> Create(const std::string& dir, int rank);
  ~PipelineLogSpool();  // writes what is queued, then joins the thread
  PipelineLogSpool(const PipelineLogSpool&) = delete;
  PipelineLogSpool& operator=(const PipelineLogSpool&) = delete;

  static std::string BasePath(const std::string& dir, int rank);
  static std::string StepPath(const std::string& dir, int rank, int64_t step);

  // Queues step `step`'s entries (replacing a file of that step).
  void Submit(int64_t step, PipelineLog entries);
  // Queues the removal of step files <= `step`.
  void Truncate(int64_t step);
  // Waits until everything queued is written; the first write error since
  // the last Flush (the step file is then missing: a replay that needs it
  // fails and falls back to the snapshot).
  [[nodiscard]] Status Flush();

  // Written so far: bytes (files) and the writer thread's seconds.
  uint64_t bytes_written() const;
  double write_seconds() const;

 private:
  PipelineLogSpool(std::string dir, int rank);
  void Run();
  struct Task {
    int64_t step = 0;
    bool truncate = false;
    PipelineLog log;
  };
  const std::string dir_;
  const int rank_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false, stop_ = false;
  Status error_;
  uint64_t bytes_written_ = 0;
  double write_seconds_ = 0;
  std::thread thread_;
};

// Takes the copy of each logged message off the trainer's thread (issue 19:
// "logging runs off the critical path"). With kThread the trainer queues
// (key, pointer, size) at each send and receive, and a worker thread copies
// the payload, computes its checksum and puts the entry into the log while
// the trainer computes or waits for its next message (its pipeline bubble).
// kInline does the copy in the call, as the log did before.
//
// Ordering rules, which keep the log exactly what the inline copy made:
//  - the caller keeps a queued message's bytes untouched until a Fence over
//    them, or a Drain, returns (the trainer fences a buffer before it writes
//    it: before a receive into it, before the forward that writes a slot's
//    output); a payload of at most kOwnedBytes (the gradient norm, a stack
//    variable) is copied into the job at once instead;
//  - Fence and Drain do every queued job they need on the calling thread
//    instead of waiting for the worker to reach it, and wait only for a job
//    the worker is in the middle of (a copy of one message), so a slow
//    worker costs at most the inline copy;
//  - the log is read or changed by its owner (TakeStep, Truncate, WriteFile,
//    Sent) only after Drain: the trainer drains at the end of every step,
//    on success and on failure, so no job is pending outside Trainer::Step
//    and a step's entries are complete and checksummed before the spool
//    writes them or a recovery reads them.
//
// Thread safety: everything from one thread, the log's owner; one worker
// thread of its own (kThread), which writes the log only under mu_.
class PipelineLogWriter {
 public:
  enum class Mode { kInline, kThread };
  static constexpr size_t kOwnedBytes = 256;
  // "inline" | "thread"; InvalidArgument naming `name` otherwise.
  static Result<Mode> ParseMode(const std::string& name);
  static const char* ModeName(Mode mode);

  // `log` must outlive the writer.
  PipelineLogWriter(PipelineLog* log, Mode mode);
  ~PipelineLogWriter();  // Drain, then the worker ends
  PipelineLogWriter(const PipelineLogWriter&) = delete;
  PipelineLogWriter& operator=(const PipelineLogWriter&) = delete;

  // Queues (kInline: does) PipelineLog::AppendSent / RecordReceived.
  // REQUIRES: data[0, bytes) untouched until a Fence over it or Drain.
  void AppendSent(const MessageKey& key, const void* data, size_t bytes);
  void RecordReceived(const MessageKey& key, const void* data, size_t bytes);
  // Returns once no job reads [data, data + bytes): the caller may write it.
  void Fence(const void* data, size_t bytes);
  // Returns once every job is done: the log holds every entry queued.
  void Drain();

  Mode mode() const { return mode_; }
  // Jobs done on the caller's thread by Fence or Drain (the worker had not
  // reached them), and by the worker, since construction.
  uint64_t jobs_by_caller() const;
  uint64_t jobs_by_worker() const;
  // CPU seconds of the worker thread so far.
  double worker_cpu_seconds() const;

  // Tests: the worker takes no new job until ResumeWorkerForTest (every
  // job is then done by Fence and Drain, i.e. a worker that fell behind).
  void PauseWorkerForTest();
  void ResumeWorkerForTest();

 private:
  struct Job {
    MessageKey key;
    const char* data = nullptr;
    size_t bytes = 0;
    bool sent = false;
    bool running = false;  // the worker took it
    std::string owned;     // small payloads (kOwnedBytes), copied at once
  };
  void Enqueue(const MessageKey& key, const void* data, size_t bytes, bool sent);
  // Copies / checksums outside the lock, then puts the entry in under it.
  void Run(const Job& job);
  void Worker();

  PipelineLog* const log_;
  const Mode mode_;
  mutable std::mutex mu_;
  std::condition_variable cv_;             // a job queued, finished, or stop_
  std::deque<std::unique_ptr<Job>> jobs_;  // queued or running
  size_t queued_ = 0;                      // jobs_ not yet running
  bool stop_ = false, paused_ = false;
  uint64_t by_caller_ = 0, by_worker_ = 0;
  double worker_cpu_ = 0;
  std::thread thread_;
};

// xxHash3 of a key and a payload (what a log entry's checksum covers).
uint64_t MessageChecksum(const MessageKey& key, const void* data, size_t bytes);

}  // namespace memento::trainer
