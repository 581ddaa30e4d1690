// Device tensors in the client's snapshot and restore (docs/has.md, "CUDA
// path"): chunk lists between device memory and page-locked host slots,
// with the slot's per-chunk xxHash3 checksums.
//
// Checksums are computed on the host, from the bytes that landed in the slot,
// right after each chunk's D2H copy completes (its event), while the next
// chunks are still in flight. Why on the host: the slot format's checksum is
// xxHash3, which the agent, the scrubber and the restore path recompute on the
// host; a device hash would need a bit-exact CUDA port of XXH3 and would take
// SMs from training, and hashing what actually arrived in the slot also
// covers the DMA itself. The cost is one host read of each chunk, which is in
// cache or at memory bandwidth, far above PCIe's.
//
// Thread safety: the functions may run on any thread; the engine serialises
// its own submissions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"
#include "snap/cuda/cuda_copy_engine.h"

namespace memento::cuda {

struct DeviceChunk {
  void* host = nullptr;    // slot bytes (page-locked: PinnedRegion)
  void* device = nullptr;  // device memory of a registered tensor
  size_t bytes = 0;
  uint64_t* checksum_out = nullptr;  // save: where the chunk's checksum goes
  uint64_t expected_checksum = 0;    // restore: what the slot bytes must hash to
  const char* label = "";            // tensor name for errors; outlives the call
};

// Save: copies every chunk device -> host on the engine's low-priority
// streams (at most the engine's max_inflight in flight; nothing synchronises
// the training stream) and stores each chunk's xxHash3, computed on the host
// once the chunk has landed, in *checksum_out. Returns the first CUDA error
// (Internal) or DeadlineExceeded; chunks already queued still finish.
Status SnapshotDeviceChunks(CudaCopyEngine* engine, const std::vector<DeviceChunk>& chunks,
                            Deadline deadline = Deadline::Infinite());

// Restore: checks each chunk's slot bytes against expected_checksum on the
// host (DataLoss naming the label and chunk when they differ: nothing of that
// chunk is copied), then copies it host -> device. Chunks before a bad one
// may already be written.
Status RestoreDeviceChunks(CudaCopyEngine* engine, const std::vector<DeviceChunk>& chunks);

}  // namespace memento::cuda
