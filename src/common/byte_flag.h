// The CLI11 side of ParseBytes (common/human.h): every byte-size flag of the
// `memento` tools and the example trainer takes "1G", "256M", "4K", "1.5G",
// "1GiB", plain integers and "256e6".
//
//   cmd->add_option("--size", args.size, "Bytes of state")->transform(ByteSize());
//   cmd->add_option("--state-mib", args.mib, "State (MiB)")->transform(ByteSize(1 << 20));
//
// The transform rewrites the text to a plain integer before CLI11 converts it
// into the option's variable. For a flag counted in a unit (`--state-mib`:
// unit_bytes = 1 MiB), a number without a unit keeps its meaning (MiB), and a
// number with one ("1G") is converted into that unit and must be a whole
// multiple of it. Errors name the flag (CLI11 prefixes "--size: ") and quote
// the bad text. Header-only, for the programs that link CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "common/human.h"

namespace memento {

inline std::string ByteUnitName(uint64_t unit_bytes) {
  switch (unit_bytes) {
    case uint64_t{1} << 10:
      return "KiB";
    case uint64_t{1} << 20:
      return "MiB";
    case uint64_t{1} << 30:
      return "GiB";
    default:
      return std::to_string(unit_bytes) + "-byte units";
  }
}

inline CLI::Validator ByteSize(uint64_t unit_bytes = 1) {
  auto op = [unit_bytes](std::string& text) -> std::string {
    Result<uint64_t> bytes = ParseBytes(text);
    if (!bytes.ok()) return bytes.status().message();
    if (unit_bytes <= 1) {
      text = std::to_string(*bytes);
      return "";
    }
    if (text.find_first_not_of("0123456789.eE+ \t") == std::string::npos) {
      return "";  // a plain number: already in the flag's unit
    }
    if (*bytes % unit_bytes != 0) {
      return "'" + text + "' is not a whole number of " + ByteUnitName(unit_bytes) +
             " (the unit of this flag)";
    }
    text = std::to_string(*bytes / unit_bytes);
    return "";
  };
  const std::string desc = unit_bytes <= 1
                               ? "BYTES (e.g. 4096, 256M, 1.5G, 1GiB)"
                               : ByteUnitName(unit_bytes) + ", or bytes with a unit (e.g. 1G)";
  return CLI::Validator(op, desc, "BYTES");
}

}  // namespace memento
