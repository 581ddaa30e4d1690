#include "net/rpc.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/checksum.h"
#include "common/log.h"

namespace memento::net {
namespace {

uint32_t TimeoutMs(Deadline d) {
  if (d.infinite()) return 0;
  int ms = d.remaining_ms();
  return static_cast<uint32_t>(std::max(ms, 1));
}

}  // namespace

void RpcServer::Register(uint32_t method, Method fn) {
  RegisterParts(
      method,
      [fn = std::move(fn)](std::string_view req, Deadline d, const ReplyFn& reply) -> Status {
        Result<std::string> out = fn(req, d);
        if (!out.ok()) return out.status();
        ConstBuffer b{out->data(), out->size()};
        return reply(&b, 1);
      });
}

void RpcServer::RegisterParts(uint32_t method, PartsMethod fn) {
  RegisterStream(method, [fn = std::move(fn)](std::string_view req, Deadline d, const DataFn&,
                                              const ReplyFn& reply) { return fn(req, d, reply); });
}

void RpcServer::RegisterStream(uint32_t method, StreamMethod fn) {
  MEMENTO_CHECK(server_ == nullptr);
  MEMENTO_CHECK(methods_.emplace(method, std::move(fn)).second);
}

Status RpcServer::Start(const ServerOptions& options, JobToken token) {
  MEMENTO_CHECK(server_ == nullptr);
  if (options.max_buffered_bytes > 0) {
    budget_ = std::make_unique<MemoryBudget>(options.max_buffered_bytes, options.limit_name);
  }
  MEMENTO_ASSIGN_OR_RETURN(server_, Server::Start(options, std::move(token),
                                                  [this](Connection& c) { ServeConnection(c); }));
  return Status::Ok();
}

void RpcServer::ServeConnection(Connection& conn) {
  for (;;) {
    // The request's payload counts against the total cap while it is
    // received and served; one that does not fit is dropped as it arrives.
    MemoryBudget::Hold hold;
    Status refused;
    const Connection::PayloadSink sink = [&](FrameType, uint32_t, uint64_t len) -> Result<void*> {
      if (budget_ == nullptr) return static_cast<void*>(nullptr);
      Result<MemoryBudget::Hold> h = budget_->Reserve(len);
      if (!h.ok()) {
        // Logged now: a peer that stalls inside the frame never gets a reply.
        refused = h.status();
        MEMENTO_LOG_WARN("net: rpc: dropping a request of {} bytes from {} unread: {}", len,
                         conn.peer(), refused.message());
        return Connection::DiscardPayload();
      }
      hold = std::move(*h);
      return static_cast<void*>(nullptr);
    };
    Result<Frame> f = conn.RecvWith(sink, Deadline::Infinite());
    if (!f.ok()) return;  // peer gone, shut down or malformed (already logged)
    if (!f->digest_ok) {
      MEMENTO_LOG_WARN("net: rpc: closing {}: a frame of {} bytes does not match its digest",
                       conn.peer(), f->size);
      return;
    }
    if (f->type != FrameType::kRpcRequest || f->payload.size() < sizeof(RpcRequestHeader)) {
      MEMENTO_LOG_WARN("net: rpc: closing {}: unexpected {} frame of {} bytes", conn.peer(),
                       FrameTypeName(static_cast<uint16_t>(f->type)), f->size);
      return;
    }
    RpcRequestHeader req;
    std::memcpy(&req, f->payload.data(), sizeof(req));
    if (!refused.ok()) {
      const Status st = ResourceExhaustedError(
          fmt::format("rpc: request of {} bytes (method {}) from {} refused: {}", f->size,
                      req.method, conn.peer(), refused.message()));
      RpcReplyHeader rep{req.request_id, static_cast<uint32_t>(st.code()),
                         static_cast<uint32_t>(st.message().size())};
      ConstBuffer parts[2] = {{&rep, sizeof(rep)}, {st.message().data(), st.message().size()}};
      if (!conn.Send(FrameType::kRpcReply, 0, parts, 2, Deadline::AfterSeconds(60)).ok()) return;
      continue;
    }
    // A method that blocks until the deadline must answer before the caller
    // stops listening: keep back a margin for the reply's trip (1/5 of the
    // budget, at most 50 ms).
    uint32_t margin = std::min<uint32_t>(req.timeout_ms / 5, 50);
    Deadline deadline = req.timeout_ms == 0 ? Deadline::Infinite()
                                            : Deadline::After(std::chrono::milliseconds(
                                                  std::max<uint32_t>(req.timeout_ms - margin, 1)));
    std::string_view body = std::string_view(f->payload).substr(sizeof(req));
    bool replied = false;
    bool send_failed = false;
    auto reply = [&](const ConstBuffer* parts, size_t n) -> Status {
      MEMENTO_CHECK_MSG(!replied, "rpc method replied twice");
      replied = true;
      RpcReplyHeader rep{req.request_id, 0, 0};
      std::vector<ConstBuffer> all;
      all.reserve(n + 1);
      all.push_back({&rep, sizeof(rep)});
      all.insert(all.end(), parts, parts + n);
      // The reply gets a fresh budget: the caller gave up already if it expired.
      Status s =
          conn.Send(FrameType::kRpcReply, 0, all.data(), all.size(), Deadline::AfterSeconds(60));
      if (!s.ok()) send_failed = true;
      return s;
    };
    auto data = [&](const ConstBuffer* parts, size_t n, std::optional<uint64_t> digest) -> Status {
      MEMENTO_CHECK_MSG(!replied, "rpc method sent data after its reply");
      if (send_failed) return UnavailableError("rpc: an earlier data frame could not be sent");
      uint64_t d = 0;
      if (digest.has_value()) {
        d = *digest;
      } else {
        StreamingChecksum sum;
        for (size_t i = 0; i < n; ++i) {
          if (parts[i].size > 0) sum.Update(parts[i].data, parts[i].size);
        }
        d = sum.Digest();
      }
      Status s = conn.SendDigested(FrameType::kData, parts, n, d, Deadline::AfterSeconds(60));
      if (!s.ok()) send_failed = true;
      return s;
    };
    Status st;
    auto it = methods_.find(req.method);
    if (it == methods_.end()) {
      st = InvalidArgumentError(fmt::format("unknown rpc method {}", req.method));
    } else {
      st = it->second(body, deadline, data, reply);
    }
    if (send_failed) return;
    if (replied) {
      if (!st.ok()) {
        MEMENTO_LOG_WARN("net: rpc method {} failed after replying: {}", req.method, st.ToString());
      }
      continue;
    }
    if (st.ok())
      st = InternalError(fmt::format("rpc method {} returned without a reply", req.method));
    RpcReplyHeader rep{req.request_id, static_cast<uint32_t>(st.code()),
                       static_cast<uint32_t>(st.message().size())};
    ConstBuffer parts[2] = {{&rep, sizeof(rep)}, {st.message().data(), st.message().size()}};
    if (!conn.Send(FrameType::kRpcReply, 0, parts, 2, Deadline::AfterSeconds(60)).ok()) return;
  }
}

Result<std::unique_ptr<RpcClient>> RpcClient::Connect(const std::string& host, int port,
                                                      const JobToken& token, Deadline deadline,
                                                      const ConnectionOptions& options) {
  MEMENTO_ASSIGN_OR_RETURN(auto conn, Dial(host, port, token, deadline, options));
  return std::make_unique<RpcClient>(std::move(conn));
}

Result<std::string> RpcClient::Call(uint32_t method, std::string_view request, Deadline deadline) {
  ConstBuffer b{request.data(), request.size()};
  return CallParts(method, &b, 1, deadline);
}

Status RpcClient::Break(Status why) {
  broken_ = UnavailableError(
      fmt::format("rpc connection to {} is broken: {}", conn_->peer(), why.ToString()));
  conn_->Shutdown();
  return why;
}

Status RpcClient::SendRequest(uint64_t id, uint32_t method, const ConstBuffer* parts,
                              size_t num_parts, Deadline deadline) {
  RpcRequestHeader req{id, method, TimeoutMs(deadline)};
  std::vector<ConstBuffer> all;
  all.reserve(num_parts + 1);
  all.push_back({&req, sizeof(req)});
  all.insert(all.end(), parts, parts + num_parts);
  Status s = conn_->Send(FrameType::kRpcRequest, 0, all.data(), all.size(), deadline);
  if (!s.ok()) return Break(s);
  return Status::Ok();
}

Result<size_t> RpcClient::CallInto(uint32_t method, std::string_view request, void* dst,
                                   size_t capacity, Deadline deadline) {
  MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  uint64_t id = next_id_++;
  ConstBuffer b{request.data(), request.size()};
  MEMENTO_RETURN_IF_ERROR(SendRequest(id, method, &b, 1, deadline));
  RpcReplyHeader rep{};
  size_t len = 0;
  Result<Frame> f = conn_->RecvSplit(&rep, sizeof(rep), dst, capacity, &len, deadline);
  if (!f.ok()) return Break(f.status());
  if (f->type != FrameType::kRpcReply || rep.request_id != id ||
      rep.status_code > static_cast<uint32_t>(StatusCode::kPermissionDenied) ||
      rep.message_len > len) {
    return Break(DataLossError(fmt::format("rpc: malformed reply from {} (id {} for request {})",
                                           conn_->peer(), rep.request_id, id)));
  }
  if (rep.status_code != 0) {
    return Status(static_cast<StatusCode>(rep.status_code),
                  std::string(static_cast<const char*>(dst), rep.message_len));
  }
  return len;
}

Result<size_t> RpcClient::CallStreamInto(uint32_t method, std::string_view request, void* dst,
                                         size_t capacity, Deadline deadline,
                                         const std::function<void(const StreamedData&)>& on_data) {
  MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  uint64_t id = next_id_++;
  ConstBuffer b{request.data(), request.size()};
  MEMENTO_RETURN_IF_ERROR(SendRequest(id, method, &b, 1, deadline));
  auto* out = static_cast<uint8_t*>(dst);
  size_t got = 0;
  Status mismatch;
  // Read under mu_ (held by this call); the sink runs inside RecvWith, still
  // under it, but the analysis cannot see into the lambda.
  const bool staged = staged_;
  std::vector<uint8_t>* stage = &stage_;
  const Connection::PayloadSink sink = [&](FrameType type, uint32_t,
                                           uint64_t len) -> Result<void*> {
    if (type != FrameType::kData) return nullptr;  // the reply: into Frame::payload
    if (len > capacity - got) {
      return InvalidArgumentError(
          fmt::format("rpc: {} streamed {} more bytes into a buffer with {} of {} bytes left",
                      conn_->peer(), len, capacity - got, capacity));
    }
    if (staged) {
      if (stage->size() < len) stage->resize(len);
      return static_cast<void*>(stage->data());
    }
    return static_cast<void*>(out + got);
  };
  for (;;) {
    Result<Frame> f = conn_->RecvWith(sink, deadline);
    if (!f.ok()) return Break(f.status());
    if (f->type == FrameType::kData) {
      if (!f->digest_ok || !(f->flags & kFrameFlagDigest)) {
        if (mismatch.ok()) {
          mismatch = DataLossError(
              fmt::format("rpc: {} bytes streamed by {} at offset {} do not match their digest",
                          f->size, conn_->peer(), got));
        }
      } else {
        if (staged_) std::memcpy(out + got, stage_.data(), f->size);
        if (on_data) on_data(StreamedData{got, f->size, f->digest});
      }
      got += f->size;
      continue;
    }
    if (f->type != FrameType::kRpcReply || f->payload.size() < sizeof(RpcReplyHeader)) {
      return Break(DataLossError(
          fmt::format("rpc: {} sent a {} frame of {} bytes in a stream", conn_->peer(),
                      FrameTypeName(static_cast<uint16_t>(f->type)), f->payload.size())));
    }
    RpcReplyHeader rep{};
    std::memcpy(&rep, f->payload.data(), sizeof(rep));
    if (rep.request_id != id ||
        rep.status_code > static_cast<uint32_t>(StatusCode::kPermissionDenied) ||
        rep.message_len > f->payload.size() - sizeof(rep)) {
      return Break(DataLossError(fmt::format("rpc: malformed reply from {} (id {} for request {})",
                                             conn_->peer(), rep.request_id, id)));
    }
    if (rep.status_code != 0) {
      return Status(static_cast<StatusCode>(rep.status_code),
                    f->payload.substr(sizeof(rep), rep.message_len));
    }
    if (!mismatch.ok()) return mismatch;
    // A reply body after streamed data is not expected; it is ignored.
    return got;
  }
}

Result<std::string> RpcClient::CallParts(uint32_t method, const ConstBuffer* parts,
                                         size_t num_parts, Deadline deadline) {
  return CallPartsUntil(method, parts, num_parts, deadline, deadline);
}

Result<std::string> RpcClient::CallBlocking(uint32_t method, std::string_view request,
                                            Deadline wait_until, Deadline reply_by) {
  ConstBuffer b{request.data(), request.size()};
  return CallPartsUntil(method, &b, 1, wait_until, reply_by);
}

Result<std::string> RpcClient::CallPartsUntil(uint32_t method, const ConstBuffer* parts,
                                              size_t num_parts, Deadline wait_until,
                                              Deadline reply_by) {
  MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  uint64_t id = next_id_++;
  const Deadline deadline = reply_by;  // the transport's: sending and receiving
  RpcRequestHeader req{id, method, TimeoutMs(wait_until)};
  std::vector<ConstBuffer> all;
  all.reserve(num_parts + 1);
  all.push_back({&req, sizeof(req)});
  all.insert(all.end(), parts, parts + num_parts);
  Status s = conn_->Send(FrameType::kRpcRequest, 0, all.data(), all.size(), deadline);
  if (!s.ok()) {
    broken_ = UnavailableError(
        fmt::format("rpc connection to {} is broken: {}", conn_->peer(), s.ToString()));
    conn_->Shutdown();
    return s;
  }
  Result<Frame> f = conn_->Recv(deadline);
  Status bad;
  if (!f.ok()) {
    bad = f.status();
  } else if (f->type != FrameType::kRpcReply || f->payload.size() < sizeof(RpcReplyHeader)) {
    bad = DataLossError(fmt::format("rpc: {} sent a {} frame of {} bytes instead of a reply",
                                    conn_->peer(), FrameTypeName(static_cast<uint16_t>(f->type)),
                                    f->payload.size()));
  }
  RpcReplyHeader rep{};
  if (bad.ok()) {
    std::memcpy(&rep, f->payload.data(), sizeof(rep));
    if (rep.request_id != id ||
        rep.status_code > static_cast<uint32_t>(StatusCode::kPermissionDenied) ||
        rep.message_len > f->payload.size() - sizeof(rep)) {
      bad = DataLossError(fmt::format("rpc: malformed reply from {} (id {} for request {})",
                                      conn_->peer(), rep.request_id, id));
    }
  }
  if (!bad.ok()) {
    // Whatever arrives later belongs to this abandoned call: the stream is
    // no longer usable for the next one.
    broken_ = UnavailableError(
        fmt::format("rpc connection to {} is broken: {}", conn_->peer(), bad.ToString()));
    conn_->Shutdown();
    return bad;
  }
  if (rep.status_code != 0) {
    return Status(static_cast<StatusCode>(rep.status_code),
                  f->payload.substr(sizeof(rep), rep.message_len));
  }
  return f->payload.substr(sizeof(rep) + rep.message_len);
}

}  // namespace memento::net
