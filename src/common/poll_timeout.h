// poll(2)'s timeout argument for a Deadline.
#pragma once

#include <chrono>

#include "memento/deadline.h"

namespace memento {

// Milliseconds to pass to poll(2) so that it wakes no earlier than
// `deadline`: -1 when infinite, 0 once expired, else the time left rounded
// *up* to a whole millisecond. Deadline::remaining_ms() rounds down, so a wait
// loop that polled with it woke up to 1 ms before the deadline and then spun
// on poll(fd, 0) until the deadline passed: a busy wait at the end of every
// timed wait (the agents' accept loop wakes 5 times a second; issue 16).
inline int PollTimeoutMs(const Deadline& deadline) {
  if (deadline.infinite()) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining()).count();
  return ms > (1 << 30) ? (1 << 30) : static_cast<int>(ms);
}

}  // namespace memento
