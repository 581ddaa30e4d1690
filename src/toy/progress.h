// The toy trainers' progress file: one line per event, each written with a
// single write(2) on an O_APPEND file, so a SIGKILL never leaves half a line
// and a test or the demo reads it while the trainer runs:
//   R <step> <digest> <restore_s> <seal_s>   restored <step> (digest of the whole state)
//   N <seal_s>                               nothing to restore: starts at step 0
//   S <step>                                 about to call Snapshot(step)
//   K <step>                                 snapshot <step> was skipped (its slot was held)
//   C <step> <copy_s> <fence_wait_s>         snapshot <step> is complete (its Fence returned OK)
//   D <step> <digest>                        state digest after the optimizer step <step>
//   E <message>                              an error; the trainer exits non-zero
//   X done                                   the last step is done and fenced
// A trainer that starts fresh may report "R 0 <digest> 0 <seal_s>" instead
// of N (RestoreReport::kFreshAsStepZero): the single-node crash tests check
// the initial state too.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "memento/status.h"

namespace memento::toy {

// The writer. Thread safety: one thread.
class ProgressLog {
 public:
  // A log that writes no lines (a trainer without --progress); its errors go
  // to stderr only.
  explicit ProgressLog(std::string program) : program_(std::move(program)) {}
  ~ProgressLog();
  ProgressLog(const ProgressLog&) = delete;
  ProgressLog& operator=(const ProgressLog&) = delete;

  // Opens (creates, appends to) `path`.
  [[nodiscard]] Status Open(const std::string& path);
  bool enabled() const { return fd_ >= 0; }

  // Writes `line` and a newline in one write(2); exits 3 when the write is
  // short (a test reading the file must never see half a line).
  void Emit(const std::string& line) const;
  // "E <message>", "<program>: <message>" on stderr, stdout flushed, then
  // _exit(code): a trainer that fails stops at once, without waiting in the
  // Client's destructor for copies or the agent.
  [[noreturn]] void Exit(const std::string& message, int code = 1) const;
  [[noreturn]] void Exit(const Status& status, int code = 1) const {
    Exit(status.ToString(), code);
  }
  const std::string& program() const { return program_; }

 private:
  std::string program_;
  int fd_ = -1;
};

// The reader: what a progress file says so far.
struct Progress {
  std::vector<std::pair<int64_t, uint64_t>> restored;  // R: (step, digest)
  double restore_s = 0;                                // R
  double seal_s = 0;                                   // R or N
  bool fresh = false;                                  // N
  std::map<int64_t, uint64_t> digests;                 // D
  int64_t max_started = -1;                            // S
  int64_t max_complete = -1;                           // C
  std::vector<int64_t> completed;                      // C
  double copy_s_sum = 0, fence_wait_s_sum = 0;         // C
  std::vector<int64_t> skipped;                        // K
  bool done = false;                                   // X
  std::string error;                                   // E (the message)
};

// Reads `path` (a missing file reads as no lines).
Progress ReadProgress(const std::string& path);

}  // namespace memento::toy
