// The requests a trainer sends its node agent on agent.sock (shm/protocol.h;
// the operations are listed in docs/node_store.md, "Agent protocol"), parsed
// and checked field by field before the agent acts on any of them.
//
//   auto req = ParseAgentRequest(frame_body);
//   if (!req.ok()) reply(req.status());   // names the field and the value
//
// A pure function of the message's bytes (no agent state), so that it can
// be fuzzed on its own (issue 21, section 5).
//
// Thread safety: free functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "memento/status.h"

namespace memento::agent {

enum class AgentOp { kHello, kPing, kSeal, kComplete, kSkipped, kTarget, kVerify, kList };
const char* AgentOpName(AgentOp op);

// One checked request. Only the fields of its op are set; the others keep
// these defaults.
struct AgentRequest {
  AgentOp op = AgentOp::kPing;
  uint32_t protocol = 0;  // hello: the client's protocol version
  std::string job;        // hello: the job the client belongs to (non-empty)
  int rank = -1;          // every op but ping: in [0, shm::kMaxRank]
  // seal: the size of each of the rank's two slots, in
  // [shm::kSlotHeaderBytes, shm::kMaxSlotBytes].
  uint64_t bytes = 0;
  bool has_manifest = false;  // seal: whether "manifest" was sent
  std::string manifest;       // seal: the rank's tensors (shm::EncodeManifest text)
  int slot = -1;              // complete, verify: in [0, shm::kSlotsPerRank)
  int64_t step = -1;          // complete, skipped: >= 0
};

// Deepest nesting of arrays and objects a request may have (requests are
// flat; this keeps a hostile message from exhausting the parser's stack).
inline constexpr int kMaxRequestDepth = 16;

// Parses one frame's body. InvalidArgument, naming the op, the field, the
// value received and what was expected, for: a body that is not a JSON
// object (or nests deeper than kMaxRequestDepth), a missing or unknown "op",
// a missing field, a field of the wrong type (a float or string where an
// integer belongs, e.g. "bytes": 1e30), or a value out of range (a negative
// or huge rank, "bytes": 0). Fields an op does not use are ignored.
Result<AgentRequest> ParseAgentRequest(std::string_view body);
// The same for a message already parsed as JSON.
Result<AgentRequest> AgentRequestFromJson(const nlohmann::json& msg);

}  // namespace memento::agent
