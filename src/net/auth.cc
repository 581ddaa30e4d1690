#include "net/auth.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "net/connection.h"

namespace memento::net {
namespace {

struct HelloMsg {
  uint32_t protocol;  // kFrameVersion
  uint32_t reserved;
  uint8_t client_nonce[kNonceBytes];
};
static_assert(sizeof(HelloMsg) == 40);
struct ChallengeMsg {
  uint8_t server_nonce[kNonceBytes];
  uint8_t server_proof[kProofBytes];
};
static_assert(sizeof(ChallengeMsg) == 64);
struct ProofMsg {
  uint8_t client_proof[kProofBytes];
};
static_assert(sizeof(ProofMsg) == 32);

// Receives a handshake frame of exactly sizeof(T) bytes and type `want`.
template <typename T>
Status RecvMsg(TcpConnection& conn, FrameType want, T* out, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(Frame f, conn.Recv(deadline));
  if (f.type == FrameType::kAuthFailed) {
    return PermissionDeniedError(
        fmt::format("peer {} refused authentication: {}", conn.peer(), f.payload.substr(0, 200)));
  }
  if (f.type != want || f.payload.size() != sizeof(T)) {
    return PermissionDeniedError(fmt::format(
        "peer {} sent a {} frame of {} bytes during the handshake (expected {} of {} bytes)",
        conn.peer(), FrameTypeName(static_cast<uint16_t>(f.type)), f.payload.size(),
        FrameTypeName(static_cast<uint16_t>(want)), sizeof(T)));
  }
  std::memcpy(out, f.payload.data(), sizeof(T));
  return Status::Ok();
}

template <typename T>
Status SendMsg(TcpConnection& conn, FrameType type, const T& msg, Deadline deadline) {
  ConstBuffer b{&msg, sizeof(T)};
  return conn.Send(type, 0, &b, 1, deadline);
}

// Refuses the peer: logs the reason, tells the peer (best effort) and closes.
Status Refuse(TcpConnection& conn, const Status& why, Deadline deadline) {
  MEMENTO_LOG_WARN("net: refusing peer {}: {}", conn.peer(), why.ToString());
  conn.Send(FrameType::kAuthFailed, "authentication failed", deadline).IgnoreError();
  conn.Shutdown();
  return why;
}

}  // namespace

Result<Nonce> RandomNonce() {
  Nonce n;
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("getrandom", errno);
    got += static_cast<size_t>(r);
  }
  return n;
}

Result<Proof> ComputeProof(const JobToken& token, std::string_view label, const Nonce& client_nonce,
                           const Nonce& server_nonce) {
  std::vector<uint8_t> msg;
  msg.insert(msg.end(), label.begin(), label.end());
  msg.insert(msg.end(), client_nonce.begin(), client_nonce.end());
  msg.insert(msg.end(), server_nonce.begin(), server_nonce.end());
  Proof out;
  unsigned int len = 0;
  const std::string& key = token.secret();
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(),
           out.data(), &len) == nullptr ||
      len != out.size()) {
    return InternalError("HMAC-SHA256 failed");
  }
  return out;
}

bool ProofsEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

Status ClientHandshake(TcpConnection& conn, const JobToken& token, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(Nonce cn, RandomNonce());
  HelloMsg hello{};
  hello.protocol = kFrameVersion;
  std::memcpy(hello.client_nonce, cn.data(), cn.size());
  MEMENTO_RETURN_IF_ERROR(SendMsg(conn, FrameType::kHello, hello, deadline));
  ChallengeMsg ch;
  Status s = RecvMsg(conn, FrameType::kChallenge, &ch, deadline);
  if (!s.ok()) {
    conn.Shutdown();
    return s.code() == StatusCode::kPermissionDenied ? s : s.WithContext("authentication");
  }
  Nonce sn;
  std::memcpy(sn.data(), ch.server_nonce, sn.size());
  MEMENTO_ASSIGN_OR_RETURN(Proof expect, ComputeProof(token, kServerLabel, cn, sn));
  if (!ProofsEqual(expect.data(), ch.server_proof, kProofBytes)) {
    return Refuse(conn,
                  PermissionDeniedError(fmt::format(
                      "server {} failed to prove the job token (wrong token?)", conn.peer())),
                  deadline);
  }
  MEMENTO_ASSIGN_OR_RETURN(Proof mine, ComputeProof(token, kClientLabel, cn, sn));
  ProofMsg pm;
  std::memcpy(pm.client_proof, mine.data(), mine.size());
  MEMENTO_RETURN_IF_ERROR(SendMsg(conn, FrameType::kProof, pm, deadline));
  MEMENTO_ASSIGN_OR_RETURN(Frame ok, conn.Recv(deadline));
  if (ok.type != FrameType::kAuthOk || !ok.payload.empty()) {
    conn.Shutdown();
    return PermissionDeniedError(fmt::format("server {} refused our job token", conn.peer()));
  }
  return Status::Ok();
}

Status ServerHandshake(TcpConnection& conn, const JobToken& token, Deadline deadline) {
  HelloMsg hello;
  Status s = RecvMsg(conn, FrameType::kHello, &hello, deadline);
  if (!s.ok()) return Refuse(conn, s.WithContext("handshake"), deadline);
  if (hello.protocol != kFrameVersion || hello.reserved != 0) {
    return Refuse(conn,
                  PermissionDeniedError(fmt::format("client speaks protocol {} (expected {})",
                                                    hello.protocol, kFrameVersion)),
                  deadline);
  }
  Nonce cn;
  std::memcpy(cn.data(), hello.client_nonce, cn.size());
  MEMENTO_ASSIGN_OR_RETURN(Nonce sn, RandomNonce());
  MEMENTO_ASSIGN_OR_RETURN(Proof mine, ComputeProof(token, kServerLabel, cn, sn));
  ChallengeMsg ch;
  std::memcpy(ch.server_nonce, sn.data(), sn.size());
  std::memcpy(ch.server_proof, mine.data(), mine.size());
  MEMENTO_RETURN_IF_ERROR(SendMsg(conn, FrameType::kChallenge, ch, deadline));
  ProofMsg pm;
  s = RecvMsg(conn, FrameType::kProof, &pm, deadline);
  if (!s.ok()) return Refuse(conn, s.WithContext("handshake"), deadline);
  MEMENTO_ASSIGN_OR_RETURN(Proof expect, ComputeProof(token, kClientLabel, cn, sn));
  if (!ProofsEqual(expect.data(), pm.client_proof, kProofBytes)) {
    return Refuse(conn, PermissionDeniedError("client failed to prove the job token"), deadline);
  }
  return conn.Send(FrameType::kAuthOk, std::string_view(), deadline);
}

}  // namespace memento::net
