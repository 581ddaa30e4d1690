#include "coord/commit.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <type_traits>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"

namespace memento::coord {

// ---- CommitTracker -----------------------------------------------------------

CommitTracker::CommitTracker(std::set<std::string> members, int64_t committed)
    : members_(std::move(members)), committed_(committed) {}

std::optional<int64_t> CommitTracker::OnCompleted(int64_t step, const std::string& node) {
  if (step <= committed_) return std::nullopt;
  reports_[step].insert(node);
  return Evaluate();
}

std::optional<int64_t> CommitTracker::SetMembers(std::set<std::string> members) {
  members_ = std::move(members);
  return Evaluate();
}

void CommitTracker::ObserveCommitted(int64_t step) {
  if (step <= committed_) return;
  committed_ = step;
  reports_.erase(reports_.begin(), reports_.upper_bound(step));
}

std::optional<int64_t> CommitTracker::Evaluate() {
  if (members_.empty()) return std::nullopt;  // an empty job commits nothing
  // The highest step every member reported wins; older pending steps are
  // superseded by it.
  for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
    const std::set<std::string>& got = it->second;
    if (std::includes(got.begin(), got.end(), members_.begin(), members_.end())) {
      int64_t step = it->first;
      for (auto p = reports_.begin(); p != reports_.end() && p->first < step; ++p) {
        superseded_.push_back(p->first);
      }
      ObserveCommitted(step);
      return step;
    }
  }
  return std::nullopt;
}

std::set<std::string> CommitTracker::Missing(int64_t step) const {
  std::set<std::string> out;
  auto it = reports_.find(step);
  for (const auto& m : members_) {
    if (it == reports_.end() || it->second.count(m) == 0) out.insert(m);
  }
  return out;
}

std::vector<int64_t> CommitTracker::TakeSuperseded() {
  std::vector<int64_t> out;
  out.swap(superseded_);
  return out;
}

std::vector<int64_t> CommitTracker::PendingSteps() const {
  std::vector<int64_t> out;
  for (const auto& [s, _] : reports_) out.push_back(s);
  return out;
}

// ---- CommitLog --------------------------------------------------------------

namespace {

constexpr uint32_t kLogMagic = 0x474C434D;  // "MCLG"
constexpr uint16_t kLogVersion = 1;

struct LogRecord {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int64_t step;
  int64_t wall_ns;
  uint64_t checksum;  // xxHash3 of the 24 bytes before it
};
static_assert(sizeof(LogRecord) == 32);
static_assert(std::is_trivially_copyable_v<LogRecord>);

LogRecord MakeRecord(const CommitRecord& c) {
  LogRecord r{kLogMagic, kLogVersion, 0, c.step, c.wall_ns, 0};
  r.checksum = Checksum(&r, offsetof(LogRecord, checksum));
  return r;
}

Status WriteAllFd(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError(fmt::format("write {}", path), errno);
    c += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CommitLog>> CommitLog::Open(const std::string& path, size_t compact_above) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(fmt::format("open commit log {}", path), errno);
  std::unique_ptr<CommitLog> log(new CommitLog(path, fd, compact_above));
  MutexLock l(&log->mu_);
  off_t good = 0;
  for (;;) {
    LogRecord r;
    ssize_t n = pread(fd, &r, sizeof(r), good);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(fmt::format("read commit log {}", path), errno);
    if (n < static_cast<ssize_t>(sizeof(r))) break;
    bool valid = r.magic == kLogMagic && r.version == kLogVersion &&
                 r.checksum == Checksum(&r, offsetof(LogRecord, checksum)) &&
                 (log->records_.empty() || r.step > log->records_.back().step);
    if (!valid) break;
    log->records_.push_back({r.step, r.wall_ns});
    good += sizeof(r);
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size != good) {
    MEMENTO_LOG_WARN("coord: commit log {}: dropping {} bytes of torn or invalid records", path,
                     st.st_size - good);
    if (ftruncate(fd, good) < 0) return ErrnoError(fmt::format("truncate {}", path), errno);
  }
  return log;
}

CommitLog::~CommitLog() {
  MutexLock l(&mu_);
  if (fd_ >= 0) close(fd_);
}

Result<bool> CommitLog::Append(int64_t step, int64_t wall_ns) {
  MutexLock l(&mu_);
  if (!records_.empty() && step <= records_.back().step) return false;
  LogRecord r = MakeRecord({step, wall_ns});
  MEMENTO_RETURN_IF_ERROR(WriteAllFd(fd_, &r, sizeof(r), path_));
  if (fdatasync(fd_) < 0) return ErrnoError(fmt::format("fdatasync {}", path_), errno);
  records_.push_back({step, wall_ns});
  if (records_.size() > compact_above_) MEMENTO_RETURN_IF_ERROR(CompactLocked());
  return true;
}

Status CommitLog::CompactLocked() {
  size_t keep_n = std::min<size_t>(64, compact_above_ / 2);
  std::vector<CommitRecord> keep(records_.end() - static_cast<ptrdiff_t>(keep_n), records_.end());
  std::string tmp = path_ + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(fmt::format("open {}", tmp), errno);
  Status s;
  for (const auto& c : keep) {
    LogRecord r = MakeRecord(c);
    s = WriteAllFd(fd, &r, sizeof(r), tmp);
    if (!s.ok()) break;
  }
  if (s.ok() && fsync(fd) < 0) s = ErrnoError(fmt::format("fsync {}", tmp), errno);
  close(fd);
  if (s.ok() && rename(tmp.c_str(), path_.c_str()) < 0) {
    s = ErrnoError(fmt::format("rename {}", tmp), errno);
  }
  if (!s.ok()) return s;
  int nfd = open(path_.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (nfd < 0) return ErrnoError(fmt::format("reopen {}", path_), errno);
  close(fd_);
  fd_ = nfd;
  records_ = std::move(keep);
  return Status::Ok();
}

std::optional<CommitRecord> CommitLog::latest() {
  MutexLock l(&mu_);
  if (records_.empty()) return std::nullopt;
  return records_.back();
}

std::vector<CommitRecord> CommitLog::records() {
  MutexLock l(&mu_);
  return records_;
}

// ---- store helpers ------------------------------------------------------------

Status ReportCompleted(Store& store, const std::string& job, const std::string& node, int64_t step,
                       Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  MEMENTO_RETURN_IF_ERROR(ValidateName("node", node));
  if (step < 0) return InvalidArgumentError(fmt::format("step {} must be >= 0", step));
  return store.Set(JobKeys(job).Completed(step, node), std::to_string(WallNanos()), deadline)
      .status();
}

Result<bool> PublishCommit(Store& store, const std::string& job, int64_t step, int64_t wall_ns,
                           Deadline deadline) {
  JobKeys keys(job);
  MEMENTO_RETURN_IF_ERROR(store.Set(keys.Commit(step), std::to_string(wall_ns), deadline).status());
  for (;;) {
    std::optional<std::string> expected;
    auto cur = store.Get(keys.CommitLatest(), deadline);
    if (cur.ok()) {
      expected = cur->value;
      char* end = nullptr;
      long long v = std::strtoll(cur->value.c_str(), &end, 10);
      if (*end == '\0' && !cur->value.empty() && v >= step) return false;
    } else if (cur.status().code() != StatusCode::kNotFound) {
      return cur.status();
    }
    MEMENTO_ASSIGN_OR_RETURN(CasResult c, store.CompareAndSwap(keys.CommitLatest(), expected,
                                                               std::to_string(step), deadline));
    if (c.swapped) return true;
  }
}

Result<int64_t> ReadLatestCommit(Store& store, const std::string& job, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(KeyValue kv, store.Get(JobKeys(job).CommitLatest(), deadline));
  char* end = nullptr;
  long long v = std::strtoll(kv.value.c_str(), &end, 10);
  if (kv.value.empty() || *end != '\0' || v < 0) {
    return DataLossError(
        fmt::format("commit/latest of job {} holds '{}', not a step", job, kv.value.substr(0, 40)));
  }
  return static_cast<int64_t>(v);
}

Status RepublishCommits(Store& store, const std::string& job, CommitLog& log, Deadline deadline) {
  auto latest = log.latest();
  if (!latest) return Status::Ok();
  auto moved = PublishCommit(store, job, latest->step, latest->wall_ns, deadline);
  if (!moved.ok()) return moved.status();
  if (*moved) {
    MEMENTO_LOG_INFO("coord: republished commit of step {} for job {}", latest->step, job);
  }
  return Status::Ok();
}

// ---- CommitCoordinator ----------------------------------------------------------

CommitCoordinator::CommitCoordinator(Store* store, std::string job, std::set<std::string> members,
                                     int64_t committed, OnCommit on_commit)
    : store_(store),
      job_(std::move(job)),
      keys_(job_),
      on_commit_(std::move(on_commit)),
      tracker_(std::move(members), committed) {}

Result<std::unique_ptr<CommitCoordinator>> CommitCoordinator::Start(Store* store, std::string job,
                                                                    std::set<std::string> members,
                                                                    Deadline deadline,
                                                                    OnCommit on_commit) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  int64_t committed = -1;
  auto latest = ReadLatestCommit(*store, job, deadline);
  if (latest.ok()) {
    committed = *latest;
  } else if (latest.status().code() != StatusCode::kNotFound) {
    return latest.status();
  }
  std::unique_ptr<CommitCoordinator> c(new CommitCoordinator(
      store, std::move(job), std::move(members), committed, std::move(on_commit)));
  MEMENTO_ASSIGN_OR_RETURN(ListResult reports, store->List(c->keys_.CompletedPrefix(), deadline));
  for (auto& kv : reports.kvs) c->OnEvent(WatchEvent{WatchEvent::Type::kPut, std::move(kv)});
  CommitCoordinator* self = c.get();
  c->cleaner_ = std::thread([self] { self->Clean(); });
  c->watcher_ = std::make_unique<Watcher>(store, c->keys_.CompletedPrefix(), reports.revision,
                                          [self](const WatchEvent& ev) { self->OnEvent(ev); });
  return c;
}

CommitCoordinator::~CommitCoordinator() {
  watcher_.reset();
  {
    MutexLock l(&clean_mu_);
    clean_stop_ = true;
  }
  clean_cv_.SignalAll();
  if (cleaner_.joinable()) cleaner_.join();
}

void CommitCoordinator::OnEvent(const WatchEvent& ev) {
  if (ev.type != WatchEvent::Type::kPut) return;
  std::string rest = ev.kv.key.substr(keys_.CompletedPrefix().size());
  size_t slash = rest.find('/');
  if (slash == std::string::npos) return;
  auto step = ParseStep(rest.substr(0, slash));
  if (!step.ok()) {
    MEMENTO_LOG_WARN("coord: ignoring report key {}: {}", ev.kv.key, step.status().ToString());
    return;
  }
  std::optional<int64_t> committed;
  std::vector<int64_t> superseded;
  {
    MutexLock l(&mu_);
    committed = tracker_.OnCompleted(*step, rest.substr(slash + 1));
    superseded = tracker_.TakeSuperseded();
  }
  if (committed) Commit(*committed, std::move(superseded));
}

void CommitCoordinator::SetMembers(std::set<std::string> members) {
  std::optional<int64_t> committed;
  std::vector<int64_t> superseded;
  {
    MutexLock l(&mu_);
    committed = tracker_.SetMembers(std::move(members));
    superseded = tracker_.TakeSuperseded();
  }
  if (committed) Commit(*committed, std::move(superseded));
}

int64_t CommitCoordinator::committed() {
  MutexLock l(&mu_);
  return tracker_.committed();
}

void CommitCoordinator::Commit(int64_t step, std::vector<int64_t> superseded) {
  int64_t now = WallNanos();
  Deadline d = Deadline::AfterSeconds(10);
  Status s;
  while (!d.expired()) {
    auto moved = PublishCommit(*store_, job_, step, now, d);
    s = moved.status();
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!s.ok()) {
    MEMENTO_LOG_ERROR("coord: could not publish the commit of step {}: {}", step, s.ToString());
    return;
  }
  MEMENTO_LOG_INFO("coord: job {} committed step {}", job_, step);
  // Reports of committed steps are no longer needed: the cleaner deletes them.
  {
    MutexLock l(&clean_mu_);
    clean_through_ = std::max(clean_through_, step);
  }
  clean_cv_.Signal();
  if (on_commit_) on_commit_(step, superseded);
}

void CommitCoordinator::Clean() {
  int64_t done = -1;
  for (;;) {
    int64_t step;
    {
      MutexLock l(&clean_mu_);
      while (!clean_stop_ && clean_through_ <= done) clean_cv_.Wait(&l);
      if (clean_stop_) return;
      step = clean_through_;
    }
    Deadline d = Deadline::AfterSeconds(10);
    auto reports = store_->List(keys_.CompletedPrefix(), d);
    if (!reports.ok()) continue;  // the next commit tries again
    for (const auto& kv : reports->kvs) {
      std::string rest = kv.key.substr(keys_.CompletedPrefix().size());
      auto s2 = ParseStep(rest.substr(0, rest.find('/')));
      if (s2.ok() && *s2 <= step) store_->Delete(kv.key, d).status().IgnoreError();
      MutexLock l(&clean_mu_);
      if (clean_stop_) return;
    }
    done = step;
  }
}

// ---- CommitFollower -----------------------------------------------------------

Result<std::unique_ptr<CommitFollower>> CommitFollower::Start(
    Store* store, std::string job, CommitLog* log, std::function<void(int64_t)> on_commit,
    Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  std::unique_ptr<CommitFollower> f(new CommitFollower());
  f->log_ = log;
  f->on_commit_ = std::move(on_commit);
  if (auto l = log->latest()) f->last_.store(l->step);
  JobKeys keys(job);
  MEMENTO_ASSIGN_OR_RETURN(ListResult cur, store->List(keys.CommitLatest(), deadline));
  std::string latest_key = keys.CommitLatest();
  auto parse = [](const std::string& v) -> int64_t {
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    return (v.empty() || *end != '\0') ? -1 : static_cast<int64_t>(x);
  };
  for (const auto& kv : cur.kvs) {
    if (kv.key == latest_key) f->Observe(parse(kv.value));
  }
  CommitFollower* self = f.get();
  f->watcher_ = std::make_unique<Watcher>(
      store, latest_key, cur.revision, [self, latest_key, parse](const WatchEvent& ev) {
        if (ev.type == WatchEvent::Type::kPut && ev.kv.key == latest_key) {
          self->Observe(parse(ev.kv.value));
        }
      });
  return f;
}

void CommitFollower::Observe(int64_t step) {
  if (step <= last_.load()) return;
  auto appended = log_->Append(step, WallNanos());
  if (!appended.ok()) {
    // The commit still happened; the local record is best effort.
    MEMENTO_LOG_ERROR("coord: commit log {}: {}", log_->path(), appended.status().ToString());
  }
  last_.store(step);
  if (on_commit_) on_commit_(step);
}

}  // namespace memento::coord
