#include "client/snapshot_path.h"

#include <time.h>

namespace memento::client {

uint64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t ThreadCpuSinceLastCallNs() {
  thread_local uint64_t last = 0;
  const uint64_t now = ThreadCpuNs();
  const uint64_t delta = now - last;
  last = now;
  return delta;
}

}  // namespace memento::client
