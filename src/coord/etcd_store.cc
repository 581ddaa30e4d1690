// EtcdStore (etcd_store.h): URL parsing, Open and authentication. The rest of
// the client: etcd_internal.h.
#include "coord/etcd_store.h"

#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "coord/etcd_internal.h"
#include "net/socket.h"

namespace memento::coord {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

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

std::string EtcdStore::AuthToken() {
  MutexLock l(&auth_mu_);
  return token_;
}

}  // namespace memento::coord
