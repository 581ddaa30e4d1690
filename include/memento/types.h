// Vocabulary types shared by every layer: dtypes, state classes, devices and the
// description of one registered tensor. See ../shared/DESIGN.md, "Vocabulary".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"

namespace memento {

// Element type of a tensor. The numeric values are part of the on-disk and
// shared-memory formats: never renumber, only append.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt16 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kBool = 9,
};

// Bytes per element (1 for kBool).
size_t DTypeSize(DType dtype);
// Safetensors spelling: "F32", "F16", "BF16", "F64", "I8", "U8", "I16", "I32", "I64", "BOOL".
std::string_view DTypeName(DType dtype);
// Accepts the safetensors spelling and the lower-case PyTorch spelling ("float32").
Result<DType> ParseDType(std::string_view name);

// How training itself replicates a piece of state (DESIGN.md, "state class").
// Numeric values are part of the formats.
enum class StateClass : uint8_t {
  kReplicated = 0,  // identical on every DP rank of one (pp, tp) position
  kDpSharded = 1,   // each DP rank holds 1/D (ZeRO-1 optimizer state)
  kPrivate = 2,     // one rank only (RNG, data cursor, step counters)
};

std::string_view StateClassName(StateClass cls);  // "replicated", "dp_sharded", "private"
Result<StateClass> ParseStateClass(std::string_view name);

enum class DeviceType : uint8_t { kHost = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kHost;
  int index = 0;  // CUDA device ordinal; 0 for host

  static Device Host() { return Device{}; }
  static Device Cuda(int index) { return Device{DeviceType::kCuda, index}; }
  bool is_host() const { return type == DeviceType::kHost; }
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

std::string DeviceName(Device device);  // "cpu", "cuda:0"

// Metadata of one registered tensor or opaque blob (no address). A blob is a
// tensor of dtype kUInt8 and shape {nbytes}.
struct TensorMeta {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  StateClass state_class = StateClass::kReplicated;
  // For kDpSharded state (ZeRO-1): the unsharded tensor, flattened, has
  // global_numel elements and this rank holds [shard_offset, shard_offset +
  // numel()). Lets the durable tier reshard to another DP size. Both 0 when
  // unknown or not sharded.
  int64_t global_numel = 0;
  int64_t shard_offset = 0;

  // Product of shape (1 for a scalar, shape {}).
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
           a.state_class == b.state_class && a.global_numel == b.global_numel &&
           a.shard_offset == b.shard_offset;
  }
};

// "[4096, 1024]".
std::string ShapeToString(const std::vector<int64_t>& shape);

// Training phases reported by the trainer (HAS uses idle windows: pipeline
// bubbles, waits on activations or gradients).
enum class Phase : uint8_t { kCompute = 0, kIdle = 1, kCommunicate = 2 };

// Per-snapshot statistics, filled when the snapshot completes.
struct SnapshotStats {
  int64_t step = -1;
  uint64_t bytes = 0;
  double copy_s = 0;               // wall time from Snapshot() to the slot being complete
  double fence_wait_s = 0;         // time Fence() blocked the trainer for this snapshot
  uint64_t bytes_idle = 0;         // HAS layer 1 (inside idle windows)
  uint64_t bytes_compute = 0;      // HAS layer 2 (beside computation)
  uint64_t bytes_communicate = 0;  // HAS layer 3
  // The part of bytes_compute copied while Fence() was already waiting
  // (training stood still): eager, copied by the trainer thread helping in
  // Fence(); HAS, released only once Fence() waited. idle + compute +
  // communicate == bytes always; bytes_fence is not a fourth layer.
  uint64_t bytes_fence = 0;
  // CPU time the copy workers spent on this snapshot (CLOCK_THREAD_CPUTIME_ID
  // of the threads that copied and hashed its chunks, the slot completion and
  // the agent notification included). Chunks the training thread copied
  // itself in Fence() are not in it (they are in fence_wait_s).
  double copy_cpu_s = 0;
  // Cluster mode (docs/cluster.md): this step was not written because the
  // only slot it could take holds a newer-than-committed version the agent is
  // still protecting (making its redundancy or waiting for its commit). A
  // skipped snapshot is a success: the step simply does not become a version.
  bool skipped = false;
  uint64_t skipped_total = 0;  // snapshots skipped since Connect()
  // Cluster mode, commit lag (docs/cluster.md, "Commit lag"): the newest
  // committed step when Snapshot(step) was called (the agent's commit word;
  // -1 before the first commit and in single-node mode), and for a version
  // that call saw committed for the first time, the Snapshot() calls
  // (commit_lag_steps = step - that version's step) and seconds since that
  // version's own Snapshot(); -1 when the call saw no new commit.
  int64_t committed = -1;
  int64_t commit_lag_steps = -1;
  double commit_lag_s = -1;
};

}  // namespace memento
