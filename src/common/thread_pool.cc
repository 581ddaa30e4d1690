#include "common/thread_pool.h"

#include <utility>

#include "common/check.h"
#include "common/thread_cpu.h"

namespace memento {

ThreadPool::ThreadPool(size_t num_threads, std::string name) {
  MEMENTO_CHECK(num_threads >= 1);
  threads_.reserve(num_threads);
  for (size_t i = 0; i < num_threads; ++i) {
    // Named from inside: the thread's CPU is then counted under its name
    // even after it exits (common/thread_cpu.h).
    std::string tname = name + std::to_string(i);
    threads_.emplace_back([this, tname] {
      NameThisThread(tname);
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    MutexLock l(&mu_);
    queue_.push_back(std::move(task));
  }
  work_cv_.Signal();
}

void ThreadPool::WaitIdle() {
  MutexLock l(&mu_);
  while (!queue_.empty() || running_ > 0) idle_cv_.Wait(&l);
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock l(&mu_);
      while (queue_.empty() && !stopping_) work_cv_.Wait(&l);
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    {
      MutexLock l(&mu_);
      --running_;
      if (queue_.empty() && running_ == 0) idle_cv_.SignalAll();
    }
  }
}

}  // namespace memento
