// On-disk layout of the durable tier (docs/durable_tier.md has the full
// description):
//
//   ROOT/version-00000000000000000042/      one directory per version (step)
//     node-00000.safetensors                node 0's bytes, safetensors layout
//     node-00000.json                       node 0's manifest (what the file holds)
//     node-00000.done                       node 0's marker (manifest checksum)
//     ...                                   the same for every other node
//     index.json                            the version index (merged manifests)
//     COMMIT                                the version's commit marker
//
// A version exists only when COMMIT exists and names an index whose size and
// xxHash3 match. COMMIT is written last (temp name, fsync, rename, fsync dir).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"

namespace memento::tier {

// Bump when the layout changes incompatibly; readers refuse newer versions.
// Version 1 is written unless a version holds tensor-parallel slices
// (TensorRecord::split_dim >= 0): those indexes say 2, so that a reader that
// would take a slice-local offset for a global one refuses them.
inline constexpr int kFormatVersion = 1;
inline constexpr int kFormatVersionTpSlices = 2;
inline constexpr int kMaxFormatVersion = 2;

// Tensor-parallel geometry (Megatron-LM): a rank's tensor is the slice
// [begin, end) along dimension `dim` of a global tensor of shape
// `global_shape`. Column-parallel weights ([out, in]) are split on dim 0,
// row-parallel ones on dim 1, column-parallel biases on dim 0. dim < 0: the
// tensor is not split.
struct TpSlice {
  int dim = -1;
  std::vector<int64_t> global_shape;
  int64_t begin = 0;
  int64_t end = 0;

  bool split() const { return dim >= 0; }
  // Part `tp_rank` of an even split into `tp_size` parts (the last part takes
  // the remainder when the size does not divide).
  static TpSlice Even(std::vector<int64_t> global_shape, int dim, int tp_rank, int tp_size);
  // global_shape with dimension `dim` replaced by end - begin.
  std::vector<int64_t> LocalShape() const;
};
// InvalidArgument (naming `name`) unless `s` is a valid slice whose local
// shape is `local_shape`.
[[nodiscard]] Status CheckTpSlice(const TpSlice& s, const std::vector<int64_t>& local_shape,
                                  const std::string& name);
inline constexpr char kIndexFileName[] = "index.json";
inline constexpr char kCommitFileName[] = "COMMIT";

std::string VersionDirName(int64_t step);  // "version-00000000000000000042"
// The step of a version directory name, or nullopt for any other name.
std::optional<int64_t> ParseVersionDirName(const std::string& name);
std::string NodeDataFileName(int node);  // "node-00003.safetensors"
std::string NodeManifestName(int node);  // "node-00003.json"
std::string NodeMarkerName(int node);    // "node-00003.done"

// xxHash3 values are written as 16 hex digits (JSON numbers lose bits > 2^53).
std::string HexU64(uint64_t v);
Result<uint64_t> ParseHexU64(const std::string& s);

// One stored byte range of a tensor.
struct PieceRecord {
  std::string key;             // its tensor name in the safetensors header
  int node = 0;                // the node that wrote it
  std::string file;            // data file, relative to the version directory
  uint64_t file_offset = 0;    // absolute byte offset in `file`
  uint64_t tensor_offset = 0;  // byte offset in the logical tensor
  uint64_t length = 0;
  uint64_t xxh3 = 0;  // Checksum() of the piece's bytes
  // TP-split tensors only (TensorRecord::split_dim >= 0): the piece is bytes
  // [tensor_offset, tensor_offset + length) of the slice [slice_begin,
  // slice_end) along split_dim, laid out as that slice's own (local) tensor.
  int64_t slice_begin = 0;
  int64_t slice_end = 0;
};

// A logical tensor: for kDpSharded state with a known global size this is the
// whole flattened tensor (shape {global_numel}) assembled from every DP rank's
// shard; otherwise the tensor as registered.
struct TensorRecord {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  StateClass state_class = StateClass::kReplicated;
  bool global = false;  // kDpSharded stored in global coordinates
  // >= 0: a tensor-parallel tensor, `shape` is the global (unsplit) shape and
  // every piece names its slice along this dimension (format version 2).
  int split_dim = -1;
  uint64_t nbytes = 0;  // logical size (the global tensor's for a TP tensor)
  // Node-local versions (agent without --store): the ranks whose tensor of
  // this name these bytes are, proved equal when the version was written
  // (same meta, same chunk checksums). "ranks" in the JSON, absent when empty:
  // cluster versions and versions written before the field existed, whose
  // shared replicated names were NOT checked (see RankTensorName).
  std::vector<int> ranks;
  std::vector<PieceRecord> pieces;
};

struct NodeRecord {
  int node = 0;
  std::string file;  // data file
  uint64_t file_size = 0;
  std::string manifest;  // manifest file
};

// The index of a version (index.json) and also a node's manifest (the same
// structure restricted to one node).
struct VersionIndex {
  int format_version = kFormatVersion;
  std::string job;
  int64_t step = 0;
  int num_nodes = 1;
  std::string topology_json = "{}";
  int64_t created_unix_ns = 0;
  std::vector<NodeRecord> nodes;
  std::map<std::string, TensorRecord> tensors;

  uint64_t stored_bytes() const;
};

std::string SerializeIndex(const VersionIndex& index);
// Errors name what is wrong (DataLoss for malformed text).
Result<VersionIndex> ParseIndex(const std::string& text, const std::string& what);

// Adds `part`'s nodes and pieces to `into`. Fails when the same tensor is
// described differently (dtype, shape, size, state class) by two nodes.
Status MergeIndex(const VersionIndex& part, VersionIndex* into);

// Node-local names. A rank's own copy of tensor `name`: "rank<R>/<name>".
std::string RankScopedName(int rank, const std::string& name);

// The stored tensor that holds rank `rank`'s tensor `name` in `index`
// (docs/durable_tier.md, "Names"):
//  1. "rank<R>/<name>" when stored;
//  2. a "rank<X>/<name>" whose `ranks` lists R (ranks with equal bytes share
//     the lowest one's copy);
//  3. "<name>" when its `ranks` lists R, or when it has no `ranks` and the
//     version is not a node-local one with several ranks (cluster versions,
//     single-rank nodes, tests);
// NotFound when none holds it. FailedPrecondition for a node-local version
// written before `ranks` existed, for any rank but the node's lowest: that
// writer stored a replicated tensor once per node from the lowest rank
// without checking that the other ranks (other pipeline stages or TP
// positions) held the same bytes, so the copy cannot be trusted for them.
[[nodiscard]] Result<std::string> RankTensorName(const VersionIndex& index, int rank,
                                                 const std::string& name);

// A node's marker (node-N.done): its part of the version is durable.
struct NodeMarker {
  int node = 0;
  int64_t step = 0;
  uint64_t epoch = 0;
  std::string file;
  uint64_t file_size = 0;
  std::string manifest;
  uint64_t manifest_size = 0;
  uint64_t manifest_xxh3 = 0;
};
std::string SerializeNodeMarker(const NodeMarker& m);
Result<NodeMarker> ParseNodeMarker(const std::string& text, const std::string& what);

// The version's commit marker (COMMIT).
struct CommitRecord {
  int format_version = kFormatVersion;
  int64_t step = 0;
  std::string index = kIndexFileName;
  uint64_t index_size = 0;
  uint64_t index_xxh3 = 0;
  std::vector<std::string> files;  // data files of every node
};
std::string SerializeCommit(const CommitRecord& c);
Result<CommitRecord> ParseCommit(const std::string& text, const std::string& what);

}  // namespace memento::tier
