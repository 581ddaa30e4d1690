// Mutex and lock types annotated for Clang's -Wthread-safety analysis.
//
//   class Foo {
//     Mutex mu_;
//     int count_ GUARDED_BY(mu_);
//     void Inc() { MutexLock l(&mu_); ++count_; }
//   };
//
// Condition variables wait on a MutexLock through CondVar::Wait*, which takes
// the std::unique_lock inside it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define MEMENTO_TSA(x) __attribute__((x))
#else
#define MEMENTO_TSA(x)
#endif

#define CAPABILITY(x) MEMENTO_TSA(capability(x))
#define SCOPED_CAPABILITY MEMENTO_TSA(scoped_lockable)
#define GUARDED_BY(x) MEMENTO_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) MEMENTO_TSA(pt_guarded_by(x))
#define REQUIRES(...) MEMENTO_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) MEMENTO_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) MEMENTO_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) MEMENTO_TSA(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS MEMENTO_TSA(no_thread_safety_analysis)

namespace memento {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->native()) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

class CondVar {
 public:
  void Wait(MutexLock* lock) { cv_.wait(lock->native()); }
  // Returns false on timeout.
  template <typename Clock, typename Dur>
  bool WaitUntil(MutexLock* lock, std::chrono::time_point<Clock, Dur> t) {
    return cv_.wait_until(lock->native(), t) != std::cv_status::timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace memento
