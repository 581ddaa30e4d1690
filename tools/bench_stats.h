// Small helpers shared by the `memento bench` commands: summary statistics
// of repeated measurements and comma-separated option lists.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace memento::tools {

// The median of `v` (0 when empty); the mean of the two middle values for an
// even count.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The arithmetic mean of `v` (0 when empty).
inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// "a,b,,c" -> {"a", "b", "c"}: the non-empty comma-separated items.
inline std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace memento::tools
