// Which threads of this process spent its CPU: a per-thread account that
// also covers threads that have already exited, so a report made when a
// daemon stops adds up to the process's own CPU time (the agent's "agent
// cpu by thread" line, read by `memento bench overhead`;
// docs/bench_overhead.md, "--cluster").
//
// Thread-safe: every function may be called from any thread.
#pragma once

#include <map>
#include <string>

namespace memento {

// CPU-seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID).
double CurrentThreadCpuSeconds();

// CPU-seconds of the whole process, every thread, dead or alive
// (CLOCK_PROCESS_CPUTIME_ID; one system call).
double ProcessCpuSeconds();

// Names the calling thread (cut to 15 bytes, the kernel's limit; what top -H,
// perf and /proc/self/task/<tid>/comm show) and, when it exits, adds the CPU
// it used to the account under that name, so that ThreadCpuByName() still
// counts it. Call it first thing in a thread's body; calling it again renames
// the thread (its whole CPU goes to the last name).
void NameThisThread(const std::string& name);

struct ThreadCpuReport {
  // CPU-seconds by thread name, live threads (read from their per-thread CPU
  // clocks) and exited ones named with NameThisThread, with trailing digits
  // dropped so that a pool's "rpc0", "rpc1" sum as "rpc". The main thread
  // appears under the process's own name (its comm).
  std::map<std::string, double> by_name;
  double process_s = 0;  // CLOCK_PROCESS_CPUTIME_ID: every thread, dead or alive
  // process_s minus the sum of by_name: threads that exited without a name
  // (never negative; a few microseconds of clock skew are clamped to 0).
  double unnamed_exited_s = 0;
};

// The account now. Reads /proc/self/task: a few dozen small files; meant for
// a report at the end of a run, not for every step.
ThreadCpuReport ThreadCpuByName();

}  // namespace memento
