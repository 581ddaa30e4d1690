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
// Thread safety: none; one trainer thread owns a log.
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

// xxHash3 of a key and a payload (what a log entry's checksum covers).
uint64_t MessageChecksum(const MessageKey& key, const void* data, size_t bytes);

}  // namespace memento::trainer
