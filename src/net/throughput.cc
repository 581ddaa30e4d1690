#include "net/throughput.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/clock.h"
#include "net/auth.h"
#include "net/connection.h"
#include "net/socket.h"

namespace memento::net {
namespace {

constexpr double kChildTimeoutS = 120;

Status ReapChild(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid", errno);
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return InternalError(fmt::format("throughput receiver exited with status 0x{:x}", st));
  }
  return Status::Ok();
}

// Runs `child` in a forked process that exits with 0 on success.
template <typename Fn>
Result<pid_t> ForkReceiver(Fn child) {
  pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) _exit(child() ? 0 : 1);
  return pid;
}

ThroughputResult MakeResult(size_t bytes, double seconds) {
  ThroughputResult r;
  r.bytes = bytes;
  r.seconds = seconds;
  r.gbps = seconds > 0 ? static_cast<double>(bytes) * 8 / seconds / 1e9 : 0;
  return r;
}

}  // namespace

Result<ThroughputResult> MeasureRawTcp(size_t bytes, size_t chunk) {
  if (bytes == 0 || chunk == 0) return InvalidArgumentError("bytes and chunk must be > 0");
  chunk = std::min(chunk, bytes);
  std::unique_ptr<char[]> buf(new char[chunk]);
  std::memset(buf.get(), 0x5a, chunk);
  MEMENTO_ASSIGN_OR_RETURN(Fd lfd, ListenTcp("127.0.0.1", 0));
  MEMENTO_ASSIGN_OR_RETURN(int port, BoundPort(lfd.get()));
  MEMENTO_ASSIGN_OR_RETURN(pid_t pid, ForkReceiver([&]() -> bool {
                             Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
                             auto fd = ConnectTcp("127.0.0.1", port, d);
                             if (!fd.ok()) return false;
                             size_t left = bytes;
                             while (left > 0) {
                               size_t n = std::min(left, chunk);
                               if (!RecvAll(fd->get(), buf.get(), n, d).ok()) return false;
                               left -= n;
                             }
                             char ack = 1;
                             iovec iov{&ack, 1};
                             return SendAll(fd->get(), &iov, 1, d).ok();
                           }));
  Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
  Status s;
  double seconds = 0;
  {
    Result<Fd> fd = AcceptTcp(lfd.get(), d);
    if (!fd.ok()) {
      s = fd.status();
    } else {
      Stopwatch sw;
      for (size_t left = bytes; left > 0 && s.ok();) {
        size_t n = std::min(left, chunk);
        iovec iov{buf.get(), n};
        s = SendAll(fd->get(), &iov, 1, d);
        left -= n;
      }
      char ack = 0;
      if (s.ok()) s = RecvAll(fd->get(), &ack, 1, d);
      seconds = sw.Seconds();
    }
  }
  Status reaped = ReapChild(pid);
  MEMENTO_RETURN_IF_ERROR(s);
  MEMENTO_RETURN_IF_ERROR(reaped);
  return MakeResult(bytes, seconds);
}

Result<ThroughputResult> MeasureFramedTcp(size_t bytes, size_t chunk, const JobToken& token) {
  if (bytes == 0 || chunk == 0) return InvalidArgumentError("bytes and chunk must be > 0");
  chunk = std::min(chunk, bytes);
  std::unique_ptr<char[]> buf(new char[chunk]);
  std::memset(buf.get(), 0x5a, chunk);
  MEMENTO_ASSIGN_OR_RETURN(Fd lfd, ListenTcp("127.0.0.1", 0));
  MEMENTO_ASSIGN_OR_RETURN(int port, BoundPort(lfd.get()));
  ConnectionOptions opts;
  opts.max_payload = std::max<uint64_t>(chunk, 1024);
  MEMENTO_ASSIGN_OR_RETURN(pid_t pid, ForkReceiver([&]() -> bool {
                             Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
                             auto conn = Dial("127.0.0.1", port, token, d, opts);
                             if (!conn.ok()) return false;
                             size_t left = bytes;
                             while (left > 0) {
                               size_t n = 0;
                               auto f = (*conn)->RecvInto(buf.get(), chunk, &n, d);
                               if (!f.ok() || n == 0) return false;
                               left -= std::min(left, n);
                             }
                             return (*conn)->Send(FrameType::kData, "ack", d).ok();
                           }));
  Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
  Status s;
  double seconds = 0;
  {
    std::string peer;
    Result<Fd> fd = AcceptTcp(lfd.get(), d, &peer);
    Result<std::unique_ptr<TcpConnection>> conn =
        fd.ok() ? AcceptHandshake(std::move(fd).value(), peer, token, opts)
                : Result<std::unique_ptr<TcpConnection>>(fd.status());
    if (!conn.ok()) {
      s = conn.status();
    } else {
      Stopwatch sw;
      for (size_t left = bytes; left > 0 && s.ok();) {
        size_t n = std::min(left, chunk);
        ConstBuffer b{buf.get(), n};
        s = (*conn)->Send(FrameType::kData, 0, &b, 1, d);
        left -= n;
      }
      if (s.ok()) s = (*conn)->Recv(d).status();
      seconds = sw.Seconds();
    }
  }
  Status reaped = ReapChild(pid);
  MEMENTO_RETURN_IF_ERROR(s);
  MEMENTO_RETURN_IF_ERROR(reaped);
  return MakeResult(bytes, seconds);
}

}  // namespace memento::net
