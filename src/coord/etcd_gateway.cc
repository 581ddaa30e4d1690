// EtcdStore's HTTP side (etcd_internal.h): the connection pool, unary calls
// (Call) and streams (Stream) to etcd's JSON gateway, and the epoch kept from
// response headers.
#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "common/json_parse.h"
#include "coord/etcd_internal.h"

namespace memento::coord {

namespace etcd {

uint64_t RandomEpoch() {
  uint64_t e = 0;
  if (getrandom(&e, sizeof(e), 0) != sizeof(e)) {
    e = std::random_device{}() ^ static_cast<uint64_t>(Now().time_since_epoch().count());
  }
  return e == 0 ? 1 : e;
}

void SetTimeouts(httplib::Client& c, Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.remaining());
  if (deadline.infinite() || left > std::chrono::hours(1)) left = std::chrono::hours(1);
  // cpp-httplib waits in whole milliseconds (poll): round up, so that its
  // timeout never fires before the deadline.
  left = std::chrono::microseconds((left.count() + 999) / 1000 * 1000 + 1000);
  const time_t sec = static_cast<time_t>(left.count() / 1000000);
  const time_t usec = static_cast<time_t>(left.count() % 1000000);
  c.set_connection_timeout(sec, usec);
  c.set_read_timeout(sec, usec);
  c.set_write_timeout(sec, usec);
}

}  // namespace etcd

namespace {

constexpr size_t kMaxIdleConnections = 32;

}  // namespace

std::unique_ptr<EtcdStore::Conn> EtcdStore::Acquire(size_t* endpoint) {
  const size_t want = current_.load() % options_.endpoints.size();
  {
    MutexLock l(&pool_mu_);
    for (size_t i = idle_.size(); i-- > 0;) {
      if (idle_[i]->endpoint == want) {
        std::unique_ptr<Conn> c = std::move(idle_[i]);
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        *endpoint = want;
        return c;
      }
    }
  }
  auto c = std::make_unique<Conn>();
  c->endpoint = want;
  const EtcdEndpoint& ep = options_.endpoints[want];
  if (options_.tls()) {
    // https: etcd's server certificate verified against the CA (its host
    // name too), and the client certificate when one is configured.
    c->client =
        std::make_unique<httplib::Client>("https://" + ep.host + ":" + std::to_string(ep.port),
                                          options_.cert_file, options_.key_file);
    c->client->set_ca_cert_path(options_.ca_file);
    c->client->enable_server_certificate_verification(true);
  } else {
    c->client = std::make_unique<httplib::Client>(ep.host, ep.port);
  }
  c->client->set_keep_alive(true);
  c->client->set_tcp_nodelay(true);  // headers and body go in two writes: no Nagle stall
  *endpoint = want;
  return c;
}

void EtcdStore::Release(std::unique_ptr<Conn> conn) {
  MutexLock l(&pool_mu_);
  if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(conn));
}

int64_t EtcdStore::Observe(const json& response, int64_t floor) {
  auto h = response.find("header");
  if (h == response.end()) return 0;
  const int64_t rev = I64(*h, "revision");
  int64_t seen = max_revision_.load();
  while (rev > seen && !max_revision_.compare_exchange_weak(seen, rev)) {
  }
  // `floor` was the highest revision seen before this request was sent: a
  // linearizable answer to it cannot be older. (Answers to requests that were
  // in flight together arrive in any order: comparing with the running
  // maximum instead changed the epoch for nothing.)
  if (rev > 0 && rev < floor) {
    // The store's history went back: this etcd lost its data (restarted empty).
    max_revision_.store(rev);
    epoch_.store(RandomEpoch());
  }
  return rev;
}

Result<json> EtcdStore::Call(const std::string& path, const json& body, Deadline deadline,
                             bool retry_after_send) {
  const std::string payload = body.dump();
  bool reauthenticated = false;
  Status last = UnavailableError(fmt::format("etcd {}: no endpoint answered {}", url_, path));
  for (;;) {
    if (deadline.expired()) {
      return DeadlineExceededError(
          fmt::format("etcd {} {}: deadline passed ({})", url_, path, last.message()));
    }
    size_t ep = 0;
    std::unique_ptr<Conn> conn = Acquire(&ep);
    SetTimeouts(*conn->client, deadline);
    const int64_t floor = max_revision_.load();
    httplib::Headers headers;
    if (path != "/v3/auth/authenticate") {
      std::string token = AuthToken();
      if (!token.empty()) headers.emplace("Authorization", token);
    }
    // The body goes through a receiver: etcd's gateway ends an error answer
    // with an HTTP trailer (Grpc-Trailer-Content-Type), which cpp-httplib 0.11
    // reports as a read error after it has delivered the whole body. A body
    // that is complete JSON is the answer then (and the connection is dropped).
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = std::move(headers);
    req.body = payload;
    req.set_header("Content-Type", "application/json");
    std::string body_in;
    req.content_receiver = [&body_in](const char* data, size_t n, uint64_t, uint64_t) {
      body_in.append(data, n);
      return true;
    };
    httplib::Response response;
    httplib::Error e = httplib::Error::Success;
    bool reusable = conn->client->send(req, response, e);
    if (!reusable && e == httplib::Error::Read && response.status > 0 && !body_in.empty() &&
        !ParseForeignJson(body_in, false).is_discarded()) {
      e = httplib::Error::Success;
    }
    if (e != httplib::Error::Success) {
      const EtcdEndpoint& where = options_.endpoints[ep];
      last = UnavailableError(
          fmt::format("etcd {}:{} {}: {}", where.host, where.port, path, httplib::to_string(e)));
      if (e == httplib::Error::Connection) {
        size_t expected = ep;
        current_.compare_exchange_strong(expected, (ep + 1) % options_.endpoints.size());
      }
      const bool not_sent = e == httplib::Error::Connection || e == httplib::Error::Write ||
                            e == httplib::Error::SSLConnection;
      if (not_sent || retry_after_send) {
        std::this_thread::sleep_for(
            std::min<Duration>(std::chrono::milliseconds(20), deadline.remaining()));
        continue;
      }
      if (deadline.expired()) {
        return DeadlineExceededError(
            fmt::format("etcd {} {}: no answer before the deadline", url_, path));
      }
      return last;
    }
    if (reusable) Release(std::move(conn));
    const httplib::Response* res = &response;
    json j = ParseForeignJson(body_in, false);
    if (j.is_discarded() || !j.is_object()) {
      return InternalError(fmt::format("etcd {} {}: HTTP {} with a body that is not JSON: {}", url_,
                                       path, res->status, body_in.substr(0, 200)));
    }
    if (auto err = ErrorOf(j)) {
      if (err->first == 16 && !options_.user.empty() && !reauthenticated &&
          path != "/v3/auth/authenticate") {
        reauthenticated = true;  // the token expired: renew it once
        MEMENTO_RETURN_IF_ERROR(Authenticate(deadline));
        continue;
      }
      if (err->first == 14 && retry_after_send) {  // e.g. "leader changed"
        last = FromGrpc(err->first, err->second, fmt::format("etcd {} {}", url_, path));
        std::this_thread::sleep_for(
            std::min<Duration>(std::chrono::milliseconds(50), deadline.remaining()));
        continue;
      }
      return FromGrpc(err->first, err->second, fmt::format("etcd {} {}", url_, path));
    }
    if (res->status != 200) {
      return InternalError(
          fmt::format("etcd {} {}: HTTP {}: {}", url_, path, res->status, body_in.substr(0, 200)));
    }
    if (auto it = j.find("result"); it != j.end()) {  // a stream's single answer
      json inner = *it;
      Observe(inner, floor);
      return inner;
    }
    Observe(j, floor);
    return j;
  }
}

Status EtcdStore::Stream(const std::string& path, const json& body, Deadline deadline,
                         const std::function<bool(const json&)>& on_message, ClientSlot* slot) {
  size_t ep = 0;
  std::unique_ptr<Conn> conn = Acquire(&ep);
  SetTimeouts(*conn->client, deadline);
  if (slot) {
    MutexLock l(&slot->mu);
    if (slot->stopped) return AbortedError("etcd stream stopped");
    slot->client = conn->client.get();
  }
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (std::string token = AuthToken(); !token.empty()) req.set_header("Authorization", token);
  std::string buffer;
  Status failure;
  bool stopped = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line.empty()) continue;
      json j = ParseForeignJson(line, false);
      if (j.is_discarded() || !j.is_object()) {
        failure = InternalError(fmt::format("etcd {} {}: a stream message is not JSON: {}", url_,
                                            path, line.substr(0, 200)));
        return false;
      }
      if (auto err = ErrorOf(j)) {
        failure = FromGrpc(err->first, err->second, fmt::format("etcd {} {}", url_, path));
        return false;
      }
      auto it = j.find("result");
      if (it == j.end()) continue;
      // Not Observe()d: a watch's header can lag a write that already
      // returned (etcd notifies watchers before it raises its revision).
      if (!on_message(*it)) {
        stopped = true;
        return false;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = conn->client->send(req, res, error);
  if (slot) {
    MutexLock l(&slot->mu);
    slot->client = nullptr;
    if (slot->stopped) return AbortedError("etcd stream stopped");
  }
  if (!failure.ok()) return failure;
  if (stopped) return Status::Ok();  // our cancel: the connection is closed, not reused
  if (!buffer.empty()) {             // a last message without a newline (an error answer)
    json j = ParseForeignJson(buffer, false);
    if (auto err = ErrorOf(j)) {
      return FromGrpc(err->first, err->second, fmt::format("etcd {} {}", url_, path));
    }
  }
  if (!sent) {
    const EtcdEndpoint& where = options_.endpoints[ep];
    if (error == httplib::Error::Connection) {
      size_t expected = ep;
      current_.compare_exchange_strong(expected, (ep + 1) % options_.endpoints.size());
    }
    if (deadline.expired()) {
      return DeadlineExceededError(fmt::format("etcd {}:{} {}: {}", where.host, where.port, path,
                                               httplib::to_string(error)));
    }
    return UnavailableError(
        fmt::format("etcd {}:{} {}: {}", where.host, where.port, path, httplib::to_string(error)));
  }
  Release(std::move(conn));
  return Status::Ok();
}

}  // namespace memento::coord
