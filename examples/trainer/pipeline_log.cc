#include "pipeline_log.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/checksum.h"
#include "common/clock.h"

namespace memento::trainer {
namespace {

constexpr char kMagic[8] = {'M', 'M', 'P', 'P', 'L', 'O', 'G', '1'};
constexpr uint32_t kVersion = 1;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t num_sent;
  uint64_t num_received;
};
static_assert(sizeof(FileHeader) == 32, "FileHeader is written raw");

// One entry: the key, then (sent) `bytes` of payload follow, or (received)
// none; `checksum` is MessageChecksum(key, payload).
struct EntryRecord {
  int64_t step;
  int32_t micro_batch;
  int32_t sender;
  int32_t receiver;
  uint8_t kind;
  uint8_t reserved[3];
  uint64_t bytes;
  uint64_t checksum;
};
static_assert(sizeof(EntryRecord) == 40, "EntryRecord is written raw");

EntryRecord ToRecord(const MessageKey& k, uint64_t bytes, uint64_t checksum) {
  EntryRecord r;
  std::memset(&r, 0, sizeof(r));
  r.step = k.step;
  r.micro_batch = k.micro_batch;
  r.sender = k.sender;
  r.receiver = k.receiver;
  r.kind = static_cast<uint8_t>(k.kind);
  r.bytes = bytes;
  r.checksum = checksum;
  return r;
}

MessageKey FromRecord(const EntryRecord& r) {
  return MessageKey{r.step, r.micro_batch, r.sender, r.receiver, static_cast<MessageKind>(r.kind)};
}

}  // namespace

std::string MessageKey::ToString() const {
  static const char* kKinds[] = {"activation", "gradient", "grad-norm"};
  return std::string(kKinds[static_cast<int>(kind) % 3]) + " step " + std::to_string(step) +
         " micro-batch " + std::to_string(micro_batch) + " stage " + std::to_string(sender) + "->" +
         std::to_string(receiver);
}

uint64_t MessageChecksum(const MessageKey& key, const void* data, size_t bytes) {
  const EntryRecord r = ToRecord(key, bytes, 0);
  return ChecksumWithSeed(data, bytes, Checksum(&r, sizeof(r)));
}

void PipelineLog::AppendSent(const MessageKey& key, const void* data, size_t bytes) {
  SentMessage& s = sent_[key];
  bytes_ -= s.payload.size();
  s.payload.assign(static_cast<const char*>(data), bytes);
  s.checksum = MessageChecksum(key, data, bytes);
  bytes_ += bytes;
}

void PipelineLog::RecordReceived(const MessageKey& key, const void* data, size_t bytes) {
  received_[key] = MessageChecksum(key, data, bytes);
}

void PipelineLog::InsertSent(const MessageKey& key, std::string payload, uint64_t checksum) {
  SentMessage& s = sent_[key];
  bytes_ -= s.payload.size();
  bytes_ += payload.size();
  s.payload = std::move(payload);
  s.checksum = checksum;
}

void PipelineLog::InsertReceived(const MessageKey& key, uint64_t checksum) {
  received_[key] = checksum;
}

void PipelineLog::Truncate(int64_t step) {
  for (auto it = sent_.begin(); it != sent_.end() && it->first.step <= step;) {
    bytes_ -= it->second.payload.size();
    it = sent_.erase(it);
  }
  for (auto it = received_.begin(); it != received_.end() && it->first.step <= step;)
    it = received_.erase(it);
}

PipelineLog PipelineLog::TakeStep(int64_t step) {
  PipelineLog out;
  const MessageKey lo{step, INT32_MIN, INT32_MIN, INT32_MIN, MessageKind::kActivation};
  for (auto it = sent_.lower_bound(lo); it != sent_.end() && it->first.step == step;) {
    bytes_ -= it->second.payload.size();
    out.bytes_ += it->second.payload.size();
    out.sent_.emplace(it->first, std::move(it->second));
    it = sent_.erase(it);
  }
  for (auto it = received_.lower_bound(lo); it != received_.end() && it->first.step == step;) {
    out.received_.emplace(it->first, it->second);
    it = received_.erase(it);
  }
  return out;
}

Result<const std::string*> PipelineLog::Sent(const MessageKey& key) const {
  auto it = sent_.find(key);
  if (it == sent_.end()) return NotFoundError("pipeline log has no " + key.ToString());
  const auto& s = it->second;
  if (MessageChecksum(key, s.payload.data(), s.payload.size()) != s.checksum) {
    return DataLossError("pipeline log: " + key.ToString() + " fails its checksum");
  }
  return &s.payload;
}

Result<uint64_t> PipelineLog::ReceivedChecksum(const MessageKey& key) const {
  auto it = received_.find(key);
  if (it == received_.end())
    return NotFoundError("pipeline log has no receipt of " + key.ToString());
  return it->second;
}

void PipelineLog::Merge(const PipelineLog& other) {
  for (const auto& [k, s] : other.sent_) {
    auto& mine = sent_[k];
    bytes_ -= mine.payload.size();
    mine = s;
    bytes_ += s.payload.size();
  }
  for (const auto& [k, c] : other.received_) received_[k] = c;
}

void PipelineLog::CorruptForTest(const MessageKey& key) {
  auto it = sent_.find(key);
  if (it != sent_.end() && !it->second.payload.empty()) it->second.payload[0] ^= 0x04;
}

Status PipelineLog::WriteFile(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoError("open " + tmp, errno);
  FileHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.num_sent = sent_.size();
  h.num_received = received_.size();
  bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1;
  for (const auto& [k, s] : sent_) {
    if (!ok) break;
    const EntryRecord r = ToRecord(k, s.payload.size(), s.checksum);
    ok = std::fwrite(&r, sizeof(r), 1, f) == 1 &&
         std::fwrite(s.payload.data(), 1, s.payload.size(), f) == s.payload.size();
  }
  for (const auto& [k, c] : received_) {
    if (!ok) break;
    const EntryRecord r = ToRecord(k, 0, c);
    ok = std::fwrite(&r, sizeof(r), 1, f) == 1;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return ErrnoError("write " + tmp, errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  return Status::Ok();
}

Result<PipelineLog> PipelineLog::ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoError("open " + path, errno);
  auto fail = [&](Status st) {
    std::fclose(f);
    return st;
  };
  FileHeader h;
  if (std::fread(&h, sizeof(h), 1, f) != 1)
    return fail(DataLossError(path + ": truncated pipeline log header"));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0)
    return fail(InvalidArgumentError(path + ": not a pipeline log (magic)"));
  if (h.version != kVersion) {
    return fail(InvalidArgumentError(path + ": pipeline log version " + std::to_string(h.version) +
                                     ", this build reads " + std::to_string(kVersion)));
  }
  PipelineLog log;
  for (uint64_t i = 0; i < h.num_sent + h.num_received; ++i) {
    EntryRecord r;
    if (std::fread(&r, sizeof(r), 1, f) != 1)
      return fail(DataLossError(path + ": truncated at entry " + std::to_string(i)));
    if (r.kind > 2) {
      return fail(InvalidArgumentError(path + ": entry " + std::to_string(i) + " has kind " +
                                       std::to_string(r.kind)));
    }
    const MessageKey k = FromRecord(r);
    if (i >= h.num_sent) {
      log.received_[k] = r.checksum;
      continue;
    }
    if (r.bytes > (uint64_t{1} << 34)) {
      return fail(DataLossError(path + ": entry " + std::to_string(i) + " claims " +
                                std::to_string(r.bytes) + " bytes"));
    }
    SentMessage s;
    s.payload.resize(r.bytes);
    if (std::fread(s.payload.data(), 1, r.bytes, f) != r.bytes)
      return fail(DataLossError(path + ": truncated in " + k.ToString()));
    s.checksum = r.checksum;
    if (MessageChecksum(k, s.payload.data(), s.payload.size()) != s.checksum)
      return fail(DataLossError(path + ": " + k.ToString() + " fails its checksum"));
    log.bytes_ += r.bytes;
    log.sent_[k] = std::move(s);
  }
  std::fclose(f);
  return log;
}

Result<PipelineLog> PipelineLog::ReadAny(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return ReadFile(path);
  // The spool's step files: "<base>.step<s>", in step order.
  const std::filesystem::path p(path);
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  const std::string prefix = p.filename().string() + ".step";
  std::vector<std::pair<int64_t, std::string>> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string tail = name.substr(prefix.size());
    if (tail.empty() || tail.find_first_not_of("0123456789") != std::string::npos) continue;
    files.emplace_back(std::stoll(tail), e.path().string());
  }
  if (ec) return ErrnoError("list " + dir, ec.value());
  if (files.empty()) {
    return NotFoundError("no pipeline log at " + path + " (neither the file nor " + path +
                         ".step<s> files of a spool)");
  }
  std::sort(files.begin(), files.end());
  PipelineLog log;
  for (const auto& [step, file] : files) {
    MEMENTO_ASSIGN_OR_RETURN(PipelineLog one, ReadFile(file));
    log.Merge(one);
  }
  return log;
}

// ---- PipelineLogSpool ----------------------------------------------------------

PipelineLogSpool::PipelineLogSpool(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {}

Result<std::unique_ptr<PipelineLogSpool>> PipelineLogSpool::Create(const std::string& dir,
                                                                   int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InternalError("pipeline log spool: mkdir -p " + dir + ": " + ec.message());
  std::unique_ptr<PipelineLogSpool> s(new PipelineLogSpool(dir, rank));
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

PipelineLogSpool::~PipelineLogSpool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string PipelineLogSpool::BasePath(const std::string& dir, int rank) {
  return dir + "/pipeline_log.rank" + std::to_string(rank);
}

std::string PipelineLogSpool::StepPath(const std::string& dir, int rank, int64_t step) {
  return BasePath(dir, rank) + ".step" + std::to_string(step);
}

void PipelineLogSpool::Submit(int64_t step, PipelineLog entries) {
  {
    std::lock_guard<std::mutex> l(mu_);
    Task t;
    t.step = step;
    t.log = std::move(entries);
    queue_.push_back(std::move(t));
  }
  cv_.notify_all();
}

void PipelineLogSpool::Truncate(int64_t step) {
  {
    std::lock_guard<std::mutex> l(mu_);
    Task t;
    t.step = step;
    t.truncate = true;
    queue_.push_back(std::move(t));
  }
  cv_.notify_all();
}

Status PipelineLogSpool::Flush() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return queue_.empty() && !busy_; });
  Status st = error_;
  error_ = Status::Ok();
  return st;
}

uint64_t PipelineLogSpool::bytes_written() const {
  std::lock_guard<std::mutex> l(mu_);
  return bytes_written_;
}

double PipelineLogSpool::write_seconds() const {
  std::lock_guard<std::mutex> l(mu_);
  return write_seconds_;
}

void PipelineLogSpool::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, everything written
    Task t = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    l.unlock();
    Stopwatch w;
    Status st;
    uint64_t bytes = 0;
    if (t.truncate) {
      // Every step file <= t.step, also those a dead process of this rank
      // left behind.
      const std::string prefix = "pipeline_log.rank" + std::to_string(rank_) + ".step";
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        const std::string tail = name.substr(prefix.size());
        if (tail.empty() || tail.find_first_not_of("0123456789") != std::string::npos) continue;
        if (std::stoll(tail) <= t.step) unlink(e.path().c_str());
      }
    } else {
      const std::string path = StepPath(dir_, rank_, t.step);
      st = t.log.WriteFile(path);
      if (st.ok()) {
        struct stat sb;
        if (stat(path.c_str(), &sb) == 0) bytes = static_cast<uint64_t>(sb.st_size);
      }
    }
    const double secs = w.Seconds();
    l.lock();
    busy_ = false;
    bytes_written_ += bytes;
    write_seconds_ += secs;
    if (!st.ok() && error_.ok()) error_ = st.WithContext("pipeline log spool");
    cv_.notify_all();
  }
}

// ---- PipelineLogWriter ---------------------------------------------------------

Result<PipelineLogWriter::Mode> PipelineLogWriter::ParseMode(const std::string& name) {
  if (name == "inline") return Mode::kInline;
  if (name == "thread") return Mode::kThread;
  return InvalidArgumentError("pipeline log copy mode '" + name + "': expected inline or thread");
}

const char* PipelineLogWriter::ModeName(Mode mode) {
  return mode == Mode::kInline ? "inline" : "thread";
}

PipelineLogWriter::PipelineLogWriter(PipelineLog* log, Mode mode) : log_(log), mode_(mode) {
  if (mode_ == Mode::kThread) thread_ = std::thread([this] { Worker(); });
}

PipelineLogWriter::~PipelineLogWriter() {
  Drain();
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PipelineLogWriter::AppendSent(const MessageKey& key, const void* data, size_t bytes) {
  if (mode_ == Mode::kInline) {
    log_->AppendSent(key, data, bytes);
    return;
  }
  Enqueue(key, data, bytes, /*sent=*/true);
}

void PipelineLogWriter::RecordReceived(const MessageKey& key, const void* data, size_t bytes) {
  if (mode_ == Mode::kInline) {
    log_->RecordReceived(key, data, bytes);
    return;
  }
  Enqueue(key, data, bytes, /*sent=*/false);
}

void PipelineLogWriter::Enqueue(const MessageKey& key, const void* data, size_t bytes, bool sent) {
  auto job = std::make_unique<Job>();
  job->key = key;
  job->bytes = bytes;
  job->sent = sent;
  if (bytes <= kOwnedBytes) {
    // The caller may reuse a small buffer at once (the gradient norm is a
    // local variable): copying it costs less than queueing it.
    job->owned.assign(static_cast<const char*>(data), bytes);
    job->data = job->owned.data();
  } else {
    job->data = static_cast<const char*>(data);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(job));
    ++queued_;
  }
  cv_.notify_all();
}

void PipelineLogWriter::Run(const Job& job) {
  if (job.sent) {
    std::string payload(job.data, job.bytes);
    const uint64_t checksum = MessageChecksum(job.key, payload.data(), payload.size());
    std::lock_guard<std::mutex> l(mu_);
    log_->InsertSent(job.key, std::move(payload), checksum);
  } else {
    const uint64_t checksum = MessageChecksum(job.key, job.data, job.bytes);
    std::lock_guard<std::mutex> l(mu_);
    log_->InsertReceived(job.key, checksum);
  }
}

void PipelineLogWriter::Fence(const void* data, size_t bytes) {
  if (mode_ == Mode::kInline) return;
  const char* lo = static_cast<const char*>(data);
  const char* hi = lo + bytes;
  auto overlaps = [&](const Job& j) { return j.data < hi && lo < j.data + j.bytes; };
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    bool wait = false;
    std::unique_ptr<Job> mine;
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (!overlaps(**it)) continue;
      if ((*it)->running) {
        wait = true;  // the worker is copying it: one message at most
        continue;
      }
      mine = std::move(*it);
      jobs_.erase(it);
      --queued_;
      break;
    }
    if (mine) {
      ++by_caller_;
      l.unlock();
      Run(*mine);
      l.lock();
      continue;
    }
    if (!wait) return;
    cv_.wait(l);
  }
}

void PipelineLogWriter::Drain() {
  if (mode_ == Mode::kInline) return;
  std::unique_lock<std::mutex> l(mu_);
  while (!jobs_.empty()) {
    // The first job the worker has not taken, done here.
    auto it = std::find_if(jobs_.begin(), jobs_.end(), [](const auto& j) { return !j->running; });
    if (it == jobs_.end()) {
      cv_.wait(l);  // only the worker's job is left
      continue;
    }
    std::unique_ptr<Job> mine = std::move(*it);
    jobs_.erase(it);
    --queued_;
    ++by_caller_;
    l.unlock();
    Run(*mine);
    l.lock();
  }
}

void PipelineLogWriter::Worker() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || (queued_ > 0 && !paused_); });
    if (stop_) return;  // the destructor drained first
    auto it = std::find_if(jobs_.begin(), jobs_.end(), [](const auto& j) { return !j->running; });
    Job* job = it->get();
    job->running = true;
    --queued_;
    l.unlock();
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    Run(*job);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    l.lock();
    worker_cpu_ += (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    ++by_worker_;
    // Only this thread removes a running job (Fence and Drain wait for it).
    jobs_.erase(
        std::find_if(jobs_.begin(), jobs_.end(), [job](const auto& j) { return j.get() == job; }));
    cv_.notify_all();
  }
}

uint64_t PipelineLogWriter::jobs_by_caller() const {
  std::lock_guard<std::mutex> l(mu_);
  return by_caller_;
}

uint64_t PipelineLogWriter::jobs_by_worker() const {
  std::lock_guard<std::mutex> l(mu_);
  return by_worker_;
}

double PipelineLogWriter::worker_cpu_seconds() const {
  std::lock_guard<std::mutex> l(mu_);
  return worker_cpu_;
}

void PipelineLogWriter::PauseWorkerForTest() {
  std::lock_guard<std::mutex> l(mu_);
  paused_ = true;
}

void PipelineLogWriter::ResumeWorkerForTest() {
  {
    std::lock_guard<std::mutex> l(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

}  // namespace memento::trainer
