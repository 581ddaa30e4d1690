// The one JSON codec of TensorMeta (include/memento/types.h), shared by every
// record that carries a tensor description:
//   - a rank's inventory in the coordination store (/memento/<job>/inventory/<rank>,
//     written by its agent, read by agents and the launcher), a JSON array;
//   - a slot's manifest (src/shm/slot.h), which adds "offset" and "nbytes".
//
//   {"name": "w", "dtype": "F32", "shape": [4, 2], "state_class": "replicated",
//    "global_numel": 0, "shard_offset": 0}
//
// "global_numel" and "shard_offset" may be absent (0). Tested in
// src/common/tensor_json_test.cc.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"
#include "memento/types.h"

namespace memento {

nlohmann::json TensorMetaToJson(const TensorMeta& meta);
// InvalidArgument naming the missing or mistyped field (or the unknown dtype /
// state class) when `j` is not a tensor description.
[[nodiscard]] Result<TensorMeta> TensorMetaFromJson(const nlohmann::json& j);

// A JSON array of tensor descriptions.
nlohmann::json TensorListToJson(const std::vector<TensorMeta>& tensors);
// Accepts the array, or an object {"tensors": [...]}. InvalidArgument naming
// the entry when one is not a tensor description.
[[nodiscard]] Result<std::vector<TensorMeta>> TensorListFromJson(const nlohmann::json& j);
// The same, from text; InvalidArgument when the text is not JSON.
[[nodiscard]] Result<std::vector<TensorMeta>> ParseTensorList(std::string_view text);

}  // namespace memento
