#include "net/frame.h"

#include <fmt/format.h>

namespace memento::net {

Status ValidateHeader(const FrameHeader& h, uint64_t max_payload) {
  if (h.magic != kFrameMagic) {
    return DataLossError(
        fmt::format("bad frame magic 0x{:08x} (expected 0x{:08x})", h.magic, kFrameMagic));
  }
  if (h.version != kFrameVersion) {
    return InvalidArgumentError(
        fmt::format("unsupported frame version {} (expected {})", h.version, kFrameVersion));
  }
  if (h.reserved != 0) {
    return DataLossError(fmt::format("frame reserved field is 0x{:x} (expected 0)", h.reserved));
  }
  if (h.payload_len > max_payload) {
    return InvalidArgumentError(
        fmt::format("frame payload length {} exceeds the maximum {}", h.payload_len, max_payload));
  }
  return Status::Ok();
}

std::string_view FrameTypeName(uint16_t type) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::kHello:
      return "Hello";
    case FrameType::kChallenge:
      return "Challenge";
    case FrameType::kProof:
      return "Proof";
    case FrameType::kAuthOk:
      return "AuthOk";
    case FrameType::kAuthFailed:
      return "AuthFailed";
    case FrameType::kRpcRequest:
      return "RpcRequest";
    case FrameType::kRpcReply:
      return "RpcReply";
    case FrameType::kData:
      return "Data";
  }
  return "Unknown";
}

}  // namespace memento::net
