#include "coord/memory_store.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <random>

namespace memento::coord {
namespace {

uint64_t RandomEpoch() {
  uint64_t e = 0;
  if (getrandom(&e, sizeof(e), 0) != sizeof(e)) {
    e = std::random_device{}() ^ static_cast<uint64_t>(Now().time_since_epoch().count());
  }
  return e | 1;  // never 0
}

bool HasPrefix(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

Result<int64_t> ParseInt(const std::string& key, const std::string& v) {
  if (v.empty()) return int64_t{0};
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') {
    return InvalidArgumentError(
        fmt::format("Add on key '{}': value '{}' is not a decimal integer", key, v.substr(0, 40)));
  }
  return static_cast<int64_t>(x);
}

}  // namespace

MemoryStore::MemoryStore(size_t history_limit)
    : history_limit_(std::max<size_t>(history_limit, 16)), epoch_(RandomEpoch()) {
  {
    MutexLock l(&mu_);
    // Lease ids differ between store incarnations, so a lease of a previous
    // store is never mistaken for a new one.
    next_lease_ = static_cast<LeaseId>((epoch_ & 0x3fffffff) << 32) + 1;
  }
  reaper_ = std::thread([this] { ReapLoop(); });
}

MemoryStore::~MemoryStore() { Close(); }

void MemoryStore::Close() {
  {
    MutexLock l(&mu_);
    closed_ = true;
  }
  changed_.SignalAll();
  if (reaper_.joinable() && reaper_.get_id() != std::this_thread::get_id()) reaper_.join();
}

void MemoryStore::ReapLoop() {
  MutexLock l(&mu_);
  while (!closed_) {
    ExpireLocked(Now());
    changed_.WaitUntil(&l, Now() + std::chrono::milliseconds(20));
  }
}

Status MemoryStore::CheckOpen() {
  if (closed_) return UnavailableError("store is shutting down");
  return Status::Ok();
}

int64_t MemoryStore::revision() {
  MutexLock l(&mu_);
  return revision_;
}

void MemoryStore::RecordLocked(WatchEvent ev) {
  history_.push_back(std::move(ev));
  while (history_.size() > history_limit_) {
    compacted_ = history_.front().kv.mod_revision;
    history_.pop_front();
  }
  changed_.SignalAll();
}

int64_t MemoryStore::PutLocked(const std::string& key, const std::string& value, LeaseId lease) {
  int64_t rev = ++revision_;
  auto it = kv_.find(key);
  if (it != kv_.end() && it->second.lease != 0 && it->second.lease != lease) {
    auto l = leases_.find(it->second.lease);
    if (l != leases_.end()) l->second.keys.erase(key);
  }
  KeyValue& kv = kv_[key];
  if (kv.create_revision == 0) kv.create_revision = rev;
  kv.key = key;
  kv.value = value;
  kv.mod_revision = rev;
  kv.lease = lease;
  if (lease != 0) leases_[lease].keys.insert(key);
  RecordLocked(WatchEvent{WatchEvent::Type::kPut, kv});
  return rev;
}

void MemoryStore::DeleteLocked(const std::string& key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return;
  if (it->second.lease != 0) {
    auto l = leases_.find(it->second.lease);
    if (l != leases_.end()) l->second.keys.erase(key);
  }
  kv_.erase(it);
  WatchEvent ev;
  ev.type = WatchEvent::Type::kDelete;
  ev.kv.key = key;
  ev.kv.mod_revision = ++revision_;
  RecordLocked(std::move(ev));
}

void MemoryStore::ExpireLocked(TimePoint now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry <= now) {
      std::set<std::string> keys = std::move(it->second.keys);
      it = leases_.erase(it);
      for (const auto& k : keys) DeleteLocked(k);
    } else {
      ++it;
    }
  }
}

void MemoryStore::WaitChange(MutexLock* l, Deadline deadline) {
  if (deadline.infinite()) {
    changed_.Wait(l);
  } else {
    changed_.WaitUntil(l, deadline.when());
  }
}

Result<int64_t> MemoryStore::Set(const std::string& key, const std::string& value, Deadline,
                                 LeaseId lease) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  if (lease != 0 && leases_.count(lease) == 0) {
    return NotFoundError(fmt::format("lease {:x} does not exist (expired?)", lease));
  }
  return PutLocked(key, value, lease);
}

Result<KeyValue> MemoryStore::Get(const std::string& key, Deadline) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  auto it = kv_.find(key);
  if (it == kv_.end()) return NotFoundError(fmt::format("key '{}' not found", key));
  return it->second;
}

Result<ListResult> MemoryStore::List(const std::string& prefix, Deadline) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  ListResult r;
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && HasPrefix(it->first, prefix); ++it) {
    r.kvs.push_back(it->second);
  }
  r.revision = revision_;
  r.epoch = epoch_;
  return r;
}

Result<CasResult> MemoryStore::CompareAndSwap(const std::string& key,
                                              const std::optional<std::string>& expected,
                                              const std::string& desired, Deadline, LeaseId lease) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  if (lease != 0 && leases_.count(lease) == 0) {
    return NotFoundError(fmt::format("lease {:x} does not exist (expired?)", lease));
  }
  auto it = kv_.find(key);
  bool match =
      expected.has_value() ? (it != kv_.end() && it->second.value == *expected) : it == kv_.end();
  CasResult r;
  if (match) {
    PutLocked(key, desired, lease);
    r.swapped = true;
    r.current = kv_[key];
  } else if (it != kv_.end()) {
    r.current = it->second;
  }
  return r;
}

Result<int64_t> MemoryStore::Add(const std::string& key, int64_t delta, Deadline) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  auto it = kv_.find(key);
  int64_t v = 0;
  LeaseId lease = 0;
  if (it != kv_.end()) {
    MEMENTO_ASSIGN_OR_RETURN(v, ParseInt(key, it->second.value));
    lease = it->second.lease;
  }
  if (__builtin_add_overflow(v, delta, &v)) {
    return InvalidArgumentError(
        fmt::format("add {} to '{}' overflows a 64-bit counter", delta, key));
  }
  PutLocked(key, std::to_string(v), lease);
  return v;
}

Result<bool> MemoryStore::Delete(const std::string& key, Deadline) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  bool existed = kv_.count(key) != 0;
  DeleteLocked(key);
  return existed;
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  MutexLock l(&mu_);
  for (;;) {
    MEMENTO_RETURN_IF_ERROR(CheckOpen());
    size_t missing = 0;
    const std::string* first = nullptr;
    for (const auto& k : keys) {
      if (kv_.count(k) == 0) {
        if (!first) first = &k;
        ++missing;
      }
    }
    if (missing == 0) return Status::Ok();
    if (deadline.expired()) {
      return DeadlineExceededError(fmt::format("wait: {} of {} keys still missing (first: '{}')",
                                               missing, keys.size(), *first));
    }
    // Check the keys again after any wake-up, the deadline's included: a key
    // that arrived just before it counts.
    WaitChange(&l, deadline);
  }
}

Result<WatchBatch> MemoryStore::WatchPoll(const std::string& prefix, int64_t after_revision,
                                          Deadline deadline) {
  MutexLock l(&mu_);
  for (;;) {
    MEMENTO_RETURN_IF_ERROR(CheckOpen());
    if (after_revision > revision_) {
      return FailedPreconditionError(fmt::format(
          "watch from revision {} but the store is at {} (restarted?)", after_revision, revision_));
    }
    if (after_revision < compacted_) {
      return FailedPreconditionError(fmt::format(
          "watch from revision {}: history compacted up to {}", after_revision, compacted_));
    }
    // The batch covers the history up to the revision scanned here, under the
    // lock: never more. (Reporting the store's revision after a wait instead
    // skipped every change that landed during a wait that then timed out, and
    // the caller's next poll started past it: commits stalled for 10 s.)
    WatchBatch b;
    b.revision = revision_;
    b.epoch = epoch_;
    // History is in revision order; find the first event after after_revision.
    auto it =
        std::upper_bound(history_.begin(), history_.end(), after_revision,
                         [](int64_t r, const WatchEvent& e) { return r < e.kv.mod_revision; });
    for (; it != history_.end(); ++it) {
      if (HasPrefix(it->kv.key, prefix)) b.events.push_back(*it);
    }
    if (!b.events.empty() || deadline.expired()) return b;
    after_revision = b.revision;  // nothing relevant up to here
    // Woken by a change or by the deadline: either way scan again, so a change
    // that landed just before the deadline is returned now.
    WaitChange(&l, deadline);
  }
}

Result<LeaseId> MemoryStore::GrantLease(double ttl_s, Deadline) {
  if (!(ttl_s > 0) || ttl_s > 86400) {
    return InvalidArgumentError(fmt::format("lease ttl {} s must be in (0, 86400]", ttl_s));
  }
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  LeaseId id = next_lease_++;
  Lease& lease = leases_[id];
  lease.ttl = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(ttl_s));
  lease.expiry = Now() + lease.ttl;
  return id;
}

Status MemoryStore::KeepAlive(LeaseId id, Deadline) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  ExpireLocked(Now());
  auto it = leases_.find(id);
  if (it == leases_.end()) return NotFoundError(fmt::format("lease {:x} expired or unknown", id));
  it->second.expiry = Now() + it->second.ttl;
  return Status::Ok();
}

Status MemoryStore::RevokeLease(LeaseId id, Deadline) {
  MutexLock l(&mu_);
  MEMENTO_RETURN_IF_ERROR(CheckOpen());
  auto it = leases_.find(id);
  if (it == leases_.end()) return NotFoundError(fmt::format("lease {:x} expired or unknown", id));
  std::set<std::string> keys = std::move(it->second.keys);
  leases_.erase(it);
  for (const auto& k : keys) DeleteLocked(k);
  return Status::Ok();
}

}  // namespace memento::coord
