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

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
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

// xxHash3 of a key and a payload (what a log entry's checksum covers).
uint64_t MessageChecksum(const MessageKey& key, const void* data, size_t bytes);

}  // namespace memento::trainer
