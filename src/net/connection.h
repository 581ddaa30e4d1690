// Connection: one authenticated, framed, bidirectional byte stream between two
// memento processes.
//
//   MEMENTO_ASSIGN_OR_RETURN(auto conn, Dial("10.0.0.2", 7000, token, deadline));
//   ConstBuffer parts[] = {{header, sizeof(header)}, {shm_span.data(), shm_span.size()}};
//   MEMENTO_RETURN_IF_ERROR(conn->Send(FrameType::kData, 0, parts, 2, deadline));
//   MEMENTO_ASSIGN_OR_RETURN(Frame reply, conn->Recv(deadline));
//
// Connection is an interface so that tests can wrap one (FaultInjectionConnection
// drops, delays or cuts frames). TcpConnection is the real one.
//
// Thread safety: one thread may Send while another Receives; concurrent Sends
// (or concurrent Recvs) are serialised by internal mutexes. Shutdown() may be
// called from any thread and makes blocked calls return Unavailable promptly.
//
// Failure: any framing error (bad magic, version, length, checksum) or
// transport error leaves the connection broken: it is shut down, the reason
// is logged once, and every later call returns the same error.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "net/frame.h"
#include "net/job_token.h"
#include "net/socket.h"

namespace memento::net {

class Connection {
 public:
  virtual ~Connection() = default;

  // Sends one frame whose payload is the concatenation of `parts`. The bytes
  // go to the socket straight from the caller's buffers (sendmsg, no copy);
  // they must stay unchanged until Send returns.
  [[nodiscard]] virtual Status Send(FrameType type, uint32_t flags, const ConstBuffer* parts,
                                    size_t num_parts, Deadline deadline) = 0;
  // Sends one kFrameFlagDigest frame (frame.h): the data is the
  // concatenation of `parts` and `digest` must be its xxHash3-64 (seed 0),
  // known to the caller (e.g. a verified slot chunk's checksum) or computed
  // by it. The data is not hashed here; a wrong digest makes the receiver
  // reject the frame's data.
  [[nodiscard]] virtual Status SendDigested(FrameType type, const ConstBuffer* parts,
                                            size_t num_parts, uint64_t digest,
                                            Deadline deadline) = 0;
  // Receives one frame into a new string.
  [[nodiscard]] virtual Result<Frame> Recv(Deadline deadline) = 0;
  // Chooses where a frame's data goes once its header has been read and
  // checked: a buffer of at least `len` bytes, or nullptr for
  // Frame::payload. An error status breaks the connection (the data cannot
  // be skipped) and is returned by RecvWith.
  using PayloadSink = std::function<Result<void*>(FrameType type, uint32_t flags, uint64_t len)>;
  // What a PayloadSink answers to drop a frame's data instead of placing
  // it: the data is received and checked through a small buffer of the
  // connection (nothing of the frame's size is allocated), and the frame
  // comes back with at most kDiscardHeadBytes of its first bytes in payload
  // (e.g. a request's header, to answer it) and size set to its whole
  // length. For a receiver that refuses a frame it cannot hold yet keeps
  // the stream in step (RpcServer's total receive cap).
  static void* DiscardPayload() {
    static char tag;
    return &tag;
  }
  static constexpr size_t kDiscardHeadBytes = 64;
  // Receives one frame whose data goes where `sink` says (Frame::size bytes).
  // For a digest frame whose data does not match its digest, the frame is
  // returned with digest_ok = false and the connection stays usable (the
  // header was intact, so the stream is still in step); the caller must
  // discard the data.
  [[nodiscard]] virtual Result<Frame> RecvWith(const PayloadSink& sink, Deadline deadline) = 0;
  // Receives one frame whose payload is written straight into caller memory:
  // its first `head_len` bytes into `head`, the rest into body[0..body_cap).
  // Returns the frame (payload left empty) and sets *body_len. InvalidArgument
  // (and the connection breaks) when the payload is shorter than `head_len` or
  // its rest is longer than `body_cap`.
  [[nodiscard]] virtual Result<Frame> RecvSplit(void* head, size_t head_len, void* body,
                                                size_t body_cap, size_t* body_len,
                                                Deadline deadline) = 0;
  // Receives one frame whose payload is written straight into dst[0..capacity).
  [[nodiscard]] Result<Frame> RecvInto(void* dst, size_t capacity, size_t* len, Deadline deadline) {
    return RecvSplit(nullptr, 0, dst, capacity, len, deadline);
  }
  // Unblocks pending calls and makes later ones fail. Idempotent.
  virtual void Shutdown() = 0;
  // "ip:port" of the peer (for logs).
  virtual const std::string& peer() const = 0;

  // Convenience: one contiguous payload.
  [[nodiscard]] Status Send(FrameType type, std::string_view payload, Deadline deadline) {
    ConstBuffer b{payload.data(), payload.size()};
    return Send(type, 0, &b, 1, deadline);
  }
};

struct ConnectionOptions {
  // Largest payload accepted after authentication.
  uint64_t max_payload = kDefaultMaxPayload;
  // Deadline for the whole authentication handshake.
  double handshake_timeout_s = 5.0;
};

// A Connection over a TCP socket.
class TcpConnection : public Connection {
 public:
  TcpConnection(Fd fd, std::string peer, uint64_t max_payload);
  ~TcpConnection() override;

  Status Send(FrameType type, uint32_t flags, const ConstBuffer* parts, size_t num_parts,
              Deadline deadline) override EXCLUDES(send_mu_);
  using Connection::Send;
  Status SendDigested(FrameType type, const ConstBuffer* parts, size_t num_parts, uint64_t digest,
                      Deadline deadline) override EXCLUDES(send_mu_);
  Result<Frame> Recv(Deadline deadline) override EXCLUDES(recv_mu_);
  Result<Frame> RecvWith(const PayloadSink& sink, Deadline deadline) override EXCLUDES(recv_mu_);
  Result<Frame> RecvSplit(void* head, size_t head_len, void* body, size_t body_cap,
                          size_t* body_len, Deadline deadline) override EXCLUDES(recv_mu_);
  void Shutdown() override;
  const std::string& peer() const override { return peer_; }

  // The handshake runs with a small limit; raised once authenticated.
  void set_max_payload(uint64_t m) { max_payload_.store(m); }
  int fd() const { return fd_.get(); }

 private:
  Status Broken(Status why, bool quiet = false);
  Status CheckUsable();
  // Reads and validates a header; payload is read by the caller.
  Result<FrameHeader> RecvHeader(Deadline deadline) REQUIRES(recv_mu_);
  // Sends header + optional digest + parts (sendmsg).
  Status SendFrame(FrameHeader& h, const uint64_t* digest, const ConstBuffer* parts,
                   size_t num_parts, Deadline deadline) REQUIRES(send_mu_);
  // After RecvHeader: for a digest frame reads and checks the digest (into
  // *digest); returns the data length.
  Result<uint64_t> RecvPrelude(const FrameHeader& h, uint64_t* digest, Deadline deadline)
      REQUIRES(recv_mu_);
  // Reads `head_len` + `body_len` data bytes of the frame whose prelude was
  // read, checking the frame checksum (plain frames; any mismatch breaks the
  // connection) or the digest (*digest_ok says whether it matched).
  Status RecvData(const FrameHeader& h, uint64_t digest, void* head, size_t head_len, void* body,
                  size_t body_len, bool* digest_ok, Deadline deadline) REQUIRES(recv_mu_);
  static void StartChecksum(const FrameHeader& h, StreamingChecksum* sum);
  // Receives and drops the data of a frame whose prelude was read
  // (PayloadSink answered DiscardPayload()), keeping its first bytes in
  // f->payload.
  Status RecvDiscard(const FrameHeader& h, uint64_t digest, uint64_t len, Frame* f,
                     Deadline deadline) REQUIRES(recv_mu_);
  // Compares the checksum computed while the payload arrived.
  Status FinishPayload(const FrameHeader& h, const StreamingChecksum& sum) REQUIRES(recv_mu_);

  Fd fd_;
  const std::string peer_;
  std::atomic<uint64_t> max_payload_;
  Mutex send_mu_;
  Mutex recv_mu_;
  Mutex state_mu_;
  Status broken_ GUARDED_BY(state_mu_);
  std::atomic<bool> shut_{false};
};

// Connects to host:port and runs the client side of the handshake: both sides
// prove knowledge of `token` (docs/transport.md). PermissionDenied when the
// server fails to prove the token or refuses ours; Unavailable or
// DeadlineExceeded when it cannot be reached in time.
[[nodiscard]] Result<std::unique_ptr<Connection>> Dial(const std::string& host, int port,
                                                       const JobToken& token, Deadline deadline,
                                                       const ConnectionOptions& options = {});

// Runs the server side of the handshake on an accepted socket.
[[nodiscard]] Result<std::unique_ptr<TcpConnection>> AcceptHandshake(
    Fd fd, std::string peer, const JobToken& token, const ConnectionOptions& options = {});

}  // namespace memento::net
