#include "agent/agent_request.h"

#include <limits>

#include "fmt/format.h"
#include "shm/slot_format.h"
#include "shm/slot_limits.h"

namespace memento::agent {

using nlohmann::json;

const char* AgentOpName(AgentOp op) {
  switch (op) {
    case AgentOp::kHello:
      return "hello";
    case AgentOp::kPing:
      return "ping";
    case AgentOp::kSeal:
      return "seal";
    case AgentOp::kComplete:
      return "complete";
    case AgentOp::kSkipped:
      return "skipped";
    case AgentOp::kTarget:
      return "target";
    case AgentOp::kVerify:
      return "verify";
    case AgentOp::kList:
      return "list";
  }
  return "unknown";
}

namespace {

constexpr AgentOp kOps[] = {AgentOp::kHello,    AgentOp::kPing,    AgentOp::kSeal,
                            AgentOp::kComplete, AgentOp::kSkipped, AgentOp::kTarget,
                            AgentOp::kVerify,   AgentOp::kList};

// A value for an error message: its JSON text, cut short.
std::string Shown(const json& v) {
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

// The deepest nesting of [ and { outside strings: nlohmann's parser is
// iterative, but a value nested a million deep is still no request.
bool NestsDeeperThan(std::string_view body, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

class Fields {
 public:
  Fields(const json& msg, const char* op) : msg_(msg), op_(op) {}

  Result<const json*> Get(const char* name) const {
    auto it = msg_.find(name);
    if (it == msg_.end()) {
      return InvalidArgumentError(fmt::format("'{}' request lacks the field '{}'", op_, name));
    }
    return &*it;
  }

  // An integer (not a float, not a string) in [lo, hi].
  Result<int64_t> Int(const char* name, int64_t lo, int64_t hi) const {
    MEMENTO_ASSIGN_OR_RETURN(const json* v, Get(name));
    bool in_range = false;
    int64_t n = 0;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      in_range = u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo;
      n = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      n = v->get<int64_t>();
      in_range = n >= lo && n <= hi;
    }
    if (!in_range) return Bad(name, *v, fmt::format("an integer in [{}, {}]", lo, hi));
    return n;
  }

  Result<uint64_t> Uint(const char* name, uint64_t lo, uint64_t hi) const {
    MEMENTO_ASSIGN_OR_RETURN(const json* v, Get(name));
    if (!v->is_number_unsigned() || v->get<uint64_t>() < lo || v->get<uint64_t>() > hi) {
      return Bad(name, *v, fmt::format("an integer in [{}, {}]", lo, hi));
    }
    return v->get<uint64_t>();
  }

  Result<std::string> String(const char* name) const {
    MEMENTO_ASSIGN_OR_RETURN(const json* v, Get(name));
    if (!v->is_string()) return Bad(name, *v, "a string");
    return v->get<std::string>();
  }

 private:
  Status Bad(const char* name, const json& v, const std::string& want) const {
    return InvalidArgumentError(fmt::format("'{}' request: field '{}' must be {}, got {} ({})", op_,
                                            name, want, Shown(v), v.type_name()));
  }
  const json& msg_;
  const char* op_;
};

}  // namespace

Result<AgentRequest> ParseAgentRequest(std::string_view body) {
  if (NestsDeeperThan(body, kMaxRequestDepth)) {
    return InvalidArgumentError(
        fmt::format("malformed request: nests deeper than {} levels", kMaxRequestDepth));
  }
  json msg = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (msg.is_discarded()) {
    return InvalidArgumentError(
        fmt::format("malformed request: {} bytes that are not JSON", body.size()));
  }
  return AgentRequestFromJson(msg);
}

Result<AgentRequest> AgentRequestFromJson(const json& msg) {
  if (!msg.is_object()) {
    return InvalidArgumentError(
        fmt::format("malformed request: a JSON {}, not an object", msg.type_name()));
  }
  auto op_it = msg.find("op");
  if (op_it == msg.end() || !op_it->is_string()) {
    return InvalidArgumentError(
        fmt::format("malformed request: no \"op\" string{}",
                    op_it == msg.end() ? "" : fmt::format(" (got {})", Shown(*op_it))));
  }
  const std::string& name = op_it->get_ref<const std::string&>();
  AgentRequest r;
  bool known = false;
  for (AgentOp op : kOps) {
    if (name == AgentOpName(op)) {
      r.op = op;
      known = true;
    }
  }
  if (!known) {
    return InvalidArgumentError(fmt::format(
        "unknown op {} (known: hello, ping, seal, complete, skipped, target, verify, list)",
        Shown(*op_it)));
  }
  if (r.op == AgentOp::kPing) return r;
  const Fields f(msg, AgentOpName(r.op));
  MEMENTO_ASSIGN_OR_RETURN(int64_t rank, f.Int("rank", 0, shm::kMaxRank));
  r.rank = static_cast<int>(rank);
  constexpr int64_t kMaxStep = std::numeric_limits<int64_t>::max();
  switch (r.op) {
    case AgentOp::kHello: {
      MEMENTO_ASSIGN_OR_RETURN(uint64_t protocol,
                               f.Uint("protocol", 0, std::numeric_limits<uint32_t>::max()));
      r.protocol = static_cast<uint32_t>(protocol);
      MEMENTO_ASSIGN_OR_RETURN(r.job, f.String("job"));
      if (r.job.empty()) return InvalidArgumentError("'hello' request: field 'job' is empty");
      break;
    }
    case AgentOp::kSeal: {
      MEMENTO_ASSIGN_OR_RETURN(r.bytes, f.Uint("bytes", shm::kSlotHeaderBytes, shm::kMaxSlotBytes));
      if (msg.contains("manifest")) {
        MEMENTO_ASSIGN_OR_RETURN(r.manifest, f.String("manifest"));
        r.has_manifest = true;
      }
      break;
    }
    case AgentOp::kComplete: {
      MEMENTO_ASSIGN_OR_RETURN(int64_t slot, f.Int("slot", 0, shm::kSlotsPerRank - 1));
      r.slot = static_cast<int>(slot);
      MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int("step", 0, kMaxStep));
      break;
    }
    case AgentOp::kSkipped: {
      MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int("step", 0, kMaxStep));
      break;
    }
    case AgentOp::kVerify: {
      MEMENTO_ASSIGN_OR_RETURN(int64_t slot, f.Int("slot", 0, shm::kSlotsPerRank - 1));
      r.slot = static_cast<int>(slot);
      break;
    }
    case AgentOp::kPing:
    case AgentOp::kTarget:
    case AgentOp::kList:
      break;
  }
  return r;
}

}  // namespace memento::agent
