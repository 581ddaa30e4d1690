// Addresses of a version's bytes anywhere in the cluster, the inventory an
// agent reports after a failure, and the interface recovery reads bytes
// through. Shared by the agent's peer service (src/agent), the recovery
// planner and executor (src/recover) and the launcher. docs/recovery.md.
//
// Thread safety: plain values; ByteReader implementations say their own.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::recover {

// Where bytes come from on a node (ids are indices into the topo::Plan):
//   kPiece   plan piece `id`: the concatenation of its segments, read from the
//            T0 slot of the piece's rank (Piece::rank) on Piece::node. T0
//            holds each rank's whole state, so any rank with identical
//            replicated tensors could serve it; recovery asks the piece's node.
//   kCopy    plan Copy `id`, held in the redundancy store of Copy::node.
//   kParity  plan Parity `id`, held in the redundancy store of Parity::node.
enum class SourceKind : uint8_t { kPiece = 0, kCopy = 1, kParity = 2 };

struct ByteSource {
  SourceKind kind = SourceKind::kPiece;
  uint32_t id = 0;
};

// Bytes [offset, offset + length) of `source` in version `step`.
struct ReadRequest {
  int64_t step = -1;
  ByteSource source;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// What one node holds of one version (T0 slots and T1 redundancy).
struct VersionHolding {
  int64_t step = -1;
  std::vector<int> ranks;  // ranks whose T0 slot of `step` is complete and verifies
  std::vector<uint32_t>
      copies;  // plan Copy ids complete (checksums verify) in the redundancy store
  std::vector<uint32_t> parities;  // plan Parity ids complete
  // Of `copies`, the kAor copies this node recomputed on the host from its
  // AOR replica (checked against the owner's checksum before the step was
  // reported; docs/reft.md section 5) rather than received over the network.
  std::vector<uint32_t> aor_copies;
};

// An agent's answer to the inventory call.
struct NodeInventory {
  int node = -1;
  std::string endpoint;    // host:port of the node's peer service
  uint64_t plan_hash = 0;  // PlanHash of the plan its redundancy was made under; 0: none yet
  int64_t committed = -1;  // newest step in its CommitLog; -1: none
  std::vector<VersionHolding> versions;  // newest first
};

// Reads bytes of a version from any node (the agent's implementation serves
// its own node from memory and other nodes through their peer service).
class ByteReader {
 public:
  virtual ~ByteReader() = default;
  // Fills dst[0, req.length) from node `node`. NotFound when the node does not
  // hold the bytes, DataLoss when their checksum fails, Unavailable when the
  // node cannot be reached.
  [[nodiscard]] virtual Status Read(int node, const ReadRequest& req, void* dst,
                                    Deadline deadline) = 0;
  // dst[offset, offset + length) of a read hashes to `xxh3` (xxHash3-64),
  // checked against the bytes when they arrived.
  using DigestFn = std::function<void(uint64_t offset, uint64_t length, uint64_t xxh3)>;
  // Read, also reporting digests of delivered byte runs where the reader
  // has them (the agent's reader: the chunk checksums a peer's T0 slot sent
  // along), so the caller need not hash those bytes again. The default
  // reports none. Thread-safety as Read; on_digest runs on the calling
  // thread before this returns.
  [[nodiscard]] virtual Status ReadWithDigests(int node, const ReadRequest& req, void* dst,
                                               Deadline deadline, const DigestFn& on_digest) {
    (void)on_digest;
    return Read(node, req, dst, deadline);
  }
};

// ---- JSON (peer protocol bodies, the store) --------------------------------

inline const char* SourceKindName(SourceKind k) {
  switch (k) {
    case SourceKind::kPiece:
      return "piece";
    case SourceKind::kCopy:
      return "copy";
    case SourceKind::kParity:
      return "parity";
  }
  return "?";
}

inline nlohmann::json ToJson(const ReadRequest& r) {
  return {{"step", r.step},
          {"kind", SourceKindName(r.source.kind)},
          {"id", r.source.id},
          {"offset", r.offset},
          {"length", r.length}};
}

[[nodiscard]] inline Result<ReadRequest> ReadRequestFromJson(const nlohmann::json& j) {
  ReadRequest r;
  if (!j.is_object() || !j.contains("step") || !j.contains("kind") || !j.contains("id") ||
      !j.contains("offset") || !j.contains("length") || !j["step"].is_number_integer() ||
      !j["kind"].is_string() || !j["id"].is_number_unsigned() ||
      !j["offset"].is_number_unsigned() || !j["length"].is_number_unsigned()) {
    return InvalidArgumentError("malformed read request: " + j.dump());
  }
  r.step = j["step"].get<int64_t>();
  const std::string kind = j["kind"].get<std::string>();
  if (kind == "piece") {
    r.source.kind = SourceKind::kPiece;
  } else if (kind == "copy") {
    r.source.kind = SourceKind::kCopy;
  } else if (kind == "parity") {
    r.source.kind = SourceKind::kParity;
  } else {
    return InvalidArgumentError("read request: unknown kind '" + kind + "'");
  }
  r.source.id = j["id"].get<uint32_t>();
  r.offset = j["offset"].get<uint64_t>();
  r.length = j["length"].get<uint64_t>();
  return r;
}

inline nlohmann::json ToJson(const NodeInventory& inv) {
  nlohmann::json versions = nlohmann::json::array();
  for (const VersionHolding& v : inv.versions) {
    nlohmann::json jv = {
        {"step", v.step}, {"ranks", v.ranks}, {"copies", v.copies}, {"parities", v.parities}};
    if (!v.aor_copies.empty()) jv["aor_copies"] = v.aor_copies;
    versions.push_back(std::move(jv));
  }
  return {{"node", inv.node},
          {"endpoint", inv.endpoint},
          {"plan_hash", inv.plan_hash},
          {"committed", inv.committed},
          {"versions", versions}};
}

[[nodiscard]] inline Result<NodeInventory> NodeInventoryFromJson(const nlohmann::json& j) {
  NodeInventory inv;
  try {
    inv.node = j.at("node").get<int>();
    inv.endpoint = j.at("endpoint").get<std::string>();
    inv.plan_hash = j.at("plan_hash").get<uint64_t>();
    inv.committed = j.at("committed").get<int64_t>();
    for (const auto& v : j.at("versions")) {
      VersionHolding h;
      h.step = v.at("step").get<int64_t>();
      h.ranks = v.at("ranks").get<std::vector<int>>();
      h.copies = v.at("copies").get<std::vector<uint32_t>>();
      h.parities = v.at("parities").get<std::vector<uint32_t>>();
      if (v.contains("aor_copies")) h.aor_copies = v.at("aor_copies").get<std::vector<uint32_t>>();
      inv.versions.push_back(std::move(h));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("malformed node inventory: ") + e.what());
  }
  return inv;
}

}  // namespace memento::recover
