#include "common/human.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace memento {

std::string HumanBytes(double bytes) {
  static const char* const kUnit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  constexpr int kLast = 5;
  double v = bytes;
  int u = 0;
  while (v >= 1024 && u < kLast) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, kUnit[u]);
  return buf;
}

std::string HumanBytes(uint64_t bytes) { return HumanBytes(static_cast<double>(bytes)); }

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return c == ' ' || c == '\t'; }
char Lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

Status Bad(std::string_view text, const std::string& why) {
  return InvalidArgumentError("bad byte count '" + std::string(text) + "': " + why);
}

}  // namespace

Result<uint64_t> ParseBytes(std::string_view text) {
  size_t i = 0, n = text.size();
  while (i < n && IsSpace(text[i])) ++i;
  while (n > i && IsSpace(text[n - 1])) --n;
  if (i == n) return Bad(text, "empty (expected a number of bytes such as 1073741824, 512M or 1G)");
  if (text[i] == '-') return Bad(text, "negative");
  if (text[i] == '+') ++i;
  // The number: digits [. digits] [e [+-] digits], at least one digit before
  // the exponent. Checked by hand so that strtod's hex, inf and nan forms and
  // its leading-space skipping never get in.
  const size_t num_begin = i;
  size_t int_digits = 0, frac_digits = 0;
  bool plain_integer = true;
  while (i < n && IsDigit(text[i])) ++i, ++int_digits;
  if (i < n && text[i] == '.') {
    plain_integer = false;
    ++i;
    while (i < n && IsDigit(text[i])) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) {
    return Bad(text, "no number (expected digits, e.g. 512M or 1073741824)");
  }
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    size_t j = i + 1;
    if (j < n && (text[j] == '+' || text[j] == '-')) ++j;
    size_t exp_digits = 0;
    while (j < n && IsDigit(text[j])) ++j, ++exp_digits;
    if (exp_digits > 0) {  // else the 'e' is junk, reported as a unit below
      plain_integer = false;
      i = j;
    }
  }
  const std::string number(text.substr(num_begin, i - num_begin));
  while (i < n && IsSpace(text[i])) ++i;
  // The unit.
  std::string unit;
  for (size_t k = i; k < n; ++k) unit += Lower(text[k]);
  int shift = 0;
  if (!unit.empty()) {
    static const std::string kPrefixes = "kmgtp";
    const size_t pos = kPrefixes.find(unit[0]);
    const std::string tail = unit.substr(1);
    if (unit == "b") {
      shift = 0;
    } else if (pos != std::string::npos && (tail.empty() || tail == "b" || tail == "ib")) {
      shift = 10 * static_cast<int>(pos + 1);
    } else {
      return Bad(text, "unknown unit '" + std::string(text.substr(i)) +
                           "' (use K, M, G, T or P, optionally followed by iB or B; powers of "
                           "1024)");
    }
  }
  constexpr uint64_t kMax = ~uint64_t{0};
  if (plain_integer) {
    uint64_t v = 0;
    for (char c : number) {
      if (__builtin_mul_overflow(v, uint64_t{10}, &v) ||
          __builtin_add_overflow(v, static_cast<uint64_t>(c - '0'), &v)) {
        return Bad(text, "more than 2^64 - 1 bytes");
      }
    }
    if (shift > 0 && v > (kMax >> shift)) return Bad(text, "more than 2^64 - 1 bytes");
    return v << shift;
  }
  constexpr long double kTwo64 = 18446744073709551616.0L;
  const long double v = std::strtold(number.c_str(), nullptr) * std::ldexp(1.0L, shift);
  const long double rounded = std::floor(v + 0.5L);
  if (!std::isfinite(v) || rounded >= kTwo64) return Bad(text, "more than 2^64 - 1 bytes");
  return static_cast<uint64_t>(rounded);
}

}  // namespace memento
