// The device path of a build without CUDA (device_path.h): device tensors
// are refused at registration, so nothing else here is ever reached.
#include "client/device_path.h"
#include "fmt/format.h"

namespace memento::client {

Status CheckDeviceTensor(const TensorMeta& meta, Device device,
                         const std::vector<RegisteredTensor>& /*registered*/) {
  return FailedPreconditionError(fmt::format(
      "tensor '{}' lives on {}: this memento was built without CUDA (nvcc was not found at "
      "build time), so it cannot copy device memory; register a host copy of the tensor or "
      "rebuild with -DMEMENTO_WITH_CUDA=ON",
      meta.name, DeviceName(device)));
}

Result<std::unique_ptr<DeviceCopier>> MakeDeviceCopier(
    const ClientOptions& /*options*/, const std::vector<RegisteredTensor>& /*tensors*/,
    const shm::SlotLayout& /*layout*/, const shm::Segment* const (&/*slots*/)[shm::kSlotsPerRank]) {
  return std::unique_ptr<DeviceCopier>();
}

std::unique_ptr<SnapshotPath> MakeDeviceSnapshotPath(DeviceCopier* /*device*/, SlotSink* /*sink*/) {
  return nullptr;
}

}  // namespace memento::client
