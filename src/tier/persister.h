// Persister: streams committed versions to the durable tier in the background.
//
// The agent calls Offer(step, provider) for every committed version. Offer
// never blocks: it applies the policy (every K-th step, or every T seconds)
// and queues the version; a version still queued when a newer one is offered
// is dropped in favour of the newer one (coalescing). One background thread
// asks the provider for the bytes (a VersionView that pins them), writes them
// with WriteVersion under a bandwidth cap, and on node 0 commits the version
// and applies retention. A failed write is logged, counted and retried with
// exponential backoff, unless a newer version arrives first; the in-memory
// tiers are never touched (the provider's view is read-only).
//
// Thread safety: Offer, stats and WaitIdle may be called from any thread.
// Thread model: one worker thread plus the writer's I/O thread during a write
// (docs/durable_tier.md, "Threads").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "tier/env.h"
#include "tier/retention.h"
#include "tier/version_view.h"
#include "tier/writer.h"

namespace memento::tier {

// Produces the view of one version when the persister is ready to write it;
// NotFound (or any error) when the version is gone, and it is then skipped.
using VersionViewProvider = std::function<Result<VersionView>()>;

struct PersisterOptions {
  std::string root;                      // the durable directory (NFS, Lustre, bucket mount, disk)
  Env* env = nullptr;                    // Env::Default() when null; must outlive the Persister
  int64_t every_k_steps = 1;             // persist steps with step % K == 0 (0: off)
  double every_seconds = 0;              // also persist when this long since the last one (0: off)
  uint64_t bandwidth_bytes_per_sec = 0;  // write cap, 0 = unlimited
  WriteOptions write;                    // direct I/O, chunking (limiter/cancel are set internally)
  double commit_timeout_s = 120;         // node 0: how long to wait for the other nodes
  double retry_initial_s = 0.5;
  double retry_max_s = 30;
  bool apply_retention = true;  // node 0 only, after each successful commit
  RetentionPolicy retention;
};

enum class OfferResult {
  kQueued,           // will be written
  kReplacedPending,  // queued; an older queued version was dropped for it
  kSkippedByPolicy,  // not due (not a K-th step, T not elapsed)
  kStopped,          // the persister is shutting down
};

struct PersisterStats {
  int64_t last_persisted_step = -1;
  int64_t persisted = 0;  // versions written successfully
  int64_t failures = 0;   // failed attempts (each retried or superseded)
  int64_t dropped = 0;    // queued versions replaced by newer ones
  int64_t skipped = 0;    // provider could not supply the version
  uint64_t bytes_written = 0;
  double last_seconds = 0;
  double last_bytes_per_sec = 0;
  std::string last_error;  // empty after a success
  bool busy = false;       // a version is queued or being written
};

class Persister {
 public:
  // Starts the worker thread. InvalidArgument for an empty root.
  [[nodiscard]] static Result<std::unique_ptr<Persister>> Start(PersisterOptions options);
  // Stops (an in-flight write is cancelled and left incomplete).
  ~Persister();
  Persister(const Persister&) = delete;
  Persister& operator=(const Persister&) = delete;

  // Returns at once; see the class comment.
  OfferResult Offer(int64_t step, VersionViewProvider provider);

  // Blocks until nothing is queued or being written; false at the deadline.
  // A version waiting for its retry counts as queued.
  bool WaitIdle(Deadline deadline);

  PersisterStats stats() const;

  // Changes the bandwidth cap of the next chunks (0 = unlimited).
  void SetBandwidth(uint64_t bytes_per_sec) { limiter_.SetRate(bytes_per_sec); }

 private:
  explicit Persister(PersisterOptions options);
  void Run();

  struct Pending {
    int64_t step;
    VersionViewProvider provider;
  };

  const PersisterOptions options_;
  Env* const env_;
  RateLimiter limiter_;
  std::atomic<bool> cancel_{false};

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::optional<Pending> pending_ GUARDED_BY(mu_);
  bool in_flight_ GUARDED_BY(mu_) = false;
  TimePoint next_attempt_ GUARDED_BY(mu_);
  double backoff_s_ GUARDED_BY(mu_);
  std::optional<TimePoint> last_persist_start_ GUARDED_BY(mu_);
  PersisterStats stats_ GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace memento::tier
