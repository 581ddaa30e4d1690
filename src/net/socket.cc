#include "net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "common/poll_timeout.h"

namespace memento::net {
namespace {

Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return ErrnoError("fcntl", errno);
  return Status::Ok();
}

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits for `events` on fd. OK when ready (or on error/hangup: the next
// syscall reports it), DeadlineExceeded on timeout.
Status PollFor(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    // Once expired the timeout is 0: one last non-blocking check, so an
    // already-ready socket is not refused.
    int r = poll(&p, 1, PollTimeoutMs(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0) {
      if (deadline.expired())
        return DeadlineExceededError(fmt::format("{}: deadline exceeded", what));
      continue;
    }
    if (errno == EINTR) continue;
    return ErrnoError(what, errno);
  }
}

Result<sockaddr_in> Resolve(const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError(fmt::format("port {} out of range 0..65535", port));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    return addr;
  }
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return UnavailableError(fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

std::string AddrString(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return fmt::format("{}:{}", buf, ntohs(a.sin_port));
}

}  // namespace

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<Fd> ListenTcp(const std::string& host, int port, int backlog) {
  MEMENTO_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    return ErrnoError(fmt::format("bind {}", AddrString(addr)), errno);
  }
  if (listen(fd.get(), backlog) < 0) return ErrnoError("listen", errno);
  MEMENTO_RETURN_IF_ERROR(SetNonBlocking(fd.get()));
  return fd;
}

Result<int> BoundPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    return ErrnoError("getsockname", errno);
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<Fd> AcceptTcp(int listen_fd, Deadline deadline, std::string* peer) {
  for (;;) {
    MEMENTO_RETURN_IF_ERROR(PollFor(listen_fd, POLLIN, deadline, "accept"));
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int fd =
        accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      TuneSocket(fd);
      if (peer) *peer = AddrString(addr);
      return Fd(fd);
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
      continue;
    }
    if (errno == EINVAL || errno == EBADF) return AbortedError("accept: listening socket closed");
    return ErrnoError("accept", errno);
  }
}

Result<Fd> ConnectTcp(const std::string& host, int port, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoError("socket", errno);
  TuneSocket(fd.get());
  std::string where = AddrString(addr);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      return UnavailableError(fmt::format("connect {}: {}", where, std::strerror(errno)));
    }
    MEMENTO_RETURN_IF_ERROR(PollFor(fd.get(), POLLOUT, deadline, "connect"));
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return UnavailableError(fmt::format("connect {}: {}", where, std::strerror(err)));
  }
  return fd;
}

Status SendAll(int fd, iovec* iov, int iovcnt, Deadline deadline) {
  while (iovcnt > 0 && iov->iov_len == 0) {
    ++iov;
    --iovcnt;
  }
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        MEMENTO_RETURN_IF_ERROR(PollFor(fd, POLLOUT, deadline, "send"));
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) {
        return UnavailableError(
            fmt::format("send: peer closed the connection ({})", std::strerror(errno)));
      }
      return ErrnoError("send", errno);
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* buf, size_t len, Deadline deadline, size_t* received,
               StreamingChecksum* sum) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  size_t dummy = 0;
  size_t& out = received ? *received : dummy;
  out = 0;
  while (got < len) {
    ssize_t n = recv(fd, p + got, len - got, 0);
    if (n > 0) {
      if (sum) sum->Update(p + got, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      out = got;
      continue;
    }
    if (n == 0) {
      return UnavailableError(
          fmt::format("recv: peer closed the connection after {} of {} bytes", got, len));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      MEMENTO_RETURN_IF_ERROR(PollFor(fd, POLLIN, deadline, "recv"));
      continue;
    }
    if (errno == ECONNRESET || errno == ENOTCONN) {
      return UnavailableError(fmt::format("recv: {}", std::strerror(errno)));
    }
    return ErrnoError("recv", errno);
  }
  return Status::Ok();
}

Result<HostPort> ParseHostPort(std::string_view s, PortUse use) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= s.size()) {
    return InvalidArgumentError(fmt::format("address '{}': expected host:port", s));
  }
  const std::string_view digits = s.substr(colon + 1);
  int64_t port = 0;
  for (char c : digits) {
    if (c < '0' || c > '9' || port > 65535) {
      port = -1;
      break;
    }
    port = port * 10 + (c - '0');
  }
  const int64_t lowest = use == PortUse::kListen ? 0 : 1;
  if (port < lowest || port > 65535) {
    return InvalidArgumentError(
        fmt::format("address '{}': port '{}' is not {}..65535", s, digits, lowest));
  }
  std::string_view host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() && use == PortUse::kConnect) {
    return InvalidArgumentError(fmt::format("address '{}': no host to connect to", s));
  }
  return HostPort{std::string(host), static_cast<int>(port)};
}

}  // namespace memento::net
