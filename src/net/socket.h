// Socket helpers for the TCP transport. Every blocking call takes a Deadline
// and is built on non-blocking descriptors plus poll(2), so no call can hang
// past its deadline.
//
// Thread safety: Fd is a value owning one descriptor; the free functions are
// thread-safe for distinct descriptors. One sender and one receiver may use
// the same socket concurrently.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/checksum.h"
#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::net {

// Owns a file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// A listening TCP socket on host:port (port 0 picks an ephemeral port; read
// it back with BoundPort). `host` is an IPv4 address or a name; "" = any.
[[nodiscard]] Result<Fd> ListenTcp(const std::string& host, int port, int backlog = 128);
// The local port a socket is bound to.
[[nodiscard]] Result<int> BoundPort(int fd);
// Waits for one connection. DeadlineExceeded when none arrives in time;
// Aborted when the listening socket was shut down.
[[nodiscard]] Result<Fd> AcceptTcp(int listen_fd, Deadline deadline, std::string* peer = nullptr);
// Connects to host:port (non-blocking connect + poll). Unavailable when the
// peer refuses, DeadlineExceeded when it does not answer in time.
[[nodiscard]] Result<Fd> ConnectTcp(const std::string& host, int port, Deadline deadline);

// Sends every byte of `iov` (sendmsg straight from the caller's buffers, no
// user-space copy). `iov` is consumed (advanced) in place. Unavailable when
// the peer closed, DeadlineExceeded on timeout.
[[nodiscard]] Status SendAll(int fd, iovec* iov, int iovcnt, Deadline deadline);
// Receives exactly `len` bytes. Unavailable when the peer closed first
// (message says how many bytes arrived), DeadlineExceeded on timeout.
// `received`, when given, is set to the number of bytes that did arrive.
// `sum`, when given, is updated with the bytes as they arrive (while they
// are still in cache).
[[nodiscard]] Status RecvAll(int fd, void* buf, size_t len, Deadline deadline,
                             size_t* received = nullptr, StreamingChecksum* sum = nullptr);

// The one parser of "host:port" addresses (store URLs, --listen flags, agent
// endpoints in the store). An IPv6 host may be bracketed ("[::1]:80"); the
// brackets are dropped. The port is decimal.
//   kListen:  port 0..65535 (0: the kernel picks one); an empty host means
//             every address (ListenTcp).
//   kConnect: port 1..65535 and a host.
// InvalidArgument quoting the text and saying what is wrong otherwise.
// Tested in src/net/transport_test.cc (HostPortTest).
struct HostPort {
  std::string host;
  int port = 0;
};
enum class PortUse { kListen, kConnect };
[[nodiscard]] Result<HostPort> ParseHostPort(std::string_view s, PortUse use);

}  // namespace memento::net
