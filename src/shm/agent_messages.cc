#include "shm/agent_messages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "fmt/format.h"
#include "shm/protocol.h"
#include "shm/slot_format.h"
#include "shm/slot_limits.h"

namespace memento::shm {

using nlohmann::json;

namespace {

// Every field name of the protocol, spelled once.
constexpr const char* kOp = "op";
constexpr const char* kProtocol = "protocol";
constexpr const char* kJob = "job";
constexpr const char* kWorldSize = "world_size";
constexpr const char* kRank = "rank";
constexpr const char* kBytes = "bytes";
constexpr const char* kManifest = "manifest";
constexpr const char* kSlot = "slot";
constexpr const char* kStep = "step";
constexpr const char* kNode = "node";
constexpr const char* kRoot = "root";
constexpr const char* kPid = "pid";
constexpr const char* kPaths = "paths";
constexpr const char* kSlotStatus = "slot_status";
constexpr const char* kVersions = "versions";
constexpr const char* kIntact = "intact";
constexpr const char* kError = "error";
constexpr const char* kPath = "path";
constexpr const char* kPlanHash = "plan_hash";
constexpr const char* kSharded = "sharded";
constexpr const char* kRanges = "ranges";
constexpr const char* kTensor = "tensor";
constexpr const char* kOffset = "offset";
constexpr const char* kLength = "length";
constexpr const char* kParities = "parities";
constexpr const char* kId = "id";
constexpr const char* kCode = "code";
constexpr const char* kK = "k";
constexpr const char* kF = "f";
constexpr const char* kIndex = "index";
constexpr const char* kBlockBytes = "block_bytes";
constexpr const char* kBlocks = "blocks";
constexpr const char* kOptimizer = "optimizer";
constexpr const char* kNumel = "numel";
constexpr const char* kLr = "lr";
constexpr const char* kChecksum = "checksum";
constexpr const char* kOwner = "owner";
constexpr const char* kCount = "count";

constexpr AgentOp kOps[] = {AgentOp::kHello,      AgentOp::kPing,        AgentOp::kSeal,
                            AgentOp::kComplete,   AgentOp::kSkipped,     AgentOp::kTarget,
                            AgentOp::kVerify,     AgentOp::kList,        AgentOp::kAssemble,
                            AgentOp::kPlan,       AgentOp::kAorRegister, AgentOp::kAorCapture,
                            AgentOp::kAorChecksum};
constexpr int64_t kMaxStep = std::numeric_limits<int64_t>::max();

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

// The checked fields of one message; `what` names it in errors
// ("'seal' request", "'list' reply").
class Fields {
 public:
  Fields(const json& msg, std::string what) : msg_(msg), what_(std::move(what)) {}

  Result<const json*> Get(const char* name) const {
    auto it = msg_.is_object() ? msg_.find(name) : msg_.end();
    if (it == msg_.end()) {
      return InvalidArgumentError(fmt::format("{} lacks the field '{}'", what_, name));
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

  Result<bool> Bool(const char* name) const {
    MEMENTO_ASSIGN_OR_RETURN(const json* v, Get(name));
    if (!v->is_boolean()) return Bad(name, *v, "true or false");
    return v->get<bool>();
  }

  // An array of at most `max_size` elements.
  Result<const json*> Array(const char* name, size_t max_size) const {
    MEMENTO_ASSIGN_OR_RETURN(const json* v, Get(name));
    if (!v->is_array() || v->size() > max_size) {
      return Bad(name, *v, fmt::format("an array of at most {} elements", max_size));
    }
    return v;
  }

  Result<const json*> Object(const char* name) const {
    MEMENTO_ASSIGN_OR_RETURN(const json* v, Get(name));
    if (!v->is_object()) return Bad(name, *v, "an object");
    return v;
  }

  Status Bad(const char* name, const json& v, const std::string& want) const {
    return InvalidArgumentError(fmt::format("{}: field '{}' must be {}, got {} ({})", what_, name,
                                            want, Shown(v), v.type_name()));
  }

  const std::string& what() const { return what_; }

 private:
  const json& msg_;
  const std::string what_;
};

std::string Request(AgentOp op) { return fmt::format("'{}' request", AgentOpName(op)); }
std::string Reply(AgentOp op) { return fmt::format("'{}' reply", AgentOpName(op)); }

json OkReply() { return StatusToJson(Status::Ok()); }

}  // namespace

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
    case AgentOp::kAssemble:
      return "assemble";
    case AgentOp::kPlan:
      return "plan";
    case AgentOp::kAorRegister:
      return "aor_register";
    case AgentOp::kAorCapture:
      return "aor_capture";
    case AgentOp::kAorChecksum:
      return "aor_checksum";
  }
  return "unknown";
}

// ---- Requests ----------------------------------------------------------------

namespace {
AgentRequest RankRequest(AgentOp op, int rank) {
  AgentRequest r;
  r.op = op;
  r.rank = rank;
  return r;
}
}  // namespace

AgentRequest HelloRequest(const std::string& job, int rank, int world_size) {
  AgentRequest r = RankRequest(AgentOp::kHello, rank);
  r.protocol = kProtocolVersion;
  r.job = job;
  r.world_size = world_size;
  return r;
}

AgentRequest SealRequest(int rank, uint64_t bytes, std::string manifest) {
  AgentRequest r = RankRequest(AgentOp::kSeal, rank);
  r.bytes = bytes;
  r.has_manifest = true;
  r.manifest = std::move(manifest);
  return r;
}

AgentRequest CompleteRequest(int rank, int slot, int64_t step) {
  AgentRequest r = RankRequest(AgentOp::kComplete, rank);
  r.slot = slot;
  r.step = step;
  return r;
}

AgentRequest SkippedRequest(int rank, int64_t step) {
  AgentRequest r = RankRequest(AgentOp::kSkipped, rank);
  r.step = step;
  return r;
}

AgentRequest TargetRequest(int rank) { return RankRequest(AgentOp::kTarget, rank); }

AgentRequest VerifyRequest(int rank, int slot) {
  AgentRequest r = RankRequest(AgentOp::kVerify, rank);
  r.slot = slot;
  return r;
}

AgentRequest ListRequest(int rank) { return RankRequest(AgentOp::kList, rank); }

AgentRequest AssembleRequest(int rank, int64_t step) {
  AgentRequest r = RankRequest(AgentOp::kAssemble, rank);
  r.step = step;
  return r;
}
AgentRequest PlanRequest(int rank, bool client_parity, int64_t step) {
  AgentRequest r = RankRequest(AgentOp::kPlan, rank);
  r.client_parity = client_parity;
  r.step = step;
  return r;
}

AgentRequest AorRegisterRequest(int rank, std::string_view optimizer_encoding, uint64_t numel) {
  AgentRequest r = RankRequest(AgentOp::kAorRegister, rank);
  static constexpr char kHex[] = "0123456789abcdef";
  r.optimizer.reserve(optimizer_encoding.size() * 2);
  for (unsigned char c : optimizer_encoding) {
    r.optimizer.push_back(kHex[c >> 4]);
    r.optimizer.push_back(kHex[c & 15]);
  }
  r.numel = numel;
  return r;
}

AgentRequest AorCaptureRequest(int rank, int64_t step, float lr) {
  AgentRequest r = RankRequest(AgentOp::kAorCapture, rank);
  r.step = step;
  r.has_lr = !std::isnan(lr);
  r.lr = r.has_lr ? static_cast<double>(lr) : 0.0;
  return r;
}

AgentRequest AorChecksumRequest(int rank, int64_t step, uint64_t checksum) {
  AgentRequest r = RankRequest(AgentOp::kAorChecksum, rank);
  r.step = step;
  r.checksum = checksum;
  return r;
}

std::string OptimizerEncoding(const AgentRequest& request) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out(request.optimizer.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>((nibble(request.optimizer[2 * i]) << 4) |
                               nibble(request.optimizer[2 * i + 1]));
  }
  return out;
}

json AgentRequestToJson(const AgentRequest& r) {
  json msg = {{kOp, AgentOpName(r.op)}};
  if (r.op == AgentOp::kPing) return msg;
  msg[kRank] = r.rank;
  switch (r.op) {
    case AgentOp::kHello:
      msg[kProtocol] = r.protocol;
      msg[kJob] = r.job;
      if (r.world_size > 0) msg[kWorldSize] = r.world_size;
      break;
    case AgentOp::kSeal:
      msg[kBytes] = r.bytes;
      if (r.has_manifest) msg[kManifest] = r.manifest;
      break;
    case AgentOp::kComplete:
      msg[kSlot] = r.slot;
      msg[kStep] = r.step;
      break;
    case AgentOp::kSkipped:
    case AgentOp::kAssemble:
      msg[kStep] = r.step;
      break;
    case AgentOp::kVerify:
      msg[kSlot] = r.slot;
      break;
    case AgentOp::kPlan:
      if (r.client_parity) msg[kParities] = true;
      if (r.step >= 0) msg[kStep] = r.step;
      break;
    case AgentOp::kAorRegister:
      msg[kOptimizer] = r.optimizer;
      msg[kNumel] = r.numel;
      break;
    case AgentOp::kAorCapture:
      msg[kStep] = r.step;
      if (r.has_lr) msg[kLr] = r.lr;
      break;
    case AgentOp::kAorChecksum:
      msg[kStep] = r.step;
      msg[kChecksum] = r.checksum;
      break;
    case AgentOp::kPing:
    case AgentOp::kTarget:
    case AgentOp::kList:
      break;
  }
  return msg;
}

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
  auto op_it = msg.find(kOp);
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
    return InvalidArgumentError(
        fmt::format("unknown op {} (known: hello, ping, seal, complete, skipped, target, verify, "
                    "list, assemble, plan, aor_register, aor_capture, aor_checksum)",
                    Shown(*op_it)));
  }
  if (r.op == AgentOp::kPing) return r;
  const Fields f(msg, Request(r.op));
  MEMENTO_ASSIGN_OR_RETURN(int64_t rank, f.Int(kRank, 0, kMaxRank));
  r.rank = static_cast<int>(rank);
  switch (r.op) {
    case AgentOp::kHello: {
      MEMENTO_ASSIGN_OR_RETURN(uint64_t protocol,
                               f.Uint(kProtocol, 0, std::numeric_limits<uint32_t>::max()));
      r.protocol = static_cast<uint32_t>(protocol);
      MEMENTO_ASSIGN_OR_RETURN(r.job, f.String(kJob));
      if (r.job.empty()) return InvalidArgumentError("'hello' request: field 'job' is empty");
      if (msg.contains(kWorldSize)) {
        MEMENTO_ASSIGN_OR_RETURN(int64_t world_size, f.Int(kWorldSize, 1, int64_t{kMaxRank} + 1));
        r.world_size = static_cast<int>(world_size);
      }
      break;
    }
    case AgentOp::kSeal: {
      MEMENTO_ASSIGN_OR_RETURN(r.bytes, f.Uint(kBytes, kSlotHeaderBytes, kMaxSlotBytes));
      if (msg.contains(kManifest)) {
        MEMENTO_ASSIGN_OR_RETURN(r.manifest, f.String(kManifest));
        r.has_manifest = true;
      }
      break;
    }
    case AgentOp::kComplete: {
      MEMENTO_ASSIGN_OR_RETURN(int64_t slot, f.Int(kSlot, 0, kSlotsPerRank - 1));
      r.slot = static_cast<int>(slot);
      MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int(kStep, 0, kMaxStep));
      break;
    }
    case AgentOp::kSkipped:
    case AgentOp::kAssemble: {
      MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int(kStep, 0, kMaxStep));
      break;
    }
    case AgentOp::kVerify: {
      MEMENTO_ASSIGN_OR_RETURN(int64_t slot, f.Int(kSlot, 0, kSlotsPerRank - 1));
      r.slot = static_cast<int>(slot);
      break;
    }
    case AgentOp::kPlan: {
      if (msg.contains(kParities)) {
        MEMENTO_ASSIGN_OR_RETURN(r.client_parity, f.Bool(kParities));
      }
      if (msg.contains(kStep)) {
        MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int(kStep, 0, kMaxStep));
      }
      break;
    }
    case AgentOp::kAorRegister: {
      MEMENTO_ASSIGN_OR_RETURN(r.optimizer, f.String(kOptimizer));
      const bool hex = std::all_of(r.optimizer.begin(), r.optimizer.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
      });
      if (r.optimizer.empty() || r.optimizer.size() % 2 != 0 || !hex ||
          r.optimizer.size() > 2 * kMaxOptimizerEncodingBytes) {
        return f.Bad(kOptimizer, msg[kOptimizer],
                     fmt::format("the optimizer's encoding as lower-case hex (an even number of "
                                 "digits, 2 to {})",
                                 2 * kMaxOptimizerEncodingBytes));
      }
      MEMENTO_ASSIGN_OR_RETURN(r.numel,
                               f.Uint(kNumel, 1, std::numeric_limits<uint64_t>::max() / 8));
      break;
    }
    case AgentOp::kAorCapture: {
      MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int(kStep, 1, kMaxStep));
      if (msg.contains(kLr)) {
        const json& v = msg[kLr];
        if (!v.is_number() || !std::isfinite(v.get<double>()) ||
            std::abs(v.get<double>()) > std::numeric_limits<float>::max()) {
          return f.Bad(kLr, v, "a finite fp32 learning rate (or absent: the optimizer's schedule)");
        }
        r.has_lr = true;
        r.lr = v.get<double>();
      }
      break;
    }
    case AgentOp::kAorChecksum: {
      MEMENTO_ASSIGN_OR_RETURN(r.step, f.Int(kStep, 1, kMaxStep));
      MEMENTO_ASSIGN_OR_RETURN(r.checksum,
                               f.Uint(kChecksum, 0, std::numeric_limits<uint64_t>::max()));
      break;
    }
    case AgentOp::kPing:
    case AgentOp::kTarget:
    case AgentOp::kList:
      break;
  }
  return r;
}

// ---- Replies -------------------------------------------------------------------

json ToJson(const HelloReply& reply) {
  json r = OkReply();
  r[kNode] = reply.node;
  r[kRoot] = reply.root;
  r[kPid] = reply.pid;
  return r;
}

json ToJson(const SealReply& reply) {
  json r = OkReply();
  r[kPaths] = reply.paths;
  return r;
}

json ToJson(const TargetReply& reply) {
  json r = OkReply();
  r[kStep] = reply.step;
  return r;
}

json ToJson(const VerifyReply& reply) {
  json r = OkReply();
  r[kSlotStatus] = StatusToJson(reply.slot_status);
  return r;
}

json ToJson(const AssembleReply& reply) {
  json r = OkReply();
  r[kPath] = reply.path;
  r[kBytes] = reply.bytes;
  return r;
}

json ToJson(const ListReply& reply) {
  json versions = json::array();
  for (const VersionEntry& v : reply.versions) {
    versions.push_back({{kStep, v.step},
                        {kSlot, v.slot},
                        {kIntact, v.intact},
                        {kBytes, v.bytes},
                        {kError, v.error}});
  }
  json r = OkReply();
  r[kVersions] = std::move(versions);
  return r;
}

namespace {

json RangesToJson(const std::vector<SaveRange>& list) {
  json ranges = json::array();
  for (const SaveRange& r : list) {
    ranges.push_back({{kTensor, r.tensor}, {kOffset, r.offset}, {kLength, r.length}});
  }
  return ranges;
}

// One range of a plan reply ("ranges" or a parity's block); `f` names it.
Result<SaveRange> ParseSaveRange(const Fields& f, const json& v) {
  SaveRange r;
  MEMENTO_ASSIGN_OR_RETURN(r.tensor, f.String(kTensor));
  if (r.tensor.empty()) return f.Bad(kTensor, v[kTensor], "a tensor name");
  MEMENTO_ASSIGN_OR_RETURN(r.offset, f.Uint(kOffset, 0, std::numeric_limits<uint64_t>::max()));
  MEMENTO_ASSIGN_OR_RETURN(r.length, f.Uint(kLength, r.offset == 0 ? 0 : 1,
                                            std::numeric_limits<uint64_t>::max() - r.offset));
  return r;
}

Result<PlanParity> ParsePlanParity(const Fields& f, const json& v) {
  PlanParity p;
  MEMENTO_ASSIGN_OR_RETURN(int64_t id, f.Int(kId, 0, int64_t{0xfffffffe}));
  p.id = static_cast<uint32_t>(id);
  MEMENTO_ASSIGN_OR_RETURN(std::string code, f.String(kCode));
  if (code != "xor" && code != "rs") return f.Bad(kCode, v[kCode], "\"xor\" or \"rs\"");
  p.xor_code = code == "xor";
  MEMENTO_ASSIGN_OR_RETURN(int64_t k, f.Int(kK, 1, 254));
  MEMENTO_ASSIGN_OR_RETURN(int64_t nf, f.Int(kF, 1, p.xor_code ? 1 : 255 - k));
  p.k = static_cast<int>(k);
  p.f = static_cast<int>(nf);
  MEMENTO_ASSIGN_OR_RETURN(int64_t index, f.Int(kIndex, 0, p.f - 1));
  p.index = static_cast<int>(index);
  MEMENTO_ASSIGN_OR_RETURN(p.block_bytes, f.Uint(kBlockBytes, 0, kMaxSlotBytes));
  MEMENTO_ASSIGN_OR_RETURN(const json* blocks, f.Array(kBlocks, static_cast<size_t>(p.k)));
  if (blocks->size() != static_cast<size_t>(p.k)) {
    return f.Bad(kBlocks, *blocks, fmt::format("an array of k = {} blocks", p.k));
  }
  for (size_t i = 0; i < blocks->size(); ++i) {
    const json& b = (*blocks)[i];
    if (!b.is_array() || b.size() > kMaxPlanRanges) {
      return f.Bad(kBlocks, *blocks, "an array of arrays of ranges");
    }
    std::vector<SaveRange> block;
    uint64_t total = 0;
    for (size_t j = 0; j < b.size(); ++j) {
      if (!b[j].is_object()) return f.Bad(kBlocks, *blocks, "an array of arrays of ranges");
      const Fields e(b[j], fmt::format("{}: {}[{}][{}]", f.what(), kBlocks, i, j));
      MEMENTO_ASSIGN_OR_RETURN(SaveRange r, ParseSaveRange(e, b[j]));
      total += r.length;
      if (r.length > p.block_bytes || total > p.block_bytes) {
        return InvalidArgumentError(
            fmt::format("{}: field '{}': block {} holds more than block_bytes {} bytes", f.what(),
                        kBlocks, i, p.block_bytes));
      }
      block.push_back(std::move(r));
    }
    p.blocks.push_back(std::move(block));
  }
  return p;
}

}  // namespace

json ToJson(const PlanReply& reply) {
  json r = OkReply();
  r[kPlanHash] = reply.plan_hash;
  r[kSharded] = reply.sharded;
  r[kRanges] = RangesToJson(reply.ranges);
  if (!reply.parities.empty()) {
    json parities = json::array();
    for (const PlanParity& p : reply.parities) {
      json blocks = json::array();
      for (const std::vector<SaveRange>& b : p.blocks) blocks.push_back(RangesToJson(b));
      parities.push_back({{kId, p.id},
                          {kCode, p.xor_code ? "xor" : "rs"},
                          {kK, p.k},
                          {kF, p.f},
                          {kIndex, p.index},
                          {kBlockBytes, p.block_bytes},
                          {kBlocks, std::move(blocks)}});
    }
    r[kParities] = std::move(parities);
  }
  return r;
}

json ToJson(const AorRegisterReply& reply) {
  json ranges = json::array();
  for (const AorRangeEntry& r : reply.ranges) {
    ranges.push_back({{kOwner, r.owner}, {kOffset, r.offset}, {kCount, r.count}});
  }
  json r = OkReply();
  r[kPath] = reply.path;
  r[kRanges] = std::move(ranges);
  return r;
}

Result<HelloReply> ParseHelloReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kHello));
  HelloReply out;
  MEMENTO_ASSIGN_OR_RETURN(int64_t node, f.Int(kNode, 0, std::numeric_limits<int>::max()));
  out.node = static_cast<int>(node);
  MEMENTO_ASSIGN_OR_RETURN(out.root, f.String(kRoot));
  MEMENTO_ASSIGN_OR_RETURN(out.pid, f.Int(kPid, 1, std::numeric_limits<int>::max()));
  return out;
}

Result<SealReply> ParseSealReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kSeal));
  MEMENTO_ASSIGN_OR_RETURN(const json* paths, f.Array(kPaths, kSlotsPerRank));
  SealReply out;
  for (const json& p : *paths) {
    if (!p.is_string() || p.get_ref<const std::string&>().empty()) {
      return f.Bad(kPaths, *paths, fmt::format("{} non-empty strings", kSlotsPerRank));
    }
    out.paths.push_back(p.get<std::string>());
  }
  if (out.paths.size() != kSlotsPerRank) {
    return f.Bad(kPaths, *paths, fmt::format("{} non-empty strings", kSlotsPerRank));
  }
  return out;
}

Result<TargetReply> ParseTargetReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kTarget));
  TargetReply out;
  MEMENTO_ASSIGN_OR_RETURN(out.step, f.Int(kStep, -1, kMaxStep));
  return out;
}

Result<VerifyReply> ParseVerifyReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kVerify));
  MEMENTO_ASSIGN_OR_RETURN(const json* st, f.Object(kSlotStatus));
  VerifyReply out;
  out.slot_status = StatusFromJson(*st);
  return out;
}

Result<ListReply> ParseListReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kList));
  MEMENTO_ASSIGN_OR_RETURN(const json* versions, f.Array(kVersions, kSlotsPerRank));
  ListReply out;
  for (size_t i = 0; i < versions->size(); ++i) {
    const json& v = (*versions)[i];
    const Fields e(v, fmt::format("{}: {}[{}]", f.what(), kVersions, i));
    if (!v.is_object()) return f.Bad(kVersions, *versions, "an array of objects");
    VersionEntry entry;
    MEMENTO_ASSIGN_OR_RETURN(entry.step, e.Int(kStep, 0, kMaxStep));
    MEMENTO_ASSIGN_OR_RETURN(int64_t slot, e.Int(kSlot, 0, kSlotsPerRank - 1));
    entry.slot = static_cast<int>(slot);
    MEMENTO_ASSIGN_OR_RETURN(entry.intact, e.Bool(kIntact));
    MEMENTO_ASSIGN_OR_RETURN(entry.bytes, e.Uint(kBytes, 0, std::numeric_limits<uint64_t>::max()));
    MEMENTO_ASSIGN_OR_RETURN(entry.error, e.String(kError));
    out.versions.push_back(std::move(entry));
  }
  return out;
}

Result<AssembleReply> ParseAssembleReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kAssemble));
  AssembleReply out;
  MEMENTO_ASSIGN_OR_RETURN(out.path, f.String(kPath));
  if (out.path.empty()) return f.Bad(kPath, reply.at(kPath), "a non-empty path");
  MEMENTO_ASSIGN_OR_RETURN(out.bytes, f.Uint(kBytes, 0, std::numeric_limits<uint64_t>::max()));
  return out;
}

Result<PlanReply> ParsePlanReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kPlan));
  PlanReply out;
  MEMENTO_ASSIGN_OR_RETURN(out.plan_hash, f.String(kPlanHash));
  MEMENTO_ASSIGN_OR_RETURN(out.sharded, f.Bool(kSharded));
  MEMENTO_ASSIGN_OR_RETURN(const json* ranges, f.Array(kRanges, kMaxPlanRanges));
  if (!out.sharded && !ranges->empty()) {
    return f.Bad(kRanges, *ranges, "empty when 'sharded' is false");
  }
  out.ranges.reserve(ranges->size());
  for (size_t i = 0; i < ranges->size(); ++i) {
    const json& v = (*ranges)[i];
    if (!v.is_object()) return f.Bad(kRanges, *ranges, "an array of objects");
    const Fields e(v, fmt::format("{}: {}[{}]", f.what(), kRanges, i));
    MEMENTO_ASSIGN_OR_RETURN(SaveRange r, ParseSaveRange(e, v));
    out.ranges.push_back(std::move(r));
  }
  if (reply.is_object() && reply.contains(kParities)) {
    MEMENTO_ASSIGN_OR_RETURN(const json* parities, f.Array(kParities, kMaxPlanRanges));
    if (!out.sharded && !parities->empty()) {
      return f.Bad(kParities, *parities, "empty when 'sharded' is false");
    }
    std::set<uint32_t> ids;
    for (size_t i = 0; i < parities->size(); ++i) {
      const json& v = (*parities)[i];
      if (!v.is_object()) return f.Bad(kParities, *parities, "an array of objects");
      const Fields e(v, fmt::format("{}: {}[{}]", f.what(), kParities, i));
      MEMENTO_ASSIGN_OR_RETURN(PlanParity p, ParsePlanParity(e, v));
      if (!ids.insert(p.id).second) {
        return InvalidArgumentError(
            fmt::format("{}: field '{}': parity {} is listed twice", f.what(), kParities, p.id));
      }
      out.parities.push_back(std::move(p));
    }
  }
  return out;
}

Result<std::vector<SlotEntrySpec>> PlanEntrySpecs(const PlanReply& reply,
                                                  const std::vector<TensorMeta>& tensors,
                                                  std::vector<size_t>* entry_tensor) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);
  std::vector<SlotEntrySpec> specs;
  specs.reserve(reply.ranges.size());
  entry_tensor->clear();
  for (const SaveRange& r : reply.ranges) {
    auto it = index.find(r.tensor);
    if (it == index.end()) {
      return InvalidArgumentError(
          fmt::format("plan {} names tensor '{}', which this rank does not register",
                      reply.plan_hash, r.tensor));
    }
    specs.push_back(
        SlotEntrySpec{tensors[it->second], r.offset, r.length == 0 ? kWholeTensor : r.length});
    entry_tensor->push_back(it->second);
  }
  return specs;
}

Result<AorRegisterReply> ParseAorRegisterReply(const json& reply) {
  const Fields f(reply, Reply(AgentOp::kAorRegister));
  AorRegisterReply out;
  MEMENTO_ASSIGN_OR_RETURN(out.path, f.String(kPath));
  MEMENTO_ASSIGN_OR_RETURN(const json* ranges, f.Array(kRanges, kMaxAorRanges));
  if (!ranges->empty() && out.path.empty()) {
    return f.Bad(kPath, reply.at(kPath), "the staging file's path (the reply has ranges)");
  }
  for (size_t i = 0; i < ranges->size(); ++i) {
    const json& v = (*ranges)[i];
    if (!v.is_object()) return f.Bad(kRanges, *ranges, "an array of objects");
    const Fields e(v, fmt::format("{}: {}[{}]", f.what(), kRanges, i));
    AorRangeEntry r;
    MEMENTO_ASSIGN_OR_RETURN(int64_t owner, e.Int(kOwner, 0, kMaxRank));
    r.owner = static_cast<int>(owner);
    MEMENTO_ASSIGN_OR_RETURN(r.offset,
                             e.Uint(kOffset, 0, std::numeric_limits<uint64_t>::max() / 8));
    MEMENTO_ASSIGN_OR_RETURN(
        r.count, e.Uint(kCount, 1, std::numeric_limits<uint64_t>::max() / 8 - r.offset));
    out.ranges.push_back(r);
  }
  return out;
}

}  // namespace memento::shm
