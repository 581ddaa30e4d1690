// Device tensors (docs/has.md, "CUDA path"). Built from device_path_cuda.cc
// in a build with CUDA (MEMENTO_HAVE_CUDA) and from device_path_none.cc
// without: there, registering a device tensor fails with a message that says
// how to get a CUDA build, so no DeviceCopier is ever made.
#pragma once

#include <memory>
#include <vector>

#include "client/registered_tensor.h"
#include "client/snapshot_path.h"
#include "memento/client.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::client {

// Registration check of a tensor on a device: a CUDA device with that index
// is visible, and every device tensor of this client is on the same device.
// Without CUDA in the build or without a visible device, FailedPrecondition
// naming the tensor; InvalidArgument for a device index out of range.
Status CheckDeviceTensor(const TensorMeta& meta, Device device,
                         const std::vector<RegisteredTensor>& registered);

// The device side of a rank's slots: both slots page-locked once
// (cudaHostRegister) and one CUDA copy engine (low-priority streams on the
// tensors' device). Thread safety: CopyToSlot and CopyFromSlot may run on
// any thread (the engine serialises its submissions).
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Whether chunk `index` of the slot layout comes from device memory.
  virtual bool OnDevice(size_t index) const = 0;
  // D2H of device chunks (src on the device, dst in the slot) with their
  // checksums computed on the host once they land (snap/cuda/device_copy.h
  // says why).
  virtual Status CopyToSlot(const std::vector<snap::CopyChunk>& chunks) = 0;
  // Restore of device chunks (src in the slot, dst on the device): slot
  // bytes verified on the host against expected_checksum, then H2D. Adds the
  // bytes to *bytes.
  virtual Status CopyFromSlot(const std::vector<snap::CopyChunk>& chunks, uint64_t* bytes) = 0;
};

// At Seal(): null when every registered tensor is on the host. The slots
// stay mapped for the copier's lifetime (it is destroyed first: the pages
// are unregistered before the slots are unmapped).
Result<std::unique_ptr<DeviceCopier>> MakeDeviceCopier(
    const ClientOptions& options, const std::vector<RegisteredTensor>& tensors,
    const shm::SlotLayout& layout, const shm::Segment* const (&slots)[shm::kSlotsPerRank]);

// The eager schedule with device tensors: one thread per snapshot copies the
// device chunks through the CUDA engine (D2H pipelined on its low-priority
// streams) and the host chunks (blobs) on the CPU, then completes the slot
// exactly as the CPU engine's on_done does. The training stream is never
// synchronised; Fence() waits for that thread. `device` and `sink` outlive
// the path.
std::unique_ptr<SnapshotPath> MakeDeviceSnapshotPath(DeviceCopier* device, SlotSink* sink);

}  // namespace memento::client
