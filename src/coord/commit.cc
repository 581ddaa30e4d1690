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
#include "common/thread_cpu.h"

namespace memento::coord {

// ---- CommitTracker -----------------------------------------------------------

CommitTracker::CommitTracker(std::set<std::string> members, int64_t committed, uint64_t epoch)
    : members_(std::move(members)), committed_(committed), epoch_(epoch) {}

std::optional<int64_t> CommitTracker::OnCompleted(int64_t step, const std::string& node,
                                                  uint64_t epoch) {
  const CommitId id{epoch, step};
  if (!(CommitId{epoch_, committed_} < id)) return std::nullopt;
  reports_[id].insert(node);
  if (epoch != epoch_) return std::nullopt;  // a newer epoch's: kept until it starts
  return Evaluate();
}

std::optional<int64_t> CommitTracker::SetMembers(std::set<std::string> members) {
  members_ = std::move(members);
  return Evaluate();
}

std::optional<int64_t> CommitTracker::ObserveCommitted(const CommitId& id) {
  if (!(CommitId{epoch_, committed_} < id)) return std::nullopt;
  const bool new_epoch = id.epoch != epoch_;
  epoch_ = id.epoch;
  committed_ = id.step;
  // Everything at or below `id`: older steps of this epoch, every report of
  // an older epoch (the abandoned history's).
  reports_.erase(reports_.begin(), reports_.upper_bound(id));
  if (new_epoch) superseded_.clear();  // steps of the abandoned history
  return new_epoch ? Evaluate() : std::nullopt;
}

std::optional<int64_t> CommitTracker::Evaluate() {
  if (members_.empty()) return std::nullopt;  // an empty job commits nothing
  // The highest step of the current epoch every member reported wins; older
  // pending steps are superseded by it. Reports of a newer epoch wait.
  for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
    if (it->first.epoch != epoch_) continue;
    const std::set<std::string>& got = it->second;
    if (std::includes(got.begin(), got.end(), members_.begin(), members_.end())) {
      const CommitId id = it->first;
      for (auto p = reports_.begin(); p != reports_.end() && p->first < id; ++p) {
        if (p->first.epoch == epoch_) superseded_.push_back(p->first.step);
      }
      ObserveCommitted(id);
      return id.step;
    }
  }
  return std::nullopt;
}

std::set<std::string> CommitTracker::Missing(int64_t step) const {
  std::set<std::string> out;
  auto it = reports_.find(CommitId{epoch_, step});
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
  for (const auto& [id, _] : reports_) {
    if (id.epoch == epoch_) out.push_back(id.step);
  }
  return out;
}

// ---- CommitLog --------------------------------------------------------------

namespace {

constexpr uint32_t kLogMagic = 0x474C434D;  // "MCLG"
constexpr uint16_t kLogVersionNoEpoch = 1;  // LogRecordV1: epoch 0
constexpr uint16_t kLogVersion = 2;         // LogRecord

// Version 1 (older builds): no epoch.
struct LogRecordV1 {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int64_t step;
  int64_t wall_ns;
  uint64_t checksum;  // xxHash3 of the 24 bytes before it
};
static_assert(sizeof(LogRecordV1) == 32);
static_assert(std::is_trivially_copyable_v<LogRecordV1>);

struct LogRecord {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int64_t step;
  int64_t wall_ns;
  uint64_t epoch;
  uint64_t checksum;  // xxHash3 of the 32 bytes before it
};
static_assert(sizeof(LogRecord) == 40);
static_assert(std::is_trivially_copyable_v<LogRecord>);
static_assert(offsetof(LogRecord, version) == offsetof(LogRecordV1, version));

LogRecord MakeRecord(const CommitRecord& c) {
  LogRecord r{kLogMagic, kLogVersion, 0, c.step, c.wall_ns, c.epoch, 0};
  r.checksum = Checksum(&r, offsetof(LogRecord, checksum));
  return r;
}

CommitId IdOf(const CommitRecord& c) { return CommitId{c.epoch, c.step}; }

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
    // A version-1 record is 32 bytes, a version-2 one 40: read the larger
    // size and look at the version first.
    LogRecord r;
    std::memset(&r, 0, sizeof(r));
    ssize_t n = pread(fd, &r, sizeof(r), good);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(fmt::format("read commit log {}", path), errno);
    if (n < static_cast<ssize_t>(sizeof(LogRecordV1)) || r.magic != kLogMagic) break;
    CommitRecord c;
    size_t size = 0;
    if (r.version == kLogVersionNoEpoch) {
      LogRecordV1 v1;
      std::memcpy(&v1, &r, sizeof(v1));
      if (v1.checksum != Checksum(&v1, offsetof(LogRecordV1, checksum))) break;
      c = {v1.step, v1.wall_ns, 0};
      size = sizeof(v1);
    } else if (r.version == kLogVersion && n >= static_cast<ssize_t>(sizeof(r))) {
      if (r.checksum != Checksum(&r, offsetof(LogRecord, checksum))) break;
      c = {r.step, r.wall_ns, r.epoch};
      size = sizeof(r);
    } else {
      break;
    }
    if (!log->records_.empty() && !(IdOf(log->records_.back()) < IdOf(c))) break;
    log->records_.push_back(c);
    good += static_cast<off_t>(size);
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

Result<bool> CommitLog::Append(int64_t step, int64_t wall_ns, uint64_t epoch) {
  MutexLock l(&mu_);
  const CommitRecord c{step, wall_ns, epoch};
  if (!records_.empty() && !(IdOf(records_.back()) < IdOf(c))) return false;
  LogRecord r = MakeRecord(c);
  MEMENTO_RETURN_IF_ERROR(WriteAllFd(fd_, &r, sizeof(r), path_));
  if (fdatasync(fd_) < 0) return ErrnoError(fmt::format("fdatasync {}", path_), errno);
  records_.push_back(c);
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

namespace {

// "<digits>" or "<digits>@<digits>" (both non-negative decimal).
bool ParseNumberAt(const std::string& text, uint64_t* first, std::optional<uint64_t>* second) {
  const size_t at = text.find('@');
  auto number = [](const std::string& t, uint64_t* out) {
    if (t.empty() || t.size() > 19) return false;
    for (char ch : t) {
      if (ch < '0' || ch > '9') return false;
    }
    *out = std::strtoull(t.c_str(), nullptr, 10);
    return true;
  };
  if (!number(text.substr(0, at), first)) return false;
  second->reset();
  if (at == std::string::npos) return true;
  uint64_t e = 0;
  if (!number(text.substr(at + 1), &e)) return false;
  *second = e;
  return true;
}

}  // namespace

std::string FormatCommitId(const CommitId& id) {
  if (id.epoch == 0) return std::to_string(id.step);
  return fmt::format("{}@{}", id.step, id.epoch);
}

Result<CommitId> ParseCommitId(const std::string& text) {
  uint64_t step = 0;
  std::optional<uint64_t> epoch;
  if (!ParseNumberAt(text, &step, &epoch)) {
    return DataLossError(
        fmt::format("commit/latest holds '{}', not <step> or <step>@<epoch>", text.substr(0, 40)));
  }
  return CommitId{epoch.value_or(0), static_cast<int64_t>(step)};
}

Result<uint64_t> ParseReportEpoch(const std::string& value) {
  uint64_t wall = 0;
  std::optional<uint64_t> epoch;
  if (!ParseNumberAt(value, &wall, &epoch)) {
    return DataLossError(fmt::format("a completed/ report holds '{}', not <wall ns>[@<epoch>]",
                                     value.substr(0, 40)));
  }
  return epoch.value_or(0);
}

Status ReportCompleted(Store& store, const std::string& job, const std::string& node, int64_t step,
                       Deadline deadline, uint64_t epoch) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  MEMENTO_RETURN_IF_ERROR(ValidateName("node", node));
  if (step < 0) return InvalidArgumentError(fmt::format("step {} must be >= 0", step));
  std::string value = std::to_string(WallNanos());
  if (epoch > 0) value += "@" + std::to_string(epoch);
  return store.Set(JobKeys(job).Completed(step, node), value, deadline).status();
}

Result<bool> PublishCommit(Store& store, const std::string& job, int64_t step, int64_t wall_ns,
                           Deadline deadline, uint64_t epoch) {
  if (step < 0) return InvalidArgumentError(fmt::format("commit of step {} (< 0)", step));
  JobKeys keys(job);
  const CommitId id{epoch, step};
  MEMENTO_RETURN_IF_ERROR(store.Set(keys.Commit(step), std::to_string(wall_ns), deadline).status());
  for (;;) {
    std::optional<std::string> expected;
    auto cur = store.Get(keys.CommitLatest(), deadline);
    if (cur.ok()) {
      expected = cur->value;
      auto have = ParseCommitId(cur->value);
      // An unreadable value is replaced.
      if (have.ok() && !(*have < id)) return false;
    } else if (cur.status().code() != StatusCode::kNotFound) {
      return cur.status();
    }
    MEMENTO_ASSIGN_OR_RETURN(CasResult c, store.CompareAndSwap(keys.CommitLatest(), expected,
                                                               FormatCommitId(id), deadline));
    if (c.swapped) return true;
  }
}

Result<CommitId> ReadLatestCommitId(Store& store, const std::string& job, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(KeyValue kv, store.Get(JobKeys(job).CommitLatest(), deadline));
  auto id = ParseCommitId(kv.value);
  if (!id.ok()) return DataLossError(fmt::format("job {}: {}", job, id.status().message()));
  return *id;
}

Result<int64_t> ReadLatestCommit(Store& store, const std::string& job, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(CommitId id, ReadLatestCommitId(store, job, deadline));
  return id.step;
}

Status RepublishCommits(Store& store, const std::string& job, CommitLog& log, Deadline deadline) {
  auto latest = log.latest();
  if (!latest) return Status::Ok();
  auto moved = PublishCommit(store, job, latest->step, latest->wall_ns, deadline, latest->epoch);
  if (!moved.ok()) return moved.status();
  if (*moved) {
    MEMENTO_LOG_INFO("coord: republished commit of step {} (epoch {}) for job {}", latest->step,
                     latest->epoch, job);
  }
  return Status::Ok();
}

// ---- CommitCoordinator ----------------------------------------------------------

CommitCoordinator::CommitCoordinator(Store* store, std::string job, std::set<std::string> members,
                                     CommitId committed, OnCommit on_commit)
    : store_(store),
      job_(std::move(job)),
      keys_(job_),
      on_commit_(std::move(on_commit)),
      tracker_(std::move(members), committed.step, committed.epoch) {}

Result<std::unique_ptr<CommitCoordinator>> CommitCoordinator::Start(Store* store, std::string job,
                                                                    std::set<std::string> members,
                                                                    Deadline deadline,
                                                                    OnCommit on_commit) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  // commit/latest first (its listing's revision starts the watch on it), so
  // that no new epoch published from now on is missed.
  const std::string latest_key = JobKeys(job).CommitLatest();
  MEMENTO_ASSIGN_OR_RETURN(ListResult latest, store->List(latest_key, deadline));
  CommitId committed;
  for (const auto& kv : latest.kvs) {
    if (kv.key != latest_key) continue;
    MEMENTO_ASSIGN_OR_RETURN(committed, ParseCommitId(kv.value));
  }
  std::unique_ptr<CommitCoordinator> c(new CommitCoordinator(
      store, std::move(job), std::move(members), committed, std::move(on_commit)));
  CommitCoordinator* self = c.get();
  c->latest_watcher_ = std::make_unique<Watcher>(
      store, latest_key, latest.revision, [self](const WatchEvent& ev) { self->OnLatest(ev); });
  MEMENTO_ASSIGN_OR_RETURN(ListResult reports, store->List(c->keys_.CompletedPrefix(), deadline));
  for (auto& kv : reports.kvs) c->OnEvent(WatchEvent{WatchEvent::Type::kPut, std::move(kv)});
  c->cleaner_ = std::thread([self] {
    NameThisThread("commit-clean");
    self->Clean();
  });
  c->watcher_ = std::make_unique<Watcher>(store, c->keys_.CompletedPrefix(), reports.revision,
                                          [self](const WatchEvent& ev) { self->OnEvent(ev); });
  return c;
}

CommitCoordinator::~CommitCoordinator() {
  watcher_.reset();
  latest_watcher_.reset();
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
  auto epoch = ParseReportEpoch(ev.kv.value);
  if (!epoch.ok()) {
    MEMENTO_LOG_WARN("coord: ignoring report {}: {}", ev.kv.key, epoch.status().ToString());
    return;
  }
  std::optional<int64_t> committed;
  std::vector<int64_t> superseded;
  uint64_t in_epoch;
  {
    MutexLock l(&mu_);
    committed = tracker_.OnCompleted(*step, rest.substr(slash + 1), *epoch);
    superseded = tracker_.TakeSuperseded();
    in_epoch = tracker_.epoch();
  }
  if (committed) Commit(*committed, in_epoch, std::move(superseded));
}

// commit/latest moved: a commit of this or another coordinator (nothing to
// do), or a recovery's first commit of a new epoch (the tracker goes on in
// it; reports of that epoch that arrived first may commit now).
void CommitCoordinator::OnLatest(const WatchEvent& ev) {
  if (ev.type != WatchEvent::Type::kPut) return;
  auto id = ParseCommitId(ev.kv.value);
  if (!id.ok()) return;
  std::optional<int64_t> committed;
  std::vector<int64_t> superseded;
  uint64_t in_epoch;
  bool new_epoch;
  {
    MutexLock l(&mu_);
    const uint64_t before = tracker_.epoch();
    committed = tracker_.ObserveCommitted(*id);
    superseded = tracker_.TakeSuperseded();
    in_epoch = tracker_.epoch();
    new_epoch = in_epoch != before;
  }
  if (new_epoch) {
    MEMENTO_LOG_INFO("coord: job {} epoch {} starts at step {}", job_, id->epoch, id->step);
    // The abandoned history's reports go.
    CleanThrough(*id);
  }
  if (committed) Commit(*committed, in_epoch, std::move(superseded));
}

void CommitCoordinator::SetMembers(std::set<std::string> members) {
  std::optional<int64_t> committed;
  std::vector<int64_t> superseded;
  uint64_t in_epoch;
  {
    MutexLock l(&mu_);
    committed = tracker_.SetMembers(std::move(members));
    superseded = tracker_.TakeSuperseded();
    in_epoch = tracker_.epoch();
  }
  if (committed) Commit(*committed, in_epoch, std::move(superseded));
}

int64_t CommitCoordinator::committed() {
  MutexLock l(&mu_);
  return tracker_.committed();
}

uint64_t CommitCoordinator::epoch() {
  MutexLock l(&mu_);
  return tracker_.epoch();
}

Status CommitCoordinator::RepublishCommitted(Deadline deadline) {
  CommitId id;
  {
    MutexLock l(&mu_);
    id = CommitId{tracker_.epoch(), tracker_.committed()};
  }
  if (id.step < 0) return Status::Ok();
  return PublishCommit(*store_, job_, id.step, WallNanos(), deadline, id.epoch).status();
}

void CommitCoordinator::Commit(int64_t step, uint64_t epoch, std::vector<int64_t> superseded) {
  int64_t now = WallNanos();
  Deadline d = Deadline::AfterSeconds(10);
  Status s;
  while (!d.expired()) {
    auto moved = PublishCommit(*store_, job_, step, now, d, epoch);
    s = moved.status();
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!s.ok()) {
    MEMENTO_LOG_ERROR("coord: could not publish the commit of step {}: {}", step, s.ToString());
    return;
  }
  if (epoch > 0) {
    MEMENTO_LOG_INFO("coord: job {} committed step {} (epoch {})", job_, step, epoch);
  } else {
    MEMENTO_LOG_INFO("coord: job {} committed step {}", job_, step);
  }
  // Reports of committed steps are no longer needed: the cleaner deletes them.
  CleanThrough(CommitId{epoch, step});
  if (on_commit_) on_commit_(CommitId{epoch, step}, superseded);
}

void CommitCoordinator::CleanThrough(const CommitId& id) {
  {
    MutexLock l(&clean_mu_);
    if (clean_through_ < id) clean_through_ = id;
  }
  clean_cv_.Signal();
}

void CommitCoordinator::Clean() {
  CommitId done;
  for (;;) {
    CommitId through;
    {
      MutexLock l(&clean_mu_);
      while (!clean_stop_ && !(done < clean_through_)) clean_cv_.Wait(&l);
      if (clean_stop_) return;
      through = clean_through_;
    }
    Deadline d = Deadline::AfterSeconds(10);
    auto reports = store_->List(keys_.CompletedPrefix(), d);
    if (!reports.ok()) continue;  // the next commit tries again
    for (const auto& kv : reports->kvs) {
      std::string rest = kv.key.substr(keys_.CompletedPrefix().size());
      auto s2 = ParseStep(rest.substr(0, rest.find('/')));
      auto e2 = ParseReportEpoch(kv.value);
      // An unreadable report is never counted: it goes too.
      const bool old = !e2.ok() || !(through < CommitId{*e2, s2.ok() ? *s2 : 0});
      if (s2.ok() && old) store_->Delete(kv.key, d).status().IgnoreError();
      MutexLock l(&clean_mu_);
      if (clean_stop_) return;
    }
    done = through;
  }
}

// ---- CommitFollower -----------------------------------------------------------

Result<std::unique_ptr<CommitFollower>> CommitFollower::Start(
    Store* store, std::string job, CommitLog* log, std::function<void(const CommitId&)> on_commit,
    Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  std::unique_ptr<CommitFollower> f(new CommitFollower());
  f->log_ = log;
  f->on_commit_ = std::move(on_commit);
  if (auto l = log->latest()) {
    MutexLock lock(&f->mu_);
    f->last_ = CommitId{l->epoch, l->step};
  }
  JobKeys keys(job);
  MEMENTO_ASSIGN_OR_RETURN(ListResult cur, store->List(keys.CommitLatest(), deadline));
  std::string latest_key = keys.CommitLatest();
  auto parse = [](const std::string& v) -> std::optional<CommitId> {
    auto id = ParseCommitId(v);
    if (!id.ok()) {
      MEMENTO_LOG_WARN("coord: ignoring {}", id.status().ToString());
      return std::nullopt;
    }
    return *id;
  };
  for (const auto& kv : cur.kvs) {
    if (kv.key != latest_key) continue;
    if (auto id = parse(kv.value)) f->Observe(*id);
  }
  CommitFollower* self = f.get();
  f->watcher_ = std::make_unique<Watcher>(
      store, latest_key, cur.revision, [self, latest_key, parse](const WatchEvent& ev) {
        if (ev.type == WatchEvent::Type::kPut && ev.kv.key == latest_key) {
          if (auto id = parse(ev.kv.value)) self->Observe(*id);
        }
      });
  return f;
}

void CommitFollower::Observe(const CommitId& id) {
  {
    MutexLock l(&mu_);
    if (!(last_ < id)) return;
    last_ = id;
  }
  auto appended = log_->Append(id.step, WallNanos(), id.epoch);
  if (!appended.ok()) {
    // The commit still happened; the local record is best effort.
    MEMENTO_LOG_ERROR("coord: commit log {}: {}", log_->path(), appended.status().ToString());
  }
  if (on_commit_) on_commit_(id);
}

}  // namespace memento::coord
