// A fixed pool of worker threads running queued tasks in FIFO order.
//
// Thread safety: Submit() and WaitIdle() may be called from any thread. Tasks
// run on the pool's threads; a task must not call WaitIdle() on its own pool.
// The destructor waits for queued tasks to finish.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace memento {

class ThreadPool {
 public:
  // REQUIRES: num_threads >= 1. `name` labels the threads (pthread name, 15 chars).
  ThreadPool(size_t num_threads, std::string name);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task) EXCLUDES(mu_);
  // Blocks until the queue is empty and no task is running.
  void WaitIdle() EXCLUDES(mu_);
  size_t size() const { return threads_.size(); }

 private:
  void WorkerLoop();

  Mutex mu_;
  CondVar work_cv_;
  CondVar idle_cv_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  size_t running_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace memento
