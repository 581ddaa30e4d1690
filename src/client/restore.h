// Loading a version from this rank's slots into the registered tensors
// (docs/node_store.md, "Restore"). Every chunk is verified while it is copied
// (one read of the slot); a version that fails its checksums leaves the
// tensors partly overwritten, and the next older intact version overwrites
// every byte.
//
// Thread safety: the trainer thread only, while no snapshot is in flight.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/agent_channel.h"
#include "client/device_path.h"
#include "client/registered_tensor.h"
#include "client/slot_prefault.h"
#include "memento/client.h"
#include "shm/slot.h"
#include "snap/copy_engine.h"

namespace memento::client {

// What a restore reads and uses; all of it is the client's.
struct RestoreContext {
  const ClientOptions* options = nullptr;
  const std::vector<RegisteredTensor>* tensors = nullptr;
  shm::RankSlots slots{};
  SlotPrefaults* prefaults = nullptr;
  snap::CopyEngine* engine = nullptr;
  bool help_engine = false;        // copy_priority "idle": the caller copies too
  DeviceCopier* device = nullptr;  // null without device tensors
  AgentChannel* agent = nullptr;   // told about versions that fail their checksums
};

struct RestoredVersion {
  int64_t step = -1;
  int slot = -1;
};

// Loads the newest intact version, or exactly `only` (no fallback) when
// given, into the registered tensors. Errors as Client::Restore() and
// Client::Restore(step) document them. *stats is set unless the saved tensors
// differ from the registered ones (InvalidArgument: nothing was tried).
Result<RestoredVersion> RestoreVersion(const RestoreContext& ctx, std::optional<int64_t> only,
                                       std::optional<RestoreStats>* stats);

}  // namespace memento::client
