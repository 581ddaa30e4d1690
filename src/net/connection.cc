#include "net/connection.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "common/log.h"
#include "net/auth.h"

namespace memento::net {

TcpConnection::TcpConnection(Fd fd, std::string peer, uint64_t max_payload)
    : fd_(std::move(fd)), peer_(std::move(peer)), max_payload_(max_payload) {}

TcpConnection::~TcpConnection() { Shutdown(); }

void TcpConnection::Shutdown() {
  if (!shut_.exchange(true) && fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

Status TcpConnection::Broken(Status why, bool quiet) {
  {
    MutexLock l(&state_mu_);
    if (!broken_.ok()) return broken_;
    broken_ = why;
  }
  if (quiet || shut_.load()) {
    MEMENTO_LOG_DEBUG("net: connection to {} closed: {}", peer_, why.ToString());
  } else {
    MEMENTO_LOG_WARN("net: closing connection to {}: {}", peer_, why.ToString());
  }
  Shutdown();
  return why;
}

Status TcpConnection::CheckUsable() {
  MutexLock l(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (shut_.load()) return UnavailableError(fmt::format("connection to {} is shut down", peer_));
  return Status::Ok();
}

Status TcpConnection::Send(FrameType type, uint32_t flags, const ConstBuffer* parts,
                           size_t num_parts, Deadline deadline) {
  MutexLock l(&send_mu_);
  MEMENTO_RETURN_IF_ERROR(CheckUsable());
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.type = static_cast<uint16_t>(type);
  h.flags = flags;
  h.reserved = 0;
  h.payload_len = 0;
  for (size_t i = 0; i < num_parts; ++i) h.payload_len += parts[i].size;
  h.checksum = 0;
  StreamingChecksum sum;
  sum.Update(&h, sizeof(h));
  std::vector<iovec> iov;
  iov.reserve(num_parts + 1);
  iov.push_back({&h, sizeof(h)});
  for (size_t i = 0; i < num_parts; ++i) {
    if (parts[i].size == 0) continue;
    sum.Update(parts[i].data, parts[i].size);
    iov.push_back({const_cast<void*>(parts[i].data), parts[i].size});
  }
  h.checksum = sum.Digest();
  Status s = SendAll(fd_.get(), iov.data(), static_cast<int>(iov.size()), deadline);
  if (!s.ok()) {
    return Broken(s.WithContext(fmt::format("sending {} frame", FrameTypeName(h.type))));
  }
  return Status::Ok();
}

Result<FrameHeader> TcpConnection::RecvHeader(Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(CheckUsable());
  FrameHeader h;
  size_t got = 0;
  Status s = RecvAll(fd_.get(), &h, sizeof(h), deadline, &got);
  if (!s.ok()) {
    // A timeout before any byte of the frame leaves the stream intact.
    if (s.code() == StatusCode::kDeadlineExceeded && got == 0) return s;
    // EOF at a frame boundary is an orderly close, not worth a warning.
    bool orderly = s.code() == StatusCode::kUnavailable && got == 0;
    return Broken(s.WithContext("receiving frame header"), orderly);
  }
  s = ValidateHeader(h, max_payload_.load());
  if (!s.ok()) return Broken(s);
  return h;
}

void TcpConnection::StartChecksum(const FrameHeader& h, StreamingChecksum* sum) {
  FrameHeader copy = h;
  copy.checksum = 0;
  sum->Update(&copy, sizeof(copy));
}

Status TcpConnection::FinishPayload(const FrameHeader& h, const StreamingChecksum& sum) {
  uint64_t want = sum.Digest();
  if (want != h.checksum) {
    return Broken(DataLossError(
        fmt::format("{} frame of {} bytes fails its checksum (got 0x{:016x}, computed 0x{:016x})",
                    FrameTypeName(h.type), h.payload_len, h.checksum, want)));
  }
  return Status::Ok();
}

Result<Frame> TcpConnection::Recv(Deadline deadline) {
  MutexLock l(&recv_mu_);
  MEMENTO_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(deadline));
  Frame f;
  f.type = static_cast<FrameType>(h.type);
  f.flags = h.flags;
  f.payload.resize(h.payload_len);
  StreamingChecksum sum;
  StartChecksum(h, &sum);
  Status s = RecvAll(fd_.get(), f.payload.data(), f.payload.size(), deadline, nullptr, &sum);
  if (!s.ok()) return Broken(s.WithContext("receiving frame payload"));
  MEMENTO_RETURN_IF_ERROR(FinishPayload(h, sum));
  return f;
}

Result<Frame> TcpConnection::RecvSplit(void* head, size_t head_len, void* body, size_t body_cap,
                                       size_t* body_len, Deadline deadline) {
  MutexLock l(&recv_mu_);
  MEMENTO_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(deadline));
  if (h.payload_len < head_len || h.payload_len - head_len > body_cap) {
    return Broken(InvalidArgumentError(
        fmt::format("{} frame of {} bytes does not fit the receive buffers ({} + {} bytes)",
                    FrameTypeName(h.type), h.payload_len, head_len, body_cap)));
  }
  StreamingChecksum sum;
  StartChecksum(h, &sum);
  Status s = RecvAll(fd_.get(), head, head_len, deadline, nullptr, &sum);
  if (s.ok()) s = RecvAll(fd_.get(), body, h.payload_len - head_len, deadline, nullptr, &sum);
  if (!s.ok()) return Broken(s.WithContext("receiving frame payload"));
  MEMENTO_RETURN_IF_ERROR(FinishPayload(h, sum));
  *body_len = h.payload_len - head_len;
  Frame f;
  f.type = static_cast<FrameType>(h.type);
  f.flags = h.flags;
  return f;
}

Result<std::unique_ptr<Connection>> Dial(const std::string& host, int port, const JobToken& token,
                                         Deadline deadline, const ConnectionOptions& options) {
  MEMENTO_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(host, port, deadline));
  auto conn = std::make_unique<TcpConnection>(std::move(fd), fmt::format("{}:{}", host, port),
                                              kMaxHandshakePayload);
  Deadline hs = Deadline::AfterSeconds(options.handshake_timeout_s);
  if (hs.when() > deadline.when()) hs = deadline;
  Status s = ClientHandshake(*conn, token, hs);
  if (!s.ok()) return s.WithContext(fmt::format("connecting to {}:{}", host, port));
  conn->set_max_payload(options.max_payload);
  return std::unique_ptr<Connection>(std::move(conn));
}

Result<std::unique_ptr<TcpConnection>> AcceptHandshake(Fd fd, std::string peer,
                                                       const JobToken& token,
                                                       const ConnectionOptions& options) {
  auto conn = std::make_unique<TcpConnection>(std::move(fd), std::move(peer), kMaxHandshakePayload);
  Status s = ServerHandshake(*conn, token, Deadline::AfterSeconds(options.handshake_timeout_s));
  if (!s.ok()) return s;
  conn->set_max_payload(options.max_payload);
  return conn;
}

}  // namespace memento::net
