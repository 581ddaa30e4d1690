// Store: the coordination store interface (docs/coordination.md).
//
// A small key-value store with revisions, compare-and-swap, counters,
// blocking waits, watches and leases, shaped after etcd v3 so that an etcd
// backend can implement it without changing callers:
//
//   Set          -> Put (with lease)
//   Get / List   -> Range (key / prefix), revision from the response header
//   CompareAndSwap, Add -> Txn (compare value or create_revision == 0)
//   Wait, WatchPoll     -> Watch from a revision
//   GrantLease / KeepAlive / RevokeLease -> Lease API
//
// Every call takes a Deadline. Keys are arbitrary byte strings (by convention
// "/memento/<job>/..."), values arbitrary bytes.
//
// Thread safety: every implementation is safe to call from many threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::coord {

// 0 means "no lease".
using LeaseId = int64_t;

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  LeaseId lease = 0;
};

struct ListResult {
  std::vector<KeyValue> kvs;  // sorted by key
  int64_t revision = 0;       // store revision the listing reflects
  uint64_t epoch = 0;         // changes when the store restarts empty
};

struct WatchEvent {
  enum class Type : uint8_t { kPut = 0, kDelete = 1 };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision (the deletion's revision) only
};

struct WatchBatch {
  std::vector<WatchEvent> events;  // in revision order
  int64_t revision = 0;            // poll again with after_revision = revision
  uint64_t epoch = 0;
};

struct CasResult {
  bool swapped = false;
  std::optional<KeyValue> current;  // the key after the call (nullopt: absent)
};

class Store {
 public:
  virtual ~Store() = default;

  // Writes key = value, attached to `lease` when non-zero (the key is deleted
  // when the lease expires or is revoked). Returns the new revision.
  // NotFound when the lease does not exist (expired).
  [[nodiscard]] virtual Result<int64_t> Set(const std::string& key, const std::string& value,
                                            Deadline deadline, LeaseId lease = 0) = 0;
  // NotFound when the key does not exist.
  [[nodiscard]] virtual Result<KeyValue> Get(const std::string& key, Deadline deadline) = 0;
  // Every key starting with `prefix`, sorted.
  [[nodiscard]] virtual Result<ListResult> List(const std::string& prefix, Deadline deadline) = 0;
  // Sets key = desired only when its current value equals `expected`
  // (nullopt: only when the key does not exist). Not swapping is not an
  // error: see CasResult::swapped and ::current.
  [[nodiscard]] virtual Result<CasResult> CompareAndSwap(const std::string& key,
                                                         const std::optional<std::string>& expected,
                                                         const std::string& desired,
                                                         Deadline deadline, LeaseId lease = 0) = 0;
  // Adds `delta` to the decimal integer stored at key (absent = 0) and
  // returns the new value. InvalidArgument when the value is not an integer.
  [[nodiscard]] virtual Result<int64_t> Add(const std::string& key, int64_t delta,
                                            Deadline deadline) = 0;
  // Returns whether the key existed.
  [[nodiscard]] virtual Result<bool> Delete(const std::string& key, Deadline deadline) = 0;
  // Blocks until every key exists. DeadlineExceeded otherwise.
  [[nodiscard]] virtual Status Wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Events on keys starting with `prefix` with revision > after_revision.
  // Blocks until there is at least one or the deadline passes (then returns
  // an empty batch, OK). FailedPrecondition when after_revision is older than
  // the kept history or newer than the store (it restarted): re-List then.
  [[nodiscard]] virtual Result<WatchBatch> WatchPoll(const std::string& prefix,
                                                     int64_t after_revision, Deadline deadline) = 0;
  // A lease that expires `ttl_s` seconds after its last KeepAlive.
  [[nodiscard]] virtual Result<LeaseId> GrantLease(double ttl_s, Deadline deadline) = 0;
  // NotFound when the lease expired (its keys are gone) or never existed.
  [[nodiscard]] virtual Status KeepAlive(LeaseId lease, Deadline deadline) = 0;
  // Deletes the lease and its keys. NotFound when it does not exist.
  [[nodiscard]] virtual Status RevokeLease(LeaseId lease, Deadline deadline) = 0;
};

// Opens a store by URL:
//   tcp://host:port   the embedded store (EmbeddedStoreServer), authenticated
//                     with `token_path` (file) or MEMENTO_JOB_TOKEN
//   etcd://host:port[,host:port...]   a real etcd (EtcdStore, etcd_store.h);
//                     etcd's own user/password from MEMENTO_ETCD_USER and
//                     MEMENTO_ETCD_PASSWORD(_FILE); the job token is not used
// Unavailable when the store cannot be reached before the deadline.
[[nodiscard]] Result<std::unique_ptr<Store>> OpenStore(const std::string& url,
                                                       const std::string& token_path,
                                                       Deadline deadline);

// Watcher: calls `on_event` for every event under `prefix` after
// `after_revision`, on its own thread, never under a lock. When the store
// restarted or the history was compacted it re-lists the prefix and delivers
// every current key as a kPut (callers must be idempotent).
//
// Thread safety: Stop() from any thread except the callback's.
class Watcher {
 public:
  using Callback = std::function<void(const WatchEvent& event)>;
  // `store` must outlive the watcher.
  Watcher(Store* store, std::string prefix, int64_t after_revision, Callback on_event);
  ~Watcher() { Stop(); }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;
  void Stop();

 private:
  void Run();
  Store* const store_;
  const std::string prefix_;
  int64_t after_;
  const Callback on_event_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace memento::coord
