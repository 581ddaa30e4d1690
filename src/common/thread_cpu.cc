#include "common/thread_cpu.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "common/mutex.h"

namespace memento {
namespace {

double Seconds(const timespec& ts) {
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// "rpc12" -> "rpc": a pool's workers are one line of the report.
std::string GroupName(std::string name) {
  while (!name.empty() && name.back() >= '0' && name.back() <= '9') name.pop_back();
  if (!name.empty() && (name.back() == '-' || name.back() == '_')) name.pop_back();
  return name.empty() ? "(digits)" : name;
}

// The CPU of threads that exited, by group name, and the thread ids whose
// exit is recorded but that may still be listed in /proc for a moment (so a
// report does not count them twice). Leaked on purpose: threads may exit
// after static destructors ran.
struct Ledger {
  Mutex mu;
  std::map<std::string, double> exited GUARDED_BY(mu);
  std::set<pid_t> exited_tids GUARDED_BY(mu);
};

Ledger& TheLedger() {
  static Ledger* ledger = new Ledger();
  return *ledger;
}

// One per named thread; its destructor runs when the thread exits.
struct ExitRecord {
  std::string group;
  ~ExitRecord() {
    if (group.empty()) return;
    const double cpu = CurrentThreadCpuSeconds();
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    Ledger& l = TheLedger();
    MutexLock lock(&l.mu);
    l.exited[group] += cpu;
    if (l.exited_tids.size() >= 64) {
      // Keep the set small in a long-lived process: drop the ids whose
      // threads are gone (tgkill with signal 0 only checks).
      for (auto it = l.exited_tids.begin(); it != l.exited_tids.end();) {
        const bool gone = syscall(SYS_tgkill, getpid(), *it, 0) != 0;
        it = gone ? l.exited_tids.erase(it) : std::next(it);
      }
    }
    l.exited_tids.insert(tid);
  }
};

thread_local ExitRecord t_exit_record;

// The kernel's CPU clock of another thread of this process (what glibc's
// pthread_getcpuclockid builds from a thread id: MAKE_THREAD_CPUCLOCK(tid,
// CPUCLOCK_SCHED) in the kernel's posix-cpu-timers). /proc/<tid>/schedstat,
// the other nanosecond source, is missing on kernels without schedstats.
bool ThreadCpuOf(pid_t tid, double* seconds) {
  const clockid_t clock = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 4 | 2);
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return false;  // exited meanwhile
  *seconds = Seconds(ts);
  return true;
}

}  // namespace

double CurrentThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return Seconds(ts);
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return Seconds(ts);
}

void NameThisThread(const std::string& name) {
  const std::string cut = name.substr(0, 15);
  pthread_setname_np(pthread_self(), cut.c_str());
  t_exit_record.group = GroupName(cut);
}

ThreadCpuReport ThreadCpuByName() {
  ThreadCpuReport r;
  std::set<pid_t> exited_tids;
  {
    // The ledger first: a thread that exits after this read is still
    // listed below (or its CPU falls to unnamed_exited_s), never twice.
    Ledger& l = TheLedger();
    MutexLock lock(&l.mu);
    r.by_name = l.exited;
    exited_tids = l.exited_tids;
  }
  std::set<pid_t> listed;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      const long tid = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || tid <= 0) continue;
      listed.insert(static_cast<pid_t>(tid));
      if (exited_tids.count(static_cast<pid_t>(tid)) > 0) continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      if (!std::getline(comm, name)) continue;
      double cpu = 0;
      if (!ThreadCpuOf(static_cast<pid_t>(tid), &cpu)) continue;
      r.by_name[GroupName(name)] += cpu;
    }
    closedir(d);
  }
  {
    // Forget recorded exits whose threads are gone from /proc: the set stays
    // as small as the number of threads exiting right now (ids are reused).
    Ledger& l = TheLedger();
    MutexLock lock(&l.mu);
    for (auto it = l.exited_tids.begin(); it != l.exited_tids.end();) {
      it = listed.count(*it) > 0 ? std::next(it) : l.exited_tids.erase(it);
    }
  }
  r.process_s = ProcessCpuSeconds();
  double named = 0;
  for (const auto& [name, s] : r.by_name) named += s;
  r.unnamed_exited_s = r.process_s > named ? r.process_s - named : 0.0;
  return r;
}

}  // namespace memento
