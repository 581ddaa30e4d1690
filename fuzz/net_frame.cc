// Fuzz target: the frame decoder of the TCP transport (src/net), fed through
// a real socket pair. The first byte picks the receiver:
//   0  an unauthenticated peer: the server side of the handshake
//      (AcceptHandshake) reads the rest as what a stranger sent;
//   1  an authenticated connection: Recv until the stream ends or breaks;
//   2  the same through RecvWith into a caller's buffer (digest frames);
//   3  RecvSplit into a header buffer and a body buffer.
// Bit 2 of the first byte makes the harness recompute each frame's checksum
// (and a digest frame's digest) after mutation, so that inputs get past it.
// No input may crash, hang past its deadline or allocate more than the
// receiver's payload limit (64 KiB here).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "net/connection.h"
#include "net/frame.h"
#include "net/job_token.h"
#include "net/socket.h"

namespace {

// Recomputes the checksum (and a digest frame's digest) of every whole frame.
void FixChecksums(std::vector<uint8_t>& b) {
  using namespace memento;
  using namespace memento::net;
  size_t pos = 0;
  while (b.size() - pos >= sizeof(FrameHeader)) {
    FrameHeader h;
    std::memcpy(&h, b.data() + pos, sizeof(h));
    const size_t avail = b.size() - pos - sizeof(h);
    if (h.payload_len > avail) return;
    uint8_t* payload = b.data() + pos + sizeof(h);
    const bool digested = (h.flags & kFrameFlagDigest) != 0 && h.payload_len >= kFrameDigestBytes;
    if (digested) {
      const uint64_t d = Checksum(payload + kFrameDigestBytes, h.payload_len - kFrameDigestBytes);
      std::memcpy(payload, &d, sizeof(d));
    }
    h.checksum = 0;
    StreamingChecksum sum;
    sum.Update(&h, sizeof(h));
    sum.Update(payload, digested ? kFrameDigestBytes : h.payload_len);
    h.checksum = sum.Digest();
    std::memcpy(b.data() + pos, &h, sizeof(h));
    pos += sizeof(h) + h.payload_len;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  using namespace memento;
  using namespace memento::net;
  if (size == 0 || size > (size_t{1} << 20)) return 0;
  std::vector<uint8_t> bytes(input, input + size);
  if (bytes[0] & 4) {
    std::vector<uint8_t> rest(bytes.begin() + 1, bytes.end());
    FixChecksums(rest);
    std::copy(rest.begin(), rest.end(), bytes.begin() + 1);
  }
  const uint8_t* data = bytes.data();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
  // The whole input is queued, then the sender closes: the receiver sees the
  // bytes and then the end of the stream, never a stall.
  int buf = static_cast<int>(size * 2 + 65536);
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  size_t done = 1;
  while (done < size) {
    const ssize_t n = send(sv[0], data + done, size - done, MSG_NOSIGNAL);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  shutdown(sv[0], SHUT_WR);
  constexpr uint64_t kMaxPayload = 64 << 10;
  const Deadline deadline = Deadline::AfterSeconds(2);
  Fd fd(sv[1]);
  switch (data[0] % 4) {
    case 0: {
      static const JobToken token = *JobToken::FromSecret("fuzz-token-0123456789abcdef");
      ConnectionOptions o;
      o.max_payload = kMaxPayload;
      o.handshake_timeout_s = 2;
      (void)AcceptHandshake(std::move(fd), "fuzz", token, o);
      break;
    }
    case 1: {
      TcpConnection conn(std::move(fd), "fuzz", kMaxPayload);
      for (int i = 0; i < 64; ++i) {
        if (!conn.Recv(deadline).ok()) break;
      }
      break;
    }
    case 2: {
      TcpConnection conn(std::move(fd), "fuzz", kMaxPayload);
      std::vector<uint8_t> sink(kMaxPayload);
      for (int i = 0; i < 64; ++i) {
        auto f = conn.RecvWith(
            [&](FrameType, uint32_t, uint64_t len) -> Result<void*> {
              if (len > sink.size()) return InvalidArgumentError("too long");
              return static_cast<void*>(sink.data());
            },
            deadline);
        if (!f.ok()) break;
      }
      break;
    }
    default: {
      TcpConnection conn(std::move(fd), "fuzz", kMaxPayload);
      std::vector<uint8_t> head(16), body(4096);
      for (int i = 0; i < 64; ++i) {
        size_t body_len = 0;
        if (!conn.RecvSplit(head.data(), head.size(), body.data(), body.size(), &body_len, deadline)
                 .ok()) {
          break;
        }
      }
      break;
    }
  }
  close(sv[0]);
  return 0;
}
