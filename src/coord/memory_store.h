// MemoryStore: the in-process Store that the embedded TCP store serves. Also
// usable directly (tests, single-process setups).
//
// Keeps keys in a sorted map, a revision counter, the last `history_limit`
// events for watches, and leases with expiry times. A reaper thread expires
// leases (every 20 ms). `epoch` is random per instance, so clients can tell
// a restarted (empty) store from the old one.
//
// Thread safety: all methods are thread-safe; blocking calls wait on a
// condition variable and are woken by every change and by Close().
#pragma once

#include <deque>
#include <map>
#include <set>
#include <thread>

#include "common/mutex.h"
#include "coord/store.h"

namespace memento::coord {

class MemoryStore : public Store {
 public:
  explicit MemoryStore(size_t history_limit = 65536);
  ~MemoryStore() override;

  Result<int64_t> Set(const std::string& key, const std::string& value, Deadline deadline,
                      LeaseId lease = 0) override EXCLUDES(mu_);
  Result<KeyValue> Get(const std::string& key, Deadline deadline) override EXCLUDES(mu_);
  Result<ListResult> List(const std::string& prefix, Deadline deadline) override EXCLUDES(mu_);
  Result<CasResult> CompareAndSwap(const std::string& key,
                                   const std::optional<std::string>& expected,
                                   const std::string& desired, Deadline deadline,
                                   LeaseId lease = 0) override EXCLUDES(mu_);
  Result<int64_t> Add(const std::string& key, int64_t delta, Deadline deadline) override
      EXCLUDES(mu_);
  Result<bool> Delete(const std::string& key, Deadline deadline) override EXCLUDES(mu_);
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override EXCLUDES(mu_);
  Result<WatchBatch> WatchPoll(const std::string& prefix, int64_t after_revision,
                               Deadline deadline) override EXCLUDES(mu_);
  Result<LeaseId> GrantLease(double ttl_s, Deadline deadline) override EXCLUDES(mu_);
  Status KeepAlive(LeaseId lease, Deadline deadline) override EXCLUDES(mu_);
  Status RevokeLease(LeaseId lease, Deadline deadline) override EXCLUDES(mu_);

  // Wakes every blocked call (they return Unavailable) and stops the reaper.
  void Close() EXCLUDES(mu_);
  uint64_t epoch() const { return epoch_; }
  int64_t revision() EXCLUDES(mu_);

 private:
  struct Lease {
    Duration ttl;
    TimePoint expiry;
    std::set<std::string> keys;
  };
  Status CheckOpen() REQUIRES(mu_);
  int64_t PutLocked(const std::string& key, const std::string& value, LeaseId lease) REQUIRES(mu_);
  void DeleteLocked(const std::string& key) REQUIRES(mu_);
  void RecordLocked(WatchEvent ev) REQUIRES(mu_);
  void ExpireLocked(TimePoint now) REQUIRES(mu_);
  // Waits for a change or the deadline (whichever comes first). Callers
  // re-check their condition after it returns, whatever woke them.
  void WaitChange(MutexLock* l, Deadline deadline) REQUIRES(mu_);
  void ReapLoop();

  const size_t history_limit_;
  const uint64_t epoch_;
  Mutex mu_;
  CondVar changed_;
  std::map<std::string, KeyValue> kv_ GUARDED_BY(mu_);
  std::map<LeaseId, Lease> leases_ GUARDED_BY(mu_);
  std::deque<WatchEvent> history_ GUARDED_BY(mu_);
  int64_t revision_ GUARDED_BY(mu_) = 0;
  int64_t compacted_ GUARDED_BY(mu_) = 0;  // history holds events with revision > compacted_
  LeaseId next_lease_ GUARDED_BY(mu_) = 1;
  bool closed_ GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace memento::coord
