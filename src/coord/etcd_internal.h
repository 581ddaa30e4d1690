// Internal to the etcd client (EtcdStore, etcd_store.h): the JSON gateway's
// encodings and the types shared by its source files. Included only by
// src/coord/etcd_*.cc. The client is split by concern:
//   etcd_store.cc    URL parsing, Open, authentication
//   etcd_gateway.cc  the HTTP connection pool, unary calls and streams, epochs
//   etcd_kv.cc       keys (range, put, transactions, Wait) and leases
//   etcd_watch.cc    WatchPoll: long-lived watch streams and one-shot polls
//   etcd_codec.cc    base64, int64 fields, key ranges, gRPC errors
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/mutex.h"
#include "coord/etcd_store.h"

namespace memento::coord {
namespace etcd {

using json = nlohmann::json;

// A random non-zero store epoch.
uint64_t RandomEpoch();

// etcd's JSON gateway sends bytes fields as standard base64.
std::string B64(std::string_view in);
Result<std::string> UnB64(std::string_view in);

// int64 fields are JSON strings in the gateway's proto3 mapping (numbers also
// accepted); a missing field is 0 (proto3 omits defaults).
int64_t I64(const json& j, const char* name);
// A bytes field, decoded ("" when missing or not base64).
std::string Bytes(const json& j, const char* name);
KeyValue ParseKv(const json& j);

// The end of the range of keys starting with `prefix` ("\0" = no end).
std::string PrefixEnd(const std::string& prefix);
// {"key", "range_end"} of the keys starting with `prefix`.
json PrefixRange(const std::string& prefix);

// gRPC status code (as etcd's gateway reports it) -> Status.
Status FromGrpc(int code, const std::string& message, const std::string& what);
// The error an answer carries: {"error": "...", "code": N} (unary) or
// {"error": {"grpc_code": N, "message": "..."}} (streams).
std::optional<std::pair<int, std::string>> ErrorOf(const json& j);

// cpp-httplib's connection, read and write timeouts from a deadline.
void SetTimeouts(httplib::Client& c, Deadline deadline);

}  // namespace etcd

// The etcd client's source files (the only ones that include this header)
// name the gateway's helpers unqualified.
using etcd::B64;
using etcd::ErrorOf;
using etcd::FromGrpc;
using etcd::I64;
using etcd::json;
using etcd::ParseKv;
using etcd::PrefixRange;
using etcd::RandomEpoch;
using etcd::SetTimeouts;

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

}  // namespace memento::coord
