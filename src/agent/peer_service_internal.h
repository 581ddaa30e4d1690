// Internal to the peer service (peer_service.h): what its source files share.
// Included only by src/agent/peer_service*.cc and peer_client.cc:
//   peer_service.cc      the plan, PeerService's start and its methods but one
//   peer_verify_kept.cc  kPeerVerifyKept: the survivors' deferred verification
//   peer_client.cc       ClusterReader and PushCopy (the calling side)
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/peer_service.h"
#include "memento/status.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::agent {

// `body` as a JSON object; InvalidArgument naming `what` otherwise.
Result<nlohmann::json> ParseJson(std::string_view body, const char* what);

// One complete T0 slot of the session's step, as it was when the session began.
struct KeptSlot {
  int rank = -1;
  int slot = -1;
  std::shared_ptr<shm::Segment> segment;
  shm::SlotInfo info;
  // Per chunk: 1 when it lies wholly inside a piece this node serves (its
  // receiver may check it; hashed at finish only when it was not streamed
  // whole).
  std::vector<uint8_t> served;
};

struct PeerService::KeptSession {
  int64_t step = -1;
  std::vector<KeptSlot> slots;
  std::thread t0_thread, red_thread;
  Status t0_status, red_status;  // written by the threads, read after the join
  uint64_t t0_hashed = 0, red_hashed = 0;
};

}  // namespace memento::agent
