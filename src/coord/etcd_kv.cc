// EtcdStore's keys (range, put, transactions, Wait) and leases
// (etcd_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <thread>

#include "coord/etcd_internal.h"

namespace memento::coord {

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
