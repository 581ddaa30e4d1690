// Server: accepts TCP connections, authenticates each one with the job token
// and runs a handler for it on its own thread.
//
// Thread model: one accept thread; one thread per authenticated connection
// (the handler runs there and owns the connection until it returns). Stop()
// shuts the listening socket and every live connection down, so blocked
// handlers see Unavailable and return; Stop() then joins all threads.
// Unauthenticated peers are refused with a logged reason before the handler
// is ever called, so they cannot read or write anything.
//
// Thread safety: port() and Stop() may be called from any thread; the handler
// must not call Stop() on its own server.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "net/connection.h"

namespace memento::net {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = ephemeral; read it back with Server::port()
  // connection.max_payload is what one connection may hold: its largest
  // frame (RpcServer serves one request per connection at a time).
  ConnectionOptions connection;
  size_t max_connections = 1024;
  // What all connections together may hold in received request payloads at
  // once (RpcServer; 0: no total cap). A request that would exceed it is
  // read and dropped without being held, answered ResourceExhausted and
  // logged, both naming the cap as `limit_name` says (docs/transport.md,
  // "Memory caps").
  uint64_t max_buffered_bytes = 0;
  std::string limit_name = "the server's total receive cap";
};

class Server {
 public:
  // Runs on the connection's thread after authentication. The connection is
  // closed when it returns.
  using Handler = std::function<void(Connection& conn)>;

  [[nodiscard]] static Result<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                             JobToken token, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  // Stops accepting, shuts every connection down and joins all threads. Idempotent.
  void Stop() EXCLUDES(mu_);
  // Connections refused so far (failed handshakes).
  uint64_t refused() const { return refused_.load(); }

 private:
  struct Peer {
    std::thread thread;
    // Set before the handshake so Stop() can shut it down at any time.
    std::shared_ptr<TcpConnection> conn;
    bool done = false;
  };
  Server(ServerOptions options, JobToken token, Handler handler, Fd listen_fd, int port);
  void AcceptLoop();
  void Serve(Peer* peer, Fd fd, std::string addr);
  void ReapDone() EXCLUDES(mu_);

  const ServerOptions options_;
  const JobToken token_;
  const Handler handler_;
  Fd listen_fd_;
  const int port_;
  std::thread accept_thread_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  std::list<Peer> peers_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
};

}  // namespace memento::net
