// Loopback TCP throughput between two processes: the raw baseline
// (`tcp_gbps`, plain send/recv of the same bytes) and the memento transport
// (framed, checksummed, authenticated). Used by `memento bench tcp` and by
// `memento bench recover` as its network baseline.
//
// Both fork a receiver process; the calling process sends. Call them from a
// process with no other threads running work that the child could inherit
// locked (the child only uses plain syscalls and the transport).
#pragma once

#include <cstddef>

#include "memento/status.h"
#include "net/job_token.h"

namespace memento::net {

struct ThroughputResult {
  size_t bytes = 0;
  double seconds = 0;
  double gbps = 0;  // gigabits per second (1e9 bit/s)
};

// Sends `bytes` over a plain loopback TCP socket in `chunk`-sized send() calls
// to a forked receiver that reads them into a buffer. Time from first byte
// sent to the receiver's acknowledgement of the last one.
[[nodiscard]] Result<ThroughputResult> MeasureRawTcp(size_t bytes, size_t chunk);
// The same bytes as kData frames of `chunk` bytes on an authenticated
// Connection (the receiver uses RecvInto, verifying every checksum).
// Excludes connection setup and the handshake.
[[nodiscard]] Result<ThroughputResult> MeasureFramedTcp(size_t bytes, size_t chunk,
                                                        const JobToken& token);

}  // namespace memento::net
