#include "shm/protocol.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/json_parse.h"
#include "common/poll_timeout.h"
#include "fmt/format.h"

namespace memento::shm {

std::string AgentSocketPath(const std::string& root) { return root + "/agent.sock"; }

namespace {

Status WaitFd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, PollTimeoutMs(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0) return DeadlineExceededError("timed out waiting for the peer");
    if (errno != EINTR) return ErrnoError("poll", errno);
  }
}

Status WriteAll(int fd, const char* p, size_t n, Deadline deadline) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      MEMENTO_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline));
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    return UnavailableError(
        fmt::format("connection lost while sending: {}", w < 0 ? std::strerror(errno) : "closed"));
  }
  return Status::Ok();
}

Status ReadAll(int fd, char* p, size_t n, Deadline deadline, bool at_frame_start) {
  bool first = at_frame_start;
  while (n > 0) {
    ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      first = false;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      MEMENTO_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && first) return UnavailableError("the peer closed the connection");
    return UnavailableError(fmt::format("connection lost while receiving: {}",
                                        r < 0 ? std::strerror(errno) : "closed mid-frame"));
  }
  return Status::Ok();
}

Result<sockaddr_un> UnixAddr(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError(
        fmt::format("socket path {} is longer than {} bytes", path, sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Status SendFrame(int fd, std::string_view body, Deadline deadline) {
  if (body.size() > kMaxFrameBytes) {
    return InvalidArgumentError(fmt::format("message of {} bytes exceeds the {}-byte frame limit",
                                            body.size(), kMaxFrameBytes));
  }
  uint32_t n = static_cast<uint32_t>(body.size());
  char len[4] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                 static_cast<char>((n >> 16) & 0xff), static_cast<char>((n >> 24) & 0xff)};
  std::string frame(len, 4);
  frame.append(body);
  return WriteAll(fd, frame.data(), frame.size(), deadline);
}

Result<std::string> RecvFrame(int fd, Deadline deadline) {
  unsigned char len[4];
  MEMENTO_RETURN_IF_ERROR(ReadAll(fd, reinterpret_cast<char*>(len), 4, deadline, true));
  uint32_t n =
      uint32_t{len[0]} | uint32_t{len[1]} << 8 | uint32_t{len[2]} << 16 | uint32_t{len[3]} << 24;
  if (n > kMaxFrameBytes) {
    return DataLossError(
        fmt::format("frame of {} bytes exceeds the {}-byte limit", n, kMaxFrameBytes));
  }
  std::string body(n, '\0');
  MEMENTO_RETURN_IF_ERROR(ReadAll(fd, body.data(), n, deadline, false));
  return body;
}

Result<std::string> RecvFrameWithin(int fd, double frame_timeout_s) {
  MEMENTO_RETURN_IF_ERROR(WaitFd(fd, POLLIN, Deadline::Infinite()));
  Deadline deadline = Deadline::AfterSeconds(frame_timeout_s);
  unsigned char len[4];
  Status s = ReadAll(fd, reinterpret_cast<char*>(len), 4, deadline, true);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    return DeadlineExceededError(fmt::format(
        "a message began but its 4-byte length did not arrive within {} s", frame_timeout_s));
  }
  MEMENTO_RETURN_IF_ERROR(s);
  uint32_t n =
      uint32_t{len[0]} | uint32_t{len[1]} << 8 | uint32_t{len[2]} << 16 | uint32_t{len[3]} << 24;
  if (n > kMaxFrameBytes) {
    return DataLossError(
        fmt::format("frame of {} bytes exceeds the {}-byte limit", n, kMaxFrameBytes));
  }
  std::string body(n, '\0');
  s = ReadAll(fd, body.data(), n, deadline, false);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    return DeadlineExceededError(
        fmt::format("a message of {} bytes did not arrive whole within {} s", n, frame_timeout_s));
  }
  MEMENTO_RETURN_IF_ERROR(s);
  return body;
}

Status SendJson(int fd, const nlohmann::json& msg, Deadline deadline) {
  // Invalid UTF-8 in a string (a message quoting bad input) is replaced,
  // not thrown.
  return SendFrame(fd, msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                   deadline);
}

Result<nlohmann::json> RecvJson(int fd, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(std::string body, RecvFrame(fd, deadline));
  auto j = ParseForeignJson(body, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError("malformed message: not a JSON object");
  }
  return j;
}

nlohmann::json StatusToJson(const Status& status) {
  if (status.ok()) return {{"ok", true}};
  return {{"ok", false}, {"code", static_cast<int>(status.code())}, {"message", status.message()}};
}

Status StatusFromJson(const nlohmann::json& reply) {
  auto ok = reply.find("ok");
  if (ok == reply.end() || !ok->is_boolean()) return DataLossError("malformed reply: no 'ok'");
  if (ok->get<bool>()) return Status::Ok();
  // Fields of the wrong type are read as absent (json::value would throw).
  int code = static_cast<int>(StatusCode::kInternal);
  auto c = reply.find("code");
  if (c != reply.end() && c->is_number_integer()) {
    const int64_t v = c->get<int64_t>();
    if (v > 0 && v <= static_cast<int64_t>(StatusCode::kPermissionDenied)) {
      code = static_cast<int>(v);
    }
  }
  std::string message = "(no message)";
  auto m = reply.find("message");
  if (m != reply.end() && m->is_string()) message = m->get<std::string>();
  return Status(static_cast<StatusCode>(code), "agent: " + message);
}

Result<int> ListenUnix(const std::string& path) {
  MEMENTO_ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddr(path));
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    auto probe = ConnectUnix(path);
    if (probe.ok()) {
      close(*probe);
      return AlreadyExistsError("an agent is already listening on " + path);
    }
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError(path + " exists and is not a socket");
    }
    unlink(path.c_str());  // stale: left by an agent that was killed
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("bind " + path, err);
  }
  if (chmod(path.c_str(), 0600) != 0 || listen(fd, 64) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("listen " + path, err);
  }
  return fd;
}

Result<int> ConnectUnix(const std::string& path) {
  MEMENTO_ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddr(path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    if (err == ENOENT) return NotFoundError("no agent socket at " + path);
    if (err == ECONNREFUSED) {
      return UnavailableError("stale agent socket " + path +
                              ": nothing is listening (the agent died?); start `memento agent`");
    }
    if (err == EACCES) return PermissionDeniedError("no permission to connect to " + path);
    return ErrnoError("connect " + path, err);
  }
  return fd;
}

Result<PeerCred> GetPeerCred(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoError("getsockopt SO_PEERCRED", errno);
  }
  PeerCred p;
  p.pid = cred.pid;
  p.uid = cred.uid;
  p.gid = cred.gid;
  return p;
}

}  // namespace memento::shm
