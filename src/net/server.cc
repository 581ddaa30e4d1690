#include "net/server.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/thread_cpu.h"
#include "net/auth.h"

namespace memento::net {

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, JobToken token,
                                              Handler handler) {
  MEMENTO_ASSIGN_OR_RETURN(Fd fd, ListenTcp(options.host, options.port));
  MEMENTO_ASSIGN_OR_RETURN(int port, BoundPort(fd.get()));
  return std::unique_ptr<Server>(
      new Server(options, std::move(token), std::move(handler), std::move(fd), port));
}

Server::Server(ServerOptions options, JobToken token, Handler handler, Fd listen_fd, int port)
    : options_(std::move(options)),
      token_(std::move(token)),
      handler_(std::move(handler)),
      listen_fd_(std::move(listen_fd)),
      port_(port) {
  accept_thread_ = std::thread([this] {
    NameThisThread("rpc-accept");
    AcceptLoop();
  });
}

Server::~Server() { Stop(); }

void Server::AcceptLoop() {
  while (!stopping_.load()) {
    std::string addr;
    // Wake up now and then to reap finished connection threads.
    Result<Fd> fd = AcceptTcp(listen_fd_.get(), Deadline::AfterSeconds(0.2), &addr);
    ReapDone();
    if (!fd.ok()) {
      if (fd.status().code() == StatusCode::kDeadlineExceeded) continue;
      if (stopping_.load()) break;
      MEMENTO_LOG_WARN("net: accept on port {}: {}", port_, fd.status().ToString());
      if (fd.status().code() == StatusCode::kAborted) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    MutexLock l(&mu_);
    if (stopped_) break;
    if (peers_.size() >= options_.max_connections) {
      MEMENTO_LOG_WARN("net: refusing {}: {} connections already open", addr, peers_.size());
      refused_.fetch_add(1);
      continue;  // fd closes here
    }
    peers_.emplace_back();
    Peer* peer = &peers_.back();
    Fd owned = std::move(fd).value();
    peer->thread = std::thread([this, peer, f = std::move(owned), addr]() mutable {
      NameThisThread("rpc-conn");
      Serve(peer, std::move(f), addr);
    });
  }
}

void Server::Serve(Peer* peer, Fd fd, std::string addr) {
  auto c = std::make_shared<TcpConnection>(std::move(fd), addr, kMaxHandshakePayload);
  {
    MutexLock l(&mu_);
    if (stopped_) {
      peer->done = true;
      return;
    }
    peer->conn = c;
  }
  Status s =
      ServerHandshake(*c, token_, Deadline::AfterSeconds(options_.connection.handshake_timeout_s));
  if (s.ok()) {
    c->set_max_payload(options_.connection.max_payload);
    MEMENTO_LOG_DEBUG("net: authenticated {}", addr);
    handler_(*c);
  } else {
    refused_.fetch_add(1);
  }
  c->Shutdown();
  MutexLock l(&mu_);
  peer->done = true;
}

void Server::ReapDone() {
  std::list<Peer> done;
  {
    MutexLock l(&mu_);
    for (auto it = peers_.begin(); it != peers_.end();) {
      auto next = std::next(it);
      if (it->done) done.splice(done.end(), peers_, it);
      it = next;
    }
  }
  for (Peer& p : done) p.thread.join();
}

void Server::Stop() {
  stopping_.store(true);
  {
    MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    ::shutdown(listen_fd_.get(), SHUT_RDWR);
    for (Peer& p : peers_) {
      if (p.conn) p.conn->Shutdown();
    }
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<Peer> all;
  {
    MutexLock l(&mu_);
    all.swap(peers_);
  }
  for (Peer& p : all) p.thread.join();
  listen_fd_.Reset();
}

}  // namespace memento::net
