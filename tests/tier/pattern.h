// Deterministic test state for the durable-tier integration tests: the bytes
// of every tensor of version `step` are a function of (step, tensor), so a
// checker in another process can tell a torn or mixed version from a sound one.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "memento/types.h"
#include "tier/env.h"
#include "tier/reader.h"
#include "tier/version_view.h"

namespace memento::tier::testing {

inline void FillPattern(uint8_t* p, size_t n, uint64_t step, uint64_t tensor) {
  uint64_t x = (step + 1) * 0x9E3779B97F4A7C15ull ^ (tensor + 1) * 0xC2B2AE3D27D4EB4Full;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
}

// Two nodes; a replicated weight split between them (page-aligned: zero-copy
// path), a ZeRO-1 optimizer tensor sharded over DP=2, and an odd-sized blob
// per node (copy path).
struct PatternJob {
  static constexpr int kNodes = 2;
  static constexpr int64_t kWeightElems = 768 * 1024;  // F32, 3 MiB
  static constexpr int64_t kOptimElems = 300001;       // F32, ~1.2 MiB
  static constexpr int64_t kBlobBytes = 4099;

  uint64_t step;
  AlignedBuffer weight{kWeightElems * 4};
  std::vector<uint8_t> optim = std::vector<uint8_t>(kOptimElems * 4);
  std::vector<uint8_t> blob[kNodes];

  explicit PatternJob(uint64_t s) : step(s) {
    FillPattern(weight.data(), kWeightElems * 4, s, 0);
    FillPattern(optim.data(), optim.size(), s, 1);
    for (int n = 0; n < kNodes; ++n) {
      blob[n].resize(kBlobBytes);
      FillPattern(blob[n].data(), kBlobBytes, s, 2 + n);
    }
  }

  static TensorMeta WeightMeta() {
    TensorMeta m;
    m.name = "layers.0.weight";
    m.dtype = DType::kFloat32;
    m.shape = {768, 1024};
    return m;
  }
  static TensorMeta OptimMeta(int rank, int dp) {
    int64_t per = (kOptimElems + dp - 1) / dp;
    int64_t b = std::min<int64_t>(kOptimElems, per * rank);
    int64_t e = std::min<int64_t>(kOptimElems, b + per);
    TensorMeta m;
    m.name = "optim.exp_avg";
    m.dtype = DType::kFloat32;
    m.shape = {e - b};
    m.state_class = StateClass::kDpSharded;
    m.global_numel = kOptimElems;
    m.shard_offset = b;
    return m;
  }
  static TensorMeta BlobMeta(int node) {
    TensorMeta m;
    m.name = "rank" + std::to_string(node) + "/rng";
    m.dtype = DType::kUInt8;
    m.shape = {kBlobBytes};
    m.state_class = StateClass::kPrivate;
    return m;
  }

  VersionView View(int node) const {
    VersionView v;
    v.job = "pattern-job";
    v.node = node;
    v.num_nodes = kNodes;
    v.step = static_cast<int64_t>(step);
    v.topology_json = R"({"dp":2,"tp":1,"pp":1,"zero":1})";
    const uint64_t half = kWeightElems * 4 / 2;
    v.entries.push_back(ViewEntry{WeightMeta(), node * half, half, weight.data() + node * half});
    TensorMeta om = OptimMeta(node, kNodes);
    v.entries.push_back(ViewEntry{om, 0, om.nbytes(), optim.data() + om.shard_offset * 4});
    v.entries.push_back(ViewEntry{BlobMeta(node), 0, kBlobBytes, blob[node].data()});
    return v;
  }
};

// Restores everything of version `step` (optimizer state re-cut for `dp`
// ranks) and compares with the pattern. Returns a description of the first
// difference, or "" when the version is exactly version `step`.
inline std::string CheckPatternVersion(Env* env, const std::string& root, int64_t step, int dp) {
  PatternJob want(static_cast<uint64_t>(step));
  std::vector<uint8_t> weight(PatternJob::kWeightElems * 4);
  std::vector<std::vector<uint8_t>> optim(dp);
  std::vector<std::vector<uint8_t>> blob(PatternJob::kNodes);
  std::vector<RestoreTarget> targets;
  targets.push_back(RestoreTarget{PatternJob::WeightMeta(), weight.data()});
  for (int r = 0; r < dp; ++r) {
    TensorMeta m = PatternJob::OptimMeta(r, dp);
    optim[r].resize(m.nbytes());
    if (m.nbytes() > 0) targets.push_back(RestoreTarget{m, optim[r].data()});
  }
  for (int n = 0; n < PatternJob::kNodes; ++n) {
    blob[n].resize(PatternJob::kBlobBytes);
    targets.push_back(RestoreTarget{PatternJob::BlobMeta(n), blob[n].data()});
  }
  auto rep = Restore(env, root, step, targets);
  if (!rep.ok()) return rep.status().ToString();
  if (std::memcmp(weight.data(), want.weight.data(), weight.size()) != 0) return "weight differs";
  for (int r = 0; r < dp; ++r) {
    TensorMeta m = PatternJob::OptimMeta(r, dp);
    if (m.nbytes() > 0 &&
        std::memcmp(optim[r].data(), want.optim.data() + m.shard_offset * 4, m.nbytes()) != 0) {
      return "optimizer shard " + std::to_string(r) + " differs";
    }
  }
  for (int n = 0; n < PatternJob::kNodes; ++n) {
    if (blob[n] != want.blob[n]) return "blob of node " + std::to_string(n) + " differs";
  }
  return "";
}

}  // namespace memento::tier::testing
