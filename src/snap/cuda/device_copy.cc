#include "snap/cuda/device_copy.h"

#include <algorithm>
#include <deque>
#include <string>

#include "common/checksum.h"

namespace memento::cuda {

Status SnapshotDeviceChunks(CudaCopyEngine* engine, const std::vector<DeviceChunk>& chunks,
                            Deadline deadline) {
  // Tickets in submission order; the oldest is hashed as soon as it lands
  // while the younger ones are still crossing PCIe.
  std::deque<std::pair<uint64_t, const DeviceChunk*>> inflight;
  const size_t depth = static_cast<size_t>(std::max(1, engine->options().max_inflight));
  Status first;
  auto finish_oldest = [&]() -> Status {
    auto [ticket, c] = inflight.front();
    inflight.pop_front();
    MEMENTO_RETURN_IF_ERROR(engine->Wait(ticket, deadline));
    if (c->checksum_out != nullptr) *c->checksum_out = Checksum(c->host, c->bytes);
    return Status::Ok();
  };
  for (const DeviceChunk& c : chunks) {
    if (inflight.size() >= depth) {
      first = finish_oldest();
      if (!first.ok()) break;
    }
    auto ticket = engine->SubmitD2H(c.host, c.device, c.bytes);
    if (!ticket.ok()) {
      first = ticket.status();
      break;
    }
    inflight.emplace_back(*ticket, &c);
  }
  while (!inflight.empty()) {
    Status st = finish_oldest();
    if (first.ok()) first = st;
  }
  return first;
}

Status RestoreDeviceChunks(CudaCopyEngine* engine, const std::vector<DeviceChunk>& chunks) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    const DeviceChunk& c = chunks[i];
    const uint64_t sum = Checksum(c.host, c.bytes);
    if (sum != c.expected_checksum) {
      return DataLossError("device tensor '" + std::string(c.label) + "': a chunk of " +
                           std::to_string(c.bytes) + " bytes fails its checksum (" +
                           std::to_string(sum) + " != " + std::to_string(c.expected_checksum) +
                           ")");
    }
    MEMENTO_RETURN_IF_ERROR(engine->CopyH2D(c.device, c.host, c.bytes));
  }
  return Status::Ok();
}

}  // namespace memento::cuda
