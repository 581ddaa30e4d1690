// How a snapshot's chunks get from registered memory into a slot (docs/has.md,
// docs/thread_model.md). Three implementations: EagerPath (every chunk at
// once on the copy engine's workers), HasPath (hierarchical asynchronous
// snapshotting: chunks released into idle windows) and, in a build with
// CUDA, the device path (device tensors through the CUDA copy engine). All
// write the same slot format with the same crash consistency: every chunk's
// bytes and checksum are written before the header's kComplete (release),
// which SlotSink::CompleteSlot stores last.
#pragma once

#include <cstdint>
#include <vector>

#include "memento/client.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "snap/copy_engine.h"

namespace memento::client {

// What a snapshot path needs from the client that owns the slots.
// Implemented by the client; both methods may be called from any thread.
class SlotSink {
 public:
  virtual ~SlotSink() = default;
  // Returns once the data region of `slot` is touched (the first snapshot
  // after a restart), touching unclaimed parts itself (slot_prefault.h).
  virtual void PrefaultSlot(int slot) = 0;
  // Every chunk of version `step` is in `slot`: marks the slot complete
  // (last, with release ordering), makes it the newest and tells the agent.
  virtual void CompleteSlot(int slot, int64_t step) = 0;
};

// Thread safety: Begin, Fence, InFlight and Drain on the trainer thread only.
class SnapshotPath {
 public:
  virtual ~SnapshotPath() = default;
  // Starts copying `chunks` (chunk i of the slot layout is chunks[i]) into
  // `slot` as version `step` and returns at once. REQUIRES: !InFlight().
  virtual Status Begin(std::vector<snap::CopyChunk> chunks, int slot, int64_t step) = 0;
  // Waits for the snapshot in flight. When it has ended (InFlight() is then
  // false), fills *stats (all but skipped_total) and returns the snapshot's
  // status; DeadlineExceeded with InFlight() still true when it has not.
  virtual Status Fence(Deadline deadline, SnapshotStats* stats) = 0;
  // Whether a snapshot began and was not fenced yet.
  virtual bool InFlight() const = 0;
  // Waits for the snapshot in flight, if any, ignoring its result (the
  // client's destructor).
  virtual void Drain() = 0;
};

// CPU time of the calling thread in nanoseconds (CLOCK_THREAD_CPUTIME_ID).
uint64_t ThreadCpuNs();

// CPU time of the calling thread since its previous call (since the thread
// started on the first call). On a copy-engine worker, called after each
// chunk and after the job's completion, it is the CPU that chunk took: a
// worker only blocks between jobs.
uint64_t ThreadCpuSinceLastCallNs();

}  // namespace memento::client
