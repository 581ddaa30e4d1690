// Monotonic time helpers. Deadline itself is public: memento/deadline.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

#include "memento/deadline.h"

namespace memento {

// Seconds between two time points, as a double.
inline double SecondsBetween(TimePoint a, TimePoint b) {
  return std::chrono::duration<double>(b - a).count();
}

// Wall-clock time in nanoseconds since the epoch (for logs and records only).
inline int64_t WallNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Measures elapsed time since construction or the last Reset().
class Stopwatch {
 public:
  Stopwatch() : start_(Now()) {}
  void Reset() { start_ = Now(); }
  double Seconds() const { return SecondsBetween(start_, Now()); }

 private:
  TimePoint start_;
};

}  // namespace memento
