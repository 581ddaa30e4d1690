#include "opt/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/checksum.h"
#include "opt/encoding.h"

namespace memento::opt {
namespace {
constexpr char kMagic[8] = {'M', 'M', 'O', 'P', 'T', 'I', 'M', '1'};
}  // namespace

std::string EncodeHeader(OptimizerKind kind, size_t num_groups) {
  EncodedHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(h.magic));
  h.version = kEncodingVersion;
  h.kind = static_cast<uint32_t>(kind);
  h.num_groups = num_groups;
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

void AppendGroups(const std::vector<ParamGroup>& groups, std::string* out) {
  for (const ParamGroup& g : groups) {
    EncodedGroup e;
    std::memset(&e, 0, sizeof(e));
    e.offset = g.offset;
    e.count = g.count;
    e.weight_decay = g.weight_decay;
    out->append(reinterpret_cast<const char*>(&e), sizeof(e));
  }
}

Result<std::vector<ParamGroup>> ParseGroups(std::string_view bytes, size_t num_groups) {
  if (num_groups > bytes.size() / sizeof(EncodedGroup) ||
      bytes.size() != num_groups * sizeof(EncodedGroup)) {
    return InvalidArgumentError("optimizer encoding: " + std::to_string(num_groups) +
                                " groups need " +
                                std::to_string(num_groups * sizeof(EncodedGroup)) +
                                " bytes, found " + std::to_string(bytes.size()));
  }
  std::vector<ParamGroup> groups(num_groups);
  for (size_t i = 0; i < num_groups; ++i) {
    EncodedGroup e;
    std::memcpy(&e, bytes.data() + i * sizeof(e), sizeof(e));
    if (e.reserved != 0) {
      return InvalidArgumentError("optimizer encoding: group " + std::to_string(i) +
                                  " has a non-zero reserved word");
    }
    groups[i] = ParamGroup{e.offset, e.count, e.weight_decay};
  }
  return groups;
}

Status SortAndCheckGroups(std::vector<ParamGroup>* groups) {
  std::sort(groups->begin(), groups->end(),
            [](const ParamGroup& a, const ParamGroup& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < groups->size(); ++i) {
    const ParamGroup& g = (*groups)[i];
    const std::string name =
        "group [" + std::to_string(g.offset) + ", +" + std::to_string(g.count) + ")";
    if (g.count == 0) return InvalidArgumentError("optimizer: " + name + " is empty");
    if (g.offset + g.count < g.offset)
      return InvalidArgumentError("optimizer: " + name + " overflows");
    if (!std::isfinite(g.weight_decay)) {
      return InvalidArgumentError("optimizer: " + name + " has a non-finite weight decay");
    }
    if (i > 0) {
      const ParamGroup& p = (*groups)[i - 1];
      if (p.offset + p.count > g.offset) {
        return InvalidArgumentError("optimizer: " + name + " overlaps group [" +
                                    std::to_string(p.offset) + ", +" + std::to_string(p.count) +
                                    ")");
      }
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Optimizer>> DecodeOptimizer(std::string_view bytes) {
  if (bytes.size() < sizeof(EncodedHeader)) {
    return InvalidArgumentError("optimizer encoding: " + std::to_string(bytes.size()) +
                                " bytes, shorter than its " +
                                std::to_string(sizeof(EncodedHeader)) + "-byte header");
  }
  EncodedHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return InvalidArgumentError("optimizer encoding: bad magic (not an encoded optimizer)");
  }
  if (h.version != kEncodingVersion) {
    return InvalidArgumentError("optimizer encoding: version " + std::to_string(h.version) +
                                ", this build reads version " + std::to_string(kEncodingVersion));
  }
  std::string_view body = bytes.substr(sizeof(h));
  switch (static_cast<OptimizerKind>(h.kind)) {
    case OptimizerKind::kAdamW:
      return DecodeAdamW(body, h.num_groups);
  }
  return InvalidArgumentError("optimizer encoding: unknown optimizer kind " +
                              std::to_string(h.kind) + " (known: 1 = adamw)");
}

Status CheckShard(const Shard& shard, int num_state, bool need_grads) {
  const std::string name =
      "shard [" + std::to_string(shard.offset) + ", +" + std::to_string(shard.count) + ")";
  if (shard.offset + shard.count < shard.offset) {
    return InvalidArgumentError("optimizer: " + name + " overflows");
  }
  if (shard.state.size() != static_cast<size_t>(num_state)) {
    return InvalidArgumentError("optimizer: " + name + " has " +
                                std::to_string(shard.state.size()) +
                                " state buffers, the optimizer needs " + std::to_string(num_state));
  }
  if (shard.count == 0) return Status::Ok();
  if (shard.params == nullptr)
    return InvalidArgumentError("optimizer: " + name + ": params is null");
  if (need_grads && shard.grads == nullptr) {
    return InvalidArgumentError("optimizer: " + name + ": grads is null");
  }
  for (size_t k = 0; k < shard.state.size(); ++k) {
    if (shard.state[k] == nullptr) {
      return InvalidArgumentError("optimizer: " + name + ": state buffer " + std::to_string(k) +
                                  " is null");
    }
  }
  return Status::Ok();
}

uint64_t ShardChecksumOfHashes(uint64_t offset, uint64_t count, const uint64_t* params_hash,
                               const uint64_t* state_hashes, int num_state) {
  // offset, count, params included, params hash, then the state hashes.
  constexpr int kInline = 16;
  uint64_t inline_words[kInline];
  std::vector<uint64_t> heap;
  const size_t n = 4 + static_cast<size_t>(num_state);
  uint64_t* w = inline_words;
  if (n > kInline) {
    heap.resize(n);
    w = heap.data();
  }
  w[0] = offset;
  w[1] = count;
  w[2] = params_hash != nullptr ? 1 : 0;
  w[3] = params_hash != nullptr ? *params_hash : 0;
  for (int k = 0; k < num_state; ++k) w[4 + k] = state_hashes[k];
  return Checksum(w, n * sizeof(uint64_t));
}

uint64_t ShardChecksum(uint64_t offset, uint64_t count, const float* params,
                       const std::vector<const float*>& state) {
  const size_t bytes = count * sizeof(float);
  std::vector<uint64_t> hashes(state.size());
  for (size_t k = 0; k < state.size(); ++k) hashes[k] = Checksum(state[k], bytes);
  if (params == nullptr) {
    return ShardChecksumOfHashes(offset, count, nullptr, hashes.data(),
                                 static_cast<int>(hashes.size()));
  }
  const uint64_t ph = Checksum(params, bytes);
  return ShardChecksumOfHashes(offset, count, &ph, hashes.data(), static_cast<int>(hashes.size()));
}

uint64_t ShardChecksum(const Shard& shard) {
  std::vector<const float*> state(shard.state.begin(), shard.state.end());
  return ShardChecksum(shard.offset, shard.count, shard.params, state);
}

}  // namespace memento::opt
