// Pacing a toy trainer on its agent's commits (StepLoopOptions::pace_commits,
// toy_run.h: the --pace-commits of tests/cluster/workload.cc and
// tests/cluster_save/cluster_trainer.cc).
//
// A test job of short steps on a loaded machine can end, or reach the step
// at which a failure is injected, while its first versions are still waiting
// for their commit: every later snapshot is skipped (the slot it would take
// is held, docs/cluster_save.md "Skips"), so the job commits few steps and
// what a test wanted to check (a commit of every step, a kill at step N
// with versions to recover from) depends on the machine's load. A paced
// trainer waits, after each snapshot it wrote, until its node's agent says
// that step committed, or let it go without a commit (a node skipped it: it
// can never commit), so its steps become versions one after the other
// however slow the machine is. A rank that skipped a step (its slot was held,
// e.g. by the durable hold) marks it in a directory the ranks share; the
// others then stop waiting for it.
//
// Reads <dir>/commit.word (shm/commit_word.h) read-only; header only.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "shm/commit_word.h"

namespace memento::toy {

enum class PaceEnd {
  kCommitted,  // the commit word says `step` (or a newer step) committed
  kReleased,   // the agent held `step`, then released it uncommitted
  kSkipped,    // another rank marked `step` skipped (MarkSkipped)
  kNoWord,     // no commit word in `dir` (not in cluster mode)
  kWaitedMax,  // none of these within `max_s` (an agent gone, ...)
};

// A rank that skipped `step` says so to the others in a directory they share
// (the job's barrier / rendezvous directory): their agents may never hold
// that step (they learn of the skip from the store before they start it), so
// without this mark a paced rank would wait for a release that never comes.
inline std::string SkipMarkPath(const std::string& shared_dir, int64_t step) {
  return shared_dir + "/skipped." + std::to_string(step);
}
inline void MarkSkipped(const std::string& shared_dir, int64_t step) {
  if (shared_dir.empty()) return;
  const int fd = open(SkipMarkPath(shared_dir, step).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
}

// Waits until `step` committed on the node of the agent whose commit word is
// in `dir` (and the agent's durable hold, if any, is on no older step), or
// the agent released it uncommitted, or a rank marked it skipped in
// `shared_dir` (empty: none), for at most `max_s` seconds. The
// agent stores `committed` before it releases the hold of a step that
// committed (agent/commit_hold.cc), so a hold seen released with `committed`
// still below `step` is a release without a commit.
inline PaceEnd WaitForCommitOrRelease(const std::string& dir, int64_t step,
                                      const std::string& shared_dir, double max_s) {
  const int fd = open(shm::CommitWordPath(dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PaceEnd::kNoWord;
  void* map = mmap(nullptr, sizeof(shm::CommitWord), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return PaceEnd::kNoWord;
  auto* w = static_cast<shm::CommitWord*>(map);
  const std::string mark = shared_dir.empty() ? "" : SkipMarkPath(shared_dir, step);
  PaceEnd end = PaceEnd::kWaitedMax;
  bool held = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_s);
  while (std::chrono::steady_clock::now() < until) {
    if (shm::CommitWordValid(w)) {
      const int64_t hold = shm::LoadWord(&w->hold);
      if (shm::LoadWord(&w->committed) >= step) {
        // And the durable tier's hold (docs/durable_tier.md) no longer
        // protects an older step: the next snapshot takes that one's slot.
        const int64_t durable = shm::LoadDurableHold(w, shm::MonotonicNanos());
        if (durable < 0 || durable >= step) {
          end = PaceEnd::kCommitted;
          break;
        }
      }
      if (hold == step) {
        held = true;
      } else if (held) {
        end = PaceEnd::kReleased;
        break;
      }
    }
    if (!mark.empty() && access(mark.c_str(), F_OK) == 0) {
      end = PaceEnd::kSkipped;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  munmap(map, sizeof(shm::CommitWord));
  return end;
}

}  // namespace memento::toy
