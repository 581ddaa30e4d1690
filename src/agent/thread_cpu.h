// CPU-seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID): what the
// agent counts per activity ("agent cpu by activity" at stop;
// docs/bench_overhead.md, "--cluster").
#pragma once

#include <time.h>

namespace memento::agent {

inline double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace memento::agent
