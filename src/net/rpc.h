// A small request/reply RPC layer on Connection.
//
// Request frame (kRpcRequest): RpcRequestHeader + request body.
// Reply frame   (kRpcReply):   RpcReplyHeader + status message + reply body.
// The caller's deadline travels with the request (timeout_ms) so that a
// server-side blocking method (Wait, Watch) gives up in time too.
//
// RpcServer runs methods on the connection's thread: one request at a time
// per connection, many connections in parallel. RpcClient allows one call in
// flight at a time (calls from several threads are serialised); a transport
// error or a deadline that fires mid-call breaks the client, and Call returns
// Unavailable from then on (callers reconnect: see StoreClient).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "net/connection.h"
#include "net/memory_budget.h"
#include "net/server.h"

namespace memento::net {

struct RpcRequestHeader {
  uint64_t request_id;
  uint32_t method;
  uint32_t timeout_ms;  // 0 = no deadline
};
static_assert(sizeof(RpcRequestHeader) == 16);
struct RpcReplyHeader {
  uint64_t request_id;
  uint32_t status_code;  // StatusCode
  uint32_t message_len;
};
static_assert(sizeof(RpcReplyHeader) == 16);

class RpcServer {
 public:
  // A method gets the request body and the caller's deadline; it returns the
  // reply body or a Status that is sent back to the caller.
  using Method = std::function<Result<std::string>(std::string_view request, Deadline deadline)>;

  RpcServer() = default;
  ~RpcServer() { Stop(); }

  // A method that answers from memory it owns (e.g. shared-memory slots)
  // without copying: it calls `reply(parts, n)` once, while the parts are
  // valid, and the reply frame is sent from them (sendmsg). Returning a
  // non-OK status without calling reply sends that status; calling reply and
  // then returning non-OK is a bug (the status is only logged).
  using ReplyFn = std::function<Status(const ConstBuffer* parts, size_t num_parts)>;
  using PartsMethod =
      std::function<Status(std::string_view request, Deadline deadline, const ReplyFn& reply)>;

  // A streaming method sends any number of data frames before its reply
  // (RpcClient::CallStreamInto receives them back to back into the caller's
  // buffer): `data(parts, n, digest)` sends one kFrameFlagDigest kData frame
  // straight from the parts; `digest` is the xxHash3 of its bytes when the
  // method knows it (e.g. a verified slot chunk), else the data is hashed
  // here. Then it ends like a PartsMethod: reply(...) or a status. A status
  // after data frames tells the caller to discard them (e.g. Aborted: a T0
  // slot was overwritten while it was being sent).
  using DataFn = std::function<Status(const ConstBuffer* parts, size_t num_parts,
                                      std::optional<uint64_t> digest)>;
  using StreamMethod = std::function<Status(std::string_view request, Deadline deadline,
                                            const DataFn& data, const ReplyFn& reply)>;

  // REQUIRES: before Start. A method id may be registered once.
  void Register(uint32_t method, Method fn);
  void RegisterParts(uint32_t method, PartsMethod fn);
  void RegisterStream(uint32_t method, StreamMethod fn);
  [[nodiscard]] Status Start(const ServerOptions& options, JobToken token);
  int port() const { return server_ ? server_->port() : -1; }
  void Stop() {
    if (server_) server_->Stop();
  }
  const Server* server() const { return server_.get(); }
  // The total receive cap (ServerOptions::max_buffered_bytes); null without one.
  const MemoryBudget* budget() const { return budget_.get(); }

 private:
  void ServeConnection(Connection& conn);
  std::unique_ptr<MemoryBudget> budget_;                // set before the server starts
  std::unordered_map<uint32_t, StreamMethod> methods_;  // read-only once started
  std::unique_ptr<Server> server_;
};

class RpcClient {
 public:
  explicit RpcClient(std::unique_ptr<Connection> conn) : conn_(std::move(conn)) {}
  [[nodiscard]] static Result<std::unique_ptr<RpcClient>> Connect(
      const std::string& host, int port, const JobToken& token, Deadline deadline,
      const ConnectionOptions& options = {});

  // Sends `method(request)` and waits for the reply body. A non-OK status
  // returned by the method arrives as that Status; transport failures arrive
  // as Unavailable / DeadlineExceeded / DataLoss and break the client.
  [[nodiscard]] Result<std::string> Call(uint32_t method, std::string_view request,
                                         Deadline deadline) EXCLUDES(mu_);
  // The same with the request body given as caller buffers (sent without copy).
  [[nodiscard]] Result<std::string> CallParts(uint32_t method, const ConstBuffer* parts,
                                              size_t num_parts, Deadline deadline) EXCLUDES(mu_);
  // For a method that blocks on the server until its deadline (the store's
  // Wait and WatchPoll): the request carries `wait_until`, and the client
  // waits for the reply until `reply_by` (later). With one deadline for
  // both, the reply of a wait that ran to its end competes with the
  // client's own timeout, and on a loaded machine the client often gives up
  // first (DeadlineExceeded instead of the method's answer).
  [[nodiscard]] Result<std::string> CallBlocking(uint32_t method, std::string_view request,
                                                 Deadline wait_until, Deadline reply_by)
      EXCLUDES(mu_);
  // Receives the reply body straight into dst[0..capacity) (e.g. a slot being
  // rebuilt) and returns its length. A reply larger than `capacity` is
  // InvalidArgument and breaks the client. Error statuses from the method
  // arrive as that Status (their message must fit `capacity` as well).
  [[nodiscard]] Result<size_t> CallInto(uint32_t method, std::string_view request, void* dst,
                                        size_t capacity, Deadline deadline) EXCLUDES(mu_);
  // One data frame of a streamed reply, as it arrived (CallStreamInto).
  struct StreamedData {
    uint64_t offset = 0;  // where it landed in dst
    uint64_t length = 0;
    uint64_t digest = 0;  // xxHash3 of its bytes, checked on arrival
  };
  // Calls a streaming method (RpcServer::RegisterStream): its data frames
  // are received back to back straight into dst[0..capacity) (each hashed
  // while it arrives and checked against its digest), `on_data` is called
  // for each, then the reply ends the call. Returns the data bytes received.
  // The method's error status arrives as that Status (the data received is
  // to be discarded), as does DataLoss when a data frame did not match its
  // digest; neither breaks the client. More data than `capacity`, a
  // transport failure or a malformed reply break it.
  [[nodiscard]] Result<size_t> CallStreamInto(
      uint32_t method, std::string_view request, void* dst, size_t capacity, Deadline deadline,
      const std::function<void(const StreamedData&)>& on_data = nullptr) EXCLUDES(mu_);
  // CallStreamInto receives each data frame into a buffer of this client
  // (reused, so its pages stay mapped) where it is hashed, then copies it to
  // dst: dst's pages are touched once, by that user-mode copy, instead of
  // by the kernel's receive and again by the hash. On virtual machines with
  // shadow paging, where the first access to a fresh page through each page
  // table exits to the hypervisor, that halves the cost of filling fresh
  // memory (docs/recovery.md, "Staged receive"); elsewhere it costs one
  // copy. The digest then vouches for the buffer, not for dst: the caller
  // must check dst again. Off by default.
  void set_staged_receive(bool on) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    staged_ = on;
  }
  bool broken() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return !broken_.ok();
  }
  void Shutdown() { conn_->Shutdown(); }

 private:
  // Sends the request frame; breaks the client on failure.
  Status SendRequest(uint64_t id, uint32_t method, const ConstBuffer* parts, size_t num_parts,
                     Deadline deadline) REQUIRES(mu_);
  // CallParts with the request's deadline and the reply's apart (CallBlocking).
  Result<std::string> CallPartsUntil(uint32_t method, const ConstBuffer* parts, size_t num_parts,
                                     Deadline wait_until, Deadline reply_by) EXCLUDES(mu_);
  // Marks the stream unusable (a late or partial reply may be in it).
  Status Break(Status why) REQUIRES(mu_);

  Mutex mu_;
  std::unique_ptr<Connection> conn_;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  Status broken_ GUARDED_BY(mu_);
  bool staged_ GUARDED_BY(mu_) = false;
  std::vector<uint8_t> stage_ GUARDED_BY(mu_);  // staged receive buffer
};

}  // namespace memento::net
