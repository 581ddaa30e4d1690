// The agent's Prometheus endpoint (`memento agent --metrics-listen
// HOST:PORT`, docs/operating.md): GET /metrics answers the text exposition
// format that `render` produces at that moment; every other path is 404.
// A small HTTP server (cpp-httplib, Debian's libcpp-httplib-dev) on its own
// threads; rendering reads the components' own counters, so a scrape never
// blocks the save path for longer than those reads.
//
//   auto server = MetricsServer::Start("127.0.0.1:9400", [&] { return agent.Metrics(); });
//   (*server)->address();   // "127.0.0.1:9400" (port 0: the port bound)
//
// Thread safety: `render` is called on the server's threads, concurrently
// with everything else; Start and the destructor from one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "memento/status.h"

namespace memento::agent {

class MetricsServer {
 public:
  // Binds `listen` ("host:port"; port 0: any free port) and serves in the
  // background. InvalidArgument for a malformed address (naming it),
  // Unavailable when it cannot be bound.
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::function<std::string()> render);
  ~MetricsServer();  // stops serving and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" as bound.
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::string address_;
  int port_ = 0;
};

}  // namespace memento::agent
