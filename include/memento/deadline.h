// Deadline: every blocking memento call takes one.
#pragma once

#include <chrono>

namespace memento {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
using Duration = SteadyClock::duration;

inline TimePoint Now() { return SteadyClock::now(); }

// A point in time after which a blocking call gives up with DeadlineExceeded.
class Deadline {
 public:
  static Deadline Infinite() { return Deadline(TimePoint::max()); }
  static Deadline After(Duration d) { return Deadline(Now() + d); }
  static Deadline AfterSeconds(double s) {
    return After(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s)));
  }
  explicit Deadline(TimePoint when) : when_(when) {}

  TimePoint when() const { return when_; }
  bool infinite() const { return when_ == TimePoint::max(); }
  bool expired() const { return !infinite() && Now() >= when_; }
  // Time left, zero once expired; Duration::max() when infinite.
  Duration remaining() const {
    if (infinite()) return Duration::max();
    TimePoint now = Now();
    return now >= when_ ? Duration::zero() : when_ - now;
  }
  // Milliseconds left for poll(2): -1 when infinite, 0 once expired.
  int remaining_ms() const {
    if (infinite()) return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(remaining()).count();
    if (ms > 1 << 30) ms = 1 << 30;
    return static_cast<int>(ms);
  }

 private:
  TimePoint when_;
};

}  // namespace memento
