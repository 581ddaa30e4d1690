// Background scrub: the agent re-verifies the checksums of the complete slots
// at rest, slowly, so that silent corruption (a flipped bit, a stray write)
// is found before a restore or a recovery needs the version
// (docs/node_store.md, "Background scrub").
//
//   auto scrub = Scrubber::Start(options, &node_store);   // a thread
//   scrub->Stats();                                       // passes, findings
//
// One pass visits every rank's complete slots (a slot being written is
// skipped) and hashes their data at no more than `bytes_per_s`; then the
// scrubber sleeps `interval_s` and starts the next pass. Verification goes
// through NodeStore::Verify, so a finding is recorded in the node's inventory
// for that slot's generation: `list` reports the version not intact, and in
// cluster mode the node's T0 inventory (T0Holdings, the peer service's
// Inventory) leaves it out, so the recovery planner does not count it. A
// writer that starts rewriting a slot during its check makes the check
// inconclusive (seqlock on state and generation), never a finding. The
// scrubber never writes a slot: restore relies on its own verification.
//
// After every pass, and as soon as a finding appears, the scrubber writes
// its report to <root>/scrub.json (replaced atomically, mode 0600), which
// `memento inspect --tier memory` shows.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "shm/node_store.h"

namespace memento::agent {

struct ScrubOptions {
  // Most bytes hashed per second (a memory-bandwidth budget far below what
  // training uses); 0 turns the scrub off.
  uint64_t bytes_per_s = uint64_t{64} << 20;
  // Pause between the end of a pass and the start of the next. The first
  // pass starts one interval after Start() (adoption has just verified
  // everything).
  double interval_s = 60;
  // Hashing granularity: the rate is held to within one piece.
  uint64_t piece_bytes = uint64_t{1} << 20;
  // Where the report goes (<root>/scrub.json); empty: nowhere.
  std::string status_path;
};

// A complete slot whose checksums failed.
struct ScrubFinding {
  int rank = -1;
  int slot = -1;
  int64_t step = -1;
  uint64_t generation = 0;
  std::string error;
  uint64_t pass = 0;  // the pass that found it (1 = the first)
  int64_t found_unix_ns = 0;
};

struct ScrubStats {
  uint64_t passes = 0;           // completed passes
  uint64_t bytes = 0;            // data bytes hashed, all passes
  uint64_t slots_checked = 0;    // conclusive checks, all passes
  uint64_t slots_rewritten = 0;  // checks a concurrent rewrite made inconclusive
  double cpu_s = 0;              // the scrub thread's CPU-seconds, all passes
  int64_t last_pass_end_unix_ns = 0;
  // Findings still current: the slot has not been rewritten since.
  std::vector<ScrubFinding> corrupt;
};

class Scrubber {
 public:
  // Starts the scrub thread; null when options.bytes_per_s == 0.
  // REQUIRES: `store` outlives the Scrubber.
  static std::unique_ptr<Scrubber> Start(const ScrubOptions& options, shm::NodeStore* store);
  ~Scrubber();  // stops and joins (a pass in progress ends at its next piece)
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  ScrubStats Stats() EXCLUDES(mu_);
  // Waits until at least `passes` passes have completed. DeadlineExceeded
  // otherwise.
  Status WaitForPasses(uint64_t passes, Deadline deadline) EXCLUDES(mu_);

  // The report as JSON text (what <root>/scrub.json holds).
  std::string ReportJson() EXCLUDES(mu_);

 private:
  Scrubber(ScrubOptions options, shm::NodeStore* store)
      : options_(std::move(options)), store_(store) {}
  void Run();
  // One pass; false when stopped.
  bool Pass(uint64_t pass) EXCLUDES(mu_);
  // Sleeps so that `bytes` more keep the pass at or under the rate. False
  // when stopped.
  bool Pace(uint64_t bytes) EXCLUDES(mu_);
  bool SleepFor(double seconds) EXCLUDES(mu_);
  void WriteReport() EXCLUDES(mu_);

  const ScrubOptions options_;
  shm::NodeStore* const store_;
  std::thread thread_;
  // The pass's pacing clock (scrub thread only).
  TimePoint pace_start_;
  uint64_t pace_bytes_ = 0;

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  ScrubStats stats_ GUARDED_BY(mu_);
  // (rank, slot) -> the finding for the slot's current generation.
  std::map<std::pair<int, int>, ScrubFinding> findings_ GUARDED_BY(mu_);
};

}  // namespace memento::agent
