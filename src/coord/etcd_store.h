// EtcdStore: the Store interface on a real etcd (v3 API, 3.4 or newer), through
// etcd's JSON gateway (POST /v3/kv/range, /v3/kv/txn, /v3/watch, ...) with
// cpp-httplib. Why the gateway and not gRPC: docs/etcd.md.
//
//   Set               -> /v3/kv/put (lease attached when non-zero)
//   Get / List        -> /v3/kv/range (key / [prefix, prefix+1))
//   CompareAndSwap    -> /v3/kv/txn (compare VALUE, or CREATE == 0 for "absent")
//   Add               -> /v3/kv/txn loop (compare MOD revision)
//   Delete            -> /v3/kv/deleterange
//   WatchPoll / Wait  -> /v3/watch from start_revision = after + 1 (one stream per
//                        poll, closed after the first batch: a dropped
//                        connection resumes from the caller's revision)
//   leases            -> /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke
//
// URL: etcd://host:port[,host:port...]. Calls go to the first endpoint that
// answers; a connection failure moves to the next. With MEMENTO_ETCD_USER and
// MEMENTO_ETCD_PASSWORD (or MEMENTO_ETCD_PASSWORD_FILE) set, the client
// authenticates (/v3/auth/authenticate) and sends the token; an expired token
// is renewed once per call.
//
// Epoch: etcd has no "started empty" marker. The client keeps a random epoch
// and changes it when a response's revision is lower than one it has seen (the
// etcd it talks to lost its data); WatchPoll from a revision newer than the
// store's is FailedPrecondition, as for the embedded store.
//
// Thread safety: safe to call from many threads (a pool of HTTP connections).
//
// Implementation: etcd_store.cc and the files listed in etcd_internal.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "coord/store.h"

namespace httplib {
class Client;
}

namespace memento::coord {

struct EtcdEndpoint {
  std::string host;
  int port = 0;
};

struct EtcdOptions {
  std::vector<EtcdEndpoint> endpoints;
  std::string user;  // empty: no authentication
  std::string password;
  // TLS (https to every endpoint) when ca_file is set: the CA that signed
  // etcd's server certificate (verified, host name included), and the client
  // certificate and key etcd asks for with --client-cert-auth (both or
  // neither). PEM files. Empty: from MEMENTO_ETCD_CACERT, MEMENTO_ETCD_CERT,
  // MEMENTO_ETCD_KEY.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool tls() const { return !ca_file.empty(); }
};

// Parses "etcd://host:port[,host:port...]". InvalidArgument naming the bad part.
[[nodiscard]] Result<EtcdOptions> ParseEtcdUrl(const std::string& url);

class EtcdStore final : public Store {
 public:
  // Connects (and authenticates) before the deadline: Unavailable otherwise.
  // User and password come from `options`, else from the environment
  // (MEMENTO_ETCD_USER, MEMENTO_ETCD_PASSWORD or MEMENTO_ETCD_PASSWORD_FILE);
  // TLS files likewise (EtcdOptions). InvalidArgument for a client
  // certificate without its key (or a key without a CA), NotFound naming a
  // TLS file that cannot be read.
  [[nodiscard]] static Result<std::unique_ptr<EtcdStore>> Open(EtcdOptions options,
                                                               Deadline deadline);
  ~EtcdStore() override;

  Result<int64_t> Set(const std::string& key, const std::string& value, Deadline deadline,
                      LeaseId lease = 0) override;
  Result<KeyValue> Get(const std::string& key, Deadline deadline) override;
  Result<ListResult> List(const std::string& prefix, Deadline deadline) override;
  Result<CasResult> CompareAndSwap(const std::string& key,
                                   const std::optional<std::string>& expected,
                                   const std::string& desired, Deadline deadline,
                                   LeaseId lease = 0) override;
  Result<int64_t> Add(const std::string& key, int64_t delta, Deadline deadline) override;
  Result<bool> Delete(const std::string& key, Deadline deadline) override;
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override;
  Result<WatchBatch> WatchPoll(const std::string& prefix, int64_t after_revision,
                               Deadline deadline) override;
  Result<LeaseId> GrantLease(double ttl_s, Deadline deadline) override;
  Status KeepAlive(LeaseId lease, Deadline deadline) override;
  Status RevokeLease(LeaseId lease, Deadline deadline) override;

  // "etcd://host:port,..." as opened.
  const std::string& url() const { return url_; }

 private:
  struct Conn;
  explicit EtcdStore(EtcdOptions options);
  // One unary call: POSTs `body` to `path`, returns the response object.
  // `retry_after_send`: the call may be repeated when the reply was lost.
  Result<nlohmann::json> Call(const std::string& path, const nlohmann::json& body,
                              Deadline deadline, bool retry_after_send);
  // A streaming call: `on_message` gets each {"result": ...} object; returning
  // false ends the stream. DeadlineExceeded when the deadline ended it.
  // `slot`, when given, holds the HTTP client while the stream runs, so that
  // another thread can end the stream (ClientSlot::Stop).
  struct ClientSlot;
  Status Stream(const std::string& path, const nlohmann::json& body, Deadline deadline,
                const std::function<bool(const nlohmann::json&)>& on_message,
                ClientSlot* slot = nullptr);
  // Watches (docs/etcd.md, "Watch streams"): one long-lived stream per
  // prefix serves consecutive polls; a poll it cannot serve uses a one-shot
  // stream (OneShotWatchPoll).
  struct WatchStream;
  std::shared_ptr<WatchStream> StreamFor(const std::string& prefix, int64_t after)
      EXCLUDES(streams_mu_);
  void RunWatchStream(const std::shared_ptr<WatchStream>& ws);
  Result<WatchBatch> OneShotWatchPoll(const std::string& prefix, int64_t after_revision,
                                      Deadline deadline);
  // FailedPrecondition when `after` is newer than the store (it restarted empty).
  Status CheckNotFuture(const std::string& prefix, int64_t after, int64_t header_revision,
                        Deadline deadline);
  Status Authenticate(Deadline deadline) EXCLUDES(auth_mu_);
  std::unique_ptr<Conn> Acquire(size_t* endpoint) EXCLUDES(pool_mu_);
  void Release(std::unique_ptr<Conn> conn) EXCLUDES(pool_mu_);
  // Notes a response header's revision (epoch bookkeeping).
  // `floor`: the highest revision seen before the request was sent.
  int64_t Observe(const nlohmann::json& response, int64_t floor);
  std::string AuthToken() EXCLUDES(auth_mu_);
  Result<std::optional<KeyValue>> Range1(const std::string& key, Deadline deadline);

  const EtcdOptions options_;
  const std::string url_;
  std::atomic<size_t> current_{0};  // the endpoint that answered last
  std::atomic<int64_t> max_revision_{0};
  std::atomic<uint64_t> epoch_;
  Mutex pool_mu_;
  std::vector<std::unique_ptr<Conn>> idle_ GUARDED_BY(pool_mu_);
  Mutex auth_mu_;
  std::string token_ GUARDED_BY(auth_mu_);
  Mutex streams_mu_;
  std::map<std::string, std::shared_ptr<WatchStream>> streams_ GUARDED_BY(streams_mu_);
};

}  // namespace memento::coord
