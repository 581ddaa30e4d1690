#include "client/slot_prefault.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

#include "shm/segment.h"

namespace memento::client {

SlotPrefault::SlotPrefault(uint8_t* base, size_t begin, size_t end)
    : base_(base),
      begin_(begin),
      end_(end),
      pieces_(end > begin ? (end - begin + kPiece - 1) / kPiece : 0) {}

void SlotPrefault::Help(const std::atomic<bool>* stop) {
  for (;;) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) return;
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces_) return;
    const size_t b = begin_ + i * kPiece, e = std::min(end_, b + kPiece);
    shm::PopulateWritable(base_ + b, e - b);
    shm::TouchPages(base_ + b, e - b);
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == pieces_) {
      MutexLock l(&mu_);
      cv_.SignalAll();
    }
  }
}

void SlotPrefault::HelpAndWait() {
  if (done()) return;
  Help();
  MutexLock l(&mu_);
  while (!done()) cv_.Wait(&l);
}

void SlotPrefaults::Start(int first, bool idle) {
  thread_ = std::thread([this, first, idle] {
    if (idle) {
      sched_param param{};
      sched_setscheduler(0, SCHED_IDLE, &param);
    }
    prefault_[first]->Help(&stop_);
    prefault_[first == 0 ? 1 : 0]->Help(&stop_);
  });
  pthread_setname_np(thread_.native_handle(), "mem-prefault");
}

void SlotPrefaults::Stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

}  // namespace memento::client
