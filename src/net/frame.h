// Wire frames of the agent transport.
//
// Every message on a memento TCP connection is one frame: a fixed 32-byte
// header followed by `payload_len` bytes. The header carries a magic, a
// version, the frame type and an xxHash3 checksum over the header (with the
// checksum field zeroed) and the payload. A receiver validates magic, version,
// reserved bits, length (against its maximum) and checksum; any mismatch closes
// the connection with a logged reason (docs/transport.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "memento/status.h"

namespace memento::net {

inline constexpr uint32_t kFrameMagic = 0x544D4D46;  // "FMMT" little-endian: 'F','M','M','T'
inline constexpr uint16_t kFrameVersion = 1;
// Largest payload a peer may send before authentication completes.
inline constexpr uint64_t kMaxHandshakePayload = 1024;
// Default largest payload after authentication (callers chunk larger data).
inline constexpr uint64_t kDefaultMaxPayload = uint64_t{256} << 20;

enum class FrameType : uint16_t {
  kHello = 1,       // client -> server: client nonce
  kChallenge = 2,   // server -> client: server nonce + server proof
  kProof = 3,       // client -> server: client proof
  kAuthOk = 4,      // server -> client: authentication accepted
  kAuthFailed = 5,  // either way: authentication refused (payload: reason)
  kRpcRequest = 16,
  kRpcReply = 17,
  kData = 32,  // opaque application data (benchmarks, bulk transfers)
};

struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t flags;
  uint32_t reserved;  // must be zero
  uint64_t payload_len;
  uint64_t checksum;  // xxHash3 over header (checksum = 0) then payload
};
static_assert(sizeof(FrameHeader) == 32, "FrameHeader is a fixed 32-byte wire struct");
static_assert(std::is_trivially_copyable_v<FrameHeader>);
static_assert(offsetof(FrameHeader, payload_len) == 16);
static_assert(offsetof(FrameHeader, checksum) == 24);
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire structs are little-endian");

// FrameHeader::flags bits.
//
// kFrameFlagDigest: the payload is `u64 digest` followed by the data, where
// digest = xxHash3-64 (seed 0) of the data alone, and `checksum` covers the
// header (checksum = 0) and the digest only. The receiver checks header and
// digest first (so the length is trusted), then hashes the data while it
// arrives and compares it with the digest. This keeps every byte covered by
// an xxHash3 end to end, but lets a sender that already knows the data's
// xxHash3 (a verified slot chunk: the checksum the trainer's copy computed)
// send it without hashing it again, and hands the receiver the digest of
// what it received (docs/transport.md, "Digest frames").
inline constexpr uint32_t kFrameFlagDigest = 1u << 0;
// Bytes the digest takes in front of the data of a kFrameFlagDigest frame.
inline constexpr uint64_t kFrameDigestBytes = 8;

// A received frame with its payload.
struct Frame {
  FrameType type = FrameType::kData;
  uint32_t flags = 0;
  std::string payload;  // empty when the payload went into caller memory
  // Bytes of data received (the payload less the digest of a digest frame).
  uint64_t size = 0;
  // kFrameFlagDigest frames: the sender's digest, and whether the data that
  // arrived matches it (Connection::RecvWith only; the other receive calls
  // turn a mismatch into DataLoss).
  uint64_t digest = 0;
  bool digest_ok = true;
};

// A read-only byte range supplied by a caller (e.g. a shared-memory span).
struct ConstBuffer {
  const void* data;
  size_t size;
};

// Checks the fixed fields of a header (not the checksum). InvalidArgument or
// DataLoss with a message naming the bad field.
[[nodiscard]] Status ValidateHeader(const FrameHeader& h, uint64_t max_payload);

std::string_view FrameTypeName(uint16_t type);

}  // namespace memento::net
