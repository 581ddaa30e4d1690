// The trainer <-> agent protocol on a node: a Unix-domain stream socket
// (<root>/agent.sock, mode 0600 inside the 0700 root), each message a frame
// of a 4-byte little-endian length and that many bytes of JSON. Requests
// carry "op"; replies carry "ok" and, on failure, "code" and "message" (a
// Status). See docs/node_store.md for the operations.
//
// Both ends check the peer's uid with SO_PEERCRED.
//
// Thread safety: free functions; one frame at a time per descriptor.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::shm {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxFrameBytes = 16 << 20;

std::string AgentSocketPath(const std::string& root);

// Sends one frame. Unavailable when the peer is gone.
Status SendFrame(int fd, std::string_view body, Deadline deadline);
// Receives one frame. Unavailable when the peer closed the connection,
// DataLoss for a malformed frame, DeadlineExceeded.
Result<std::string> RecvFrame(int fd, Deadline deadline);

// How long the rest of a frame may take once its first byte arrived, on the
// agent's side of agent.sock: the same limit a TCP peer has for its whole
// handshake (net::ConnectionOptions::handshake_timeout_s). A client that
// sends part of a message and stalls is disconnected after it, instead of
// holding a connection thread and its buffer forever.
inline constexpr double kFrameTimeoutS = 5.0;

// Waits without limit for a frame to begin (a trainer may stay quiet between
// steps for as long as it likes), then receives it whole within
// `frame_timeout_s`: DeadlineExceeded, naming the bytes that had arrived,
// when it does not. Otherwise as RecvFrame.
Result<std::string> RecvFrameWithin(int fd, double frame_timeout_s);

// JSON message helpers (nlohmann's exceptions stop here).
Status SendJson(int fd, const nlohmann::json& msg, Deadline deadline);
Result<nlohmann::json> RecvJson(int fd, Deadline deadline);
nlohmann::json StatusToJson(const Status& status);  // {"ok": true} or {"ok": false, code, message}
Status StatusFromJson(const nlohmann::json& reply);

// Binds and listens on `path` (mode 0600). A socket file already there is
// probed first: AlreadyExists when an agent answers on it, otherwise (stale,
// left by a killed agent) it is removed and replaced.
Result<int> ListenUnix(const std::string& path);
// Connects to `path`: NotFound when no socket exists, Unavailable when it is
// stale (nobody listening).
Result<int> ConnectUnix(const std::string& path);

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
Result<PeerCred> GetPeerCred(int fd);

}  // namespace memento::shm
