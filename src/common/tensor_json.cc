#include "common/tensor_json.h"

#include <utility>

namespace memento {

using nlohmann::json;

json TensorMetaToJson(const TensorMeta& m) {
  return {{"name", m.name},
          {"dtype", std::string(DTypeName(m.dtype))},
          {"shape", m.shape},
          {"state_class", std::string(StateClassName(m.state_class))},
          {"global_numel", m.global_numel},
          {"shard_offset", m.shard_offset}};
}

Result<TensorMeta> TensorMetaFromJson(const json& j) {
  if (!j.is_object()) {
    return InvalidArgumentError("tensor description is not a JSON object: " + j.dump());
  }
  TensorMeta m;
  try {
    m.name = j.at("name").get<std::string>();
    MEMENTO_ASSIGN_OR_RETURN(m.dtype, ParseDType(j.at("dtype").get<std::string>()));
    m.shape = j.at("shape").get<std::vector<int64_t>>();
    MEMENTO_ASSIGN_OR_RETURN(m.state_class,
                             ParseStateClass(j.at("state_class").get<std::string>()));
    m.global_numel = j.value("global_numel", int64_t{0});
    m.shard_offset = j.value("shard_offset", int64_t{0});
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("malformed tensor description: ") + e.what());
  }
  return m;
}

json TensorListToJson(const std::vector<TensorMeta>& tensors) {
  json arr = json::array();
  for (const TensorMeta& m : tensors) arr.push_back(TensorMetaToJson(m));
  return arr;
}

Result<std::vector<TensorMeta>> TensorListFromJson(const json& j) {
  const json& list = j.is_object() && j.contains("tensors") ? j.at("tensors") : j;
  if (!list.is_array()) return InvalidArgumentError("tensor list is not a JSON array");
  std::vector<TensorMeta> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    Result<TensorMeta> m = TensorMetaFromJson(list[i]);
    if (!m.ok()) {
      return InvalidArgumentError("tensor list entry " + std::to_string(i) + ": " +
                                  m.status().message());
    }
    out.push_back(std::move(*m));
  }
  return out;
}

Result<std::vector<TensorMeta>> ParseTensorList(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgumentError("tensor list is not JSON: " + std::string(text.substr(0, 200)));
  }
  return TensorListFromJson(j);
}

}  // namespace memento
