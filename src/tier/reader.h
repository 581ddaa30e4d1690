// Reading the durable tier: listing versions, finding the newest complete one,
// and restoring tensors (optionally into another DP size / shard geometry).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"
#include "tier/env.h"
#include "tier/format.h"

namespace memento::tier {

struct VersionSummary {
  int64_t step = 0;
  std::string dir;              // absolute path of the version directory
  bool complete = false;        // COMMIT present and parseable, naming this step
  std::string state;            // "complete", or why not ("no COMMIT marker (incomplete write)")
  std::vector<int> nodes_done;  // nodes whose node-N.done marker is present
};

// Every version directory under `root`, oldest first. Cheap: reads COMMIT
// markers only (use Verify for a full check). An absent `root` lists nothing.
[[nodiscard]] Result<std::vector<VersionSummary>> ListVersions(Env* env, const std::string& root);

// The newest complete version under `root`; NotFound when there is none.
[[nodiscard]] Result<int64_t> LatestCompleteVersion(Env* env, const std::string& root);

// The index of a complete version, checked against its COMMIT marker (size and
// xxHash3). NotFound when the version has no COMMIT: it does not exist.
[[nodiscard]] Result<VersionIndex> LoadIndex(Env* env, const std::string& root, int64_t step);

// One destination of a restore: bytes [offset, offset + length) of the rank's
// tensor `meta` (the whole tensor by default) land at `data`.
//
// Resharding: for kDpSharded state with meta.global_numel > 0 the rank's
// tensor is the slice at element meta.shard_offset of the global tensor, so a
// job with another DP size names its own slices and gets them re-cut from the
// stored pieces. Other tensors are matched by name; a different PP split
// restores as long as every tensor exists whole under the same name (layer
// boundaries unchanged).
//
// TP re-cut: a target with `tp` set is slice tp of the global tensor; it is
// cut from whatever slices the version stores (another TP degree), or from
// the whole tensor when it was saved unsplit. A target without `tp` whose
// shape is the global shape gets the whole tensor assembled from the stored
// slices (TP 1). A re-cut target is restored whole (offset 0, full length).
struct RestoreTarget {
  RestoreTarget() = default;
  RestoreTarget(TensorMeta meta, void* data, uint64_t offset = 0, uint64_t length = UINT64_MAX)
      : meta(std::move(meta)), data(data), offset(offset), length(length) {}

  TensorMeta meta;
  void* data = nullptr;  // not owned; meta.nbytes() (or length) bytes
  uint64_t offset = 0;
  uint64_t length = UINT64_MAX;  // UINT64_MAX: to the end of the tensor
  TpSlice tp;
  // >= 0: meta.name is rank `rank`'s own name for the tensor (as it
  // registered it), resolved with RankTensorName: "rank<R>/<name>", a shared
  // copy whose `ranks` list R, or the plain name. -1: meta.name is the stored
  // name as is.
  int rank = -1;
};

struct RestoreOptions {
  bool direct_io = true;  // O_DIRECT reads: a cold read, no page-cache pollution
  size_t chunk_bytes = 8 << 20;
  // Read and check every needed piece before writing any destination (costs a
  // second read). Without it a checksum failure is still reported, but
  // destinations may already hold some bytes.
  bool verify_before_write = false;
};

struct RestoreReport {
  int64_t step = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_restored = 0;
  double seconds = 0;
};

// Fills every target from version `step` (the newest complete one when
// nullopt). Before reading any data all targets are checked against the index;
// if any tensor is missing, has another dtype or shape, or has bytes no stored
// piece covers, nothing is written and the error lists every problem
// (NotFound / InvalidArgument). A piece that fails its checksum is DataLoss.
[[nodiscard]] Result<RestoreReport> Restore(Env* env, const std::string& root,
                                            std::optional<int64_t> step,
                                            const std::vector<RestoreTarget>& targets,
                                            const RestoreOptions& options = {});

}  // namespace memento::tier

namespace memento::tier::internal {

// Reads the bytes of piece `p` from `file` in chunks through `buffer` (aligned,
// its size is the chunk size), calls `sink(tensor_offset, bytes, len)` for each
// chunk in order, and checks the piece's checksum at the end (DataLoss naming
// `what` on mismatch or a short file). Adds the bytes read to *bytes_read.
template <typename Sink>
Status ReadPiece(RandomAccessFile* file, const PieceRecord& p, AlignedBuffer* buffer,
                 const std::string& what, Sink&& sink, uint64_t* bytes_read);

}  // namespace memento::tier::internal

#include "tier/reader_inl.h"
