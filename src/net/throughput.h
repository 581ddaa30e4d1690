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
  // CPU time (user + system) of the sending and the receiving process during
  // the transfer (MeasureRawTcp; MeasureFramedTcp counts the receiver's whole
  // life, connect and handshake included); their sum over `seconds` is the
  // cores the transfer kept busy. 0 when unknown.
  double sender_cpu_s = 0;
  double receiver_cpu_s = 0;
};

// Sends `bytes` over a plain loopback TCP socket in `chunk`-sized send() calls
// to a forked receiver that reads them into a buffer. Time from first byte
// sent to the receiver's acknowledgement of the last one. The sender sends
// from, and the receiver receives into, a buffer of `buffer_bytes` (0: one
// chunk), walked through chunk by chunk and wrapping around: with
// buffer_bytes = bytes every byte moves between distinct memory, as
// recovery moves a slot (a chunk-sized buffer stays in cache and flatters
// the baseline). Both buffers are written before the clock starts.
[[nodiscard]] Result<ThroughputResult> MeasureRawTcp(size_t bytes, size_t chunk,
                                                     size_t buffer_bytes = 0);
// The same bytes as kData frames of `chunk` bytes on an authenticated
// Connection (the receiver uses RecvInto, verifying every checksum).
// Excludes connection setup and the handshake.
// With `digest_frames`, the frames are kFrameFlagDigest frames whose digest
// the sender knows already (computed once before the clock starts, as the
// agent sends a slot chunk with its table checksum): the receiver still
// hashes and checks every byte (RecvWith), the sender hashes nothing.
[[nodiscard]] Result<ThroughputResult> MeasureFramedTcp(size_t bytes, size_t chunk,
                                                        const JobToken& token,
                                                        bool digest_frames = false);

}  // namespace memento::net
