// The etcd JSON gateway's encodings (declared in etcd_internal.h).
#include <fmt/format.h>

#include <charconv>

#include "coord/etcd_internal.h"

namespace memento::coord::etcd {

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

}  // namespace memento::coord::etcd
