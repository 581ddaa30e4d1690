#include "agent/metrics_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>

#include "common/log.h"
#include "common/metrics.h"
#include "common/thread_cpu.h"
#include "fmt/format.h"
#include "net/socket.h"

namespace memento::agent {

struct MetricsServer::Impl {
  httplib::Server server;
  std::atomic<bool> done{false};  // listen_after_bind returned
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                            std::function<std::string()> render) {
  Result<net::HostPort> hp = net::ParseHostPort(listen, net::PortUse::kListen);
  if (!hp.ok()) return hp.status().WithContext("--metrics-listen");
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->impl_ = std::make_unique<Impl>();
  httplib::Server& server = s->impl_->server;
  server.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), kMetricsContentType);
  });
  server.set_keep_alive_max_count(4);
  // A scrape every few seconds: two threads are plenty (the default is one
  // per core).
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  int port = hp->port;
  if (port == 0) {
    port = server.bind_to_any_port(hp->host);
    if (port <= 0) {
      return UnavailableError(
          fmt::format("--metrics-listen {}: could not bind {}", listen, hp->host));
    }
  } else if (!server.bind_to_port(hp->host, port)) {
    return UnavailableError(fmt::format(
        "--metrics-listen {}: could not bind {}:{} (in use, or not an address of this host)",
        listen, hp->host, port));
  }
  s->port_ = port;
  s->address_ = fmt::format("{}:{}", hp->host, port);
  MetricsServer* self = s.get();
  s->thread_ = std::thread([self] {
    NameThisThread("metrics");
    if (!self->impl_->server.listen_after_bind()) {
      MEMENTO_LOG_WARN("metrics endpoint {} stopped serving", self->address_);
    }
    self->impl_->done.store(true);
  });
  MEMENTO_LOG_INFO("metrics: http://{}/metrics", s->address_);
  return s;
}

MetricsServer::~MetricsServer() {
  if (impl_ != nullptr && thread_.joinable()) {
    // cpp-httplib's stop() does nothing until the server runs: a stop that
    // came before listen_after_bind() started would leave it serving.
    while (!impl_->server.is_running() && !impl_->done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    impl_->server.stop();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace memento::agent
