// The calling side of the peer protocol (peer_service.h): ClusterReader,
// through which recovery reads bytes from this node and its peers, and
// PushCopy.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "agent/durable_cluster.h"
#include "agent/peer_service_internal.h"
#include "agent/redundancy_shm.h"
#include "common/checksum.h"
#include "common/log.h"
#include "net/peer_protocol.h"
#include "recover/recipe.h"
#include "recover/recover.h"

namespace memento::agent {

using recover::ByteSource;
using recover::ReadRequest;
using recover::SourceKind;

namespace {

// "read of <kind> <id> (step S) from node N": how a failed remote read names
// itself (both read paths).
std::string ReadOf(const ReadRequest& req, int node) {
  return fmt::format("read of {} {} (step {}) from node {}",
                     recover::SourceKindName(req.source.kind), req.source.id, req.step, node);
}

Result<std::unique_ptr<net::RpcClient>> ConnectTo(const std::string& endpoint,
                                                  const net::JobToken& token, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(net::HostPort hp, net::ParseHostPort(endpoint, net::PortUse::kConnect));
  return net::RpcClient::Connect(hp.host, hp.port, token, deadline);
}

// A live node whose membership lease lapsed (its heartbeat starved on a
// loaded host) has no endpoint key until it registers again, within about
// one lease TTL (3 s by default). A recovery read asks again for up to
// kEndpointGraceS (within its deadline) before calling such a node
// unreachable: chaos seed 0x5539b994 ended a job with exit 1 that way,
// although nothing was lost. Any other error, or an endpoint that refuses
// connections, is answered at once.
constexpr double kEndpointGraceS = 5.0;

Result<std::string> EndpointWithGrace(const EndpointSource& endpoint_of, int node,
                                      Deadline deadline) {
  if (!endpoint_of) return NotFoundError("no endpoint source");
  const Deadline grace = Deadline::AfterSeconds(kEndpointGraceS);
  for (;;) {
    Result<std::string> ep = endpoint_of(node);
    if (ep.ok() || ep.status().code() != StatusCode::kNotFound || grace.expired() ||
        deadline.expired()) {
      return ep;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

// ---- ClusterReader -------------------------------------------------------------

ClusterReader::ClusterReader(ClusterReaderOptions options, net::JobToken token)
    : options_(std::move(options)), token_(std::move(token)) {}

ClusterReader::~ClusterReader() { Reset(); }

void ClusterReader::Reset() {
  std::map<int, Pool> pools;
  {
    MutexLock l(&mu_);
    for (auto& [node, pool] : pools_) {
      pool.open -= pool.idle.size();
      pools[node].idle = std::move(pool.idle);
      pool.idle.clear();
    }
  }
  // Closed outside the lock.
}

Status ClusterReader::Read(int node, const ReadRequest& req, void* dst, Deadline deadline) {
  return ReadWithDigests(node, req, dst, deadline, nullptr);
}

Status ClusterReader::ReadWithDigests(int node, const ReadRequest& req, void* dst,
                                      Deadline deadline, const DigestFn& on_digest) {
  if (node == options_.node) return ReadLocal(req, dst);
  if (options_.legacy_reads) {
    // Large reads in bounded requests (each received straight into place).
    auto* out = static_cast<uint8_t*>(dst);
    for (uint64_t done = 0; done < req.length || req.length == 0;) {
      ReadRequest part = req;
      part.offset = req.offset + done;
      part.length = std::min<uint64_t>(req.length - done, kMaxPeerReadBytes);
      MEMENTO_RETURN_IF_ERROR(ReadRemoteLegacy(node, part, out + done, deadline));
      done += part.length;
      if (req.length == 0) break;
    }
    return Status::Ok();
  }
  return ReadRemote(node, req, dst, deadline, on_digest);
}

Status ClusterReader::ReadLocal(const ReadRequest& req, void* dst) {
  if (req.source.kind == SourceKind::kPiece) {
    if (options_.pieces == nullptr) return FailedPreconditionError("cluster reader: no T0 reader");
    MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan, options_.plan());
    return options_.pieces->ReadPiece(plan->plan, req.source.id, req.step, req.offset, req.length,
                                      dst);
  }
  if (options_.redundancy == nullptr) {
    return FailedPreconditionError("cluster reader: no redundancy store");
  }
  return options_.redundancy->Read(req, dst);
}

Result<std::unique_ptr<net::RpcClient>> ClusterReader::Acquire(int node, Deadline deadline,
                                                               bool* pooled) {
  {
    MutexLock l(&mu_);
    for (;;) {
      Pool& pool = pools_[node];
      if (!pool.idle.empty()) {
        std::unique_ptr<net::RpcClient> c = std::move(pool.idle.back());
        pool.idle.pop_back();
        *pooled = true;
        return c;
      }
      if (pool.open < std::max<size_t>(1, options_.connections_per_peer)) {
        ++pool.open;
        break;
      }
      if (deadline.infinite()) {
        cv_.Wait(&l);
      } else if (!cv_.WaitUntil(&l, deadline.when())) {
        return DeadlineExceededError(
            fmt::format("cluster reader: no free connection to node {} in time", node));
      }
    }
  }
  *pooled = false;
  Result<std::string> endpoint = EndpointWithGrace(options_.endpoint_of, node, deadline);
  Result<std::unique_ptr<net::RpcClient>> c =
      endpoint.ok() ? ConnectTo(*endpoint, token_, deadline)
                    : Result<std::unique_ptr<net::RpcClient>>(endpoint.status());
  if (!c.ok()) {
    MutexLock l(&mu_);
    --pools_[node].open;
    cv_.SignalAll();
    Status s = c.status();
    return UnavailableError(fmt::format("cannot reach node {}{}: {}", node,
                                        endpoint.ok() ? " at " + *endpoint : "", s.ToString()));
  }
  (*c)->set_staged_receive(options_.staged_receive);
  return c;
}

void ClusterReader::Release(int node, std::unique_ptr<net::RpcClient> client) {
  std::vector<std::unique_ptr<net::RpcClient>> stale;  // closed outside the lock
  MutexLock l(&mu_);
  Pool& pool = pools_[node];
  if (client != nullptr && !client->broken()) {
    pool.idle.push_back(std::move(client));
  } else {
    --pool.open;
    // A broken connection: the peer most likely restarted (a lost node's
    // replacement), so the idle ones to it are stale too. Dropped, so that
    // the retry on a fresh connection really gets a fresh one (several
    // stale idle connections made the retry fail after a node was replaced:
    // agent_sharded_exhaustive_test).
    pool.open -= pool.idle.size();
    stale = std::move(pool.idle);
    pool.idle.clear();
  }
  cv_.SignalAll();
}

Status ClusterReader::ReadRemote(int node, const ReadRequest& req, void* dst, Deadline deadline,
                                 const DigestFn& on_digest) {
  const std::string body = recover::ToJson(req).dump();
  std::function<void(const net::RpcClient::StreamedData&)> on_data;
  if (on_digest) {
    on_data = [&](const net::RpcClient::StreamedData& d) {
      on_digest(d.offset, d.length, d.digest);
    };
  }
  for (int attempt = 0;; ++attempt) {
    bool pooled = false;
    MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<net::RpcClient> client,
                             Acquire(node, deadline, &pooled));
    // One request, the bytes streamed back straight into dst (digest frames,
    // each checked against the source's checksum as it arrives).
    Result<size_t> n =
        client->CallStreamInto(net::kPeerReadStream, body, dst, req.length, deadline, on_data);
    const bool broken = client->broken();
    Release(node, std::move(client));
    if (!n.ok()) {
      // A pooled connection may have gone stale (peer restarted): once more
      // on a fresh one.
      if (broken && pooled && attempt == 0 && !deadline.expired()) continue;
      if (broken) {
        return UnavailableError(ReadOf(req, node) + ": " + n.status().ToString());
      }
      if (n.status().code() == StatusCode::kDataLoss) {
        // Checked here on arrival (the sender's own checks name the chunk).
        return n.status().WithContext(ReadOf(req, node));
      }
      return n.status();
    }
    if (*n != req.length) {
      return DataLossError(
          fmt::format("node {} answered {} bytes for a read of {}", node, *n, req.length));
    }
    return Status::Ok();
  }
}

Status ClusterReader::ReadRemoteLegacy(int node, const ReadRequest& req, void* dst,
                                       Deadline deadline) {
  const std::string body = recover::ToJson(req).dump();
  // An error reply's message lands in the destination too: small reads go
  // through a scratch buffer big enough for any message.
  constexpr size_t kMinCapacity = 4096;
  std::vector<uint8_t> scratch;
  void* into = dst;
  size_t capacity = req.length;
  if (req.length < kMinCapacity) {
    scratch.resize(kMinCapacity);
    into = scratch.data();
    capacity = scratch.size();
  }
  for (int attempt = 0;; ++attempt) {
    bool pooled = false;
    MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<net::RpcClient> client,
                             Acquire(node, deadline, &pooled));
    Result<size_t> n = client->CallInto(net::kPeerRead, body, into, capacity, deadline);
    const bool broken = client->broken();
    Release(node, std::move(client));
    if (!n.ok()) {
      if (broken && pooled && attempt == 0 && !deadline.expired()) continue;
      if (broken) {
        return UnavailableError(ReadOf(req, node) + ": " + n.status().ToString());
      }
      return n.status();
    }
    if (*n != req.length) {
      return DataLossError(
          fmt::format("node {} answered {} bytes for a read of {}", node, *n, req.length));
    }
    if (into != dst && req.length > 0) std::memcpy(dst, into, req.length);
    return Status::Ok();
  }
}

// ---- PushCopy -----------------------------------------------------------------------

Status PushCopy(net::RpcClient& client, int64_t step, uint32_t copy_id, const void* bytes,
                size_t len, Deadline deadline) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  const uint64_t xxh3 = Checksum(bytes, len);
  uint64_t offset = 0;
  do {
    const uint64_t n = std::min<uint64_t>(len - offset, kMaxPushPartBytes);
    // Every part names the whole copy's checksum: the receiver checks it when
    // the copy is complete, and accepts a retried push of a copy it already
    // finished with the same bytes.
    nlohmann::json head = {
        {"step", step}, {"copy", copy_id}, {"offset", offset}, {"total", len}, {"xxh3", xxh3}};
    const std::string text = head.dump();
    std::string prefix(4 + text.size(), '\0');
    const uint32_t tl = static_cast<uint32_t>(text.size());
    for (int i = 0; i < 4; ++i) prefix[i] = static_cast<char>((tl >> (8 * i)) & 0xff);
    std::memcpy(prefix.data() + 4, text.data(), text.size());
    net::ConstBuffer parts[2] = {{prefix.data(), prefix.size()}, {p + offset, n}};
    MEMENTO_ASSIGN_OR_RETURN(std::string reply,
                             client.CallParts(net::kPeerPush, parts, n > 0 ? 2 : 1, deadline));
    (void)reply;
    offset += n;
  } while (offset < len);
  return Status::Ok();
}

Status PushCopy(const std::string& endpoint, const net::JobToken& token, int64_t step,
                uint32_t copy_id, const void* bytes, size_t len, Deadline deadline) {
  auto client = ConnectTo(endpoint, token, deadline);
  if (!client.ok()) {
    return UnavailableError(
        fmt::format("push of copy {} to {}: {}", copy_id, endpoint, client.status().ToString()));
  }
  return PushCopy(**client, step, copy_id, bytes, len, deadline);
}

}  // namespace memento::agent
