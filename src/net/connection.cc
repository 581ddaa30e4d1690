#include "net/connection.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
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

Status TcpConnection::SendFrame(FrameHeader& h, const uint64_t* digest, const ConstBuffer* parts,
                                size_t num_parts, Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(CheckUsable());
  std::vector<iovec> iov;
  iov.reserve(num_parts + 2);
  iov.push_back({&h, sizeof(h)});
  if (digest != nullptr) iov.push_back({const_cast<uint64_t*>(digest), sizeof(*digest)});
  for (size_t i = 0; i < num_parts; ++i) {
    if (parts[i].size == 0) continue;
    iov.push_back({const_cast<void*>(parts[i].data), parts[i].size});
  }
  Status s = SendAll(fd_.get(), iov.data(), static_cast<int>(iov.size()), deadline);
  if (!s.ok()) {
    return Broken(s.WithContext(fmt::format("sending {} frame", FrameTypeName(h.type))));
  }
  return Status::Ok();
}

namespace {

FrameHeader MakeHeader(FrameType type, uint32_t flags, uint64_t payload_len) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.type = static_cast<uint16_t>(type);
  h.flags = flags;
  h.reserved = 0;
  h.payload_len = payload_len;
  h.checksum = 0;
  return h;
}

// Checksum of a digest frame: header (checksum = 0) then the digest.
uint64_t DigestFrameChecksum(const FrameHeader& h, uint64_t digest) {
  uint8_t buf[sizeof(FrameHeader) + sizeof(digest)];
  FrameHeader copy = h;
  copy.checksum = 0;
  std::memcpy(buf, &copy, sizeof(copy));
  std::memcpy(buf + sizeof(copy), &digest, sizeof(digest));
  return Checksum(buf, sizeof(buf));
}

}  // namespace

Status TcpConnection::Send(FrameType type, uint32_t flags, const ConstBuffer* parts,
                           size_t num_parts, Deadline deadline) {
  MutexLock l(&send_mu_);
  if (flags & kFrameFlagDigest) {
    return InvalidArgumentError("Send: use SendDigested for digest frames");
  }
  uint64_t len = 0;
  for (size_t i = 0; i < num_parts; ++i) len += parts[i].size;
  FrameHeader h = MakeHeader(type, flags, len);
  StreamingChecksum sum;
  sum.Update(&h, sizeof(h));
  for (size_t i = 0; i < num_parts; ++i) {
    if (parts[i].size > 0) sum.Update(parts[i].data, parts[i].size);
  }
  h.checksum = sum.Digest();
  return SendFrame(h, nullptr, parts, num_parts, deadline);
}

Status TcpConnection::SendDigested(FrameType type, const ConstBuffer* parts, size_t num_parts,
                                   uint64_t digest, Deadline deadline) {
  MutexLock l(&send_mu_);
  uint64_t len = kFrameDigestBytes;
  for (size_t i = 0; i < num_parts; ++i) len += parts[i].size;
  FrameHeader h = MakeHeader(type, kFrameFlagDigest, len);
  h.checksum = DigestFrameChecksum(h, digest);
  return SendFrame(h, &digest, parts, num_parts, deadline);
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

Result<uint64_t> TcpConnection::RecvPrelude(const FrameHeader& h, uint64_t* digest,
                                            Deadline deadline) {
  *digest = 0;
  if (!(h.flags & kFrameFlagDigest)) return h.payload_len;
  if (h.payload_len < kFrameDigestBytes) {
    return Broken(DataLossError(
        fmt::format("digest frame of {} bytes has no room for its digest", h.payload_len)));
  }
  Status s = RecvAll(fd_.get(), digest, sizeof(*digest), deadline);
  if (!s.ok()) return Broken(s.WithContext("receiving frame digest"));
  const uint64_t want = DigestFrameChecksum(h, *digest);
  if (want != h.checksum) {
    return Broken(DataLossError(fmt::format(
        "{} digest frame of {} bytes fails its header checksum (got 0x{:016x}, computed "
        "0x{:016x})",
        FrameTypeName(h.type), h.payload_len, h.checksum, want)));
  }
  return h.payload_len - kFrameDigestBytes;
}

Status TcpConnection::RecvData(const FrameHeader& h, uint64_t digest, void* head, size_t head_len,
                               void* body, size_t body_len, bool* digest_ok, Deadline deadline) {
  const bool digested = (h.flags & kFrameFlagDigest) != 0;
  StreamingChecksum sum;
  if (!digested) StartChecksum(h, &sum);
  Status s = RecvAll(fd_.get(), head, head_len, deadline, nullptr, &sum);
  if (s.ok()) s = RecvAll(fd_.get(), body, body_len, deadline, nullptr, &sum);
  if (!s.ok()) return Broken(s.WithContext("receiving frame payload"));
  if (!digested) return FinishPayload(h, sum);
  *digest_ok = sum.Digest() == digest;
  return Status::Ok();
}

Status TcpConnection::RecvDiscard(const FrameHeader& h, uint64_t digest, uint64_t len, Frame* f,
                                  Deadline deadline) {
  const bool digested = (h.flags & kFrameFlagDigest) != 0;
  StreamingChecksum sum;
  if (!digested) StartChecksum(h, &sum);
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(len, 64 << 10)));
  for (uint64_t left = len; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    Status s = RecvAll(fd_.get(), buf.data(), n, deadline, nullptr, &sum);
    if (!s.ok()) return Broken(s.WithContext("receiving the payload of a dropped frame"));
    if (f->payload.size() < kDiscardHeadBytes) {
      f->payload.append(buf.data(), std::min(n, kDiscardHeadBytes - f->payload.size()));
    }
    left -= n;
  }
  if (!digested) return FinishPayload(h, sum);
  f->digest_ok = sum.Digest() == digest;
  return Status::Ok();
}

Result<Frame> TcpConnection::Recv(Deadline deadline) {
  MutexLock l(&recv_mu_);
  MEMENTO_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(deadline));
  uint64_t digest = 0;
  MEMENTO_ASSIGN_OR_RETURN(uint64_t len, RecvPrelude(h, &digest, deadline));
  Frame f;
  f.type = static_cast<FrameType>(h.type);
  f.flags = h.flags;
  f.size = len;
  f.digest = digest;
  f.payload.resize(len);
  MEMENTO_RETURN_IF_ERROR(
      RecvData(h, digest, nullptr, 0, f.payload.data(), len, &f.digest_ok, deadline));
  if (!f.digest_ok) {
    return Broken(DataLossError(
        fmt::format("{} frame of {} bytes does not match its digest", FrameTypeName(h.type), len)));
  }
  return f;
}

Result<Frame> TcpConnection::RecvSplit(void* head, size_t head_len, void* body, size_t body_cap,
                                       size_t* body_len, Deadline deadline) {
  MutexLock l(&recv_mu_);
  MEMENTO_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(deadline));
  uint64_t digest = 0;
  MEMENTO_ASSIGN_OR_RETURN(uint64_t len, RecvPrelude(h, &digest, deadline));
  if (len < head_len || len - head_len > body_cap) {
    return Broken(InvalidArgumentError(
        fmt::format("{} frame of {} bytes does not fit the receive buffers ({} + {} bytes)",
                    FrameTypeName(h.type), len, head_len, body_cap)));
  }
  Frame f;
  f.type = static_cast<FrameType>(h.type);
  f.flags = h.flags;
  f.size = len;
  f.digest = digest;
  MEMENTO_RETURN_IF_ERROR(
      RecvData(h, digest, head, head_len, body, len - head_len, &f.digest_ok, deadline));
  if (!f.digest_ok) {
    return Broken(DataLossError(
        fmt::format("{} frame of {} bytes does not match its digest", FrameTypeName(h.type), len)));
  }
  *body_len = len - head_len;
  return f;
}

Result<Frame> TcpConnection::RecvWith(const PayloadSink& sink, Deadline deadline) {
  MutexLock l(&recv_mu_);
  MEMENTO_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(deadline));
  uint64_t digest = 0;
  MEMENTO_ASSIGN_OR_RETURN(uint64_t len, RecvPrelude(h, &digest, deadline));
  Frame f;
  f.type = static_cast<FrameType>(h.type);
  f.flags = h.flags;
  f.size = len;
  f.digest = digest;
  Result<void*> where = sink ? sink(f.type, h.flags, len) : Result<void*>(nullptr);
  if (!where.ok()) return Broken(where.status());
  void* dst = *where;
  if (dst == Connection::DiscardPayload()) {
    MEMENTO_RETURN_IF_ERROR(RecvDiscard(h, digest, len, &f, deadline));
    return f;
  }
  if (dst == nullptr) {
    f.payload.resize(len);
    dst = f.payload.data();
  }
  MEMENTO_RETURN_IF_ERROR(RecvData(h, digest, nullptr, 0, dst, len, &f.digest_ok, deadline));
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
