// The messages between a trainer's client and its node agent on agent.sock
// (framing: shm/protocol.h; the operations: docs/node_store.md, "Agent
// protocol"). One typed struct per message, encoded and decoded here for
// both directions, so each field's name is spelled once (agent_messages.cc):
//
//   client:  SendJson(fd, AgentRequestToJson(SealRequest(rank, bytes, m)))
//   agent:   auto req = ParseAgentRequest(frame_body);  // every field checked
//            if (!req.ok()) reply(StatusToJson(req.status()));  // names the field
//            ... reply(ToJson(SealReply{paths}));
//   client:  MEMENTO_ASSIGN_OR_RETURN(SealReply r, ParseSealReply(reply));
//
// The decoders are pure functions of the message (no agent or client
// state), so that they can be fuzzed on their own (issue 21, section 5).
// Every malformed message, in either direction, is InvalidArgument naming
// the op, the field, the value received and what was expected.
//
// Thread safety: free functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"
#include "shm/slot.h"

namespace memento::shm {

enum class AgentOp {
  kHello,
  kPing,
  kSeal,
  kComplete,
  kSkipped,
  kTarget,
  kVerify,
  kList,
  kAssemble,
  kPlan,
  kAorRegister,
  kAorCapture,
  kAorChecksum
};
const char* AgentOpName(AgentOp op);

// ---- Requests (client -> agent) ---------------------------------------------

// One request. Only the fields of its op are set; the others keep these
// defaults.
struct AgentRequest {
  AgentOp op = AgentOp::kPing;
  uint32_t protocol = 0;  // hello: the client's protocol version
  std::string job;        // hello: the job the client belongs to (non-empty)
  int world_size = 0;     // hello: the job's world size (optional: 0 when not sent)
  int rank = -1;          // every op but ping: in [0, shm::kMaxRank]
  // seal: the size of each of the rank's two slots, in
  // [shm::kSlotHeaderBytes, shm::kMaxSlotBytes].
  uint64_t bytes = 0;
  bool has_manifest = false;  // seal: whether "manifest" was sent
  std::string manifest;       // seal: the rank's tensors (shm::EncodeManifest text)
  int slot = -1;              // complete, verify: in [0, shm::kSlotsPerRank)
  int64_t step =
      -1;  // complete, skipped, assemble, aor_capture, aor_checksum: >= 0; plan: optional
  // plan: the client computes the parities its rank produces (docs/reft.md
  // section 4) and wants them listed instead of their stripe inputs
  // ("parities": true; absent from older clients: false).
  bool client_parity = false;
  // plan (optional, in `step`): the step of the snapshot the client lays out
  // with the answer; from that step on its slots hold the listed parities
  // (the agent then keeps them resident in T0). -1: not sent.
  // aor_register (docs/reft.md section 5): the optimizer's Encode() bytes as
  // lower-case hex (non-empty, at most kMaxOptimizerEncodingBytes bytes) and
  // the number of elements of the flat buffer (> 0).
  std::string optimizer;
  uint64_t numel = 0;
  // aor_capture: the learning rate the trainer's step uses (finite); absent
  // (has_lr false): the optimizer's own schedule decides it.
  bool has_lr = false;
  double lr = 0;
  uint64_t checksum = 0;  // aor_checksum: the rank's opt::ShardChecksum after `step`
};

// Largest optimizer encoding an aor_register request carries (parameter
// groups included), in bytes before hex.
inline constexpr size_t kMaxOptimizerEncodingBytes = size_t{1} << 20;

// The requests a client sends (hello carries shm::kProtocolVersion).
AgentRequest HelloRequest(const std::string& job, int rank, int world_size);
AgentRequest SealRequest(int rank, uint64_t bytes, std::string manifest);
AgentRequest CompleteRequest(int rank, int slot, int64_t step);
AgentRequest SkippedRequest(int rank, int64_t step);
AgentRequest TargetRequest(int rank);
AgentRequest VerifyRequest(int rank, int slot);
AgentRequest ListRequest(int rank);
// The rank's whole state at `step` from its plan pieces (docs/reft.md,
// section 3), staged by the agent in a whole-tensor slot file.
AgentRequest AssembleRequest(int rank, int64_t step);
// `step`: the snapshot the answer lays out (-1: not sent).
AgentRequest PlanRequest(int rank, bool client_parity = false, int64_t step = -1);
// AOR (docs/reft.md section 5): the rank's flat gradient buffer is
// registered with the optimizer's encoding (raw bytes; hex on the wire);
// each step's slices are staged and the agent brings its replicas forward;
// the rank's own shard checksum after each step.
AgentRequest AorRegisterRequest(int rank, std::string_view optimizer_encoding, uint64_t numel);
// lr: NaN = the optimizer's own schedule.
AgentRequest AorCaptureRequest(int rank, int64_t step, float lr);
AgentRequest AorChecksumRequest(int rank, int64_t step, uint64_t checksum);
// The raw bytes of an aor_register request's "optimizer" (hex checked by
// the parser).
std::string OptimizerEncoding(const AgentRequest& request);

// The JSON of a request: "op" and the fields of its op.
nlohmann::json AgentRequestToJson(const AgentRequest& request);

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

// ---- Replies (agent -> client) ----------------------------------------------
//
// A reply is shm::StatusToJson(status) ({"ok": true}, or the error's code and
// message) and, when ok, the fields of its op below. complete, skipped and
// ping answer the status alone. ToJson(...) writes an ok reply; the Parse
// functions read the fields of a reply whose status was ok (StatusFromJson
// first).

struct HelloReply {
  int node = 0;
  std::string root;  // the agent's directory
  int64_t pid = 0;   // the agent's process id
};
struct SealReply {
  std::vector<std::string> paths;  // the rank's slot files, kSlotsPerRank of them
};
struct TargetReply {
  int64_t step = -1;  // the step the cluster restores; -1: none
};
struct VerifyReply {
  Status slot_status;  // the slot's verification result
};
struct VersionEntry {  // one complete slot of a rank
  int64_t step = -1;
  int slot = -1;
  bool intact = false;  // verified against its checksums
  uint64_t bytes = 0;
  std::string error;  // why it is not intact; empty when it is
};
struct ListReply {
  std::vector<VersionEntry> versions;  // newest first
};
struct AssembleReply {
  // A complete whole-tensor (format v1) slot file of the rank at the step,
  // under the agent's root; the client maps it read-only, verifies every
  // chunk, restores from it and removes it.
  std::string path;
  uint64_t bytes = 0;  // its data bytes
};
// plan (docs/reft.md section 1): the byte ranges the rank's T0 slot holds
// under the job's plan. A "not ready" agent (no plan yet: it still waits for
// every rank's inventory) answers Unavailable instead, and the client writes
// whole tensors meanwhile.
struct SaveRange {
  std::string tensor;   // a registered tensor's name
  uint64_t offset = 0;  // bytes of the whole tensor
  uint64_t length = 0;  // > 0, except {name, 0, 0} for a tensor of zero bytes
};
// A parity the rank's copy workers compute (asked with client_parity):
// block `index` (0..f-1 of the f parity blocks) of the stripe's code over k
// data blocks of `block_bytes`; data block i is the concatenation of
// blocks[i]'s ranges of the rank's registered tensors, zero-padded to
// block_bytes. The slot holds it as a parity entry (shm::SlotEntrySpec).
struct PlanParity {
  uint32_t id = 0;       // topo::Parity::id
  bool xor_code = true;  // "code": "xor" (codec::CodeKind::kXor) or "rs"
  int k = 0;             // >= 1
  int f = 0;             // >= 1 (xor: 1)
  int index = 0;         // [0, f)
  uint64_t block_bytes = 0;
  std::vector<std::vector<SaveRange>> blocks;  // k of them, each at most block_bytes long
};
struct PlanReply {
  std::string plan_hash;  // 16 hex digits; "" when the agent has no cluster plan
  // false: whole tensors (sharding off, a single node, or a rank the plan
  // gives every byte of its state); `ranges` is then empty.
  bool sharded = false;
  std::vector<SaveRange> ranges;  // sharded: by tensor (registration order), then offset
  // sharded and asked with client_parity: the parities the rank computes
  // (`ranges` then leave out their stripe inputs). Absent ("parities" not
  // in the reply, as from older agents): none.
  std::vector<PlanParity> parities;
};
// aor_register: the ranges of the flat buffer whose AOR replicas this rank
// feeds (the plan's kAor copies it produces), and the staging file the
// client writes each step's gradient and parameter slices into
// (agent/aor_holder.h: header, then per range `count` gradients and `count`
// parameters, fp32). No ranges: nothing to capture (no plan with AOR, or
// this rank feeds no replica).
struct AorRangeEntry {
  int owner = -1;       // the rank whose optimizer shard the replica is
  uint64_t offset = 0;  // elements of the flat buffer
  uint64_t count = 0;   // > 0
};
struct AorRegisterReply {
  std::string path;  // empty when ranges is empty
  std::vector<AorRangeEntry> ranges;
};
inline constexpr size_t kMaxAorRanges = 1024;

// Most ranges a plan reply may carry (a rank's tensors, each cut a few times).
inline constexpr size_t kMaxPlanRanges = size_t{1} << 20;

nlohmann::json ToJson(const HelloReply& reply);
nlohmann::json ToJson(const SealReply& reply);
nlohmann::json ToJson(const TargetReply& reply);
nlohmann::json ToJson(const VerifyReply& reply);
nlohmann::json ToJson(const ListReply& reply);
nlohmann::json ToJson(const AssembleReply& reply);
nlohmann::json ToJson(const PlanReply& reply);
nlohmann::json ToJson(const AorRegisterReply& reply);

// InvalidArgument naming the op and the field for a reply that lacks a
// field or holds one of the wrong type or range (a seal reply with other
// than kSlotsPerRank paths, a negative pid, a slot other than 0 or 1).
Result<HelloReply> ParseHelloReply(const nlohmann::json& reply);
Result<SealReply> ParseSealReply(const nlohmann::json& reply);
Result<TargetReply> ParseTargetReply(const nlohmann::json& reply);
Result<VerifyReply> ParseVerifyReply(const nlohmann::json& reply);
Result<ListReply> ParseListReply(const nlohmann::json& reply);
// An empty path is refused.
Result<AssembleReply> ParseAssembleReply(const nlohmann::json& reply);
// Also InvalidArgument for a range with an empty tensor name, a zero length at
// an offset other than 0, or an end past 2^64; sharded false with ranges or
// parities; a parity with an unknown code, k, f or index out of range
// (k + f <= 255, xor: f = 1), other than k blocks, a block longer than
// block_bytes, or an id given twice.
Result<PlanReply> ParsePlanReply(const nlohmann::json& reply);
// Also InvalidArgument for a range of count 0 or past 2^64, a negative
// owner, ranges without a path.
Result<AorRegisterReply> ParseAorRegisterReply(const nlohmann::json& reply);

// The slot entries of a sharded plan reply, as the client lays out its T0
// slot (docs/reft.md section 2): one entry per range, in the reply's order
// ({name, 0, 0} is the whole zero-byte tensor); `entry_tensor[i]` is the
// index in `tensors` (the rank's registered tensors) of entry i's tensor.
// InvalidArgument naming the plan and the tensor when a range names a tensor
// that is not in `tensors`.
Result<std::vector<SlotEntrySpec>> PlanEntrySpecs(const PlanReply& reply,
                                                  const std::vector<TensorMeta>& tensors,
                                                  std::vector<size_t>* entry_tensor);

}  // namespace memento::shm
