#include "snap/copy_engine.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/check.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "fmt/format.h"
#include "snap/copy_kernel.h"

namespace memento::snap {

Status CopyJob::Wait(Deadline deadline) {
  MutexLock l(&mu_);
  while (!done_) {
    if (deadline.infinite()) {
      cv_.Wait(&l);
    } else if (!cv_.WaitUntil(&l, deadline.when()) && !done_) {
      return DeadlineExceededError(fmt::format("copy job still running: {} of {} chunks done",
                                               chunks_done(), chunks_.size()));
    }
  }
  return status_;
}

bool CopyJob::done() {
  MutexLock l(&mu_);
  return done_;
}

CopyEngine::CopyEngine(Options options) : options_(std::move(options)) {
  MEMENTO_CHECK(options_.threads >= 1);
  {
    MutexLock l(&mu_);
    worker_tids_.assign(options_.threads, 0);
  }
  for (int i = 0; i < options_.threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
    std::string tname = (options_.name + std::to_string(i)).substr(0, 15);
    pthread_setname_np(workers_.back().native_handle(), tname.c_str());
  }
}

CopyEngine::~CopyEngine() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

std::shared_ptr<CopyJob> CopyEngine::Submit(std::vector<CopyChunk> chunks,
                                            std::function<void(size_t, uint64_t)> on_chunk,
                                            std::function<Status(const Status&)> on_done,
                                            std::function<void()> before_chunk) {
  std::shared_ptr<CopyJob> job(new CopyJob());
  job->chunks_ = std::move(chunks);
  job->before_chunk_ = std::move(before_chunk);
  job->on_chunk_ = std::move(on_chunk);
  job->on_done_ = std::move(on_done);
  for (const CopyChunk& c : job->chunks_) job->bytes_ += c.length;
  job->start_ = Now();
  if (job->chunks_.empty()) {
    Finish(*job);
    return job;
  }
  {
    MutexLock l(&mu_);
    if (options_.idle_priority && !workers_idle_) SetWorkersIdle(true);
    queue_.push_back(job);
  }
  cv_.SignalAll();
  return job;
}

bool CopyEngine::workers_idle() {
  MutexLock l(&mu_);
  return workers_idle_;
}

void CopyEngine::SetWorkersIdle(bool idle) {
  // SCHED_IDLE (weight 3 against 1024 for nice 0): a worker runs on CPU time
  // no normal thread wants and never preempts one on wake-up. Lowering is
  // always allowed; raising back needs privilege or RLIMIT_NICE (sched(7)),
  // and a refused raise leaves the helping fence to do the work.
  sched_param param{};
  bool all = true;
  int err = 0;
  for (pid_t tid : worker_tids_) {
    if (tid == 0) continue;  // not started yet: the worker sets itself
    if (sched_setscheduler(tid, idle ? SCHED_IDLE : SCHED_OTHER, &param) != 0) {
      all = false;
      err = errno;
    }
  }
  if (!all && !warned_priority_) {
    warned_priority_ = true;
    MEMENTO_LOG_INFO("copy workers: cannot switch to {} priority ({}); {}",
                     idle ? "idle" : "normal", std::strerror(err),
                     idle ? "they keep the normal priority"
                          : "a waiting Fence() copies the remaining chunks itself");
  }
  workers_idle_ = idle && all;
}

Status CopyEngine::HelpAndWait(CopyJob& job, Deadline deadline, uint64_t* helped_bytes) {
  if (job.done()) return job.Wait(deadline);
  {
    MutexLock l(&mu_);
    if (workers_idle_) SetWorkersIdle(false);  // back to idle at the next Submit
  }
  while (!deadline.expired()) {
    size_t index = job.next_.fetch_add(1, std::memory_order_relaxed);
    if (index >= job.chunks_.size()) break;
    const uint64_t n = job.chunks_[index].length;
    RunChunk(job, index);  // may finish the job: `job` stays valid (the caller holds it)
    if (helped_bytes != nullptr) *helped_bytes += n;
  }
  return job.Wait(deadline);
}

void CopyEngine::WorkerLoop(int worker) {
  {
    MutexLock l(&mu_);
    worker_tids_[worker] = static_cast<pid_t>(syscall(SYS_gettid));
    if (workers_idle_) {
      sched_param param{};
      sched_setscheduler(0, SCHED_IDLE, &param);
    }
  }
  for (;;) {
    std::shared_ptr<CopyJob> job;
    size_t index = 0;
    {
      MutexLock l(&mu_);
      for (;;) {
        while (!queue_.empty() && queue_.front()->next_.load(std::memory_order_relaxed) >=
                                      queue_.front()->chunks_.size()) {
          queue_.pop_front();  // every chunk claimed; the claimers finish it
        }
        if (!queue_.empty()) break;
        if (stopping_) return;
        cv_.Wait(&l);
      }
      job = queue_.front();
      index = job->next_.fetch_add(1, std::memory_order_relaxed);
    }
    if (index >= job->chunks_.size()) continue;
    RunChunk(*job, index);
  }
}

Result<uint64_t> RunSaveChunk(const CopyChunk& c) {
  uint64_t sum = 0;
  if (c.producer != nullptr) {
    auto* dst = static_cast<uint8_t*>(c.dst);
    MEMENTO_RETURN_IF_ERROR(c.producer->Produce(c.producer_offset, c.length, dst));
    sum = FastChecksum(dst, c.length);
  } else {
    sum = CopyAndChecksumStreaming(c.dst, c.src, c.length);
  }
  if (c.checksum_out != nullptr) *c.checksum_out = sum;
  return sum;
}

void CopyEngine::RunChunk(CopyJob& job, size_t index) {
  const CopyChunk& c = job.chunks_[index];
  if (!job.failed_.load(std::memory_order_relaxed)) {
    if (job.before_chunk_) job.before_chunk_();
    Result<uint64_t> ran = RunSaveChunk(c);
    const uint64_t sum = ran.ok() ? *ran : 0;
    if (!ran.ok()) {
      job.failed_.store(true, std::memory_order_relaxed);
      MutexLock l(&job.mu_);
      if (job.first_error_.ok()) job.first_error_ = ran.status();
    } else if (c.verify && sum != c.expected_checksum) {
      job.failed_.store(true, std::memory_order_relaxed);
      MutexLock l(&job.mu_);
      if (job.first_error_.ok()) {
        job.first_error_ = DataLossError(
            fmt::format("chunk {} ({}, {} bytes) fails its checksum: {:#018x} expected, {:#018x} "
                        "found",
                        index, c.label, c.length, c.expected_checksum, sum));
      }
    }
    if (job.on_chunk_) job.on_chunk_(index, sum);
    if (options_.chunk_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.chunk_delay_us));
    }
  }
  if (job.finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks_.size()) {
    Finish(job);
  }
}

void CopyEngine::Finish(CopyJob& job) {
  job.copy_s_.store(SecondsBetween(job.start_, Now()), std::memory_order_release);
  Status st;
  {
    MutexLock l(&job.mu_);
    st = job.first_error_;
  }
  if (job.on_done_) st = job.on_done_(st);
  {
    MutexLock l(&job.mu_);
    job.status_ = st;
    job.done_ = true;
  }
  job.cv_.SignalAll();
}

}  // namespace memento::snap
