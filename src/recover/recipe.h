// The recipe inside a RankAssembly (recover.h): how every byte of one rank's
// state at one version is obtained. Decide() writes it, ExecuteAssemblies()
// follows it; the JSON form travels in the peer protocol's recover call.
// docs/recovery.md, "Recipe".
//
// A rank's state is the concatenation of plan pieces (topo/plan.h): the
// replicated pieces of its sharding group, its dp_shard piece and its private
// piece. Each piece's bytes scatter into the rank's tensors through the
// piece's segments. A recipe lists one part per non-empty piece:
//   read    the whole piece from one node: its primary (kPiece, the T0 slot of
//           Piece::rank there) or a copy (kCopy) in that node's T1
//   decode  per non-empty stripe block of the piece, exactly k inputs (data
//           block ranges read from a piece or copy, parities, or zeros)
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memento/status.h"
#include "recover/recover.h"
#include "recover/source.h"

namespace memento::recover {

// Bytes [offset, offset + length) of `source` on `node`.
struct SourceRange {
  int node = -1;
  ByteSource source;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One input of a decode: stripe block `index` (codec numbering: data 0..k-1,
// parity k..k+f-1). Data blocks read `range` and are zero-padded to the
// stripe's block_bytes; `zero` marks an empty data block (nothing to read).
struct DecodeInput {
  int index = 0;
  bool zero = false;
  SourceRange range;
};

// Bytes [offset, offset + length) of the piece are stripe block `target`.
struct DecodeBlock {
  uint32_t stripe = 0;
  int target = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<DecodeInput> inputs;  // exactly the stripe's k
};

struct PiecePart {
  enum class Op : uint8_t { kRead = 0, kDecode = 1 };
  uint32_t piece = 0;
  std::string key;  // Piece::key, for logs
  uint64_t bytes = 0;
  Op op = Op::kRead;
  SourceRange read;                 // kRead: [0, bytes) of a kPiece or kCopy source
  std::vector<DecodeBlock> blocks;  // kDecode
};

struct Recipe {
  int64_t step = -1;
  int rank = -1;
  int node = -1;  // where the rank's slot is rebuilt
  std::vector<PiecePart> parts;
};

nlohmann::json RecipeToJson(const Recipe& recipe);
// InvalidArgument naming the field when `j` is not a recipe.
[[nodiscard]] Result<Recipe> RecipeFromJson(const nlohmann::json& j);

// Tuning of the executor (tests shrink the window to exercise splitting).
struct ExecuteOptions {
  uint64_t window_bytes = uint64_t{4} << 20;  // largest single decode unit
  // Largest single read of a whole-piece part (one request, streamed);
  // 0: window_bytes.
  uint64_t read_window_bytes = uint64_t{16} << 20;
  uint64_t chunk_bytes = uint64_t{4} << 20;  // slot chunk size (must match the client's)
  int threads = 4;                           // parallel readers / decoders
  // Decode inputs that are pieces this node fetches whole are taken from the
  // slot (after their reads) instead of being read again.
  bool reuse_fetched_inputs = true;
  // Chunk checksums of the rebuilt slot are taken from the digests the
  // reader checked on arrival where a digest covers exactly one chunk.
  bool reuse_digests = true;
  // The final verification of a rebuilt slot does not hash again the chunks
  // whose checksum came from an arrival digest (their bytes were hashed in
  // place on arrival); false: every chunk is hashed (the full check).
  bool trust_arrival_digests = true;
  // Tests only: runs after every byte and checksum of a rebuilt slot is
  // written, just before it is marked complete and verified (a test corrupts
  // the slot here to show what the verification still catches).
  std::function<void(int rank, const shm::Segment& segment)> before_complete;
  // Restore-time assembly (ExecuteAssembliesWithOptions for the agent's
  // `assemble` op, docs/reft.md section 3): when set, each rank's whole slot
  // is written into a new file at stage_path(rank) (replaced if it exists)
  // instead of a slot of the node store; the store's slots are only read. The
  // staged slot is left complete (slot index 0) with every chunk checksum
  // either the source's (an arrival digest) or computed from bytes verified
  // at their source; it is not verified again here (its reader, the client's
  // restore, verifies every chunk before it writes a byte).
  std::function<std::string(int rank)> stage_path;
};

// The recipe of a restore-time assembly of `rank` at `step` on the rank's
// node: every non-empty piece of the rank's state (its sharding group's
// replicated pieces, its dp_shard and private pieces) read whole from its
// primary, the T0 slot of Piece::rank on Piece::node (this node's own slots
// for local pieces, a peer's over the authenticated transport otherwise).
// InvalidArgument for a rank out of the plan.
[[nodiscard]] Result<Recipe> PrimaryRecipe(const topo::Plan& plan, int rank, int64_t step);

// Checks that the segments of `rank`'s pieces (as PrimaryRecipe lists them)
// tile each tensor of `tensors` exactly: every byte of every tensor in one
// segment, no gap, no overlap, no segment of a tensor the rank lacks.
// FailedPrecondition naming the tensor, the byte range and the piece (and
// its node) otherwise.
[[nodiscard]] Status CheckPiecesTile(const topo::Plan& plan, int rank,
                                     const std::vector<TensorMeta>& tensors);

// ExecuteAssemblies (recover.h) with explicit options.
[[nodiscard]] Result<AssemblyStats> ExecuteAssembliesWithOptions(
    const topo::Plan& plan, const topo::Inventory& inventory, const std::string& job_id,
    int64_t step, const std::vector<RankAssembly>& assemblies, ByteReader& reader,
    shm::NodeStore& store, Deadline deadline, const ExecuteOptions& options);

}  // namespace memento::recover
