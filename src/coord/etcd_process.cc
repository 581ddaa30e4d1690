#include "coord/etcd_process.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "coord/etcd_store.h"

namespace memento::coord {
namespace {

// A loopback port that was free a moment ago (bind to 0, read it back, close).
Result<int> FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("binding a free loopback port", err);
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

}  // namespace

Result<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(const std::string& dir, Deadline deadline,
                                                        const std::string& binary) {
  Result<std::string> path = FindExecutable(binary.empty() ? "etcd" : binary);
  if (!path.ok()) {
    return NotFoundError(
        fmt::format("no etcd server binary ({}); install it with scripts/setup.sh (Debian package "
                    "etcd-server) or name one (MEMENTO_ETCD_BIN for `memento bench`)",
                    path.status().message()));
  }
  std::unique_ptr<EtcdProcess> p(new EtcdProcess());
  p->binary_ = *path;
  p->data_dir_ = dir + "/etcd-data";
  p->log_path_ = dir + "/etcd.log";
  Status last;
  // The ports were free when picked; another process may take one before etcd
  // binds it: then pick again.
  for (int attempt = 0; attempt < 3 && !deadline.expired(); ++attempt) {
    MEMENTO_ASSIGN_OR_RETURN(p->client_port_, FreePort());
    MEMENTO_ASSIGN_OR_RETURN(p->peer_port_, FreePort());
    if (p->peer_port_ == p->client_port_) continue;
    last = p->Launch(deadline);
    if (last.ok()) return p;
    p->Kill();
    std::error_code ec;
    std::filesystem::remove_all(p->data_dir_, ec);
  }
  return last;
}

EtcdProcess::~EtcdProcess() { Kill(); }

std::string EtcdProcess::url() const { return fmt::format("etcd://127.0.0.1:{}", client_port_); }

void EtcdProcess::Kill() {
  if (proc_.unreaped()) {
    proc_.Kill(SIGKILL).IgnoreError();
    proc_.Wait(Deadline::AfterSeconds(10)).status().IgnoreError();
  }
}

Status EtcdProcess::Restart(bool keep_data, Deadline deadline) {
  Kill();
  if (!keep_data) {
    std::error_code ec;
    std::filesystem::remove_all(data_dir_, ec);
  }
  return Launch(deadline);
}

Status EtcdProcess::Launch(Deadline deadline) {
  const std::string client = fmt::format("http://127.0.0.1:{}", client_port_);
  const std::string peer = fmt::format("http://127.0.0.1:{}", peer_port_);
  SpawnOptions o;
  o.argv = {binary_,
            "--name=memento",
            "--data-dir=" + data_dir_,
            "--listen-client-urls=" + client,
            "--advertise-client-urls=" + client,
            "--listen-peer-urls=" + peer,
            "--initial-advertise-peer-urls=" + peer,
            "--initial-cluster=memento=" + peer,
            "--heartbeat-interval=10",
            "--election-timeout=100",
            "--log-level=warn",
            "--logger=zap"};
  o.log_path = log_path_;
  MEMENTO_ASSIGN_OR_RETURN(proc_, Subprocess::Spawn(o));
  Status last = UnavailableError("not probed yet");
  EtcdOptions eo;
  eo.endpoints.push_back(EtcdEndpoint{"127.0.0.1", client_port_});
  while (!deadline.expired()) {
    if (!proc_.running()) {
      return UnavailableError(fmt::format("etcd on {} exited ({}); its log {} ends:\n{}", client,
                                          proc_.exit_status()->ToString(), log_path_,
                                          TailFile(log_path_)));
    }
    auto s = EtcdStore::Open(eo, Deadline::AfterSeconds(0.5));
    if (s.ok()) return Status::Ok();
    last = s.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return UnavailableError(
      fmt::format("etcd on {} did not answer before the deadline ({}); its "
                  "log {} ends:\n{}",
                  client, last.ToString(), log_path_, TailFile(log_path_)));
}

}  // namespace memento::coord
