#include "memento/types.h"

#include <string>

namespace memento {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kInt8:
      return 1;
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat64:
      return "F64";
    case DType::kInt8:
      return "I8";
    case DType::kUInt8:
      return "U8";
    case DType::kInt16:
      return "I16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  struct Entry {
    std::string_view a, b;
    DType dtype;
  };
  static constexpr Entry kTable[] = {
      {"F32", "float32", DType::kFloat32},    {"F16", "float16", DType::kFloat16},
      {"BF16", "bfloat16", DType::kBFloat16}, {"F64", "float64", DType::kFloat64},
      {"I8", "int8", DType::kInt8},           {"U8", "uint8", DType::kUInt8},
      {"I16", "int16", DType::kInt16},        {"I32", "int32", DType::kInt32},
      {"I64", "int64", DType::kInt64},        {"BOOL", "bool", DType::kBool},
  };
  for (const Entry& e : kTable) {
    if (name == e.a || name == e.b) return e.dtype;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) +
                              "' (expected F32, F16, BF16, F64, I8, U8, I16, I32, I64 or BOOL)");
}

std::string_view StateClassName(StateClass cls) {
  switch (cls) {
    case StateClass::kReplicated:
      return "replicated";
    case StateClass::kDpSharded:
      return "dp_sharded";
    case StateClass::kPrivate:
      return "private";
  }
  return "?";
}

Result<StateClass> ParseStateClass(std::string_view name) {
  if (name == "replicated") return StateClass::kReplicated;
  if (name == "dp_sharded") return StateClass::kDpSharded;
  if (name == "private") return StateClass::kPrivate;
  return InvalidArgumentError("unknown state class '" + std::string(name) +
                              "' (expected replicated, dp_sharded or private)");
}

std::string DeviceName(Device device) {
  if (device.is_host()) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace memento
