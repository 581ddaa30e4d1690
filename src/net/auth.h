// Mutual HMAC-SHA256 challenge-response on a fresh connection
// (docs/transport.md, "Authentication").
//
//   client -> server  Hello      { version, client_nonce[32] }
//   server -> client  Challenge  { server_nonce[32], HMAC(token, "memento-server" | cn | sn) }
//   client -> server  Proof      { HMAC(token, "memento-client" | cn | sn) }
//   server -> client  AuthOk
//
// Nonces come from getrandom(2); proofs are compared in constant time.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "memento/deadline.h"
#include "memento/status.h"
#include "net/job_token.h"

namespace memento::net {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

[[nodiscard]] Result<Nonce> RandomNonce();
// HMAC-SHA256(token, label | client_nonce | server_nonce).
[[nodiscard]] Result<Proof> ComputeProof(const JobToken& token, std::string_view label,
                                         const Nonce& client_nonce, const Nonce& server_nonce);
// Constant-time equality.
bool ProofsEqual(const uint8_t* a, const uint8_t* b, size_t n);

inline constexpr std::string_view kServerLabel = "memento-server-v1";
inline constexpr std::string_view kClientLabel = "memento-client-v1";

class TcpConnection;
class Connection;
// The two halves; each returns PermissionDenied with the reason on refusal.
[[nodiscard]] Status ClientHandshake(TcpConnection& conn, const JobToken& token, Deadline deadline);
[[nodiscard]] Status ServerHandshake(TcpConnection& conn, const JobToken& token, Deadline deadline);

}  // namespace memento::net
