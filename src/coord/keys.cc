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

Result<SkippedKey> ParseSkippedKey(const JobKeys& keys, const std::string& key) {
  auto bad = [&](const char* why) {
    return InvalidArgumentError(
        fmt::format("skip record key '{}' is not {}<20-digit step>/<node>[@<epoch>] ({})",
                    key.substr(0, 200), keys.SkippedPrefix(), why));
  };
  const std::string prefix = keys.SkippedPrefix();
  if (key.compare(0, prefix.size(), prefix) != 0) return bad("another prefix");
  const std::string rest = key.substr(prefix.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return bad("no node");
  SkippedKey k;
  auto step = ParseStep(rest.substr(0, slash));
  if (!step.ok()) return bad("the step is not 20 digits");
  k.step = *step;
  std::string node = rest.substr(slash + 1);
  const size_t at = node.find('@');
  if (at != std::string::npos) {
    const std::string digits = node.substr(at + 1);
    if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) {
      return bad("the epoch is not a canonical decimal number");
    }
    uint64_t e = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return bad("the epoch is not a decimal number");
      const uint64_t d = static_cast<uint64_t>(c - '0');
      if (e > (UINT64_MAX - d) / 10) return bad("the epoch overflows");
      e = e * 10 + d;
    }
    // Epoch 0 is written without a suffix: "@0" is no key of ours.
    if (e == 0) return bad("epoch 0 has no suffix");
    k.epoch = e;
    node.resize(at);
  }
  if (!ValidateName("node", node).ok()) return bad("the node name is not [A-Za-z0-9._-]{1,64}");
  k.node = std::move(node);
  return k;
}

}  // namespace memento::coord
