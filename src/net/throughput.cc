#include "net/throughput.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/checksum.h"
#include "common/clock.h"
#include "net/auth.h"
#include "net/connection.h"
#include "net/socket.h"

namespace memento::net {
namespace {

constexpr double kChildTimeoutS = 120;

double CpuSeconds(const rusage& u) {
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

double ThreadCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return CpuSeconds(u);
}

Status ReapChild(pid_t pid, double* cpu_s = nullptr) {
  int st = 0;
  rusage u{};
  while (wait4(pid, &st, 0, &u) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid", errno);
  }
  if (cpu_s != nullptr) *cpu_s = CpuSeconds(u);
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

Result<ThroughputResult> MeasureRawTcp(size_t bytes, size_t chunk, size_t buffer_bytes) {
  if (bytes == 0 || chunk == 0) return InvalidArgumentError("bytes and chunk must be > 0");
  chunk = std::min(chunk, bytes);
  buffer_bytes = std::max(buffer_bytes, chunk);
  // Written now (pages present), like a slot the sender serves from. The
  // receiver allocates and writes its own after the fork (writing into
  // pages shared copy-on-write with the sender would fault on every page),
  // like the populated slot it rebuilds.
  std::unique_ptr<char[]> buf(new char[buffer_bytes]);
  std::memset(buf.get(), 0x5a, buffer_bytes);
  // The next `chunk`-sized window of a buffer, wrapping around.
  auto window = [&](char* base, size_t done, size_t n) {
    size_t at = done % buffer_bytes;
    if (at + n > buffer_bytes) at = 0;
    return base + at;
  };
  MEMENTO_ASSIGN_OR_RETURN(Fd lfd, ListenTcp("127.0.0.1", 0));
  MEMENTO_ASSIGN_OR_RETURN(int port, BoundPort(lfd.get()));
  MEMENTO_ASSIGN_OR_RETURN(pid_t pid, ForkReceiver([&]() -> bool {
                             std::unique_ptr<char[]> rbuf(new char[buffer_bytes]);
                             std::memset(rbuf.get(), 0xa5, buffer_bytes);
                             Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
                             auto fd = ConnectTcp("127.0.0.1", port, d);
                             if (!fd.ok()) return false;
                             const double cpu0 = ThreadCpuSeconds();
                             for (size_t done = 0; done < bytes;) {
                               size_t n = std::min(bytes - done, chunk);
                               if (!RecvAll(fd->get(), window(rbuf.get(), done, n), n, d).ok()) {
                                 return false;
                               }
                               done += n;
                             }
                             // The ack carries the receiver's CPU seconds
                             // for the transfer (its setup excluded).
                             double ack = ThreadCpuSeconds() - cpu0;
                             iovec iov{&ack, sizeof(ack)};
                             return SendAll(fd->get(), &iov, 1, d).ok();
                           }));
  Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
  Status s;
  double seconds = 0, cpu_s = 0, receiver_cpu_s = 0;
  {
    Result<Fd> fd = AcceptTcp(lfd.get(), d);
    if (!fd.ok()) {
      s = fd.status();
    } else {
      const double cpu0 = ThreadCpuSeconds();
      Stopwatch sw;
      for (size_t done = 0; done < bytes && s.ok();) {
        size_t n = std::min(bytes - done, chunk);
        iovec iov{window(buf.get(), done, n), n};
        s = SendAll(fd->get(), &iov, 1, d);
        done += n;
      }
      if (s.ok()) s = RecvAll(fd->get(), &receiver_cpu_s, sizeof(receiver_cpu_s), d);
      seconds = sw.Seconds();
      cpu_s = ThreadCpuSeconds() - cpu0;
    }
  }
  Status reaped = ReapChild(pid);
  MEMENTO_RETURN_IF_ERROR(s);
  MEMENTO_RETURN_IF_ERROR(reaped);
  ThroughputResult r = MakeResult(bytes, seconds);
  r.sender_cpu_s = cpu_s;
  r.receiver_cpu_s = receiver_cpu_s;
  return r;
}

Result<ThroughputResult> MeasureFramedTcp(size_t bytes, size_t chunk, const JobToken& token,
                                          bool digest_frames) {
  if (bytes == 0 || chunk == 0) return InvalidArgumentError("bytes and chunk must be > 0");
  chunk = std::min(chunk, bytes);
  std::unique_ptr<char[]> buf(new char[chunk]);
  std::memset(buf.get(), 0x5a, chunk);
  MEMENTO_ASSIGN_OR_RETURN(Fd lfd, ListenTcp("127.0.0.1", 0));
  MEMENTO_ASSIGN_OR_RETURN(int port, BoundPort(lfd.get()));
  ConnectionOptions opts;
  opts.max_payload = std::max<uint64_t>(chunk + kFrameDigestBytes, 1024);
  MEMENTO_ASSIGN_OR_RETURN(pid_t pid, ForkReceiver([&]() -> bool {
                             Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
                             auto conn = Dial("127.0.0.1", port, token, d, opts);
                             if (!conn.ok()) return false;
                             size_t left = bytes;
                             while (left > 0) {
                               size_t n = 0;
                               if (digest_frames) {
                                 auto f = (*conn)->RecvWith(
                                     [&](FrameType, uint32_t, uint64_t len) -> Result<void*> {
                                       if (len > chunk) return InvalidArgumentError("too big");
                                       return static_cast<void*>(buf.get());
                                     },
                                     d);
                                 if (!f.ok() || !f->digest_ok) return false;
                                 n = f->size;
                               } else {
                                 auto f = (*conn)->RecvInto(buf.get(), chunk, &n, d);
                                 if (!f.ok()) return false;
                               }
                               if (n == 0) return false;
                               left -= std::min(left, n);
                             }
                             return (*conn)->Send(FrameType::kData, "ack", d).ok();
                           }));
  Deadline d = Deadline::AfterSeconds(kChildTimeoutS);
  Status s;
  double seconds = 0, cpu_s = 0;
  {
    std::string peer;
    Result<Fd> fd = AcceptTcp(lfd.get(), d, &peer);
    Result<std::unique_ptr<TcpConnection>> conn =
        fd.ok() ? AcceptHandshake(std::move(fd).value(), peer, token, opts)
                : Result<std::unique_ptr<TcpConnection>>(fd.status());
    if (!conn.ok()) {
      s = conn.status();
    } else {
      const uint64_t full_digest = Checksum(buf.get(), chunk);
      const double cpu0 = ThreadCpuSeconds();
      Stopwatch sw;
      for (size_t left = bytes; left > 0 && s.ok();) {
        size_t n = std::min(left, chunk);
        ConstBuffer b{buf.get(), n};
        if (digest_frames) {
          s = (*conn)->SendDigested(FrameType::kData, &b, 1,
                                    n == chunk ? full_digest : Checksum(buf.get(), n), d);
        } else {
          s = (*conn)->Send(FrameType::kData, 0, &b, 1, d);
        }
        left -= n;
      }
      if (s.ok()) s = (*conn)->Recv(d).status();
      seconds = sw.Seconds();
      cpu_s = ThreadCpuSeconds() - cpu0;
    }
  }
  double child_cpu_s = 0;
  Status reaped = ReapChild(pid, &child_cpu_s);
  MEMENTO_RETURN_IF_ERROR(s);
  MEMENTO_RETURN_IF_ERROR(reaped);
  ThroughputResult r = MakeResult(bytes, seconds);
  r.sender_cpu_s = cpu_s;
  r.receiver_cpu_s = child_cpu_s;
  return r;
}

}  // namespace memento::net
