// The embedded coordination store: a MemoryStore served over the
// authenticated RPC transport (src/net), and StoreClient, the Store
// implementation that talks to it. One agent or the launcher hosts the server
// (`memento store --listen HOST:PORT --token-file F`).
//
// The store is soft state (docs/coordination.md): agents re-register their
// leases and republish their commit records when it restarts empty.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "coord/memory_store.h"
#include "coord/store.h"
#include "net/rpc.h"

namespace memento::coord {

// RPC method ids of the embedded store protocol.
enum class StoreMethod : uint32_t {
  kPing = 1,
  kSet = 2,
  kGet = 3,
  kList = 4,
  kCompareAndSwap = 5,
  kAdd = 6,
  kDelete = 7,
  kWait = 8,
  kWatchPoll = 9,
  kGrantLease = 10,
  kKeepAlive = 11,
  kRevokeLease = 12,
};

// Thread safety: Stop() and store() from any thread.
// What the store server's connections may hold in received requests
// (docs/transport.md, "Memory caps"; `memento store --max-request`,
// `--max-buffered`).
struct StoreServerLimits {
  uint64_t max_request_bytes = uint64_t{64} << 20;    // one request (one connection)
  uint64_t max_buffered_bytes = uint64_t{256} << 20;  // all connections together
};

class EmbeddedStoreServer {
 public:
  // Listens on host:port (port 0 = ephemeral; see port()).
  [[nodiscard]] static Result<std::unique_ptr<EmbeddedStoreServer>> Start(
      const std::string& host, int port, net::JobToken token, const StoreServerLimits& limits = {});
  // The total receive cap's account (tests).
  const net::MemoryBudget* budget() const { return rpc_.budget(); }
  ~EmbeddedStoreServer() { Stop(); }

  int port() const { return rpc_.port(); }
  // The served store, for in-process access by the hosting process.
  MemoryStore& store() { return *store_; }
  // Closes the store (blocked calls return Unavailable) and the server.
  void Stop();

 private:
  EmbeddedStoreServer() : store_(std::make_unique<MemoryStore>()) {}
  void RegisterMethods();
  std::unique_ptr<MemoryStore> store_;
  net::RpcServer rpc_;
};

// Store over TCP. Keeps a small pool of authenticated connections so that
// concurrent calls (and long-polling watches) do not wait for each other.
// A broken connection is replaced on the next call. Idempotent calls (Get,
// List, Set, Delete, Wait, WatchPoll, KeepAlive, RevokeLease) are retried on
// a fresh connection until the deadline; CompareAndSwap, Add and GrantLease
// are not (a retry could apply them twice) and return Unavailable.
class StoreClient : public Store {
 public:
  StoreClient(std::string host, int port, net::JobToken token)
      : host_(std::move(host)), port_(port), token_(std::move(token)) {}

  // Checks that the store answers (and authenticates) before the deadline.
  [[nodiscard]] Status Ping(Deadline deadline);

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

 private:
  // `reply_grace` > 0: a method that blocks on the server until `deadline`
  // (Wait, WatchPoll). The server gets `deadline`; the connection and the
  // reply get `reply_grace` more, so that a wait that ran to its end still
  // delivers its answer (WatchPoll: an empty batch, OK) on a loaded machine.
  // Retries on fresh connections stop at `deadline`.
  Result<std::string> Call(StoreMethod method, const std::string& body, Deadline deadline,
                           bool idempotent, Duration reply_grace = Duration::zero()) EXCLUDES(mu_);
  const std::string host_;
  const int port_;
  const net::JobToken token_;
  Mutex mu_;
  std::vector<std::unique_ptr<net::RpcClient>> idle_ GUARDED_BY(mu_);
};

}  // namespace memento::coord
