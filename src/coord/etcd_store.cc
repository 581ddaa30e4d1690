#include "coord/etcd_store.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/random.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/json_parse.h"
#include "net/socket.h"

namespace memento::coord {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxIdleConnections = 32;

uint64_t RandomEpoch() {
  uint64_t e = 0;
  if (getrandom(&e, sizeof(e), 0) != sizeof(e)) {
    e = std::random_device{}() ^ static_cast<uint64_t>(Now().time_since_epoch().count());
  }
  return e == 0 ? 1 : e;
}

// ---- base64 (etcd's JSON gateway sends bytes fields as standard base64) ----

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string B64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> UnB64(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int v = val(c);
    if (v < 0) return InternalError("etcd answered a bytes field that is not base64");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

// int64 fields are JSON strings in the gateway's proto3 mapping (numbers also
// accepted); a missing field is 0 (proto3 omits defaults).
int64_t I64(const json& j, const char* name) {
  if (!j.is_object()) return 0;
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }
  return 0;
}

std::string Bytes(const json& j, const char* name) {
  if (!j.is_object()) return {};
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return {};
  auto r = UnB64(it->get_ref<const std::string&>());
  return r.ok() ? *r : std::string();
}

KeyValue ParseKv(const json& j) {
  KeyValue kv;
  kv.key = Bytes(j, "key");
  kv.value = Bytes(j, "value");
  kv.create_revision = I64(j, "create_revision");
  kv.mod_revision = I64(j, "mod_revision");
  kv.lease = I64(j, "lease");
  return kv;
}

// The end of the range of keys starting with `prefix` ("\0" = no end).
std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

json PrefixRange(const std::string& prefix) {
  json r;
  r["key"] = B64(prefix.empty() ? std::string(1, '\0') : prefix);
  r["range_end"] = B64(PrefixEnd(prefix));
  return r;
}

// gRPC status code (as etcd's gateway reports it) -> Status.
Status FromGrpc(int code, const std::string& message, const std::string& what) {
  std::string m = fmt::format("{}: {}", what, message);
  switch (code) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE
      return InvalidArgumentError(m);
    case 4:  // DEADLINE_EXCEEDED
      return DeadlineExceededError(m);
    case 5:  // NOT_FOUND
      return NotFoundError(m);
    case 7:   // PERMISSION_DENIED
    case 16:  // UNAUTHENTICATED
      return PermissionDeniedError(m);
    case 8:  // RESOURCE_EXHAUSTED
      return ResourceExhaustedError(m);
    case 9:  // FAILED_PRECONDITION
      return FailedPreconditionError(m);
    case 10:  // ABORTED
      return AbortedError(m);
    case 1:   // CANCELLED
    case 14:  // UNAVAILABLE
      return UnavailableError(m);
    default:
      return InternalError(m);
  }
}

// The error an answer carries: {"error": "...", "code": N} (unary) or
// {"error": {"grpc_code": N, "message": "..."}} (streams).
std::optional<std::pair<int, std::string>> ErrorOf(const json& j) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find("error");
  if (it == j.end()) return std::nullopt;
  if (it->is_object()) {
    int code = static_cast<int>(I64(*it, "grpc_code"));
    if (code == 0) code = static_cast<int>(I64(*it, "code"));
    return std::make_pair(code == 0 ? 2 : code, it->value("message", std::string("error")));
  }
  int code = static_cast<int>(I64(j, "code"));
  std::string msg = it->is_string() ? it->get<std::string>() : it->dump();
  return std::make_pair(code == 0 ? 2 : code, msg);
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

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

struct EtcdStore::Conn {
  size_t endpoint = 0;
  std::unique_ptr<httplib::Client> client;
};

struct EtcdStore::ClientSlot {
  Mutex mu;
  httplib::Client* client GUARDED_BY(mu) = nullptr;
  bool stopped GUARDED_BY(mu) = false;
  void Stop() {
    MutexLock l(&mu);
    stopped = true;
    // cpp-httplib allows stop() from another thread: it shuts the socket down.
    if (client != nullptr) client->stop();
  }
};

struct EtcdStore::WatchStream {
  std::string prefix;
  int64_t from = 0;  // the stream delivers every event with revision > from
  Mutex mu;
  CondVar cv;
  std::deque<WatchEvent> events GUARDED_BY(mu);  // received, not yet passed by a poll
  int64_t served_through GUARDED_BY(mu) = 0;     // polls asked for events after this
  int64_t known_rev GUARDED_BY(mu) = 0;          // the store is known to have reached this revision
  bool ended GUARDED_BY(mu) = false;
  Status end_status GUARDED_BY(mu);
  TimePoint last_used GUARDED_BY(mu);
  std::atomic<bool> stop{false};
  ClientSlot client;
  std::thread thread;
  void Stop() {
    stop.store(true);
    client.Stop();
  }
};

Result<EtcdOptions> ParseEtcdUrl(const std::string& url) {
  constexpr std::string_view kScheme = "etcd://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    return InvalidArgumentError(fmt::format("'{}' is not an etcd URL (etcd://host:port,...)", url));
  }
  std::string rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  EtcdOptions o;
  std::stringstream ss(rest);
  std::string part;
  while (std::getline(ss, part, ',')) {
    Result<net::HostPort> hp = net::ParseHostPort(part, net::PortUse::kConnect);
    if (!hp.ok()) {
      return hp.status().WithContext(fmt::format("etcd URL '{}', endpoint '{}'", url, part));
    }
    o.endpoints.push_back(EtcdEndpoint{hp->host, hp->port});
  }
  if (o.endpoints.empty()) {
    return InvalidArgumentError(
        fmt::format("etcd URL '{}' names no endpoint (etcd://host:port[,host:port...])", url));
  }
  return o;
}

EtcdStore::EtcdStore(EtcdOptions options)
    : options_(std::move(options)),
      url_([this] {
        std::string u = "etcd://";
        for (size_t i = 0; i < options_.endpoints.size(); ++i) {
          if (i) u += ',';
          u += fmt::format("{}:{}", options_.endpoints[i].host, options_.endpoints[i].port);
        }
        return u;
      }()),
      epoch_(RandomEpoch()) {}

EtcdStore::~EtcdStore() {
  std::map<std::string, std::shared_ptr<WatchStream>> streams;
  {
    MutexLock l(&streams_mu_);
    streams.swap(streams_);
  }
  for (auto& [prefix, ws] : streams) {
    ws->Stop();
    if (ws->thread.joinable()) ws->thread.join();
  }
}

Result<std::unique_ptr<EtcdStore>> EtcdStore::Open(EtcdOptions options, Deadline deadline) {
  if (options.endpoints.empty()) return InvalidArgumentError("etcd store: no endpoint");
  if (options.user.empty()) options.user = Env("MEMENTO_ETCD_USER");
  if (!options.user.empty() && options.password.empty()) {
    options.password = Env("MEMENTO_ETCD_PASSWORD");
    std::string file = Env("MEMENTO_ETCD_PASSWORD_FILE");
    if (options.password.empty() && !file.empty()) {
      std::ifstream in(file);
      if (!in) {
        return NotFoundError(fmt::format("MEMENTO_ETCD_PASSWORD_FILE '{}' cannot be read", file));
      }
      std::getline(in, options.password);
    }
  }
  // TLS (docs/etcd.md, "TLS").
  if (options.ca_file.empty()) options.ca_file = Env("MEMENTO_ETCD_CACERT");
  if (options.cert_file.empty()) options.cert_file = Env("MEMENTO_ETCD_CERT");
  if (options.key_file.empty()) options.key_file = Env("MEMENTO_ETCD_KEY");
  if (options.cert_file.empty() != options.key_file.empty()) {
    return InvalidArgumentError(
        "etcd TLS: a client certificate needs its key and a key its certificate (cert '" +
        options.cert_file + "', key '" + options.key_file +
        "'; MEMENTO_ETCD_CERT and MEMENTO_ETCD_KEY)");
  }
  if (!options.cert_file.empty() && options.ca_file.empty()) {
    return InvalidArgumentError(
        "etcd TLS: a client certificate without the CA that signed etcd's server certificate "
        "(MEMENTO_ETCD_CACERT)");
  }
  for (const auto& [what, path] : {std::pair<const char*, std::string>{
                                       "CA certificate (MEMENTO_ETCD_CACERT)", options.ca_file},
                                   {"client certificate (MEMENTO_ETCD_CERT)", options.cert_file},
                                   {"client key (MEMENTO_ETCD_KEY)", options.key_file}}) {
    if (path.empty()) continue;
    std::ifstream in(path);
    if (!in) return NotFoundError(fmt::format("etcd TLS: the {} '{}' cannot be read", what, path));
  }
  if (options.tls()) {
    // OpenSSL writes to the socket without MSG_NOSIGNAL: a peer that closed
    // the connection (a refused handshake, etcd restarted) would kill the
    // process with SIGPIPE. Ignored when nobody installed a handler.
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
  }
  std::unique_ptr<EtcdStore> s(new EtcdStore(std::move(options)));
  if (!s->options_.user.empty()) {
    MEMENTO_RETURN_IF_ERROR(s->Authenticate(deadline).WithContext("opening " + s->url_));
  }
  // One read proves the endpoint answers (and that the token works).
  auto probe = s->Range1("/memento/.probe", deadline);
  if (!probe.ok()) {
    if (probe.status().code() == StatusCode::kDeadlineExceeded) {
      return UnavailableError(fmt::format("etcd {} cannot be reached before the deadline ({})",
                                          s->url_, probe.status().message()));
    }
    return probe.status().WithContext("opening " + s->url_);
  }
  return s;
}

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

std::string EtcdStore::AuthToken() {
  MutexLock l(&auth_mu_);
  return token_;
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

Status EtcdStore::Authenticate(Deadline deadline) {
  json body = {{"name", options_.user}, {"password", options_.password}};
  {
    MutexLock l(&auth_mu_);
    token_.clear();
  }
  auto r = Call("/v3/auth/authenticate", body, deadline, true);
  if (!r.ok()) {
    const StatusCode c = r.status().code();
    if (c == StatusCode::kUnavailable || c == StatusCode::kDeadlineExceeded) {
      return r.status().WithContext(fmt::format("etcd authentication as '{}'", options_.user));
    }
    // etcd answers a wrong password with INVALID_ARGUMENT.
    return PermissionDeniedError(
        fmt::format("etcd {} refused user '{}' ({}): check "
                    "MEMENTO_ETCD_USER and MEMENTO_ETCD_PASSWORD(_FILE)",
                    url_, options_.user, r.status().message()));
  }
  std::string token = r->value("token", std::string());
  if (token.empty()) {
    return PermissionDeniedError(
        fmt::format("etcd {} gave no token for user '{}' (is authentication enabled there?)", url_,
                    options_.user));
  }
  MutexLock l(&auth_mu_);
  token_ = std::move(token);
  return Status::Ok();
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

Result<std::optional<KeyValue>> EtcdStore::Range1(const std::string& key, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(json r, Call("/v3/kv/range", json{{"key", B64(key)}}, deadline, true));
  auto kvs = r.find("kvs");
  if (kvs == r.end() || !kvs->is_array() || kvs->empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(ParseKv((*kvs)[0]));
}

Result<int64_t> EtcdStore::Set(const std::string& key, const std::string& value, Deadline deadline,
                               LeaseId lease) {
  json body = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  MEMENTO_ASSIGN_OR_RETURN(json r, Call("/v3/kv/put", body, deadline, true));
  return I64(r["header"], "revision");
}

Result<KeyValue> EtcdStore::Get(const std::string& key, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(std::optional<KeyValue> kv, Range1(key, deadline));
  if (!kv) return NotFoundError(fmt::format("key '{}' not found in {}", key, url_));
  return *std::move(kv);
}

Result<ListResult> EtcdStore::List(const std::string& prefix, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(json r, Call("/v3/kv/range", PrefixRange(prefix), deadline, true));
  ListResult out;
  out.revision = I64(r["header"], "revision");
  out.epoch = epoch_.load();
  if (auto kvs = r.find("kvs"); kvs != r.end() && kvs->is_array()) {
    out.kvs.reserve(kvs->size());
    for (const json& kv : *kvs) out.kvs.push_back(ParseKv(kv));
  }
  return out;
}

Result<CasResult> EtcdStore::CompareAndSwap(const std::string& key,
                                            const std::optional<std::string>& expected,
                                            const std::string& desired, Deadline deadline,
                                            LeaseId lease) {
  json cmp;
  if (expected) {
    cmp = {{"target", "VALUE"}, {"key", B64(key)}, {"result", "EQUAL"}, {"value", B64(*expected)}};
  } else {
    cmp = {{"target", "CREATE"}, {"key", B64(key)}, {"result", "EQUAL"}, {"create_revision", "0"}};
  }
  json put = {{"key", B64(key)}, {"value", B64(desired)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  json range = {{"key", B64(key)}};
  json body = {
      {"compare", json::array({cmp})},
      {"success", json::array({json{{"request_put", put}}, json{{"request_range", range}}})},
      {"failure", json::array({json{{"request_range", range}}})}};
  MEMENTO_ASSIGN_OR_RETURN(json r, Call("/v3/kv/txn", body, deadline, false));
  CasResult out;
  out.swapped = r.value("succeeded", false);
  if (auto resp = r.find("responses"); resp != r.end() && resp->is_array()) {
    for (const json& one : *resp) {
      auto rr = one.find("response_range");
      if (rr == one.end()) continue;
      auto kvs = rr->find("kvs");
      if (kvs != rr->end() && kvs->is_array() && !kvs->empty()) out.current = ParseKv((*kvs)[0]);
    }
  }
  return out;
}

Result<int64_t> EtcdStore::Add(const std::string& key, int64_t delta, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(std::optional<KeyValue> cur, Range1(key, deadline));
  for (;;) {
    int64_t v = 0;
    if (cur) {
      const std::string& s = cur->value;
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
        return InvalidArgumentError(fmt::format(
            "Add on key '{}': value '{}' is not a decimal integer", key, s.substr(0, 40)));
      }
    }
    int64_t next = 0;
    if (__builtin_add_overflow(v, delta, &next)) {
      return InvalidArgumentError(
          fmt::format("Add on key '{}': {} + {} overflows a 64-bit integer", key, v, delta));
    }
    json cmp;
    if (cur) {
      cmp = {{"target", "MOD"},
             {"key", B64(key)},
             {"result", "EQUAL"},
             {"mod_revision", std::to_string(cur->mod_revision)}};
    } else {
      cmp = {
          {"target", "CREATE"}, {"key", B64(key)}, {"result", "EQUAL"}, {"create_revision", "0"}};
    }
    json range = {{"key", B64(key)}};
    json body = {{"compare", json::array({cmp})},
                 {"success",
                  json::array({json{{"request_put",
                                     {{"key", B64(key)}, {"value", B64(std::to_string(next))}}}}})},
                 {"failure", json::array({json{{"request_range", range}}})}};
    MEMENTO_ASSIGN_OR_RETURN(json r, Call("/v3/kv/txn", body, deadline, false));
    if (r.value("succeeded", false)) return next;
    cur.reset();
    if (auto resp = r.find("responses"); resp != r.end() && resp->is_array() && !resp->empty()) {
      const json& rr = (*resp)[0]["response_range"];
      auto kvs = rr.find("kvs");
      if (kvs != rr.end() && kvs->is_array() && !kvs->empty()) cur = ParseKv((*kvs)[0]);
    }
  }
}

Result<bool> EtcdStore::Delete(const std::string& key, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(json r,
                           Call("/v3/kv/deleterange", json{{"key", B64(key)}}, deadline, true));
  return I64(r, "deleted") > 0;
}

Status EtcdStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  for (const std::string& key : keys) {
    for (;;) {
      MEMENTO_ASSIGN_OR_RETURN(json r,
                               Call("/v3/kv/range", json{{"key", B64(key)}}, deadline, true));
      auto kvs = r.find("kvs");
      if (kvs != r.end() && kvs->is_array() && !kvs->empty()) break;
      // Absent at revision `rev`: watch for its creation from there.
      const int64_t rev = I64(r["header"], "revision");
      json create = {{"key", B64(key)}, {"start_revision", std::to_string(rev + 1)}};
      bool put = false;
      Status s =
          Stream("/v3/watch", json{{"create_request", create}}, deadline, [&](const json& m) {
            auto ev = m.find("events");
            if (ev == m.end() || !ev->is_array()) return !m.value("canceled", false);
            for (const json& e : *ev) {
              if (e.value("type", std::string("PUT")) == "PUT") put = true;
            }
            return !put;
          });
      if (put) break;
      if (deadline.expired() || s.code() == StatusCode::kDeadlineExceeded) {
        return DeadlineExceededError(
            fmt::format("key '{}' did not appear in {} before the deadline", key, url_));
      }
      if (!s.ok() && s.code() != StatusCode::kUnavailable) return s;
      if (!s.ok()) {
        std::this_thread::sleep_for(
            std::min<Duration>(std::chrono::milliseconds(50), deadline.remaining()));
      }
    }
  }
  return Status::Ok();
}

Status EtcdStore::CheckNotFuture(const std::string& prefix, int64_t after, int64_t header_revision,
                                 Deadline deadline) {
  if (after <= header_revision) return Status::Ok();
  // A watch's header can lag a write that already returned by a revision or
  // two: ask the store itself before calling the revision impossible.
  MEMENTO_ASSIGN_OR_RETURN(
      json cur,
      Call("/v3/kv/range", json{{"key", B64("/")}, {"count_only", true}}, deadline, true));
  const int64_t now = I64(cur["header"], "revision");
  if (after <= now) return Status::Ok();
  return FailedPreconditionError(
      fmt::format("watch of '{}' from revision {}: etcd {} is at revision {} (it restarted without "
                  "its data); re-list",
                  prefix, after, url_, now));
}

// How long past a WatchPoll's deadline its revision check (CheckNotFuture)
// may take: the poll's answer at its deadline is an empty batch, never
// DeadlineExceeded because the check itself was slow (coord_test
// WatchPollSeesPutsAndDeletesInOrder/Etcd failed 3 of 200 at load 23).
namespace {
constexpr Duration kCheckGrace = std::chrono::seconds(2);
Deadline WithCheckGrace(Deadline d) { return d.infinite() ? d : Deadline(d.when() + kCheckGrace); }
}  // namespace

constexpr double kIdleStreamS = 30;
constexpr double kStreamReadS = 5;

std::shared_ptr<EtcdStore::WatchStream> EtcdStore::StreamFor(const std::string& prefix,
                                                             int64_t after) {
  std::vector<std::shared_ptr<WatchStream>> retired;
  std::shared_ptr<WatchStream> out;
  {
    MutexLock l(&streams_mu_);
    for (auto it = streams_.begin(); it != streams_.end();) {
      bool idle;
      {
        MutexLock sl(&it->second->mu);
        idle = it->second->ended || SecondsBetween(it->second->last_used, Now()) > kIdleStreamS;
      }
      if (idle && it->first != prefix) {
        retired.push_back(std::move(it->second));
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
    auto it = streams_.find(prefix);
    if (it != streams_.end()) {
      std::shared_ptr<WatchStream>& ws = it->second;
      MutexLock sl(&ws->mu);
      if (ws->ended) {
        // Deliver what it received, then its end; the next poll starts anew.
        if (ws->events.empty() || after < ws->served_through) {
          retired.push_back(std::move(ws));
          streams_.erase(it);
        } else {
          out = ws;
        }
      } else if (after >= ws->served_through && after >= ws->from) {
        out = ws;
      }
      // else: an older position than the stream's: a one-shot poll (nullptr).
      if (out) ws->last_used = Now();  // out is ws: the lock held is ws->mu
    }
    if (!out && streams_.find(prefix) == streams_.end()) {
      out = std::make_shared<WatchStream>();
      out->prefix = prefix;
      out->from = after;
      {
        MutexLock sl(&out->mu);
        out->served_through = after;
        out->last_used = Now();
      }
      streams_[prefix] = out;
      out->thread = std::thread([this, ws = out] { RunWatchStream(ws); });
    }
  }
  for (auto& ws : retired) {
    ws->Stop();
    if (ws->thread.joinable()) ws->thread.join();
  }
  return out;
}

void EtcdStore::RunWatchStream(const std::shared_ptr<WatchStream>& ws) {
  int64_t pos = ws->from;  // every event up to here was delivered
  Status refused, s;
  while (!ws->stop.load()) {
    json create = PrefixRange(ws->prefix);
    create["start_revision"] = std::to_string(pos + 1);
    // Each read waits at most kStreamReadS: a quiet stream is re-opened from
    // `pos` (transparent to the polls), and a Stop() that raced the start of
    // a request is noticed within that time.
    s = Stream(
        "/v3/watch", json{{"create_request", create}}, Deadline::AfterSeconds(kStreamReadS),
        [&](const json& m) {
          if (ws->stop.load()) return false;
          const int64_t compacted = I64(m, "compact_revision");
          if (compacted > 0) {
            refused = FailedPreconditionError(fmt::format(
                "watch of '{}' from revision {}: etcd {} compacted its history up to {}; re-list",
                ws->prefix, pos, url_, compacted));
            return false;
          }
          if (m.value("created", false)) {
            const int64_t header = I64(m["header"], "revision");
            refused = CheckNotFuture(ws->prefix, pos, header, Deadline::AfterSeconds(10));
            if (!refused.ok()) return false;
            MutexLock l(&ws->mu);
            ws->known_rev = std::max({ws->known_rev, header, pos});
          }
          if (m.value("canceled", false)) {
            refused = FailedPreconditionError(
                fmt::format("etcd {} cancelled the watch of '{}': {}", url_, ws->prefix,
                            m.value("cancel_reason", std::string("no reason given"))));
            return false;
          }
          auto ev = m.find("events");
          if (ev == m.end() || !ev->is_array() || ev->empty()) return true;
          {
            MutexLock l(&ws->mu);
            for (const json& e : *ev) {
              WatchEvent we;
              we.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::kDelete
                                                                        : WatchEvent::Type::kPut;
              we.kv = ParseKv(e["kv"]);
              if (we.kv.mod_revision <= pos) continue;
              pos = we.kv.mod_revision;
              ws->known_rev = std::max(ws->known_rev, pos);
              ws->events.push_back(std::move(we));
            }
          }
          ws->cv.SignalAll();
          return !ws->stop.load();
        },
        &ws->client);
    if (!refused.ok() || ws->stop.load()) break;
    if (s.code() != StatusCode::kDeadlineExceeded) break;  // ended or failed: not quiet
  }
  {
    MutexLock l(&ws->mu);
    ws->ended = true;
    if (!refused.ok()) {
      ws->end_status = refused;
    } else if (!s.ok()) {
      ws->end_status = s;
    } else {
      ws->end_status =
          UnavailableError(fmt::format("etcd {}: the watch of '{}' was closed", url_, ws->prefix));
    }
  }
  ws->cv.SignalAll();
}

Result<WatchBatch> EtcdStore::WatchPoll(const std::string& prefix, int64_t after_revision,
                                        Deadline deadline) {
  if (after_revision < 0) after_revision = 0;
  std::shared_ptr<WatchStream> ws = StreamFor(prefix, after_revision);
  if (!ws) return OneShotWatchPoll(prefix, after_revision, deadline);
  int64_t known;
  {
    MutexLock l(&ws->mu);
    known = ws->known_rev;
  }
  if (after_revision > known) {
    // A revision the stream has not seen (learnt from a List, or from a store
    // that since restarted empty): confirm it with the store once. The
    // check may run past the poll's deadline (kCheckGrace): a short poll on a
    // loaded machine returns an empty batch, not DeadlineExceeded.
    MEMENTO_RETURN_IF_ERROR(
        CheckNotFuture(prefix, after_revision, known, WithCheckGrace(deadline)));
    MutexLock l(&ws->mu);
    ws->known_rev = std::max(ws->known_rev, after_revision);
  }
  MutexLock l(&ws->mu);
  for (;;) {
    while (!ws->events.empty() && ws->events.front().kv.mod_revision <= after_revision) {
      ws->events.pop_front();
    }
    ws->served_through = std::max(ws->served_through, after_revision);
    ws->last_used = Now();
    if (!ws->events.empty()) {
      WatchBatch batch;
      batch.epoch = epoch_.load();
      batch.events.assign(ws->events.begin(), ws->events.end());
      batch.revision = batch.events.back().kv.mod_revision;
      return batch;
    }
    if (ws->ended) return ws->end_status;
    if (deadline.expired()) {
      WatchBatch batch;
      batch.epoch = epoch_.load();
      batch.revision = after_revision;  // nothing new up to here
      return batch;
    }
    ws->cv.WaitUntil(&l, deadline.when());
  }
}

Result<WatchBatch> EtcdStore::OneShotWatchPoll(const std::string& prefix, int64_t after_revision,
                                               Deadline deadline) {
  if (after_revision < 0) after_revision = 0;
  json create = PrefixRange(prefix);
  create["start_revision"] = std::to_string(after_revision + 1);
  WatchBatch batch;
  Status refused;
  bool created = false;
  Status s = Stream("/v3/watch", json{{"create_request", create}}, deadline, [&](const json& m) {
    const int64_t compacted = I64(m, "compact_revision");
    if (compacted > 0) {
      refused = FailedPreconditionError(fmt::format(
          "watch of '{}' from revision {}: etcd {} compacted its history up to {}; re-list", prefix,
          after_revision, url_, compacted));
      return false;
    }
    if (m.value("created", false)) {
      created = true;
      Status future = CheckNotFuture(prefix, after_revision, I64(m["header"], "revision"),
                                     WithCheckGrace(deadline));
      if (!future.ok()) {
        refused = future;
        return false;
      }
    }
    if (m.value("canceled", false)) {
      refused = FailedPreconditionError(
          fmt::format("etcd {} cancelled the watch of '{}': {}", url_, prefix,
                      m.value("cancel_reason", std::string("no reason given"))));
      return false;
    }
    auto ev = m.find("events");
    if (ev == m.end() || !ev->is_array() || ev->empty()) return true;
    for (const json& e : *ev) {
      WatchEvent we;
      we.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::kDelete
                                                                : WatchEvent::Type::kPut;
      we.kv = ParseKv(e["kv"]);
      if (we.kv.mod_revision <= after_revision) continue;
      batch.revision = std::max(batch.revision, we.kv.mod_revision);
      batch.events.push_back(std::move(we));
    }
    return batch.events.empty();
  });
  if (!refused.ok()) return refused;
  batch.epoch = epoch_.load();
  if (!batch.events.empty()) return batch;
  if (!s.ok() && s.code() != StatusCode::kDeadlineExceeded) return s;
  // The deadline passed (before etcd confirmed the watch, too: a short poll on
  // a loaded machine): an empty batch, as Store::WatchPoll promises. It claims
  // nothing past after_revision; an etcd that is down fails above (Unavailable).
  batch.revision = after_revision;  // nothing new up to here
  return batch;
}

Result<LeaseId> EtcdStore::GrantLease(double ttl_s, Deadline deadline) {
  if (!(ttl_s > 0) || ttl_s > 86400) {
    return InvalidArgumentError(fmt::format("lease ttl {} s must be in (0, 86400]", ttl_s));
  }
  // etcd counts whole seconds (and raises a TTL below its minimum to it).
  const int64_t ttl = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ttl_s)));
  MEMENTO_ASSIGN_OR_RETURN(
      json r, Call("/v3/lease/grant", json{{"TTL", std::to_string(ttl)}}, deadline, true));
  const LeaseId id = I64(r, "ID");
  if (id == 0) {
    return InternalError(
        fmt::format("etcd {} granted no lease: {}", url_, r.dump().substr(0, 200)));
  }
  return id;
}

Status EtcdStore::KeepAlive(LeaseId lease, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(
      json r, Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}, deadline, true));
  if (I64(r, "TTL") <= 0) {
    return NotFoundError(fmt::format("lease {:x} expired or never existed in {}", lease, url_));
  }
  return Status::Ok();
}

Status EtcdStore::RevokeLease(LeaseId lease, Deadline deadline) {
  return Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}, deadline, true).status();
}

}  // namespace memento::coord
