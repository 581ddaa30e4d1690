#include "common/human.h"

#include <cstdio>

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

}  // namespace memento
