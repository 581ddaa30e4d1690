// Reads the fields of a parsed JSON document without exceptions: every read
// checks that the field is there and has the right type (an integer that
// fits the destination, a string, an array of such), records the first
// problem and leaves the destination as it was; status() is then
// InvalidArgument naming the document, the field and what is wrong. Used by
// the decoders that must not throw (src/topo/plan_json.cc,
// src/topo/topology_json.cc). Tests: common_test JsonReaderTest.
//
//   JsonReader r("plan JSON");
//   r.Get(j, "reason", &p.reason);
//   for (const json& e : r.Array(j, "pieces")) { r.Get(e, "id", &x.id); ... }
//   MEMENTO_RETURN_IF_ERROR(r.status());
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memento/status.h"

namespace memento {

namespace json_reader_internal {

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// Whether `v` holds a value of type T (for integers: one that fits T).
template <typename T>
bool Holds(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    if (v.is_number_unsigned()) {
      return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    }
    if (!v.is_number_integer()) return false;
    const int64_t x = v.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      return x >= 0 && static_cast<uint64_t>(x) <= std::numeric_limits<T>::max();
    } else {
      return x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max();
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    return v.is_number();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string();
  } else {
    static_assert(IsVector<T>::value, "JsonReader reads bool, numbers, strings and vectors");
    if (!v.is_array()) return false;
    for (const nlohmann::json& e : v) {
      if (!Holds<typename T::value_type>(e)) return false;
    }
    return true;
  }
}

template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, bool>) {
    return "a boolean";
  } else if constexpr (std::is_integral_v<T>) {
    return std::is_unsigned_v<T> ? "an integer >= 0 that fits" : "an integer that fits";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else {
    return "an array of the right element type";
  }
}

}  // namespace json_reader_internal

class JsonReader {
 public:
  // `what` names the document in messages ("plan JSON").
  explicit JsonReader(std::string what) : what_(std::move(what)) {}

  bool ok() const { return problem_.empty(); }
  Status status() const {
    return ok() ? Status::Ok() : InvalidArgumentError(what_ + ": " + problem_);
  }

  // Where the following reads are, for messages ("pieces[3]"); "" = the top.
  void SetContext(std::string where) { where_ = std::move(where); }

  // Records a problem found by the caller (the first one is kept).
  void Fail(const std::string& problem) {
    if (problem_.empty()) problem_ = where_.empty() ? problem : where_ + ": " + problem;
  }

  // The required field `key` of object `o` into *out.
  template <typename T>
  bool Get(const nlohmann::json& o, const char* key, T* out) {
    const nlohmann::json* v = Field(o, key);
    if (v == nullptr) return false;
    return Take(*v, key, out);
  }

  // The optional field `key` into *out; absent leaves *out as it is.
  template <typename T>
  bool GetOptional(const nlohmann::json& o, const char* key, T* out) {
    if (!o.is_object()) return Fail(key, "its parent is not an object");
    auto it = o.find(key);
    if (it == o.end()) return true;
    return Take(*it, key, out);
  }

  // The required array `key` of `o`; an empty array when it is missing or
  // not an array (the problem is recorded), so a loop over it just ends.
  const nlohmann::json& Array(const nlohmann::json& o, const char* key) {
    const nlohmann::json* v = Field(o, key);
    if (v == nullptr) return EmptyArray();
    if (!v->is_array()) {
      Fail(key, "is not an array");
      return EmptyArray();
    }
    return *v;
  }

  // The required object `key` of `o`; an empty object when it is missing or
  // not an object (the problem is recorded).
  const nlohmann::json& Object(const nlohmann::json& o, const char* key) {
    const nlohmann::json* v = Field(o, key);
    if (v == nullptr) return EmptyObject();
    if (!v->is_object()) {
      Fail(key, "is not an object");
      return EmptyObject();
    }
    return *v;
  }

 private:
  const nlohmann::json* Field(const nlohmann::json& o, const char* key) {
    if (!o.is_object()) {
      Fail(key, "its parent is not an object");
      return nullptr;
    }
    auto it = o.find(key);
    if (it == o.end()) {
      Fail(key, "is missing");
      return nullptr;
    }
    return &*it;
  }

  template <typename T>
  bool Take(const nlohmann::json& v, const char* key, T* out) {
    if (!json_reader_internal::Holds<T>(v)) {
      std::string shown = v.dump();
      if (shown.size() > 60) shown = shown.substr(0, 60) + "...";
      return Fail(key, std::string("is ") + shown + ", not " + json_reader_internal::TypeName<T>());
    }
    *out = v.get<T>();
    return true;
  }

  bool Fail(const char* key, const std::string& problem) {
    Fail(std::string("'") + key + "' " + problem);
    return false;
  }

  static const nlohmann::json& EmptyArray() {
    static const nlohmann::json* const a = new nlohmann::json(nlohmann::json::array());
    return *a;
  }
  static const nlohmann::json& EmptyObject() {
    static const nlohmann::json* const o = new nlohmann::json(nlohmann::json::object());
    return *o;
  }

  std::string what_;
  std::string where_;
  std::string problem_;
};

}  // namespace memento
