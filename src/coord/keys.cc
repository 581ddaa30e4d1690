#include "coord/keys.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <string>

namespace memento::coord {

Status ValidateName(const std::string& what, const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      ok = false;
    }
  }
  if (!ok) {
    return InvalidArgumentError(
        fmt::format("{} name '{}' must be 1..64 characters of [A-Za-z0-9._-]", what, name));
  }
  return Status::Ok();
}

std::string NodeName(int node) { return "node" + std::to_string(node); }

Result<int> ParseNodeName(std::string_view name) {
  constexpr std::string_view kPrefix = "node";
  auto bad = [&](const char* why) {
    return InvalidArgumentError(fmt::format("node name '{}' is not node<N> ({})", name, why));
  };
  if (name.substr(0, kPrefix.size()) != kPrefix) return bad("no 'node' prefix");
  const std::string_view digits = name.substr(kPrefix.size());
  if (digits.empty()) return bad("no number");
  if (digits.size() > 1 && digits[0] == '0') return bad("leading zero");
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return bad("not a decimal number");
    v = v * 10 + (c - '0');
    if (v > INT32_MAX) return bad("too large");
  }
  return static_cast<int>(v);
}

std::string StepKey(int64_t step) { return fmt::format("{:020d}", step); }

Result<int64_t> ParseStep(const std::string& s) {
  if (s.size() != 20) return InvalidArgumentError(fmt::format("step '{}' is not 20 digits", s));
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return InvalidArgumentError(fmt::format("step '{}' is not numeric", s));
    if (v > (INT64_MAX - 9) / 10)
      return InvalidArgumentError(fmt::format("step '{}' overflows", s));
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace memento::coord
