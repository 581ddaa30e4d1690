// The byte encoding of an optimizer's configuration (Optimizer::Encode,
// DecodeOptimizer): a fixed header, the kind's parameters, then the groups.
// Little-endian raw structs, versioned; internal to src/opt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"
#include "opt/optimizer.h"

namespace memento::opt {

enum class OptimizerKind : uint32_t { kAdamW = 1 };

struct EncodedHeader {
  char magic[8];  // "MMOPTIM1"
  uint32_t version;
  uint32_t kind;  // OptimizerKind
  uint64_t num_groups;
};
static_assert(sizeof(EncodedHeader) == 24, "EncodedHeader is a wire struct");

struct EncodedAdamW {
  float lr, min_lr;
  int32_t warmup_steps, decay_steps;
  float beta1, beta2, eps, weight_decay;
};
static_assert(sizeof(EncodedAdamW) == 32, "EncodedAdamW is a wire struct");

struct EncodedGroup {
  uint64_t offset;
  uint64_t count;
  float weight_decay;
  uint32_t reserved;  // 0
};
static_assert(sizeof(EncodedGroup) == 24, "EncodedGroup is a wire struct");

constexpr uint32_t kEncodingVersion = 1;

std::string EncodeHeader(OptimizerKind kind, size_t num_groups);
void AppendGroups(const std::vector<ParamGroup>& groups, std::string* out);
// Exactly num_groups groups in `bytes` (no trailing bytes).
Result<std::vector<ParamGroup>> ParseGroups(std::string_view bytes, size_t num_groups);
// Sorts by offset; InvalidArgument on an empty, overflowing, non-finite or
// overlapping group.
Status SortAndCheckGroups(std::vector<ParamGroup>* groups);

Result<std::unique_ptr<Optimizer>> DecodeAdamW(std::string_view body, size_t num_groups);

}  // namespace memento::opt
