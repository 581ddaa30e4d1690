// Placement planner: for a hybrid-parallel topology, which node snapshots
// which bytes and which redundancy each node holds (REFT 4.1 global parameter
// sharding, REFT 4.2 ARC / AEC / AOR, Gemini group placement, Reed-Solomon
// beyond REFT). Pure functions of (topology, tensor inventory, policy); no I/O.
// See docs/planner.md for the model, the formulas and the JSON form.
//
// Thread safety: all types are plain values; the functions are pure and
// reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"

namespace memento::topo {

// DP x TP x PP, ZeRO stage and the rank -> node map.
// Rank order is Megatron's: rank = (pp_i * dp + dp_i) * tp + tp_i.
struct Topology {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero_stage = 0;                  // 0, 1, or 3 (3: no inherent redundancy)
  std::vector<int> rank_node;          // rank -> node id in [0, num_nodes)
  std::vector<std::string> node_rack;  // node -> failure-domain label ("" = none); may be empty

  int num_ranks() const { return dp * tp * pp; }
  int num_nodes() const;  // 1 + max node id (0 when rank_node is empty)
  int Rank(int dp_i, int tp_i, int pp_i) const { return (pp_i * dp + dp_i) * tp + tp_i; }
  int DpIndex(int rank) const { return (rank / tp) % dp; }
  int TpIndex(int rank) const { return rank % tp; }
  int PpIndex(int rank) const { return rank / (tp * dp); }
  std::string_view Rack(int node) const;

  // Consecutive ranks fill each node: rank r runs on node r / ranks_per_node.
  [[nodiscard]] static Result<Topology> Uniform(int dp, int tp, int pp, int zero_stage,
                                                int ranks_per_node);
  // InvalidArgument naming the bad value when sizes, stage or map are wrong.
  [[nodiscard]] Status Validate() const;
};

// Tensors registered by each rank (index = rank), in registration order.
using Inventory = std::vector<std::vector<TensorMeta>>;

enum class Scheme : uint8_t { kNone, kReplicate, kXor, kRs, kPeer, kAuto };
enum class LocalCopy : uint8_t { kSharded, kFull };

struct Policy {
  Scheme scheme = Scheme::kXor;
  int f = 1;  // kRs: node failures tolerated per sharding group
  int m = 2;  // kPeer: copies (Gemini group size)
  LocalCopy local_copy = LocalCopy::kSharded;
  // kAuto budgets (0 = unlimited): host memory a node may spend on snapshots,
  // the bytes a node may move device -> host per snapshot and the bytes it
  // may receive from peers per snapshot. kAuto itself is resolved by the
  // reliability model (model::MakeJobPlan, src/model/auto_plan.h).
  uint64_t host_bytes_per_node = 0;
  uint64_t copy_bytes_per_node = 0;
  uint64_t network_bytes_per_node = 0;
};

// "none", "replicate", "xor", "rs:2", "peer:3", "auto" (case-sensitive).
[[nodiscard]] Result<Policy> ParsePolicy(std::string_view text);
std::string PolicyName(const Policy& policy);  // inverse of ParsePolicy for the scheme

inline constexpr uint64_t kPieceAlignment = 64;  // piece and block boundaries
inline constexpr uint32_t kNoId = 0xffffffffu;

// A byte range of one tensor of a rank.
struct Segment {
  std::string tensor;
  uint64_t offset = 0;
  uint64_t length = 0;
  friend bool operator==(const Segment& a, const Segment& b) {
    return a.tensor == b.tensor && a.offset == b.offset && a.length == b.length;
  }
};

enum class PieceKind : uint8_t {
  kReplicatedShard = 0,  // 1/n of a sharding group's replicated state (global sharding)
  kDpShard = 1,  // all unique non-private bytes of a rank (ZeRO-1 optimizer shard; ZeRO-3 state)
  kPrivate = 2,  // all private bytes of a rank (RNG, data cursor)
};
std::string_view PieceKindName(PieceKind kind);  // "replicated", "dp_shard", "private"

// The unit that is snapshotted, protected, moved and checked. Its bytes are
// the concatenation of `segments` (read from `rank`'s tensors), `bytes` long.
struct Piece {
  uint32_t id = 0;  // index in Plan::pieces; stable for equal inputs
  std::string key;  // stable readable id: "sg3/r1", "rank17/dp", "rank17/priv"
  PieceKind kind = PieceKind::kReplicatedShard;
  int group = -1;  // sharding group id (kReplicatedShard, kDpShard), -1 otherwise
  int rank = 0;    // the rank that copies these bytes into its node's slot
  int node = 0;    // the node that holds the primary copy
  uint64_t bytes = 0;
  std::vector<Segment> segments;
};

enum class CopyKind : uint8_t {
  kArc = 0,        // REFT ARC: copied from the node's own replica of the state (no network)
  kLocalFull = 1,  // local_copy=full: the node keeps its whole sharding-group state
  kAor = 2,        // REFT AOR: optimizer shard recomputed on the host from local gradients
  kPeer = 3,       // Gemini: sent over the network to a group peer
};
std::string_view CopyKindName(CopyKind kind);  // "arc", "local_full", "aor", "peer"

// A whole copy of a piece held by another node.
struct Copy {
  uint32_t id = 0;
  uint32_t piece = 0;
  int node = 0;
  CopyKind kind = CopyKind::kArc;
  // Rank on `node` whose memory produces the bytes (same segments as the
  // piece, read from this rank's identical tensors); -1 for kPeer (the node's
  // agent receives the bytes from the piece's node).
  int producer_rank = -1;
};

// One data block of a stripe: bytes [offset, offset + length) of a piece,
// zero-padded to the stripe's block_bytes (length may be 0: all zeros).
struct StripeBlock {
  uint32_t piece = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// k data blocks on distinct nodes plus f parity blocks on other distinct
// nodes; any f of the k + f may be lost (codec/erasure_code.h numbering:
// data 0..k-1, parity k..k+f-1).
struct Stripe {
  uint32_t id = 0;
  int group = 0;
  bool xor_code = true;  // codec::CodeKind::kXor, else kRs
  int k = 0;
  int f = 0;
  uint64_t block_bytes = 0;  // multiple of kPieceAlignment
  std::vector<StripeBlock> data;
  std::vector<uint32_t> parities;  // Parity ids, index j = stripe block k + j
};

struct Parity {
  uint32_t id = 0;
  uint32_t stripe = 0;
  int index = 0;  // 0..f-1
  int node = 0;
  int producer_rank = 0;  // rank on `node` whose replicated tensors hold every data block
  uint64_t bytes = 0;     // == stripe block_bytes
};

enum class GroupKind : uint8_t { kShardingGroup = 0, kPeerGroup = 1 };

// A set of nodes whose joint failures the plan bounds.
struct Group {
  int id = 0;
  GroupKind kind = GroupKind::kShardingGroup;
  std::string name;        // "sg3 (pp=0 tp=3)", "peer0"
  int pp = -1, tp = -1;    // sharding groups
  std::vector<int> ranks;  // sharding group: DP ranks in dp order
  std::vector<int> nodes;  // distinct nodes, in placement ring order
  std::string scheme;      // what protects the group's state: "xor", "arc", "rs:2+aor", ...
  int protection = 0;      // node failures inside the group that are always recoverable
  bool carries_data = false;
  std::string note;  // why the level is what it is, in words
};

struct NodePlan {
  int node = 0;
  std::string rack;
  std::vector<int> ranks;
  std::vector<uint32_t> pieces;    // primary pieces
  std::vector<uint32_t> copies;    // Copy ids held here
  std::vector<uint32_t> parities;  // Parity ids held here
  uint64_t piece_bytes = 0;
  uint64_t copy_bytes = 0;
  uint64_t parity_bytes = 0;
  uint64_t network_bytes = 0;  // bytes of kPeer copies received per snapshot
  uint64_t total_bytes() const { return piece_bytes + copy_bytes + parity_bytes; }
};

struct RankPlan {
  int rank = 0;
  int node = 0;
  int group = 0;                   // sharding group
  std::vector<uint32_t> pieces;    // pieces this rank copies into its node's slot
  std::vector<uint32_t> copies;    // copies produced from this rank's memory (arc, local_full, aor)
  std::vector<uint32_t> parities;  // parities computed from this rank's replicated tensors
};

struct Plan {
  Topology topology;
  Policy policy;       // as resolved (kAuto replaced by the choice)
  std::string reason;  // for kAuto: why this scheme
  std::vector<Piece> pieces;
  std::vector<Copy> copies;
  std::vector<Stripe> stripes;
  std::vector<Parity> parities;
  std::vector<Group> groups;  // sharding groups first (id = pp * tp + tp_i), then peer groups
  std::vector<NodePlan> nodes;
  std::vector<RankPlan> ranks;
  int protection = 0;  // min over groups that carry data: any this-many node failures recover
  std::vector<std::string> notes;  // limits and fallbacks, in words
  uint64_t total_state_bytes = 0;  // unique state (sum of piece bytes)
  uint64_t total_held_bytes = 0;   // everything held in host memory by all nodes
};

// Builds the plan. InvalidArgument when the topology or inventory is
// malformed (inventory size != ranks, replicated tensors that differ between
// DP replicas, dp_sharded state under a policy that needs ZeRO-1...), and for
// kAuto: that choice needs the reliability model (model::MakeJobPlan).
[[nodiscard]] Result<Plan> MakePlan(const Topology& topology, const Inventory& inventory,
                                    const Policy& policy);

// The largest per-node figures of a plan, as the kAuto budgets count them:
// host bytes held (NodePlan::total_bytes), device -> host bytes per snapshot
// (pieces, parity, ARC and local_full copies; parity is computed on the device
// and AOR/peer copies do not cross PCIe) and bytes received from peers per
// snapshot (NodePlan::network_bytes).
struct NodeCosts {
  uint64_t host = 0;
  uint64_t copy = 0;
  uint64_t network = 0;
};
NodeCosts MaxNodeCosts(const Plan& plan);

// ---- recovery -----------------------------------------------------------

// One input of a decode: stripe block `index`, read from `node` (a piece
// holder for data blocks, the parity holder for parity blocks). `zero`:
// an empty data block, all zeros, nothing to fetch.
struct BlockSource {
  int index = 0;
  int node = -1;
  uint32_t piece = kNoId;   // data blocks
  uint32_t parity = kNoId;  // parity blocks
  uint64_t offset = 0;      // data blocks: range of the piece
  uint64_t length = 0;
  bool zero = false;
};

struct RecoveryStep {
  enum class Kind : uint8_t { kCopy = 0, kDecode = 1 };
  Kind kind = Kind::kCopy;
  // kCopy: the whole piece from `node` (a Copy held there).
  int node = -1;
  uint32_t copy = kNoId;
  // kDecode: bytes [offset, offset + length) of the piece are block `target`
  // of `stripe`, rebuilt from exactly k `inputs`.
  uint32_t stripe = kNoId;
  int target = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<BlockSource> inputs;
};

struct PieceRecipe {
  uint32_t piece = 0;
  bool recoverable = false;
  std::vector<RecoveryStep> steps;  // empty for a zero-byte piece
  std::string reason;               // why not, when !recoverable
};

struct RecoveryPlan {
  std::vector<int> failed_nodes;     // sorted, unique
  bool recoverable = false;          // every lost piece has a recipe
  std::vector<PieceRecipe> recipes;  // one per piece whose primary node failed
  uint64_t copy_bytes = 0;           // bytes moved by kCopy steps
  uint64_t decode_bytes = 0;         // bytes rebuilt by kDecode steps
};

// Recipes to rebuild every piece whose node failed (the view `memento plan
// --fail` prints) are computed by recover::PlanFailure (src/recover/recover.h)
// with the source planner real recovery uses; these are their types.

}  // namespace memento::topo
