// Touching a rank's slots after they are mapped (docs/node_store.md,
// "Restart").
//
// The first access to each page of a new mapping of a slot is slow (on VMs
// with shadow paging, ~2.6 us per 4 KiB page: 0.7 s per GiB). A restarted
// trainer therefore maps its slots without touching them in Seal(), and a
// SlotPrefault touches the data region of one slot in 8 MiB pieces, claimed
// by whichever thread gets there first: the background thread of
// SlotPrefaults, Restore() for the slot it reads, the copy workers (or a
// helping Fence) of the first snapshot into it. Only speed depends on it: an
// untouched page is still correct to read or write (TouchPages is atomic),
// just slower on first access.
//
// Thread safety: Help() and HelpAndWait() may run on any number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

#include "common/mutex.h"
#include "shm/slot.h"

namespace memento::client {

class SlotPrefault {
 public:
  SlotPrefault(uint8_t* base, size_t begin, size_t end);
  bool done() const { return finished_.load(std::memory_order_acquire) >= pieces_; }
  // Touches unclaimed pieces until none is left to claim (or `stop` is set).
  void Help(const std::atomic<bool>* stop = nullptr);
  // Returns once every piece is touched, touching unclaimed ones itself.
  void HelpAndWait();

 private:
  static constexpr size_t kPiece = size_t{8} << 20;
  uint8_t* const base_;
  const size_t begin_;
  const size_t end_;
  const size_t pieces_;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> finished_{0};
  Mutex mu_;
  CondVar cv_;
};

// The prefaults of a rank's two slots and the background thread that works
// through them. Set() and Start()/Stop() on the trainer thread; slot(s) from
// any thread once set.
class SlotPrefaults {
 public:
  ~SlotPrefaults() { Stop(); }
  void Set(int slot, uint8_t* base, size_t begin, size_t end) {
    prefault_[slot] = std::make_unique<SlotPrefault>(base, begin, end);
  }
  SlotPrefault& slot(int s) { return *prefault_[s]; }

  // One thread touches the data regions of both slots, first `first` (the
  // one holding the newest version: the one a Restore() reads, and helps
  // with; with 4 KiB pages, touching the other slot at the same time only
  // slows both down on a shadow-paging VM), then the other one (the one the
  // next snapshot overwrites; its copiers help). At SCHED_IDLE when `idle`,
  // like the copy workers.
  void Start(int first, bool idle);
  // Stops the thread (pieces already claimed are finished) and joins it.
  void Stop();

 private:
  std::unique_ptr<SlotPrefault> prefault_[shm::kSlotsPerRank];
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace memento::client
