// Human-readable quantities for messages and reports ("1.50 GiB"), and the
// parser of the byte counts users type on command lines ("1G", "256M").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "memento/status.h"

namespace memento {

// Binary units: "0 B", "512 B", "1.50 KiB", "64.00 MiB", "3.20 GiB", "1.00 TiB".
[[nodiscard]] std::string HumanBytes(uint64_t bytes);
[[nodiscard]] std::string HumanBytes(double bytes);

// A byte count as users type it: a non-negative number (integer, decimal or
// with an exponent: "1073741824", "1.5", "256e6") and an optional unit
// (case-insensitive) K, M, G, T, P, each with an optional "iB" or "B"
// ("4K", "256M", "1.5G", "1GiB", "8gb"). All units are powers of 1024 (as
// HumanBytes prints them; "GB" too, like CLI11's size values and `ls -h`).
// Spaces around the number and between number and unit are allowed, so
// HumanBytes' output parses back ("1.50 GiB"). A fractional result is rounded
// to the nearest byte. InvalidArgument, quoting the text, for empty input, a
// negative number, an unknown unit or trailing characters, hex, inf or nan,
// and counts above 2^64 - 1.
[[nodiscard]] Result<uint64_t> ParseBytes(std::string_view text);

}  // namespace memento
