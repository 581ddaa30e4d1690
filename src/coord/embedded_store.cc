#include "coord/embedded_store.h"

#include <fmt/format.h>

#include <thread>

#include "common/log.h"
#include "net/wire.h"

namespace memento::coord {
namespace {

using net::WireReader;
using net::WireWriter;

void PutKv(WireWriter& w, const KeyValue& kv) {
  w.Bytes(kv.key).Bytes(kv.value).I64(kv.create_revision).I64(kv.mod_revision).I64(kv.lease);
}

Status GetKv(WireReader& r, KeyValue* kv) {
  MEMENTO_RETURN_IF_ERROR(r.Bytes(&kv->key));
  MEMENTO_RETURN_IF_ERROR(r.Bytes(&kv->value));
  MEMENTO_RETURN_IF_ERROR(r.I64(&kv->create_revision));
  MEMENTO_RETURN_IF_ERROR(r.I64(&kv->mod_revision));
  return r.I64(&kv->lease);
}

// Turns a decoding error of a request into a clear InvalidArgument.
Status BadRequest(StoreMethod m, const Status& s) {
  return InvalidArgumentError(
      fmt::format("malformed store request (method {}): {}", static_cast<int>(m), s.message()));
}

}  // namespace

Result<std::unique_ptr<EmbeddedStoreServer>> EmbeddedStoreServer::Start(
    const std::string& host, int port, net::JobToken token, const StoreServerLimits& limits) {
  std::unique_ptr<EmbeddedStoreServer> s(new EmbeddedStoreServer());
  s->RegisterMethods();
  net::ServerOptions o;
  o.host = host;
  o.port = port;
  o.connection.max_payload = limits.max_request_bytes;
  o.max_buffered_bytes = limits.max_buffered_bytes;
  o.limit_name = "the store's total receive cap, memento store --max-buffered";
  MEMENTO_RETURN_IF_ERROR(s->rpc_.Start(o, std::move(token)));
  return s;
}

void EmbeddedStoreServer::Stop() {
  store_->Close();
  rpc_.Stop();
}

void EmbeddedStoreServer::RegisterMethods() {
  MemoryStore* st = store_.get();
  auto reg = [this](StoreMethod m, std::function<Status(WireReader&, WireWriter&, Deadline)> fn) {
    rpc_.Register(static_cast<uint32_t>(m),
                  [m, fn](std::string_view req, Deadline d) -> Result<std::string> {
                    WireReader r(req);
                    WireWriter w;
                    Status s = fn(r, w, d);
                    if (!s.ok()) return s;
                    return w.Take();
                  });
  };
  // Each handler decodes (BadRequest on failure), calls the MemoryStore and encodes.
#define MEMENTO_DECODE(m, expr)                                     \
  do {                                                              \
    Status decode_status_ = (expr);                                 \
    if (!decode_status_.ok()) return BadRequest(m, decode_status_); \
  } while (0)
  reg(StoreMethod::kPing, [st](WireReader& r, WireWriter& w, Deadline) {
    MEMENTO_DECODE(StoreMethod::kPing, r.Done());
    w.U64(st->epoch());
    return Status::Ok();
  });
  reg(StoreMethod::kSet, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string k, v;
    int64_t lease = 0;
    MEMENTO_DECODE(StoreMethod::kSet, r.Bytes(&k));
    MEMENTO_DECODE(StoreMethod::kSet, r.Bytes(&v));
    MEMENTO_DECODE(StoreMethod::kSet, r.I64(&lease));
    MEMENTO_DECODE(StoreMethod::kSet, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(int64_t rev, st->Set(k, v, d, lease));
    w.I64(rev);
    return Status::Ok();
  });
  reg(StoreMethod::kGet, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string k;
    MEMENTO_DECODE(StoreMethod::kGet, r.Bytes(&k));
    MEMENTO_DECODE(StoreMethod::kGet, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(KeyValue kv, st->Get(k, d));
    PutKv(w, kv);
    return Status::Ok();
  });
  reg(StoreMethod::kList, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string p;
    MEMENTO_DECODE(StoreMethod::kList, r.Bytes(&p));
    MEMENTO_DECODE(StoreMethod::kList, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(ListResult l, st->List(p, d));
    w.U32(static_cast<uint32_t>(l.kvs.size()));
    for (const auto& kv : l.kvs) PutKv(w, kv);
    w.I64(l.revision).U64(l.epoch);
    return Status::Ok();
  });
  reg(StoreMethod::kCompareAndSwap, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string k, expected, desired;
    uint8_t has_expected = 0;
    int64_t lease = 0;
    MEMENTO_DECODE(StoreMethod::kCompareAndSwap, r.Bytes(&k));
    MEMENTO_DECODE(StoreMethod::kCompareAndSwap, r.U8(&has_expected));
    MEMENTO_DECODE(StoreMethod::kCompareAndSwap, r.Bytes(&expected));
    MEMENTO_DECODE(StoreMethod::kCompareAndSwap, r.Bytes(&desired));
    MEMENTO_DECODE(StoreMethod::kCompareAndSwap, r.I64(&lease));
    MEMENTO_DECODE(StoreMethod::kCompareAndSwap, r.Done());
    std::optional<std::string> exp;
    if (has_expected) exp = expected;
    MEMENTO_ASSIGN_OR_RETURN(CasResult c, st->CompareAndSwap(k, exp, desired, d, lease));
    w.U8(c.swapped ? 1 : 0).U8(c.current ? 1 : 0);
    if (c.current) PutKv(w, *c.current);
    return Status::Ok();
  });
  reg(StoreMethod::kAdd, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string k;
    int64_t delta = 0;
    MEMENTO_DECODE(StoreMethod::kAdd, r.Bytes(&k));
    MEMENTO_DECODE(StoreMethod::kAdd, r.I64(&delta));
    MEMENTO_DECODE(StoreMethod::kAdd, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(int64_t v, st->Add(k, delta, d));
    w.I64(v);
    return Status::Ok();
  });
  reg(StoreMethod::kDelete, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string k;
    MEMENTO_DECODE(StoreMethod::kDelete, r.Bytes(&k));
    MEMENTO_DECODE(StoreMethod::kDelete, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(bool existed, st->Delete(k, d));
    w.U8(existed ? 1 : 0);
    return Status::Ok();
  });
  reg(StoreMethod::kWait, [st](WireReader& r, WireWriter&, Deadline d) {
    uint32_t n = 0;
    MEMENTO_DECODE(StoreMethod::kWait, r.U32(&n));
    if (n > r.rest().size() / 4)
      return BadRequest(StoreMethod::kWait, InvalidArgumentError(fmt::format("{} keys", n)));
    std::vector<std::string> keys(n);
    for (auto& k : keys) MEMENTO_DECODE(StoreMethod::kWait, r.Bytes(&k));
    MEMENTO_DECODE(StoreMethod::kWait, r.Done());
    return st->Wait(keys, d);
  });
  reg(StoreMethod::kWatchPoll, [st](WireReader& r, WireWriter& w, Deadline d) {
    std::string p;
    int64_t after = 0;
    MEMENTO_DECODE(StoreMethod::kWatchPoll, r.Bytes(&p));
    MEMENTO_DECODE(StoreMethod::kWatchPoll, r.I64(&after));
    MEMENTO_DECODE(StoreMethod::kWatchPoll, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(WatchBatch b, st->WatchPoll(p, after, d));
    w.U32(static_cast<uint32_t>(b.events.size()));
    for (const auto& ev : b.events) {
      w.U8(static_cast<uint8_t>(ev.type));
      PutKv(w, ev.kv);
    }
    w.I64(b.revision).U64(b.epoch);
    return Status::Ok();
  });
  reg(StoreMethod::kGrantLease, [st](WireReader& r, WireWriter& w, Deadline d) {
    double ttl = 0;
    MEMENTO_DECODE(StoreMethod::kGrantLease, r.F64(&ttl));
    MEMENTO_DECODE(StoreMethod::kGrantLease, r.Done());
    MEMENTO_ASSIGN_OR_RETURN(LeaseId id, st->GrantLease(ttl, d));
    w.I64(id);
    return Status::Ok();
  });
  reg(StoreMethod::kKeepAlive, [st](WireReader& r, WireWriter&, Deadline d) {
    int64_t id = 0;
    MEMENTO_DECODE(StoreMethod::kKeepAlive, r.I64(&id));
    MEMENTO_DECODE(StoreMethod::kKeepAlive, r.Done());
    return st->KeepAlive(id, d);
  });
  reg(StoreMethod::kRevokeLease, [st](WireReader& r, WireWriter&, Deadline d) {
    int64_t id = 0;
    MEMENTO_DECODE(StoreMethod::kRevokeLease, r.I64(&id));
    MEMENTO_DECODE(StoreMethod::kRevokeLease, r.Done());
    return st->RevokeLease(id, d);
  });
#undef MEMENTO_DECODE
}

// ---- client ---------------------------------------------------------------

// How much longer than a blocking call's deadline (Wait, WatchPoll) the
// client waits for the server's answer: the answer of a wait that timed out
// is still sent after the deadline, and at load 30 on two cores its trip
// took more than the server's margin (1/5 of the budget, at most 50 ms) in
// a third of the 50 ms polls (coord_test WatchPollSeesPutsAndDeletesInOrder).
constexpr Duration kBlockingReplyGrace = std::chrono::seconds(2);

Result<std::string> StoreClient::Call(StoreMethod method, const std::string& body,
                                      Deadline deadline, bool idempotent, Duration reply_grace) {
  const Deadline reply_by = reply_grace > Duration::zero() && !deadline.infinite()
                                ? Deadline(deadline.when() + reply_grace)
                                : deadline;
  Status last;
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<net::RpcClient> client;
    {
      MutexLock l(&mu_);
      if (!idle_.empty()) {
        client = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    bool fresh = false;
    if (!client) {
      auto c = net::RpcClient::Connect(host_, port_, token_, reply_by);
      if (!c.ok()) {
        last = c.status();
        // Authentication failures will not heal by retrying.
        if (last.code() == StatusCode::kPermissionDenied) return last;
      } else {
        client = std::move(c).value();
        fresh = true;
      }
    }
    if (client) {
      Result<std::string> r =
          client->CallBlocking(static_cast<uint32_t>(method), body, deadline, reply_by);
      if (!client->broken()) {
        MutexLock l(&mu_);
        if (idle_.size() < 8) idle_.push_back(std::move(client));
        return r;
      }
      last = r.status();
      // A pooled connection may have died while idle (the store restarted):
      // the peer's close shows up as Unavailable and the request never
      // reached a live store, so one retry on a fresh connection is safe even
      // for calls that must not be applied twice. Anything else (a timeout, a
      // fresh connection failing mid-call) may have been applied.
      bool stale_pooled = !fresh && attempt == 0 && last.code() == StatusCode::kUnavailable;
      if (!idempotent && !stale_pooled) return last;
    }
    if (deadline.expired()) {
      if (last.ok()) last = DeadlineExceededError("store call: deadline exceeded");
      return last.code() == StatusCode::kDeadlineExceeded
                 ? last
                 : DeadlineExceededError(
                       fmt::format("store {}:{} unreachable before the deadline: {}", host_, port_,
                                   last.ToString()));
    }
    auto pause = std::min<Duration>(std::chrono::milliseconds(50 * (1 + std::min(attempt, 10))),
                                    deadline.remaining());
    std::this_thread::sleep_for(pause);
  }
}

Status StoreClient::Ping(Deadline deadline) {
  return Call(StoreMethod::kPing, "", deadline, true).status();
}

Result<int64_t> StoreClient::Set(const std::string& key, const std::string& value,
                                 Deadline deadline, LeaseId lease) {
  WireWriter w;
  w.Bytes(key).Bytes(value).I64(lease);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep, Call(StoreMethod::kSet, w.str(), deadline, true));
  WireReader r(rep);
  int64_t rev = 0;
  MEMENTO_RETURN_IF_ERROR(r.I64(&rev));
  return rev;
}

Result<KeyValue> StoreClient::Get(const std::string& key, Deadline deadline) {
  WireWriter w;
  w.Bytes(key);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep, Call(StoreMethod::kGet, w.str(), deadline, true));
  WireReader r(rep);
  KeyValue kv;
  MEMENTO_RETURN_IF_ERROR(GetKv(r, &kv));
  return kv;
}

Result<ListResult> StoreClient::List(const std::string& prefix, Deadline deadline) {
  WireWriter w;
  w.Bytes(prefix);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep, Call(StoreMethod::kList, w.str(), deadline, true));
  WireReader r(rep);
  uint32_t n = 0;
  MEMENTO_RETURN_IF_ERROR(r.U32(&n));
  ListResult l;
  for (uint32_t i = 0; i < n; ++i) {
    KeyValue kv;
    MEMENTO_RETURN_IF_ERROR(GetKv(r, &kv));
    l.kvs.push_back(std::move(kv));
  }
  MEMENTO_RETURN_IF_ERROR(r.I64(&l.revision));
  MEMENTO_RETURN_IF_ERROR(r.U64(&l.epoch));
  return l;
}

Result<CasResult> StoreClient::CompareAndSwap(const std::string& key,
                                              const std::optional<std::string>& expected,
                                              const std::string& desired, Deadline deadline,
                                              LeaseId lease) {
  WireWriter w;
  w.Bytes(key).U8(expected ? 1 : 0).Bytes(expected ? *expected : "").Bytes(desired).I64(lease);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep,
                           Call(StoreMethod::kCompareAndSwap, w.str(), deadline, false));
  WireReader r(rep);
  uint8_t swapped = 0, has = 0;
  MEMENTO_RETURN_IF_ERROR(r.U8(&swapped));
  MEMENTO_RETURN_IF_ERROR(r.U8(&has));
  CasResult c;
  c.swapped = swapped != 0;
  if (has) {
    KeyValue kv;
    MEMENTO_RETURN_IF_ERROR(GetKv(r, &kv));
    c.current = std::move(kv);
  }
  return c;
}

Result<int64_t> StoreClient::Add(const std::string& key, int64_t delta, Deadline deadline) {
  WireWriter w;
  w.Bytes(key).I64(delta);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep, Call(StoreMethod::kAdd, w.str(), deadline, false));
  WireReader r(rep);
  int64_t v = 0;
  MEMENTO_RETURN_IF_ERROR(r.I64(&v));
  return v;
}

Result<bool> StoreClient::Delete(const std::string& key, Deadline deadline) {
  WireWriter w;
  w.Bytes(key);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep, Call(StoreMethod::kDelete, w.str(), deadline, true));
  WireReader r(rep);
  uint8_t existed = 0;
  MEMENTO_RETURN_IF_ERROR(r.U8(&existed));
  return existed != 0;
}

Status StoreClient::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.Bytes(k);
  return Call(StoreMethod::kWait, w.str(), deadline, true, kBlockingReplyGrace).status();
}

Result<WatchBatch> StoreClient::WatchPoll(const std::string& prefix, int64_t after_revision,
                                          Deadline deadline) {
  WireWriter w;
  w.Bytes(prefix).I64(after_revision);
  MEMENTO_ASSIGN_OR_RETURN(
      std::string rep, Call(StoreMethod::kWatchPoll, w.str(), deadline, true, kBlockingReplyGrace));
  WireReader r(rep);
  uint32_t n = 0;
  MEMENTO_RETURN_IF_ERROR(r.U32(&n));
  WatchBatch b;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t type = 0;
    MEMENTO_RETURN_IF_ERROR(r.U8(&type));
    if (type > 1) return DataLossError(fmt::format("watch event type {} unknown", type));
    WatchEvent ev;
    ev.type = static_cast<WatchEvent::Type>(type);
    MEMENTO_RETURN_IF_ERROR(GetKv(r, &ev.kv));
    b.events.push_back(std::move(ev));
  }
  MEMENTO_RETURN_IF_ERROR(r.I64(&b.revision));
  MEMENTO_RETURN_IF_ERROR(r.U64(&b.epoch));
  return b;
}

Result<LeaseId> StoreClient::GrantLease(double ttl_s, Deadline deadline) {
  WireWriter w;
  w.F64(ttl_s);
  MEMENTO_ASSIGN_OR_RETURN(std::string rep,
                           Call(StoreMethod::kGrantLease, w.str(), deadline, false));
  WireReader r(rep);
  int64_t id = 0;
  MEMENTO_RETURN_IF_ERROR(r.I64(&id));
  return id;
}

Status StoreClient::KeepAlive(LeaseId lease, Deadline deadline) {
  WireWriter w;
  w.I64(lease);
  return Call(StoreMethod::kKeepAlive, w.str(), deadline, true).status();
}

Status StoreClient::RevokeLease(LeaseId lease, Deadline deadline) {
  WireWriter w;
  w.I64(lease);
  return Call(StoreMethod::kRevokeLease, w.str(), deadline, true).status();
}

}  // namespace memento::coord
