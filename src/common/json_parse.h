// JSON parsing for bytes another process or the disk wrote.
//
// nlohmann::json converts a number written with a fraction or an exponent
// (1e30) to an integer type with a plain cast, which is undefined behaviour
// when the value does not fit (found by the fuzz targets: docs/testing.md).
// ParseForeignJson drops such numbers (magnitude >= 2^63, or not finite)
// while parsing: the field then reads as missing, so the caller's "missing
// field" error names it. Otherwise exactly json::parse (it throws the same
// exceptions; allow_exceptions = false returns a discarded value instead).
//
// Header-only; the includer links nlohmann_json.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>

namespace memento {

inline nlohmann::json ParseForeignJson(std::string_view text, bool allow_exceptions = true) {
  using json = nlohmann::json;
  const json::parser_callback_t keep = [](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::value && parsed.is_number_float()) {
      const double v = parsed.get<double>();
      return std::isfinite(v) && std::fabs(v) < 9.2e18;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), keep, allow_exceptions);
}

}  // namespace memento
